//! envoyproxy/ratelimit's configuration, as it is: a directory of YAML files,
//! each a `domain` and a tree of `descriptors` (`key`, optional `value`,
//! nested `descriptors`, `rate_limit: {unit, requests_per_unit, name,
//! unlimited, replaces}`, `shadow_mode`, `detailed_metric`), matched the way
//! upstream matches it:
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

use serde_yaml_ng::{Mapping, Value};

use super::{Limit, OnRedisError, Pattern, Rule, RuleError, RuleErrors, SyncMode};
use crate::limiter::{Algorithm, fixed_window};

/// A rate limit unit, with Envoy's numbers (`RateLimitResponse.RateLimit.Unit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Week = 5,
    Month = 6,
    Year = 7,
}

impl Unit {
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

    fn parse(s: &str) -> Option<Unit> {
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
}

/// The whole configuration, every file's domain.
#[derive(Clone, Debug, Default)]
pub struct EnvoyConfig {
    domains: HashMap<String, Node>,
    limits: Vec<EnvoyLimit>,
    /// One rule per limit, holding that limit alone, for the engine.
    rules: Vec<Rule>,
}

/// What a descriptor matched.
#[derive(Clone, Copy, Debug)]
pub enum Matched<'c> {
    Limit(&'c EnvoyLimit),
    Unlimited(&'c EnvoyLimit),
}

/// At most this many files in the directory, and bytes in all.
pub const MAX_FILES: usize = 1000;
pub const MAX_TOTAL_BYTES: u64 = 16 << 20;

/// The keys upstream reads, by where they appear.
const FILE_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "quota_mode",
    "share_threshold",
];
const LIMIT_KEYS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces", "metadata"];

// === impl EnvoyConfig ===

impl EnvoyConfig {
    /// Every `.yaml` and `.yml` file of `dir`, in name order.
    pub fn load_dir(dir: &Path) -> Result<(EnvoyConfig, String), RuleErrors> {
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
        Ok((EnvoyConfig::parse(&files)?, digest))
    }

    /// Files as (name, text): validated whole; every error names the file,
    /// the domain and the descriptor path.
    pub fn parse(files: &[(String, String)]) -> Result<EnvoyConfig, RuleErrors> {
        let mut config = EnvoyConfig::default();
        let mut errors = Vec::new();
        let mut owner: HashMap<String, String> = HashMap::new();
        for (file, text) in files {
            let mut err = |field: &str, message: String| {
                errors.push(RuleError { file: file.clone(), resource: None, field: field.into(), message })
            };
            if let Err(e) = super::bounds::check(text) {
                err("", format!("refused before parsing: {e}"));
                continue;
            }
            let doc: Value = match serde_yaml_ng::from_str(text) {
                Ok(v) => v,
                Err(e) => {
                    err("", format!("not valid YAML: {e}"));
                    continue;
                }
            };
            let Some(map) = doc.as_mapping() else {
                err("", "expected a mapping with 'domain' and 'descriptors'".into());
                continue;
            };
            let domain = map.get("domain").and_then(Value::as_str).unwrap_or_default().to_string();
            if domain.is_empty() {
                err("domain", "is required and must not be empty".into());
                continue;
            }
            if let Some(first) = owner.insert(domain.clone(), file.clone()) {
                err(&format!("domain '{domain}'"), format!("is also defined in {first}; each domain is defined once"));
                continue;
            }
            let mut walker =
                Walker { config: &mut config, file, domain: &domain, errors: Vec::new(), depth: 0, shared: Vec::new() };
            for (field, message) in unknown_keys(map, "", FILE_KEYS) {
                walker.error(&field, message);
            }
            let root = walker.descriptors(map.get("descriptors"), &domain, "descriptors");
            errors.append(&mut walker.errors);
            config.domains.insert(domain, root);
        }
        if errors.is_empty() { Ok(config) } else { Err(RuleErrors(errors)) }
    }

    pub fn has_domain(&self, domain: &str) -> bool {
        !self.domains.is_empty() && self.domains.contains_key(domain)
    }

