//! Floodgate's rules: what is configured for each resource, validated once at
//! the edge into types that cannot hold a bad value.
//!
//! Three dialects are read into the one rule model ([`RuleSet`]): Floodgate's
//! own rules file (YAML, [`RuleSet::from_yaml`]), an envoyproxy/ratelimit
//! configuration ([`envoy`]) and Sentinel's JSON rules ([`sentinel`]).
//! [`files`] is how every file is read: type checked and size bounded.
//!
//! Matching: an exact name wins; otherwise the first glob in file order;
//! otherwise the `"*"` default rule if there is one. A glob rule is a template:
//! each resource it matches gets buckets of its own.

use std::collections::HashMap;
use std::time::Duration;

use floodgate_core::{digest, limiter, time};

use crate::limiter::Algorithm;

pub mod bounds;
mod breaker;
mod concurrency;
pub mod cost;
pub mod duration;
pub mod envoy;
mod fields;
pub mod files;
mod glob;
pub mod overrides;
mod parse;
pub mod proposed;
pub mod sentinel;
pub mod systems;

pub use concurrency::{
    AdaptiveConfig, AimdConfig, AlgorithmConfig, Gradient2Config, Partitions, ProbeConfig, VegasConfig,
};
pub use cost::{CostError, Formula};
pub use fields::{RuleError, RuleErrors};
pub use floodgate_core::breaker::{Backoff, BreakerConfig, OFF as BREAKER_OFF, WindowKind};
use glob::Glob;
pub use systems::{Priority, PriorityShedding, SystemConfig};

/// The longest resource name, descriptor key or value accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 32;

/// The rules a server runs with when it is given none: a rules file built
/// into the binary.
pub const DEFAULT_RULES: &str = include_str!("default_rules.yaml");

/// A validated rules file, ready for matching.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuleSet {
    rules: Vec<Rule>,
    exact: HashMap<String, usize, ahash::RandomState>,
    globs: Vec<(Glob, usize)>,
    default: Option<usize>,
    /// The file's tiers, by name: overrides set at run time may pick them.
    tiers: HashMap<String, Vec<Limit>>,
    /// The systems the file names, in file order.
    systems: Vec<SystemConfig>,
    /// The file's `global:` section: automatic levels for the resources no
    /// system lists. Without it the global scope's level moves only when an
    /// operator sets it.
    global: Option<SystemConfig>,
    membership: systems::Membership,
}

/// Everything configured for one resource name or pattern.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// The name or pattern as written.
    pub name: String,
    pub pattern: Pattern,
    pub limits: Vec<Limit>,
    pub concurrency: Option<Concurrency>,
    pub breaker: Option<BreakerConfig>,
    /// Shed (verdict SHED) while the degradation level is at least this.
    pub shed_at_level: Option<u32>,
    /// From which level each priority is shed; `None` takes the system's.
    pub shed_priority: Option<PriorityShedding>,
    /// A template rule (glob or default) keeps at most this many breakers and
    /// concurrency counts, one per resource it matched; the least recently
    /// used go first.
    pub max_breakers: usize,
    /// Other limits (or a block) for some descriptor values.
    pub overrides: overrides::Overrides,
    /// Who may call at all, by a descriptor's value (Sentinel's authority
    /// rules): a caller refused is denied before any limit.
    pub origins: Option<Origins>,
    /// `usage: [input_tokens, output_tokens]`: the usage fields a call may
    /// report, which its limits' `cost` formulas read.
    pub usage: Vec<String>,
}

/// `origins: { key: origin, allow: [a, b] }` (or `deny:`): callers whose
/// descriptor `key` is (allow: is not) one of `values` are denied. A request
/// without the descriptor, or with it empty, passes, as in Sentinel.
#[derive(Clone, Debug, PartialEq)]
pub struct Origins {
    pub key: String,
    pub allow: bool,
    pub values: Vec<String>,
}

impl Origins {
    /// Whether a caller with this value of the descriptor may call.
    pub fn admits(&self, value: Option<&str>) -> bool {
        match value {
            None | Some("") => true,
            Some(v) => self.values.iter().any(|x| x == v) == self.allow,
        }
    }
}

