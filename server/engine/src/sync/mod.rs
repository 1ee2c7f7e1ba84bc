//! What the decision core keeps for replication through Redis, present only
//! when the server replicates: whether Redis answers, how many replicas share
//! the limits, what replicated buckets took since their last sync, breaker
//! news, and probe outcomes waiting to go out. The replication module (the
//! network side) reads and feeds it; nothing here touches the network.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use super::{Engine, Installed, Prepared};
use crate::breaker::Call;
use crate::events::Event;

use crate::limiter::{Bucket, Shared};
use crate::rules::{Concurrency, Limit};
use crate::store::{BucketKey, LimitId};
use crate::time::Timestamp;

mod coordination;
mod dirty;
mod memory;
mod shared;
mod slots;

pub use coordination::decided_by_store;
use coordination::shared_slots;
pub use coordination::{Alone, Coordination, Slots};
pub use dirty::{Known, SyncItem};
pub use memory::MAX_REMEMBERED;
pub use shared::{BreakerNews, ProbeGrant, RemoteBreaker, RemoteOutcome, SharedBreaker};
use shared::{Outbox, Unsynced};
pub use slots::{RemoteSlot, SlotGrant, SlotOp};

/// The replication state of one replica.
#[derive(Debug, Default)]
pub struct Replica {
    /// Redis answered last time.
    up: AtomicBool,
    /// Live replicas, this one included.
    live: AtomicU32,
    /// Redis's clock minus this replica's, in microseconds (from heartbeats).
    offset_us: AtomicI64,
    dirty: dirty::DirtyBuckets,
    outbox: Arc<Outbox>,
    /// Strict concurrency slots to give back to (or add to) the fleet's set.
    slot_ops: Arc<Outbox<SlotOp>>,
    /// How many of them add a slot taken while Redis was away: until they
    /// are in, the fleet's count is short, and no slot is asked of it.
    adds_owed: std::sync::atomic::AtomicU64,
    breakers: DashMap<String, Unsynced, ahash::RandomState>,
    /// What Redis last said a strict bucket had left: where an outage's
    /// local share starts, and what is restored if Redis loses its data.
    strict_seen: DashMap<BucketKey, Seen, ahash::RandomState>,
    /// What this replica last knew of buckets it no longer keeps, until they
    /// would be full again: restored too if Redis loses its data.
    memory: memory::Memory,
    /// Resources whose marker this replica has seen in Redis: when, and its
    /// token (see limits.lua).
    marked: DashMap<String, (Timestamp, String), ahash::RandomState>,
    /// Resources this replica restored lately, until when: their replicated
    /// buckets take no new lease until every replica has had time to put
    /// back what it knew and push what it took.
    recovering: DashMap<String, Timestamp, ahash::RandomState>,
    /// Strict buckets decided here during an outage, dropped when it ends.
    outage: DashMap<BucketKey, (), ahash::RandomState>,
    /// What this replica owes strict buckets in Redis, net: units admitted
    /// (or charged) while Redis could not be asked, less what was given
    /// back. Paid when Redis answers again, before this replica asks it for
    /// a decision; while any is owed, decisions follow the outage policies.
    debts: std::sync::Mutex<std::collections::HashMap<BucketKey, Debt>>,
}

/// Units owed to one strict bucket in Redis (negative: to give back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Debt {
    pub resource: String,
    pub units: i64,
}

/// A strict bucket's available units as Redis last reported them.
#[derive(Clone, Debug)]
struct Seen {
    resource: String,
    /// Negative when charges took the bucket beyond its limit: that debt is
    /// restored too if Redis loses it, or the units charged would be free
    /// again.
    remaining: f64,
    at: Timestamp,
    /// Redis's time (us) of the figure: answers that arrive out of order
    /// (two calls in flight) never replace a figure with an older one.
    redis_at: i64,
    /// The resource's marker token when the figure was given: figures are
    /// compared by their time only within one token (see restore.lua).
    token: String,
    /// When a decision here last used it (a refresh is not a use).
    used: Timestamp,
    /// What this replica admitted on its own lately, times the live
    /// replicas (each may have admitted as much from its share): not yet in
    /// any figure Redis gives, while the others' debts may be unpaid.
    assumed: f64,
    /// When it last admitted on its own (`assumed` lapses [`ASSUMED_FOR`]
    /// after: every replica has seen Redis back and paid by then).
    assumed_at: Timestamp,
}

