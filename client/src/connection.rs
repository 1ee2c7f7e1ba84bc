//! A local breaker on each server connection: after a few calls in a row
//! fail to reach the server, the client stops trying for a cool-down (growing
//! up to a cap), so a dead server costs no waiting per request; then one call
//! probes, and success closes it again.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Failures in a row that open the local breaker.
const THRESHOLD: u32 = 3;
const FIRST_COOLDOWN: Duration = Duration::from_millis(250);
const MAX_COOLDOWN: Duration = Duration::from_secs(5);

pub(crate) struct ServerBreaker {
    endpoint: String,
    base: Instant,
    /// Nanoseconds after `base` until which calls are not tried; 0 when closed.
    open_until: AtomicU64,
    failures: AtomicU32,
    probing: AtomicBool,
    cooldown: Mutex<Duration>,
}

impl ServerBreaker {
    pub(crate) fn new(endpoint: String) -> Self {
        ServerBreaker {
            endpoint,
            base: Instant::now(),
            open_until: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            probing: AtomicBool::new(false),
            cooldown: Mutex::new(FIRST_COOLDOWN),
        }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// May a call be tried? While open, no; once the cool-down is over, one
    /// caller at a time probes. The attempt says how the call went; dropped
    /// without a word (the caller's future was cancelled), a probe lets the
    /// next call probe.
    pub(crate) fn attempt(&self) -> Option<Attempt<'_>> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Some(Attempt { breaker: self, probe: false, settled: false });
        }
        let probe = self.now() >= until && !self.probing.swap(true, Ordering::AcqRel);
        probe.then_some(Attempt { breaker: self, probe: true, settled: false })
    }

    /// Whether the server is currently considered unreachable.
    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    fn success(&self) {
        self.failures.store(0, Ordering::Release);
        self.probing.store(false, Ordering::Release);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 {
            *self.cooldown.lock().unwrap_or_else(|e| e.into_inner()) = FIRST_COOLDOWN;
            tracing::info!(endpoint = %self.endpoint, "Floodgate is reachable again");
        }
    }

    fn failure(&self, why: &str) {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let probing = self.probing.swap(false, Ordering::AcqRel);
        if failures < THRESHOLD && !probing {
            return;
        }
        let mut cooldown = self.cooldown.lock().unwrap_or_else(|e| e.into_inner());
        let was_open = self.open_until.swap(self.now() + cooldown.as_nanos() as u64, Ordering::AcqRel) != 0;
        if !was_open {
            tracing::warn!(endpoint = %self.endpoint, error = why, "Floodgate is unreachable: running without it");
        }
        *cooldown = (*cooldown * 2).min(MAX_COOLDOWN);
    }
}

/// One call tried through the breaker.
pub(crate) struct Attempt<'a> {
    breaker: &'a ServerBreaker,
    probe: bool,
    settled: bool,
}

impl Attempt<'_> {
    pub(crate) fn success(mut self) {
        self.settled = true;
        self.breaker.success();
    }

    pub(crate) fn failure(mut self, why: &str) {
        self.settled = true;
        self.breaker.failure(why);
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.probe && !self.settled {
            // Cancelled mid-probe: neither up nor down was learnt.
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(b: &ServerBreaker) {
        for _ in 0..THRESHOLD {
            b.attempt().unwrap().failure("x");
        }
        assert!(b.is_open());
        *b.cooldown.lock().unwrap() = Duration::ZERO;
        b.open_until.store(1, Ordering::Release);
    }

    #[test]
    fn opens_after_failures_in_a_row_and_lets_one_probe_through() {
        let b = ServerBreaker::new("test".into());
        b.attempt().unwrap().failure("x");
        b.attempt().unwrap().failure("x");
        assert!(!b.is_open());
        b.attempt().unwrap().failure("x");
        assert!(b.is_open());
        assert!(b.attempt().is_none(), "cooling down");
        *b.cooldown.lock().unwrap() = Duration::ZERO;
        b.open_until.store(1, Ordering::Release);
        let probe = b.attempt().expect("one probe");
        assert!(b.attempt().is_none(), "only one");
        probe.success();
        assert!(!b.is_open() && b.attempt().is_some());
    }

    #[test]
    fn a_cancelled_probe_lets_the_next_call_probe() {
        let b = ServerBreaker::new("test".into());
        open(&b);
        let probe = b.attempt().expect("a probe");
        drop(probe); // its future was dropped: no success, no failure
        assert!(b.attempt().is_some(), "the next call probes; the client is not cut off");
    }
}
