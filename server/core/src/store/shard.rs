//! One shard of the store: its buckets in a dense list, their scopes in one
//! byte string, and a hash table of positions in the list.
//!
//! A hash table keeps free slots (up to half of them, just after it grew).
//! Here a free slot costs the table's 5 bytes (a 4-byte position and a
//! control byte), not a whole bucket with its key, and the list and the
//! string hold only what is there: memory follows the keys held.
//!
//! Removing a bucket moves the last one of the list into its place (its
//! position in the table is updated), and leaves its scope's bytes unused in
//! the string until they are many: then the string is written again with the
//! live scopes only.

use hashbrown::HashTable;

use super::LimitId;
use super::key::BucketKey;
use crate::limiter::Bucket;
use crate::time::Timestamp;

/// Unused scope bytes are reclaimed once they are more than this and more
/// than the live ones.
const RECLAIM_ABOVE: usize = 4096;

/// A bucket and what the store keeps with it.
pub(super) struct Entry {
    pub bucket: Bucket,
    /// Last time a decision touched this bucket, for LRU eviction.
    pub touched: Timestamp,
    limit: LimitId,
    /// Where its scope starts in `Shard::scopes`.
    scope: u32,
}

#[derive(Default)]
pub(super) struct Shard {
    /// The position in `entries` of each bucket, by the hash of its key.
    positions: HashTable<u32>,
    entries: Vec<Entry>,
    /// Each entry's scope: its length (LEB128), then its bytes.
    scopes: Vec<u8>,
    /// Bytes of `scopes` that no entry uses any more.
    unused: usize,
}

/// The hash of a bucket's key, from its limit and its scope's bytes.
pub(super) fn hash(hasher: &ahash::RandomState, limit: LimitId, scope: &[u8]) -> u64 {
    hasher.hash_one((limit.0, scope))
}