/// How long what the replicas admitted on their own in an outage is taken
/// off the figure the next outage starts from (a flapping Redis).
const ASSUMED_FOR: Duration = Duration::from_secs(3);

/// State this replica keeps only while it is in use.
const FORGET_AFTER: Duration = Duration::from_secs(600);

// === impl Replica ===

impl Replica {
    pub fn new() -> Self {
        Replica { live: AtomicU32::new(1), ..Replica::default() }
    }

    /// Redis answered last time.
    pub fn up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Records whether Redis answers; true when it has just come back.
    pub fn set_up(&self, up: bool) -> bool {
        !self.up.swap(up, Ordering::AcqRel) && up
    }

    /// Learns Redis's clock from a heartbeat that answered at `local`.
    pub fn set_redis_clock(&self, redis_us: i64, local: Timestamp) {
        let local_us = (local.as_nanos() / 1000) as i64;
        self.offset_us.store(redis_us - local_us, Ordering::Release);
    }

    /// A local time in Redis's clock, in microseconds: scripts' deadlines.
    pub fn redis_time(&self, local: Timestamp) -> i64 {
        (local.as_nanos() / 1000) as i64 + self.offset_us.load(Ordering::Acquire)
    }

    /// The token of `resource`'s marker as this replica learned it; empty
    /// when it has not (scripts then ask it to restore and learn it).
    pub fn marker(&self, resource: &str) -> String {
        self.marked.get(resource).map(|m| m.1.clone()).unwrap_or_default()
    }

    /// A script found the marker this replica knows.
    pub fn mark(&self, resource: &str, now: Timestamp) {
        if let Some(mut m) = self.marked.get_mut(resource) {
            m.0 = now;
        }
    }

    /// The marker's token, as a restore returned it.
    pub fn learn_marker(&self, resource: &str, token: String, now: Timestamp) {
        self.marked.insert(resource.to_string(), (now, token));
    }

    /// This replica restored `resource` (Redis had lost it): its replicated
    /// buckets take no new lease until `until`.
    pub fn recover(&self, resource: &str, until: Timestamp) {
        self.recovering.insert(resource.to_string(), until);
    }

    /// Whether `resource` is being recovered at `now`.
    pub fn recovering(&self, resource: &str, now: Timestamp) -> bool {
        self.recovering.get(resource).is_some_and(|until| now < *until)
    }

    /// What Redis answered for a strict bucket a decision here used.
    /// What Redis last said a bucket it decides had left, when this
    /// replica last asked it: what the console shows of a strict limit
    /// (another replica's calls since are not in it).
    pub fn last_from_store(&self, key: &BucketKey) -> Option<u64> {
        self.strict_seen.get(key).map(|s| s.remaining.max(0.0) as u64)
    }

    /// What Redis said a strict bucket had available at its time `redis_at`
    /// (us), in an answer to a decision, a charge or a settle here: negative
    /// when charges took it beyond its limit. An older figure than the one
    /// kept is not taken: after a loss, this figure is what the bucket is
    /// restored to, and a stale one would give back units taken.
    pub fn saw_strict(&self, key: &BucketKey, resource: &str, available: i64, now: Timestamp, redis_at: i64) {
        let remaining = available as f64;
        if let Some(mut s) = self.strict_seen.get_mut(key) {
            s.used = now;
            if redis_at >= s.redis_at {
                (s.remaining, s.at, s.redis_at, s.token) = (remaining, now, redis_at, self.marker(resource));
            }
            return;
        }
        let token = self.marker(resource);
        let seen = Seen {
            resource: resource.to_string(),
            remaining,
            at: now,
            redis_at,
            token,
            used: now,
            assumed: 0.0,
            assumed_at: Timestamp::ZERO,
        };
        self.strict_seen.insert(key.clone(), seen);
    }

