//! The HTTP port: `/healthz`, `/readyz`, `/metrics`, the JSON API (`/v1/`)
//! and the console (`/`),
//! served (`serve`) with the same connection bounds and TLS as the gRPC port,
//! to the hosts it answers to (`site`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::access::Access;
use crate::decider::Decider;

mod api;
mod console;
mod openapi;
mod reply;
mod serve;
mod site;

pub use api::Api;
pub use serve::serve;
pub use site::{Hosts, parse_name as parse_host_name};

/// What the HTTP endpoints report on.
#[derive(Clone)]
pub struct HttpState {
    ready: Arc<AtomicBool>,
    decider: Arc<Decider>,
    prometheus: Option<PrometheusHandle>,
    /// Who may read the console's data and use its actions (as Admin).
    access: Arc<Access>,
    console: console::Console,
    /// The names the port answers to (see [`site`]).
    hosts: Arc<Hosts>,
    /// What else readiness waits for: why it is not ready yet, if it is not.
    gate: Option<ReadyGate>,
    /// The gRPC calls as JSON (`/v1/`), when served.
    api: Option<Api>,
}

/// A condition of readiness: `Some(why)` while it is not met.
pub(crate) type ReadyGate = Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl HttpState {
    /// Must be called on the runtime: the console starts keeping events.
    pub fn new(decider: Arc<Decider>, prometheus: Option<PrometheusHandle>, access: Arc<Access>, hosts: Hosts) -> Self {
        let console = console::Console::start(&decider);
        let hosts = Arc::new(hosts);
        HttpState {
            ready: Arc::new(AtomicBool::new(false)),
            decider,
            prometheus,
            access,
            console,
            hosts,
            gate: None,
            api: None,
        }
    }

    /// Readiness also waits for `gate`.
    pub(crate) fn with_gate(mut self, gate: Option<ReadyGate>) -> Self {
        self.gate = gate;
        self
    }

    /// Serves the gRPC calls as JSON under `/v1/`.
    pub(crate) fn with_api(mut self, api: Api) -> Self {
        self.api = Some(api);
        self
    }

    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// The server is draining: Watch and the console's event streams end.
    pub(crate) fn drain_streams(&self) {
        self.decider.drain_streams();
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(api::openapi))
        .route("/v1/{*call}", axum::routing::post(api::call))
        .merge(console::routes())
        .fallback(console::not_found)
        .method_not_allowed_fallback(console::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), site::check_host))
        .with_state(state)
}

