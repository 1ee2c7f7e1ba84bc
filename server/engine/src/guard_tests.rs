//! Breakers, permits, concurrency limits and shedding through the engine, on a
//! fake clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::breaker::{Outcome, State};
use crate::events::Event;
use crate::time::ManualClock;

// `global: {}`: breakers' error rates move the global level (5/15/30%).
const RULES: &str = r#"
global: {}
resources:
  - name: db
    concurrency: { max_in_flight: 2, permit_ttl: 5s }
  - name: payments
    limits: [ { name: hourly, algorithm: fixed_window, limit: 1000, window: 1h } ]
    breaker:
      window: { kind: count, size: 10 }
      minimum_calls: 4
      failure_rate_threshold: 0.5
      wait_in_open: 5s
      half_open_calls: 2
      max_wait_in_half_open: 10s
  - name: tight
    limits: [ { name: one, algorithm: fixed_window, limit: 1, window: 1h } ]
    breaker: { window: { kind: count, size: 10 }, minimum_calls: 1, wait_in_open: 1s, half_open_calls: 1 }
  - name: reports
    shed_at_level: 2
"#;

fn engine() -> (Engine, Arc<ManualClock>) {
    super::tests::engine(RULES)
}

/// Every event the engine publishes from now on.
fn subscribe(e: &Engine) -> std::sync::mpsc::Receiver<Arc<Event>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    assert!(e.events().listen(Box::new(move |event| drop(tx.lock().unwrap().send(event)))));
    rx
}

struct Got {
    verdict: Verdict,
    permit: Option<String>,
    retry_after: Duration,
    state: Option<State>,
    reason: String,
    holds_slot: bool,
}

fn ask(e: &Engine, resource: &str) -> Got {
    ask_with(e, resource, false)
}

fn ask_with(e: &Engine, resource: &str, dry_run: bool) -> Got {
    let rules = e.rules();
    let none = HashMap::<String, String>::new();
    let a = e.acquire(&rules, &Request { dry_run, ..Request::new(resource, &none) }).unwrap();
    Got {
        verdict: a.verdict,
        reason: a.reason(),
        permit: a.permit_id.map(|p| p.to_string()),
        retry_after: a.retry_after,
        state: a.breaker_state,
        holds_slot: a.holds_slot,
    }
}

/// The global scope's (level, manual, automatic).
fn level(e: &Engine) -> (u32, bool, u32) {
    let l = e.views().level();
    (l.level, l.manual, l.automatic)
}

fn report(e: &Engine, resource: &str, permit: &str, outcome: Outcome) -> Reported {
    e.outcomes().report(&e.rules(), resource, permit, outcome, Some(Duration::from_millis(5))).unwrap()
}

#[test]
fn a_concurrency_limit_holds_slots_until_reported() {
    let (e, _) = engine();
    let first = ask(&e, "db");
    assert!(first.holds_slot);
    let a = first.permit.expect("a permit");
    let _b = ask(&e, "db").permit.expect("a permit");
    let third = ask(&e, "db");
    assert_eq!(third.verdict, Verdict::ConcurrencyLimited);
    assert_eq!(third.reason, "concurrency limit of 'db' reached: 2 calls in flight");
    assert_eq!(report(&e, "db", &a, Outcome::Success), Reported { counted: true, breaker_state: None, settled: false });
    assert_eq!(ask(&e, "db").verdict, Verdict::Allowed);
    assert!(!report(&e, "db", &a, Outcome::Success).counted, "a permit returns once");
}

#[test]
fn an_unreported_permit_frees_its_slot_after_permit_ttl() {
    let (e, clock) = engine();
    let crashed = ask(&e, "db").permit.unwrap();
    ask(&e, "db");
    assert_eq!(ask(&e, "db").verdict, Verdict::ConcurrencyLimited);
    clock.advance(Duration::from_millis(4_999));
    e.outcomes().tick();
    assert_eq!(ask(&e, "db").verdict, Verdict::ConcurrencyLimited);
    clock.advance(Duration::from_millis(1));
    e.outcomes().tick();
    assert_eq!(e.views().permits_in_flight(), 0);
    assert_eq!(ask(&e, "db").verdict, Verdict::Allowed);
    assert!(!report(&e, "db", &crashed, Outcome::Success).counted, "too late: expired");
}

