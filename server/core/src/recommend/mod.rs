//! Limits recommended from recorded traffic, and proven by replaying it.
//!
//! A [`History`] holds each key's calls per minute. [`propose`] reads a
//! period of it and proposes one limit a minute for every key and overrides
//! for the keys that are heavier than most:
//!
//! - A key's *typical peak* is the median, over the days of the period, of
//!   its busiest minute of each day. The median lets a key that misbehaved
//!   on fewer than half of the days keep the peak it had before.
//! - The limit is a stated quantile of the keys' typical peaks times a
//!   headroom. A key whose typical peak times the headroom is above that
//!   limit gets an override of its own at that figure.
//! - Guard rails against the limits in force (the previous proposal): a
//!   limit goes down by at most a stated fraction a step, and is never set
//!   below the observed figure times the headroom (a rise to it is never
//!   held back, since holding it back would deny calls that are normal).
//!
//! [`replay`] then sends the recorded calls of a period through the real
//! limiter code (the token bucket or the fixed window of [`crate::limiter`],
//! each minute's calls spread evenly over it) and counts what the proposal
//! would have denied, key by key.

use std::collections::BTreeMap;

use crate::limiter::rate::Rate;
use crate::limiter::{Algorithm, fixed_window, token_bucket};
use crate::time::Timestamp;

pub mod synthetic;
#[cfg(test)]
mod tests;
pub mod traffic;

/// Minutes in a day: a typical peak is taken per day of this many minutes
/// from the start of the period.
pub const DAY: u64 = 1440;
const MINUTE_NANOS: u64 = 60_000_000_000;
/// The last minute a [`Timestamp`] holds (nanoseconds in a u64), less a day
/// for the replay of a day after it.
const LAST_MINUTE: u64 = u64::MAX / MINUTE_NANOS - DAY;
/// The longest line of a trace, in bytes (its line end aside).
pub const MAX_LINE: usize = 4096;
/// The most calls of one key in one minute (about 16,667 a second).
pub const MAX_CALLS: u32 = 1_000_000;
/// The longest key, in bytes.
pub const MAX_KEY: usize = 1024;

/// Each key's calls per minute, kept sparse (minutes without calls cost
/// nothing).
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Per key, (minute, calls) in increasing minutes: 8 bytes a minute.
    keys: BTreeMap<String, Vec<(u32, u32)>>,
    entries: usize,
    max_entries: usize,
}

/// Why a history could not take more.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HistoryError {
    #[error(
        "the history holds at most {0} pairs of a key and a minute (--max-entries); read a shorter period or fewer keys"
    )]
    Full(usize),
    #[error("minute {0} is past the last one a time can hold (year 2554)")]
    TooLate(u64),
    #[error("{0} calls in one minute of one key is more than {MAX_CALLS}")]
    TooMany(u64),
    #[error("a key of {0} bytes is longer than {MAX_KEY}")]
    LongKey(usize),
    #[error("line {line}: {what}")]
    Line { line: usize, what: String },
}

impl History {
    /// An empty history holding at most `max_entries` (key, minute) pairs.
    pub fn new(max_entries: usize) -> Self {
        History { keys: BTreeMap::new(), entries: 0, max_entries }
    }

    /// Adds `calls` to `key` in `minute` (minutes since the Unix epoch).
    pub fn record(&mut self, key: &str, minute: u64, calls: u32) -> Result<(), HistoryError> {
        if minute > LAST_MINUTE {
            return Err(HistoryError::TooLate(minute));
        }
        if calls > MAX_CALLS {
            return Err(HistoryError::TooMany(u64::from(calls)));
        }
        if key.len() > MAX_KEY {
            return Err(HistoryError::LongKey(key.len()));
        }
        if calls == 0 {
            return Ok(());
        }
        let minute = minute as u32;
        let series = match self.keys.get_mut(key) {
            Some(series) => series,
            None => {
                // A new key costs room as minutes of its bytes do, so that
                // long keys are bounded too.
                let cost = 1 + key.len() / 16;
                if self.entries + cost > self.max_entries {
                    return Err(HistoryError::Full(self.max_entries));
                }
                self.entries += cost;
                self.keys.entry(key.to_string()).or_default()
            }
        };
        match series.binary_search_by_key(&minute, |&(m, _)| m) {
            Ok(i) => {
                let sum = u64::from(series[i].1) + u64::from(calls);
                series[i].1 = u32::try_from(sum).ok().filter(|&n| n <= MAX_CALLS).ok_or(HistoryError::TooMany(sum))?;
            }
            Err(i) => {
                if self.entries >= self.max_entries {
                    return Err(HistoryError::Full(self.max_entries));
                }
                series.insert(i, (minute, calls));
                self.entries += 1;
            }
        }
        Ok(())
    }

