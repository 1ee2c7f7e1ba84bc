//! What a replica remembers of buckets it no longer uses.
//!
//! A replica keeps a replicated bucket only while it is in use (about ten
//! seconds) and a strict bucket's last figure for ten minutes. A bucket that
//! stays used up for an hour is still worth knowing about after that: if
//! Redis loses its data or goes back to an older copy while nobody uses the
//! bucket, the next call must not find it full. So when a replica stops
//! keeping a bucket, it remembers what was available and when, until the
//! bucket would be full again anyway (twice its limit's window: a sliding
//! window still counts the window before). A restore then puts back what it
//! remembers, however long ago the bucket was last used.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

use super::Known;
use crate::store::BucketKey;
use crate::time::Timestamp;

/// How many buckets one replica remembers at most. Each costs about a
/// hundred bytes, so the cap is about 100 MB; past it, buckets are not
/// remembered (and counted), and a data loss then may find them full.
pub const MAX_REMEMBERED: usize = 1_000_000;

#[derive(Clone, Debug)]
struct Fact {
    available: f64,
    at: Timestamp,
    /// After this instant the bucket would be full again: nothing to keep.
    until: Timestamp,
    /// A strict bucket's Redis time of the figure (see [`Known::strict_at`]).
    strict_at: Option<(i64, String)>,
}

/// Buckets a replica no longer uses, by resource (a restore runs per
/// resource).
#[derive(Debug, Default)]
pub(super) struct Memory {
    by_resource: DashMap<String, HashMap<BucketKey, Fact>, ahash::RandomState>,
    count: AtomicUsize,
}

impl Memory {
    /// Remembers that `key` had `available` units at `at`, until `until`.
    /// False when the memory is full and the bucket was not remembered.
    pub(super) fn remember(
        &self,
        resource: &str,
        key: &BucketKey,
        available: f64,
        at: Timestamp,
        until: Timestamp,
        strict_at: Option<(i64, String)>,
    ) -> bool {
        let mut facts = self.by_resource.entry(resource.to_string()).or_default();
        let fact = Fact { available, at, until, strict_at };
        if let Some(old) = facts.get_mut(key) {
            *old = fact;
            return true;
        }
        if self.count.load(Ordering::Relaxed) >= MAX_REMEMBERED {
            return false;
        }
        facts.insert(key.clone(), fact);
        self.count.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// What is remembered of `resource`'s buckets, except those already in
    /// `out` (a figure from a bucket in use is newer).
    pub(super) fn known_of(&self, resource: &str, out: &mut Vec<Known>) {
        let Some(facts) = self.by_resource.get(resource) else { return };
        for (key, fact) in facts.iter() {
            if !out.iter().any(|k| &k.key == key) {
                out.push(Known {
                    key: key.clone(),
                    limit: key.limit,
                    available: fact.available,
                    at: fact.at,
                    strict_at: fact.strict_at.clone(),
                });
            }
        }
    }

    /// Whether anything is remembered of `resource`.
    pub(super) fn knows(&self, resource: &str) -> bool {
        self.by_resource.contains_key(resource)
    }

    /// Forgets the buckets that are full again by `now`.
    pub(super) fn forget(&self, now: Timestamp) {
        let mut dropped = 0;
        self.by_resource.retain(|_, facts| {
            let before = facts.len();
            facts.retain(|_, f| now < f.until);
            dropped += before - facts.len();
            !facts.is_empty()
        });
        self.count.fetch_sub(dropped, Ordering::Relaxed);
    }

    pub(super) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LimitId;

    fn key(n: u32) -> BucketKey {
        BucketKey::new(LimitId(n), std::iter::empty::<&str>())
    }

    #[test]
    fn a_remembered_bucket_is_known_until_it_would_be_full_again() {
        let m = Memory::default();
        let t = |s: u64| Timestamp::from_nanos(s * 1_000_000_000);
        assert!(m.remember("r", &key(1), 5.0, t(10), t(100), Some((7, "t".into()))));
        let mut out = Vec::new();
        m.known_of("r", &mut out);
        assert_eq!(
            out,
            vec![Known { key: key(1), limit: LimitId(1), available: 5.0, at: t(10), strict_at: Some((7, "t".into())) }]
        );
        m.forget(t(99));
        assert!(m.knows("r"));
        m.forget(t(100));
        assert!(!m.knows("r"));
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn a_bucket_in_use_wins_over_what_is_remembered_of_it() {
        let m = Memory::default();
        let t = Timestamp::from_nanos(1);
        m.remember("r", &key(1), 5.0, t, Timestamp::from_nanos(u64::MAX), None);
        let newer = Known { key: key(1), limit: LimitId(1), available: 2.0, at: t, strict_at: None };
        let mut out = vec![newer.clone()];
        m.known_of("r", &mut out);
        assert_eq!(out, vec![newer]);
    }
}
