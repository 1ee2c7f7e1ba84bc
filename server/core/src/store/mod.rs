//! Every bucket, sharded in memory.
//!
//! Keys are evicted two ways: a sweep drops buckets back in their initial state
//! (forgetting them changes no answer), so memory follows active keys; and a
//! bound on the number of keys (`--max-keys`) and one on their bytes
//! (`--max-key-bytes`: a key as long as its resource and values) evict the
//! least recently used first, so that a flood of distinct keys, long or
//! short, cannot exhaust memory.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use crate::limiter::{Algorithm, Bucket, Decision};
use crate::time::Timestamp;

mod key;
mod shard;

pub use key::{BucketKey, LimitId};
use shard::Shard;

/// Shards: enough that two cores rarely meet on one lock, and small enough
/// that a sweep holds each lock only briefly. A power of two.
const SHARDS: usize = 64;

/// A store with room for fewer buckets than this is never shrunk: it is
/// small, and a steady set of keys would otherwise regrow it after each sweep.
const SHRINK_ABOVE: usize = 16 * 1024;

/// Every bucket, in shards chosen by the hash of its key. Each shard keeps
/// its buckets in one dense list, their scopes in one byte string, and a
/// hash table of positions in the list: a bucket costs its state, the bytes
/// of its scope and a few bytes of table, and the room a table keeps free
/// costs 5 bytes a slot, not the size of a bucket and its key.
pub struct Buckets {
    shards: Box<[RwLock<Shard>]>,
    hasher: ahash::RandomState,
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

// === impl Buckets ===

impl Buckets {
    /// A store holding at most `max_keys` buckets (`usize::MAX` for no bound).
    pub fn new(max_keys: usize) -> Self {
        Buckets {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            hasher: ahash::RandomState::new(),
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

    /// The hash of a key, the same as [`Shard`] computes from a bucket it holds.
    fn hash(&self, key: &BucketKey) -> u64 {
        shard::hash(&self.hasher, key.limit, key.scope.as_bytes())
    }

    /// The shard of a hash: from bits below the top seven, which the hash
    /// table inside the shard reads to tell its slots apart.
    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        &self.shards[((hash << 7) >> (64 - SHARDS.trailing_zeros())) as usize]
    }

    fn write(&self, hash: u64) -> RwLockWriteGuard<'_, Shard> {
        self.shard(hash).write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self, hash: u64) -> RwLockReadGuard<'_, Shard> {
        self.shard(hash).read().unwrap_or_else(|e| e.into_inner())
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

    /// Runs `f` on the bucket at `key`, created by `new` when there is none
    /// (and noted as created), and marks it used at `now`.
    fn upsert<T>(
        &self,
        key: &BucketKey,
        now: Timestamp,
        new: impl FnOnce() -> Bucket,
        f: impl FnOnce(&mut Bucket) -> T,
    ) -> T {
        let hash = self.hash(key);
        let mut shard = self.write(hash);
        let (out, over) = match shard.find(hash, key) {
            Some(i) => {
                let entry = shard.entry_mut(i);
                entry.touched = now;
                (f(&mut entry.bucket), false)
            }
            None => {
                let mut bucket = new();
                let out = f(&mut bucket);
                shard.insert(&self.hasher, hash, key, bucket, now);
                (out, self.count_new(key.scope.len()))
            }
        };
        // Eviction waits until the shard is released: it visits every shard.
        drop(shard);
        if over {
            self.evict_least_recently_used();
        }
        out
    }

    /// Runs `f` on the bucket at `key`, if there is one, changing nothing else.
    fn update<T>(&self, key: &BucketKey, f: impl FnOnce(&mut Bucket) -> T) -> Option<T> {
        let hash = self.hash(key);
        let mut shard = self.write(hash);
        let i = shard.find(hash, key)?;
        Some(f(&mut shard.entry_mut(i).bucket))
    }

    /// Reads the bucket at `key`, if there is one.
    fn read_bucket<T>(&self, key: &BucketKey, f: impl FnOnce(&Bucket) -> T) -> Option<T> {
        let hash = self.hash(key);
        let shard = self.read(hash);
        let i = shard.find(hash, key)?;
        Some(f(&shard.entry(i).bucket))
    }

    /// Decides `cost` on the bucket at `key`, creating it on first use.
    pub fn acquire(&self, key: BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) -> Decision {
        self.upsert(&key, now, || alg.new_bucket(now), |b| b.try_acquire(alg, now, cost))
    }

    /// Takes `cost` whether or not it fits (usage that already happened),
    /// beyond the limit if need be.
    pub fn force(&self, key: BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) {
        self.upsert(&key, now, || alg.new_bucket(now), |b| b.force(alg, now, cost));
    }

    /// Sets a bucket's state (a replica adopting the merged state), creating
    /// the key when it is not held, as `acquire` does.
    pub fn put(&self, key: BucketKey, bucket: Bucket, now: Timestamp) {
        // Taken once: by `new` for a key not held, else by the update.
        let given = std::cell::Cell::new(Some(bucket));
        let take = || given.take().expect("the bucket is put once");
        self.upsert(&key, now, take, |held| {
            if let Some(bucket) = given.take() {
                *held = bucket;
            }
        });
    }

    /// Creates the bucket at `key` with `new`'s state unless one is held
    /// there already (which is left as it is).
    pub fn put_if_absent(&self, key: BucketKey, new: impl FnOnce() -> Bucket, now: Timestamp) {
        self.upsert(&key, now, new, |_| ());
    }

