//! Limits through Redis: strict decisions (one script per decision, all or
//! nothing), and the replicated sync (push what was taken, adopt the merged
//! state).

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;
use smallvec::SmallVec;

use super::Replication;
use super::scripts::{bucket_key, limit_args};
use crate::engine::{Installed, Pending, SyncItem};
use crate::limiter::{Decision, Shared, Status};
use crate::store::BucketKey;
use crate::time::Timestamp;

/// Sync scripts in flight at once.
const CONCURRENCY: usize = 32;
/// Buckets per sync script: long scripts would hold Redis up.
const KEYS_PER_SCRIPT: usize = 200;

impl Replication {
    /// Redis's decision over a request's strict limits; `None` if it could not answer.
    pub(super) async fn strict(&self, pending: &Pending<'_>) -> Option<SmallVec<[Decision; 4]>> {
        let resource = pending.resource();
        let mut invocation = self.scripts.take.prepare_invoke();
        invocation.arg(pending.cost());
        let mut limits = Vec::new();
        for (limit, key) in pending.strict() {
            invocation.key(bucket_key(resource, limit, key));
            invocation.arg(&limit_args(&limit.algorithm)[..]);
            limits.push(limit.algorithm.capacity());
        }
        let reply: Vec<i64> = self.call("take", |mut h| async move { invocation.invoke_async(&mut h).await }).await?;
        let us = |n: i64| Duration::from_micros(n.max(0) as u64);
        let decisions = limits
            .iter()
            .zip(reply.get(1..)?.chunks(5))
            .map(|(&limit, r)| Decision {
                admitted: reply[0] == 1,
                status: Status {
                    limit,
                    remaining: r[1].max(0) as u64,
                    reset_after: us(r[2]),
                    retry_after: if r[0] == 1 { Duration::ZERO } else { us(r[3]) },
                    wait: us(r[4]),
                },
            })
            .collect::<SmallVec<_>>();
        (decisions.len() == limits.len()).then_some(decisions)
    }

    /// The merged state of buckets this process does not hold yet, so that a
    /// restarted replica resumes where the replicas are rather than full.
    pub(super) async fn pull(&self, rules: &Installed, resource: &str, keys: Vec<BucketKey>) {
        self.lease_now(rules, resource, keys, 0).await;
    }

    /// Syncs these buckets now (pushing what they took), asking for a lease
    /// of at least `want` units if that much is free.
    pub(super) async fn lease_now(&self, rules: &Installed, resource: &str, keys: Vec<BucketKey>, want: u64) {
        let items: Vec<SyncItem> = keys
            .into_iter()
            .map(|key| {
                let delta = self.engine.take_dirty(&key);
                SyncItem { limit: key.limit, key, resource: resource.to_string(), delta }
            })
            .collect();
        self.push_and_adopt(rules, items, want).await;
    }

    /// One round of the replicated sync: push every active bucket's
    /// consumption and adopt the merged state. What could not be pushed is
    /// kept for the next round.
    pub(super) async fn sync_buckets(&self, rules: &Installed) -> bool {
        let items = self.engine.drain_dirty(Duration::from_secs(10));
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
            for (batch, shared) in group.iter().zip(futures_join(calls).await) {
                match shared {
                    Some(shared) => {
                        for (item, shared) in batch.iter().zip(shared) {
                            self.engine.adopt(rules, &item.resource, &item.key, &shared);
                        }
                    }
                    None => {
                        ok = false;
                        for item in batch.iter().filter(|i| i.delta > 0) {
                            self.engine.restore_dirty(item);
                        }
                    }
                }
            }
        }
        ok
    }

    async fn sync_batch(&self, rules: &Installed, batch: &[&SyncItem], want: u64) -> Option<Vec<Shared>> {
        let lease_ttl = (self.config.sync_interval * 3).as_micros() as u64;
        let mut invocation = self.scripts.sync.prepare_invoke();
        invocation.arg(&self.config.replica_id).arg(self.engine.replica().share()).arg(lease_ttl).arg(want);
        for item in batch {
            // A limit gone from the rules still syncs once, as a no-op fixed window.
            let (key, args) = match rules.limit(item.limit) {
                Some((_, limit)) => (bucket_key(&item.resource, limit, &item.key), limit_args(&limit.algorithm)),
                None => (format!("fg:b:{{{}}}:gone", super::conn::tag(&item.resource)), [4.0, 1.0, 1e6, 0.0, 0.0]),
            };
            invocation.key(key).arg(item.delta).arg(&args[..]);
        }
        let reply: Vec<Value> = self.call("sync", |mut h| async move { invocation.invoke_async(&mut h).await }).await?;
        let num = |v: &Value| -> Option<f64> {
            match v {
                Value::Int(n) => Some(*n as f64),
                Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
                Value::SimpleString(s) => s.parse().ok(),
                _ => None,
            }
        };
        let shared: Option<Vec<Shared>> = reply
            .chunks(5)
            .map(|r| {
                Some(Shared {
                    lease: num(&r[0])?,
                    window_start: Timestamp::from_nanos(num(&r[1])? as u64 * 1000),
                    prev: num(&r[2])? as u64,
                    cur: num(&r[3])? as u64,
                    available: num(&r[4])?,
                })
            })
            .collect();
        shared.filter(|s| s.len() == batch.len())
    }
}

/// Runs futures concurrently on this task and collects their outputs in order.
pub(super) async fn futures_join<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    let mut futures: Vec<Option<_>> = futures.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    outputs.into_iter().map(|o| o.expect("every future finished")).collect()
}
