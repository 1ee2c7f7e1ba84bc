//! A circuit breaker's configuration: plain data, validated by the rules
//! crate before it reaches a breaker.

use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub struct BreakerConfig {
    /// Opens at a failure rate at or above this, in (0, 1]; [`OFF`] never.
    pub failure_rate_threshold: f64,
    /// Opens at a slow-call rate at or above this, in (0, 1]; [`OFF`] never.
    pub slow_call_rate_threshold: f64,
    /// Opens at this many failures in the window (Sentinel's exception
    /// count); in HALF_OPEN, at this many failed probes, or all of them when
    /// fewer probes are handed out.
    pub failure_count_threshold: Option<u32>,
    /// A call is slow when strictly longer than this.
    pub slow_call_duration: Duration,
    pub window: WindowKind,
    /// Nothing is decided with fewer calls than this in the window.
    pub minimum_calls: u32,
    pub wait_in_open: Backoff,
    /// Probes handed out in HALF_OPEN, across all clients and replicas.
    pub half_open_calls: u32,
    /// Probes that never report expire after this, and the breaker reopens.
    pub max_wait_in_half_open: Duration,
}

/// A rate threshold that never trips (`off`).
pub const OFF: f64 = f64::INFINITY;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKind {
    /// The last `n` calls.
    Count(u32),
    /// The calls of the last `n` seconds.
    Time(u32),
    /// The calls since the last multiple of `n` milliseconds since the epoch
    /// (Sentinel's `statIntervalMs`: its one bucket, emptied at each
    /// boundary).
    Tumbling(u32),
}

/// How long OPEN lasts: `initial`, times `multiplier` per consecutive reopening,
/// at most `max`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub multiplier: f64,
    pub max: Duration,
}

impl Backoff {
    pub fn fixed(d: Duration) -> Self {
        Backoff { initial: d, multiplier: 1.0, max: d }
    }

    /// The wait after `openings` consecutive openings (1 for the first).
    pub fn wait(&self, openings: u32) -> Duration {
        let factor = self.multiplier.powi(openings.saturating_sub(1).min(1000) as i32);
        let secs = (self.initial.as_secs_f64() * factor).min(self.max.as_secs_f64());
        Duration::from_secs_f64(secs).max(self.initial.min(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_per_opening_up_to_max() {
        let b = Backoff { initial: Duration::from_secs(5), multiplier: 1.5, max: Duration::from_secs(10) };
        assert_eq!(b.wait(1), Duration::from_secs(5));
        assert_eq!(b.wait(2), Duration::from_millis(7500));
        assert_eq!(b.wait(3), Duration::from_secs(10));
        assert_eq!(b.wait(50), Duration::from_secs(10));
        assert_eq!(Backoff::fixed(Duration::from_secs(30)).wait(7), Duration::from_secs(30));
    }
}
