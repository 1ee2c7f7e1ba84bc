//! How this replica shares its limits, breakers and concurrency slots with
//! the other replicas. The engine asks one [`Coordination`] at the few points
//! of a decision where the answer depends on the fleet; it never asks
//! whether there is a fleet.
//!
//! Two implementations exist:
//! - [`Alone`]: a server without a shared store (memory only). Every limit
//!   is decided here, nothing is noted for anyone, and a replica's share of
//!   a limit is the whole limit.
//! - [`Replica`](crate::sync::Replica): a server that shares its state
//!   through Redis. It keeps what the replication task (in the
//!   `floodgate-redis` crate) pushes to and pulls from Redis: what
//!   replicated buckets took, strict debts, breaker news, slot operations.

use std::time::Duration;

use crate::breaker::Call;
use crate::limiter::Algorithm;
use crate::rules::{Concurrency, Limit, OnRedisError, SyncMode};
use crate::store::BucketKey;
use crate::sync::SlotGrant;
use crate::sync::{RemoteOutcome, RemoteSlot, SlotOp};
use crate::time::Timestamp;

/// What the decision path asks of the fleet. Every method answers at once:
/// nothing here waits on the network.
pub trait Coordination: Send + Sync + 'static {
    /// Whether the shared store decides `limit` (strict limits, and sliding
    /// logs, which cannot be shared approximately). Such a limit is decided
    /// in two steps: here, then by the store.
    fn decides(&self, limit: &Limit) -> bool;

    /// Whether the shared store answered last time. `false` without one.
    fn store_up(&self) -> bool;

    /// Whether the store is known and away: strict limits then follow
    /// their `on_redis_error`.
    fn in_outage(&self) -> bool;

    /// Whether decisions note what they take for the fleet, so a decision
    /// keeps its resource's name for them.
    fn notes_takes(&self) -> bool;

    /// This replica's share of a limit while replicas cannot agree (1.0
    /// alone).
    fn share(&self) -> f64;

    /// Notes units a limit took here (negative: gave back).
    fn note_take(&self, limit: &Limit, key: &BucketKey, resource: &str, units: i64, now: Timestamp);

    /// Notes units a strict bucket admitted here while the store could not
    /// be asked (negative: gave back): owed to the store.
    fn admitted_here(&self, key: &BucketKey, resource: &str, units: i64, now: Timestamp);

    /// Where a strict bucket decided here during an outage starts: what the
    /// store last said it had left (`None`: it never said). The bucket is
    /// remembered, to be dropped when the outage ends.
    fn outage_start(&self, key: &BucketKey, now: Timestamp) -> Option<f64>;

    /// What the store last said a bucket it decides had left, when this
    /// replica last heard (for answers that did not ask it: a call another
    /// limit denied first). `None` when it never said.
    fn last_remaining(&self, _key: &BucketKey) -> Option<u64> {
        None
    }

    /// How many calls a concurrency limit of `limit` slots lets this
    /// replica hold for one call, given the store's answer `slot`.
    fn slots(&self, c: &Concurrency, limit: u32, slot: Option<RemoteSlot>) -> Slots;

    /// A probe outcome (or a probe given back) to send to the shared breaker.
    fn send_outcome(&self, outcome: RemoteOutcome);

    /// A call the local breaker of `resource` recorded.
    fn record_call(&self, resource: &str, call: Call, tripped: bool);

    /// A strict concurrency slot to give back to (or add to) the fleet.
    fn push_slot_op(&self, op: SlotOp);

    /// Forgets breakers no longer guarded here.
    fn retain_breakers(&self, guarded: &dyn Fn(&str) -> bool);
}

/// A server alone: nothing is shared.
#[derive(Debug, Default)]
pub struct Alone;

impl Coordination for Alone {
    fn decides(&self, _: &Limit) -> bool {
        false
    }

    fn store_up(&self) -> bool {
        false
    }

    fn in_outage(&self) -> bool {
        false
    }

    fn notes_takes(&self) -> bool {
        false
    }

    fn share(&self) -> f64 {
        1.0
    }

    fn note_take(&self, _: &Limit, _: &BucketKey, _: &str, _: i64, _: Timestamp) {}

    fn admitted_here(&self, _: &BucketKey, _: &str, _: i64, _: Timestamp) {}

    fn outage_start(&self, _: &BucketKey, _: Timestamp) -> Option<f64> {
        None
    }

    fn slots(&self, _: &Concurrency, limit: u32, _: Option<RemoteSlot>) -> Slots {
        Slots::Here(Some(limit))
    }

    fn send_outcome(&self, _: RemoteOutcome) {}

    fn record_call(&self, _: &str, _: Call, _: bool) {}

    fn push_slot_op(&self, _: SlotOp) {}

    fn retain_breakers(&self, _: &dyn Fn(&str) -> bool) {}
}

/// Whether the store decides `limit` when limits are shared: strict limits,
/// and replicated sliding logs. A shadow limit never is: it enforces
/// nothing, and a strict script enforces all it is given.
pub fn decided_by_store(limit: &Limit) -> bool {
    if limit.shadow {
        return false;
    }
    match limit.sync {
        SyncMode::Strict => true,
        SyncMode::Replicated => matches!(limit.algorithm, Algorithm::SlidingWindowLog(_)),
        SyncMode::Local => false,
    }
}

/// The slots a concurrency limit gives when limits are shared: its `sync`
/// with the store's answer, or its `on_redis_error` while the store cannot
/// answer. `live` is the number of live replicas.
pub(crate) fn shared_slots(c: &Concurrency, limit: u32, slot: Option<RemoteSlot>, up: bool, live: u32) -> Slots {
    let outage = match c.on_redis_error {
        // This replica's share of the fleet's slots, at least one.
        OnRedisError::Local => Some(limit.div_ceil(live)),
        OnRedisError::Allow => None,
        OnRedisError::Deny => Some(0),
    };
    match c.sync {
        SyncMode::Local => Slots::Here(Some(limit)),
        SyncMode::Strict => match slot {
            Some(RemoteSlot::Taken(grant)) => Slots::Taken(grant),
            Some(RemoteSlot::Full { retry_after }) => Slots::Full(retry_after),
            // The store answers but did not take a slot in time (it is
            // slow): denied, rather than decided as if it were away.
            None if up => Slots::Full(Duration::from_millis(100)),
            None => Slots::Owed(outage),
        },
        SyncMode::Replicated if up => Slots::Leased,
        SyncMode::Replicated => Slots::Here(outage),
    }
}

/// How many calls a resource's concurrency limit lets this replica hold,
/// as the decision path worked it out from the rule's `sync`.
#[derive(Debug)]
pub enum Slots {
    /// At most this many here (`None`: no cap): a `local` limit, a server
    /// without Redis, or `on_redis_error` while Redis cannot answer.
    Here(Option<u32>),
    /// A `replicated` limit while Redis answers: this replica's lease while
    /// it is fresh, else nothing (the lease is renewed before deciding).
    Leased,
    /// A `strict` limit Redis could not be asked about: the outage policy's
    /// cap; a permit given holds a slot Redis is told of once it answers.
    Owed(Option<u32>),
    /// A `strict` limit: Redis took a slot for this call.
    Taken(Box<SlotGrant>),
    /// A `strict` limit: every slot of the fleet is held.
    Full(Duration),
}
