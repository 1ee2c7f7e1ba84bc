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
pub type NotLeasable = String;

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
        let Some(rule) = rules.rules.find(resource) else {
            return Ok(Err("no rule matches the resource".into()));
        };
        if rule.breaker.is_some() {
            return Ok(Err("the resource has a circuit breaker: each call is decided by the server".into()));
        }
        if rule.concurrency.is_some() {
            return Ok(Err("the resource has a concurrency limit: each call is decided by the server".into()));
        }
        if rule.shed_at_level.is_some() {
            return Ok(Err("the resource is shed by degradation level: each call is decided by the server".into()));
        }
        let matched = match limits_for(rule, d, &self.clock) {
            Ok(limits) => matched_in(limits, rule.per_resource(), resource, d),
            Err((_, values)) => return Ok(Err(format!("blocked by an override for {values}"))),
        };
        if matched.is_empty() {
            return Ok(Err("no limit applies to these descriptors".into()));
        }
        let mut ttl = Duration::MAX;
        for (l, ..) in &matched {
            match l.lease {
                _ if l.shadow => return Ok(Err(format!("limit '{}' is in shadow mode", l.name))),
                Some(t) => ttl = ttl.min(t),
                None => return Ok(Err(format!("limit '{}' may not be leased (no `lease:` in the rules)", l.name))),
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
