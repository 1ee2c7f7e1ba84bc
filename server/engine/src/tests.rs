use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::time::{ManualClock, Timestamp};

const RULES: &str = r#"
resources:
  - name: orders
    limits:
      - { name: global, algorithm: token_bucket, capacity: 5, refill_per_second: 1 }
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 2, window: 1m }
  - name: "payments.*"
    limits:
      - { name: each, algorithm: fixed_window, limit: 1, window: 1m }
  - name: open
"#;

/// An engine on a fake clock with `yaml` installed.
pub(super) fn engine(yaml: &str) -> (Engine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_700_006_400)));
    let engine = Engine::new(EngineConfig { max_keys: usize::MAX }, clock.clone());
    engine.control().install(RuleSet::from_yaml(yaml, "test.yaml").unwrap(), yaml.into(), "test".into());
    (engine, clock)
}

fn d(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn ask(
    e: &Engine,
    resource: &str,
    descriptors: &HashMap<String, String>,
    cost: u32,
) -> Result<(Verdict, Vec<u64>), RequestError> {
    let rules = e.rules();
    let out = e.acquire(&rules, &Request { cost, ..Request::new(resource, descriptors) })?;
    Ok((out.verdict, out.limits.iter().map(|l| l.status.remaining).collect()))
}

#[test]
fn a_denial_by_one_limit_takes_nothing_from_the_others() {
    let (e, _) = engine(RULES);
    let u1 = d(&[("user", "u1")]);
    assert_eq!(ask(&e, "orders", &u1, 1).unwrap(), (Verdict::Allowed, vec![4, 1]));
    assert_eq!(ask(&e, "orders", &u1, 1).unwrap(), (Verdict::Allowed, vec![3, 0]));
    // per-user denies: global keeps its 3 tokens.
    assert_eq!(ask(&e, "orders", &u1, 1).unwrap(), (Verdict::RateLimited, vec![3, 0]));
    assert_eq!(ask(&e, "orders", &u1, 1).unwrap(), (Verdict::RateLimited, vec![3, 0]));
    let u2 = d(&[("user", "u2")]);
    assert_eq!(ask(&e, "orders", &u2, 2).unwrap(), (Verdict::Allowed, vec![1, 0]));
}

#[test]
fn a_keyed_limit_applies_only_when_its_descriptors_are_present() {
    let (e, _) = engine(RULES);
    let none = d(&[]);
    for remaining in (0..5).rev() {
        assert_eq!(ask(&e, "orders", &none, 1).unwrap(), (Verdict::Allowed, vec![remaining]));
    }
    let (verdict, _) = ask(&e, "orders", &none, 1).unwrap();
    assert_eq!(verdict, Verdict::RateLimited);
}

#[test]
fn the_denial_names_the_limit_and_when_to_retry() {
    let (e, _) = engine(RULES);
    let u1 = d(&[("user", "u1")]);
    let rules = e.rules();
    let req = Request { cost: 2, ..Request::new("orders", &u1) };
    e.acquire(&rules, &req).unwrap();
    let out = e.acquire(&rules, &req).unwrap();
    assert_eq!(out.verdict, Verdict::RateLimited);
    assert_eq!(out.retry_after, Duration::from_secs(60));
    assert_eq!(out.reason(), "limit 'per-user' (fixed_window 2 per 1m) exceeded, retry in 1m");
    assert!(!out.limits[0].exceeded && out.limits[1].exceeded);
}

#[test]
fn glob_rules_keep_buckets_per_resource() {
    let (e, _) = engine(RULES);
    let none = d(&[]);
    assert_eq!(ask(&e, "payments.charge", &none, 1).unwrap().0, Verdict::Allowed);
    assert_eq!(ask(&e, "payments.charge", &none, 1).unwrap().0, Verdict::RateLimited);
    assert_eq!(ask(&e, "payments.refund", &none, 1).unwrap().0, Verdict::Allowed);
}

#[test]
fn unmatched_and_limitless_resources_are_allowed() {
    let (e, _) = engine(RULES);
    assert_eq!(ask(&e, "nothing matches", &d(&[]), 1).unwrap(), (Verdict::Allowed, vec![]));
    assert_eq!(ask(&e, "open", &d(&[]), 1).unwrap(), (Verdict::Allowed, vec![]));
}

#[test]
fn a_cost_beyond_capacity_is_an_error_and_changes_nothing() {
    let (e, _) = engine(RULES);
    let u1 = d(&[("user", "u1")]);
    let err = ask(&e, "orders", &u1, 3).unwrap_err();
    assert_eq!(err.to_string(), "cost 3 exceeds capacity 2 of limit 'per-user'");
    assert!(e.buckets().is_empty());
    assert_eq!(ask(&e, "orders", &u1, 2).unwrap(), (Verdict::Allowed, vec![3, 0]));
    let err = ask(&e, "", &u1, 1).unwrap_err();
    assert_eq!(err.to_string(), "resource: must not be empty");
}

/// A shadow limit never changes the answer, not even to an error: a cost
/// beyond its capacity is what it would have denied (before, such a call
/// was INVALID_ARGUMENT, so trying a shadow limit on live traffic broke
/// the calls that cost more than it holds).
#[test]
fn a_cost_beyond_a_shadow_limits_capacity_is_only_reported() {
    let yaml = r#"
resources:
  - name: trial
    limits:
      - { name: real, algorithm: fixed_window, limit: 1000, window: 1m }
      - { name: tried, algorithm: fixed_window, limit: 100, window: 1m, shadow: true }
"#;
    let (e, _) = engine(yaml);
    let rules = e.rules();
    let none = d(&[]);
    let out = e.acquire(&rules, &Request { cost: 500, ..Request::new("trial", &none) }).unwrap();
    assert_eq!(out.verdict, Verdict::Allowed);
    assert_eq!(out.limits[0].status.remaining, 500);
    assert!(out.limits[1].exceeded && out.limits[1].limit.shadow);
}

#[test]
fn dry_run_answers_without_consuming() {
    let (e, _) = engine(RULES);
    let u1 = d(&[("user", "u1")]);
    let rules = e.rules();
    let dry = Request { cost: 2, dry_run: true, ..Request::new("orders", &u1) };
    for _ in 0..3 {
        let out = e.acquire(&rules, &dry).unwrap();
        assert_eq!(out.verdict, Verdict::Allowed);
        assert_eq!(out.limits[0].status.remaining, 3);
    }
    assert!(e.buckets().is_empty());
}

#[test]
fn peek_reports_state_without_consuming() {
    let (e, _) = engine(RULES);
    let u1 = d(&[("user", "u1")]);
    ask(&e, "orders", &u1, 1).unwrap();
    let rules = e.rules();
    let out = e.peek(&rules, "orders", &u1, None).unwrap();
    assert_eq!(out.limits.iter().map(|l| l.status.remaining).collect::<Vec<_>>(), [4, 1]);
    let out = e.peek(&rules, "orders", &u1, Some("per-user")).unwrap();
    assert_eq!(out.limits.len(), 1);
    assert_eq!(out.rule.map(String::as_str), Some("orders"));
}

#[test]
fn a_reload_keeps_buckets_of_unchanged_limits() {
    let (e, clock) = engine(RULES);
    let none = d(&[]);
    for _ in 0..5 {
        ask(&e, "orders", &none, 1).unwrap();
    }
    let v = e.control().install(RuleSet::from_yaml(RULES, "t").unwrap(), RULES.into(), "t".into());
    assert_eq!(v, 2);
    assert_eq!(ask(&e, "orders", &none, 1).unwrap().0, Verdict::RateLimited, "the bucket survived the reload");
    // A bigger capacity applies at once to the same bucket.
    let bigger = RULES.replace("capacity: 5", "capacity: 50");
    e.control().install(RuleSet::from_yaml(&bigger, "t").unwrap(), bigger, "t".into());
    clock.advance(Duration::from_secs(2));
    assert_eq!(ask(&e, "orders", &none, 1).unwrap(), (Verdict::Allowed, vec![1]));
}

#[test]
fn sweep_forgets_idle_buckets() {
    let (e, clock) = engine(RULES);
    ask(&e, "orders", &d(&[("user", "u1")]), 1).unwrap();
    assert_eq!(e.buckets().len(), 2);
    assert_eq!(e.sweep(), 0);
    clock.advance(Duration::from_secs(60));
    assert_eq!(e.sweep(), 2);
    assert!(e.buckets().is_empty());
}

const TIERED: &str = r#"
tiers:
  gold:
    - { name: per-key, key: [api_key], algorithm: fixed_window, limit: 5, window: 1h }
    - { name: burst, key: [api_key], algorithm: token_bucket, capacity: 2, refill_per_second: 1 }
resources:
  - name: api
    limits:
      - { name: per-key, key: [api_key], algorithm: fixed_window, limit: 2, window: 1h }
    overrides:
      - { when: { api_key: k-gold }, tier: gold }
      - { when: { tenant: acme }, factor: 10 }
      - { when: { api_key: k-big }, limits: { per-key: 4 } }
      - { when: { ip: 6.6.6.6 }, block: true, retry_after: 1h }
"#;

#[test]
fn overrides_give_tiers_factors_absolute_limits_and_blocks() {
    let (e, _) = engine(TIERED);
    let admitted = |pairs: &[(&str, &str)], n: usize| {
        let d = d(pairs);
        (0..n).filter(|_| ask(&e, "api", &d, 1).unwrap().0 == Verdict::Allowed).count()
    };
    assert_eq!(admitted(&[("api_key", "plain")], 10), 2, "the rule's own limit");
    assert_eq!(admitted(&[("api_key", "k-big")], 10), 4, "an absolute limit");
    assert_eq!(admitted(&[("api_key", "k1"), ("tenant", "acme")], 30), 20, "ten times the limit");
    // The gold tier's limits instead: its token bucket of 2 bites first.
    let gold = d(&[("api_key", "k-gold")]);
    let (v, remaining) = ask(&e, "api", &gold, 1).unwrap();
    assert_eq!((v, remaining), (Verdict::Allowed, vec![4, 1]));
    // Blocked: denied before any limit, with its retry_after and a reason.
    let rules = e.rules();
    let ip = d(&[("api_key", "x"), ("ip", "6.6.6.6")]);
    let a = e.acquire(&rules, &Request::new("api", &ip));
    let a = a.unwrap();
    assert_eq!((a.verdict, a.retry_after), (Verdict::RateLimited, Duration::from_secs(3600)));
    assert_eq!(a.reason(), "blocked by an override for ip=6.6.6.6, retry in 1h");
    assert!(a.limits.is_empty());
    // An override's buckets are its own: k-big's 4 did not touch plain's.
    assert_eq!(admitted(&[("api_key", "plain")], 1), 0);
}

fn runtime_spec(id: &str, when: &[(&str, &str)], action: crate::overrides::Do) -> crate::overrides::Spec {
    crate::overrides::Spec {
        id: id.into(),
        rule: "api".into(),
        when: when.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        action,
        expires_at: None,
        created_at: 1,
        created_by: "test".into(),
        reason: String::new(),
    }
}

#[test]
fn a_run_time_override_applies_before_the_files_and_ends_at_its_expiry_exactly() {
    use crate::overrides::{Change, Do, Table};
    let (e, clock) = engine(TIERED);
    let now = crate::time::Clock::now(&*clock).as_nanos();
    // k-big has the file's 4; for ten seconds, a block wins over it.
    let mut block = runtime_spec("block-k-big", &[("api_key", "k-big")], Do::Block { retry_after_ms: 5_000 });
    block.expires_at = Some(now + 10_000_000_000);
    let v1 = e.rules().version;
    let v2 = e.control().install_overrides(Arc::new(Table::from_specs([block])), Change::default());
    assert_eq!(v2, v1 + 1, "an override change is an install");
    let k_big = d(&[("api_key", "k-big")]);
    let (v, _) = ask(&e, "api", &k_big, 1).unwrap();
    assert_eq!(v, Verdict::RateLimited, "blocked");
    clock.advance(Duration::from_nanos(9_999_999_999));
    assert_eq!(ask(&e, "api", &k_big, 1).unwrap().0, Verdict::RateLimited, "a nanosecond before its end");
    clock.advance(Duration::from_nanos(1));
    // Ended: not yet removed from the table, and no longer applying.
    assert_eq!(e.rules().runtime.len(), 1);
    assert_eq!(ask(&e, "api", &k_big, 1).unwrap(), (Verdict::Allowed, vec![3]), "the file's override again");
}

#[test]
fn buckets_survive_run_time_override_changes_that_do_not_touch_them() {
    use crate::overrides::{Change, Do, Table};
    let (e, _) = engine(TIERED);
    let k_big = d(&[("api_key", "k-big")]);
    let plain = d(&[("api_key", "plain")]);
    let acme = d(&[("api_key", "a1"), ("tenant", "acme")]);
    assert_eq!(ask(&e, "api", &k_big, 1).unwrap(), (Verdict::Allowed, vec![3]));
    assert_eq!(ask(&e, "api", &plain, 1).unwrap(), (Verdict::Allowed, vec![1]));
    let one = Table::from_specs([runtime_spec("acme-x2", &[("tenant", "acme")], Do::Factor(2.0))]);
    e.control().install_overrides(Arc::new(one.clone()), Change::default());
    // acme: twice the rule's 2, from a bucket of its own.
    assert_eq!(ask(&e, "api", &acme, 1).unwrap(), (Verdict::Allowed, vec![3]));
    // A second override set: the first's bucket and the file's are kept.
    let two = one.with(&[runtime_spec("u9", &[("api_key", "u9")], Do::Limits(vec![("per-key".into(), 7)]))]);
    e.control().install_overrides(Arc::new(two.clone()), Change::default());
    assert_eq!(ask(&e, "api", &acme, 1).unwrap(), (Verdict::Allowed, vec![2]));
    assert_eq!(ask(&e, "api", &k_big, 1).unwrap(), (Verdict::Allowed, vec![2]), "the file's override's bucket");
    assert_eq!(ask(&e, "api", &plain, 1).unwrap(), (Verdict::Allowed, vec![0]), "the rule's own bucket");
    assert_eq!(ask(&e, "api", &d(&[("api_key", "u9")]), 1).unwrap(), (Verdict::Allowed, vec![6]));
    // A reload of the same file keeps the run-time overrides and their buckets.
    e.control().install(RuleSet::from_yaml(TIERED, "t").unwrap(), TIERED.into(), "test".into());
    assert_eq!(ask(&e, "api", &acme, 1).unwrap(), (Verdict::Allowed, vec![1]));
    // A rules file without the rule: kept, inactive, and back with the rule.
    e.control().install(RuleSet::from_yaml(RULES, "t").unwrap(), RULES.into(), "test".into());
    assert_eq!(e.rules().problems.len(), 2, "{:?}", e.rules().problems);
    e.control().install(RuleSet::from_yaml(TIERED, "t").unwrap(), TIERED.into(), "test".into());
    assert!(e.rules().problems.is_empty());
    assert_eq!(ask(&e, "api", &acme, 1).unwrap(), (Verdict::Allowed, vec![0]));
}

const BY_ORIGIN: &str = r#"
resources:
  - name: api
    origins: { deny: [evil, "worse"] }
    limits:
      - { name: all, algorithm: fixed_window, limit: 6, window: 1m }
      - { name: app-a, algorithm: fixed_window, limit: 1, window: 1m, when: { origin: app-a } }
      - { name: others, key: [origin], algorithm: fixed_window, limit: 2, window: 1m, unless: { origin: [app-a] } }
      - { name: via-web, algorithm: fixed_window, limit: 1, window: 1m, when: { context: [web] } }
  - name: members
    origins: { key: caller, allow: app-a }
"#;

#[test]
fn conditioned_limits_apply_to_their_origins_and_an_origins_rule_refuses_callers() {
    let (e, _) = engine(BY_ORIGIN);
    let admitted = |pairs: &[(&str, &str)], n: usize| {
        let d = d(pairs);
        (0..n).filter(|_| ask(&e, "api", &d, 1).unwrap().0 == Verdict::Allowed).count()
    };
    // app-a: `all` and its own limit of 1; `others` is not for it.
    assert_eq!(admitted(&[("origin", "app-a")], 3), 1);
    // Each other origin has its own 2 (keyed by origin), within `all`.
    assert_eq!(admitted(&[("origin", "app-b")], 3), 2);
    assert_eq!(admitted(&[("origin", "app-c")], 3), 2);
    // A request through the `web` context also meets `via-web`.
    assert_eq!(admitted(&[("context", "web")], 3), 1);
    // No origin at all: only `all` (of which 6 - 1 - 2 - 2 - 1 = 0 is left).
    assert_eq!(admitted(&[], 1), 0);
    // A denied origin is refused before any limit, naming why.
    let rules = e.rules();
    let evil = d(&[("origin", "evil")]);
    let a = e.acquire(&rules, &Request::new("api", &evil)).unwrap();
    assert_eq!((a.verdict, a.limits.len()), (Verdict::RateLimited, 0));
    assert_eq!(a.reason(), "blocked by the origins rule: origin='evil' is denied, retry in 1m");
    // An allow list: its members pass; others are refused; no caller passes (as in Sentinel).
    let member = |v: Option<&str>| {
        let d = d(&v.map(|v| vec![("caller", v)]).unwrap_or_default());
        e.acquire(&rules, &Request::new("members", &d)).unwrap().verdict
    };
    assert_eq!(member(Some("app-a")), Verdict::Allowed);
    assert_eq!(member(Some("app-b")), Verdict::RateLimited);
    assert_eq!(member(Some("")), Verdict::Allowed);
    assert_eq!(member(None), Verdict::Allowed);
}
