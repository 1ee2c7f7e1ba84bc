//! `floodgate.v1` <-> domain.

use std::collections::HashMap;

use floodgate_proto::v1 as pb;
use pb::watch_event::Event as Kind;

use super::{FromDomain, FromWire, IntoWire, duration, from_duration, instant, timestamp};
use crate::breaker::{Outcome, State};
use crate::decider::{Applied, BreakerView, RulesInForce};
use crate::degradation::Load;
use crate::engine::{
    Answer, Level, LevelTarget, LimitReport, Report, Reported, Request, RequestError, Snapshot, Verdict,
};
use crate::events::Event;
use crate::rules::Priority;

// === requests ===

impl<'a> FromWire<&'a pb::AcquireRequest> for Request<'a, HashMap<String, String>> {
    type Error = RequestError;

    fn from_wire(r: &'a pb::AcquireRequest) -> Result<Self, RequestError> {
        Ok(Request {
            resource: &r.resource,
            descriptors: &r.descriptors,
            cost: r.cost,
            dry_run: r.dry_run,
            settle: r.settle,
            priority: priority(r.priority)?,
            usage: usage(&r.usage)?,
        })
    }
}

/// Usage as reported: `None` when empty; its form checked.
pub fn usage(usage: &crate::engine::request::Usage) -> Result<Option<&crate::engine::request::Usage>, RequestError> {
    if usage.is_empty() {
        return Ok(None);
    }
    crate::engine::request::check_usage_form(usage)?;
    Ok(Some(usage))
}

/// A wire priority; UNSPECIFIED is CRITICAL, unknown numbers are bad input.
pub fn priority(n: i32) -> Result<Priority, RequestError> {
    match pb::Priority::try_from(n) {
        Ok(pb::Priority::Unspecified | pb::Priority::Critical) => Ok(Priority::Critical),
        Ok(pb::Priority::CriticalPlus) => Ok(Priority::CriticalPlus),
        Ok(pb::Priority::SheddablePlus) => Ok(Priority::SheddablePlus),
        Ok(pb::Priority::Sheddable) => Ok(Priority::Sheddable),
        Err(_) => Err(RequestError::UnknownEnum {
            field: "priority",
            value: n,
            expected: "PRIORITY_CRITICAL_PLUS, PRIORITY_CRITICAL, PRIORITY_SHEDDABLE_PLUS or PRIORITY_SHEDDABLE",
        }),
    }
}

impl<'a> FromWire<&'a pb::ReportOutcomeRequest> for Report<'a> {
    type Error = RequestError;

    fn from_wire(r: &'a pb::ReportOutcomeRequest) -> Result<Self, RequestError> {
        crate::engine::request::check_permit_id(&r.permit_id)?;
        if !r.resource.is_empty() {
            crate::engine::request::check_name("resource", &r.resource, false)?;
        }
        let outcome = outcome(r.outcome)?;
        let latency = match &r.latency {
            Some(d) => Some(from_duration(d).ok_or(RequestError::BadDuration {
                field: "latency",
                seconds: d.seconds,
                nanos: d.nanos,
            })?),
            None => None,
        };
        let usage = usage(&r.usage)?;
        Ok(Report {
            resource: &r.resource,
            permit_id: &r.permit_id,
            outcome,
            latency,
            actual_cost: r.actual_cost,
            usage,
        })
    }
}

/// A wire outcome; UNSPECIFIED and unknown numbers are bad input.
fn outcome(n: i32) -> Result<Outcome, RequestError> {
    let bad = RequestError::UnknownEnum {
        field: "outcome",
        value: n,
        expected: "OUTCOME_SUCCESS, OUTCOME_FAILURE or OUTCOME_IGNORED",
    };
    match pb::Outcome::try_from(n).map_err(|_| bad.clone())? {
        pb::Outcome::Success => Ok(Outcome::Success),
        pb::Outcome::Failure => Ok(Outcome::Failure),
        pb::Outcome::Ignored => Ok(Outcome::Ignored),
        pb::Outcome::Unspecified => Err(bad),
    }
}

