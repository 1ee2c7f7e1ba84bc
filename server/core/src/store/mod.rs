//! Every bucket, sharded in memory.
//!
//! Keys are evicted two ways: a sweep drops buckets back in their initial state
//! (forgetting them changes no answer), so memory follows active keys; and a
//! bound on the number of keys (`--max-keys`) and one on their bytes
//! (`--max-key-bytes`: a key as long as its resource and values) evict the
//! least recently used first, so that a flood of distinct keys, long or
//! short, cannot exhaust memory.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use crate::limiter::{Algorithm, Bucket, Decision};
use crate::time::Timestamp;

mod key;

pub use key::{BucketKey, LimitId};

/// Shards: enough that two cores rarely meet on one lock, and small enough
/// that a sweep holds each lock only briefly.
const SHARDS: usize = 64;

/// A table with room for fewer buckets than this is never shrunk: it is
/// small, and a steady set of keys would otherwise regrow it after each sweep.
const SHRINK_ABOVE: usize = 16 * 1024;

pub struct Buckets {
    map: DashMap<BucketKey, Slot, ahash::RandomState>,
    len: AtomicUsize,
    max_keys: usize,
    /// The keys' scopes, in bytes, and their bound.
    bytes: AtomicUsize,
    max_bytes: usize,
    evicting: AtomicBool,
    evicted: AtomicU64,
}

struct Slot {
    bucket: Bucket,
    /// Last time a decision touched this bucket, for LRU eviction.
    touched: Timestamp,
}

// === impl Buckets ===

impl Buckets {
    /// A store holding at most `max_keys` buckets (`usize::MAX` for no bound).
    pub fn new(max_keys: usize) -> Self {
        Buckets {
            map: DashMap::with_hasher_and_shard_amount(ahash::RandomState::new(), SHARDS),
            len: AtomicUsize::new(0),
            max_keys: max_keys.max(1),
            bytes: AtomicUsize::new(0),
            max_bytes: usize::MAX,
            evicting: AtomicBool::new(false),
            evicted: AtomicU64::new(0),
        }
    }

    /// Bounds the bytes of the keys held too (their scopes: the resource
    /// and descriptor values they are keyed on).
    pub fn set_max_bytes(&mut self, max_bytes: usize) {
        self.max_bytes = max_bytes.max(1);
    }

    /// A bucket was created under a key of `weight` bytes: evicts when a
    /// bound is passed.
    fn grew(&self, weight: usize) {
        let keys = self.len.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = self.bytes.fetch_add(weight, Ordering::Relaxed) + weight;
        if keys > self.max_keys || bytes > self.max_bytes {
            self.evict_least_recently_used();
        }
    }

    /// Decides `cost` on the bucket at `key`, creating it on first use.
    pub fn acquire(&self, key: BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) -> Decision {
        // The bytes of a key created (`None`: it was there).
        let created;
        let decision = match self.map.entry(key) {
            Entry::Occupied(mut e) => {
                created = None;
                let slot = e.get_mut();
                slot.touched = now;
                slot.bucket.try_acquire(alg, now, cost)
            }
            Entry::Vacant(e) => {
                created = Some(e.key().scope.len());
                let mut bucket = alg.new_bucket(now);
                let decision = bucket.try_acquire(alg, now, cost);
                e.insert(Slot { bucket, touched: now });
                decision
            }
        };
        if let Some(weight) = created {
            self.grew(weight);
        }
        decision
    }

    /// Takes `cost` whether or not it fits (usage that already happened),
    /// beyond the limit if need be.
    pub fn force(&self, key: BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) {
        let created = match self.map.entry(key) {
            Entry::Occupied(mut e) => {
                let slot = e.get_mut();
                slot.touched = now;
                slot.bucket.force(alg, now, cost);
                None
            }
            Entry::Vacant(e) => {
                let weight = e.key().scope.len();
                let mut bucket = alg.new_bucket(now);
                bucket.force(alg, now, cost);
                e.insert(Slot { bucket, touched: now });
                Some(weight)
            }
        };
        if let Some(weight) = created {
            self.grew(weight);
        }
    }

    /// Sets a bucket's state (a replica adopting the merged state).
    pub fn put(&self, key: BucketKey, bucket: Bucket, now: Timestamp) {
        let weight = key.scope.len();
        if self.map.insert(key, Slot { bucket, touched: now }).is_none() {
            self.grew(weight);
        }
    }

