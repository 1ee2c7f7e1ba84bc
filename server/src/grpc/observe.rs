//! Latency and status code of every gRPC call, by method, as a tower layer
//! around all services on the port (health and reflection included).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tower::{Layer, Service};

use crate::metrics::RpcMetrics;

/// Methods get their own label; any other path is counted as "other", so a
/// client cannot grow the label set.
const METHODS: &[(&str, &str)] = &[
    ("/floodgate.v1.Floodgate/Acquire", "Floodgate/Acquire"),
    ("/floodgate.v1.Floodgate/AcquireBatch", "Floodgate/AcquireBatch"),
    ("/floodgate.v1.Floodgate/ReportOutcome", "Floodgate/ReportOutcome"),
    ("/floodgate.v1.Floodgate/ReportOutcomeBatch", "Floodgate/ReportOutcomeBatch"),
    ("/floodgate.v1.Floodgate/Charge", "Floodgate/Charge"),
    ("/floodgate.v1.Floodgate/Lease", "Floodgate/Lease"),
    ("/floodgate.v1.Floodgate/Watch", "Floodgate/Watch"),
    ("/floodgate.v1.Admin/GetRules", "Admin/GetRules"),
    ("/floodgate.v1.Admin/ApplyRules", "Admin/ApplyRules"),
    ("/floodgate.v1.Admin/ListBreakers", "Admin/ListBreakers"),
    ("/floodgate.v1.Admin/GetBreaker", "Admin/GetBreaker"),
    ("/floodgate.v1.Admin/SetBreakerState", "Admin/SetBreakerState"),
    ("/floodgate.v1.Admin/SetDegradationLevel", "Admin/SetDegradationLevel"),
    ("/floodgate.v1.Admin/Peek", "Admin/Peek"),
    ("/floodgate.v1.Admin/GetWhatIf", "Admin/GetWhatIf"),
    ("/floodgate.v1.Admin/SetOverrides", "Admin/SetOverrides"),
    ("/floodgate.v1.Admin/ListOverrides", "Admin/ListOverrides"),
    ("/floodgate.v1.Admin/DeleteOverrides", "Admin/DeleteOverrides"),
    ("/floodgate.v1.Admin/GetTopKeys", "Admin/GetTopKeys"),
    ("/grpc.health.v1.Health/Check", "Health/Check"),
    ("/grpc.health.v1.Health/Watch", "Health/Watch"),
    ("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "RateLimitService/ShouldRateLimit"),
    (
        "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
        "RateLimitQuotaService/StreamRateLimitQuotas",
    ),
];

#[derive(Clone)]
pub struct ObserveLayer {
    by_path: Arc<HashMap<&'static str, RpcMetrics>>,
    other: RpcMetrics,
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    layer: ObserveLayer,
}

impl ObserveLayer {
    pub fn new() -> Self {
        let by_path = METHODS.iter().map(|&(path, label)| (path, RpcMetrics::new(label))).collect();
        ObserveLayer { by_path: Arc::new(by_path), other: RpcMetrics::new("other") }
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
        let metrics = self.layer.by_path.get(req.uri().path()).unwrap_or(&self.layer.other).clone();
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
