//! # floodgate-client
//!
//! Ask [Floodgate](https://github.com/floodgate-rs/floodgate) before calling
//! something, report after, and fall back gracefully when denied or when the
//! server is gone.
//!
//! - [`Client`]: `acquire` (a [`Decision`]), `acquire_batch`, `acquire_until`;
//!   an admitted call's [`Permit`] reports its outcome (batched in the
//!   background, never blocking the caller), and reports itself when dropped
//!   unreported (a cancelled call). Without a server: fail open, closed, or
//!   decide locally at a share of the last known limits, within a short
//!   deadline, with a local breaker on the connection and automatic
//!   reconnection. Watch feeds a cache of open breakers and of the rule
//!   patterns, so an open circuit or a resource without a rule costs no
//!   round trip.
//! - [`Client::guard`]: acquire, run, time, classify and report in one call;
//!   [`Fallback`]s (a value, the last good value for the same question, a
//!   closure given the cause) per call or per resource
//!   ([`guard::ResourceGuard`]).
//! - [`http::FloodgateLayer`]: a tower layer for HTTP services (axum, hyper)
//!   answering 429/503 with `Retry-After` and the rate limit fields.
//! - [`grpc::FloodgateGrpcLayer`]: the same for tonic services.
//! - [`proto`]: the generated stubs.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use floodgate_client::{Acquire, Client, GuardError};
//!
//! let client = Client::connect("http://127.0.0.1:1").unwrap(); // no server here: fails open
//! let answer = client
//!     .guard(Acquire::new("payments-db").descriptor("tenant", "acme"))
//!     .run(|| async { Ok::<_, std::io::Error>("query result") })
//!     .await;
//! match answer {
//!     Ok(rows) => assert_eq!(rows, "query result"),
//!     Err(GuardError::Denied(d)) => println!("denied, retry in {:?}", d.retry_after),
//!     Err(e) => println!("{e}"),
//! }
//! # }
//! ```
//!
//! ## The surface
//!
//! At the root, what every caller touches: [`Client`] and its [`Builder`],
//! [`FailMode`] and [`Tls`]; the question, [`Acquire`]; the answer, [`Decision`] with
//! its [`Verdict`] and [`Permit`]; [`Outcome`] to report; [`Error`]; and for
//! guarded calls [`Fallback`], [`Served`] and [`GuardError`]. The rest lives in
//! modules: [`decision`] (a decision's parts: limits, where it came from,
//! breaker states), [`guard`] (the guard types and classifiers), [`stats`],
//! [`http`] and [`grpc`] (the tower layers), and [`proto`] (the generated
//! stubs). Types that may grow are `#[non_exhaustive]`; builders that take
//! user input return `Result` and never panic.

mod client;
mod connection;
pub mod decision;
mod error;
mod finish;
pub mod grpc;
pub mod guard;
pub mod http;
mod last_good;
mod lease;
mod load;
mod local;
pub mod metered;
mod permit;
mod reporter;
pub mod stats;
mod watch;

pub use client::Client;
pub use client::builder::{Builder, FailMode, Tls};
pub use decision::{Acquire, Decision, Priority, Verdict};
pub use error::Error;
pub use floodgate_proto as proto;
pub use guard::{Fallback, GuardError, Served};
pub use metered::{Charged, Flow, Metered, Metering};
pub use permit::{Outcome, Permit};

#[cfg(test)]
mod tests;
