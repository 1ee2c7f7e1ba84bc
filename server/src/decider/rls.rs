//! Envoy's `ShouldRateLimit`, answered as envoyproxy/ratelimit answers it,
//! whatever decides each descriptor (see [`crate::engine::rls`]):
//!
//! - each descriptor has its own status; the request is OVER_LIMIT when any
//!   descriptor is, unless the global shadow mode is on;
//! - a limit named in another matched limit's `replaces` does not apply;
//! - `current_limit` is the limit in requests per SECOND to YEAR, exact
//!   whenever a whole number of requests per some unit says it, and never 0;
//! - `duration_until_reset` is the time to the end of the current window, in
//!   whole seconds as upstream reports it (a fixed window's own end; for
//!   other algorithms, the end of the current unit of `current_limit`);
//! - with response headers on, the limit, remaining and reset of the
//!   descriptor nearest its limit (or the last one over it) are added.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use smallvec::SmallVec;

use super::Decider;
use crate::engine::request::check_batch;
use crate::engine::{Answer, Installed, LimitReport, Prepared, RequestError, RlsDescriptor, Target, Verdict};
use crate::replication::Replication;
use crate::rules::envoy::{Unit, per_unit};
use crate::rules::{Limit, Priority};
use crate::store::BucketKey;
use crate::time::Timestamp;

/// One `ShouldRateLimit` call, checked.
#[derive(Clone, Debug)]
pub struct RlsRequest<'a> {
    pub domain: &'a str,
    pub descriptors: SmallVec<[RlsDescriptor<'a>; 2]>,
}

/// How the RLS answers, for the whole server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RlsOptions {
    /// Always answer OK; what would have been denied is still counted.
    pub shadow: bool,
    /// The descriptor entry whose value is the request's priority
    /// (`sheddable`, `critical_plus`...); empty: none. A value that names no
    /// priority is CRITICAL, never an error (an error would let Envoy's
    /// failure mode decide, often to allow).
    pub priority_key: &'static str,
    /// Add rate limit headers to the answer, for Envoy to send on.
    pub headers: Option<RlsHeaders>,
}

impl Default for RlsOptions {
    fn default() -> Self {
        RlsOptions { shadow: false, headers: None, priority_key: "priority" }
    }
}

/// Which names the response headers take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RlsHeaders {
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (upstream's defaults).
    #[value(name = "ratelimit")]
    RateLimit,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    #[value(name = "x-ratelimit")]
    XRateLimit,
}

/// A limit as Envoy is shown it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    pub name: String,
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// One descriptor's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlsStatus {
    pub over: bool,
    pub limit: Option<Shown>,
    pub remaining: u32,
    pub reset: Option<Duration>,
}

/// The answer to one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlsAnswer {
    pub over: bool,
    pub statuses: SmallVec<[RlsStatus; 2]>,
    pub headers: Vec<(&'static str, String)>,
}

type Items<'r> = SmallVec<[Item<'r>; 2]>;
type Answers<'r> = SmallVec<[Option<Answer<'r>>; 2]>;

/// Where a descriptor's decision is, and the limits it shares with an
/// earlier descriptor of the request: (that descriptor, limit position).
struct Item<'r> {
    target: Target<'r>,
    prepared: Option<Prepared<'r>>,
    shared: SmallVec<[(usize, usize); 2]>,
}

impl Decider {
    /// Decides every descriptor of an RLS call. Bad input (a name too long,
    /// too many descriptors) is an error that takes nothing.
    pub async fn should_rate_limit(&self, req: &RlsRequest<'_>) -> Result<RlsAnswer, RequestError> {
        if req.descriptors.is_empty() {
            return Err(RequestError::Empty { field: "descriptors".into() });
        }
        check_batch("descriptors", req.descriptors.len())?;
        match &self.replication {
            None => self.rls_here(req),
            // Boxed: the memory-only call's future stays small.
            Some(replication) => Box::pin(self.rls_replicated(replication, req)).await,
        }
    }

    /// Memory only: decided at once, on the rules in force (no reference
    /// count taken on them).
    fn rls_here(&self, req: &RlsRequest<'_>) -> Result<RlsAnswer, RequestError> {
        let rules = self.engine.rules();
        let mut items = self.rls_items(&rules, req)?;
        let now = self.engine.clock().now();
        let answers: Answers<'_> =
            items.iter_mut().map(|it| it.prepared.take().map(|p| self.engine.decide(p, now))).collect();
        Ok(self.answer(&rules, &items, &answers, now))
    }

