//! The breaker's conformance suite: named scenarios drawn from the state-machine
//! tests of resilience4j, Sentinel and Polly, all on injected time.

use std::time::Duration;

use super::*;
use crate::breaker::{Backoff, BreakerConfig, WindowKind};

const T0: Timestamp = Timestamp::from_secs(1_700_006_400);

fn at_ms(ms: u64) -> Timestamp {
    T0.add_nanos(ms * 1_000_000)
}

fn cfg() -> BreakerConfig {
    BreakerConfig {
        failure_rate_threshold: 0.5,
        slow_call_rate_threshold: 1.0,
        failure_count_threshold: None,
        slow_call_duration: Duration::from_millis(800),
        window: WindowKind::Count(10),
        minimum_calls: 4,
        wait_in_open: Backoff::fixed(Duration::from_secs(5)),
        half_open_calls: 3,
        max_wait_in_half_open: Duration::from_secs(10),
    }
}

/// A breaker driven through whole calls: acquire, then report.
struct Driver {
    b: Breaker,
    cfg: BreakerConfig,
    transitions: Vec<(State, State)>,
}

impl Driver {
    fn new(cfg: BreakerConfig) -> Self {
        Driver { b: Breaker::new(&cfg), cfg, transitions: Vec::new() }
    }

    fn note(&mut self, t: Option<Transition>) {
        if let Some(t) = t {
            self.transitions.push((t.from, t.to));
        }
    }

    fn acquire(&mut self, now: Timestamp) -> Admission {
        let (a, t) = self.b.acquire(&self.cfg, now);
        self.note(t);
        a
    }

    fn permit(&mut self, now: Timestamp) -> u64 {
        match self.acquire(now) {
            Admission::Permitted { generation, .. } => generation,
            other => panic!("expected a permit at {now:?}, got {other:?} in {:?}", self.b.state()),
        }
    }

    fn report(&mut self, now: Timestamp, generation: u64, outcome: Outcome, latency_ms: u64) {
        let (_, t) = self.b.report(&self.cfg, now, generation, outcome, Duration::from_millis(latency_ms));
        self.note(t);
    }

    /// One whole call.
    fn call(&mut self, now: Timestamp, outcome: Outcome, latency_ms: u64) {
        let g = self.permit(now);
        self.report(now, g, outcome, latency_ms);
    }

    fn fail(&mut self, now: Timestamp, n: usize) {
        (0..n).for_each(|_| self.call(now, Outcome::Failure, 10));
    }

    fn succeed(&mut self, now: Timestamp, n: usize) {
        (0..n).for_each(|_| self.call(now, Outcome::Success, 10));
    }

    fn state(&self) -> State {
        self.b.state()
    }

    fn open(&mut self) {
        self.fail(T0, 4);
        assert_eq!(self.state(), State::Open);
    }
}

use Outcome::{Failure, Ignored, Success};

#[test]
fn stays_closed_below_minimum_calls_even_when_every_call_fails() {
    let mut d = Driver::new(cfg());
    d.fail(T0, 3);
    assert_eq!(d.state(), State::Closed);
    assert_eq!(d.b.info(&d.cfg, T0).window.failures, 3);
}

#[test]
fn trips_at_exactly_the_failure_rate_threshold() {
    let mut d = Driver::new(cfg());
    d.succeed(T0, 2);
    d.fail(T0, 2); // 2 of 4 = 50% = the threshold
    assert_eq!(d.state(), State::Open);
    assert_eq!(d.transitions, [(State::Closed, State::Open)]);
}

#[test]
fn stays_closed_just_below_the_threshold() {
    let mut d = Driver::new(cfg());
    d.succeed(T0, 3);
    d.fail(T0, 2); // 2 of 5 = 40%
    assert_eq!(d.state(), State::Closed);
}

