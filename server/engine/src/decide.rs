//! One decision: shedding, then the breaker and the concurrency limit, then
//! every matched limit, all or nothing. `two_step` holds the guarded path and
//! the form in which strict limits are decided by Redis between two steps.

use std::fmt::Write;
use std::time::Duration;

use smallvec::SmallVec;

use super::counters::RuleMetrics;
use super::guards::{Denial, PermitId};
use super::installed::RuleHandles;
use super::request::{self, Costs, Descriptors, Request, RequestError};
use super::sync::{RemoteBreaker, RemoteSlot};
use super::{Engine, Installed};
use crate::breaker;
use crate::degradation::Scope;
use crate::limiter::{Decision, Status};
use crate::rules::{Limit, Priority, Rule, duration};
use crate::store::{BucketKey, LimitId};
use crate::sync::decided_by_store;
use crate::time::{SharedClock, Timestamp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    RateLimited,
    CircuitOpen,
    ConcurrencyLimited,
    Shed,
}

/// One matched limit after the decision.
#[derive(Clone, Copy, Debug)]
pub struct LimitReport<'r> {
    pub limit: &'r Limit,
    /// The limit's position in its rule.
    pub index: usize,
    pub status: Status,
    /// This limit would not admit the cost (a shadow limit's denial is only
    /// reported: `limit.shadow`; a call admitted over the limit by its
    /// `over_limit` share exceeded it too: `status.over_limit`).
    pub exceeded: bool,
}

impl LimitReport<'_> {
    /// This limit denied the call: it was exceeded, is not in shadow mode,
    /// and did not admit the call over it.
    pub fn denied(&self) -> bool {
        self.exceeded && !self.limit.shadow && !self.status.over_limit
    }
}

/// The answer to one request; borrows names from the rules in force.
#[derive(Clone, Debug)]
pub struct Answer<'r> {
    pub verdict: Verdict,
    /// The matched rule's name, if any.
    pub rule: Option<&'r String>,
    /// One per matched limit, in rule order (empty when denied before the limits).
    /// Two inline: most rules have one or two limits, and an answer is moved
    /// several times on its way out.
    pub limits: SmallVec<[LimitReport<'r>; 2]>,
    pub retry_after: Duration,
    pub wait: Duration,
    /// Set when admitted on a resource with a breaker or a concurrency
    /// limit, or with `settle`.
    pub permit_id: Option<PermitId>,
    /// The permit holds a concurrency slot.
    pub holds_slot: bool,
    /// The rule's concurrency limit (0: none), for clients deciding alone.
    pub max_in_flight: u32,
    pub breaker_state: Option<breaker::State>,
    pub degradation_level: u32,
    /// Why it was denied before the limits were looked at.
    pub denial: Option<Box<Denial>>,
    /// The source of the rule's waterfall that paid for an allowed call;
    /// `None` when the rule's own limits did (or the call was denied).
    pub paid_by: Option<&'r String>,
}

/// Of the waterfall sources whose limits are `limits` (all asked, all
/// denied), the soonest time at which one could pay for a call of `cost`:
/// a source pays once every limit of it has room, so its time is the latest
/// of its limits'; a source with a limit that can never hold `cost` never
/// pays. `None` when no source could.
fn soonest_payable(limits: &[LimitReport<'_>], cost: u64) -> Option<Duration> {
    let mut sources: SmallVec<[u8; 4]> = limits.iter().map(|r| r.limit.source).collect();
    sources.dedup();
    sources
        .into_iter()
        .filter_map(|source| {
            let mut latest = None;
            for r in limits.iter().filter(|r| r.limit.source == source && r.denied()) {
                if r.limit.algorithm.capacity() < cost {
                    return None;
                }
                latest = latest.max(Some(r.status.retry_after));
            }
            latest
        })
        .min()
}

/// Matched limits: (limit, its index in the rule, its bucket).
pub(super) type Matched<'r> = SmallVec<[(&'r Limit, usize, BucketKey); 2]>;

