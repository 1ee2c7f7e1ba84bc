//! Fixed window: at most L per window of length W, windows aligned to the Unix
//! epoch (so every replica agrees where a window starts); or per calendar
//! window (a day, week, month or year in a time zone).

use super::calendar::Calendar;
use super::{Decision, Limiter, Status, nanos};
use crate::time::Timestamp;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub limit: u64,
    /// Window length in nanoseconds; never zero. For a calendar window, its
    /// nominal length (what a client is told as the policy window).
    pub window: u64,
    /// Windows of the calendar instead of fixed lengths.
    pub calendar: Option<Calendar>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    start: Timestamp,
    count: u64,
    /// What a later window starts counting from: 0, except on a replica that
    /// leased a share of the window, which may take only its share of the
    /// next one until it syncs again.
    carry: u64,
}

impl Config {
    pub fn new(limit: u64, window: u64) -> Self {
        Config { limit, window: window.max(1), calendar: None }
    }

    /// `limit` per window of `calendar`.
    pub fn calendar(limit: u64, calendar: Calendar) -> Self {
        Config { limit, window: calendar.unit().nominal(), calendar: Some(calendar) }
    }

    fn window_start(&self, now: Timestamp) -> Timestamp {
        let n = now.as_nanos();
        match &self.calendar {
            None => Timestamp::from_nanos(n - n % self.window),
            Some(c) => Timestamp::from_nanos(c.window(n).0),
        }
    }

    /// Where the window holding `at` starts.
    pub fn window_of(&self, at: Timestamp) -> Timestamp {
        self.window_start(at)
    }

    /// Where the window that starts at `start` ends.
    pub(crate) fn window_end(&self, start: Timestamp) -> Timestamp {
        match &self.calendar {
            None => start.add_nanos(self.window),
            Some(c) => Timestamp::from_nanos(c.end_of(start.as_nanos())),
        }
    }
}

impl FixedWindow {
    /// The window starting at `start` with `count` taken; a later window
    /// starts from `carry` taken.
    pub(crate) fn with_count(start: Timestamp, count: u64, carry: u64) -> Self {
        FixedWindow { start, count, carry }
    }

    /// The window in force at `now` and its count. A stored window later than
    /// `now` (a replica whose clock runs ahead) is kept: it never under-counts.
    fn current(&self, cfg: &Config, now: Timestamp) -> (Timestamp, u64) {
        let start = cfg.window_start(now);
        if self.start >= start { (self.start, self.count) } else { (start, self.carry.min(cfg.limit)) }
    }
}

impl Limiter for FixedWindow {
    type Config = Config;

    fn new(cfg: &Config, now: Timestamp) -> Self {
        FixedWindow { start: cfg.window_start(now), count: 0, carry: 0 }
    }

    fn check(&self, cfg: &Config, now: Timestamp, cost: u64) -> Decision {
        let (start, used) = self.current(cfg, now);
        let to_end = cfg.window_end(start).saturating_since(now);
        let admitted = used.saturating_add(cost) <= cfg.limit;
        let after = if admitted { used + cost } else { used };
        Decision {
            admitted,
            status: Status {
                limit: cfg.limit,
                remaining: cfg.limit.saturating_sub(after),
                reset_after: nanos(if after > 0 { to_end } else { 0 }),
                retry_after: nanos(if admitted { 0 } else { to_end }),
                wait: nanos(0),
                over_limit: false,
            },
        }
    }

    fn commit(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        let (start, used) = self.current(cfg, now);
        *self = FixedWindow { start, count: used.saturating_add(cost), carry: self.carry };
    }

    fn refund(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        let (start, used) = self.current(cfg, now);
        *self = FixedWindow { start, count: used.saturating_sub(cost), carry: self.carry };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::testing::*;
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn admits_the_limit_per_window_and_resets_at_the_boundary() {
        let c = Config::new(3, SEC);
        let mut w = FixedWindow::new(&c, at_ms(250));
        for i in 0..3 {
            let d = w.try_acquire(&c, at_ms(250), 1);
            assert!(d.admitted);
            assert_eq!(d.status.remaining, 2 - i);
            assert_eq!(d.status.reset_after, ms(750), "end of the epoch-aligned window");
        }
        let d = w.try_acquire(&c, at_ms(999), 1);
        assert!(!d.admitted);
        assert_eq!(d.status.retry_after, ms(1));
        let d = w.try_acquire(&c, at_ms(1000), 1);
        assert!(d.admitted, "a new window opens exactly at the boundary");
        assert_eq!(d.status.remaining, 2);
        assert_eq!(d.status.reset_after, ms(1000));
    }

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        let c = Config::new(1, 60 * SEC);
        // T0 is a multiple of 60 s; 59.9 s in, the window ends 100 ms later.
        let mut w = FixedWindow::new(&c, at_ms(59_900));
        let d = w.try_acquire(&c, at_ms(59_900), 1);
        assert_eq!(d.status.reset_after, ms(100));
        assert!(!w.try_acquire(&c, at_ms(59_999), 1).admitted);
        assert!(w.try_acquire(&c, at_ms(60_000), 1).admitted);
    }