#[test]
fn failures_open_the_breaker_and_probes_close_it() {
    let (e, clock) = engine();
    let events = subscribe(&e);
    for _ in 0..4 {
        let p = ask(&e, "payments").permit.unwrap();
        report(&e, "payments", &p, Outcome::Failure);
    }
    let denied = ask(&e, "payments");
    assert_eq!((denied.verdict, denied.state), (Verdict::CircuitOpen, Some(State::Open)));
    assert_eq!(denied.retry_after, Duration::from_secs(5));
    assert_eq!(denied.reason, "circuit breaker of 'payments' is OPEN, next probe in 5s");
    clock.advance(Duration::from_secs(5));
    let probes: Vec<_> = (0..2).map(|_| ask(&e, "payments")).collect();
    assert!(probes.iter().all(|p| p.verdict == Verdict::Allowed && p.state == Some(State::HalfOpen)));
    assert!(probes.iter().all(|p| p.holds_slot), "a probe is reported at once: the breaker waits for it");
    assert_eq!(ask(&e, "payments").verdict, Verdict::CircuitOpen, "only two probes");
    for p in &probes {
        report(&e, "payments", p.permit.as_deref().unwrap(), Outcome::Success);
    }
    assert_eq!(ask(&e, "payments").state, Some(State::Closed));
    let seen: Vec<(State, State)> = std::iter::from_fn(|| events.try_recv().ok())
        .filter_map(|ev| match &*ev {
            Event::Breaker { transition: t, .. } => Some((t.from, t.to)),
            _ => None,
        })
        .collect();
    assert_eq!(seen, [(State::Closed, State::Open), (State::Open, State::HalfOpen), (State::HalfOpen, State::Closed)]);
}

#[test]
fn a_probe_denied_by_a_limit_is_given_back() {
    let (e, clock) = engine();
    let p = ask(&e, "tight").permit.unwrap(); // takes the only unit of the hour
    report(&e, "tight", &p, Outcome::Failure); // minimum_calls 1: opens
    clock.advance(Duration::from_secs(1));
    let probe = ask(&e, "tight");
    assert_eq!(probe.verdict, Verdict::RateLimited, "half-open, but the limit is spent");
    let info = e.views().breaker(&e.rules(), "tight").unwrap();
    assert_eq!((info.state, info.probes_remaining), (State::HalfOpen, 1), "the probe came back");
}

#[test]
fn report_answers_unknown_malformed_and_mismatched_permits() {
    let (e, _) = engine();
    let rules = e.rules();
    let unknown =
        e.outcomes().report(&rules, "db", "0123456789abcdef0123456789abcdef", Outcome::Success, None).unwrap();
    assert_eq!(unknown, Reported { counted: false, breaker_state: None, settled: false });
    let err = e.outcomes().report(&rules, "db", "not-a-permit", Outcome::Success, None).unwrap_err();
    assert_eq!(err.to_string(), "permit_id: 'not-a-permit' is not a permit id");
    let p = ask(&e, "db").permit.unwrap();
    let err = e.outcomes().report(&rules, "payments", &p, Outcome::Success, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "resource: the permit was not issued for 'payments'",
        "and says nothing of whose it is"
    );
    assert!(
        e.outcomes().report(&rules, "", &p, Outcome::Success, None).unwrap().counted,
        "an empty resource is the permit's"
    );
}

#[test]
fn shedding_follows_the_degradation_level() {
    let (e, _) = engine();
    assert_eq!(ask(&e, "reports").verdict, Verdict::Allowed);
    let set = e.control().set_degradation(LevelTarget::One(""), Some(2)).unwrap();
    assert_eq!(set.iter().map(|l| (l.level, l.manual, l.automatic)).collect::<Vec<_>>(), [(2, true, 0)]);
    let shed = ask(&e, "reports");
    assert_eq!(shed.verdict, Verdict::Shed);
    assert_eq!(shed.reason, "shed: degradation level is 2, this resource is shed at 2");
    assert_eq!(ask(&e, "db").verdict, Verdict::Allowed, "not shed: no shed_at_level");
    e.control().set_degradation(LevelTarget::One(""), Some(1)).unwrap();
    assert_eq!(ask(&e, "reports").verdict, Verdict::Allowed);
    e.control().set_degradation(LevelTarget::One(""), None).unwrap();
    assert_eq!(level(&e), (0, false, 0));
}

