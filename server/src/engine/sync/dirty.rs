//! Replicated buckets' consumption since their last sync.

use std::time::Duration;

use dashmap::DashMap;

use crate::store::BucketKey;
use crate::store::LimitId;
use crate::time::{Timestamp, duration_nanos};

/// One replicated bucket's consumption since its last sync.
#[derive(Clone, Debug)]
struct Dirty {
    /// The request's resource: the bucket's hash tag in Redis.
    resource: String,
    limit: LimitId,
    /// Units taken since the last sync; negative when more was given back
    /// (a settled estimate) than taken.
    delta: i64,
    touched: Timestamp,
    /// What the replicas had left in common at the last sync, and when.
    available: f64,
    synced_at: Timestamp,
}

/// What a replica last knew of a bucket: how much was available, and when.
#[derive(Clone, Debug, PartialEq)]
pub struct Known {
    pub key: BucketKey,
    pub limit: LimitId,
    pub available: f64,
    pub at: Timestamp,
}

/// One bucket to sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncItem {
    pub key: BucketKey,
    pub resource: String,
    pub limit: LimitId,
    /// Units to push; negative gives back.
    pub delta: i64,
}

#[derive(Debug, Default)]
pub(super) struct DirtyBuckets {
    map: DashMap<BucketKey, Dirty, ahash::RandomState>,
}

impl DirtyBuckets {
    /// Notes units taken (or, negative, given back) from a replicated bucket.
    pub(super) fn note(&self, key: &BucketKey, resource: &str, limit: LimitId, units: i64, now: Timestamp) {
        if let Some(mut e) = self.map.get_mut(key) {
            e.delta = e.delta.saturating_add(units);
            e.touched = now;
            return;
        }
        let mut e = self.map.entry(key.clone()).or_insert_with(|| Dirty {
            resource: resource.to_string(),
            limit,
            delta: 0,
            touched: now,
            available: 0.0,
            synced_at: Timestamp::ZERO,
        });
        e.delta = e.delta.saturating_add(units);
        e.touched = now;
    }

    /// Every bucket active within `active` of `now`, with its consumption
    /// (now reset); the others are forgotten.
    pub(super) fn drain(&self, now: Timestamp, active: Duration) -> Vec<SyncItem> {
        let mut items = Vec::new();
        self.map.retain(|key, d| {
            let keep = d.delta != 0 || now.saturating_since(d.touched) < duration_nanos(active);
            if keep {
                items.push(SyncItem { key: key.clone(), resource: d.resource.clone(), limit: d.limit, delta: d.delta });
                d.delta = 0;
            }
            keep
        });
        items
    }

    /// One bucket's consumption, now reset.
    pub(super) fn take(&self, key: &BucketKey) -> i64 {
        self.map.get_mut(key).map_or(0, |mut d| std::mem::take(&mut d.delta))
    }

    /// Consumption not yet pushed for `key`.
    pub(super) fn pending(&self, key: &BucketKey) -> i64 {
        self.map.get(key).map_or(0, |d| d.delta)
    }

    /// Records what the replicas have in common after a sync; the bucket is
    /// tracked from now on (a sync is not a use, so `touched` stays).
    pub(super) fn synced(&self, key: &BucketKey, resource: &str, available: f64, now: Timestamp) {
        let mut d = self.map.entry(key.clone()).or_insert_with(|| Dirty {
            resource: resource.to_string(),
            limit: key.limit,
            delta: 0,
            touched: now,
            available: 0.0,
            synced_at: now,
        });
        d.available = available;
        d.synced_at = now;
    }

    /// What the replicas had in common at the last sync of `key`.
    pub(super) fn available(&self, key: &BucketKey) -> Option<f64> {
        self.map.get(key).map(|d| d.available)
    }

    /// What this replica knew of a resource's synced buckets, to restore.
    pub(super) fn known_of(&self, resource: &str, out: &mut Vec<Known>) {
        for e in self.map.iter().filter(|e| e.resource == resource && e.synced_at != Timestamp::ZERO) {
            out.push(Known { key: e.key().clone(), limit: e.limit, available: e.available, at: e.synced_at });
        }
    }
}
