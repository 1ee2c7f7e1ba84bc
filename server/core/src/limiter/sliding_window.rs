//! Sliding window counter: the approximation with two counters per key.
//!
//! Windows are aligned to the epoch. The estimate at `now` is the previous
//! window's count weighted by how much of it the sliding window still overlaps,
//! plus the current count: `prev * (W - e) / W + cur`, where `e` is the time into
//! the current window. Compared in integers scaled by W, so it is exact.

use super::{Decision, Limiter, Status, nanos};
use crate::time::Timestamp;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub limit: u64,
    /// Window length in nanoseconds; never zero.
    pub window: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    start: Timestamp,
    prev: u64,
    cur: u64,
}

/// The counters as seen at one instant.
struct View {
    start: Timestamp,
    prev: u64,
    cur: u64,
    /// Nanoseconds into the current window.
    elapsed: u64,
}

impl Config {
    pub fn new(limit: u64, window: u64) -> Self {
        Config { limit, window: window.max(1) }
    }
}

impl SlidingWindow {
    /// The counters of the window starting at `start` (aligned to the epoch).
    pub(crate) fn with_counts(cfg: &Config, start: Timestamp, prev: u64, cur: u64) -> Self {
        let n = start.as_nanos();
        SlidingWindow { start: Timestamp::from_nanos(n - n % cfg.window), prev, cur }
    }

    fn view(&self, cfg: &Config, now: Timestamp) -> View {
        let n = now.as_nanos();
        let start = Timestamp::from_nanos(n - n % cfg.window);
        let (start, prev, cur) = if self.start >= start {
            // Same window, or one a faster clock opened: keep what it counted.
            (self.start, self.prev, self.cur)
        } else if self.start.add_nanos(cfg.window) == start {
            (start, self.cur, 0)
        } else {
            (start, 0, 0)
        };
        View { start, prev, cur, elapsed: now.saturating_since(start) }
    }
}

impl View {
    /// The estimate times W.
    fn weighted(&self, w: u64, extra: u64) -> u128 {
        let overlap = w.saturating_sub(self.elapsed) as u128;
        self.prev as u128 * overlap + (self.cur as u128 + extra as u128) * w as u128
    }

    /// Time until `cost` fits under `limit`.
    fn retry_after(&self, limit: u64, w: u64, cost: u64) -> u64 {
        let (w128, e) = (w as u128, self.elapsed);
        // Within this window, the previous count's weight keeps shrinking.
        if let Some(room) = limit.checked_sub(self.cur.saturating_add(cost)) {
            if self.prev == 0 {
                return 0;
            }
            let keep = (room as u128 * w128 / self.prev as u128).min(w128) as u64;
            let at = w - keep;
            if at < w {
                return at.saturating_sub(e);
            }
        }
        // Otherwise in the next window, where this window's count is the previous.
        let keep = match self.cur {
            0 => w,
            // A cost above the limit never fits: the longest wait.
            cur => (limit.saturating_sub(cost) as u128 * w128 / cur as u128).min(w128) as u64,
        };
        (w - e.min(w)) + (w - keep)
    }

    /// Time until the estimate is back to zero.
    fn reset_after(&self, w: u64, cur: u64) -> u64 {
        let to_end = w.saturating_sub(self.elapsed);
        if cur > 0 {
            to_end + w
        } else if self.prev > 0 {
            to_end
        } else {
            0
        }
    }
}

impl Limiter for SlidingWindow {
    type Config = Config;

    fn new(cfg: &Config, now: Timestamp) -> Self {
        let n = now.as_nanos();
        SlidingWindow { start: Timestamp::from_nanos(n - n % cfg.window), prev: 0, cur: 0 }
    }

    fn check(&self, cfg: &Config, now: Timestamp, cost: u64) -> Decision {
        let (v, w) = (self.view(cfg, now), cfg.window);
        let cap = cfg.limit as u128 * w as u128;
        let admitted = v.weighted(w, cost) <= cap;
        let cur_after = if admitted { v.cur + cost } else { v.cur };
        let used = v.weighted(w, cur_after - v.cur);
        Decision {
            admitted,
            status: Status {
                limit: cfg.limit,
                remaining: (cap.saturating_sub(used) / w as u128) as u64,
                reset_after: nanos(v.reset_after(w, cur_after)),
                retry_after: nanos(if admitted { 0 } else { v.retry_after(cfg.limit, w, cost) }),
                wait: nanos(0),
                over_limit: false,
            },
        }
    }

