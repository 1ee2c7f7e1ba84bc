//! The rules in force: swapped atomically, read without a lock on the hot path.
//!
//! The rules are plain data ([`crate::rules`]); what the engine keeps for
//! them while they are in force sits beside them, in [`Handles`]: each
//! limit's id in the bucket store (kept across installs, so that a limit that
//! keeps its rule, name and algorithm keeps its buckets), its hottest keys,
//! and each rule's decision counters.
//!
//! Two sources live side by side: Floodgate's rules file (`rules`) and,
//! optionally, an envoyproxy/ratelimit configuration (`envoy`), each installed
//! on its own without touching the other.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::{ArcSwap, Guard};

use super::counters::{RuleMetrics, Tally};
use super::envoy_sizes::EnvoySizes;
pub use super::handles::RuleHandles;
use crate::degradation::{Scope, Systems};
use crate::hitters::Hitters;
use crate::limiter::Algorithm;
use crate::metrics::upstream::{LimitStats, Registry};
use crate::overrides::Table;
use crate::recommend::traffic::Traffic;
use crate::rules::envoy::{self, EnvoyConfig, Unit};
use crate::rules::sentinel::SentinelRules;
use crate::rules::{Limit, Pattern, Rule, RuleSet};
use crate::store::LimitId;

/// The rules in force, with where they came from, and what the engine keeps
/// beside them.
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
    /// Sentinel's rules (empty when none are loaded), merged into `rules`.
    pub sentinel: Arc<SentinelInstalled>,
    /// The degradation scopes: the global one and the rules' systems.
    pub systems: Arc<Systems>,
    pub(super) handles: Handles,
}

/// An envoyproxy/ratelimit configuration in force.
#[derive(Debug)]
pub struct EnvoyInstalled {
    pub config: EnvoyConfig,
    /// The files' text, for `GetRules`.
    pub text: String,
    /// The directory or xDS control plane it came from; empty when none is loaded.
    pub source: String,
    /// The control plane's version of it (empty for a directory).
    pub version: String,
    pub loaded_at: SystemTime,
}

/// Sentinel's rules in force (`--sentinel-rules`).
#[derive(Debug)]
pub struct SentinelInstalled {
    pub rules: SentinelRules,
    /// The files' text, for `GetRules`.
    pub text: String,
    /// The directory they came from; empty when none is loaded.
    pub source: String,
    pub loaded_at: SystemTime,
}

impl Default for SentinelInstalled {
    fn default() -> Self {
        SentinelInstalled {
            rules: SentinelRules::default(),
            text: String::new(),
            source: String::new(),
            loaded_at: SystemTime::UNIX_EPOCH,
        }
    }
}

impl SentinelInstalled {
    /// Sentinel's resources the rules file names too: the file's rule decides them.
    pub fn left_out(&self, file: &RuleSet) -> Vec<String> {
        file.with_extra(&self.rules.rules, self.rules.system.as_ref()).1
    }
}

/// What the engine keeps beside the rules in force.
#[derive(Debug)]
pub(super) struct Handles {
    /// One per rule of [`Installed::rules`], in order.
    rules: Arc<Vec<RuleHandles>>,
    /// One per rule of the Envoy configuration, in order.
    envoy: Arc<Vec<RuleHandles>>,
    /// Where a decision no rule matched is counted.
    pub(super) unmatched: RuleMetrics,
    /// Every limit by id.
    by_id: HashMap<LimitId, Place>,
    /// Limits Envoy sends with a descriptor (`limit` overrides); kept for
    /// the life of the process.
    pub(super) envoy_sizes: Arc<EnvoySizes>,
    /// Every limit of `rules` in Envoy's terms (requests per unit), by rule.
    per_unit: Vec<Vec<(u32, Unit)>>,
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
pub(crate) struct RulesSlot {
    current: ArcSwap<Installed>,
    /// Limit ids. Also serialises installs.
    ids: Mutex<Ids>,
    /// The series of upstream's per-descriptor stats.
    upstream: Arc<Registry>,
    /// The rules files in force before the one in force now, newest last,
    /// so that a change can be reverted.
    earlier: Mutex<std::collections::VecDeque<Earlier>>,
}

/// How many earlier rules files are kept. Each is at most the 1 MiB an
/// upload may be, so the history costs at most this many MiB.
pub const EARLIER_KEPT: usize = 10;

/// A rules file that was in force before.
#[derive(Clone, Debug)]
pub struct Earlier {
    /// The last version it was in force as.
    pub version: u64,
    pub yaml: String,
    pub source: String,
    /// When that version was installed.
    pub loaded_at: SystemTime,
    /// When it stopped being in force.
    pub replaced_at: SystemTime,
    /// Its first [`EARLIER_NAMES`] rule patterns, in file order, and how
    /// many it has.
    pub resources: Vec<String>,
    pub resource_count: usize,
}

/// Patterns listed for an earlier rules file: enough to recognise it, few
/// enough that ten files of thousands of rules keep `GetRules` small.
pub const EARLIER_NAMES: usize = 20;

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
    /// Recorded traffic by (rule, limit name and key names), for the limits
    /// in force with `history`, each bounded by its keys.
    traffic: HashMap<(String, String), Arc<Traffic>>,
}

