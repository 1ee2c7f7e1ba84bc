//! Degradation levels 0 to 3, one per scope: each system the rules name, and
//! the global scope (the resources no system lists).
//!
//! A scope's automatic level is the highest any of its signals asks for:
//! - the error and slow-call rates of its reported calls, and a percentile of
//!   their latency, over a window of whole seconds (at least `minimum_calls`);
//! - the load its instances report (`ReportLoad`): CPU, memory and queueing
//!   delay, summed up over the live instances (mean, busiest, or the share
//!   above a threshold); an instance silent for `instance_timeout` leaves.
//!
//! A signal asks for level `n` once it reaches the `n`th threshold, and keeps
//! asking for a level it raised until it is below `hysteresis` times that
//! threshold. The level rises at once; it falls only after `min_time_at_level`
//! at the level, one level at a time (at once, straight down, without a
//! dwell). An operator's level wins until cleared.
//!
//! The global scope has no automatic signal unless the rules' `global:`
//! section gives one (by default there: the error rate of every breaker's
//! calls, 5/15/30%, left below four fifths of the threshold). Without it,
//! one flaky dependency cannot raise the level of every resource.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::breaker::Call;
use crate::rules::SystemConfig;
use crate::rules::systems::{Aggregate, MAX_LEVEL, PriorityShedding};
use crate::time::Timestamp;

/// The effective level of a scope moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelChange {
    /// The system; empty for the global scope.
    pub system: Arc<str>,
    pub from: u32,
    pub to: u32,
    pub manual: bool,
    /// Which signal moved it, in one human line (empty for an operator's change).
    pub reason: String,
}

/// What one instance of a system last reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Utilization, 0 to 1.
    pub cpu: f64,
    pub memory: f64,
    pub in_flight: Option<u32>,
    pub queue_delay: Option<Duration>,
}

/// A load report of a new instance was refused: the system has `live`
/// instances, and may have `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyInstances {
    pub live: usize,
    pub max: usize,
}

/// A scope's signals as last evaluated; `None` when a signal has nothing to go on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Signals {
    /// Reported calls in the window.
    pub calls: u64,
    pub error_rate: Option<f64>,
    pub slow_call_rate: Option<f64>,
    pub latency: Option<Duration>,
    /// The aggregate the rules chose (the mean for `share`).
    pub cpu: Option<f64>,
    pub memory: Option<f64>,
    pub queue_delay: Option<Duration>,
    /// Live instances.
    pub instances: usize,
    /// The sum of the live instances' reported in-flight calls.
    pub in_flight: u64,
}

/// A scope's level and how it is set.
#[derive(Clone, Debug, PartialEq)]
pub struct Level {
    /// The system; empty for the global scope.
    pub system: Arc<str>,
    pub level: u32,
    pub manual: bool,
    pub automatic: u32,
    /// Why the automatic level is what it is.
    pub reason: String,
    pub signals: Signals,
}

/// One second of reported calls.
#[derive(Clone, Debug)]
struct Slot {
    second: u64,
    calls: u64,
    failed: u64,
    slow: u64,
    latency: Box<[u32; BUCKETS]>,
}

/// Latency buckets: four per power of two of microseconds (at most 19% apart).
const BUCKETS: usize = 128;

fn bucket(latency: Duration) -> usize {
    let us = latency.as_micros().min(u128::from(u64::MAX)) as u64;
    if us == 0 {
        return 0;
    }
    let log = 63 - u64::from(us.leading_zeros());
    let quarter = if log >= 2 { (us >> (log - 2)) & 3 } else { (us << (2 - log)) & 3 };
    (1 + 4 * log + quarter).min(BUCKETS as u64 - 1) as usize
}

/// The top of bucket `i` (a latency is never reported lower than it was).
fn bucket_top(i: usize) -> Duration {
    if i == 0 {
        return Duration::from_micros(1);
    }
    let (log, quarter) = ((i - 1) / 4, (i - 1) % 4);
    let us = (1u128 << log) * (4 + quarter as u128 + 1) / 4;
    Duration::from_micros(us.min(u128::from(u64::MAX)) as u64)
}

impl Slot {
    fn empty(second: u64) -> Self {
        Slot { second, calls: 0, failed: 0, slow: 0, latency: Box::new([0; BUCKETS]) }
    }
}