/// The scope stored at `at`.
fn scope_at(scopes: &[u8], at: u32) -> &[u8] {
    let (mut len, mut shift, mut i) = (0usize, 0, at as usize);
    loop {
        let byte = scopes[i];
        i += 1;
        len |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    &scopes[i..i + len]
}

/// Appends a scope; where it starts.
fn push_scope(scopes: &mut Vec<u8>, scope: &[u8]) -> u32 {
    let at = u32::try_from(scopes.len()).expect("a shard holds less than 4 GiB of scopes");
    let mut len = scope.len();
    while len >= 0x80 {
        scopes.push((len & 0x7f) as u8 | 0x80);
        len >>= 7;
    }
    scopes.push(len as u8);
    scopes.extend_from_slice(scope);
    at
}

/// The bytes a scope takes in the string, its length included.
fn stored_len(scope: &[u8]) -> usize {
    let mut prefix = 1;
    let mut len = scope.len() >> 7;
    while len > 0 {
        prefix += 1;
        len >>= 7;
    }
    prefix + scope.len()
}

impl Shard {
    /// The position of the bucket at `key` (whose hash is `hash`).
    pub fn find(&self, hash: u64, key: &BucketKey) -> Option<usize> {
        let (entries, scopes) = (&self.entries, &self.scopes);
        let found = self.positions.find(hash, |&i| {
            let e = &entries[i as usize];
            e.limit == key.limit && scope_at(scopes, e.scope) == key.scope.as_bytes()
        });
        found.map(|&i| i as usize)
    }

    pub fn entry(&self, i: usize) -> &Entry {
        &self.entries[i]
    }

    pub fn entry_mut(&mut self, i: usize) -> &mut Entry {
        &mut self.entries[i]
    }

    /// Buckets the shard has room for without growing its table.
    pub fn capacity(&self) -> usize {
        self.positions.capacity()
    }

    /// Every bucket, with its limit and scope.
    pub fn iter(&self) -> impl Iterator<Item = (LimitId, &str, &Entry)> {
        self.entries.iter().map(|e| (e.limit, scope_str(&self.scopes, e.scope), e))
    }

    /// Adds a bucket the shard does not hold.
    pub fn insert(&mut self, hasher: &ahash::RandomState, hash: u64, key: &BucketKey, bucket: Bucket, now: Timestamp) {
        let i = u32::try_from(self.entries.len()).expect("a shard holds less than 4 billion buckets");
        let scope = push_scope(&mut self.scopes, key.scope.as_bytes());
        self.entries.push(Entry { bucket, touched: now, limit: key.limit, scope });
        let (entries, scopes) = (&self.entries, &self.scopes);
        self.positions.insert_unique(hash, i, |&j| rehash(hasher, entries, scopes, j));
    }

    /// Removes the bucket at position `i`, whose key's hash is `hash`.
    pub fn remove(&mut self, hasher: &ahash::RandomState, hash: u64, i: usize) {
        if let Ok(slot) = self.positions.find_entry(hash, |&j| j as usize == i) {
            slot.remove();
        }
        let gone = self.entries.swap_remove(i);
        self.unused += stored_len(scope_at(&self.scopes, gone.scope));
        // The last bucket moved into position `i`.
        if i < self.entries.len() {
            let last = self.entries.len() as u32;
            let moved = rehash(hasher, &self.entries, &self.scopes, i as u32);
            if let Some(position) = self.positions.find_mut(moved, |&j| j == last) {
                *position = i as u32;
            }
        }
        if self.unused > RECLAIM_ABOVE && self.unused * 2 > self.scopes.len() {
            self.rewrite_scopes();
        }
    }

    /// Keeps the buckets for which `keep` is true; how many were removed, and
    /// the bytes of their scopes.
    pub fn retain(
        &mut self,
        hasher: &ahash::RandomState,
        mut keep: impl FnMut(LimitId, &Bucket) -> bool,
    ) -> (usize, usize) {
        let gone: Vec<usize> =
            (0..self.entries.len()).filter(|&i| !keep(self.entries[i].limit, &self.entries[i].bucket)).collect();
        let bytes: usize = gone.iter().map(|&i| scope_at(&self.scopes, self.entries[i].scope).len()).sum();
        if gone.len() * 8 < self.entries.len() {
            // A few: each is removed (from the last, so that a bucket moved
            // into a freed position is never one still to remove).
            for &i in gone.iter().rev() {
                let e = &self.entries[i];
                let hash = hash(hasher, e.limit, scope_at(&self.scopes, e.scope));
                self.remove(hasher, hash, i);
            }
        } else if !gone.is_empty() {
            // Many: the list is filtered and the table and string rebuilt.
            let mut n = 0;
            self.entries.retain(|_| {
                let kept = gone.binary_search(&n).is_err();
                n += 1;
                kept
            });
            self.rewrite_scopes();
            self.reindex(hasher);
        }
        (gone.len(), bytes)
    }

    /// Gives the memory of a shard that holds far fewer buckets than it
    /// has room for back.
    pub fn shrink(&mut self, hasher: &ahash::RandomState) {
        self.rewrite_scopes();
        self.scopes.shrink_to_fit();
        self.entries.shrink_to_fit();
        let (entries, scopes) = (&self.entries, &self.scopes);
        self.positions.shrink_to_fit(|&j| rehash(hasher, entries, scopes, j));
    }

    /// Writes the scopes again, the live ones only, in the list's order.
    fn rewrite_scopes(&mut self) {
        let live: usize = self.entries.iter().map(|e| stored_len(scope_at(&self.scopes, e.scope))).sum();
        let mut scopes = Vec::with_capacity(live);
        for e in &mut self.entries {
            e.scope = push_scope(&mut scopes, scope_at(&self.scopes, e.scope));
        }
        self.scopes = scopes;
        self.unused = 0;
    }

    /// Rebuilds the table from the list.
    fn reindex(&mut self, hasher: &ahash::RandomState) {
        self.positions.clear();
        let (entries, scopes) = (&self.entries, &self.scopes);
        for i in 0..entries.len() as u32 {
            let hash = rehash(hasher, entries, scopes, i);
            self.positions.insert_unique(hash, i, |&j| rehash(hasher, entries, scopes, j));
        }
    }
}

/// The hash of the bucket at position `i`.
fn rehash(hasher: &ahash::RandomState, entries: &[Entry], scopes: &[u8], i: u32) -> u64 {
    let e = &entries[i as usize];
    hash(hasher, e.limit, scope_at(scopes, e.scope))
}

/// A scope as text: it was stored from a `str`.
fn scope_str(scopes: &[u8], at: u32) -> &str {
    std::str::from_utf8(scope_at(scopes, at)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_of_every_length_read_back() {
        let mut scopes = Vec::new();
        let texts: Vec<String> = [0usize, 1, 127, 128, 300, 16_384, 20_000].iter().map(|&n| "x".repeat(n)).collect();
        let at: Vec<u32> = texts.iter().map(|t| push_scope(&mut scopes, t.as_bytes())).collect();
        for (t, at) in texts.iter().zip(at) {
            assert_eq!(scope_at(&scopes, at), t.as_bytes());
            assert_eq!(
                stored_len(t.as_bytes()),
                t.len()
                    + if t.len() < 128 {
                        1
                    } else if t.len() < 16_384 {
                        2
                    } else {
                        3
                    }
            );
        }
        assert_eq!(scopes.len(), texts.iter().map(|t| stored_len(t.as_bytes())).sum::<usize>());
    }
}