/// A limit that applies to some requests only: `when: { origin: [a, b] }`
/// applies when the descriptor is one of the values; `unless:` when it is
/// absent or none of them. A limit's `when` and `unless` may name several
/// keys: each must hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    pub key: String,
    pub values: Vec<String>,
    /// `unless:` rather than `when:`.
    pub negate: bool,
}

impl Condition {
    /// Whether a request with this value of the descriptor is concerned.
    #[inline]
    pub fn holds(&self, value: Option<&str>) -> bool {
        match value {
            Some(v) => self.values.iter().any(|x| x == v) != self.negate,
            None => self.negate,
        }
    }
}

/// How many resources a template rule keeps breakers for, unless it says.
pub const DEFAULT_MAX_BREAKERS: usize = 1000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    Exact,
    Glob,
    /// The `"*"` rule, used when nothing else matches.
    Default,
}

/// One bucket definition: plain data. What the engine keeps for it while it
/// is in force (its id in the bucket store, its hottest keys) sits beside it,
/// in `engine::installed`.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub name: String,
    /// Descriptor names whose values select the bucket; empty for one global bucket.
    pub key: Vec<String>,
    pub algorithm: Algorithm,
    pub sync: SyncMode,
    pub on_redis_error: OnRedisError,
    /// Evaluated and counted, never enforced: a denial by this limit leaves
    /// the verdict alone (the answer says it would have denied).
    pub shadow: bool,
    /// `fixed: true`: its numbers are chosen by people, and tools that
    /// propose limits from traffic (`floodgate recommend`) leave it alone.
    /// The server enforces it like any other limit.
    pub fixed: bool,
    /// `history: true`: the server records each key's busiest minute of
    /// each day, from which `floodgate recommend --server` proposes limits.
    pub history: bool,
    /// Clients may lease a share of it (`lease: 2s`).
    pub lease: Option<Lease>,
    /// It applies only to requests every one of these holds for.
    pub when: Vec<Condition>,
    /// A share of the calls this limit denies is admitted anyway
    /// (`over_limit: { admit: 10% }`), so that a caller a little over its
    /// limit feels pressure rather than a wall.
    pub over_limit: Option<OverLimit>,
    /// `cost: input_tokens + output_tokens * 4`: the limit takes its cost
    /// from the usage a call reports, not from the request's `cost`.
    pub cost: Option<Formula>,
    /// Which source of its rule's waterfall the limit belongs to: 0 for the
    /// rule's own `limits`, n for the n-th item of its `waterfall`, which
    /// pays for a call only when every source before it had no room.
    pub source: u8,
}

/// `over_limit: { admit: 10% }`: of the calls a limit denies, this share is
/// admitted anyway, each call drawn at random (every call over the limit has
/// the same chance, the first ones no more than the later ones). What an
/// admitted call costs is taken beyond the limit, as a `Charge` is, so that
/// it counts everywhere the limit's usage counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimit {
    /// The share admitted, in parts per million (1 to 999,999).
    pub admit_ppm: u32,
    /// `ramp: true`: the share falls with how far the caller is over, from
    /// `admit` just over the limit to none a whole window in debt (bucket
    /// algorithms only, whose debt says how far over a caller is).
    pub ramp: bool,
}

/// `lease: 2s` (and `lease_share:`, `lease_start:`): how clients may lease a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The longest a lease lasts.
    pub ttl: Duration,
    pub share: LeaseShare,
    /// On a window longer than the lease: whether a holder may take all it
    /// finds at once (`lease_start: all`, the default), or starts from the
    /// window's pace and doubles with use (`lease_start: paced`).
    pub paced: bool,
}

/// How a leased limit's capacity is divided among the holders that want more
/// than it holds (see `engine::lease`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseShare {
    /// Max-min fair: every holder gets what it wants up to an equal share;
    /// what the smaller ones leave goes to the larger.
    #[default]
    Fair,
    /// In proportion to what each wants.
    Proportional,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Concurrency {
    /// The limit on calls in flight; for an adaptive limit, its ceiling
    /// (`adaptive.max`): what it is now is the resource's (`Guarded::limit`).
    pub max_in_flight: u32,
    /// Recomputed from the latencies the callers report.
    pub adaptive: Option<AdaptiveConfig>,
    /// Guaranteed shares of the limit by priority (empty: none).
    pub partitions: Partitions,
    pub permit_ttl: Duration,
    /// With Redis: `strict` one in-flight set for the fleet, `replicated`
    /// slots leased to replicas, `local` per replica.
    pub sync: SyncMode,
    /// A `strict` or `replicated` concurrency limit while Redis cannot answer.
    pub on_redis_error: OnRedisError,
}

