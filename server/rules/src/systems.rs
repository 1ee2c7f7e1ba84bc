//! Systems: named groups of resources with a degradation level of their own,
//! the signals that set it and the thresholds of each signal; and request
//! priorities, with the level from which each is shed.
//!
//! ```yaml
//! systems:
//!   - name: payments
//!     resources: ["payments.*", "POST /checkout"]
//!     cpu: [0.6, 0.75, 0.9]            # or "60%"; `off` turns a signal off
//!     memory: [0.7, 0.8, 0.9]
//!     error_rate: [0.05, 0.15, 0.30]
//!     latency: { p90: [200ms, 500ms, 1s] }
//!     load: { aggregate: mean, instance_timeout: 5s, max_instances: 1000 }
//!     min_time_at_level: 5s
//! ```

use std::collections::HashMap;
use std::time::Duration;

use serde_yaml_ng::Value;

use super::fields::{Collector, Fields, kind, show};
use super::glob::Glob;

/// The most systems one rules file may name.
pub(crate) const MAX_SYSTEMS: usize = 64;
/// The most resource patterns one system may list.
pub(crate) const MAX_SYSTEM_PATTERNS: usize = 1000;
/// The highest degradation level.
pub const MAX_LEVEL: u32 = 3;

/// A request's criticality, most important first (Google's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Never shed by a level.
    CriticalPlus,
    /// What a request without a priority is.
    #[default]
    Critical,
    SheddablePlus,
    Sheddable,
}

impl Priority {
    pub const ALL: [Priority; 4] =
        [Priority::CriticalPlus, Priority::Critical, Priority::SheddablePlus, Priority::Sheddable];

    /// Its place in [`Priority::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// As written in rules files (`sheddable_plus`).
    pub fn key(self) -> &'static str {
        match self {
            Priority::CriticalPlus => "critical_plus",
            Priority::Critical => "critical",
            Priority::SheddablePlus => "sheddable_plus",
            Priority::Sheddable => "sheddable",
        }
    }

    /// As the API spells it (`PRIORITY_SHEDDABLE_PLUS`).
    pub fn name(self) -> &'static str {
        match self {
            Priority::CriticalPlus => "PRIORITY_CRITICAL_PLUS",
            Priority::Critical => "PRIORITY_CRITICAL",
            Priority::SheddablePlus => "PRIORITY_SHEDDABLE_PLUS",
            Priority::Sheddable => "PRIORITY_SHEDDABLE",
        }
    }

    /// A descriptor value (Envoy's RLS): `sheddable`, `SHEDDABLE_PLUS`,
    /// `PRIORITY_CRITICAL`..., in any case.
    pub fn parse(text: &str) -> Option<Priority> {
        let t = text.trim().to_ascii_lowercase();
        let t = t.strip_prefix("priority_").unwrap_or(&t);
        Priority::ALL.into_iter().find(|p| p.key() == t)
    }
}

/// From which level each priority is shed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityShedding([u8; 4]);

/// Above every level: never shed.
const NEVER: u8 = MAX_LEVEL as u8 + 1;

impl PriorityShedding {
    /// Level 1 sheds SHEDDABLE, 2 also SHEDDABLE_PLUS, 3 everything but CRITICAL_PLUS.
    pub(crate) const DEFAULT: PriorityShedding = PriorityShedding([NEVER, 3, 2, 1]);
    /// Nothing is shed by priority (the global scope, unless a rule asks).
    pub(crate) const NONE: PriorityShedding = PriorityShedding([NEVER; 4]);

    /// The level from which `p` is shed, when it is shed at `level`.
    #[inline]
    pub fn sheds(self, p: Priority, level: u32) -> Option<u32> {
        let at = u32::from(self.0[p as usize]);
        (level >= at).then_some(at)
    }

    /// The level from which `p` is shed; `None` for never.
    pub fn at(self, p: Priority) -> Option<u32> {
        let at = self.0[p as usize];
        (at != NEVER).then_some(u32::from(at))
    }

