//! Decisions that may need Redis, for one request or a batch alike: every
//! item's first-touch pulls go out together, probes run concurrently, strict
//! items of one resource share one script, and a batch awaits Redis a few
//! times, not once per item.

use std::collections::HashSet;

use futures_util::future::join_all;

use super::Replication;
use floodgate_core::store::BucketKey;
use floodgate_engine::sync::{RemoteBreaker, decided_by_store};
use floodgate_engine::{Answer, Descriptors, Engine, Installed, Pending, Prepared, RequestError, Step, Verdict};

impl Replication {
    /// Decides `prepared` (one per item, in order), asking Redis where it
    /// must: first touch of replicated buckets, probes of shared breakers,
    /// strict limits. `again(i)` prepares item `i` once more, for a second
    /// decision after a sync.
    pub async fn decide_many<'r, F>(&self, mut prepared: Vec<Prepared<'r>>, again: F) -> Vec<Answer<'r>>
    where
        F: Fn(usize) -> Option<Prepared<'r>>,
    {
        // A replica that has not reached Redis yet (it just started) pulls
        // too: Redis may well answer, and it knows no bucket.
        let never_connected = !self.connected.load(std::sync::atomic::Ordering::Acquire);
        let all_held = (self.sync().up() || never_connected) && self.pull_missing(&prepared).await;
        // What is still not held (Redis did not answer, or is away) is not
        // decided from a full bucket: this replica holds no lease of it.
        // (When every bucket was held already, nothing is looked up again.)
        if !all_held {
            self.hold_unpulled(&prepared);
        }
        if self.sync().up() {
            self.ask_probes(&mut prepared).await;
            self.limits().ask_slots(&mut prepared).await;
            self.limits().ensure_leases(&prepared).await;
        }
        let mut answers = self.decide_steps(prepared).await;
        if self.sync().up() {
            self.escalate(again, &mut answers).await;
        }
        if self.sync().up() && !self.sync().outbox_is_empty() {
            self.breakers().flush_outbox(&self.engine.rules_full()).await;
        }
        answers
    }

    /// What Peek shows of a resource's limits: the figures a real call would
    /// be decided by. A replicated bucket this replica does not hold (it
    /// never used it, or forgot it after it sat idle) is pulled from Redis
    /// first, as a call would; the limits Redis decides (strict limits,
    /// replicated sliding logs) are read from Redis, taking nothing. While
    /// Redis does not answer, those show what Redis said when this replica
    /// last asked it.
    pub async fn peek<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        resource: &str,
        descriptors: &D,
        only: Option<&str>,
    ) -> Result<Answer<'r>, RequestError> {
        let (mut answer, keys) = self.engine.peek_keys(rules, resource, descriptors, only)?;
        // While Redis cannot be asked, a limit it decides shows what Redis
        // said at this replica's last call there (a real call now follows
        // the limit's `on_redis_error`).
        let last_said = |answer: &mut Answer<'r>| {
            for (report, (limit, key)) in answer.limits.iter_mut().zip(&keys) {
                if decided_by_store(limit)
                    && let Some(remaining) = self.last_from_redis(key)
                {
                    report.status.remaining = remaining;
                    report.exceeded = remaining == 0;
                }
            }
        };
        if !self.sync().up() {
            last_said(&mut answer);
            return Ok(answer);
        }
        let held = |k| self.engine.buckets().contains_key(k);
        let missing: Vec<(&str, BucketKey)> = keys
            .iter()
            .filter(|(l, k)| l.sync.is_replicated() && !decided_by_store(l) && !held(k))
            .map(|(_, k)| (resource, k.clone()))
            .collect();
        if !missing.is_empty() {
            self.limits().lease_now(missing, 0).await;
            answer = self.engine.peek_keys(rules, resource, descriptors, only)?.0;
        }
        let remote: Vec<usize> = (0..keys.len()).filter(|&i| decided_by_store(keys[i].0)).collect();
        if remote.is_empty() {
            return Ok(answer);
        }
        let asked = remote.iter().map(|&i| (keys[i].0, &keys[i].1));
        match self.limits().peek_strict(resource, asked).await {
            Some(decisions) => {
                for (&i, d) in remote.iter().zip(decisions) {
                    let report = &mut answer.limits[i];
                    report.status = d.status;
                    report.exceeded = !d.admitted;
                }
            }
            None => last_said(&mut answer),
        }
        Ok(answer)
    }

    /// Pulls every replicated bucket this process does not hold yet, all
    /// items' at once, so a restarted replica resumes where the replicas are.
    /// True when every bucket was held already (nothing was pulled).
    async fn pull_missing(&self, prepared: &[Prepared<'_>]) -> bool {
        let mut seen = HashSet::new();
        let mut missing: Vec<(&str, BucketKey)> = Vec::new();
        // A dry run too: it must be decided from the figure a real call
        // would find, not from a full bucket.
        for p in prepared {
            for (_, key) in p.replicated_keys() {
                if !self.engine.buckets().contains_key(key) && seen.insert(key) {
                    missing.push((p.resource(), key.clone()));
                }
            }
        }
        if missing.is_empty() {
            return true;
        }
        self.limits().lease_now(missing, 0).await;
        false
    }

    /// The replicated buckets of these items that this process still does
    /// not hold (their pull failed, or Redis is away): this replica holds
    /// no lease of them, and deciding from a full bucket would admit the
    /// whole limit again, beside what the other replicas hold and what was
    /// used. A replica that has reached Redis before knows how many replicas
    /// share a limit, and starts such a bucket from its share of the whole
    /// limit, as strict limits do under `on_redis_error: local`; one that
    /// never reached Redis (it started while Redis was away) knows nothing
    /// of them, and starts it empty. The next sync that reaches Redis
    /// brings its lease.
    fn hold_unpulled(&self, prepared: &[Prepared<'_>]) {
        let connected = self.connected.load(std::sync::atomic::Ordering::Acquire);
        let share = if connected { self.sync().share() } else { 0.0 };
        for p in prepared {
            for (limit, key) in p.replicated_keys() {
                if !self.engine.buckets().contains_key(key) {
                    self.sync().on(&self.engine).hold_share(&limit.algorithm, key, share);
                }
            }
        }
    }

    /// Asks the shared breakers for the probes the items need, concurrently.
    async fn ask_probes(&self, prepared: &mut [Prepared<'_>]) {
        let wanted: Vec<usize> = (0..prepared.len())
            .filter(|&i| {
                !prepared[i].dry_run()
                    && self.sync().on(&self.engine).needs_remote_probe(&prepared[i], prepared[i].resource())
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let resources: Vec<String> = wanted.iter().map(|&i| prepared[i].resource().to_string()).collect();
        let grants = join_all(resources.into_iter().map(|r| self.probe_detached(r))).await;
        for (i, grant) in wanted.into_iter().zip(grants) {
            if let Some(grant) = grant {
                prepared[i].set_remote_breaker(grant);
            }
        }
    }

    /// Asks for a probe on a task of its own: a grant whose caller went away
    /// drops there, giving the probe back.
    async fn probe_detached(&self, resource: String) -> Option<RemoteBreaker> {
        self.detached(|me| async move {
            let rules = me.engine.rules_full();
            me.breakers().probe(&rules, &resource).await
        })
        .await
        .flatten()
    }

    /// The local part of every item, then Redis's part of those with strict
    /// limits, concurrently.
    async fn decide_steps<'r>(&self, prepared: Vec<Prepared<'r>>) -> Vec<Answer<'r>> {
        let now = self.engine.clock().now();
        let mut answers: Vec<Option<Answer<'r>>> = Vec::with_capacity(prepared.len());
        let mut remote = Waiting { engine: &self.engine, items: Vec::new() };
        for p in prepared {
            match self.engine.begin(p, now) {
                Step::Done(answer) => answers.push(Some(answer)),
                Step::Remote(pending) => {
                    remote.items.push((answers.len(), pending));
                    answers.push(None);
                }
            }
        }
        if !remote.items.is_empty() {
            let pending: Vec<&Pending<'r>> = remote.items.iter().map(|(_, p)| &**p).collect();
            // Cancelled here (the caller went away), `remote` gives back
            // what the decisions took as it drops.
            let decisions = self.limits().strict(&pending).await;
            for ((i, pending), decisions) in std::mem::take(&mut remote.items).into_iter().zip(decisions) {
                answers[i] = Some(self.engine.finish(*pending, decisions));
            }
        }
        answers.into_iter().map(|a| a.expect("every item decided")).collect()
    }

    /// Items denied by this replica's lease while the replicas had more in
    /// common: those buckets are synced now (asking for a lease of at least
    /// the cost) and the items decided again. Nothing was taken the first time.
    async fn escalate<'r, F>(&self, again_for: F, answers: &mut [Answer<'r>])
    where
        F: Fn(usize) -> Option<Prepared<'r>>,
    {
        let short_lease = |a: &Answer<'_>| {
            a.verdict == Verdict::RateLimited
                && a.limits.iter().filter(|r| r.exceeded).all(|r| r.limit.sync.is_replicated())
        };
        let mut again = Vec::new();
        let mut keys = Vec::new();
        let mut want = 0;
        for (i, answer) in answers.iter().enumerate() {
            if !short_lease(answer) {
                continue;
            }
            // The first decision counted the call's keys; this one does not.
            let Some(p) = again_for(i).map(Prepared::retried) else { continue };
            if self.sync().on(&self.engine).worth_escalating(&p) {
                want = want.max(p.cost());
                again.push((i, p));
            }
        }
        for (_, p) in &again {
            keys.extend(p.replicated_keys().map(|(_, k)| (p.resource(), k.clone())));
        }
        if again.is_empty() {
            return;
        }
        metrics::counter!(floodgate_engine::metrics::REDIS_ESCALATIONS).increment(again.len() as u64);
        self.limits().lease_now(keys, want).await;
        let (index, prepared): (Vec<usize>, Vec<Prepared<'r>>) = again.into_iter().unzip();
        for (i, answer) in index.into_iter().zip(self.decide_steps(prepared).await) {
            answers[i] = answer;
        }
    }
}

/// Decisions waiting for Redis. Dropped before they finish (the future of
/// the call was dropped at the await), each gives back what it took here.
struct Waiting<'e, 'r> {
    engine: &'e Engine,
    items: Vec<(usize, Box<Pending<'r>>)>,
}

impl Drop for Waiting<'_, '_> {
    fn drop(&mut self) {
        for (_, pending) in self.items.drain(..) {
            self.engine.abandon(*pending);
        }
    }
}
