//! The console's charts: what the server keeps of the last 15 minutes, one
//! value per second, in bounded memory.
//!
//! A sampler reads, once a second, every rule's decision tally (two relaxed
//! counters the decision path adds to), every breaker's rates and state and
//! every scope's degradation level, and writes the second into fixed rings.
//! At most [`RESOURCES`] resources have rings of their own: a resource gets
//! one when it first decides while there is room, and gives it back after a
//! whole window without a decision; the rest are summed as "other". Breakers
//! and systems are bounded the same way. Each sample is also the `tick`
//! event the page applies, so the page never refetches to move its charts.
//!
//! Time is the caller's: [`Series::sample`] takes the second it samples, so
//! the tests step through seconds without waiting for them.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::engine::Tally;

/// Seconds kept: 15 minutes.
pub(crate) const SECONDS: usize = 900;
/// Resources with rings of their own.
pub(crate) const RESOURCES: usize = 256;
/// Breakers with rings of their own.
pub(crate) const BREAKERS: usize = 256;
/// Degradation scopes with rings of their own (the global scope included).
pub const SYSTEMS: usize = 64;
/// Transitions kept per breaker.
const TRANSITIONS: usize = 64;

/// One value per second for the last [`SECONDS`] seconds, ending at the
/// series' `now`.
#[derive(Clone, Debug)]
struct Ring<T> {
    values: Box<[T]>,
}

impl<T: Copy + Default> Ring<T> {
    fn new() -> Self {
        Ring { values: vec![T::default(); SECONDS].into_boxed_slice() }
    }

    fn set(&mut self, t: u64, v: T) {
        self.values[(t % SECONDS as u64) as usize] = v;
    }

    fn get(&self, t: u64) -> T {
        self.values[(t % SECONDS as u64) as usize]
    }

    /// The values from `now - SECONDS + 1` to `now`, oldest first.
    fn ordered(&self, now: u64) -> Vec<T> {
        (0..SECONDS as u64).map(|i| self.get((now + 1 + i) % SECONDS as u64)).collect()
    }
}

/// A resource's decisions per second.
#[derive(Clone, Debug)]
struct Decisions {
    admitted: Ring<u32>,
    denied: Ring<u32>,
    /// The last second it decided anything.
    last_active: u64,
}

impl Decisions {
    fn new(now: u64) -> Self {
        Decisions { admitted: Ring::new(), denied: Ring::new(), last_active: now }
    }

    fn total(&self) -> u64 {
        self.admitted.values.iter().chain(self.denied.values.iter()).map(|&v| u64::from(v)).sum()
    }

    fn json(&self, name: &str, now: u64) -> Value {
        json!({ "name": name, "admitted": self.admitted.ordered(now), "denied": self.denied.ordered(now) })
    }
}

/// A breaker's rates and state per second, and its transitions.
#[derive(Clone, Debug)]
struct BreakerSeries {
    failure_rate: Ring<f32>,
    slow_call_rate: Ring<f32>,
    /// The state's number (see [`state_number`]), 0 before it was seen.
    state: Ring<u8>,
    transitions: VecDeque<Transition>,
    last_seen: u64,
    /// What the last tick said of it, to say only what changed.
    last: Option<BreakerNow>,
}

impl BreakerSeries {
    fn new(now: u64) -> Self {
        BreakerSeries {
            failure_rate: Ring::new(),
            slow_call_rate: Ring::new(),
            state: Ring::new(),
            transitions: VecDeque::new(),
            last_seen: now,
            last: None,
        }
    }
}

#[derive(Clone, Debug)]
struct Transition {
    at: u64,
    from: &'static str,
    to: &'static str,
}

/// A breaker as one tick sees it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BreakerNow {
    pub resource: String,
    pub state: &'static str,
    pub calls: u64,
    pub failure_rate: f64,
    pub slow_call_rate: f64,
    pub not_permitted: u64,
}