impl Default for EnvoyInstalled {
    fn default() -> Self {
        EnvoyInstalled {
            config: EnvoyConfig::default(),
            text: String::new(),
            source: String::new(),
            version: String::new(),
            loaded_at: SystemTime::UNIX_EPOCH,
        }
    }
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
            sentinel: Arc::default(),
            systems: Arc::default(),
            handles: Handles {
                rules: Arc::default(),
                envoy: Arc::default(),
                unmatched: RuleMetrics::unmatched(),
                by_id: HashMap::new(),
                envoy_sizes: Arc::new(EnvoySizes::new()),
                per_unit: Vec::new(),
            },
        }
    }

    /// The rule for `resource` (see [`RuleSet::position`]) with its handles.
    pub fn find(&self, resource: &str) -> Option<(&Rule, &RuleHandles)> {
        self.rules.position(resource).map(|i| self.rule_at(i))
    }

    /// The degradation scope of `resource`: its system's, else the global one.
    #[inline]
    pub(crate) fn scope_of(&self, resource: &str) -> &Arc<Scope> {
        self.systems.scope(self.rules.membership().system_of(resource))
    }

    /// The `i`th rule of [`Installed::rules`] with its handles.
    pub(crate) fn rule_at(&self, i: usize) -> (&Rule, &RuleHandles) {
        (&self.rules.rules()[i], &self.handles.rules[i])
    }

    /// Every traffic record of the limits in force (`history: true`).
    pub fn records(&self) -> Vec<Arc<Traffic>> {
        self.handles.rules.iter().flat_map(|h| h.traffic.iter().flatten().cloned()).collect()
    }

    /// The `i`th rule of the Envoy configuration with its handles.
    pub fn envoy_rule(&self, i: usize) -> (&Rule, &RuleHandles) {
        (&self.envoy.config.rules()[i], &self.handles.envoy[i])
    }

    /// The algorithm of a limit still in force.
    pub fn algorithm(&self, id: LimitId) -> Option<&Algorithm> {
        self.limit(id).map(|(_, l)| &l.algorithm)
    }

    /// A limit still in force, with its rule.
    pub fn limit(&self, id: LimitId) -> Option<(&Rule, &Limit)> {
        let rule = match self.handles.by_id.get(&id) {
            Some(&Place::Rule(r, l)) => return Some((&self.rules.rules()[r], &self.rules.rules()[r].limits[l])),
            Some(&Place::Override(r, o, l)) => {
                let rule = &self.rules.rules()[r];
                return Some((rule, &rule.overrides.list()[o].limits[l]));
            }
            Some(&Place::Envoy(r)) => &self.envoy.config.rules()[r],
            None => self.handles.envoy_sizes.rule(id)?,
        };
        Some((rule, &rule.limits[0]))
    }

    /// A limit of ours in Envoy's terms: rule `rule`, limit `limit`.
    pub fn per_unit(&self, rule: usize, limit: usize) -> (u32, Unit) {
        self.handles.per_unit[rule][limit]
    }

    /// Every decision tally with the `resource` its decisions are counted
    /// under: the rules', the Envoy configuration's (`_envoy`, one per
    /// limit) and the unmatched decisions' (`_unmatched`).
    pub fn tallies(&self, mut each: impl FnMut(&str, &Arc<Tally>)) {
        for (rule, handles) in self.rules.rules().iter().zip(self.handles.rules.iter()) {
            each(&rule.name, &handles.metrics.tally);
        }
        for handles in self.handles.envoy.iter() {
            each(crate::metrics::ENVOY, &handles.metrics.tally);
        }
        each(crate::metrics::UNMATCHED, &self.handles.unmatched.tally);
    }

    /// The rule patterns, in file order.
    pub fn resource_names(&self) -> Vec<String> {
        self.rules.rules().iter().map(|r| r.name.clone()).collect()
    }
}

