//! One decision: shedding, then the breaker and the concurrency limit, then
//! every matched limit, all or nothing.

use std::fmt::Write;
use std::time::Duration;

use smallvec::SmallVec;

use super::admit::{Admitted, Denial};
use super::request::{self, Descriptors, Request, RequestError};
use super::shared::RemoteBreaker;
use super::{Engine, Installed};
use crate::breaker;
use crate::limiter::{Decision, Status};
use crate::metrics::RuleMetrics;
use crate::rules::{Limit, OnRedisError, Rule, SyncMode, duration};
use crate::store::BucketKey;
use crate::time::Timestamp;

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
    /// This limit would not admit the cost.
    pub exceeded: bool,
}

/// The answer to one request; borrows names from the rules in force.
#[derive(Clone, Debug)]
pub struct Answer<'r> {
    pub verdict: Verdict,
    /// The matched rule's name, if any.
    pub rule: Option<&'r str>,
    /// One per matched limit, in rule order (empty when denied before the limits).
    /// Two inline: most rules have one or two limits, and an answer is moved
    /// several times on its way out.
    pub limits: SmallVec<[LimitReport<'r>; 2]>,
    pub retry_after: Duration,
    pub wait: Duration,
    /// Set when admitted on a resource with a breaker or a concurrency limit.
    pub permit_id: Option<String>,
    pub breaker_state: Option<breaker::State>,
    pub degradation_level: u32,
    /// Why it was denied before the limits were looked at.
    pub denial: Option<Box<Denial>>,
}

/// A matched limit and its decision, `None` until Redis answers.
type Decided<'r> = (&'r Limit, usize, BucketKey, Option<Decision>);

/// Matched limits: (limit, its index in the rule, its bucket).
type Matched<'r> = SmallVec<[(&'r Limit, usize, BucketKey); 2]>;

/// A request checked and matched against the rules, not yet decided.
#[derive(Debug)]
pub struct Prepared<'r> {
    rule: Option<(&'r Rule, &'r RuleMetrics)>,
    /// The resource, kept when the rule guards it (breaker or concurrency).
    resource: Option<String>,
    /// The resource when replication needs it (a hash tag); else empty.
    request_resource: String,
    matched: Matched<'r>,
    cost: u64,
    dry_run: bool,
    /// Redis's answer when the resource's breaker needed a probe.
    remote_breaker: Option<RemoteBreaker>,
}

impl Prepared<'_> {
    /// Decides the breaker as the shared breaker answered.
    pub fn with_remote_breaker(mut self, answer: RemoteBreaker) -> Self {
        self.remote_breaker = Some(answer);
        self
    }

    /// The replicated limits' buckets this process does not hold yet.
    pub fn replicated_keys(&self) -> impl Iterator<Item = (&Limit, &BucketKey)> {
        self.matched
            .iter()
            .filter(|(l, ..)| l.sync == SyncMode::Replicated && !decided_by_redis(l))
            .map(|(l, _, k)| (*l, k))
    }

    pub fn request_resource(&self) -> &str {
        &self.request_resource
    }

    pub fn cost(&self) -> u64 {
        self.cost
    }
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
    metrics: &'r RuleMetrics,
    resource: Option<String>,
    request_resource: String,
    admitted: Option<Admitted>,
    /// Every matched limit in rule order; the decision is `None` until Redis answers.
    limits: SmallVec<[Decided<'r>; 4]>,
    cost: u64,
    dry_run: bool,
    now: Timestamp,
    /// The local limits already gave back what they took (one of them denied).
    given_back: bool,
}

impl<'r> Pending<'r> {
    /// The strict limits Redis must decide, in rule order.
    pub fn strict(&self) -> impl Iterator<Item = (&'r Limit, &BucketKey)> {
        self.limits.iter().filter(|(.., d)| d.is_none()).map(|(l, _, k, _)| (*l, k))
    }

