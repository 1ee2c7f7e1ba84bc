//! Limits through Redis: strict decisions (one script per decision, all or
//! nothing), and the replicated sync (push what was taken, adopt the merged
//! state).

use super::Limits;
use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use smallvec::SmallVec;

use super::Replication;
use super::adjust::Adjust;
use super::scripts::{ScriptName, bucket_key, limit_args, marker_key};
use super::wire::{self, Answered, TakeReply};
use floodgate_core::limiter::{Decision, Shared, Status};
use floodgate_core::store::BucketKey;
use floodgate_engine::sync::SyncItem;
use floodgate_engine::{Installed, Pending, Remote};

/// Decisions per take script: a batch of one resource goes in few scripts.
const DECISIONS_PER_SCRIPT: usize = 100;
/// Sync scripts in flight at once.
const CONCURRENCY: usize = 32;
/// Buckets per sync script: long scripts would hold Redis up.
const KEYS_PER_SCRIPT: usize = 200;
/// A replicated bucket unused this long is no longer synced.
const ACTIVE: Duration = Duration::from_secs(10);
/// After restoring a resource Redis lost, how long at least its replicated
/// buckets take no new lease: longer than a replica's longest wait between
/// two attempts to reach Redis (0.5 s) by far, so every replica has put back what it
/// knew by then.
const RECOVERY: Duration = Duration::from_millis(2500);

/// Lands a round of syncs as it ends, done, failed or cut short: their
/// buckets may be synced again, and whoever waits for one is woken.
struct Landing<'a> {
    replication: &'a Replication,
    items: &'a [SyncItem],
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        for item in self.items {
            self.replication.sync().landed(item);
        }
        self.replication.landed.notify_waiters();
    }
}

/// How long Redis keeps a replica's lease after its last sync: three sync
/// intervals, and at least a second, so that a replica whose syncs are late
/// (a busy machine) does not lose the reservation it is deciding from. A
/// replica that stopped syncing (it died, or lost Redis) holds its lease
/// that long.
pub(super) fn lease_ttl(sync_interval: Duration) -> Duration {
    (sync_interval * 3).max(Duration::from_secs(1))
}

/// One take script's work, owned (it runs on a task of its own): per
/// decision its strict limits, each with its cost.
struct TakeJob {
    resource: String,
    decisions: Vec<TakeDecision>,
}

/// One decision of a take script.
struct TakeDecision {
    /// Decided and reported, nothing taken: a dry run, or a peek (cost 0).
    check: bool,
    limits: SmallVec<[StrictLimit; 2]>,
}

/// A strict limit of a decision, as the take script needs it.
struct StrictLimit {
    key: BucketKey,
    redis_key: String,
    args: [f64; 5],
    capacity: u64,
    /// What the decision takes from it (a limit with a `cost` formula
    /// takes its own).
    cost: u64,
}

impl StrictLimit {
    fn new(
        resource: &str,
        limit: &floodgate_rules::Limit,
        key: &BucketKey,
        now: floodgate_core::time::Timestamp,
        cost: u64,
    ) -> Self {
        StrictLimit {
            cost,
            key: key.clone(),
            redis_key: bucket_key(resource, limit, key),
            args: limit_args(&limit.algorithm, now),
            capacity: limit.algorithm.capacity(),
        }
    }
}

impl TakeJob {
    fn new<'p, 'r: 'p>(group: impl Iterator<Item = &'p Pending<'r>>, now: floodgate_core::time::Timestamp) -> TakeJob {
        let mut resource = String::new();
        let decisions = group
            .map(|p| {
                resource = p.resource().to_string();
                let limits = p
                    .strict_costs()
                    .map(|(limit, key, cost)| StrictLimit::new(p.resource(), limit, key, now, cost))
                    .collect();
                TakeDecision { check: p.dry_run(), limits }
            })
            .collect();
        TakeJob { resource, decisions }
    }

    /// A check of `limits` (strict limits of `resource`) at no cost: what a
    /// peek shows.
    fn peek<'a>(
        resource: &str,
        limits: impl Iterator<Item = (&'a floodgate_rules::Limit, &'a BucketKey)>,
        now: floodgate_core::time::Timestamp,
    ) -> TakeJob {
        let limits = limits.map(|(limit, key)| StrictLimit::new(resource, limit, key, now, 0)).collect();
        TakeJob { resource: resource.to_string(), decisions: vec![TakeDecision { check: true, limits }] }
    }
}

