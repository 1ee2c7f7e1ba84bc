//! Floodgate's engine: the decisions by the rules in force: buckets, guards
//! (breakers, concurrency limits, shedding), permits, and the all-or-nothing
//! check of several limits. No network, no async runtime, no clock of its own
//! (time comes from the injected [`Clock`](crate::time::Clock)), no generated
//! code.
//!
//! - [`Engine`]: prepare and decide (one step, or two when Redis decides
//!   strict limits); its other jobs are handles: [`Engine::control`] (what is
//!   in force), [`Engine::views`] (what is shown), [`Engine::leasing`],
//!   [`Engine::charges`] and [`Engine::outcomes`].
//! - [`Coordination`]: what a decision asks of the other replicas;
//!   [`Alone`] without a shared store, [`sync::Replica`] with Redis.
//! - [`request`]: what a caller may ask, checked before anything is decided;
//!   [`guards`]: breakers, concurrency slots and permits per resource;
//!   [`report`], [`settle`], [`lease`]: what comes back after a decision.
//! - [`degradation`]: levels per system; [`events`]: transitions for Watch;
//!   [`overrides`]: limits set at run time; [`metrics`]: every metric's name.
//! - [`concurrency`], [`hottest`], [`what_if`]: views for Admin and the
//!   console.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::Guard;

use floodgate_core::{adaptive, breaker, digest, hitters, limiter, recommend, store, time};
use floodgate_rules as rules;

use crate::events::{Event, Events};
use crate::rules::RuleSet;
use crate::store::Buckets;
pub use crate::sync::{Alone, Coordination};
use crate::time::{SharedClock, Timestamp};

pub mod concurrency;
mod counters;
mod decide;
pub mod degradation;
mod envoy_sizes;
pub mod events;
pub mod guards;
mod handles;
pub mod hottest;
mod installed;
pub mod lease;
pub mod metrics;
pub mod overrides;
mod permit_id;
pub mod report;
pub mod request;
mod rls;
pub mod settle;
pub mod sync;
pub mod what_if;

pub use counters::Tally;
pub use decide::{Answer, LimitReport, Pending, Prepared, Remote, Step, Verdict};
pub use guards::{DEFAULT_PERMIT_TTL, Denial, PermitId};
pub use installed::{EARLIER_KEPT, Earlier, EnvoyInstalled, Installed};
pub use report::{LevelTarget, Report, Reported, Snapshot};
pub use request::{Descriptors, ErrorKind, Request, RequestError};
pub use rls::{RlsDescriptor, Target};

pub use crate::degradation::Level;

pub struct Engine {
    rules: installed::RulesSlot,
    buckets: Buckets,
    guards: guards::Guards,
    permits: guards::Permits,
    /// Estimates waiting for their actual cost.
    settlements: settle::Settlements,
    /// Recent lease holders per bucket, for fair shares.
    leases: lease::Leases,
    events: Events,
    clock: SharedClock,
    /// How this replica shares its state with the others ([`Alone`] until
    /// [`Engine::with_coordination`]).
    coordination: Arc<dyn Coordination>,
}

/// The engine seen for one job. Each job's methods live on its own type, so
/// that the engine's own methods are the decisions: [`Engine::control`]
/// changes what is in force (rules, overrides, breaker states, levels),
/// [`Engine::views`] reads what the console, Admin and the CLI show, and
/// [`Engine::leasing`] hands out and takes back leases,
/// [`Engine::outcomes`] takes the outcomes of admitted calls, and
/// [`Engine::charges`] counts usage after the call. A job handle only
/// borrows the engine; it dereferences to it for the state they share.
macro_rules! job {
    ($(#[$doc:meta])* $name:ident, $method:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name<'e>(&'e Engine);

        impl std::ops::Deref for $name<'_> {
            type Target = Engine;

            fn deref(&self) -> &Engine {
                self.0
            }
        }

        impl Engine {
            $(#[$doc])*
            pub fn $method(&self) -> $name<'_> {
                $name(self)
            }
        }
    };
}

