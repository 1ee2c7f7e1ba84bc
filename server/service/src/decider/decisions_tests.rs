//! The decision log on its own: what it keeps, how much, and how it is read.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::engine::{Engine, EngineConfig};
use crate::rules::RuleSet;
use crate::time::{ManualClock, Timestamp};

const RULES: &str = r#"
resources:
  - name: chat
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 2, window: 1m }
      - { name: all, algorithm: fixed_window, limit: 100, window: 1m }
      - { name: trial, key: [user], algorithm: fixed_window, limit: 1, window: 1m, shadow: true }
"#;

fn engine() -> Arc<Engine> {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_700_006_400)));
    let engine = Arc::new(Engine::new(EngineConfig { max_keys: usize::MAX }, clock));
    engine.control().install(RuleSet::from_yaml(RULES, "t").unwrap(), RULES.into(), "t".into());
    engine
}

/// Decides `n` calls of `user` on `resource` and offers each to the log.
fn decide(engine: &Engine, log: &DecisionLog, resource: &str, user: &str, n: usize) {
    let rules = engine.rules();
    let descriptors = HashMap::from([("user".to_string(), user.to_string())]);
    for _ in 0..n {
        let req = Request::new(resource, &descriptors);
        let answer = engine.acquire(&rules, &req).unwrap();
        if log.wants() {
            log.keep(&req, &answer);
        }
    }
}

fn everything() -> DecisionQuery {
    DecisionQuery { count: MAX_READ, ..DecisionQuery::default() }
}

#[test]
fn an_empty_share_keeps_nothing() {
    let (e, log) = (engine(), DecisionLog::new(0.0, 10).unwrap());
    decide(&e, &log, "chat", "u1", 5);
    assert!(!log.wants());
    assert_eq!((log.kept(), log.read(&everything()).0.len()), (0, 0));
}

#[test]
fn a_kept_decision_names_the_limit_that_denied_and_every_limit_evaluated() {
    let (e, log) = (engine(), DecisionLog::new(1.0, 10).unwrap());
    decide(&e, &log, "chat", "u1", 3);
    let kept = log.read(&everything()).0;
    assert_eq!(kept.len(), 3);
    // Newest first: the third call, denied by `per-user` (2 a minute).
    let denied = &kept[0];
    assert_eq!(denied.verdict, Verdict::RateLimited);
    assert_eq!(denied.decided_by, vec!["per-user".to_string()]);
    assert_eq!(denied.rule, "chat");
    assert_eq!(denied.descriptors, vec![("user".to_string(), "u1".to_string())]);
    let names: Vec<&str> = denied.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["per-user", "all", "trial"]);
    let trial = &denied.limits[2];
    assert!(trial.exceeded && trial.shadow, "the shadow limit would have denied: {trial:?}");
    assert!(denied.reason.contains("per-user"), "{}", denied.reason);
    // The second call was admitted, with the shadow limit exceeded.
    let allowed = &kept[1];
    assert_eq!(allowed.verdict, Verdict::Allowed);
    assert!(allowed.decided_by.is_empty() && allowed.reason.is_empty(), "{allowed:?}");
    assert!(allowed.limits[2].exceeded);
}

#[test]
fn an_unknown_resource_says_no_rule_matched_when_denied_or_nothing_when_allowed() {
    let (e, log) = (engine(), DecisionLog::new(1.0, 10).unwrap());
    decide(&e, &log, "nowhere", "u1", 1);
    let kept = log.read(&everything()).0;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].rule, "");
    // Unknown resources are admitted by default.
    assert_eq!(kept[0].verdict, Verdict::Allowed);
    assert!(kept[0].decided_by.is_empty());
}

#[test]
fn the_log_holds_its_capacity_and_drops_the_oldest() {
    let (e, log) = (engine(), DecisionLog::new(1.0, 3).unwrap());
    for user in ["a", "b", "c", "d", "e"] {
        decide(&e, &log, "chat", user, 1);
    }
    let users: Vec<String> = log.read(&everything()).0.into_iter().map(|d| d.descriptors[0].1.clone()).collect();
    assert_eq!(users, ["e", "d", "c"]);
    assert_eq!(log.kept(), 5);
}

