//! A generated trace to measure recommendations with: many tenants with
//! traffic that rises by day and falls by night (and is lower on weekends),
//! a few legitimately heavy tenants, and one that misbehaves from a point on.
//!
//! Shape, per tenant: a mean between `low` and `high` calls a minute (spread
//! evenly on a log scale), times a daily curve (0.4 at midnight to 1.6 at
//! noon) and 0.6 on the sixth and seventh day of each week; each minute's
//! calls are drawn from a Poisson distribution around that. The heavy
//! tenants have 15 times the mean. The misbehaving tenant, an ordinary one,
//! sends `storm` calls a minute more from `storm_from` on.

use super::{DAY, History};

/// What to generate.
#[derive(Clone, Debug)]
pub struct Shape {
    pub seed: u64,
    pub tenants: usize,
    pub heavy: usize,
    pub days: u64,
    /// The lowest and highest mean calls a minute of an ordinary tenant.
    pub low: f64,
    pub high: f64,
    /// Extra calls a minute of the misbehaving tenant, from `storm_from`
    /// (minutes from the start).
    pub storm: u32,
    pub storm_from: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            seed: 1,
            tenants: 300,
            heavy: 3,
            days: 14,
            low: 2.0,
            high: 40.0,
            storm: 3000,
            storm_from: 11 * DAY + DAY / 2,
        }
    }
}

/// A generated trace.
pub struct Trace {
    pub history: History,
    /// The first minute.
    pub start: u64,
    pub heavy: Vec<String>,
    pub misbehaving: String,
    /// The misbehaving tenant's calls beyond its normal ones, per minute.
    pub excess: Vec<(u64, u32)>,
}

impl Trace {
    /// Calls of the misbehaving tenant beyond its normal ones in `from..to`.
    pub fn excess_in(&self, from: u64, to: u64) -> u64 {
        self.excess.iter().filter(|&&(m, _)| (from..to).contains(&m)).map(|&(_, n)| u64::from(n)).sum()
    }
}

/// The name of tenant `i`.
pub fn tenant(i: usize) -> String {
    format!("tenant=t{i:04}")
}

/// Generates the trace `shape` describes; the same shape gives the same
/// trace.
pub fn generate(shape: &Shape) -> Trace {
    let mut rng = SplitMix(shape.seed);
    // Midnight of a Monday (2026-01-05), in minutes since the epoch.
    let start = 1_767_571_200 / 60;
    let mut history = History::new(usize::MAX);
    let heavy: Vec<String> = (0..shape.heavy).map(|i| tenant(i * 97 % shape.tenants.max(1))).collect();
    let misbehaving = tenant(7);
    let mut excess = Vec::new();
    for i in 0..shape.tenants {
        let name = tenant(i);
        let spread = (shape.high / shape.low).ln();
        let mut mean = shape.low * (spread * rng.unit()).exp();
        if heavy.contains(&name) {
            mean *= 15.0;
        }
        for m in 0..shape.days * DAY {
            let day = m / DAY;
            let of_day = (m % DAY) as f64 / DAY as f64;
            // 0.4 at midnight, 1.6 at noon.
            let curve = 1.0 - 0.6 * (2.0 * std::f64::consts::PI * of_day).cos();
            let week = if day % 7 >= 5 { 0.6 } else { 1.0 };
            let mut calls = rng.poisson(mean * curve * week);
            if name == misbehaving && m >= shape.storm_from {
                calls += shape.storm;
                excess.push((start + m, shape.storm));
            }
            history.record(&name, start + m, calls).expect("the history has no bound");
        }
    }
    Trace { history, start, heavy, misbehaving, excess }
}

/// A small, seeded generator (SplitMix64): the trace needs to be the same
/// from run to run, not unpredictable.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A Poisson draw: exact (Knuth's product of uniforms) for small means,
    /// the normal approximation above 30.
    fn poisson(&mut self, mean: f64) -> u32 {
        if mean <= 0.0 {
            return 0;
        }
        if mean < 30.0 {
            let limit = (-mean).exp();
            let (mut k, mut p) = (0u32, self.unit());
            while p > limit {
                k += 1;
                p *= self.unit();
            }
            return k;
        }
        // Box-Muller.
        let (u1, u2) = (self.unit().max(f64::MIN_POSITIVE), self.unit());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        (mean + mean.sqrt() * z).round().max(0.0) as u32
    }
}

/// What recommendations made day by day would have done to a trace.
#[derive(Clone, Debug, Default)]
pub struct Evaluation {
    /// Per day evaluated: the limit for every key without an override.
    pub limits: Vec<u64>,
    /// The largest change of any key's limit from one day to the next, as a
    /// fraction of the day before (a fall, and a rise).
    pub largest_fall: f64,
    pub largest_rise: f64,
    /// Calls of the tenants other than the misbehaving one, and how many of
    /// them were denied.
    pub good_calls: u64,
    pub good_denied: u64,
    /// The misbehaving tenant's calls beyond its normal ones, and how many
    /// of its calls were denied, while it misbehaved.
    pub excess: u64,
    pub excess_denied: u64,
}

/// Walks forward through `trace`: at the start of each day from
/// `lookback` on, limits are proposed from the `lookback` days before (with
/// the guard rails against the day before's) and enforced on that day; the
/// day's calls are replayed against them.
pub fn evaluate(
    trace: &Trace,
    settings: &super::Settings,
    shape: super::Shape,
    lookback: u64,
    days: u64,
) -> Evaluation {
    let mut out = Evaluation::default();
    let mut previous: Option<super::Proposal> = None;
    for day in lookback..days {
        let from = trace.start + day * DAY;
        let proposal = super::propose(&trace.history, from - lookback * DAY, from, settings, previous.as_ref());
        if let Some(before) = &previous {
            for key in trace.history.keys.keys() {
                let (was, is) = (before.limit_for(key) as f64, proposal.limit_for(key) as f64);
                out.largest_fall = out.largest_fall.max((was - is) / was);
                out.largest_rise = out.largest_rise.max((is - was) / was);
            }
        }
        for r in super::replay(&trace.history, from, from + DAY, &proposal, shape) {
            if r.key == trace.misbehaving {
                let excess = trace.excess_in(from, from + DAY);
                if excess > 0 {
                    out.excess += excess;
                    out.excess_denied += r.denied;
                }
            } else {
                out.good_calls += r.calls;
                out.good_denied += r.denied;
            }
        }
        out.limits.push(proposal.per_minute);
        previous = Some(proposal);
    }
    out
}
