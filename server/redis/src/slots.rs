//! Concurrency limits through Redis (SPEC section 5).
//!
//! - `strict`: one in-flight set for the fleet (slot.lua). A call takes a
//!   slot there under its permit's id before it is decided; the permit gives
//!   it back when it is reported or expires. Exact across replicas.
//! - `replicated`: each replica leases a number of slots (slot_lease.lua)
//!   and decides from memory within it. Redis never leases out more than
//!   `max_in_flight` in all, and a replica takes slots under a lease only
//!   while it is fresh ([`lease_ttl`]), so the fleet stays within the limit
//!   while Redis answers. A replica whose lease cannot take a call renews it
//!   at once; every sync shrinks an idle replica's lease to what it holds.
//! - While Redis cannot answer, `on_redis_error` decides (engine side).

use super::Limits;
use floodgate_engine::Coordination;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::limits::lease_ttl;
use super::scripts::{ScriptName, slot_keys};
use super::wire::{self, Answered};
use floodgate_engine::guards::{Guarded, PermitId};
use floodgate_engine::sync::{RemoteSlot, SlotOp};
use floodgate_engine::{Installed, Prepared};
use floodgate_rules::Concurrency;

/// Strict permits this close to their expiry are not put back.
const REASSERT_MARGIN: Duration = Duration::from_millis(250);

/// Why a lease is renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Renewal {
    /// A call found no free slot under it.
    Short,
    /// The periodic sync.
    Sync,
}

/// A renewal over, whatever became of it: the next may go out.
struct LeaseLanding<'a> {
    g: &'a Guarded,
    landed: &'a tokio::sync::Notify,
}

