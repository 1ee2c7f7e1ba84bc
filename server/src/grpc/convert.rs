//! Proto <-> domain, in one place: the rest of the crate never sees generated types.

use std::time::{Duration, SystemTime};

use floodgate_proto::v1 as pb;

use crate::breaker::{self, Info, State};
use crate::engine::{Answer, LimitReport, Verdict};
use crate::time::Timestamp;

pub fn duration(d: Duration) -> Option<prost_types::Duration> {
    (!d.is_zero()).then(|| prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    })
}

/// A proto duration as a `Duration`; negative is `None`.
pub fn from_duration(d: &prost_types::Duration) -> Option<Duration> {
    let secs = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok()?;
    Some(Duration::from_secs(secs) + Duration::from_nanos(nanos.into()))
}

pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

pub fn verdict(v: Verdict) -> pb::Verdict {
    match v {
        Verdict::Allowed => pb::Verdict::Allowed,
        Verdict::RateLimited => pb::Verdict::RateLimited,
        Verdict::CircuitOpen => pb::Verdict::CircuitOpen,
        Verdict::ConcurrencyLimited => pb::Verdict::ConcurrencyLimited,
        Verdict::Shed => pb::Verdict::Shed,
    }
}

/// A limit's state for an answer. `algorithm` is left empty: it is the same in
/// every answer, costs a sixth of a batch's encoding, and Peek reports it.
pub fn limit_status(r: &LimitReport<'_>) -> pb::LimitStatus {
    let alg = &r.limit.algorithm;
    pb::LimitStatus {
        name: r.limit.name.clone(),
        limit: r.status.limit,
        remaining: r.status.remaining,
        reset_after: duration(r.status.reset_after),
        retry_after: duration(r.status.retry_after),
        window: duration(alg.window()),
        exceeded: r.exceeded,
        algorithm: String::new(),
    }
}

pub fn acquire_response(out: Answer<'_>) -> pb::AcquireResponse {
    pb::AcquireResponse {
        verdict: verdict(out.verdict) as i32,
        limits: out.limits.iter().map(limit_status).collect(),
        retry_after: duration(out.retry_after),
        wait: duration(out.wait),
        breaker_state: out.breaker_state.map_or(pb::BreakerState::Unspecified, breaker_state) as i32,
        degradation_level: out.degradation_level,
        reason: if out.verdict == Verdict::Allowed { String::new() } else { out.reason() },
        permit_id: out.permit_id.unwrap_or_default(),
    }
}

pub fn breaker_state(s: State) -> pb::BreakerState {
    match s {
        State::Closed => pb::BreakerState::Closed,
        State::Open => pb::BreakerState::Open,
        State::HalfOpen => pb::BreakerState::HalfOpen,
        State::ForcedOpen => pb::BreakerState::ForcedOpen,
        State::Disabled => pb::BreakerState::Disabled,
        State::MetricsOnly => pb::BreakerState::MetricsOnly,
    }
}

/// A wire breaker state as a domain state; `None` for UNSPECIFIED or unknown.
pub fn from_breaker_state(n: i32) -> Option<State> {
    Some(match pb::BreakerState::try_from(n).ok()? {
        pb::BreakerState::Unspecified => return None,
        pb::BreakerState::Closed => State::Closed,
        pb::BreakerState::Open => State::Open,
        pb::BreakerState::HalfOpen => State::HalfOpen,
        pb::BreakerState::ForcedOpen => State::ForcedOpen,
        pb::BreakerState::Disabled => State::Disabled,
        pb::BreakerState::MetricsOnly => State::MetricsOnly,
    })
}

/// A wire outcome as a domain outcome; `None` for UNSPECIFIED or unknown.
pub fn from_outcome(n: i32) -> Option<breaker::Outcome> {
    match pb::Outcome::try_from(n).ok()? {
        pb::Outcome::Success => Some(breaker::Outcome::Success),
        pb::Outcome::Failure => Some(breaker::Outcome::Failure),
        pb::Outcome::Ignored => Some(breaker::Outcome::Ignored),
        pb::Outcome::Unspecified => None,
    }
}

pub fn instant(t: Timestamp) -> prost_types::Timestamp {
    timestamp(t.to_system_time())
}

pub fn breaker_info(resource: String, i: Info) -> pb::BreakerInfo {
    pb::BreakerInfo {
        resource,
        state: breaker_state(i.state) as i32,
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
