use super::*;
use crate::rules::systems::LoadConfig;

const OK: Call = Call { failed: false, slow: false };
const FAIL: Call = Call { failed: true, slow: false };

fn at(secs: u64) -> Timestamp {
    Timestamp::from_secs(1_700_006_400 + secs)
}

fn at_ms(ms: u64) -> Timestamp {
    Timestamp::from_nanos(at(0).as_nanos() + ms * 1_000_000)
}

fn calls(s: &Scope, now: Timestamp, ok: usize, failed: usize) {
    (0..ok).for_each(|_| s.record_call(now, OK));
    (0..failed).for_each(|_| s.record_call(now, FAIL));
}

fn to(change: Option<LevelChange>) -> Option<u32> {
    change.map(|c| c.to)
}

fn load(cpu: f64) -> Load {
    Load { cpu, memory: 0.1, in_flight: None, queue_delay: None }
}

fn system(f: impl FnOnce(&mut SystemConfig)) -> Scope {
    let mut cfg = SystemConfig::named("payments");
    f(&mut cfg);
    Scope::new(cfg)
}

/// The global scope as a rules file's `global: {}` section sets it: the
/// error rate of every breaker's calls, 5%, 15% and 30%.
fn global_on() -> SystemConfig {
    SystemConfig { error_rate: Some([0.05, 0.15, 0.30]), ..SystemConfig::global() }
}

/// Three instances reporting `cpu` at `now`.
fn three(s: &Scope, now: Timestamp, cpu: [f64; 3]) {
    for (i, c) in cpu.iter().enumerate() {
        s.report_load(now, &format!("i{i}"), load(*c), now).unwrap();
    }
}

#[test]
fn without_a_global_section_no_error_rate_moves_the_global_level() {
    let s = Scope::new(SystemConfig::global());
    calls(&s, at(0), 0, 100);
    assert_eq!(s.evaluate(at(0)), None, "100% errors, and no signal to raise the level");
    assert_eq!(s.level(), 0);
    // An operator still sets it.
    assert_eq!(to(s.set_manual(Some(2))), Some(2));
}

#[test]
fn calls_recorded_before_a_global_section_raise_nothing_once_it_appears() {
    let s = Scope::new(SystemConfig::global());
    calls(&s, at(0), 0, 100);
    s.configure(global_on());
    assert_eq!(s.evaluate(at(0)), None, "the window starts empty when a signal appears");
    calls(&s, at(1), 0, 30);
    assert_eq!(to(s.evaluate(at(1))), Some(3), "calls after it count");
}

#[test]
fn the_global_scope_follows_the_error_rate_thresholds() {
    let s = Scope::new(global_on());
    calls(&s, at(0), 96, 4);
    assert_eq!(s.evaluate(at(0)), None, "4% is level 0");
    calls(&s, at(0), 0, 1); // 5 of 101 = 4.95%
    assert_eq!(s.evaluate(at(0)), None);
    calls(&s, at(0), 0, 1); // 6 of 102 = 5.9%
    let change = s.evaluate(at(0)).unwrap();
    assert_eq!((change.from, change.to, change.manual), (0, 1, false));
    assert!(change.reason.starts_with("error rate reached 0.05"), "{}", change.reason);
    calls(&s, at(0), 0, 20); // 26 of 122 = 21%
    assert_eq!(to(s.evaluate(at(0))), Some(2));
    calls(&s, at(0), 0, 30); // 56 of 152 = 37%
    assert_eq!(s.level(), 2, "levels change only when evaluated");
    assert_eq!(to(s.evaluate(at(0))), Some(3));
}

#[test]
fn hysteresis_holds_a_level_until_the_rate_falls_well_below_it() {
    let s = Scope::new(global_on());
    calls(&s, at(0), 84, 16); // 16%
    assert_eq!(to(s.evaluate(at(0))), Some(2));
    calls(&s, at(0), 23, 0); // 16 of 123 = 13%: below 15%, above 12%
    assert_eq!(s.evaluate(at(0)), None);
    assert_eq!(s.level(), 2);
    calls(&s, at(0), 20, 0); // 16 of 143 = 11.2%
    assert_eq!(to(s.evaluate(at(0))), Some(1));
    // Ten seconds on, the window is empty: back to 0.
    assert_eq!(to(s.evaluate(at(10))), Some(0));
}

#[test]
fn a_few_failures_are_not_an_error_rate() {
    let s = Scope::new(global_on());
    calls(&s, at(0), 0, 19);
    assert_eq!(s.evaluate(at(0)), None);
    calls(&s, at(0), 0, 1);
    assert_eq!(to(s.evaluate(at(0))), Some(3));
}

