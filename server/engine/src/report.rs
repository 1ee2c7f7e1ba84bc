//! After the call: outcomes, permit expiry, time-driven transitions, and the
//! operator's controls over breakers and the degradation level.

use crate::{Control, Outcomes, Views};
use std::time::Duration;

use super::Installed;
use super::guards::{Guarded, Permit, PermitId};
use super::request::{self, RequestError};
use super::sync::RemoteOutcome;
use super::sync::SlotOp;
use crate::breaker::{Info, Outcome, State};
use crate::degradation::{Level, LevelChange, Load, Scope};
use crate::events::Event;
use crate::rules::{BreakerConfig, Concurrency, Rule};
use crate::time::Timestamp;

/// One ReportOutcome, checked: `resource` may be empty (else it must be the
/// permit's), `latency` defaults to the permit's age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report<'a> {
    pub resource: &'a str,
    pub permit_id: &'a str,
    pub outcome: Outcome,
    pub latency: Option<Duration>,
    /// What the call really cost (a permit of an Acquire with `settle`).
    pub actual_cost: Option<u64>,
    /// The usage the call really had, which limits with a `cost` formula
    /// settle at.
    pub usage: Option<&'a request::Usage>,
}

/// The answer to one ReportOutcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reported {
    /// False for an expired or unknown permit.
    pub counted: bool,
    pub breaker_state: Option<State>,
    /// An actual cost was applied to the estimate.
    pub settled: bool,
}

/// Every breaker, the levels and the rules version at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub breakers: Vec<(String, Info)>,
    /// The global scope's level.
    pub level: Level,
    /// Each system's, in file order.
    pub systems: Vec<Level>,
    pub rules_version: u64,
    /// The rule patterns in force, in file order.
    pub patterns: Vec<String>,
}

/// Publishes a change of degradation level, if there was one.
fn level_changed(events: &crate::events::Events, change: Option<LevelChange>) {
    if let Some(change) = change {
        events.publish(Event::Degradation(change));
    }
}

