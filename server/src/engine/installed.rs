//! The rules in force: swapped atomically, read without a lock on the hot path.
//! Limit ids are kept across installs, so that a limit that keeps its rule,
//! name and algorithm keeps its buckets.
//!
//! Two sources live side by side: Floodgate's rules file (`rules`) and,
//! optionally, an envoyproxy/ratelimit configuration (`envoy`), each installed
//! on its own without touching the other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::{ArcSwap, Guard};

use super::counters::RuleMetrics;
use super::overrides::Overrides;
use crate::limiter::Algorithm;
use crate::rules::envoy::{self, EnvoyConfig, Unit};
use crate::rules::{Limit, LimitId, Rule, RuleSet};

/// The rules in force, with where they came from.
#[derive(Debug)]
pub struct Installed {
    pub rules: Arc<RuleSet>,
    /// The text they were read from.
    pub yaml: String,
    /// Increases with every install.
    pub version: u64,
    /// A file path, "embedded", "admin" or "redis".
    pub source: String,
    pub loaded_at: SystemTime,
    /// The envoyproxy/ratelimit configuration (empty when none is loaded).
    pub envoy: Arc<EnvoyInstalled>,
    /// Every limit by id.
    by_id: HashMap<LimitId, Place>,
    /// Decision counters, one per rule, and for requests no rule matched.
    pub(super) metrics: Vec<RuleMetrics>,
    pub(super) unmatched: RuleMetrics,
    /// Limits Envoy sends with a descriptor (`limit` overrides); kept for
    /// the life of the process.
    pub(super) overrides: Arc<Overrides>,
    /// Every limit of `rules` in Envoy's terms (requests per unit), by rule.
    per_unit: Vec<Vec<(u32, Unit)>>,
}

/// An envoyproxy/ratelimit configuration in force.
#[derive(Debug, Default)]
pub struct EnvoyInstalled {
    pub config: EnvoyConfig,
    /// The files' text, for `GetRules`.
    pub text: String,
    /// The directory it was read from; empty when none is loaded.
    pub source: String,
    /// One set of counters per limit, as `config.rules()` orders them.
    pub(super) metrics: Vec<RuleMetrics>,
}

/// Where a limit lives: one of our rules, or the Envoy configuration.
#[derive(Clone, Copy, Debug)]
enum Place {
    Rule(usize, usize),
    /// A limit of an override of a rule: (rule, override, limit).
    Override(usize, usize, usize),
    Envoy(usize),
}

/// Where the rules in force live.
pub struct RulesSlot {
    current: ArcSwap<Installed>,
    /// Limit ids by (rule, limit, algorithm). Also serialises installs.
    ids: Mutex<HashMap<(String, String, &'static str), LimitId>>,
}

// === impl Installed ===

impl Installed {
    fn empty() -> Self {
        Installed {
            rules: Arc::default(),
            yaml: String::new(),
            version: 0,
            source: String::new(),
            loaded_at: SystemTime::now(),
            envoy: Arc::default(),
            by_id: HashMap::new(),
            metrics: Vec::new(),
            unmatched: RuleMetrics::unmatched(),
            overrides: Arc::new(Overrides::new()),
            per_unit: Vec::new(),
        }
    }

    /// The algorithm of a limit still in force.
    pub fn algorithm(&self, id: LimitId) -> Option<&Algorithm> {
        self.limit(id).map(|(_, l)| &l.algorithm)
    }

    /// A limit still in force, with its rule.
    pub fn limit(&self, id: LimitId) -> Option<(&Rule, &Limit)> {
        let rule = match self.by_id.get(&id) {
            Some(&Place::Rule(r, l)) => return Some((&self.rules.rules()[r], &self.rules.rules()[r].limits[l])),
            Some(&Place::Override(r, o, l)) => {
                let rule = &self.rules.rules()[r];
                return Some((rule, &rule.overrides.list()[o].limits[l]));
            }
            Some(&Place::Envoy(r)) => &self.envoy.config.rules()[r],
            None => self.overrides.rule(id)?,
        };
        Some((rule, &rule.limits[0]))
    }

    /// A limit of ours in Envoy's terms: rule `rule`, limit `limit`.
    pub fn per_unit(&self, rule: usize, limit: usize) -> (u32, Unit) {
        self.per_unit[rule][limit]
    }

    /// The counters of the `i`th rule of the Envoy configuration.
    pub(super) fn envoy_metrics(&self, i: usize) -> &RuleMetrics {
        &self.envoy.metrics[i]
    }

