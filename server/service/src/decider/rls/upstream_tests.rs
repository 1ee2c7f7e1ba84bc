//! What envoyproxy/ratelimit does beyond matching: quota mode, custom header
//! names, the metadata of the descriptors that passed, and its stats,
//! through the decider on a fake clock.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::engine::{Engine, EngineConfig};
use crate::rules::envoy::EnvoyConfig;
use crate::time::ManualClock;

/// A whole minute since the epoch: every window starts empty.
const START: u64 = 1_700_006_400;

const ENVOY: &str = r#"
domain: edge
descriptors:
  - { key: user, rate_limit: { unit: minute, requests_per_unit: 10 } }
  - { key: bulk, rate_limit: { unit: minute, requests_per_unit: 10 } }
  - { key: trial, shadow_mode: true, rate_limit: { unit: minute, requests_per_unit: 2 } }
  - { key: ip, detailed_metric: true, rate_limit: { unit: minute, requests_per_unit: 1 } }
  - key: q1
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
    metadata: { service: { name: one, weight: 1 } }
  - key: q2
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
    metadata: { service: { name: two, zone: b }, extra: 7 }
  - { key: n, rate_limit: { unit: minute, requests_per_unit: 1 } }
  - { key: free, rate_limit: { unlimited: true } }
"#;

fn decider(options: RlsOptions) -> Decider {
    let clock = Arc::new(ManualClock::new(crate::time::Timestamp::from_secs(START)));
    let engine = Arc::new(Engine::new(EngineConfig { max_keys: usize::MAX }, clock));
    let envoy = EnvoyConfig::parse(&[("edge.yaml".into(), ENVOY.into())]).unwrap();
    engine.control().install_envoy(envoy, ENVOY.into(), "t".into(), String::new());
    Decider::new(engine, None).with_rls(options)
}

fn d<'a>(entries: &'a [(&'a str, &'a str)], hits: u64) -> RlsDescriptor<'a> {
    RlsDescriptor { entries, hits, limit: None }
}

fn call<'a>(dec: &Decider, descriptors: Vec<RlsDescriptor<'a>>) -> RlsAnswer {
    let req = RlsRequest { domain: "edge", descriptors: descriptors.into() };
    let mut call = std::pin::pin!(dec.should_rate_limit(&req));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match call.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(answer) => answer.unwrap(),
        std::task::Poll::Pending => panic!("a memory-only call never waits"),
    }
}

#[test]
fn quota_descriptors_deny_only_all_together() {
    let dec = decider(RlsOptions::default());
    let both = || vec![d(&[("q1", "a")], 1), d(&[("q2", "a")], 1)];
    let first = call(&dec, both());
    assert!(!first.over);
    let second = call(&dec, both());
    assert!(!second.over, "q1 is over but q2 is within: {second:?}");
    assert!(second.statuses[0].over && second.statuses[0].quota, "the descriptor itself says OVER_LIMIT");
    assert!(call(&dec, both()).over, "both over");
    // A descriptor not in quota mode decides on its own.
    assert!(!call(&dec, vec![d(&[("q2", "b")], 1), d(&[("n", "b")], 1)]).over);
    assert!(call(&dec, vec![d(&[("q2", "b")], 1), d(&[("n", "b")], 1)]).over, "n is over");
}

#[test]
fn the_global_quota_mode_needs_every_limited_descriptor_over() {
    let dec = decider(RlsOptions { quota: true, ..RlsOptions::default() });
    let ask = || vec![d(&[("n", "g")], 1), d(&[("nothing", "here")], 1), d(&[("free", "x")], 1)];
    assert!(!call(&dec, ask()).over);
    let second = call(&dec, ask());
    assert!(second.statuses[0].over, "n is over");
    assert!(!second.over, "a descriptor with no limit counts as a quota descriptor within it");
    assert!(call(&dec, vec![d(&[("n", "g")], 1), d(&[("free", "x")], 1)]).over, "unlimited ones do not count");
}

#[test]
fn headers_take_the_names_given_and_skip_over_quota_descriptors() {
    let names = HeaderNames { limit: "x-limit", remaining: "x-left", reset: "x-reset" };
    let dec = decider(RlsOptions { headers: Some(names), ..RlsOptions::default() });
    call(&dec, vec![d(&[("q1", "h")], 1)]);
    let a = call(&dec, vec![d(&[("q1", "h")], 1), d(&[("user", "h")], 1)]);
    assert_eq!(
        a.headers,
        [("x-limit", "1".to_string()), ("x-left", "0".into()), ("x-reset", "60".into())],
        "the least remaining, the over quota descriptor included"
    );
    call(&dec, vec![d(&[("n", "h")], 1)]);
    let b = call(&dec, vec![d(&[("user", "h2")], 1), d(&[("n", "h")], 1), d(&[("q2", "h")], 1)]);
    assert_eq!(b.headers[0], ("x-limit", "1".to_string()), "n is over and not in quota mode: its headers");
}

