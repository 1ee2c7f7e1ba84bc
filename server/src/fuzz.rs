//! Entry points for the coverage-guided fuzzers (`fuzz/`) and for the test
//! that replays their corpus on every run of the suite: each takes arbitrary
//! bytes, the way a hostile client or a broken file would send them, and must
//! never panic, hang or allocate without bound.

use std::sync::{Arc, OnceLock};

use floodgate_proto::envoy::service::ratelimit::v3 as rls;
use floodgate_proto::v1 as pb;
use prost::Message;

use crate::engine::{Engine, EngineConfig, Report, Request};
use crate::grpc::convert::envoy::RlsAsk;
use crate::rules::RuleSet;
use crate::time::SystemClock;

/// Rules with every algorithm, keys, globs, a breaker and a concurrency limit.
const RULES: &str = r#"
resources:
  - name: tb
    limits: [ { name: l, key: [user], algorithm: token_bucket, capacity: 5, refill_per_second: 1 } ]
  - name: gcra
    limits: [ { name: l, algorithm: gcra, rate_per_second: 2, burst: 3 } ]
  - name: shape
    limits: [ { name: l, algorithm: leaky_bucket, capacity: 4, leak_per_second: 2, mode: shape, max_wait: 1s } ]
  - name: fw
    limits: [ { name: l, key: [a, b], algorithm: fixed_window, limit: 3, window: 1s } ]
  - name: log
    limits: [ { name: l, algorithm: sliding_window_log, limit: 3, window: 1s } ]
  - name: "svc.*"
    limits: [ { name: l, algorithm: sliding_window, limit: 3, window: 1s } ]
    breaker: { window: { kind: count, size: 4 }, minimum_calls: 2, wait_in_open: 1s }
    concurrency: { max_in_flight: 2 }
    max_breakers: 8
  - name: "*"
    shed_at_level: 3
"#;

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let e = Engine::new(EngineConfig { max_keys: 10_000, replicated: false }, Arc::new(SystemClock::new()));
        e.install(RuleSet::from_yaml(RULES, "fuzz").expect("the fuzz rules are valid"), RULES.into(), "fuzz".into());
        e
    })
}

/// A rules file: parsed and validated, or refused with errors.
pub fn rules(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = RuleSet::from_yaml(text, "fuzz");
    }
}

/// A request body as a client would send it: the first byte picks the RPC,
/// the rest is the message, decoded, checked and decided.
pub fn requests(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else { return };
    let e = engine();
    let rules = e.rules();
    match kind % 4 {
        0 => {
            if let Ok(r) = pb::AcquireRequest::decode(body) {
                let _ = e.acquire(&rules, &Request::from(&r));
            }
        }
        1 => {
            if let Ok(b) = pb::AcquireBatchRequest::decode(body) {
                for r in b.requests.iter().take(crate::engine::request::MAX_BATCH) {
                    let _ = e.acquire(&rules, &Request::from(r));
                }
            }
        }
        2 => {
            if let Ok(r) = pb::ReportOutcomeRequest::decode(body)
                && let Ok(report) = Report::try_from(&r)
            {
                let _ = e.report(&rules, report.resource, report.permit_id, report.outcome, report.latency);
            }
        }
        _ => {
            if let Ok(r) = rls::RateLimitRequest::decode(body)
                && let Ok(ask) = RlsAsk::try_from(&r)
            {
                for req in ask.requests() {
                    let _ = e.acquire(&rules, &req);
                }
            }
        }
    }
    e.tick();
}