    /// What Redis says a strict bucket has available now (negative beyond
    /// its limit), read by the sync loop so that an outage starts from a
    /// fresh figure, not from this replica's own last decision.
    pub fn refreshed_strict(&self, key: &BucketKey, available: i64, now: Timestamp, redis_at: i64) {
        if let Some(mut s) = self.strict_seen.get_mut(key)
            && redis_at >= s.redis_at
        {
            s.remaining = available as f64;
            s.at = now;
            s.redis_at = redis_at;
            s.token = self.marker(&s.resource);
        }
    }

    /// Strict buckets a decision here used within `active`, by resource: the
    /// ones whose figure the sync loop keeps fresh.
    pub fn strict_in_use(&self, now: Timestamp, active: Duration) -> Vec<(String, BucketKey)> {
        let active = crate::time::duration_nanos(active);
        self.strict_seen
            .iter()
            .filter(|e| now.saturating_since(e.used) < active)
            .map(|e| (e.resource.clone(), e.key().clone()))
            .collect()
    }

    /// Units a strict bucket admitted (or, negative, gave back) here while
    /// Redis was away: owed to Redis, and taken off the figure the next
    /// outage starts from. As if every live replica had admitted as much
    /// (each decides from its share): so however often Redis comes and
    /// goes before this replica hears its figure again, its outages admit at
    /// most its share of that figure in all, not a share of it each time.
    pub fn admitted_here(&self, key: &BucketKey, resource: &str, units: i64, now: Timestamp) {
        self.owe(key, resource, units);
        if let Some(mut s) = self.strict_seen.get_mut(key) {
            if now.saturating_since(s.assumed_at) >= crate::time::duration_nanos(ASSUMED_FOR) {
                s.assumed = 0.0;
            }
            let change = if units > 0 { units as f64 / self.share() } else { units as f64 };
            s.assumed = (s.assumed + change).max(0.0);
            s.assumed_at = now;
        }
    }

    /// Notes units a strict bucket owes Redis (or, negative, gets back).
    pub fn owe(&self, key: &BucketKey, resource: &str, units: i64) {
        if units == 0 {
            return;
        }
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        let debt = debts.entry(key.clone()).or_insert_with(|| Debt { resource: resource.to_string(), units: 0 });
        debt.units = debt.units.saturating_add(units);
        if debt.units == 0 {
            debts.remove(key);
        }
    }

    /// Everything owed, now cleared (to pay it; what could not be paid is
    /// owed again with [`Replica::owe`]).
    pub fn take_debts(&self) -> Vec<(BucketKey, Debt)> {
        std::mem::take(&mut *self.debts.lock().unwrap_or_else(|e| e.into_inner())).into_iter().collect()
    }

    /// Redis answers again: decisions ask it from now on. Under the debts'
    /// lock, so that what is still owed (admitted here while the debts were
    /// being paid) is taken in the same instant: the caller pays it at once.
    /// With `only_if_paid`, nothing changes while anything is owed (`None`).
    pub fn come_back(&self, only_if_paid: bool) -> Option<Vec<(BucketKey, Debt)>> {
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        if only_if_paid && !debts.is_empty() {
            return None;
        }
        self.up.store(true, Ordering::Release);
        Some(std::mem::take(&mut *debts).into_iter().collect())
    }

    /// What an outage starting `now` decides `key` from: what Redis last
    /// said it had left, less what the replicas may have admitted on their
    /// own since that Redis does not count yet; `None` if Redis said nothing.
    fn strict_remaining(&self, key: &BucketKey, now: Timestamp) -> Option<f64> {
        self.strict_seen.get(key).map(|s| {
            if now.saturating_since(s.assumed_at) >= crate::time::duration_nanos(ASSUMED_FOR) {
                return s.remaining.max(0.0);
            }
            // A figure Redis gave after this replica's own admits were paid
            // (debts are paid before Redis is asked again) counts them: only
            // the others' may be missing.
            let missing = if s.at > s.assumed_at { s.assumed * (1.0 - self.share()) } else { s.assumed };
            (s.remaining - missing).max(0.0)
        })
    }

