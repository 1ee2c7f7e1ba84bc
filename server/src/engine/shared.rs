//! Breakers shared across replicas, the engine's side: what the replication
//! module pushes (window deltas, local trips, probe outcomes in an outbox) and
//! what it brings back (shared states to adopt, probe grants). No network here.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{Engine, Installed, Prepared};
use crate::breaker::{Call, Counts, Outcome, State};
use crate::events::Event;
use crate::rules::BreakerConfig;
use crate::time::Timestamp;

/// Redis's answer for a breaker whose next call needs a probe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RemoteBreaker {
    /// A probe, counted across every replica, of the shared generation.
    Probe {
        generation: u64,
    },
    /// The shared breaker admits plain calls (closed, disabled, metrics-only).
    Plain,
    Deny {
        state: State,
        retry_after: Duration,
    },
}

/// The shared breaker's state, on this replica's clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharedBreaker {
    pub generation: u64,
    pub state: State,
    pub open_until: Timestamp,
    pub openings: u32,
}

/// A probe's outcome (or a probe given back) for the shared breaker.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteOutcome {
    pub resource: String,
    pub generation: u64,
    pub outcome: Outcome,
    pub slow: bool,
}

/// One breaker's news since the last sync.
#[derive(Clone, Debug)]
pub struct BreakerSync {
    pub resource: String,
    pub config: BreakerConfig,
    pub calls: Counts,
    /// This replica's own window opened it.
    pub tripped: bool,
}

/// What a guarded resource has to push.
#[derive(Debug, Default)]
pub struct Unsynced {
    calls: Counts,
    tripped: bool,
    /// The last shared generation adopted.
    generation: u64,
}

#[derive(Debug, Default)]
pub struct Outbox {
    items: Mutex<Vec<RemoteOutcome>>,
    /// Something waits: checked on every decision, so no lock when empty.
    waiting: AtomicBool,
}

impl Outbox {
    pub fn push(&self, o: RemoteOutcome) {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).push(o);
        self.waiting.store(true, Ordering::Release);
    }

    pub fn take(&self) -> Vec<RemoteOutcome> {
        if !self.waiting.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.items.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn is_empty(&self) -> bool {
        !self.waiting.load(Ordering::Acquire)
    }
}

impl Unsynced {
    pub fn record(&mut self, call: Call, tripped: bool) {
        self.calls.add(call);
        self.tripped |= tripped;
    }
}

impl Engine {
    /// Whether the next call on this resource needs Redis to grant a probe
    /// (the rule `p` matched has a breaker, in OPEN past its wait or HALF_OPEN).
    pub fn needs_remote_probe(&self, p: &Prepared<'_>, resource: &str) -> bool {
        if !self.replica.up() || !p.has_breaker() {
            return false;
        }
        let now = self.clock.now();
        self.guards.get(resource).is_some_and(|g| g.current_breaker().as_ref().is_some_and(|b| b.needs_probe(now)))
    }

    /// Probe outcomes and returned probes waiting to be sent to Redis.
    pub fn take_outbox(&self) -> Vec<RemoteOutcome> {
        self.outbox.take()
    }

    pub fn outbox_is_empty(&self) -> bool {
        self.outbox.is_empty()
    }

    /// Every breaker's window since the last sync (now reset).
    pub fn breaker_news(&self, rules: &Installed) -> Vec<BreakerSync> {
        self.guards
            .all()
            .into_iter()
            .filter_map(|(resource, g)| {
                let config = rules.rules.find(&resource)?.breaker.clone()?;
                let mut u = g.unsynced.lock().unwrap_or_else(|e| e.into_inner());
                let news = BreakerSync { resource, config, calls: u.calls, tripped: u.tripped };
                (u.calls, u.tripped) = (Counts::default(), false);
                Some(news)
            })
            .collect()
    }

    /// Takes the shared state of a resource's breaker when it is newer than
    /// the last one taken.
    pub fn adopt_breaker(&self, rules: &Installed, resource: &str, shared: SharedBreaker) {
        let Some(cfg) = rules.rules.find(resource).and_then(|r| r.breaker.as_ref()) else { return };
        let g = self.guards.get_or_create(resource);
        {
            let mut u = g.unsynced.lock().unwrap_or_else(|e| e.into_inner());
            if shared.generation <= u.generation {
                return;
            }
            u.generation = shared.generation;
        }
        let now = self.clock.now();
        let transition = g
            .breaker(Some(cfg))
            .as_mut()
            .and_then(|b| b.adopt(cfg, now, shared.state, shared.open_until, shared.openings));
        if let Some(transition) = transition {
            self.events.publish(Event::Breaker { resource: resource.into(), transition });
        }
    }
}
