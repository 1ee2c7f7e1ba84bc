//! YAML to a validated [`RuleSet`], reporting every error at once.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_yaml_ng::Value;

use super::concurrency::Partitions;
use super::fields::{Collector, Fields, RuleErrors};
use super::glob::Glob;
use super::overrides::{Action, Override, Overrides};
use super::{
    Concurrency, Condition, Formula, Lease, LeaseShare, Limit, MAX_DESCRIPTORS, MAX_NAME_BYTES, OnRedisError, Origins,
    OverLimit, Pattern, Rule, RuleSet, SyncMode,
};
use crate::limiter::leaky_bucket::Mode;
use crate::limiter::rate::Rate;
use crate::limiter::{
    Algorithm, Kind, balance, calendar, fixed_window, gcra, leaky_bucket, sliding_window, sliding_window_log,
    token_bucket, warm_up,
};

use super::overrides::MAX_AMOUNT;
/// The longest window or refill period (about 31 years).
const MAX_SPAN_NANOS: u64 = 1_000_000_000_000_000_000;
const MIN_WINDOW: Duration = Duration::from_millis(1);
const COMMON: &[&str] = &[
    "name",
    "key",
    "algorithm",
    "sync",
    "on_redis_error",
    "shadow",
    "fixed",
    "history",
    "lease",
    "lease_share",
    "lease_start",
    "when",
    "unless",
    "over_limit",
    "cost",
];

pub(super) fn rule_set(text: &str, file: &str) -> Result<RuleSet, RuleErrors> {
    let out = Collector::new(file);
    if let Err(e) = super::bounds::check(text) {
        out.push(None, "", format!("refused before parsing: {e}"));
        return Err(out.into_errors());
    }
    let doc: Value = match serde_yaml_ng::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            out.push(None, "", format!("not valid YAML: {e}"));
            return Err(out.into_errors());
        }
    };
    if doc.is_null() {
        out.push(None, "", "the file is empty (expected a 'resources' list)");
        return Err(out.into_errors());
    }
    let Some(top) = out.fields(&doc, None, "") else {
        return Err(out.into_errors());
    };
    top.deny_unknown(&["resources", "tiers", "systems", "global"]);
    let tiers = tiers(&top);
    let systems = super::systems::parse(&out, &top);
    let global = super::systems::parse_global(&out, &top);
    let items = match top.get("resources") {
        Some(Value::Sequence(items)) => items.as_slice(),
        Some(_) => {
            top.error("resources", "must be a list of resources");
            &[]
        }
        None => {
            top.error("resources", "is required");
            &[]
        }
    };
    let mut rules = Vec::with_capacity(items.len());
    let mut seen = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(name) = item.get("name").and_then(Value::as_str)
            && !seen.insert(name)
        {
            out.push(Some(name), "name", "is defined twice; each resource may appear once");
        }
        rules.extend(resource(&out, item, i, &tiers));
    }
    match out.is_empty() {
        true => Ok(RuleSet::new(rules, tiers, systems).with_global(global)),
        false => Err(out.into_errors()),
    }
}

fn resource(out: &Collector, item: &Value, index: usize, tiers: &HashMap<String, Vec<Limit>>) -> Option<Rule> {
    let name = item.get("name").and_then(Value::as_str);
    let label = name.map(str::to_string).unwrap_or_else(|| format!("#{}", index + 1));
    let f = out.fields(item, None, &format!("resources[{index}]"))?;
    let f = Fields::with_resource(f, &label);
    let errors_before = out.count();
    f.deny_unknown(&[
        "name",
        "limits",
        "concurrency",
        "breaker",
        "shed_at_level",
        "shed_priority",
        "max_breakers",
        "shadow",
        "overrides",
        "origins",
        "usage",
        "waterfall",
    ]);
    let name = f.required("name", Fields::string);
    if let Some(n) = &name {
        check_name(&f, "name", n);
    }
    let mut limits = limits(&f);
    if f.flag("shadow") {
        if let Some(l) = limits.iter().find(|l| l.over_limit.is_some()) {
            f.error(
                "shadow",
                format!("cannot be set beside over_limit (limit '{}'): a shadow limit denies nothing", l.name),
            );
        }
        limits.iter_mut().for_each(|l| l.shadow = true);
    }
    waterfall(&f, &mut limits);
    let overrides = overrides(&f, &limits, tiers);
    let usage = usage(&f, &limits, &overrides);
    let concurrency = f.nested("concurrency").and_then(|c| concurrency(&c));
    let breaker = f.nested("breaker").and_then(|b| super::breaker::parse(&b));
    let shed_at_level = f.u64_in("shed_at_level", 1, 3).map(|n| n as u32);
    let origins = f.nested("origins").and_then(|o| origins(&o));
    let shed_priority = super::systems::shed_priority(&f);
    let max_breakers = f.u64_in("max_breakers", 1, 10_000_000).map(|n| n as usize);
    let pattern = match name.as_deref() {
        Some("*") => Pattern::Default,
        Some(n) if Glob::is_glob(n) => Pattern::Glob,
        _ => Pattern::Exact,
    };
    if max_breakers.is_some() && pattern == Pattern::Exact {
        f.error("max_breakers", "only a glob or default rule keeps more than one breaker");
    }
    if out.count() > errors_before {
        return None;
    }
    let name = name?;
    let max_breakers = max_breakers.unwrap_or(super::DEFAULT_MAX_BREAKERS);
    Some(Rule {
        name,
        pattern,
        limits,
        concurrency,
        breaker,
        shed_at_level,
        shed_priority,
        max_breakers,
        overrides,
        origins,
        usage,
    })
}

