//! Vegas, as Netflix's concurrency-limits defines it (after TCP Vegas):
//! the queue is estimated from the no-load latency (the least window mean
//! seen, measured afresh now and then) as
//! `queue = ceil(limit * (1 - no_load / rtt))`, and with `f = log10 of the
//! limit` (at least 1; the square root from 1000 on):
//!
//! - a drop: `limit - f`;
//! - peak in flight under half the limit: unchanged (the callers held back);
//! - `queue <= f`: `limit + 6f`; `queue < 3f`: `limit + f`;
//!   `queue > 6f`: `limit - f`; otherwise unchanged;
//!
//! bounded by `min` and `max`, then smoothed. Every about
//! `probe_multiplier * limit` windows (jittered by 0.5 to 1) the window's
//! latency becomes the no-load latency, so that a slower resource is not
//! held to its old best forever. When the limit measures its no-load
//! latency at the floor (`probe`), that measurement is the no-load latency
//! and the windows are not used to guess it.

use super::config::VegasConfig;
use super::{Inputs, Update};

#[derive(Clone, Debug, PartialEq)]
pub struct Vegas {
    pub(super) limit: f64,
    /// The no-load latency (µs; 0: none yet).
    no_load: f64,
    probe_count: u64,
    jitter: f64,
    /// The jitter's generator (xorshift64*): the next probe's jitter.
    rng: u64,
    short: f64,
    queue: f64,
}

/// Netflix's `Log10RootFunction`: log10 of the limit as a whole number, at
/// least 1, and the square root from 1000 on.
pub(crate) fn log10_root(limit: f64) -> f64 {
    let n = limit.max(0.0) as u64;
    if n < 1000 { ((n as f64).log10().floor() as i64).max(1) as f64 } else { (n as f64).sqrt().floor() }
}

impl Vegas {
    pub fn new(initial: f64, seed: u64) -> Vegas {
        let mut v =
            Vegas { limit: initial, no_load: 0.0, probe_count: 0, jitter: 1.0, rng: seed | 1, short: 0.0, queue: 0.0 };
        v.jitter = v.next_jitter();
        v
    }

    /// A jitter in [0.5, 1).
    fn next_jitter(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        0.5 + (x >> 11) as f64 / (1u64 << 53) as f64 * 0.5
    }

    #[cfg(test)]
    pub(super) fn next_jitter_for_tests(&mut self) -> f64 {
        self.next_jitter()
    }

    pub(super) fn update(&mut self, c: &VegasConfig, (min, max): (f64, f64), u: &Update) -> f64 {
        let f = log10_root(self.limit);
        let new = match u.rtt_us {
            // Every call dropped: nothing to measure, a drop all the same.
            None if u.dropped => self.limit - f,
            None => return self.limit,
            Some(rtt) => {
                self.short = rtt;
                if let Some(measured) = u.min_rtt_us {
                    // Measured at the floor: no guess from the windows.
                    self.no_load = measured;
                } else {
                    self.probe_count += 1;
                    if self.jitter * f64::from(c.probe_multiplier) * self.limit <= self.probe_count as f64 {
                        self.jitter = self.next_jitter();
                        self.probe_count = 0;
                        self.no_load = rtt;
                        return self.limit;
                    }
                    if self.no_load == 0.0 || rtt < self.no_load {
                        self.no_load = rtt;
                        return self.limit;
                    }
                }
                self.queue = (self.limit * (1.0 - self.no_load / rtt)).ceil();
                let whole = log10_root(self.limit.floor());
                let (alpha, beta, threshold) = (3.0 * whole, 6.0 * whole, whole);
                if u.dropped {
                    self.limit - f
                } else if f64::from(u.in_flight) * 2.0 < self.limit {
                    return self.limit;
                } else if self.queue <= threshold {
                    self.limit + beta
                } else if self.queue < alpha {
                    self.limit + f
                } else if self.queue > beta {
                    // A queue far above beta (a limit started, or left, far
                    // above what the dependency serves) goes down by half of
                    // what is over beta each window, not by log10(limit):
                    // from four times the capacity, that takes seconds, not
                    // minutes. Near beta, the step is log10(limit) as before.
                    self.limit - f.max((self.queue - beta) / 2.0)
                } else {
                    return self.limit;
                }
            }
        };
        let new = new.clamp(min.max(1.0), max);
        self.limit = (1.0 - c.smoothing) * self.limit + c.smoothing * new;
        self.limit
    }

    pub(super) fn inputs(&self) -> Inputs {
        Inputs { short_rtt_us: self.short, no_load_rtt_us: self.no_load, queue: self.queue, ..Inputs::default() }
    }

    pub(super) fn numbers(&self) -> Vec<f64> {
        // The generator's state as two exact halves (an f64 holds 53 bits).
        let (hi, lo) = ((self.rng >> 32) as f64, (self.rng & 0xffff_ffff) as f64);
        vec![self.limit, self.no_load, self.probe_count as f64, self.jitter, hi, lo, self.short, self.queue]
    }

    pub(super) fn from_numbers(n: &[f64]) -> Option<Vegas> {
        let &[limit, no_load, probe_count, jitter, hi, lo, short, queue] = n else { return None };
        let word = |x: f64| (0.0..4_294_967_296.0).contains(&x).then_some(x as u64);
        let rng = (word(hi)? << 32) | word(lo)?;
        (probe_count >= 0.0 && (0.5..=1.0).contains(&jitter)).then_some(Vegas {
            limit,
            no_load,
            probe_count: probe_count as u64,
            jitter,
            rng: rng | 1,
            short,
            queue,
        })
    }
}
