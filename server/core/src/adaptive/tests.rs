//! Each algorithm against sequences worked by hand from its published
//! definition (Netflix's concurrency-limits), then the window around them
//! on a fake clock.

use std::time::Duration;

use super::vegas::log10_root;
use super::*;
use crate::adaptive::{AimdConfig, Gradient2Config, VegasConfig};

fn config(algorithm: AlgorithmConfig, initial: u32) -> AdaptiveConfig {
    let window = Duration::from_secs(1);
    AdaptiveConfig { algorithm, min: 1, max: 1000, initial, window, min_samples: 10, probe: None }
}

fn gradient2(long_window: u32) -> AdaptiveConfig {
    let c = Gradient2Config { smoothing: 0.2, queue_size: 4, long_window, tolerance: 1.0 };
    config(AlgorithmConfig::Gradient2(c), 20)
}

fn vegas(smoothing: f64, probe_multiplier: u32, initial: u32) -> AdaptiveConfig {
    config(AlgorithmConfig::Vegas(VegasConfig { smoothing, probe_multiplier }), initial)
}

fn aimd(initial: u32) -> AdaptiveConfig {
    config(AlgorithmConfig::Aimd(AimdConfig { backoff_ratio: 0.9, timeout: Duration::from_secs(5) }), initial)
}

