//! Envoy's rate limit service, decided the way envoyproxy/ratelimit decides it:
//! every descriptor on its own limit, found in the Envoy configuration of the
//! domain (or a `limit` Envoy sends), else in our rules for the domain.
//!
//! What differs from `Acquire`:
//! - the cost is the descriptor's `hits_addend` (0: check only, nothing taken)
//!   and may exceed a limit's capacity: that descriptor is over the limit, as
//!   upstream answers, never an error;
//! - nothing reports back, so no permit is handed out: a breaker or a
//!   concurrency limit only gates (OVER_LIMIT unless the breaker is CLOSED,
//!   DISABLED or METRICS_ONLY and a slot is free), and takes nothing;
//! - a bucket of our rules matched by several descriptors of one request (a
//!   limit without a key matches them all) is charged once, by the first.

use smallvec::SmallVec;

use super::decide::{Matched, Prepared, limits_for, matched_in};
use super::installed::RuleHandles;
use super::{Engine, Installed, RequestError, request};
use crate::rules::Rule;
use crate::rules::envoy::{EnvoyLimit, Matched as EnvoyMatch, Unit};
use crate::store::BucketKey;

/// One RLS descriptor, checked.
#[derive(Clone, Debug)]
pub struct RlsDescriptor<'a> {
    /// The entries, in Envoy's order.
    pub entries: &'a [(&'a str, &'a str)],
    /// Units to take; 0 only checks.
    pub hits: u64,
    /// A limit sent with the descriptor, replacing the configured one.
    pub limit: Option<(u32, Unit)>,
}

/// What decides one descriptor.
#[derive(Clone, Copy, Debug)]
pub enum Target<'r> {
    /// No limit applies: OK, no current limit.
    Nothing,
    /// `unlimited: true` in the Envoy configuration: OK, never limited.
    Unlimited(&'r EnvoyLimit),
    /// A limit of the Envoy configuration.
    Envoy(&'r EnvoyLimit),
    /// A limit Envoy sent with the descriptor.
    Override { rule: &'r Rule, handles: &'r RuleHandles, requests_per_unit: u32, unit: Unit },
    /// Our rules for the domain: the rule's position.
    Rules(usize),
}

/// When a refused override size was logged last.
static OVERRIDE_WARNING: crate::time::Throttle = crate::time::Throttle::new(60);

impl Engine {
    /// Finds what decides a descriptor of `domain`: an override when the
    /// domain is known here, else the Envoy configuration of the domain when
    /// there is one, else our rules.
    pub fn rls_target<'r>(
        &self,
        rules: &'r Installed,
        domain: &str,
        d: &RlsDescriptor<'_>,
    ) -> Result<Target<'r>, RequestError> {
        request::validate_rls(domain, d.entries)?;
        let envoy = &rules.envoy.config;
        if let Some((requests_per_unit, unit)) = d.limit
            && (envoy.has_domain(domain) || rules.rules.position(domain).is_some())
        {
            match rules.handles.envoy_sizes.get(requests_per_unit, unit) {
                Some((rule, handles)) => return Ok(Target::Override { rule, handles, requests_per_unit, unit }),
                // Too many sizes already: the configured limit applies.
                None => {
                    metrics::counter!(crate::metrics::RLS_OVERRIDES_REFUSED).increment(1);
                    if OVERRIDE_WARNING.due(self.clock().now()) {
                        tracing::warn!(
                            domain,
                            requests_per_unit,
                            unit = unit.name(),
                            max = super::envoy_sizes::MAX_SIZES,
                            "a limit Envoy sent is not applied: this process keeps {} sizes already; the configured limit decides (floodgate_rls_overrides_refused_total counts each; logged once a minute)",
                            super::envoy_sizes::MAX_SIZES
                        );
                    }
                }
            }
        }
        if !envoy.has_domain(domain) {
            return Ok(rules.rules.position(domain).map_or(Target::Nothing, Target::Rules));
        }
        Ok(match envoy.find(domain, d.entries) {
            None => Target::Nothing,
            Some(EnvoyMatch::Unlimited(l)) => Target::Unlimited(l),
            Some(EnvoyMatch::Limit(l)) => Target::Envoy(l),
        })
    }

    /// The decision a target needs, not yet made; `None` when there is none.
    pub fn prepare_rls<'r>(
        &self,
        rules: &'r Installed,
        domain: &str,
        d: &RlsDescriptor<'_>,
        (target, priority): (Target<'r>, crate::rules::Priority),
    ) -> Option<Prepared<'r>> {
        let mut blocked = None;
        // The counter of an Envoy limit is per distinct list of entries, as upstream's.
        let flat = || d.entries.iter().flat_map(|(k, v)| [*k, *v]);
        let (rule, handles, matched): (&Rule, &RuleHandles, Matched<'r>) = match target {
            Target::Nothing | Target::Unlimited(_) => return None,
            Target::Envoy(l) => {
                let (rule, handles) = rules.envoy_rule(l.rule);
                let key = if l.shared.is_empty() {
                    BucketKey::new(handles.ids[0], flat())
                } else {
                    // `share_threshold`: every value a wildcard matches counts as the wildcard.
                    let entries = d.entries.iter().enumerate().flat_map(|(i, &(k, v))| {
                        let v = l.shared.iter().find(|(at, _)| *at == i).map_or(v, |(_, w)| w.as_str());
                        [k, v]
                    });
                    BucketKey::new(handles.ids[0], entries)
                };
                (rule, handles, SmallVec::from_iter([(&rule.limits[0], 0, key)]))
            }
            Target::Override { rule, handles, .. } => {
                let key = BucketKey::new(handles.ids[0], std::iter::once(domain).chain(flat()));
                (rule, handles, SmallVec::from_iter([(&rule.limits[0], 0, key)]))
            }
            Target::Rules(i) => {
                let (rule, handles) = rules.rule_at(i);
                let entries = d.entries;
                let matched = match limits_for(rule, handles, entries, &self.clock) {
                    Ok(limits) => matched_in(limits, rule.per_resource(), domain, entries, Some(0)),
                    Err(block) => {
                        blocked = Some(block);
                        Matched::default()
                    }
                };
                (rule, handles, matched)
            }
        };
        let guarded = rule.breaker.is_some() || rule.concurrency.is_some();
        Some(Prepared {
            rule: Some((rule, handles)),
            unmatched: &rules.handles.unmatched,
            resource: guarded.then(|| domain.to_string()),
            guarded,
            settle: false,
            request_resource: if self.coordination.notes_takes() { domain.to_string() } else { String::new() },
            matched,
            costs: crate::request::Costs::same(d.hits),
            dry_run: d.hits == 0,
            gate: true,
            remote_breaker: None,
            remote_slot: None,
            blocked,
            scope: rules.scope_of(domain),
            priority,
            // Envoy's RLS decides by the rule's own limits: it has no way
            // to say which source paid.
            source: 0,
            more: false,
            charge: false,
            retried: false,
        })
    }
}

impl Prepared<'_> {
    /// The buckets this decision would take from.
    pub fn buckets(&self) -> impl Iterator<Item = (usize, &BucketKey)> {
        self.matched.iter().map(|(_, i, k)| (*i, k))
    }

    /// Leaves out the limits at these positions of the rule (charged by
    /// another descriptor of the same request).
    pub fn leave_out(&mut self, limits: &[usize]) {
        self.matched.retain(|(_, i, _)| !limits.contains(i));
    }
}