    pub fn resource(&self) -> &str {
        &self.request_resource
    }

    pub fn cost(&self) -> u64 {
        self.cost
    }
}

/// Reported for a strict limit Redis was not asked about: its size, no state.
fn not_asked(l: &Limit) -> Decision {
    Decision { admitted: true, status: Status { limit: l.algorithm.capacity(), ..Status::default() } }
}

/// Whether Redis decides this limit when replication is on: strict limits,
/// and sliding logs (an exact log cannot be shared approximately).
pub fn decided_by_redis(l: &Limit) -> bool {
    l.sync == SyncMode::Strict
        || (l.sync == SyncMode::Replicated && matches!(l.algorithm, crate::limiter::Algorithm::SlidingWindowLog(_)))
}

// === impl Answer ===

impl Answer<'_> {
    fn allowed(level: u32) -> Self {
        Answer {
            verdict: Verdict::Allowed,
            rule: None,
            limits: SmallVec::new(),
            retry_after: Duration::ZERO,
            wait: Duration::ZERO,
            permit_id: None,
            breaker_state: None,
            degradation_level: level,
            denial: None,
        }
    }

    /// One human line for a denial, naming the limit or breaker; empty when allowed.
    pub fn reason(&self) -> String {
        if let Some(denial) = &self.denial {
            return denial.to_string();
        }
        let mut out = String::new();
        for report in self.limits.iter().filter(|r| r.exceeded) {
            if !out.is_empty() {
                out.push_str("; ");
            }
            let (l, alg) = (report.limit, &report.limit.algorithm);
            let _ = write!(
                out,
                "limit '{}' ({} {} per {}) exceeded, retry in {}",
                l.name,
                alg.name(),
                alg.capacity(),
                duration::format(alg.window()),
                duration::human(report.status.retry_after),
            );
        }
        out
    }
}

// === impl Engine ===