#[test]
fn breaker_failures_raise_the_automatic_level() {
    let (e, _) = engine();
    let events = subscribe(&e);
    for outcome in [Outcome::Failure; 4].into_iter().chain([Outcome::Success; 16]) {
        // Reset each time so the breaker stays closed and keeps recording.
        e.control().set_breaker(&e.rules(), "payments", State::Closed).unwrap();
        let p = ask(&e, "payments").permit.unwrap();
        report(&e, "payments", &p, outcome);
    }
    e.outcomes().tick();
    assert_eq!(level(&e), (2, false, 2), "4 of 20 is 20%");
    let changes: Vec<_> = std::iter::from_fn(|| events.try_recv().ok())
        .filter_map(|ev| match &*ev {
            Event::Degradation(c) => Some((c.from, c.to)),
            _ => None,
        })
        .collect();
    assert_eq!(changes, [(0, 2)]);
}

#[test]
fn a_dry_run_takes_no_slot_and_no_probe() {
    let (e, clock) = engine();
    for _ in 0..5 {
        assert_eq!(ask_with(&e, "db", true).verdict, Verdict::Allowed);
    }
    assert_eq!(e.views().permits_in_flight(), 0);
    let p = ask(&e, "tight").permit.unwrap();
    report(&e, "tight", &p, Outcome::Failure);
    assert_eq!(ask_with(&e, "tight", true).verdict, Verdict::CircuitOpen);
    clock.advance(Duration::from_secs(1));
    assert_eq!(ask_with(&e, "tight", true).state, Some(State::Open), "a dry run moves nothing");
}

#[test]
fn operators_force_and_reset_breakers() {
    let (e, _) = engine();
    let rules = e.rules();
    assert_eq!(e.control().set_breaker(&rules, "payments", State::ForcedOpen).unwrap().state, State::ForcedOpen);
    let denied = ask(&e, "payments");
    assert_eq!(
        (denied.verdict, denied.reason.as_str()),
        (Verdict::CircuitOpen, "circuit breaker of 'payments' is FORCED_OPEN")
    );
    assert_eq!(e.control().set_breaker(&rules, "payments", State::Closed).unwrap().state, State::Closed);
    assert_eq!(ask(&e, "payments").verdict, Verdict::Allowed);
    assert_eq!(
        e.control().set_breaker(&rules, "db", State::Closed).unwrap_err().to_string(),
        "resource: no rule gives 'db' a circuit breaker"
    );
    assert!(e.control().set_breaker(&rules, "payments", State::Open).is_err());
    let names: Vec<_> = e.views().breakers(&rules).into_iter().map(|(r, _)| r).collect();
    assert_eq!(names, ["payments"]);
}

#[test]
fn concurrent_callers_never_hold_more_than_max_in_flight() {
    let (e, _) = engine();
    let e = Arc::new(e);
    let held = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let peak = Arc::new(std::sync::atomic::AtomicU32::new(0));
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (e, held, peak) = (e.clone(), held.clone(), peak.clone());
            s.spawn(move || {
                use std::sync::atomic::Ordering::SeqCst;
                for _ in 0..2000 {
                    if let Some(p) = ask(&e, "db").permit {
                        let now = held.fetch_add(1, SeqCst) + 1;
                        peak.fetch_max(now, SeqCst);
                        held.fetch_sub(1, SeqCst);
                        report(&e, "db", &p, Outcome::Success);
                    }
                }
            });
        }
    });
    assert!(peak.load(std::sync::atomic::Ordering::SeqCst) <= 2);
    assert_eq!(e.views().permits_in_flight(), 0);
}