/// A request checked and matched against the rules, not yet decided.
#[derive(Debug)]
pub struct Prepared<'r> {
    pub(super) rule: Option<(&'r Rule, &'r RuleHandles)>,
    /// Where a decision no rule matched is counted.
    pub(super) unmatched: &'r RuleMetrics,
    /// The resource, kept when the rule guards it (breaker or concurrency)
    /// or the cost is an estimate to settle.
    pub(super) resource: Option<String>,
    /// The rule has a breaker or a concurrency limit.
    pub(super) guarded: bool,
    /// The cost is an estimate: an allowed decision holds it for its report.
    pub(super) settle: bool,
    /// The resource when replication needs it (a hash tag); else empty.
    pub(super) request_resource: String,
    pub(super) matched: Matched<'r>,
    /// What the call takes from each matched limit.
    pub(super) costs: Costs,
    pub(super) dry_run: bool,
    /// The guards only gate: no permit is handed out, nothing is taken from
    /// them (Envoy's RLS, which never reports back).
    pub(super) gate: bool,
    /// Redis's answer when the resource's breaker needed a probe.
    pub(super) remote_breaker: Option<RemoteBreaker>,
    /// Redis's answer for a strict concurrency slot.
    pub(super) remote_slot: Option<RemoteSlot>,
    /// An override blocks the request: its `retry_after` and the values.
    pub(super) blocked: Option<(Duration, String)>,
    /// The resource's degradation scope: its system's, or the global one.
    pub(super) scope: &'r Scope,
    pub(super) priority: Priority,
    /// The source of the rule's waterfall whose limits were matched: 0 for
    /// the rule's own limits.
    pub(super) source: u8,
    /// A later source of the waterfall may pay if these limits have no
    /// room: a denial by them is not counted (the last source's is).
    pub(super) more: bool,
    /// A charge's try at a waterfall source: no guard, shedding or block
    /// applies (the call happened), and nothing is counted as a decision.
    pub(super) charge: bool,
    /// A second decision of the same call (after a sync brought a larger
    /// lease): its keys were counted among the hottest and in the traffic
    /// record by the first one, and are not counted again.
    pub(super) retried: bool,
}

impl<'r> Prepared<'r> {
    /// Decides the breaker as the shared breaker answered.
    pub fn set_remote_breaker(&mut self, answer: RemoteBreaker) {
        self.remote_breaker = Some(answer);
    }

    /// Decides a strict concurrency limit as Redis answered.
    pub fn set_remote_slot(&mut self, answer: RemoteSlot) {
        self.remote_slot = Some(answer);
    }

    /// The same call decided a second time: its keys are not counted again
    /// among the hottest or in the traffic record.
    pub fn retried(mut self) -> Self {
        self.retried = true;
        self
    }

    /// The matched rule's concurrency limit, when the call is decided (not
    /// a dry run, not a gate) and so would take a slot.
    pub fn concurrency(&self) -> Option<&crate::rules::Concurrency> {
        if self.dry_run || self.gate || !self.guarded {
            return None;
        }
        self.rule.and_then(|(r, _)| r.concurrency.as_ref())
    }

    /// The replicated limits' buckets this process does not hold yet.
    pub fn replicated_keys(&self) -> impl Iterator<Item = (&Limit, &BucketKey)> {
        self.replicated().map(|(l, _, k)| (l, k))
    }

    /// [`Prepared::replicated_keys`], with what the call takes from each.
    pub fn replicated_costs(&self) -> impl Iterator<Item = (&BucketKey, u64)> {
        self.replicated().map(|(_, slot, k)| (k, self.costs.of(slot)))
    }

    fn replicated(&self) -> impl Iterator<Item = (&Limit, usize, &BucketKey)> {
        self.matched
            .iter()
            .filter(|(l, ..)| l.sync.is_replicated() && !decided_by_store(l))
            .map(|(l, slot, k)| (*l, *slot, k))
    }

    /// Whether the matched rule has a circuit breaker.
    pub(crate) fn has_breaker(&self) -> bool {
        self.rule.is_some_and(|(r, _)| r.breaker.is_some())
    }

    /// The largest cost the call takes from one limit.
    pub fn cost(&self) -> u64 {
        self.matched.iter().map(|(_, slot, _)| self.costs.of(*slot)).max().unwrap_or(self.costs.base())
    }

    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Whether the guards only gate this decision (no permit).
    pub fn gate(&self) -> bool {
        self.gate
    }

    /// The request's resource, when replication needs it; else empty.
    pub fn resource(&self) -> &str {
        &self.request_resource
    }

    /// The next source of the rule's waterfall, which pays for the call if
    /// these limits deny it ([`Answer::limits_denied`]); `None` when there
    /// is none.
    pub fn next_source(&self) -> Option<u8> {
        self.more.then_some(self.source + 1)
    }

