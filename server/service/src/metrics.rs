//! The Prometheus recorder and the per-method RPC handles. The metric names
//! and their help text live in the engine crate ([`floodgate_engine::metrics`]),
//! beside the decisions that count them.

use std::time::Duration;

use metrics::{Counter, Histogram, counter, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

pub use floodgate_engine::metrics::*;

const RPC_BUCKETS: &[f64] =
    &[0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// Installs the global Prometheus recorder; `None` if one is already installed
/// (a second server in the same process shares the first one's).
pub fn install() -> Option<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(RPC_DURATION.into()), RPC_BUCKETS)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(REDIS_RTT.into()), RPC_BUCKETS)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(REDIS_SYNC_DURATION.into()), RPC_BUCKETS)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(upstream::RESPONSE_TIME.into()), upstream::RESPONSE_TIME_BUCKETS)
        .ok()?
        // Gauges set at scrape time for something gone (a breaker swept, a
        // rule removed) stop being set; their series go after ten minutes.
        .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(600)))
        .install_recorder()
        .ok()?;
    floodgate_engine::metrics::describe();
    Some(handle)
}

/// One gRPC method's handles.
#[derive(Clone)]
pub(crate) struct RpcMetrics {
    duration: Histogram,
    ok: Counter,
    method: &'static str,
    /// envoyproxy/ratelimit's own series of the method, for ShouldRateLimit.
    upstream: Option<(Histogram, Counter)>,
}

impl RpcMetrics {
    pub fn new(method: &'static str) -> Self {
        RpcMetrics {
            duration: histogram!(RPC_DURATION, "method" => method),
            ok: counter!(RPC_REQUESTS, "method" => method, "code" => "OK"),
            method,
            upstream: None,
        }
    }

    /// Also counted in envoyproxy/ratelimit's `total_requests` and
    /// `response_time` under `grpc_method`.
    pub(crate) fn with_upstream(mut self, grpc_method: &'static str) -> Self {
        let response_time = histogram!(upstream::RESPONSE_TIME, "grpc_method" => grpc_method);
        self.upstream = Some((response_time, counter!(upstream::TOTAL_REQUESTS, "grpc_method" => grpc_method)));
        self
    }

    pub fn record(&self, took: Duration, code: Option<tonic::Code>) {
        self.duration.record(took.as_secs_f64());
        if let Some((response_time, total)) = &self.upstream {
            response_time.record(took.as_secs_f64());
            total.increment(1);
        }
        match code {
            None | Some(tonic::Code::Ok) => self.ok.increment(1),
            Some(code) => counter!(RPC_REQUESTS, "method" => self.method, "code" => code_name(code)).increment(1),
        }
    }
}

/// A gRPC code as gRPC writes it (`INVALID_ARGUMENT`): in metrics' labels
/// and the JSON API's errors.
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
