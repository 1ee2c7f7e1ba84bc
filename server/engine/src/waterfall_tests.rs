//! A rule's `waterfall` through the engine: the rule's own limits pay first,
//! then each source in turn; a call no source has room for is denied with
//! every source's limits; guards and blocks deny before any source.

use std::collections::HashMap;
use std::time::Duration;

use super::*;

const RULES: &str = r#"
resources:
  - name: chat
    limits:
      - { name: minute, key: [tenant], algorithm: fixed_window, limit: 10, window: 1m }
    waterfall:
      - { name: month, key: [tenant], algorithm: fixed_window, calendar: month, limit: 5 }
      - { name: credits, key: [tenant, account], algorithm: fixed_window, window: 3650d, limit: 3 }
    overrides:
      - { when: { tenant: blocked }, block: true }
  - name: guarded
    limits:
      - { name: minute, algorithm: fixed_window, limit: 1, window: 1m }
    waterfall:
      - { name: month, algorithm: fixed_window, calendar: month, limit: 2 }
    concurrency: { max_in_flight: 1, permit_ttl: 30s }
"#;

fn tenant(t: &str, account: Option<&str>) -> HashMap<String, String> {
    let mut d = HashMap::from([("tenant".to_string(), t.to_string())]);
    if let Some(a) = account {
        d.insert("account".to_string(), a.to_string());
    }
    d
}

fn ask<'r>(e: &Engine, rules: &'r Installed, d: &HashMap<String, String>, cost: u32) -> Answer<'r> {
    e.acquire(rules, &Request { cost, ..Request::new("chat", d) }).unwrap()
}

#[test]
fn each_source_pays_in_turn_then_the_call_is_denied() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let acme = tenant("acme", Some("a1"));
    let mut paid = Vec::new();
    for _ in 0..20 {
        let a = ask(&e, &rules, &acme, 1);
        paid.push((a.verdict, a.paid_by.map(String::as_str)));
    }
    let allowed = |by| (Verdict::Allowed, by);
    let mut want = vec![allowed(None); 10];
    want.extend([allowed(Some("month")); 5]);
    want.extend([allowed(Some("credits")); 3]);
    want.extend([(Verdict::RateLimited, None); 2]);
    assert_eq!(paid, want);

    // The denial names every source, each exceeded, and the caller may come
    // back when the first has room again (the minute's window).
    let a = ask(&e, &rules, &acme, 1);
    let names: Vec<_> = a.limits.iter().map(|r| (r.limit.name.as_str(), r.exceeded)).collect();
    assert_eq!(names, [("minute", true), ("month", true), ("credits", true)]);
    assert!(a.retry_after <= Duration::from_secs(60) && !a.retry_after.is_zero(), "{a:?}");
    assert!(a.reason().contains("'minute'") && a.reason().contains("'credits'"), "{}", a.reason());

    // Another tenant's sources are its own.
    let other = ask(&e, &rules, &tenant("other", Some("o1")), 1);
    assert_eq!((other.verdict, other.paid_by), (Verdict::Allowed, None));
}

#[test]
fn an_admitted_call_shows_the_sources_that_had_no_room_and_the_one_that_paid() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let acme = tenant("acme", Some("a1"));
    assert_eq!(ask(&e, &rules, &acme, 10).paid_by, None);
    let a = ask(&e, &rules, &acme, 2);
    assert_eq!((a.verdict, a.paid_by.map(String::as_str)), (Verdict::Allowed, Some("month")));
    let shown: Vec<_> = a.limits.iter().map(|r| (r.limit.name.as_str(), r.exceeded, r.status.remaining)).collect();
    assert_eq!(shown, [("minute", true, 0), ("month", false, 3)]);
    assert!(a.retry_after.is_zero());
}

