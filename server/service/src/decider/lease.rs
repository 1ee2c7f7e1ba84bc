//! Leases through the decision path: a grant is an Acquire of the granted
//! units with `settle` (so replicated and strict limits take them as they take
//! any cost), and a renewal or return settles the previous lease at what was
//! used (see `engine::lease` and `engine::settle`).

use super::Leasing;
use std::time::Duration;

use super::FromAnswer;
use smallvec::SmallVec;

use crate::engine::lease::{Empty, Left, NotLeasable, Plan};
use crate::engine::{Answer, Descriptors, Request, RequestError, Verdict};

/// Extra time the server keeps a lease's estimate past its end, for a
/// return that arrives late.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

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
    /// With nothing granted: when to ask again (and `empty` says why); with
    /// a grant that used up this holder's share: when the next can be had.
    pub retry_after: Duration,
    pub empty: Option<Empty>,
    /// The previous lease was settled at `used`.
    pub returned: bool,
    /// This holder's share for a lease time, and the holders sharing.
    pub share: u64,
    pub holders: usize,
    /// The limits the lease was cut from, and what they hold after it: what
    /// a client deciding alone (the server gone) keeps to.
    pub limits: Vec<Left>,
}

/// What a grant's Acquire came to.
struct Granted {
    verdict: Verdict,
    permit_id: Option<String>,
    retry_after: Duration,
    /// What each limit holds after it.
    remaining: SmallVec<[u64; 2]>,
}

impl FromAnswer<Answer<'_>> for Granted {
    fn from_answer(a: Answer<'_>) -> Self {
        let remaining = a.limits.iter().map(|l| l.status.remaining).collect();
        let permit_id = a.permit_id.map(|p| p.to_string());
        Granted { verdict: a.verdict, permit_id, retry_after: a.retry_after, remaining }
    }
}

impl Granted {
    fn available(&self) -> u64 {
        self.remaining.iter().copied().min().unwrap_or(0)
    }
}