    async fn rls_replicated(&self, replication: &Replication, req: &RlsRequest<'_>) -> Result<RlsAnswer, RequestError> {
        let rules = self.engine.rules_full();
        let mut items = self.rls_items(&rules, req)?;
        let priority = self.rls_priority(req);
        let (index, prepared): (SmallVec<[usize; 4]>, Vec<Prepared<'_>>) =
            items.iter_mut().enumerate().filter_map(|(i, it)| it.prepared.take().map(|p| (i, p))).unzip();
        let again = |k: usize| {
            let i = index[k];
            let mut p =
                self.engine.prepare_rls(&rules, req.domain, &req.descriptors[i], (items[i].target, priority))?;
            p.leave_out(&items[i].shared.iter().map(|&(_, l)| l).collect::<SmallVec<[usize; 2]>>());
            Some(p)
        };
        let decided = replication.decide_many(prepared, again).await;
        let mut answers: Answers<'_> = (0..items.len()).map(|_| None).collect();
        for (&i, a) in index.iter().zip(decided) {
            answers[i] = Some(a);
        }
        Ok(self.answer(&rules, &items, &answers, self.engine.clock().now()))
    }

    /// The request's priority: the first entry named `priority_key` in any
    /// descriptor, else CRITICAL.
    fn rls_priority(&self, req: &RlsRequest<'_>) -> Priority {
        let key = self.rls.priority_key;
        if key.is_empty() {
            return Priority::default();
        }
        let value = req.descriptors.iter().flat_map(|d| d.entries.iter()).find(|(k, _)| *k == key);
        value.and_then(|(_, v)| Priority::parse(v)).unwrap_or_default()
    }

    /// Matches every descriptor, drops replaced limits and prepares the rest;
    /// a bucket several descriptors share is charged by the first only.
    fn rls_items<'r>(&self, rules: &'r Installed, req: &RlsRequest<'_>) -> Result<Items<'r>, RequestError> {
        let priority = self.rls_priority(req);
        let mut targets = req
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| self.engine.rls_target(rules, req.domain, d).map_err(|e| e.in_batch("descriptors", i)))
            .collect::<Result<SmallVec<[Target<'r>; 4]>, _>>()?;
        let replaces = |t: &Target<'_>| match *t {
            Target::Envoy(l) | Target::Unlimited(l) => !l.replaces.is_empty(),
            _ => false,
        };
        if targets.iter().any(replaces) {
            let replaced: HashSet<&str> = targets
                .iter()
                .flat_map(|t| match t {
                    Target::Envoy(l) | Target::Unlimited(l) => l.replaces.as_slice(),
                    _ => &[],
                })
                .map(String::as_str)
                .collect();
            for t in &mut targets {
                if let Target::Envoy(l) = t
                    && !l.name.is_empty()
                    && replaced.contains(l.name.as_str())
                {
                    *t = Target::Nothing;
                }
            }
        }
        // Buckets of our rules several descriptors share; only with several.
        let mut first: Option<HashMap<BucketKey, (usize, usize)>> =
            (targets.iter().filter(|t| matches!(t, Target::Rules(_))).count() > 1).then(HashMap::new);
        let mut items = Items::with_capacity(targets.len());
        for (i, (d, target)) in req.descriptors.iter().zip(targets).enumerate() {
            let mut prepared = self.engine.prepare_rls(rules, req.domain, d, (target, priority));
            let mut shared = SmallVec::new();
            if let (Target::Rules(_), Some(p), Some(first)) = (target, prepared.as_mut(), first.as_mut()) {
                let mut leave: SmallVec<[usize; 2]> = SmallVec::new();
                for (limit, key) in p.buckets() {
                    match first.get(key) {
                        Some(&earlier) => {
                            shared.push(earlier);
                            leave.push(limit);
                        }
                        None => {
                            first.insert(key.clone(), (i, limit));
                        }
                    }
                }
                p.leave_out(&leave);
            }
            items.push(Item { target, prepared, shared });
        }
        Ok(items)
    }

    /// Every descriptor's status, the overall code (and the global shadow
    /// mode), and the headers.
    fn answer(&self, rules: &Installed, items: &Items<'_>, answers: &Answers<'_>, now: Timestamp) -> RlsAnswer {
        let statuses: SmallVec<[RlsStatus; 2]> =
            items.iter().enumerate().map(|(i, item)| status(rules, item, &answers[i], answers, now)).collect();
        let mut over = statuses.iter().any(|s| s.over);
        if over && self.rls.shadow {
            metrics::counter!(crate::metrics::RLS_GLOBAL_SHADOW).increment(1);
            over = false;
        }
        let headers = match self.rls.headers {
            Some(names) => headers(names, &statuses),
            None => Vec::new(),
        };
        RlsAnswer { over, statuses, headers }
    }
}