#[test]
fn a_source_pays_all_of_a_call_or_none_of_it() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let acme = tenant("acme", Some("a1"));
    assert_eq!(ask(&e, &rules, &acme, 8).verdict, Verdict::Allowed);
    // 4 does not fit the minute (2 left): the month pays all 4.
    let a = ask(&e, &rules, &acme, 4);
    assert_eq!(a.paid_by.map(String::as_str), Some("month"));
    let minute = e.peek(&rules, "chat", &acme, Some("minute")).unwrap();
    assert_eq!(minute.limits[0].status.remaining, 2, "the minute took nothing of a call it could not pay");
    // 4 fits neither the month (1 left) nor the credits (3): denied, nothing taken.
    assert_eq!(ask(&e, &rules, &acme, 4).verdict, Verdict::RateLimited);
    let all = e.peek(&rules, "chat", &acme, None).unwrap();
    let left: Vec<_> = all.limits.iter().map(|r| r.status.remaining).collect();
    assert_eq!(left, [2, 1, 3]);
    // A cost more than a source ever holds passes over it.
    assert_eq!(ask(&e, &rules, &acme, 2).paid_by, None);
    let a = ask(&e, &rules, &acme, 9);
    assert_eq!(a.verdict, Verdict::RateLimited, "9 is more than the month and the credits ever hold");
}

#[test]
fn a_source_that_does_not_apply_is_passed_over_never_free() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    // Without an account the credits do not apply: after the month, denied.
    let acme = tenant("acme", None);
    let verdicts: Vec<_> = (0..16).map(|_| ask(&e, &rules, &acme, 1).verdict).collect();
    assert_eq!(verdicts.iter().filter(|v| **v == Verdict::Allowed).count(), 15);
    assert_eq!(verdicts[15], Verdict::RateLimited);
}

#[test]
fn a_block_or_a_guard_denies_before_any_source() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let a = ask(&e, &rules, &tenant("blocked", Some("b")), 1);
    assert_eq!(a.verdict, Verdict::RateLimited);
    assert!(a.denial.is_some() && a.paid_by.is_none() && a.limits.is_empty(), "{a:?}");

    // The concurrency slot is held by the first call: the second is denied
    // by it, whatever the sources hold.
    let none = HashMap::new();
    let first = e.acquire(&rules, &Request::new("guarded", &none)).unwrap();
    assert_eq!(first.verdict, Verdict::Allowed);
    let second = e.acquire(&rules, &Request::new("guarded", &none)).unwrap();
    assert_eq!(second.verdict, Verdict::ConcurrencyLimited);
    // Reported, the slot is free: the minute has no room, the month pays,
    // and the permit holds the slot as any permit does.
    let id = first.permit_id.unwrap().to_string();
    e.outcomes().report(&rules, "guarded", &id, crate::breaker::Outcome::Success, None).unwrap();
    let third = e.acquire(&rules, &Request::new("guarded", &none)).unwrap();
    assert_eq!((third.verdict, third.paid_by.map(String::as_str)), (Verdict::Allowed, Some("month")));
    assert!(third.permit_id.is_some());
    let fourth = e.acquire(&rules, &Request::new("guarded", &none)).unwrap();
    assert_eq!(fourth.verdict, Verdict::ConcurrencyLimited, "the month's denial did not free the slot");
}

#[test]
fn a_dry_run_through_the_waterfall_takes_nothing() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let acme = tenant("acme", Some("a1"));
    assert_eq!(ask(&e, &rules, &acme, 10).paid_by, None);
    let dry = e.acquire(&rules, &Request { dry_run: true, ..Request::new("chat", &acme) }).unwrap();
    assert_eq!((dry.verdict, dry.paid_by.map(String::as_str)), (Verdict::Allowed, Some("month")));
    let month = e.peek(&rules, "chat", &acme, Some("month")).unwrap();
    assert_eq!(month.limits[0].status.remaining, 5);
}

