//! Adaptive concurrency limits (SPEC section 5): the limit on calls in
//! flight to a resource, recomputed every window from the latencies its
//! callers report, the way Netflix's concurrency-limits computes a
//! client's own limit (Gradient2, Vegas, AIMD), but from every caller's
//! samples at once.
//!
//! Everything here is plain state that takes the time and the samples; the
//! engine feeds it (ReportOutcome, permit expiry), the replication module
//! carries windows between replicas and the shared state back.
//!
//! A window gathers the samples of about `window` (a second by default):
//! how many, their mean and least latency, the most calls in flight, and
//! the drops (FAILURE outcomes and expired permits, which carry no
//! latency). When it closes with at least `min_samples`, the algorithm
//! takes it as Netflix's windowed limit hands a window to its delegate:
//! one update with the window's mean latency, its peak in flight, and
//! whether anything dropped.

use std::collections::VecDeque;
use std::time::Duration;

use crate::time::Timestamp;
pub use config::{AdaptiveConfig, AimdConfig, AlgorithmConfig, Gradient2Config, ProbeConfig, VegasConfig};

mod aimd;
mod config;
mod gradient2;
mod probe;
mod vegas;

pub use probe::Probe;

pub use aimd::Aimd;
pub use gradient2::Gradient2;
pub use vegas::Vegas;

/// How many closed windows a limit remembers, for the console's chart
/// (two minutes of one-second windows).
pub(crate) const HISTORY: usize = 120;

/// What one window gathered. Latencies in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Calls that reported a latency.
    pub samples: u64,
    pub rtt_sum_us: u64,
    /// The least latency reported (0: none).
    pub min_rtt_us: u64,
    /// The most calls in flight when one was admitted.
    pub max_in_flight: u32,
    /// Failures and expired permits.
    pub drops: u64,
}

impl Window {
    /// A call that came back after `rtt`.
    pub fn sample(&mut self, rtt: Duration) {
        let us = rtt.as_micros().min(u128::from(u64::MAX / 4)) as u64;
        self.samples += 1;
        self.rtt_sum_us = self.rtt_sum_us.saturating_add(us);
        self.min_rtt_us = if self.min_rtt_us == 0 { us.max(1) } else { self.min_rtt_us.min(us.max(1)) };
    }

    pub fn drop_one(&mut self) {
        self.drops += 1;
    }

    /// A call admitted with `n` in flight (itself included).
    pub fn in_flight(&mut self, n: u32) {
        self.max_in_flight = self.max_in_flight.max(n);
    }

    /// Another replica's window of the same time: counts add, the peaks in
    /// flight add too (the fleet's peak is at most their sum).
    pub fn merge(&mut self, o: &Window) {
        self.samples += o.samples;
        self.rtt_sum_us = self.rtt_sum_us.saturating_add(o.rtt_sum_us);
        self.min_rtt_us = match (self.min_rtt_us, o.min_rtt_us) {
            (0, m) | (m, 0) => m,
            (a, b) => a.min(b),
        };
        self.max_in_flight = self.max_in_flight.saturating_add(o.max_in_flight);
        self.drops += o.drops;
    }

    /// The mean latency in microseconds, if any call reported one.
    pub fn mean_rtt_us(&self) -> Option<f64> {
        (self.samples > 0).then(|| (self.rtt_sum_us as f64 / self.samples as f64).max(1.0))
    }

    pub fn is_empty(&self) -> bool {
        self.samples == 0 && self.drops == 0 && self.max_in_flight == 0
    }
}

/// What an algorithm is given once per window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Update {
    /// The window's mean latency in microseconds; `None` when every call
    /// of the window dropped.
    pub rtt_us: Option<f64>,
    pub in_flight: u32,
    pub dropped: bool,
    /// The no-load latency measured at the floor (µs), when the limit
    /// measures it (see [`ProbeConfig`]).
    pub min_rtt_us: Option<f64>,
}

/// The state of one algorithm: the estimate, and what it keeps between
/// windows.
#[derive(Clone, Debug, PartialEq)]
pub enum Estimator {
    Gradient2(Gradient2),
    Vegas(Vegas),
    Aimd(Aimd),
}

