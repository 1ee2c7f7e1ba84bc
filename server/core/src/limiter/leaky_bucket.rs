//! Leaky bucket: capacity C, leaking R per second.
//!
//! The state is the exact time at which the bucket will have drained (`drain`,
//! kept to a fraction of a nanosecond), so both modes share it:
//! - `police` admits cost k when the water level plus k fits in C, and the caller
//!   proceeds at once;
//! - `shape` admits the same way but the caller waits for its turn, the time until
//!   the queue ahead of it has leaked, so shaped callers are evenly spaced 1/R
//!   apart; it also rejects when that wait would exceed `max_wait`.

use super::rate::{self, Rate};
use super::{Decision, Limiter, Status, nanos};
use crate::time::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Police,
    /// Shape traffic; `max_wait` in nanoseconds, `None` for no bound but capacity.
    Shape {
        max_wait: Option<u64>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub capacity: u64,
    pub leak: Rate,
    pub mode: Mode,
}

/// The drain time is `drain_ns + frac / m` ns, where m is the rate in picounits
/// per nanosecond; in those 1/m ns units one unit of water is exactly 1e12.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakyBucket {
    drain_ns: u64,
    frac: u64,
}

impl Config {
    pub fn new(capacity: u64, leak: Rate, mode: Mode) -> Self {
        Config { capacity, leak, mode }
    }

    fn m(&self) -> u128 {
        self.leak.pico_per_nano() as u128
    }
}

impl LeakyBucket {
    /// The drain time in 1/m ns units.
    fn drain(&self, cfg: &Config) -> u128 {
        self.drain_ns as u128 * cfg.m() + (self.frac as u128).min(cfg.m() - 1)
    }

    fn set_drain(&mut self, cfg: &Config, scaled: u128) {
        self.drain_ns = u64::try_from(scaled / cfg.m()).unwrap_or(u64::MAX);
        self.frac = (scaled % cfg.m()) as u64;
    }
}

impl LeakyBucket {
    /// A bucket with room for `room` units (a fraction allowed) at `now`.
    pub(crate) fn with_room(cfg: &Config, now: Timestamp, room: f64) -> Self {
        let level = (cfg.capacity as f64 - room).max(0.0);
        let mut b = LeakyBucket { drain_ns: 0, frac: 0 };
        b.set_drain(cfg, now.as_nanos() as u128 * cfg.m() + (level * rate::PICO as f64) as u128);
        b
    }
}

impl Limiter for LeakyBucket {
    type Config = Config;

    fn new(_cfg: &Config, now: Timestamp) -> Self {
        LeakyBucket { drain_ns: now.as_nanos(), frac: 0 }
    }

    fn check(&self, cfg: &Config, now: Timestamp, cost: u64) -> Decision {
        let m = cfg.m();
        let now_scaled = now.as_nanos() as u128 * m;
        // Water in the bucket, in picounits; also the queue ahead of this caller.
        let level = self.drain(cfg).saturating_sub(now_scaled);
        let full = rate::pico(cfg.capacity);
        let over = (level + rate::pico(cost)).saturating_sub(full);
        let wait = u64::try_from(level.div_ceil(m)).unwrap_or(u64::MAX);
        let (wait, max_wait) = match cfg.mode {
            Mode::Police => (0, None),
            Mode::Shape { max_wait } => (wait, max_wait),
        };
        let late = max_wait.map_or(0, |max| wait.saturating_sub(max));
        let admitted = over == 0 && late == 0;
        let after = if admitted { level + rate::pico(cost) } else { level };
        let retry_after = if admitted { 0 } else { cfg.leak.time_for(over).max(late) };
        Decision {
            admitted,
            status: Status {
                limit: cfg.capacity,
                remaining: rate::floor_units(full.saturating_sub(after)),
                reset_after: nanos(cfg.leak.time_for(after)),
                retry_after: nanos(retry_after),
                wait: nanos(if admitted { wait } else { 0 }),
                over_limit: false,
            },
        }
    }

    fn commit(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        let start = self.drain(cfg).max(now.as_nanos() as u128 * cfg.m());
        self.set_drain(cfg, start + rate::pico(cost));
    }