/// The state an operator asks for; UNSPECIFIED and unknown numbers are bad input.
pub(crate) fn breaker_state_request(n: i32) -> Result<State, RequestError> {
    State::from_number(i64::from(n)).ok_or(RequestError::UnknownEnum {
        field: "state",
        value: n,
        expected: "BREAKER_STATE_CLOSED, BREAKER_STATE_FORCED_OPEN, BREAKER_STATE_DISABLED or BREAKER_STATE_METRICS_ONLY",
    })
}

/// `SetDegradationLevel`: a level, or automatic.
pub(crate) fn level_request(
    r: &pb::SetDegradationLevelRequest,
) -> Result<(LevelTarget<'_>, Option<u32>), RequestError> {
    let target = match (r.every_system, r.system.as_str()) {
        (true, "") => LevelTarget::Every,
        (true, system) => return Err(RequestError::SystemWithEverySystem(system.to_string())),
        (false, system) => LevelTarget::One(system),
    };
    Ok((target, (!r.automatic).then_some(r.level)))
}

/// `ReportLoad`: one instance's load, checked by the engine.
pub fn load(r: &pb::ReportLoadRequest) -> Result<Load, RequestError> {
    let queue_delay = match &r.queue_delay {
        Some(d) => Some(from_duration(d).ok_or(RequestError::BadDuration {
            field: "queue_delay",
            seconds: d.seconds,
            nanos: d.nanos,
        })?),
        None => None,
    };
    Ok(Load { cpu: r.cpu, memory: r.memory, in_flight: r.in_flight, queue_delay })
}

// === answers ===

impl FromDomain<Verdict> for pb::Verdict {
    fn from_domain(v: Verdict) -> Self {
        match v {
            Verdict::Allowed => pb::Verdict::Allowed,
            Verdict::RateLimited => pb::Verdict::RateLimited,
            Verdict::CircuitOpen => pb::Verdict::CircuitOpen,
            Verdict::ConcurrencyLimited => pb::Verdict::ConcurrencyLimited,
            Verdict::Shed => pb::Verdict::Shed,
        }
    }
}

impl FromDomain<State> for pb::BreakerState {
    fn from_domain(s: State) -> Self {
        match s {
            State::Closed => pb::BreakerState::Closed,
            State::Open => pb::BreakerState::Open,
            State::HalfOpen => pb::BreakerState::HalfOpen,
            State::ForcedOpen => pb::BreakerState::ForcedOpen,
            State::Disabled => pb::BreakerState::Disabled,
            State::MetricsOnly => pb::BreakerState::MetricsOnly,
        }
    }
}

fn state_number(s: Option<State>) -> i32 {
    s.map_or(pb::BreakerState::Unspecified, pb::BreakerState::from_domain) as i32
}

/// A limit's state for an answer. `algorithm` is left empty: it is the same in
/// every answer, costs a sixth of a batch's encoding, and Peek reports it.
impl crate::decider::FromAnswer<crate::engine::settle::Charged<'_>> for pb::ChargeResponse {
    fn from_answer(c: crate::engine::settle::Charged<'_>) -> Self {
        pb::ChargeResponse {
            limits: c.limits.iter().map(IntoWire::into_wire).collect(),
            duplicate: c.duplicate,
            paid_by: c.paid_by.cloned().unwrap_or_default(),
        }
    }
}

impl FromDomain<&LimitReport<'_>> for pb::LimitStatus {
    fn from_domain(r: &LimitReport<'_>) -> Self {
        pb::LimitStatus {
            name: r.limit.name.clone(),
            limit: r.status.limit,
            remaining: r.status.remaining,
            reset_after: duration(r.limit.algorithm.shown_reset_after(r.status.reset_after)),
            retry_after: duration(r.status.retry_after),
            window: duration(r.limit.algorithm.window()),
            exceeded: r.exceeded,
            algorithm: String::new(),
            shadow: r.limit.shadow,
            admitted_over_limit: r.status.over_limit,
        }
    }
}