/// The state behind a scope's lock.
#[derive(Debug)]
struct Controller {
    cfg: SystemConfig,
    ring: Vec<Slot>,
    /// By instance: its load and when it was taken.
    instances: HashMap<String, (Load, Timestamp), ahash::RandomState>,
    /// When expired instances were last dropped.
    pruned_at: Timestamp,
    automatic: u32,
    /// When the automatic level last moved.
    since: Timestamp,
    manual: Option<u32>,
    reason: String,
    signals: Signals,
}

/// One scope: its level for the hot path as atomics, the rest behind a lock.
#[derive(Debug)]
pub struct Scope {
    name: Arc<str>,
    current: AtomicU32,
    shedding: AtomicU32,
    state: Mutex<Controller>,
}

impl Scope {
    pub fn new(cfg: SystemConfig) -> Self {
        let ring = (0..cfg.window_seconds).map(|_| Slot::empty(u64::MAX)).collect();
        Scope {
            name: Arc::from(cfg.name.as_str()),
            current: AtomicU32::new(0),
            shedding: AtomicU32::new(cfg.shed_priority.pack()),
            state: Mutex::new(Controller {
                cfg,
                ring,
                instances: HashMap::default(),
                pruned_at: Timestamp::ZERO,
                automatic: 0,
                since: Timestamp::ZERO,
                manual: None,
                reason: String::new(),
                signals: Signals::default(),
            }),
        }
    }

    /// The system's name; empty for the global scope.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn is_global(&self) -> bool {
        self.name.is_empty()
    }

    /// The level in force: one atomic load.
    #[inline]
    pub fn level(&self) -> u32 {
        self.current.load(Ordering::Relaxed)
    }

    /// From which level each priority is shed here.
    #[inline]
    pub fn shedding(&self) -> PriorityShedding {
        PriorityShedding::unpack(self.shedding.load(Ordering::Relaxed))
    }

    /// New thresholds (the rules changed); the state stays, the window
    /// starts over if its length changed.
    pub fn configure(&self, cfg: SystemConfig) {
        let mut c = self.lock();
        // Calls recorded while no signal read them (the global scope before
        // the rules gave it a `global:` section) must not raise a level the
        // moment a signal appears: the window starts empty then.
        let reads_calls =
            |c: &SystemConfig| c.error_rate.is_some() || c.slow_call_rate.is_some() || c.latency.is_some();
        if cfg.window_seconds != c.cfg.window_seconds || (reads_calls(&cfg) && !reads_calls(&c.cfg)) {
            c.ring = (0..cfg.window_seconds).map(|_| Slot::empty(u64::MAX)).collect();
        }
        self.shedding.store(cfg.shed_priority.pack(), Ordering::Relaxed);
        c.cfg = cfg;
    }

    /// A call a breaker counted (the global scope's signal).
    pub(crate) fn record_call(&self, now: Timestamp, call: Call) {
        let mut c = self.lock();
        let slot = c.slot(now);
        slot.calls += 1;
        slot.failed += u64::from(call.failed);
        slot.slow += u64::from(call.slow);
    }

    /// A reported outcome of one of the system's calls.
    pub(crate) fn record_outcome(&self, now: Timestamp, failed: bool, latency: Duration) {
        let mut c = self.lock();
        let slow = latency > c.cfg.slow_call_duration;
        let slot = c.slot(now);
        slot.calls += 1;
        slot.failed += u64::from(failed);
        slot.slow += u64::from(slow);
        slot.latency[bucket(latency)] += 1;
    }

    /// One instance's load, reported at `taken_at` (where it was taken:
    /// here, or on the replica that passed it on). A report older than the
    /// one held changes nothing (two replicas' reports cross on their way),
    /// nor does one older than `instance_timeout` (delivered late). An
    /// instance's silence is counted from when its last report was taken.
    /// A new instance is refused while the system has `max_instances` live
    /// ones. Answers how many live instances the system has.
    pub fn report_load(
        &self,
        now: Timestamp,
        instance: &str,
        load: Load,
        taken_at: Timestamp,
    ) -> Result<usize, TooManyInstances> {
        let mut c = self.lock();
        if now.saturating_since(taken_at) >= c.cfg.load.instance_timeout.as_nanos() as u64 {
            return Ok(c.instances.len());
        }
        if let Some(entry) = c.instances.get_mut(instance) {
            if taken_at >= entry.1 {
                *entry = (load, taken_at);
            }
            return Ok(c.instances.len());
        }
        let max = c.cfg.load.max_instances;
        // A flood of new ids walks the table at most ten times a second.
        if c.instances.len() >= max && now.saturating_since(c.pruned_at) >= 100_000_000 {
            c.prune(now);
        }
        if c.instances.len() >= max {
            return Err(TooManyInstances { live: c.instances.len(), max });
        }
        c.instances.insert(instance.to_string(), (load, taken_at));
        Ok(c.instances.len())
    }

    /// Recomputes the automatic level at `now`.
    pub(crate) fn evaluate(&self, now: Timestamp) -> Option<LevelChange> {
        self.update(|c| {
            c.prune(now);
            c.evaluate(now);
            None
        })
    }

    /// An operator's level (`Some`, at most 3), or back to automatic (`None`).
    pub(crate) fn set_manual(&self, level: Option<u32>) -> Option<LevelChange> {
        self.update(|c| {
            c.manual = level.map(|l| l.min(MAX_LEVEL));
            Some(match c.manual {
                Some(l) => format!("set to {l} by an operator"),
                None => format!("back to the automatic level: {}", c.reason),
            })
        })
    }

    /// The operator's level, if one is set.
    pub fn manual(&self) -> Option<u32> {
        self.lock().manual
    }

    pub fn get(&self) -> Level {
        let c = self.lock();
        Level {
            system: self.name.clone(),
            level: c.level(),
            manual: c.manual.is_some(),
            automatic: c.automatic,
            reason: c.reason.clone(),
            signals: c.signals.clone(),
        }
    }

    /// A change and the atomic level move together, under the lock.
    /// `f` answers the reason of an operator's change, `None` for an automatic one.
    fn update(&self, f: impl FnOnce(&mut Controller) -> Option<String>) -> Option<LevelChange> {
        let mut c = self.lock();
        let from = c.level();
        let by_operator = f(&mut c);
        let to = c.level();
        self.current.store(to, Ordering::Relaxed);
        let manual = by_operator.is_some();
        let reason = by_operator.unwrap_or_else(|| c.reason.clone());
        (from != to).then(|| LevelChange { system: self.name.clone(), from, to, manual, reason })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Controller> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One signal at one evaluation: its thresholds and whether the aggregate
/// reaches a value.
struct Signal<'a> {
    name: &'static str,
    thresholds: [f64; 3],
    reaches: &'a dyn Fn(f64) -> bool,
    show: &'a dyn Fn(f64) -> String,
    /// A load signal (summed up over the instances).
    share: bool,
}