/// The most sources a waterfall may list after the rule's own limits.
pub(crate) const MAX_WATERFALL: usize = 8;

/// `waterfall: [limits...]`: sources that pay, in order, for a call the
/// rule's own limits have no room for. Each is one limit, appended to
/// `limits` with its position as `source`.
fn waterfall(f: &Fields<'_>, limits: &mut Vec<Limit>) {
    if !f.has("waterfall") {
        return;
    }
    let sources = limit_list(f, "waterfall");
    if sources.len() > MAX_WATERFALL {
        f.error("waterfall", format!("lists {} sources; the limit is {MAX_WATERFALL}", sources.len()));
        return;
    }
    let own = match f.get("limits") {
        Some(Value::Sequence(items)) => !items.is_empty(),
        _ => false,
    };
    if !own {
        f.error("waterfall", "follows the rule's own limits: give the rule 'limits' that are tried first");
    }
    if f.flag("shadow") {
        f.error("waterfall", "cannot be used on a shadow rule, which denies nothing and so never needs another source");
    }
    for (i, mut l) in sources.into_iter().enumerate() {
        let why_not = if limits.iter().any(|o| o.name == l.name) {
            Some("is the name of another limit of this resource")
        } else if l.lease.is_some() {
            Some("cannot have a 'lease': a source pays only for calls the sources before it refused")
        } else if l.over_limit.is_some() {
            Some("cannot have 'over_limit': a source either has room or passes the call to the next")
        } else if l.shadow {
            Some("cannot be a shadow limit: a source either has room or passes the call to the next")
        } else if l.algorithm.shapes() {
            Some("cannot be a shaping limit: a source admits or refuses at once")
        } else {
            None
        };
        if let Some(why) = why_not {
            f.error("waterfall", format!("source '{}' {why}", l.name.escape_debug()));
            continue;
        }
        l.source = (i + 1) as u8;
        limits.push(l);
    }
}

/// `usage: [input_tokens, output_tokens]`: the fields a call may report,
/// and every `cost` formula of the rule (its overrides' too) reads only
/// these.
fn usage(f: &Fields<'_>, limits: &[Limit], overrides: &Overrides) -> Vec<String> {
    use super::cost::MAX_USAGE_FIELDS;
    let usage = f.strings("usage").unwrap_or_default();
    if usage.len() > MAX_USAGE_FIELDS {
        f.error("usage", format!("names {} fields; the limit is {MAX_USAGE_FIELDS}", usage.len()));
    }
    let mut seen = HashSet::new();
    for name in &usage {
        let valid = super::cost::usage_name_form(name) && !name.as_bytes()[0].is_ascii_digit();
        if !valid {
            f.error("usage", format!("'{}' is not a usage field name (lowercase letters, digits and _, at most 64 bytes, not starting with a digit)", name.escape_debug()));
        } else if !seen.insert(name.as_str()) {
            f.error("usage", format!("names '{name}' twice"));
        }
    }
    let overridden = overrides.list().iter().flat_map(|o| o.limits.iter());
    let mut told = HashSet::new();
    for l in limits.iter().chain(overridden) {
        let Some(formula) = &l.cost else { continue };
        for field in formula.fields() {
            if !seen.contains(field) && told.insert((l.name.clone(), field.to_string())) {
                let declared = if usage.is_empty() {
                    "the rule has no 'usage' list".to_string()
                } else {
                    format!("the rule's usage fields are: {}", usage.join(", "))
                };
                f.error(
                    "usage",
                    format!(
                        "limit '{}' reads usage field '{field}' in its cost, which 'usage' does not name ({declared})",
                        l.name
                    ),
                );
            }
        }
    }
    let mut all = limits.iter().chain(overrides.list().iter().flat_map(|o| o.limits.iter()));
    // A limit whose formula was refused is not among `limits`: its error
    // is the one to read, not this one.
    let written = ["limits", "waterfall"].iter().any(|key| match f.get(key) {
        Some(Value::Sequence(items)) => items.iter().any(|item| item.get("cost").is_some()),
        _ => false,
    });
    if !usage.is_empty() && !written && all.all(|l| l.cost.is_none()) {
        f.error("usage", "is given, but no limit has a 'cost' formula that reads it");
    }
    usage
}