impl crate::decider::FromAnswer<Answer<'_>> for pb::AcquireResponse {
    fn from_answer(out: Answer<'_>) -> Self {
        pb::AcquireResponse {
            verdict: pb::Verdict::from_domain(out.verdict) as i32,
            limits: out.limits.iter().map(pb::LimitStatus::from_domain).collect(),
            retry_after: duration(out.retry_after),
            wait: duration(out.wait),
            breaker_state: state_number(out.breaker_state),
            degradation_level: out.degradation_level,
            reason: if out.verdict == Verdict::Allowed { String::new() } else { out.reason() },
            permit_id: out.permit_id.map(|p| p.to_string()).unwrap_or_default(),
            holds_slot: out.holds_slot,
            max_in_flight: out.max_in_flight,
            paid_by: out.paid_by.cloned().unwrap_or_default(),
        }
    }
}

impl FromDomain<&crate::decider::decisions::Logged> for pb::LoggedDecision {
    fn from_domain(d: &crate::decider::decisions::Logged) -> Self {
        pb::LoggedDecision {
            at: Some(super::timestamp(d.at)),
            resource: d.resource.clone(),
            descriptors: d.descriptors.iter().cloned().collect(),
            cost: d.cost,
            dry_run: d.dry_run,
            settle: d.settle,
            verdict: pb::Verdict::from_domain(d.verdict) as i32,
            rule: d.rule.clone(),
            limits: d
                .limits
                .iter()
                .map(|l| pb::LimitStatus {
                    name: l.name.clone(),
                    limit: l.limit,
                    remaining: l.remaining,
                    reset_after: duration(l.reset_after),
                    retry_after: duration(l.retry_after),
                    window: duration(l.window),
                    exceeded: l.exceeded,
                    algorithm: String::new(),
                    shadow: l.shadow,
                    admitted_over_limit: l.admitted_over_limit,
                })
                .collect(),
            decided_by: d.decided_by.clone(),
            reason: d.reason.clone(),
            usage: d.usage.iter().cloned().collect(),
            limit_costs: d.limits.iter().map(|l| l.cost).collect(),
            paid_by: d.paid_by.clone(),
            breaker_state: state_number(d.breaker_state),
            degradation_level: d.degradation_level,
        }
    }
}

/// A leased limit and what it holds.
pub fn left(l: &crate::engine::lease::Left) -> pb::LimitStatus {
    pb::LimitStatus {
        name: l.name.clone(),
        limit: l.limit,
        remaining: l.remaining,
        window: duration(l.window),
        ..pb::LimitStatus::default()
    }
}

impl crate::decider::FromAnswer<Answer<'_>> for pb::PeekResponse {
    fn from_answer(out: Answer<'_>) -> Self {
        pb::PeekResponse {
            rule: out.rule.cloned().unwrap_or_default(),
            limits: out
                .limits
                .iter()
                .map(|r| pb::LimitStatus { algorithm: r.limit.algorithm.name().into(), ..r.into_wire() })
                .collect(),
            breaker_state: state_number(out.breaker_state),
            degradation_level: out.degradation_level,
        }
    }
}

impl FromDomain<Reported> for pb::ReportOutcomeResponse {
    fn from_domain(r: Reported) -> Self {
        pb::ReportOutcomeResponse {
            counted: r.counted,
            breaker_state: state_number(r.breaker_state),
            settled: r.settled,
        }
    }
}

// === Admin ===