#[test]
fn the_log_holds_its_bytes_however_long_the_descriptors() {
    let e = engine();
    let log = DecisionLog { max_bytes: 8 * 1024, ..DecisionLog::new(1.0, 1000).unwrap() };
    let long = "x".repeat(crate::rules::MAX_NAME_BYTES);
    decide(&e, &log, "chat", &long, 100);
    let kept = log.read(&everything()).0;
    let held = log.held.lock().unwrap();
    assert!(held.bytes <= 8 * 1024, "{} bytes held", held.bytes);
    assert_eq!(held.bytes, held.decisions.iter().map(Logged::bytes).sum::<usize>());
    let one = held.decisions[0].bytes();
    assert!(one > crate::rules::MAX_NAME_BYTES, "a decision counts its descriptors: {one} bytes");
    assert_eq!(kept.len(), 8 * 1024 / one, "as many as fit in 8 KiB, at {one} bytes each");
    assert_eq!(log.kept(), 100);
}

#[test]
fn a_share_keeps_about_that_share() {
    let (e, log) = (engine(), DecisionLog::new(0.25, MAX_CAPACITY).unwrap());
    decide(&e, &log, "nowhere", "u", 20_000);
    let kept = log.kept();
    assert!((4_500..=5_500).contains(&kept), "kept {kept} of 20000 at 25%");
}

#[test]
fn a_share_outside_zero_to_one_is_refused_and_changes_nothing() {
    let log = DecisionLog::new(0.5, 10).unwrap();
    for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
        assert!(log.set_share(bad).is_err(), "{bad}");
    }
    assert_eq!(log.share(), 0.5);
    assert_eq!(log.set_share(1.0).unwrap(), 0.5);
    assert_eq!(log.set_share(0.0).unwrap(), 1.0);
    assert!(DecisionLog::new(2.0, 10).is_err());
}

#[test]
fn a_read_filters_by_resource_descriptors_and_denials() {
    let (e, log) = (engine(), DecisionLog::new(1.0, 100).unwrap());
    decide(&e, &log, "chat", "u1", 3);
    decide(&e, &log, "chat", "u2", 1);
    decide(&e, &log, "nowhere", "u1", 1);
    let q = |resource: &str, user: Option<&str>, denied_only: bool| DecisionQuery {
        resource: resource.into(),
        descriptors: user.map(|u| vec![("user".to_string(), u.to_string())]).unwrap_or_default(),
        denied_only,
        count: 0,
    };
    assert_eq!(log.read(&q("", None, false)).0.len(), 5);
    assert_eq!(log.read(&q("chat", None, false)).0.len(), 4);
    assert_eq!(log.read(&q("", Some("u1"), false)).0.len(), 4);
    assert_eq!(log.read(&q("chat", Some("u1"), true)).0.len(), 1);
    assert_eq!(log.read(&q("chat", Some("u3"), false)).0.len(), 0);
    assert_eq!(log.read(&DecisionQuery { count: 2, ..q("", None, false) }).0.len(), 2);
}

#[test]
fn one_read_returns_at_most_its_bytes_and_says_more_matched() {
    let (e, log) = (engine(), DecisionLog::new(1.0, MAX_CAPACITY).unwrap());
    let long = "x".repeat(crate::rules::MAX_NAME_BYTES);
    decide(&e, &log, "chat", &long, 10_000);
    let (read, more) = log.read(&everything());
    let bytes: usize = read.iter().map(Logged::bytes).sum();
    assert!(more, "10,000 decisions of {} bytes do not fit", read[0].bytes());
    assert!(
        bytes <= MAX_READ_BYTES && bytes + read[0].bytes() > MAX_READ_BYTES,
        "{} decisions, {bytes} bytes",
        read.len()
    );
    let (few, more) = log.read(&DecisionQuery { count: 5, ..everything() });
    assert_eq!((few.len(), more), (5, false));
}
