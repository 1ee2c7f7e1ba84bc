//! An axum service protected by Floodgate.
//!
//! Every request is asked of Floodgate as `GET /api/orders/:id` with the
//! caller's `x-user-id` and IP; the handler calls a flaky downstream (one call
//! in three fails) through a guard on resource `orders-db`, falling back to a
//! cached answer when the downstream's circuit is open.
//!
//! ```sh
//! floodgate serve --config client/examples/http_guard.yaml &
//! cargo run -p floodgate-client --example http_guard -- \
//!     --floodgate http://127.0.0.1:50051 --listen 127.0.0.1:3000
//! curl -i -H 'x-user-id: u42' http://127.0.0.1:3000/api/orders/123
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::get;
use clap::Parser;
use floodgate_client::http::FloodgateLayer;
use floodgate_client::{Acquire, Client, Fallback, Served};

#[derive(Parser)]
struct Args {
    /// The Floodgate server.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    floodgate: String,
    /// Where this service listens.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
}

#[derive(Clone)]
struct App {
    floodgate: Client,
    downstream_calls: Arc<AtomicU64>,
}

/// The downstream: one call in three fails.
async fn flaky_lookup(calls: &AtomicU64, id: &str) -> Result<String, String> {
    let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_multiple_of(3) { Err(format!("downstream failed on call {n}")) } else { Ok(format!("order {id}")) }
}

async fn order(State(app): State<App>, Path(id): Path<String>) -> String {
    let fallback = Fallback::Value(format!("order {id} (from cache)"));
    let served = app
        .floodgate
        .guard(Acquire::new("orders-db"))
        .run_or(&fallback, || flaky_lookup(&app.downstream_calls, &id))
        .await;
    match served {
        Ok(Served::Fresh(body)) => body + "\n",
        Ok(other) => format!("{} [fallback]\n", other.into_inner()),
        Err(e) => format!("unavailable: {e}\n"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let args = Args::parse();
    let floodgate = Client::connect(args.floodgate)?;
    let app = App { floodgate: floodgate.clone(), downstream_calls: Arc::new(AtomicU64::new(0)) };
    let router = Router::new().route("/api/orders/{id}", get(order)).with_state(app).layer(
        FloodgateLayer::new(floodgate)
            .routes(["/api/orders/:id"])
            .descriptor_header("x-user-id", "user")?
            .client_ip("ip"),
    );
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(listen = %args.listen, "http_guard serving");
    axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
