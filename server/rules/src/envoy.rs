//! envoyproxy/ratelimit's configuration, as it is: a directory of YAML files
//! (or `RateLimitConfig` resources served over xDS), each a `domain` and a
//! tree of `descriptors` (`key`, optional `value`, nested `descriptors`,
//! `rate_limit: {unit, requests_per_unit, name, unlimited, replaces}`,
//! `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`,
//! `share_threshold`, `metadata`), matched the way upstream matches it:
//!
//! - a request descriptor's entries are walked in order from the domain: at
//!   each level `key_value` is looked up first, then a wildcard value
//!   (`value: "foo*"`), then the key alone;
//! - a limit applies only when the walk ends on the descriptor's last entry;
//! - the counter is per distinct list of entries (key and value), so a
//!   key-only entry counts each value on its own;
//! - `unlimited` never limits; `replaces` drops the named limits of other
//!   descriptors of the same request.
//!
//! Every limit is a fixed window of its unit, aligned to the Unix epoch
//! (WEEK 7 days, MONTH 30 days, YEAR 365 days, as upstream counts them).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::{Limit, OnRedisError, Pattern, Rule, RuleErrors, SyncMode};
use crate::limiter::{Algorithm, fixed_window};

mod parse;

pub use parse::Document;

/// A rate limit unit, with Envoy's numbers (`RateLimitResponse.RateLimit.Unit`:
/// WEEK, added last, is 7 after MONTH 5 and YEAR 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Year = 6,
    Week = 7,
}

impl Unit {
    /// Shortest first.
    pub const ALL: [Unit; 7] = [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year];

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// From Envoy's enum number (`RateLimitResponse.RateLimit.Unit`); 0 is UNKNOWN.
    pub fn from_number(n: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|&u| u as i32 == n)
    }

    pub fn parse(s: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.name().eq_ignore_ascii_case(s))
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

/// A limit of ours in Envoy's terms, requests per unit: the unit of its
/// window when the window is one, else the smallest unit in which the rate is
/// a whole number, else the smallest in which it is at least one (rounded).
/// Rate-based algorithms are shown at their sustained rate (capacity per time
/// to refill from empty). Never 0.
pub fn per_unit(limit: &Limit) -> (u32, Unit) {
    let n = u128::from(limit.algorithm.capacity());
    let window = limit.algorithm.window().as_nanos().max(1);
    let unit_nanos = |u: Unit| u128::from(u.seconds()) * 1_000_000_000;
    let clamp = |v: u128| u32::try_from(v).unwrap_or(u32::MAX).max(1);
    if let Some(u) = Unit::ALL.into_iter().find(|&u| unit_nanos(u) == window) {
        return (clamp(n), u);
    }
    if let Some(u) = Unit::ALL.into_iter().find(|&u| (n * unit_nanos(u)) % window == 0 && n * unit_nanos(u) >= window) {
        return (clamp(n * unit_nanos(u) / window), u);
    }
    let at_least_one = Unit::ALL.into_iter().find(|&u| n * unit_nanos(u) >= window).unwrap_or(Unit::Year);
    (clamp((n * unit_nanos(at_least_one) + window / 2) / window), at_least_one)
}

/// One `rate_limit` of the tree.
#[derive(Clone, Debug)]
pub struct EnvoyLimit {
    /// Upstream's stat key: the domain and the descriptor path
    /// (`edge.remote_address`, `edge.generic_key_foo`).
    pub path: String,
    pub name: String,
    pub unit: Unit,
    pub requests_per_unit: u32,
    pub unlimited: bool,
    pub replaces: Vec<String>,
    /// `share_threshold`: entries (by position) that matched a wildcard whose
    /// matches share one counter, and the wildcard value their counter uses.
    pub shared: Vec<(usize, String)>,
    /// `quota_mode`: over its limit, this descriptor alone does not make the
    /// answer OVER_LIMIT; only every quota descriptor of a request over does.
    pub quota: bool,
    /// `detailed_metric`: the stat key names the request's values.
    pub detailed_metric: bool,
    /// The stat key depends on the request (`detailed_metric`, or
    /// `value_to_metric` on a descriptor of its path): see [`EnvoyConfig::stat_key`].
    pub dynamic_stat: bool,
    /// The descriptor's `metadata` (a mapping), for the answer's dynamic
    /// metadata when this limit matched and passed.
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// The limit as the engine decides it; its rule is `rules[rule]`.
    pub rule: usize,
}

#[derive(Clone, Debug, Default)]
struct Node {
    /// By `key` or `key_value`.
    children: HashMap<String, Node>,
    /// `key_value` patterns with `*`, in file order: (pattern, child key).
    wildcards: Vec<(String, String)>,
    limit: Option<usize>,
    /// `value_to_metric`: the stat key names the value this node matched.
    value_to_metric: bool,
    /// `share_threshold`: the wildcard value every match counts as.
    shared: Option<String>,
}