#[test]
fn a_manual_level_wins_until_cleared() {
    let s = Scope::new(global_on());
    let change = s.set_manual(Some(2)).unwrap();
    assert_eq!((change.from, change.to, change.manual), (0, 2, true));
    assert_eq!(change.reason, "set to 2 by an operator");
    calls(&s, at(0), 0, 100);
    assert_eq!(s.evaluate(at(0)), None, "the automatic level moves underneath");
    let l = s.get();
    assert_eq!((l.level, l.automatic, l.manual), (2, 3, true));
    let back = s.set_manual(None).unwrap();
    assert_eq!(back.to, 3);
    assert!(back.reason.starts_with("back to the automatic level: error rate reached 0.30"), "{}", back.reason);
    assert_eq!(to(s.set_manual(Some(9))), None, "clamped to 3, which is the level already");
}

#[test]
fn cpu_raises_a_system_level_by_level_and_it_falls_past_the_hysteresis_after_the_dwell() {
    let s = system(|_| {});
    three(&s, at(0), [0.65; 3]);
    assert_eq!(to(s.evaluate(at(0))), Some(1), "60% is level 1");
    three(&s, at(1), [0.80; 3]);
    assert_eq!(to(s.evaluate(at(1))), Some(2));
    three(&s, at(2), [0.95; 3]);
    let change = s.evaluate(at(2)).unwrap();
    assert_eq!(change.to, 3);
    assert!(change.reason.starts_with("cpu reached 0.90 (level 3)"), "{}", change.reason);
    // Below 90% but above 0.8 x 90% = 72%: level 3 holds, however long.
    three(&s, at(19), [0.85; 3]);
    assert_eq!(s.evaluate(at(20)), None);
    assert_eq!(s.level(), 3);
    // Below 72%: it falls, one level per 5 s at a level.
    three(&s, at(21), [0.10; 3]);
    assert_eq!(to(s.evaluate(at(21))), Some(2));
    assert_eq!(s.evaluate(at(23)), None, "2 s at level 2 is not the 5 s dwell");
    let reason = s.get().reason;
    assert!(reason.starts_with("the signals ask for level 0; a level falls one at a time, after 5s at it"), "{reason}");
    three(&s, at(25), [0.10; 3]);
    assert_eq!(to(s.evaluate(at(26))), Some(1));
    three(&s, at(30), [0.10; 3]);
    assert_eq!(to(s.evaluate(at(31))), Some(0));
}

#[test]
fn one_bad_second_rises_at_once_and_stays_for_the_dwell() {
    let s = system(|_| {});
    three(&s, at(0), [0.95; 3]);
    assert_eq!(to(s.evaluate(at(0))), Some(3));
    three(&s, at(1), [0.05; 3]);
    for ms in (1000..5000).step_by(250) {
        assert_eq!(s.evaluate(at_ms(ms)), None, "at {ms} ms");
    }
    assert_eq!(to(s.evaluate(at(5))), Some(2));
}

#[test]
fn load_is_summed_up_as_the_rules_say() {
    let cases =
        [(Aggregate::Mean, 0.5, 0), (Aggregate::Max, 0.5, 3), (Aggregate::Share, 0.5, 0), (Aggregate::Share, 0.3, 3)];
    for (aggregate, share, want) in cases {
        let s = system(|c| c.load = LoadConfig { aggregate, share, ..c.load });
        three(&s, at(0), [0.99, 0.10, 0.10]);
        s.evaluate(at(0));
        assert_eq!(s.level(), want, "{aggregate:?} share {share}");
        assert_eq!(s.get().signals.instances, 3);
    }
}

#[test]
fn a_silent_instance_leaves_after_the_timeout() {
    let s = system(|c| c.min_time_at_level = Duration::ZERO);
    s.report_load(at(0), "hot", load(0.95), at(0)).unwrap();
    s.report_load(at(0), "cool", load(0.05), at(0)).unwrap();
    assert_eq!(s.evaluate(at(0)), None, "mean 50%");
    // "cool" goes silent; "hot" keeps reporting.
    s.report_load(at(3), "hot", load(0.95), at(3)).unwrap();
    assert_eq!(s.evaluate(at(4)), None, "4 s: still within the 5 s timeout");
    s.report_load(at(5), "hot", load(0.95), at(5)).unwrap();
    assert_eq!(to(s.evaluate(at(5))), Some(3), "'cool' left at 5 s");
    assert_eq!(s.get().signals.instances, 1);
}

