//! The rules in force: swapped atomically, read without a lock on the hot path.
//! Limit ids are kept across installs, so that a limit that keeps its rule,
//! name and algorithm keeps its buckets.
//!
//! Two sources live side by side: Floodgate's rules file (`rules`) and,
//! optionally, an envoyproxy/ratelimit configuration (`envoy`), each installed
//! on its own without touching the other.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::{ArcSwap, Guard};

use super::counters::RuleMetrics;
use super::envoy_sizes::EnvoySizes;
use crate::hitters::Hitters;
use crate::limiter::Algorithm;
use crate::overrides::Table;
use crate::rules::envoy::{self, EnvoyConfig, Unit};
use crate::rules::{Limit, LimitId, Rule, RuleSet};

/// The rules in force, with where they came from.
#[derive(Debug)]
pub struct Installed {
    /// The rules deciding: the file's, with the overrides set at run time
    /// merged in.
    pub rules: Arc<RuleSet>,
    /// The file's rules as read.
    pub file: Arc<RuleSet>,
    /// The overrides set at run time, and why those that do not apply do not.
    pub runtime: Arc<Table>,
    pub problems: Arc<BTreeMap<String, String>>,
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
    pub(super) envoy_sizes: Arc<EnvoySizes>,
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
    /// Limit ids. Also serialises installs.
    ids: Mutex<Ids>,
}

