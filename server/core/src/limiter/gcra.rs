//! GCRA: the token bucket's shape (rate r, burst b) stored as one timestamp per
//! key, the theoretical arrival time (TAT).
//!
//! A cost k is admitted when `max(TAT, now) + k*T <= now + b*T`, with the emission
//! interval `T = 1/r` rounded up to a whole nanosecond: GCRA trades the token
//! bucket's exactness for 8 bytes of state, and rounding up means it never admits
//! more than the rate (it is exact whenever 1e9 / r is a whole number).

use super::rate::{PICO, Rate};
use super::{Decision, Limiter, Status, nanos};
use crate::time::Timestamp;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub rate: Rate,
    pub burst: u64,
    /// Nanoseconds per unit, rounded up.
    pub emission_interval: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gcra {
    tat: Timestamp,
}

impl Config {
    pub fn new(rate: Rate, burst: u64) -> Self {
        Config { rate, burst, emission_interval: rate.time_for(PICO) }
    }

    fn span(&self, units: u64) -> u64 {
        self.emission_interval.saturating_mul(units)
    }
}

impl Gcra {
    /// A state where `available` units (a fraction allowed) can be taken at `now`.
    pub(crate) fn with_available(cfg: &Config, now: Timestamp, available: f64) -> Self {
        let owed = (cfg.burst as f64 - available).max(0.0);
        Gcra { tat: now.add_nanos((owed * cfg.emission_interval as f64) as u64) }
    }
}

impl Limiter for Gcra {
    type Config = Config;

    fn new(_cfg: &Config, now: Timestamp) -> Self {
        Gcra { tat: now }
    }

    fn check(&self, cfg: &Config, now: Timestamp, cost: u64) -> Decision {
        let t = cfg.emission_interval;
        let base = self.tat.max(now);
        let new_tat = base.add_nanos(cfg.span(cost));
        let horizon = now.add_nanos(cfg.span(cfg.burst));
        let admitted = new_tat <= horizon;
        let (after, retry_after) = if admitted { (new_tat, 0) } else { (base, new_tat.saturating_since(horizon)) };
        Decision {
            admitted,
            status: Status {
                limit: cfg.burst,
                remaining: horizon.saturating_since(after) / t,
                reset_after: nanos(after.saturating_since(now)),
                retry_after: nanos(retry_after),
                wait: nanos(0),
                over_limit: false,
            },
        }
    }

    fn commit(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        self.tat = self.tat.max(now).add_nanos(cfg.span(cost));
    }

    fn refund(&mut self, cfg: &Config, _now: Timestamp, cost: u64) {
        self.tat = Timestamp::from_nanos(self.tat.as_nanos().saturating_sub(cfg.span(cost)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::testing::*;
    use proptest::prelude::*;

    fn cfg(per_second: f64, burst: u64) -> Config {
        Config::new(Rate::per_second(per_second).unwrap(), burst)
    }

    #[test]
    fn admits_the_burst_then_one_per_interval() {
        let c = cfg(10.0, 5);
        assert_eq!(c.emission_interval, 100_000_000);
        let mut g = Gcra::new(&c, T0);
        for i in 0..5 {
            let d = g.try_acquire(&c, T0, 1);
            assert!(d.admitted);
            assert_eq!(d.status.remaining, 4 - i);
            assert_eq!(d.status.reset_after, ms(100 * (i + 1)));
        }
        let d = g.try_acquire(&c, T0, 1);
        assert!(!d.admitted);
        assert_eq!(d.status.retry_after, ms(100));
        assert_eq!(d.status.reset_after, ms(500));
        assert!(!g.try_acquire(&c, at_ms(99), 1).admitted);
        assert!(g.try_acquire(&c, at_ms(100), 1).admitted);
        assert!(!g.try_acquire(&c, at_ms(100), 1).admitted);
    }

    #[test]
    fn matches_a_token_bucket_of_the_same_shape() {
        use crate::limiter::token_bucket::{self, TokenBucket};
        let g_cfg = cfg(4.0, 3);
        let t_cfg = token_bucket::Config::new(3, Rate::per_second(4.0).unwrap());
        let (mut g, mut tb) = (Gcra::new(&g_cfg, T0), TokenBucket::new(&t_cfg, T0));
        for (step, cost) in [(0, 2), (0, 2), (100, 1), (250, 1), (250, 3), (750, 3), (750, 1), (1000, 2)] {
            let now = at_ms(step);
            let (a, b) = (g.try_acquire(&g_cfg, now, cost), tb.try_acquire(&t_cfg, now, cost));
            assert_eq!(a.admitted, b.admitted, "at {step} ms cost {cost}");
            assert_eq!(a.status.remaining, b.status.remaining, "at {step} ms cost {cost}");
            assert_eq!(a.status.retry_after, b.status.retry_after, "at {step} ms cost {cost}");
        }
    }

    #[test]
    fn cost_equal_to_burst_needs_a_full_bucket() {
        let c = cfg(1.0, 4);
        let mut g = Gcra::new(&c, T0);
        assert!(g.try_acquire(&c, T0, 4).admitted);
        let d = g.try_acquire(&c, at_ms(3000), 4);
        assert!(!d.admitted);
        assert_eq!(d.status.remaining, 3);
        assert_eq!(d.status.retry_after, ms(1000));
        assert!(g.try_acquire(&c, at_ms(4000), 4).admitted);
    }

    #[test]
    fn the_interval_is_rounded_up_so_it_never_overshoots() {
        let c = cfg(3.0, 1);
        assert_eq!(c.emission_interval, 333_333_334);
        let mut g = Gcra::new(&c, T0);
        let admitted = (0..3000u64).filter(|i| g.try_acquire(&c, at_ms(*i), 1).admitted).count();
        // Over 3 s at 3/s with a burst of 1: at most 1 + 3 * 2.999 = 9.
        assert_eq!(admitted, 9);
    }

    #[test]
    fn refund_restores_the_previous_arrival_time() {
        let c = cfg(10.0, 2);
        let mut g = Gcra::new(&c, T0);
        assert!(g.try_acquire(&c, T0, 2).admitted);
        g.refund(&c, T0, 1);
        assert!(g.try_acquire(&c, T0, 1).admitted);
        assert!(!g.try_acquire(&c, T0, 1).admitted);
    }

    proptest! {
        #[test]
        fn never_admits_more_than_burst_plus_rate(
            burst in 1u64..50,
            per_second in 1u64..2000,
            ops in prop::collection::vec((0u64..50_000_000, 1u64..50), 1..200),
        ) {
            let c = cfg(per_second as f64, burst);
            let mut g = Gcra::new(&c, T0);
            let (mut t, mut admitted) = (0u64, 0u128);
            for (dt, cost) in ops {
                t += dt;
                let cost = cost.min(burst);
                let d = g.try_acquire(&c, at_ns(t), cost);
                if d.admitted {
                    admitted += cost as u128;
                } else {
                    prop_assert!(d.status.remaining < cost);
                }
                // burst + r * t, in units of 1e-9 to stay in integers.
                prop_assert!(admitted * 1_000_000_000 <= burst as u128 * 1_000_000_000 + per_second as u128 * t as u128);
            }
        }
    }
}
