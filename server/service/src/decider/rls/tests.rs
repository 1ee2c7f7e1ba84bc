//! ShouldRateLimit semantics through the decider, memory only, on a fake clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::breaker::Outcome;
use crate::engine::{Engine, EngineConfig, Request};
use crate::rules::RuleSet;
use crate::rules::envoy::EnvoyConfig;
use crate::time::ManualClock;

/// 1_700_006_400 is a whole day (and minute) since the epoch: a Monday.
const START: u64 = 1_700_006_400;

const ENVOY: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 4, name: per_ip }
  - key: generic_key
    value: foo
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: tenant
    descriptors:
      - key: user
        rate_limit: { unit: week, requests_per_unit: 2 }
      - key: vip
        rate_limit: { unlimited: true }
  - key: bulk
    rate_limit: { unit: hour, requests_per_unit: 100, replaces: [ { name: per_ip } ] }
  - key: trial
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: path
    value: "/shared/*"
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: path
    value: "/own/*"
    descriptors:
      - key: method
        rate_limit: { unit: minute, requests_per_unit: 2 }
"#;

const RULES: &str = r#"
resources:
  - name: api
    limits:
      - { name: all, algorithm: fixed_window, limit: 4, window: 1m }
      - { name: per_user, key: [user], algorithm: fixed_window, limit: 3, window: 1m }
  - name: db
    concurrency: { max_in_flight: 1, permit_ttl: 1h }
    limits: [ { name: all, algorithm: fixed_window, limit: 1000, window: 1h } ]
  - name: pay
    breaker: { window: { kind: count, size: 4 }, minimum_calls: 1, wait_in_open: 5s, half_open_calls: 1 }
  - name: trial
    limits: [ { name: one, algorithm: fixed_window, limit: 1, window: 1m, shadow: true } ]
  - name: every
    limits:
      - { name: tb, key: [a], algorithm: token_bucket, capacity: 3, refill_per_second: 1 }
      - { name: gcra, key: [b], algorithm: gcra, rate_per_second: 2, burst: 3 }
      - { name: leaky, key: [c], algorithm: leaky_bucket, capacity: 3, leak_per_second: 1 }
      - { name: log, key: [d], algorithm: sliding_window_log, limit: 3, window: 1s }
      - { name: sliding, key: [e], algorithm: sliding_window, limit: 3, window: 1s }
"#;

fn decider(options: RlsOptions) -> (Decider, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(crate::time::Timestamp::from_secs(START)));
    let engine = Arc::new(Engine::new(EngineConfig { max_keys: usize::MAX }, clock.clone()));
    engine.control().install(RuleSet::from_yaml(RULES, "t").unwrap(), RULES.into(), "t".into());
    let envoy = EnvoyConfig::parse(&[("edge.yaml".into(), ENVOY.into())]).unwrap();
    engine.control().install_envoy(envoy, ENVOY.into(), "t".into(), String::new());
    (Decider::new(engine, None).with_rls(options), clock)
}

fn d<'a>(entries: &'a [(&'a str, &'a str)]) -> RlsDescriptor<'a> {
    RlsDescriptor { entries, hits: 1, limit: None }
}

fn call<'a>(dec: &Decider, domain: &'a str, descriptors: Vec<RlsDescriptor<'a>>) -> RlsAnswer {
    let req = RlsRequest { domain, descriptors: descriptors.into() };
    let mut call = std::pin::pin!(dec.should_rate_limit(&req));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match call.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(answer) => answer.unwrap(),
        std::task::Poll::Pending => panic!("a memory-only call never waits"),
    }
}

/// The overall verdicts of `n` calls of one descriptor.
fn overs(dec: &Decider, domain: &str, entries: &[(&str, &str)], n: usize) -> Vec<bool> {
    (0..n).map(|_| call(dec, domain, vec![d(entries)]).over).collect()
}