impl Concurrency {
    /// The limit before any window closed: an adaptive limit's `initial`,
    /// else `max_in_flight`.
    pub fn initial_limit(&self) -> u32 {
        self.adaptive.map_or(self.max_in_flight, |a| a.initial)
    }
}

/// How a limit uses Redis, when the server has one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncMode {
    /// Decide from memory, push consumption and pull merged state every interval.
    #[default]
    Replicated,
    /// One atomic Redis script per decision.
    Strict,
    /// Never touch Redis.
    Local,
}

// === impl SyncMode ===

// Each question about a mode is one exhaustive match, so that a mode added
// to the enum fails to compile until every question has its answer.
impl SyncMode {
    /// Decided from memory, shared with the fleet every sync interval.
    pub fn is_replicated(self) -> bool {
        match self {
            SyncMode::Replicated => true,
            SyncMode::Strict | SyncMode::Local => false,
        }
    }

    /// Decided by one atomic script in the shared store.
    pub fn is_strict(self) -> bool {
        match self {
            SyncMode::Strict => true,
            SyncMode::Replicated | SyncMode::Local => false,
        }
    }

    /// Shared with the other replicas at all (replicated or strict).
    pub fn is_shared(self) -> bool {
        match self {
            SyncMode::Replicated | SyncMode::Strict => true,
            SyncMode::Local => false,
        }
    }
}

/// What a `strict` limit does while Redis is unreachable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnRedisError {
    /// Decide locally with the limit divided among live replicas.
    #[default]
    Local,
    Allow,
    Deny,
}

// === impl RuleSet ===

impl RuleSet {
    /// Parses and validates a rules file; `file` names it in every error.
    pub fn from_yaml(text: &str, file: &str) -> Result<RuleSet, RuleErrors> {
        parse::rule_set(text, file)
    }

    fn new(rules: Vec<Rule>, tiers: HashMap<String, Vec<Limit>>, systems: Vec<SystemConfig>) -> RuleSet {
        let membership = systems::Membership::new(&systems);
        let mut set = RuleSet { rules, tiers, systems, membership, ..RuleSet::default() };
        for (i, rule) in set.rules.iter().enumerate() {
            match rule.pattern {
                Pattern::Exact => {
                    set.exact.insert(rule.name.clone(), i);
                }
                Pattern::Glob => set.globs.push((Glob::new(&rule.name), i)),
                Pattern::Default => set.default = Some(i),
            }
        }
        set
    }

    /// Rules (and systems) built elsewhere than in a rules file.
    pub fn from_rules(rules: Vec<Rule>, systems: Vec<SystemConfig>) -> RuleSet {
        RuleSet::new(rules, HashMap::new(), systems)
    }

    /// These rules with another source's (Sentinel's) after them: a resource
    /// these name exactly keeps its rule here, the other's default rule
    /// counts only when these have none, its system only when these have
    /// none of that name. Returns the other's rules left out.
    pub fn with_extra(&self, extra: &[Rule], system: Option<&SystemConfig>) -> (RuleSet, Vec<String>) {
        if extra.is_empty() && system.is_none() {
            return (self.clone(), Vec::new());
        }
        let mut rules = self.rules.clone();
        let mut left_out = Vec::new();
        for r in extra {
            let taken = match r.pattern {
                Pattern::Default => self.default.is_some(),
                _ => self.exact.contains_key(&r.name),
            };
            if taken {
                left_out.push(r.name.clone());
            } else {
                rules.push(self.beneath(r));
            }
        }
        let mut systems = self.systems.clone();
        if let Some(s) = system {
            match systems.iter().any(|x| x.name == s.name) {
                true => left_out.push(format!("system '{}'", s.name)),
                false => systems.push(s.clone()),
            }
        }
        let mut set = RuleSet::new(rules, self.tiers.clone(), systems);
        set.global = self.global.clone();
        (set, left_out)
    }

