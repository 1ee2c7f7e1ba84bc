//! The breaker's sliding windows of recorded calls: the last N calls, or the
//! calls of the last N seconds.

use super::config::WindowKind;
use crate::time::Timestamp;

/// Calls, failures and slow calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub calls: u64,
    pub failures: u64,
    pub slow: u64,
    /// Slow calls that succeeded.
    pub slow_successes: u64,
}

/// One recorded call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub failed: bool,
    pub slow: bool,
}

#[derive(Clone, Debug)]
pub enum Window {
    Count(CountWindow),
    Time(TimeWindow),
    Tumbling(TumblingWindow),
}

/// The calls since the last multiple of `length` since the epoch.
#[derive(Clone, Debug)]
pub struct TumblingWindow {
    length: u64,
    /// The start of the interval `totals` counts, in nanoseconds.
    start: u64,
    totals: Counts,
}

impl TumblingWindow {
    /// Empties the window when `now` is in a later interval.
    fn advance(&mut self, now: Timestamp) {
        let start = now.as_nanos() - now.as_nanos() % self.length;
        if start > self.start {
            self.start = start;
            self.totals = Counts::default();
        }
    }
}

/// The last `size` calls, in a ring.
#[derive(Clone, Debug)]
pub struct CountWindow {
    ring: Vec<Call>,
    next: usize,
    totals: Counts,
}

/// One-second buckets covering the last `seconds` seconds.
#[derive(Clone, Debug)]
pub struct TimeWindow {
    buckets: Vec<(u64, Counts)>,
    totals: Counts,
}

// === impl Counts ===

impl Counts {
    pub fn failure_rate(&self) -> f64 {
        ratio(self.failures, self.calls)
    }

    pub fn slow_call_rate(&self) -> f64 {
        ratio(self.slow, self.calls)
    }

    pub fn add(&mut self, call: Call) {
        self.calls += 1;
        self.failures += u64::from(call.failed);
        self.slow += u64::from(call.slow);
        self.slow_successes += u64::from(call.slow && !call.failed);
    }