/// The whole configuration, every file's domain.
#[derive(Clone, Debug, Default)]
pub struct EnvoyConfig {
    domains: HashMap<String, Node>,
    limits: Vec<EnvoyLimit>,
    /// One rule per limit, holding that limit alone, for the engine.
    rules: Vec<Rule>,
}

/// How a configuration is read (upstream's settings of the same names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnvoyOptions {
    /// `MERGE_DOMAIN_CONFIG`: files of one domain add up (a descriptor
    /// defined twice at one level is still an error); else a domain is
    /// defined once.
    pub merge_domains: bool,
}

/// What a descriptor matched.
#[derive(Clone, Copy, Debug)]
pub enum Matched<'c> {
    Limit(&'c EnvoyLimit),
    Unlimited(&'c EnvoyLimit),
}

/// How a request entry found its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step<'c> {
    /// By `key_value`.
    Value,
    /// By a wildcard value (the node's composite key).
    Wildcard(&'c str),
    /// By the key alone.
    Key,
}

/// At most this many files in the directory, and bytes in all.
pub const MAX_FILES: usize = 1000;
pub(crate) const MAX_TOTAL_BYTES: u64 = 16 << 20;

// === impl EnvoyConfig ===

impl EnvoyConfig {
    /// Every `.yaml` and `.yml` file of `dir`, in name order.
    pub fn load_dir(dir: &Path, options: &EnvoyOptions) -> Result<(EnvoyConfig, String), RuleErrors> {
        let dir_name = dir.display().to_string();
        let entries = std::fs::read_dir(dir).map_err(|e| RuleErrors::one(&dir_name, format!("cannot read: {e}")))?;
        // One more than the limit is enough to refuse: a directory of a
        // million entries is not listed whole.
        let mut names: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .take(MAX_FILES + 1)
            .collect();
        names.sort();
        if names.len() > MAX_FILES {
            return Err(RuleErrors::one(&dir_name, format!("more than {MAX_FILES} files; that is the limit")));
        }
        let mut files = Vec::new();
        let mut total = 0;
        for path in names {
            let name = path.display().to_string();
            let text = crate::files::read_text(&path, super::bounds::MAX_BYTES)
                .map_err(|e| RuleErrors::one(&name, format!("cannot read: {e}")))?;
            total += text.len() as u64;
            if total > MAX_TOTAL_BYTES {
                return Err(RuleErrors::one(
                    &dir_name,
                    format!("over {MAX_TOTAL_BYTES} bytes in all; that is the limit"),
                ));
            }
            files.push((name, text));
        }
        let digest = files.iter().map(|(n, t)| format!("# {n}\n{t}\n")).collect();
        Ok((EnvoyConfig::parse_with(&files, options)?, digest))
    }

    /// Files as (name, text), with the default options.
    pub fn parse(files: &[(String, String)]) -> Result<EnvoyConfig, RuleErrors> {
        Self::parse_with(files, &EnvoyOptions::default())
    }

    /// Files as (name, text): validated whole; every error names the file,
    /// the domain and the descriptor path.
    pub(crate) fn parse_with(files: &[(String, String)], options: &EnvoyOptions) -> Result<EnvoyConfig, RuleErrors> {
        let mut errors = Vec::new();
        let documents = files
            .iter()
            .filter_map(|(file, text)| match Document::from_yaml(file, text) {
                Ok(d) => Some(d),
                Err(e) => {
                    errors.push(e);
                    None
                }
            })
            .collect::<Vec<_>>();
        match Self::from_documents(&documents, options) {
            Ok(config) if errors.is_empty() => Ok(config),
            Ok(_) => Err(RuleErrors(errors)),
            Err(RuleErrors(mut more)) => {
                errors.append(&mut more);
                Err(RuleErrors(errors))
            }
        }
    }

    /// Documents already parsed (files, or resources served over xDS),
    /// validated whole.
    pub fn from_documents(documents: &[Document], options: &EnvoyOptions) -> Result<EnvoyConfig, RuleErrors> {
        parse::read(documents, options)
    }

    pub fn has_domain(&self, domain: &str) -> bool {
        !self.domains.is_empty() && self.domains.contains_key(domain)
    }

    /// The limit one request descriptor matches, as upstream walks the tree.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched<'_>> {
        let mut found = None;
        self.walk(domain, entries, |i, node, _| {
            if i + 1 == entries.len() {
                found = node.limit.map(|l| &self.limits[l]);
            }
        });
        found.map(|l| if l.unlimited { Matched::Unlimited(l) } else { Matched::Limit(l) })
    }

    /// Upstream's walk: for each entry, `key_value`, then a wildcard value,
    /// then the key alone; `seen` is told each entry's node and how it was
    /// found. Stops at the first entry that finds none, or at a node without
    /// children.
    fn walk<'c>(&'c self, domain: &str, entries: &[(&str, &str)], mut seen: impl FnMut(usize, &'c Node, Step<'c>)) {
        let Some(mut node) = self.domains.get(domain) else { return };
        // Short `key_value`s are built on the stack.
        let mut with_value = compact_str::CompactString::default();
        for (i, (key, value)) in entries.iter().enumerate() {
            with_value.clear();
            with_value.push_str(key);
            with_value.push('_');
            with_value.push_str(value);
            let next = match node.children.get(with_value.as_str()) {
                Some(n) => Some((n, Step::Value)),
                None => node
                    .wildcards
                    .iter()
                    .find(|(p, _)| wildcard(p, &with_value))
                    .and_then(|(_, child)| Some((node.children.get(child)?, Step::Wildcard(child.as_str()))))
                    .or_else(|| Some((node.children.get(*key)?, Step::Key))),
            };
            let Some((next, step)) = next else { break };
            seen(i, next, step);
            if next.children.is_empty() {
                break;
            }
            node = next;
        }
    }

    /// The stat key of a limit whose key depends on the request
    /// ([`EnvoyLimit::dynamic_stat`]), built as upstream builds it: with
    /// `detailed_metric`, every entry as `key_value` (a shared wildcard's
    /// entry as the wildcard); else each entry as the value it matched,
    /// the request's value where `value_to_metric` says so.
    pub fn stat_key(&self, domain: &str, entries: &[(&str, &str)], limit: &EnvoyLimit) -> String {
        let mut key = String::with_capacity(64);
        key.push_str(domain);
        if limit.detailed_metric {
            for (i, (k, v)) in entries.iter().enumerate() {
                key.push('.');
                key.push_str(k);
                match limit.shared.iter().find(|(at, _)| *at == i) {
                    Some((_, w)) => {
                        key.push('_');
                        key.push_str(w);
                    }
                    None if limit.shared.is_empty() || !v.is_empty() => {
                        key.push('_');
                        key.push_str(&crate::digest::bounded(v));
                    }
                    None => {}
                }
            }
            return key;
        }
        // Only a limit's own entries reach here: the walk matched them all.
        self.walk(domain, entries, |i, node, step| {
            let (k, v) = entries[i];
            let value = match step {
                Step::Wildcard(_) if node.shared.is_some() => node.shared.as_deref().unwrap_or_default(),
                Step::Wildcard(_) if node.value_to_metric => v,
                Step::Wildcard(composite) => {
                    composite.strip_prefix(k).and_then(|c| c.strip_prefix('_')).unwrap_or(composite)
                }
                Step::Value => v,
                Step::Key if node.value_to_metric => v,
                Step::Key => "",
            };
            key.push('.');
            key.push_str(k);
            if !value.is_empty() {
                key.push('_');
                key.push_str(&crate::digest::bounded(value));
            }
        });
        key
    }

    /// The engine's rules, one per limit.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Every limit, in file order.
    pub fn limits(&self) -> &[EnvoyLimit] {
        &self.limits
    }

    /// The engine's limit of an Envoy limit.
    pub fn limit_of<'c>(&'c self, l: &EnvoyLimit) -> &'c Limit {
        &self.rules[l.rule].limits[0]
    }

    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }
}