#[test]
fn a_charge_in_memory_goes_to_the_rule_s_own_limits() {
    // The engine's own `charge` (no waterfall choice: the decider makes it)
    // takes from the rule's own limits only, never from every source.
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let acme = tenant("acme", Some("a1"));
    let c = e.charges().charge(&rules, "chat", &acme, 3, None).unwrap();
    let names: Vec<_> = c.limits.iter().map(|r| r.limit.name.as_str()).collect();
    assert_eq!(names, ["minute"]);
    assert_eq!(c.paid_by, None);
}

const CREDITS: &str = r#"
resources:
  - name: api
    limits:
      - { name: free, key: [tenant], algorithm: fixed_window, limit: 1, window: 1h }
    waterfall:
      - { name: credits, key: [tenant], algorithm: balance, max_balance: 100 }
"#;

#[test]
fn credits_topped_up_here_pay_after_the_free_calls_and_never_pass_their_most() {
    use crate::settle::BalanceChange;
    let (e, _clock) = super::tests::engine(CREDITS);
    let rules = e.rules();
    let t = tenant("t", None);
    let call = |cost: u32| e.acquire(&rules, &Request { cost, ..Request::new("api", &t) }).unwrap();
    assert_eq!(call(1).paid_by, None);
    assert_eq!(call(1).verdict, Verdict::RateLimited, "no credits yet");
    let top_up = |amount: i64| e.charges().plan_balance(&rules, "api", &t, "credits", amount);
    assert!(matches!(top_up(60), Ok(BalanceChange::Here { balance: 60, max: 100 })));
    // A cost the free calls never hold is paid by the credits.
    let a = call(25);
    assert_eq!((a.verdict, a.paid_by.map(String::as_str)), (Verdict::Allowed, Some("credits")));
    assert!(matches!(top_up(66), Err(RequestError::OutOfRange { field: "amount", .. })), "35 + 66 > 100");
    assert!(matches!(top_up(65), Ok(BalanceChange::Here { balance: 100, .. })));
    assert!(matches!(top_up(-30), Ok(BalanceChange::Here { balance: 70, .. })));
    assert!(matches!(top_up(0), Err(RequestError::OutOfRange { .. })));
    let not = e.charges().plan_balance(&rules, "api", &t, "free", 5);
    assert!(matches!(not, Err(RequestError::NotABalance { .. })), "{:?}", not.err());
    // More than any source ever holds is bad input, as without a waterfall.
    let err = e.acquire(&rules, &Request { cost: 101, ..Request::new("api", &t) }).unwrap_err();
    assert!(matches!(err, RequestError::CostExceedsCapacity { .. }), "{err:?}");
}

/// A denial's retry_after points at a source that could pay: not at the
/// rule's own minute limit, which can never hold a call of this cost.
#[test]
fn a_denial_is_retried_when_a_source_that_could_pay_has_room() {
    let (e, _clock) = super::tests::engine(
        r#"
resources:
  - name: chat
    limits:
      - { name: minute, key: [tenant], algorithm: fixed_window, limit: 2, window: 1m }
    waterfall:
      - { name: day, key: [tenant], algorithm: fixed_window, limit: 10, window: 1d }
"#,
    );
    let rules = e.rules();
    let t = tenant("t", None);
    let call = |cost: u32| e.acquire(&rules, &Request { cost, ..Request::new("chat", &t) }).unwrap();
    assert_eq!(call(2).paid_by, None, "the minute pays for what it holds");
    assert_eq!(call(5).paid_by.map(String::as_str), Some("day"));
    assert_eq!(call(5).paid_by.map(String::as_str), Some("day"));
    let denied = call(5);
    assert_eq!(denied.verdict, Verdict::RateLimited);
    // The minute comes back within a minute, but never holds 5: the call
    // may come back when the day does.
    assert!(denied.retry_after > Duration::from_secs(3600), "{:?}", denied.retry_after);
    // A call the minute could hold may come back within the minute.
    let small = call(1);
    assert_eq!(small.verdict, Verdict::RateLimited);
    assert!(small.retry_after <= Duration::from_secs(60), "{:?}", small.retry_after);
}