    /// An extra exact rule as it is merged: a glob or the default of these
    /// rules that would have matched its resource still applies under it (its
    /// limits, and its breaker, concurrency, shedding and overrides where the
    /// extra rule has none), so that an extra rule that only restricts (an
    /// origin list, a per-value limit) takes nothing away.
    fn beneath(&self, extra: &Rule) -> Rule {
        let mut r = extra.clone();
        let Some(under) = (extra.pattern == Pattern::Exact).then(|| self.find(&extra.name)).flatten() else {
            return r;
        };
        for l in &under.limits {
            let mut l = l.clone();
            if r.limits.iter().any(|m| m.name == l.name) {
                l.name = format!("{}({})", l.name, under.name);
            }
            r.limits.push(l);
        }
        r.breaker = r.breaker.or_else(|| under.breaker.clone());
        r.concurrency = r.concurrency.or(under.concurrency);
        r.shed_at_level = r.shed_at_level.or(under.shed_at_level);
        r.shed_priority = r.shed_priority.or(under.shed_priority);
        if r.overrides.is_empty() {
            r.overrides = under.overrides.clone();
        }
        r
    }

    /// The rule for `resource`: exact name, else first glob, else the default.
    pub fn find(&self, resource: &str) -> Option<&Rule> {
        self.position(resource).map(|i| &self.rules[i])
    }

    /// The index in [`RuleSet::rules`] of the rule for `resource`.
    pub fn position(&self, resource: &str) -> Option<usize> {
        self.exact
            .get(resource)
            .copied()
            .or_else(|| self.globs.iter().find(|(g, _)| g.matches(resource)).map(|&(_, i)| i))
            .or(self.default)
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Every pattern of resources the server may answer other than "allowed,
    /// no limits": the rules' names in file order, then the systems'
    /// resources (a system sheds resources no rule names). A client may
    /// answer a resource none of them matches without asking.
    pub fn patterns(&self) -> Vec<String> {
        let mut out: Vec<String> = self.rules.iter().map(|r| r.name.clone()).collect();
        for s in &self.systems {
            for r in &s.resources {
                if !out.contains(r) {
                    out.push(r.clone());
                }
            }
        }
        out
    }

    /// The systems the file names, in file order.
    pub fn systems(&self) -> &[SystemConfig] {
        &self.systems
    }

    /// How the global scope (the resources no system lists) sets its level:
    /// the file's `global:` section, else no automatic signal at all.
    pub fn global_system(&self) -> SystemConfig {
        self.global.clone().unwrap_or_else(SystemConfig::global)
    }

    /// These rules with the file's `global:` section.
    pub(crate) fn with_global(mut self, global: Option<SystemConfig>) -> RuleSet {
        self.global = global;
        self
    }

    /// Which system each resource belongs to.
    pub fn membership(&self) -> &systems::Membership {
        &self.membership
    }

    /// The tiers the file defines, by name.
    pub fn tiers(&self) -> &HashMap<String, Vec<Limit>> {
        &self.tiers
    }

    /// Replaces the overrides of the rule named `name` (as written); false
    /// when there is none. Limits must still get their ids, at install.
    /// An override without a tag is tagged by its position (`#j`).
    pub fn set_overrides(&mut self, name: &str, mut list: Vec<overrides::Override>) -> bool {
        let Some(rule) = self.rules.iter_mut().find(|r| r.name == name) else { return false };
        for (j, o) in list.iter_mut().enumerate() {
            if o.tag.is_empty() {
                o.tag = format!("#{j}");
            }
        }
        rule.overrides = overrides::Overrides::new(&rule.limits, list);
        true
    }
}

// === impl Rule ===

impl Rule {
    /// How many sources of its waterfall come after the rule's own limits
    /// (0: the rule has no waterfall).
    pub fn waterfall_len(&self) -> u8 {
        self.limits.iter().map(|l| l.source).max().unwrap_or(0)
    }

    /// The name of the waterfall's source `n` (1 or more); `None` for the
    /// rule's own limits (0).
    pub fn source_name(&self, n: u8) -> Option<&String> {
        if n == 0 {
            return None;
        }
        self.limits.iter().find(|l| l.source == n).map(|l| &l.name)
    }

    /// Whether buckets are shared by every resource this rule matches (exact
    /// rules match one) or kept per resource (globs and the default).
    pub fn per_resource(&self) -> bool {
        self.pattern != Pattern::Exact
    }
}

#[cfg(test)]
mod tests;