/// The algorithm's inputs as they were at the last update (microseconds;
/// 0 where the algorithm has no such measure).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Inputs {
    /// The last window's mean latency.
    pub short_rtt_us: f64,
    /// Gradient2's long-term latency.
    pub long_rtt_us: f64,
    /// Vegas's no-load latency.
    pub no_load_rtt_us: f64,
    /// Gradient2's gradient (long over short, within [0.5, 1]); Vegas's
    /// estimated queue.
    pub gradient: f64,
    pub queue: f64,
    /// The no-load latency measured at the floor (0: none yet, or not
    /// measured).
    pub min_rtt_us: f64,
    /// Whether the limit is held at the floor now, to measure it.
    pub probing: bool,
    /// When the next measurement starts.
    pub next_probe_at: Option<Timestamp>,
}

/// One closed window, as the chart shows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub at: Timestamp,
    pub limit: u32,
    pub window: Window,
}

/// A resource's adaptive limit: the algorithm's state, the window being
/// gathered and when it closes, and the windows closed lately.
#[derive(Clone, Debug)]
pub struct Controller {
    cfg: AdaptiveConfig,
    estimator: Estimator,
    window: Window,
    closes_at: Timestamp,
    history: VecDeque<Point>,
    /// The version of the fleet's state last adopted (with Redis).
    fleet_version: Option<u64>,
    /// When this replica last pushed its window to the fleet's.
    pushed_at: Option<Timestamp>,
    /// The measured no-load latency, when the rule measures it.
    probe: Option<Probe>,
    /// Windows in a row in which the limit rose: the algorithm saw no sign
    /// of a queue. After [`QUIET_WINDOWS`], the no-load latency is measured
    /// again early, in case the reference it decides against is wrong.
    rising: u32,
}

/// Windows in a row of a rising limit after which the no-load latency is
/// measured again (a minute with the default one-second window).
const QUIET_WINDOWS: u32 = 60;

impl Estimator {
    pub fn new(cfg: &AdaptiveConfig, seed: u64) -> Estimator {
        let initial = f64::from(cfg.initial);
        match cfg.algorithm {
            AlgorithmConfig::Gradient2(_) => Estimator::Gradient2(Gradient2::new(initial)),
            AlgorithmConfig::Vegas(_) => Estimator::Vegas(Vegas::new(initial, seed)),
            AlgorithmConfig::Aimd(_) => Estimator::Aimd(Aimd::new(initial)),
        }
    }

    /// Lowers the estimate to `limit` (never raises it).
    pub fn lower_to(&mut self, limit: f64) {
        let l = match self {
            Estimator::Gradient2(g) => &mut g.limit,
            Estimator::Vegas(v) => &mut v.limit,
            Estimator::Aimd(a) => &mut a.limit,
        };
        *l = l.min(limit);
    }

    /// The estimate, unrounded.
    pub fn estimate(&self) -> f64 {
        match self {
            Estimator::Gradient2(g) => g.limit,
            Estimator::Vegas(v) => v.limit,
            Estimator::Aimd(a) => a.limit,
        }
    }

    /// One window's update; the new estimate.
    pub fn update(&mut self, cfg: &AdaptiveConfig, u: &Update) -> f64 {
        let (min, max) = (f64::from(cfg.min), f64::from(cfg.max));
        match (self, cfg.algorithm) {
            (Estimator::Gradient2(g), AlgorithmConfig::Gradient2(c)) => g.update(&c, (min, max), u),
            (Estimator::Vegas(v), AlgorithmConfig::Vegas(c)) => v.update(&c, (min, max), u),
            (Estimator::Aimd(a), AlgorithmConfig::Aimd(c)) => a.update(&c, (min, max), u),
            // Rules changed the algorithm: the caller makes a new state.
            (e, _) => e.estimate(),
        }
    }

    pub fn inputs(&self) -> Inputs {
        match self {
            Estimator::Gradient2(g) => g.inputs(),
            Estimator::Vegas(v) => v.inputs(),
            Estimator::Aimd(a) => a.inputs(),
        }
    }

    fn same_algorithm(&self, cfg: &AdaptiveConfig) -> bool {
        matches!(
            (self, cfg.algorithm),
            (Estimator::Gradient2(_), AlgorithmConfig::Gradient2(_))
                | (Estimator::Vegas(_), AlgorithmConfig::Vegas(_))
                | (Estimator::Aimd(_), AlgorithmConfig::Aimd(_))
        )
    }