    /// The source of the waterfall these limits are (0: the rule's own).
    pub fn source(&self) -> u8 {
        self.source
    }

    /// The name of the waterfall source these limits are (`None`: the
    /// rule's own limits).
    pub fn source_name(&self) -> Option<&'r String> {
        self.rule.and_then(|(r, _)| r.source_name(self.source))
    }
}

// === impl Denial ===

impl Denial {
    /// The verdict a denial before the limits answers. (Here, not beside
    /// `Denial`: the guards know nothing of answers.)
    pub fn verdict(&self) -> Verdict {
        match self {
            Denial::Blocked { .. } => Verdict::RateLimited,
            Denial::Shed { .. } => Verdict::Shed,
            Denial::CircuitOpen { .. } => Verdict::CircuitOpen,
            Denial::Concurrency { .. } => Verdict::ConcurrencyLimited,
        }
    }
}

// === impl Answer ===

impl<'r> Answer<'r> {
    pub(super) fn allowed(level: u32) -> Self {
        Answer {
            verdict: Verdict::Allowed,
            rule: None,
            limits: SmallVec::new(),
            retry_after: Duration::ZERO,
            wait: Duration::ZERO,
            permit_id: None,
            holds_slot: false,
            max_in_flight: 0,
            breaker_state: None,
            degradation_level: level,
            denial: None,
            paid_by: None,
        }
    }

    /// Allowed by `rule`, so far.
    pub(super) fn of_rule(rule: &'r Rule, level: u32) -> Answer<'r> {
        let max_in_flight = rule.concurrency.map_or(0, |c| c.max_in_flight);
        Answer { rule: Some(&rule.name), max_in_flight, ..Answer::allowed(level) }
    }

    /// Denied by its limits, not before them (a breaker, shedding, an
    /// override's block): the one denial a waterfall's next source answers.
    pub fn limits_denied(&self) -> bool {
        self.verdict == Verdict::RateLimited && self.denial.is_none()
    }

    /// One waterfall source's denial (`self`), followed by a later source's
    /// answer, which decides the call. The answer lists every source's
    /// limits asked, in order (so that it shows why an earlier one did not
    /// pay); a call no source had room for may come back when the first
    /// has room again.
    ///
    /// A denial's `retry_after` is the soonest at which a source asked
    /// could pay for the call (`cost`): a source whose limit can never hold
    /// that cost is left out, as long as another source could.
    pub fn then_source(&mut self, later: Answer<'r>, cost: u64) {
        let denied = later.limits_denied();
        let mut retry_after = if denied { self.retry_after.min(later.retry_after) } else { later.retry_after };
        let mut limits = std::mem::take(&mut self.limits);
        limits.extend(later.limits.iter().copied());
        if denied && let Some(soonest) = soonest_payable(&limits, cost) {
            retry_after = soonest;
        }
        *self = Answer { limits, retry_after, ..later };
    }

    /// Counts this decision in its rule's counters, or, when a later
    /// source of the rule's waterfall decides the call (`passed_on`), only
    /// what each of its limits said.
    pub(super) fn count_unless_passed_on(&self, metrics: &RuleMetrics, passed_on: bool) {
        if passed_on {
            metrics.record_limits(self.limit_results());
        } else {
            self.count(metrics);
        }
    }

    fn limit_results(&self) -> impl Iterator<Item = (usize, bool, bool, bool)> + '_ {
        self.limits.iter().map(|r| (r.index, r.exceeded, r.limit.shadow, r.status.over_limit))
    }

    /// Counts this decision in its rule's counters.
    pub(super) fn count(&self, metrics: &RuleMetrics) {
        let verdict = match self.verdict {
            Verdict::Allowed => 0,
            Verdict::RateLimited => 1,
            Verdict::CircuitOpen => 2,
            Verdict::ConcurrencyLimited => 3,
            Verdict::Shed => 4,
        };
        let denied_by = match self.verdict {
            Verdict::RateLimited => self.limits.iter().find(|r| r.denied()).map(|r| r.index),
            _ => None,
        };
        metrics.record(verdict, denied_by, self.limit_results());
    }

    /// One human line for a denial, naming the limit or breaker; empty when allowed.
    pub fn reason(&self) -> String {
        if let Some(denial) = &self.denial {
            return denial.to_string();
        }
        let mut out = String::new();
        for report in self.limits.iter().filter(|r| r.denied()) {
            if !out.is_empty() {
                out.push_str("; ");
            }
            let l = report.limit;
            let _ = write!(
                out,
                "limit '{}' ({}) exceeded, retry in {}",
                l.name,
                l.algorithm.summary(),
                duration::human(report.status.retry_after),
            );
        }
        out
    }
}

