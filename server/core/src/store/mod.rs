//! Every bucket, sharded in memory.
//!
//! Keys are evicted two ways: a sweep drops buckets back in their initial state
//! (forgetting them changes no answer), so memory follows active keys; and a
//! bound on the number of keys (`--max-keys`) and one on their bytes
//! (`--max-key-bytes`: a key as long as its resource and values) evict the
//! least recently used first, so that a flood of distinct keys, long or
//! short, cannot exhaust memory.

use std::collections::BinaryHeap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
    /// Held by the sweep and by an eviction, so that they never run at
    /// once: an eviction scanning while a sweep empties the store would see
    /// only the few keys left, busy ones, and take them for the oldest.
    scanning: Mutex<()>,
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
            scanning: Mutex::new(()),
            evicted: AtomicU64::new(0),
        }
    }

    /// Bounds the bytes of the keys held too (their scopes: the resource
    /// and descriptor values they are keyed on).
    pub fn set_max_bytes(&mut self, max_bytes: usize) {
        self.max_bytes = max_bytes.max(1);
    }

    /// Counts a bucket about to be created under a key of `weight` bytes,
    /// and answers whether a bound is passed. The caller counts while it
    /// still holds the key's shard, before the bucket can be seen: a sweep or
    /// an eviction that removes the bucket then always subtracts after this
    /// adds. (Counted after, a removal in between took the count below zero
    /// for a moment; it wrapped round to billions of keys, and the eviction
    /// that followed forgot every key, busy ones too.)
    fn count_new(&self, weight: usize) -> bool {
        let keys = self.len.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = self.bytes.fetch_add(weight, Ordering::Relaxed) + weight;
        keys > self.max_keys || bytes > self.max_bytes
    }

    /// Decides `cost` on the bucket at `key`, creating it on first use.
    pub fn acquire(&self, key: BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) -> Decision {
        // Whether a key was created past a bound. Eviction waits until the
        // shard is released: it visits every shard.
        let over;
        let decision = match self.map.entry(key) {
            Entry::Occupied(mut e) => {
                over = None;
                let slot = e.get_mut();
                slot.touched = now;
                slot.bucket.try_acquire(alg, now, cost)
            }
            Entry::Vacant(e) => {
                over = self.count_new(e.key().scope.len()).then(|| e.key().clone());
                let mut bucket = alg.new_bucket(now);
                let decision = bucket.try_acquire(alg, now, cost);
                e.insert(Slot { bucket, touched: now });
                decision
            }
        };
        if let Some(created) = over {
            self.evict_least_recently_used(&created);
        }
        decision
    }

    /// Takes `cost` whether or not it fits (usage that already happened),
    /// beyond the limit if need be.
    pub fn force(&self, key: BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) {
        let over = match self.map.entry(key) {
            Entry::Occupied(mut e) => {
                let slot = e.get_mut();
                slot.touched = now;
                slot.bucket.force(alg, now, cost);
                None
            }
            Entry::Vacant(e) => {
                let over = self.count_new(e.key().scope.len()).then(|| e.key().clone());
                let mut bucket = alg.new_bucket(now);
                bucket.force(alg, now, cost);
                e.insert(Slot { bucket, touched: now });
                over
            }
        };
        if let Some(created) = over {
            self.evict_least_recently_used(&created);
        }
    }

    /// Sets a bucket's state (a replica adopting the merged state).
    pub fn put(&self, key: BucketKey, bucket: Bucket, now: Timestamp) {
        let over = match self.map.entry(key) {
            Entry::Occupied(mut e) => {
                *e.get_mut() = Slot { bucket, touched: now };
                None
            }
            Entry::Vacant(e) => {
                let over = self.count_new(e.key().scope.len()).then(|| e.key().clone());
                e.insert(Slot { bucket, touched: now });
                over
            }
        };
        if let Some(created) = over {
            self.evict_least_recently_used(&created);
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
        // A poisoned lock guards nothing broken: it holds no data.
        let _scanning = self.scanning.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
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

    /// Evicts the least recently used buckets until the store is back below
    /// its bounds by 1% of them (the low-water marks), so that a flood of new
    /// keys pays for a scan once per many inserts. `spare` (the key whose
    /// creation passed a bound) is never chosen: a key longer than the bytes
    /// bound is held alone rather than forgotten at once, which would leave
    /// its limit never applied. One thread evicts at a time, and never during a
    /// sweep; the others go on.
    ///
    /// The counts are read again for each removal, not only before the scan:
    /// a sweep running at the same time may have emptied the store, and the
    /// few busy keys left would then be the oldest ones seen. A key touched
    /// since the scan saw it is no longer among the oldest and is kept.
    fn evict_least_recently_used(&self, spare: &BucketKey) {
        let Ok(_scanning) = self.scanning.try_lock() else {
            return;
        };
        let low_keys = self.max_keys - self.max_keys / 100;
        let low_bytes = self.max_bytes - self.max_bytes / 100;
        let (keys, bytes) = (self.len(), self.bytes());
        let mean = (bytes / keys.max(1)).max(1);
        let batch = keys.saturating_sub(low_keys).max(bytes.saturating_sub(low_bytes).div_ceil(mean)).max(1);
        // The `batch` oldest, kept in a max-heap on `touched`.
        let mut oldest: BinaryHeap<(Timestamp, BucketKey)> = BinaryHeap::with_capacity(batch + 1);
        for entry in self.map.iter() {
            // Credits an operator topped up are never evicted: only a top-up
            // (the admin role) makes them, so they are as many as it made.
            // A balance in debt may be: forgetting it is the owed units' loss.
            if matches!(&entry.value().bucket, Bucket::Balance(b) if b.units() > 0) || entry.key() == spare {
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
        for (touched, key) in oldest.into_sorted_vec() {
            if self.len() <= low_keys && self.bytes() <= low_bytes {
                break;
            }
            if self.map.remove_if(&key, |_, slot| slot.touched == touched).is_some() {
                self.forget(1, key.scope.len());
            }
        }
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