/// The states as the state ring numbers them (0: not seen yet).
const STATES: [&str; 6] = ["CLOSED", "OPEN", "HALF_OPEN", "FORCED_OPEN", "DISABLED", "METRICS_ONLY"];

fn state_number(state: &str) -> u8 {
    STATES.iter().position(|s| *s == state).map_or(0, |i| i as u8 + 1)
}

/// What a tick reads besides the tallies.
#[derive(Debug, Default)]
pub struct Reading {
    pub breakers: Vec<BreakerNow>,
    /// (system, level); the global scope is "".
    pub levels: Vec<(String, u32)>,
}

/// A tally as the last sample read it: its resource, the tally, and what it
/// had counted (admitted, denied).
type Seen = (Arc<str>, Arc<Tally>, (u64, u64));

/// Everything kept for the charts.
#[derive(Debug)]
pub struct Series {
    /// The last second sampled (0: none yet).
    now: u64,
    /// The first second sampled: the page draws no further back.
    started: u64,
    resources: HashMap<Arc<str>, Decisions>,
    other: Decisions,
    /// Every tally seen at the last sample, by address: its resource, the
    /// tally (kept so that what it counted after the last sample is read
    /// once more when the rules that made it go) and what it had counted.
    previous: HashMap<usize, Seen>,
    breakers: HashMap<String, BreakerSeries>,
    levels: HashMap<String, (Ring<u8>, u64)>,
}

impl Default for Series {
    fn default() -> Self {
        Series {
            now: 0,
            started: 0,
            resources: HashMap::new(),
            other: Decisions::new(0),
            previous: HashMap::new(),
            breakers: HashMap::new(),
            levels: HashMap::new(),
        }
    }
}

/// The name under which resources without rings of their own are summed.
pub(crate) const OTHER: &str = "other";