#[test]
fn slow_successful_calls_count_toward_the_slow_call_rate() {
    let mut d = Driver::new(BreakerConfig { slow_call_rate_threshold: 0.5, ..cfg() });
    d.call(T0, Success, 900);
    d.call(T0, Success, 900);
    d.succeed(T0, 1);
    assert_eq!(d.state(), State::Closed);
    d.call(T0, Success, 801); // 3 of 4 slow, none failed
    assert_eq!(d.state(), State::Open);
    assert_eq!(d.b.info(&d.cfg, T0).opened_at, Some(T0));
}

#[test]
fn a_call_exactly_at_slow_call_duration_is_not_slow() {
    let mut d = Driver::new(BreakerConfig { slow_call_rate_threshold: 0.5, ..cfg() });
    for _ in 0..4 {
        d.call(T0, Success, 800);
    }
    assert_eq!(d.state(), State::Closed);
    assert_eq!(d.b.info(&d.cfg, T0).window.slow, 0);
}

#[test]
fn open_rejects_with_retry_after_the_time_left() {
    let mut d = Driver::new(cfg());
    d.open();
    assert_eq!(
        d.acquire(at_ms(1_500)),
        Admission::Rejected { state: State::Open, retry_after: Duration::from_millis(3_500) }
    );
    assert_eq!(d.b.info(&d.cfg, at_ms(1_500)).not_permitted, 1);
    assert_eq!(d.b.info(&d.cfg, at_ms(1_500)).next_probe_at, Some(at_ms(5_000)));
}

#[test]
fn the_first_acquire_after_the_wait_moves_to_half_open() {
    let mut d = Driver::new(cfg());
    d.open();
    assert!(matches!(d.acquire(at_ms(4_999)), Admission::Rejected { .. }));
    assert_eq!(d.state(), State::Open, "time alone does not move it");
    assert!(matches!(d.acquire(at_ms(5_000)), Admission::Permitted { probe: true, .. }));
    assert_eq!(d.state(), State::HalfOpen);
    assert_eq!(d.transitions, [(State::Closed, State::Open), (State::Open, State::HalfOpen)]);
}

#[test]
fn backoff_grows_per_reopening_5s_then_7_5s_and_resets_on_close() {
    let backoff = Backoff { initial: Duration::from_secs(5), multiplier: 1.5, max: Duration::from_secs(60) };
    let mut d = Driver::new(BreakerConfig { wait_in_open: backoff, half_open_calls: 1, ..cfg() });
    d.open();
    assert_eq!(d.b.info(&d.cfg, T0).next_probe_at, Some(at_ms(5_000)));
    d.call(at_ms(5_000), Failure, 10); // the probe fails: reopen
    assert_eq!(d.state(), State::Open);
    assert_eq!(d.b.info(&d.cfg, at_ms(5_000)).next_probe_at, Some(at_ms(12_500)), "5 s * 1.5");
    d.call(at_ms(12_500), Failure, 10);
    assert_eq!(d.b.info(&d.cfg, at_ms(12_500)).next_probe_at, Some(at_ms(23_750)), "7.5 s * 1.5");
    d.call(at_ms(23_750), Success, 10);
    assert_eq!(d.state(), State::Closed);
    d.fail(at_ms(30_000), 4);
    assert_eq!(d.b.info(&d.cfg, at_ms(30_000)).next_probe_at, Some(at_ms(35_000)), "back to 5 s after closing");
}

#[test]
fn half_open_hands_out_exactly_n_probes_and_rejects_the_next() {
    let mut d = Driver::new(cfg());
    d.open();
    let probes: Vec<_> = (0..3).map(|_| d.acquire(at_ms(5_000))).collect();
    assert!(probes.iter().all(|a| matches!(a, Admission::Permitted { probe: true, .. })));
    match d.acquire(at_ms(5_001)) {
        Admission::Rejected { state, retry_after } => {
            assert_eq!(state, State::HalfOpen);
            assert_eq!(retry_after, Duration::from_millis(9_999), "until the probes must have reported");
        }
        other => panic!("{other:?}"),
    }
    let info = d.b.info(&d.cfg, at_ms(5_001));
    assert_eq!((info.probes_in_flight, info.probes_remaining), (3, 0));
}

