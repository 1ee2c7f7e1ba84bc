//! Degradation scopes through the engine: each system's level, shedding by
//! priority, outcomes and load feeding the right system, on a fake clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::breaker::Outcome;
use crate::degradation::Load;
use crate::rules::Priority;
use crate::time::ManualClock;

const RULES: &str = r#"
resources:
  - name: payments.charge
    concurrency: { max_in_flight: 1000 }
  - name: "search.*"
    limits: [ { name: q, algorithm: token_bucket, capacity: 1000, refill_per_second: 1000 } ]
  - name: reports
    shed_at_level: 1
  - name: payments.audit
    shed_priority: { critical: never }
systems:
  - name: payments
    resources: ["payments.*"]
    min_time_at_level: 0s
  - name: search
    resources: ["search.*", "suggest"]
"#;

fn engine() -> (Engine, Arc<ManualClock>) {
    super::tests::engine(RULES)
}

fn ask(e: &Engine, resource: &str, priority: Priority) -> (Verdict, u32, String) {
    let rules = e.rules();
    let none = HashMap::<String, String>::new();
    let req = Request { priority, ..Request::new(resource, &none) };
    let a = e.acquire(&rules, &req).unwrap();
    (a.verdict, a.degradation_level, a.reason())
}

fn set(e: &Engine, system: &str, level: Option<u32>) {
    e.control().set_degradation(LevelTarget::One(system), level).unwrap();
}

#[test]
fn each_system_has_its_own_level_and_answers_carry_it() {
    let (e, _) = engine();
    set(&e, "payments", Some(3));
    assert_eq!(ask(&e, "payments.charge", Priority::CriticalPlus), (Verdict::Allowed, 3, String::new()));
    assert_eq!(ask(&e, "search.web", Priority::Sheddable).1, 0, "search stays at 0");
    assert_eq!(ask(&e, "search.web", Priority::Sheddable).0, Verdict::Allowed);
    assert_eq!(ask(&e, "elsewhere", Priority::Sheddable), (Verdict::Allowed, 0, String::new()), "the global scope");
    let levels: Vec<_> = e.views().levels().iter().map(|l| (l.system.to_string(), l.level)).collect();
    assert_eq!(levels, [("".into(), 0), ("payments".into(), 3), ("search".into(), 0)]);
}

#[test]
fn priorities_are_shed_level_by_level_and_critical_plus_never() {
    let (e, _) = engine();
    let verdicts = |e: &Engine| Priority::ALL.map(|p| ask(e, "payments.charge", p).0);
    use Verdict::{Allowed as A, Shed as S};
    assert_eq!(verdicts(&e), [A, A, A, A]);
    set(&e, "payments", Some(1));
    assert_eq!(verdicts(&e), [A, A, A, S], "CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS, SHEDDABLE");
    set(&e, "payments", Some(2));
    assert_eq!(verdicts(&e), [A, A, S, S]);
    set(&e, "payments", Some(3));
    assert_eq!(verdicts(&e), [A, S, S, S]);
    let (_, _, reason) = ask(&e, "payments.charge", Priority::SheddablePlus);
    assert_eq!(
        reason,
        "shed: degradation level is 3 in system 'payments', PRIORITY_SHEDDABLE_PLUS is shed from level 2"
    );
    // A rule's own mapping: CRITICAL is never shed on payments.audit.
    assert_eq!(ask(&e, "payments.audit", Priority::Critical).0, A);
    assert_eq!(ask(&e, "payments.audit", Priority::Sheddable).0, S);
    // A resource of the system no rule matches is shed too.
    assert_eq!(ask(&e, "payments.unruled", Priority::Sheddable).0, S);
    set(&e, "payments", None);
    assert_eq!(verdicts(&e), [A, A, A, A], "the override cleared: automatic level 0");
}

#[test]
fn the_global_scope_sheds_by_shed_at_level_only() {
    let (e, _) = engine();
    set(&e, "", Some(3));
    assert_eq!(ask(&e, "elsewhere", Priority::Sheddable).0, Verdict::Allowed, "no shedding by priority unless asked");
    assert_eq!(ask(&e, "reports", Priority::CriticalPlus).0, Verdict::Shed, "shed_at_level sheds every priority");
    assert_eq!(ask(&e, "payments.charge", Priority::Sheddable).0, Verdict::Allowed, "payments is not the global scope");
}