impl Outcomes<'_> {
    /// Takes a permit back with the call's outcome. `resource` may be empty; if
    /// given it must be the permit's. `latency` defaults to the permit's age.
    pub fn report(
        &self,
        rules: &Installed,
        resource: &str,
        permit_id: &str,
        outcome: Outcome,
        latency: Option<Duration>,
    ) -> Result<Reported, RequestError> {
        let Some((id, permit)) = self.permits.take(permit_id, resource)? else {
            outcome_counter(rules, resource, outcome, "unknown");
            return Ok(Reported { counted: false, breaker_state: self.current_state(rules, resource), settled: false });
        };
        let now = self.clock.now();
        if permit.expires_at <= now {
            outcome_counter(rules, &permit.resource, outcome, "expired");
            let state = self.current_state(rules, &permit.resource);
            self.release(permit, id, now);
            return Ok(Reported { counted: false, breaker_state: state, settled: false });
        }
        permit.guarded.touch(now);
        let latency = latency.unwrap_or_else(|| Duration::from_nanos(now.saturating_since(permit.issued_at)));
        let scope = rules.scope_of(&permit.resource);
        if !scope.is_global() && outcome != Outcome::Ignored {
            scope.record_outcome(now, outcome == Outcome::Failure, latency);
        }
        let rule = rules.rules.find(&permit.resource);
        if permit.holds_slot
            && let Some(c) = rule.and_then(|r| r.concurrency.as_ref())
        {
            // A call is no longer than its permit was held: a caller that
            // reports more cannot drag the fleet's limit down.
            let held = Duration::from_nanos(now.saturating_since(permit.issued_at));
            match outcome {
                Outcome::Success => self.adaptive_sample(&permit.guarded, c, now, Some(latency.min(held))),
                Outcome::Failure => self.adaptive_sample(&permit.guarded, c, now, None),
                Outcome::Ignored => {}
            }
        }
        let cfg = rule.and_then(|r| r.breaker.as_ref());
        let state = match (permit.breaker, permit.remote_probe, cfg) {
            (_, Some(generation), Some(cfg)) => {
                // A probe of the shared breaker: Redis counts it and decides.
                let slow = latency > cfg.slow_call_duration;
                let resource = permit.resource.clone();
                self.coordination.send_outcome(RemoteOutcome { resource, generation, outcome, slow });
                permit.guarded.current_breaker().as_ref().map(|b| b.state())
            }
            (Some((generation, _)), None, Some(cfg)) => {
                self.record(&permit, (cfg, scope), now, generation, outcome, latency)
            }
            _ => None,
        };
        outcome_counter(rules, &permit.resource, outcome, "counted");
        self.release(permit, id, now);
        Ok(Reported { counted: true, breaker_state: state, settled: false })
    }

    fn record(
        &self,
        permit: &Permit,
        (cfg, scope): (&BreakerConfig, &Scope),
        now: Timestamp,
        generation: u64,
        outcome: Outcome,
        latency: Duration,
    ) -> Option<State> {
        let mut slot = permit.guarded.breaker(Some(cfg));
        let b = slot.as_mut()?;
        let (call, transition) = b.report(cfg, now, generation, outcome, latency);
        let state = b.state();
        drop(slot);
        if let Some(call) = call {
            // A system counts every reported call (above); the global scope
            // the calls its breakers count.
            if scope.is_global() {
                scope.record_call(now, call);
            }
            let tripped = transition.as_ref().is_some_and(|t| t.from == State::Closed && t.to == State::Open);
            self.coordination.record_call(&permit.resource, call, tripped);
        }
        if let Some(transition) = transition {
            let rule = permit.guarded.rule.to_string();
            self.events.publish(Event::Breaker { resource: permit.resource.clone(), rule, transition });
        }
        Some(state)
    }

    fn release(&self, permit: Permit, id: PermitId, now: Timestamp) {
        if permit.holds_slot {
            permit.guarded.release_slot_after(Duration::from_nanos(now.saturating_since(permit.issued_at)));
            permit.guarded.release_class(permit.class);
        }
        if permit.strict_slot {
            self.coordination.push_slot_op(SlotOp::Give { resource: permit.resource, id });
        }
    }

    /// A call's latency (`None`: a drop) for the resource's adaptive limit,
    /// if it has one; the window closes here once it is over, unless the
    /// fleet closes it (the sync).
    fn adaptive_sample(&self, guarded: &Guarded, c: &Concurrency, now: Timestamp, latency: Option<Duration>) {
        let Some(a) = &c.adaptive else { return };
        guarded.sample(a, now, latency);
        self.close_adaptive_window(guarded, c, now);
    }

    fn close_adaptive_window(&self, guarded: &Guarded, c: &Concurrency, now: Timestamp) {
        if let Some(a) = &c.adaptive
            && self.adapts_alone(c)
        {
            guarded.close_window(a, now);
        }
    }

    /// Whether this replica computes a resource's adaptive limit from its
    /// own samples: without Redis, for a `local` limit, and while Redis
    /// cannot be reached. Otherwise the sync merges every replica's windows.
    pub fn adapts_alone(&self, c: &Concurrency) -> bool {
        !c.sync.is_shared() || !self.coordination.store_up()
    }

    fn current_state(&self, rules: &Installed, resource: &str) -> Option<State> {
        let rule = rules.rules.find(resource)?;
        self.guards.state_for(rule, resource)
    }

    /// Time-driven work, run every few hundred milliseconds: expire permits,
    /// reopen breakers whose probes did not report, re-evaluate the levels.
    pub fn tick(&self) {
        let now = self.clock.now();
        let rules = self.rules();
        for (id, permit) in self.permits.expire(now) {
            metrics::counter!(crate::metrics::PERMITS_EXPIRED).increment(1);
            // A call that never reported: a drop, to an adaptive limit.
            if let (true, Some(c)) = (permit.holds_slot, rules.rules.find(&permit.resource).and_then(|r| r.concurrency))
            {
                self.adaptive_sample(&permit.guarded, &c, now, None);
            }
            self.release(permit, id, now);
        }
        for (resource, guarded) in self.guards.all() {
            let Some(rule) = rules.rules.find(&resource) else { continue };
            if let Some(c) = &rule.concurrency {
                self.close_adaptive_window(&guarded, c, now);
            }
            let Some(cfg) = rule.breaker.as_ref() else { continue };
            let transition = guarded.current_breaker().as_mut().and_then(|b| b.tick(cfg, now));
            if let Some(transition) = transition {
                self.events.publish(Event::Breaker { resource, rule: rule.name.clone(), transition });
            }
        }
        for scope in rules.systems.all() {
            let change = scope.evaluate(now);
            level_changed(&self.events, change);
        }
        self.guards.sweep(now);
        self.coordination.retain_breakers(&|resource| self.guards.contains(resource));
    }
}