/// The most values a condition or an origins list may name.
const MAX_VALUES: usize = 1_000;

/// `origins: { key: origin, allow: [...] }` or `{ deny: [...] }`.
fn origins(f: &Fields<'_>) -> Option<Origins> {
    f.deny_unknown(&["key", "allow", "deny"]);
    let key = if f.has("key") { f.string("key")? } else { "origin".to_string() };
    check_name(f, "key", &key);
    let (field, allow) = match (f.has("allow"), f.has("deny")) {
        (true, false) => ("allow", true),
        (false, true) => ("deny", false),
        _ => {
            f.error("allow", "needs exactly one of allow or deny: a list of values");
            return None;
        }
    };
    let values = values(f, field)?;
    Some(Origins { key, allow, values })
}

/// A list of descriptor values (one scalar for a list of one).
fn values(f: &Fields<'_>, key: &str) -> Option<Vec<String>> {
    let values = match f.get(key) {
        Some(Value::Sequence(items)) => items.iter().map(yaml_scalar).collect::<Option<Vec<_>>>(),
        Some(v) => yaml_scalar(v).map(|s| vec![s]),
        None => None,
    };
    match values {
        Some(v) if !v.is_empty() && v.len() <= MAX_VALUES => {
            for value in &v {
                if value.len() > MAX_NAME_BYTES {
                    f.error(key, format!("a value is {} bytes long; the limit is {MAX_NAME_BYTES}", value.len()));
                    return None;
                }
            }
            Some(v)
        }
        _ => {
            f.error(key, format!("must be a value or a list of 1 to {MAX_VALUES} values"));
            None
        }
    }
}

/// A limit's `when: { key: [values], ... }` and `unless: { key: [values], ... }`.
fn conditions(f: &Fields<'_>) -> Option<Vec<Condition>> {
    let mut out = Vec::new();
    let mut ok = true;
    for (field, negate) in [("when", false), ("unless", true)] {
        let map = match f.get(field) {
            None => continue,
            Some(Value::Mapping(m)) if !m.is_empty() && m.len() <= MAX_DESCRIPTORS => m,
            Some(_) => {
                f.error(field, "must map descriptor keys to their values, e.g. { origin: [app-a, app-b] }");
                ok = false;
                continue;
            }
        };
        let holder = f.nested(field)?;
        for (k, _) in map {
            let Some(key) = k.as_str() else {
                f.error(field, "a descriptor key must be a string");
                ok = false;
                continue;
            };
            check_name(f, field, key);
            match values(&holder, key) {
                Some(values) => out.push(Condition { key: key.to_string(), values, negate }),
                None => ok = false,
            }
        }
    }
    ok.then_some(out)
}

fn check_name(f: &Fields<'_>, key: &str, name: &str) {
    if name.is_empty() {
        f.error(key, "must not be empty");
    } else if name.len() > MAX_NAME_BYTES {
        f.error(key, format!("is {} bytes long; the limit is {MAX_NAME_BYTES}", name.len()));
    } else if let Some(c) = name.chars().find(|c| c.is_control()) {
        f.error(key, format!("control character U+{:04X} is not allowed", c as u32));
    }
}

/// At most this many overrides per resource, and values in one's `when`.
pub(crate) const MAX_OVERRIDES: usize = 1_000_000;
const MAX_WHEN: usize = 8;

/// `tiers: { gold: [limits...] }`: named sets of limits overrides can pick.
fn tiers(top: &Fields<'_>) -> HashMap<String, Vec<Limit>> {
    let mut out = HashMap::new();
    let Some(map) = top.get("tiers") else { return out };
    let Some(map) = map.as_mapping() else {
        top.error("tiers", "must be a mapping of tier names to lists of limits");
        return out;
    };
    for (name, list) in map {
        let Some(name) = name.as_str() else {
            top.error("tiers", "tier names must be strings");
            continue;
        };
        let holder = serde_yaml_ng::Mapping::from_iter([(Value::from("limits"), list.clone())]);
        let holder = Value::Mapping(holder);
        let Some(t) = top.nested_value(&holder, &format!("tiers.{name}")) else { continue };
        out.insert(name.to_string(), limit_list(&t, "limits"));
    }
    out
}

