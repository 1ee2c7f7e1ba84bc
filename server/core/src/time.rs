//! Time, injected: nothing under the decision core reads a clock.
//!
//! A [`Timestamp`] is nanoseconds since the Unix epoch. Wall-clock based so that
//! replicas sharing state through Redis agree on windows aligned to the epoch,
//! and monotonic within a process (see [`SystemClock`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

/// Something that tells the time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The real clock: wall time at start-up plus a monotonic elapsed time, so it
/// never steps backwards when NTP adjusts the wall clock.
#[derive(Debug)]
pub struct SystemClock {
    base_wall: u64,
    base: std::time::Instant,
}

/// A clock that only moves when told to: for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

// === impl Timestamp ===

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);

    pub const fn from_nanos(nanos: u64) -> Self {
        Timestamp(nanos)
    }

    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs * 1_000_000_000)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time elapsed since `earlier`, zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    pub fn saturating_add(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_nanos(d)))
    }

    pub fn add_nanos(self, nanos: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(nanos))
    }

    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.0)
    }
}

/// At most one "now" per `secs` seconds: for a warning a flood of requests
/// could repeat.
#[derive(Debug)]
pub struct Throttle {
    secs: u64,
    /// The second (plus one) of the last "now"; 0: never.
    last: std::sync::atomic::AtomicU64,
}

impl Throttle {
    pub const fn new(secs: u64) -> Self {
        Throttle { secs, last: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Whether it is time again (and if so, the next is `secs` away).
    pub fn due(&self, now: Timestamp) -> bool {
        use std::sync::atomic::Ordering;
        let second = now.as_nanos() / 1_000_000_000 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && second < last.saturating_add(self.secs) {
            return false;
        }
        self.last.compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// === impl SystemClock ===

impl SystemClock {
    pub fn new() -> Self {
        let base_wall = SystemTime::now().duration_since(UNIX_EPOCH).map(duration_nanos).unwrap_or(0);
        SystemClock { base_wall, base: std::time::Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.base_wall + duration_nanos(self.base.elapsed()))
    }
}

// === impl ManualClock ===

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock { now: AtomicU64::new(start.0) }
    }

    pub fn advance(&self, d: Duration) {
        self.now.fetch_add(duration_nanos(d), Ordering::SeqCst);
    }

    pub fn set(&self, t: Timestamp) {
        self.now.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_says_now_once_per_period() {
        let t = Throttle::new(60);
        let at = |s| Timestamp::from_secs(s);
        assert!(t.due(at(0)), "the first time");
        assert!(!t.due(at(0)) && !t.due(at(59)));
        assert!(t.due(at(60)));
        assert!(!t.due(at(100)));
        assert!(t.due(at(1_000)));
    }

    #[test]
    fn system_clock_is_monotonic_and_near_wall_time() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let diff = (duration_nanos(wall) as i128 - b.as_nanos() as i128).abs();
        assert!(diff < 1_000_000_000, "clock is {diff} ns away from wall time");
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_secs(10));
        assert_eq!(clock.now(), Timestamp::from_secs(10));
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now().as_nanos(), 11_500_000_000);
    }
}
