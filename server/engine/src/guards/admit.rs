//! The guards before the limits: shedding, the circuit breaker and the
//! concurrency limit. What they hand out is an [`Admitted`], a value whose
//! drop gives it back: a later check that denies, or a caller that goes
//! away while Redis is asked, returns the slot and the probe at once, as
//! tower's concurrency limit returns its semaphore permit.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::permits::{Permit, PermitId, Permits};
use super::{Guarded, Guards};
use crate::breaker::{Admission, State};
use crate::events::{Event, Events};
use crate::rules::{Priority, Rule, duration};
use crate::sync::{ProbeGrant, RemoteBreaker, SlotGrant, Slots};
use crate::time::Timestamp;

/// A permit's time to live when the rule sets none (no concurrency limit).
pub const DEFAULT_PERMIT_TTL: Duration = Duration::from_secs(60);

/// What the guards handed out for one call. Dropped, it gives back what it
/// holds; [`Permits::issue_for`] takes it over into a permit instead.
#[derive(Debug)]
pub struct Admitted {
    /// `None` once handed over to a permit.
    held: Option<Held>,
    pub breaker_state: Option<State>,
}

#[derive(Debug)]
struct Held {
    guarded: Arc<Guarded>,
    /// The breaker's generation, and whether this call is a probe.
    breaker: Option<(u64, bool)>,
    /// A probe the shared breaker granted.
    remote_probe: Option<Box<ProbeGrant>>,
    holds_slot: bool,
    /// The class whose slot it holds.
    class: Priority,
    /// The slot in the fleet's in-flight set (a strict concurrency limit).
    strict: Option<Strict>,
}

#[derive(Debug)]
enum Strict {
    /// Redis took it under this permit id.
    Granted(Box<SlotGrant>),
    /// Taken here while Redis could not be asked: added once it answers.
    Owed,
}

/// A denial before the limits were looked at.
#[derive(Clone, Debug, PartialEq)]
pub enum Denial {
    /// An override of the rules blocks these descriptor values.
    Blocked {
        values: String,
        retry_after: Duration,
    },
    /// The resource's system (empty: the global scope) is at `level`, and
    /// the resource (`priority: None`) or the request's priority is shed
    /// from level `at`.
    Shed {
        at: u32,
        level: u32,
        priority: Option<Priority>,
        system: Arc<str>,
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
        self.held.as_ref().is_some_and(|h| h.holds_slot)
    }

    /// Whether the caller should report this call at once: it holds a
    /// concurrency slot, or it is one of a HALF_OPEN breaker's probes (the
    /// breaker decides only when its probes are reported).
    pub fn report_at_once(&self) -> bool {
        self.held
            .as_ref()
            .is_some_and(|h| h.holds_slot || h.remote_probe.is_some() || h.breaker.is_some_and(|(_, probe)| probe))
    }