    /// Reads lines of `unix_seconds,key,calls` (the key may itself hold
    /// commas; blank lines and lines starting with `#` are skipped). Calls
    /// of one key in one minute add up. A line longer than [`MAX_LINE`]
    /// bytes is refused, so that a file without line ends (a device, a
    /// stream of zeros) is not read into memory whole.
    pub fn read(&mut self, mut text: impl std::io::BufRead) -> Result<(), HistoryError> {
        use std::io::{BufRead as _, Read as _};
        let mut buf = Vec::new();
        for line_no in 1.. {
            let bad = |what: String| HistoryError::Line { line: line_no, what };
            buf.clear();
            let n =
                (&mut text).take(MAX_LINE as u64 + 3).read_until(b'\n', &mut buf).map_err(|e| bad(e.to_string()))?;
            if n == 0 {
                return Ok(());
            }
            let content = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let content = content.strip_suffix(b"\r").unwrap_or(content);
            if content.len() > MAX_LINE {
                return Err(bad(format!("the line is longer than {MAX_LINE} bytes")));
            }
            let line = std::str::from_utf8(content).map_err(|_| bad("the line is not UTF-8".to_string()))?;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (Some((secs, rest)), Some((_, calls))) = (line.split_once(','), line.rsplit_once(',')) else {
                return Err(bad(format!("'{}' is not seconds,key,calls", line.escape_debug())));
            };
            let key = rest.rsplit_once(',').map_or("", |(key, _)| key);
            if key.is_empty() {
                return Err(bad(format!("'{}' has no key between its seconds and its calls", line.escape_debug())));
            }
            let secs: u64 = (secs.trim().parse())
                .map_err(|_| bad(format!("seconds '{}' is not a whole number", secs.escape_debug())))?;
            let calls: u64 = (calls.trim().parse())
                .map_err(|_| bad(format!("calls '{}' is not a whole number", calls.escape_debug())))?;
            let calls = u32::try_from(calls).map_err(|_| bad(HistoryError::TooMany(calls).to_string()))?;
            self.record(key, secs / 60, calls).map_err(|e| bad(e.to_string()))?;
        }
        Ok(())
    }

    /// The first and the last minute recorded.
    pub fn span(&self) -> Option<(u64, u64)> {
        let first = self.keys.values().filter_map(|s| s.first()).map(|&(m, _)| m).min()?;
        let last = self.keys.values().filter_map(|s| s.last()).map(|&(m, _)| m).max()?;
        Some((u64::from(first), u64::from(last)))
    }

    /// Every key, in byte order.
    pub fn key_names(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// The first key, in byte order.
    pub fn first_key(&self) -> Option<&str> {
        self.keys.keys().next().map(String::as_str)
    }

    /// `key`'s calls in `minute`.
    pub fn calls(&self, key: &str, minute: u64) -> u32 {
        self.minutes(key, minute, minute + 1).first().map_or(0, |&(_, n)| n)
    }

    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    /// `key`'s minutes in `from..to`.
    fn minutes<'a>(&'a self, key: &str, from: u64, to: u64) -> &'a [(u32, u32)] {
        let Some(series) = self.keys.get(key) else { return &[] };
        let start = series.partition_point(|&(m, _)| u64::from(m) < from);
        let end = series.partition_point(|&(m, _)| u64::from(m) < to);
        &series[start..end]
    }
}

