//! Decisions and what comes back after them: Acquire (one or a batch),
//! ReportOutcome (one or a batch), Charge and Peek.

use std::sync::Arc;

use super::{Decider, FromAnswer};
use crate::engine::request::check_batch;
use crate::engine::settle::{Charged, Strict};
use crate::engine::{
    Answer, Descriptors, Engine, Installed, Prepared, Report, Reported, Request, RequestError, Verdict,
};
use crate::replication::Replication;

impl Decider {
    /// One decision, as the caller's type.
    pub async fn acquire<D, R>(&self, req: &Request<'_, D>) -> Result<R, RequestError>
    where
        D: Descriptors + Sync + ?Sized,
        R: for<'r> FromAnswer<Answer<'r>>,
    {
        match &self.replication {
            None => {
                let rules = self.engine.rules();
                let answer = self.engine.acquire(&rules, req)?;
                Ok(self.answered(req, answer))
            }
            // Boxed: the memory-only call's future stays small.
            Some(replication) => Box::pin(self.acquire_replicated(replication, req)).await,
        }
    }

    async fn acquire_replicated<D, R>(&self, replication: &Replication, req: &Request<'_, D>) -> Result<R, RequestError>
    where
        D: Descriptors + Sync + ?Sized,
        R: for<'r> FromAnswer<Answer<'r>>,
    {
        let rules = self.engine.rules_full();
        let prepared = vec![self.engine.prepare(&rules, req)?];
        let answer = self.decide_replicated(replication, &rules, std::slice::from_ref(req), prepared).await;
        Ok(self.answered(req, answer.into_iter().next().expect("one answer per request")))
    }

    /// Independent decisions, answered in order. Every item is checked first:
    /// one bad item refuses the whole batch (named `field[i]`), taking nothing.
    pub async fn acquire_many<D, R>(&self, field: &'static str, reqs: &[Request<'_, D>]) -> Result<Vec<R>, RequestError>
    where
        D: Descriptors + Sync + ?Sized,
        R: for<'r> FromAnswer<Answer<'r>>,
    {
        check_batch(field, reqs.len())?;
        let Some(replication) = &self.replication else {
            let rules = self.engine.rules();
            let prepared = prepare_all(&self.engine, &rules, field, reqs)?;
            let now = self.engine.clock().now();
            let answers =
                prepared.into_iter().zip(reqs).map(|(p, req)| self.engine.decide_waterfall(&rules, req, p, now));
            return Ok(answers.zip(reqs).map(|(a, req)| self.answered(req, a)).collect());
        };
        let rules = self.engine.rules_full();
        let prepared = prepare_all(&self.engine, &rules, field, reqs)?;
        let answers = self.decide_replicated(replication, &rules, reqs, prepared).await;
        Ok(answers.into_iter().zip(reqs).map(|(a, req)| self.answered(req, a)).collect())
    }

    /// Decides prepared requests with Redis and then, for each one its
    /// limits denied whose rule has a waterfall, the later sources in turn
    /// (all the items that go on to a source in one round), until one pays
    /// or none is left.
    async fn decide_replicated<'r, D: Descriptors + Sync + ?Sized>(
        &self,
        replication: &Replication,
        rules: &'r Installed,
        reqs: &[Request<'_, D>],
        prepared: Vec<Prepared<'r>>,
    ) -> Vec<Answer<'r>> {
        let mut next: Vec<_> = prepared.iter().map(|p| (p.next_source(), p.source_name())).collect();
        let again = |i: usize| self.engine.prepare(rules, &reqs[i]).ok();
        let mut answers = replication.decide_many(prepared, again).await;
        for (answer, (_, paid_by)) in answers.iter_mut().zip(&next) {
            answer.paid_by = paid_by.filter(|_| answer.verdict == Verdict::Allowed);
        }
        loop {
            // The items that go on, each with the source that is asked next.
            let mut items = Vec::new();
            let mut round = Vec::new();
            for (i, answer) in answers.iter().enumerate() {
                let Some(n) = next[i].0.filter(|_| answer.limits_denied()) else { continue };
                next[i].0 = None;
                if let Some(p) = self.engine.prepare_source(rules, &reqs[i], n) {
                    next[i] = (p.next_source(), p.source_name());
                    items.push((i, p.source()));
                    round.push(p);
                }
            }
            if round.is_empty() {
                return answers;
            }
            let again = |j: usize| {
                let (i, n) = items[j];
                self.engine.prepare_source(rules, &reqs[i], n).filter(|p| p.source() == n)
            };
            let later = replication.decide_many(round, again).await;
            for ((i, _), mut answer) in items.iter().zip(later) {
                answer.paid_by = next[*i].1.filter(|_| answer.verdict == Verdict::Allowed);
                answers[*i].then_source(answer, u64::from(reqs[*i].cost));
            }
        }
    }