    fn refund(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        let floor = now.as_nanos() as u128 * cfg.m();
        let drain = self.drain(cfg).saturating_sub(rate::pico(cost)).max(floor);
        self.set_drain(cfg, drain);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::testing::*;
    use proptest::prelude::*;

    fn cfg(capacity: u64, per_second: f64, mode: Mode) -> Config {
        Config::new(capacity, Rate::per_second(per_second).unwrap(), mode)
    }

    #[test]
    fn police_rejects_when_the_queue_would_overflow() {
        let c = cfg(3, 2.0, Mode::Police);
        let mut b = LeakyBucket::new(&c, T0);
        for i in 0..3 {
            let d = b.try_acquire(&c, T0, 1);
            assert!(d.admitted);
            assert_eq!(d.status.wait, ms(0));
            assert_eq!(d.status.remaining, 2 - i);
        }
        let d = b.try_acquire(&c, T0, 1);
        assert!(!d.admitted);
        assert_eq!(d.status.retry_after, ms(500));
        assert_eq!(d.status.reset_after, ms(1500), "time to drain 3 at 2/s");
        assert!(!b.try_acquire(&c, at_ms(499), 1).admitted);
        assert!(b.try_acquire(&c, at_ms(500), 1).admitted);
    }

    #[test]
    fn shaped_callers_are_evenly_spaced() {
        let c = cfg(10, 4.0, Mode::Shape { max_wait: None });
        let mut b = LeakyBucket::new(&c, T0);
        let waits: Vec<_> = (0..5).map(|_| b.try_acquire(&c, T0, 1).status.wait).collect();
        assert_eq!(waits, [ms(0), ms(250), ms(500), ms(750), ms(1000)]);
        // 100 ms later, the next turn is 1250 ms after T0.
        assert_eq!(b.try_acquire(&c, at_ms(100), 1).status.wait, ms(1150));
    }

    #[test]
    fn shaping_with_a_third_interval_keeps_exact_spacing() {
        let c = cfg(100, 3.0, Mode::Shape { max_wait: None });
        let mut b = LeakyBucket::new(&c, T0);
        let waits: Vec<_> = (0..4).map(|_| b.try_acquire(&c, T0, 1).status.wait.as_nanos()).collect();
        // Turns at 0, 1/3, 2/3 and exactly 1 s: no drift from rounding.
        assert_eq!(waits, [0, 333_333_334, 666_666_667, 1_000_000_000]);
    }

    #[test]
    fn shape_rejects_when_the_wait_would_exceed_max_wait() {
        let c = cfg(100, 10.0, Mode::Shape { max_wait: Some(300_000_000) });
        let mut b = LeakyBucket::new(&c, T0);
        for i in 0..4 {
            assert_eq!(b.try_acquire(&c, T0, 1).status.wait, ms(100 * i));
        }
        let d = b.try_acquire(&c, T0, 1);
        assert!(!d.admitted, "its wait would be 400 ms");
        assert_eq!(d.status.retry_after, ms(100));
        assert_eq!(d.status.wait, ms(0));
        let d = b.try_acquire(&c, at_ms(100), 1);
        assert!(d.admitted);
        assert_eq!(d.status.wait, ms(300));
    }

    #[test]
    fn cost_equal_to_capacity_needs_an_empty_bucket() {
        let c = cfg(5, 5.0, Mode::Police);
        let mut b = LeakyBucket::new(&c, T0);
        assert!(b.try_acquire(&c, T0, 5).admitted);
        let d = b.try_acquire(&c, at_ms(600), 5);
        assert!(!d.admitted);
        assert_eq!(d.status.retry_after, ms(400));
        assert!(b.try_acquire(&c, at_ms(1000), 5).admitted);
    }

    #[test]
    fn refund_lowers_the_level() {
        let c = cfg(2, 1.0, Mode::Police);
        let mut b = LeakyBucket::new(&c, T0);
        assert!(b.try_acquire(&c, T0, 2).admitted);
        b.refund(&c, T0, 2);
        assert_eq!(b.check(&c, T0, 0).status.remaining, 2);
        assert_eq!(b.check(&c, T0, 0).status.reset_after, ms(0));
    }

    proptest! {
        #[test]
        fn never_admits_more_than_capacity_plus_leak(
            capacity in 1u64..50,
            rate_milli in 1u64..100_000,
            shape in any::<bool>(),
            ops in prop::collection::vec((0u64..200_000_000, 1u64..50), 1..200),
        ) {
            let mode = if shape { Mode::Shape { max_wait: Some(1_000_000_000) } } else { Mode::Police };
            let c = Config::new(capacity, Rate::per_second(rate_milli as f64 / 1000.0).unwrap(), mode);
            let mut b = LeakyBucket::new(&c, T0);
            let (mut t, mut admitted, mut last_start) = (0u64, 0u128, 0u64);
            for (dt, cost) in ops {
                t += dt;
                let cost = cost.min(capacity);
                let d = b.try_acquire(&c, at_ns(t), cost);
                if d.admitted {
                    admitted += rate::pico(cost);
                    // Shaped callers start in arrival order.
                    let start = t + d.status.wait.as_nanos() as u64;
                    prop_assert!(start >= last_start);
                    last_start = start;
                }
                prop_assert!(admitted <= rate::pico(capacity) + c.leak.gain(t));
            }
        }
    }
}
