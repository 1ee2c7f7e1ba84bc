//! Warm-up: Sentinel's `WarmUpController` (the shape of Guava's
//! `SmoothWarmingUp`), number for number.
//!
//! A cold key admits `rate / cold_factor` per second and warms to `rate`
//! over `warm_up_period` of traffic; left idle, it cools again. The state is
//! a store of tokens `S` between a warning line `w` and a maximum `M`
//! (`w = trunc(period x rate) div (cold_factor - 1)`,
//! `M = w + trunc(2 x period x rate / (1 + cold_factor))`): a cold key holds
//! `M`. Once per calendar second the store is synced: it first cools, by
//! `rate` per elapsed second while under `w` (or over it while the last
//! second's traffic stayed under `rate / cold_factor`, in whole units), at
//! most to `M`; then the last second's admissions are taken from it. The
//! rate in force is `rate` under the line, else `1 / ((S - w) x slope +
//! 1 / rate)`, with `slope = (cold_factor - 1) / rate / (M - w)`: from
//! `rate / cold_factor` at `M` to `rate` at `w`.
//!
//! - `police` admits cost k when the admissions of the last 500 to 1000 ms
//!   (two 500 ms buckets, aligned to the epoch) plus k are within the rate
//!   in force, as Sentinel's default second-level window counts them;
//! - `shape` (Sentinel's `WarmUpRateLimiterController`) spaces callers
//!   `cost / rate in force` apart, rounded to the millisecond, each waiting
//!   its turn (`wait`), and refuses one whose turn is more than `max_wait`
//!   away.
//!
//! Times are whole milliseconds and the arithmetic is Sentinel's (doubles,
//! truncations, `Math.round`, `Math.nextUp`), so its unit tests' steps come
//! out here as they do there. One quirk is kept: a store exactly at the
//! warning line does not cool. Configurations whose warning line would be 0
//! (`period x rate` under 2), where Sentinel blocks everything, are refused.

use std::time::Duration;

use super::rate::Rate;
use super::{Decision, Limiter, Status};
use crate::time::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Police,
    /// Paced; a caller whose turn is more than `max_wait_ms` away is refused.
    Shape {
        max_wait_ms: u64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The warm rate, per second.
    pub rate: Rate,
    /// The warm-up period, in milliseconds.
    pub period_ms: u64,
    pub cold_factor: u32,
    pub mode: Mode,
    warning: i64,
    max: i64,
    slope: f64,
}

/// Why numbers cannot make a warm-up.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("cold_factor must be at least 2, got {0}")]
    ColdFactor(u32),
    #[error(
        "rate_per_second x warm_up_period must be at least 2 (got {0}): the warning line would be 0 and nothing would pass"
    )]
    TooShort(f64),
}

impl Config {
    pub fn new(rate: Rate, period: Duration, cold_factor: u32, mode: Mode) -> Result<Config, ConfigError> {
        if cold_factor < 2 {
            return Err(ConfigError::ColdFactor(cold_factor));
        }
        let (c, seconds, f) = (rate.as_f64(), period.as_millis() as f64 / 1000.0, i64::from(cold_factor));
        let product = seconds * c;
        let warning = (product as i64) / (f - 1);
        let max = warning + (2.0 * seconds * c / (1.0 + f as f64)) as i64;
        if warning == 0 || max <= warning {
            return Err(ConfigError::TooShort(product));
        }
        let slope = (f as f64 - 1.0) / c / (max - warning) as f64;
        Ok(Config { rate, period_ms: period.as_millis() as u64, cold_factor, mode, warning, max, slope })
    }

    fn c(&self) -> f64 {
        self.rate.as_f64()
    }

    /// The rate in force with `stored` tokens: `Math.nextUp` of Sentinel's.
    fn rate_in_force(&self, stored: i64) -> f64 {
        if stored < self.warning {
            return self.c();
        }
        (1.0 / ((stored - self.warning) as f64 * self.slope + 1.0 / self.c())).next_up()
    }

    /// The rate a cold key admits (`rate / cold_factor`, as Sentinel computes it at `M`).
    pub(crate) fn cold_rate(&self) -> f64 {
        self.rate_in_force(self.max)
    }
}

/// One key's warm-up. Boxed in the bucket: it counts its admissions per
/// 500 ms and per second besides its store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmUp {
    stored: i64,
    /// The second (ms, a multiple of 1000) the store was last synced; 0: never.
    synced: i64,
    /// Admissions in the current and the previous 500 ms bucket; `half` is
    /// the current one's index (ms / 500).
    half: i64,
    half_count: u64,
    prev_half_count: u64,
    /// Admissions in the current and the previous calendar second.
    second: i64,
    second_count: u64,
    prev_second_count: u64,
    /// Shape: when the last admitted caller's turn is (ms; -1 none), and what
    /// it was before the last commit (for its refund).
    latest: i64,
    latest_before: i64,
    /// With Redis: the units this replica may admit until its next sync
    /// (Redis runs the warm-up for the fleet); `None` when deciding alone.
    leased: Option<u64>,
}