impl Series {
    /// Samples second `now`: `tallies` calls back with every tally in force
    /// and its resource. Returns the tick event (JSON) the page applies.
    pub fn sample(
        &mut self,
        now: u64,
        tallies: impl FnOnce(&mut dyn FnMut(&str, &Arc<Tally>)),
        reading: Reading,
    ) -> String {
        if now <= self.now {
            // A clock that went back, or a second sampled twice: nothing new.
            return String::new();
        }
        // Seconds the sampler missed count as zero, and a new second starts at zero.
        if self.now == 0 {
            self.started = now;
        }
        let from = if self.now == 0 { now } else { (self.now + 1).max(now.saturating_sub(SECONDS as u64 - 1)) };
        for t in from..=now {
            for d in self.resources.values_mut().chain(std::iter::once(&mut self.other)) {
                d.admitted.set(t, 0);
                d.denied.set(t, 0);
            }
        }
        self.now = now;

        // What each resource decided since the last sample.
        let mut seen: HashMap<usize, Seen> = HashMap::with_capacity(self.previous.len());
        let mut delta: HashMap<Arc<str>, (u64, u64)> = HashMap::new();
        let previous = &mut self.previous;
        let mut each = |name: &str, tally: &Arc<Tally>| {
            let key = Arc::as_ptr(tally) as usize;
            if seen.contains_key(&key) {
                return;
            }
            let counted = tally.read();
            let (name, before) = match previous.remove(&key) {
                Some((name, _, before)) => (name, before),
                None => (Arc::from(name), (0, 0)),
            };
            let d = delta.entry(name.clone()).or_default();
            d.0 += counted.0.saturating_sub(before.0);
            d.1 += counted.1.saturating_sub(before.1);
            seen.insert(key, (name, tally.clone(), counted));
        };
        tallies(&mut each);
        // Tallies of rules no longer in force: what they counted since.
        for (_, (name, tally, before)) in previous.drain() {
            let counted = tally.read();
            let d = delta.entry(name).or_default();
            d.0 += counted.0.saturating_sub(before.0);
            d.1 += counted.1.saturating_sub(before.1);
        }
        self.previous = seen;

        // Rings given back after a whole window without a decision.
        self.resources.retain(|_, d| now - d.last_active < SECONDS as u64);
        let mut ticked: Vec<(Arc<str>, u32, u32)> = Vec::new();
        let (mut other_a, mut other_d) = (0u32, 0u32);
        for (name, (a, d)) in delta {
            if a == 0 && d == 0 {
                continue;
            }
            let (a, d) = (clamp(a), clamp(d));
            let room = self.resources.len() < RESOURCES;
            match self.resources.get_mut(&name) {
                Some(series) => record(series, now, a, d),
                None if room => {
                    let mut series = Decisions::new(now);
                    record(&mut series, now, a, d);
                    self.resources.insert(name.clone(), series);
                }
                None => {
                    other_a = other_a.saturating_add(a);
                    other_d = other_d.saturating_add(d);
                    continue;
                }
            }
            ticked.push((name, a, d));
        }
        if other_a > 0 || other_d > 0 {
            record(&mut self.other, now, other_a, other_d);
        }
        ticked.sort_by(|a, b| a.0.cmp(&b.0));

        let changed = self.sample_breakers(now, reading.breakers);
        self.sample_levels(now, &reading.levels);

        let mut out = String::with_capacity(64 + ticked.len() * 32);
        let _ = write!(out, "{{\"kind\":\"tick\",\"t\":{now},\"resources\":[");
        for (i, (name, a, d)) in ticked.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "[{},{a},{d}]", Value::String(name.to_string()));
        }
        let _ = write!(out, "],\"other\":[{other_a},{other_d}],\"breakers\":");
        out.push_str(&Value::Array(changed).to_string());
        out.push_str(",\"levels\":");
        let levels: Vec<Value> = reading.levels.iter().map(|(s, l)| json!([s, l])).collect();
        out.push_str(&Value::Array(levels).to_string());
        out.push('}');
        out
    }

    /// Writes each breaker's second; returns those that changed since the
    /// last tick (as the page's rows read them).
    fn sample_breakers(&mut self, now: u64, breakers: Vec<BreakerNow>) -> Vec<Value> {
        self.breakers.retain(|_, b| now - b.last_seen < SECONDS as u64);
        let mut changed = Vec::new();
        for b in breakers {
            if !self.breakers.contains_key(&b.resource) {
                if self.breakers.len() >= BREAKERS {
                    continue;
                }
                self.breakers.insert(b.resource.clone(), BreakerSeries::new(now));
            }
            let series = self.breakers.get_mut(&b.resource).expect("inserted above");
            // Seconds missed repeat the last value seen.
            let gap_from = if series.last.is_some() {
                (series.last_seen + 1).max(now.saturating_sub(SECONDS as u64 - 1))
            } else {
                now
            };
            let before = series.last_seen;
            let (f, s, st) =
                (series.failure_rate.get(before), series.slow_call_rate.get(before), series.state.get(before));
            for t in gap_from..now {
                series.failure_rate.set(t, f);
                series.slow_call_rate.set(t, s);
                series.state.set(t, st);
            }
            series.failure_rate.set(now, b.failure_rate as f32);
            series.slow_call_rate.set(now, b.slow_call_rate as f32);
            series.state.set(now, state_number(b.state));
            series.last_seen = now;
            if series.last.as_ref() != Some(&b) {
                changed.push(json!({
                    "resource": b.resource, "state": b.state, "calls": b.calls,
                    "failure_rate": b.failure_rate, "slow_call_rate": b.slow_call_rate, "not_permitted": b.not_permitted,
                }));
                series.last = Some(b);
            }
        }
        changed
    }

    fn sample_levels(&mut self, now: u64, levels: &[(String, u32)]) {
        self.levels.retain(|_, (_, seen)| now - *seen < SECONDS as u64);
        for (system, level) in levels {
            if !self.levels.contains_key(system) && self.levels.len() >= SYSTEMS {
                continue;
            }
            let (ring, seen) = self.levels.entry(system.clone()).or_insert_with(|| (Ring::new(), now));
            let from = if *seen == now { now } else { (*seen + 1).max(now.saturating_sub(SECONDS as u64 - 1)) };
            let previous = ring.get(*seen);
            for t in from..now {
                ring.set(t, previous);
            }
            ring.set(now, u8::try_from(*level).unwrap_or(u8::MAX));
            *seen = now;
        }
    }

    /// A breaker's transition, for the chart's marks.
    /// A breaker's transition, for the chart's marks (a breaker that opened
    /// within its first second is charted from then).
    pub fn transition(&mut self, resource: &str, at: u64, from: &'static str, to: &'static str) {
        if !self.breakers.contains_key(resource) && self.breakers.len() < BREAKERS {
            self.breakers.insert(resource.to_string(), BreakerSeries::new(at));
        }
        if let Some(b) = self.breakers.get_mut(resource) {
            if b.transitions.len() == TRANSITIONS {
                b.transitions.pop_front();
            }
            b.transitions.push_back(Transition { at, from, to });
        }
    }

    /// What the page asks for: the named resources and breakers (or, with
    /// none named, the `top` busiest), "other", and every level.
    pub fn json(&self, resources: &[String], breakers: &[String], top: usize) -> Value {
        let now = self.now;
        let chosen = |named: &[String], all: Vec<(&String, u64)>| -> Vec<String> {
            if !named.is_empty() {
                return named.to_vec();
            }
            let mut all = all;
            all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            all.into_iter().take(top).map(|(n, _)| n.clone()).collect()
        };
        let names: Vec<(String, u64)> = self.resources.iter().map(|(n, d)| (n.to_string(), d.total())).collect();
        let resource_names = chosen(resources, names.iter().filter(|(_, t)| *t > 0).map(|(n, t)| (n, *t)).collect());
        let resources: Vec<Value> =
            resource_names.iter().filter_map(|n| self.resources.get(n.as_str()).map(|d| d.json(n, now))).collect();
        let busiest: Vec<(&String, u64)> = self
            .breakers
            .iter()
            .map(|(n, b)| {
                let weight = b.state.values.iter().filter(|&&s| s != 0 && s != 1).count() as u64 * 1_000_000
                    + b.last.as_ref().map_or(0, |l| l.calls);
                (n, weight)
            })
            .collect();
        let breaker_names = chosen(breakers, busiest);
        let breakers: Vec<Value> = breaker_names
            .iter()
            .filter_map(|n| {
                let b = self.breakers.get(n)?;
                let transitions: Vec<Value> = b
                    .transitions
                    .iter()
                    .filter(|t| now.saturating_sub(t.at) < SECONDS as u64)
                    .map(|t| json!({ "t": t.at, "from": t.from, "to": t.to }))
                    .collect();
                let state: Vec<Option<&str>> =
                    b.state.ordered(now).into_iter().map(|s| s.checked_sub(1).map(|i| STATES[i as usize])).collect();
                Some(json!({
                    "resource": n,
                    "failure_rate": b.failure_rate.ordered(now),
                    "slow_call_rate": b.slow_call_rate.ordered(now),
                    "state": state,
                    "transitions": transitions,
                }))
            })
            .collect();
        let mut levels: Vec<Value> =
            self.levels.iter().map(|(s, (ring, _))| json!({ "system": s, "level": ring.ordered(now) })).collect();
        levels.sort_by(|a, b| a["system"].as_str().cmp(&b["system"].as_str()));
        json!({
            "t": now,
            "started": self.started,
            "seconds": SECONDS,
            "resources": resources,
            "other": self.other.json(OTHER, now),
            "tracked": self.resources.len(),
            "breakers": breakers,
            "levels": levels,
        })
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn record(d: &mut Decisions, now: u64, a: u32, n: u32) {
    d.admitted.set(now, a);
    d.denied.set(now, n);
    d.last_active = now;
}

#[cfg(test)]
mod tests;
