//! The guards before the limits: shedding, the circuit breaker and the
//! concurrency limit. What they hand out is undone if a later check denies.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::permits::{Permit, Permits};
use super::{Guarded, Guards};
use crate::breaker::{Admission, Outcome, State};
use crate::engine::sync::{RemoteBreaker, RemoteOutcome, Replica};
use crate::events::{Event, Events};
use crate::rules::{Rule, duration};
use crate::time::Timestamp;

/// A permit's time to live when the rule sets none (no concurrency limit).
pub const DEFAULT_PERMIT_TTL: Duration = Duration::from_secs(60);

/// What the guards handed out for one call.
#[derive(Debug)]
pub struct Admitted {
    guarded: Arc<Guarded>,
    /// The breaker's generation, and whether this call is a probe.
    breaker: Option<(u64, bool)>,
    /// A probe the shared breaker granted: its shared generation.
    remote_probe: Option<(String, u64)>,
    holds_slot: bool,
    pub breaker_state: Option<State>,
}

/// A denial before the limits were looked at.
#[derive(Clone, Debug, PartialEq)]
pub enum Denial {
    /// An override of the rules blocks these descriptor values.
    Blocked {
        values: String,
        retry_after: Duration,
    },
    Shed {
        at: u32,
        level: u32,
    },
    CircuitOpen {
        resource: String,
        state: State,
        retry_after: Duration,
    },
    Concurrency {
        resource: String,
        max: u32,
        retry_after: Duration,
    },
}

impl Admitted {
    /// Whether this call holds one of the resource's concurrency slots.
    pub fn holds_slot(&self) -> bool {
        self.holds_slot
    }
}

impl Denial {
    pub fn retry_after(&self) -> Duration {
        match self {
            Denial::CircuitOpen { retry_after, .. }
            | Denial::Concurrency { retry_after, .. }
            | Denial::Blocked { retry_after, .. } => *retry_after,
            Denial::Shed { .. } => Duration::ZERO,
        }
    }

    pub fn breaker_state(&self) -> Option<State> {
        match self {
            Denial::CircuitOpen { state, .. } => Some(*state),
            _ => None,
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::Blocked { values, retry_after } => {
                write!(f, "blocked by an override for {values}, retry in {}", duration::human(*retry_after))
            }
            Denial::Shed { at, level } => {
                write!(f, "shed: degradation level is {level}, this resource is shed at {at}")
            }
            Denial::CircuitOpen { resource, state: State::HalfOpen, retry_after } => write!(
                f,
                "circuit breaker of '{resource}' is HALF_OPEN with every probe in flight, retry in {}",
                duration::human(*retry_after)
            ),
            Denial::CircuitOpen { resource, state: State::Open, retry_after } => {
                write!(f, "circuit breaker of '{resource}' is OPEN, next probe in {}", duration::human(*retry_after))
            }
            Denial::CircuitOpen { resource, state, .. } => {
                write!(f, "circuit breaker of '{resource}' is {}", state.name())
            }
            Denial::Concurrency { resource, max, .. } => {
                write!(f, "concurrency limit of '{resource}' reached: {max} calls in flight")
            }
        }
    }
}

/// One call's trip through the guards: what it asks and where events go.
pub struct Ask<'a> {
    pub rule: &'a Rule,
    pub resource: &'a str,
    pub level: u32,
    pub now: Timestamp,
    pub dry_run: bool,
    /// Only a breaker that lets every call through (CLOSED, DISABLED,
    /// METRICS_ONLY) passes: probes are kept for callers that report.
    pub gate: bool,
    /// The shared breaker's answer, when Redis was asked for a probe.
    pub remote: Option<RemoteBreaker>,
}