impl Controller {
    fn level(&self) -> u32 {
        self.manual.unwrap_or(self.automatic)
    }

    /// The slot of `now`'s second, emptied if it held an older second.
    fn slot(&mut self, now: Timestamp) -> &mut Slot {
        let second = now.as_nanos() / 1_000_000_000;
        let len = self.ring.len() as u64;
        let slot = &mut self.ring[(second % len) as usize];
        if slot.second != second {
            slot.second = second;
            slot.calls = 0;
            slot.failed = 0;
            slot.slow = 0;
            slot.latency.fill(0);
        }
        slot
    }

    fn prune(&mut self, now: Timestamp) {
        let timeout = self.cfg.load.instance_timeout;
        self.instances.retain(|_, (_, taken)| now.saturating_since(*taken) < timeout.as_nanos() as u64);
        self.pruned_at = now;
    }

    fn evaluate(&mut self, now: Timestamp) {
        let second = now.as_nanos() / 1_000_000_000;
        let live = |s: &&Slot| s.second != u64::MAX && s.second <= second && second - s.second < self.ring.len() as u64;
        let (mut calls, mut failed, mut slow) = (0u64, 0u64, 0u64);
        let mut hist = [0u64; BUCKETS];
        for s in self.ring.iter().filter(live) {
            calls += s.calls;
            failed += s.failed;
            slow += s.slow;
            for (h, n) in hist.iter_mut().zip(s.latency.iter()) {
                *h += u64::from(*n);
            }
        }
        let cfg = &self.cfg;
        let enough = calls >= u64::from(cfg.minimum_calls) && calls > 0;
        let rate = |n: u64| enough.then(|| n as f64 / calls as f64);
        let latency =
            cfg.latency.filter(|_| enough && hist.iter().sum::<u64>() > 0).map(|(q, _)| percentile(&hist, q.0));
        let loads: Vec<&Load> = self.instances.values().map(|(l, ..)| l).collect();
        let n = loads.len();
        let in_flight = loads.iter().filter_map(|l| l.in_flight).map(u64::from).sum();
        let cpu: Vec<f64> = loads.iter().map(|l| l.cpu).collect();
        let memory: Vec<f64> = loads.iter().map(|l| l.memory).collect();
        let queue: Vec<f64> = loads.iter().filter_map(|l| l.queue_delay).map(|d| d.as_secs_f64()).collect();
        let signals = Signals {
            calls,
            error_rate: rate(failed),
            slow_call_rate: rate(slow),
            latency,
            cpu: summary(&cpu, cfg.load.aggregate),
            memory: summary(&memory, cfg.load.aggregate),
            queue_delay: summary(&queue, cfg.load.aggregate).map(Duration::from_secs_f64),
            instances: n,
            in_flight,
        };

        let fraction = |v: f64| format!("{v:.2}");
        let secs = |v: f64| crate::rules::duration::human(Duration::from_secs_f64(v));
        let by_value = |v: Option<f64>| move |t: f64| v.is_some_and(|v| v >= t);
        let (agg, share) = (cfg.load.aggregate, cfg.load.share);
        let secs3 = |d: [Duration; 3]| d.map(|d| d.as_secs_f64());
        let (error, slow_rate) = (by_value(signals.error_rate), by_value(signals.slow_call_rate));
        let lat = by_value(signals.latency.map(|d| d.as_secs_f64()));
        let cpu_r = |t: f64| reaches(&cpu, agg, share, t);
        let mem_r = |t: f64| reaches(&memory, agg, share, t);
        let queue_r = |t: f64| reaches(&queue, agg, share, t);
        let mut list: Vec<Signal<'_>> = Vec::new();
        if let Some(t) = cfg.error_rate {
            list.push(Signal { name: "error rate", thresholds: t, reaches: &error, show: &fraction, share: false });
        }
        if let Some(t) = cfg.slow_call_rate {
            list.push(Signal {
                name: "slow-call rate",
                thresholds: t,
                reaches: &slow_rate,
                show: &fraction,
                share: false,
            });
        }
        if let Some((_, t)) = cfg.latency {
            list.push(Signal { name: "latency", thresholds: secs3(t), reaches: &lat, show: &secs, share: false });
        }
        if let Some(t) = cfg.cpu {
            list.push(Signal { name: "cpu", thresholds: t, reaches: &cpu_r, show: &fraction, share: true });
        }
        if let Some(t) = cfg.memory {
            list.push(Signal { name: "memory", thresholds: t, reaches: &mem_r, show: &fraction, share: true });
        }
        if let Some(t) = cfg.queue_delay {
            list.push(Signal {
                name: "queue delay",
                thresholds: secs3(t),
                reaches: &queue_r,
                show: &secs,
                share: true,
            });
        }

        let (current, hysteresis) = (self.automatic, cfg.hysteresis);
        let mut wanted = 0;
        let mut why = String::new();
        for s in &list {
            let reached = (1..=MAX_LEVEL).rev().find(|&l| (s.reaches)(s.thresholds[l as usize - 1])).unwrap_or(0);
            let held =
                (1..=current).rev().find(|&l| (s.reaches)(s.thresholds[l as usize - 1] * hysteresis)).unwrap_or(0);
            let level = reached.max(held);
            if level > wanted {
                wanted = level;
                let t = s.thresholds[level as usize - 1];
                let share = if s.share && cfg.load.aggregate == Aggregate::Share {
                    format!(" on at least {:.0}% of the instances", cfg.load.share * 100.0)
                } else {
                    String::new()
                };
                why = if reached >= held {
                    format!("{} reached {}{share} (level {level})", s.name, (s.show)(t))
                } else {
                    format!("{} still above {} (level {level} is left below it)", s.name, (s.show)(t * hysteresis))
                };
            }
        }
        let describe = describe(&signals, cfg.load.aggregate);
        let next = if wanted > current {
            wanted
        } else if wanted < current && now.saturating_since(self.since) >= cfg.min_time_at_level.as_nanos() as u64 {
            if cfg.min_time_at_level.is_zero() { wanted } else { current - 1 }
        } else {
            current
        };
        if next != current {
            self.automatic = next;
            self.since = now;
        }
        self.reason = match (next, why.is_empty()) {
            (0, _) => describe,
            (_, false) if next == wanted => format!("{why}; {describe}"),
            _ => format!(
                "the signals ask for level {wanted}; a level falls one at a time, after {} at it; {describe}",
                crate::rules::duration::human(cfg.min_time_at_level)
            ),
        };
        self.signals = signals;
    }
}