job!(
    /// What is in force: rules, overrides, breaker states, degradation levels.
    Control,
    control
);
job!(
    /// What the console, Admin and the CLI read: breakers, levels, concurrency
    /// limits, permits, the hottest keys.
    Views,
    views
);
job!(
    /// Leases: planned, taken and given back.
    Leasing,
    leasing
);
job!(
    /// Usage counted after the call: charges, and estimates settled with the
    /// actual cost.
    Charges,
    charges
);
job!(
    /// What comes back after a decision: outcomes reported, permits expired,
    /// and the tick that moves breakers and levels on.
    Outcomes,
    outcomes
);

/// How the engine is built.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// The most buckets held in memory (least recently used evicted first).
    pub max_keys: usize,
}

// === impl Engine ===

impl Engine {
    pub fn new(config: EngineConfig, clock: SharedClock) -> Self {
        Engine {
            rules: installed::RulesSlot::new(),
            buckets: Buckets::new(config.max_keys),
            guards: guards::Guards::default(),
            permits: guards::Permits::default(),
            settlements: settle::Settlements::default(),
            leases: lease::Leases::default(),
            events: Events::default(),
            clock,
            coordination: Arc::new(Alone),
        }
    }

    /// Shares this engine's state through `coordination` (a [`sync::Replica`]
    /// that the replication task carries to and from Redis).
    pub fn with_coordination(mut self, coordination: Arc<dyn Coordination>) -> Self {
        self.coordination = coordination;
        self
    }

    /// Bounds the bytes of the bucket keys held (`--max-key-bytes`) besides
    /// their number.
    pub fn with_max_key_bytes(mut self, max_bytes: usize) -> Self {
        self.buckets.set_max_bytes(max_bytes);
        self
    }

    /// The rules in force; hold the guard only for the length of one decision.
    pub fn rules(&self) -> Guard<Arc<Installed>> {
        self.rules.load()
    }

    /// The rules in force, to hold across awaits.
    pub fn rules_full(&self) -> Arc<Installed> {
        self.rules.load_full()
    }

    /// The rules files in force before the one in force now, newest first
    /// (at most [`EARLIER_KEPT`]).
    pub fn earlier_rules(&self) -> Vec<Earlier> {
        self.rules.earlier()
    }

    pub fn buckets(&self) -> &Buckets {
        &self.buckets
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub fn events(&self) -> &Events {
        &self.events
    }

    /// Forgets idle buckets and buckets of limits no longer in force.
    pub fn sweep(&self) -> usize {
        let rules = self.rules.load_full();
        let now = self.clock.now();
        self.expire_estimates(now);
        self.leases.forget(now);
        let secs = now.as_nanos() / 1_000_000_000;
        for i in 0..rules.rules.rules().len() {
            let (rule, handles) = rules.rule_at(i);
            for limit in rule.limits.iter().filter(|l| l.history) {
                if let Some(t) = handles.recorded(rule, &limit.name) {
                    t.sweep(secs);
                }
            }
        }
        self.buckets.sweep(now, |id| rules.algorithm(id))
    }
}

impl Views<'_> {
    /// The series of upstream's per-descriptor stats (Envoy's RLS).
    pub fn upstream_stats(&self) -> &Arc<crate::metrics::upstream::Registry> {
        self.rules.upstream()
    }
}