impl FromDomain<RulesInForce> for pb::GetRulesResponse {
    fn from_domain(r: RulesInForce) -> Self {
        pb::GetRulesResponse {
            yaml: r.yaml,
            version: r.version,
            source: r.source,
            loaded_at: Some(timestamp(r.loaded_at)),
            resources: r.resources,
            envoy: r.envoy.map(|e| pb::EnvoyConfigInForce {
                source: e.source,
                version: e.version,
                domains: e.domains,
                loaded_at: Some(timestamp(e.loaded_at)),
                yaml: e.yaml,
            }),
            sentinel: r.sentinel.map(|s| pb::SentinelRulesInForce {
                source: s.source,
                resources: s.resources,
                ignored: s.ignored,
                left_out: s.left_out,
                loaded_at: Some(timestamp(s.loaded_at)),
                json: s.json,
            }),
            earlier: r
                .earlier
                .into_iter()
                .map(|e| pb::EarlierRules {
                    version: e.version,
                    source: e.source,
                    loaded_at: Some(timestamp(e.loaded_at)),
                    replaced_at: Some(timestamp(e.replaced_at)),
                    resources: e.resources,
                    resource_count: e.resource_count as u64,
                })
                .collect(),
        }
    }
}

impl FromDomain<crate::decider::Reverted> for pb::RevertRulesResponse {
    fn from_domain(r: crate::decider::Reverted) -> Self {
        pb::RevertRulesResponse { version: r.version, reverted_to: r.reverted_to, resources: r.resources }
    }
}

impl FromDomain<Applied> for pb::ApplyRulesResponse {
    fn from_domain(a: Applied) -> Self {
        pb::ApplyRulesResponse {
            version: a.version,
            resources: a.resources,
            applied: a.applied,
            what_if_until: a.what_if_until.map(timestamp),
        }
    }
}

impl FromDomain<crate::engine::what_if::Findings> for pb::GetWhatIfResponse {
    fn from_domain(r: crate::engine::what_if::Findings) -> Self {
        let at = |t: crate::time::Timestamp| {
            timestamp(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(t.as_nanos()))
        };
        pb::GetWhatIfResponse {
            running: r.running,
            started_at: Some(at(r.started)),
            until: Some(at(r.until)),
            calls: r.calls,
            unmatched: r.unmatched,
            limits: r
                .limits
                .into_iter()
                .map(|l| pb::WhatIfLimit {
                    rule: l.rule,
                    limit: l.limit,
                    evaluated: l.evaluated,
                    would_deny: l.would_deny,
                    newly_denied: l.newly_denied,
                    top: l.top.into_iter().map(|(key, count, error)| pb::WhatIfHitter { key, count, error }).collect(),
                })
                .collect(),
        }
    }
}

impl FromDomain<BreakerView> for pb::BreakerInfo {
    fn from_domain(b: BreakerView) -> Self {
        let i = b.info;
        pb::BreakerInfo {
            resource: b.resource,
            state: pb::BreakerState::from_domain(i.state) as i32,
            calls: i.window.calls,
            failures: i.window.failures,
            slow_calls: i.window.slow,
            slow_successes: i.window.slow_successes,
            failure_rate: i.window.failure_rate(),
            slow_call_rate: i.window.slow_call_rate(),
            not_permitted: i.not_permitted,
            opened_at: i.opened_at.map(instant),
            next_probe_at: i.next_probe_at.map(instant),
            probes_in_flight: i.probes_in_flight,
            probes_remaining: i.probes_remaining,
            generation: i.generation,
            consecutive_openings: i.consecutive_openings,
        }
    }
}

/// `SetDegradationLevel`'s answer: one level set, its fields; several (every
/// system), the list too.
pub(crate) fn level_response(mut levels: Vec<Level>) -> pb::SetDegradationLevelResponse {
    let systems =
        if levels.len() == 1 { Vec::new() } else { levels.iter().map(pb::SystemLevel::from_domain).collect() };
    let first = if levels.is_empty() { None } else { Some(levels.remove(0)) };
    let (level, manual, automatic_level, system) =
        first.map(|l| (l.level, l.manual, l.automatic, l.system.to_string())).unwrap_or_default();
    pb::SetDegradationLevelResponse { level, manual, automatic_level, system, systems }
}