/// Whether the live instances' values reach threshold `t`.
fn reaches(values: &[f64], aggregate: Aggregate, share: f64, t: f64) -> bool {
    if values.is_empty() {
        return false;
    }
    match aggregate {
        Aggregate::Mean => values.iter().sum::<f64>() / values.len() as f64 >= t,
        Aggregate::Max => values.iter().any(|&v| v >= t),
        Aggregate::Share => values.iter().filter(|&&v| v >= t).count() as f64 >= share * values.len() as f64 - 1e-9,
    }
}

/// The value shown for a load signal: the busiest for `max`, else the mean.
fn summary(values: &[f64], aggregate: Aggregate) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    Some(match aggregate {
        Aggregate::Max => values.iter().copied().fold(f64::MIN, f64::max),
        _ => values.iter().sum::<f64>() / values.len() as f64,
    })
}

fn describe(s: &Signals, aggregate: Aggregate) -> String {
    let mut out = format!("{} calls", s.calls);
    if let Some(r) = s.error_rate {
        let _ = write!(out, ", error rate {r:.2}");
    }
    if let Some(r) = s.slow_call_rate {
        let _ = write!(out, ", slow {r:.2}");
    }
    if let Some(l) = s.latency {
        let _ = write!(out, ", latency {}", crate::rules::duration::human(l));
    }
    let how = if aggregate == Aggregate::Max { "max" } else { "mean" };
    if s.instances > 0 {
        let _ = write!(out, "; {} instances", s.instances);
        if let Some(c) = s.cpu {
            let _ = write!(out, ", cpu {how} {c:.2}");
        }
        if let Some(m) = s.memory {
            let _ = write!(out, ", memory {how} {m:.2}");
        }
    }
    out
}