    /// Every decided call, however it was decided: shown to the what-if
    /// running (if any) and offered to the decision log, translated.
    #[inline]
    fn answered<'r, D: Descriptors + ?Sized, R: FromAnswer<Answer<'r>>>(
        &self,
        req: &Request<'_, D>,
        answer: Answer<'r>,
    ) -> R {
        if let Some(w) = &*self.what_if.load() {
            w.observe(req, answer.verdict == Verdict::Allowed, self.engine.clock().now());
        }
        if self.decisions.wants() {
            self.decisions.keep(req, &answer);
        }
        R::from_answer(answer)
    }

    /// Takes a permit back with the call's outcome.
    pub async fn report(&self, r: &Report<'_>) -> Result<Reported, RequestError> {
        let (reported, strict) = self.report_here(r)?;
        if let Some(replication) = &self.replication {
            replication.adjust_strict(&strict).await;
            replication.breakers().after_report().await;
            if !reported.counted {
                return self.forward(replication, r).await.unwrap_or(Ok(reported));
            }
        }
        Ok(reported)
    }

    /// A report of a permit another live replica issued, passed on to it.
    async fn forward(&self, replication: &Replication, r: &Report<'_>) -> Option<Result<Reported, RequestError>> {
        Some(match replication.forward(r).await? {
            Err(RequestError::PermitResourceMismatch { .. }) => {
                Err(RequestError::PermitResourceMismatch { resource: r.resource.to_string() })
            }
            answer => answer,
        })
    }

    /// Handles the reports other replicas pass on for permits this one
    /// issued, until the server stops; `None` without Redis.
    pub(crate) fn spawn_forwarded_reports(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let mut inbox = self.replication.as_ref()?.forwarded_reports()?;
        let weak = Arc::downgrade(self);
        // A few at a time: each may wait on Redis (a strict settle).
        let room = Arc::new(tokio::sync::Semaphore::new(64));
        Some(tokio::spawn(async move {
            while let Some(f) = inbox.recv().await {
                let Some(decider) = weak.upgrade() else { return };
                let Ok(seat) = room.clone().acquire_owned().await else { return };
                tokio::spawn(async move {
                    let answer = decider.report(&f.report()).await;
                    if let Some(replication) = &decider.replication {
                        replication.answer_forwarded(&f, &answer).await;
                    }
                    drop(seat);
                });
            }
        }))
    }