impl FromDomain<&Level> for pb::SystemLevel {
    fn from_domain(l: &Level) -> Self {
        let s = &l.signals;
        pb::SystemLevel {
            system: l.system.to_string(),
            level: l.level,
            manual: l.manual,
            automatic_level: l.automatic,
            reason: l.reason.clone(),
            signals: Some(pb::SystemSignals {
                calls: s.calls,
                error_rate: s.error_rate,
                slow_call_rate: s.slow_call_rate,
                latency: s.latency.and_then(duration),
                cpu: s.cpu,
                memory: s.memory,
                queue_delay: s.queue_delay.and_then(duration),
                instances: s.instances as u32,
                in_flight: s.in_flight,
            }),
        }
    }
}

// === Watch ===

impl FromDomain<Snapshot> for pb::Snapshot {
    fn from_domain(s: Snapshot) -> Self {
        let breakers = s
            .breakers
            .into_iter()
            .map(|(resource, info)| pb::BreakerSummary {
                resource,
                state: pb::BreakerState::from_domain(info.state) as i32,
                next_probe_at: info.next_probe_at.map(instant),
            })
            .collect();
        pb::Snapshot {
            breakers,
            degradation_level: s.level.level,
            degradation_override: s.level.manual,
            rules_version: s.rules_version,
            resync: false,
            rule_patterns: s.patterns,
            systems: s.systems.iter().map(pb::SystemLevel::from_domain).collect(),
        }
    }
}

/// What Watch sends for an event; `None` for an event it has no message for.
impl FromDomain<&Event> for Option<Kind> {
    fn from_domain(event: &Event) -> Self {
        Some(match event {
            Event::Breaker { resource, transition: t, .. } => Kind::Breaker(pb::BreakerTransition {
                resource: resource.clone(),
                from_state: pb::BreakerState::from_domain(t.from) as i32,
                to_state: pb::BreakerState::from_domain(t.to) as i32,
                reason: t.reason.clone(),
                next_probe_at: t.next_probe_at.map(instant),
            }),
            Event::Degradation(c) => Kind::Degradation(pb::DegradationChange {
                from_level: c.from,
                to_level: c.to,
                manual: c.manual,
                system: c.system.to_string(),
                reason: c.reason.clone(),
            }),
            Event::Rules { version, source, patterns } => Kind::Rules(pb::RulesReloaded {
                version: *version,
                source: source.clone(),
                rule_patterns: patterns.to_vec(),
            }),
            Event::Overrides { version, set, deleted, expired } => Kind::Overrides(pb::OverridesChanged {
                set: set.clone(),
                deleted: deleted.clone(),
                expired: expired.clone(),
                rules_version: *version,
            }),
            Event::RulesRefused { .. } => return None,
        })
    }
}

/// A `Lease` request as the decider takes it, with `descriptors` (the
/// request's, or those with the caller's proven origin set).
pub(crate) fn lease_ask<'a, D: ?Sized>(r: &'a pb::LeaseRequest, descriptors: &'a D) -> crate::decider::LeaseAsk<'a, D> {
    crate::decider::LeaseAsk {
        resource: &r.resource,
        descriptors,
        want: r.want,
        previous: &r.previous_lease_id,
        used: r.used,
        holder: &r.holder,
        release: r.release,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_breaker_state_has_the_protos_number() {
        // Redis stores a state by its number, and the wire carries the
        // proto's: the two must be the same numbers.
        for s in State::ALL {
            assert_eq!(pb::BreakerState::from_domain(s) as i32, i32::from(s.number()), "{}", s.name());
        }
        assert_eq!(State::from_number(pb::BreakerState::Unspecified as i64), None);
    }
}