fn shown(name: &str, requests_per_unit: u32, unit: Unit) -> Option<Shown> {
    Some(Shown { name: name.into(), requests_per_unit, unit })
}

#[test]
fn an_envoy_limit_admits_exactly_its_count_and_shows_itself() {
    let (dec, clock) = decider(RlsOptions::default());
    clock.advance(Duration::from_secs(15));
    let ip = [("remote_address", "10.0.0.1")];
    let first = call(&dec, "edge", vec![d(&ip)]);
    assert_eq!(
        first.statuses[0],
        RlsStatus {
            over: false,
            limit: shown("per_ip", 4, Unit::Minute),
            remaining: 3,
            reset: Some(Duration::from_secs(45)),
            quota: false,
        }
    );
    assert_eq!(overs(&dec, "edge", &ip, 4), [false, false, false, true]);
    let over = call(&dec, "edge", vec![d(&ip)]);
    assert!(over.over && over.statuses[0].over);
    assert_eq!(over.statuses[0].remaining, 0);
    assert_eq!(overs(&dec, "edge", &[("remote_address", "10.0.0.2")], 1), [false], "counted per value");
    clock.advance(Duration::from_secs(45));
    assert_eq!(overs(&dec, "edge", &ip, 1), [false], "a new minute");
}

#[test]
fn share_threshold_makes_every_value_a_wildcard_matches_share_one_counter() {
    let (dec, _) = decider(RlsOptions::default());
    let get = |path| [("path", path), ("method", "GET")];
    // Under `/shared/*` every path counts against one counter per method...
    assert_eq!(overs(&dec, "edge", &get("/shared/a"), 1), [false]);
    assert_eq!(overs(&dec, "edge", &get("/shared/b"), 2), [false, true]);
    assert_eq!(overs(&dec, "edge", &[("path", "/shared/c"), ("method", "PUT")], 1), [false], "per method still");
    // ...under `/own/*` each path has its own, as upstream without the flag.
    assert_eq!(overs(&dec, "edge", &get("/own/a"), 2), [false, false]);
    assert_eq!(overs(&dec, "edge", &get("/own/b"), 3), [false, false, true]);
}

#[test]
fn values_nesting_and_week_units_match_upstream() {
    let (dec, _) = decider(RlsOptions::default());
    assert_eq!(overs(&dec, "edge", &[("generic_key", "foo")], 2), [false, true]);
    assert_eq!(overs(&dec, "edge", &[("generic_key", "bar")], 3), [false; 3], "no key-only entry: no limit");
    let user = [("tenant", "acme"), ("user", "u1")];
    let a = call(&dec, "edge", vec![d(&user)]);
    // Monday 00:00 UTC is 4 days into an epoch-aligned week (the epoch was a Thursday).
    let week_left = Duration::from_secs(604_800 - (START % 604_800));
    assert_eq!(a.statuses[0].limit, shown("", 2, Unit::Week));
    assert_eq!(a.statuses[0].reset, Some(week_left));
    assert_eq!(overs(&dec, "edge", &user, 2), [false, true]);
    let vip = call(&dec, "edge", vec![d(&[("tenant", "acme"), ("vip", "x")])]);
    assert_eq!(vip.statuses[0], RlsStatus { over: false, limit: None, remaining: u32::MAX, reset: None, quota: false });
    let unknown = call(&dec, "nowhere", vec![d(&[("remote_address", "1")])]);
    assert_eq!(unknown.statuses[0], RlsStatus { over: false, limit: None, remaining: 0, reset: None, quota: false });
}

