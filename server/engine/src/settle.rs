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
use super::request::{self, Costs, Descriptors, RequestError, Usage};
use super::{Engine, Installed, LimitReport};
use crate::rules::{Limit, Rule};
use crate::store::BucketKey;
use crate::time::Timestamp;

/// What a `Charge` left: the matched limits, in rule order, and the strict
/// ones Redis must take the cost from (their status is Redis's to fill in).
pub struct Charged<'r> {
    pub limits: SmallVec<[LimitReport<'r>; 2]>,
    pub strict: Strict,
    /// Its idempotency key was seen before: nothing was taken.
    pub duplicate: bool,
    /// The waterfall source it was taken from; `None`: the rule's own limits.
    pub paid_by: Option<&'r String>,
}

/// A `Charge` checked and matched ([`Charges::plan_charge`]), to take with
/// [`Charges::take_charge`]: its limits and what each takes.
pub struct ChargePlan<'r> {
    matched: super::decide::Matched<'r>,
    costs: Costs,
    /// The name of the waterfall source whose limits these are (`None`:
    /// the rule's own), and the number of sources after the rule's own.
    source_name: Option<&'r String>,
    waterfall: u8,
}

impl ChargePlan<'_> {
    /// The sources of the rule's waterfall after its own limits (0: none).
    pub fn waterfall(&self) -> u8 {
        self.waterfall
    }

    /// Whether no limit of this source applies to the charge.
    pub fn is_empty(&self) -> bool {
        self.matched.is_empty()
    }
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
    /// The permit held a live estimate, now forgotten (settled, or left to
    /// stand when the report said no actual cost).
    pub known: bool,
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
    /// The buckets decided here, with the estimate each took (a limit
    /// with a `cost` formula took its own).
    buckets: SmallVec<[(BucketKey, u64); 2]>,
    /// The buckets Redis decided (strict), and when Redis took the units
    /// (its clock, us); `None` when they were decided here while Redis was
    /// away (what they took is owed).
    strict: SmallVec<[(BucketKey, u64); 1]>,
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

/// Each bucket's actual cost, in the order of an estimate's buckets (those
/// decided here, then the strict ones); `None` where the estimate stands.
type Actuals = SmallVec<[Option<u64>; 3]>;

/// What each bucket of estimate `p` (those decided here, then the strict
/// ones) really cost: by its limit's formula when usage is reported, else
/// `actual`; `None` where the estimate stands.
fn actuals(
    rules: &Installed,
    p: &Pending,
    actual: Option<u64>,
    usage: Option<&Usage>,
) -> Result<Actuals, RequestError> {
    if let Some(usage) = usage
        && let Some((rule, _)) = rules.find(&p.resource)
    {
        request::check_usage(rule, usage)?;
    }
    let bucket = |k: &BucketKey| -> Result<Option<u64>, RequestError> {
        let formula = usage.zip(rules.limit(k.limit)).and_then(|(u, (_, l))| request::formula_cost(l, u));
        match formula {
            Some(cost) => cost.map(Some),
            None => Ok(actual),
        }
    };
    p.buckets.iter().chain(&p.strict).map(|(k, _)| bucket(k)).collect()
}

