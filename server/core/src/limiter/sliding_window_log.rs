//! Sliding window log: exact. At most L admitted in any window of length W,
//! keeping one timestamp per admitted request (merged when they coincide).
//!
//! An entry admitted at `t` counts while `now < t + W`. L is capped at 10,000 by
//! the rules, which bounds the log's memory per key.

use std::collections::VecDeque;

use super::{Decision, Limiter, Status, nanos};
use crate::time::Timestamp;

/// The largest limit the log accepts.
pub const MAX_LIMIT: u64 = 10_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub limit: u64,
    /// Window length in nanoseconds; never zero.
    pub window: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindowLog {
    /// (admitted at, cost), oldest first.
    entries: VecDeque<(Timestamp, u64)>,
    /// The sum of every entry's cost, expired ones included until pruned.
    total: u64,
}

impl Config {
    pub fn new(limit: u64, window: u64) -> Self {
        Config { limit, window: window.max(1) }
    }
}

impl SlidingWindowLog {
    fn live(cfg: &Config, at: Timestamp, now: Timestamp) -> bool {
        at.add_nanos(cfg.window) > now
    }

    /// Cost still inside the window at `now`.
    fn used(&self, cfg: &Config, now: Timestamp) -> u64 {
        let expired: u64 = self.entries.iter().take_while(|(at, _)| !Self::live(cfg, *at, now)).map(|(_, n)| n).sum();
        self.total - expired
    }

    /// Time until `needed` units have left the window.
    fn time_to_free(&self, cfg: &Config, now: Timestamp, needed: u64) -> u64 {
        let mut freed = 0;
        for (at, n) in self.entries.iter().filter(|(at, _)| Self::live(cfg, *at, now)) {
            freed += n;
            if freed >= needed {
                return at.add_nanos(cfg.window).saturating_since(now);
            }
        }
        cfg.window
    }

    fn prune(&mut self, cfg: &Config, now: Timestamp) {
        while let Some(&(at, n)) = self.entries.front() {
            if Self::live(cfg, at, now) {
                break;
            }
            self.entries.pop_front();
            self.total -= n;
        }
    }
}

impl Limiter for SlidingWindowLog {
    type Config = Config;

    fn new(_cfg: &Config, _now: Timestamp) -> Self {
        SlidingWindowLog::default()
    }

    fn check(&self, cfg: &Config, now: Timestamp, cost: u64) -> Decision {
        let used = self.used(cfg, now);
        let admitted = used.saturating_add(cost) <= cfg.limit;
        let after = if admitted { used + cost } else { used };
        // The newest entry decides when the log is empty again.
        let last = self.entries.back().map(|&(at, _)| at);
        let newest = if admitted && cost > 0 {
            Some(last.map_or(now, |at| at.max(now)))
        } else if used > 0 {
            last
        } else {
            None
        };
        let reset_after = newest.map_or(0, |at| at.add_nanos(cfg.window).saturating_since(now));
        let retry_after = if admitted { 0 } else { self.time_to_free(cfg, now, used.saturating_add(cost) - cfg.limit) };
        Decision {
            admitted,
            status: Status {
                limit: cfg.limit,
                remaining: cfg.limit.saturating_sub(after),
                reset_after: nanos(reset_after),
                retry_after: nanos(retry_after),
                wait: nanos(0),
                over_limit: false,
            },
        }
    }

    fn commit(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        self.prune(cfg, now);
        if cost == 0 {
            return;
        }
        self.total = self.total.saturating_add(cost);
        // A later entry (another replica's clock) keeps the log sorted: merge into it.
        match self.entries.back_mut() {
            Some((at, n)) if *at >= now => *n = n.saturating_add(cost),
            _ => self.entries.push_back((now, cost)),
        }
    }

    fn refund(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        self.give_back(cfg, now, now, cost);
    }