fn ms(now: Timestamp) -> i64 {
    (now.as_nanos() / 1_000_000) as i64
}

/// Java's `Math.round` for a double: `floor(x + 0.5)`.
fn java_round(x: f64) -> i64 {
    (x + 0.5).floor() as i64
}

impl WarmUp {
    /// Admissions of the last 500 to 1000 ms (Sentinel's `passQps`, truncated).
    fn pass_qps(&self, t: i64) -> u64 {
        match t.div_euclid(500) - self.half {
            0 => self.half_count + self.prev_half_count,
            1 => self.half_count,
            _ => 0,
        }
    }

    /// Admissions of the previous calendar second (`previousPassQps`).
    fn previous_second(&self, t: i64) -> u64 {
        match t.div_euclid(1000) - self.second {
            0 => self.prev_second_count,
            1 => self.second_count,
            _ => 0,
        }
    }

    /// The store synced at `t` (Sentinel's `syncToken`): (tokens, synced second).
    fn synced_store(&self, cfg: &Config, t: i64) -> (i64, i64) {
        let second = t - t.rem_euclid(1000);
        if second <= self.synced {
            return (self.stored, self.synced);
        }
        let q = self.previous_second(t) as i64;
        let (s, w) = (self.stored, cfg.warning);
        let cooled = |s: i64| (s as f64 + (second - self.synced) as f64 * cfg.c() / 1000.0) as i64;
        let cooled = if s < w || (s > w && q < (cfg.c() as i64) / i64::from(cfg.cold_factor)) { cooled(s) } else { s };
        ((cooled.min(cfg.max) - q).max(0), second)
    }

    /// Shape: the caller's cost in ms at the rate in force, and its wait.
    fn turn(&self, cfg: &Config, stored: i64, t: i64, cost: u64) -> (i64, i64) {
        let cost_ms = java_round(cost as f64 / cfg.rate_in_force(stored) * 1000.0);
        (cost_ms, cost_ms + self.latest - t)
    }

    /// When the key would be cold again, idle from now: never when its
    /// store cannot cool (exactly at the warning line, or above it when
    /// `rate / cold_factor` is under one unit), else once a sync finds it
    /// cooled to the maximum and its counts have aged out.
    fn cold_after(&self, cfg: &Config, t: i64) -> Option<i64> {
        let (stored, synced) = self.synced_store(cfg, t);
        // The counts have aged out of both windows two seconds on.
        let counts_gone = (self.second + 2) * 1000;
        if stored >= cfg.max {
            return Some((counts_gone - t).max(0).max(self.latest - t));
        }
        let cools = stored < cfg.warning || (stored > cfg.warning && (cfg.c() as i64) / i64::from(cfg.cold_factor) > 0);
        if !cools {
            return None;
        }
        // The first whole second at which a sync finds it at the maximum.
        let needed = ((cfg.max - stored) as f64 * 1000.0 / cfg.c()).ceil() as i64;
        let at = synced + needed;
        let at = at + (1000 - at.rem_euclid(1000)) % 1000;
        Some((at.max(counts_gone).max(self.latest) - t).max(0))
    }

    #[cfg(test)]
    fn stored(&self) -> i64 {
        self.stored
    }

    /// What Sentinel's tests mock: the node's `passQps` and `previousPassQps` at `t`.
    #[cfg(test)]
    fn seed(&mut self, t: i64, pass_qps: u64, previous_qps: u64) {
        (self.half, self.half_count, self.prev_half_count) = (t.div_euclid(500), pass_qps, 0);
        (self.second, self.second_count, self.prev_second_count) = (t.div_euclid(1000), 0, previous_qps);
    }
}

impl Limiter for WarmUp {
    type Config = Config;

    fn new(_cfg: &Config, _now: Timestamp) -> Self {
        WarmUp {
            stored: 0,
            synced: 0,
            half: 0,
            half_count: 0,
            prev_half_count: 0,
            second: 0,
            second_count: 0,
            prev_second_count: 0,
            latest: -1,
            latest_before: -1,
            leased: None,
        }
    }

