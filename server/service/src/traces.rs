//! Traces: every gRPC call is a span (`rpc`), exported over OTLP (gRPC) when
//! `--otlp-endpoint` is set. A W3C `traceparent` (and `tracestate`) in the
//! call's metadata makes it a child of the caller's span, so the decision
//! shows inside the caller's trace; the caller's sampling decision is kept.
//! Calls without one start a trace of their own only as often as
//! `--otlp-sample-ratio` says (default: never, as a decision service answers
//! far more calls than anyone wants traced).
//!
//! Off (no endpoint), nothing here runs on the request path but one load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Where and how much to export.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// e.g. `http://127.0.0.1:4317`.
    pub endpoint: String,
    /// Of the calls without a sampled parent, the fraction traced (0 to 1).
    pub sample_ratio: f64,
    pub service_name: String,
}

/// The exporter; flushes what is left when shut down.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Builds the exporter; must run on the Tokio runtime. The layer goes
    /// into the subscriber.
    pub fn start<S>(
        config: &OtlpConfig,
    ) -> anyhow::Result<(Exporter, tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>)>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        anyhow::ensure!(
            (0.0..=1.0).contains(&config.sample_ratio),
            "--otlp-sample-ratio must be from 0 to 1, got {}",
            config.sample_ratio
        );
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&config.endpoint)
            .with_timeout(Duration::from_secs(5))
            .build()?;
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(Duration::from_millis(500))
            .with_max_queue_size(8192)
            .build();
        let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batch).build();
        let resource = opentelemetry_sdk::Resource::builder().with_service_name(config.service_name.clone()).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("floodgate");
        ENABLED.store(true, Ordering::Release);
        Ok((Exporter { provider }, tracing_opentelemetry::layer().with_tracer(tracer)))
    }

    /// Exports what is queued and stops.
    pub fn shutdown(self) {
        ENABLED.store(false, Ordering::Release);
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "exporting the last spans");
        }
    }
}

/// Whether spans are exported.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// The span of one gRPC call: named by its path, a child of the caller's
/// span when the metadata carries one.
pub(crate) fn rpc_span(headers: &http::HeaderMap, path: &str) -> tracing::Span {
    if !enabled() {
        return tracing::debug_span!("rpc", path = %path);
    }
    let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or(("", path));
    let span = tracing::info_span!(
        target: "floodgate::rpc",
        "rpc",
        otel.name = %path.trim_start_matches('/'),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
        rpc.grpc.status_code = tracing::field::Empty,
        floodgate.verdict = tracing::field::Empty,
        path = %path,
    );
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    let _ = span.set_parent(parent);
    span
}

/// Notes the call's gRPC status code on its span.
pub(crate) fn record_status(code: i32) {
    if enabled() {
        tracing::Span::current().record("rpc.grpc.status_code", code);
    }
}

/// Notes a decision's verdict on its call's span.
pub(crate) fn record_verdict(verdict: &str) {
    if enabled() {
        tracing::Span::current().record("floodgate.verdict", verdict);
    }
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}