/// Units as a signed count.
fn signed(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

impl Engine {
    /// An allowed Acquire with `settle`: remembers what its estimate took
    /// (the buckets of `taken` and what each took, the request's `cost`, at
    /// `now`, the instant the decision
    /// took them; Redis's instant `redis_at` for strict limits it decided)
    /// and puts the permit to settle it in `answer` (the breaker's or the
    /// concurrency limit's permit when it has one).
    pub(super) fn hold_estimate<'a>(
        &self,
        answer: &mut Answer<'_>,
        rule: &Rule,
        resource: String,
        taken: impl Iterator<Item = (&'a Limit, &'a BucketKey, u64)>,
        (cost, now, redis_at): (u64, Timestamp, Option<i64>),
    ) {
        if self.settlements.len() >= MAX_PENDING {
            return;
        }
        let (mut buckets, mut strict) = (SmallVec::new(), SmallVec::new());
        for (l, k, cost) in taken {
            if self.coordination.decides(l) {
                strict.push((k.clone(), cost));
            } else {
                buckets.push((k.clone(), cost));
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
    /// Checks a settlement as [`Charges::settle_estimate`] would, changing
    /// nothing: the errors it would answer (a value too large, another
    /// resource's permit, usage its rule refuses), so that a report (or a
    /// batch of them) can be refused before any part of it is applied.
    pub fn check_settle(
        &self,
        rules: &Installed,
        id: &str,
        resource: &str,
        actual: Option<u64>,
        usage: Option<&Usage>,
    ) -> Result<(), RequestError> {
        if self.actuals_of(rules, id, resource, actual, usage)?.is_some() {
            return Ok(());
        }
        // Another replica's permit, or none: usage the named resource's rule
        // refuses is refused here already.
        match (usage, rules.find(resource)) {
            (Some(usage), Some((rule, _))) if !resource.is_empty() => request::check_usage(rule, usage),
            _ => Ok(()),
        }
    }

    /// The input checked, and what each bucket of estimate `id` really cost
    /// (see [`actuals`]); `None` when no estimate here has that id.
    fn actuals_of(
        &self,
        rules: &Installed,
        id: &str,
        resource: &str,
        actual: Option<u64>,
        usage: Option<&Usage>,
    ) -> Result<Option<(u128, Actuals)>, RequestError> {
        let key = request::check_permit_id(id)?;
        if let Some(actual) = actual {
            request::check_cost("actual_cost", actual)?;
        }
        match self.settlements.map.get(&key) {
            Some(p) if resource.is_empty() || p.resource == resource => {
                Ok(Some((key, actuals(rules, &p, actual, usage)?)))
            }
            Some(_) => Err(RequestError::PermitResourceMismatch { resource: resource.into() }),
            None => Ok(None),
        }
    }

    /// Settles permit `id` at `actual` (or, `None`, lets its estimate stand
    /// and forgets it). A limit with a `cost` formula settles at what the
    /// formula gives for `usage`, when usage is reported. Not settled when
    /// it holds no estimate (unknown, expired, already settled, or not from
    /// an Acquire with `settle`). Bad input changes nothing.
    pub fn settle_estimate(
        &self,
        rules: &Installed,
        id: &str,
        resource: &str,
        actual: Option<u64>,
        usage: Option<&Usage>,
    ) -> Result<Settled, RequestError> {
        // Each bucket's actual cost, worked out before the permit is taken,
        // so that usage the rule refuses leaves the permit to settle again.
        let Some((key, actuals)) = self.actuals_of(rules, id, resource, actual, usage)? else {
            return Ok(Settled::default());
        };
        let Some((_, p)) = self.settlements.map.remove_if(&key, |_, p| resource.is_empty() || p.resource == resource)
        else {
            return Ok(Settled::default());
        };
        let now = self.clock.now();
        if p.expires <= now {
            return Ok(Settled::default());
        }
        if actuals.iter().all(Option::is_none) {
            return Ok(Settled { known: true, ..Settled::default() });
        }
        for ((bucket, estimate), actual) in p.buckets.iter().zip(&actuals) {
            let (Some(actual), Some((_, l))) = (actual, rules.limit(bucket.limit)) else { continue };
            let (actual, estimate) = (*actual, *estimate);
            if actual > estimate {
                let more = actual - estimate;
                self.buckets.force(bucket.clone(), &l.algorithm, now, more);
                self.note_replicated(l, bucket, &p.resource, signed(more), now);
            } else if actual < estimate && l.algorithm.same_window(p.at, now) {
                let back = estimate - actual;
                self.buckets.give_back(bucket, &l.algorithm, now, p.at, back);
                self.note_replicated(l, bucket, &p.resource, -signed(back), now);
            }
        }
        let mut strict = Strict { resource: p.resource.clone(), items: SmallVec::new() };
        for ((k, estimate), actual) in p.strict.iter().zip(&actuals[p.buckets.len()..]) {
            let Some(actual) = actual else { continue };
            let units = signed(*actual) - signed(*estimate);
            if units == 0 {
                continue;
            }
            match p.redis_at {
                Some(at) => strict.items.push((k.clone(), units, at, 0)),
                // Taken here while Redis was away: the debt is what changes.
                None => self.coordination.admitted_here(k, &p.resource, units, now),
            }
        }
        Ok(Settled { settled: true, known: true, strict })
    }

    /// A `Charge` checked and matched, taking nothing yet: every error it
    /// could meet is found here (so that an idempotency key is claimed only
    /// for a charge that will be taken); `None` when no rule matches (a
    /// charge that takes nothing, key or not).
    pub fn plan_charge<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        resource: &str,
        descriptors: &D,
        cost: u64,
        usage: Option<&Usage>,
    ) -> Result<Option<ChargePlan<'r>>, RequestError> {
        self.plan_charge_from(rules, resource, descriptors, cost, usage, 0)
    }

    /// [`Charges::plan_charge`], taken from the waterfall's source `source`
    /// (0: the rule's own limits).
    pub fn plan_charge_from<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        resource: &str,
        descriptors: &D,
        cost: u64,
        usage: Option<&Usage>,
        source: u8,
    ) -> Result<Option<ChargePlan<'r>>, RequestError> {
        request::validate(resource, descriptors)?;
        request::check_cost("cost", cost)?;
        let Some((rule, handles)) = rules.find(resource) else { return Ok(None) };
        let matched = matched(rule, handles, resource, descriptors, &self.clock, Some(source));
        let costs = super::decide::costs_of(Some(rule), &matched, usage, cost, 0)?;
        let (source_name, waterfall) = (rule.source_name(source), rule.waterfall_len());
        Ok(Some(ChargePlan { matched, costs, source_name, waterfall }))
    }

    /// `Charge`: takes `cost` from every limit the request matches (a limit
    /// with a `cost` formula: what it gives for `usage`, when reported),
    /// beyond the limit if need be; the limits' state afterwards. Strict limits are
    /// for the caller to take in Redis (`Charged::strict`).
    pub fn charge<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        resource: &str,
        descriptors: &D,
        cost: u64,
        usage: Option<&Usage>,
    ) -> Result<Charged<'r>, RequestError> {
        let plan = self.plan_charge(rules, resource, descriptors, cost, usage)?;
        Ok(self.take_charge(resource, plan))
    }

    /// What Redis must take of a planned charge of `resource` (its strict
    /// limits' units, each with its place in the answer's limits), taking
    /// nothing: so that Redis can take it, with the charge's idempotency key,
    /// before anything is taken here. [`Charges::take_charge`] lists its
    /// strict part with this too.
    pub fn strict_part(&self, resource: &str, plan: &ChargePlan<'_>) -> Strict {
        let mut strict = Strict { resource: resource.to_string(), items: SmallVec::new() };
        for (pos, (l, index, bucket)) in plan.matched.iter().enumerate() {
            let cost = plan.costs.of(*index);
            if cost > 0 && self.coordination.decides(l) {
                strict.items.push((bucket.clone(), signed(cost), 0, pos));
            }
        }
        strict
    }

    /// Takes a planned charge of `resource` (nothing when no rule matched).
    pub fn take_charge<'r>(&self, resource: &str, plan: Option<ChargePlan<'r>>) -> Charged<'r> {
        let mut charged =
            Charged { limits: SmallVec::new(), strict: Strict::default(), duplicate: false, paid_by: None };
        let Some(plan) = plan else { return charged };
        charged.strict = self.strict_part(resource, &plan);
        let ChargePlan { matched, costs, source_name, .. } = plan;
        charged.paid_by = source_name;
        let now = self.clock.now();
        for (l, index, bucket) in matched {
            let cost = costs.of(index);
            if self.coordination.decides(l) {
                // Until Redis answers (and while it is away, when the charge
                // is owed): what is known without it, that a charge of the
                // whole limit or more exceeds it whatever Redis holds. A
                // charge of nothing is not sent: what Redis last said stands.
                let limit = l.algorithm.capacity();
                let remaining = match cost {
                    0 => self.coordination.last_remaining(&bucket).unwrap_or(limit).min(limit),
                    _ => 0,
                };
                let status = crate::limiter::Status { limit, remaining, ..Default::default() };
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
        charged
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
        request::check_cost("used", used)?;
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
        self.charges().settle_estimate(rules, id, resource, Some(used), None).map_err(|e| match e {
            RequestError::PermitResourceMismatch { resource } => RequestError::LeaseResourceMismatch { resource },
            e => e,
        })
    }
}

