//! Latency and status code of every gRPC call, by method, as a tower layer
//! around all services on the port (health and reflection included).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tower::{Layer, Service};

use super::rpc::Rpc;
use crate::metrics::RpcMetrics;

#[derive(Clone)]
pub struct ObserveLayer {
    /// By [`Rpc`], in table order: every RPC gets its own label; any other
    /// path is counted as "other", so a client cannot grow the label set.
    by_rpc: Arc<[RpcMetrics]>,
    other: RpcMetrics,
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    layer: ObserveLayer,
}

impl ObserveLayer {
    pub fn new() -> Self {
        let by_rpc = Rpc::ALL
            .iter()
            .map(|&r| match r {
                Rpc::ShouldRateLimit => RpcMetrics::new(r.label()).with_upstream("ShouldRateLimit"),
                _ => RpcMetrics::new(r.label()),
            })
            .collect();
        ObserveLayer { by_rpc, other: RpcMetrics::new("other") }
    }
}

impl Default for ObserveLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe { inner, layer: self.clone() }
    }
}

impl<S, B, RB> Service<http::Request<B>> for Observe<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let rpc = Rpc::from_path(req.uri().path());
        let metrics = rpc.map_or(&self.layer.other, |r| &self.layer.by_rpc[r as usize]).clone();
        let start = Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = call.await;
            // Unary errors come back trailers-only: the status is in the headers.
            let code =
                response.as_ref().ok().and_then(|r| tonic::Status::from_header_map(r.headers())).map(|s| s.code());
            metrics.record(start.elapsed(), code);
            crate::traces::record_status(code.map_or(0, |c| c as i32));
            response
        })
    }
}