/// A resource's `overrides`: each `when` some descriptor values, and one of
/// `block: true` (with `retry_after`), `factor: F`, `limits: {name: N}` or
/// `tier: NAME`.
fn overrides(f: &Fields<'_>, limits: &[Limit], tiers: &HashMap<String, Vec<Limit>>) -> Overrides {
    let items = match f.get("overrides") {
        None => return Overrides::default(),
        Some(Value::Sequence(items)) => items,
        Some(_) => {
            f.error("overrides", "must be a list of overrides");
            return Overrides::default();
        }
    };
    if items.len() > MAX_OVERRIDES {
        f.error("overrides", format!("{} overrides; the limit is {MAX_OVERRIDES}", items.len()));
        return Overrides::default();
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(o) = f.nested_value(item, &format!("overrides[{i}]")) else { continue };
        if let Some(o) = one_override(&o, limits, tiers) {
            out.push(o.tagged(format!("#{i}")));
        }
    }
    Overrides::new(limits, out)
}

fn one_override(f: &Fields<'_>, limits: &[Limit], tiers: &HashMap<String, Vec<Limit>>) -> Option<Override> {
    f.deny_unknown(&["when", "block", "retry_after", "factor", "limits", "tier"]);
    let when: Vec<(String, String)> = match f.get("when").and_then(Value::as_mapping) {
        Some(m) => m.iter().filter_map(|(k, v)| Some((k.as_str()?.to_string(), yaml_scalar(v)?))).collect(),
        None => {
            f.error("when", "is required: a mapping of descriptor keys to values, e.g. { tenant: acme }");
            return None;
        }
    };
    if when.is_empty() || when.len() > MAX_WHEN {
        f.error("when", format!("must name 1 to {MAX_WHEN} descriptor values, got {}", when.len()));
        return None;
    }
    for (k, _) in &when {
        check_name(f, "when", k);
    }
    let given: Vec<&str> = ["block", "factor", "limits", "tier"].into_iter().filter(|k| f.has(k)).collect();
    if given.len() != 1 {
        f.error("when", "needs exactly one of block, factor, limits or tier");
        return None;
    }
    if f.has("retry_after") && given[0] != "block" {
        f.error("retry_after", "applies only with block: true");
    }
    let action = override_action(f, given[0])?;
    match Override::new(when, action, limits, tiers) {
        Ok(o) => Some(o),
        Err((field, why)) => {
            f.error(field, why);
            None
        }
    }
}

/// What an override does, from the one of `block`, `factor`, `limits` and
/// `tier` it gives (`given`).
fn override_action(f: &Fields<'_>, given: &str) -> Option<Action> {
    Some(match given {
        "block" => {
            if !f.flag("block") {
                f.error("block", "must be true (remove the override to unblock)");
                return None;
            }
            let retry_after = if f.has("retry_after") {
                f.duration("retry_after", Duration::from_secs(1))?
            } else {
                Duration::from_secs(60)
            };
            Action::Block { retry_after }
        }
        "factor" => Action::Factor(f.f64("factor")?),
        "limits" => {
            let Some(map) = f.get("limits").and_then(Value::as_mapping) else {
                f.error("limits", "must map limit names to numbers, e.g. { per-user: 5000 }");
                return None;
            };
            let mut set = Vec::new();
            for (k, v) in map {
                let name = k.as_str().unwrap_or_default();
                let Some(n) = v.as_u64() else {
                    f.error("limits", format!("'{name}' must be a whole number from 1 to {MAX_AMOUNT}"));
                    return None;
                };
                set.push((name.to_string(), n));
            }
            Action::Limits(set)
        }
        _ => Action::Tier(f.string("tier")?),
    })
}

/// A descriptor value as YAML writes it: a string, a number or a boolean.
fn yaml_scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn limits(f: &Fields<'_>) -> Vec<Limit> {
    limit_list(f, "limits")
}