    /// The limit one request descriptor matches, as upstream walks the tree.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched<'_>> {
        let mut node = self.domains.get(domain)?;
        let mut found = None;
        // Short `key_value`s are built on the stack.
        let mut with_value = compact_str::CompactString::default();
        for (i, (key, value)) in entries.iter().enumerate() {
            with_value.clear();
            with_value.push_str(key);
            with_value.push('_');
            with_value.push_str(value);
            let next = node
                .children
                .get(with_value.as_str())
                .or_else(|| {
                    let (_, child) = node.wildcards.iter().find(|(p, _)| wildcard(p, &with_value))?;
                    node.children.get(child)
                })
                .or_else(|| node.children.get(*key));
            let Some(next) = next else { break };
            if i + 1 == entries.len() {
                found = next.limit.map(|l| &self.limits[l]);
            }
            if next.children.is_empty() {
                break;
            }
            node = next;
        }
        found.map(|l| if l.unlimited { Matched::Unlimited(l) } else { Matched::Limit(l) })
    }

    /// The engine's rules, one per limit.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
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

/// Every key of `map` not in `known`, as (field, message).
fn unknown_keys(map: &Mapping, path: &str, known: &[&str]) -> Vec<(String, String)> {
    map.keys()
        .filter(|k| !k.as_str().is_some_and(|k| known.contains(&k)))
        .map(|k| {
            let name = k.as_str().map_or_else(|| format!("{k:?}"), |k| format!("'{k}'"));
            (path.to_string(), format!("unknown key {name} (expected one of: {})", known.join(", ")))
        })
        .collect()
}

/// Reads one file's tree.
struct Walker<'a> {
    config: &'a mut EnvoyConfig,
    file: &'a str,
    domain: &'a str,
    errors: Vec<RuleError>,
    /// How deep the descriptor being read is (0 at the top).
    depth: usize,
    /// The `share_threshold` wildcards on the path to it: (depth, value).
    shared: Vec<(usize, String)>,
}

