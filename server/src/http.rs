//! The HTTP port: `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::engine::Engine;

/// What the HTTP endpoints report on.
#[derive(Clone)]
pub struct HttpState {
    ready: Arc<AtomicBool>,
    engine: Arc<Engine>,
    prometheus: Option<PrometheusHandle>,
}

impl HttpState {
    pub fn new(engine: Arc<Engine>, prometheus: Option<PrometheusHandle>) -> Self {
        HttpState { ready: Arc::new(AtomicBool::new(false)), engine, prometheus }
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Ready once rules are loaded and gRPC is serving; not ready while shutting down.
async fn readyz(State(state): State<HttpState>) -> (StatusCode, &'static str) {
    if state.is_ready() { (StatusCode::OK, "ready\n") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready\n") }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let Some(prometheus) = &state.prometheus else {
        return (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain")], "metrics are off\n".to_string());
    };
    let engine = &state.engine;
    crate::metrics::scrape_time(engine.buckets().len(), engine.buckets().evicted());
    crate::metrics::scrape_engine(engine);
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], prometheus.render())
}