    /// Forgets one bucket.
    pub fn remove(&self, key: &BucketKey) {
        let hash = self.hash(key);
        let mut shard = self.write(hash);
        if let Some(i) = shard.find(hash, key) {
            shard.remove(&self.hasher, hash, i);
            drop(shard);
            self.len.fetch_sub(1, Ordering::Relaxed);
            self.bytes.fetch_sub(key.scope.len(), Ordering::Relaxed);
        }
    }

    pub fn contains_key(&self, key: &BucketKey) -> bool {
        self.read_bucket(key, |_| ()).is_some()
    }

    /// The decision `acquire` would make, changing nothing (not even creating).
    pub fn check(&self, key: &BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) -> Decision {
        match self.read_bucket(key, |b| b.check(alg, now, cost)) {
            Some(decision) => decision,
            None => alg.new_bucket(now).check(alg, now, cost),
        }
    }

    /// What the balance at `key` holds (below 0: owes); `None` when the
    /// store holds no balance there (never topped up nor charged, or not
    /// kept: a store full of balances has no room for another).
    pub fn balance_units(&self, key: &BucketKey) -> Option<i64> {
        self.read_bucket(key, |b| match b {
            Bucket::Balance(b) => Some(b.units()),
            _ => None,
        })
        .flatten()
    }

    /// Gives back what an `acquire` at the same `now` took.
    pub fn refund(&self, key: &BucketKey, alg: &Algorithm, now: Timestamp, cost: u64) {
        self.update(key, |b| b.refund(alg, now, cost));
    }

    /// See [`Limiter::give_back`](crate::limiter::Limiter::give_back).
    pub fn give_back(&self, key: &BucketKey, alg: &Algorithm, now: Timestamp, taken_at: Timestamp, cost: u64) {
        self.update(key, |b| b.give_back(alg, now, taken_at, cost));
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

    /// Buckets the store has room for without growing.
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.read().unwrap_or_else(|e| e.into_inner()).capacity()).sum()
    }

    /// Drops every bucket back in its initial state, and every bucket whose
    /// limit no longer exists (`algorithm` answers `None`). Returns how many.
    pub fn sweep<'a>(&self, now: Timestamp, algorithm: impl Fn(LimitId) -> Option<&'a Algorithm>) -> usize {
        // A poisoned lock guards nothing broken: it holds no data.
        let _scanning = self.scanning.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (mut removed, mut bytes) = (0, 0);
        for shard in self.shards.iter() {
            let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
            let (r, b) = shard
                .retain(&self.hasher, |limit, bucket| algorithm(limit).is_some_and(|alg| !bucket.is_idle(alg, now)));
            removed += r;
            bytes += b;
        }
        self.forget(removed, bytes);
        // A store sized for a burst of keys stays that size when they go:
        // shrink it once it is mostly empty, so that the memory comes back.
        // Each shard is shrunk under its own lock, one at a time.
        if removed > 0 && self.capacity() > SHRINK_ABOVE.max(4 * self.len()) {
            for shard in self.shards.iter() {
                shard.write().unwrap_or_else(|e| e.into_inner()).shrink(&self.hasher);
            }
        }
        removed
    }

    /// Evicts the least recently used buckets until the store is back below
    /// its bounds by 1% of them (the low-water marks), so that a flood of new
    /// keys pays for a scan once per many inserts. The key just created is a
    /// candidate like the others: it is the most recently used, so it goes
    /// only when nothing else may (a store full of credits refuses a new
    /// balance this way). One thread evicts at a time, and never during a
    /// sweep; the others go on.
    ///
    /// The counts are read again for each removal, not only before the scan:
    /// keys created or removed meanwhile change what is needed. A key
    /// touched since the scan saw it is no longer among the oldest and is
    /// kept.
    fn evict_least_recently_used(&self) {
        // A poisoned lock guards nothing broken (it holds no data): an
        // eviction after a panic elsewhere still runs, or the bound is lost.
        let _scanning = match self.scanning.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let low_keys = self.max_keys - self.max_keys / 100;
        let low_bytes = self.max_bytes - self.max_bytes / 100;
        let (keys, bytes) = (self.len(), self.bytes());
        let mean = (bytes / keys.max(1)).max(1);
        let batch = keys.saturating_sub(low_keys).max(bytes.saturating_sub(low_bytes).div_ceil(mean)).max(1);
        // The `batch` oldest, kept in a max-heap on `touched`.
        let mut oldest: BinaryHeap<(Timestamp, BucketKey)> = BinaryHeap::with_capacity(batch + 1);
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|e| e.into_inner());
            for (limit, scope, entry) in shard.iter() {
                // Credits an operator topped up are never evicted: only a
                // top-up (the admin role) makes them, so they are as many
                // as it made. A balance in debt may be: forgetting it is
                // the owed units' loss.
                if matches!(&entry.bucket, Bucket::Balance(b) if b.units() > 0) {
                    continue;
                }
                let touched = entry.touched;
                if oldest.len() < batch {
                    oldest.push((touched, BucketKey::from_scope(limit, scope)));
                } else if oldest.peek().is_some_and(|(t, _)| touched < *t) {
                    oldest.pop();
                    oldest.push((touched, BucketKey::from_scope(limit, scope)));
                }
            }
        }
        for (touched, key) in oldest.into_sorted_vec() {
            if self.len() <= low_keys && self.bytes() <= low_bytes {
                break;
            }
            let hash = self.hash(&key);
            let mut shard = self.write(hash);
            if let Some(i) = shard.find(hash, &key).filter(|&i| shard.entry(i).touched == touched) {
                shard.remove(&self.hasher, hash, i);
                drop(shard);
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