    /// Four bytes, for an atomic.
    pub fn pack(self) -> u32 {
        u32::from_le_bytes(self.0)
    }

    pub fn unpack(v: u32) -> Self {
        PriorityShedding(v.to_le_bytes())
    }
}

/// How the load of a system's instances is summed up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aggregate {
    /// The mean over live instances.
    Mean,
    /// The busiest instance.
    Max,
    /// A level when at least `share` of the live instances are at its threshold.
    Share,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadConfig {
    pub aggregate: Aggregate,
    /// With `Share`: the share of instances (0 to 1) that must be above a threshold.
    pub share: f64,
    /// An instance silent this long leaves the aggregate.
    pub instance_timeout: Duration,
    /// The most live instances per system; more are refused.
    pub max_instances: usize,
}

/// Which percentile of the system's call latency is watched.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentile(pub f64);

/// One named system.
#[derive(Clone, Debug, PartialEq)]
pub struct SystemConfig {
    /// Empty for the global scope.
    pub name: String,
    /// Exact resource names and globs.
    pub resources: Vec<String>,
    /// Thresholds raising the level to 1, 2, 3; `None` turns the signal off.
    pub error_rate: Option<[f64; 3]>,
    pub slow_call_rate: Option<[f64; 3]>,
    /// A reported call is slow when strictly longer than this.
    pub slow_call_duration: Duration,
    pub latency: Option<(Percentile, [Duration; 3])>,
    pub cpu: Option<[f64; 3]>,
    pub memory: Option<[f64; 3]>,
    pub queue_delay: Option<[Duration; 3]>,
    pub load: LoadConfig,
    /// A level is left only once every signal is below this share of its threshold.
    pub hysteresis: f64,
    /// The least time at a level before it falls (it rises at once).
    pub min_time_at_level: Duration,
    /// Rates of fewer calls than this in the window raise nothing.
    pub minimum_calls: u32,
    /// The window of outcomes, in seconds.
    pub window_seconds: u32,
    /// From which level each priority is shed.
    pub shed_priority: PriorityShedding,
}

pub(crate) const DEFAULT_ERROR_RATE: [f64; 3] = [0.05, 0.15, 0.30];
pub(crate) const DEFAULT_CPU: [f64; 3] = [0.60, 0.75, 0.90];
pub(crate) const DEFAULT_MEMORY: [f64; 3] = [0.70, 0.80, 0.90];
const DEFAULT_LOAD: LoadConfig = LoadConfig {
    aggregate: Aggregate::Mean,
    share: 0.5,
    instance_timeout: Duration::from_secs(5),
    max_instances: 1000,
};

impl SystemConfig {
    /// The resources no system names, when the rules have no `global:`
    /// section: no automatic signal (the level moves only when an operator
    /// sets it), no dwell, no shedding by priority unless a rule asks.
    pub fn global() -> Self {
        SystemConfig {
            name: String::new(),
            resources: Vec::new(),
            error_rate: None,
            slow_call_rate: None,
            slow_call_duration: Duration::from_secs(1),
            latency: None,
            cpu: None,
            memory: None,
            queue_delay: None,
            load: DEFAULT_LOAD,
            hysteresis: 0.8,
            min_time_at_level: Duration::ZERO,
            minimum_calls: 20,
            window_seconds: 10,
            shed_priority: PriorityShedding::NONE,
        }
    }

    /// A named system with every default.
    pub fn named(name: &str) -> Self {
        SystemConfig {
            name: name.to_string(),
            error_rate: Some(DEFAULT_ERROR_RATE),
            cpu: Some(DEFAULT_CPU),
            memory: Some(DEFAULT_MEMORY),
            min_time_at_level: Duration::from_secs(5),
            shed_priority: PriorityShedding::DEFAULT,
            ..SystemConfig::global()
        }
    }

    pub fn is_global(&self) -> bool {
        self.name.is_empty()
    }
}

/// Which system each resource belongs to: an exact name wins, else the first
/// glob in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Membership {
    exact: HashMap<String, usize, ahash::RandomState>,
    globs: Vec<(Glob, usize)>,
}