/// A change to one key's balance ([`Charges::plan_balance`]).
pub enum BalanceChange {
    /// Made in this process: what the balance holds after it.
    Here { balance: i64, max: u64 },
    /// To make in Redis (a strict balance): the units to take (a top-up's
    /// are negative: given back).
    Strict { strict: Strict, max: u64 },
}

impl Charges<'_> {
    /// Tops up (`amount` above 0) or takes from (below 0) the balance named
    /// `limit` of `resource` for these descriptors. A balance this process
    /// holds is changed here; a strict one is for the caller to change in
    /// Redis. Refused: a limit the request does not match, one that is not
    /// a balance, an amount of 0 or one that would pass `max_balance` (as
    /// far as this process knows; Redis never goes past it either).
    pub fn plan_balance<D: Descriptors + ?Sized>(
        &self,
        rules: &Installed,
        resource: &str,
        descriptors: &D,
        limit: &str,
        amount: i64,
    ) -> Result<BalanceChange, RequestError> {
        request::validate(resource, descriptors)?;
        let no_limit = || RequestError::NoSuchLimit { resource: resource.into(), limit: limit.into() };
        let Some((rule, handles)) = rules.find(resource) else { return Err(no_limit()) };
        let all = matched(rule, handles, resource, descriptors, &self.clock, None);
        let Some((l, _, key)) = all.into_iter().find(|(l, ..)| l.name == limit) else { return Err(no_limit()) };
        let crate::limiter::Algorithm::Balance(cfg) = &l.algorithm else {
            return Err(RequestError::NotABalance {
                resource: resource.into(),
                limit: limit.into(),
                algorithm: l.algorithm.name(),
            });
        };
        let max = cfg.max;
        if amount == 0 || amount.unsigned_abs() > crate::limiter::balance::MAX {
            let message =
                format!("{amount} is not an amount to add or take: 1 to {} either way", crate::limiter::balance::MAX);
            return Err(RequestError::OutOfRange { field: "amount", message });
        }
        if self.coordination.decides(l) {
            let strict = Strict { resource: resource.to_string(), items: smallvec::smallvec![(key, -amount, 0, 0)] };
            return Ok(BalanceChange::Strict { strict, max });
        }
        let before = self.buckets.balance_units(&key).unwrap_or(0);
        check_top_up(before, amount, max)?;
        let now = self.clock.now();
        if amount > 0 {
            self.buckets.force(key.clone(), &l.algorithm, now, 0);
            self.buckets.refund(&key, &l.algorithm, now, amount.unsigned_abs());
        } else {
            self.buckets.force(key.clone(), &l.algorithm, now, amount.unsigned_abs());
        }
        // A store full of balances that hold credits (never evicted) had no
        // room for this one: the change was not kept.
        let Some(after) = self.buckets.balance_units(&key) else { return Err(RequestError::BalancesFull) };
        Ok(BalanceChange::Here { balance: after, max })
    }
}

