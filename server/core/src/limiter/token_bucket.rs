//! Token bucket: capacity C, refilled at R per second; starts full.
//!
//! Admits cost k when it holds at least k tokens and takes them. Tokens are kept
//! exactly (whole tokens plus picotokens), so fractional refills add up.
//!
//! Consumption forced beyond what it holds (a settled cost larger than its
//! estimate, a `Charge`) is a debt: the bucket stays empty, and its refill
//! starts only once the debt is refilled (`updated` lies in the future by the
//! debt's refill time), so later callers wait it out.

use super::rate::{self, Amount, Rate};
use super::{Decision, Limiter, Status, nanos};
use crate::time::Timestamp;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub capacity: u64,
    pub refill: Rate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    tokens: Amount,
    updated: Timestamp,
}

impl Config {
    pub fn new(capacity: u64, refill: Rate) -> Self {
        Config { capacity, refill }
    }
}

impl TokenBucket {
    /// A bucket holding `tokens` (a fraction allowed) at `now`; negative
    /// tokens are a debt: empty until they are refilled.
    pub fn with_tokens(cfg: &Config, now: Timestamp, tokens: f64) -> Self {
        if tokens < 0.0 {
            let owed = (-tokens * rate::PICO as f64) as u128;
            return TokenBucket { tokens: Amount::from_pico(0), updated: now.add_nanos(cfg.refill.time_for(owed)) };
        }
        let pico = (tokens.min(cfg.capacity as f64) * rate::PICO as f64) as u128;
        TokenBucket { tokens: Amount::from_pico(pico.min(rate::pico(cfg.capacity))), updated: now }
    }

    /// Tokens held at `now`, in picotokens, never above capacity. A `now` earlier
    /// than the last update (another replica's clock) refills nothing.
    fn tokens_at(&self, cfg: &Config, now: Timestamp) -> u128 {
        let gained = cfg.refill.gain(now.saturating_since(self.updated));
        (self.tokens.to_pico() + gained).min(rate::pico(cfg.capacity))
    }

    fn set(&mut self, pico: u128, now: Timestamp) {
        self.tokens = Amount::from_pico(pico);
        self.updated = self.updated.max(now);
    }
}

impl Limiter for TokenBucket {
    type Config = Config;

    fn new(cfg: &Config, now: Timestamp) -> Self {
        TokenBucket { tokens: Amount::units(cfg.capacity), updated: now }
    }

    fn check(&self, cfg: &Config, now: Timestamp, cost: u64) -> Decision {
        // Time still owed to a debt: nothing refills before it is over.
        let debt = self.updated.saturating_since(now);
        let have = self.tokens_at(cfg, now);
        let need = rate::pico(cost);
        let full = rate::pico(cfg.capacity);
        let admitted = have >= need;
        let left = if admitted { have - need } else { have };
        let retry_after = if admitted { 0 } else { debt.saturating_add(cfg.refill.time_for(need - have)) };
        Decision {
            admitted,
            status: Status {
                limit: cfg.capacity,
                remaining: rate::floor_units(left),
                reset_after: nanos(debt.saturating_add(cfg.refill.time_for(full - left))),
                retry_after: nanos(retry_after),
                wait: nanos(0),
                over_limit: false,
            },
        }
    }

    fn commit(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        let have = self.tokens_at(cfg, now);
        let need = rate::pico(cost);
        if have >= need {
            self.set(have - need, now);
        } else {
            // A debt: empty, and the refill starts once the shortfall is refilled.
            let owed = cfg.refill.time_for(need - have);
            self.tokens = Amount::from_pico(0);
            self.updated = self.updated.max(now).add_nanos(owed);
        }
    }

