//! What the decision core knows of replication: whether it is on, whether Redis
//! answers, how many replicas share the limits, and which replicated buckets
//! took units since the last sync. The replication module (the network side)
//! keeps it current; nothing here touches the network.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use super::{Engine, Installed};
use crate::limiter::{Bucket, Shared};
use crate::rules::LimitId;
use crate::store::BucketKey;
use crate::time::Timestamp;

#[derive(Debug, Default)]
pub struct ReplicaView {
    enabled: AtomicBool,
    up: AtomicBool,
    live: AtomicU32,
}

/// A replicated bucket's consumption since its last sync.
#[derive(Clone, Debug)]
pub struct Dirty {
    /// The request's resource: the bucket's hash tag in Redis.
    pub resource: String,
    pub limit: LimitId,
    pub delta: u64,
    pub touched: Timestamp,
    /// What the replicas had left in common at the last sync.
    pub available: f64,
}

/// One bucket to sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncItem {
    pub key: BucketKey,
    pub resource: String,
    pub limit: LimitId,
    pub delta: u64,
}

pub type DirtyMap = DashMap<BucketKey, Dirty, ahash::RandomState>;

impl ReplicaView {
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Release);
        self.live.store(1, Ordering::Release);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
    }

    /// Replication is on and Redis answered last time.
    pub fn up(&self) -> bool {
        self.enabled() && self.up.load(Ordering::Acquire)
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
}

impl Engine {
    pub fn replica(&self) -> &ReplicaView {
        &self.replica
    }

    /// Notes units taken (or, negative, given back) from a replicated bucket.
    pub(super) fn note_taken(&self, key: &BucketKey, resource: &str, limit: LimitId, units: i64, now: Timestamp) {
        if let Some(mut e) = self.dirty.get_mut(key) {
            e.delta = e.delta.saturating_add_signed(units);
            e.touched = now;
            return;
        }
        let mut e = self.dirty.entry(key.clone()).or_insert_with(|| Dirty {
            resource: resource.to_string(),
            limit,
            delta: 0,
            touched: now,
            available: 0.0,
        });
        e.delta = e.delta.saturating_add_signed(units);
        e.touched = now;
    }

    /// Every replicated bucket active within `active`: its consumption since the
    /// last sync (now reset), so that it is pushed and the merged state pulled.
    pub fn drain_dirty(&self, active: Duration) -> Vec<SyncItem> {
        let now = self.clock.now();
        let mut items = Vec::new();
        self.dirty.retain(|key, d| {
            let keep = d.delta > 0 || now.saturating_since(d.touched) < crate::time::duration_nanos(active);
            if keep {
                items.push(SyncItem { key: key.clone(), resource: d.resource.clone(), limit: d.limit, delta: d.delta });
                d.delta = 0;
            }
            keep
        });
        items
    }

    /// One bucket's consumption since its last sync, now reset (to push it now).
    pub fn take_dirty(&self, key: &BucketKey) -> u64 {
        self.dirty.get_mut(key).map_or(0, |mut d| std::mem::take(&mut d.delta))
    }

    /// Puts back consumption a failed sync could not push.
    pub fn restore_dirty(&self, item: &SyncItem) {
        self.note_taken(&item.key, &item.resource, item.limit, item.delta as i64, self.clock.now());
    }

    /// Replaces a replicated bucket with its lease of the merged state, then
    /// re-applies what was taken here since the state was read.
    pub fn adopt(&self, rules: &Installed, resource: &str, key: &BucketKey, shared: &Shared) {
        let Some(alg) = rules.algorithm(key.limit) else { return };
        let now = self.clock.now();
        let mut bucket = Bucket::adopt(alg, now, shared);
        if let Some(pending) = self.dirty.get(key).map(|d| d.delta).filter(|&d| d > 0) {
            bucket.force(alg, now, pending);
        }
        self.buckets.put(key.clone(), bucket, now);
        // Tracked from now on: synced while active (a sync does not count as
        // use, so an unused bucket stops being synced), its common state known.
        let mut d = self.dirty.entry(key.clone()).or_insert_with(|| Dirty {
            resource: resource.to_string(),
            limit: key.limit,
            delta: 0,
            touched: now,
            available: 0.0,
        });
        d.available = shared.available;
    }

    /// Whether a request its replicated limits denied here might fit in what
    /// the replicas have in common (more than this replica's lease).
    pub fn worth_escalating(&self, p: &super::Prepared<'_>) -> bool {
        let cost = p.cost() as f64;
        p.replicated_keys().any(|(_, k)| self.dirty.get(k).is_some_and(|d| d.available >= cost))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::engine::{EngineConfig, Request};
    use crate::rules::RuleSet;
    use crate::time::{Clock, ManualClock};

    const RULES: &str = "resources: [ { name: r, limits: [ { name: l, key: [user], algorithm: token_bucket, capacity: 10, refill_per_second: 1 } ] } ]";

    #[test]
    fn replicated_buckets_are_synced_while_used_and_dropped_when_idle() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_700_006_400)));
        let e = Engine::new(EngineConfig { max_keys: 1000 }, clock.clone());
        e.install(RuleSet::from_yaml(RULES, "t").unwrap(), RULES.into(), "t".into());
        e.replica().enable();
        let d: HashMap<String, String> = [("user".to_string(), "u1".to_string())].into();
        let rules = e.rules_full();
        for _ in 0..3 {
            e.acquire(&rules, &Request { resource: "r", descriptors: &d, cost: 1, dry_run: false }).unwrap();
        }
        let items = e.drain_dirty(Duration::from_secs(10));
        assert_eq!(items.iter().map(|i| (i.resource.as_str(), i.delta)).collect::<Vec<_>>(), [("r", 3)]);
        // The merged state leases 2 of 7 available; a sync is not a use.
        let shared = Shared { available: 7.0, lease: 2.0, ..Shared::default() };
        e.adopt(&rules, "r", &items[0].key, &shared);
        assert_eq!(
            e.buckets()
                .check(&items[0].key, rules.algorithm(items[0].key.limit).unwrap(), clock.now(), 0)
                .status
                .remaining,
            2
        );
        assert_eq!(e.drain_dirty(Duration::from_secs(10)).len(), 1, "still active");
        clock.advance(Duration::from_secs(11));
        e.adopt(&rules, "r", &items[0].key, &shared);
        assert!(e.drain_dirty(Duration::from_secs(10)).is_empty(), "idle for 11 s: no longer synced");
    }
}