/// Upstream's wildcard: `*` matches any run, anywhere in the pattern.
fn wildcard(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let [first, middle @ .., last] = &parts[..] else { return pattern == text };
    if !text.starts_with(first) || !text.ends_with(last) || text.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// A rule of one fixed window of `requests_per_unit` per `unit`, named
/// `name` (its limit too): how a limit of envoyproxy/ratelimit's
/// configuration, or one Envoy sends with a descriptor, is decided.
pub fn window_rule(name: String, requests_per_unit: u32, unit: Unit, shadow: bool) -> Rule {
    let window = unit.seconds() * 1_000_000_000;
    let limit = Limit {
        name: name.clone(),
        key: Vec::new(),
        algorithm: Algorithm::FixedWindow(fixed_window::Config::new(u64::from(requests_per_unit), window)),
        sync: SyncMode::default(),
        on_redis_error: OnRedisError::default(),
        shadow,
        fixed: false,
        history: false,
        lease: None,
        when: Vec::new(),
        over_limit: None,
        cost: None,
        source: 0,
    };
    Rule {
        name,
        pattern: Pattern::Exact,
        limits: vec![limit],
        concurrency: None,
        breaker: None,
        shed_at_level: None,
        shed_priority: None,
        max_breakers: super::DEFAULT_MAX_BREAKERS,
        overrides: Default::default(),
        origins: None,
        usage: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