#[test]
fn probes_succeeding_close_the_breaker_with_a_fresh_window() {
    let mut d = Driver::new(cfg());
    d.open();
    d.succeed(at_ms(5_000), 3);
    assert_eq!(d.state(), State::Closed);
    let info = d.b.info(&d.cfg, at_ms(5_000));
    assert_eq!(info.window, Counts::default());
    assert_eq!(info.consecutive_openings, 0);
    d.fail(at_ms(6_000), 3);
    assert_eq!(d.state(), State::Closed, "the old failures are gone");
}

#[test]
fn failing_probes_reopen_the_breaker() {
    let mut d = Driver::new(cfg());
    d.open();
    d.call(at_ms(5_000), Success, 10);
    d.fail(at_ms(5_000), 2); // 2 of 3 probes failed
    assert_eq!(d.state(), State::Open);
    assert_eq!(d.transitions.last(), Some(&(State::HalfOpen, State::Open)));
}

#[test]
fn the_decision_falls_only_when_the_last_probe_reports() {
    let mut d = Driver::new(cfg());
    d.open();
    let gens: Vec<u64> = (0..3).map(|_| d.permit(at_ms(5_000))).collect();
    d.report(at_ms(5_100), gens[0], Failure, 10);
    d.report(at_ms(5_200), gens[1], Failure, 10);
    assert_eq!(d.state(), State::HalfOpen, "two failures of three decide nothing yet");
    d.report(at_ms(5_300), gens[2], Success, 10);
    assert_eq!(d.state(), State::Open);
}

#[test]
fn an_ignored_outcome_returns_its_probe_permit() {
    let mut d = Driver::new(cfg());
    d.open();
    let gens: Vec<u64> = (0..3).map(|_| d.permit(at_ms(5_000))).collect();
    assert!(matches!(d.acquire(at_ms(5_000)), Admission::Rejected { .. }));
    d.report(at_ms(5_000), gens[0], Ignored, 10);
    let g = d.permit(at_ms(5_000));
    d.report(at_ms(5_000), gens[1], Success, 10);
    d.report(at_ms(5_000), gens[2], Success, 10);
    assert_eq!(d.state(), State::HalfOpen, "the ignored probe's replacement has not reported");
    d.report(at_ms(5_000), g, Success, 10);
    assert_eq!(d.state(), State::Closed);
}

#[test]
fn ignored_outcomes_are_not_recorded_when_closed() {
    let mut d = Driver::new(cfg());
    for _ in 0..10 {
        d.call(T0, Ignored, 10);
    }
    assert_eq!(d.b.info(&d.cfg, T0).window.calls, 0);
}

#[test]
fn a_stale_generation_outcome_never_decides() {
    let mut d = Driver::new(cfg());
    let old: Vec<u64> = (0..4).map(|_| d.permit(T0)).collect();
    d.b.force(&d.cfg, T0, State::Closed); // a reset starts a new generation
    for g in old {
        d.report(T0, g, Failure, 10);
    }
    assert_eq!(d.state(), State::Closed, "four failures, all from before the reset");
    let info = d.b.info(&d.cfg, T0);
    assert_eq!((info.window.calls, info.stale_outcomes), (0, 4));
}

#[test]
fn a_probe_from_an_earlier_half_open_round_does_not_decide_this_one() {
    let mut d = Driver::new(BreakerConfig { half_open_calls: 1, ..cfg() });
    d.open();
    let first = d.permit(at_ms(5_000));
    d.b.tick(&d.cfg, at_ms(15_000)); // the probe never reported: reopen
    assert_eq!(d.state(), State::Open);
    let second = d.permit(at_ms(40_000));
    assert_ne!(first, second);
    d.report(at_ms(40_000), first, Success, 10);
    assert_eq!(d.state(), State::HalfOpen, "the late probe of the last round is stale");
    d.report(at_ms(40_000), second, Success, 10);
    assert_eq!(d.state(), State::Closed);
}