impl Control<'_> {
    /// CLOSED (reset), FORCED_OPEN, DISABLED or METRICS_ONLY.
    pub fn set_breaker(&self, rules: &Installed, resource: &str, to: State) -> Result<Info, RequestError> {
        if !to.settable() {
            return Err(RequestError::BadBreakerState(to.name()));
        }
        let (rule, cfg) = breaker_config(rules, resource)?;
        let now = self.clock.now();
        let guarded = self.guards.get_or_create(resource, rule);
        guarded.touch(now);
        let mut slot = guarded.breaker(Some(cfg));
        let b = slot.as_mut().expect("configured");
        let transition = b.force(cfg, now, to);
        let info = b.info(cfg, now);
        drop(slot);
        if let Some(transition) = transition {
            self.events.publish(Event::Breaker { resource: resource.into(), rule: rule.name.clone(), transition });
        }
        Ok(info)
    }

    /// An operator's level (`None`: back to automatic) for the system named
    /// `system` (empty: the global scope), or for every scope; the levels after.
    pub fn set_degradation(&self, target: LevelTarget<'_>, level: Option<u32>) -> Result<Vec<Level>, RequestError> {
        let rules = self.rules();
        let scopes: Vec<&std::sync::Arc<Scope>> = match target {
            LevelTarget::Every => rules.systems.all().collect(),
            LevelTarget::One(name) => {
                vec![rules.systems.by_name(name).ok_or_else(|| RequestError::UnknownSystem(name.to_string()))?]
            }
        };
        Ok(scopes
            .into_iter()
            .map(|scope| {
                level_changed(&self.events, scope.set_manual(level));
                scope.get()
            })
            .collect())
    }

    /// Operators' levels stored for the fleet: each scope named takes its
    /// level, every other scope goes back to automatic.
    pub fn apply_manual_levels(&self, levels: &std::collections::HashMap<String, u32>) {
        for scope in self.rules().systems.all() {
            let want = levels.get(&**scope.name()).copied();
            if scope.manual() != want {
                level_changed(&self.events, scope.set_manual(want));
            }
        }
    }

    /// One instance's load (`ReportLoad`), taken at `taken_at` (here, now:
    /// `None`): the system's level and live instances after it.
    pub fn report_load(
        &self,
        system: &str,
        instance: &str,
        load: Load,
        taken_at: Option<Timestamp>,
    ) -> Result<(u32, usize), RequestError> {
        request::check_name("system", system, false)?;
        request::check_name("instance", instance, false)?;
        for (field, value) in [("cpu", load.cpu), ("memory", load.memory)] {
            if !(0.0..=1.0).contains(&value) {
                return Err(RequestError::BadUtilization { field, value: value.to_string() });
            }
        }
        let rules = self.rules();
        let scope = rules.systems.by_name(system).filter(|s| !s.is_global());
        let scope = scope.ok_or_else(|| RequestError::UnknownSystem(system.to_string()))?;
        let now = self.clock.now();
        let live = scope.report_load(now, instance, load, taken_at.unwrap_or(now)).map_err(|full| {
            RequestError::TooManyInstances {
                system: system.to_string(),
                live: full.live,
                max: full.max,
                instance: instance.to_string(),
            }
        })?;
        Ok((scope.level(), live))
    }
}

impl Views<'_> {
    /// What a Watch stream starts with.
    pub fn snapshot(&self) -> Snapshot {
        let rules = self.rules();
        let patterns = rules.rules.patterns();
        let systems = rules.systems.named().iter().map(|s| s.get()).collect();
        let level = rules.systems.global().get();
        Snapshot { breakers: self.breakers(&rules), level, systems, rules_version: rules.version, patterns }
    }

    /// Every breaker in use, by resource.
    pub fn breakers(&self, rules: &Installed) -> Vec<(String, Info)> {
        let now = self.clock.now();
        self.guards
            .all()
            .into_iter()
            .filter_map(|(resource, g)| {
                let cfg = rules.rules.find(&resource)?.breaker.as_ref()?;
                let info = g.breaker(Some(cfg)).as_mut()?.info(cfg, now);
                Some((resource, info))
            })
            .collect()
    }

    /// One resource's breaker; an error when its rule has none.
    pub fn breaker(&self, rules: &Installed, resource: &str) -> Result<Info, RequestError> {
        let (rule, cfg) = breaker_config(rules, resource)?;
        let guarded = self.guards.get_or_create(resource, rule);
        let mut slot = guarded.breaker(Some(cfg));
        Ok(slot.as_mut().expect("configured").info(cfg, self.clock.now()))
    }

    /// The global scope's level.
    pub fn level(&self) -> Level {
        self.rules().systems.global().get()
    }

    /// Every scope's level: the global one first, then each system in file order.
    pub fn levels(&self) -> Vec<Level> {
        self.rules().systems.all().map(|s| s.get()).collect()
    }
}

/// Whose degradation level an operator sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LevelTarget<'a> {
    /// The system of this name; empty for the global scope.
    One(&'a str),
    /// The global scope and every system.
    Every,
}

/// One reported outcome: `result` is counted, unknown or expired.
fn outcome_counter(rules: &Installed, resource: &str, outcome: Outcome, result: &'static str) {
    let rule = rules.rules.find(resource).map_or(crate::metrics::UNMATCHED.to_string(), |r| r.name.clone());
    let outcome = match outcome {
        Outcome::Success => "SUCCESS",
        Outcome::Failure => "FAILURE",
        Outcome::Ignored => "IGNORED",
    };
    metrics::counter!(crate::metrics::OUTCOMES, "resource" => rule, "outcome" => outcome, "result" => result)
        .increment(1);
}

fn breaker_config<'r>(rules: &'r Installed, resource: &str) -> Result<(&'r Rule, &'r BreakerConfig), RequestError> {
    request::check_name("resource", resource, false)?;
    let rule = rules.rules.find(resource).ok_or_else(|| RequestError::NoBreaker(resource.into()))?;
    let cfg = rule.breaker.as_ref().ok_or_else(|| RequestError::NoBreaker(resource.into()))?;
    Ok((rule, cfg))
}
