//! Helpers shared by the algorithms' unit tests.

use std::time::Duration;

use crate::time::Timestamp;

/// A start time well away from zero and aligned to a day (so to every window the tests use).
pub(crate) const T0: Timestamp = Timestamp::from_secs(1_700_006_400);

pub fn at_ms(ms: u64) -> Timestamp {
    T0.add_nanos(ms * 1_000_000)
}

pub(crate) fn at_ns(ns: u64) -> Timestamp {
    T0.add_nanos(ns)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
