//! Decision counters, one set per rule, resolved when rules are installed so
//! that counting a decision is an atomic add: no label hashing per decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, counter};

use crate::metrics::{DECISIONS, ENVOY, LIMIT_DECISIONS, UNMATCHED};
use crate::rules::Rule;

/// The `verdict` label values, in the order `record` numbers them.
pub(crate) const VERDICTS: [&str; 5] = ["ALLOWED", "RATE_LIMITED", "CIRCUIT_OPEN", "CONCURRENCY_LIMITED", "SHED"];

/// One rule's decision counters.
#[derive(Debug)]
pub(crate) struct RuleMetrics {
    /// By verdict (index `verdict_index`), with an empty `limit` label.
    verdicts: [Counter; 5],
    /// RATE_LIMITED, by the index of the limit that denied.
    limited_by: Vec<Counter>,
    /// Per limit: (admitted, exceeded, exceeded in shadow mode, exceeded
    /// and admitted over the limit: only for a limit with `over_limit`).
    limits: Vec<(Counter, Counter, Counter, Option<Counter>)>,
    /// Decisions admitted and denied, read once a second by the console's
    /// charts.
    pub tally: Arc<Tally>,
}

/// A rule's decisions admitted and denied since its counters were made:
/// two relaxed adds' worth of state, read by whoever samples them.
#[derive(Debug, Default)]
pub struct Tally {
    admitted: AtomicU64,
    denied: AtomicU64,
}

impl Tally {
    /// (admitted, denied) so far.
    pub fn read(&self) -> (u64, u64) {
        (self.admitted.load(Ordering::Relaxed), self.denied.load(Ordering::Relaxed))
    }

    /// Counts one decision.
    #[inline]
    pub fn count(&self, admitted: bool) {
        let n = if admitted { &self.admitted } else { &self.denied };
        n.fetch_add(1, Ordering::Relaxed);
    }
}

impl RuleMetrics {
    pub fn new(rule: &Rule) -> Self {
        let own = rule.limits.iter().map(|l| l.name.clone());
        let names: Vec<String> = own.chain(rule.overrides.extra_names().iter().cloned()).collect();
        // An override's limit admits over its limit as the rule's limit of
        // its name does (overrides change amounts, not `over_limit`).
        let soft: Vec<bool> =
            names.iter().map(|n| rule.limits.iter().any(|l| &l.name == n && l.over_limit.is_some())).collect();
        Self::for_resource(&rule.name, &names, &soft)
    }

    pub fn unmatched() -> Self {
        Self::for_resource(UNMATCHED, &[], &[])
    }

    /// The counters every limit of the Envoy configuration shares
    /// (`resource` and `limit` are `_envoy`): their own series are
    /// upstream's stats, bounded and forgotten with the configuration.
    pub fn envoy() -> Self {
        Self::for_resource(ENVOY, &[ENVOY.to_string()], &[false])
    }

    fn for_resource(resource: &str, limits: &[String], soft: &[bool]) -> Self {
        let r = resource.to_string();
        let verdict = |v: &'static str| counter!(DECISIONS, "resource" => r.clone(), "verdict" => v, "limit" => "");
        let verdicts = VERDICTS.map(verdict);
        let limited_by = limits
            .iter()
            .map(|l| counter!(DECISIONS, "resource" => r.clone(), "verdict" => "RATE_LIMITED", "limit" => l.clone()))
            .collect();
        let result = |l: &String, res: &'static str| counter!(LIMIT_DECISIONS, "resource" => r.clone(), "limit" => l.clone(), "result" => res);
        let limits = limits
            .iter()
            .zip(soft)
            .map(|(l, &soft)| {
                let over = soft.then(|| result(l, "exceeded_admitted"));
                (result(l, "admitted"), result(l, "exceeded"), result(l, "shadow_exceeded"), over)
            })
            .collect();
        RuleMetrics { verdicts, limited_by, limits, tally: Arc::default() }
    }

    /// Counts one decision: its verdict (as `VERDICTS` orders them), the
    /// index of the limit that denied it if a limit did, and every matched
    /// limit's (index, exceeded, shadow, admitted over the limit).
    pub fn record(
        &self,
        verdict: usize,
        denied_by: Option<usize>,
        limits: impl Iterator<Item = (usize, bool, bool, bool)>,
    ) {
        match denied_by {
            Some(i) => self.limited_by[i].increment(1),
            None => self.verdicts[verdict].increment(1),
        }
        self.tally.count(verdict == 0);
        self.record_limits(limits);
    }

    /// Counts every matched limit's decision (index, exceeded, shadow,
    /// admitted over the limit), not the call's verdict: a denial that
    /// passes the call on to the next source of a waterfall, whose
    /// decision is the call's.
    pub fn record_limits(&self, limits: impl Iterator<Item = (usize, bool, bool, bool)>) {
        for (index, exceeded, shadow, over_limit) in limits {
            let (admitted, over, shadowed, admitted_over) = &self.limits[index];
            match (exceeded, shadow, admitted_over.as_ref().filter(|_| over_limit)) {
                (false, ..) => admitted.increment(1),
                (true, false, Some(c)) => c.increment(1),
                (true, false, None) => over.increment(1),
                (true, true, _) => shadowed.increment(1),
            }
        }
    }
}