// === impl Engine ===

impl Engine {
    /// Decides one request against `rules` (from [`Engine::rules`]).
    #[inline]
    pub fn acquire<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
    ) -> Result<Answer<'r>, RequestError> {
        let prepared = self.prepare(rules, req)?;
        Ok(self.decide_waterfall(rules, req, prepared, self.clock.now()))
    }

    /// Decides a prepared request and, when its limits deny it and its rule
    /// has a waterfall, each later source in turn until one pays.
    pub fn decide_waterfall<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
        mut p: Prepared<'r>,
        now: Timestamp,
    ) -> Answer<'r> {
        // Most rules have no waterfall: their answer is the decision, with
        // no source to name and nothing to carry between sources.
        if p.next_source().is_none() && p.source() == 0 {
            return self.decide(p, now);
        }
        let mut before: Option<Answer<'r>> = None;
        loop {
            let (next, paid_by) = (p.next_source(), p.source_name());
            let mut answer = self.decide(p, now);
            answer.paid_by = paid_by.filter(|_| answer.verdict == Verdict::Allowed);
            if let Some(mut b) = before.take() {
                b.then_source(answer, u64::from(req.cost));
                answer = b;
            }
            match next.filter(|_| answer.limits_denied()).and_then(|n| self.prepare_source(rules, req, n)) {
                Some(later) => {
                    p = later;
                    before = Some(answer);
                }
                None => return answer,
            }
        }
    }

    /// Checks a request and matches it, deciding nothing: every error a
    /// decision could meet is found here, so a batch can be refused whole.
    pub fn prepare<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
    ) -> Result<Prepared<'r>, RequestError> {
        self.prepare_in(rules, req, 0)
    }

    /// [`Engine::prepare`] for the waterfall's source `n` or, when that
    /// source cannot pay for the request (no limit of it applies, as a
    /// descriptor it keys on is missing, or the cost is more than it ever
    /// holds), the first later one that can; `None` when no later source
    /// can (the call is denied by the sources before).
    pub fn prepare_source<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
        mut n: u8,
    ) -> Option<Prepared<'r>> {
        let len = rules.find(req.resource).map_or(0, |(r, _)| r.waterfall_len());
        while n <= len {
            // The request was checked by the rule's own limits first: an
            // error here is this source's (its capacity), not the request's.
            if let Ok(p) = self.prepare_in(rules, req, n)
                && !p.matched.is_empty()
            {
                return Some(p);
            }
            n += 1;
        }
        None
    }

    /// A `Charge`'s try at the waterfall's source `source`: its limits
    /// take the charge only if every one of them has room for it, all or
    /// nothing (strict ones in Redis, as a decision is taken), and no guard,
    /// shedding or counting applies: the charge is for a call that
    /// happened. `None` when the source cannot pay (no limit of it applies,
    /// the charge is more than it ever holds, an override blocks the caller).
    pub fn prepare_charge<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
        cost: u64,
        source: u8,
    ) -> Option<Prepared<'r>> {
        let mut p = self.prepare_in(rules, req, source).ok()?;
        if p.matched.is_empty() || p.blocked.is_some() {
            return None;
        }
        p.costs = costs_of(p.rule.map(|(r, _)| r), &p.matched, req.usage, cost, 0).ok()?;
        if p.matched.iter().any(|(l, slot, _)| p.costs.of(*slot) > l.algorithm.capacity()) {
            return None;
        }
        p.guarded = false;
        p.gate = true;
        p.settle = false;
        p.resource = None;
        p.more = false;
        p.charge = true;
        Some(p)
    }

    fn prepare_in<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
        source: u8,
    ) -> Result<Prepared<'r>, RequestError> {
        request::validate(req.resource, req.descriptors)?;
        let cost = u64::from(req.cost.max(1));
        let rule = rules.find(req.resource);
        let mut blocked = None;
        let matched = match rule {
            None => Matched::default(),
            Some((r, h)) => match limits_for(r, h, req.descriptors, &self.clock) {
                Ok(limits) => matched_in(limits, r.per_resource(), req.resource, req.descriptors, Some(source)),
                Err(block) => {
                    blocked = Some(block);
                    Matched::default()
                }
            },
        };
        let costs = costs_of(rule.map(|(r, _)| r), &matched, req.usage, cost, 1)?;
        for (limit, slot, _) in &matched {
            let capacity = limit.algorithm.capacity();
            let cost = costs.of(*slot);
            // A limit of 0 (Sentinel's threshold below one call) denies; it is
            // not an error. A shadow limit never changes the answer: a cost
            // beyond it is only reported as what it would have denied.
            if !limit.shadow && capacity > 0 && cost > capacity {
                // More than the rule's own limits ever hold, but a later
                // source of its waterfall may pay: they deny and pass it on.
                let more = rule.map_or(0, |(r, _)| r.waterfall_len());
                if source == 0 && more > 0 && self.prepare_source(rules, req, 1).is_some() {
                    continue;
                }
                return Err(RequestError::CostExceedsCapacity { cost, capacity, limit: limit.name.clone() });
            }
        }
        let guarded = rule.is_some_and(|(r, _)| r.breaker.is_some() || r.concurrency.is_some());
        let settle = req.settle && !req.dry_run;
        let resource = (guarded || settle).then(|| req.resource.to_string());
        let request_resource = if self.coordination.notes_takes() { req.resource.to_string() } else { String::new() };
        let scope = rule.and_then(|(_, h)| h.scope.as_deref()).unwrap_or_else(|| rules.scope_of(req.resource));
        Ok(Prepared {
            rule,
            unmatched: &rules.handles.unmatched,
            resource,
            guarded,
            settle,
            request_resource,
            matched,
            costs,
            dry_run: req.dry_run,
            gate: false,
            remote_breaker: None,
            remote_slot: None,
            blocked,
            scope,
            priority: req.priority,
            source,
            more: rule.is_some_and(|(r, _)| source < r.waterfall_len()),
            charge: false,
            retried: false,
        })
    }

    /// Decides a prepared request at `now`, entirely in this process: strict
    /// limits, if any, follow their `on_redis_error`.
    #[inline]
    pub fn decide<'r>(&self, p: Prepared<'r>, now: Timestamp) -> Answer<'r> {
        match self.begin(p, now) {
            Step::Done(answer) => answer,
            Step::Remote(pending) => self.finish(*pending, None),
        }
    }

    /// Every limit decided in this process, all or nothing, into `answer`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide_limits<'r>(
        &self,
        answer: &mut Answer<'r>,
        handles: &RuleHandles,
        matched: &Matched<'r>,
        resource: &str,
        now: Timestamp,
        costs: &Costs,
        (dry_run, retried): (bool, bool),
    ) {
        let mut decisions = self.take_or_check(matched, resource, now, costs, dry_run);
        if matched.iter().zip(&decisions).any(|((l, ..), d)| enforced_denial(l, d)) {
            for ((l, _, k), d) in matched.iter().zip(&mut decisions).filter(|(_, d)| d.admitted) {
                self.restate(l, k, d, now);
            }
        }
        fill_limits(answer, matched, &decisions);
        if !dry_run && !retried {
            observe_hitters(handles, matched, &decisions, costs, now);
        }
    }

    /// Every matched limit's decision: taken all or nothing, or on a dry run
    /// only checked.
    pub(super) fn take_or_check(
        &self,
        matched: &Matched<'_>,
        resource: &str,
        now: Timestamp,
        costs: &Costs,
        dry_run: bool,
    ) -> SmallVec<[Decision; 4]> {
        if dry_run {
            matched.iter().map(|(l, slot, k)| self.buckets.check(k, &l.algorithm, now, costs.of(*slot))).collect()
        } else {
            self.take_all_or_nothing(matched, resource, now, costs)
        }
    }

    /// A limit that would have admitted a call another limit denied: nothing
    /// was taken, so it reports what it holds, not what it would hold after
    /// the cost.
    pub(super) fn restate(&self, l: &Limit, key: &BucketKey, d: &mut Decision, now: Timestamp) {
        d.status = self.buckets.check(key, &l.algorithm, now, 0).status;
    }

    /// The state of a resource's limits for these descriptors, consuming nothing.
    /// `only` keeps one limit by name.
    pub fn peek<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        resource: &str,
        descriptors: &D,
        only: Option<&str>,
    ) -> Result<Answer<'r>, RequestError> {
        self.peek_keys(rules, resource, descriptors, only).map(|(answer, _)| answer)
    }

    /// [`Engine::peek`], with each reported limit's bucket, in the order of
    /// `answer.limits`: a replica that shares its limits reads the buckets
    /// it does not decide alone (strict limits, replicated buckets it does
    /// not hold) from the store, and restates them.
    pub fn peek_keys<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        resource: &str,
        descriptors: &D,
        only: Option<&str>,
    ) -> Result<(Answer<'r>, PeekedKeys<'r>), RequestError> {
        request::validate(resource, descriptors)?;
        let level = rules.scope_of(resource).level();
        let Some((rule, handles)) = rules.find(resource) else {
            return Ok((Answer::allowed(level), SmallVec::new()));
        };
        let mut matched = matched(rule, handles, resource, descriptors, &self.clock, None);
        matched.retain(|(l, _, _)| only.is_none_or(|name| l.name == name));
        let now = self.clock.now();
        let decisions: SmallVec<[Decision; 4]> =
            matched.iter().map(|(l, _, k)| self.buckets.check(k, &l.algorithm, now, 0)).collect();
        let mut answer = Answer::of_rule(rule, level);
        fill_limits(&mut answer, &matched, &decisions);
        answer.breaker_state = self.guards.state_for(rule, resource);
        Ok((answer, matched.into_iter().map(|(l, _, k)| (l, k)).collect()))
    }

    /// Takes `cost` from every matched bucket, or from none: when one denies,
    /// what the earlier ones took is given back, and the later ones are only
    /// checked so that the answer still reports every limit. A concurrent
    /// caller may see the taken units for that instant: it can be denied
    /// spuriously, never admitted beyond a limit. A shadow limit takes what it
    /// admits, and its denial denies nothing.
    pub(super) fn take_all_or_nothing(
        &self,
        matched: &Matched<'_>,
        resource: &str,
        now: Timestamp,
        costs: &Costs,
    ) -> SmallVec<[Decision; 4]> {
        take_all_or_nothing(&self.buckets, matched, now, costs, |l, k, units| {
            self.note_replicated(l, k, resource, units, now)
        })
    }

    /// Keeps count of what a replicated limit took, for the next sync.
    pub(super) fn note_replicated(&self, l: &Limit, key: &BucketKey, resource: &str, units: i64, now: Timestamp) {
        self.coordination.note_take(l, key, resource, units, now);
    }
}

