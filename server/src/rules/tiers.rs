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
#[derive(Clone, Debug)]
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
}

impl Override {
    /// `factor` times every limit of `base` for requests carrying `when`.
    pub fn factor(when: Vec<(String, String)>, factor: f64, base: &[Limit]) -> Override {
        let limits = base.iter().map(|l| Limit { algorithm: l.algorithm.scaled(factor), ..l.clone() }).collect();
        Override { when, action: Action::Factor(factor), limits, slots: Vec::new() }
    }
}

/// A resource's overrides, indexed by their first descriptor value.
#[derive(Clone, Debug, Default)]
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

    pub(crate) fn list_mut(&mut self) -> &mut [Override] {
        &mut self.list
    }

    /// The first override (in file order) whose values the request carries.
    pub fn find<'a, 'd>(&'a self, get: impl Fn(&str) -> Option<&'d str>) -> Option<&'a Override> {
        let mut best: Option<u32> = None;
        for (key, by_value) in &self.index {
            let Some(value) = get(key) else { continue };
            let Some(candidates) = by_value.get(value) else { continue };
            for &i in candidates {
                if best.is_some_and(|b| b < i) {
                    break;
                }
                let o = &self.list[i as usize];
                if o.when[1..].iter().all(|(k, v)| get(k) == Some(v.as_str())) {
                    best = Some(i);
                    break;
                }
            }
        }
        best.map(|i| &self.list[i as usize])
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
            let found = set.find(|k| pairs.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v));
            found.map(|o| o.action.clone())
        };
        assert_eq!(find(&[("tenant", "acme"), ("plan", "gold")]), Some(Action::Factor(1.0)));
        assert_eq!(find(&[("tenant", "acme")]), Some(Action::Factor(3.0)), "all values must match");
        assert_eq!(find(&[("tenant", "acme"), ("user", "u1")]), Some(Action::Factor(2.0)), "file order");
        assert_eq!(find(&[("tenant", "other")]), None);
        assert_eq!(find(&[]), None);
    }
}