#[test]
fn probes_that_never_report_expire_and_reopen_the_breaker() {
    let mut d = Driver::new(cfg());
    d.open();
    d.permit(at_ms(5_000));
    assert_eq!(d.b.tick(&d.cfg, at_ms(14_999)), None);
    let t = d.b.tick(&d.cfg, at_ms(15_000)).expect("a reopening");
    assert_eq!((t.from, t.to), (State::HalfOpen, State::Open));
    assert!(t.reason.contains("did not report"), "{}", t.reason);
    assert_eq!(t.next_probe_at, Some(at_ms(20_000)));
}

#[test]
fn forced_open_ignores_time() {
    let mut d = Driver::new(cfg());
    d.b.force(&d.cfg, T0, State::ForcedOpen);
    for ms in [0, 5_000, 3_600_000] {
        assert!(matches!(d.acquire(at_ms(ms)), Admission::Rejected { state: State::ForcedOpen, .. }));
    }
    assert_eq!(d.state(), State::ForcedOpen);
}

#[test]
fn disabled_admits_everything_and_records_nothing() {
    let mut d = Driver::new(cfg());
    d.b.force(&d.cfg, T0, State::Disabled);
    d.fail(T0, 50);
    assert_eq!(d.state(), State::Disabled);
    assert_eq!(d.b.info(&d.cfg, T0).window.calls, 0);
}

#[test]
fn metrics_only_records_and_never_opens() {
    let mut d = Driver::new(cfg());
    d.b.force(&d.cfg, T0, State::MetricsOnly);
    d.fail(T0, 10);
    assert_eq!(d.state(), State::MetricsOnly);
    let info = d.b.info(&d.cfg, T0);
    assert_eq!((info.window.calls, info.window.failures), (10, 10));
}

#[test]
fn reset_closes_an_open_breaker_and_clears_its_window() {
    let mut d = Driver::new(cfg());
    d.open();
    let t = d.b.force(&d.cfg, at_ms(100), State::Closed).unwrap();
    assert_eq!((t.from, t.to), (State::Open, State::Closed));
    assert_eq!(d.b.info(&d.cfg, at_ms(100)).window.calls, 0);
    assert!(matches!(d.acquire(at_ms(100)), Admission::Permitted { probe: false, .. }));
}

#[test]
fn the_time_based_window_drops_old_buckets() {
    let mut d = Driver::new(BreakerConfig { window: WindowKind::Time(10), ..cfg() });
    d.fail(at_ms(0), 2);
    d.succeed(at_ms(9_000), 1);
    assert_eq!(d.state(), State::Closed, "3 calls: below minimum_calls");
    // At 10 s the two failures have left the window: 2 of 4 would have tripped.
    d.succeed(at_ms(10_000), 1);
    assert_eq!(d.state(), State::Closed);
    assert_eq!(d.b.info(&d.cfg, at_ms(10_000)).window.calls, 2);
    d.fail(at_ms(10_500), 2);
    assert_eq!(d.state(), State::Open, "2 of 4 within the last 10 s");
}

#[test]
fn the_count_window_forgets_calls_beyond_its_size() {
    let mut d = Driver::new(BreakerConfig { window: WindowKind::Count(4), ..cfg() });
    d.fail(T0, 1);
    d.succeed(T0, 3);
    d.succeed(T0, 1); // pushes the failure out
    d.fail(T0, 1);
    assert_eq!(d.state(), State::Closed, "1 of the last 4 failed");
    d.fail(T0, 1);
    assert_eq!(d.state(), State::Open, "2 of the last 4 failed");
}

#[test]
fn a_failure_rate_threshold_of_one_needs_every_call_to_fail() {
    let mut d = Driver::new(BreakerConfig { failure_rate_threshold: 1.0, ..cfg() });
    d.succeed(T0, 1);
    d.fail(T0, 9);
    assert_eq!(d.state(), State::Closed);
    let mut d = Driver::new(BreakerConfig { failure_rate_threshold: 1.0, ..cfg() });
    d.fail(T0, 4);
    assert_eq!(d.state(), State::Open);
}