/// The buckets of the limits a peek reports, in the order of its answer.
pub type PeekedKeys<'r> = SmallVec<[(&'r Limit, BucketKey); 2]>;

/// How long a caller its origin refuses is told to wait: the answer will not
/// change until the rules do.
const ORIGIN_REFUSED_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// The limits that decide a request under `rule`: an override's for the
/// descriptor values it names, else the rule's; `Err` when an override blocks
/// them (its `retry_after`, and the values).
pub(super) fn limits_for<'r, D: Descriptors + ?Sized>(
    rule: &'r Rule,
    handles: &'r RuleHandles,
    d: &D,
    clock: &SharedClock,
) -> Result<LimitsFor<'r>, (std::time::Duration, String)> {
    let own = LimitsFor::own(rule, handles.ids(None));
    if let Some(origins) = &rule.origins {
        let value = d.get(&origins.key);
        if !origins.admits(value) {
            let what = if origins.allow { "not among the allowed ones" } else { "denied" };
            let why =
                format!("the origins rule: {}='{}' is {what}", origins.key, value.unwrap_or_default().escape_debug());
            return Err((ORIGIN_REFUSED_RETRY, why));
        }
    }
    if rule.overrides.is_empty() {
        return Ok(own);
    }
    let Some((i, o)) = rule.overrides.find(|k| d.get(k), || clock.now().as_nanos()) else { return Ok(own) };
    match &o.action {
        crate::rules::overrides::Action::Block { retry_after } => {
            let values = crate::request::pairs_text(o.when.iter().map(|(k, v)| (k, v)));
            Err((*retry_after, format!("an override for {values}")))
        }
        _ => Ok(LimitsFor { limits: &o.limits, slots: Some(&o.slots), ids: handles.ids(Some(i)) }),
    }
}