/// (rule, limit, algorithm): a limit's identity.
type Identity = (String, String, &'static str);

/// Limit ids by identity: the file's kept for the life of the process (a
/// limit that comes back gets its buckets back), run-time overrides' only
/// while they exist (they come and go by the thousand).
#[derive(Default)]
struct Ids {
    file: HashMap<Identity, LimitId>,
    /// By the override's id, then identity: kept while the id is in the
    /// table (an override waiting for its rule to come back keeps its buckets).
    runtime: HashMap<(String, Identity), LimitId>,
    /// The last id given.
    last: u32,
    /// Hottest keys by (rule, limit name): an override's limit shares its
    /// rule's limit's, and both outlive installs. Bounded by the names rules
    /// files have used.
    hitters: HashMap<(String, String), Arc<Hitters>>,
}

// === impl Installed ===

impl Installed {
    fn empty() -> Self {
        Installed {
            rules: Arc::default(),
            file: Arc::default(),
            runtime: Arc::default(),
            problems: Arc::default(),
            yaml: String::new(),
            version: 0,
            source: String::new(),
            loaded_at: SystemTime::now(),
            envoy: Arc::default(),
            by_id: HashMap::new(),
            metrics: Vec::new(),
            unmatched: RuleMetrics::unmatched(),
            envoy_sizes: Arc::new(EnvoySizes::new()),
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
            None => self.envoy_sizes.rule(id)?,
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
        RulesSlot { current: ArcSwap::from_pointee(Installed::empty()), ids: Mutex::new(Ids::default()) }
    }

    /// The rules in force; hold the guard only for the length of one decision.
    pub fn load(&self) -> Guard<Arc<Installed>> {
        self.current.load()
    }

    /// The rules in force, to hold across awaits.
    pub fn load_full(&self) -> Arc<Installed> {
        self.current.load_full()
    }

    /// Swaps in a new rule set (with the overrides set at run time), keeping
    /// the Envoy configuration in force; returns the version.
    pub fn install(&self, rules: RuleSet, yaml: String, source: String) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current.load_full();
        let parts = Parts { yaml, source, envoy: current.envoy.clone(), runtime: current.runtime.clone() };
        self.merge_and_swap(&mut ids, &current, Arc::new(rules), parts)
    }

    /// Swaps in other overrides set at run time, keeping the rules; returns
    /// the version.
    pub fn install_runtime(&self, runtime: Arc<Table>) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current.load_full();
        let parts =
            Parts { yaml: current.yaml.clone(), source: current.source.clone(), envoy: current.envoy.clone(), runtime };
        self.merge_and_swap(&mut ids, &current, current.file.clone(), parts)
    }

    /// Merges `file` with `parts.runtime`, gives every limit its id, swaps.
    fn merge_and_swap(&self, ids: &mut Ids, current: &Installed, file: Arc<RuleSet>, parts: Parts) -> u64 {
        let (mut rules, problems) = parts.runtime.merge(&file);
        ids.runtime.retain(|(id, _), _| parts.runtime.get(id).is_some());
        for rule in rules.rules_mut() {
            ids.assign("", rule);
            // An override's limits have buckets of their own, the same across
            // installs while it has the same tag.
            let name = rule.name.clone();
            // The rule's hottest keys by limit name, looked up once per name.
            let mut hitters: Vec<(String, Arc<Hitters>)> = Vec::new();
            for o in rule.overrides.list_mut() {
                let runtime = o.tag.strip_prefix('@').map(str::to_string);
                for limit in &mut o.limits {
                    let h = match hitters.iter().find(|(n, _)| *n == limit.name) {
                        Some((_, h)) => h.clone(),
                        None => {
                            let h = ids.hitters("", &name, &limit.name);
                            hitters.push((limit.name.clone(), h.clone()));
                            h
                        }
                    };
                    limit.hitters = Some(h);
                    let identity = (format!("\u{2}{name}{}", o.tag), limit.name.clone(), limit.algorithm.name());
                    limit.id = match &runtime {
                        None => ids.get(identity),
                        Some(id) => match ids.runtime.get(&(id.clone(), identity.clone())) {
                            Some(&known) => known,
                            None => {
                                let new = ids.next();
                                ids.runtime.insert((id.clone(), identity), new);
                                new
                            }
                        },
                    };
                }
            }
        }
        let metrics = rules.rules().iter().map(RuleMetrics::new).collect();
        // The file's rules get the ids too: a what-if or a later merge reads them.
        let file = match Arc::try_unwrap(file) {
            Ok(mut f) => {
                for rule in f.rules_mut() {
                    ids.assign("", rule);
                }
                Arc::new(f)
            }
            Err(shared) => shared,
        };
        self.swap(current, Arc::new(rules), file, Arc::new(problems), metrics, parts)
    }

    /// Swaps in an envoyproxy/ratelimit configuration (read from `source`),
    /// keeping our rules in force; returns the version.
    pub fn install_envoy(&self, mut config: EnvoyConfig, text: String, source: String) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        for rule in config.rules_mut() {
            ids.assign("\u{1}envoy:", rule);
        }
        let metrics = config.rules().iter().map(RuleMetrics::new).collect();
        let envoy = Arc::new(EnvoyInstalled { config, text, source, metrics });
        let current = self.current.load_full();
        let parts = Parts {
            yaml: current.yaml.clone(),
            source: current.source.clone(),
            envoy,
            runtime: current.runtime.clone(),
        };
        let metrics = current.rules.rules().iter().map(RuleMetrics::new).collect();
        self.swap(&current, current.rules.clone(), current.file.clone(), current.problems.clone(), metrics, parts)
    }

    /// Installs a new `Installed` built from its parts; the caller holds `ids`.
    fn swap(
        &self,
        current: &Installed,
        rules: Arc<RuleSet>,
        file: Arc<RuleSet>,
        problems: Arc<BTreeMap<String, String>>,
        metrics: Vec<RuleMetrics>,
        parts: Parts,
    ) -> u64 {
        let Parts { yaml, source, envoy, runtime } = parts;
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
            file,
            runtime,
            problems,
            yaml,
            version: current.version + 1,
            source,
            loaded_at: SystemTime::now(),
            envoy,
            by_id,
            metrics,
            unmatched: RuleMetrics::unmatched(),
            envoy_sizes: current.envoy_sizes.clone(),
        };
        let version = installed.version;
        self.current.store(Arc::new(installed));
        version
    }
}

/// What an install keeps or replaces besides the rules.
struct Parts {
    yaml: String,
    source: String,
    envoy: Arc<EnvoyInstalled>,
    runtime: Arc<Table>,
}

impl Ids {
    fn next(&mut self) -> LimitId {
        self.last += 1;
        LimitId(self.last)
    }

    /// The id of a limit of the file (or Envoy's): the one it had, else a new one.
    fn get(&mut self, identity: Identity) -> LimitId {
        if let Some(&id) = self.file.get(&identity) {
            return id;
        }
        let id = self.next();
        self.file.insert(identity, id);
        id
    }

    /// Gives every limit of `rule` its id, by (rule, limit, algorithm), and
    /// its hottest keys.
    fn assign(&mut self, prefix: &str, rule: &mut Rule) {
        for limit in &mut rule.limits {
            limit.id = self.get((format!("{prefix}{}", rule.name), limit.name.clone(), limit.algorithm.name()));
            limit.hitters = Some(self.hitters(prefix, &rule.name, &limit.name));
        }
    }

    fn hitters(&mut self, prefix: &str, rule: &str, limit: &str) -> Arc<Hitters> {
        self.hitters.entry((format!("{prefix}{rule}"), limit.to_string())).or_default().clone()
    }
}

impl Default for RulesSlot {
    fn default() -> Self {
        Self::new()
    }
}