    /// Forgets one bucket.
    pub fn remove(&self, key: &BucketKey) {
        if self.map.remove(key).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
            self.bytes.fetch_sub(key.scope.len(), Ordering::Relaxed);
        }
    }

    pub fn contains_key(&self, key: &BucketKey) -> bool {
        self.map.contains_key(key)
    }

    /// The decision `acquire` would make, changing nothing (not even creating).
    pub fn check(&self, key: &BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) -> Decision {
        match self.map.get(key) {
            Some(slot) => slot.bucket.check(alg, now, cost),
            None => alg.new_bucket(now).check(alg, now, cost),
        }
    }

    /// What the balance at `key` holds (below 0: owes); `None` when the
    /// store holds no balance there (never topped up nor charged, or not
    /// kept: a store full of balances has no room for another).
    pub fn balance_units(&self, key: &BucketKey) -> Option<i64> {
        match self.map.get(key).as_deref().map(|slot| &slot.bucket) {
            Some(Bucket::Balance(b)) => Some(b.units()),
            _ => None,
        }
    }

    /// Gives back what an `acquire` at the same `now` took.
    pub fn refund(&self, key: &BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) {
        if let Some(mut slot) = self.map.get_mut(key) {
            slot.bucket.refund(alg, now, cost);
        }
    }

    /// See [`Limiter::give_back`](crate::limiter::Limiter::give_back).
    pub fn give_back(&self, key: &BucketKey, alg: &Algorithm, now: Timestamp, taken_at: Timestamp, cost: u64) {
        if let Some(mut slot) = self.map.get_mut(key) {
            slot.bucket.give_back(alg, now, taken_at, cost);
        }
    }

    /// Buckets held now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Bytes of the keys held now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Buckets evicted so far, idle or least recently used.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Drops every bucket back in its initial state, and every bucket whose
    /// limit no longer exists (`algorithm` answers `None`). Returns how many.
    pub fn sweep<'a>(&self, now: Timestamp, algorithm: impl Fn(LimitId) -> Option<&'a Algorithm>) -> usize {
        let (mut removed, mut bytes) = (0, 0);
        self.map.retain(|key, slot| {
            let keep = algorithm(key.limit).is_some_and(|alg| !slot.bucket.is_idle(alg, now));
            if !keep {
                removed += 1;
                bytes += key.scope.len();
            }
            keep
        });
        self.forget(removed, bytes);
        // A table sized for a burst of keys stays that size when they go:
        // shrink it once it is mostly empty, so that the memory comes back.
        // Each shard is rehashed under its own lock, one at a time.
        if removed > 0 && self.map.capacity() > SHRINK_ABOVE.max(4 * self.len()) {
            self.map.shrink_to_fit();
        }
        removed
    }

    /// Evicts a batch of the least recently used buckets: the excess over
    /// `max_keys`, or as many keys of the mean size as the excess over
    /// `max_bytes`, and at least 1% of those held so that a flood of new keys
    /// pays for a scan once per many inserts. One thread evicts at a time;
    /// the others go on.
    fn evict_least_recently_used(&self) {
        if self.evicting.swap(true, Ordering::Acquire) {
            return;
        }
        let (keys, bytes) = (self.len(), self.bytes());
        let excess = keys.saturating_sub(self.max_keys);
        let mean = (bytes / keys.max(1)).max(1);
        let excess_bytes = bytes.saturating_sub(self.max_bytes).div_ceil(mean);
        let batch = excess.max(excess_bytes).max(keys / 100).max(1);
        // The `batch` oldest, kept in a max-heap on `touched`.
        let mut oldest: BinaryHeap<(Timestamp, BucketKey)> = BinaryHeap::with_capacity(batch + 1);
        for entry in self.map.iter() {
            // Credits an operator topped up are never evicted: only a top-up
            // (the admin role) makes them, so they are as many as it made.
            // A balance in debt may be: forgetting it is the owed units' loss.
            if matches!(&entry.value().bucket, Bucket::Balance(b) if b.units() > 0) {
                continue;
            }
            let touched = entry.value().touched;
            if oldest.len() < batch {
                oldest.push((touched, entry.key().clone()));
            } else if oldest.peek().is_some_and(|(t, _)| touched < *t) {
                oldest.pop();
                oldest.push((touched, entry.key().clone()));
            }
        }
        let (mut removed, mut bytes) = (0, 0);
        for (_, key) in oldest {
            if self.map.remove(&key).is_some() {
                removed += 1;
                bytes += key.scope.len();
            }
        }
        self.forget(removed, bytes);
        self.evicting.store(false, Ordering::Release);
    }

    fn forget(&self, removed: usize, bytes: usize) {
        self.len.fetch_sub(removed, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.evicted.fetch_add(removed as u64, Ordering::Relaxed);
    }

    #[cfg(test)]
    fn contains(&self, key: &BucketKey) -> bool {
        self.contains_key(key)
    }
}

#[cfg(test)]
mod tests;