fn limit_list(f: &Fields<'_>, key: &str) -> Vec<Limit> {
    let items = match f.get(key) {
        None => return Vec::new(),
        Some(Value::Sequence(items)) => items,
        Some(_) => {
            f.error(key, "must be a list of limits");
            return Vec::new();
        }
    };
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let label = match item.get("name").and_then(Value::as_str) {
            Some(n) => format!("{key}[{i}] '{n}'"),
            None => format!("{key}[{i}]"),
        };
        let Some(l) = f.nested_value(item, &label) else {
            continue;
        };
        if let Some(limit) = limit(&l) {
            if !names.insert(limit.name.clone()) {
                l.error("name", "is used by another limit of this resource");
            }
            out.push(limit);
        }
    }
    out
}

fn limit(f: &Fields<'_>) -> Option<Limit> {
    let name = f.required("name", Fields::string);
    if let Some(n) = &name {
        check_name(f, "name", n);
    }
    let key = f.strings("key").unwrap_or_default();
    check_key(f, &key);
    let (sync, on_error) = sync_and_outage(f);
    let algorithm = match f.required("algorithm", |f, k| f.choice(k, Kind::NAMED))? {
        Kind::TokenBucket => token_bucket(f),
        Kind::Gcra => gcra(f),
        Kind::LeakyBucket => leaky_bucket(f),
        Kind::FixedWindow => fixed(f),
        Kind::SlidingWindowLog => windowed(f, sliding_window_log::MAX_LIMIT)
            .map(|(l, w)| Algorithm::SlidingWindowLog(sliding_window_log::Config::new(l, w))),
        Kind::SlidingWindow => {
            windowed(f, MAX_AMOUNT).map(|(l, w)| Algorithm::SlidingWindow(sliding_window::Config::new(l, w)))
        }
        Kind::WarmUp => warm_up(f, sync),
        Kind::Balance => balance(f, sync),
    };
    let shadow = f.flag("shadow");
    let fixed = f.flag("fixed");
    let history = f.flag("history");
    if history && key.is_empty() {
        f.error("history", "records each key's calls, and this limit has no key: give it one, or leave history out");
    }
    let lease = lease(f, algorithm.as_ref());
    let when = conditions(f);
    let shapes = algorithm.as_ref().is_some_and(Algorithm::shapes);
    let bucket = matches!(&algorithm, Some(Algorithm::TokenBucket(_) | Algorithm::Gcra(_) | Algorithm::LeakyBucket(_)));
    let over_limit = over_limit(f, sync, shadow, lease.is_some(), shapes, bucket);
    let cost = cost(f, lease.is_some());
    // A shaping warm-up's queue is one replica's: local unless told (and refused otherwise).
    let shaping = matches!(&algorithm, Some(a @ Algorithm::WarmUp(_)) if a.shapes());
    let sync = sync.or(shaping.then_some(SyncMode::Local));
    // A balance is money: exact in Redis unless told, and spent by no
    // replica alone while Redis is away unless told.
    let balance = matches!(&algorithm, Some(Algorithm::Balance(_)));
    let sync = sync.or(balance.then_some(SyncMode::Strict));
    let on_error = on_error.or(balance.then_some(OnRedisError::Deny));
    if balance && lease.is_some() {
        f.error("lease", "a balance cannot be leased: its units do not come back with time");
        return None;
    }
    if balance && on_error.is_some_and(|e| e != OnRedisError::Deny) {
        f.error(
            "on_redis_error",
            "a balance pays for nothing while Redis is away: only 'deny' (its default) is allowed, because 'allow' would give calls away and 'local' would let each replica spend credits the others may have spent",
        );
        return None;
    }
    if balance && matches!(over_limit, Some(Some(_))) {
        f.error("over_limit", "cannot be used on a balance: calls over it would spend credits nobody topped up");
        return None;
    }
    Some(Limit {
        name: name?,
        key,
        algorithm: algorithm?,
        sync: sync.unwrap_or_default(),
        on_redis_error: on_error.unwrap_or_default(),
        shadow,
        fixed,
        history,
        lease,
        when: when?,
        over_limit: over_limit?,
        cost: cost?,
        source: 0,
    })
}