#[test]
fn the_metadata_of_descriptors_that_passed_is_handed_on() {
    let dec = decider(RlsOptions { dynamic_metadata: true, ..RlsOptions::default() });
    let a = call(&dec, vec![d(&[("q1", "m")], 1), d(&[("q2", "m")], 1), d(&[("user", "m")], 1)]);
    let names: Vec<&serde_json::Value> = a.metadata.iter().map(|m| &m["service"]["name"]).collect();
    assert_eq!(names, ["one", "two"], "in order, only limits that carry metadata");
    let b = call(&dec, vec![d(&[("q1", "m")], 1), d(&[("q2", "m")], 1)]);
    assert_eq!(b.metadata.len(), 1, "q1 is over now: {b:?}");
    assert_eq!(b.metadata[0]["extra"], 7);
    assert!(decider(RlsOptions::default()).rls.dynamic_metadata.eq(&false));
    assert!(call(&decider(RlsOptions::default()), vec![d(&[("q1", "m")], 1)]).metadata.is_empty(), "off by default");
}

/// Every series of upstream's stats /metrics would show, as
/// `name{label=value,...}`.
fn counters(dec: &Decider) -> HashMap<String, u64> {
    let mut text = String::new();
    dec.render_upstream_stats(&mut text);
    let samples = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty());
    samples
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.replace('"', ""), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn stats_split_hits_as_upstream_does() {
    let got = {
        let dec = decider(RlsOptions::default());
        // One hit at a time on 10 a minute (near from 8): 8 within, 2 near, 2 over; then 5 at once, over.
        let overs: Vec<bool> = (0..12).map(|_| call(&dec, vec![d(&[("user", "a")], 1)]).over).collect();
        assert_eq!(overs.iter().filter(|o| **o).count(), 2);
        call(&dec, vec![d(&[("user", "a")], 5)]);
        // Shadow mode: 2 a minute (near from 1), four hits, all answered OK.
        for _ in 0..4 {
            assert!(!call(&dec, vec![d(&[("trial", "t")], 1)]).over);
        }
        // Crossing: 9 (one of them near), then 3 (2 over, 1 near), denied.
        call(&dec, vec![d(&[("bulk", "b")], 9)]);
        assert!(call(&dec, vec![d(&[("bulk", "b")], 3)]).over);
        // Checks count nothing but the hits they carry (none).
        call(&dec, vec![d(&[("bulk", "b")], 0)]);
        // detailed_metric: the value names the series; dots of an address become _.
        call(&dec, vec![d(&[("ip", "10.0.0.1")], 1)]);
        call(&dec, vec![d(&[("ip", "10.0.0.1")], 1)]);
        // Unlimited and unmatched descriptors count nothing.
        call(&dec, vec![d(&[("free", "x")], 1), d(&[("nothing", "x")], 1)]);
        counters(&dec)
    };
    let c = |stat: &str, key1: &str| {
        let name = format!("ratelimit_service_rate_limit_{stat}{{domain=edge,key1={key1}}}");
        got.get(&name).copied().unwrap_or_else(|| panic!("no {name} in {got:?}"))
    };
    assert_eq!(
        [c("total_hits", "user"), c("within_limit", "user"), c("near_limit", "user"), c("over_limit", "user")],
        [17, 10, 2, 7]
    );
    assert_eq!(c("shadow_mode", "user"), 0);
    assert_eq!(
        [
            c("total_hits", "trial"),
            c("within_limit", "trial"),
            c("near_limit", "trial"),
            c("over_limit", "trial"),
            c("shadow_mode", "trial")
        ],
        [4, 2, 1, 2, 2]
    );
    assert_eq!(
        [c("total_hits", "bulk"), c("within_limit", "bulk"), c("near_limit", "bulk"), c("over_limit", "bulk")],
        [12, 9, 2, 2]
    );
    let ip = "ip_10_0_0_1";
    assert_eq!([c("total_hits", ip), c("within_limit", ip), c("over_limit", ip)], [2, 1, 1]);
    assert!(!got.keys().any(|k| k.contains("key1=free") || k.contains("key1=nothing")), "{got:?}");
}