#[test]
fn hits_zero_only_checks_and_a_cost_above_capacity_is_over_the_limit() {
    let (dec, _) = decider(RlsOptions::default());
    let ip = [("remote_address", "10.0.0.9")];
    let check = RlsDescriptor { hits: 0, ..d(&ip) };
    for _ in 0..10 {
        let a = call(&dec, "edge", vec![check.clone()]);
        assert!(!a.over);
        assert_eq!(a.statuses[0].remaining, 4, "nothing taken");
    }
    let huge = RlsDescriptor { hits: 5, ..d(&ip) };
    let a = call(&dec, "edge", vec![huge]);
    assert!(a.over, "5 hits on a limit of 4 is OVER_LIMIT, not an error");
    let beyond = RlsDescriptor { hits: u64::MAX, ..d(&ip) };
    assert!(call(&dec, "edge", vec![beyond]).over);
    assert_eq!(overs(&dec, "edge", &ip, 5), [false, false, false, false, true], "the denied costs took nothing");
}

#[test]
fn replaces_unlimited_and_shadow_mode() {
    let (dec, _) = decider(RlsOptions::default());
    let ip = [("remote_address", "10.1.1.1")];
    for _ in 0..6 {
        let a = call(&dec, "edge", vec![d(&ip), d(&[("bulk", "b")])]);
        assert!(!a.over, "per_ip is replaced by bulk's limit");
        assert_eq!(a.statuses[0].limit, None);
        assert_eq!(a.statuses[1].limit, shown("", 100, Unit::Hour));
    }
    assert_eq!(overs(&dec, "edge", &ip, 1), [false], "per_ip took nothing while replaced");
    let trial = [("trial", "t")];
    let statuses: Vec<RlsStatus> = (0..3).map(|_| call(&dec, "edge", vec![d(&trial)]).statuses.remove(0)).collect();
    assert!(statuses.iter().all(|s| !s.over), "shadow mode never denies: {statuses:?}");
    assert_eq!(statuses[2].remaining, 0, "but shows the limit used up");
}

#[test]
fn the_global_shadow_mode_answers_ok_and_keeps_each_status() {
    let (dec, _) = decider(RlsOptions { shadow: true, ..RlsOptions::default() });
    let foo = [("generic_key", "foo")];
    assert!(!call(&dec, "edge", vec![d(&foo)]).over);
    let second = call(&dec, "edge", vec![d(&foo)]);
    assert!(!second.over, "overall OK");
    assert!(second.statuses[0].over, "the descriptor still says OVER_LIMIT");
}

#[test]
fn a_limit_envoy_sends_replaces_the_configured_one_on_known_domains() {
    let (dec, _) = decider(RlsOptions::default());
    let o = |entries| RlsDescriptor { limit: Some((2, Unit::Hour)), ..d(entries) };
    let ip = [("remote_address", "10.2.2.2")];
    let a = call(&dec, "edge", vec![o(&ip)]);
    assert_eq!(a.statuses[0].limit, shown("", 2, Unit::Hour));
    assert!(!call(&dec, "edge", vec![o(&ip)]).over);
    assert!(call(&dec, "edge", vec![o(&ip)]).over);
    assert_eq!(overs(&dec, "edge", &ip, 1), [false], "the configured limit is a different counter");
    assert!(!call(&dec, "api", vec![o(&[("x", "1")])]).over, "our rules' domains are known too");
    for _ in 0..3 {
        assert!(!call(&dec, "nowhere", vec![o(&[("x", "1")])]).over, "an unknown domain has no limit");
    }
}

#[test]
fn our_rules_charge_a_bucket_once_per_request() {
    let (dec, _) = decider(RlsOptions::default());
    // Envoy sends one descriptor per rate_limits entry: "all" matches each.
    let users =
        [[("user", "u0")], [("user", "u1")], [("user", "u2")], [("user", "u3")], [("user", "u4")], [("user", "u5")]];
    let two = |i: usize| vec![d(&[("remote_address", "1.2.3.4")]), d(&users[i])];
    let got: Vec<bool> = (0..5).map(|i| call(&dec, "api", two(i)).over).collect();
    assert_eq!(got, [false, false, false, false, true], "4 per minute is 4 requests");
    let a = call(&dec, "api", two(5));
    assert_eq!(a.statuses[0].limit, shown("all", 4, Unit::Minute));
    assert!(a.statuses[0].over && a.statuses[1].over, "the shared bucket denies both: {a:?}");
}