/// How limits are proposed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// Which quantile of the keys' typical peaks sets the limit (0 to 1).
    pub quantile: f64,
    /// The factor above the observed figure (at least 1).
    pub headroom: f64,
    /// How far a limit may go down from the one in force in one proposal,
    /// as a fraction (0.2: by at most 20%).
    pub max_decrease: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { quantile: 0.99, headroom: 1.5, max_decrease: 0.2 }
    }
}

impl Settings {
    /// Refuses settings that cannot propose anything sensible, naming the
    /// setting and its value.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.quantile) {
            return Err(format!("quantile {} is not between 0 and 1", self.quantile));
        }
        if !(self.headroom.is_finite() && self.headroom >= 1.0 && self.headroom <= 1000.0) {
            return Err(format!("headroom {} is not between 1 and 1000", self.headroom));
        }
        if !(0.0..1.0).contains(&self.max_decrease) {
            return Err(format!("max decrease {} is not at least 0 and below 1", self.max_decrease));
        }
        Ok(())
    }
}

/// A proposed limit, in calls a minute, and the keys allowed more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// The limit for every key without an override.
    pub per_minute: u64,
    /// The quantile of typical peaks times the headroom, before guard rails.
    pub observed: u64,
    /// Keys allowed more than `per_minute`, by name.
    pub overrides: BTreeMap<String, u64>,
    /// Keys with calls in the period.
    pub keys: usize,
}

impl Proposal {
    /// The limit `key` would have.
    pub fn limit_for(&self, key: &str) -> u64 {
        self.overrides.get(key).copied().unwrap_or(self.per_minute)
    }
}

/// Each key's typical peak over the days of `from..to`: the median of its
/// busiest minute of each recorded day. A recorded day is one on which some
/// key made calls; on such a day a key without calls counts 0. A day on
/// which no key made any call is a gap in the recording, not a quiet day,
/// and is left out: a stray line far from the rest then adds one day, not
/// a thousand empty ones.
pub fn typical_peaks(history: &History, from: u64, to: u64) -> BTreeMap<&str, u64> {
    let day_of = |m: u32| (u64::from(m) - from) / DAY;
    // Each key's peak per day it made calls, in increasing days.
    let mut per_key: Vec<(&str, Vec<(u64, u64)>)> = Vec::new();
    let mut recorded = std::collections::BTreeSet::new();
    for key in history.keys.keys() {
        let minutes = history.minutes(key, from, to);
        if minutes.is_empty() {
            continue;
        }
        let mut peaks: Vec<(u64, u64)> = Vec::new();
        for &(m, calls) in minutes {
            let (day, calls) = (day_of(m), u64::from(calls));
            match peaks.last_mut() {
                Some((d, peak)) if *d == day => *peak = (*peak).max(calls),
                _ => peaks.push((day, calls)),
            }
        }
        recorded.extend(peaks.iter().map(|&(d, _)| d));
        per_key.push((key.as_str(), peaks));
    }
    let days = recorded.len().max(1);
    per_key
        .into_iter()
        .map(|(key, peaks)| {
            // The days without calls sort first, as zeros.
            let mut values: Vec<u64> = peaks.into_iter().map(|(_, p)| p).collect();
            values.sort_unstable();
            let zeros = days - values.len();
            let middle = (days - 1) / 2;
            (key, if middle < zeros { 0 } else { values[middle - zeros] })
        })
        .collect()
}

