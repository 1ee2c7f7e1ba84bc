//! Leases through the decision path: a grant is an Acquire of the granted
//! units with `settle` (so replicated and strict limits take them as they take
//! any cost), and a renewal or return settles the previous lease at what was
//! used (see `engine::lease` and `engine::settle`).

use std::time::Duration;

use super::Decider;
use crate::engine::lease::{NotLeasable, Plan};
use crate::engine::{Answer, Descriptors, Request, RequestError, Verdict};

/// Extra time the server keeps a lease's estimate past its end, for a
/// return that arrives late.
pub const GRACE: Duration = Duration::from_secs(5);

/// A lease asked for.
pub struct LeaseAsk<'a, D: ?Sized> {
    pub resource: &'a str,
    pub descriptors: &'a D,
    /// Units wanted for the lease's time; 0: a fair share.
    pub want: u64,
    /// The lease this renews or returns, and how much of it was used.
    pub previous: &'a str,
    pub used: u64,
    /// Who holds it: fair shares are per holder.
    pub holder: &'a str,
    /// Only return `previous`; grant nothing.
    pub release: bool,
}

/// The answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leased {
    /// Why these limits may not be leased; `None` when they may.
    pub not_leasable: Option<NotLeasable>,
    pub lease_id: String,
    pub granted: u64,
    pub ttl: Duration,
    /// With nothing granted: when to ask again.
    pub retry_after: Duration,
    /// The previous lease was settled at `used`.
    pub returned: bool,
}

/// What a grant's Acquire came to.
struct Granted {
    verdict: Verdict,
    permit_id: Option<String>,
    retry_after: Duration,
    /// What the limits hold after it (the least of them).
    available: u64,
}

impl From<Answer<'_>> for Granted {
    fn from(a: Answer<'_>) -> Self {
        let available = a.limits.iter().map(|l| l.status.remaining).min().unwrap_or(0);
        let permit_id = a.permit_id.map(|p| p.to_string());
        Granted { verdict: a.verdict, permit_id, retry_after: a.retry_after, available }
    }
}

impl Decider {
    /// Settles lease `previous` at `used`; whether it held an estimate.
    async fn return_lease(&self, resource: &str, previous: &str, used: u64) -> Result<bool, RequestError> {
        let settled = self.engine.settle_lease(&self.engine.rules(), previous, resource, used)?;
        if let Some(replication) = &self.replication {
            self.adjust_strict(replication, settled.strict).await;
        }
        Ok(settled.settled)
    }

    /// Grants, renews or returns a lease.
    pub async fn lease<D: Descriptors + Sync + ?Sized>(&self, ask: &LeaseAsk<'_, D>) -> Result<Leased, RequestError> {
        let mut out = Leased::default();
        if !ask.previous.is_empty() {
            out.returned = self.return_lease(ask.resource, ask.previous, ask.used).await?;
        }
        if ask.release {
            return Ok(out);
        }
        let rules = self.engine.rules_full();
        let plan = match self.engine.lease_plan(&rules, ask.resource, ask.descriptors, ask.want, ask.holder)? {
            Ok(plan) => plan,
            Err(why) => {
                ::metrics::counter!(crate::metrics::LEASES, "result" => "not_leasable").increment(1);
                out.not_leasable = Some(why);
                return Ok(out);
            }
        };
        out.ttl = plan.ttl;
        if plan.grant == 0 {
            ::metrics::counter!(crate::metrics::LEASES, "result" => "empty").increment(1);
            out.retry_after = plan.ask_again_in(plan.retry_after);
            return Ok(out);
        }
        self.grant(ask, &plan, out).await
    }

