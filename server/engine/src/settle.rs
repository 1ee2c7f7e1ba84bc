//! Reserve, then settle: an Acquire with `settle` takes its cost as an
//! estimate and hands out a permit; the report's actual cost gives back the
//! difference or takes the rest, beyond the limit if need be (a debt that
//! later callers wait out). `Charge` takes usage without asking first.
//!
//! Per algorithm: the token bucket, GCRA and the leaky bucket carry a debt
//! over time (an empty bucket that refills only once the debt is refilled; a
//! theoretical arrival or drain time further ahead). The fixed and sliding
//! windows count beyond their limit until the window ends, when a window
//! forgives what it counted; a give-back applies only while the window the
//! estimate was taken in is still the current one (a later window never
//! took it). The sliding log gives back only the estimate's own entries.
//!
//! Replicated limits push what settling gave or took at the next sync, like
//! any consumption. Strict limits are adjusted in Redis (by the caller, see
//! [`Strict`]): what the engine returns says what to take or give back; an
//! estimate a strict limit took in an outage, or a charge Redis could not
//! take, is owed and paid when Redis answers again.

use crate::{Charges, Leasing};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use smallvec::SmallVec;

use super::decide::{Answer, matched};
use super::guards::PermitId;
use super::request::{self, Descriptors, RequestError};
use super::{Engine, Installed, LimitReport};
use crate::rules::{Limit, Rule};
use crate::store::BucketKey;
use crate::time::Timestamp;

/// What a `Charge` left: the matched limits, in rule order, and the strict
/// ones Redis must take the cost from (their status is Redis's to fill in).
pub struct Charged<'r> {
    pub limits: SmallVec<[LimitReport<'r>; 2]>,
    pub strict: Strict,
}

/// Units to take from (positive) or give back to (negative) strict buckets
/// of one resource in Redis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Strict {
    pub resource: String,
    /// (bucket, units, the Redis time of the take a give-back is part of,
    /// us; 0 when unknown), with the bucket's position in `Charged::limits`.
    pub items: SmallVec<[(BucketKey, i64, i64, usize); 1]>,
}

/// What a report's actual cost did to its estimate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// An estimate was settled.
    pub settled: bool,
    /// What its strict limits must take or give back in Redis.
    pub strict: Strict,
}

/// Estimates waiting to be settled, at most.
pub const MAX_PENDING: usize = 1_000_000;

