//! Gradient2, as Netflix's concurrency-limits defines it: the limit moves
//! by the gradient between the long-term latency (an exponential average
//! over `long_window` windows, a plain mean over the first ten) and the
//! window's, within [0.5, 1], plus `queue_size` of headroom, smoothed:
//!
//! ```text
//! gradient = max(0.5, min(1, tolerance * long / short))
//! new      = limit * gradient + queue_size
//! limit    = clamp(limit * (1 - smoothing) + new * smoothing, min, max)
//! ```
//!
//! When the long-term latency is more than twice the window's (load has
//! gone), it is cut by a tenth at once rather than waiting for the average.
//! A window whose peak in flight was under half the limit leaves it alone
//! (the callers, not the resource, held it back). Drops are not a signal.
//!
//! When the limit measures its no-load latency (`probe`), `long` in the
//! gradient is at most that latency plus a quarter: so a limit that started
//! while its resource was overloaded, whose long-term latency was queued
//! from the start, still finds the gradient below 1 and shrinks.

use super::config::Gradient2Config;
use super::{Inputs, Update};

/// The first windows of the long-term latency are a plain mean.
const WARMUP: u32 = 10;

/// How much slower than the measured no-load latency a window may be before
/// the limit shrinks.
pub(crate) const MIN_RTT_BUFFER: f64 = 0.25;

#[derive(Clone, Debug, PartialEq)]
pub struct Gradient2 {
    pub(super) limit: f64,
    /// The long-term latency (µs), and how many windows are in it (up to
    /// the warm-up) with their sum.
    long: f64,
    long_count: u32,
    long_sum: f64,
    short: f64,
    gradient: f64,
}

impl Gradient2 {
    pub fn new(initial: f64) -> Gradient2 {
        Gradient2 { limit: initial, long: 0.0, long_count: 0, long_sum: 0.0, short: 0.0, gradient: 1.0 }
    }

    fn add_long(&mut self, window: u32, rtt: f64) -> f64 {
        if self.long_count < WARMUP {
            self.long_count += 1;
            self.long_sum += rtt;
            self.long = self.long_sum / f64::from(self.long_count);
        } else {
            let factor = 2.0 / (f64::from(window) + 1.0);
            self.long = self.long * (1.0 - factor) + rtt * factor;
        }
        self.long
    }

    pub(super) fn update(&mut self, c: &Gradient2Config, (min, max): (f64, f64), u: &Update) -> f64 {
        let Some(short) = u.rtt_us else { return self.limit };
        let queue = f64::from(c.queue_size);
        self.short = short;
        let long = self.add_long(c.long_window, short);
        if long / short > 2.0 {
            self.long *= 0.9;
        }
        if f64::from(u.in_flight) < self.limit / 2.0 {
            return self.limit;
        }
        // With a measured no-load latency, the reference is at most that
        // plus a quarter (Envoy's buffer): a long-term latency measured
        // while the resource was already overloaded is no reference.
        let reference = match u.min_rtt_us {
            Some(m) => long.min(m * (1.0 + MIN_RTT_BUFFER)),
            None => long,
        };
        self.gradient = (c.tolerance * reference / short).clamp(0.5, 1.0);
        let new = self.limit * self.gradient + queue;
        let new = self.limit * (1.0 - c.smoothing) + new * c.smoothing;
        self.limit = new.clamp(min, max);
        self.limit
    }

    pub(super) fn inputs(&self) -> Inputs {
        Inputs { short_rtt_us: self.short, long_rtt_us: self.long, gradient: self.gradient, ..Inputs::default() }
    }

    pub(super) fn numbers(&self) -> Vec<f64> {
        vec![self.limit, self.long, f64::from(self.long_count), self.long_sum, self.short, self.gradient]
    }

    pub(super) fn from_numbers(n: &[f64]) -> Option<Gradient2> {
        let &[limit, long, count, long_sum, short, gradient] = n else { return None };
        (count >= 0.0 && count <= f64::from(WARMUP)).then_some(Gradient2 {
            limit,
            long,
            long_count: count as u32,
            long_sum,
            short,
            gradient,
        })
    }
}
