//! Per-resource state beside the buckets: the circuit breaker and the count of
//! calls in flight. Created on first use; idle ones are forgotten.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dashmap::DashMap;

use crate::breaker::Breaker;
use crate::rules::{BreakerConfig, Rule};
use crate::time::Timestamp;

mod admit;
mod concurrency;
mod permits;

pub use admit::{Admitted, Ask, DEFAULT_PERMIT_TTL, Denial};
pub use permits::{Permit, PermitId, Permits};

/// A closed breaker untouched this long is forgotten (its history with it).
pub(crate) const IDLE_TTL: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
pub struct Guarded {
    breaker: Mutex<Option<Breaker>>,
    pub in_flight: AtomicU32,
    /// Nanoseconds since the epoch of the last acquire or report.
    touched: AtomicU64,
    /// The rule that made it: its metric label, and what its cap counts.
    pub rule: Arc<str>,
    /// How long permits hold a concurrency slot, on average (microseconds,
    /// a moving average; 0 until the first is returned).
    hold_us: AtomicU64,
    /// A replicated concurrency limit: the slots this replica may hold at
    /// once, leased from Redis, and until when it may take them (engine
    /// clock, ns).
    lease: AtomicU32,
    lease_until: AtomicU64,
    /// What Redis keeps reserved for this replica after the last renewal
    /// (at least the lease): a renewal is due until it is 0.
    reserved: AtomicU32,
    /// A call asked for a slot since the last lease sync.
    wanted: std::sync::atomic::AtomicBool,
    /// A renewal of the lease is out (one at a time).
    lease_syncing: std::sync::atomic::AtomicBool,
    /// An adaptive limit's state (see `concurrency.rs`), and the limit it
    /// gives, read without the lock (0: none yet, the rule's `initial`).
    adaptive: Mutex<Option<crate::adaptive::Controller>>,
    limit: AtomicU32,
    /// The most calls in flight since the window was last taken.
    peak: AtomicU32,
    /// Calls in flight by priority (for partitions and metrics).
    by_class: [AtomicU32; 4],
}

/// What a denied caller is told to wait for a slot before any permit came back.
const FIRST_HOLD_GUESS: Duration = Duration::from_millis(50);

/// Per-resource state, created on first use. A template rule (glob or
/// default) matches unboundedly many resources: it keeps at most its
/// `max_breakers` of them, the least recently used going first.
#[derive(Default)]
pub struct Guards {
    map: DashMap<String, Arc<Guarded>, ahash::RandomState>,
    /// How many each template rule holds.
    per_rule: DashMap<Arc<str>, usize, ahash::RandomState>,
}