/// An estimate taken, waiting for its actual cost.
#[derive(Debug)]
struct Pending {
    resource: String,
    cost: u64,
    at: Timestamp,
    expires: Timestamp,
    /// The buckets decided here.
    buckets: SmallVec<[BucketKey; 2]>,
    /// The buckets Redis decided (strict), and when Redis took the units
    /// (its clock, us); `None` when they were decided here while Redis was
    /// away (what they took is owed).
    strict: SmallVec<[BucketKey; 1]>,
    redis_at: Option<i64>,
    /// A lease's holder (its hash); 0 for an Acquire's estimate.
    holder: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Settlements {
    map: DashMap<u128, Pending, ahash::RandomState>,
}

impl Settlements {
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// Units as a signed count.
fn signed(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

impl Engine {
    /// An allowed Acquire with `settle`: remembers what its estimate took
    /// (the buckets of `taken`, `cost` at `now`, the instant the decision
    /// took them; Redis's instant `redis_at` for strict limits it decided)
    /// and puts the permit to settle it in `answer` (the breaker's or the
    /// concurrency limit's permit when it has one).
    pub(super) fn hold_estimate<'a>(
        &self,
        answer: &mut Answer<'_>,
        rule: &Rule,
        resource: String,
        taken: impl Iterator<Item = (&'a Limit, &'a BucketKey)>,
        (cost, now, redis_at): (u64, Timestamp, Option<i64>),
    ) {
        if self.settlements.len() >= MAX_PENDING {
            return;
        }
        let (mut buckets, mut strict) = (SmallVec::new(), SmallVec::new());
        for (l, k) in taken {
            if self.coordination.decides(l) {
                strict.push(k.clone());
            } else {
                buckets.push(k.clone());
            }
        }
        let ttl = rule.concurrency.map_or(super::DEFAULT_PERMIT_TTL, |c| c.permit_ttl);
        let expires = now.saturating_add(ttl);
        let pending = Pending { resource, cost, at: now, expires, buckets, strict, redis_at, holder: 0 };
        if let Some(id) = answer.permit_id {
            self.settlements.map.insert(id.get(), pending);
            return;
        }
        loop {
            let id = PermitId::random();
            if let Entry::Vacant(slot) = self.settlements.map.entry(id.get()) {
                slot.insert(pending);
                answer.permit_id = Some(id);
                return;
            }
        }
    }

    /// Forgets estimates whose permits expired: they stand as taken.
    pub(super) fn expire_estimates(&self, now: Timestamp) -> usize {
        let before = self.settlements.len();
        self.settlements.map.retain(|_, p| p.expires > now);
        before - self.settlements.len()
    }
}

impl Charges<'_> {
    /// Settles permit `id` at `actual` (or, `None`, lets its estimate stand
    /// and forgets it). Not settled when it holds no estimate (unknown,
    /// expired, already settled, or not from an Acquire with `settle`).
    pub fn settle_estimate(
        &self,
        rules: &Installed,
        id: &str,
        resource: &str,
        actual: Option<u64>,
    ) -> Result<Settled, RequestError> {
        let key = request::check_permit_id(id)?;
        if let Some(actual) = actual
            && actual > u64::from(u32::MAX)
        {
            return Err(RequestError::CostTooLarge { field: "actual_cost", value: actual });
        }
        let Some((_, p)) = self.settlements.map.remove_if(&key, |_, p| resource.is_empty() || p.resource == resource)
        else {
            if self.settlements.map.contains_key(&key) {
                return Err(RequestError::PermitResourceMismatch { resource: resource.into() });
            }
            return Ok(Settled::default());
        };
        let now = self.clock.now();
        let Some(actual) = actual else { return Ok(Settled::default()) };
        if p.expires <= now {
            return Ok(Settled::default());
        }
        for bucket in &p.buckets {
            let Some((_, l)) = rules.limit(bucket.limit) else { continue };
            if actual > p.cost {
                let more = actual - p.cost;
                self.buckets.force(bucket.clone(), &l.algorithm, now, more);
                self.note_replicated(l, bucket, &p.resource, signed(more), now);
            } else if actual < p.cost && l.algorithm.same_window(p.at, now) {
                let back = p.cost - actual;
                self.buckets.give_back(bucket, &l.algorithm, now, p.at, back);
                self.note_replicated(l, bucket, &p.resource, -signed(back), now);
            }
        }
        let units = signed(actual) - signed(p.cost);
        let mut strict = Strict { resource: p.resource.clone(), items: SmallVec::new() };
        if units != 0 {
            match p.redis_at {
                Some(at) => strict.items.extend(p.strict.iter().map(|k| (k.clone(), units, at, 0))),
                // Taken here while Redis was away: the debt is what changes.
                None => p.strict.iter().for_each(|k| self.coordination.admitted_here(k, &p.resource, units, now)),
            }
        }
        Ok(Settled { settled: true, strict })
    }

    /// `Charge`: takes `cost` from every limit the request matches, beyond
    /// the limit if need be; the limits' state afterwards. Strict limits are
    /// for the caller to take in Redis (`Charged::strict`).
    pub fn charge<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        resource: &str,
        descriptors: &D,
        cost: u64,
    ) -> Result<Charged<'r>, RequestError> {
        request::validate(resource, descriptors)?;
        if cost > u64::from(u32::MAX) {
            return Err(RequestError::CostTooLarge { field: "cost", value: cost });
        }
        let mut charged = Charged { limits: SmallVec::new(), strict: Strict::default() };
        let Some((rule, handles)) = rules.find(resource) else { return Ok(charged) };
        let now = self.clock.now();
        for (l, index, bucket) in matched(rule, handles, resource, descriptors, &self.clock) {
            if self.coordination.decides(l) {
                if cost > 0 {
                    charged.strict.items.push((bucket, signed(cost), 0, charged.limits.len()));
                }
                // Until Redis answers (and while it is away, when the charge
                // is owed): what is known without it, that a charge of the
                // whole limit or more exceeds it whatever Redis holds.
                let status = crate::limiter::Status { limit: l.algorithm.capacity(), ..Default::default() };
                let exceeded = cost > 0 && cost >= status.limit;
                charged.limits.push(LimitReport { limit: l, index, status, exceeded });
                continue;
            }
            if cost > 0 {
                self.buckets.force(bucket.clone(), &l.algorithm, now, cost);
                self.note_replicated(l, &bucket, resource, signed(cost), now);
            }
            let status = self.buckets.check(&bucket, &l.algorithm, now, 0).status;
            charged.limits.push(LimitReport { limit: l, index, status, exceeded: status.remaining == 0 });
        }
        charged.strict.resource = resource.to_string();
        Ok(charged)
    }
}

