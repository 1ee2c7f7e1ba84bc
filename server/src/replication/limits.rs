//! Limits through Redis: strict decisions (one script per decision, all or
//! nothing), and the replicated sync (push what was taken, adopt the merged
//! state).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use smallvec::SmallVec;

use super::Replication;
use super::scripts::{ScriptName, bucket_key, limit_args, marker_key};
use super::wire::{self, Answered, TakeReply};
use crate::engine::sync::SyncItem;
use crate::engine::{Installed, Pending, Remote};
use crate::limiter::{Decision, Shared, Status};
use crate::store::BucketKey;

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
/// two attempts to reach Redis (2 s), so every replica has put back what it
/// knew by then.
const RECOVERY: Duration = Duration::from_millis(2500);

impl Replication {
    /// Redis's decisions over the strict limits of these pending decisions,
    /// in order; `None` for those it could not answer. Decisions on one
    /// resource (one slot) go in one script, up to [`DECISIONS_PER_SCRIPT`];
    /// the scripts run concurrently.
    pub(super) async fn strict(&self, rules: &Installed, pending: &[&Pending<'_>]) -> Vec<Option<Remote>> {
        let mut by_resource: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, p) in pending.iter().enumerate() {
            by_resource.entry(p.resource()).or_default().push(i);
        }
        let groups: Vec<Vec<&Pending<'_>>> = by_resource
            .values()
            .flat_map(|v| v.chunks(DECISIONS_PER_SCRIPT))
            .map(|g| g.iter().map(|&i| pending[i]).collect())
            .collect();
        let replies = join_all(groups.iter().map(|g| self.take(rules, g))).await;
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

    /// One take script over decisions of one resource. Each attempt carries a
    /// deadline, so a script that runs after this replica gave up on it
    /// changes nothing; one that ran too late is asked again. A resource
    /// Redis lost is restored first.
    async fn take(&self, rules: &Installed, group: &[&Pending<'_>]) -> Option<Vec<Remote>> {
        let resource = group.first()?.resource();
        let clock = self.engine.clock();
        let started = clock.now();
        let mut restored = false;
        loop {
            let deadline = self.sync().redis_time(clock.now().saturating_add(self.config.timeout));
            let mut invocation = self.scripts.get(ScriptName::Take).prepare_invoke();
            invocation.key(marker_key(resource));
            let mut args: Vec<f64> = Vec::new();
            let mut counts = Vec::with_capacity(group.len());
            for p in group {
                let strict: SmallVec<[_; 4]> = p.strict().collect();
                args.extend([p.cost() as f64, strict.len() as f64]);
                for (limit, key) in &strict {
                    invocation.key(bucket_key(resource, limit, key));
                    args.extend(limit_args(&limit.algorithm, clock.now()));
                }
                counts.push(strict.len());
            }
            invocation.arg(deadline).arg(self.sync().marker(resource)).arg(group.len()).arg(&args[..]);
            match self.run(ScriptName::Take, invocation, |v| TakeReply::parse_many(v, &counts)).await? {
                Answered::Done(replies) => return Some(self.taken(resource, group, replies)),
                Answered::TooLate if clock.now().saturating_since(started) < self.slow_limit() => {
                    metrics::counter!(crate::metrics::REDIS_LATE).increment(1);
                }
                Answered::Lost if !restored => {
                    restored = true;
                    if !self.restore(rules, resource).await {
                        return None;
                    }
                }
                Answered::TooLate | Answered::Lost => return None,
            }
        }
    }

    /// Redis's decisions, noted (what each strict bucket has left) and
    /// turned into the engine's.
    fn taken(&self, resource: &str, group: &[&Pending<'_>], replies: Vec<TakeReply>) -> Vec<Remote> {
        let now = self.engine.clock().now();
        self.sync().mark(resource, now);
        group
            .iter()
            .zip(replies)
            .map(|(p, reply)| {
                let decisions = p
                    .strict()
                    .zip(&reply.limits)
                    .map(|((limit, key), r)| {
                        self.sync().saw_strict(key, resource, r.remaining, now);
                        Decision {
                            admitted: reply.admitted,
                            status: Status {
                                limit: limit.algorithm.capacity(),
                                remaining: r.remaining,
                                reset_after: r.reset_after,
                                retry_after: if r.admitted { Duration::ZERO } else { r.retry_after },
                                wait: r.wait,
                            },
                        }
                    })
                    .collect();
                Remote { decisions, at_us: reply.at_us }
            })
            .collect()
    }

    /// Redis lost `resource` (its marker is gone or another's), or this
    /// replica has not learned its marker yet: puts back what it knew of the
    /// resource's buckets, so the replicas go on from there, and learns the
    /// marker. After a loss, its replicated buckets take no new lease for a
    /// while (the other replicas put back and push theirs meanwhile: a lease
    /// cut from an earlier figure would overlap what they still hold).
    pub(super) async fn restore(&self, rules: &Installed, resource: &str) -> bool {
        let known = self.sync().known_of(resource);
        let chunks: Vec<&[crate::engine::sync::Known]> =
            if known.is_empty() { vec![&[]] } else { known.chunks(KEYS_PER_SCRIPT).collect() };
        let mut token = None;
        for chunk in chunks {
            let mut invocation = self.scripts.get(ScriptName::Restore).prepare_invoke();
            invocation.key(marker_key(resource));
            for k in chunk {
                let Some((_, limit)) = rules.limit(k.limit) else { continue };
                invocation.key(bucket_key(resource, limit, &k.key));
                invocation
                    .arg(&limit_args(&limit.algorithm, self.engine.clock().now())[..])
                    .arg(k.available)
                    .arg(self.sync().redis_time(k.at));
            }
            let Some((lowered, t)) = self.run(ScriptName::Restore, invocation, wire::parse_restored).await else {
                return false;
            };
            token = Some(t);
            if !chunk.is_empty() {
                metrics::counter!(crate::metrics::REDIS_RESTORES).increment(1);
                tracing::warn!(
                    resource,
                    buckets = chunk.len(),
                    lowered,
                    "Redis had lost this resource's state: restored what this replica knew"
                );
            }
        }
        let now = self.engine.clock().now();
        let Some(token) = token else { return false };
        self.sync().learn_marker(resource, token, now);
        if !known.is_empty() {
            let recovery = (self.config.sync_interval * 3).max(RECOVERY);
            self.sync().recover(resource, now.saturating_add(recovery));
        }
        true
    }

    /// How long a call may wait on a Redis that is slow but alive.
    pub(super) fn slow_limit(&self) -> u64 {
        crate::time::duration_nanos(self.config.timeout * 20)
    }

    /// Syncs these buckets now (pushing what they took), asking for a lease
    /// of at least `want` units if that much is free. With `want` 0, it pulls
    /// the merged state of buckets this process does not hold yet.
    pub(super) async fn lease_now(&self, rules: &Installed, keys: Vec<(&str, BucketKey)>, want: u64) {
        let items: Vec<SyncItem> = keys
            .into_iter()
            .map(|(resource, key)| {
                let delta = self.sync().take_dirty(&key);
                SyncItem { limit: key.limit, key, resource: resource.to_string(), delta }
            })
            .collect();
        self.push_and_adopt(rules, items, want).await;
    }

    /// One round of the replicated sync: push every active bucket's
    /// consumption and adopt the merged state. What could not be pushed is
    /// kept for the next round.
    pub(super) async fn sync_buckets(&self, rules: &Installed) -> bool {
        let items = self.sync().drain_dirty(self.engine.clock().now(), ACTIVE);
        self.push_and_adopt(rules, items, 0).await
    }

    /// Pushes and adopts in one script per resource (its keys share a slot)
    /// and chunk, the chunks running concurrently.
    async fn push_and_adopt(&self, rules: &Installed, items: Vec<SyncItem>, want: u64) -> bool {
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
                            // Recovering: pushed, but no new lease yet.
                            if !self.sync().recovering(&item.resource, now) {
                                self.engine.adopt(rules, &item.resource, &item.key, &shared);
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
        let mut restored = false;
        loop {
            match self.sync_once_batch(rules, batch, want).await? {
                Answered::Done(shared) => {
                    self.sync().mark(resource, self.engine.clock().now());
                    return Some(shared);
                }
                // Nothing was pushed: the consumption is pushed again next time.
                Answered::TooLate => return None,
                Answered::Lost if !restored => {
                    restored = true;
                    if !self.restore(rules, resource).await {
                        return None;
                    }
                }
                Answered::Lost => return None,
            }
        }
    }

    /// One run of the sync script over one resource's batch.
    async fn sync_once_batch(
        &self,
        rules: &Installed,
        batch: &[&SyncItem],
        want: u64,
    ) -> Option<Answered<Vec<Shared>>> {
        let resource = batch.first()?.resource.as_str();
        let lease_ttl = (self.config.sync_interval * 3).as_micros() as u64;
        let now = self.engine.clock().now();
        let deadline = self.sync().redis_time(now.saturating_add(self.config.timeout));
        let mut invocation = self.scripts.get(ScriptName::Sync).prepare_invoke();
        invocation.key(marker_key(resource));
        invocation
            .arg(&self.config.replica_id)
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
            invocation.key(key).arg(item.delta).arg(&args[..]);
        }
        let n = batch.len();
        self.run(ScriptName::Sync, invocation, |v| wire::parse_sync(v, n)).await
    }
}
