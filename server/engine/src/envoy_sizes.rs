//! Limits Envoy sends itself: a descriptor's `limit` (requests per unit)
//! replaces the configured one. Each distinct size becomes a fixed-window rule
//! with one limit, created on first use and kept for the life of the process,
//! so that its buckets keep counting across rule reloads. At most
//! [`MAX_SIZES`] sizes exist: a caller cannot grow this without bound.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use super::handles::RuleHandles;
use crate::rules::Rule;
use crate::rules::envoy::{self, Unit};
use crate::store::LimitId;

/// The most distinct override sizes one process keeps.
pub(crate) const MAX_SIZES: usize = 256;

pub(crate) struct EnvoySizes {
    slots: Box<[OnceLock<(Rule, RuleHandles)>]>,
    index: RwLock<HashMap<(u32, Unit), usize>>,
}

impl std::fmt::Debug for EnvoySizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvoySizes").field("sizes", &self.index.read().map(|m| m.len()).unwrap_or(0)).finish()
    }
}

/// Override ids count down from the top of the id space, far from the ids
/// rules are given (which count up from 1).
fn id_of(slot: usize) -> LimitId {
    LimitId(u32::MAX - slot as u32)
}

impl EnvoySizes {
    pub fn new() -> Self {
        EnvoySizes { slots: (0..MAX_SIZES).map(|_| OnceLock::new()).collect(), index: RwLock::new(HashMap::new()) }
    }

    /// The rule for `requests_per_unit` per `unit`, created on first use;
    /// `None` once [`MAX_SIZES`] sizes exist.
    pub fn get(&self, requests_per_unit: u32, unit: Unit) -> Option<(&Rule, &RuleHandles)> {
        let key = (requests_per_unit, unit);
        let found = self.index.read().unwrap_or_else(|e| e.into_inner()).get(&key).copied();
        let slot = match found {
            Some(slot) => slot,
            None => {
                let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
                let next = index.len();
                match index.get(&key) {
                    Some(&slot) => slot,
                    None if next < MAX_SIZES => {
                        let rule = rule(requests_per_unit, unit);
                        let handles = RuleHandles::without_hitters(&rule, vec![id_of(next)]);
                        let _ = self.slots[next].set((rule, handles));
                        index.insert(key, next);
                        next
                    }
                    None => return None,
                }
            }
        };
        self.slots[slot].get().map(|(r, m)| (r, m))
    }

    /// The rule of an override limit, by its limit's id.
    pub fn rule(&self, id: LimitId) -> Option<&Rule> {
        let slot = (u32::MAX - id.0) as usize;
        self.slots.get(slot)?.get().filter(|(_, h)| h.ids[0] == id).map(|(r, _)| r)
    }
}

impl Default for EnvoySizes {
    fn default() -> Self {
        Self::new()
    }
}

fn rule(requests_per_unit: u32, unit: Unit) -> Rule {
    envoy::window_rule(format!("override:{requests_per_unit}/{}", unit.name()), requests_per_unit, unit, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_shared_bounded_and_found_by_id() {
        let o = EnvoySizes::new();
        let (_, a) = o.get(10, Unit::Minute).unwrap();
        let a_id = a.ids[0];
        let (_, again) = o.get(10, Unit::Minute).unwrap();
        assert_eq!(again.ids[0], a_id, "the same size is the same limit");
        let (_, b) = o.get(10, Unit::Hour).unwrap();
        assert_ne!(b.ids[0], a_id);
        assert_eq!(o.rule(a_id).unwrap().name, "override:10/minute");
        assert!(o.rule(LimitId(7)).is_none());
        for n in 0..MAX_SIZES as u32 {
            let _ = o.get(1000 + n, Unit::Second);
        }
        assert!(o.get(99_999, Unit::Day).is_none(), "no more than MAX_SIZES sizes");
        assert!(o.get(10, Unit::Minute).is_some(), "sizes already known still work");
    }
}