// === impl RulesSlot ===

impl RulesSlot {
    pub fn new() -> Self {
        RulesSlot {
            current: ArcSwap::from_pointee(Installed::empty()),
            ids: Mutex::new(Ids::default()),
            upstream: Arc::new(Registry::new(crate::metrics::upstream::MAX_SERIES)),
            earlier: Mutex::default(),
        }
    }

    /// The rules files in force before the one in force now, newest first.
    pub fn earlier(&self) -> Vec<Earlier> {
        self.earlier.lock().unwrap_or_else(|e| e.into_inner()).iter().rev().cloned().collect()
    }

    /// The series of upstream's per-descriptor stats.
    pub fn upstream(&self) -> &Arc<Registry> {
        &self.upstream
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
        // Version 0 is the empty set the server starts with: nothing to
        // keep; nor is the same file installed again.
        if current.version > 0 && current.yaml != yaml {
            let mut earlier = self.earlier.lock().unwrap_or_else(|e| e.into_inner());
            if earlier.len() == EARLIER_KEPT {
                earlier.pop_front();
            }
            earlier.push_back(Earlier {
                version: current.version,
                yaml: current.yaml.clone(),
                source: current.source.clone(),
                loaded_at: current.loaded_at,
                replaced_at: SystemTime::now(),
                resources: current.file.rules().iter().take(EARLIER_NAMES).map(|r| r.name.clone()).collect(),
                resource_count: current.file.rules().len(),
            });
        }
        let parts = Parts {
            yaml,
            source,
            envoy: current.envoy.clone(),
            sentinel: current.sentinel.clone(),
            runtime: current.runtime.clone(),
            systems: current.systems.clone(),
        };
        self.merge_and_swap(&mut ids, &current, Arc::new(rules), parts)
    }