    fn commit(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        let v = self.view(cfg, now);
        *self = SlidingWindow { start: v.start, prev: v.prev, cur: v.cur.saturating_add(cost) };
    }

    fn refund(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        let v = self.view(cfg, now);
        *self = SlidingWindow { start: v.start, prev: v.prev, cur: v.cur.saturating_sub(cost) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::testing::*;
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn weighs_the_previous_window_by_its_overlap() {
        let c = Config::new(10, SEC);
        let mut s = SlidingWindow::new(&c, T0);
        assert!(s.try_acquire(&c, at_ms(500), 10).admitted);
        assert!(!s.try_acquire(&c, at_ms(999), 1).admitted);
        // 250 ms into the next window: 10 * 0.75 = 7.5 used, 2 fit.
        let d = s.check(&c, at_ms(1250), 0);
        assert_eq!(d.status.remaining, 2);
        assert!(s.try_acquire(&c, at_ms(1250), 2).admitted);
        let d = s.try_acquire(&c, at_ms(1250), 1);
        assert!(!d.admitted);
        // 7.5 + 2 + 1 > 10 until the previous weight drops to 0.7: at 1300 ms.
        assert_eq!(d.status.retry_after, ms(50));
        assert!(s.try_acquire(&c, at_ms(1300), 1).admitted);
    }

    #[test]
    fn retry_rolls_into_the_next_window_when_this_one_is_full() {
        let c = Config::new(4, SEC);
        let mut s = SlidingWindow::new(&c, T0);
        assert!(s.try_acquire(&c, at_ms(100), 4).admitted);
        let d = s.try_acquire(&c, at_ms(600), 1);
        assert!(!d.admitted);
        // Next window: 4 * (1 - e) + 1 <= 4 once e >= 0.25: 400 + 250 ms from now.
        assert_eq!(d.status.retry_after, ms(650));
        assert!(!s.try_acquire(&c, at_ms(1249), 1).admitted);
        assert!(s.try_acquire(&c, at_ms(1250), 1).admitted);
    }

    #[test]
    fn reset_after_counts_until_both_windows_are_forgotten() {
        let c = Config::new(5, SEC);
        let mut s = SlidingWindow::new(&c, T0);
        assert_eq!(s.check(&c, at_ms(100), 0).status.reset_after, ms(0));
        let d = s.try_acquire(&c, at_ms(100), 1);
        assert_eq!(d.status.reset_after, ms(1900));
        assert_eq!(s.check(&c, at_ms(1100), 0).status.reset_after, ms(900));
        assert_eq!(s.check(&c, at_ms(2000), 0).status.reset_after, ms(0));
        assert_eq!(s.check(&c, at_ms(5000), 0).status.remaining, 5);
    }

    #[test]
    fn cost_equal_to_limit() {
        let c = Config::new(3, SEC);
        let mut s = SlidingWindow::new(&c, T0);
        assert!(s.try_acquire(&c, T0, 3).admitted);
        let d = s.try_acquire(&c, at_ms(10), 3);
        assert!(!d.admitted);
        assert_eq!(d.status.retry_after, ms(1990), "the next window must fully pass the first");
        s.refund(&c, at_ms(10), 3);
        assert!(s.try_acquire(&c, at_ms(10), 3).admitted);
    }

    proptest! {
        /// The estimate never exceeds the limit, and no fixed window ever holds more.
        #[test]
        fn never_admits_more_than_the_limit_per_window(
            limit in 1u64..50,
            window_ms in 1u64..2000,
            ops in prop::collection::vec((0u64..300_000_000, 1u64..50), 1..200),
        ) {
            let c = Config::new(limit, window_ms * 1_000_000);
            let mut s = SlidingWindow::new(&c, T0);
            let mut t = 0u64;
            let mut per_window = std::collections::HashMap::<u64, u64>::new();
            for (dt, cost) in ops {
                t += dt;
                let cost = cost.min(limit);
                let d = s.try_acquire(&c, at_ns(t), cost);
                if d.admitted {
                    let n = per_window.entry(at_ns(t).as_nanos() / c.window).or_default();
                    *n += cost;
                    prop_assert!(*n <= limit);
                } else {
                    prop_assert!(d.status.remaining < cost);
                    // Waiting retry_after really makes room.
                    let later = at_ns(t).saturating_add(d.status.retry_after);
                    prop_assert!(s.check(&c, later, cost).admitted);
                }
            }
        }
    }
}
