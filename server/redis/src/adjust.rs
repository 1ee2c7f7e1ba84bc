//! Strict buckets adjusted outside a decision: usage charged after the fact
//! (Charge, an estimate settled higher), units given back (an estimate
//! settled lower), what a replica admitted while Redis was away (its debts,
//! paid when Redis answers again, before the replica asks it anything else),
//! and the figures an outage starts from, kept fresh.

use std::collections::HashMap;
use std::time::Duration;

use super::Replication;
use super::scripts::{ScriptName, bucket_key, limit_args, marker_key};
use super::wire;
use floodgate_core::store::BucketKey;
use floodgate_engine::Installed;
use floodgate_engine::settle::Strict;
use floodgate_engine::sync::Debt;

/// Buckets per adjust script: long scripts would hold Redis up.
const BUCKETS_PER_SCRIPT: usize = 200;
/// Strict buckets used within this long have their figure kept fresh.
const IN_USE: Duration = Duration::from_secs(10);

/// What [`Replication::claim_and_adjust`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// The key was claimed and the units taken: what each bucket has left
    /// (`None` for one whose limit is no longer in force).
    Taken(Vec<Option<i64>>),
    /// The key was claimed before: nothing was taken.
    Before,
}

/// One strict bucket's adjustment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adjust {
    pub key: BucketKey,
    /// Taken (positive) or given back (negative).
    pub units: i64,
    /// For a give-back: Redis's time (us) of the take it is part of; 0 when
    /// unknown.
    pub at_us: i64,
}

impl Replication {
    /// Takes or gives back units on strict buckets in Redis; what each has
    /// left after. While Redis is away, or when it does not answer, they are
    /// owed instead (`None`), and paid when it answers again.
    pub async fn adjust_strict(&self, strict: &Strict) -> Option<Vec<Option<i64>>> {
        let left = self.try_adjust_strict(strict).await;
        if left.is_none() {
            self.owe_strict(strict);
        }
        left
    }

    /// [`Self::adjust_strict`] without owing what Redis did not take.
    pub async fn try_adjust_strict(&self, strict: &Strict) -> Option<Vec<Option<i64>>> {
        if strict.items.is_empty() {
            return Some(Vec::new());
        }
        let left = self.adjust_strict_claiming(strict, None).await?;
        Some(left.expect("an adjust without a claim is never a duplicate"))
    }

    /// A Charge's strict part taken together with the claim of its
    /// idempotency key `hash`, in one script: either both happen or neither
    /// (a replica that dies in between leaves no key claimed and not taken).
    /// `None` when Redis did not answer: nothing was claimed nor taken then.
    pub async fn claim_and_adjust(&self, strict: &Strict, hash: u128) -> Option<Claimed> {
        let claim = super::claim_key_name(&strict.resource, hash);
        Some(match self.adjust_strict_claiming(strict, Some(&claim)).await? {
            Some(left) => Claimed::Taken(left),
            None => Claimed::Before,
        })
    }

    /// Adjusts strict buckets in Redis, claiming the key named `claim` in the
    /// same script when there is one: what each has left after, or `None`
    /// inside when the key was claimed before (nothing changed); `None` when
    /// Redis is away or did not answer.
    async fn adjust_strict_claiming(&self, strict: &Strict, claim: Option<&str>) -> Option<Option<Vec<Option<i64>>>> {
        let sync = Some(self.sync()).filter(|s| s.up())?;
        let rules = self.engine.rules_full();
        let items: Vec<Adjust> = strict
            .items
            .iter()
            .map(|(key, units, at_us, _)| Adjust { key: key.clone(), units: *units, at_us: *at_us })
            .collect();
        let Some((at_us, left)) = self.adjust_with(&rules, &strict.resource, &items, claim).await? else {
            return Some(None);
        };
        // Redis's figure is this replica's to start an outage from, to
        // restore an emptied Redis with, and to keep fresh.
        let now = self.engine.clock().now();
        for (item, left) in items.iter().zip(&left) {
            if let Some(left) = left {
                sync.saw_strict(&item.key, &strict.resource, *left, now, at_us);
            }
        }
        Some(Some(left))
    }

    /// Units Redis did not take: owed, and taken off the figure the next
    /// outage starts from, as what is admitted during one is.
    pub fn owe_strict(&self, strict: &Strict) {
        let sync = self.sync();
        let now = self.engine.clock().now();
        for (key, units, _, _) in &strict.items {
            sync.admitted_here(key, &strict.resource, *units, now);
        }
    }

    /// Adjusts strict buckets of `resource`, once: Redis's time (us), and
    /// what each has available after (negative for a debt; `None` for a
    /// bucket whose limit is no longer in force), or `None` when Redis did
    /// not answer in time (nothing was changed then: each attempt carries a
    /// deadline). A resource Redis lost is restored first.
    pub async fn adjust(&self, rules: &Installed, resource: &str, items: &[Adjust]) -> Option<(i64, Vec<Option<i64>>)> {
        let adjusted = self.adjust_with(rules, resource, items, None).await?;
        Some(adjusted.expect("an adjust without a claim is never a duplicate"))
    }