    /// The state as Redis keeps it for the fleet: its numbers, space
    /// separated, after the algorithm's name.
    pub fn encode(&self) -> String {
        let (name, numbers) = match self {
            Estimator::Gradient2(g) => ("gradient2", g.numbers()),
            Estimator::Vegas(v) => ("vegas", v.numbers()),
            Estimator::Aimd(a) => ("aimd", a.numbers()),
        };
        let mut out = String::from(name);
        for n in numbers {
            out.push(' ');
            out.push_str(&n.to_string());
        }
        out
    }

    /// The state [`Estimator::encode`] wrote, if it is one of `cfg`'s
    /// algorithm and every number is finite.
    pub fn decode(text: &str, cfg: &AdaptiveConfig) -> Option<Estimator> {
        let mut parts = text.split(' ');
        let name = parts.next()?;
        let numbers: Vec<f64> =
            parts.map(|p| p.parse::<f64>().ok().filter(|n| n.is_finite())).collect::<Option<_>>()?;
        let e = match name {
            "gradient2" => Estimator::Gradient2(Gradient2::from_numbers(&numbers)?),
            "vegas" => Estimator::Vegas(Vegas::from_numbers(&numbers)?),
            "aimd" => Estimator::Aimd(Aimd::from_numbers(&numbers)?),
            _ => return None,
        };
        e.same_algorithm(cfg).then_some(e)
    }
}

/// The limit an estimate allows: whole calls, within the rule's bounds.
pub fn whole(estimate: f64, cfg: &AdaptiveConfig) -> u32 {
    let floor =
        if estimate.is_finite() { estimate.floor().max(0.0).min(f64::from(u32::MAX)) as u32 } else { cfg.initial };
    floor.clamp(cfg.min, cfg.max).max(1)
}

impl Controller {
    pub fn new(cfg: AdaptiveConfig, now: Timestamp, seed: u64) -> Controller {
        Controller {
            estimator: Estimator::new(&cfg, seed),
            cfg,
            window: Window::default(),
            closes_at: now.saturating_add(cfg.window),
            history: VecDeque::new(),
            fleet_version: None,
            pushed_at: None,
            probe: cfg.probe.map(|p| Probe::new(p, now)),
            rising: 0,
        }
    }

    /// Whether this replica's window is due to go to the fleet's at `now`:
    /// four times a window, so that the fleet's closes at most a quarter
    /// window late, and a thousand resources cost Redis a few thousand
    /// scripts a second at most.
    pub fn push_due(&mut self, now: Timestamp) -> bool {
        let due = self
            .pushed_at
            .is_none_or(|at| now.saturating_since(at) >= crate::time::duration_nanos(self.cfg.window / 4));
        if due {
            self.pushed_at = Some(now);
        }
        due
    }

    /// The version of the fleet's state this one follows, if any.
    pub fn fleet_version(&self) -> Option<u64> {
        self.fleet_version
    }

    pub fn set_fleet_version(&mut self, v: u64) {
        self.fleet_version = Some(v);
    }

    /// A window taken for the fleet that never reached it: its samples go
    /// back into the one being gathered.
    pub fn put_back(&mut self, w: &Window) {
        let peak = self.window.max_in_flight.max(w.max_in_flight);
        self.window.merge(w);
        self.window.max_in_flight = peak;
    }

    pub fn config(&self) -> &AdaptiveConfig {
        &self.cfg
    }

    /// The limit in force: the algorithm's, or the floor while the no-load
    /// latency is measured.
    pub fn limit(&self) -> u32 {
        let limit = whole(self.estimator.estimate(), &self.cfg);
        match &self.probe {
            Some(p) if p.pinned() => limit.min(self.floor()),
            _ => limit,
        }
    }

    /// The limit while the no-load latency is measured: the probe's floor,
    /// never below `min`.
    fn floor(&self) -> u32 {
        self.probe.as_ref().map_or(self.cfg.min, |p| p.config().floor.max(self.cfg.min))
    }

    /// The algorithm's inputs, with the measured no-load latency.
    pub fn inputs(&self) -> Inputs {
        let mut inputs = self.estimator.inputs();
        if let Some(p) = &self.probe {
            inputs.min_rtt_us = p.min_rtt_us().unwrap_or(0.0);
            inputs.probing = p.pinned();
            inputs.next_probe_at = Some(p.next_at());
        }
        inputs
    }

    pub fn estimator(&self) -> &Estimator {
        &self.estimator
    }