    /// Many outcomes, in order; the first that cannot be taken stops the batch.
    pub(crate) async fn report_many(
        &self,
        field: &'static str,
        reports: &[Report<'_>],
    ) -> Result<Vec<Reported>, RequestError> {
        check_batch(field, reports.len())?;
        // One item refused refuses the batch before any item is applied.
        for (i, r) in reports.iter().enumerate() {
            self.check_report(r).map_err(|e| e.in_batch(field, i))?;
        }
        let mut reported = Vec::with_capacity(reports.len());
        let mut strict = Vec::new();
        let mut refused = None;
        for (i, r) in reports.iter().enumerate() {
            match self.report_here(r) {
                Ok((one, adjust)) => {
                    reported.push(one);
                    strict.push(adjust);
                }
                Err(e) => {
                    refused = Some(e.in_batch(field, i));
                    break;
                }
            }
        }
        if let Some(replication) = &self.replication {
            for adjust in strict {
                replication.adjust_strict(&adjust).await;
            }
            replication.breakers().after_report().await;
            // Reports of other replicas' permits, passed on. One the issuer
            // refuses (another resource) is answered `counted: false` here:
            // the rest of the batch was applied already.
            for (one, r) in reported.iter_mut().zip(reports).filter(|(one, _)| !one.counted) {
                if let Some(Ok(answer)) = replication.forward(r).await {
                    *one = answer;
                }
            }
        }
        refused.map_or(Ok(reported), Err)
    }

    /// The errors a report's settlement would meet (usage its rule refuses),
    /// found before anything is applied: the outcome is not counted either.
    fn check_report(&self, r: &Report<'_>) -> Result<(), RequestError> {
        // Without usage, a settlement refuses only a cost too large, which
        // needs no lookup; usage needs the permit's rule.
        if r.usage.is_none() {
            return r.actual_cost.map_or(Ok(()), |value| crate::engine::request::check_cost("actual_cost", value));
        }
        let rules = self.engine.rules();
        match self.engine.charges().check_settle(&rules, r.permit_id, r.resource, r.actual_cost, r.usage) {
            // Answered as before, by the report itself.
            Ok(()) | Err(RequestError::PermitResourceMismatch { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn report_here(&self, r: &Report<'_>) -> Result<(Reported, Strict), RequestError> {
        self.check_report(r)?;
        let rules = self.engine.rules();
        let mut reported = self.engine.outcomes().report(&rules, r.resource, r.permit_id, r.outcome, r.latency)?;
        // A permit of an Acquire with `settle`: its estimate is settled (or,
        // without an actual cost, stands) whether or not it also guarded a call.
        match self.engine.charges().settle_estimate(&rules, r.permit_id, r.resource, r.actual_cost, r.usage) {
            Ok(settled) => {
                reported.settled = settled.settled;
                // A permit of an estimate is counted when reported, settled
                // or not (without an actual cost its estimate stands).
                reported.counted |= settled.known;
                Ok((reported, settled.strict))
            }
            Err(RequestError::PermitResourceMismatch { .. }) if reported.counted => Ok((reported, Strict::default())),
            Err(e) => Err(e),
        }
    }

    /// `Charge`: takes `cost` from every limit the request matches, beyond
    /// the limit if need be (strict limits in Redis; owed to it while it is
    /// away). A charge whose idempotency `key` was seen before takes nothing
    /// and says so (see `charged_keys`).
    pub async fn charge<D, R>(
        &self,
        resource: &str,
        descriptors: &D,
        cost: u64,
        usage: Option<&crate::engine::request::Usage>,
        key: &str,
    ) -> Result<R, RequestError>
    where
        D: Descriptors + ?Sized,
        R: for<'r> FromAnswer<Charged<'r>>,
    {
        let rules = self.engine.rules_full();
        if !key.is_empty() {
            super::charged_keys::check_key(key)?;
        }
        // Bad input is refused before the key is claimed: a corrected charge
        // sent again with the key is still the first.
        let plan = self.engine.charges().plan_charge(&rules, resource, descriptors, cost, usage)?;
        let hash = (!key.is_empty() && plan.is_some()).then(|| self.charged_keys.hash(resource, descriptors, key));
        // Taken before: the limits as they are now (strict ones as Redis
        // holds them), as a peek reads them.
        let duplicate = async || -> Result<R, RequestError> {
            let answer = self.peeked(&rules, resource, descriptors, None).await?;
            let seen = Charged { limits: answer.limits, strict: Strict::default(), duplicate: true, paid_by: None };
            Ok(R::from_answer(seen))
        };
        if let Some(hash) = hash
            && !self.charged_keys.first(hash, self.engine.clock().now())
        {
            return duplicate().await;
        }
        // What Redis took of the charge together with the claim of its key.
        let mut taken_in_redis = None;
        let plan = match (plan, hash) {
            (Some(p), hash) if p.waterfall() > 0 => {
                if let Some(hash) = hash
                    && !self.claim_alone(resource, hash).await
                {
                    return duplicate().await;
                }
                match self.charge_waterfall(&rules, resource, descriptors, cost, usage).await {
                    Ok(charged) => return Ok(R::from_answer(charged)),
                    Err(last) => last,
                }
            }
            (Some(p), Some(hash)) => {
                let strict = self.engine.charges().strict_part(resource, &p);
                match &self.replication {
                    // Redis takes a part: it claims the key in the same script,
                    // so that a replica dying in between cannot leave the key
                    // claimed and the charge not taken.
                    Some(replication) if !strict.items.is_empty() => {
                        match replication.claim_and_adjust(&strict, hash).await {
                            Some(floodgate_redis::Claimed::Before) => return duplicate().await,
                            Some(floodgate_redis::Claimed::Taken(left)) => taken_in_redis = Some(left),
                            // No answer: nothing was claimed nor taken. The
                            // claim is made alone (owed while Redis is away).
                            None if !self.claim_alone(resource, hash).await => return duplicate().await,
                            None => {}
                        }
                    }
                    _ if !self.claim_alone(resource, hash).await => return duplicate().await,
                    _ => {}
                }
                Some(p)
            }
            (plan, _) => plan,
        };
        let mut charged = self.engine.charges().take_charge(resource, plan);
        if let Some(replication) = &self.replication {
            let strict = std::mem::take(&mut charged.strict);
            let left = match taken_in_redis {
                Some(left) => Some(left),
                None => replication.try_adjust_strict(&strict).await,
            };
            match left {
                Some(left) => {
                    for ((_, _, _, pos), available) in strict.items.iter().zip(left) {
                        let Some(available) = available else { continue };
                        let report = &mut charged.limits[*pos];
                        report.status.remaining = available.max(0) as u64;
                        report.exceeded = available <= 0;
                    }
                }
                // Owed: `local` limits take it from the outage's bucket here
                // too (first: the bucket starts from what was left before it).
                None => {
                    for (key, units, _, pos) in &strict.items {
                        let report = &mut charged.limits[*pos];
                        let units = u64::try_from(*units).unwrap_or(0);
                        if let Some(status) = self.engine.charge_in_outage(report.limit, key, units) {
                            report.exceeded = status.remaining == 0;
                            report.status = status;
                        }
                    }
                    replication.owe_strict(&strict);
                }
            }
        }
        Ok(R::from_answer(charged))
    }

    /// A charge to a rule with a waterfall: taken from the first source
    /// (the rule's own limits first) whose every limit has room for it, all
    /// or nothing, as a decision takes a call (strict limits in Redis, so
    /// that two replicas never both take the last room). When no source
    /// has room, `Err` with the plan of the last source that applies: the
    /// charge is taken from it into debt, as any charge beyond a limit, and
    /// the caller is told that no source has room.
    async fn charge_waterfall<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        resource: &str,
        descriptors: &D,
        cost: u64,
        usage: Option<&crate::engine::request::Usage>,
    ) -> Result<Charged<'r>, Option<crate::engine::settle::ChargePlan<'r>>> {
        let req =
            Request { cost: u32::try_from(cost).unwrap_or(u32::MAX), usage, ..Request::new(resource, descriptors) };
        let sources = rules.find(resource).map_or(0, |(r, _)| r.waterfall_len());
        for n in 0..=sources {
            let Some(p) = self.engine.prepare_charge(rules, &req, cost, n) else { continue };
            let paid_by = p.source_name();
            let answer = match &self.replication {
                None => self.engine.decide(p, self.engine.clock().now()),
                Some(replication) => {
                    let again = |_| self.engine.prepare_charge(rules, &req, cost, n);
                    let answer = replication.decide_many(vec![p], again).await.into_iter().next();
                    answer.expect("one answer per request")
                }
            };
            if answer.verdict == Verdict::Allowed {
                return Ok(Charged { limits: answer.limits, strict: Strict::default(), duplicate: false, paid_by });
            }
        }
        let charges = self.engine.charges();
        let last = (0..=sources).rev().find_map(|n| {
            let plan = charges.plan_charge_from(rules, resource, descriptors, cost, usage, n).ok().flatten();
            plan.filter(|p| !p.is_empty())
        });
        Err(last)
    }

    /// Tops up (`amount` above 0) or takes from the balance named `limit`
    /// of `resource` for these descriptors; what it holds after, and its
    /// `max_balance`. A strict balance changes in Redis or not at all.
    pub async fn adjust_balance<D: Descriptors + ?Sized>(
        &self,
        resource: &str,
        descriptors: &D,
        limit: &str,
        amount: i64,
    ) -> Result<(i64, u64), RequestError> {
        use crate::engine::settle::{BalanceChange, check_top_up};
        let rules = self.engine.rules_full();
        match self.engine.charges().plan_balance(&rules, resource, descriptors, limit, amount)? {
            BalanceChange::Here { balance, max } => Ok((balance, max)),
            BalanceChange::Strict { strict, max } => {
                let Some(replication) = &self.replication else { return Err(RequestError::BalanceUnavailable) };
                // What Redis holds now (0 while it owes: a top-up pays that
                // first, so the check is never too strict).
                let now = replication.peek(&rules, resource, descriptors, Some(limit)).await?;
                let before = now.limits.first().map_or(0, |l| i64::try_from(l.status.remaining).unwrap_or(i64::MAX));
                check_top_up(before, amount, max)?;
                match replication.try_adjust_strict(&strict).await {
                    Some(left) => Ok((left.first().copied().flatten().unwrap_or(0), max)),
                    None => Err(RequestError::BalanceUnavailable),
                }
            }
        }
    }

    /// Whether the charge whose key hashes to `hash`, first on this replica
    /// (noted in `charged_keys`, so that one sent while Redis is away, or
    /// after it lost its keys, is caught here), is the first in Redis too:
    /// claimed there when it answers, so that a retry sent to another
    /// replica is caught. Used when Redis takes no part of the charge with
    /// the claim (see `Replication::claim_and_adjust`).
    ///
    /// Only the charge that is first here claims the key in Redis. If every
    /// charge of the name claimed, a later one could win the claim in
    /// Redis while the first here lost it, and both would answer
    /// "duplicate": the charge would be taken by nobody.
    async fn claim_alone(&self, resource: &str, hash: u128) -> bool {
        match &self.replication {
            Some(replication) => replication.claim_key(resource, hash).await.unwrap_or(true),
            None => true,
        }
    }

    /// A resource's limits for these descriptors, consuming nothing; `only`
    /// keeps one limit by name (an error when it did not match). With Redis,
    /// the figures a real call would be decided by (see
    /// [`Replication::peek`]).
    pub async fn peek<D, R>(&self, resource: &str, descriptors: &D, only: Option<&str>) -> Result<R, RequestError>
    where
        D: Descriptors + ?Sized,
        R: for<'r> FromAnswer<Answer<'r>>,
    {
        let rules = self.engine.rules();
        let answer = self.peeked(&rules, resource, descriptors, only).await?;
        if let Some(limit) = only
            && answer.limits.is_empty()
        {
            return Err(RequestError::NoSuchLimit { resource: resource.into(), limit: limit.into() });
        }
        Ok(R::from_answer(answer))
    }

    /// What a peek reads: with Redis, the figures a real call would be
    /// decided by; else this process's.
    async fn peeked<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r crate::engine::Installed,
        resource: &str,
        descriptors: &D,
        only: Option<&str>,
    ) -> Result<Answer<'r>, RequestError> {
        match &self.replication {
            Some(replication) => replication.peek(rules, resource, descriptors, only).await,
            None => self.engine.peek(rules, resource, descriptors, only),
        }
    }
}

/// Checks and matches every item before any is decided.
fn prepare_all<'r, D: Descriptors + ?Sized>(
    engine: &Engine,
    rules: &'r Installed,
    field: &'static str,
    reqs: &[Request<'_, D>],
) -> Result<Vec<Prepared<'r>>, RequestError> {
    reqs.iter().enumerate().map(|(i, r)| engine.prepare(rules, r).map_err(|e| e.in_batch(field, i))).collect()
}
