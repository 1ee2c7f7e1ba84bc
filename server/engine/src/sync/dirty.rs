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
    /// Units taken here in all, net (never reset): a sync notes it when it
    /// goes out, and on its reply re-applies what was taken since. Redis
    /// keeps the last total it applied, so a push is never counted twice.
    taken: i64,
    /// When this count of `taken` started (us): a bucket forgotten and used
    /// again counts from 0 in a new epoch.
    epoch: u64,
    /// The newest merged state adopted (its sequence in Redis): an older
    /// reply that arrives later is not adopted over it.
    seq: u64,
    /// A sync of this bucket is out: no other goes until it lands, since a
    /// merged state Redis computed before the other's push arrived would
    /// not count it.
    flying: bool,
    touched: Timestamp,
    /// What the replicas had left in common at the last sync, and when.
    available: f64,
    synced_at: Timestamp,
}

impl Dirty {
    fn new(resource: &str, limit: LimitId, touched: Timestamp, synced_at: Timestamp) -> Dirty {
        Dirty {
            resource: resource.to_string(),
            limit,
            delta: 0,
            taken: 0,
            seq: 0,
            flying: false,
            epoch: touched.as_nanos() / 1000,
            touched,
            available: 0.0,
            synced_at,
        }
    }

    /// The sync item for this bucket, its consumption now reset; the bucket
    /// is flying until it lands.
    fn item(&mut self, key: &BucketKey, hold: u64) -> SyncItem {
        self.flying = true;
        SyncItem {
            key: key.clone(),
            resource: self.resource.clone(),
            limit: self.limit,
            delta: std::mem::take(&mut self.delta),
            hold,
            mark: self.taken,
            epoch: self.epoch,
        }
    }
}

/// What a replica last knew of a bucket: how much was available, and when.
#[derive(Clone, Debug, PartialEq)]
pub struct Known {
    pub key: BucketKey,
    pub limit: LimitId,
    pub available: f64,
    pub at: Timestamp,
    /// For a strict bucket, the Redis time (us) of the answer that gave the
    /// figure, and the resource's marker token then. Every change to a
    /// strict bucket goes through Redis, so the most recent answer any
    /// replica had is the bucket's true state then, and a restore keeps the
    /// most recent figure rather than the lowest, among figures given under
    /// one token (a figure given after a loss, before every replica that
    /// knew the bucket restored it, may lack what they knew).
    pub strict_at: Option<(i64, String)>,
}

/// A replicated bucket no longer in use, dropped from the ones synced.
#[derive(Clone, Debug)]
pub(super) struct Forgotten {
    pub key: BucketKey,
    pub resource: String,
    /// What the replicas had available in common at its last sync, and
    /// when; `None` if it was never synced.
    pub last: Option<(f64, Timestamp)>,
}

/// One bucket to sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncItem {
    pub key: BucketKey,
    pub resource: String,
    pub limit: LimitId,
    /// Units to push; negative gives back.
    pub delta: i64,
    /// What this replica could still admit from the bucket it decides from
    /// as the sync went out: Redis keeps at least that much reserved for it
    /// until its next sync, since it may admit that much before the reply.
    pub hold: u64,
    /// [`Dirty::taken`] as the sync went out, and its epoch.
    pub mark: i64,
    pub epoch: u64,
}

#[derive(Debug, Default)]
pub(super) struct DirtyBuckets {
    map: DashMap<BucketKey, Dirty, ahash::RandomState>,
}

impl DirtyBuckets {
    /// Notes units taken (or, negative, given back) from a replicated bucket.
    pub(super) fn note(&self, key: &BucketKey, resource: &str, limit: LimitId, units: i64, now: Timestamp) {
        self.add(key, resource, limit, units, units, now);
    }

    /// Puts back consumption a sync could not push (it was taken already).
    pub(super) fn put_back(&self, key: &BucketKey, resource: &str, limit: LimitId, units: i64, now: Timestamp) {
        self.add(key, resource, limit, units, 0, now);
    }

    fn add(&self, key: &BucketKey, resource: &str, limit: LimitId, delta: i64, taken: i64, now: Timestamp) {
        let apply = |e: &mut Dirty| {
            e.delta = e.delta.saturating_add(delta);
            e.taken = e.taken.wrapping_add(taken);
            e.touched = now;
        };
        if let Some(mut e) = self.map.get_mut(key) {
            apply(&mut e);
            return;
        }
        let mut e = self.map.entry(key.clone()).or_insert_with(|| Dirty::new(resource, limit, now, Timestamp::ZERO));
        apply(&mut e);
    }

    /// Every bucket active within `active` of `now`, with its consumption
    /// (now reset) and what `hold` says it could still admit (asked before
    /// the consumption is taken); the others are forgotten, and put in
    /// `forgotten`.
    pub(super) fn drain(
        &self,
        now: Timestamp,
        active: Duration,
        hold: impl Fn(&BucketKey) -> u64,
        forgotten: &mut Vec<Forgotten>,
    ) -> Vec<SyncItem> {
        let mut items = Vec::new();
        self.map.retain(|key, d| {
            if d.flying {
                return true;
            }
            let keep = d.delta != 0 || now.saturating_since(d.touched) < duration_nanos(active);
            if keep {
                items.push(d.item(key, hold(key)));
            } else {
                let last = (d.synced_at != Timestamp::ZERO).then_some((d.available, d.synced_at));
                forgotten.push(Forgotten { key: key.clone(), resource: d.resource.clone(), last });
            }
            keep
        });
        items
    }

    /// One bucket's sync item (its consumption now reset), `hold` as for
    /// [`DirtyBuckets::drain`]; `None` while a sync of it is out.
    pub(super) fn take(&self, key: &BucketKey, resource: &str, hold: u64, now: Timestamp) -> Option<SyncItem> {
        let mut d =
            self.map.entry(key.clone()).or_insert_with(|| Dirty::new(resource, key.limit, now, Timestamp::ZERO));
        (!d.flying).then(|| d.item(key, hold))
    }

    /// The sync of `key` is over (done or failed): the next may go.
    pub(super) fn landed(&self, key: &BucketKey) {
        if let Some(mut d) = self.map.get_mut(key) {
            d.flying = false;
        }
    }

    /// Whether a merged state of sequence `seq` is newer than the last one
    /// adopted for `key` (it then is the last one).
    pub(super) fn newer(&self, key: &BucketKey, resource: &str, seq: u64, now: Timestamp) -> bool {
        let mut d = self.map.entry(key.clone()).or_insert_with(|| Dirty::new(resource, key.limit, now, now));
        if seq <= d.seq {
            return false;
        }
        d.seq = seq;
        true
    }

    /// Units taken here since [`SyncItem::mark`] `mark`.
    pub(super) fn since(&self, key: &BucketKey, mark: i64) -> i64 {
        self.map.get(key).map_or(0, |d| d.taken.wrapping_sub(mark))
    }

    /// Records what the replicas have in common after a sync; the bucket is
    /// tracked from now on (a sync is not a use, so `touched` stays).
    pub(super) fn synced(&self, key: &BucketKey, resource: &str, available: f64, now: Timestamp) {
        let mut d = self.map.entry(key.clone()).or_insert_with(|| Dirty::new(resource, key.limit, now, now));
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
            out.push(Known {
                key: e.key().clone(),
                limit: e.limit,
                available: e.available,
                at: e.synced_at,
                strict_at: None,
            });
        }
    }
}