    /// [`Self::adjust`], claiming the key named `claim` in the same script
    /// when there is one: `Some(None)` when it was claimed before (nothing
    /// changed then).
    async fn adjust_with(
        &self,
        rules: &Installed,
        resource: &str,
        items: &[Adjust],
        claim: Option<&str>,
    ) -> Option<Option<(i64, Vec<Option<i64>>)>> {
        let clock = self.engine.clock();
        if claim.is_none() && items.iter().all(|i| rules.limit(i.key.limit).is_none()) {
            return Some(Some((0, vec![None; items.len()])));
        }
        let claim_ms = u64::try_from(super::CLAIM_TTL.as_millis()).unwrap_or(u64::MAX) as f64;
        let adjusted = self
            .limits()
            .until_done(rules, resource, true, || async {
                let now = clock.now();
                let deadline = self.sync().redis_time(now.saturating_add(self.config.timeout));
                let mut invocation = self.scripts.get(ScriptName::Adjust).prepare_invoke();
                invocation.key(marker_key(resource));
                let mut args: Vec<f64> = Vec::with_capacity(items.len() * 7);
                let mut sent = 0;
                for item in items {
                    // A limit gone from the rules has nothing left to adjust.
                    let Some((_, limit)) = rules.limit(item.key.limit) else { continue };
                    invocation.key(bucket_key(resource, limit, &item.key));
                    args.extend([item.units as f64, item.at_us as f64]);
                    args.extend(limit_args(&limit.algorithm, now));
                    sent += 1;
                }
                if let Some(claim) = claim {
                    invocation.key(claim);
                    args.push(claim_ms);
                }
                invocation.arg(deadline).arg(self.sync().marker(resource)).arg(&args[..]);
                self.run(ScriptName::Adjust, invocation, |v| wire::parse_claimed_adjust(v, sent)).await
            })
            .await?;
        self.sync().mark(resource, clock.now());
        let Some((at_us, left)) = adjusted else { return Some(None) };
        let mut left = left.into_iter();
        Some(Some((at_us, items.iter().map(|i| rules.limit(i.key.limit).and_then(|_| left.next())).collect())))
    }

    /// Pays what is owed to strict buckets, one script per resource and
    /// chunk. What could not be paid is owed again; false then.
    pub(super) async fn pay(&self, rules: &Installed, debts: Vec<(BucketKey, Debt)>) -> bool {
        let mut by_resource: HashMap<String, Vec<Adjust>> = HashMap::new();
        for (key, debt) in debts {
            by_resource.entry(debt.resource).or_default().push(Adjust { key, units: debt.units, at_us: 0 });
        }
        let mut paid = true;
        for (resource, items) in by_resource {
            for chunk in items.chunks(BUCKETS_PER_SCRIPT) {
                if !paid || self.adjust(rules, &resource, chunk).await.is_none() {
                    paid = false;
                    for item in chunk {
                        self.sync().owe(&item.key, &resource, item.units);
                    }
                    continue;
                }
                metrics::counter!(floodgate_engine::metrics::REDIS_DEBTS_PAID).increment(chunk.len() as u64);
                tracing::info!(resource, buckets = chunk.len(), "paid what was admitted here while Redis was away");
            }
        }
        paid
    }

    /// Redis answered a heartbeat. If it had been away, what was admitted
    /// here meanwhile is paid before decisions ask it again; then any debt
    /// left (from a decision that raced the switch) at once. False when
    /// Redis stopped answering again.
    pub(super) async fn come_back(&self, rules: &Installed) -> bool {
        // Charges' idempotency keys noted here meanwhile, first: a retry
        // sent to another replica once Redis answers is then caught.
        if !self.pay_claims().await {
            return false;
        }
        if self.sync().up() {
            let debts = self.sync().take_debts();
            return debts.is_empty() || self.pay(rules, debts).await;
        }
        // Decisions made while paying add debts: a few rounds, then the
        // switch takes what is left in the same instant and pays it.
        for _ in 0..3 {
            let debts = self.sync().take_debts();
            if debts.is_empty() {
                break;
            }
            if !self.pay(rules, debts).await {
                return false;
            }
        }
        let Some(rest) = self.sync().come_back(false) else { return false };
        if self.connected.swap(true, std::sync::atomic::Ordering::AcqRel) {
            tracing::info!("Redis answers again: deciding through it");
        } else {
            tracing::info!("connected to Redis");
        }
        self.sync().on(&self.engine).end_outage();
        rest.is_empty() || self.pay(rules, rest).await
    }

    /// Reads what the strict buckets in use here have left, so that an
    /// outage starts from what Redis holds, not from this replica's last
    /// decision (other replicas decide too).
    pub(super) async fn refresh_strict(&self, rules: &Installed) {
        let now = self.engine.clock().now();
        let mut by_resource: HashMap<String, Vec<Adjust>> = HashMap::new();
        for (resource, key) in self.sync().strict_in_use(now, IN_USE) {
            by_resource.entry(resource).or_default().push(Adjust { key, units: 0, at_us: 0 });
        }
        for (resource, items) in by_resource {
            for chunk in items.chunks(BUCKETS_PER_SCRIPT) {
                let Some((at_us, left)) = self.adjust(rules, &resource, chunk).await else { return };
                let now = self.engine.clock().now();
                for (item, available) in chunk.iter().zip(left) {
                    if let Some(available) = available {
                        self.sync().refreshed_strict(&item.key, available, now, at_us);
                    }
                }
            }
        }
    }
}