impl Drop for LeaseLanding<'_> {
    fn drop(&mut self) {
        self.g.end_lease_sync();
        self.landed.notify_waiters();
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

impl Limits<'_> {
    /// Takes a strict slot in Redis for every item that needs one,
    /// concurrently. An item left without an answer (Redis is away, or
    /// permits issued without it are not counted there yet) follows its
    /// limit's `on_redis_error`.
    pub(super) async fn ask_slots(&self, prepared: &mut [Prepared<'_>]) {
        let wanted: Vec<(usize, String, Concurrency)> = (0..prepared.len())
            .filter_map(|i| {
                let c = prepared[i].concurrency().filter(|c| c.sync.is_strict())?;
                Some((i, prepared[i].resource().to_string(), *c))
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        // New rules may have made a limit strict: the calls in flight here
        // join the set before anything is asked of it.
        if self.rules_changed(self.engine.rules().version) {
            self.reassert_slots().await;
        }
        if self.sync().adds_owed() {
            self.flush_slot_ops().await;
        }
        if !self.sync().up() || self.sync().adds_owed() {
            return;
        }
        let answers = join_all(wanted.iter().map(|(_, r, c)| self.take_slot_detached(r.clone(), *c))).await;
        for ((i, ..), answer) in wanted.into_iter().zip(answers) {
            if let Some(answer) = answer {
                prepared[i].set_remote_slot(answer);
            }
        }
    }

    /// On a task of its own: a slot whose caller went away is given back as
    /// its grant drops there.
    async fn take_slot_detached(&self, resource: String, c: Concurrency) -> Option<RemoteSlot> {
        self.detached(move |me| async move { me.limits().take_slot(resource, c).await }).await.flatten()
    }

    /// A script that ran past its deadline (a slow Redis: it took nothing)
    /// is asked again while a call may wait on a slow Redis.
    async fn take_slot(&self, resource: String, c: Concurrency) -> Option<RemoteSlot> {
        let id = PermitId::random();
        let clock = self.engine.clock();
        let started = clock.now();
        let [set, _] = slot_keys(&resource);
        let max = self.engine.views().concurrency_limit(&resource, &c);
        loop {
            let deadline = self.sync().redis_time(clock.now().saturating_add(self.config.timeout));
            let mut invocation = self.scripts.get(ScriptName::Slot).prepare_invoke();
            invocation.key(&set).arg(1).arg(id.to_string()).arg(millis(c.permit_ttl)).arg(max);
            invocation.arg(deadline);
            match self.run(ScriptName::Slot, invocation, wire::parse_slot).await {
                Some(Answered::Done(Ok(()))) => {
                    return Some(RemoteSlot::Taken(Box::new(self.sync().slot_granted(&resource, id))));
                }
                Some(Answered::Done(Err(first_expiry))) => {
                    let guess = self.engine.views().slot_free_in(&resource, max);
                    return Some(RemoteSlot::Full { retry_after: guess.min(first_expiry) });
                }
                Some(Answered::TooLate) if clock.now().saturating_since(started) < self.slow_limit() => {
                    metrics::counter!(floodgate_engine::metrics::REDIS_LATE).increment(1);
                }
                _ => {
                    // It may have run with its answer lost: given back, so
                    // that the slot is not held by nobody until it expires.
                    self.sync().push_slot_op(SlotOp::Give { resource, id });
                    return None;
                }
            }
        }
    }

    /// Tells the fleet's in-flight sets of the slots given back, and of
    /// those taken while Redis could not be asked, in order. What could not
    /// be sent goes again at the next flush. One flush at a time, on a task
    /// of its own: a caller that goes away loses none of them.
    pub(super) async fn flush_slot_ops(&self) {
        self.slot_work(false).await;
    }

    /// Whether the rules in force are not the ones this was last asked with
    /// (a limit may have become strict: the calls held here join its set).
    pub(super) fn rules_changed(&self, version: u64) -> bool {
        self.rules_seen.swap(version, std::sync::atomic::Ordering::AcqRel) != version
    }

    /// Every second: each strict permit held here is put back in its set,
    /// should Redis have lost it (restarted empty, or failed over to a
    /// replica that had not heard of it).
    pub(super) async fn reassert_slots(&self) {
        self.slot_work(true).await;
    }

    async fn slot_work(&self, reassert: bool) {
        self.detached(move |me| async move { me.limits().slot_work_here(reassert).await }).await;
    }

    async fn slot_work_here(&self, reassert: bool) {
        let _one = self.slot_flush.lock().await;
        if reassert {
            let rules = self.engine.rules_full();
            for (resource, held) in self.engine.views().strict_slots(&rules) {
                for chunk in held.chunks(500) {
                    if !self.add_slots(&resource, chunk).await {
                        return;
                    }
                }
            }
        }
        let ops = self.sync().take_slot_ops();
        for (i, op) in ops.iter().enumerate() {
            if !self.slot_op(op).await {
                self.sync().put_back_slot_ops(ops[i..].to_vec());
                return;
            }
            if matches!(op, SlotOp::Add { .. }) {
                self.sync().added();
            }
        }
    }

    /// Puts permits held here back in a strict set (where they are, their
    /// expiry stays). Not those about to expire: Redis may have expired one
    /// already (its expiry there is counted from the take, a little before
    /// the permit's here), and its slot be taken again.
    async fn add_slots(&self, resource: &str, held: &[(PermitId, floodgate_core::time::Timestamp)]) -> bool {
        let soon = self.engine.clock().now().saturating_add(REASSERT_MARGIN);
        let redis_ms = |t: floodgate_core::time::Timestamp| self.sync().redis_time(t) / 1000;
        let mut members = Vec::with_capacity(held.len() * 2);
        for (id, expires_at) in held.iter().filter(|(_, e)| *e > soon) {
            members.push(redis_ms(*expires_at).to_string());
            members.push(id.to_string());
        }
        if members.is_empty() {
            return true;
        }
        let [set, _] = slot_keys(resource);
        let added: Option<i64> = self
            .call("slot_reassert", |mut h| async move {
                redis::cmd("ZADD").arg(set).arg("NX").arg(members).query_async(&mut h).await
            })
            .await;
        if added.is_some_and(|n| n > 0) {
            tracing::warn!(resource, added, "strict slots held here were missing from Redis: put back");
        }
        added.is_some()
    }

    async fn slot_op(&self, op: &SlotOp) -> bool {
        let now = self.engine.clock().now();
        let (resource, id, code, ttl) = match op {
            SlotOp::Give { resource, id } => (resource, id, 2, 0),
            SlotOp::Add { resource, id, expires_at } => {
                let left = expires_at.saturating_since(now) / 1_000_000;
                if left == 0 {
                    return true;
                }
                (resource, id, 3, left)
            }
        };
        let [set, _] = slot_keys(resource);
        let mut invocation = self.scripts.get(ScriptName::Slot).prepare_invoke();
        invocation.key(set).arg(code).arg(id.to_string()).arg(ttl).arg(0).arg(0);
        matches!(self.run(ScriptName::Slot, invocation, wire::parse_slot).await, Some(Answered::Done(_)))
    }

    /// Renews the lease of every replicated concurrency limit whose lease
    /// cannot take the item's call (none yet, stale, or every slot of it in
    /// use), concurrently, before the items are decided.
    pub(super) async fn ensure_leases(&self, prepared: &[Prepared<'_>]) {
        let now = self.engine.clock().now();
        let short: Vec<(String, Arc<Guarded>, Concurrency)> = prepared
            .iter()
            .filter_map(|p| {
                let c = p.concurrency().filter(|c| c.sync.is_replicated())?;
                let g = self.engine.views().guarded(p)?;
                let short = g.lease_at(now).is_none_or(|lease| g.in_flight() >= lease);
                short.then(|| (p.resource().to_string(), g, *c))
            })
            .collect();
        if short.is_empty() {
            return;
        }
        join_all(short.into_iter().map(|(r, g, c)| self.renew_detached(r, g, c, Renewal::Short))).await;
    }

    /// Every sync: the lease of each replicated concurrency limit in use
    /// here, renewed at what it holds plus a little room if calls came.
    pub(super) async fn sync_leases(&self, rules: &Installed) {
        for (resource, g) in self.engine.views().guards_all() {
            let Some(c) = rules.rules.find(&resource).and_then(|r| r.concurrency) else { continue };
            if !c.sync.is_replicated() || (g.reserved() == 0 && g.in_flight() == 0 && !g.wanted()) {
                continue;
            }
            self.renew_lease(&resource, &g, c, Renewal::Sync).await;
        }
    }

    async fn renew_detached(&self, resource: String, g: Arc<Guarded>, c: Concurrency, why: Renewal) {
        self.detached(move |me| async move { me.limits().renew_lease(&resource, &g, c, why).await }).await;
    }

    /// One renewal of a lease; one at a time per resource. A call short of
    /// a slot while another renewal is out waits for that one to land.
    async fn renew_lease(&self, resource: &str, g: &Guarded, c: Concurrency, why: Renewal) {
        if !g.begin_lease_sync() {
            if why == Renewal::Short {
                let landed = self.landed.notified();
                if g.lease_syncing() {
                    let _ = tokio::time::timeout(Duration::from_nanos(self.slow_limit()), landed).await;
                }
            }
            return;
        }
        let _landing = LeaseLanding { g, landed: &self.landed };
        let sync = self.sync();
        let sent = self.engine.clock().now();
        let used = g.in_flight();
        let lease = g.lease_at(sent).unwrap_or(0);
        let max = g.limit(&c);
        let room = (max / (4 * sync.live())).max(1);
        let want = match why {
            // Short of slots: twice as many (fewer round trips to ramp up).
            Renewal::Short => lease.max(used).saturating_add(room.max(lease.max(used))),
            Renewal::Sync if g.take_wanted() => used.saturating_add(room),
            Renewal::Sync => used,
        };
        let life = lease_ttl(self.config.sync_interval);
        let hold = millis(life + c.permit_ttl);
        // A renewal Redis runs after this replica gave up only reserves
        // slots for a while (the lease is not taken): as late as a call may
        // wait on a slow Redis.
        let deadline = sync.redis_time(sent.saturating_add(Duration::from_nanos(self.slow_limit())));
        let floor = lease.max(used);
        let [_, leases] = slot_keys(resource);
        let mut invocation = self.scripts.get(ScriptName::SlotLease).prepare_invoke();
        invocation
            .key(leases)
            .arg(&self.instance)
            .arg(used)
            .arg(floor)
            .arg(want.min(max))
            .arg(max)
            .arg(hold)
            .arg(deadline)
            .arg(millis(life));
        if let Some(Answered::Done((granted, _others))) =
            self.run(ScriptName::SlotLease, invocation, wire::parse_slot_lease).await
        {
            g.set_lease(granted, sent.saturating_add(life), granted.max(floor));
        }
    }
}
