//! What-if: candidate rules run in shadow beside the live ones on real
//! traffic for a while, in buckets of their own, changing nothing. Each
//! candidate limit counts the calls it would have denied, those of them the
//! live rules allowed, and whom it would have denied most (a Space-Saving
//! sketch of bounded size, not a map of every key).
//!
//! While one runs, every Acquire is decided twice (once for real, once in
//! shadow); with none running the cost is one pointer load.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use smallvec::SmallVec;

use super::decide::{LimitsFor, costs_of, enforced_denial, matched_in, take_all_or_nothing};
use super::request::{Costs, Descriptors, Request};
use crate::limiter::Decision;
use crate::rules::{Limit, Rule, RuleSet};
use crate::store::{BucketKey, Buckets, LimitId};
use crate::time::Timestamp;

/// Heavy hitters kept per limit.
pub const TOP: usize = 20;
/// Buckets a what-if may hold (the least recently used go first).
pub const MAX_KEYS: usize = 100_000;
/// Bytes of a heavy hitter's key kept (longer keys are cut).
const MAX_KEY_BYTES: usize = 512;

/// A what-if in progress (or finished, until the next one).
pub struct WhatIf {
    rules: RuleSet,
    /// Per rule, its limits' ids: identities of its own, for buckets in a
    /// store of its own.
    ids: Vec<Vec<LimitId>>,
    buckets: Buckets,
    started: Timestamp,
    until: Timestamp,
    calls: AtomicU64,
    unmatched: AtomicU64,
    /// Per rule, per limit, in file order.
    stats: Vec<Vec<LimitStats>>,
}

#[derive(Default)]
struct LimitStats {
    evaluated: AtomicU64,
    would_deny: AtomicU64,
    newly_denied: AtomicU64,
    top: Mutex<SpaceSaving>,
}

/// What one candidate limit would have done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitFindings {
    pub rule: String,
    pub limit: String,
    pub evaluated: u64,
    pub would_deny: u64,
    pub newly_denied: u64,
    /// (key, count, error), most first.
    pub top: Vec<(String, u64, u64)>,
}

/// What the candidate rules would have done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Findings {
    pub running: bool,
    pub started: Timestamp,
    pub until: Timestamp,
    pub calls: u64,
    pub unmatched: u64,
    pub limits: Vec<LimitFindings>,
}

impl WhatIf {
    /// Candidate `rules`, observed from `now` until `until`.
    pub fn new(rules: RuleSet, now: Timestamp, until: Timestamp) -> WhatIf {
        let mut next = 0u32;
        let mut id = || {
            next += 1;
            LimitId(next)
        };
        let ids = rules.rules().iter().map(|r| r.limits.iter().map(|_| id()).collect()).collect();
        let stats = rules.rules().iter().map(|r| r.limits.iter().map(|_| LimitStats::default()).collect()).collect();
        WhatIf {
            rules,
            ids,
            buckets: Buckets::new(MAX_KEYS),
            started: now,
            until,
            calls: AtomicU64::new(0),
            unmatched: AtomicU64::new(0),
            stats,
        }
    }

