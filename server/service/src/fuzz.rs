//! Entry points for the coverage-guided fuzzers (`fuzz/`) and for the test
//! that replays their corpus on every run of the suite: each takes arbitrary
//! bytes, the way a hostile client or a broken file would send them, and must
//! never panic, hang or allocate without bound.

use std::sync::{Arc, OnceLock};

use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use floodgate_proto::v1 as pb;
use prost::Message;

use crate::decider::{Decider, RlsHeaders, RlsOptions};
use crate::engine::{Engine, EngineConfig, Report, Request};
use crate::grpc::convert::FromWire;
use crate::grpc::convert::acquire::{AcquireWire, WireAcquire};
use crate::grpc::convert::envoy::{RlsWire, WireRequest};
use crate::rules::RuleSet;
use crate::rules::envoy::EnvoyConfig;
use crate::time::SystemClock;

/// Rules with every algorithm, keys, globs, a breaker and a concurrency limit.
const RULES: &str = r#"
tiers:
  gold: [ { name: g, key: [user], algorithm: fixed_window, limit: 9, window: 1s } ]
resources:
  - name: tb
    limits: [ { name: l, key: [user], algorithm: token_bucket, capacity: 5, refill_per_second: 1 } ]
    overrides: [ { when: { user: vip }, tier: gold } ]
  - name: gcra
    limits: [ { name: l, algorithm: gcra, rate_per_second: 2, burst: 3, lease: 1s } ]
  - name: shape
    limits: [ { name: l, algorithm: leaky_bucket, capacity: 4, leak_per_second: 2, mode: shape, max_wait: 1s } ]
  - name: fw
    limits: [ { name: l, key: [a, b], algorithm: fixed_window, limit: 3, window: 1s } ]
  - name: log
    limits: [ { name: l, algorithm: sliding_window_log, limit: 3, window: 1s } ]
  - name: priced
    usage: [a, b]
    limits:
      - { name: l, key: [user], algorithm: token_bucket, capacity: 50, refill_per_second: 1, cost: "a - b / 3 + 2 * b" }
      - { name: m, algorithm: fixed_window, limit: 9, window: 1s }
  - name: "svc.*"
    limits: [ { name: l, algorithm: sliding_window, limit: 3, window: 1s } ]
    breaker: { window: { kind: count, size: 4 }, minimum_calls: 2, wait_in_open: 1s }
    concurrency: { max_in_flight: 2 }
    max_breakers: 8
  - name: "*"
    shed_at_level: 3
"#;

/// An envoyproxy/ratelimit configuration with values, wildcards, nesting,
/// `unlimited`, `replaces` and `shadow_mode`.
const ENVOY: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 3, name: per_ip }
  - key: generic_key
    value: "a*"
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: tenant
    descriptors:
      - key: user
        rate_limit: { unit: week, requests_per_unit: 1, replaces: [ { name: per_ip } ] }
      - key: vip
        rate_limit: { unlimited: true }
  - key: bulk
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 0 }
"#;

fn engine() -> &'static (Arc<Engine>, Decider) {
    static ENGINE: OnceLock<(Arc<Engine>, Decider)> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let config = EngineConfig { max_keys: 10_000 };
        let e = Arc::new(Engine::new(config, Arc::new(SystemClock::new())));
        e.control().install(
            RuleSet::from_yaml(RULES, "fuzz").expect("the fuzz rules are valid"),
            RULES.into(),
            "fuzz".into(),
        );
        let envoy = EnvoyConfig::parse(&[("edge.yaml".into(), ENVOY.into())]).expect("the fuzz Envoy config is valid");
        e.control().install_envoy(envoy, ENVOY.into(), "fuzz".into(), String::new());
        let options = RlsOptions { headers: Some(RlsHeaders::RateLimit.into()), ..RlsOptions::default() };
        let decider = Decider::new(e.clone(), None).with_rls(options);
        (e, decider)
    })
}

/// An envoyproxy/ratelimit configuration file: parsed and validated, or
/// refused with errors; when valid, a few lookups in it.
pub fn envoy_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(config) = EnvoyConfig::parse(&[("fuzz.yaml".into(), text.into())]) {
        for domain in config.domains().collect::<Vec<_>>() {
            let _ = config.find(domain, &[("k", "v"), ("k2", "v2")]);
        }
    }
}

/// A rules file: parsed and validated, or refused with errors.
pub fn rules(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = RuleSet::from_yaml(text, "fuzz");
    }
}