impl Limits<'_> {
    /// Redis's decisions over the strict limits of these pending decisions,
    /// in order; `None` for those it could not answer. Decisions on one
    /// resource (one slot) go in one script, up to [`DECISIONS_PER_SCRIPT`];
    /// the scripts run concurrently, each on a task of its own, so that a
    /// caller that goes away cannot cut an exchange with Redis in the middle
    /// (what it took is then given back).
    pub(super) async fn strict(&self, pending: &[&Pending<'_>]) -> Vec<Option<Remote>> {
        let mut by_resource: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, p) in pending.iter().enumerate() {
            by_resource.entry(p.resource()).or_default().push(i);
        }
        let now = self.engine.clock().now();
        let jobs: Vec<TakeJob> = by_resource
            .values()
            .flat_map(|v| v.chunks(DECISIONS_PER_SCRIPT))
            .map(|g| TakeJob::new(g.iter().map(|&i| pending[i]), now))
            .collect();
        let replies = join_all(jobs.into_iter().map(|job| self.take_detached(job))).await;
        let mut out = vec![None; pending.len()];
        let order = by_resource.values().flat_map(|v| v.chunks(DECISIONS_PER_SCRIPT));
        for (indices, reply) in order.zip(replies) {
            let Some(reply) = reply else { continue };
            for (&i, decisions) in indices.iter().zip(reply) {
                out[i] = Some(decisions);
            }
        }
        out
    }

    /// What Redis holds for these limits of `resource` (the ones it
    /// decides), taking nothing: a peek. `None` when Redis did not answer.
    pub(super) async fn peek_strict<'a>(
        &self,
        resource: &str,
        limits: impl Iterator<Item = (&'a floodgate_rules::Limit, &'a BucketKey)>,
    ) -> Option<SmallVec<[Decision; 4]>> {
        let job = TakeJob::peek(resource, limits, self.engine.clock().now());
        let mut remote = self.take_detached(job).await?;
        Some(remote.pop()?.decisions)
    }

    /// Runs a take on a task of its own. If the caller is gone when Redis
    /// answers, what the take admitted is given back in Redis.
    async fn take_detached(&self, job: TakeJob) -> Option<Vec<Remote>> {
        let me = self.me.upgrade()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let rules = me.engine.rules_full();
            let taken = me.limits().take(&rules, &job).await;
            if let Err(Some(unwanted)) = tx.send(taken) {
                me.limits().give_back_unwanted(&rules, &job, &unwanted).await;
            }
        });
        rx.await.ok().flatten()
    }

    /// A take whose caller went away: what it admitted goes back.
    async fn give_back_unwanted(&self, rules: &Installed, job: &TakeJob, taken: &[Remote]) {
        let mut items = Vec::new();
        for (d, remote) in job.decisions.iter().zip(taken) {
            // A check took nothing.
            if !d.check && remote.decisions.iter().all(|d| d.admitted) {
                items.extend(d.limits.iter().map(|l| Adjust {
                    key: l.key.clone(),
                    units: -i64::try_from(l.cost).unwrap_or(i64::MAX),
                    at_us: remote.at_us,
                }));
            }
        }
        // Redis's figure after the give-back is not noted as this replica's:
        // the give-back may run before this replica paid what it admitted
        // on its own in an outage, and the next outage would start from a
        // figure that counts as paid what is not.
        if !items.is_empty() && self.adjust(rules, &job.resource, &items).await.is_none() {
            for item in &items {
                self.sync().owe(&item.key, &job.resource, item.units);
            }
        }
    }

    /// One take script over decisions of one resource. Each attempt carries a
    /// deadline, so a script that runs after this replica gave up on it
    /// changes nothing; one that ran too late is asked again. A resource
    /// Redis lost is restored first.
    async fn take(&self, rules: &Installed, job: &TakeJob) -> Option<Vec<Remote>> {
        let resource = job.resource.as_str();
        let clock = self.engine.clock();
        let counts: Vec<usize> = job.decisions.iter().map(|d| d.limits.len()).collect();
        let replies = self
            .until_done(rules, resource, true, || async {
                let deadline = self.sync().redis_time(clock.now().saturating_add(self.config.timeout));
                let mut invocation = self.scripts.get(ScriptName::Take).prepare_invoke();
                invocation.key(marker_key(resource));
                let mut args: Vec<f64> = Vec::new();
                for d in &job.decisions {
                    args.extend([d.limits.len() as f64, f64::from(u8::from(d.check))]);
                    for l in &d.limits {
                        invocation.key(&l.redis_key);
                        args.extend(l.args);
                        args.push(l.cost as f64);
                    }
                }
                invocation.arg(deadline).arg(self.sync().marker(resource)).arg(job.decisions.len()).arg(&args[..]);
                self.run(ScriptName::Take, invocation, |v| TakeReply::parse_many(v, &counts)).await
            })
            .await?;
        Some(self.taken(job, replies))
    }

    /// Redis's decisions, noted (what each strict bucket has left) and
    /// turned into the engine's.
    fn taken(&self, job: &TakeJob, replies: Vec<TakeReply>) -> Vec<Remote> {
        let resource = job.resource.as_str();
        let now = self.engine.clock().now();
        self.sync().mark(resource, now);
        job.decisions
            .iter()
            .zip(replies)
            .map(|(d, reply)| {
                let decisions = d
                    .limits
                    .iter()
                    .zip(&reply.limits)
                    .map(|(l, r)| {
                        // A check of a cost reports what would be left after
                        // it, not what is left; a check of nothing (a peek)
                        // is what is left.
                        if !d.check || l.cost == 0 {
                            self.sync().saw_strict(&l.key, resource, r.available, now, reply.at_us);
                        }
                        // Each limit's own verdict: nothing was taken unless
                        // every one admitted, and only those that did not
                        // are named as what denied.
                        Decision {
                            admitted: r.admitted,
                            status: Status {
                                limit: l.capacity,
                                remaining: r.remaining,
                                reset_after: r.reset_after,
                                retry_after: if r.admitted { Duration::ZERO } else { r.retry_after },
                                wait: r.wait,
                                // A strict limit is never admitted over (the rules refuse it).
                                over_limit: false,
                            },
                        }
                    })
                    .collect();
                Remote { decisions, at_us: reply.at_us }
            })
            .collect()
    }

    /// Redis lost `resource` (its marker is gone or another's), or this
    /// replica has not learned its marker yet (`seen`, the token the script
    /// that found it so was given, is empty): puts back what it knew of the
    /// resource's buckets, so the replicas go on from there, and learns the
    /// marker. After a loss, its replicated buckets take no new lease for a
    /// while (the other replicas put back and push theirs meanwhile: a lease
    /// cut from an earlier figure would overlap what they still hold).
    pub(super) async fn restore(&self, rules: &Installed, resource: &str, seen: &str) -> bool {
        // Without a token, this replica meets the resource's marker for the
        // first time: nothing was lost that it could know of.
        let lost = !seen.is_empty();
        // A strict call and the marker check may both find the same loss.
        // Only the first restores: the second would put back this replica's
        // figure again, now lowered by the takes made since the first, and
        // Redis would count those takes twice. So restores run one at a
        // time, and one whose token this replica has replaced meanwhile is
        // done already.
        let _one_at_a_time = self.restoring.lock().await;
        if lost && self.sync().marker(resource) != seen {
            return true;
        }
        let known = if lost { self.sync().known_of(resource) } else { Vec::new() };
        let chunks: Vec<&[floodgate_engine::sync::Known]> =
            if known.is_empty() { vec![&[]] } else { known.chunks(KEYS_PER_SCRIPT).collect() };
        let mut token = None;
        for chunk in chunks {
            let mut invocation = self.scripts.get(ScriptName::Restore).prepare_invoke();
            invocation.key(marker_key(resource));
            for k in chunk {
                let Some((_, limit)) = rules.limit(k.limit) else { continue };
                invocation.key(bucket_key(resource, limit, &k.key));
                // A strict figure carries Redis's own time of the answer
                // that gave it and the marker token then; a replicated one,
                // this replica's time of its last sync, in Redis's time as
                // this replica estimates it.
                let (at, token) = match &k.strict_at {
                    Some((at, token)) => (*at, token.as_str()),
                    None => (self.sync().redis_time(k.at), ""),
                };
                invocation
                    .arg(&limit_args(&limit.algorithm, self.engine.clock().now())[..])
                    .arg(k.available)
                    .arg(at)
                    .arg(u8::from(k.strict_at.is_some()))
                    .arg(token);
            }
            let Some((changed, t)) = self.run(ScriptName::Restore, invocation, wire::parse_restored).await else {
                return false;
            };
            token = Some(t);
            if !chunk.is_empty() {
                metrics::counter!(floodgate_engine::metrics::REDIS_RESTORES).increment(1);
                tracing::warn!(
                    resource,
                    buckets = chunk.len(),
                    changed,
                    "Redis had lost this resource's state: restored what this replica knew"
                );
            }
        }
        let now = self.engine.clock().now();
        let Some(token) = token else { return false };
        self.sync().learn_marker(resource, token, now);
        if lost && !known.is_empty() {
            let recovery = (self.config.sync_interval * 3).max(RECOVERY);
            self.sync().recover(resource, now.saturating_add(recovery));
        }
        true
    }

    /// Runs the script `attempt` builds until Redis has done it: a resource
    /// Redis lost is restored once, then asked again; one that ran too late
    /// (changing nothing) is asked again while a call may still wait on a
    /// slow Redis, when `retry_late`. `None` when Redis did not answer or
    /// did nothing.
    pub(super) async fn until_done<T, F, Fut>(
        &self,
        rules: &Installed,
        resource: &str,
        retry_late: bool,
        mut attempt: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<Answered<T>>>,
    {
        let clock = self.engine.clock();
        let started = clock.now();
        let mut restored = false;
        let mut relearned = false;
        loop {
            let seen = self.sync().marker(resource);
            match attempt().await? {
                Answered::Done(t) => return Some(t),
                Answered::TooLate if retry_late && clock.now().saturating_since(started) < self.slow_limit() => {
                    metrics::counter!(floodgate_engine::metrics::REDIS_LATE).increment(1);
                }
                // Another exchange of this replica learned the marker while
                // this one was out (the first touches of several buckets,
                // or one loss met by several calls): it restored already.
                Answered::Lost if !relearned && self.sync().marker(resource) != seen => relearned = true,
                Answered::Lost if !restored => {
                    restored = true;
                    if !self.restore(rules, resource, &seen).await {
                        return None;
                    }
                }
                Answered::TooLate | Answered::Lost => return None,
            }
        }
    }

    /// How long a call may wait on a Redis that is slow but alive.
    pub(super) fn slow_limit(&self) -> u64 {
        floodgate_core::time::duration_nanos(self.config.timeout * 20)
    }

    /// Syncs these buckets now (pushing what they took), asking for a lease
    /// of at least `want` units if that much is free. With `want` 0, it pulls
    /// the merged state of buckets this process does not hold yet. On a
    /// task of its own: a caller that goes away cannot lose the consumption
    /// taken out to be pushed, or push it twice.
    ///
    /// A bucket has one sync out at a time (the merged state of one that
    /// Redis ran before another's push arrived would not count that push):
    /// for a bucket whose sync is out, this waits for it to land, as long
    /// as a call may wait on a slow Redis, and then pulls nothing more (the
    /// merged state just came) or asks its own lease.
    pub(super) async fn lease_now(&self, keys: Vec<(&str, BucketKey)>, want: u64) {
        let Some(me) = self.me.upgrade() else { return };
        let rules = self.engine.rules_full();
        let deadline = tokio::time::Instant::now() + Duration::from_nanos(self.slow_limit());
        let mut waiting = keys;
        let mut tasks = Vec::new();
        while !waiting.is_empty() {
            let landed = self.landed.notified();
            let mut items = Vec::new();
            let mut flying = Vec::new();
            for (resource, key) in waiting {
                match self.sync().on(&self.engine).sync_item(&rules, resource, &key) {
                    Some(item) => items.push(item),
                    None => flying.push((resource, key)),
                }
            }
            if !items.is_empty() {
                let (me, rules) = (me.clone(), rules.clone());
                tasks.push(tokio::spawn(async move { me.limits().push_and_adopt(&rules, items, want).await }));
            }
            if flying.is_empty() || tokio::time::timeout_at(deadline, landed).await.is_err() {
                break;
            }
            // A pull is done once the bucket is here.
            flying.retain(|(_, key)| want > 0 || !self.engine.buckets().contains_key(key));
            waiting = flying;
        }
        join_all(tasks).await;
    }

    /// One round of the replicated sync: push every active bucket's
    /// consumption and adopt the merged state. What could not be pushed is
    /// kept for the next round.
    pub(super) async fn sync_buckets(&self, rules: &Installed) -> bool {
        let items = self.sync().on(&self.engine).sync_items(rules, self.engine.clock().now(), ACTIVE);
        self.push_and_adopt(rules, items, 0).await
    }

    /// Pushes and adopts in one script per resource (its keys share a slot)
    /// and chunk, the chunks running concurrently.
    async fn push_and_adopt(&self, rules: &Installed, items: Vec<SyncItem>, want: u64) -> bool {
        let _landing = Landing { replication: self, items: &items };
        let mut by_resource: HashMap<&str, Vec<&SyncItem>> = HashMap::new();
        for item in &items {
            by_resource.entry(item.resource.as_str()).or_default().push(item);
        }
        let batches: Vec<&[&SyncItem]> = by_resource.values().flat_map(|v| v.chunks(KEYS_PER_SCRIPT)).collect();
        let mut ok = true;
        for group in batches.chunks(CONCURRENCY) {
            let calls = group.iter().map(|batch| self.sync_batch(rules, batch, want));
            for (batch, shared) in group.iter().zip(join_all(calls).await) {
                match shared {
                    Some(shared) => {
                        let now = self.engine.clock().now();
                        for (item, shared) in batch.iter().zip(shared) {
                            // Recovering: pushed, but no new lease yet; what
                            // the replicas have in common is known all the
                            // same. A bucket not held here has nothing to put
                            // back: it takes its lease (rather than deciding
                            // from a full bucket).
                            let held = self.engine.buckets().contains_key(&item.key);
                            if held && self.sync().recovering(&item.resource, now) {
                                self.sync().on(&self.engine).note_common(&item.resource, &item.key, &shared);
                            } else {
                                self.sync().on(&self.engine).adopt(rules, item, &shared);
                            }
                        }
                    }
                    None => {
                        ok = false;
                        let now = self.engine.clock().now();
                        for item in batch.iter().filter(|i| i.delta != 0) {
                            self.sync().restore_dirty(item, now);
                        }
                    }
                }
            }
        }
        ok
    }

    async fn sync_batch(&self, rules: &Installed, batch: &[&SyncItem], want: u64) -> Option<Vec<Shared>> {
        let resource = batch.first()?.resource.as_str();
        // Too late: nothing was pushed, and the consumption is pushed again next time.
        let shared = self.until_done(rules, resource, false, || self.sync_once_batch(rules, batch, want)).await?;
        self.sync().mark(resource, self.engine.clock().now());
        Some(shared)
    }

    /// One run of the sync script over one resource's batch.
    async fn sync_once_batch(
        &self,
        rules: &Installed,
        batch: &[&SyncItem],
        want: u64,
    ) -> Option<Answered<Vec<Shared>>> {
        let resource = batch.first()?.resource.as_str();
        let lease_ttl = lease_ttl(self.config.sync_interval).as_micros() as u64;
        let now = self.engine.clock().now();
        let deadline = self.sync().redis_time(now.saturating_add(self.config.timeout));
        let mut invocation = self.scripts.get(ScriptName::Sync).prepare_invoke();
        invocation.key(marker_key(resource));
        invocation
            .arg(&self.instance)
            .arg(self.sync().share())
            .arg(lease_ttl)
            .arg(want)
            .arg(deadline)
            .arg(self.sync().marker(resource));
        for item in batch {
            // A limit gone from the rules still syncs once, as a no-op fixed window.
            let (key, args) = match rules.limit(item.limit) {
                Some((_, limit)) => (bucket_key(&item.resource, limit, &item.key), limit_args(&limit.algorithm, now)),
                None => (format!("fg:b:{{{}}}:gone", super::conn::tag(&item.resource)), [4.0, 1.0, 1e6, 0.0, 0.0]),
            };
            invocation.key(key).arg(item.delta).arg(item.hold).arg(item.epoch).arg(item.mark).arg(&args[..]);
        }
        let n = batch.len();
        self.run(ScriptName::Sync, invocation, |v| wire::parse_sync(v, n)).await
    }
}