    /// One real call: what the candidate rules would have decided, given
    /// that the live rules `live_allowed` it. Does nothing once it has ended.
    pub fn observe<D: Descriptors + ?Sized>(&self, req: &Request<'_, D>, live_allowed: bool, now: Timestamp) {
        if req.dry_run || now >= self.until {
            return;
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        let Some(i) = self.rules.position(req.resource) else {
            self.unmatched.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let rule = &self.rules.rules()[i];
        let cost = u64::from(req.cost.max(1));
        // The candidate rules' own limits (their overrides are not tried).
        let limits = LimitsFor::own(rule, &self.ids[i]);
        let matched = matched_in(limits, rule.per_resource(), req.resource, req.descriptors, Some(0));
        // All or nothing, as the live decision: what an admitted call takes
        // stays taken; a denied call takes nothing. A cost above a limit's
        // capacity (bad input under these rules) is refused by that limit.
        let costs = costs_of(Some(rule), &matched, req.usage, cost, 1).unwrap_or_else(|_| Costs::same(cost));
        let decisions: SmallVec<[Decision; 4]> =
            if matched.iter().any(|(l, slot, _)| costs.of(*slot) > l.algorithm.capacity()) {
                let check = |(l, slot, k): &(&Limit, usize, BucketKey)| {
                    let cost = costs.of(*slot);
                    let d = self.buckets.check(k, &l.algorithm, now, cost);
                    Decision { admitted: cost <= l.algorithm.capacity() && !enforced_denial(l, &d), ..d }
                };
                matched.iter().map(check).collect()
            } else {
                let decisions = take_all_or_nothing(&self.buckets, &matched, now, &costs, |_, _, _| {});
                let refused = |(l, _, _): &(&Limit, usize, BucketKey), d: &Decision| enforced_denial(l, d);
                matched.iter().zip(decisions).map(|(m, d)| Decision { admitted: !refused(m, &d), ..d }).collect()
            };
        for ((limit, index, _), d) in matched.iter().zip(&decisions) {
            let stats = &self.stats[i][*index];
            stats.evaluated.fetch_add(1, Ordering::Relaxed);
            if d.admitted {
                continue;
            }
            stats.would_deny.fetch_add(1, Ordering::Relaxed);
            if live_allowed {
                stats.newly_denied.fetch_add(1, Ordering::Relaxed);
            }
            let key = hitter(rule, limit, req.resource, req.descriptors);
            stats.top.lock().unwrap_or_else(|e| e.into_inner()).observe(key);
        }
    }

    pub fn findings(&self, now: Timestamp) -> Findings {
        let mut limits = Vec::new();
        for (rule, stats) in self.rules.rules().iter().zip(&self.stats) {
            for (limit, s) in rule.limits.iter().zip(stats) {
                limits.push(LimitFindings {
                    rule: rule.name.clone(),
                    limit: limit.name.clone(),
                    evaluated: s.evaluated.load(Ordering::Relaxed),
                    would_deny: s.would_deny.load(Ordering::Relaxed),
                    newly_denied: s.newly_denied.load(Ordering::Relaxed),
                    top: s.top.lock().unwrap_or_else(|e| e.into_inner()).ranked(),
                });
            }
        }
        Findings {
            running: now < self.until,
            started: self.started,
            until: self.until,
            calls: self.calls.load(Ordering::Relaxed),
            unmatched: self.unmatched.load(Ordering::Relaxed),
            limits,
        }
    }
}

/// Who a denial hit: the limit's key values, as `user=u42,tenant=acme`.
fn hitter<D: Descriptors + ?Sized>(rule: &Rule, limit: &crate::rules::Limit, resource: &str, d: &D) -> String {
    let mut key = String::new();
    if rule.per_resource() {
        key.push_str(resource);
    }
    for k in &limit.key {
        if !key.is_empty() {
            key.push(',');
        }
        key.push_str(k);
        key.push('=');
        key.push_str(d.get(k).unwrap_or_default());
    }
    truncate(&mut key, MAX_KEY_BYTES);
    key
}

/// Cuts `text` to at most `max` bytes, at a character's boundary; whether it
/// was cut.
pub(crate) fn truncate(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    true
}

/// Space-Saving (Metwally et al.): the `TOP` most frequent keys of a stream
/// in bounded memory. A key not kept replaces the least counted one and
/// inherits its count as its possible error.
#[derive(Default)]
struct SpaceSaving {
    /// (key, count, error)
    entries: Vec<(String, u64, u64)>,
}

impl SpaceSaving {
    fn observe(&mut self, key: String) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == key) {
            e.1 += 1;
            return;
        }
        if self.entries.len() < TOP {
            self.entries.push((key, 1, 0));
            return;
        }
        let min = self.entries.iter_mut().min_by_key(|e| e.1).expect("TOP entries");
        *min = (key, min.1 + 1, min.1);
    }

    fn ranked(&self) -> Vec<(String, u64, u64)> {
        let mut out = self.entries.clone();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const CANDIDATE: &str = r#"
resources:
  - name: api
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 2, window: 1h }
      - { name: all, algorithm: fixed_window, limit: 1000, window: 1h }
"#;

    fn ask<'a>(d: &'a HashMap<String, String>) -> Request<'a, HashMap<String, String>> {
        Request::new("api", d)
    }

    fn user(u: &str) -> HashMap<String, String> {
        HashMap::from([("user".to_string(), u.to_string())])
    }

    #[test]
    fn counts_would_be_denials_newly_denied_calls_and_whom() {
        let t = Timestamp::from_secs(1_700_000_000);
        let w = WhatIf::new(RuleSet::from_yaml(CANDIDATE, "t").unwrap(), t, t.add_nanos(60_000_000_000));
        let (heavy, light) = (user("heavy"), user("light"));
        for i in 0..10 {
            // The live rules denied the heavy user's last two calls already.
            w.observe(&ask(&heavy), i < 8, t);
        }
        w.observe(&ask(&light), true, t);
        w.observe(&Request { dry_run: true, ..ask(&light) }, true, t);
        w.observe(&Request { resource: "other", ..ask(&light) }, true, t);
        let r = w.findings(t);
        assert!(r.running);
        assert_eq!((r.calls, r.unmatched), (12, 1), "dry runs are not calls");
        let per_user = &r.limits[0];
        assert_eq!((per_user.evaluated, per_user.would_deny, per_user.newly_denied), (11, 8, 6));
        assert_eq!(per_user.top, vec![("user=heavy".to_string(), 8, 0)]);
        let all = &r.limits[1];
        assert_eq!((all.evaluated, all.would_deny), (11, 0), "a denied call took nothing from the global limit");
        // Ended: nothing more is counted.
        w.observe(&ask(&light), true, t.add_nanos(60_000_000_000));
        assert!(!w.findings(t.add_nanos(60_000_000_000)).running);
        assert_eq!(w.findings(t).calls, 12);
    }

    #[test]
    fn the_sketch_keeps_the_heaviest_keys_in_bounded_memory() {
        let mut s = SpaceSaving::default();
        for i in 0..10_000u64 {
            // Three heavy keys among thousands of light ones.
            let key = if i % 4 == 0 { format!("heavy{}", i % 3) } else { format!("light{i}") };
            s.observe(key);
        }
        let top = s.ranked();
        assert_eq!(top.len(), TOP, "never more than TOP entries");
        let names: Vec<_> = top.iter().take(3).map(|e| e.0.as_str()).collect();
        for h in ["heavy0", "heavy1", "heavy2"] {
            assert!(names.contains(&h), "{h} in the top 3: {top:?}");
        }
        for (key, count, error) in &top[..3] {
            let truth = 834u64; // 2,500 of 10,000 spread over three keys
            assert!(*count >= truth - 1 && count - error <= truth, "{key}: {count} - {error} vs {truth}");
        }
    }
}
