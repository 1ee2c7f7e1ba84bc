//! What the engine keeps for one rule while it is in force: its limits' ids
//! in the bucket store, its hottest keys and its decision counters.

use std::sync::Arc;

use super::counters::RuleMetrics;
use crate::degradation::Scope;
use crate::hitters::Hitters;
use crate::metrics::upstream::LimitStats;
use crate::recommend::traffic::Traffic;
use crate::rules::Rule;
use crate::store::LimitId;

/// What the engine keeps for one rule in force.
#[derive(Debug)]
pub struct RuleHandles {
    /// The ids of the rule's own limits, in order.
    pub(super) ids: Vec<LimitId>,
    /// The ids of each override's limits, as `rule.overrides.list()` orders them.
    pub(super) override_ids: Vec<Vec<LimitId>>,
    /// Hottest keys by slot: the rule's limits, then the names only its
    /// overrides' limits have (see `Overrides::extra_names`). Shared by the
    /// limits of one rule and name (an override's with the rule's), and kept
    /// across installs.
    pub(super) hitters: Vec<Option<Arc<Hitters>>>,
    /// Recorded traffic by slot, as `hitters`: for the names whose limit in
    /// the rule has `history: true`, else `None`.
    pub(super) traffic: Vec<Option<Arc<Traffic>>>,
    pub(super) metrics: RuleMetrics,
    /// The degradation scope of every resource the rule matches, when one
    /// scope takes them all (an exact rule, or no systems); else `None`, and
    /// each resource is looked up.
    pub(super) scope: Option<Arc<Scope>>,
    /// An Envoy configuration limit's series of upstream's stats, when its
    /// stat key does not depend on the request.
    pub(super) upstream: Option<Arc<LimitStats>>,
}

// === impl RuleHandles ===

impl RuleHandles {
    /// The ids of the limits that decide under the `o`th override, or the
    /// rule's own (`None`).
    pub(super) fn ids(&self, o: Option<usize>) -> &[LimitId] {
        match o {
            None => &self.ids,
            Some(o) => &self.override_ids[o],
        }
    }

    /// The hottest keys of slot `slot`, if it keeps them.
    #[inline]
    pub(super) fn hitters(&self, slot: usize) -> Option<&Hitters> {
        self.hitters.get(slot)?.as_deref()
    }

    /// The traffic recorded for the limit of slot `slot`, if it is.
    #[inline]
    pub(super) fn traffic(&self, slot: usize) -> Option<&Traffic> {
        self.traffic.get(slot)?.as_deref()
    }

    /// The traffic recorded for `rule`'s limit named `limit`, if it has
    /// `history`.
    pub fn recorded(&self, rule: &Rule, limit: &str) -> Option<&Arc<Traffic>> {
        let slot = rule.limits.iter().position(|l| l.name == limit)?;
        self.traffic.get(slot)?.as_ref()
    }

    /// The series of upstream's stats of an Envoy configuration limit whose
    /// stat key is its path.
    pub fn upstream(&self) -> Option<&LimitStats> {
        self.upstream.as_deref()
    }

    /// The handles of a rule that keeps no hottest keys (Envoy's sizes).
    pub(super) fn without_hitters(rule: &Rule, ids: Vec<LimitId>) -> RuleHandles {
        let slots = rule.limits.len() + rule.overrides.extra_names().len();
        RuleHandles {
            ids,
            override_ids: Vec::new(),
            hitters: vec![None; slots],
            traffic: vec![None; slots],
            metrics: RuleMetrics::new(rule),
            scope: None,
            upstream: None,
        }
    }
}
