//! Envoy's `ShouldRateLimit`, answered as envoyproxy/ratelimit answers it,
//! whatever decides each descriptor (see [`crate::engine::rls`]):
//!
//! - each descriptor has its own status; the request is OVER_LIMIT when any
//!   descriptor is, unless the global shadow mode is on; a descriptor in
//!   quota mode (`quota_mode`, or every one with the global quota mode)
//!   makes it OVER_LIMIT only when every quota descriptor is;
//! - a limit named in another matched limit's `replaces` does not apply;
//! - `current_limit` is the limit in requests per SECOND to YEAR, exact
//!   whenever a whole number of requests per some unit says it, and never 0;
//! - `duration_until_reset` is the time to the end of the current window, in
//!   whole seconds as upstream reports it (a fixed window's own end; for
//!   other algorithms, the end of the current unit of `current_limit`);
//! - with response headers on, the limit, remaining and reset of the
//!   descriptor nearest its limit (or the last one over it) are added;
//! - upstream's stats count every descriptor an Envoy configuration limit
//!   (or a limit Envoy sent) decided.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::Decider;
use crate::engine::request::check_batch;
use crate::engine::{Answer, Installed, Prepared, RequestError, RlsDescriptor, Target};
use crate::replication::Replication;
use crate::rules::Priority;
use crate::rules::envoy::Unit;
use crate::store::BucketKey;

/// One `ShouldRateLimit` call, checked.
#[derive(Clone, Debug)]
pub struct RlsRequest<'a> {
    pub domain: &'a str,
    pub descriptors: SmallVec<[RlsDescriptor<'a>; 2]>,
}

/// How the RLS answers, for the whole server.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RlsOptions {
    /// Always answer OK; what would have been denied is still counted.
    pub shadow: bool,
    /// Every descriptor is in quota mode (upstream's `QUOTA_MODE`).
    pub quota: bool,
    /// The descriptor entry whose value is the request's priority
    /// (`sheddable`, `critical_plus`...); empty: none. A value that names no
    /// priority is CRITICAL, never an error (an error would let Envoy's
    /// failure mode decide, often to allow).
    pub priority_key: &'static str,
    /// Add rate limit headers to the answer, for Envoy to send on.
    pub headers: Option<HeaderNames>,
    /// Say in the answer's dynamic metadata what was asked and the metadata
    /// of the descriptors that passed (upstream's `RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
    /// Upstream's `NEAR_LIMIT_RATIO`: past this share of a limit, hits count
    /// as `near_limit`.
    pub near_ratio: f32,
    /// The most label sets of upstream's stats whose key depends on the
    /// request (`detailed_metric`, `value_to_metric`, limits Envoy sends).
    pub stat_series: usize,
}

impl Default for RlsOptions {
    fn default() -> Self {
        RlsOptions {
            shadow: false,
            quota: false,
            headers: None,
            priority_key: "priority",
            dynamic_metadata: false,
            near_ratio: 0.8,
            stat_series: crate::metrics::upstream::MAX_SERIES,
        }
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

/// The three header names (upstream's `LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: &'static str,
    pub remaining: &'static str,
    pub reset: &'static str,
}

impl From<RlsHeaders> for HeaderNames {
    fn from(style: RlsHeaders) -> Self {
        match style {
            RlsHeaders::RateLimit => {
                HeaderNames { limit: "RateLimit-Limit", remaining: "RateLimit-Remaining", reset: "RateLimit-Reset" }
            }
            RlsHeaders::XRateLimit => HeaderNames {
                limit: "X-RateLimit-Limit",
                remaining: "X-RateLimit-Remaining",
                reset: "X-RateLimit-Reset",
            },
        }
    }
}

/// A limit as Envoy is shown it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    /// Inline up to 24 bytes: a limit's name is shown on every answer.
    pub name: compact_str::CompactString,
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
    /// In quota mode: over, it makes the answer OVER_LIMIT only with every
    /// other quota descriptor over.
    pub quota: bool,
}

/// The answer to one call.
#[derive(Clone, Debug, PartialEq)]
pub struct RlsAnswer {
    pub over: bool,
    pub statuses: SmallVec<[RlsStatus; 2]>,
    pub headers: Vec<(&'static str, String)>,
    /// With dynamic metadata on: the metadata of each descriptor that
    /// passed, in order, to merge into the answer.
    pub metadata: Vec<Arc<serde_json::Map<String, serde_json::Value>>>,
}

type Items<'r> = SmallVec<[Item<'r>; 2]>;
type Answers<'r> = SmallVec<[Option<Answer<'r>>; 2]>;

/// Where a descriptor's decision is, and the limits it shares with an
/// earlier descriptor of the request: (that descriptor, limit position).
struct Item<'r> {
    target: Target<'r>,
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
        let now = self.engine.clock().now();
        // Each descriptor decided as soon as it is prepared.
        let mut answers = Answers::new();
        let items = self.rls_items(&rules, req, |_, p| answers.push(p.map(|p| self.engine.decide(p, now))))?;
        Ok(self.answer(&rules, req, &items, &answers, now))
    }

    async fn rls_replicated(&self, replication: &Replication, req: &RlsRequest<'_>) -> Result<RlsAnswer, RequestError> {
        let rules = self.engine.rules_full();
        let (mut index, mut prepared): (SmallVec<[usize; 4]>, Vec<Prepared<'_>>) = Default::default();
        let items = self.rls_items(&rules, req, |i, p| {
            if let Some(p) = p {
                index.push(i);
                prepared.push(p);
            }
        })?;
        let priority = self.rls_priority(req);
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
        Ok(self.answer(&rules, req, &items, &answers, self.engine.clock().now()))
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

    /// Matches every descriptor, drops replaced limits and prepares the rest,
    /// handing each descriptor's decision to `prepared` in order; a bucket
    /// several descriptors share is charged by the first only.
    fn rls_items<'r>(
        &self,
        rules: &'r Installed,
        req: &RlsRequest<'_>,
        mut prepared: impl FnMut(usize, Option<Prepared<'r>>),
    ) -> Result<Items<'r>, RequestError> {
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
            let mut decision = self.engine.prepare_rls(rules, req.domain, d, (target, priority));
            let mut shared = SmallVec::new();
            if let (Target::Rules(_), Some(p), Some(first)) = (target, decision.as_mut(), first.as_mut()) {
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
            prepared(i, decision);
            items.push(Item { target, shared });
        }
        Ok(items)
    }
}

mod answer;
#[cfg(test)]
use answer::shown;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upstream_tests;
