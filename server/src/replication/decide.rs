//! Decisions that may need Redis, for one request or a batch alike: every
//! item's first-touch pulls go out together, probes run concurrently, strict
//! items of one resource share one script, and a batch awaits Redis a few
//! times, not once per item.

use std::collections::HashSet;

use super::{Replication, join_all};
use crate::engine::{Answer, Descriptors, Installed, Pending, Prepared, Request, Step, Verdict};
use crate::rules::SyncMode;
use crate::store::BucketKey;

impl Replication {
    /// Decides `prepared` (one per request, in order), asking Redis where it
    /// must: first touch of replicated buckets, probes of shared breakers,
    /// strict limits.
    pub async fn decide_many<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        reqs: &[Request<'_, D>],
        mut prepared: Vec<Prepared<'r>>,
    ) -> Vec<Answer<'r>> {
        if self.sync().up() {
            self.pull_missing(rules, reqs, &prepared).await;
            self.ask_probes(rules, reqs, &mut prepared).await;
        }
        let mut answers = self.decide_steps(rules, prepared).await;
        if self.sync().up() {
            self.escalate(rules, reqs, &mut answers).await;
        }
        if !self.sync().outbox_is_empty() {
            self.flush_outbox(&self.engine.rules_full()).await;
        }
        answers
    }

    /// Pulls every replicated bucket this process does not hold yet, all
    /// items' at once, so a restarted replica resumes where the replicas are.
    async fn pull_missing<D: Descriptors + ?Sized>(
        &self,
        rules: &Installed,
        reqs: &[Request<'_, D>],
        prepared: &[Prepared<'_>],
    ) {
        let mut seen = HashSet::new();
        let mut missing: Vec<(&str, BucketKey)> = Vec::new();
        for (req, p) in reqs.iter().zip(prepared).filter(|(r, _)| !r.dry_run) {
            for (_, key) in p.replicated_keys() {
                if !self.engine.buckets().contains_key(key) && seen.insert(key) {
                    missing.push((req.resource, key.clone()));
                }
            }
        }
        if !missing.is_empty() {
            self.lease_now(rules, missing, 0).await;
        }
    }

    /// Asks the shared breakers for the probes the items need, concurrently.
    async fn ask_probes<D: Descriptors + ?Sized>(
        &self,
        rules: &Installed,
        reqs: &[Request<'_, D>],
        prepared: &mut [Prepared<'_>],
    ) {
        let wanted: Vec<usize> = (0..reqs.len())
            .filter(|&i| !reqs[i].dry_run && self.engine.needs_remote_probe(&prepared[i], reqs[i].resource))
            .collect();
        if wanted.is_empty() {
            return;
        }
        let grants = join_all(wanted.iter().map(|&i| self.probe(rules, reqs[i].resource))).await;
        for (i, grant) in wanted.into_iter().zip(grants) {
            if let Some(grant) = grant {
                prepared[i].set_remote_breaker(grant);
            }
        }
    }

    /// The local part of every item, then Redis's part of those with strict
    /// limits, concurrently.
    async fn decide_steps<'r>(&self, rules: &Installed, prepared: Vec<Prepared<'r>>) -> Vec<Answer<'r>> {
        let now = self.engine.clock().now();
        let mut answers: Vec<Option<Answer<'r>>> = Vec::with_capacity(prepared.len());
        let mut remote = Vec::new();
        for p in prepared {
            match self.engine.begin(p, now) {
                Step::Done(answer) => answers.push(Some(answer)),
                Step::Remote(pending) => {
                    remote.push((answers.len(), pending));
                    answers.push(None);
                }
            }
        }
        if !remote.is_empty() {
            let pending: Vec<&Pending<'r>> = remote.iter().map(|(_, p)| &**p).collect();
            let decisions = self.strict(rules, &pending).await;
            for ((i, pending), decisions) in remote.into_iter().zip(decisions) {
                answers[i] = Some(self.engine.finish(*pending, decisions));
            }
        }
        answers.into_iter().map(|a| a.expect("every item decided")).collect()
    }

    /// Items denied by this replica's lease while the replicas had more in
    /// common: those buckets are synced now (asking for a lease of at least
    /// the cost) and the items decided again. Nothing was taken the first time.
    async fn escalate<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        reqs: &[Request<'_, D>],
        answers: &mut [Answer<'r>],
    ) {
        let short_lease = |a: &Answer<'_>| {
            a.verdict == Verdict::RateLimited
                && a.limits.iter().filter(|r| r.exceeded).all(|r| r.limit.sync == SyncMode::Replicated)
        };
        let mut again = Vec::new();
        let mut keys = Vec::new();
        let mut want = 0;
        for (i, answer) in answers.iter().enumerate() {
            if !short_lease(answer) {
                continue;
            }
            let Ok(p) = self.engine.prepare(rules, &reqs[i]) else { continue };
            if self.engine.worth_escalating(&p) {
                keys.extend(p.replicated_keys().map(|(_, k)| (reqs[i].resource, k.clone())));
                want = want.max(p.cost());
                again.push((i, p));
            }
        }
        if again.is_empty() {
            return;
        }
        metrics::counter!(crate::metrics::REDIS_ESCALATIONS).increment(again.len() as u64);
        self.lease_now(rules, keys, want).await;
        let (index, prepared): (Vec<usize>, Vec<Prepared<'r>>) = again.into_iter().unzip();
        for (i, answer) in index.into_iter().zip(self.decide_steps(rules, prepared).await) {
            answers[i] = answer;
        }
    }
}