/// The limits deciding a request, their ids, and where each is counted (an
/// override's limits by their rule-wide slot; the rule's own by their
/// position).
#[derive(Clone, Copy)]
pub(super) struct LimitsFor<'r> {
    limits: &'r [crate::rules::Limit],
    slots: Option<&'r [usize]>,
    ids: &'r [LimitId],
}

impl<'r> LimitsFor<'r> {
    /// The rule's own limits, overrides aside, with these ids.
    pub(super) fn own(rule: &'r Rule, ids: &'r [LimitId]) -> Self {
        LimitsFor { limits: &rule.limits, slots: None, ids }
    }
}

/// The limits of `rule` that apply to a request: a keyed limit applies only
/// when every descriptor it names is present; none when an override blocks it.
pub(super) fn matched<'r, D: Descriptors + ?Sized>(
    rule: &'r Rule,
    handles: &'r RuleHandles,
    resource: &str,
    d: &D,
    clock: &SharedClock,
    source: Option<u8>,
) -> Matched<'r> {
    match limits_for(rule, handles, d, clock) {
        Ok(limits) => matched_in(limits, rule.per_resource(), resource, d, source),
        Err(_) => Matched::default(),
    }
}

/// The limits of `limits` that apply to a request, of the waterfall's
/// `source` only (0: the rule's own limits), or of every source (`None`).
pub(super) fn matched_in<'r, D: Descriptors + ?Sized>(
    limits: LimitsFor<'r>,
    per_resource: bool,
    resource: &str,
    d: &D,
    source: Option<u8>,
) -> Matched<'r> {
    let slot = |i: usize| limits.slots.map_or(i, |s| s[i]);
    limits
        .limits
        .iter()
        .enumerate()
        .filter_map(|(index, limit)| {
            let id = limits.ids[index];
            if source.is_some_and(|s| s != limit.source) || !limit.when.iter().all(|c| c.holds(d.get(&c.key))) {
                return None;
            }
            if limit.key.is_empty() && !per_resource {
                return Some((limit, slot(index), BucketKey::global(id)));
            }
            let mut parts: SmallVec<[&str; 4]> = SmallVec::new();
            if per_resource {
                parts.push(resource);
            }
            for k in &limit.key {
                parts.push(d.get(k)?);
            }
            Some((limit, slot(index), BucketKey::new(id, parts)))
        })
        .collect()
}

