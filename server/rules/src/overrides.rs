//! Overrides per descriptor value: "tenant acme gets 10x", "this API key is
//! on the gold plan", "block this IP". Each override of a resource names the
//! descriptor values it applies to (all must match) and what changes: a
//! factor on every limit, absolute numbers for some limits, a tier (a named
//! set of limits) instead of the resource's limits, or a block.
//!
//! An override's limits are limits of their own (their own buckets), so
//! adding or removing one never reinterprets a bucket another limit filled.
//! Matching costs one hash lookup per distinct descriptor key the overrides
//! of a resource start with, however many overrides there are.

use std::collections::HashMap;
use std::time::Duration;

use super::Limit;
use crate::limiter::{Algorithm, sliding_window_log};

/// The largest capacity, burst or window limit: far beyond any real use, and
/// small enough that no arithmetic on it can overflow.
pub(crate) const MAX_AMOUNT: u64 = 1_000_000_000_000;
/// The largest factor an override may give.
pub(crate) const MAX_FACTOR: f64 = 1_000_000.0;
/// `until` of an override that never ends.
pub const NEVER: u64 = u64::MAX;

/// What an override does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Denied (RATE_LIMITED), with this `retry_after`.
    Block { retry_after: Duration },
    /// Every limit times this factor (capacity and rate).
    Factor(f64),
    /// Some limits at absolute numbers (capacity, burst or limit), their
    /// rates scaled alike.
    Limits(Vec<(String, u64)>),
    /// The tier's limits instead of the resource's.
    Tier(String),
}

/// One override of a resource.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    /// Descriptor values that must all be present.
    pub when: Vec<(String, String)>,
    pub action: Action,
    /// The resource's limits under this override (empty for a block).
    pub limits: Vec<Limit>,
    /// Each of those limits' metrics slot: its position among the rule's
    /// limits when it has the name of one, else after them (see
    /// [`Overrides::extra_names`]).
    pub slots: Vec<usize>,
    /// When it stops applying, in nanoseconds since the Unix epoch
    /// ([`NEVER`] for the rules file's).
    pub until: u64,
    /// Where it comes from, unique within its rule: `#3` for the file's
    /// fourth, `@ID` for one set at run time. Its limits keep their buckets
    /// across installs while it does.
    pub tag: String,
}

impl Override {
    /// `action` for requests carrying `when`, on a rule with the `base`
    /// limits; `Err((field, why))` when the action names a limit or tier that
    /// does not exist or a number out of range.
    pub fn new(
        when: Vec<(String, String)>,
        action: Action,
        base: &[Limit],
        tiers: &HashMap<String, Vec<Limit>>,
    ) -> Result<Override, (&'static str, String)> {
        let limits = derive(&action, base, tiers)?;
        Ok(Override { when, action, limits, slots: Vec::new(), until: NEVER, tag: String::new() })
    }

    /// `factor` times every limit of `base` for requests carrying `when`.
    pub fn factor(when: Vec<(String, String)>, factor: f64, base: &[Limit]) -> Override {
        let limits = base.iter().map(|l| scaled(l, factor)).collect();
        Override { when, action: Action::Factor(factor), limits, slots: Vec::new(), until: NEVER, tag: String::new() }
    }

    /// The same override, ending at `until` (nanoseconds since the epoch).
    pub fn until(mut self, until: u64) -> Override {
        self.until = until;
        self
    }

    /// The same override, tagged (see [`Override::tag`]).
    pub fn tagged(mut self, tag: String) -> Override {
        self.tag = tag;
        self
    }
}

