//! AIMD, as Netflix's concurrency-limits defines it, once per window: a
//! drop (a failure or an expired permit in the window) or a mean latency
//! past `timeout` takes the limit to `limit * backoff_ratio` (at least one
//! less); otherwise, while the peak in flight reached half the limit, one
//! more; bounded by `min` and `max`. When the limit measures its no-load
//! latency (`probe`), a window whose mean latency is over twice it is a
//! drop too.

use super::config::AimdConfig;

/// With a measured no-load latency, a window slower than this many times it
/// counts as a drop: the resource is queueing.
const SLOWDOWN: f64 = 2.0;
use super::{Inputs, Update};

#[derive(Clone, Debug, PartialEq)]
pub struct Aimd {
    pub(super) limit: f64,
    short: f64,
}

impl Aimd {
    pub fn new(initial: f64) -> Aimd {
        Aimd { limit: initial.floor(), short: 0.0 }
    }

    pub(super) fn update(&mut self, c: &AimdConfig, (min, max): (f64, f64), u: &Update) -> f64 {
        let current = self.limit.floor();
        let timeout_us = c.timeout.as_secs_f64() * 1e6;
        if let Some(rtt) = u.rtt_us {
            self.short = rtt;
        }
        let slow = |rtt: f64| rtt > timeout_us || u.min_rtt_us.is_some_and(|m| rtt > m * SLOWDOWN);
        let new = if u.dropped || u.rtt_us.is_some_and(slow) {
            (current * c.backoff_ratio).floor().min(current - 1.0).max(1.0)
        } else if f64::from(u.in_flight) * 2.0 >= current {
            current + 1.0
        } else {
            return self.limit;
        };
        self.limit = new.clamp(min, max);
        self.limit
    }

    pub(super) fn inputs(&self) -> Inputs {
        Inputs { short_rtt_us: self.short, ..Inputs::default() }
    }

    pub(super) fn numbers(&self) -> Vec<f64> {
        vec![self.limit, self.short]
    }

    pub(super) fn from_numbers(n: &[f64]) -> Option<Aimd> {
        let &[limit, short] = n else { return None };
        Some(Aimd { limit, short })
    }
}
