//! From the decisions of one `ShouldRateLimit` call to its answer: each
//! descriptor's status, the overall code, the headers, the dynamic metadata,
//! and upstream's stats.

use std::time::Duration;

use smallvec::SmallVec;

use super::{Answers, HeaderNames, Item, Items, RlsAnswer, RlsRequest, RlsStatus, Shown};
use crate::decider::Decider;
use crate::engine::{Answer, Installed, LimitReport, Target, Verdict};
use crate::rules::Limit;
use crate::rules::envoy::{Unit, per_unit};
use crate::time::Timestamp;

impl Decider {
    /// Every descriptor's status, the overall code (quota mode, the global
    /// shadow mode), the headers and the metadata; counts upstream's stats.
    pub(super) fn answer(
        &self,
        rules: &Installed,
        req: &RlsRequest<'_>,
        items: &Items<'_>,
        answers: &Answers<'_>,
        now: Timestamp,
    ) -> RlsAnswer {
        let statuses: SmallVec<[RlsStatus; 2]> = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let mut s = status(rules, item, &answers[i], answers, now);
                s.quota |= self.rls.quota && !matches!(item.target, Target::Unlimited(_));
                s
            })
            .collect();
        self.count(rules, req, items, answers);
        self.log_decisions(req, answers);
        let mut over = overall(&statuses);
        if over && self.rls.shadow {
            metrics::counter!(crate::metrics::RLS_GLOBAL_SHADOW).increment(1);
            over = false;
        }
        let headers = match self.rls.headers {
            Some(names) => headers(names, items, &statuses),
            None => Vec::new(),
        };
        let metadata = match self.rls.dynamic_metadata {
            true => passed_metadata(items, &statuses),
            false => Vec::new(),
        };
        RlsAnswer { over, statuses, headers, metadata }
    }

    /// Offers each descriptor's decision to the decision log.
    fn log_decisions(&self, req: &RlsRequest<'_>, answers: &Answers<'_>) {
        for (d, answer) in req.descriptors.iter().zip(answers) {
            if let Some(answer) = answer
                && self.decisions().wants()
            {
                let asked = crate::decider::decisions::Asked {
                    cost: d.hits,
                    dry_run: d.hits == 0,
                    settle: false,
                    usage: Vec::new(),
                };
                self.decisions().keep_parts(req.domain, d.entries.iter().copied(), asked, answer);
            }
        }
    }

    /// Upstream's stats of every descriptor an Envoy configuration limit or
    /// a limit Envoy sent decided (replaced and unlimited ones count nothing).
    fn count(&self, rules: &Installed, req: &RlsRequest<'_>, items: &Items<'_>, answers: &Answers<'_>) {
        let ratio = self.rls.near_ratio;
        for (i, item) in items.iter().enumerate() {
            let Some(report) = answers[i].as_ref().and_then(|a| a.limits.first()) else { continue };
            let d = &req.descriptors[i];
            match item.target {
                Target::Envoy(l) => {
                    let shadow = rules.envoy.config.limit_of(l).shadow;
                    match rules.envoy_rule(l.rule).1.upstream() {
                        Some(stats) => record(stats, report, d.hits, shadow, ratio),
                        None => {
                            let key = rules.envoy.config.stat_key(req.domain, d.entries, l);
                            record(&self.engine.views().upstream_stats().get(&key), report, d.hits, shadow, ratio);
                        }
                    }
                }
                Target::Override { .. } => record(
                    &self.engine.views().upstream_stats().get(&descriptor_key(req.domain, d.entries)),
                    report,
                    d.hits,
                    false,
                    ratio,
                ),
                _ => {}
            }
        }
    }
}

/// Upstream's stat key of a limit Envoy sent: the domain and every entry.
fn descriptor_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = domain.to_string();
    for (k, v) in entries {
        key.push('.');
        key.push_str(k);
        if !v.is_empty() {
            key.push('_');
            key.push_str(&crate::digest::bounded(v));
        }
    }
    key
}

/// Counts one descriptor's hits: what the limit held before them is what it
/// holds now, less them when they were taken (a denial takes nothing).
fn record(
    stats: &crate::metrics::upstream::LimitStats,
    report: &LimitReport<'_>,
    hits: u64,
    shadow: bool,
    near_ratio: f32,
) {
    let used = report.status.limit.saturating_sub(report.status.remaining);
    let before = if report.exceeded { used } else { used.saturating_sub(hits) };
    stats.record(report.status.limit, before, hits, shadow, near_ratio);
}