    /// Everything this replica knows of `resource`'s buckets, to restore
    /// them: those in use, then those it remembers.
    pub fn known_of(&self, resource: &str) -> Vec<Known> {
        let mut out = Vec::new();
        self.dirty.known_of(resource, &mut out);
        for e in self.strict_seen.iter().filter(|e| e.resource == resource) {
            out.push(Known {
                key: e.key().clone(),
                limit: e.key().limit,
                available: e.remaining,
                at: e.at,
                strict_at: Some((e.redis_at, e.token.clone())),
            });
        }
        self.memory.known_of(resource, &mut out);
        out
    }

    /// Up to `max` resources whose marker this replica knows and no script
    /// has found since `before`, with the token: the ones to check, since no
    /// call would notice if Redis lost them. A marker is kept only while the
    /// resource is in use or something is remembered of it, so these are the
    /// ones worth it.
    pub fn markers_to_check(&self, before: Timestamp, max: usize) -> Vec<(String, String)> {
        self.marked
            .iter()
            .filter(|e| e.value().0 < before)
            .take(max)
            .map(|e| (e.key().clone(), e.value().1.clone()))
            .collect()
    }

    /// Remembers what a bucket no longer kept had available, and when, for
    /// `horizon` (the time it takes to be full again). False when the
    /// memory is full.
    /// `strict_at` is a strict bucket's Redis time of the figure, and the
    /// marker token it was given under.
    pub fn remember(
        &self,
        resource: &str,
        key: &BucketKey,
        (available, at): (f64, Timestamp),
        horizon: Duration,
        strict_at: Option<(i64, String)>,
    ) -> bool {
        let until = at.saturating_add(horizon);
        self.memory.remember(resource, key, available, at, until, strict_at)
    }

    /// How many buckets are remembered.
    pub fn remembered(&self) -> usize {
        self.memory.len()
    }

    /// Forgets what has not been used for a while: markers of resources
    /// nothing is known of, and strict buckets (their last figure is then
    /// remembered for `horizon` of their limit: `None` for a limit gone).
    pub fn forget_idle(&self, now: Timestamp, horizon: impl Fn(LimitId) -> Option<Duration>) {
        let fresh = |at: Timestamp| now.saturating_since(at) < crate::time::duration_nanos(FORGET_AFTER);
        self.recovering.retain(|_, until| now < *until);
        self.strict_seen.retain(|key, s| {
            if fresh(s.at) {
                return true;
            }
            if let Some(horizon) = horizon(key.limit) {
                self.remember(&s.resource, key, (s.remaining, s.at), horizon, Some((s.redis_at, s.token.clone())));
            }
            false
        });
        self.memory.forget(now);
        // A marker is kept while something is known of its resource: a
        // replica that forgot the token could not tell a loss from a first use.
        self.marked.retain(|resource, (at, _)| fresh(*at) || self.memory.knows(resource));
    }

    pub fn set_live(&self, n: u32) {
        self.live.store(n.max(1), Ordering::Release);
    }

    pub fn live(&self) -> u32 {
        self.live.load(Ordering::Acquire).max(1)
    }

    /// This replica's share of a limit while replicas cannot coordinate.
    pub fn share(&self) -> f64 {
        1.0 / f64::from(self.live())
    }

    /// The sync of this item is over, done or not: the next may go out.
    pub fn landed(&self, item: &SyncItem) {
        self.dirty.landed(&item.key);
    }

    /// Puts back consumption a failed sync could not push.
    pub fn restore_dirty(&self, item: &SyncItem, now: Timestamp) {
        self.dirty.put_back(&item.key, &item.resource, item.limit, item.delta, now);
    }

    /// Probe outcomes and returned probes waiting to be sent to Redis.
    pub fn take_outbox(&self) -> Vec<RemoteOutcome> {
        self.outbox.take()
    }

    pub fn outbox_is_empty(&self) -> bool {
        self.outbox.is_empty()
    }

    /// An outcome that could not be sent: sent again at the next flush.
    pub fn resend(&self, outcome: RemoteOutcome) {
        self.outbox.push(outcome);
    }