impl Leasing<'_> {
    /// Keeps the estimate of permit `id` until `expires` (a lease's time).
    /// Estimate `id` is a lease of `holder`'s, kept until `expires`.
    pub fn hold_lease(&self, id: &str, expires: Timestamp, holder: &str) {
        if let Ok(key) = request::check_permit_id(id)
            && let Some(mut p) = self.settlements.map.get_mut(&key)
        {
            p.expires = expires;
            p.holder = super::lease::holder_hash(holder);
        }
    }

    /// A lease returned or renewed (see `decider::lease`): its estimate
    /// settled at what its holder says it used, never more than the lease
    /// granted (a holder cannot have admitted more); errors name the
    /// lease's fields.
    pub fn settle_lease(
        &self,
        rules: &Installed,
        id: &str,
        resource: &str,
        used: u64,
        holder: &str,
    ) -> Result<Settled, RequestError> {
        let key = request::check_permit_id(id).map_err(|_| RequestError::MalformedLease(request::preview(id)))?;
        if used > u64::from(u32::MAX) {
            return Err(RequestError::CostTooLarge { field: "used", value: used });
        }
        // Only its holder settles a lease: nobody else may give back (or
        // charge) what it took.
        if self
            .settlements
            .map
            .get(&key)
            .is_some_and(|p| p.holder != 0 && p.holder != super::lease::holder_hash(holder))
        {
            return Err(RequestError::LeaseHolderMismatch);
        }
        let used = self.settlements.map.get(&key).map_or(used, |p| used.min(p.cost));
        self.charges().settle_estimate(rules, id, resource, Some(used)).map_err(|e| match e {
            RequestError::PermitResourceMismatch { resource } => RequestError::LeaseResourceMismatch { resource },
            e => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::rules::RuleSet;
    use crate::time::{Clock, ManualClock};
    use crate::{EngineConfig, Request, Verdict};

    const RULES: &str = r#"
resources:
  - name: llm
    limits:
      - { name: tokens, key: [user], algorithm: token_bucket, capacity: 100, refill_per_second: 10 }
      - { name: daily, key: [user], algorithm: fixed_window, limit: 1000, window: 1h }
  - name: db
    concurrency: { max_in_flight: 5, permit_ttl: 30s }
    limits: [ { name: rows, algorithm: gcra, rate_per_second: 100, burst: 100 } ]
  - name: short
    concurrency: { max_in_flight: 5, permit_ttl: 60s }
    limits: [ { name: w, algorithm: fixed_window, limit: 5, window: 10s } ]
"#;

    fn engine() -> (Engine, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_700_006_400)));
        let e = Engine::new(EngineConfig { max_keys: usize::MAX }, clock.clone());
        e.control().install(RuleSet::from_yaml(RULES, "t").unwrap(), RULES.into(), "t".into());
        (e, clock)
    }

    fn user() -> HashMap<String, String> {
        HashMap::from([("user".to_string(), "u1".to_string())])
    }

    /// An Acquire with `settle` of `cost`: (allowed, permit, remaining per limit).
    fn estimate(e: &Engine, resource: &str, cost: u32) -> (bool, Option<String>, Vec<u64>) {
        let rules = e.rules();
        let d = user();
        let req = Request { cost, settle: true, ..Request::new(resource, &d) };
        let a = e.acquire(&rules, &req).unwrap();
        (
            a.verdict == Verdict::Allowed,
            a.permit_id.map(|p| p.to_string()),
            a.limits.iter().map(|l| l.status.remaining).collect(),
        )
    }

    fn remaining(e: &Engine, resource: &str) -> Vec<(u64, Duration)> {
        let rules = e.rules();
        let a = e.peek(&rules, resource, &user(), None).unwrap();
        a.limits.iter().map(|l| (l.status.remaining, l.status.retry_after)).collect()
    }

    #[test]
    fn a_lower_actual_cost_gives_back_the_difference() {
        let (e, _) = engine();
        let (ok, permit, left) = estimate(&e, "llm", 60);
        assert!(ok);
        assert_eq!(left, [40, 940]);
        let permit = permit.expect("a permit to settle with, though the rule has no breaker");
        assert_eq!(e.charges().settle_estimate(&e.rules(), &permit, "llm", Some(15)).map(|s| s.settled), Ok(true));
        assert_eq!(remaining(&e, "llm").iter().map(|r| r.0).collect::<Vec<_>>(), [85, 985]);
        assert_eq!(
            e.charges().settle_estimate(&e.rules(), &permit, "llm", Some(0)).map(|s| s.settled),
            Ok(false),
            "settled once"
        );
    }

    #[test]
    fn a_higher_actual_cost_is_a_debt_later_callers_wait_out() {
        let (e, clock) = engine();
        let (_, permit, _) = estimate(&e, "llm", 50);
        assert_eq!(
            e.charges().settle_estimate(&e.rules(), &permit.unwrap(), "", Some(180)).map(|s| s.settled),
            Ok(true)
        );
        // 100 - 180 = 80 tokens owed; at 10/s the bucket is empty for 8 s.
        let r = remaining(&e, "llm");
        assert_eq!(r[0], (0, Duration::ZERO), "peek asks for nothing: no retry time");
        assert_eq!(r[1].0, 820, "the window counts the actual cost");
        let (ok, _, _) = estimate(&e, "llm", 1);
        assert!(!ok);
        clock.advance(Duration::from_millis(8_099));
        assert!(!estimate(&e, "llm", 1).0, "still paying the debt back");
        clock.advance(Duration::from_millis(1));
        assert!(estimate(&e, "llm", 1).0, "8 s of debt, then 0.1 s for one token");
    }

    #[test]
    fn gcra_carries_a_debt_and_a_guarded_permit_settles_too() {
        let (e, clock) = engine();
        let (ok, permit, _) = estimate(&e, "db", 10);
        assert!(ok);
        let permit = permit.unwrap();
        // The concurrency permit is the settle permit: one report does both.
        let reported = e.outcomes().report(&e.rules(), "db", &permit, crate::breaker::Outcome::Success, None).unwrap();
        assert!(reported.counted);
        assert_eq!(e.charges().settle_estimate(&e.rules(), &permit, "db", Some(150)).map(|s| s.settled), Ok(true));
        // 150 in a burst of 100 at 100/s: 0.5 s over, then 10 ms per row.
        assert!(!estimate(&e, "db", 1).0);
        clock.advance(Duration::from_millis(510));
        assert!(estimate(&e, "db", 1).0);
    }

    #[test]
    fn bad_or_foreign_permits_and_windows_that_moved_on() {
        let (e, clock) = engine();
        let rules = e.rules();
        assert!(matches!(
            e.charges().settle_estimate(&rules, "nope", "", Some(1)),
            Err(RequestError::MalformedPermit(_))
        ));
        assert_eq!(
            e.charges().settle_estimate(&rules, &format!("{:032x}", 7), "", Some(1)).map(|s| s.settled),
            Ok(false),
            "unknown"
        );
        let (_, permit, _) = estimate(&e, "llm", 30);
        let permit = permit.unwrap();
        assert!(matches!(
            e.charges().settle_estimate(&rules, &permit, "db", Some(1)),
            Err(RequestError::PermitResourceMismatch { .. })
        ));
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            e.charges().settle_estimate(&rules, &permit, "llm", Some(0)).map(|s| s.settled),
            Ok(false),
            "expired after the permit's 60 s"
        );
        // A window that moved on never took the estimate: nothing comes back to it.
        clock.advance(Duration::from_secs(10) - Duration::from_nanos(clock.now().as_nanos() % 10_000_000_000));
        let (_, old, _) = estimate(&e, "short", 4);
        clock.advance(Duration::from_secs(10));
        let (_, new, left) = estimate(&e, "short", 3);
        assert_eq!(left, [2]);
        assert_eq!(e.charges().settle_estimate(&rules, &old.unwrap(), "short", Some(0)).map(|s| s.settled), Ok(true));
        assert_eq!(remaining(&e, "short")[0].0, 2, "the new window keeps its 3");
        assert_eq!(e.charges().settle_estimate(&rules, &new.unwrap(), "short", Some(1)).map(|s| s.settled), Ok(true));
        assert_eq!(remaining(&e, "short")[0].0, 4, "its own estimate comes back");
    }

    #[test]
    fn charge_takes_usage_beyond_the_limit() {
        let (e, _) = engine();
        let rules = e.rules();
        let charged = e.charges().charge(&rules, "llm", &user(), 130).unwrap();
        let after: Vec<_> =
            charged.limits.iter().map(|l| (l.limit.name.as_str(), l.status.remaining, l.exceeded)).collect();
        assert_eq!(after, [("tokens", 0, true), ("daily", 870, false)]);
        assert!(!estimate(&e, "llm", 1).0, "30 tokens owed");
        assert_eq!(e.charges().charge(&rules, "nothing-matches", &user(), 5).unwrap().limits.len(), 0);
        assert!(matches!(e.charges().charge(&rules, "", &user(), 5), Err(RequestError::Empty { .. })));
        let huge = e.charges().charge(&rules, "llm", &user(), u64::MAX).err().map(|e| e.to_string());
        assert_eq!(huge.as_deref(), Some("cost: 18446744073709551615 is larger than the largest cost, 4294967295"));
    }
}
