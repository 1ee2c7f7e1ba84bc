//! Leases: a client takes a share of a resource's limits for its
//! descriptors, decides its own calls from it for a short time, and returns
//! what it did not use. A lease is a reserve-then-settle (see `settle`): its
//! units are taken from every matched limit when granted, all or nothing, and
//! the unused part is given back when the holder renews or returns it. So a
//! lease never admits more than the limits hold: what leasing trades is
//! accuracy the other way (units a holder keeps and does not use are idle
//! until it returns them, or lost to the window if it never does).
//!
//! Which limits: only those the rules mark (`lease: 2s`, the longest a lease
//! of them lasts); a request matching any other limit, a breaker, a
//! concurrency limit or a shedding level is decided per call.
//!
//! How much: each holder's fair share of what is available now, among the
//! holders seen on the same bucket within two lease times; never more than it
//! asked for, never more than is available.

use std::time::Duration;

use dashmap::DashMap;
use smallvec::SmallVec;

use super::decide::{limits_for, matched_in};
use super::request::{self, Descriptors, RequestError};
use super::{Engine, Installed};
use crate::store::BucketKey;
use crate::time::Timestamp;

/// Holders remembered per bucket; beyond, the one seen longest ago goes.
pub const MAX_HOLDERS: usize = 64;
/// Buckets with holders remembered; beyond, new holders are not counted
/// until the sweep frees some (shares then come out larger, never past
/// what is available).
pub const MAX_KEYS: usize = 100_000;

/// What may be leased now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// How long the lease lasts: the shortest `lease` of the matched limits.
    pub ttl: Duration,
    /// Units to grant (0 when none are available).
    pub grant: u64,
    /// With nothing to grant: when units come back.
    pub retry_after: Duration,
    /// Holders sharing the bucket now, this one included.
    pub holders: usize,
}

/// Recent holders per bucket.
#[derive(Debug, Default)]
pub struct Leases {
    holders: DashMap<BucketKey, SmallVec<[(u64, Timestamp); 4]>, ahash::RandomState>,
}

impl Leases {
    /// Notes `holder` on `key` at `now`; how many holders were seen on it
    /// since `since`.
    fn touch(&self, key: &BucketKey, holder: u64, now: Timestamp, since: Timestamp) -> usize {
        if !self.holders.contains_key(key) && self.holders.len() >= MAX_KEYS {
            return 1;
        }
        let mut list = self.holders.entry(key.clone()).or_default();
        list.retain(|(_, seen)| *seen >= since);
        match list.iter_mut().find(|(h, _)| *h == holder) {
            Some(entry) => entry.1 = now,
            None => {
                if list.len() >= MAX_HOLDERS
                    && let Some(oldest) = list.iter().enumerate().min_by_key(|(_, (_, seen))| *seen).map(|(i, _)| i)
                {
                    list.remove(oldest);
                }
                list.push((holder, now));
            }
        }
        list.len()
    }

    /// Forgets holders not seen since `since`.
    pub(super) fn forget(&self, since: Timestamp) {
        self.holders.retain(|_, list| {
            list.retain(|(_, seen)| *seen >= since);
            !list.is_empty()
        });
    }
}

/// Why a request cannot be leased, for the client (which then asks per call).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotLeasable {
    #[error("no rule matches the resource")]
    NoRule,
    #[error("the resource has a circuit breaker: each call is decided by the server")]
    Breaker,
    #[error("the resource has a concurrency limit: each call is decided by the server")]
    Concurrency,
    #[error("the resource is shed by degradation level: each call is decided by the server")]
    Shed,
    #[error("blocked by an override for {0}")]
    Blocked(String),
    #[error("no limit applies to these descriptors")]
    NoLimit,
    #[error("limit '{0}' is in shadow mode")]
    Shadow(String),
    #[error("limit '{0}' may not be leased (no `lease:` in the rules)")]
    NotMarked(String),
}

/// The shortest time a holder told "nothing left" waits before asking again.
const MIN_ASK_AGAIN: Duration = Duration::from_millis(1);

impl Plan {
    /// What to take after taking `self.grant` (at attempt `attempt`, from 0)
    /// found only `available`: another caller came first, or a replicated
    /// bucket was first pulled from Redis at this replica's share. Once, a
    /// fair share of what is there; then nothing (`None`) until the holder
    /// asks again.
    pub fn after_shortfall(&self, attempt: u32, available: u64) -> Option<u64> {
        (attempt == 0 && available > 0).then(|| available.div_ceil(self.holders as u64).min(self.grant))
    }