/// What a call of `cost` that reported `usage` takes from each matched
/// limit of `rule`: the limits with a `cost` formula take what it gives,
/// and at least `least` (1 for a question: a call that takes nothing would
/// pass a budget used up; 0 for a charge).
pub(super) fn costs_of(
    rule: Option<&Rule>,
    matched: &Matched<'_>,
    usage: Option<&request::Usage>,
    cost: u64,
    least: u64,
) -> Result<Costs, RequestError> {
    let (Some(usage), Some(rule)) = (usage, rule) else { return Ok(Costs::same(cost)) };
    request::check_usage(rule, usage)?;
    let mut each = Vec::new();
    for (limit, slot, _) in matched {
        if let Some(by_usage) = request::formula_cost(limit, usage) {
            each.push((*slot, by_usage?.max(least)));
        }
    }
    Ok(Costs::with(cost, each))
}

/// [`Engine::take_all_or_nothing`] in any bucket store; `taken` hears of
/// every unit taken (positive) or given back (negative), per bucket.
pub(super) fn take_all_or_nothing(
    buckets: &crate::store::Buckets,
    matched: &Matched<'_>,
    now: Timestamp,
    costs: &Costs,
    mut taken: impl FnMut(&Limit, &BucketKey, i64),
) -> SmallVec<[Decision; 4]> {
    let mut decisions = SmallVec::new();
    let mut denied = false;
    for (limit, slot, key) in matched {
        let alg = &limit.algorithm;
        let cost = costs.of(*slot);
        let d = if denied {
            buckets.check(key, alg, now, cost)
        } else {
            // Noted before it is taken, and undone if it was not: a replica
            // adopting a merged state meanwhile counts it either way.
            taken(limit, key, cost as i64);
            let d = buckets.acquire(key.clone(), alg, now, cost);
            if !d.admitted && !limit.shadow && over_limit_admits(limit, key, now, cost, &d) {
                // Admitted over the limit: taken beyond it, so that a denial
                // by a later limit gives it back as any take, and what the
                // call costs counts wherever the limit's usage counts. The
                // status is the bucket's after the take.
                buckets.force(key.clone(), alg, now, cost);
                let after = buckets.check(key, alg, now, 0).status;
                let status = Status { remaining: 0, retry_after: Duration::ZERO, over_limit: true, ..after };
                Decision { admitted: true, status }
            } else {
                if !d.admitted {
                    taken(limit, key, -(cost as i64));
                }
                d
            }
        };
        if !d.admitted && !denied && !limit.shadow {
            denied = true;
            let admitted = matched.iter().zip(decisions.iter_mut()).filter(|(_, d): &(_, &mut Decision)| d.admitted);
            for ((l, slot, k), d) in admitted {
                let cost = costs.of(*slot);
                buckets.refund(k, &l.algorithm, now, cost);
                taken(l, k, -(cost as i64));
                undo_over_limit(buckets, l, k, d, now, cost);
            }
        }
        decisions.push(d);
    }
    decisions
}