    fn check(&self, cfg: &Config, now: Timestamp, cost: u64) -> Decision {
        if let Some(lease) = self.leased {
            return leased(cfg, lease, cost);
        }
        let t = ms(now);
        let (stored, _) = self.synced_store(cfg, t);
        let rate = cfg.rate_in_force(stored);
        let limit = cfg.c() as u64;
        let reset = |until: i64| {
            let idle = self.cold_after(cfg, t).map_or(u64::MAX, |d| d.max(until) as u64);
            Duration::from_millis(idle)
        };
        match cfg.mode {
            Mode::Police => {
                let passed = self.pass_qps(t);
                let admitted = (passed + cost) as f64 <= rate;
                let remaining = (rate.floor() as u64).saturating_sub(passed + if admitted { cost } else { 0 });
                // The older 500 ms bucket leaves the count at the next boundary.
                let retry = if admitted { 0 } else { 500 - t.rem_euclid(500) };
                Decision {
                    admitted,
                    status: Status {
                        limit,
                        remaining,
                        reset_after: reset(0),
                        retry_after: Duration::from_millis(retry as u64),
                        wait: Duration::ZERO,
                        over_limit: false,
                    },
                }
            }
            Mode::Shape { max_wait_ms } => {
                let max_wait = max_wait_ms as i64;
                let (cost_ms, wait) = self.turn(cfg, stored, t, cost);
                let admitted = wait <= max_wait;
                let latest = match (admitted, wait <= 0) {
                    (true, true) => t,
                    (true, false) => self.latest + cost_ms,
                    (false, _) => self.latest,
                };
                // Callers of one unit that could still queue behind it.
                let per_unit = java_round(1000.0 / rate);
                let next_wait = latest + per_unit - t;
                let remaining =
                    if next_wait > max_wait { 0 } else { ((max_wait - next_wait) / per_unit.max(1) + 1) as u64 };
                Decision {
                    admitted,
                    status: Status {
                        limit,
                        remaining,
                        reset_after: reset(latest - t),
                        retry_after: Duration::from_millis(if admitted { 0 } else { (wait - max_wait) as u64 }),
                        wait: Duration::from_millis(if admitted { wait.max(0) as u64 } else { 0 }),
                        over_limit: false,
                    },
                }
            }
        }
    }

    /// Sentinel syncs the store on every decision, admitted or not: so here.
    fn try_acquire(&mut self, cfg: &Config, now: Timestamp, cost: u64) -> Decision {
        if self.leased.is_none() {
            (self.stored, self.synced) = self.synced_store(cfg, ms(now));
        }
        let decision = self.check(cfg, now, cost);
        if decision.admitted {
            self.commit(cfg, now, cost);
        }
        decision
    }

    fn commit(&mut self, cfg: &Config, now: Timestamp, cost: u64) {
        if let Some(lease) = &mut self.leased {
            *lease = lease.saturating_sub(cost);
            return;
        }
        let t = ms(now);
        let (stored, synced) = self.synced_store(cfg, t);
        if let Mode::Shape { .. } = cfg.mode {
            let (cost_ms, wait) = self.turn(cfg, stored, t, cost);
            self.latest_before = self.latest;
            self.latest = if wait <= 0 { t } else { self.latest + cost_ms };
        }
        (self.stored, self.synced) = (stored, synced);
        let half = t.div_euclid(500);
        match half - self.half {
            0 => {}
            1 => (self.prev_half_count, self.half_count) = (self.half_count, 0),
            _ => (self.prev_half_count, self.half_count) = (0, 0),
        }
        self.half = half;
        self.half_count += cost;
        let second = t.div_euclid(1000);
        match second - self.second {
            0 => {}
            1 => (self.prev_second_count, self.second_count) = (self.second_count, 0),
            _ => (self.prev_second_count, self.second_count) = (0, 0),
        }
        self.second = second;
        self.second_count += cost;
    }

    fn refund(&mut self, cfg: &Config, _now: Timestamp, cost: u64) {
        if let Some(lease) = &mut self.leased {
            *lease = lease.saturating_add(cost);
            return;
        }
        self.half_count = self.half_count.saturating_sub(cost);
        self.second_count = self.second_count.saturating_sub(cost);
        if let Mode::Shape { .. } = cfg.mode {
            self.latest = self.latest_before;
        }
    }

    fn give_back(&mut self, cfg: &Config, now: Timestamp, taken_at: Timestamp, cost: u64) {
        if self.leased.is_some() {
            return self.refund(cfg, now, cost);
        }
        // Only while the buckets it was counted in are the current ones.
        let (t, at) = (ms(now), ms(taken_at));
        if at.div_euclid(500) == t.div_euclid(500) && at.div_euclid(500) == self.half {
            self.half_count = self.half_count.saturating_sub(cost);
        }
        if at.div_euclid(1000) == t.div_euclid(1000) && at.div_euclid(1000) == self.second {
            self.second_count = self.second_count.saturating_sub(cost);
        }
    }
}

impl WarmUp {
    /// A replica's bucket with Redis: `lease` units to admit until its next sync.
    pub(crate) fn with_lease(cfg: &Config, now: Timestamp, lease: f64) -> WarmUp {
        WarmUp { leased: Some(lease.max(0.0).floor() as u64), ..WarmUp::new(cfg, now) }
    }
}

/// A leased bucket's answer: the lease, used up, is Redis's to renew.
fn leased(cfg: &Config, lease: u64, cost: u64) -> Decision {
    let admitted = cost <= lease;
    Decision {
        admitted,
        status: Status {
            limit: cfg.c() as u64,
            remaining: lease - if admitted { cost } else { 0 },
            reset_after: Duration::from_secs(1),
            retry_after: Duration::from_millis(if admitted { 0 } else { 100 }),
            wait: Duration::ZERO,
            over_limit: false,
        },
    }
}

#[cfg(test)]
mod tests;