#[test]
fn a_concurrency_limit_only_gates_and_never_leaks() {
    let (dec, _) = decider(RlsOptions::default());
    assert_eq!(overs(&dec, "db", &[("k", "v")], 10), [false; 10], "max_in_flight 1, and no permit is taken");
    assert_eq!(dec.views().figures().permits_in_flight, 0);
    let rules = dec.engine.rules();
    let none = HashMap::<String, String>::new();
    let held = dec.engine.acquire(&rules, &Request::new("db", &none));
    let permit = held.unwrap().permit_id.expect("a permit");
    drop(rules);
    assert_eq!(overs(&dec, "db", &[("k", "v")], 2), [true, true], "the slot is held by an Acquire caller");
    dec.engine.outcomes().report(&dec.engine.rules(), "db", &permit.to_string(), Outcome::Success, None).unwrap();
    assert_eq!(overs(&dec, "db", &[("k", "v")], 1), [false]);
}

#[test]
fn a_breaker_lets_rls_through_only_when_closed_and_never_takes_a_probe() {
    let (dec, clock) = decider(RlsOptions::default());
    let none = HashMap::<String, String>::new();
    let acquire = || {
        let rules = dec.engine.rules();
        let a = dec.engine.acquire(&rules, &Request::new("pay", &none));
        a.unwrap().permit_id
    };
    let permit = acquire().unwrap();
    dec.engine.outcomes().report(&dec.engine.rules(), "pay", &permit.to_string(), Outcome::Failure, None).unwrap();
    let open = call(&dec, "pay", vec![d(&[("k", "v")])]);
    assert!(open.over, "OPEN");
    assert_eq!(open.statuses[0].reset, Some(Duration::from_secs(5)), "retry when the breaker may probe");
    clock.advance(Duration::from_secs(6));
    assert_eq!(overs(&dec, "pay", &[("k", "v")], 3), [true; 3], "the probe is kept for a caller that reports");
    let probe = acquire().expect("an Acquire caller still gets the probe");
    dec.engine.outcomes().report(&dec.engine.rules(), "pay", &probe.to_string(), Outcome::Success, None).unwrap();
    assert_eq!(overs(&dec, "pay", &[("k", "v")], 3), [false; 3], "CLOSED again");
    assert_eq!(dec.views().figures().permits_in_flight, 0);
}

#[test]
fn shadow_limits_of_our_rules_never_deny() {
    let (dec, _) = decider(RlsOptions::default());
    assert_eq!(overs(&dec, "trial", &[("k", "v")], 3), [false; 3]);
}

#[test]
fn every_algorithm_answers_a_cost_above_capacity_as_over_and_takes_nothing() {
    let (dec, _) = decider(RlsOptions::default());
    for key in ["a", "b", "c", "d", "e"] {
        // Empty, then with one unit taken: both states answer too big a cost.
        for (entries, left) in [([(key, "x")], 3), ([(key, "y")], 2)] {
            if left == 2 {
                assert!(!call(&dec, "every", vec![d(&entries)]).over);
            }
            for hits in [4, 1_000, u64::from(u32::MAX) + 1, u64::MAX] {
                let a = call(&dec, "every", vec![RlsDescriptor { hits, ..d(&entries) }]);
                assert!(a.over, "{key}: {hits} hits on a capacity of 3");
            }
            let a = call(&dec, "every", vec![RlsDescriptor { hits: left, ..d(&entries) }]);
            assert!(!a.over, "{key}: what was left is still there: {a:?}");
        }
    }
}