    /// A strict concurrency slot Redis took for a call under `id`.
    pub fn slot_granted(&self, resource: &str, id: crate::permit_id::PermitId) -> SlotGrant {
        SlotGrant::new(resource.to_string(), id, self.slot_ops.clone())
    }

    /// Strict concurrency slots to give back or add, oldest first.
    pub fn take_slot_ops(&self) -> Vec<SlotOp> {
        self.slot_ops.take()
    }

    /// Strict slots wait to be given back or added.
    pub fn slot_ops_waiting(&self) -> bool {
        !self.slot_ops.is_empty()
    }

    /// Slots taken while Redis was away that it does not count yet.
    pub fn adds_owed(&self) -> bool {
        self.adds_owed.load(Ordering::Acquire) > 0
    }

    /// One of them reached Redis.
    pub fn added(&self) {
        let _ = self.adds_owed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Ops that could not be sent, first again at the next flush.
    pub fn put_back_slot_ops(&self, ops: Vec<SlotOp>) {
        let later = self.slot_ops.take();
        for op in ops.into_iter().chain(later) {
            self.slot_ops.push(op);
        }
    }

    /// A probe of `resource`'s shared breaker that Redis granted.
    pub fn probe_granted(&self, resource: &str, generation: u64) -> ProbeGrant {
        ProbeGrant::new(resource.to_string(), generation, self.outbox.clone())
    }

    /// One breaker's calls since the last sync (now reset).
    fn take_news(&self, resource: String) -> BreakerNews {
        match self.breakers.get_mut(&resource) {
            Some(mut u) => {
                let news = BreakerNews { resource, calls: u.calls, tripped: u.tripped };
                (u.calls, u.tripped) = (Default::default(), false);
                news
            }
            None => BreakerNews { resource, calls: Default::default(), tripped: false },
        }
    }

    /// Whether `generation` is newer than the last shared state adopted for
    /// `resource` (and notes it as adopted).
    fn newer(&self, resource: &str, generation: u64) -> bool {
        let mut u = self.breakers.entry(resource.to_string()).or_default();
        if generation <= u.generation {
            return false;
        }
        u.generation = generation;
        true
    }

    fn take_outage(&self) -> Vec<BucketKey> {
        let keys: Vec<BucketKey> = self.outage.iter().map(|e| e.key().clone()).collect();
        for k in &keys {
            self.outage.remove(k);
        }
        keys
    }
}

// === impl Coordination for Replica ===

impl Coordination for Replica {
    fn decides(&self, limit: &Limit) -> bool {
        decided_by_store(limit)
    }

    fn store_up(&self) -> bool {
        self.up()
    }

    fn in_outage(&self) -> bool {
        !self.up()
    }

    fn notes_takes(&self) -> bool {
        true
    }

    fn share(&self) -> f64 {
        Replica::share(self)
    }

    /// Keeps count of what a replicated limit took, for the next sync.
    fn note_take(&self, limit: &Limit, key: &BucketKey, resource: &str, units: i64, now: Timestamp) {
        if limit.sync.is_replicated() {
            self.dirty.note(key, resource, key.limit, units, now);
        }
    }

    fn admitted_here(&self, key: &BucketKey, resource: &str, units: i64, now: Timestamp) {
        Replica::admitted_here(self, key, resource, units, now)
    }

    fn last_remaining(&self, key: &BucketKey) -> Option<u64> {
        self.last_from_store(key)
    }

    fn outage_start(&self, key: &BucketKey, now: Timestamp) -> Option<f64> {
        if !self.outage.contains_key(key) {
            self.outage.insert(key.clone(), ());
        }
        self.strict_remaining(key, now)
    }

    fn slots(&self, c: &Concurrency, limit: u32, slot: Option<RemoteSlot>) -> Slots {
        shared_slots(c, limit, slot, self.up(), self.live())
    }

    fn send_outcome(&self, outcome: RemoteOutcome) {
        self.outbox.push(outcome);
    }

    /// A call this replica's breaker recorded, for the next sync.
    fn record_call(&self, resource: &str, call: Call, tripped: bool) {
        match self.breakers.get_mut(resource) {
            Some(mut u) => u.record(call, tripped),
            None => self.breakers.entry(resource.to_string()).or_default().record(call, tripped),
        }
    }

