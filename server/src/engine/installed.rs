//! The rules in force: swapped atomically, read without a lock on the hot path.
//! Limit ids are kept across installs, so that a limit that keeps its rule,
//! name and algorithm keeps its buckets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::{ArcSwap, Guard};

use super::counters::RuleMetrics;
use crate::limiter::Algorithm;
use crate::rules::{Limit, LimitId, Rule, RuleSet};

/// The rules in force, with where they came from.
#[derive(Debug)]
pub struct Installed {
    pub rules: RuleSet,
    /// The text they were read from.
    pub yaml: String,
    /// Increases with every install.
    pub version: u64,
    /// A file path, "embedded", "admin" or "redis".
    pub source: String,
    pub loaded_at: SystemTime,
    /// Every limit by id: (rule index, limit index).
    by_id: HashMap<LimitId, (usize, usize)>,
    /// Decision counters, one per rule, and for requests no rule matched.
    pub(super) metrics: Vec<RuleMetrics>,
    pub(super) unmatched: RuleMetrics,
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
            rules: RuleSet::default(),
            yaml: String::new(),
            version: 0,
            source: String::new(),
            loaded_at: SystemTime::now(),
            by_id: HashMap::new(),
            metrics: Vec::new(),
            unmatched: RuleMetrics::unmatched(),
        }
    }

    /// The algorithm of a limit still in force.
    pub fn algorithm(&self, id: LimitId) -> Option<&Algorithm> {
        self.limit(id).map(|(_, l)| &l.algorithm)
    }

    /// A limit still in force, with its rule.
    pub fn limit(&self, id: LimitId) -> Option<(&Rule, &Limit)> {
        let &(r, l) = self.by_id.get(&id)?;
        let rule = &self.rules.rules()[r];
        Some((rule, &rule.limits[l]))
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

    /// Swaps in a new rule set and returns its version.
    pub fn install(&self, mut rules: RuleSet, yaml: String, source: String) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let mut by_id = HashMap::new();
        for (r, rule) in rules.rules_mut().iter_mut().enumerate() {
            for (l, limit) in rule.limits.iter_mut().enumerate() {
                let next = LimitId(ids.len() as u32 + 1);
                let identity = (rule.name.clone(), limit.name.clone(), limit.algorithm.name());
                limit.id = *ids.entry(identity).or_insert(next);
                by_id.insert(limit.id, (r, l));
            }
        }
        let version = self.current.load().version + 1;
        let metrics = rules.rules().iter().map(RuleMetrics::new).collect();
        let unmatched = RuleMetrics::unmatched();
        let loaded_at = SystemTime::now();
        let installed = Installed { rules, yaml, version, source, loaded_at, by_id, metrics, unmatched };
        self.current.store(Arc::new(installed));
        version
    }
}

impl Default for RulesSlot {
    fn default() -> Self {
        Self::new()
    }
}