/// The limits `action` gives a rule whose own are `base`.
fn derive(
    action: &Action,
    base: &[Limit],
    tiers: &HashMap<String, Vec<Limit>>,
) -> Result<Vec<Limit>, (&'static str, String)> {
    match action {
        Action::Block { .. } => Ok(Vec::new()),
        Action::Factor(factor) => {
            if !(*factor > 0.0 && *factor <= MAX_FACTOR) {
                return Err(("factor", format!("must be above 0 and at most {MAX_FACTOR}, got {factor}")));
            }
            within_caps("factor", base.iter().map(|l| scaled(l, *factor)).collect())
        }
        Action::Limits(set) => {
            if set.is_empty() {
                return Err(("limits", "must name at least one limit, e.g. { per-user: 5000 }".into()));
            }
            for (name, n) in set {
                let Some(limit) = base.iter().find(|l| l.name == *name) else {
                    return Err(("limits", format!("'{}' is not a limit of this resource", name.escape_debug())));
                };
                // A balance holds what was topped up: no override sizes it
                // (a factor leaves it as it is too).
                if matches!(limit.algorithm, Algorithm::Balance(_)) {
                    return Err((
                        "limits",
                        format!(
                            "'{}' is a balance: it holds what an operator topped up (floodgate balance), and an override cannot change it",
                            name.escape_debug()
                        ),
                    ));
                }
                if !(1..=MAX_AMOUNT).contains(n) {
                    return Err((
                        "limits",
                        format!("'{}' must be a whole number from 1 to {MAX_AMOUNT}, got {n}", name.escape_debug()),
                    ));
                }
            }
            within_caps(
                "limits",
                base.iter()
                    .map(|l| match set.iter().find(|(name, _)| *name == l.name) {
                        Some(&(_, n)) => scaled(l, n as f64 / l.algorithm.capacity() as f64),
                        None => l.clone(),
                    })
                    .collect(),
            )
        }
        // A tier replaces the rule's own limits; the rule's waterfall stays.
        Action::Tier(name) => match tiers.get(name) {
            Some(t) => Ok(t.iter().chain(base.iter().filter(|l| l.source > 0)).cloned().collect()),
            None => Err(("tier", format!("'{}' is not a tier (define it under tiers:)", name.escape_debug()))),
        },
    }
}

/// `limits`, unless one is above what its algorithm allows in a rules file
/// (a sliding log keeps an entry per unit: 10,000 at most).
fn within_caps(field: &'static str, limits: Vec<Limit>) -> Result<Vec<Limit>, (&'static str, String)> {
    for l in &limits {
        let cap = match l.algorithm {
            Algorithm::SlidingWindowLog(_) => sliding_window_log::MAX_LIMIT,
            // An override leaves a balance as it is: its own bound holds.
            Algorithm::Balance(_) => continue,
            _ => MAX_AMOUNT,
        };
        let n = l.algorithm.capacity();
        if n > cap {
            let name = l.name.escape_debug();
            return Err((field, format!("would make '{name}' {n}; {} allows at most {cap}", l.algorithm.name())));
        }
    }
    Ok(limits)
}

/// `l` at `factor` times its capacity and rate.
fn scaled(l: &Limit, factor: f64) -> Limit {
    Limit { algorithm: l.algorithm.scaled(factor), ..l.clone() }
}

/// A resource's overrides, indexed by their first descriptor value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    list: Vec<Override>,
    /// First `when` key, then its value: the overrides starting with it, in order.
    index: HashMap<String, HashMap<String, Vec<u32>, ahash::RandomState>, ahash::RandomState>,
    /// See [`Overrides::extra_names`].
    extra_names: Vec<String>,
}

impl Overrides {
    /// `list`, overriding the rule's `base` limits: sets every override's
    /// `slots` and notes the limit names only overrides have (a tier's own).
    pub fn new(base: &[Limit], mut list: Vec<Override>) -> Overrides {
        let mut extra: Vec<String> = Vec::new();
        for o in &mut list {
            o.slots = o
                .limits
                .iter()
                .map(|l| match base.iter().position(|b| b.name == l.name) {
                    Some(i) => i,
                    None => match extra.iter().position(|n| *n == l.name) {
                        Some(i) => base.len() + i,
                        None => {
                            extra.push(l.name.clone());
                            base.len() + extra.len() - 1
                        }
                    },
                })
                .collect();
        }
        let mut index: HashMap<String, HashMap<String, Vec<u32>, ahash::RandomState>, ahash::RandomState> =
            HashMap::default();
        for (i, o) in list.iter().enumerate() {
            let Some((k, v)) = o.when.first() else { continue };
            index.entry(k.clone()).or_default().entry(v.clone()).or_default().push(i as u32);
        }
        Overrides { list, index, extra_names: extra }
    }