/// Ready once rules are loaded and gRPC is serving; not ready while shutting down.
async fn readyz(State(state): State<HttpState>) -> (StatusCode, String) {
    if !state.is_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into());
    }
    match state.gate.as_ref().and_then(|gate| gate()) {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
        None => {
            // Replicas with other rules are a warning, not a reason to take
            // this one out of service: during a rollout of new rules, some
            // replicas have them before the others.
            let differ = state.decider.views().replica_health().rules_differ;
            match differ.is_empty() {
                true => (StatusCode::OK, "ready\n".into()),
                false => (
                    StatusCode::OK,
                    format!(
                        "ready\nwarning: {} live replicas decide by other rules than this one: {}\n",
                        differ.len(),
                        differ.join(", ")
                    ),
                ),
            }
        }
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let Some(prometheus) = &state.prometheus else {
        return (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain")], "metrics are off\n".to_string());
    };
    scrape(&state.decider);
    let mut text = prometheus.render();
    // Series whose label sets come and go with the Envoy configuration are
    // kept here rather than in the recorder (which keeps every series
    // forever), so that they go when it does.
    state.decider.render_upstream_stats(&mut text);
    let installed = state.decider.views().installed();
    crate::metrics::render_envoy_config_info(&installed.envoy.source, &installed.envoy.version, &mut text);
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// Concurrency limits of exact rules (one resource each, named by the
/// rules file): their limit, calls in flight by priority, and an adaptive
/// limit's inputs.
fn concurrency_gauges(decider: &Decider) {
    use crate::metrics::*;
    use ::metrics::gauge;
    // An exact rule's resource is its rule's name.
    for v in decider.views().concurrency_views(|resource, rule| resource == rule, usize::MAX) {
        let resource = v.resource.clone();
        gauge!(CONCURRENCY_LIMIT, "resource" => resource.clone()).set(f64::from(v.limit));
        for (p, (_, n)) in crate::rules::Priority::ALL.iter().zip(v.partitions) {
            gauge!(CONCURRENCY_IN_FLIGHT, "resource" => resource.clone(), "priority" => p.key()).set(f64::from(n));
        }
        let Some(i) = v.inputs else { continue };
        let measures =
            [("short", i.short_rtt_us), ("long", i.long_rtt_us), ("no_load", i.no_load_rtt_us), ("min", i.min_rtt_us)];
        for (measure, us) in measures {
            gauge!(ADAPTIVE_LATENCY, "resource" => resource.clone(), "measure" => measure).set(us / 1e6);
        }
        gauge!(ADAPTIVE_GRADIENT, "resource" => resource.clone()).set(i.gradient);
        gauge!(ADAPTIVE_QUEUE, "resource" => resource.clone()).set(i.queue);
        gauge!(ADAPTIVE_PROBING, "resource" => resource).set(f64::from(u8::from(i.probing)));
    }
}

/// Gauges read at scrape time rather than kept up to date on the hot path.
/// Breakers are counted per rule and state; only an exact rule's breaker (one
/// resource, named by the rules file) has series of its own.
fn scrape(decider: &Decider) {
    use crate::metrics::*;
    use ::metrics::{counter, gauge};
    let figures = decider.views().figures();
    scrape_time(figures.keys, figures.key_bytes, figures.evicted);
    let installed = decider.views().installed();
    let mut by_rule: std::collections::BTreeMap<&str, [u64; 6]> =
        installed.rules.rules().iter().filter(|r| r.breaker.is_some()).map(|r| (r.name.as_str(), [0; 6])).collect();
    for b in decider.views().breakers() {
        let Some(rule) = installed.rules.find(&b.resource) else { continue };
        if let Some(counts) = by_rule.get_mut(rule.name.as_str()) {
            counts[usize::from(b.info.state.number() - 1)] += 1;
        }
        if rule.name != b.resource {
            continue;
        }
        let (resource, info) = (b.resource, b.info);
        gauge!(BREAKER_STATE, "resource" => resource.clone()).set(f64::from(info.state.number()));
        gauge!(BREAKER_FAILURE_RATE, "resource" => resource.clone()).set(info.window.failure_rate());
        gauge!(BREAKER_SLOW_CALL_RATE, "resource" => resource.clone()).set(info.window.slow_call_rate());
        counter!(BREAKER_NOT_PERMITTED, "resource" => resource).absolute(info.not_permitted);
    }
    for (rule, counts) in by_rule {
        for (state, n) in crate::breaker::State::ALL.into_iter().zip(counts) {
            gauge!(BREAKERS, "rule" => rule.to_string(), "state" => state.name()).set(n as f64);
        }
    }
    gauge!(PERMITS_IN_FLIGHT).set(figures.permits_in_flight as f64);
    concurrency_gauges(decider);
    for l in &figures.levels {
        let system = crate::metrics::system_label(&l.system);
        gauge!(DEGRADATION_LEVEL, "system" => system.clone()).set(f64::from(l.level));
        if l.system.is_empty() {
            continue;
        }
        let s = &l.signals;
        gauge!(crate::metrics::SYSTEM_INSTANCES, "system" => system.clone()).set(s.instances as f64);
        let signals = [
            ("error_rate", s.error_rate),
            ("slow_call_rate", s.slow_call_rate),
            ("latency_seconds", s.latency.map(|d| d.as_secs_f64())),
            ("cpu", s.cpu),
            ("memory", s.memory),
            ("queue_delay_seconds", s.queue_delay.map(|d| d.as_secs_f64())),
        ];
        for (name, value) in signals {
            let g = gauge!(crate::metrics::SYSTEM_SIGNAL, "system" => system.clone(), "signal" => name);
            g.set(value.unwrap_or(f64::NAN));
        }
    }
}