    fn hand_over(mut self) -> Held {
        self.held.take().expect("held until handed over")
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        if held.holds_slot {
            held.guarded.release_slot();
            held.guarded.release_class(held.class);
        }
        // A shared probe goes back as its grant drops; a local one here.
        if held.remote_probe.is_none()
            && let (Some((generation, probe)), Some(b)) = (held.breaker, held.guarded.current_breaker().as_mut())
        {
            b.release(generation, probe);
        }
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
                write!(f, "blocked by {values}, retry in {}", duration::human(*retry_after))
            }
            Denial::Shed { at, level, priority, system } => {
                write!(f, "shed: degradation level is {level}")?;
                if !system.is_empty() {
                    write!(f, " in system '{system}'")?;
                }
                match priority {
                    None => write!(f, ", this resource is shed at {at}"),
                    Some(p) => write!(f, ", {} is shed from level {at}", p.name()),
                }
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
    pub now: Timestamp,
    pub dry_run: bool,
    /// Only a breaker that lets every call through (CLOSED, DISABLED,
    /// METRICS_ONLY) passes: probes are kept for callers that report.
    pub gate: bool,
    /// The shared breaker's answer, when Redis was asked for a probe.
    pub remote: Option<RemoteBreaker>,
    /// What the concurrency limit lets through, if the rule has one.
    pub slots: Slots,
    /// The resource's state (`Guards::get_or_create`).
    pub guarded: Arc<Guarded>,
    /// The call's priority, for the concurrency limit's partitions.
    pub priority: Priority,
}

impl Guards {
    /// Runs the guards of the rule for the resource; on a dry run, only asks.
    pub fn admit(&self, ask: Ask<'_>, events: &Events) -> Result<Admitted, Denial> {
        let Ask { rule, resource, now, dry_run, gate, remote, slots, guarded, priority } = ask;
        guarded.touch(now);
        let closed = |state, retry_after| Denial::CircuitOpen { resource: resource.into(), state, retry_after };
        let mut remote_probe = None;
        let (breaker, breaker_state) = match (&rule.breaker, remote) {
            (Some(_), Some(RemoteBreaker::Deny { state, retry_after })) => return Err(closed(state, retry_after)),
            (Some(_), Some(RemoteBreaker::Probe(grant))) if !dry_run => {
                let local = guarded.current_breaker().as_ref().map_or(0, |b| b.generation());
                remote_probe = Some(grant);
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
        let mut held = Held { guarded, breaker, remote_probe, holds_slot: false, class: priority, strict: None };
        if let Some(c) = &rule.concurrency {
            let (cap, strict) = match slots {
                Slots::Here(cap) => (Ok(cap), None),
                Slots::Leased => (Ok(Some(held.guarded.lease_at(now).unwrap_or(0))), None),
                Slots::Owed(cap) => (Ok(cap), Some(Strict::Owed)),
                Slots::Taken(grant) => (Ok(None), Some(Strict::Granted(grant))),
                Slots::Full(retry_after) => (Err(retry_after), None),
            };
            let full = match cap {
                Err(_) => true,
                Ok(cap) if dry_run => cap.is_some_and(|cap| held.guarded.in_flight() >= cap),
                Ok(cap) => !held.guarded.try_take_for(cap, priority, &c.partitions),
            };
            if full {
                let max = held.guarded.limit(c);
                // When a slot is likely free: the calls' recent hold time
                // (their latency) spread over the limit.
                let retry_after = cap.err().unwrap_or_else(|| held.guarded.slot_free_in(max));
                // The slot Redis took, if any, goes back as it drops.
                drop(strict);
                // Dropped: the breaker's admission (a probe) goes back.
                drop(Admitted { held: Some(held), breaker_state });
                return Err(Denial::Concurrency { resource: resource.into(), max, retry_after });
            }
            held.holds_slot = !dry_run;
            held.strict = strict.filter(|_| !dry_run);
        }
        Ok(Admitted { held: Some(held), breaker_state })
    }

    /// The state of a resource's breaker, if its rule has one.
    pub(crate) fn state_for(&self, rule: &Rule, resource: &str) -> Option<State> {
        rule.breaker.as_ref()?;
        Some(self.get(resource)?.current_breaker().as_ref().map_or(State::Closed, |b| b.state()))
    }
}

impl Permits {
    /// A permit for an admitted call, expiring after the rule's `permit_ttl`
    /// (a probe's, after `max_wait_in_half_open` at the latest).
    /// A permit that holds a strict slot taken without Redis also answers
    /// when it expires: Redis is told of it once it answers.
    pub(crate) fn issue_for(
        &self,
        rule: &Rule,
        resource: String,
        a: Admitted,
        now: Timestamp,
    ) -> (PermitId, Option<(String, Timestamp)>) {
        let held = a.hand_over();
        let mut ttl = rule.concurrency.map_or(DEFAULT_PERMIT_TTL, |c| c.permit_ttl);
        if let (Some((_, true)), Some(cfg)) = (held.breaker, &rule.breaker) {
            ttl = ttl.min(cfg.max_wait_in_half_open);
        }
        let expires_at = now.saturating_add(ttl);
        let permit = Permit {
            resource,
            guarded: held.guarded,
            issued_at: now,
            expires_at,
            breaker: held.breaker,
            remote_probe: held.remote_probe.map(|g| g.keep()),
            holds_slot: held.holds_slot,
            class: held.class,
            strict_slot: held.strict.is_some(),
        };
        match held.strict {
            Some(Strict::Granted(grant)) => (self.issue_as(grant.keep(), permit), None),
            Some(Strict::Owed) => {
                let resource = permit.resource.clone();
                (self.issue(permit), Some((resource, expires_at)))
            }
            None => (self.issue(permit), None),
        }
    }
}