/// OVER_LIMIT when a descriptor not in quota mode is over, or when every
/// quota descriptor is (upstream's rule).
fn overall(statuses: &[RlsStatus]) -> bool {
    let quota = statuses.iter().filter(|s| s.quota);
    let (total, failed) = quota.fold((0, 0), |(t, f), s| (t + 1, f + usize::from(s.over)));
    statuses.iter().any(|s| s.over && !s.quota) || (total > 0 && total == failed)
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
    let nothing = RlsStatus { over: false, limit: None, remaining: 0, reset: None, quota: false };
    let answer = match (item.target, answer) {
        (Target::Unlimited(_), _) => return RlsStatus { remaining: u32::MAX, ..nothing },
        (_, Some(a)) => a,
        _ => return nothing,
    };
    let quota = matches!(item.target, Target::Envoy(l) if l.quota);
    let shared = item.shared.iter().filter_map(|&(j, l)| all[j].as_ref()?.limits.iter().find(|r| r.index == l));
    let reports: SmallVec<[&LimitReport<'_>; 4]> = answer.limits.iter().chain(shared).collect();
    // Over when this descriptor was denied, or a bucket it shares was.
    let over = answer.verdict != Verdict::Allowed || reports.iter().any(|r| r.denied());
    let tightest = reports
        .iter()
        .find(|r| r.denied())
        .or_else(|| reports.iter().find(|r| r.exceeded))
        .or_else(|| reports.iter().min_by_key(|r| r.status.remaining))
        .copied();
    let Some(report) = tightest else {
        // Denied by a guard before any limit: say when to try again.
        let reset = over.then_some(answer.retry_after).filter(|d| !d.is_zero()).map(whole_seconds);
        return RlsStatus { over, reset, quota, ..nothing };
    };
    let shown = match item.target {
        Target::Envoy(l) => {
            Shown { name: l.name.as_str().into(), requests_per_unit: l.requests_per_unit, unit: l.unit }
        }
        Target::Override { requests_per_unit, unit, .. } => Shown { name: Default::default(), requests_per_unit, unit },
        // The precomputed table holds the rule's own limits; an override's
        // (another limit object) is computed here.
        Target::Rules(i)
            if rules.rules.rules()[i].limits.get(report.index).is_some_and(|l| std::ptr::eq(l, report.limit)) =>
        {
            let (requests_per_unit, unit) = rules.per_unit(i, report.index);
            Shown { name: report.limit.name.as_str().into(), requests_per_unit, unit }
        }
        _ => shown(report.limit),
    };
    let remaining = if report.exceeded { 0 } else { u32::try_from(report.status.remaining).unwrap_or(u32::MAX) };
    let reset = Some(until_reset(report.limit, shown.unit, now));
    RlsStatus { over, limit: Some(shown), remaining, reset, quota }
}

/// A limit of our rules as Envoy is shown it (see [`per_unit`]).
pub fn shown(limit: &Limit) -> Shown {
    let (requests_per_unit, unit) = per_unit(limit);
    Shown { name: limit.name.as_str().into(), requests_per_unit, unit }
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

/// The headers of the descriptor upstream picks: the one with a limit that
/// has least remaining (the first of equals), unless a descriptor not in
/// quota mode is over (the last of those).
fn headers(names: HeaderNames, items: &Items<'_>, statuses: &[RlsStatus]) -> Vec<(&'static str, String)> {
    let mut chosen: Option<&RlsStatus> = None;
    let mut least = u32::MAX;
    for (item, s) in items.iter().zip(statuses) {
        if s.limit.is_some() && s.remaining < least {
            (chosen, least) = (Some(s), s.remaining);
        }
        if s.over && !s.quota && !matches!(item.target, Target::Unlimited(_)) {
            (chosen, least) = (Some(s), 0);
        }
    }
    let Some(s @ RlsStatus { limit: Some(shown), .. }) = chosen else { return Vec::new() };
    vec![
        (names.limit, shown.requests_per_unit.to_string()),
        (names.remaining, s.remaining.to_string()),
        (names.reset, s.reset.unwrap_or_default().as_secs().to_string()),
    ]
}

/// The metadata of the Envoy configuration limits that passed, in order.
fn passed_metadata(
    items: &Items<'_>,
    statuses: &[RlsStatus],
) -> Vec<std::sync::Arc<serde_json::Map<String, serde_json::Value>>> {
    items
        .iter()
        .zip(statuses)
        .filter(|(_, s)| !s.over)
        .filter_map(|(item, _)| match item.target {
            Target::Envoy(l) => l.metadata.clone(),
            _ => None,
        })
        .collect()
}