/// The `q` quantile (0 to 1) of a histogram, as its bucket's top.
fn percentile(hist: &[u64; BUCKETS], q: f64) -> Duration {
    let total: u64 = hist.iter().sum();
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total.max(1));
    let mut seen = 0;
    for (i, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return bucket_top(i);
        }
    }
    bucket_top(BUCKETS - 1)
}

/// Every scope in force: the global scope and one per system, in file order.
/// A system that keeps its name across rule changes keeps its state.
#[derive(Debug)]
pub struct Systems {
    global: Arc<Scope>,
    named: Vec<Arc<Scope>>,
}

impl Default for Systems {
    fn default() -> Self {
        Systems { global: Arc::new(Scope::new(SystemConfig::global())), named: Vec::new() }
    }
}

impl Systems {
    /// The scopes for `configs`, and the global scope set as `global` says:
    /// those already here keep their state and take the new thresholds.
    pub fn reconfigure(&self, configs: &[SystemConfig], global: &SystemConfig) -> Systems {
        self.global.configure(global.clone());
        let named = configs
            .iter()
            .map(|cfg| match self.named.iter().find(|s| *s.name == *cfg.name) {
                Some(s) => {
                    s.configure(cfg.clone());
                    s.clone()
                }
                None => Arc::new(Scope::new(cfg.clone())),
            })
            .collect();
        Systems { global: self.global.clone(), named }
    }

    /// The scope of system `index` in file order; `None` is the global scope.
    #[inline]
    pub fn scope(&self, index: Option<usize>) -> &Arc<Scope> {
        index.and_then(|i| self.named.get(i)).unwrap_or(&self.global)
    }

    /// A scope by name; the empty name is the global scope.
    pub(crate) fn by_name(&self, name: &str) -> Option<&Arc<Scope>> {
        if name.is_empty() {
            return Some(&self.global);
        }
        self.named.iter().find(|s| &*s.name == name)
    }

    pub fn global(&self) -> &Arc<Scope> {
        &self.global
    }

    /// The named systems, in file order.
    pub fn named(&self) -> &[Arc<Scope>] {
        &self.named
    }

    /// The global scope, then every system.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Scope>> {
        std::iter::once(&self.global).chain(self.named.iter())
    }
}

#[cfg(test)]
mod tests;