/// Refuses a top-up that would take a balance holding `before` past `max`.
pub fn check_top_up(before: i64, amount: i64, max: u64) -> Result<(), RequestError> {
    let after = i128::from(before) + i128::from(amount);
    if amount > 0 && after > i128::from(max) {
        let message = format!("{amount} would make the balance {after}, more than its max_balance {max}");
        return Err(RequestError::OutOfRange { field: "amount", message });
    }
    Ok(())
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
  - name: chat
    usage: [input_tokens, cached_input_tokens, output_tokens]
    limits:
      - { name: requests, key: [user], algorithm: fixed_window, limit: 100, window: 1h }
      - { name: input, key: [user], algorithm: fixed_window, limit: 1000, window: 1h, cost: "input_tokens - cached_input_tokens + cached_input_tokens / 10" }
      - { name: output, key: [user], algorithm: token_bucket, capacity: 500, refill_per_second: 0.001, cost: output_tokens }
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
        assert_eq!(
            e.charges().settle_estimate(&e.rules(), &permit, "llm", Some(15), None).map(|s| s.settled),
            Ok(true)
        );
        assert_eq!(remaining(&e, "llm").iter().map(|r| r.0).collect::<Vec<_>>(), [85, 985]);
        assert_eq!(
            e.charges().settle_estimate(&e.rules(), &permit, "llm", Some(0), None).map(|s| s.settled),
            Ok(false),
            "settled once"
        );
    }

    #[test]
    fn a_higher_actual_cost_is_a_debt_later_callers_wait_out() {
        let (e, clock) = engine();
        let (_, permit, _) = estimate(&e, "llm", 50);
        assert_eq!(
            e.charges().settle_estimate(&e.rules(), &permit.unwrap(), "", Some(180), None).map(|s| s.settled),
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
        assert_eq!(
            e.charges().settle_estimate(&e.rules(), &permit, "db", Some(150), None).map(|s| s.settled),
            Ok(true)
        );
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
            e.charges().settle_estimate(&rules, "nope", "", Some(1), None),
            Err(RequestError::MalformedPermit(_))
        ));
        assert_eq!(
            e.charges().settle_estimate(&rules, &format!("{:032x}", 7), "", Some(1), None).map(|s| s.settled),
            Ok(false),
            "unknown"
        );
        let (_, permit, _) = estimate(&e, "llm", 30);
        let permit = permit.unwrap();
        assert!(matches!(
            e.charges().settle_estimate(&rules, &permit, "db", Some(1), None),
            Err(RequestError::PermitResourceMismatch { .. })
        ));
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            e.charges().settle_estimate(&rules, &permit, "llm", Some(0), None).map(|s| s.settled),
            Ok(false),
            "expired after the permit's 60 s"
        );
        // A window that moved on never took the estimate: nothing comes back to it.
        clock.advance(Duration::from_secs(10) - Duration::from_nanos(clock.now().as_nanos() % 10_000_000_000));
        let (_, old, _) = estimate(&e, "short", 4);
        clock.advance(Duration::from_secs(10));
        let (_, new, left) = estimate(&e, "short", 3);
        assert_eq!(left, [2]);
        assert_eq!(
            e.charges().settle_estimate(&rules, &old.unwrap(), "short", Some(0), None).map(|s| s.settled),
            Ok(true)
        );
        assert_eq!(remaining(&e, "short")[0].0, 2, "the new window keeps its 3");
        assert_eq!(
            e.charges().settle_estimate(&rules, &new.unwrap(), "short", Some(1), None).map(|s| s.settled),
            Ok(true)
        );
        assert_eq!(remaining(&e, "short")[0].0, 4, "its own estimate comes back");
    }

    #[test]
    fn charge_takes_usage_beyond_the_limit() {
        let (e, _) = engine();
        let rules = e.rules();
        let charged = e.charges().charge(&rules, "llm", &user(), 130, None).unwrap();
        let after: Vec<_> =
            charged.limits.iter().map(|l| (l.limit.name.as_str(), l.status.remaining, l.exceeded)).collect();
        assert_eq!(after, [("tokens", 0, true), ("daily", 870, false)]);
        assert!(!estimate(&e, "llm", 1).0, "30 tokens owed");
        assert_eq!(e.charges().charge(&rules, "nothing-matches", &user(), 5, None).unwrap().limits.len(), 0);
        assert!(matches!(e.charges().charge(&rules, "", &user(), 5, None), Err(RequestError::Empty { .. })));
        let huge = e.charges().charge(&rules, "llm", &user(), u64::MAX, None).err().map(|e| e.to_string());
        assert_eq!(huge.as_deref(), Some("cost: 18446744073709551615 is larger than the largest cost, 4294967295"));
    }

    fn usage(pairs: &[(&str, u64)]) -> Usage {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn limits_with_a_formula_take_settle_and_charge_their_own_cost() {
        let (e, _) = engine();
        let rules = e.rules();
        let d = user();
        // Reserved: 1 request, 300 input tokens, 200 output tokens.
        let expected = usage(&[("input_tokens", 300), ("output_tokens", 200)]);
        let req = Request { settle: true, usage: Some(&expected), ..Request::new("chat", &d) };
        let a = e.acquire(&rules, &req).unwrap();
        let left: Vec<u64> = a.limits.iter().map(|l| l.status.remaining).collect();
        assert_eq!((a.verdict, left), (Verdict::Allowed, vec![99, 700, 300]));
        let permit = a.permit_id.unwrap().to_string();

        // Used: 300 input tokens of which 25 cached (275 + 2.5, rounded up
        // to 278), 50 output tokens; the request stays 1.
        let used = usage(&[("input_tokens", 300), ("cached_input_tokens", 25), ("output_tokens", 50)]);
        let settled = e.charges().settle_estimate(&rules, &permit, "chat", None, Some(&used)).unwrap();
        assert!(settled.settled);
        let left: Vec<u64> = remaining(&e, "chat").iter().map(|(r, _)| *r).collect();
        assert_eq!(left, [99, 722, 450]);

        // A charge of output tokens only: the other budgets are untouched
        // (the request's cost, 0, takes nothing from `requests`).
        let more = usage(&[("output_tokens", 460)]);
        let charged = e.charges().charge(&rules, "chat", &d, 0, Some(&more)).unwrap();
        let after: Vec<(u64, bool)> = charged.limits.iter().map(|l| (l.status.remaining, l.exceeded)).collect();
        assert_eq!(after, [(99, false), (722, false), (0, true)]);
        // The output budget is in debt: a call expecting any output is denied
        // by it, and one expecting none is read as expecting one.
        let none = usage(&[("input_tokens", 10)]);
        let a = e.acquire(&rules, &Request { usage: Some(&none), ..Request::new("chat", &d) }).unwrap();
        assert_eq!(a.verdict, Verdict::RateLimited);
        assert_eq!(
            a.limits.iter().filter(|l| l.denied()).map(|l| l.limit.name.as_str()).collect::<Vec<_>>(),
            ["output"]
        );
    }

    #[test]
    fn usage_the_rule_does_not_read_is_refused_and_changes_nothing() {
        let (e, _) = engine();
        let rules = e.rules();
        let d = user();
        let before = remaining(&e, "chat");
        let typo = usage(&[("outptu_tokens", 5)]);
        let err = e.acquire(&rules, &Request { usage: Some(&typo), ..Request::new("chat", &d) }).unwrap_err();
        assert_eq!(
            err.to_string(),
            "usage: 'outptu_tokens' is not a usage field of rule 'chat' (its usage fields: input_tokens, cached_input_tokens, output_tokens)"
        );
        let negative = usage(&[("input_tokens", 10), ("cached_input_tokens", 40)]);
        let err = e.charges().charge(&rules, "chat", &d, 1, Some(&negative)).err().unwrap();
        assert!(err.to_string().starts_with("usage: limit 'input' would cost -26 for this usage"), "{err}");
        let huge = usage(&[("output_tokens", 501)]);
        let err = e.acquire(&rules, &Request { usage: Some(&huge), ..Request::new("chat", &d) }).unwrap_err();
        assert_eq!(err.to_string(), "cost 501 exceeds capacity 500 of limit 'output'");
        let err = e.acquire(&rules, &Request { usage: Some(&typo), ..Request::new("llm", &d) }).unwrap_err();
        assert!(err.to_string().contains("(it reads no usage)"), "{err}");
        assert_eq!(remaining(&e, "chat"), before);

        // A settle with refused usage leaves the permit to settle again.
        let expected = usage(&[("output_tokens", 100)]);
        let a =
            e.acquire(&rules, &Request { settle: true, usage: Some(&expected), ..Request::new("chat", &d) }).unwrap();
        let permit = a.permit_id.unwrap().to_string();
        assert!(e.charges().settle_estimate(&rules, &permit, "chat", None, Some(&typo)).is_err());
        let used = usage(&[("output_tokens", 10)]);
        assert!(e.charges().settle_estimate(&rules, &permit, "chat", None, Some(&used)).unwrap().settled);
        assert_eq!(remaining(&e, "chat")[2].0, 490);
    }
}