/// One descriptor's status from its answer (and the answers of the
/// descriptors it shares buckets with).
fn status(
    rules: &Installed,
    item: &Item<'_>,
    answer: &Option<Answer<'_>>,
    all: &[Option<Answer<'_>>],
    now: Timestamp,
) -> RlsStatus {
    let nothing = RlsStatus { over: false, limit: None, remaining: 0, reset: None };
    let answer = match (item.target, answer) {
        (Target::Unlimited(_), _) => return RlsStatus { remaining: u32::MAX, ..nothing },
        (_, Some(a)) => a,
        _ => return nothing,
    };
    let shared = item.shared.iter().filter_map(|&(j, l)| all[j].as_ref()?.limits.iter().find(|r| r.index == l));
    let reports: SmallVec<[&LimitReport<'_>; 4]> = answer.limits.iter().chain(shared).collect();
    // Over when this descriptor was denied, or a bucket it shares was.
    let over = answer.verdict != Verdict::Allowed || reports.iter().any(|r| r.exceeded && !r.limit.shadow);
    let tightest = reports
        .iter()
        .find(|r| r.exceeded && !r.limit.shadow)
        .or_else(|| reports.iter().find(|r| r.exceeded))
        .or_else(|| reports.iter().min_by_key(|r| r.status.remaining))
        .copied();
    let Some(report) = tightest else {
        // Denied by a guard before any limit: say when to try again.
        let reset = over.then_some(answer.retry_after).filter(|d| !d.is_zero()).map(whole_seconds);
        return RlsStatus { over, reset, ..nothing };
    };
    let shown = match item.target {
        Target::Envoy(l) => Shown { name: l.name.clone(), requests_per_unit: l.requests_per_unit, unit: l.unit },
        Target::Override { requests_per_unit, unit, .. } => Shown { name: String::new(), requests_per_unit, unit },
        // The precomputed table holds the rule's own limits; an override's
        // (another limit object) is computed here.
        Target::Rules(i)
            if rules.rules.rules()[i].limits.get(report.index).is_some_and(|l| std::ptr::eq(l, report.limit)) =>
        {
            let (requests_per_unit, unit) = rules.per_unit(i, report.index);
            Shown { name: report.limit.name.clone(), requests_per_unit, unit }
        }
        _ => shown(report.limit),
    };
    let remaining = if report.exceeded { 0 } else { u32::try_from(report.status.remaining).unwrap_or(u32::MAX) };
    let reset = Some(until_reset(report.limit, shown.unit, now));
    RlsStatus { over, limit: Some(shown), remaining, reset }
}

/// A limit of our rules as Envoy is shown it (see [`per_unit`]).
pub fn shown(limit: &Limit) -> Shown {
    let (requests_per_unit, unit) = per_unit(limit);
    Shown { name: limit.name.clone(), requests_per_unit, unit }
}

/// Time to the end of the current window, in whole seconds (at least one).
fn until_reset(limit: &Limit, unit: Unit, now: Timestamp) -> Duration {
    let window = match &limit.algorithm {
        crate::limiter::Algorithm::FixedWindow(c) => match &c.calendar {
            Some(cal) => return whole_seconds(Duration::from_nanos(cal.window(now.as_nanos()).1 - now.as_nanos())),
            None => c.window,
        },
        _ => unit.seconds() * 1_000_000_000,
    };
    whole_seconds(Duration::from_nanos(window - now.as_nanos() % window))
}

fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_nanos().div_ceil(1_000_000_000).max(1) as u64)
}

/// The headers of the descriptor nearest its limit, or of the last over it.
fn headers(names: RlsHeaders, statuses: &[RlsStatus]) -> Vec<(&'static str, String)> {
    let with_limit = || statuses.iter().filter(|s| s.limit.is_some());
    let Some(s) = with_limit().rfind(|s| s.over).or_else(|| with_limit().min_by_key(|s| s.remaining)) else {
        return Vec::new();
    };
    let [limit, remaining, reset] = match names {
        RlsHeaders::RateLimit => ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
        RlsHeaders::XRateLimit => ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"],
    };
    let shown = s.limit.as_ref().expect("filtered on a limit");
    vec![
        (limit, shown.requests_per_unit.to_string()),
        (remaining, s.remaining.to_string()),
        (reset, s.reset.unwrap_or_default().as_secs().to_string()),
    ]
}

#[cfg(test)]
mod tests;