#[test]
fn limits_are_shown_exactly_in_envoy_units_and_never_as_zero() {
    let rules = RuleSet::from_yaml(
        r#"
resources:
  - name: r
    limits:
      - { name: week, algorithm: fixed_window, limit: 1, window: 7d }
      - { name: odd, algorithm: fixed_window, limit: 7, window: 90s }
      - { name: minute, algorithm: sliding_window, limit: 4, window: 1m }
      - { name: tb, algorithm: token_bucket, capacity: 3, refill_per_second: 1 }
      - { name: gcra, algorithm: gcra, rate_per_second: 100, burst: 10 }
      - { name: slow, algorithm: fixed_window, limit: 1, window: 400d }
      - { name: prime, algorithm: fixed_window, limit: 7, window: 11s }
"#,
        "t",
    )
    .unwrap();
    let got: Vec<(u32, Unit)> =
        rules.rules()[0].limits.iter().map(super::shown).map(|s| (s.requests_per_unit, s.unit)).collect();
    assert_eq!(
        got,
        [
            (1, Unit::Week),
            (280, Unit::Hour),
            (4, Unit::Minute),
            (1, Unit::Second),
            (100, Unit::Second),
            (1, Unit::Year),
            (38, Unit::Minute),
        ]
    );
}

#[test]
fn headers_come_from_the_descriptor_nearest_its_limit() {
    let (dec, clock) = decider(RlsOptions { headers: Some(RlsHeaders::RateLimit.into()), ..RlsOptions::default() });
    clock.advance(Duration::from_secs(20));
    let a = call(&dec, "edge", vec![d(&[("remote_address", "9.9.9.9")]), d(&[("generic_key", "foo")])]);
    assert_eq!(
        a.headers,
        [("RateLimit-Limit", "1".to_string()), ("RateLimit-Remaining", "0".into()), ("RateLimit-Reset", "1".into())]
    );
    let (dec, _) = decider(RlsOptions { headers: Some(RlsHeaders::XRateLimit.into()), ..RlsOptions::default() });
    let a = call(&dec, "edge", vec![d(&[("remote_address", "9.9.9.9")])]);
    assert_eq!(a.headers[0], ("X-RateLimit-Limit", "4".to_string()));
    assert_eq!(a.headers[1], ("X-RateLimit-Remaining", "3".to_string()));
    assert!(call(&dec, "nowhere", vec![d(&[("k", "v")])]).headers.is_empty(), "no limit, no headers");
}

#[test]
fn bad_input_is_an_error_naming_the_descriptor() {
    let (dec, _) = decider(RlsOptions::default());
    let long = "x".repeat(300);
    let entries = [(long.as_str(), "v")];
    let req = RlsRequest { domain: "edge", descriptors: SmallVec::from_vec(vec![d(&[("k", "v")]), d(&entries)]) };
    let mut fut = std::pin::pin!(dec.should_rate_limit(&req));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let std::task::Poll::Ready(Err(e)) = fut.as_mut().poll(&mut cx) else { panic!("an error") };
    assert!(e.to_string().starts_with("descriptors[1]"), "{e}");
    let empty = RlsRequest { domain: "edge", descriptors: SmallVec::new() };
    let mut fut = std::pin::pin!(dec.should_rate_limit(&empty));
    assert!(matches!(fut.as_mut().poll(&mut cx), std::task::Poll::Ready(Err(_))));
}

#[test]
fn a_long_value_is_decided_and_counted_by_its_own_digest() {
    let (dec, _) = decider(RlsOptions::default());
    // Two values alike in their first 10 kB: a long path or header is still
    // a value of its own, never an error that Envoy's failure mode decides.
    let a = format!("{}a", "/p".repeat(5_000));
    let b = format!("{}b", "/p".repeat(5_000));
    assert_eq!(overs(&dec, "edge", &[("remote_address", &a)], 5), [false, false, false, false, true]);
    assert_eq!(overs(&dec, "edge", &[("remote_address", &b)], 4), [false; 4], "its own counter");
    // A short value spelled like the long one's digest is not its counter.
    let spelled = crate::digest::digest(&a);
    assert_eq!(overs(&dec, "edge", &[("remote_address", &spelled)], 4), [false; 4], "not the long value's counter");
}