/// Proposes limits from the calls of `from..to` (minutes), within the guard
/// rails against `previous` (the limits in force), when there is one.
pub fn propose(history: &History, from: u64, to: u64, settings: &Settings, previous: Option<&Proposal>) -> Proposal {
    let peaks = typical_peaks(history, from, to);
    let mut sorted: Vec<u64> = peaks.values().copied().collect();
    sorted.sort_unstable();
    let quantile = match sorted.len() {
        0 => 0,
        n => sorted[((n - 1) as f64 * settings.quantile).round() as usize],
    };
    let with_headroom = |figure: u64| ((figure as f64 * settings.headroom).ceil() as u64).max(1);
    // A limit goes down by at most `max_decrease` from what is in force, and
    // never below what was observed times the headroom.
    let guarded = |observed: u64, in_force: Option<u64>| match in_force {
        Some(before) if observed < before => {
            let lowest = (before as f64 * (1.0 - settings.max_decrease)).ceil() as u64;
            observed.max(lowest)
        }
        _ => observed,
    };
    let observed = with_headroom(quantile);
    let per_minute = guarded(observed, previous.map(|p| p.per_minute));
    let mut overrides = BTreeMap::new();
    for (&key, &peak) in &peaks {
        let own = with_headroom(peak);
        let limit = guarded(own, previous.map(|p| p.limit_for(key)));
        if limit > per_minute {
            overrides.insert(key.to_string(), limit);
        }
    }
    // A key heavier before but without calls in this period keeps its
    // override until the guard rail has brought it down to the limit.
    if let Some(previous) = previous {
        for (key, &before) in &previous.overrides {
            if !peaks.contains_key(key.as_str()) {
                let limit = guarded(per_minute, Some(before));
                if limit > per_minute {
                    overrides.insert(key.clone(), limit);
                }
            }
        }
    }
    Proposal { per_minute, observed, overrides, keys: peaks.len() }
}

/// The limiter a proposal is replayed with (and would be enforced with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `limit` calls in each minute of the clock.
    FixedWindow,
    /// A bucket of `limit` calls refilled at `limit` a minute.
    TokenBucket,
}

impl Shape {
    /// The algorithm for `limit` calls a minute.
    pub fn algorithm(self, limit: u64) -> Algorithm {
        let limit = limit.max(1);
        match self {
            Shape::FixedWindow => Algorithm::FixedWindow(fixed_window::Config::new(limit, MINUTE_NANOS)),
            Shape::TokenBucket => {
                let rate = Rate::per_second(refill_per_second(limit)).unwrap_or_else(|_| Rate::whole_per_second(1));
                Algorithm::TokenBucket(token_bucket::Config::new(limit, rate))
            }
        }
    }
}

/// The refill a second of a token bucket of `limit` calls a minute, kept to
/// a thousandth of a call a second (the precision a rate has): what the
/// replay uses and what the printed rules say.
pub fn refill_per_second(limit: u64) -> f64 {
    (limit as f64 * 1000.0 / 60.0).round().max(1.0) / 1000.0
}

/// What one key's recorded calls would have met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyReplay {
    pub key: String,
    pub limit: u64,
    pub calls: u64,
    pub denied: u64,
}

/// Replays the calls of `from..to` against `proposal`, per key: the most
/// denied first.
pub fn replay(history: &History, from: u64, to: u64, proposal: &Proposal, shape: Shape) -> Vec<KeyReplay> {
    let mut out: Vec<KeyReplay> = history
        .keys
        .keys()
        .filter_map(|key| {
            let minutes = history.minutes(key, from, to);
            if minutes.is_empty() {
                return None;
            }
            let limit = proposal.limit_for(key);
            let alg = shape.algorithm(limit);
            Some(replay_key(key, limit, &alg, minutes))
        })
        .collect();
    out.sort_by(|a, b| b.denied.cmp(&a.denied).then_with(|| a.key.cmp(&b.key)));
    out
}

/// One key's calls through the real limiter: each minute's calls spread
/// evenly over it, one unit each.
fn replay_key(key: &str, limit: u64, alg: &Algorithm, minutes: &[(u32, u32)]) -> KeyReplay {
    let first = Timestamp::from_nanos(u64::from(minutes[0].0) * MINUTE_NANOS);
    let mut bucket = alg.new_bucket(first);
    let (mut calls, mut denied) = (0, 0);
    for &(minute, n) in minutes {
        let start = u64::from(minute) * MINUTE_NANOS;
        let step = MINUTE_NANOS / u64::from(n);
        for i in 0..u64::from(n) {
            let now = Timestamp::from_nanos(start + i * step + step / 2);
            if !bucket.try_acquire(alg, now, 1).admitted {
                denied += 1;
            }
        }
        calls += u64::from(n);
    }
    KeyReplay { key: key.to_string(), limit, calls, denied }
}
