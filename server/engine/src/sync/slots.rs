//! Concurrency slots through Redis. A `strict` concurrency limit keeps one
//! in-flight set for the fleet in Redis: a call takes a slot there under its
//! permit's id, and gives it back when the permit is returned. A
//! `replicated` one leases this replica a number of slots it may hold at
//! once, renewed every sync (see `replication::slots`).

use std::sync::Arc;
use std::time::Duration;

use super::shared::Outbox;
use crate::permit_id::PermitId;
use crate::time::Timestamp;

/// Redis's answer for a strict concurrency slot asked for one call.
#[derive(Debug)]
pub enum RemoteSlot {
    /// Boxed: rare, and every prepared decision carries room for this.
    Taken(Box<SlotGrant>),
    /// Every slot is held; one is likely back in `retry_after`.
    Full { retry_after: Duration },
}

/// What waits to be told to the fleet's in-flight set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotOp {
    /// A permit's slot is free again.
    Give { resource: String, id: PermitId },
    /// A permit issued while Redis could not be asked holds a slot until
    /// `expires_at`: the fleet counts it once Redis answers again.
    Add { resource: String, id: PermitId, expires_at: Timestamp },
}

/// A slot Redis took for a call under `id`: a value whose drop gives it
/// back, unless a permit took it over. A call cut off between the take and
/// its permit (a limit denies it, its caller goes away) never keeps a slot.
#[derive(Debug)]
pub struct SlotGrant {
    resource: String,
    id: PermitId,
    ops: Arc<Outbox<SlotOp>>,
    live: bool,
}

impl SlotGrant {
    pub(super) fn new(resource: String, id: PermitId, ops: Arc<Outbox<SlotOp>>) -> Self {
        SlotGrant { resource, id, ops, live: true }
    }

    /// Taken over by a permit of this id, which gives the slot back itself.
    pub fn keep(mut self) -> PermitId {
        self.live = false;
        self.id
    }
}

impl Drop for SlotGrant {
    fn drop(&mut self) {
        if self.live {
            self.ops.push(SlotOp::Give { resource: std::mem::take(&mut self.resource), id: self.id });
        }
    }
}