impl Membership {
    pub fn new(systems: &[SystemConfig]) -> Self {
        let mut m = Membership::default();
        for (i, s) in systems.iter().enumerate() {
            for r in &s.resources {
                if Glob::is_glob(r) {
                    m.globs.push((Glob::new(r), i));
                } else {
                    m.exact.entry(r.clone()).or_insert(i);
                }
            }
        }
        m
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.globs.is_empty()
    }

    /// The index of `resource`'s system; `None` for the global scope.
    #[inline]
    pub fn system_of(&self, resource: &str) -> Option<usize> {
        if self.is_empty() {
            return None;
        }
        self.exact
            .get(resource)
            .copied()
            .or_else(|| self.globs.iter().find(|(g, _)| g.matches(resource)).map(|&(_, i)| i))
    }
}

// === parsing ===

/// The top-level `systems:` list.
pub(super) fn parse(out: &Collector, top: &Fields<'_>) -> Vec<SystemConfig> {
    let items = match top.get("systems") {
        None => return Vec::new(),
        Some(Value::Sequence(items)) => items,
        Some(other) => {
            top.error("systems", format!("must be a list of systems, got {}", kind(other)));
            return Vec::new();
        }
    };
    if items.len() > MAX_SYSTEMS {
        top.error("systems", format!("{} systems; the limit is {MAX_SYSTEMS}", items.len()));
        return Vec::new();
    }
    let mut systems: Vec<SystemConfig> = Vec::with_capacity(items.len());
    let mut listed: HashMap<&str, &str> = HashMap::new();
    let mut names = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let Some(f) = out.fields(item, None, &format!("systems[{i}]")) else { continue };
        if let Some(name) = item.get("name").and_then(Value::as_str)
            && !names.insert(name)
        {
            f.error("name", format!("system '{name}' is defined twice"));
            continue;
        }
        systems.extend(one(&f));
    }
    for s in &systems {
        for r in s.resources.iter().filter(|r| !Glob::is_glob(r)) {
            if let Some(other) = listed.insert(r, &s.name)
                && other != s.name
            {
                out.push(None, "systems", format!("resource '{r}' is listed by systems '{other}' and '{}'", s.name));
            }
        }
    }
    systems
}

/// The top-level `global:` section: the global scope's automatic level,
/// from the calls that breakers count on the resources no system lists. Its
/// error rate is 5%, 15% and 30% unless it says otherwise.
pub(super) fn parse_global(out: &Collector, top: &Fields<'_>) -> Option<SystemConfig> {
    // `global:` alone looks like "on" and would read as absent: say so.
    if top.is_null("global") {
        top.error("global", "has no value; write `global: {}` to turn on the defaults, or leave it out");
        return None;
    }
    let item = top.get("global")?;
    if !matches!(item, Value::Mapping(_)) {
        top.error(
            "global",
            format!("must be a mapping (for example {{ error_rate: [0.05, 0.15, 0.3] }}), got {}", kind(item)),
        );
        return None;
    }
    let f = out.fields(item, None, "global")?;
    f.deny_unknown(&[
        "error_rate",
        "slow_call_rate",
        "slow_call_duration",
        "latency",
        "hysteresis",
        "min_time_at_level",
        "minimum_calls",
        "window",
    ]);
    let before = f.errors();
    let mut s = SystemConfig { error_rate: Some(DEFAULT_ERROR_RATE), ..SystemConfig::global() };
    signals(&f, &mut s);
    (f.errors() == before).then_some(s)
}