impl Guards {
    /// Runs the guards of the rule for the resource; on a dry run, only asks.
    pub fn admit(&self, ask: Ask<'_>, events: &Events, sync: Option<&Replica>) -> Result<Admitted, Denial> {
        let Ask { rule, resource, level, now, dry_run, gate, remote } = ask;
        if let Some(at) = rule.shed_at_level.filter(|&at| level >= at) {
            return Err(Denial::Shed { at, level });
        }
        let guarded = self.get_or_create(resource, rule);
        guarded.touch(now);
        let closed = |state, retry_after| Denial::CircuitOpen { resource: resource.into(), state, retry_after };
        let mut remote_probe = None;
        let (breaker, breaker_state) = match (&rule.breaker, remote) {
            (Some(_), Some(RemoteBreaker::Deny { state, retry_after })) => return Err(closed(state, retry_after)),
            (Some(_), Some(RemoteBreaker::Probe { generation })) if !dry_run => {
                let local = guarded.current_breaker().as_ref().map_or(0, |b| b.generation());
                remote_probe = Some((resource.to_string(), generation));
                (Some((local, true)), Some(State::HalfOpen))
            }
            (Some(cfg), _) => {
                let mut slot = guarded.breaker(Some(cfg));
                let b = slot.as_mut().expect("a breaker was just configured");
                if dry_run {
                    if !b.would_permit(cfg, now) || (gate && !b.state().passes_every_call()) {
                        return Err(closed(b.state(), b.retry_after(cfg, now)));
                    }
                    (None, Some(b.state()))
                } else {
                    let (admission, transition) = b.acquire(cfg, now);
                    let state = b.state();
                    drop(slot);
                    if let Some(transition) = transition {
                        events.publish(Event::Breaker {
                            resource: resource.into(),
                            rule: rule.name.clone(),
                            transition,
                        });
                    }
                    match admission {
                        Admission::Permitted { generation, probe } => (Some((generation, probe)), Some(state)),
                        Admission::Rejected { state, retry_after } => return Err(closed(state, retry_after)),
                    }
                }
            }
            (None, _) => (None, None),
        };
        let mut admitted = Admitted { guarded, breaker, remote_probe, holds_slot: false, breaker_state };
        if let Some(c) = &rule.concurrency {
            let full = if dry_run {
                admitted.guarded.in_flight.load(std::sync::atomic::Ordering::Acquire) >= c.max_in_flight
            } else {
                !admitted.guarded.try_take_slot(c.max_in_flight)
            };
            if full {
                let retry_after = admitted.guarded.slot_free_in(c.max_in_flight);
                Self::undo(admitted, sync);
                return Err(Denial::Concurrency { resource: resource.into(), max: c.max_in_flight, retry_after });
            }
            admitted.holds_slot = !dry_run;
        }
        Ok(admitted)
    }

    /// Gives back what the guards handed out for a call that does not go ahead.
    pub fn undo(a: Admitted, sync: Option<&Replica>) {
        if a.holds_slot {
            a.guarded.release_slot();
        }
        if let Some((resource, generation)) = a.remote_probe {
            // The shared breaker's probe goes back as an IGNORED outcome.
            if let Some(sync) = sync {
                sync.send(RemoteOutcome { resource, generation, outcome: Outcome::Ignored, slow: false });
            }
        } else if let (Some((generation, probe)), Some(b)) = (a.breaker, a.guarded.current_breaker().as_mut()) {
            b.release(generation, probe);
        }
    }

    /// The state of a resource's breaker, if its rule has one.
    pub fn state_for(&self, rule: &Rule, resource: &str) -> Option<State> {
        rule.breaker.as_ref()?;
        Some(self.get(resource)?.current_breaker().as_ref().map_or(State::Closed, |b| b.state()))
    }
}

impl Permits {
    /// A permit for an admitted call, expiring after the rule's `permit_ttl`
    /// (a probe's, after `max_wait_in_half_open` at the latest).
    pub fn issue_for(&self, rule: &Rule, resource: String, a: Admitted, now: Timestamp) -> String {
        let mut ttl = rule.concurrency.map_or(DEFAULT_PERMIT_TTL, |c| c.permit_ttl);
        if let (Some((_, true)), Some(cfg)) = (a.breaker, &rule.breaker) {
            ttl = ttl.min(cfg.max_wait_in_half_open);
        }
        self.issue(Permit {
            resource,
            guarded: a.guarded,
            issued_at: now,
            expires_at: now.saturating_add(ttl),
            breaker: a.breaker,
            remote_probe: a.remote_probe.map(|(_, g)| g),
            holds_slot: a.holds_slot,
        })
    }
}