    /// When a holder granted nothing asks again: within one lease time at
    /// most, since units may come back before the limit's own `retry_after`
    /// (another holder returns some).
    pub fn ask_again_in(&self, retry_after: Duration) -> Duration {
        retry_after.clamp(MIN_ASK_AGAIN, self.ttl)
    }
}

/// What a holder that reports its demand (Envoy's RLQS: what it allowed and
/// denied since its last report) asks for next: a fair share the first time,
/// then about twice its last demand.
pub fn want_from_demand(first: bool, allowed: u64, denied: u64) -> u64 {
    if first { 0 } else { allowed.saturating_add(denied).saturating_mul(2).max(1) }
}

/// One holder's leases by what it calls each bucket (an RLQS stream's bucket
/// ids), bounded: a holder cannot make the server keep more than
/// [`Book::MAX`] of them.
#[derive(Debug)]
pub struct Book<K> {
    leases: std::collections::HashMap<K, String>,
}

impl<K: std::hash::Hash + Eq> Book<K> {
    /// The most buckets one holder has leases for.
    pub const MAX: usize = 10_000;

    /// The lease held for `bucket` (empty when none); `None` when the book is
    /// full and `bucket` is not in it.
    pub fn lease_of<Q>(&self, bucket: &Q) -> Option<&str>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        match self.leases.get(bucket) {
            Some(id) => Some(id),
            None if self.leases.len() >= Self::MAX => None,
            None => Some(""),
        }
    }

    pub fn hold(&mut self, bucket: K, lease: String) {
        self.leases.insert(bucket, lease);
    }

    pub fn forget<Q>(&mut self, bucket: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.leases.remove(bucket);
    }
}

impl<K> Default for Book<K> {
    fn default() -> Self {
        Book { leases: std::collections::HashMap::new() }
    }
}

impl Engine {
    /// How much `holder` may lease of `resource`'s limits for `d` now, at
    /// most `want` (0: its fair share); `Err` when they may not be leased.
    pub fn lease_plan<D: Descriptors + ?Sized>(
        &self,
        rules: &Installed,
        resource: &str,
        d: &D,
        want: u64,
        holder: &str,
    ) -> Result<Result<Plan, NotLeasable>, RequestError> {
        request::validate(resource, d)?;
        let Some((rule, handles)) = rules.find(resource) else {
            return Ok(Err(NotLeasable::NoRule));
        };
        if rule.breaker.is_some() {
            return Ok(Err(NotLeasable::Breaker));
        }
        if rule.concurrency.is_some() {
            return Ok(Err(NotLeasable::Concurrency));
        }
        if rule.shed_at_level.is_some() {
            return Ok(Err(NotLeasable::Shed));
        }
        let matched = match limits_for(rule, handles, d, &self.clock) {
            Ok(limits) => matched_in(limits, rule.per_resource(), resource, d),
            Err((_, values)) => return Ok(Err(NotLeasable::Blocked(values))),
        };
        if matched.is_empty() {
            return Ok(Err(NotLeasable::NoLimit));
        }
        let mut ttl = Duration::MAX;
        for (l, ..) in &matched {
            match l.lease {
                _ if l.shadow => return Ok(Err(NotLeasable::Shadow(l.name.clone()))),
                Some(t) => ttl = ttl.min(t),
                None => return Ok(Err(NotLeasable::NotMarked(l.name.clone()))),
            }
        }
        let now = self.clock.now();
        let since = Timestamp::from_nanos(now.as_nanos().saturating_sub(2 * ttl.as_nanos() as u64));
        let who = holder_hash(holder);
        let holders = matched.iter().map(|(_, _, k)| self.leases.touch(k, who, now, since)).max().unwrap_or(1);
        let available = matched
            .iter()
            .map(|(l, _, k)| self.buckets.check(k, &l.algorithm, now, 0).status.remaining)
            .min()
            .unwrap_or(0);
        if available == 0 {
            let retry_after =
                matched.iter().map(|(l, _, k)| self.buckets.check(k, &l.algorithm, now, 1).status.retry_after).max();
            return Ok(Ok(Plan { ttl, grant: 0, retry_after: retry_after.unwrap_or_default(), holders }));
        }
        let share = available.div_ceil(holders as u64);
        let grant = if want == 0 { share } else { want.min(share) }.min(u64::from(u32::MAX));
        Ok(Ok(Plan { ttl, grant, retry_after: Duration::ZERO, holders }))
    }
}

fn holder_hash(holder: &str) -> u64 {
    // Fixed keys: the same holder is the same entry on every call.
    ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(holder)
}