    #[test]
    fn cost_equal_to_limit_and_idle_state() {
        let c = Config::new(5, SEC);
        let mut w = FixedWindow::new(&c, T0);
        assert_eq!(w.check(&c, T0, 0).status.reset_after, ms(0), "an empty window is idle");
        assert!(w.try_acquire(&c, T0, 5).admitted);
        assert!(!w.try_acquire(&c, T0, 1).admitted);
        w.refund(&c, T0, 5);
        assert!(w.try_acquire(&c, T0, 5).admitted);
    }

    /// Unix time of a civil time in a zone.
    fn civil(zone: &str, when: &str) -> Timestamp {
        let dt: jiff::civil::DateTime = when.parse().unwrap();
        let z = dt.to_zoned(jiff::tz::TimeZone::get(zone).unwrap()).unwrap();
        Timestamp::from_nanos(z.timestamp().as_nanosecond() as u64)
    }

    #[test]
    fn a_calendar_month_resets_at_local_midnight_on_the_first() {
        use crate::limiter::calendar::{Calendar, Unit};
        let ny = "America/New_York";
        let c = Config::calendar(2, Calendar::new(Unit::Month, ny).unwrap());
        let t = civil(ny, "2026-01-31T23:00");
        let mut w = FixedWindow::new(&c, t);
        let d = w.try_acquire(&c, t, 1);
        assert!(d.admitted);
        assert_eq!(d.status.reset_after, ms(3_600_000), "an hour to February, New York time");
        assert!(w.try_acquire(&c, civil(ny, "2026-01-31T23:59:59"), 1).admitted);
        let denied = w.try_acquire(&c, civil(ny, "2026-01-31T23:59:59"), 1);
        assert!(!denied.admitted);
        assert_eq!(denied.status.retry_after, ms(1000));
        // Midnight UTC is still January in New York: still denied.
        assert!(!w.try_acquire(&c, civil("UTC", "2026-02-01T00:00:01"), 1).admitted);
        let feb = w.try_acquire(&c, civil(ny, "2026-02-01T00:00"), 1);
        assert!(feb.admitted, "February opens at local midnight");
        assert_eq!(feb.status.reset_after, ms(28 * 86_400_000), "28 days of February");
    }

    #[test]
    fn a_calendar_day_spans_a_dst_change() {
        use crate::limiter::calendar::{Calendar, Unit};
        let ny = "America/New_York";
        let c = Config::calendar(1, Calendar::new(Unit::Day, ny).unwrap());
        // 2026-11-01 lasts 25 hours in New York: 00:30 is 24.5 h before midnight.
        let t = civil(ny, "2026-11-01T00:30");
        let mut w = FixedWindow::new(&c, t);
        assert_eq!(w.try_acquire(&c, t, 1).status.reset_after, ms(24 * 3_600_000 + 1_800_000));
        assert!(!w.try_acquire(&c, civil(ny, "2026-11-01T23:59"), 1).admitted);
        assert!(w.try_acquire(&c, civil(ny, "2026-11-02T00:00"), 1).admitted);
    }

    proptest! {
        #[test]
        fn never_admits_more_than_the_limit_in_any_window(
            limit in 1u64..50,
            window_ms in 1u64..2000,
            ops in prop::collection::vec((0u64..300_000_000, 1u64..50), 1..200),
        ) {
            let c = Config::new(limit, window_ms * 1_000_000);
            let mut w = FixedWindow::new(&c, T0);
            let mut t = 0u64;
            let mut per_window = std::collections::HashMap::<u64, u64>::new();
            for (dt, cost) in ops {
                t += dt;
                let cost = cost.min(limit);
                if w.try_acquire(&c, at_ns(t), cost).admitted {
                    let n = per_window.entry(at_ns(t).as_nanos() / c.window).or_default();
                    *n += cost;
                    prop_assert!(*n <= limit);
                }
            }
        }
    }
}
