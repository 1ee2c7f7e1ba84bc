//! A tower layer for HTTP services (axum, hyper): each request is mapped to a
//! resource (method and route template) and descriptors (headers, client IP),
//! asked of Floodgate, and answered 429 or 503 when denied, with `Retry-After`,
//! the IETF `RateLimit` and `RateLimit-Policy` fields, the older
//! `X-RateLimit-*` ones and a small JSON body. Allowed responses carry the
//! rate limit fields too. 5xx answers, errors and calls dropped before they
//! finish (timeouts) are reported as failures.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use axum::{Router, routing::get};
//! use floodgate_client::{Client, http::FloodgateLayer};
//!
//! let client = Client::connect("http://127.0.0.1:50051")?;
//! let app: Router = Router::new()
//!     .route("/api/orders/{id}", get(|| async { "order" }))
//!     .layer(
//!         FloodgateLayer::new(client)
//!             .routes(["/api/orders/:id"])
//!             .descriptor_header("x-user-id", "user")?
//!             .client_ip("ip"),
//!     );
//! # Ok(()) }
//! ```

mod config;
mod headers;
mod layer;
mod route;
mod service;

pub(crate) use config::PriorityFrom;
pub use headers::{denial_body, denial_status, rate_limit_headers};
pub use layer::FloodgateLayer;
pub use route::Routes;
pub use service::{ActualCost, Floodgate};