    /// Swaps in other overrides set at run time, keeping the rules; returns
    /// the version.
    pub(crate) fn install_runtime(&self, runtime: Arc<Table>) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current.load_full();
        let parts = Parts {
            yaml: current.yaml.clone(),
            source: current.source.clone(),
            envoy: current.envoy.clone(),
            sentinel: current.sentinel.clone(),
            runtime,
            systems: current.systems.clone(),
        };
        self.merge_and_swap(&mut ids, &current, current.file.clone(), parts)
    }

    /// Merges `file` with `parts.runtime`, gives every limit its id, swaps.
    fn merge_and_swap(&self, ids: &mut Ids, current: &Installed, file: Arc<RuleSet>, parts: Parts) -> u64 {
        let sentinel = &parts.sentinel.rules;
        let (rules, problems) = match sentinel.rules.is_empty() && sentinel.system.is_none() {
            true => parts.runtime.merge(&file),
            false => parts.runtime.merge(&file.with_extra(&sentinel.rules, sentinel.system.as_ref()).0),
        };
        ids.runtime.retain(|(id, _), _| parts.runtime.get(id).is_some());
        // The `global:` section comes from the rules file alone.
        let systems = Arc::new(current.systems.reconfigure(rules.systems(), &file.global_system()));
        let scope_of = |rule: &Rule| match rule.pattern {
            _ if rules.membership().is_empty() => Some(systems.global().clone()),
            Pattern::Exact => Some(systems.scope(rules.membership().system_of(&rule.name)).clone()),
            Pattern::Glob | Pattern::Default => None,
        };
        let handles: Arc<Vec<RuleHandles>> = Arc::new(
            rules.rules().iter().map(|rule| RuleHandles { scope: scope_of(rule), ..ids.rule_handles(rule) }).collect(),
        );
        // A record no limit in force keeps is dropped, so that renamed
        // limits do not pile up tables of 100,000 keys each.
        ids.traffic.retain(|_, t| handles.iter().any(|h| h.traffic.iter().flatten().any(|kept| Arc::ptr_eq(kept, t))));
        let envoy_handles = current.handles.envoy.clone();
        let parts = Parts { systems, ..parts };
        self.swap(current, Arc::new(rules), file, Arc::new(problems), handles, envoy_handles, parts)
    }

    /// Swaps in Sentinel's rules (read from `source`), merged after the
    /// file's; returns the version.
    pub fn install_sentinel(&self, rules: SentinelRules, text: String, source: String) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current.load_full();
        let sentinel = Arc::new(SentinelInstalled { rules, text, source, loaded_at: SystemTime::now() });
        let parts = Parts {
            yaml: current.yaml.clone(),
            source: current.source.clone(),
            envoy: current.envoy.clone(),
            sentinel,
            runtime: current.runtime.clone(),
            systems: current.systems.clone(),
        };
        self.merge_and_swap(&mut ids, &current, current.file.clone(), parts)
    }

    /// Swaps in an envoyproxy/ratelimit configuration (read from `source`),
    /// keeping our rules in force; returns the version.
    pub fn install_envoy(&self, config: EnvoyConfig, text: String, source: String, version: String) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        // What the configuration in force no longer has is forgotten: ids
        // and hottest keys of its limits, and its series of upstream's stats
        // (a control plane may send configurations with new names forever).
        let identities: std::collections::HashSet<(String, String, &'static str)> = config
            .rules()
            .iter()
            .flat_map(|r| r.limits.iter().map(|l| (format!("{ENVOY}{}", r.name), l.name.clone(), l.algorithm.name())))
            .collect();
        ids.file.retain(|identity, _| !identity.0.starts_with(ENVOY) || identities.contains(identity));
        let named: std::collections::HashSet<(&str, &str)> =
            identities.iter().map(|(rule, limit, _)| (rule.as_str(), limit.as_str())).collect();
        ids.hitters
            .retain(|(rule, limit), _| !rule.starts_with(ENVOY) || named.contains(&(rule.as_str(), limit.as_str())));
        // One rule per limit, in the same order.
        let series = |l: &envoy::EnvoyLimit| !(l.dynamic_stat || l.unlimited);
        let envoy_handles = Arc::new(
            config
                .rules()
                .iter()
                .zip(config.limits())
                .map(|(rule, l)| ids.envoy_handles(rule, series(l).then(|| self.upstream.configured(&rule.name))))
                .collect(),
        );
        let configured: Vec<&str> = config
            .rules()
            .iter()
            .zip(config.limits())
            .filter(|(_, l)| series(l))
            .map(|(r, _)| r.name.as_str())
            .collect();
        let domain = crate::metrics::upstream::domain_label;
        let mut domains: std::collections::HashSet<String> = config.domains().map(domain).collect();
        let current = self.current.load_full();
        domains.extend(current.rules.rules().iter().map(|r| domain(&r.name)));
        self.upstream.retain(configured, |domain| domains.contains(domain));
        let envoy = Arc::new(EnvoyInstalled { config, text, source, version, loaded_at: SystemTime::now() });
        let parts = Parts {
            yaml: current.yaml.clone(),
            source: current.source.clone(),
            envoy,
            sentinel: current.sentinel.clone(),
            runtime: current.runtime.clone(),
            systems: current.systems.clone(),
        };
        let (rules, file, problems) = (current.rules.clone(), current.file.clone(), current.problems.clone());
        let handles = current.handles.rules.clone();
        self.swap(&current, rules, file, problems, handles, envoy_handles, parts)
    }

    /// Installs a new `Installed` built from its parts; the caller holds `ids`.
    #[allow(clippy::too_many_arguments)]
    fn swap(
        &self,
        current: &Installed,
        rules: Arc<RuleSet>,
        file: Arc<RuleSet>,
        problems: Arc<BTreeMap<String, String>>,
        handles: Arc<Vec<RuleHandles>>,
        envoy_handles: Arc<Vec<RuleHandles>>,
        parts: Parts,
    ) -> u64 {
        let Parts { yaml, source, envoy, sentinel, runtime, systems } = parts;
        let mut by_id = HashMap::new();
        for (r, h) in handles.iter().enumerate() {
            for (l, id) in h.ids.iter().enumerate() {
                by_id.insert(*id, Place::Rule(r, l));
            }
            for (o, ids) in h.override_ids.iter().enumerate() {
                for (l, id) in ids.iter().enumerate() {
                    by_id.insert(*id, Place::Override(r, o, l));
                }
            }
        }
        for (r, h) in envoy_handles.iter().enumerate() {
            by_id.insert(h.ids[0], Place::Envoy(r));
        }
        let per_unit = rules.rules().iter().map(|r| r.limits.iter().map(envoy::per_unit).collect()).collect();
        let installed = Installed {
            rules,
            file,
            runtime,
            problems,
            yaml,
            version: current.version + 1,
            source,
            loaded_at: SystemTime::now(),
            envoy,
            sentinel,
            systems,
            handles: Handles {
                rules: handles,
                envoy: envoy_handles,
                unmatched: RuleMetrics::unmatched(),
                by_id,
                envoy_sizes: current.handles.envoy_sizes.clone(),
                per_unit,
            },
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
    sentinel: Arc<SentinelInstalled>,
    runtime: Arc<Table>,
    /// The degradation scopes (rebuilt from the merged rules on a merge).
    systems: Arc<Systems>,
}

/// The prefix of Envoy rules' identities: apart from ours, whatever their names.
const ENVOY: &str = "\u{1}envoy:";
/// The prefix of overrides' limits' identities.
const OVERRIDE: &str = "\u{2}";

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

    /// The id of a limit of an override set at run time (`@ID` tags): kept
    /// while the override is.
    fn runtime(&mut self, override_id: &str, identity: Identity) -> LimitId {
        let key = (override_id.to_string(), identity);
        if let Some(&id) = self.runtime.get(&key) {
            return id;
        }
        let id = self.next();
        self.runtime.insert(key, id);
        id
    }

    /// The ids of `limits` of rule `rule` (with `prefix`), by (rule, limit, algorithm).
    fn ids_of(&mut self, prefix: &str, rule: &str, limits: &[Limit]) -> Vec<LimitId> {
        limits.iter().map(|l| self.get((format!("{prefix}{rule}"), l.name.clone(), l.algorithm.name()))).collect()
    }

    /// A rule's handles: its limits' ids, its overrides' (their own buckets,
    /// the same across installs while the override has the same tag), and
    /// its hottest keys by slot.
    fn rule_handles(&mut self, rule: &Rule) -> RuleHandles {
        let ids = self.ids_of("", &rule.name, &rule.limits);
        let mut override_ids = Vec::with_capacity(rule.overrides.len());
        for o in rule.overrides.list() {
            let runtime = o.tag.strip_prefix('@');
            let list = o
                .limits
                .iter()
                .map(|limit| {
                    let identity =
                        (format!("{OVERRIDE}{}{}", rule.name, o.tag), limit.name.clone(), limit.algorithm.name());
                    match runtime {
                        None => self.get(identity),
                        Some(id) => self.runtime(id, identity),
                    }
                })
                .collect();
            override_ids.push(list);
        }
        let names =
            rule.limits.iter().map(|l| l.name.as_str()).chain(rule.overrides.extra_names().iter().map(String::as_str));
        let names: Vec<&str> = names.collect();
        let hitters = names.iter().map(|name| Some(self.hitters("", &rule.name, name))).collect();
        let traffic = names
            .iter()
            .map(|name| {
                let limit = rule.limits.iter().find(|l| l.name == *name && l.history)?;
                Some(self.traffic(&rule.name, name, &limit.key))
            })
            .collect();
        RuleHandles {
            ids,
            override_ids,
            hitters,
            traffic,
            metrics: RuleMetrics::new(rule),
            scope: None,
            upstream: None,
        }
    }

    /// An Envoy rule's handles: one limit, no overrides, the series of
    /// upstream's stats under its path (`upstream`: none when its key
    /// depends on the request or it counts nothing), and the decision
    /// counters every Envoy limit shares (its own series are upstream's).
    fn envoy_handles(&mut self, rule: &Rule, upstream: Option<Arc<LimitStats>>) -> RuleHandles {
        let ids = self.ids_of(ENVOY, &rule.name, &rule.limits);
        let hitters = rule.limits.iter().map(|l| Some(self.hitters(ENVOY, &rule.name, &l.name))).collect();
        let traffic = vec![None; rule.limits.len()];
        RuleHandles {
            ids,
            override_ids: Vec::new(),
            hitters,
            traffic,
            metrics: RuleMetrics::envoy(),
            scope: None,
            upstream,
        }
    }

    /// The recorded traffic of (rule, limit name, key), kept across
    /// installs while the rules have it. A limit whose key changes starts a
    /// new record: the values recorded were of other descriptors.
    fn traffic(&mut self, rule: &str, limit: &str, key: &[String]) -> Arc<Traffic> {
        let limit = format!("{limit}\0{}", key.join("\0"));
        let name = format!("{rule}\0{limit}");
        self.traffic
            .entry((rule.to_string(), limit))
            .or_insert_with(|| Arc::new(Traffic::named(name, crate::recommend::traffic::MAX_KEYS)))
            .clone()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Domain `kept` (a configured series and a request-dependent one), and
    /// one more domain named `other`.
    fn config(other: &str) -> EnvoyConfig {
        let kept = "domain: kept\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n  - key: ip\n    detailed_metric: true\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";
        let other = format!(
            "domain: {other}\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: minute, requests_per_unit: 2 }}\n"
        );
        EnvoyConfig::parse(&[("a.yaml".into(), kept.into()), ("b.yaml".into(), other)]).unwrap()
    }

    #[test]
    fn configurations_with_new_names_forever_keep_only_what_is_in_force() {
        let slot = RulesSlot::new();
        slot.install_envoy(config("first"), String::new(), "xds".into(), "0".into());
        let kept = slot.load().envoy_rule(0).1.ids[0];
        let stats = slot.upstream().get("kept.ip_1");
        for i in 0..1_000 {
            // A control plane naming a new domain in every version.
            slot.install_envoy(config(&format!("d{i}")), String::new(), "xds".into(), i.to_string());
            slot.upstream().get(&format!("d{i}.ip_1"));
            // Traffic goes on on kept's request-dependent series.
            slot.upstream().get("kept.ip_1");
        }
        let ids = slot.ids.lock().unwrap();
        assert_eq!(ids.file.len(), 3, "kept's two limits and the last domain's one");
        assert_eq!(ids.hitters.len(), 3);
        drop(ids);
        // kept.user, kept.ip_1 (its domain stays), d999.user, d999.ip_1.
        assert_eq!(slot.upstream().len(), 4);
        assert_eq!(slot.load().envoy_rule(0).1.ids[0], kept, "a limit that stays keeps its buckets");
        assert!(Arc::ptr_eq(&stats, &slot.upstream().get("kept.ip_1")), "and its series");
    }

    fn recorded(slot: &RulesSlot) -> Option<Arc<Traffic>> {
        let installed = slot.load_full();
        let (rule, handles) = installed.rule_at(0);
        handles.recorded(rule, "l").cloned()
    }

    #[test]
    fn a_limits_record_stays_while_it_has_history_and_no_longer() {
        let rules = |limit: u64, history: bool| {
            let text = format!(
                "resources:\n  - name: api\n    limits: [ {{ name: l, key: [t], algorithm: fixed_window, limit: {limit}, window: 1m, history: {history} }} ]\n"
            );
            (RuleSet::from_yaml(&text, "t").unwrap(), text)
        };
        let slot = RulesSlot::new();
        let (r, t) = rules(5, true);
        slot.install(r, t, "t".into());
        let first = recorded(&slot).expect("recorded");
        first.count(&"k".into(), 1, 0);
        // Another limit value: the same record.
        let (r, t) = rules(6, true);
        slot.install(r, t, "t".into());
        assert!(Arc::ptr_eq(&first, &recorded(&slot).unwrap()));
        // Another key: another record (the values were of another name).
        let (_, t) = rules(6, true);
        let t = t.replace("key: [t]", "key: [u]");
        slot.install(RuleSet::from_yaml(&t, "t").unwrap(), t, "t".into());
        let other = recorded(&slot).unwrap();
        assert!(!Arc::ptr_eq(&first, &other) && other.keys() == 0);
        assert_eq!(slot.ids.lock().unwrap().traffic.len(), 1, "the old one is dropped");
        // Without history: no record, and none kept aside.
        let (r, t) = rules(6, false);
        slot.install(r, t, "t".into());
        assert!(recorded(&slot).is_none());
        assert!(slot.ids.lock().unwrap().traffic.is_empty());
        // With history again: a new, empty record.
        let (r, t) = rules(6, true);
        slot.install(r, t, "t".into());
        assert_eq!(recorded(&slot).unwrap().keys(), 0);
    }
}