#[test]
fn the_instance_table_is_bounded_and_frees_room_as_instances_expire() {
    let s = system(|c| c.load.max_instances = 100);
    for i in 0..100 {
        s.report_load(at(0), &format!("fake-{i}"), load(0.5), at(0)).unwrap();
    }
    assert_eq!(s.report_load(at(1), "one-more", load(0.5), at(1)), Err(TooManyInstances { live: 100, max: 100 }));
    s.report_load(at(1), "fake-7", load(0.6), at(1)).expect("a known instance still reports");
    assert_eq!(s.report_load(at_ms(5500), "one-more", load(0.5), at_ms(5500)), Ok(2), "the others expired at 5 s");
    s.evaluate(at_ms(5500));
    assert_eq!(s.get().signals.instances, 2, "fake-7 reported at 1 s and is still live; the rest left");
}

#[test]
fn a_percentile_of_the_reported_latency_raises_the_level() {
    let s = system(|c| {
        c.latency = Some((
            crate::rules::systems::Percentile(0.9),
            [Duration::from_millis(100), Duration::from_millis(300), Duration::from_secs(1)],
        ));
        c.min_time_at_level = Duration::ZERO;
    });
    for _ in 0..85 {
        s.record_outcome(at(0), false, Duration::from_millis(20));
    }
    for _ in 0..15 {
        s.record_outcome(at(0), false, Duration::from_millis(400));
    }
    let change = s.evaluate(at(0)).unwrap();
    assert_eq!(change.to, 2, "p90 is 400 ms: level 2, {}", change.reason);
    assert!(s.get().signals.latency.unwrap() >= Duration::from_millis(400));
    assert_eq!(to(s.evaluate(at(10))), Some(0), "the window moved past them");
}

#[test]
fn errors_of_a_system_count_its_reported_outcomes() {
    let s = system(|_| {});
    for i in 0..40 {
        s.record_outcome(at(0), i % 10 == 0, Duration::from_millis(5));
    }
    assert_eq!(to(s.evaluate(at(0))), Some(1), "10% errors");
    assert_eq!(s.get().signals.error_rate, Some(0.1));
    for _ in 0..10 {
        s.record_outcome(at(0), true, Duration::from_millis(5));
    }
    assert_eq!(to(s.evaluate(at(0))), Some(2), "14 of 50: 28% errors");
}

#[test]
fn latency_buckets_never_report_less_than_was_measured() {
    for us in [1u64, 2, 3, 5, 7, 100, 999, 1000, 12_345, 400_000, 1_000_000, 60_000_000] {
        let d = Duration::from_micros(us);
        let top = bucket_top(bucket(d));
        assert!(top >= d, "{us} us -> {top:?}");
        assert!(top.as_secs_f64() <= d.as_secs_f64() * 1.5 + 1e-6, "{us} us -> {top:?}");
    }
}

#[test]
fn systems_keep_their_state_across_rule_changes() {
    let systems = Systems::default();
    let a =
        systems.reconfigure(&[SystemConfig::named("payments"), SystemConfig::named("search")], &SystemConfig::global());
    a.by_name("payments").unwrap().set_manual(Some(3));
    let b = a.reconfigure(&[SystemConfig::named("search"), SystemConfig::named("payments")], &SystemConfig::global());
    assert_eq!(b.by_name("payments").unwrap().level(), 3);
    assert_eq!(b.scope(Some(0)).name().as_ref(), "search");
    assert!(b.by_name("other").is_none());
    assert!(b.scope(None).is_global());
}

#[test]
fn a_report_older_than_the_one_held_changes_nothing() {
    let s = system(|c| c.min_time_at_level = Duration::ZERO);
    // Taken at 2 s on one replica, heard here at 2 s; one taken at 1 s on
    // another replica arrives after it.
    s.report_load(at(2), "pod", load(0.95), at(2)).unwrap();
    s.report_load(at_ms(2100), "pod", load(0.10), at(1)).unwrap();
    assert_eq!(to(s.evaluate(at_ms(2100))), Some(3), "the newer report stands");
    s.report_load(at(3), "pod", load(0.10), at(3)).unwrap();
    assert_eq!(to(s.evaluate(at(3))), Some(0));
}

#[test]
fn a_report_delivered_later_than_the_timeout_counts_for_nothing() {
    let s = system(|c| c.min_time_at_level = Duration::ZERO);
    // Taken at 0 s, delivered at 6 s (a stalled Redis held it): too old.
    s.report_load(at(6), "late", load(0.95), at(0)).unwrap();
    assert_eq!(s.evaluate(at(6)), None);
    assert_eq!(s.get().signals.instances, 0);
    // Taken at 3 s, delivered at 6 s: counted, and leaves 5 s after it was taken.
    s.report_load(at(6), "late", load(0.95), at(3)).unwrap();
    assert_eq!(to(s.evaluate(at(6))), Some(3));
    assert_eq!(to(s.evaluate(at(8))), Some(0), "silent since 3 s: gone at 8 s");
}