    fn sub(&mut self, other: &Counts) {
        self.calls -= other.calls;
        self.failures -= other.failures;
        self.slow -= other.slow;
        self.slow_successes -= other.slow_successes;
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

// === impl Window ===

impl Window {
    pub fn new(kind: WindowKind) -> Window {
        match kind {
            WindowKind::Count(n) => {
                Window::Count(CountWindow { ring: Vec::with_capacity(n as usize), next: 0, totals: Counts::default() })
            }
            WindowKind::Time(s) => Window::Time(TimeWindow {
                buckets: vec![(0, Counts::default()); s as usize],
                totals: Counts::default(),
            }),
            WindowKind::Tumbling(ms) => Window::Tumbling(TumblingWindow {
                length: u64::from(ms.max(1)) * 1_000_000,
                start: 0,
                totals: Counts::default(),
            }),
        }
    }

    /// Whether this window was made for `kind`.
    pub fn is(&self, kind: WindowKind) -> bool {
        match (self, kind) {
            (Window::Count(w), WindowKind::Count(n)) => w.ring.capacity() == n as usize,
            (Window::Time(w), WindowKind::Time(s)) => w.buckets.len() == s as usize,
            (Window::Tumbling(w), WindowKind::Tumbling(ms)) => w.length == u64::from(ms.max(1)) * 1_000_000,
            _ => false,
        }
    }

    pub fn record(&mut self, now: Timestamp, call: Call) {
        match self {
            Window::Count(w) => w.record(call),
            Window::Time(w) => w.record(now, call),
            Window::Tumbling(w) => {
                w.advance(now);
                w.totals.add(call);
            }
        }
    }

    /// The calls still in the window at `now`.
    pub fn counts(&mut self, now: Timestamp) -> Counts {
        match self {
            Window::Count(w) => w.totals,
            Window::Time(w) => {
                w.advance(now);
                w.totals
            }
            Window::Tumbling(w) => {
                w.advance(now);
                w.totals
            }
        }
    }
}

impl CountWindow {
    fn record(&mut self, call: Call) {
        let cap = self.ring.capacity();
        if self.ring.len() < cap {
            self.ring.push(call);
        } else {
            let old = std::mem::replace(&mut self.ring[self.next], call);
            let mut gone = Counts::default();
            gone.add(old);
            self.totals.sub(&gone);
        }
        self.next = (self.next + 1) % cap;
        self.totals.add(call);
    }
}

impl TimeWindow {
    fn second(now: Timestamp) -> u64 {
        now.as_nanos() / 1_000_000_000
    }

    /// Drops every bucket older than the window.
    fn advance(&mut self, now: Timestamp) {
        let current = Self::second(now);
        let span = self.buckets.len() as u64;
        for (second, counts) in &mut self.buckets {
            if *counts != Counts::default() && *second + span <= current {
                self.totals.sub(counts);
                *counts = Counts::default();
            }
        }
    }

    fn record(&mut self, now: Timestamp, call: Call) {
        self.advance(now);
        let current = Self::second(now);
        let i = (current % self.buckets.len() as u64) as usize;
        let bucket = &mut self.buckets[i];
        if bucket.0 != current {
            self.totals.sub(&bucket.1);
            *bucket = (current, Counts::default());
        }
        bucket.1.add(call);
        self.totals.add(call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: Call = Call { failed: false, slow: false };
    const FAIL: Call = Call { failed: true, slow: false };
    const SLOW: Call = Call { failed: false, slow: true };

    fn at(secs: u64, ms: u64) -> Timestamp {
        Timestamp::from_nanos((1_700_006_400 + secs) * 1_000_000_000 + ms * 1_000_000)
    }

    #[test]
    fn the_count_window_keeps_the_last_n_calls() {
        let mut w = Window::new(WindowKind::Count(3));
        for call in [FAIL, FAIL, OK] {
            w.record(at(0, 0), call);
        }
        assert_eq!(w.counts(at(0, 0)), Counts { calls: 3, failures: 2, slow: 0, slow_successes: 0 });
        w.record(at(0, 0), SLOW); // pushes out the first failure
        assert_eq!(w.counts(at(0, 0)), Counts { calls: 3, failures: 1, slow: 1, slow_successes: 1 });
        w.record(at(0, 0), OK);
        w.record(at(0, 0), OK);
        assert_eq!(w.counts(at(99, 0)).failures, 0, "time does not age a count window");
    }

    #[test]
    fn the_tumbling_window_empties_at_each_boundary_since_the_epoch() {
        // 20 s intervals: [1_700_006_400, +20) is one (1_700_006_400 is a multiple of 20).
        let mut w = Window::new(WindowKind::Tumbling(20_000));
        w.record(at(0, 0), FAIL);
        w.record(at(19, 999), OK);
        assert_eq!(w.counts(at(19, 999)).calls, 2);
        assert_eq!(w.counts(at(20, 0)), Counts::default(), "a new interval, however recent the calls");
        w.record(at(25, 0), SLOW);
        assert_eq!(w.counts(at(39, 0)).calls, 1);
        assert_eq!(w.counts(at(100, 0)).calls, 0);
    }

    #[test]
    fn the_time_window_drops_old_buckets() {
        let mut w = Window::new(WindowKind::Time(10));
        w.record(at(0, 100), FAIL);
        w.record(at(0, 900), FAIL);
        w.record(at(4, 0), OK);
        w.record(at(9, 999), SLOW);
        assert_eq!(w.counts(at(9, 999)).calls, 4);
        // At 10 s the first second's bucket has left the window.
        assert_eq!(w.counts(at(10, 0)), Counts { calls: 2, failures: 0, slow: 1, slow_successes: 1 });
        assert_eq!(w.counts(at(14, 0)).calls, 1);
        assert_eq!(w.counts(at(100, 0)).calls, 0);
        // A bucket reused after the ring wrapped starts empty.
        w.record(at(20, 0), FAIL);
        w.record(at(30, 0), OK);
        assert_eq!(w.counts(at(30, 0)), Counts { calls: 1, failures: 0, slow: 0, slow_successes: 0 });
    }
}
