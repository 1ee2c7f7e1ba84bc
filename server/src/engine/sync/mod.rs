//! What the decision core keeps for replication through Redis, present only
//! when the server replicates: whether Redis answers, how many replicas share
//! the limits, what replicated buckets took since their last sync, breaker
//! news, and probe outcomes waiting to go out. The replication module (the
//! network side) reads and feeds it; nothing here touches the network.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use super::{Engine, Installed, Prepared};
use crate::breaker::Call;
use crate::events::Event;
use crate::limiter::{Algorithm, Bucket, Shared};
use crate::rules::{Limit, SyncMode};
use crate::store::BucketKey;
use crate::time::Timestamp;

mod dirty;
mod shared;

pub use dirty::SyncItem;
pub use shared::{BreakerNews, RemoteBreaker, RemoteOutcome, SharedBreaker};
use shared::{Outbox, Unsynced};

/// The replication state of one replica.
#[derive(Debug, Default)]
pub struct Replica {
    /// Redis answered last time.
    up: AtomicBool,
    /// Live replicas, this one included.
    live: AtomicU32,
    dirty: dirty::DirtyBuckets,
    outbox: Outbox,
    breakers: DashMap<String, Unsynced, ahash::RandomState>,
}

/// Whether Redis decides this limit when replication is on: strict limits,
/// and sliding logs (an exact log cannot be shared approximately).
pub fn decided_by_redis(l: &Limit) -> bool {
    l.sync == SyncMode::Strict
        || (l.sync == SyncMode::Replicated && matches!(l.algorithm, Algorithm::SlidingWindowLog(_)))
}

// === impl Replica ===

impl Replica {
    pub(super) fn new() -> Self {
        Replica { live: AtomicU32::new(1), ..Replica::default() }
    }

    /// Redis answered last time.
    pub fn up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
    }

    pub fn set_live(&self, n: u32) {
        self.live.store(n.max(1), Ordering::Release);
    }

    pub fn live(&self) -> u32 {
        self.live.load(Ordering::Acquire).max(1)
    }

    /// This replica's share of a limit while replicas cannot coordinate.
    pub fn share(&self) -> f64 {
        1.0 / f64::from(self.live())
    }

    /// Notes units a replicated limit took (or, negative, gave back).
    pub(super) fn note(&self, l: &Limit, key: &BucketKey, resource: &str, units: i64, now: Timestamp) {
        if l.sync == SyncMode::Replicated {
            self.dirty.note(key, resource, l.id, units, now);
        }
    }

    /// Every replicated bucket active within `active`, with its consumption
    /// since the last sync (now reset), so that it is pushed and the merged
    /// state pulled.
    pub fn drain_dirty(&self, now: Timestamp, active: Duration) -> Vec<SyncItem> {
        self.dirty.drain(now, active)
    }

    /// One bucket's consumption since its last sync, now reset (to push it now).
    pub fn take_dirty(&self, key: &BucketKey) -> u64 {
        self.dirty.take(key)
    }

    /// Puts back consumption a failed sync could not push.
    pub fn restore_dirty(&self, item: &SyncItem, now: Timestamp) {
        self.dirty.note(&item.key, &item.resource, item.limit, item.delta as i64, now);
    }

    /// Probe outcomes and returned probes waiting to be sent to Redis.
    pub fn take_outbox(&self) -> Vec<RemoteOutcome> {
        self.outbox.take()
    }

    pub fn outbox_is_empty(&self) -> bool {
        self.outbox.is_empty()
    }

    pub(super) fn send(&self, outcome: RemoteOutcome) {
        self.outbox.push(outcome);
    }

    /// A call this replica's breaker recorded, for the next sync.
    pub(super) fn record_call(&self, resource: &str, call: Call, tripped: bool) {
        match self.breakers.get_mut(resource) {
            Some(mut u) => u.record(call, tripped),
            None => self.breakers.entry(resource.to_string()).or_default().record(call, tripped),
        }
    }

    /// One breaker's calls since the last sync (now reset).
    fn take_news(&self, resource: String) -> BreakerNews {
        match self.breakers.get_mut(&resource) {
            Some(mut u) => {
                let news = BreakerNews { resource, calls: u.calls, tripped: u.tripped };
                (u.calls, u.tripped) = (Default::default(), false);
                news
            }
            None => BreakerNews { resource, calls: Default::default(), tripped: false },
        }
    }

    /// Whether `generation` is newer than the last shared state adopted for
    /// `resource` (and notes it as adopted).
    fn newer(&self, resource: &str, generation: u64) -> bool {
        let mut u = self.breakers.entry(resource.to_string()).or_default();
        if generation <= u.generation {
            return false;
        }
        u.generation = generation;
        true
    }

    /// Forgets breakers no longer guarded here once their news went out.
    pub(super) fn retain_breakers(&self, guarded: impl Fn(&str) -> bool) {
        self.breakers.retain(|resource, u| guarded(resource) || u.calls.calls > 0);
    }
}