fn window(rtt_us: f64, in_flight: u32) -> Update {
    Update { rtt_us: Some(rtt_us), in_flight, dropped: false, min_rtt_us: None }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Feeds `steps` (update, expected estimate after it) and checks each.
fn run(cfg: &AdaptiveConfig, e: &mut Estimator, steps: &[(Update, f64)]) {
    for (i, (u, want)) in steps.iter().enumerate() {
        let got = e.update(cfg, u);
        assert!(close(got, *want), "step {i}: {u:?} gave {got}, want {want}");
    }
}

#[test]
fn gradient2_follows_the_long_over_short_latency() {
    let cfg = gradient2(600);
    let mut e = Estimator::new(&cfg, 1);
    run(
        &cfg,
        &mut e,
        &[
            // long = 10000, gradient 1: 20 * 0.8 + (20 + 4) * 0.2
            (window(10_000.0, 20), 20.8),
            // 20.8 * 0.8 + (20.8 + 4) * 0.2
            (window(10_000.0, 20), 21.6),
            // long = mean(10000, 10000, 20000) = 13333.3, gradient 2/3:
            // 21.6 * 0.8 + (21.6 * 2/3 + 4) * 0.2
            (window(20_000.0, 21), 20.96),
            // 5 in flight, under half of 20.96: unchanged; long = 11250 is
            // more than twice 5000, cut to 10125
            (window(5_000.0, 5), 20.96),
        ],
    );
    let Estimator::Gradient2(g) = &e else { unreachable!() };
    assert!(close(g.inputs().long_rtt_us, 10_125.0), "{:?}", g.inputs());
    run(
        &cfg,
        &mut e,
        &[
            // Still warming up: long = (45000 + 10000) / 5 = 11000 (the cut
            // is forgotten), 1.1 capped at 1: 20.96 * 0.8 + 24.96 * 0.2
            (window(10_000.0, 30), 21.76),
            // long = 155000 / 6, gradient 0.258 floored at 0.5:
            // 21.76 * 0.8 + (21.76 * 0.5 + 4) * 0.2
            (window(100_000.0, 30), 20.384),
        ],
    );
}

#[test]
fn gradient2_long_latency_is_an_exponential_average_after_ten_windows() {
    // long_window 3: factor 2 / (3 + 1) = 0.5.
    let cfg = gradient2(3);
    let mut e = Estimator::new(&cfg, 1);
    for _ in 0..10 {
        e.update(&cfg, &window(10_000.0, 1000));
    }
    let before = e.estimate();
    // long = 10000 * 0.5 + 20000 * 0.5 = 15000, gradient 0.75
    let got = e.update(&cfg, &window(20_000.0, 1000));
    assert!(close(got, before * 0.8 + (before * 0.75 + 4.0) * 0.2), "{got}");
    assert!(close(e.inputs().long_rtt_us, 15_000.0));
    assert!(close(e.inputs().gradient, 0.75));
    // Drops alone are no signal to Gradient2.
    let dropped = Update { rtt_us: None, in_flight: 1000, dropped: true, min_rtt_us: None };
    assert!(close(e.update(&cfg, &dropped), got));
}

#[test]
fn gradient2_stays_within_min_and_max_and_tolerates_what_it_is_told() {
    let mut cfg = gradient2(600);
    cfg.min = 20;
    cfg.max = 21;
    let mut e = Estimator::new(&cfg, 1);
    // 20.8 * 0.8 + 24.8 * 0.2 = 21.6, capped; then the gradient floors at
    // 0.5: 21 * 0.8 + (10.5 + 4) * 0.2 = 19.7, raised to min.
    run(&cfg, &mut e, &[(window(10_000.0, 20), 20.8), (window(10_000.0, 20), 21.0), (window(1e6, 21), 20.0)]);
    // tolerance 2: a window twice as slow as the long-term is no queue.
    let c = Gradient2Config { smoothing: 0.2, queue_size: 4, long_window: 600, tolerance: 2.0 };
    let cfg = config(AlgorithmConfig::Gradient2(c), 20);
    let mut e = Estimator::new(&cfg, 1);
    run(&cfg, &mut e, &[(window(10_000.0, 20), 20.8), (window(20_000.0, 20), 20.8 + 0.8)]);
}

#[test]
fn log10_root_is_netflix_s() {
    let cases = [(0.0, 1.0), (5.0, 1.0), (9.9, 1.0), (10.0, 1.0), (99.0, 1.0), (100.0, 2.0), (999.0, 2.0)];
    for (limit, want) in cases {
        assert!(close(log10_root(limit), want), "{limit}");
    }
    assert!(close(log10_root(1000.0), 31.0));
    assert!(close(log10_root(4000.0), 63.0));
}

#[test]
fn vegas_grows_while_the_queue_is_short_and_shrinks_when_it_is_long() {
    let cfg = vegas(1.0, 30, 20);
    let mut e = Estimator::new(&cfg, 7);
    let drop = |rtt: f64, n| Update { rtt_us: Some(rtt), in_flight: n, dropped: true, min_rtt_us: None };
    run(
        &cfg,
        &mut e,
        &[
            // The first window sets the no-load latency.
            (window(10_000.0, 20), 20.0),
            // queue = ceil(20 * (1 - 1)) = 0 <= threshold 1: + beta 6
            (window(10_000.0, 20), 26.0),
            // queue = ceil(26 * (1 - 10/12)) = 5, within [alpha 3, beta 6]
            (window(12_000.0, 26), 26.0),
            // queue = ceil(26 / 3) = 9 > beta: down by the larger of
            // log10 (1) and half of what is over beta ((9 - 6) / 2)
            (window(15_000.0, 26), 24.5),
            // a drop: - 1
            (drop(10_000.0, 25), 23.5),
            // 10 in flight, under half of 23.5: unchanged
            (window(30_000.0, 10), 23.5),
            // queue = ceil(23.5 * (1 - 10/10.5)) = 2, between threshold and alpha: + 1
            (window(10_500.0, 24), 24.5),
            // faster than the no-load latency: that is the new one
            (window(9_000.0, 25), 24.5),
            // queue = ceil(24.5 * (1 - 9/18)) = 13 > 6: down by (13 - 6) / 2
            (window(18_000.0, 25), 21.0),
        ],
    );
    assert!(close(e.inputs().no_load_rtt_us, 9_000.0));
    assert!(close(e.inputs().queue, 13.0));
    // Every call of a window dropped: a drop.
    assert!(close(e.update(&cfg, &Update { rtt_us: None, in_flight: 21, dropped: true, min_rtt_us: None }), 20.0));
}

#[test]
fn vegas_smooths_and_scales_its_thresholds_with_the_limit() {
    let cfg = vegas(0.5, 30, 20);
    let mut e = Estimator::new(&cfg, 7);
    // 0.5 * 20 + 0.5 * 26
    run(&cfg, &mut e, &[(window(10_000.0, 20), 20.0), (window(10_000.0, 20), 23.0)]);
    // At 150 the thresholds are log10 2: alpha 6, beta 12, threshold 2.
    let cfg = vegas(1.0, 1000, 150);
    let mut e = Estimator::new(&cfg, 7);
    run(
        &cfg,
        &mut e,
        &[
            (window(10_000.0, 150), 150.0),
            // queue = ceil(150 * (1 - 10/10.1)) = 2 <= 2: + 12
            (window(10_100.0, 150), 162.0),
            // queue = ceil(162 * (1 - 10/10.5)) = 8: within [6, 12]
            (window(10_500.0, 162), 162.0),
            // queue = ceil(162 * (1 - 10/12)) = 27 > 12: down by the larger
            // of log10 (2) and (27 - 12) / 2
            (window(12_000.0, 162), 154.5),
            // queue = ceil(154.5 * (1 - 10/10.8)) = 12, not over beta: unchanged
            (window(10_800.0, 155), 154.5),
        ],
    );
}

#[test]
fn vegas_probes_the_no_load_latency_afresh() {
    // probe_multiplier 1 at a limit of 2: a probe once the count reaches
    // jitter * 2, jitter in [0.5, 1): by the second window.
    let mut cfg = vegas(1.0, 1, 2);
    cfg.max = 2;
    let mut e = Estimator::new(&cfg, 99);
    e.update(&cfg, &window(10_000.0, 2));
    e.update(&cfg, &window(30_000.0, 2));
    assert!(close(e.inputs().no_load_rtt_us, 30_000.0), "{:?}", e.inputs());
    // Jitters stay in [0.5, 1).
    let mut v = Vegas::new(20.0, 12345);
    for _ in 0..10_000 {
        let j = v.next_jitter_for_tests();
        assert!((0.5..1.0).contains(&j), "{j}");
    }
}

#[test]
fn aimd_adds_one_and_backs_off_by_the_ratio() {
    let cfg = aimd(10);
    let mut e = Estimator::new(&cfg, 1);
    let dropped = Update { rtt_us: Some(10_000.0), in_flight: 9, dropped: true, min_rtt_us: None };
    run(
        &cfg,
        &mut e,
        &[
            // 5 in flight, 5 * 2 >= 10: + 1
            (window(10_000.0, 5), 11.0),
            // 5 * 2 < 11: unchanged
            (window(10_000.0, 5), 11.0),
            // a drop: floor(11 * 0.9) = 9
            (dropped, 9.0),
            // a mean latency past the 5 s timeout: floor(9 * 0.9) = 8
            (window(6_000_000.0, 9), 8.0),
            (window(10_000.0, 8), 9.0),
        ],
    );
    // At least one less, never below 1 (nor min).
    let cfg = aimd(2);
    let mut e = Estimator::new(&cfg, 1);
    run(&cfg, &mut e, &[(dropped, 1.0), (dropped, 1.0)]);
    let mut cfg = aimd(50);
    cfg.min = 48;
    let mut e = Estimator::new(&cfg, 1);
    run(&cfg, &mut e, &[(dropped, 48.0)]);
}

#[test]
fn a_window_closes_on_time_and_needs_its_samples() {
    let cfg = aimd(10);
    let t0 = Timestamp::from_secs(100);
    let mut c = Controller::new(cfg, t0, 1);
    for _ in 0..9 {
        c.window_mut().sample(Duration::from_millis(10));
    }
    c.window_mut().in_flight(10);
    assert_eq!(c.close_if_due(t0.saturating_add(Duration::from_millis(999))), None, "not over yet");
    assert_eq!(c.close_if_due(t0.saturating_add(Duration::from_secs(1))), None, "9 samples of 10");
    assert_eq!(c.limit(), 10);
    assert_eq!(c.history().count(), 0);
    // The next window starts empty: ten samples now.
    let t1 = t0.saturating_add(Duration::from_secs(1));
    for _ in 0..10 {
        c.window_mut().sample(Duration::from_millis(10));
    }
    c.window_mut().in_flight(6);
    assert_eq!(c.close_if_due(t1.saturating_add(Duration::from_secs(1))), Some(11));
    let p = c.history().last().copied().unwrap();
    assert_eq!((p.limit, p.window.samples, p.window.max_in_flight), (11, 10, 6));
    // Drops count toward the samples a window needs.
    let t2 = t1.saturating_add(Duration::from_secs(2));
    for _ in 0..10 {
        c.window_mut().drop_one();
    }
    assert_eq!(c.close_if_due(t2.saturating_add(Duration::from_secs(1))), Some(9));
}

#[test]
fn windows_of_replicas_merge() {
    let mut a = Window::default();
    a.sample(Duration::from_millis(10));
    a.sample(Duration::from_millis(30));
    a.in_flight(7);
    let mut b = Window::default();
    b.sample(Duration::from_millis(5));
    b.drop_one();
    b.in_flight(4);
    a.merge(&b);
    assert_eq!(a, Window { samples: 3, rtt_sum_us: 45_000, min_rtt_us: 5_000, max_in_flight: 11, drops: 1 });
    assert_eq!(a.mean_rtt_us(), Some(15_000.0));
    let mut empty = Window::default();
    empty.merge(&Window::default());
    assert!(empty.is_empty());
    assert_eq!(empty.mean_rtt_us(), None);
}

#[test]
fn states_travel_as_text_and_bad_text_is_refused() {
    for cfg in [gradient2(600), vegas(1.0, 30, 20), aimd(10)] {
        let mut e = Estimator::new(&cfg, 42);
        for rtt in [10_000.0, 10_000.0, 12_000.0, 15_000.0] {
            e.update(&cfg, &window(rtt, 30));
        }
        let text = e.encode();
        assert_eq!(Estimator::decode(&text, &cfg), Some(e.clone()), "{text}");
        // The same numbers go on the same way.
        let mut back = Estimator::decode(&text, &cfg).unwrap();
        assert!(close(back.update(&cfg, &window(11_000.0, 30)), e.update(&cfg, &window(11_000.0, 30))));
    }
    let cfg = gradient2(600);
    for bad in ["", "gradient2", "gradient2 1 2 3", "vegas 20 0 0 0.7 1 2 0 0", "gradient2 NaN 1 1 1 1 1", "x 1"] {
        assert_eq!(Estimator::decode(bad, &cfg), None, "{bad}");
    }
}

#[test]
fn new_rules_keep_the_state_of_the_same_algorithm() {
    let t0 = Timestamp::from_secs(1);
    let mut c = Controller::new(aimd(10), t0, 1);
    c.window_mut().in_flight(10);
    for _ in 0..10 {
        c.window_mut().sample(Duration::from_millis(1));
    }
    assert_eq!(c.close_if_due(t0.saturating_add(Duration::from_secs(1))), Some(11));
    let mut narrower = aimd(10);
    narrower.max = 8;
    c.reconfigure(narrower, 1);
    assert_eq!(c.limit(), 8, "the state is kept, within the new bounds");
    c.reconfigure(gradient2(600), 1);
    assert_eq!(c.limit(), 20, "another algorithm starts at its initial");
}

/// A dependency that serves `servers` calls at once in `service` each, the
/// rest queued, called by `callers` closed-loop callers through the limit,
/// one window a second for `windows` seconds on a fake clock. Each window,
/// the calls in flight are the limit (or every caller, if fewer), and they
/// take the service time stretched by the queue. The limit, and the mean
/// latency, of the last ten windows.
fn closed_loop(cfg: AdaptiveConfig, servers: u32, service_ms: f64, callers: u32, windows: u64) -> (Vec<u32>, f64) {
    let start = Timestamp::from_secs(1_700_000_000);
    let mut c = Controller::new(cfg, start, 7);
    let (mut limits, mut latencies) = (Vec::new(), Vec::new());
    for second in 1..=windows {
        let in_flight = c.limit().min(callers);
        let latency_ms = service_ms * (f64::from(in_flight) / f64::from(servers)).max(1.0);
        let calls = (f64::from(in_flight) * 1000.0 / latency_ms).round() as u64;
        for _ in 0..calls {
            c.window_mut().sample(Duration::from_secs_f64(latency_ms / 1000.0));
        }
        c.window_mut().in_flight(in_flight);
        let now = start.saturating_add(Duration::from_secs(second));
        let w = c.take_window(now);
        c.apply(now, &w);
        if second > windows - 10 {
            limits.push(c.limit());
            latencies.push(latency_ms);
        }
    }
    (limits, latencies.iter().sum::<f64>() / latencies.len() as f64)
}

/// Closes the window of second `second` after `start`: `n` calls came back
/// after `rtt_ms`, with at most `peak` in flight (0: none admitted). The
/// limit after it.
fn close_window(c: &mut Controller, start: Timestamp, second: u64, rtt_ms: u64, n: u64, peak: u32) -> u32 {
    for _ in 0..n {
        c.window_mut().sample(Duration::from_millis(rtt_ms));
    }
    c.window_mut().in_flight(peak);
    let now = start.saturating_add(Duration::from_secs(second));
    let w = c.take_window(now);
    c.apply(now, &w);
    c.limit()
}

fn probing(cfg: AdaptiveConfig) -> AdaptiveConfig {
    AdaptiveConfig { probe: Some(ProbeConfig::default()), ..cfg }
}

#[test]
fn an_overloaded_start_is_found_only_with_a_measured_no_load_latency() {
    // 5 calls at once at 40 ms (125 calls a second), 20 callers, initial
    // limit 20: every window from the first is already queued (160 ms).
    for cfg in [gradient2(600), vegas(1.0, 30, 20), aimd(20)] {
        let name = cfg.algorithm_name();
        let (limits, latency) = closed_loop(cfg, 5, 40.0, 20, 50);
        assert!(latency > 120.0, "{name} without a measurement: {latency} ms, limits {limits:?}");
        let (limits, latency) = closed_loop(probing(cfg), 5, 40.0, 20, 50);
        // Gradient2 keeps `queue_size` (4) calls of headroom over what the
        // dependency serves: 10 in flight, twice its no-load latency.
        assert!(latency <= 90.0, "{name} with a measurement: {latency} ms, limits {limits:?}");
        assert!(limits.iter().all(|l| (3..=11).contains(l)), "{name}: {limits:?}");
    }
}

#[test]
fn a_healthy_start_finds_the_same_capacity_with_or_without_the_measurement() {
    // 40 at once at 40 ms, 80 callers, initial 20: room to grow.
    for cfg in [gradient2(600), vegas(1.0, 30, 20)] {
        let name = cfg.algorithm_name();
        let cfg = AdaptiveConfig { max: 200, ..cfg };
        let (without, _) = closed_loop(cfg, 40, 40.0, 80, 120);
        let (with, latency) = closed_loop(probing(cfg), 40, 40.0, 80, 120);
        let mean = |l: &[u32]| l.iter().map(|x| f64::from(*x)).sum::<f64>() / l.len() as f64;
        assert!((30.0..=60.0).contains(&mean(&with)), "{name} with: {with:?} ({latency} ms)");
        assert!((mean(&with) - mean(&without)).abs() <= 0.25 * mean(&without), "{name}: {with:?} vs {without:?}");
    }
}

#[test]
fn the_measurement_holds_the_limit_at_the_floor_then_lets_it_go() {
    let cfg = probing(gradient2(600));
    let start = Timestamp::from_secs(1_700_000_000);
    let mut c = Controller::new(cfg, start, 7);
    let at = |c: &mut Controller, second, rtt_ms, n| close_window(c, start, second, rtt_ms, n, 0);
    assert_eq!(at(&mut c, 1, 100, 200), 3, "the first window's close starts draining at the floor");
    assert!(c.inputs().probing);
    assert_eq!(at(&mut c, 2, 100, 50), 3, "drained; measuring");
    assert_eq!(at(&mut c, 3, 40, 60), 20, "60 samples at 40 ms: measured, the limit is back");
    let inputs = c.inputs();
    assert!(!inputs.probing);
    assert!(close(inputs.min_rtt_us, 40_000.0), "{inputs:?}");
    // The next in the first slot of five minutes on the clock at least half
    // an interval away: 1_700_000_400 (the one at 1_700_000_100 is too
    // near), moved by at most 15% of five minutes.
    let next = inputs.next_probe_at.unwrap().as_nanos() - start.as_nanos();
    assert!((400_000_000_000..445_000_000_000).contains(&next), "{next}");
}

#[test]
fn a_measurement_that_finds_the_window_before_it_queued_lowers_the_limit() {
    let cfg = probing(gradient2(600));
    let start = Timestamp::from_secs(1_700_000_000);
    let mut c = Controller::new(cfg, start, 7);
    let at = |c: &mut Controller, second, rtt_ms, n, peak| close_window(c, start, second, rtt_ms, n, peak);
    // The first window: 20 in flight, each call 200 ms (queued).
    assert_eq!(at(&mut c, 1, 200, 100, 20), 3);
    assert_eq!(at(&mut c, 2, 60, 50, 3), 3, "drained; measuring");
    // Measured 40 ms. At the first window's throughput (20 / 200 ms), twice
    // the no-load latency is 20 * 80 / 200 = 8 in flight: the limit goes
    // back to 8, not to its initial 20.
    assert_eq!(at(&mut c, 3, 40, 60, 3), 8);
    // The next measurement, after a window that did not queue, leaves the
    // limit where the algorithm has it.
    let mut c = Controller::new(cfg, start, 7);
    assert_eq!(at(&mut c, 1, 50, 100, 20), 3);
    assert_eq!(at(&mut c, 2, 45, 50, 3), 3);
    assert_eq!(at(&mut c, 3, 40, 60, 3), 20, "50 ms is not twice 40 ms: nothing queued");
}

#[test]
fn the_measurement_waits_for_the_queue_to_drain_and_gives_up_on_one_that_does_not() {
    let cfg = probing(gradient2(600));
    let start = Timestamp::from_secs(1_700_000_000);
    let mut c = Controller::new(cfg, start, 7);
    let window = |c: &mut Controller, second, rtt_ms, n, peak| {
        close_window(c, start, second, rtt_ms, n, peak);
    };
    window(&mut c, 1, 100, 20, 20); // the measurement starts
    // A slow resource: the calls admitted before the floor are still in
    // flight, coming back after their time in the queue.
    window(&mut c, 2, 3000, 20, 20);
    window(&mut c, 3, 4000, 20, 20);
    assert!(c.inputs().probing, "still draining");
    // Drained: at most the floor in flight; these are measured.
    window(&mut c, 4, 1000, 3, 3);
    window(&mut c, 5, 1000, 3, 3);
    window(&mut c, 6, 1000, 3, 3);
    window(&mut c, 7, 1000, 3, 3);
    let inputs = c.inputs();
    assert!(!inputs.probing);
    assert!(close(inputs.min_rtt_us, 1_000_000.0), "the queue's latency is not the no-load one: {inputs:?}");

    // A queue that never drains is not measured: the last measurement stays.
    let mut c = Controller::new(cfg, start, 7);
    for second in 1..=12 {
        window(&mut c, second, 5000, 20, 20);
    }
    let inputs = c.inputs();
    assert!(!inputs.probing, "it gave up");
    assert_eq!(inputs.min_rtt_us, 0.0, "{inputs:?}");
}

#[test]
fn a_limit_that_only_rises_for_a_minute_is_measured_again_early() {
    let cfg = probing(gradient2(600));
    let cfg = AdaptiveConfig { max: 10_000, ..cfg };
    let start = Timestamp::from_secs(1_700_000_000);
    let mut c = Controller::new(cfg, start, 7);
    let at = |c: &mut Controller, second, rtt_ms, n, peak| {
        let limit = close_window(c, start, second, rtt_ms, n, peak);
        (limit, c.inputs())
    };
    // The measurement at start: windows 1 to 3.
    at(&mut c, 1, 40, 100, 20);
    at(&mut c, 2, 40, 50, 3);
    let (_, inputs) = at(&mut c, 3, 40, 60, 3);
    assert!(!inputs.probing);
    let planned = inputs.next_probe_at.unwrap();
    // Then every window full and as fast as the measured latency: gradient2
    // says nothing (its gradient is 1) and the limit rises window after
    // window. After 60 of them, the next measurement is at the next window,
    // not at the slot planned minutes away.
    let mut second = 4;
    let mut early = None;
    while second < 4 + 200 {
        let limit = c.limit();
        let (_, inputs) = at(&mut c, second, 40, 100, limit);
        if inputs.probing {
            early = Some(second);
            break;
        }
        second += 1;
    }
    let early = early.expect("measured again early");
    assert!(early >= 4 + 60, "after 60 windows of a rising limit, not {early}");
    assert!(start.saturating_add(Duration::from_secs(early)) < planned, "before the planned slot");
}