    /// Takes what `plan` grants, as an Acquire with `settle`. The plan read
    /// this replica's memory; taking may find less: then what the plan says
    /// to take instead.
    async fn grant<D: Descriptors + Sync + ?Sized>(
        &self,
        ask: &LeaseAsk<'_, D>,
        plan: &Plan,
        mut out: Leased,
    ) -> Result<Leased, RequestError> {
        let mut cost = u32::try_from(plan.grant).unwrap_or(u32::MAX);
        let mut attempt = 0;
        loop {
            let req = Request { cost, settle: true, ..Request::new(ask.resource, ask.descriptors) };
            let granted: Granted = self.acquire(&req).await?;
            match (granted.verdict, granted.permit_id) {
                (Verdict::Allowed, Some(id)) => {
                    let until = self.engine.clock().now().saturating_add(plan.ttl + GRACE);
                    self.engine.hold_estimate_until(&id, until);
                    ::metrics::counter!(crate::metrics::LEASES, "result" => "granted").increment(1);
                    ::metrics::counter!(crate::metrics::LEASED_UNITS).increment(u64::from(cost));
                    out.lease_id = id;
                    out.granted = u64::from(cost);
                    return Ok(out);
                }
                _ => match plan.after_shortfall(attempt, granted.available) {
                    Some(units) => {
                        cost = u32::try_from(units).unwrap_or(u32::MAX);
                        attempt += 1;
                    }
                    None => {
                        ::metrics::counter!(crate::metrics::LEASES, "result" => "empty").increment(1);
                        out.retry_after = plan.ask_again_in(granted.retry_after);
                        return Ok(out);
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::engine::{Engine, EngineConfig};
    use crate::rules::RuleSet;
    use crate::time::{ManualClock, Timestamp};

    const RULES: &str = r#"
resources:
  - name: api
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 100, window: 1h, lease: 2s }
  - name: mixed
    limits:
      - { name: leased, algorithm: fixed_window, limit: 100, window: 1h, lease: 2s }
      - { name: exact, algorithm: fixed_window, limit: 100, window: 1h }
  - name: guarded
    limits:
      - { name: l, algorithm: fixed_window, limit: 100, window: 1h, lease: 2s }
    breaker: { window: { kind: count, size: 10 } }
"#;

    fn decider(rules: &str) -> (Decider, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_700_006_400)));
        let engine = Arc::new(Engine::new(EngineConfig { max_keys: 1000, replicated: false }, clock.clone()));
        engine.install(RuleSet::from_yaml(rules, "t").unwrap(), rules.into(), "test".into());
        (Decider::new(engine, None), clock)
    }

    fn user(u: &str) -> HashMap<String, String> {
        [("user".to_string(), u.to_string())].into()
    }

    async fn lease(d: &Decider, holder: &str, want: u64, previous: &str, used: u64) -> Leased {
        let descriptors = user("u1");
        let ask = LeaseAsk { resource: "api", descriptors: &descriptors, want, previous, used, holder, release: false };
        d.lease(&ask).await.unwrap()
    }

    async fn remaining(d: &Decider) -> u64 {
        let rules = d.engine.rules();
        let answer: crate::engine::Answer = d.engine.peek(&rules, "api", &user("u1"), None).unwrap();
        answer.limits[0].status.remaining
    }

    #[tokio::test]
    async fn a_lease_takes_its_units_and_a_renewal_gives_back_what_was_not_used() {
        let (d, _) = decider(RULES);
        let a = lease(&d, "a", 50, "", 0).await;
        assert!(a.not_leasable.is_none(), "{a:?}");
        assert_eq!((a.granted, a.ttl), (50, Duration::from_secs(2)));
        assert_eq!(remaining(&d).await, 50, "taken when granted: never more admitted than the limit holds");
        // Used 10 of 50: 40 come back, and the new lease takes 15.
        let renewed = lease(&d, "a", 15, &a.lease_id, 10).await;
        assert!(renewed.returned);
        assert_eq!(renewed.granted, 15);
        assert_eq!(remaining(&d).await, 100 - 10 - 15);
        // Returned for good: only the used part stays taken.
        let descriptors = user("u1");
        let ask = LeaseAsk {
            resource: "api",
            descriptors: &descriptors,
            want: 0,
            previous: &renewed.lease_id,
            used: 5,
            holder: "a",
            release: true,
        };
        let done = d.lease(&ask).await.unwrap();
        assert!(done.returned && done.lease_id.is_empty());
        assert_eq!(remaining(&d).await, 100 - 10 - 5);
        // A second return of the same lease gives nothing back.
        assert!(!lease(&d, "a", 0, &renewed.lease_id, 0).await.returned);
    }

    async fn release(d: &Decider, holder: &str, previous: &str, used: u64) -> bool {
        let descriptors = user("u1");
        let ask =
            LeaseAsk { resource: "api", descriptors: &descriptors, want: 0, previous, used, holder, release: true };
        d.lease(&ask).await.unwrap().returned
    }

    #[tokio::test]
    async fn shares_are_fair_among_holders_and_never_exceed_what_is_available() {
        let (d, _) = decider(RULES);
        let x = lease(&d, "x", 0, "", 0).await;
        assert_eq!(x.granted, 100, "alone: all of it");
        let b = lease(&d, "b", 0, "", 0).await;
        assert_eq!(b.granted, 0);
        assert!(b.retry_after > Duration::ZERO, "nothing left: told when to ask again");
        assert!(release(&d, "x", &x.lease_id, 10).await);
        assert_eq!(remaining(&d).await, 90);
        // Three holders seen (x, b, y): a third each of what is left.
        assert_eq!(lease(&d, "y", 0, "", 0).await.granted, 30);
        assert_eq!(lease(&d, "x", 500, "", 0).await.granted, 20, "never more than a fair share, whatever is asked");
        assert_eq!(remaining(&d).await, 40);
    }

    #[tokio::test]
    async fn a_vanished_holder_keeps_what_it_took_and_stops_counting_after_two_lease_times() {
        let (d, clock) = decider(RULES);
        let gone = lease(&d, "gone", 40, "", 0).await;
        assert_eq!(gone.granted, 40);
        assert_eq!(lease(&d, "b", 0, "", 0).await.granted, 30, "two holders: half of 60");
        // Past the lease and its grace: a late return is refused, the units
        // stay taken (its holder may have used them).
        clock.advance(Duration::from_secs(2) + GRACE + Duration::from_millis(1));
        d.engine.sweep();
        assert!(!release(&d, "gone", &gone.lease_id, 0).await);
        assert_eq!(remaining(&d).await, 30);
        // Neither gone nor b were seen within two lease times: b is alone.
        assert_eq!(lease(&d, "b", 0, "", 0).await.granted, 30);
    }

    #[tokio::test]
    async fn only_limits_the_rules_mark_may_be_leased_and_a_rule_change_is_seen_at_once() {
        let (d, _) = decider(RULES);
        let none: HashMap<String, String> = HashMap::new();
        let ask = |resource: &'static str| LeaseAsk {
            resource,
            descriptors: &none,
            want: 0,
            previous: "",
            used: 0,
            holder: "h",
            release: false,
        };
        let mixed = d.lease(&ask("mixed")).await.unwrap();
        assert_eq!(mixed.not_leasable, Some(NotLeasable::NotMarked("exact".into())));
        assert_eq!(
            mixed.not_leasable.unwrap().to_string(),
            "limit 'exact' may not be leased (no `lease:` in the rules)"
        );
        assert_eq!(d.lease(&ask("guarded")).await.unwrap().not_leasable, Some(NotLeasable::Breaker));
        assert_eq!(d.lease(&ask("nothing")).await.unwrap().not_leasable, Some(NotLeasable::NoRule));
        assert_eq!(d.lease(&ask("api")).await.unwrap().not_leasable, Some(NotLeasable::NoLimit));

        // A lease out, then the rule loses `lease:`: the return still settles
        // (the limit kept its buckets), and no new lease is granted.
        let out = lease(&d, "a", 30, "", 0).await;
        let unleased = RULES.replace(", lease: 2s }", " }");
        d.install(RuleSet::from_yaml(&unleased, "t").unwrap(), unleased.clone(), super::super::Origin::Admin);
        let after = lease(&d, "a", 10, &out.lease_id, 5).await;
        assert!(after.returned, "{after:?}");
        assert!(after.not_leasable.is_some());
        assert_eq!(remaining(&d).await, 95);
    }