    /// The rule patterns, in file order.
    pub fn resource_names(&self) -> Vec<String> {
        self.rules.rules().iter().map(|r| r.name.clone()).collect()
    }
}

// === impl RulesSlot ===

impl RulesSlot {
    pub fn new() -> Self {
        RulesSlot { current: ArcSwap::from_pointee(Installed::empty()), ids: Mutex::new(HashMap::new()) }
    }

    /// The rules in force; hold the guard only for the length of one decision.
    pub fn load(&self) -> Guard<Arc<Installed>> {
        self.current.load()
    }

    /// The rules in force, to hold across awaits.
    pub fn load_full(&self) -> Arc<Installed> {
        self.current.load_full()
    }

    /// Swaps in a new rule set, keeping the Envoy configuration in force;
    /// returns the version.
    pub fn install(&self, mut rules: RuleSet, yaml: String, source: String) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        for rule in rules.rules_mut() {
            assign(&mut ids, "", rule);
            // An override's limits have buckets of their own, the same across
            // reloads for the same override position.
            let name = rule.name.clone();
            for (j, o) in rule.overrides.list_mut().iter_mut().enumerate() {
                for limit in &mut o.limits {
                    let next = LimitId(ids.len() as u32 + 1);
                    let identity = (format!("\u{2}{name}#{j}"), limit.name.clone(), limit.algorithm.name());
                    limit.id = *ids.entry(identity).or_insert(next);
                }
            }
        }
        let current = self.current.load_full();
        let metrics = rules.rules().iter().map(RuleMetrics::new).collect();
        self.swap(&current, Arc::new(rules), metrics, yaml, source, current.envoy.clone())
    }

    /// Swaps in an envoyproxy/ratelimit configuration (read from `source`),
    /// keeping our rules in force; returns the version.
    pub fn install_envoy(&self, mut config: EnvoyConfig, text: String, source: String) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        for rule in config.rules_mut() {
            assign(&mut ids, "\u{1}envoy:", rule);
        }
        let metrics = config.rules().iter().map(RuleMetrics::new).collect();
        let envoy = Arc::new(EnvoyInstalled { config, text, source, metrics });
        let current = self.current.load_full();
        let (yaml, rules_source) = (current.yaml.clone(), current.source.clone());
        let metrics = current.rules.rules().iter().map(RuleMetrics::new).collect();
        self.swap(&current, current.rules.clone(), metrics, yaml, rules_source, envoy)
    }

    /// Installs a new `Installed` built from its parts; the caller holds `ids`.
    fn swap(
        &self,
        current: &Installed,
        rules: Arc<RuleSet>,
        metrics: Vec<RuleMetrics>,
        yaml: String,
        source: String,
        envoy: Arc<EnvoyInstalled>,
    ) -> u64 {
        let mut by_id = HashMap::new();
        for (r, rule) in rules.rules().iter().enumerate() {
            for (l, limit) in rule.limits.iter().enumerate() {
                by_id.insert(limit.id, Place::Rule(r, l));
            }
            for (o, over) in rule.overrides.list().iter().enumerate() {
                for (l, limit) in over.limits.iter().enumerate() {
                    by_id.insert(limit.id, Place::Override(r, o, l));
                }
            }
        }
        for (r, rule) in envoy.config.rules().iter().enumerate() {
            by_id.insert(rule.limits[0].id, Place::Envoy(r));
        }
        let per_unit = rules.rules().iter().map(|r| r.limits.iter().map(envoy::per_unit).collect()).collect();
        let installed = Installed {
            per_unit,
            rules,
            yaml,
            version: current.version + 1,
            source,
            loaded_at: SystemTime::now(),
            envoy,
            by_id,
            metrics,
            unmatched: RuleMetrics::unmatched(),
            overrides: current.overrides.clone(),
        };
        let version = installed.version;
        self.current.store(Arc::new(installed));
        version
    }
}

/// Gives every limit of `rule` its id: the one it had, by (rule, limit,
/// algorithm), else a new one.
fn assign(ids: &mut HashMap<(String, String, &'static str), LimitId>, prefix: &str, rule: &mut Rule) {
    for limit in &mut rule.limits {
        let next = LimitId(ids.len() as u32 + 1);
        let identity = (format!("{prefix}{}", rule.name), limit.name.clone(), limit.algorithm.name());
        limit.id = *ids.entry(identity).or_insert(next);
    }
}

impl Default for RulesSlot {
    fn default() -> Self {
        Self::new()
    }
}
