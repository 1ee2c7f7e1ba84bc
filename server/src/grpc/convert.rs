//! Proto <-> domain, in one place: the rest of the crate never sees generated types.

use std::time::{Duration, SystemTime};

use floodgate_proto::v1 as pb;

use crate::engine::{LimitReport, Outcome, Verdict};

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

pub fn acquire_response(out: &Outcome<'_>) -> pb::AcquireResponse {
    pb::AcquireResponse {
        verdict: verdict(out.verdict) as i32,
        permit_id: String::new(),
        limits: out.limits.iter().map(limit_status).collect(),
        retry_after: duration(out.retry_after),
        wait: duration(out.wait),
        breaker_state: pb::BreakerState::Unspecified as i32,
        degradation_level: 0,
        reason: out.reason(),
    }
}