    fn refund(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        let mut give = rate::pico(cost);
        let debt = self.updated.saturating_since(now);
        if debt > 0 {
            // Pay the debt back first.
            let owed = cfg.refill.gain(debt);
            if give <= owed {
                self.updated = Timestamp::from_nanos(self.updated.as_nanos() - cfg.refill.time_for(give).min(debt));
                return;
            }
            give -= owed;
            self.updated = now;
        }
        let have = self.tokens_at(cfg, now);
        self.set((have + give).min(rate::pico(cfg.capacity)), now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::testing::*;
    use proptest::prelude::*;

    fn cfg(capacity: u64, per_second: f64) -> Config {
        Config::new(capacity, Rate::per_second(per_second).unwrap())
    }

    #[test]
    fn starts_full_and_admits_exactly_capacity() {
        let c = cfg(10, 5.0);
        let mut b = TokenBucket::new(&c, T0);
        for i in 0..10 {
            let d = b.try_acquire(&c, T0, 1);
            assert!(d.admitted, "call {i}");
            assert_eq!(d.status.remaining, 9 - i);
            assert_eq!(d.status.retry_after, ms(0));
        }
        let d = b.try_acquire(&c, T0, 1);
        assert!(!d.admitted);
        assert_eq!(d.status.remaining, 0);
        assert_eq!(d.status.retry_after, ms(200), "(k - tokens) / R = 1 / 5");
        assert_eq!(d.status.reset_after, ms(2000), "(C - tokens) / R = 10 / 5");
    }

    #[test]
    fn fractional_refills_are_never_lost() {
        let c = cfg(1, 1.0);
        let mut b = TokenBucket::new(&c, T0);
        assert!(b.try_acquire(&c, T0, 1).admitted);
        // 0.4 + 0.4 = 0.8 token: still short by exactly 0.2.
        assert!(!b.try_acquire(&c, at_ms(400), 1).admitted);
        let d = b.try_acquire(&c, at_ms(800), 1);
        assert!(!d.admitted);
        assert_eq!(d.status.retry_after, ms(200));
        assert!(b.try_acquire(&c, at_ms(1000), 1).admitted);
        // A third of a token per call at 1/3 s steps adds up to whole tokens.
        let c = cfg(3, 1.0);
        let mut b = TokenBucket::new(&c, T0);
        assert!(b.try_acquire(&c, T0, 3).admitted);
        let mut t = 0;
        for _ in 0..3 {
            t += 333_333_333;
            b.commit(&c, at_ns(t), 0);
        }
        assert!(!b.check(&c, at_ns(t), 1).admitted, "999_999_999 ns is short of one token");
        assert!(b.check(&c, at_ns(t + 1), 1).admitted);
    }

    #[test]
    fn cost_equal_to_capacity_needs_a_full_bucket() {
        let c = cfg(100, 10.0);
        let mut b = TokenBucket::new(&c, T0);
        assert!(b.try_acquire(&c, T0, 100).admitted);
        let d = b.try_acquire(&c, at_ms(5000), 100);
        assert!(!d.admitted);
        assert_eq!(d.status.remaining, 50);
        assert_eq!(d.status.retry_after, ms(5000));
        assert!(b.try_acquire(&c, at_ms(10_000), 100).admitted);
    }

    #[test]
    fn never_holds_more_than_capacity() {
        let c = cfg(5, 100.0);
        let mut b = TokenBucket::new(&c, T0);
        let d = b.check(&c, at_ms(3_600_000), 0);
        assert_eq!(d.status.remaining, 5);
        assert_eq!(d.status.reset_after, ms(0));
        assert!(b.try_acquire(&c, at_ms(3_600_000), 5).admitted);
        assert!(!b.try_acquire(&c, at_ms(3_600_000), 1).admitted);
    }

    #[test]
    fn forced_consumption_is_a_debt_that_later_callers_wait_out() {
        let c = cfg(10, 1.0);
        let mut b = TokenBucket::new(&c, T0);
        b.commit(&c, T0, 25);
        let d = b.check(&c, T0, 1);
        assert!(!d.admitted);
        assert_eq!(d.status.remaining, 0);
        assert_eq!(d.status.retry_after, ms(16_000), "15 tokens owed, then 1 to refill, at 1/s");
        assert_eq!(d.status.reset_after, ms(25_000), "full again after 15 + 10 s");
        assert!(!b.try_acquire(&c, at_ms(15_999), 1).admitted);
        assert!(b.try_acquire(&c, at_ms(16_000), 1).admitted, "the debt is paid, one token refilled");
        // A refund pays a debt back before it adds tokens.
        let mut b = TokenBucket::new(&c, T0);
        b.commit(&c, T0, 15);
        b.refund(&c, T0, 3);
        assert_eq!(b.check(&c, T0, 1).status.retry_after, ms(3_000), "2 owed, 1 to refill");
        b.refund(&c, T0, 4);
        assert_eq!(b.check(&c, T0, 0).status.remaining, 2, "debt paid, 2 tokens left");
    }

    #[test]
    fn refund_gives_back_what_was_taken() {
        let c = cfg(3, 1.0);
        let mut b = TokenBucket::new(&c, T0);
        assert!(b.try_acquire(&c, T0, 2).admitted);
        b.refund(&c, T0, 2);
        assert_eq!(b.check(&c, T0, 0).status.remaining, 3);
        b.refund(&c, T0, 2);
        assert_eq!(b.check(&c, T0, 0).status.remaining, 3, "never above capacity");
    }

    #[test]
    fn a_clock_behind_the_bucket_refills_nothing() {
        let c = cfg(2, 1.0);
        let mut b = TokenBucket::new(&c, at_ms(10_000));
        assert!(b.try_acquire(&c, at_ms(10_000), 2).admitted);
        assert!(!b.try_acquire(&c, at_ms(5_000), 1).admitted);
        assert!(b.try_acquire(&c, at_ms(11_000), 1).admitted);
    }

    proptest! {
        /// Whatever the interleaving, admitted work over [T0, t] never exceeds
        /// C + R * (t - T0), and a denial always means too few tokens.
        #[test]
        fn never_admits_more_than_capacity_plus_refill(
            capacity in 1u64..50,
            rate_milli in 1u64..100_000,
            ops in prop::collection::vec((0u64..200_000_000, 1u64..50), 1..200),
        ) {
            let c = Config::new(capacity, Rate::per_second(rate_milli as f64 / 1000.0).unwrap());
            let mut b = TokenBucket::new(&c, T0);
            let (mut t, mut admitted) = (0u64, 0u128);
            for (dt, cost) in ops {
                t += dt;
                let cost = cost.min(capacity);
                let d = b.try_acquire(&c, at_ns(t), cost);
                if d.admitted {
                    admitted += rate::pico(cost);
                } else {
                    prop_assert!(d.status.remaining < cost);
                    prop_assert!(!d.status.retry_after.is_zero());
                }
                prop_assert!(admitted <= rate::pico(capacity) + c.refill.gain(t));
            }
        }
    }
}