impl Views<'_> {
    /// Permits handed out and not yet returned or expired.
    pub fn permits_in_flight(&self) -> usize {
        self.permits.len()
    }

    /// The guarded state of a prepared item's resource (made for its rule).
    pub fn guarded(&self, p: &Prepared<'_>) -> Option<Arc<guards::Guarded>> {
        let (rule, _) = p.rule?;
        Some(self.guards.get_or_create(p.resource(), rule))
    }

    /// The permits issued here that hold a strict slot, by resource (those
    /// of a limit made strict since they were issued included).
    pub fn strict_slots(&self, rules: &Installed) -> std::collections::HashMap<String, Vec<(PermitId, Timestamp)>> {
        let strict =
            |resource: &str| rules.rules.find(resource).and_then(|r| r.concurrency).is_some_and(|c| c.sync.is_strict());
        self.permits.strict_slots(strict)
    }

    /// Every guarded resource, sorted by name.
    pub fn guards_all(&self) -> Vec<(String, Arc<guards::Guarded>)> {
        self.guards.all()
    }

    /// When a concurrency slot of `resource` is likely to come back.
    pub fn slot_free_in(&self, resource: &str, max: u32) -> Duration {
        self.guards.get(resource).map_or(Duration::from_millis(50), |g| g.slot_free_in(max))
    }

    /// Every resource's guards (breaker, concurrency), sorted by name.
    pub fn all_guarded(&self) -> Vec<(String, Arc<guards::Guarded>)> {
        self.guards.all()
    }

    /// A resource's concurrency limit now (an adaptive one moves).
    pub fn concurrency_limit(&self, resource: &str, c: &crate::rules::Concurrency) -> u32 {
        self.guards.get(resource).map_or_else(|| c.initial_limit(), |g| g.limit(c))
    }
}

impl Control<'_> {
    /// Swaps in a new rule set atomically and returns its version. Limits that
    /// keep their resource, name and algorithm keep their buckets.
    pub fn install(&self, rules: RuleSet, yaml: String, source: String) -> u64 {
        let version = self.rules.install(rules, yaml, source.clone());
        // The rules in force: the file's, with Sentinel's and the overrides merged.
        let patterns = self.rules.load().rules.patterns().into();
        self.events.publish(Event::Rules { version, source, patterns });
        version
    }

    /// Says that rules read from `source` were refused (`error` is why);
    /// nothing changes in the rules in force.
    pub fn refused(&self, source: String, error: &str) {
        // A refusal lists every error in the file: enough to act on, but
        // not a whole megabyte of them in every console snapshot.
        let mut error = error.to_string();
        if what_if::truncate(&mut error, 4096) {
            error.push_str(" ...");
        }
        self.events.publish(Event::RulesRefused { source, error });
    }

    /// Installs Sentinel's rules read from `source` beside the file's.
    pub fn install_sentinel(&self, rules: crate::rules::sentinel::SentinelRules, text: String, source: String) -> u64 {
        let version = self.rules.install_sentinel(rules, text, source.clone());
        let patterns = self.rules.load().rules.patterns().into();
        self.events.publish(Event::Rules { version, source: format!("sentinel:{source}"), patterns });
        version
    }

    /// Installs other overrides set at run time beside the rules in force;
    /// `change` says what changed, for Watch. With 100,000 overrides this
    /// re-merges the rules for about half a second: call it off the async
    /// workers.
    pub fn install_overrides(&self, table: Arc<crate::overrides::Table>, change: crate::overrides::Change) -> u64 {
        let count = table.len();
        let version = self.rules.install_runtime(table);
        ::metrics::gauge!(crate::metrics::OVERRIDES).set(count as f64);
        let crate::overrides::Change { set, deleted, expired } = change;
        self.events.publish(Event::Overrides { version, set, deleted, expired });
        version
    }

    /// Installs an envoyproxy/ratelimit configuration read from `source` (a
    /// directory, or an xDS control plane and the `version` it named),
    /// beside the rules in force.
    pub fn install_envoy(
        &self,
        config: crate::rules::envoy::EnvoyConfig,
        text: String,
        source: String,
        version: String,
    ) -> u64 {
        let version = self.rules.install_envoy(config, text, source.clone(), version);
        let patterns = self.rules.load().rules.patterns().into();
        self.events.publish(Event::Rules { version, source: format!("envoy:{source}"), patterns });
        version
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod adaptive_tests;
#[cfg(test)]
mod guard_tests;
#[cfg(test)]
mod over_limit_tests;
#[cfg(test)]
mod sentinel_tests;

#[cfg(test)]
mod system_tests;

#[cfg(test)]
mod waterfall_tests;