    /// A commit at `taken_at` is in the entry of that instant: only it gives
    /// back, never an older or a newer caller's entry. (Callers admitted at
    /// the same instant share it; their units are alike.) A commit merged
    /// into a later entry (a clock that went back) gives nothing back.
    fn give_back(&mut self, cfg: &Config, now: Timestamp, taken_at: Timestamp, cost: u64) {
        self.prune(cfg, now);
        let Some(i) = self.entries.iter().rposition(|(at, _)| *at == taken_at) else { return };
        let n = &mut self.entries[i].1;
        let back = cost.min(*n);
        *n -= back;
        self.total -= back;
        if *n == 0 {
            self.entries.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::testing::*;
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn exact_over_any_window() {
        let c = Config::new(3, SEC);
        let mut l = SlidingWindowLog::new(&c, T0);
        assert!(l.try_acquire(&c, at_ms(0), 1).admitted);
        assert!(l.try_acquire(&c, at_ms(400), 1).admitted);
        let d = l.try_acquire(&c, at_ms(900), 1);
        assert!(d.admitted);
        assert_eq!(d.status.remaining, 0);
        assert_eq!(d.status.reset_after, ms(1000), "the newest entry leaves 1 s after it came");
        let d = l.try_acquire(&c, at_ms(999), 1);
        assert!(!d.admitted);
        assert_eq!(d.status.retry_after, ms(1), "the oldest entry leaves at 1000 ms");
        // The entry from 0 ms leaves exactly at 1000 ms: the window is (now - W, now].
        assert!(l.try_acquire(&c, at_ms(1000), 1).admitted);
        assert!(!l.try_acquire(&c, at_ms(1399), 1).admitted);
        assert!(l.try_acquire(&c, at_ms(1400), 1).admitted);
    }

    #[test]
    fn retry_waits_for_enough_entries_to_leave() {
        let c = Config::new(4, SEC);
        let mut l = SlidingWindowLog::new(&c, T0);
        assert!(l.try_acquire(&c, at_ms(0), 1).admitted);
        assert!(l.try_acquire(&c, at_ms(100), 1).admitted);
        assert!(l.try_acquire(&c, at_ms(200), 2).admitted);
        let d = l.try_acquire(&c, at_ms(500), 2);
        assert!(!d.admitted);
        assert_eq!(d.status.retry_after, ms(600), "two units must leave: the 0 and 100 ms ones");
        assert!(l.try_acquire(&c, at_ms(1100), 2).admitted);
    }

    #[test]
    fn cost_equal_to_limit_and_refund() {
        let c = Config::new(10, SEC);
        let mut l = SlidingWindowLog::new(&c, T0);
        assert!(l.try_acquire(&c, T0, 10).admitted);
        assert!(!l.try_acquire(&c, at_ms(999), 1).admitted);
        l.give_back(&c, at_ms(999), T0, 4);
        assert_eq!(l.check(&c, at_ms(999), 0).status.remaining, 4);
        assert!(l.try_acquire(&c, at_ms(1000), 10).admitted);
        assert!(l.is_empty_after(&c, at_ms(2000)));
    }

    #[test]
    fn giving_back_a_settled_estimate_takes_only_that_callers_entries() {
        let c = Config::new(10, SEC);
        let mut l = SlidingWindowLog::new(&c, T0);
        // An estimate of 5 at 0 ms, then five other calls at 100 ms.
        assert!(l.try_acquire(&c, at_ms(0), 5).admitted);
        assert!(l.try_acquire(&c, at_ms(100), 5).admitted);
        // The estimate is settled at 0: its 5 come back, the others stay.
        l.give_back(&c, at_ms(200), at_ms(0), 5);
        assert_eq!(l.check(&c, at_ms(200), 0).status.remaining, 5);
        assert!(l.try_acquire(&c, at_ms(200), 5).admitted);
        assert!(!l.try_acquire(&c, at_ms(300), 1).admitted, "10 in the window: the others' 5 were not given back");
        // Before the fix, the newest entries (the 100 ms callers') went
        // back: the window then held 5 + 5 + 5 admitted within 1 s.
        // Given back twice, or after its entry left the window: nothing.
        l.give_back(&c, at_ms(300), at_ms(0), 5);
        assert_eq!(l.check(&c, at_ms(300), 0).status.remaining, 0);
        assert!(l.try_acquire(&c, at_ms(1150), 5).admitted, "the 100 ms callers' 5 left at 1100 ms");
        l.give_back(&c, at_ms(1150), at_ms(100), 5);
        assert_eq!(l.check(&c, at_ms(1150), 0).status.remaining, 0, "the 100 ms entry is gone: nothing comes back");
    }

    impl SlidingWindowLog {
        fn is_empty_after(&self, cfg: &Config, now: Timestamp) -> bool {
            self.check(cfg, now, 0).status.reset_after.is_zero()
        }
    }

    proptest! {
        #[test]
        fn never_admits_more_than_the_limit_in_any_sliding_window(
            limit in 1u64..30,
            window_ms in 1u64..1000,
            ops in prop::collection::vec((0u64..100_000_000, 1u64..30), 1..200),
        ) {
            let c = Config::new(limit, window_ms * 1_000_000);
            let mut l = SlidingWindowLog::new(&c, T0);
            let mut t = 0u64;
            let mut log: Vec<(u64, u64)> = Vec::new();
            for (dt, cost) in ops {
                t += dt;
                let cost = cost.min(limit);
                if l.try_acquire(&c, at_ns(t), cost).admitted {
                    log.push((t, cost));
                    let in_window: u64 = log.iter().filter(|(at, _)| at + c.window > t).map(|e| e.1).sum();
                    prop_assert!(in_window <= limit);
                } else {
                    // Exact: a denial means it really would not fit.
                    let in_window: u64 = log.iter().filter(|(at, _)| at + c.window > t).map(|e| e.1).sum();
                    prop_assert!(in_window + cost > limit);
                }
            }
        }
    }
}
