//! The decision core: rules in force, buckets, and the all-or-nothing check of
//! several limits. No network, no clock of its own (time comes from the
//! injected [`Clock`](crate::time::Clock)), no generated code.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::{ArcSwap, Guard};

use crate::degradation::Degradation;
use crate::events::{Event, Events};
use crate::limiter::Algorithm;
use crate::metrics::RuleMetrics;
use crate::rules::{LimitId, RuleSet};
use crate::store::Buckets;
use crate::time::SharedClock;

mod admit;
mod decide;
mod guard;
mod pending;
mod permits;
mod replica;
mod report;
pub mod request;
mod shared;

pub use admit::{DEFAULT_PERMIT_TTL, Denial};
pub use decide::{Answer, LimitReport, Prepared, Verdict};
pub use pending::{Pending, Step, decided_by_redis};
pub use replica::{Dirty, ReplicaView, SyncItem};
pub use report::{Level, Reported, Snapshot};
pub use request::{Descriptors, Request, RequestError};
pub use shared::{BreakerSync, RemoteBreaker, RemoteOutcome, SharedBreaker};

/// The rules in force, with where they came from.
#[derive(Debug)]
pub struct Installed {
    pub rules: RuleSet,
    /// The text they were read from.
    pub yaml: String,
    /// Increases with every install.
    pub version: u64,
    /// A file path, "embedded" or "admin".
    pub source: String,
    pub loaded_at: SystemTime,
    /// Every limit by id: (rule index, limit index).
    by_id: HashMap<LimitId, (usize, usize)>,
    /// Decision counters, one per rule.
    metrics: Vec<RuleMetrics>,
}

pub struct Engine {
    rules: ArcSwap<Installed>,
    guards: guard::Guards,
    permits: permits::Permits,
    events: Events,
    degradation: Mutex<Degradation>,
    /// The degradation level in force, for the hot path.
    level: AtomicU32,
    replica: ReplicaView,
    dirty: replica::DirtyMap,
    outbox: shared::Outbox,
    /// Decision counters of requests no rule matched.
    unmatched: RuleMetrics,
    buckets: Buckets,
    clock: SharedClock,
    /// Limit ids by (rule, limit, algorithm), kept across reloads so that an
    /// unchanged limit keeps its buckets. Also serialises installs.
    ids: Mutex<HashMap<(String, String, &'static str), LimitId>>,
}

/// Where rules come from and how the store is bounded.
pub struct EngineConfig {
    pub max_keys: usize,
}

// === impl Installed ===

impl Installed {
    /// The algorithm of a limit still in force.
    pub fn algorithm(&self, id: LimitId) -> Option<&Algorithm> {
        self.limit(id).map(|(_, l)| &l.algorithm)
    }

    /// A limit still in force, with its rule.
    pub fn limit(&self, id: LimitId) -> Option<(&crate::rules::Rule, &crate::rules::Limit)> {
        let &(r, l) = self.by_id.get(&id)?;
        let rule = &self.rules.rules()[r];
        Some((rule, &rule.limits[l]))
    }
}

// === impl Engine ===

impl Engine {
    pub fn new(config: EngineConfig, clock: SharedClock) -> Self {
        let empty = Installed {
            rules: RuleSet::default(),
            yaml: String::new(),
            version: 0,
            source: String::new(),
            loaded_at: SystemTime::now(),
            by_id: HashMap::new(),
            metrics: Vec::new(),
        };
        Engine {
            rules: ArcSwap::from_pointee(empty),
            guards: guard::Guards::default(),
            permits: permits::Permits::default(),
            events: Events::default(),
            degradation: Mutex::new(Degradation::default()),
            level: AtomicU32::new(0),
            replica: ReplicaView::default(),
            dirty: replica::DirtyMap::default(),
            outbox: shared::Outbox::default(),
            unmatched: RuleMetrics::unmatched(),
            buckets: Buckets::new(config.max_keys),
            clock,
            ids: Mutex::new(HashMap::new()),
        }
    }

    /// The rules in force; hold the guard only for the length of one decision.
    pub fn rules(&self) -> Guard<Arc<Installed>> {
        self.rules.load()
    }

    /// The rules in force, to hold across awaits.
    pub fn rules_full(&self) -> Arc<Installed> {
        self.rules.load_full()
    }

    /// Swaps in a new rule set atomically and returns its version. Limits that
    /// keep their resource, name and algorithm keep their buckets.
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
        let version = self.rules.load().version + 1;
        let metrics = rules.rules().iter().map(RuleMetrics::new).collect();
        let installed =
            Installed { rules, yaml, version, source: source.clone(), loaded_at: SystemTime::now(), by_id, metrics };
        self.rules.store(Arc::new(installed));
        drop(ids);
        self.events.publish(Event::Rules { version, source });
        version
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

    /// Permits handed out and not yet returned or expired.
    pub fn permits_in_flight(&self) -> usize {
        self.permits.len()
    }

    fn degradation(&self) -> std::sync::MutexGuard<'_, Degradation> {
        self.degradation.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets idle buckets and buckets of limits no longer in force.
    pub fn sweep(&self) -> usize {
        let rules = self.rules.load_full();
        self.buckets.sweep(self.clock.now(), |id| rules.algorithm(id))
    }
}

/// Runs [`Engine::tick`] every `every` until the engine is dropped.
pub fn spawn_ticker(engine: &Arc<Engine>, every: Duration) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(engine);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(engine) = weak.upgrade() else { return };
            engine.tick();
        }
    })
}

/// Runs [`Engine::sweep`] every `every` until the engine is dropped.
pub fn spawn_sweeper(engine: &Arc<Engine>, every: Duration) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(engine);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(engine) = weak.upgrade() else { return };
            let removed = tokio::task::spawn_blocking(move || engine.sweep()).await.unwrap_or(0);
            tracing::debug!(removed, "swept idle buckets");
        }
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod guard_tests;
