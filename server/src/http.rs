//! The HTTP port: `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

/// What the HTTP endpoints report on.
#[derive(Clone, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

pub fn router(health: Health) -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).route("/readyz", get(readyz)).with_state(health)
}

/// Ready once rules are loaded and gRPC is serving; not ready while shutting down.
async fn readyz(State(health): State<Health>) -> (StatusCode, &'static str) {
    if health.is_ready() { (StatusCode::OK, "ready\n") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready\n") }
}
