//! Sentinel's own unit tests of its warm-up controllers, step by step on a
//! fake clock (`WarmUpControllerTest`, `WarmUpRateLimiterControllerTest`),
//! and the ramp and the cooling the algorithm exists for.

use super::*;
use crate::limiter::testing::*;

fn police(rate: f64, period_s: u64, cold_factor: u32) -> Config {
    Config::new(Rate::per_second(rate).unwrap(), Duration::from_secs(period_s), cold_factor, Mode::Police).unwrap()
}

fn at_ms(t: i64) -> Timestamp {
    Timestamp::from_nanos(t as u64 * 1_000_000)
}

#[test]
fn the_lines_and_slope_are_sentinels() {
    let c = police(10.0, 10, 3);
    assert_eq!((c.warning, c.max), (50, 100));
    assert!((c.slope - 0.004).abs() < 1e-12);
    // Cold: 1 / (50 x 0.004 + 0.1) = 3.33..., warm: the rate.
    assert!((c.cold_rate() - 10.0 / 3.0).abs() < 1e-9, "{}", c.cold_rate());
    assert_eq!(c.rate_in_force(49), 10.0);
    // Degenerate configurations are refused rather than blocking everything.
    let tiny = Config::new(Rate::per_second(1.0).unwrap(), Duration::from_secs(1), 3, Mode::Police);
    assert!(matches!(tiny, Err(ConfigError::TooShort(_))), "{tiny:?}");
    let cold = Config::new(Rate::per_second(10.0).unwrap(), Duration::from_secs(10), 1, Mode::Police);
    assert_eq!(cold, Err(ConfigError::ColdFactor(1)));
}

/// `WarmUpControllerTest.testWarmUp`: count 10, 10 s, cold factor 3, the
/// node's pass QPS and previous-second QPS as the test mocks them.
#[test]
fn sentinels_warm_up_controller_test() {
    let c = police(10.0, 10, 3);
    let t0 = 1_700_000_000_123;
    let mut w = WarmUp::new(&c, at_ms(t0));
    let ask = |w: &mut WarmUp, t: i64, pass_qps: u64, prev_qps: u64| {
        w.seed(t, pass_qps, prev_qps);
        w.try_acquire(&c, at_ms(t), 1).admitted
    };
    assert!(!ask(&mut w, t0, 8, 1), "cold: 8 + 1 is over 3.378");
    assert_eq!(w.stored(), 99, "filled to 100, less the previous second's 1");
    assert!(ask(&mut w, t0, 1, 1), "1 + 1 is within 3.378; no sync within the second");
    // A hundred steps of 100 ms with 10 the second before: each second takes
    // 10 from the store, down to the warning line, where it refills by 10.
    let mut stores = Vec::new();
    for i in 1..=100 {
        ask(&mut w, t0 + i * 100, 1, 10);
        stores.push(w.stored());
    }
    let count = |s: i64| stores.iter().filter(|&&x| x == s).count();
    assert_eq!([count(89), count(79), count(69), count(59), count(49)], [10, 10, 10, 10, 52], "{stores:?}");
    assert_eq!(stores.len() - [89, 79, 69, 59, 49].iter().map(|&s| count(s)).sum::<usize>(), 8, "the first 8 at 99");
    let t = t0 + 10_000;
    assert!(ask(&mut w, t, 8, 10), "warm: 8 + 1 is within 10");
    assert!(!ask(&mut w, t, 10, 10), "10 + 1 is over 10");
}