/// A request body as a client would send it: the first byte picks the RPC,
/// the rest is the message, decoded, checked and decided (4: a Charge; 5:
/// Admin's SetOverrides, then a decision under each and their deletion; 6: a
/// Lease).
pub fn requests(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else { return };
    let (e, decider) = engine();
    let rules = e.rules();
    match kind % 7 {
        0 => {
            // Acquire is read in place: what prost reads, or prost is asked.
            let read = AcquireWire(bytes::Bytes::copy_from_slice(body)).read().map(|r| {
                r.map(|mut r| {
                    r.descriptors.sort_unstable();
                    format!("{r:?}")
                })
            });
            // Usage, or more descriptors than a decision takes, is left to
            // prost (which may refuse usage that ours only skipped).
            match (pb::AcquireRequest::decode(body), read) {
                (Ok(r), Ok(Some(ours))) => assert_eq!(ours, format!("{:?}", WireAcquire::from(&r))),
                (Ok(r), Ok(None)) => {
                    assert!(r.descriptors.len() > crate::rules::MAX_DESCRIPTORS || !r.usage.is_empty())
                }
                (Ok(_), Err(e)) => panic!("prost read what ours refused: {e:?}"),
                (Err(_), Ok(None)) => {}
                (Err(_), read) => assert!(read.is_err(), "prost refused {body:?}"),
            }
            if let Ok(r) = pb::AcquireRequest::decode(body)
                && let Ok(req) = Request::from_wire(&r)
            {
                let _ = e.acquire(&rules, &req);
            }
        }
        4 => {
            if let Ok(r) = pb::ChargeRequest::decode(body) {
                let usage = crate::grpc::convert::floodgate::usage(&r.usage).ok().flatten();
                let _ = e.charges().charge(&rules, &r.resource, &r.descriptors, r.cost, usage);
            }
        }
        1 => {
            if let Ok(b) = pb::AcquireBatchRequest::decode(body) {
                for r in b.requests.iter().take(crate::engine::request::MAX_BATCH) {
                    if let Ok(req) = Request::from_wire(r) {
                        let _ = e.acquire(&rules, &req);
                    }
                }
            }
        }
        2 => {
            if let Ok(r) = pb::ReportOutcomeRequest::decode(body)
                && let Ok(report) = Report::from_wire(&r)
            {
                let _ = e.outcomes().report(&rules, report.resource, report.permit_id, report.outcome, report.latency);
                let _ = e.charges().settle_estimate(
                    &rules,
                    report.permit_id,
                    report.resource,
                    report.actual_cost,
                    report.usage,
                );
            }
        }
        5 => {
            if let Ok(r) = pb::SetOverridesRequest::decode(body) {
                overrides(e, decider, &r);
            }
        }
        6 => {
            if let Ok(r) = pb::LeaseRequest::decode(body) {
                let _ = ready(decider.leasing().lease(&crate::grpc::convert::floodgate::lease_ask(&r, &r.descriptors)));
            }
        }
        _ => {
            // The RLS request is read in place: it must read exactly what
            // prost reads, and refuse what prost refuses.
            let wire = RlsWire(bytes::Bytes::copy_from_slice(body));
            let read = wire.read();
            match rls::RateLimitRequest::decode(body) {
                Ok(r) => assert_eq!(format!("{:?}", read.as_ref().ok()), format!("{:?}", Some(WireRequest::from(&r)))),
                Err(_) => assert!(read.is_err(), "prost refused {body:?}"),
            }
            if let Ok(r) = read
                && let Ok(ask) = crate::decider::RlsRequest::try_from(&r)
            {
                let _ = ready(decider.should_rate_limit(&ask));
            }
        }
    }
    e.outcomes().tick();
}

/// Sets the overrides, decides a call under each, deletes them.
fn overrides(e: &Engine, decider: &Decider, r: &pb::SetOverridesRequest) {
    let new = r.overrides.iter().take(16).map(crate::grpc::convert::overrides::new_override);
    let Ok(new) = new.collect::<Result<Vec<_>, _>>() else { return };
    let Ok(set) = ready(decider.control().set_overrides(new, "fuzz")) else { return };
    let rules = e.rules();
    for s in &set.specs {
        let d: std::collections::HashMap<String, String> = s.when.iter().cloned().collect();
        let req = Request::new(&s.rule, &d);
        let _ = e.acquire(&rules, &req);
    }
    let ids = set.specs.iter().map(|s| s.id.clone()).collect();
    ready(decider.control().delete_overrides(ids)).expect("deleting what was just set");
}

/// Polls `f` once: memory only, nothing here ever waits.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("a memory-only call waited"),
    }
}
