//! What crosses between the decision core and Redis for breakers: probes the
//! shared breaker grants or denies, its state to adopt, outcomes to send, and
//! each breaker's window news since the last sync.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::breaker::{Call, Counts, Outcome, State};
use crate::time::Timestamp;

/// Redis's answer for a breaker whose next call needs a probe.
#[derive(Debug)]
pub enum RemoteBreaker {
    /// A probe, counted across every replica, of the shared generation.
    /// Boxed: rare, and every prepared decision carries room for this.
    Probe(Box<ProbeGrant>),
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

/// A probe the shared breaker granted: a value whose drop gives the probe
/// back (an IGNORED outcome, sent at the next flush), unless a permit took
/// it over. So a call cut off anywhere between the grant and its permit
/// (another check denies it, its caller goes away while Redis is asked)
/// never keeps a probe the round then waits for.
#[derive(Debug)]
pub struct ProbeGrant {
    resource: String,
    generation: u64,
    outbox: Arc<Outbox>,
    live: bool,
}

impl ProbeGrant {
    pub(super) fn new(resource: String, generation: u64, outbox: Arc<Outbox>) -> Self {
        ProbeGrant { resource, generation, outbox, live: true }
    }

    /// The shared generation it probes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Taken over by a permit, which reports the probe's outcome itself.
    pub fn keep(mut self) -> u64 {
        self.live = false;
        self.generation
    }
}

impl Drop for ProbeGrant {
    fn drop(&mut self) {
        if self.live {
            let resource = std::mem::take(&mut self.resource);
            let generation = self.generation;
            self.outbox.push(RemoteOutcome { resource, generation, outcome: Outcome::Ignored, slow: false });
        }
    }
}

/// A probe's outcome (or a probe given back) for the shared breaker.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteOutcome {
    pub resource: String,
    pub generation: u64,
    pub outcome: Outcome,
    pub slow: bool,
}

/// One breaker's calls since the last sync.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerNews {
    pub resource: String,
    pub calls: Counts,
    /// This replica's own window opened it.
    pub tripped: bool,
}

/// What a resource's breaker has to push, and the last shared generation adopted.
#[derive(Debug, Default)]
pub(super) struct Unsynced {
    pub(super) calls: Counts,
    pub(super) tripped: bool,
    pub(super) generation: u64,
}

impl Unsynced {
    pub(super) fn record(&mut self, call: Call, tripped: bool) {
        self.calls.add(call);
        self.tripped |= tripped;
    }
}

/// What waits to be sent to Redis: probe outcomes, strict slots to return.
#[derive(Debug)]
pub(super) struct Outbox<T = RemoteOutcome> {
    items: Mutex<Vec<T>>,
    /// Something waits: checked on every decision, so no lock when empty.
    waiting: AtomicBool,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Outbox { items: Mutex::new(Vec::new()), waiting: AtomicBool::new(false) }
    }
}

impl<T> Outbox<T> {
    pub(super) fn push(&self, o: T) {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).push(o);
        self.waiting.store(true, Ordering::Release);
    }

    pub(super) fn take(&self) -> Vec<T> {
        if !self.waiting.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.items.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(super) fn is_empty(&self) -> bool {
        !self.waiting.load(Ordering::Acquire)
    }
}