impl Walker<'_> {
    /// An error naming the file, the domain and the descriptor path.
    fn error(&mut self, path: &str, message: impl Into<String>) {
        let field = if path.is_empty() {
            format!("domain '{}'", self.domain)
        } else {
            format!("domain '{}': {path}", self.domain)
        };
        self.errors.push(RuleError { file: self.file.to_string(), resource: None, field, message: message.into() });
    }

    /// A `descriptors` list: the children of the node at `stat` (`path` names it in errors).
    fn descriptors(&mut self, list: Option<&Value>, stat: &str, path: &str) -> Node {
        let mut node = Node::default();
        let items = match list {
            None | Some(Value::Null) => return node,
            Some(Value::Sequence(items)) => items,
            Some(_) => {
                self.error(path, "must be a list of descriptors");
                return node;
            }
        };
        for (i, item) in items.iter().enumerate() {
            let here = format!("{path}[{i}]");
            let Some(map) = item.as_mapping() else {
                self.error(&here, "must be a mapping");
                continue;
            };
            for (field, message) in unknown_keys(map, &here, DESCRIPTOR_KEYS) {
                self.error(&field, message);
            }
            let key = map.get("key").and_then(Value::as_str).unwrap_or_default();
            if key.is_empty() {
                self.error(&format!("{here}.key"), "is required and must not be empty");
                continue;
            }
            let value = map.get("value").and_then(Value::as_str).unwrap_or_default();
            let composite = if value.is_empty() { key.to_string() } else { format!("{key}_{value}") };
            let here = format!("{path}.{composite}");
            if node.children.contains_key(&composite) {
                self.error(&here, format!("duplicate descriptor '{composite}' at this level"));
                continue;
            }
            let stat = format!("{stat}.{composite}");
            let share = self.share_threshold(map, value, &here);
            if share {
                self.shared.push((self.depth, value.to_string()));
            }
            self.depth += 1;
            let mut child = self.descriptors(map.get("descriptors"), &stat, &format!("{here}.descriptors"));
            self.depth -= 1;
            let shadow = map.get("shadow_mode").and_then(Value::as_bool).unwrap_or(false);
            if let Some(rl) = map.get("rate_limit") {
                child.limit = self.rate_limit(rl, &stat, &format!("{here}.rate_limit"), shadow);
            }
            if share {
                self.shared.pop();
            }
            if composite.contains('*') {
                node.wildcards.push((composite.clone(), composite.clone()));
            }
            node.children.insert(composite, child);
        }
        node
    }

    /// A descriptor's `share_threshold`: whether every value its wildcard
    /// matches shares one counter.
    fn share_threshold(&mut self, map: &Mapping, value: &str, here: &str) -> bool {
        match map.get("share_threshold") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) if value.contains('*') => true,
            Some(Value::Bool(true)) => {
                self.error(
                    &format!("{here}.share_threshold"),
                    format!("applies only to a wildcard value (containing '*'), not '{value}'"),
                );
                false
            }
            Some(_) => {
                self.error(&format!("{here}.share_threshold"), "must be true or false");
                false
            }
        }
    }

    fn rate_limit(&mut self, v: &Value, stat: &str, path: &str, shadow: bool) -> Option<usize> {
        let Some(map) = v.as_mapping() else {
            self.error(path, "must be a mapping");
            return None;
        };
        for (field, message) in unknown_keys(map, path, LIMIT_KEYS) {
            self.error(&field, message);
        }
        let unlimited = map.get("unlimited").and_then(Value::as_bool).unwrap_or(false);
        let (unit, requests_per_unit) = self.size(map, path, unlimited)?;
        let name = map.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let mut replaces = Vec::new();
        for r in map.get("replaces").and_then(Value::as_sequence).into_iter().flatten() {
            match r.get("name").and_then(Value::as_str) {
                Some(n) if !n.is_empty() && n != name => replaces.push(n.to_string()),
                Some(n) if n == name => self.error(&format!("{path}.replaces"), "must not name this limit itself"),
                _ => self.error(&format!("{path}.replaces"), "every entry needs a name"),
            }
        }
        // Named by its stat, unique in the domain: the Redis key and the
        // metrics name it.
        self.config.rules.push(window_rule(stat.to_string(), requests_per_unit, unit, shadow));
        self.config.limits.push(EnvoyLimit {
            path: stat.to_string(),
            name,
            unit,
            requests_per_unit,
            unlimited,
            replaces,
            shared: self.shared.clone(),
            rule: self.config.rules.len() - 1,
        });
        Some(self.config.limits.len() - 1)
    }

    /// A limit's `unit` and `requests_per_unit` (an unlimited one has neither).
    fn size(&mut self, map: &Mapping, path: &str, unlimited: bool) -> Option<(Unit, u32)> {
        let unit = map.get("unit").and_then(Value::as_str);
        let unit = match (unlimited, unit) {
            (true, Some(_)) => {
                self.error(&format!("{path}.unit"), "must not be given with unlimited");
                return None;
            }
            (true, None) => Unit::Second,
            (false, Some(u)) => match Unit::parse(u) {
                Some(u) => u,
                None => {
                    self.error(
                        &format!("{path}.unit"),
                        format!("'{u}' is not second, minute, hour, day, week, month or year"),
                    );
                    return None;
                }
            },
            (false, None) => {
                self.error(&format!("{path}.unit"), "is required");
                return None;
            }
        };
        let rpu = map.get("requests_per_unit").map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()));
        let requests_per_unit = match (unlimited, rpu) {
            (_, Some(Some(n))) => n,
            (true, None) => 0,
            (false, None) => {
                self.error(&format!("{path}.requests_per_unit"), "is required");
                return None;
            }
            (_, Some(None)) => {
                self.error(&format!("{path}.requests_per_unit"), "must be a whole number up to 4294967295");
                return None;
            }
        };
        Some((unit, requests_per_unit))
    }
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
        lease: None,
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
    }
}

#[cfg(test)]
mod tests;