impl Leasing<'_> {
    /// Settles lease `previous` at `used`; whether it held an estimate.
    async fn return_lease(
        &self,
        resource: &str,
        previous: &str,
        used: u64,
        holder: &str,
    ) -> Result<bool, RequestError> {
        let settled = self.engine.leasing().settle_lease(&self.engine.rules(), previous, resource, used, holder)?;
        if let Some(replication) = &self.replication {
            replication.adjust_strict(&settled.strict).await;
        }
        Ok(settled.settled)
    }

    /// Grants, renews or returns a lease.
    pub async fn lease<D: Descriptors + Sync + ?Sized>(&self, ask: &LeaseAsk<'_, D>) -> Result<Leased, RequestError> {
        crate::engine::lease::check_holder(ask.holder)?;
        crate::engine::request::check_cost("used", ask.used)?;
        let mut out = Leased::default();
        if !ask.previous.is_empty() {
            out.returned = self.return_lease(ask.resource, ask.previous, ask.used, ask.holder).await?;
        }
        if ask.release {
            self.engine.leasing().lease_released(&self.engine.rules(), ask.resource, ask.descriptors, ask.holder);
            return Ok(out);
        }
        let rules = self.engine.rules_full();
        let settled = out.returned.then_some(ask.used);
        let plan = match self.engine.leasing().lease_plan(
            &rules,
            ask.resource,
            ask.descriptors,
            ask.want,
            ask.holder,
            settled,
        )? {
            Ok(plan) => plan,
            Err(why) => {
                ::metrics::counter!(crate::metrics::LEASES, "result" => "not_leasable").increment(1);
                out.not_leasable = Some(why);
                return Ok(out);
            }
        };
        out.ttl = plan.ttl;
        out.share = plan.share;
        out.holders = plan.holders;
        out.limits = plan.limits.to_vec();
        if plan.grant == 0 {
            ::metrics::counter!(crate::metrics::LEASES, "result" => "empty").increment(1);
            out.retry_after = plan.retry_after;
            out.empty = plan.empty;
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
            let available = granted.available();
            match (granted.verdict, granted.permit_id) {
                (Verdict::Allowed, Some(id)) => {
                    let until = self.engine.clock().now().saturating_add(plan.ttl + GRACE);
                    self.engine.leasing().hold_lease(&id, until, ask.holder);
                    self.engine.leasing().lease_taken(plan, u64::from(cost));
                    for (left, remaining) in out.limits.iter_mut().zip(&granted.remaining) {
                        left.remaining = *remaining;
                    }
                    ::metrics::counter!(crate::metrics::LEASES, "result" => "granted").increment(1);
                    ::metrics::counter!(crate::metrics::LEASED_UNITS).increment(u64::from(cost));
                    out.lease_id = id;
                    out.granted = u64::from(cost);
                    out.retry_after = plan.retry_after;
                    return Ok(out);
                }
                _ => match plan.after_shortfall(attempt, available) {
                    Some(units) => {
                        cost = u32::try_from(units).unwrap_or(u32::MAX);
                        attempt += 1;
                    }
                    None => {
                        ::metrics::counter!(crate::metrics::LEASES, "result" => "empty").increment(1);
                        out.retry_after = plan.ask_again_in(granted.retry_after);
                        out.empty = Some(Empty::NothingLeft);
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
    use crate::decider::Decider;
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
        let engine = Arc::new(Engine::new(EngineConfig { max_keys: 1000 }, clock.clone()));
        engine.control().install(RuleSet::from_yaml(rules, "t").unwrap(), rules.into(), "test".into());
        (Decider::new(engine, None), clock)
    }

    fn user(u: &str) -> HashMap<String, String> {
        [("user".to_string(), u.to_string())].into()
    }

    async fn lease(d: &Decider, holder: &str, want: u64, previous: &str, used: u64) -> Leased {
        let descriptors = user("u1");
        let ask = LeaseAsk { resource: "api", descriptors: &descriptors, want, previous, used, holder, release: false };
        d.leasing().lease(&ask).await.unwrap()
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
        let done = d.leasing().lease(&ask).await.unwrap();
        assert!(done.returned && done.lease_id.is_empty());
        assert_eq!(remaining(&d).await, 100 - 10 - 5);
        // A second return of the same lease gives nothing back.
        assert!(!lease(&d, "a", 0, &renewed.lease_id, 0).await.returned);
    }

    async fn release(d: &Decider, holder: &str, previous: &str, used: u64) -> bool {
        let descriptors = user("u1");
        let ask =
            LeaseAsk { resource: "api", descriptors: &descriptors, want: 0, previous, used, holder, release: true };
        d.leasing().lease(&ask).await.unwrap().returned
    }

    #[tokio::test]
    async fn a_first_lease_leaves_a_reserve_for_the_next_holder_and_shares_follow_what_holders_want() {
        let (d, clock) = decider(RULES);
        // Alone and not saying what it wants: half, the other half kept for
        // a newcomer (first come is not all served).
        let x = lease(&d, "x", 0, "", 0).await;
        assert_eq!((x.granted, x.share, x.holders), (50, 50, 1));
        assert_eq!(x.limits.len(), 1, "the lease carries its limits");
        assert_eq!((x.limits[0].name.as_str(), x.limits[0].limit, x.limits[0].remaining), ("per-user", 100, 50));
        // The newcomer is served at once: a third of the 100 (x, itself, and
        // the reserve for one more).
        let b = lease(&d, "b", 0, "", 0).await;
        assert_eq!((b.granted, b.holders), (33, 2));
        // x renews having used 5 and saying it wants 10: it gets 10; b's
        // share is what x leaves.
        let x2 = lease(&d, "x", 10, &x.lease_id, 5).await;
        assert!(x2.returned);
        assert_eq!(x2.granted, 10);
        assert_eq!(remaining(&d).await, 100 - 5 - 33 - 10);
        // b used its 33 at once: its share is a rate; a lease time later it has it back.
        let early = lease(&d, "b", 500, &b.lease_id, 33).await;
        assert_eq!((early.granted, early.empty), (0, Some(Empty::ShareUsed)));
        clock.advance(Duration::from_secs(2));
        let b2 = lease(&d, "b", 500, "", 0).await;
        let left = 100 - 5 - 33 - 10;
        assert_eq!(b2.share, left, "max-min fair: all that x does not want of what is left");
        assert_eq!(b2.granted, left);
        assert_eq!(remaining(&d).await, 0);
        // Returned for good, a holder no longer counts.
        assert!(release(&d, "x", &x2.lease_id, 10).await);
        let b3 = lease(&d, "b", 500, &b2.lease_id, 0).await;
        assert_eq!(b3.holders, 1);
    }

    #[tokio::test]
    async fn a_vanished_holder_keeps_what_it_took_and_stops_counting_after_two_lease_times() {
        let (d, clock) = decider(RULES);
        let gone = lease(&d, "gone", 40, "", 0).await;
        assert_eq!(gone.granted, 40);
        let b = lease(&d, "b", 0, "", 0).await;
        assert_eq!((b.granted, b.holders), (33, 2), "a third of 100: gone, b and the reserve");
        // Past the lease and its grace: a late return is refused, the units
        // stay taken (its holder may have used them).
        clock.advance(Duration::from_secs(2) + GRACE + Duration::from_millis(1));
        d.engine.sweep();
        assert!(!release(&d, "gone", &gone.lease_id, 0).await);
        assert_eq!(remaining(&d).await, 27);
        // gone was not seen within two lease times: b shares with no one.
        let again = lease(&d, "b", 100, &b.lease_id, 33).await;
        assert_eq!((again.holders, again.granted), (1, 27));
    }

    #[tokio::test]
    async fn a_holder_that_used_its_share_is_told_when_it_comes_back_not_given_more() {
        let rules = "resources:\n  - name: tb\n    limits:\n      - { name: l, algorithm: token_bucket, capacity: 200, refill_per_second: 200, lease: 1s }\n";
        let (d, clock) = decider(rules);
        let none: HashMap<String, String> = HashMap::new();
        let ask = |holder: &'static str, want: u64, previous: &str, used: u64| {
            let previous = previous.to_string();
            let (d, none) = (&d, &none);
            async move {
                let ask = LeaseAsk {
                    resource: "tb",
                    descriptors: none,
                    want,
                    previous: &previous,
                    used,
                    holder,
                    release: false,
                };
                d.leasing().lease(&ask).await.unwrap()
            }
        };
        // Alone, a takes what it finds: nobody else wants any.
        let a = ask("a", 300, "", 0).await;
        assert_eq!((a.granted, a.holders), (200, 1));
        // b comes: both want 300 of 200 a second. Nothing is left now; b is
        // told when to come back, and is served within one lease time.
        let mut b = ask("b", 300, "", 0).await;
        assert_eq!((b.granted, b.holders, b.empty), (0, 2, Some(Empty::NothingLeft)), "{b:?}");
        let mut waited = Duration::ZERO;
        while b.granted == 0 {
            assert!(b.retry_after > Duration::ZERO);
            clock.advance(b.retry_after);
            waited += b.retry_after;
            b = ask("b", 300, "", 0).await;
        }
        assert!(waited <= Duration::from_secs(1), "b waited {waited:?}");
        assert!(b.granted >= b.share / 2, "{b:?}");
        // a used all it took and asks again at once: its share is a rate;
        // it is told when to come back rather than given b's.
        let early = ask("a", 300, &a.lease_id, 200).await;
        assert_eq!(early.granted, 0, "{early:?}");
        assert!(early.retry_after > Duration::ZERO);
        let later = ask("a", 300, "", 0).await;
        assert_eq!(later.granted, 0, "asking again is no different: {later:?}");
    }

    /// Holders leasing as the client crate does (asking again when the lease
    /// is used up or when told, renewing at 0.6 of a lease time, wanting
    /// their rate and a quarter), on a token bucket they drain.
    async fn simulate(d: &Decider, clock: &ManualClock, demands: &[u64], seconds: u64) -> Vec<(f64, f64)> {
        struct Sim {
            demand: u64,
            lease: String,
            left: u64,
            used: u64,
            renew_at: u64,
            wait_until: u64,
            admitted: u64,
            rpcs: u64,
            /// Demand in thousandths of a unit not yet asked for.
            owed: u64,
        }
        impl Sim {
            /// Renews (or asks for) the lease at `t` ms; what was granted.
            async fn renew(&mut self, d: &Decider, holder: &str, t: u64, measuring: bool) -> u64 {
                let none: HashMap<String, String> = HashMap::new();
                let want = self.demand * 5 / 4;
                let (previous, used) = (&self.lease, self.used);
                let ask = LeaseAsk { resource: "tb", descriptors: &none, want, previous, used, holder, release: false };
                let got = d.leasing().lease(&ask).await.unwrap();
                self.rpcs += u64::from(measuring);
                (self.lease, self.left, self.used) = (got.lease_id, got.granted, 0);
                self.renew_at = t + got.ttl.as_millis() as u64 * 6 / 10;
                self.wait_until = t + got.retry_after.as_millis().max(1) as u64;
                got.granted
            }
        }
        let mut sims: Vec<Sim> = demands
            .iter()
            .map(|&demand| Sim {
                demand,
                lease: String::new(),
                left: 0,
                used: 0,
                renew_at: 0,
                wait_until: 0,
                admitted: 0,
                rpcs: 0,
                owed: 0,
            })
            .collect();
        let step = 10u64;
        let (measure_from, end) = ((seconds - 10) * 1000, seconds * 1000);
        let mut t = 0;
        while t < end {
            for (i, s) in sims.iter_mut().enumerate() {
                let holder = format!("h{i}");
                s.owed += s.demand * step;
                let mut need = s.owed / 1000;
                s.owed %= 1000;
                while need > 0 {
                    if s.left > 0 && t < s.renew_at + 300 {
                        let n = need.min(s.left);
                        (s.left, s.used, need) = (s.left - n, s.used + n, need - n);
                        if t >= measure_from {
                            s.admitted += n;
                        }
                        continue;
                    }
                    if t < s.wait_until {
                        break;
                    }
                    if s.renew(d, &holder, t, t >= measure_from).await == 0 {
                        break;
                    }
                }
                if s.left > 0 && t >= s.renew_at {
                    s.renew(d, &holder, t, t >= measure_from).await;
                }
            }
            clock.advance(Duration::from_millis(step));
            t += step;
        }
        sims.iter().map(|s| (s.admitted as f64 / 10.0, s.rpcs as f64 / 10.0)).collect()
    }

    const TB: &str = "resources:\n  - name: tb\n    limits:\n      - { name: l, algorithm: token_bucket, capacity: 1000, refill_per_second: 200, lease: 1s }\n";

    #[tokio::test]
    async fn contended_holders_get_their_max_min_fair_share_at_a_few_calls_a_second() {
        for (demands, fair) in [
            (&[300, 100][..], &[100.0, 100.0][..]),
            (&[300, 50], &[150.0, 50.0]),
            (&[100, 100], &[100.0, 100.0]),
            (&[400, 300, 100, 20], &[60.0, 60.0, 60.0, 20.0]),
            (&[50, 50], &[50.0, 50.0]),
        ] {
            let (d, clock) = decider(TB);
            let got = simulate(&d, &clock, demands, 40).await;
            let total: f64 = got.iter().map(|g| g.0).sum();
            eprintln!("demands {demands:?}: (admitted/s, Lease calls/s) {got:?}, max-min fair {fair:?}");
            for ((rate, rpcs), want) in got.iter().zip(fair) {
                assert!(*rate >= want * 0.95, "demands {demands:?}: got {got:?}, max-min fair {fair:?}");
                assert!(*rpcs <= 6.0, "demands {demands:?}: {rpcs} Lease calls a second: {got:?}");
            }
            assert!(total <= 200.0 * 1.02, "demands {demands:?}: {total}/s admitted on 200/s");
        }
    }

    #[test]
    fn max_min_fair_and_proportional_shares() {
        use crate::engine::lease::share_of;
        use crate::rules::LeaseShare::{Fair, Proportional};
        let fair = |c, w: &[u64]| (0..w.len()).map(|i| share_of(Fair, c, w, i)).collect::<Vec<_>>();
        let prop = |c, w: &[u64]| (0..w.len()).map(|i| share_of(Proportional, c, w, i)).collect::<Vec<_>>();
        assert_eq!(fair(200, &[375, 125]), [100, 100], "oversubscribed: equal");
        assert_eq!(fair(200, &[50, 375]), [50, 150], "what the small one leaves goes to the large");
        assert_eq!(fair(200, &[50, 60]), [50, 60], "under the capacity: what each wants");
        assert_eq!(fair(200, &[30, 70, 80, 300]), [30, 57, 57, 57], "water-filling, rounded up");
        assert_eq!(share_of(Fair, 200, &[0], 0), 100, "not said: a share beside one more holder");
        assert_eq!(share_of(Fair, 200, &[0, 375], 0), 67);
        assert_eq!(share_of(Fair, 3, &[9, 9, 9, 9], 0), 1, "never zero while there is capacity");
        assert_eq!(prop(200, &[300, 100]), [150, 50]);
        assert_eq!(prop(200, &[50, 60]), [50, 60]);
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
        let mixed = d.leasing().lease(&ask("mixed")).await.unwrap();
        assert_eq!(mixed.not_leasable, Some(NotLeasable::NotMarked("exact".into())));
        assert_eq!(
            mixed.not_leasable.unwrap().to_string(),
            "limit 'exact' may not be leased (no `lease:` in the rules)"
        );
        assert_eq!(d.leasing().lease(&ask("guarded")).await.unwrap().not_leasable, Some(NotLeasable::Breaker));
        assert_eq!(d.leasing().lease(&ask("nothing")).await.unwrap().not_leasable, Some(NotLeasable::NoRule));
        assert_eq!(d.leasing().lease(&ask("api")).await.unwrap().not_leasable, Some(NotLeasable::NoLimit));

        // A lease out, then the rule loses `lease:`: the return still settles
        // (the limit kept its buckets), and no new lease is granted.
        let out = lease(&d, "a", 30, "", 0).await;
        let unleased = RULES.replace(", lease: 2s }", " }");
        d.control().install(RuleSet::from_yaml(&unleased, "t").unwrap(), unleased.clone(), super::super::Origin::Admin);
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
        assert_eq!(err(d.leasing().lease(&bad("zzz", 1, "api")).await), "previous_lease_id: 'zzz' is not a lease id");
        let b = lease(&d, "b", 5, "", 0).await;
        let used = 5_000_000_000;
        let too_many = LeaseAsk { previous: &b.lease_id, used, ..bad("", 0, "api") };
        assert_eq!(
            err(d.leasing().lease(&too_many).await),
            "used: 5000000000 is larger than the largest cost, 4294967295"
        );
        let elsewhere = LeaseAsk { previous: &b.lease_id, holder: "b", ..bad("", 1, "mixed") };
        assert_eq!(err(d.leasing().lease(&elsewhere).await), "resource: the lease was not granted for 'mixed'");
        // Only its holder settles a lease: another name cannot give b's
        // units back (nor keep b from being charged them).
        let before = remaining(&d).await;
        let mallory = LeaseAsk { previous: &b.lease_id, used: 0, holder: "mallory", ..bad("", 0, "api") };
        assert_eq!(
            err(d.leasing().lease(&mallory).await),
            "previous_lease_id: the lease was granted to another holder"
        );
        assert_eq!(remaining(&d).await, before, "nothing given back");
        assert!(release(&d, "b", &b.lease_id, 5).await, "b settles its own");
        let nameless = LeaseAsk { holder: "", ..bad("", 0, "api") };
        assert_eq!(
            err(d.leasing().lease(&nameless).await),
            "holder: is required (a name stable for the client process)"
        );
        let unsettled = LeaseAsk { used: u64::MAX, ..bad("", 0, "api") };
        assert!(err(d.leasing().lease(&unsettled).await).starts_with("used: 18446744073709551615 is larger"));
    }

    #[test]
    fn a_shaping_limit_cannot_be_leased() {
        let yaml = "resources:\n  - name: s\n    limits:\n      - { name: l, algorithm: leaky_bucket, capacity: 5, leak_per_second: 1, mode: shape, max_wait: 1s, lease: 1s }\n";
        let err = RuleSet::from_yaml(yaml, "t").unwrap_err().to_string();
        assert!(err.contains("lease: a shaping leaky bucket makes callers wait"), "{err}");
        let long = "resources:\n  - name: s\n    limits:\n      - { name: l, algorithm: fixed_window, limit: 5, window: 1s, lease: 2m }\n";
        assert!(RuleSet::from_yaml(long, "t").unwrap_err().to_string().contains("lease: must be at most 1m"));
        let share = |s: &str| {
            let yaml = format!(
                "resources:\n  - name: s\n    limits:\n      - {{ name: l, algorithm: fixed_window, limit: 5, window: 1s, {s} }}\n"
            );
            RuleSet::from_yaml(&yaml, "t").map(|r| r.rules()[0].limits[0].lease).map_err(|e| e.to_string())
        };
        use crate::rules::{Lease, LeaseShare};
        let ttl = Duration::from_secs(1);
        assert_eq!(share("lease: 1s"), Ok(Some(Lease { ttl, share: LeaseShare::Fair, paced: false })));
        assert_eq!(
            share("lease: 1s, lease_share: proportional, lease_start: paced"),
            Ok(Some(Lease { ttl, share: LeaseShare::Proportional, paced: true }))
        );
        assert!(
            share("lease: 1s, lease_start: whole")
                .unwrap_err()
                .contains("lease_start: must be one of paced, all, got 'whole'")
        );
        assert!(share("lease_start: all").unwrap_err().contains("lease_start: only a limit with `lease:` is leased"));
        assert!(
            share("lease: 1s, lease_share: even")
                .unwrap_err()
                .contains("lease_share: must be one of fair, proportional, got 'even'")
        );
        assert!(share("lease_share: fair").unwrap_err().contains("lease_share: only a limit with `lease:` is leased"));
    }

    #[tokio::test]
    async fn a_huge_limit_is_leased_at_most_the_largest_cost_at_once() {
        let rules = RULES.replace("limit: 100, window: 1h, lease: 2s", "limit: 1000000000000, window: 1h, lease: 2s");
        let (d, _) = decider(&rules);
        for want in [0, 10_000_000_000] {
            let l = lease(&d, "a", want, "", 0).await;
            assert_eq!((l.granted, l.share, l.empty), (u64::from(u32::MAX), u64::from(u32::MAX), None), "{l:?}");
        }
    }

    #[tokio::test]
    async fn a_share_larger_than_the_bucket_is_taken_as_the_bucket_fills() {
        // 6 a second for 10 s is 60, but the bucket holds 12 at most: the
        // share is leased as the bucket fills, never refused for ever.
        let rules = "resources:\n  - name: tb\n    limits:\n      - { name: l, algorithm: token_bucket, capacity: 12, refill_per_second: 6, lease: 10s }\n";
        let (d, clock) = decider(rules);
        let none: HashMap<String, String> = HashMap::new();
        let mut granted = 0;
        for holder in ["a", "b", "a", "b", "a", "b"] {
            let ask =
                LeaseAsk { resource: "tb", descriptors: &none, want: 0, previous: "", used: 0, holder, release: false };
            granted += d.leasing().lease(&ask).await.unwrap().granted;
            clock.advance(Duration::from_secs(2));
        }
        assert!(granted >= 40, "{granted} granted in 12 s of a 6/s bucket of 12");
    }

    /// Holders on `tb` (rules `rules`) asking in the same order every
    /// `poll` ms for `seconds`, each wanting `want` and reporting all of its
    /// last grant used; when `obey`, not before their `retry_after`. What
    /// each was granted.
    async fn take_turns(rules: &str, holders: usize, want: u64, poll: u64, obey: bool, seconds: u64) -> Vec<u64> {
        take_turns_from(rules, &vec![(want, 0); holders], poll, obey, seconds).await
    }

    /// The same with holders that each want their own (`want`, and come
    /// first at `from` ms).
    async fn take_turns_from(rules: &str, holders: &[(u64, u64)], poll: u64, obey: bool, seconds: u64) -> Vec<u64> {
        let (d, clock) = decider(rules);
        let none: HashMap<String, String> = HashMap::new();
        let n = holders.len();
        let (mut got, mut held, mut wait) = (vec![0u64; n], vec![(String::new(), 0u64); n], vec![0u64; n]);
        for t in (0..seconds * 1000).step_by(10) {
            for (i, &(want, from)) in holders.iter().enumerate() {
                if t < from || (obey && t < wait[i]) || t % poll != 0 {
                    continue;
                }
                let (previous, used) = std::mem::take(&mut held[i]);
                let holder = format!("h{i}");
                let ask = LeaseAsk {
                    resource: "tb",
                    descriptors: &none,
                    want,
                    previous: &previous,
                    used,
                    holder: &holder,
                    release: false,
                };
                let l = d.leasing().lease(&ask).await.unwrap();
                got[i] += l.granted;
                if l.granted > 0 {
                    held[i] = (l.lease_id, l.granted);
                }
                wait[i] = t + l.retry_after.as_millis().max(10) as u64;
            }
            clock.advance(Duration::from_millis(10));
        }
        got
    }

    /// An hour's quota and one-second leases, `lease_start: paced`: the
    /// first holder, alone for a second and using all it gets, cannot take
    /// the whole hour in one lease. It starts from the hour's pace (600 an
    /// hour is under one a second: one unit) and doubles with use each lease
    /// time, so the holders that come after it find their share. With
    /// `lease_start: all` (the default) it takes all 600 in its first lease
    /// and the others get nothing for the rest of the hour.
    #[tokio::test]
    async fn a_paced_holder_cannot_take_a_long_window_in_one_lease() {
        let paced = "resources:\n  - name: tb\n    limits:\n      - { name: l, algorithm: fixed_window, limit: 600, window: 1h, lease: 1s, lease_start: paced }\n";
        let holders = [(1000, 0), (1000, 1000), (10, 1500), (1000, 2000)];
        let got = take_turns_from(paced, &holders, 100, true, 20).await;
        assert!(got.iter().sum::<u64>() <= 600, "{got:?}: never more than the window holds");
        // Seen: [288, 163, 51, 98]. The holders ramp up together; the first
        // had a head start of one to two lease times.
        assert!(got[0] < 300, "the first holder took {} of 600: {got:?}", got[0]);
        assert!(got[1] >= 100 && got[3] >= 50, "the later holders found their share: {got:?}");
        assert!(got[2] >= 10, "the small holder got what it wants: {got:?}");
        let all = paced.replace(", lease_start: paced", "");
        let got = take_turns_from(&all, &holders, 100, true, 20).await;
        assert_eq!(got, [600, 0, 0, 0], "all at once: the first holder takes the hour");
    }

    #[tokio::test]
    async fn on_a_tiny_limit_shares_are_fractions_and_nobody_starves() {
        // One a second among four holders that each want five: a quarter of
        // a unit each per lease time, asked in the same order every time.
        let one = "resources:\n  - name: tb\n    limits:\n      - { name: l, algorithm: token_bucket, capacity: 1, refill_per_second: 1, lease: 1s }\n";
        let got = take_turns(one, 4, 5, 10, true, 40).await;
        assert!(got.iter().sum::<u64>() <= 41, "{got:?}: the bucket held 1 + 40");
        assert!(got.iter().all(|&g| g >= 7), "a fair share is 10 each: {got:?}");
        // Six holders that ignore retry_after and ask every 0.6 s (as an
        // Envoy reports on its own schedule), on 3 a second: everyone is owed
        // more than there is, and each still gets its turn.
        let three = one.replace("capacity: 1, refill_per_second: 1", "capacity: 3, refill_per_second: 3");
        let got = take_turns(&three, 6, 10, 600, false, 15).await;
        assert!(got.iter().sum::<u64>() <= 48, "{got:?}: the bucket held 3 + 45");
        assert!(got.iter().all(|&g| g >= 3), "a fair share is 7.5 each: {got:?}");
    }

    #[tokio::test]
    async fn proportional_shares_follow_what_holders_want() {
        let rules = RULES.replace("lease: 2s }", "lease: 2s, lease_share: proportional }");
        let (d, _) = decider(&rules);
        let a = lease(&d, "a", 300, "", 0).await;
        assert_eq!(a.granted, 100, "alone: all it wants of what there is");
        let a = lease(&d, "a", 300, &a.lease_id, 0).await;
        let b = lease(&d, "b", 100, "", 0).await;
        // 100 divided 3:1; b finds a holding its 100 and gets nothing until a renews.
        assert_eq!((b.share, b.granted, b.empty), (25, 0, Some(Empty::NothingLeft)));
        let a = lease(&d, "a", 300, &a.lease_id, 0).await;
        assert_eq!(a.share, 75);
        let b = lease(&d, "b", 100, "", 0).await;
        assert_eq!(b.granted, 25);
    }
}