    /// Limit names only overrides have, in order: their metrics slots follow
    /// the rule's own limits.
    pub fn extra_names(&self) -> &[String] {
        &self.extra_names
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn list(&self) -> &[Override] {
        &self.list
    }

    /// The first override (in order) whose values the request carries and
    /// that has not ended at `now()` (nanoseconds since the epoch; asked only
    /// of an override that ends), with its position in [`Overrides::list`].
    pub fn find<'a, 'd>(
        &'a self,
        get: impl Fn(&str) -> Option<&'d str>,
        now: impl Fn() -> u64,
    ) -> Option<(usize, &'a Override)> {
        let mut best: Option<u32> = None;
        for (key, by_value) in &self.index {
            let Some(value) = get(key) else { continue };
            let Some(candidates) = by_value.get(value) else { continue };
            for &i in candidates {
                if best.is_some_and(|b| b < i) {
                    break;
                }
                let o = &self.list[i as usize];
                if (o.until == NEVER || o.until > now()) && o.when[1..].iter().all(|(k, v)| get(k) == Some(v.as_str()))
                {
                    best = Some(i);
                    break;
                }
            }
        }
        best.map(|i| (i as usize, &self.list[i as usize]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(when: &[(&str, &str)], factor: f64) -> Override {
        Override {
            when: when.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            action: Action::Factor(factor),
            limits: Vec::new(),
            slots: Vec::new(),
            until: NEVER,
            tag: String::new(),
        }
    }

    #[test]
    fn the_first_override_whose_values_all_match_wins() {
        let set = Overrides::new(
            &[],
            vec![
                o(&[("tenant", "acme"), ("plan", "gold")], 1.0),
                o(&[("user", "u1")], 2.0),
                o(&[("tenant", "acme")], 3.0),
            ],
        );
        let find = |pairs: &[(&str, &str)]| {
            let found = set.find(|k| pairs.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v), || 0);
            found.map(|(_, o)| o.action.clone())
        };
        assert_eq!(find(&[("tenant", "acme"), ("plan", "gold")]), Some(Action::Factor(1.0)));
        assert_eq!(find(&[("tenant", "acme")]), Some(Action::Factor(3.0)), "all values must match");
        assert_eq!(find(&[("tenant", "acme"), ("user", "u1")]), Some(Action::Factor(2.0)), "file order");
        assert_eq!(find(&[("tenant", "other")]), None);
        assert_eq!(find(&[]), None);
    }

    #[test]
    fn an_ended_override_gives_way_to_the_next_that_matches() {
        let set = Overrides::new(&[], vec![o(&[("tenant", "acme")], 2.0).until(100), o(&[("tenant", "acme")], 3.0)]);
        let at = |now| set.find(|k| (k == "tenant").then_some("acme"), || now).map(|(_, o)| o.action.clone());
        assert_eq!(at(99), Some(Action::Factor(2.0)));
        assert_eq!(at(100), Some(Action::Factor(3.0)), "ended at its `until`, exactly");
    }

    #[test]
    fn derive_refuses_unknown_names_and_numbers_out_of_range() {
        let tiers = HashMap::new();
        let err = |a: Action| Override::new(vec![("k".into(), "v".into())], a, &[], &tiers).unwrap_err();
        assert_eq!(err(Action::Tier("gold".into())).0, "tier");
        assert_eq!(err(Action::Factor(0.0)).0, "factor");
        assert_eq!(err(Action::Factor(f64::NAN)).0, "factor");
        assert!(err(Action::Limits(vec![("nope".into(), 5)])).1.contains("'nope' is not a limit"));
        assert_eq!(err(Action::Limits(Vec::new())).0, "limits");

        // Past an algorithm's own cap: a sliding log keeps an entry a unit.
        let log = super::super::RuleSet::from_yaml(
            "resources:\n  - name: a\n    limits: [ { name: l, algorithm: sliding_window_log, limit: 100, window: 1s }, { name: f, algorithm: fixed_window, limit: 1000000000000, window: 1s } ]\n",
            "t",
        )
        .unwrap();
        let base = &log.rules()[0].limits[..1];
        let refused = |a: Action| Override::new(vec![("k".into(), "v".into())], a, base, &tiers).unwrap_err();
        let (field, why) = refused(Action::Limits(vec![("l".into(), 1_000_000_000_000)]));
        assert_eq!(
            (field, why.as_str()),
            ("limits", "would make 'l' 1000000000000; sliding_window_log allows at most 10000")
        );
        assert_eq!(refused(Action::Factor(101.0)).0, "factor");
        let ok = Override::new(vec![("k".into(), "v".into())], Action::Factor(100.0), base, &tiers).unwrap();
        assert_eq!(ok.limits[0].algorithm.capacity(), 10_000);
        let big = &log.rules()[0].limits[1..];
        assert_eq!(
            Override::new(vec![("k".into(), "v".into())], Action::Factor(2.0), big, &tiers).unwrap_err().0,
            "factor"
        );
    }
}