    #[tokio::test]
    async fn a_return_counts_at_most_what_the_lease_granted_and_errors_name_the_lease() {
        let (d, _) = decider(RULES);
        let a = lease(&d, "a", 10, "", 0).await;
        assert_eq!(a.granted, 10);
        // A holder cannot have admitted a billion on a lease of ten.
        assert!(release(&d, "a", &a.lease_id, 1_000_000_000).await);
        assert_eq!(remaining(&d).await, 90, "the lease's 10, not a billion, and no debt");
        let descriptors = user("u1");
        let bad = |previous: &'static str, used: u64, resource: &'static str| LeaseAsk {
            resource,
            descriptors: &descriptors,
            want: 0,
            previous,
            used,
            holder: "a",
            release: true,
        };
        let err = |e: Result<Leased, RequestError>| e.unwrap_err().to_string();
        assert_eq!(err(d.lease(&bad("zzz", 1, "api")).await), "previous_lease_id: 'zzz' is not a lease id");
        let b = lease(&d, "b", 5, "", 0).await;
        let used = 5_000_000_000;
        let too_many = LeaseAsk { previous: &b.lease_id, used, ..bad("", 0, "api") };
        assert_eq!(err(d.lease(&too_many).await), "used: 5000000000 is larger than the largest cost, 4294967295");
        let elsewhere = LeaseAsk { previous: &b.lease_id, ..bad("", 1, "mixed") };
        assert_eq!(err(d.lease(&elsewhere).await), "resource: the lease was not granted for 'mixed'");
    }

    #[test]
    fn a_shaping_limit_cannot_be_leased() {
        let yaml = "resources:\n  - name: s\n    limits:\n      - { name: l, algorithm: leaky_bucket, capacity: 5, leak_per_second: 1, mode: shape, max_wait: 1s, lease: 1s }\n";
        let err = RuleSet::from_yaml(yaml, "t").unwrap_err().to_string();
        assert!(err.contains("lease: a shaping leaky bucket makes callers wait"), "{err}");
        let long = "resources:\n  - name: s\n    limits:\n      - { name: l, algorithm: fixed_window, limit: 5, window: 1s, lease: 2m }\n";
        assert!(RuleSet::from_yaml(long, "t").unwrap_err().to_string().contains("lease: must be at most 1m"));
    }
}