    /// New rules: the same algorithm keeps its state (its limit within the
    /// new bounds); another starts afresh at its `initial`.
    pub fn reconfigure(&mut self, cfg: AdaptiveConfig, seed: u64) {
        if cfg == self.cfg {
            return;
        }
        if !self.estimator.same_algorithm(&cfg) {
            self.estimator = Estimator::new(&cfg, seed);
        }
        self.probe = match (self.probe.take(), cfg.probe) {
            (Some(mut p), Some(c)) => {
                p.reconfigure(c, self.closes_at);
                Some(p)
            }
            (None, Some(c)) => Some(Probe::new(c, self.closes_at)),
            (_, None) => None,
        };
        self.cfg = cfg;
    }

    /// The window being gathered, to add a sample to.
    pub fn window_mut(&mut self) -> &mut Window {
        &mut self.window
    }

    /// Whether the window being gathered is over at `now`.
    pub fn due(&self, now: Timestamp) -> bool {
        now >= self.closes_at
    }

    /// Takes the window being gathered and starts the next (the sync sends
    /// it to be merged with the other replicas').
    pub fn take_window(&mut self, now: Timestamp) -> Window {
        self.closes_at = now.saturating_add(self.cfg.window);
        std::mem::take(&mut self.window)
    }

    /// Closes the window if it is over: the new limit, when it changed
    /// anything (a window short of `min_samples` does not). The engine
    /// composes the same steps itself; the tests use this shorthand.
    #[cfg(test)]
    pub(crate) fn close_if_due(&mut self, now: Timestamp) -> Option<u32> {
        if !self.due(now) {
            return None;
        }
        let w = self.take_window(now);
        self.apply(now, &w)
    }

    /// Runs the algorithm on a closed window (this replica's, or the
    /// fleet's merged): the new limit, if the window was full enough.
    pub fn apply(&mut self, now: Timestamp, w: &Window) -> Option<u32> {
        let floor = self.floor();
        if self.probe.as_mut().is_some_and(|p| p.on_window(now, w, floor)) {
            // A window at the floor says nothing of the limit. A
            // measurement that found the resource queued before it lowers
            // the limit it goes back to.
            if let Some(resume) = self.probe.as_mut().and_then(Probe::take_resume) {
                self.estimator.lower_to(resume.max(f64::from(self.cfg.min)));
            }
            let limit = self.limit();
            self.remember(now, limit, *w);
            return Some(limit);
        }
        if w.samples + w.drops < u64::from(self.cfg.min_samples) {
            return None;
        }
        let u = Update {
            rtt_us: w.mean_rtt_us(),
            in_flight: w.max_in_flight,
            dropped: w.drops > 0,
            min_rtt_us: self.probe.as_ref().and_then(Probe::min_rtt_us),
        };
        let before = self.estimator.estimate();
        self.estimator.update(&self.cfg, &u);
        self.note_rise(now, before);
        let limit = self.limit();
        self.remember(now, limit, *w);
        Some(limit)
    }

    /// Counts the windows in a row in which the estimate rose (below `max`);
    /// after [`QUIET_WINDOWS`] of them, measures the no-load latency early.
    fn note_rise(&mut self, now: Timestamp, before: f64) {
        let after = self.estimator.estimate();
        self.rising = if after > before && after < f64::from(self.cfg.max) { self.rising + 1 } else { 0 };
        if self.rising >= QUIET_WINDOWS && self.probe.as_mut().is_some_and(|p| p.hurry(now)) {
            self.rising = 0;
        }
    }

    /// Adopts the fleet's state, computed by another replica from the
    /// merged window `w`.
    pub fn adopt(&mut self, now: Timestamp, estimator: Estimator, w: Option<&Window>) {
        let before = self.estimator.estimate();
        self.estimator = estimator;
        // The fleet's window moves this replica's measurement on too: every
        // replica holds back at the same windows.
        let floor = self.floor();
        let mut at_floor = false;
        if let (Some(p), Some(w)) = (self.probe.as_mut(), w) {
            at_floor = p.on_window(now, w, floor);
            // The fleet's estimator, adopted above, was lowered already by
            // the replica that computed it.
            p.take_resume();
        }
        // Every replica counts the same fleet estimates as the replica that
        // computed them, and so measures early at the same window.
        if w.is_some() && !at_floor {
            self.note_rise(now, before);
        }
        if let Some(w) = w {
            let limit = self.limit();
            self.remember(now, limit, *w);
        }
    }

    fn remember(&mut self, at: Timestamp, limit: u32, window: Window) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(Point { at, limit, window });
    }

    /// The windows closed lately, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &Point> {
        self.history.iter()
    }
}

#[cfg(test)]
mod tests;
