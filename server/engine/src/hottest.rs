//! The hottest keys of the rules in force (see [`crate::hitters`]).

use crate::Views;
use compact_str::CompactString;

use super::Installed;
use super::installed::RuleHandles;
use crate::hitters::{Hitters, TOP};
use crate::recommend::traffic::{KeyPeaks, Traffic};
use crate::rules::{Limit, Rule};
use crate::store::{BucketKey, LimitId};
use std::sync::Arc;

/// One limit's hottest keys, as text: (key, count, error), most first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopLimit {
    pub rule: String,
    pub limit: String,
    pub denied: Vec<(String, u64, u64)>,
    pub admitted: Vec<(String, u64, u64)>,
}

/// An Envoy descriptor's bucket scope (its entries, key then value) as
/// `user=u42,plan=gold`.
fn entries_text(scope: CompactString) -> String {
    let parts = BucketKey { limit: LimitId::default(), scope }.parts();
    crate::request::pairs_text(parts.chunks(2).map(|kv| (&kv[0], kv.get(1).map_or("", String::as_str))))
}

/// A rule's limits and its overrides' (a tier's own), one per name (one per
/// hottest-keys slot), with their hottest keys.
fn distinct_limits<'r>(rule: &'r Rule, handles: &'r RuleHandles) -> Vec<(&'r Limit, &'r Hitters)> {
    let own = rule.limits.iter().enumerate();
    let extra = rule.overrides.extra_names().iter().enumerate().filter_map(|(j, name)| {
        let limit = rule.overrides.list().iter().flat_map(|o| o.limits.iter()).find(|l| l.name == *name)?;
        Some((rule.limits.len() + j, limit))
    });
    own.chain(extra).filter_map(|(slot, limit)| Some((limit, handles.hitters(slot)?))).collect()
}

/// A bucket's scope as `user=u42,tenant=acme`, after the resource for a
/// template rule.
fn key_text(rule: &Rule, limit: &Limit, scope: CompactString) -> String {
    let parts = BucketKey { limit: LimitId::default(), scope }.parts();
    let mut parts = parts.into_iter();
    let mut out: Vec<String> = Vec::new();
    if rule.per_resource() {
        out.extend(parts.next());
    }
    let rest: Vec<String> = parts.collect();
    out.push(crate::request::pairs_text(limit.key.iter().zip(&rest)));
    out.retain(|part| !part.is_empty());
    out.join(",")
}

impl Views<'_> {
    /// Per limit of the rules in force (only `rule`'s when not empty), the
    /// `n` keys it denied and admitted most lately; limits without any left out.
    pub fn top_keys(&self, rules: &Installed, rule: &str, n: usize) -> Vec<TopLimit> {
        let n = n.clamp(1, TOP);
        let now = self.clock.now().as_nanos() / 1_000_000_000;
        let mut out = Vec::new();
        // One limit's lists, its keys as text; nothing when it counted none.
        let mut push = |r: &Rule, limit: &Limit, hitters: &Hitters, text: &dyn Fn(CompactString) -> String| {
            let list = |denied| -> Vec<(String, u64, u64)> {
                hitters.top(denied, now, n).into_iter().map(|h| (text(h.scope), h.count, h.error)).collect()
            };
            let (denied, admitted) = (list(true), list(false));
            if !(denied.is_empty() && admitted.is_empty()) {
                out.push(TopLimit { rule: r.name.clone(), limit: limit.name.clone(), denied, admitted });
            }
        };
        for i in 0..rules.rules.rules().len() {
            let (r, handles) = rules.rule_at(i);
            if !(rule.is_empty() || r.name == rule) {
                continue;
            }
            for (limit, hitters) in distinct_limits(r, handles) {
                push(r, limit, hitters, &|scope| key_text(r, limit, scope));
            }
        }
        // The envoyproxy/ratelimit configuration's limits: keyed by the
        // request's descriptor entries.
        for i in 0..rules.envoy.config.rules().len() {
            let (r, handles) = rules.envoy_rule(i);
            if (rule.is_empty() || r.name == rule)
                && let Some(limit) = r.limits.first()
                && let Some(hitters) = handles.hitters(0)
            {
                push(r, limit, hitters, &|scope| entries_text(scope));
            }
        }
        out
    }
}

/// A page of a limit's recorded traffic (`history: true`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedPage {
    /// Keys recorded now by this replica, and calls of new keys not
    /// recorded because the limit's table (here or in Redis) was full.
    pub keys: usize,
    pub refused: u64,
    /// The page is the fleet's record, read from Redis (else this
    /// replica's own).
    pub shared: bool,
    /// Each key as `tenant=acme` (after the resource, for a template rule)
    /// with (Unix day, calls in its busiest minute), oldest first.
    pub page: Vec<(String, Vec<(u32, u32)>)>,
    /// The page after this one, if there is one.
    pub next: Option<usize>,
}

impl Views<'_> {
    /// The traffic recorded for limit `limit` of the rule named `rule`,
    /// when `page` is one of its pages.
    pub fn record_of(
        &self,
        rules: &Installed,
        rule: &str,
        limit: &str,
        page: usize,
    ) -> Result<Arc<Traffic>, crate::request::RequestError> {
        self.locate(rules, rule, limit, page).map(|(_, _, t)| t)
    }

    fn locate<'i>(
        &self,
        rules: &'i Installed,
        rule: &str,
        limit: &str,
        page: usize,
    ) -> Result<(&'i Rule, &'i Limit, Arc<Traffic>), crate::request::RequestError> {
        use crate::recommend::traffic::SHARDS;
        use crate::request::RequestError;
        let i = (0..rules.rules.rules().len())
            .find(|&i| rules.rules.rules()[i].name == rule)
            .ok_or_else(|| RequestError::NoSuchRule(rule.to_string()))?;
        let (r, handles) = rules.rule_at(i);
        let l = r
            .limits
            .iter()
            .find(|l| l.name == limit)
            .ok_or_else(|| RequestError::NoSuchLimit { resource: rule.to_string(), limit: limit.to_string() })?;
        let traffic = handles
            .recorded(r, limit)
            .ok_or_else(|| RequestError::NotRecorded { resource: rule.to_string(), limit: limit.to_string() })?;
        if page >= SHARDS {
            return Err(RequestError::BadPage(page.to_string()));
        }
        Ok((r, l, traffic.clone()))
    }

    /// Page `page` of the traffic recorded for limit `limit` of the rule
    /// named `rule`: `shared` (the fleet's, read from Redis) when given,
    /// else this replica's.
    pub fn recorded_traffic(
        &self,
        rules: &Installed,
        rule: &str,
        limit: &str,
        page: usize,
        shared: Option<Vec<KeyPeaks>>,
    ) -> Result<RecordedPage, crate::request::RequestError> {
        use crate::recommend::traffic::SHARDS;
        let (r, l, traffic) = self.locate(rules, rule, limit, page)?;
        let now = self.clock.now().as_nanos() / 1_000_000_000;
        let is_shared = shared.is_some();
        let peaks = shared.unwrap_or_else(|| traffic.page(page, now));
        let keys = peaks.into_iter().map(|k| (key_text(r, l, k.key), k.peaks)).collect();
        Ok(RecordedPage {
            keys: traffic.keys(),
            refused: traffic.refused(),
            shared: is_shared,
            page: keys,
            next: (page + 1 < SHARDS).then_some(page + 1),
        })
    }
}