// === impl Engine ===

impl Engine {
    /// Whether the next call on this resource needs Redis to grant a probe
    /// (the rule `p` matched has a breaker, in OPEN past its wait or HALF_OPEN).
    pub fn needs_remote_probe(&self, p: &Prepared<'_>, resource: &str) -> bool {
        if !self.sync.as_ref().is_some_and(Replica::up) || !p.has_breaker() {
            return false;
        }
        let now = self.clock.now();
        self.guards.get(resource).is_some_and(|g| g.current_breaker().as_ref().is_some_and(|b| b.needs_probe(now)))
    }

    /// Takes the shared state of a resource's breaker when it is newer than
    /// the last one taken.
    pub fn adopt_breaker(&self, rules: &Installed, resource: &str, shared: SharedBreaker) {
        let Some(sync) = &self.sync else { return };
        let Some(rule) = rules.rules.find(resource) else { return };
        let Some(cfg) = rule.breaker.as_ref() else { return };
        if !sync.newer(resource, shared.generation) {
            return;
        }
        let g = self.guards.get_or_create(resource, rule);
        let now = self.clock.now();
        let transition = g
            .breaker(Some(cfg))
            .as_mut()
            .and_then(|b| b.adopt(cfg, now, shared.state, shared.open_until, shared.openings));
        if let Some(transition) = transition {
            self.events.publish(Event::Breaker { resource: resource.into(), rule: rule.name.clone(), transition });
        }
    }

    /// Replaces a replicated bucket with its lease of the merged state, then
    /// re-applies what was taken here since the state was read.
    pub fn adopt(&self, rules: &Installed, resource: &str, key: &BucketKey, shared: &Shared) {
        let Some(sync) = &self.sync else { return };
        let Some(alg) = rules.algorithm(key.limit) else { return };
        let now = self.clock.now();
        let mut bucket = Bucket::adopt(alg, now, shared);
        let pending = sync.dirty.pending(key);
        if pending > 0 {
            bucket.force(alg, now, pending);
        }
        self.buckets.put(key.clone(), bucket, now);
        sync.dirty.synced(key, resource, shared.available, now);
    }

    /// Whether a request its replicated limits denied here might fit in what
    /// the replicas have in common (more than this replica's lease).
    pub fn worth_escalating(&self, p: &Prepared<'_>) -> bool {
        let Some(sync) = &self.sync else { return false };
        let cost = p.cost() as f64;
        p.replicated_keys().any(|(_, k)| sync.dirty.available(k).is_some_and(|a| a >= cost))
    }

    /// Every guarded breaker's calls since the last sync (now reset), also
    /// those with none: each sync brings back the shared state of all.
    pub fn breaker_news(&self, rules: &Installed) -> Vec<BreakerNews> {
        let Some(sync) = &self.sync else { return Vec::new() };
        self.guards
            .all()
            .into_iter()
            .filter(|(resource, _)| rules.rules.find(resource).is_some_and(|r| r.breaker.is_some()))
            .map(|(resource, _)| sync.take_news(resource))
            .collect()
    }
}

#[cfg(test)]
mod tests;