/// A call admitted over `l` (its `over_limit`) and then denied by another
/// limit, its take given back: `l` denied it too, and says so (exceeded,
/// with when the cost would fit, in the reason), as it would have without
/// the draw.
pub(super) fn undo_over_limit(
    buckets: &crate::store::Buckets,
    l: &Limit,
    k: &BucketKey,
    d: &mut Decision,
    now: Timestamp,
    cost: u64,
) {
    if d.status.over_limit {
        *d = buckets.check(k, &l.algorithm, now, cost);
    }
}

/// Whether this call, which `limit` denied (`denied`), is one of the share
/// its `over_limit` admits anyway. Each call is drawn on its own from a hash
/// of a process-wide sequence, the bucket and the time, so that every call
/// over the limit has the same chance. A cost the limit could never hold is
/// not admitted over it, nor is a call whose cost would fit only a whole
/// window from now: what calls admitted over the limit take puts a caller
/// at most about one window (the time the limit takes to refill from
/// empty) in debt.
fn over_limit_admits(limit: &Limit, key: &BucketKey, now: Timestamp, cost: u64, denied: &Decision) -> bool {
    use std::hash::{Hash, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let Some(o) = limit.over_limit else { return false };
    if cost > limit.algorithm.capacity() || denied.status.retry_after >= limit.algorithm.window() {
        return false;
    }
    // With `ramp`, the share falls with the caller's debt: from `admit` when
    // the cost fits at once to none when it fits a whole window from now.
    let share = if o.ramp {
        let owed = denied.status.retry_after.as_secs_f64() / limit.algorithm.window().as_secs_f64();
        (f64::from(o.admit_ppm) * (1.0 - owed)).max(0.0) as u64
    } else {
        u64::from(o.admit_ppm)
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (DRAWS.fetch_add(1, Ordering::Relaxed), key, now.as_nanos()).hash(&mut h);
    h.finish() % 1_000_000 < share
}

/// A denial that counts: by a limit that is not in shadow mode.
pub(super) fn enforced_denial(l: &Limit, d: &Decision) -> bool {
    !d.admitted && !l.shadow
}

/// Counts each matched limit's decision among its hottest keys, and in its
/// recorded traffic when it has `history` (a global bucket has no key worth
/// naming).
#[inline]
pub(super) fn observe_hitters(
    handles: &RuleHandles,
    matched: &Matched<'_>,
    decisions: &[Decision],
    costs: &Costs,
    now: Timestamp,
) {
    for ((_, slot, key), d) in matched.iter().zip(decisions) {
        if let Some(h) = handles.hitters(*slot)
            && !key.scope.is_empty()
        {
            h.observe(&key.scope, !d.admitted, || now.as_nanos() / 1_000_000_000);
            if let Some(t) = handles.traffic(*slot) {
                // Units, as the limit counts them: a call of cost 10 is 10.
                t.count(&key.scope, costs.of(*slot), now.as_nanos() / 1_000_000_000);
            }
        }
    }
}

pub(super) fn fill_limits<'r>(answer: &mut Answer<'r>, matched: &Matched<'r>, decisions: &[Decision]) {
    for ((limit, index, _), d) in matched.iter().zip(decisions) {
        if enforced_denial(limit, d) {
            answer.verdict = Verdict::RateLimited;
            answer.retry_after = answer.retry_after.max(d.status.retry_after);
        }
        answer.wait = answer.wait.max(d.status.wait);
        let exceeded = !d.admitted || d.status.over_limit;
        answer.limits.push(LimitReport { limit, index: *index, status: d.status, exceeded });
    }
    if answer.verdict != Verdict::Allowed {
        answer.wait = Duration::ZERO;
    }
}

mod two_step;

pub use two_step::{Pending, Remote, Step};