fn one(f: &Fields<'_>) -> Option<SystemConfig> {
    f.deny_unknown(&[
        "name",
        "resources",
        "error_rate",
        "slow_call_rate",
        "slow_call_duration",
        "latency",
        "cpu",
        "memory",
        "queue_delay",
        "load",
        "hysteresis",
        "min_time_at_level",
        "minimum_calls",
        "window",
        "shed_priority",
    ]);
    let name = f.required("name", Fields::string)?;
    let before = f.errors();
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        f.error("name", format!("'{name}' must be 1 to 64 letters, digits, '.', '_' or '-'"));
    }
    if name == "global" {
        f.error("name", "'global' names the resources no system lists; pick another name");
    }
    let mut s = SystemConfig::named(&name);
    match f.required("resources", Fields::strings) {
        Some(list) if list.is_empty() => f.error("resources", "must name at least one resource or glob"),
        Some(list) if list.len() > MAX_SYSTEM_PATTERNS => {
            f.error("resources", format!("{} patterns; the limit is {MAX_SYSTEM_PATTERNS}", list.len()));
        }
        Some(list) => {
            for (i, r) in list.iter().enumerate() {
                if r.is_empty() || r.len() > super::MAX_NAME_BYTES || r.chars().any(char::is_control) {
                    f.error(&format!("resources[{i}]"), format!("'{}' is not a resource name", r.escape_debug()));
                }
            }
            s.resources = list;
        }
        None => {}
    }
    s.cpu = fractions(f, "cpu", s.cpu);
    s.memory = fractions(f, "memory", s.memory);
    s.queue_delay = durations(f, "queue_delay", f.get("queue_delay"));
    if let Some(load) = f.nested("load") {
        s.load = load_config(&load);
    }
    signals(f, &mut s);
    if f.has("shed_priority") {
        s.shed_priority = shed_priority(f)?;
    }
    (f.errors() == before).then_some(s)
}

/// The signals from reported calls, and how a level moves: what a system
/// and the `global:` section both say.
fn signals(f: &Fields<'_>, s: &mut SystemConfig) {
    s.error_rate = fractions(f, "error_rate", s.error_rate);
    s.slow_call_rate = fractions(f, "slow_call_rate", s.slow_call_rate);
    if let Some(d) = f.duration("slow_call_duration", Duration::from_millis(1)) {
        s.slow_call_duration = d;
    }
    s.latency = latency(f);
    if let Some(h) = f.f64("hysteresis") {
        if (0.1..=1.0).contains(&h) {
            s.hysteresis = h;
        } else {
            f.error(
                "hysteresis",
                format!("must be between 0.1 and 1 (a level is left below this share of its threshold), got {h}"),
            );
        }
    }
    if let Some(d) = f.duration("min_time_at_level", Duration::ZERO) {
        if d > Duration::from_secs(3600) {
            f.error("min_time_at_level", "must be at most 1h");
        }
        s.min_time_at_level = d;
    }
    if let Some(n) = f.u64_in("minimum_calls", 1, 1_000_000) {
        s.minimum_calls = n as u32;
    }
    if let Some(d) = f.duration("window", Duration::from_secs(1)) {
        if d > Duration::from_secs(300) || d.subsec_nanos() != 0 {
            f.error("window", "must be whole seconds, 1s to 5m");
        }
        s.window_seconds = d.as_secs().clamp(1, 300) as u32;
    }
}

/// `[0.6, 0.75, 0.9]`, `["60%", "75%", "90%"]` or `off`; increasing, in (0, 1].
fn fractions(f: &Fields<'_>, key: &str, default: Option<[f64; 3]>) -> Option<[f64; 3]> {
    let Some(v) = f.get(key) else { return default };
    if is_off(v) {
        return None;
    }
    let parsed = three(f, key, v, |item| {
        let n = match item {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => {
                s.trim().strip_suffix('%').and_then(|p| p.trim().parse::<f64>().ok()).map(|p| p / 100.0)
            }
            _ => None,
        };
        n.filter(|n| *n > 0.0 && *n <= 1.0)
            .ok_or_else(|| format!("{} is not a fraction above 0 and at most 1 (0.6 or \"60%\")", show(item)))
    })?;
    increasing(f, key, &parsed, |a, b| a < b).then_some(parsed)
}