impl Engine {
    /// Decides one request against `rules` (from [`Engine::rules`]).
    pub fn acquire<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
    ) -> Result<Answer<'r>, RequestError> {
        let prepared = self.prepare(rules, req)?;
        Ok(self.decide(prepared, self.clock.now()))
    }

    /// Checks a request and matches it, deciding nothing: every error a
    /// decision could meet is found here, so a batch can be refused whole.
    pub fn prepare<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
    ) -> Result<Prepared<'r>, RequestError> {
        request::validate(req.resource, req.descriptors)?;
        let cost = u64::from(req.cost.max(1));
        let rule = rules.rules.position(req.resource).map(|i| (&rules.rules.rules()[i], &rules.metrics[i]));
        let matched = rule.map(|(r, _)| matched(r, req.resource, req.descriptors)).unwrap_or_default();
        for (limit, _, _) in &matched {
            let capacity = limit.algorithm.capacity();
            if cost > capacity {
                return Err(RequestError::CostExceedsCapacity { cost, capacity, limit: limit.name.clone() });
            }
        }
        let guarded = rule.is_some_and(|(r, _)| r.breaker.is_some() || r.concurrency.is_some());
        let resource = guarded.then(|| req.resource.to_string());
        let request_resource = if self.replica.enabled() { req.resource.to_string() } else { String::new() };
        Ok(Prepared { rule, resource, request_resource, matched, cost, dry_run: req.dry_run, remote_breaker: None })
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

    /// Runs the guards and every limit decided here. When strict limits remain
    /// (replication on, Redis up), the caller asks Redis and calls `finish`.
    #[inline]
    pub fn begin<'r>(&self, p: Prepared<'r>, now: Timestamp) -> Step<'r> {
        let level = self.degradation_level();
        let Some((rule, metrics)) = p.rule else {
            let answer = Answer::allowed(level);
            if !p.dry_run {
                self.unmatched.record(&answer);
            }
            return Step::Done(answer);
        };
        let remote_on = self.replica.up() && !p.dry_run;
        let unguarded = p.resource.is_none() && rule.shed_at_level.is_none_or(|at| level < at);
        if unguarded && !(remote_on && p.matched.iter().any(|(l, ..)| decided_by_redis(l))) {
            // The common case, without the machinery for guards and Redis.
            let mut answer = Answer { rule: Some(&rule.name), ..Answer::allowed(level) };
            self.decide_limits(&mut answer, &p.matched, &p.request_resource, now, p.cost, p.dry_run);
            if !p.dry_run {
                metrics.record(&answer);
            }
            return Step::Done(answer);
        }
        let mut pending = Pending {
            answer: Answer { rule: Some(&rule.name), ..Answer::allowed(level) },
            rule,
            metrics,
            admitted: None,
            limits: SmallVec::new(),
            cost: p.cost,
            dry_run: p.dry_run,
            now,
            resource: p.resource,
            request_resource: p.request_resource,
            given_back: false,
        };
        if let Some(denied) = self.guard(&mut pending, level, p.remote_breaker) {
            return Step::Done(self.done(pending, denied));
        }
        if !(remote_on && p.matched.iter().any(|(l, ..)| decided_by_redis(l))) {
            let (now, cost, dry_run) = (pending.now, pending.cost, pending.dry_run);
            let resource = std::mem::take(&mut pending.request_resource);
            self.decide_limits(&mut pending.answer, &p.matched, &resource, now, cost, dry_run);
            return Step::Done(self.settle(pending));
        }
        let (remote, local): (Matched<'r>, Matched<'r>) =
            p.matched.into_iter().partition(|(l, _, _)| decided_by_redis(l));
        let decisions = if p.dry_run {
            local.iter().map(|(l, _, k)| self.buckets.check(k, &l.algorithm, now, p.cost)).collect()
        } else {
            self.take_all_or_nothing(&local, &pending.request_resource, now, p.cost)
        };
        let denied = decisions.iter().any(|d| !d.admitted);
        pending.given_back = denied;
        pending.limits.extend(local.into_iter().zip(decisions).map(|((l, i, k), d)| (l, i, k, Some(d))));
        // Denied here: Redis is not asked, and its limits are reported unknown.
        pending.limits.extend(remote.into_iter().map(|(l, i, k)| (l, i, k, denied.then(|| not_asked(l)))));
        pending.limits.sort_by_key(|(_, i, _, _)| *i);
        if denied || pending.limits.iter().all(|(.., d)| d.is_some()) {
            return Step::Done(self.finish(pending, Some(SmallVec::new())));
        }
        Step::Remote(Box::new(pending))
    }

    /// Every limit decided in this process, all or nothing, into `answer`.
    fn decide_limits<'r>(
        &self,
        answer: &mut Answer<'r>,
        matched: &Matched<'r>,
        resource: &str,
        now: Timestamp,
        cost: u64,
        dry_run: bool,
    ) {
        let mut decisions = if dry_run {
            matched.iter().map(|(l, _, k)| self.buckets.check(k, &l.algorithm, now, cost)).collect()
        } else {
            self.take_all_or_nothing(matched, resource, now, cost)
        };
        if decisions.iter().any(|d| !d.admitted) {
            // Nothing was taken: the limits that would have admitted report
            // what they hold, not what they would hold after this cost.
            for ((l, _, k), d) in matched.iter().zip(&mut decisions).filter(|(_, d)| d.admitted) {
                d.status = self.buckets.check(k, &l.algorithm, now, 0).status;
            }
        }
        fill_limits(answer, matched, &decisions);
    }

    /// Completes a decision with Redis's answers for the strict limits, in
    /// rule order (`None` when Redis could not answer: each strict limit then
    /// follows its `on_redis_error`). When one denies, everything is given back.
    pub fn finish<'r>(&self, mut p: Pending<'r>, remote: Option<SmallVec<[Decision; 4]>>) -> Answer<'r> {
        let strict: Matched<'r> =
            p.limits.iter().filter(|(.., d)| d.is_none()).map(|(l, i, k, _)| (*l, *i, k.clone())).collect();
        let from_redis = match remote {
            Some(d) if d.len() == strict.len() => d,
            _ => self.without_redis(&strict, p.now, p.cost),
        };
        let mut from_redis = from_redis.into_iter();
        for (.., d) in p.limits.iter_mut().filter(|(.., d)| d.is_none()) {
            *d = from_redis.next();
        }
        let denied = p.limits.iter().any(|(.., d)| d.is_some_and(|d| !d.admitted));
        if denied {
            let on_redis = self.replica.up();
            for (l, _, k, d) in &mut p.limits {
                let Some(d) = d.as_mut().filter(|d| d.admitted) else { continue };
                if on_redis && decided_by_redis(l) {
                    continue;
                }
                if !p.dry_run && !p.given_back {
                    self.buckets.refund(k, &l.algorithm, p.now, p.cost);
                    self.note_replicated(l, k, &p.request_resource, -(p.cost as i64), p.now);
                }
                // Nothing was taken: report what the limit holds now.
                d.status = self.buckets.check(k, &l.algorithm, p.now, 0).status;
            }
        }
        let decisions: SmallVec<[Decision; 4]> =
            p.limits.iter().map(|(l, .., d)| d.unwrap_or_else(|| not_asked(l))).collect();
        let matched: Matched<'r> = p.limits.iter().map(|(l, i, k, _)| (*l, *i, k.clone())).collect();
        fill_limits(&mut p.answer, &matched, &decisions);
        self.settle(p)
    }

    /// Hands out the permit, or gives back what the guards handed out.
    fn settle<'r>(&self, mut p: Pending<'r>) -> Answer<'r> {
        if let Some(a) = p.admitted.take() {
            p.answer.breaker_state = a.breaker_state;
            if p.answer.verdict != Verdict::Allowed || p.dry_run {
                self.undo(a);
            } else {
                let resource = p.resource.clone().unwrap_or_default();
                p.answer.permit_id = Some(self.issue_permit(p.rule, resource, a, p.now));
            }
        }
        if !p.dry_run {
            p.metrics.record(&p.answer);
        }
        p.answer
    }

    fn done<'r>(&self, p: Pending<'r>, denial: Denial) -> Answer<'r> {
        let mut p = p;
        p.answer.verdict = denial.verdict();
        p.answer.retry_after = denial.retry_after();
        p.answer.breaker_state = denial.breaker_state();
        p.answer.denial = Some(Box::new(denial));
        self.settle(p)
    }

    /// Shedding, the breaker and the concurrency limit; the denial if any.
    fn guard(&self, p: &mut Pending<'_>, level: u32, remote: Option<RemoteBreaker>) -> Option<Denial> {
        match &p.resource {
            Some(resource) => match self.admit(p.rule, resource, level, p.now, p.dry_run, remote) {
                Ok(a) => {
                    p.admitted = Some(a);
                    None
                }
                Err(denial) => Some(denial),
            },
            None => p.rule.shed_at_level.filter(|&at| level >= at).map(|at| Denial::Shed { at, level }),
        }
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
        request::validate(resource, descriptors)?;
        let level = self.degradation_level();
        let Some(rule) = rules.rules.find(resource) else {
            return Ok(Answer::allowed(level));
        };
        let mut matched = matched(rule, resource, descriptors);
        matched.retain(|(l, _, _)| only.is_none_or(|name| l.name == name));
        let now = self.clock.now();
        let decisions: SmallVec<[Decision; 4]> =
            matched.iter().map(|(l, _, k)| self.buckets.check(k, &l.algorithm, now, 0)).collect();
        let mut answer = Answer { rule: Some(&rule.name), ..Answer::allowed(level) };
        fill_limits(&mut answer, &matched, &decisions);
        answer.breaker_state = self.breaker_state(rule, resource);
        Ok(answer)
    }

    /// Takes `cost` from every matched bucket, or from none: when one denies,
    /// what the earlier ones took is given back, and the later ones are only
    /// checked so that the answer still reports every limit. A concurrent
    /// caller may see the taken units for that instant: it can be denied
    /// spuriously, never admitted beyond a limit.
    fn take_all_or_nothing(
        &self,
        matched: &Matched<'_>,
        resource: &str,
        now: Timestamp,
        cost: u64,
    ) -> SmallVec<[Decision; 4]> {
        let mut decisions = SmallVec::new();
        let mut denied = false;
        for (limit, _, key) in matched {
            let alg = &limit.algorithm;
            let d = if denied {
                self.buckets.check(key, alg, now, cost)
            } else {
                self.buckets.acquire(key.clone(), alg, now, cost)
            };
            if !d.admitted && !denied {
                denied = true;
                for (l, _, k) in &matched[..decisions.len()] {
                    self.buckets.refund(k, &l.algorithm, now, cost);
                    self.note_replicated(l, k, resource, -(cost as i64), now);
                }
            }
            if d.admitted && !denied {
                self.note_replicated(limit, key, resource, cost as i64, now);
            }
            decisions.push(d);
        }
        decisions
    }

    /// Keeps count of what a replicated limit took, for the next sync.
    fn note_replicated(&self, l: &Limit, key: &BucketKey, resource: &str, units: i64, now: Timestamp) {
        if self.replica.enabled() && l.sync == SyncMode::Replicated {
            self.note_taken(key, resource, l.id, units, now);
        }
    }

    /// Strict limits while Redis cannot answer, all or nothing: `local`
    /// decides here with the limit divided among the live replicas, `allow`
    /// admits, `deny` denies.
    fn without_redis(&self, strict: &Matched<'_>, now: Timestamp, cost: u64) -> SmallVec<[Decision; 4]> {
        let share = self.replica.share();
        let mut decisions = SmallVec::new();
        let mut taken = Vec::new();
        let mut denied = false;
        for (l, _, k) in strict {
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
                OnRedisError::Local => {
                    let d = self.buckets.acquire(k.clone(), &alg, now, cost);
                    if d.admitted {
                        taken.push((k, alg));
                    }
                    d
                }
            };
            if !d.admitted && !denied {
                denied = true;
                for (k, alg) in &taken {
                    self.buckets.refund(k, alg, now, cost);
                }
            }
            decisions.push(d);
        }
        decisions
    }
}

