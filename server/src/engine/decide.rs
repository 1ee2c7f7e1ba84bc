//! One decision: shedding, then the breaker and the concurrency limit, then
//! every matched limit, all or nothing.

use std::fmt::Write;
use std::time::Duration;

use smallvec::SmallVec;

use super::admit::Denial;
use super::request::{self, Descriptors, Request, RequestError};
use super::{Engine, Installed};
use crate::breaker;
use crate::limiter::{Decision, Status};
use crate::metrics::RuleMetrics;
use crate::rules::{Limit, Rule, duration};
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
    pub limits: SmallVec<[LimitReport<'r>; 4]>,
    pub retry_after: Duration,
    pub wait: Duration,
    /// Set when admitted on a resource with a breaker or a concurrency limit.
    pub permit_id: Option<String>,
    pub breaker_state: Option<breaker::State>,
    pub degradation_level: u32,
    /// Why it was denied before the limits were looked at.
    pub denial: Option<Denial>,
}

/// Matched limits: (limit, its index in the rule, its bucket).
type Matched<'r> = SmallVec<[(&'r Limit, usize, BucketKey); 4]>;

/// A request checked and matched against the rules, not yet decided.
#[derive(Debug)]
pub struct Prepared<'r> {
    rule: Option<(&'r Rule, &'r RuleMetrics)>,
    /// The resource, kept when the rule guards it (breaker or concurrency).
    resource: Option<String>,
    matched: Matched<'r>,
    cost: u64,
    dry_run: bool,
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
        Ok(Prepared { rule, resource, matched, cost, dry_run: req.dry_run })
    }

    /// Decides a prepared request at `now`.
    pub fn decide<'r>(&self, p: Prepared<'r>, now: Timestamp) -> Answer<'r> {
        let level = self.degradation_level();
        let Some((rule, metrics)) = p.rule else {
            let answer = Answer::allowed(level);
            if !p.dry_run {
                self.unmatched.record(&answer);
            }
            return answer;
        };
        let answer = self.decide_rule(rule, &p, level, now);
        if !p.dry_run {
            metrics.record(&answer);
        }
        answer
    }

    fn decide_rule<'r>(&self, rule: &'r Rule, p: &Prepared<'r>, level: u32, now: Timestamp) -> Answer<'r> {
        let mut answer = Answer { rule: Some(&rule.name), ..Answer::allowed(level) };
        let admitted = match &p.resource {
            Some(resource) => match self.admit(rule, resource, level, now, p.dry_run) {
                Ok(a) => Some(a),
                Err(denial) => {
                    answer.verdict = denial.verdict();
                    answer.retry_after = denial.retry_after();
                    answer.breaker_state = denial.breaker_state();
                    answer.denial = Some(denial);
                    return answer;
                }
            },
            None => match rule.shed_at_level.filter(|&at| level >= at) {
                Some(at) => {
                    answer.verdict = Verdict::Shed;
                    answer.denial = Some(Denial::Shed { at, level });
                    return answer;
                }
                None => None,
            },
        };
        let (matched, cost) = (&p.matched, p.cost);
        let mut decisions = if p.dry_run {
            matched.iter().map(|(l, _, k)| self.buckets.check(k, &l.algorithm, now, cost)).collect()
        } else {
            self.take_all_or_nothing(matched, now, cost)
        };
        if decisions.iter().any(|d| !d.admitted) {
            // Nothing was taken: the limits that would have admitted report
            // what they hold, not what they would hold after this cost.
            for ((l, _, k), d) in matched.iter().zip(&mut decisions).filter(|(_, d)| d.admitted) {
                d.status = self.buckets.check(k, &l.algorithm, now, 0).status;
            }
        }
        fill_limits(&mut answer, matched, &decisions);
        match admitted {
            Some(a) if answer.verdict != Verdict::Allowed || p.dry_run => {
                answer.breaker_state = a.breaker_state;
                self.undo(a);
            }
            Some(a) => {
                answer.breaker_state = a.breaker_state;
                answer.permit_id = Some(self.issue_permit(rule, p.resource.clone().unwrap_or_default(), a, now));
            }
            None => {}
        }
        answer
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
    fn take_all_or_nothing(&self, matched: &Matched<'_>, now: Timestamp, cost: u64) -> SmallVec<[Decision; 4]> {
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