/// `WarmUpRateLimiterControllerTest`: count 10, 10 s, cold factor 3, pass
/// and previous QPS 100: the store empties, so callers are paced 100 ms apart.
#[test]
fn sentinels_warm_up_rate_limiter_tests() {
    let shape = |max_wait_ms| {
        Config::new(Rate::per_second(10.0).unwrap(), Duration::from_secs(10), 3, Mode::Shape { max_wait_ms }).unwrap()
    };
    let t0 = 1_700_000_000_000;
    // testPace: each caller waits its turn, 100 ms after the one before.
    let c = shape(1000);
    let mut w = WarmUp::new(&c, at_ms(t0));
    w.seed(t0, 100, 100);
    let first = w.try_acquire(&c, at_ms(t0), 1);
    assert!(first.admitted && first.status.wait.is_zero());
    assert_eq!(w.stored(), 0, "filled to 100, less the previous second's 100");
    let mut t = t0;
    for _ in 0..10 {
        let d = w.try_acquire(&c, at_ms(t), 1);
        assert!(d.admitted);
        assert_eq!(d.status.wait, Duration::from_millis(100));
        t += 100; // the caller sleeps its wait, as Sentinel's does
    }
    // testPaceCanNotPass: a queue of 10 ms refuses a second caller at once.
    let c = shape(10);
    let mut w = WarmUp::new(&c, at_ms(t0));
    w.seed(t0, 100, 100);
    assert!(w.try_acquire(&c, at_ms(t0), 1).admitted);
    let second = w.try_acquire(&c, at_ms(t0), 1);
    assert!(!second.admitted);
    assert_eq!(second.status.retry_after, Duration::from_millis(90));
    // Ten at the same instant with a queue of 1 s: waits 100 to 1000, all admitted; the next not.
    let c = shape(1000);
    let mut w = WarmUp::new(&c, at_ms(t0));
    w.seed(t0, 100, 100);
    let waits: Vec<u64> = (0..11).map(|_| w.try_acquire(&c, at_ms(t0), 1).status.wait.as_millis() as u64).collect();
    assert_eq!(waits, [0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]);
    assert!(!w.try_acquire(&c, at_ms(t0), 1).admitted);
}

/// Admitted per second under a demand far above the rate.
fn per_second(c: &Config, w: &mut WarmUp, from: i64, seconds: i64) -> Vec<u64> {
    (0..seconds)
        .map(|s| {
            let mut admitted = 0;
            for i in 0..100 {
                let t = from + s * 1000 + i * 10;
                admitted += w.try_acquire(c, at_ms(t), 1).admitted as u64;
            }
            admitted
        })
        .collect()
}

#[test]
fn a_cold_key_ramps_to_its_rate_over_the_period_and_cools_when_idle() {
    let c = police(100.0, 10, 3);
    let t0 = 1_700_000_000_000;
    let mut w = WarmUp::new(&c, at_ms(t0));
    let ramp = per_second(&c, &mut w, t0, 20);
    assert!(ramp[0] <= 34 && ramp[0] >= 30, "cold: about 100 / 3 a second: {ramp:?}");
    assert!(ramp.windows(2).all(|p| p[1] + 2 >= p[0]), "never falls back while busy: {ramp:?}");
    assert!(ramp[12..].iter().all(|&n| n == 100), "warm within the period and a little: {ramp:?}");
    // Idle long enough to refill the store: cold again, and evictable.
    let idle = t0 + 20_000 + 60_000;
    assert!(w.check(&c, at_ms(idle), 0).status.reset_after.is_zero(), "back to its initial state");
    let again = per_second(&c, &mut w, idle, 1);
    assert!(again[0] <= 34, "cold again: {again:?}");
    // A fresh key answers the same as one that cooled.
    let mut fresh = WarmUp::new(&c, at_ms(idle));
    assert_eq!(per_second(&c, &mut fresh, idle, 1), again);
}

#[test]
fn a_refund_gives_back_exactly_the_admission() {
    for mode in [Mode::Police, Mode::Shape { max_wait_ms: 500 }] {
        let c = Config::new(Rate::per_second(10.0).unwrap(), Duration::from_secs(10), 3, mode).unwrap();
        let mut w = WarmUp::new(&c, T0);
        assert!(w.try_acquire(&c, T0, 1).admitted);
        let before = w.clone();
        let now = T0.add_nanos(1_000_000);
        assert!(w.try_acquire(&c, now, 1).admitted);
        w.refund(&c, now, 1);
        assert_eq!(w.check(&c, now, 1), before.check(&c, now, 1), "{mode:?}");
    }
}