impl Guarded {
    /// The breaker, made or reconfigured for `cfg`; `None` when the rule has none.
    pub fn breaker(&self, cfg: Option<&BreakerConfig>) -> MutexGuard<'_, Option<Breaker>> {
        let mut slot = self.breaker.lock().unwrap_or_else(|e| e.into_inner());
        match (cfg, slot.as_mut()) {
            (None, _) => *slot = None,
            (Some(cfg), Some(b)) => b.reconfigure(cfg),
            (Some(cfg), None) => *slot = Some(Breaker::new(cfg)),
        }
        slot
    }

    /// The breaker as it is, without reconfiguring.
    pub(crate) fn current_breaker(&self) -> MutexGuard<'_, Option<Breaker>> {
        self.breaker.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn touch(&self, now: Timestamp) {
        self.touched.store(now.as_nanos(), Ordering::Relaxed);
    }

    /// This replica's lease of a replicated concurrency limit, while it may
    /// still take slots under it.
    pub fn lease_at(&self, now: Timestamp) -> Option<u32> {
        (now.as_nanos() < self.lease_until.load(Ordering::Acquire)).then(|| self.lease.load(Ordering::Acquire))
    }

    /// The lease Redis granted, usable until `until`, and what it keeps
    /// reserved for this replica.
    pub fn set_lease(&self, slots: u32, until: Timestamp, reserved: u32) {
        self.lease.store(slots, Ordering::Release);
        self.lease_until.store(until.as_nanos(), Ordering::Release);
        self.reserved.store(reserved, Ordering::Release);
    }

    /// What Redis keeps reserved for this replica.
    pub fn reserved(&self) -> u32 {
        self.reserved.load(Ordering::Acquire)
    }

    /// Starts a renewal of the lease, unless one is out.
    pub fn begin_lease_sync(&self) -> bool {
        !self.lease_syncing.swap(true, Ordering::AcqRel)
    }

    pub fn end_lease_sync(&self) {
        self.lease_syncing.store(false, Ordering::Release);
    }

    pub fn lease_syncing(&self) -> bool {
        self.lease_syncing.load(Ordering::Acquire)
    }

    /// Whether a call asked for a slot since the last renewal.
    pub fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Whether a call asked for a slot since the last time this was asked.
    pub fn take_wanted(&self) -> bool {
        self.wanted.swap(false, Ordering::AcqRel)
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Takes a concurrency slot if fewer than `max` are held (`None`: no cap).
    pub(crate) fn try_take_slot_within(&self, max: Option<u32>) -> bool {
        self.wanted.store(true, Ordering::Relaxed);
        match max {
            Some(max) => self.try_take_slot(max),
            None => {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                true
            }
        }
    }

    /// Takes a concurrency slot if fewer than `max` are held.
    pub(crate) fn try_take_slot(&self, max: u32) -> bool {
        self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_ok()
    }

    pub(crate) fn release_slot(&self) {
        let _ = self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Gives a slot back after it was held for `held`.
    pub(crate) fn release_slot_after(&self, held: Duration) {
        self.release_slot();
        let held = held.as_micros().min(u128::from(u64::MAX / 8)) as u64;
        let _ = self.hold_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
            Some(if avg == 0 { held.max(1) } else { (avg * 7 + held) / 8 })
        });
    }

    /// When a slot is likely to come back, with `max` held: the average hold
    /// spread over the holders, since they started at different times.
    pub fn slot_free_in(&self, max: u32) -> Duration {
        match self.hold_us.load(Ordering::Relaxed) {
            0 => FIRST_HOLD_GUESS,
            avg => Duration::from_micros(avg / u64::from(max.max(1))).max(Duration::from_millis(1)),
        }
    }

    /// Whether a call acquired or reported within `d` of `now`.
    pub fn active_within(&self, now: Timestamp, d: Duration) -> bool {
        now.saturating_since(Timestamp::from_nanos(self.touched.load(Ordering::Relaxed)))
            < crate::time::duration_nanos(d)
    }

    fn idle(&self, now: Timestamp) -> bool {
        let quiet = now.saturating_since(Timestamp::from_nanos(self.touched.load(Ordering::Relaxed)))
            >= crate::time::duration_nanos(IDLE_TTL);
        let closed = self.current_breaker().as_ref().is_none_or(|b| b.state() == crate::breaker::State::Closed);
        quiet && closed && self.in_flight.load(Ordering::Acquire) == 0
    }
}

impl Guards {
    /// The state of `resource`, made for `rule` the first time.
    pub(crate) fn get_or_create(&self, resource: &str, rule: &Rule) -> Arc<Guarded> {
        if let Some(g) = self.map.get(resource) {
            return g.clone();
        }
        let template = rule.per_resource();
        if template {
            self.make_room(&rule.name, rule.max_breakers);
        }
        self.map
            .entry(resource.to_string())
            .or_insert_with(|| {
                let rule: Arc<str> = Arc::from(rule.name.as_str());
                if template {
                    *self.per_rule.entry(rule.clone()).or_default() += 1;
                }
                Arc::new(Guarded { rule, ..Guarded::default() })
            })
            .clone()
    }

    /// Below `cap` for `rule`: evicts its least recently used resources (1%
    /// of the cap at a time, so that a flood pays for a scan once per many).
    fn make_room(&self, rule: &str, cap: usize) {
        if self.per_rule.get(rule).is_none_or(|n| *n < cap) {
            return;
        }
        let batch = (cap / 100).max(1);
        let mut oldest: Vec<(u64, String)> = self
            .map
            .iter()
            .filter(|e| &*e.value().rule == rule)
            .map(|e| (e.value().touched.load(Ordering::Relaxed), e.key().clone()))
            .collect();
        oldest.sort_unstable();
        for (_, resource) in oldest.into_iter().take(batch) {
            if let Some((_, g)) = self.map.remove(&resource) {
                self.forget(&g);
            }
        }
    }

    fn forget(&self, g: &Guarded) {
        if let Some(mut n) = self.per_rule.get_mut(&g.rule) {
            *n = n.saturating_sub(1);
        }
    }

    pub fn get(&self, resource: &str) -> Option<Arc<Guarded>> {
        self.map.get(resource).map(|g| g.clone())
    }

    /// Every guarded resource, sorted by name.
    pub fn all(&self) -> Vec<(String, Arc<Guarded>)> {
        let mut all: Vec<_> = self.map.iter().map(|e| (e.key().clone(), e.value().clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Forgets idle resources that no permit refers to.
    pub fn sweep(&self, now: Timestamp) {
        self.map.retain(|_, g| {
            let keep = Arc::strong_count(g) > 1 || !g.idle(now);
            if !keep {
                self.forget(g);
            }
            keep
        });
    }

    pub fn contains(&self, resource: &str) -> bool {
        self.map.contains_key(resource)
    }
}