/// `[200ms, 500ms, 1s]` or `off`; increasing.
fn durations(f: &Fields<'_>, key: &str, v: Option<&Value>) -> Option<[Duration; 3]> {
    let v = v?;
    if is_off(v) {
        return None;
    }
    let parsed = three(f, key, v, |item| {
        let text = match item {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => return Err(format!("{} is not a duration such as 250ms", show(other))),
        };
        super::duration::parse(&text)
            .map_err(|e| e.to_string())
            .and_then(|d| if d.is_zero() { Err(format!("{text} is not a threshold (must be above 0)")) } else { Ok(d) })
    })?;
    increasing(f, key, &parsed, |a, b| a < b).then_some(parsed)
}

/// `off`, or `false`: a setting turned off.
pub(super) fn is_off(v: &Value) -> bool {
    matches!(v, Value::String(s) if s == "off") || matches!(v, Value::Bool(false))
}

/// Exactly three thresholds, for levels 1, 2 and 3.
fn three<T: Copy + Default>(
    f: &Fields<'_>,
    key: &str,
    v: &Value,
    read: impl Fn(&Value) -> Result<T, String>,
) -> Option<[T; 3]> {
    let Value::Sequence(items) = v else {
        f.error(key, format!("must be a list of 3 thresholds (levels 1, 2, 3) or off, got {}", kind(v)));
        return None;
    };
    if items.len() != 3 {
        f.error(key, format!("must list 3 thresholds (levels 1, 2, 3), got {}", items.len()));
        return None;
    }
    let mut out = [T::default(); 3];
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match read(item) {
            Ok(t) => out[i] = t,
            Err(e) => {
                f.error(&format!("{key}[{i}]"), e);
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

fn increasing<T: std::fmt::Debug>(f: &Fields<'_>, key: &str, t: &[T; 3], lt: impl Fn(&T, &T) -> bool) -> bool {
    let ok = lt(&t[0], &t[1]) && lt(&t[1], &t[2]);
    if !ok {
        f.error(key, format!("thresholds must increase from level 1 to 3, got {t:?}"));
    }
    ok
}

/// `latency: { p90: [200ms, 500ms, 1s] }` (p50, p90, p95, p99 or p99.9).
fn latency(f: &Fields<'_>) -> Option<(Percentile, [Duration; 3])> {
    let v = f.get("latency")?;
    if is_off(v) {
        return None;
    }
    let l = f.nested("latency")?;
    let keys: Vec<&str> = ["p50", "p90", "p95", "p99", "p99.9"].into_iter().filter(|k| l.has(k)).collect();
    l.deny_unknown(&["p50", "p90", "p95", "p99", "p99.9"]);
    let [key] = keys.as_slice() else {
        l.error("", "must name one percentile: p50, p90, p95, p99 or p99.9, e.g. { p90: [200ms, 500ms, 1s] }");
        return None;
    };
    let q: f64 = key[1..].parse::<f64>().ok()? / 100.0;
    durations(&l, key, l.get(key)).map(|t| (Percentile(q), t))
}

fn load_config(l: &Fields<'_>) -> LoadConfig {
    l.deny_unknown(&["aggregate", "share", "instance_timeout", "max_instances"]);
    let mut c = DEFAULT_LOAD;
    if let Some(a) =
        l.choice("aggregate", &[("mean", Aggregate::Mean), ("max", Aggregate::Max), ("share", Aggregate::Share)])
    {
        c.aggregate = a;
    }
    if let Some(s) = l.f64("share") {
        if s > 0.0 && s <= 1.0 {
            c.share = s;
        } else {
            l.error("share", format!("must be a share of instances above 0 and at most 1, got {s}"));
        }
    }
    if l.has("share") && c.aggregate != Aggregate::Share {
        l.error("share", "applies only with aggregate: share");
    }
    if let Some(d) = l.duration("instance_timeout", Duration::from_millis(100)) {
        if d > Duration::from_secs(3600) {
            l.error("instance_timeout", "must be at most 1h");
        }
        c.instance_timeout = d;
    }
    if let Some(n) = l.u64_in("max_instances", 1, 10_000) {
        c.max_instances = n as usize;
    }
    c
}

/// `shed_priority: { sheddable: 1, sheddable_plus: 2, critical: 3, critical_plus: never }`
/// (keys not given keep the default) or `never` (nothing is shed by priority).
pub(super) fn shed_priority(f: &Fields<'_>) -> Option<PriorityShedding> {
    const KEY: &str = "shed_priority";
    let v = f.get(KEY)?;
    if matches!(v, Value::String(s) if s == "never") {
        return Some(PriorityShedding::NONE);
    }
    let m = f.nested(KEY)?;
    let keys: Vec<&str> = Priority::ALL.iter().map(|p| p.key()).collect();
    m.deny_unknown(&keys);
    let mut out = PriorityShedding::DEFAULT;
    let before = f.errors();
    for p in Priority::ALL {
        let Some(v) = m.get(p.key()) else { continue };
        match v {
            Value::String(s) if s == "never" => out.0[p as usize] = NEVER,
            Value::Number(n) if n.as_u64().is_some_and(|n| (1..=3).contains(&n)) => {
                out.0[p as usize] = n.as_u64().unwrap_or(3) as u8;
            }
            other => m.error(p.key(), format!("must be a level 1 to 3 or never, got {}", show(other))),
        }
    }
    // Less important first: SHEDDABLE never outlives SHEDDABLE_PLUS, and so on.
    if let Some(w) = out.0.windows(2).position(|w| w[0] < w[1]) {
        let (more, less) = (Priority::ALL[w], Priority::ALL[w + 1]);
        let show = |p: Priority| out.at(p).map_or("never".to_string(), |l| l.to_string());
        f.error(
            KEY,
            format!(
                "{} ({}) would be shed before {} ({}): a more important priority must be shed at the same level or later",
                more.key(),
                show(more),
                less.key(),
                show(less)
            ),
        );
    }
    (f.errors() == before).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RuleSet;

    fn systems(yaml: &str) -> Result<RuleSet, String> {
        RuleSet::from_yaml(yaml, "rules.yaml").map_err(|e| e.to_string())
    }

    #[test]
    fn a_system_takes_the_defaults_and_its_own_thresholds() {
        let rules = systems(
            "resources: [ { name: a } ]\nsystems:\n  - name: payments\n    resources: [\"payments.*\", a]\n    cpu: [\"50%\", 0.7, 0.8]\n    memory: off\n    latency: { p90: [100ms, 200ms, 1s] }\n    load: { aggregate: share, share: 0.34 }\n",
        )
        .unwrap();
        let s = &rules.systems()[0];
        assert_eq!(s.cpu, Some([0.5, 0.7, 0.8]));
        assert_eq!(s.memory, None);
        assert_eq!(s.error_rate, Some(DEFAULT_ERROR_RATE));
        assert_eq!(s.latency.map(|l| l.1[0]), Some(Duration::from_millis(100)));
        assert_eq!((s.load.aggregate, s.load.share), (Aggregate::Share, 0.34));
        assert_eq!(s.shed_priority, PriorityShedding::DEFAULT);
        assert_eq!(rules.membership().system_of("payments.charge"), Some(0));
        assert_eq!(rules.membership().system_of("a"), Some(0));
        assert_eq!(rules.membership().system_of("search"), None);
    }

    #[test]
    fn the_global_scope_moves_by_itself_only_with_a_global_section() {
        let none = systems("resources: []\n").unwrap().global_system();
        assert_eq!((none.error_rate, none.slow_call_rate, none.latency), (None, None, None));
        let on = systems("resources: []\nglobal: {}\n").unwrap().global_system();
        assert_eq!(on.error_rate, Some(DEFAULT_ERROR_RATE));
        assert!(on.is_global());
        let own = systems("resources: []\nglobal: { error_rate: [0.1, 0.2, 0.5], minimum_calls: 50, window: 30s }\n")
            .unwrap()
            .global_system();
        assert_eq!((own.error_rate, own.minimum_calls, own.window_seconds), (Some([0.1, 0.2, 0.5]), 50, 30));
        let e = systems("resources: []\nglobal: { cpu: [0.5, 0.6, 0.7], error_rate: [0.5, 0.2, 0.1] }\n").unwrap_err();
        assert!(e.contains("global.cpu: unknown field"), "{e}");
        assert!(e.contains("global.error_rate: thresholds must increase"), "{e}");
        let e = systems("resources: []\nglobal: on\n").unwrap_err();
        assert!(e.contains("global: must be a mapping"), "{e}");
        let e = systems("resources: []\nglobal:\n").unwrap_err();
        assert!(e.contains("global: has no value; write `global: {}`"), "{e}");
    }

    #[test]
    fn an_exact_name_wins_over_an_earlier_glob() {
        let rules = systems(
            "resources: []\nsystems:\n  - { name: all, resources: [\"*\"] }\n  - { name: refunds, resources: [payments.refund] }\n",
        )
        .unwrap();
        assert_eq!(rules.membership().system_of("payments.refund"), Some(1));
        assert_eq!(rules.membership().system_of("x"), Some(0));
    }

    #[test]
    fn bad_systems_are_refused_with_every_error_named() {
        let e = systems(
            "resources: []\nsystems:\n  - { name: p, resources: [a], cpu: [0.9, 0.8, 0.95], memory: [1.5, 2, 3], latency: { p90: [1s] } }\n  - { name: p, resources: [b] }\n  - { name: q, resources: [a], shed_priority: { sheddable: 4 } }\n  - { name: global, resources: [] }\n  - { name: r, resources: [z] }\n  - { name: t, resources: [y], shed_priority: { sheddable: 2, sheddable_plus: 1 } }\n  - { name: s, resources: [z] }\n",
        )
        .unwrap_err();
        for want in [
            "cpu: thresholds must increase",
            "memory[0]: 1.5 is not a fraction",
            "latency.p90: must list 3 thresholds",
            "system 'p' is defined twice",
            "shed_priority.sheddable: must be a level 1 to 3 or never, got 4",
            "shed_priority: sheddable_plus (1) would be shed before sheddable (2)",
            "'global' names the resources",
            "resources: must name at least one",
            "resource 'z' is listed by systems 'r' and 's'",
        ] {
            assert!(e.contains(want), "{want:?} missing from:\n{e}");
        }
    }

    #[test]
    fn priorities_are_shed_from_their_levels() {
        let d = PriorityShedding::DEFAULT;
        assert_eq!(d.sheds(Priority::Sheddable, 0), None);
        assert_eq!(d.sheds(Priority::Sheddable, 1), Some(1));
        assert_eq!(d.sheds(Priority::SheddablePlus, 1), None);
        assert_eq!(d.sheds(Priority::SheddablePlus, 2), Some(2));
        assert_eq!(d.sheds(Priority::Critical, 2), None);
        assert_eq!(d.sheds(Priority::Critical, 3), Some(3));
        assert_eq!(d.sheds(Priority::CriticalPlus, 3), None);
        assert_eq!(PriorityShedding::unpack(d.pack()), d);
        assert_eq!(Priority::parse("PRIORITY_SHEDDABLE_PLUS"), Some(Priority::SheddablePlus));
        assert_eq!(Priority::parse("critical_plus"), Some(Priority::CriticalPlus));
        assert_eq!(Priority::parse("urgent"), None);
    }

    #[test]
    fn a_rule_may_shed_by_priority_its_own_way() {
        let rules = systems(
            "resources:\n  - { name: a, shed_priority: { sheddable: 2 } }\n  - { name: b, shed_priority: never }\n",
        )
        .unwrap();
        let a = rules.find("a").unwrap().shed_priority.unwrap();
        assert_eq!(a.at(Priority::Sheddable), Some(2));
        assert_eq!(a.at(Priority::Critical), Some(3));
        assert_eq!(rules.find("b").unwrap().shed_priority, Some(PriorityShedding::NONE));
    }
}