#[test]
fn every_system_at_once_and_unknown_systems() {
    let (e, _) = engine();
    let set = e.control().set_degradation(LevelTarget::Every, Some(2)).unwrap();
    assert_eq!(set.len(), 3);
    assert!(set.iter().all(|l| l.level == 2 && l.manual));
    let err = e.control().set_degradation(LevelTarget::One("billing"), Some(1)).unwrap_err();
    assert_eq!(err.to_string(), "system: 'billing' is not a system of the rules in force");
    assert_eq!(err.kind(), ErrorKind::BadInput);
}

#[test]
fn reported_outcomes_raise_their_system_only() {
    let (e, clock) = engine();
    let rules = e.rules();
    let none = HashMap::<String, String>::new();
    for i in 0..40 {
        let req = Request::new("payments.charge", &none);
        let p = e.acquire(&rules, &req).unwrap().permit_id.unwrap().to_string();
        let outcome = if i % 2 == 0 { Outcome::Failure } else { Outcome::Success };
        e.outcomes().report(&rules, "", &p, outcome, Some(Duration::from_millis(3))).unwrap();
    }
    clock.advance(Duration::from_millis(100));
    e.outcomes().tick();
    let levels: Vec<_> = e.views().levels().iter().map(|l| l.level).collect();
    assert_eq!(levels, [0, 3, 0], "50% errors in payments; search and the global scope untouched");
    assert_eq!(e.views().levels()[1].signals.error_rate, Some(0.5));
}

#[test]
fn load_reports_move_a_system_and_bad_ones_change_nothing() {
    let (e, clock) = engine();
    let load = |cpu| Load { cpu, memory: 0.2, in_flight: Some(3), queue_delay: None };
    for i in 0..3 {
        assert_eq!(e.control().report_load("payments", &format!("pod-{i}"), load(0.8), None).unwrap(), (0, i + 1));
    }
    e.outcomes().tick();
    assert_eq!(e.views().levels()[1].level, 2, "80% CPU");
    assert_eq!(e.views().levels()[1].signals.in_flight, 9);
    let bad = [
        ("payments", "p", 1.5, "cpu: 1.5 is not a utilization between 0 and 1"),
        ("payments", "p", f64::NAN, "cpu: NaN is not a utilization between 0 and 1"),
        ("payments", "p", -0.1, "cpu: -0.1 is not a utilization between 0 and 1"),
        ("billing", "p", 0.5, "system: 'billing' is not a system of the rules in force"),
        ("", "p", 0.5, "system: must not be empty"),
        ("payments", "", 0.5, "instance: must not be empty"),
    ];
    for (system, instance, cpu, want) in bad {
        assert_eq!(e.control().report_load(system, instance, load(cpu), None).unwrap_err().to_string(), want);
    }
    assert!(e.control().report_load("payments", &"x".repeat(300), load(0.1), None).is_err(), "a long instance id");
    e.outcomes().tick();
    assert_eq!(e.views().levels()[1].signals.instances, 3, "nothing bad was counted");
    // Silent for the 5 s timeout: they leave, and the level falls.
    clock.advance(Duration::from_secs(6));
    e.outcomes().tick();
    assert_eq!((e.views().levels()[1].level, e.views().levels()[1].signals.instances), (0, 0));
}

#[test]
fn a_reload_keeps_a_system_state_and_drops_removed_systems() {
    let (e, _) = engine();
    set(&e, "payments", Some(2));
    let other = RULES.replace("- name: search\n    resources: [\"search.*\", \"suggest\"]\n", "");
    let other = other.replace(
        "systems:\n  - name: payments\n    resources: [\"payments.*\"]\n    min_time_at_level: 0s\n",
        "systems:\n  - name: payments\n    resources: [\"payments.*\"]\n    cpu: [0.5, 0.6, 0.7]\n",
    );
    e.control().install(RuleSet::from_yaml(&other, "t").unwrap(), other.clone(), "t".into());
    let levels: Vec<_> = e.views().levels().iter().map(|l| (l.system.to_string(), l.level, l.manual)).collect();
    assert_eq!(levels, [("".into(), 0, false), ("payments".into(), 2, true)]);
    assert_eq!(ask(&e, "search.web", Priority::Sheddable).1, 0, "search.* is global now");
}