#[test]
fn release_returns_a_probe_whose_call_was_denied_elsewhere() {
    let mut d = Driver::new(BreakerConfig { half_open_calls: 1, ..cfg() });
    d.open();
    let g = d.permit(at_ms(5_000));
    assert!(matches!(d.acquire(at_ms(5_000)), Admission::Rejected { .. }));
    d.b.release(g, true);
    assert!(matches!(d.acquire(at_ms(5_000)), Admission::Permitted { probe: true, .. }));
}

#[test]
fn every_transition_bumps_the_generation() {
    let mut d = Driver::new(cfg());
    let g0 = d.b.generation();
    d.open();
    let g1 = d.b.generation();
    d.permit(at_ms(5_000));
    let g2 = d.b.generation();
    assert!(g0 < g1 && g1 < g2);
}

#[test]
fn would_permit_answers_without_changing_state() {
    let mut d = Driver::new(BreakerConfig { half_open_calls: 1, ..cfg() });
    d.open();
    assert!(!d.b.would_permit(&d.cfg, at_ms(4_000)));
    assert!(d.b.would_permit(&d.cfg, at_ms(5_000)));
    assert_eq!(d.state(), State::Open);
    d.permit(at_ms(5_000));
    assert!(!d.b.would_permit(&d.cfg, at_ms(5_000)));
}

#[test]
fn a_new_window_kind_in_the_rules_starts_a_fresh_window_and_keeps_the_state() {
    let mut d = Driver::new(cfg());
    d.fail(T0, 3);
    d.b.reconfigure(&BreakerConfig { window: WindowKind::Count(10), ..cfg() });
    assert_eq!(d.b.info(&d.cfg, T0).window.calls, 3, "same window: kept");
    d.fail(T0, 1);
    assert_eq!(d.state(), State::Open);
    d.b.reconfigure(&BreakerConfig { window: WindowKind::Time(30), ..cfg() });
    assert_eq!(d.state(), State::Open);
    assert_eq!(d.b.info(&d.cfg, T0).window.calls, 0);
}

#[test]
fn every_state_has_one_number_and_back() {
    for s in State::ALL {
        assert_eq!(State::from_number(i64::from(s.number())), Some(s));
    }
    assert_eq!(State::from_number(0), None, "0 is unspecified, not CLOSED");
    assert_eq!(State::from_number(7), None);
}

#[test]
fn a_failure_count_opens_whatever_the_rate_and_one_failed_probe_of_one_reopens() {
    let off = || crate::breaker::OFF;
    let count = BreakerConfig {
        failure_rate_threshold: off(),
        slow_call_rate_threshold: off(),
        failure_count_threshold: Some(3),
        minimum_calls: 1,
        half_open_calls: 1,
        ..cfg()
    };
    let mut d = Driver::new(count);
    d.succeed(T0, 50);
    d.fail(T0, 2);
    assert_eq!(d.state(), State::Closed, "2 failures of 52: under 3, whatever the rate");
    d.fail(T0, 1);
    assert_eq!(d.state(), State::Open, "the third failure");
    // HALF_OPEN hands out one probe: its failure reopens (3 is capped at 1).
    let later = T0.saturating_add(Duration::from_secs(5));
    d.call(later, Failure, 10);
    assert_eq!(d.state(), State::Open);
    let later = later.saturating_add(Duration::from_secs(5));
    d.call(later, Success, 10);
    assert_eq!(d.state(), State::Closed);
    // Off rates never trip: every call failing, without a count, stays closed.
    let mut never =
        Driver::new(BreakerConfig { failure_rate_threshold: off(), slow_call_rate_threshold: 1.0, ..cfg() });
    never.fail(T0, 100);
    assert_eq!(never.state(), State::Closed);
}
