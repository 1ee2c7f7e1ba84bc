//! Proto <-> domain, in one place: the services only call `into_wire()` and
//! `from_wire`, and nothing outside `grpc` sees generated types. The
//! conversions are this crate's own traits ([`FromDomain`], [`FromWire`])
//! rather than `From`/`TryFrom`, because the orphan rule forbids `From`
//! between the engine's types and the generated messages, both foreign here.
//!
//! - [`floodgate`]: `floodgate.v1` (the data plane, Admin, Watch).
//! - [`envoy`]: Envoy's RLS v3.
//! - [`overrides`]: overrides set at run time (Admin).

use std::time::{Duration, SystemTime};

use crate::time::Timestamp;

/// A wire message made from a domain value (the generated type's `From`).
pub(crate) trait FromDomain<T> {
    fn from_domain(value: T) -> Self;
}

/// A domain value as a wire message; implemented for every [`FromDomain`].
pub(crate) trait IntoWire<W> {
    fn into_wire(self) -> W;
}

impl<T, W: FromDomain<T>> IntoWire<W> for T {
    fn into_wire(self) -> W {
        W::from_domain(self)
    }
}

/// A domain value read from a wire message, or why it cannot be (the
/// domain type's `TryFrom`).
pub(crate) trait FromWire<W>: Sized {
    type Error;
    fn from_wire(wire: W) -> Result<Self, Self::Error>;
}

pub mod acquire;
pub mod concurrency;
pub mod envoy;
pub mod floodgate;
pub mod overrides;
pub mod wire;

/// A duration for the wire; zero is left out (absent means zero).
pub fn duration(d: Duration) -> Option<prost_types::Duration> {
    (!d.is_zero()).then(|| prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    })
}

/// A proto duration as a `Duration`; negative or malformed is `None`.
pub(crate) fn from_duration(d: &prost_types::Duration) -> Option<Duration> {
    let secs = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok().filter(|&n| n < 1_000_000_000)?;
    Some(Duration::new(secs, nanos))
}

/// A what-if's length: 1 s to 24 h.
pub(crate) fn what_if_length(d: &prost_types::Duration) -> Result<Duration, crate::engine::RequestError> {
    match from_duration(d) {
        Some(l) if (Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&l) => Ok(l),
        _ => Err(crate::engine::RequestError::WhatIfLength(format!("{}s {}ns", d.seconds, d.nanos))),
    }
}

pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

pub fn instant(t: Timestamp) -> prost_types::Timestamp {
    timestamp(t.to_system_time())
}
