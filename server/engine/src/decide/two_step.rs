//! A decision in two steps: the guards and every limit decided here first, then
//! (when strict limits remain and Redis is up) Redis's answer for those, all or
//! nothing across both. The replication module does the asking.

use std::time::Duration;

use smallvec::SmallVec;

use super::{Answer, Matched, Prepared, Verdict, fill_limits};
use crate::Engine;
use crate::guards::{Admitted, Ask, Denial, Guarded};
use crate::installed::RuleHandles;
use crate::limiter::Algorithm;
use crate::limiter::{Decision, Status};
use crate::rules::{Limit, OnRedisError, Rule};
use crate::store::BucketKey;
use crate::sync::Slots;
use crate::sync::{RemoteBreaker, RemoteSlot, SlotOp};
use crate::time::Timestamp;

/// A matched limit and its decision, `None` until Redis answers.
type Decided<'r> = (&'r Limit, usize, BucketKey, Option<Decision>);

/// Redis's decisions over a request's strict limits, in rule order, and the
/// instant (Redis's clock, us) it took their units.
#[derive(Clone, Debug, PartialEq)]
pub struct Remote {
    pub decisions: SmallVec<[Decision; 4]>,
    pub at_us: i64,
}

/// Where a decision stands between its local part and Redis's.
// `Done` is the common case and is returned by value: boxing it would cost an
// allocation per decision. The rare `Remote` is boxed instead.
#[allow(clippy::large_enum_variant)]
pub enum Step<'r> {
    Done(Answer<'r>),
    /// Strict limits remain: ask Redis, then call [`Engine::finish`].
    Remote(Box<Pending<'r>>),
}

/// A decision waiting for Redis's answer on its strict limits.
#[derive(Debug)]
pub struct Pending<'r> {
    answer: Answer<'r>,
    rule: &'r Rule,
    handles: &'r RuleHandles,
    resource: Option<String>,
    guarded: bool,
    settle: bool,
    request_resource: String,
    admitted: Option<Admitted>,
    /// Every matched limit in rule order; the decision is `None` until Redis answers.
    limits: SmallVec<[Decided<'r>; 4]>,
    costs: crate::request::Costs,
    dry_run: bool,
    /// A second decision of the call: its keys are not counted again.
    retried: bool,
    gate: bool,
    /// The call's priority (the concurrency limit's partitions).
    priority: crate::rules::Priority,
    now: Timestamp,
    /// The local limits already gave back what they took (one of them denied).
    given_back: bool,
    /// When Redis took the strict limits' units (its clock, us), once it did.
    redis_at: Option<i64>,
    /// A later source of the rule's waterfall pays if these limits deny.
    more: bool,
    /// A charge's try at a waterfall source: nothing is counted.
    charge: bool,
}

impl<'r> Pending<'r> {
    /// The strict limits Redis must decide, in rule order.
    pub fn strict(&self) -> impl Iterator<Item = (&'r Limit, &BucketKey)> {
        self.limits.iter().filter(|(.., d)| d.is_none()).map(|(l, _, k, _)| (*l, k))
    }

    /// [`Pending::strict`], with what the call takes from each.
    pub fn strict_costs(&self) -> impl Iterator<Item = (&'r Limit, &BucketKey, u64)> {
        self.limits.iter().filter(|(.., d)| d.is_none()).map(|(l, slot, k, _)| (*l, k, self.costs.of(*slot)))
    }

    pub fn resource(&self) -> &str {
        &self.request_resource
    }

    /// A dry run: Redis decides its strict limits and takes nothing.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }
}

/// Denied before anything is taken: an override blocks the request, or its
/// system sheds it.
fn denied_before<'r>(denial: Denial, p: &Prepared<'r>, rule: Option<&'r Rule>, level: u32) -> Answer<'r> {
    let answer = Answer {
        rule: rule.map(|r| &r.name),
        verdict: denial.verdict(),
        retry_after: denial.retry_after(),
        denial: Some(Box::new(denial)),
        ..Answer::allowed(level)
    };
    if !p.dry_run {
        answer.count(p.rule.map_or(p.unmatched, |(_, h)| &h.metrics));
    }
    answer
}

/// Whether the request is shed at `level` (above 0): by its rule's
/// `shed_at_level`, or by its priority, as its rule (else its system) sheds them.
#[inline(never)]
fn shed(p: &Prepared<'_>, level: u32) -> Option<Denial> {
    let rule = p.rule.map(|(r, _)| r);
    let system = || p.scope.name().clone();
    if let Some(at) = rule.and_then(|r| r.shed_at_level).filter(|&at| level >= at) {
        return Some(Denial::Shed { at, level, priority: None, system: system() });
    }
    let by_priority = match rule.and_then(|r| r.shed_priority) {
        Some(own) => own,
        None => p.scope.shedding(),
    };
    let at = by_priority.sheds(p.priority, level)?;
    Some(Denial::Shed { at, level, priority: Some(p.priority), system: system() })
}

/// Reported for a strict limit Redis was not asked about: its size, and
/// what Redis last said it had left (when this replica heard; else its size:
/// nothing is known to be taken).
fn not_asked(l: &Limit, last: Option<u64>) -> Decision {
    let limit = l.algorithm.capacity();
    let remaining = last.unwrap_or(limit).min(limit);
    Decision { admitted: true, status: Status { limit, remaining, ..Status::default() } }
}

impl Engine {
    /// Runs the guards and every limit decided here. When strict limits remain
    /// (replication on, Redis up), the caller asks Redis and calls `finish`.
    #[inline]
    pub fn begin<'r>(&self, mut p: Prepared<'r>, now: Timestamp) -> Step<'r> {
        let level = p.scope.level();
        let shed = if level > 0 && !p.charge { shed(&p, level) } else { None };
        let Some((rule, handles)) = p.rule else {
            if let Some(denial) = shed {
                return Step::Done(denied_before(denial, &p, None, level));
            }
            let answer = Answer::allowed(level);
            if !p.dry_run {
                answer.count(p.unmatched);
            }
            return Step::Done(answer);
        };
        if let Some((retry_after, values)) = p.blocked.take() {
            return Step::Done(denied_before(Denial::Blocked { values, retry_after }, &p, Some(rule), level));
        }
        if let Some(denial) = shed {
            return Step::Done(denied_before(denial, &p, Some(rule), level));
        }
        // Limits Redis decides: with Redis up it is asked (a dry run too:
        // Redis's figure is the one a real call would be decided by); while
        // it is down, each follows its `on_redis_error`, on every request of
        // the outage.
        let redis_limits = p.matched.iter().any(|(l, ..)| self.coordination.decides(l));
        if !p.guarded && !redis_limits {
            // The common case, without the machinery for guards and Redis.
            let mut answer = Answer::of_rule(rule, level);
            let mode = (p.dry_run, p.retried);
            self.decide_limits(&mut answer, handles, &p.matched, &p.request_resource, now, &p.costs, mode);
            if let Some(resource) = p.resource.filter(|_| p.settle && answer.verdict == Verdict::Allowed) {
                let taken = p.matched.iter().map(|(l, slot, k)| (*l, k, p.costs.of(*slot)));
                self.hold_estimate(&mut answer, rule, resource, taken, (p.costs.base(), now, None));
            }
            if !p.dry_run && !p.charge {
                answer.count_unless_passed_on(&handles.metrics, p.more && answer.limits_denied());
            }
            return Step::Done(answer);
        }
        self.begin_guarded(p, (rule, handles), level, now, redis_limits)
    }

    /// [`Engine::begin`] for a resource with guards (shedding, a breaker, a
    /// concurrency limit) or with limits Redis decides.
    fn begin_guarded<'r>(
        &self,
        p: Prepared<'r>,
        (rule, handles): (&'r Rule, &'r RuleHandles),
        level: u32,
        now: Timestamp,
        redis_limits: bool,
    ) -> Step<'r> {
        let mut pending = Pending {
            answer: Answer::of_rule(rule, level),
            rule,
            handles,
            admitted: None,
            limits: SmallVec::new(),
            costs: p.costs,
            dry_run: p.dry_run,
            gate: p.gate,
            priority: p.priority,
            now,
            resource: p.resource,
            guarded: p.guarded,
            settle: p.settle,
            request_resource: p.request_resource,
            given_back: false,
            redis_at: None,
            more: p.more,
            charge: p.charge,
            retried: p.retried,
        };
        if let Some(denied) = self.guard(&mut pending, p.remote_breaker, p.remote_slot) {
            return Step::Done(self.done(pending, denied));
        }
        if !redis_limits {
            let (now, mode) = (pending.now, (pending.dry_run, pending.retried));
            let resource = std::mem::take(&mut pending.request_resource);
            self.decide_limits(&mut pending.answer, handles, &p.matched, &resource, now, &pending.costs, mode);
            pending.limits.extend(p.matched.into_iter().map(|(l, i, k)| (l, i, k, None)));
            return Step::Done(self.conclude(pending));
        }
        self.ask_redis(pending, p.matched)
    }

    /// The limits decided here are taken (all or nothing) before Redis is
    /// asked for the rest: `Remote` when it must be; decided here when a
    /// local limit denies, or Redis is down (the outage policies).
    fn ask_redis<'r>(&self, mut pending: Pending<'r>, matched: Matched<'r>) -> Step<'r> {
        let (remote, local): (Matched<'r>, Matched<'r>) =
            matched.into_iter().partition(|(l, _, _)| self.coordination.decides(l));
        let (now, dry_run) = (pending.now, pending.dry_run);
        let decisions = self.take_or_check(&local, &pending.request_resource, now, &pending.costs, dry_run);
        let denied = local.iter().zip(&decisions).any(|((l, ..), d)| super::enforced_denial(l, d));
        pending.given_back = denied;
        pending.limits.extend(local.into_iter().zip(decisions).map(|((l, i, k), d)| (l, i, k, Some(d))));
        // Denied here: Redis is not asked, and its limits are reported unknown.
        let last = |k: &BucketKey| self.coordination.last_remaining(k);
        pending.limits.extend(remote.into_iter().map(|(l, i, k)| {
            let d = denied.then(|| not_asked(l, last(&k)));
            (l, i, k, d)
        }));
        pending.limits.sort_by_key(|(_, i, _, _)| *i);
        if denied || pending.limits.iter().all(|(.., d)| d.is_some()) {
            return Step::Done(self.finish(pending, Some(Remote { decisions: SmallVec::new(), at_us: 0 })));
        }
        if !self.coordination.store_up() {
            return Step::Done(self.finish(pending, None));
        }
        Step::Remote(Box::new(pending))
    }

    /// Completes a decision with Redis's answers for the strict limits, in
    /// rule order (`None` when Redis could not answer: each strict limit then
    /// follows its `on_redis_error`). When one denies, everything is given back.
    pub fn finish<'r>(&self, mut p: Pending<'r>, remote: Option<Remote>) -> Answer<'r> {
        let strict: Matched<'r> =
            p.limits.iter().filter(|(.., d)| d.is_none()).map(|(l, i, k, _)| (*l, *i, k.clone())).collect();
        let from_redis = match remote {
            Some(r) if r.decisions.len() == strict.len() => {
                p.redis_at = (!strict.is_empty()).then_some(r.at_us);
                r.decisions
            }
            _ => self.without_redis(&strict, &p.request_resource, p.now, &p.costs, p.dry_run),
        };
        let mut from_redis = from_redis.into_iter();
        for (.., d) in p.limits.iter_mut().filter(|(.., d)| d.is_none()) {
            *d = from_redis.next();
        }
        let denied = p.limits.iter().any(|(l, .., d)| d.is_some_and(|d| super::enforced_denial(l, &d)));
        if denied {
            for (l, slot, k, d) in &mut p.limits {
                let cost = p.costs.of(*slot);
                let Some(d) = d.as_mut().filter(|d| d.admitted) else { continue };
                // Redis (or the outage policy) takes its limits all or
                // nothing itself: only the local ones give back here.
                if self.coordination.decides(l) {
                    continue;
                }
                if !p.dry_run && !p.given_back {
                    self.buckets.refund(k, &l.algorithm, p.now, cost);
                    self.note_replicated(l, k, &p.request_resource, -(cost as i64), p.now);
                }
                if d.status.over_limit {
                    super::undo_over_limit(&self.buckets, l, k, d, p.now, cost);
                    continue;
                }
                self.restate(l, k, d, p.now);
            }
        }
        let decisions: SmallVec<[Decision; 4]> = p
            .limits
            .iter()
            .map(|(l, _, k, d)| d.unwrap_or_else(|| not_asked(l, self.coordination.last_remaining(k))))
            .collect();
        let matched: Matched<'r> = p.limits.iter().map(|(l, i, k, _)| (*l, *i, k.clone())).collect();
        fill_limits(&mut p.answer, &matched, &decisions);
        if !p.dry_run && !p.retried {
            super::observe_hitters(p.handles, &matched, &decisions, &p.costs, p.now);
        }
        self.conclude(p)
    }

    /// A decision that will not finish (its caller went away while Redis was
    /// asked): the limits decided here give back what they took, and the
    /// guards' admission goes back as it drops. Nothing is counted: the
    /// caller never got an answer.
    pub fn abandon(&self, p: Pending<'_>) {
        if p.dry_run || p.given_back {
            return;
        }
        for (l, slot, k, d) in &p.limits {
            if d.is_some_and(|d| d.admitted) && !self.coordination.decides(l) {
                let cost = p.costs.of(*slot);
                self.buckets.refund(k, &l.algorithm, p.now, cost);
                self.note_replicated(l, k, &p.request_resource, -(cost as i64), p.now);
            }
        }
    }

    /// Hands out the permit, or gives back what the guards handed out; counts
    /// the decision.
    fn conclude<'r>(&self, mut p: Pending<'r>) -> Answer<'r> {
        if let Some(a) = p.admitted.take() {
            p.answer.breaker_state = a.breaker_state;
            if p.answer.verdict != Verdict::Allowed || p.dry_run || p.gate {
                drop(a);
            } else {
                let resource = p.resource.clone().unwrap_or_default();
                p.answer.holds_slot = a.report_at_once();
                let (id, owed) = self.permits.issue_for(p.rule, resource, a, p.now);
                if let Some((resource, expires_at)) = owed {
                    self.coordination.push_slot_op(SlotOp::Add { resource, id, expires_at });
                }
                p.answer.permit_id = Some(id);
            }
        }
        if let Some(resource) = p.resource.take().filter(|_| p.settle && p.answer.verdict == Verdict::Allowed) {
            let taken = p.limits.iter().map(|(l, slot, k, _)| (*l, k, p.costs.of(*slot)));
            self.hold_estimate(&mut p.answer, p.rule, resource, taken, (p.costs.base(), p.now, p.redis_at));
        }
        // A denial a later source of the waterfall may still turn into an
        // admission is counted by that source's decision, not here.
        if !p.dry_run && !p.charge {
            p.answer.count_unless_passed_on(&p.handles.metrics, p.more && p.answer.limits_denied());
        }
        p.answer
    }

    fn done<'r>(&self, p: Pending<'r>, denial: Denial) -> Answer<'r> {
        let mut p = p;
        p.answer.verdict = denial.verdict();
        p.answer.retry_after = denial.retry_after();
        p.answer.breaker_state = denial.breaker_state();
        p.answer.denial = Some(Box::new(denial));
        self.conclude(p)
    }

    /// The breaker and the concurrency limit; the denial if any.
    fn guard(&self, p: &mut Pending<'_>, remote: Option<RemoteBreaker>, slot: Option<RemoteSlot>) -> Option<Denial> {
        let resource = p.resource.as_ref().filter(|_| p.guarded)?;
        let dry_run = p.dry_run || p.gate;
        let guarded = self.guards.get_or_create(resource, p.rule);
        if let Some(c) = &p.rule.concurrency {
            // What the limit is now (an adaptive one moves).
            p.answer.max_in_flight = guarded.limit(c);
        }
        let slots = self.slots(p.rule, &guarded, slot, dry_run);
        let priority = p.priority;
        let ask = Ask { rule: p.rule, resource, now: p.now, dry_run, gate: p.gate, remote, slots, guarded, priority };
        match self.guards.admit(ask, &self.events) {
            Ok(a) => {
                p.admitted = Some(a);
                None
            }
            Err(denial) => Some(denial),
        }
    }

    /// What a rule's concurrency limit lets through here: its `sync` with
    /// Redis's answer, or its `on_redis_error` while Redis cannot answer.
    fn slots(&self, rule: &Rule, guarded: &Guarded, slot: Option<RemoteSlot>, dry_run: bool) -> Slots {
        let Some(c) = &rule.concurrency else { return Slots::Here(None) };
        let limit = guarded.limit(c);
        if dry_run {
            // Nothing is taken, and Redis is not asked: what this replica
            // holds against the whole limit.
            return Slots::Here(Some(limit));
        }
        self.coordination.slots(c, limit, slot)
    }

    /// A strict charge while Redis is away, on a limit whose
    /// `on_redis_error` is `local`: taken from this replica's outage bucket
    /// too (as what it admits meanwhile is), so that a used-up limit stays
    /// used up here until Redis answers. What the bucket has left after;
    /// `None` for the other modes, or when Redis answers again.
    pub fn charge_in_outage(&self, limit: &Limit, key: &BucketKey, cost: u64) -> Option<Status> {
        if !self.coordination.in_outage() || limit.on_redis_error != OnRedisError::Local {
            return None;
        }
        let now = self.clock.now();
        let alg = limit.algorithm.scaled(self.coordination.share());
        self.outage_bucket(key, &alg, now);
        self.buckets.force(key.clone(), &alg, now, cost);
        Some(self.buckets.check(key, &alg, now, 0).status)
    }

    /// Makes the bucket a strict limit decides from during an outage (`alg`
    /// is the limit scaled to this replica's share): this replica's share of
    /// what Redis last reported left, or of the whole limit if it never did.
    fn outage_bucket(&self, key: &BucketKey, alg: &Algorithm, now: Timestamp) {
        if self.buckets.contains_key(key) {
            return;
        }
        let mut bucket = alg.new_bucket(now);
        if let Some(remaining) = self.coordination.outage_start(key, now) {
            let share = (remaining * self.coordination.share()).floor() as u64;
            bucket.force(alg, now, alg.capacity().saturating_sub(share));
        }
        self.buckets.put(key.clone(), bucket, now);
    }

    /// Strict limits while Redis cannot answer, all or nothing: `local`
    /// decides here with the limit divided among the live replicas, `allow`
    /// admits, `deny` denies. What is admitted is owed to Redis, and paid
    /// when it answers again. A dry run takes and owes nothing.
    fn without_redis(
        &self,
        strict: &Matched<'_>,
        resource: &str,
        now: Timestamp,
        costs: &crate::request::Costs,
        dry_run: bool,
    ) -> SmallVec<[Decision; 4]> {
        let share = self.coordination.share();
        let mut decisions = SmallVec::new();
        let mut taken = Vec::new();
        let mut denied = false;
        for (l, slot, k) in strict {
            let cost = costs.of(*slot);
            let alg = l.algorithm.scaled(share);
            let d = match l.on_redis_error {
                OnRedisError::Allow => {
                    Decision { admitted: true, status: Status { limit: alg.capacity(), ..Status::default() } }
                }
                OnRedisError::Deny => Decision {
                    admitted: false,
                    status: Status { limit: alg.capacity(), retry_after: Duration::from_secs(1), ..Status::default() },
                },
                OnRedisError::Local if denied => self.buckets.check(k, &alg, now, cost),
                // The bucket a real call would decide from (made from what
                // Redis last said, as a real call would make it), checked.
                OnRedisError::Local if dry_run => {
                    self.outage_bucket(k, &alg, now);
                    self.buckets.check(k, &alg, now, cost)
                }
                OnRedisError::Local => {
                    self.outage_bucket(k, &alg, now);
                    let d = self.buckets.acquire(k.clone(), &alg, now, cost);
                    if d.admitted {
                        taken.push((k, alg, cost));
                    }
                    d
                }
            };
            if !d.admitted && !denied {
                denied = true;
                for (k, alg, cost) in &taken {
                    self.buckets.refund(k, alg, now, *cost);
                }
            }
            decisions.push(d);
        }
        if !denied && !dry_run {
            for (_, slot, k) in strict {
                let cost = costs.of(*slot);
                self.coordination.admitted_here(k, resource, i64::try_from(cost).unwrap_or(i64::MAX), now);
            }
        }
        decisions
    }
}