    fn push_slot_op(&self, op: SlotOp) {
        if matches!(op, SlotOp::Add { .. }) {
            self.adds_owed.fetch_add(1, Ordering::AcqRel);
        }
        self.slot_ops.push(op);
    }

    /// Forgets breakers no longer guarded here once their news went out.
    fn retain_breakers(&self, guarded: &dyn Fn(&str) -> bool) {
        self.breakers.retain(|resource, u| guarded(resource) || u.calls.calls > 0);
    }
}

// === The replication task's view of the engine ===

/// The replica and the engine together: what the replication task reads
/// from and writes to the engine's state, so that the engine itself needs
/// no method that only a replicating server calls.
#[derive(Clone, Copy)]
pub struct OnEngine<'a> {
    replica: &'a Replica,
    engine: &'a Engine,
}

impl Replica {
    /// This replica's state together with `engine`'s.
    pub fn on<'a>(&'a self, engine: &'a Engine) -> OnEngine<'a> {
        OnEngine { replica: self, engine }
    }
}

impl OnEngine<'_> {
    /// Whether the next call on this resource needs Redis to grant a probe
    /// (the rule `p` matched has a breaker, in OPEN past its wait or HALF_OPEN).
    pub fn needs_remote_probe(&self, p: &Prepared<'_>, resource: &str) -> bool {
        if !self.replica.up() || !p.has_breaker() || p.gate() {
            return false;
        }
        let now = self.engine.clock.now();
        self.engine
            .guards
            .get(resource)
            .is_some_and(|g| g.current_breaker().as_ref().is_some_and(|b| b.needs_probe(now)))
    }

    /// Takes the shared state of a resource's breaker when it is newer than
    /// the last one taken.
    pub fn adopt_breaker(&self, rules: &Installed, resource: &str, shared: SharedBreaker) {
        let Some(rule) = rules.rules.find(resource) else { return };
        let Some(cfg) = rule.breaker.as_ref() else { return };
        if !self.replica.newer(resource, shared.generation) {
            return;
        }
        let g = self.engine.guards.get_or_create(resource, rule);
        let now = self.engine.clock.now();
        let transition = g
            .breaker(Some(cfg))
            .as_mut()
            .and_then(|b| b.adopt(cfg, now, shared.state, shared.open_until, shared.openings));
        if let Some(transition) = transition {
            self.engine.events.publish(Event::Breaker {
                resource: resource.into(),
                rule: rule.name.clone(),
                transition,
            });
        }
    }

    /// Records what the replicas have in common after a sync, without taking
    /// a lease of it (a resource recovering from a loss): the next loss is
    /// restored from this figure, not from one older than the last loss.
    pub fn note_common(&self, resource: &str, key: &BucketKey, shared: &Shared) {
        self.replica.dirty.synced(key, resource, shared.available, self.engine.clock.now());
    }

    /// Every replicated bucket active within `active`, with its consumption
    /// since the last sync (now reset) and what it could still admit here,
    /// so that it is pushed and the merged state pulled. The buckets of
    /// those no longer active go: the lease they hold is no longer kept for
    /// this replica in Redis, so their next use pulls the merged state.
    pub fn sync_items(&self, rules: &Installed, now: Timestamp, active: Duration) -> Vec<SyncItem> {
        let mut forgotten = Vec::new();
        let items = self.replica.dirty.drain(now, active, |key| self.holding(rules, key, now), &mut forgotten);
        for f in forgotten {
            self.engine.buckets.remove(&f.key);
            // Should Redis lose the bucket later, what was last known of it is
            // put back, however long it stays idle.
            if let (Some((available, at)), Some(alg)) = (f.last, rules.algorithm(f.key.limit)) {
                self.replica.remember(&f.resource, &f.key, (available, at), alg.window().saturating_mul(2), None);
            }
        }
        items
    }

    /// One replicated bucket's sync item, its consumption now reset (to push
    /// it now); `None` while another sync of it is out (see
    /// [`Replica::landed`]).
    pub fn sync_item(&self, rules: &Installed, resource: &str, key: &BucketKey) -> Option<SyncItem> {
        let now = self.engine.clock.now();
        let hold = self.holding(rules, key, now);
        self.replica.dirty.take(key, resource, hold, now)
    }

    /// What this replica could still admit from the bucket at `key`.
    fn holding(&self, rules: &Installed, key: &BucketKey, now: Timestamp) -> u64 {
        match rules.algorithm(key.limit) {
            Some(alg) if self.engine.buckets.contains_key(key) => {
                self.engine.buckets.check(key, alg, now, 0).status.remaining
            }
            _ => 0,
        }
    }

    /// Replaces a replicated bucket with its lease of the merged state, then
    /// re-applies what was taken here since the sync of `item` went out. A
    /// state older than one adopted already is left alone (replies to
    /// concurrent syncs may arrive in any order).
    pub fn adopt(&self, rules: &Installed, item: &SyncItem, shared: &Shared) {
        let Some(alg) = rules.algorithm(item.key.limit) else { return };
        let now = self.engine.clock.now();
        let key = &item.key;
        if !self.replica.dirty.newer(key, &item.resource, shared.seq, now) {
            return;
        }
        let mut bucket = Bucket::adopt(alg, now, shared, self.replica.share());
        let since = self.replica.dirty.since(key, item.mark);
        if since > 0 {
            bucket.force(alg, now, since.unsigned_abs());
        } else if since < 0 {
            bucket.refund(alg, now, since.unsigned_abs());
        }
        self.engine.buckets.put(key.clone(), bucket, now);
        // Decisions note what they take before taking it: one that took from
        // the old bucket while it was replaced is counted now (one that took
        // from the new bucket is counted twice until the next sync, which
        // errs on the side of the limit).
        let later = self.replica.dirty.since(key, item.mark).wrapping_sub(since);
        if later > 0 {
            self.engine.buckets.force(key.clone(), alg, now, later.unsigned_abs());
        } else if later < 0 {
            self.engine.buckets.refund(key, alg, now, later.unsigned_abs());
        }
        self.replica.dirty.synced(key, &item.resource, shared.available, now);
    }

    /// A replicated bucket this replica does not hold and could not pull
    /// (Redis did not answer, or is away): it holds no lease of it, so it
    /// does not start from a full bucket, which would admit the whole limit
    /// again beside what the other replicas hold. It starts from `share` of
    /// the whole limit (0: nothing; until a sync brings its lease it admits
    /// only what its local refill gives, nothing from a window). A bucket
    /// held meanwhile (a sync landed) is left as it is.
    pub fn hold_share(&self, alg: &crate::limiter::Algorithm, key: &BucketKey, share: f64) {
        let now = self.engine.clock.now();
        let whole = alg.capacity() as f64;
        let share = share.clamp(0.0, 1.0);
        let held = Shared { available: whole, lease: whole * share, window_start: now, prev: 0, cur: 0, seq: 0 };
        self.engine.buckets.put_if_absent(key.clone(), || Bucket::adopt(alg, now, &held, share), now);
    }

    /// Redis is back: the buckets strict limits used during the outage go, so
    /// the next outage starts again from what Redis last said.
    pub fn end_outage(&self) {
        for key in self.replica.take_outage() {
            self.engine.buckets.remove(&key);
        }
    }

    /// Whether a request its replicated limits denied here might fit in what
    /// the replicas have in common (more than this replica's lease).
    pub fn worth_escalating(&self, p: &Prepared<'_>) -> bool {
        p.replicated_costs().any(|(k, cost)| self.replica.dirty.available(k).is_some_and(|a| a >= cost as f64))
    }

    /// Every guarded breaker's calls since the last sync (now reset), also
    /// those with none: each sync brings back the shared state of all.
    pub fn breaker_news(&self, rules: &Installed) -> Vec<BreakerNews> {
        self.engine
            .guards
            .all()
            .into_iter()
            .filter(|(resource, _)| rules.rules.find(resource).is_some_and(|r| r.breaker.is_some()))
            .map(|(resource, _)| self.replica.take_news(resource))
            .collect()
    }
}

#[cfg(test)]
mod tests;