/// The limits of `rule` that apply: a keyed limit applies only when every
/// descriptor it names is present.
fn matched<'r, D: Descriptors + ?Sized>(rule: &'r Rule, resource: &str, d: &D) -> Matched<'r> {
    let per_resource = rule.per_resource();
    rule.limits
        .iter()
        .enumerate()
        .filter_map(|(index, limit)| {
            if limit.key.is_empty() && !per_resource {
                return Some((limit, index, BucketKey::global(limit.id)));
            }
            let mut parts: SmallVec<[&str; 4]> = SmallVec::new();
            if per_resource {
                parts.push(resource);
            }
            for k in &limit.key {
                parts.push(d.get(k)?);
            }
            Some((limit, index, BucketKey::new(limit.id, parts)))
        })
        .collect()
}

fn fill_limits<'r>(answer: &mut Answer<'r>, matched: &Matched<'r>, decisions: &[Decision]) {
    for ((limit, index, _), d) in matched.iter().zip(decisions) {
        if !d.admitted {
            answer.verdict = Verdict::RateLimited;
            answer.retry_after = answer.retry_after.max(d.status.retry_after);
        }
        answer.wait = answer.wait.max(d.status.wait);
        answer.limits.push(LimitReport { limit, index: *index, status: d.status, exceeded: !d.admitted });
    }
    if answer.verdict != Verdict::Allowed {
        answer.wait = Duration::ZERO;
    }
}