/// `cost: input_tokens + output_tokens * 4`: `Some(None)` when absent,
/// `None` (with the error told) when wrong.
fn cost(f: &Fields<'_>, leased: bool) -> Option<Option<Formula>> {
    let value = match f.get("cost") {
        None => return Some(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => {
            f.error("cost", "must be a formula over usage fields, e.g. input_tokens + output_tokens * 4");
            return None;
        }
    };
    if leased {
        f.error("cost", "cannot be used with 'lease': a lease's holder counts calls, not usage");
        return None;
    }
    match Formula::parse(&value) {
        Ok(formula) => Some(Some(formula)),
        Err(why) => {
            f.error("cost", format!("'{}' {why}", value.escape_debug()));
            None
        }
    }
}

/// `over_limit: { admit: 10% }`: `Some(None)` when absent, `None` (with the
/// error told) when wrong.
fn over_limit(
    f: &Fields<'_>,
    sync: Option<SyncMode>,
    shadow: bool,
    leased: bool,
    shapes: bool,
    bucket: bool,
) -> Option<Option<OverLimit>> {
    if !f.has("over_limit") {
        return Some(None);
    }
    let why_not = if shapes {
        Some("cannot be used on a shaping limit: the calls over it would go ahead of the callers that wait their turn")
    } else if sync == Some(SyncMode::Strict) {
        Some("cannot be used with 'sync: strict', which promises to admit exactly the limit")
    } else if shadow {
        Some("changes nothing on a shadow limit, which denies nothing")
    } else if leased {
        Some("cannot be used with 'lease': a lease's holder decides its calls alone")
    } else {
        None
    };
    if let Some(why) = why_not {
        f.error("over_limit", why);
        return None;
    }
    let o = f.nested("over_limit")?;
    o.deny_unknown(&["admit", "ramp"]);
    let ramp = o.flag("ramp");
    if ramp && !bucket {
        o.error(
            "ramp",
            "needs a token_bucket, gcra or leaky_bucket: a window's count does not say how far over a caller is",
        );
        return None;
    }
    let admit = o.required("admit", |o, k| {
        // A percent sign, always: a bare 0.1 could be read as a tenth.
        let value = o.get(k)?;
        let share = value
            .as_str()
            .filter(|s| s.trim().ends_with('%'))
            .and_then(|_| super::concurrency::percent(value))
            .filter(|p| *p >= 0.0001 && *p < 100.0);
        if share.is_none() {
            let got = match value {
                Value::String(s) => s.clone(),
                other => serde_yaml_ng::to_string(other).unwrap_or_default().trim().to_string(),
            };
            o.error(
                k,
                format!("must be a share from 0.0001% to below 100%, with its percent sign (e.g. 10%), got {got}"),
            );
        }
        share
    })?;
    let admit_ppm = ((admit * 10_000.0).round() as u32).clamp(1, 999_999);
    Some(Some(OverLimit { admit_ppm, ramp }))
}

/// The longest lease a limit may hand out.
const MAX_LEASE: Duration = Duration::from_secs(60);

/// `lease: 2s`: clients may take a share of this limit for up to that long
/// and decide on their own (see `engine::lease`); `lease_share: fair` (the
/// default) or `proportional` divides it among holders that want more than
/// there is; `lease_start: all` (the default) or `paced` says whether a
/// holder's lease on a long window starts from the window's pace.
fn lease(f: &Fields<'_>, algorithm: Option<&Algorithm>) -> Option<Lease> {
    let share = f.choice("lease_share", &[("fair", LeaseShare::Fair), ("proportional", LeaseShare::Proportional)]);
    let paced = f.choice("lease_start", &[("paced", true), ("all", false)]);
    if !f.has("lease") {
        for field in ["lease_share", "lease_start"] {
            if f.has(field) {
                f.error(field, "only a limit with `lease:` is leased");
            }
        }
        return None;
    }
    let ttl = f.duration("lease", Duration::from_millis(100))?;
    if ttl > MAX_LEASE {
        f.error("lease", format!("must be at most 1m, got {}", super::duration::format(ttl)));
        return None;
    }
    if let Some(Algorithm::LeakyBucket(c)) = algorithm
        && matches!(c.mode, Mode::Shape { .. })
    {
        f.error("lease", "a shaping leaky bucket makes callers wait; it cannot be leased");
        return None;
    }
    Some(Lease { ttl, share: share.unwrap_or_default(), paced: paced.unwrap_or(false) })
}

fn check_key(f: &Fields<'_>, key: &[String]) {
    if key.len() > MAX_DESCRIPTORS {
        f.error("key", format!("names {} descriptors; a request carries at most {MAX_DESCRIPTORS}", key.len()));
    }
    let mut seen = HashSet::new();
    for (i, k) in key.iter().enumerate() {
        check_name(f, &format!("key[{i}]"), k);
        if !seen.insert(k) {
            f.error(&format!("key[{i}]"), format!("descriptor '{k}' is named twice"));
        }
    }
}

fn rate(f: &Fields<'_>, key: &str) -> Option<Rate> {
    let r = f.required(key, Fields::f64)?;
    Rate::per_second(r).map_err(|e| f.error(key, e.to_string())).ok()
}

fn amount(f: &Fields<'_>, key: &str, max: u64) -> Option<u64> {
    f.required(key, |f, k| f.u64_in(k, 1, max))
}

fn token_bucket(f: &Fields<'_>) -> Option<Algorithm> {
    f.deny_unknown(&[COMMON, &["capacity", "refill_per_second"]].concat());
    let (capacity, refill) = (amount(f, "capacity", MAX_AMOUNT), rate(f, "refill_per_second"));
    let cfg = token_bucket::Config::new(capacity?, refill?);
    within_span(f, "capacity", cfg.refill.time_for(crate::limiter::rate::pico(cfg.capacity)))?;
    Some(Algorithm::TokenBucket(cfg))
}

fn gcra(f: &Fields<'_>) -> Option<Algorithm> {
    f.deny_unknown(&[COMMON, &["rate_per_second", "burst"]].concat());
    let (rate, burst) = (rate(f, "rate_per_second"), amount(f, "burst", MAX_AMOUNT));
    let cfg = gcra::Config::new(rate?, burst?);
    within_span(f, "burst", cfg.emission_interval.saturating_mul(cfg.burst))?;
    Some(Algorithm::Gcra(cfg))
}

fn leaky_bucket(f: &Fields<'_>) -> Option<Algorithm> {
    f.deny_unknown(&[COMMON, &["capacity", "leak_per_second", "mode", "max_wait"]].concat());
    let (capacity, leak) = (amount(f, "capacity", MAX_AMOUNT), rate(f, "leak_per_second"));
    let shape = f.choice("mode", &[("police", false), ("shape", true)]);
    let max_wait = f.duration("max_wait", Duration::ZERO);
    if f.has("max_wait") && shape != Some(true) {
        f.error("max_wait", "applies only to mode: shape");
        return None;
    }
    let mode = match shape {
        Some(true) => Mode::Shape { max_wait: max_wait.map(crate::time::duration_nanos) },
        Some(false) => Mode::Police,
        None if f.has("mode") => return None,
        None => Mode::Police,
    };
    let cfg = leaky_bucket::Config::new(capacity?, leak?, mode);
    within_span(f, "capacity", cfg.leak.time_for(crate::limiter::rate::pico(cfg.capacity)))?;
    Some(Algorithm::LeakyBucket(cfg))
}

/// `rate_per_second`, `warm_up_period`, `cold_factor` (3), `mode: police |
/// shape` and, shaping, `max_wait` (500 ms, Sentinel's default). A shaping
/// warm-up queues callers on one replica: it is refused for `replicated`
/// and `strict`.
fn warm_up(f: &Fields<'_>, sync: Option<SyncMode>) -> Option<Algorithm> {
    f.deny_unknown(&[COMMON, &["rate_per_second", "warm_up_period", "cold_factor", "mode", "max_wait"]].concat());
    let rate = rate(f, "rate_per_second");
    let period = f.required("warm_up_period", |f, k| f.duration(k, Duration::from_secs(1)));
    let cold_factor = if f.has("cold_factor") { f.u64_in("cold_factor", 2, 1000).map(|n| n as u32) } else { Some(3) };
    let shape = f.choice("mode", &[("police", false), ("shape", true)]);
    if f.has("max_wait") && shape != Some(true) {
        f.error("max_wait", "applies only to mode: shape");
        return None;
    }
    let max_wait = if f.has("max_wait") { f.duration("max_wait", Duration::ZERO)? } else { Duration::from_millis(500) };
    let mode = match shape {
        Some(true) => warm_up::Mode::Shape { max_wait_ms: max_wait.as_millis() as u64 },
        Some(false) => warm_up::Mode::Police,
        None if f.has("mode") => return None,
        None => warm_up::Mode::Police,
    };
    if matches!(mode, warm_up::Mode::Shape { .. }) && matches!(sync, Some(SyncMode::Replicated | SyncMode::Strict)) {
        f.error(
            "mode",
            "a shaping warm-up queues its callers on one replica: use sync: local (or mode: police with Redis)",
        );
        return None;
    }
    match warm_up::Config::new(rate?, period?, cold_factor?, mode) {
        Ok(cfg) => Some(Algorithm::WarmUp(cfg)),
        Err(e) => {
            f.error("warm_up_period", e.to_string());
            None
        }
    }
}

/// `algorithm: balance` (with an optional `max_balance`): units an operator
/// tops up, which never come back on their own. Replicas cannot share one
/// out by leases: `sync: replicated` is refused.
fn balance(f: &Fields<'_>, sync: Option<SyncMode>) -> Option<Algorithm> {
    f.deny_unknown(&[COMMON, &["max_balance"]].concat());
    let max = if f.has("max_balance") { f.u64_in("max_balance", 1, balance::MAX)? } else { balance::MAX };
    if sync == Some(SyncMode::Replicated) {
        f.error(
            "sync",
            "a balance cannot be replicated (shared out between syncs): use sync: strict (the default for a balance) or local",
        );
        return None;
    }
    Some(Algorithm::Balance(balance::Config::new(max)))
}

/// `limit` and `window` of the window algorithms, the window in nanoseconds.
/// A fixed window: `window: 1h`, or `calendar: day|week|month|year` with an
/// optional `time_zone` (an IANA name; UTC by default).
fn fixed(f: &Fields<'_>) -> Option<Algorithm> {
    if !f.has("calendar") {
        if f.has("time_zone") {
            f.error("time_zone", "applies only with calendar: day, week, month or year");
        }
        return windowed(f, MAX_AMOUNT).map(|(l, w)| Algorithm::FixedWindow(fixed_window::Config::new(l, w)));
    }
    f.deny_unknown(&[COMMON, &["limit", "calendar", "time_zone"]].concat());
    if f.has("window") {
        f.error("window", "give either window or calendar, not both");
    }
    let limit = amount(f, "limit", MAX_AMOUNT);
    let unit = f.choice(
        "calendar",
        &[
            ("day", calendar::Unit::Day),
            ("week", calendar::Unit::Week),
            ("month", calendar::Unit::Month),
            ("year", calendar::Unit::Year),
        ],
    );
    let zone = if f.has("time_zone") { f.string("time_zone")? } else { "UTC".to_string() };
    let cal = match calendar::Calendar::new(unit?, &zone) {
        Ok(c) => Some(c),
        Err(e) => {
            f.error("time_zone", e);
            None
        }
    };
    if f.has("window") {
        return None;
    }
    Some(Algorithm::FixedWindow(fixed_window::Config::calendar(limit?, cal?)))
}

fn windowed(f: &Fields<'_>, max_limit: u64) -> Option<(u64, u64)> {
    f.deny_unknown(&[COMMON, &["limit", "window"]].concat());
    let limit = amount(f, "limit", max_limit);
    let window = f.required("window", |f, k| f.duration(k, MIN_WINDOW));
    let window = crate::time::duration_nanos(window?);
    within_span(f, "window", window)?;
    Some((limit?, window))
}

fn within_span(f: &Fields<'_>, key: &str, nanos: u64) -> Option<()> {
    if nanos > MAX_SPAN_NANOS {
        f.error(key, "makes a refill period or window longer than 31 years");
        return None;
    }
    Some(())
}

/// `sync` and `on_redis_error`, as limits and concurrency limits write them.
fn sync_and_outage(f: &Fields<'_>) -> (Option<SyncMode>, Option<OnRedisError>) {
    let sync = f.choice(
        "sync",
        &[("replicated", SyncMode::Replicated), ("strict", SyncMode::Strict), ("local", SyncMode::Local)],
    );
    let on_error = f.choice(
        "on_redis_error",
        &[("local", OnRedisError::Local), ("allow", OnRedisError::Allow), ("deny", OnRedisError::Deny)],
    );
    (sync, on_error)
}

fn concurrency(f: &Fields<'_>) -> Option<Concurrency> {
    f.deny_unknown(&["max_in_flight", "adaptive", "partitions", "permit_ttl", "sync", "on_redis_error"]);
    let adaptive = if f.has("adaptive") {
        if f.has("max_in_flight") {
            f.error("max_in_flight", "cannot be set beside 'adaptive' (the adaptive limit's ceiling is adaptive.max)");
        }
        Some(f.nested("adaptive").and_then(|a| super::concurrency::parse_adaptive(&a)))
    } else {
        None
    };
    let max = match adaptive {
        Some(a) => a.map(|a| u64::from(a.max)),
        None => f.required("max_in_flight", |f, k| f.u64_in(k, 1, 10_000_000)),
    };
    let partitions = match f.has("partitions") {
        true => f.nested("partitions").and_then(|p| Partitions::parse(&p)),
        false => Some(Partitions::default()),
    };
    let ttl = f.duration("permit_ttl", Duration::from_millis(1));
    let ttl = if f.has("permit_ttl") { ttl? } else { Duration::from_secs(60) };
    let (sync, on_redis_error) = sync_and_outage(f);
    Some(Concurrency {
        max_in_flight: max? as u32,
        adaptive: adaptive.flatten(),
        partitions: partitions?,
        permit_ttl: ttl,
        sync: sync.unwrap_or_default(),
        on_redis_error: on_redis_error.unwrap_or_default(),
    })
}
