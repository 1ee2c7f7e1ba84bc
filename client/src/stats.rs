//! What the client did, for logs, metrics or tests.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters since the client was built.
#[derive(Debug, Default)]
pub struct Stats {
    rpcs: AtomicU64,
    cached_denials: AtomicU64,
    no_rule: AtomicU64,
    server_errors: AtomicU64,
    without_server: AtomicU64,
    decided_locally: AtomicU64,
    reports_counted: AtomicU64,
    reports_uncounted: AtomicU64,
    reports_dropped: AtomicU64,
    leased: AtomicU64,
    loads_reported: AtomicU64,
    loads_failed: AtomicU64,
    /// Guarded calls since the last load report: how many started, and how
    /// long in all they waited before they ran (µs).
    queued_calls: AtomicU64,
    queued_us: AtomicU64,
    /// Guarded calls running now.
    running: AtomicU64,
}

/// A copy of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Calls sent to a server (Acquire, AcquireBatch, Lease).
    pub rpcs: u64,
    /// Denials answered from the open-breaker cache, with no round trip.
    pub cached_denials: u64,
    /// Calls on resources no rule matches, allowed with no round trip.
    pub no_rule: u64,
    /// Server answers that were errors rather than decisions (the fail mode answered).
    pub server_errors: u64,
    /// Decisions made without the server: by the fail mode (open, closed or
    /// local), all of them.
    pub without_server: u64,
    /// Of those, the ones `FailMode::Local` decided from the limits it learned.
    pub decided_locally: u64,
    /// Reports the server counted, and those it did not (expired or unknown permits).
    pub reports_counted: u64,
    pub reports_uncounted: u64,
    /// Reports that could not be delivered.
    pub reports_dropped: u64,
    /// Decisions answered from a lease, with no round trip.
    pub leased: u64,
    /// Load reports (`Builder::report_load`) the server took, and those it
    /// refused or that failed.
    pub loads_reported: u64,
    pub loads_failed: u64,
}

impl Stats {
    pub(crate) fn rpc(&self) {
        self.rpcs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn cached_denial(&self) {
        self.cached_denials.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn no_rule(&self) {
        self.no_rule.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn server_error(&self) {
        self.server_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn without_server(&self) {
        self.without_server.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn decided_locally(&self) {
        self.decided_locally.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reported(&self, counted: u64, uncounted: u64) {
        self.reports_counted.fetch_add(counted, Ordering::Relaxed);
        self.reports_uncounted.fetch_add(uncounted, Ordering::Relaxed);
    }

    pub(crate) fn leased(&self) {
        self.leased.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn load_reported(&self) {
        self.loads_reported.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn load_failed(&self) {
        self.loads_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// A guarded call waited `d` before it ran: the question's round trip
    /// and any shaping wait.
    pub(crate) fn queued(&self, d: std::time::Duration) {
        self.queued_calls.fetch_add(1, Ordering::Relaxed);
        self.queued_us.fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The mean wait of the guarded calls that started since the last time
    /// this was asked (`None`: none started), and starts counting afresh.
    pub(crate) fn take_queue_delay(&self) -> Option<std::time::Duration> {
        let calls = self.queued_calls.swap(0, Ordering::Relaxed);
        let us = self.queued_us.swap(0, Ordering::Relaxed);
        (calls > 0).then(|| std::time::Duration::from_micros(us / calls))
    }

    /// A guarded call runs until the returned value is dropped.
    pub(crate) fn running(self: &std::sync::Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running(self.clone())
    }

    /// Guarded calls running now.
    pub(crate) fn in_flight(&self) -> u64 {
        self.running.load(Ordering::Relaxed)
    }

    pub(crate) fn dropped(&self, n: u64) {
        self.reports_dropped.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            rpcs: l(&self.rpcs),
            cached_denials: l(&self.cached_denials),
            no_rule: l(&self.no_rule),
            server_errors: l(&self.server_errors),
            without_server: l(&self.without_server),
            decided_locally: l(&self.decided_locally),
            reports_counted: l(&self.reports_counted),
            reports_uncounted: l(&self.reports_uncounted),
            reports_dropped: l(&self.reports_dropped),
            leased: l(&self.leased),
            loads_reported: l(&self.loads_reported),
            loads_failed: l(&self.loads_failed),
        }
    }
}

/// A guarded call that is running: counted in [`Stats::in_flight`] until it
/// is dropped, however the call ends (a cancelled call too).
pub(crate) struct Running(std::sync::Arc<Stats>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}
