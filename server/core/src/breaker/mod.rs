//! The circuit breaker: resilience4j's state machine as a pure state type.
//!
//! CLOSED records every counted outcome and opens when, with at least
//! `minimum_calls` in the window, the failure rate or the slow-call rate reaches
//! its threshold. OPEN rejects until `wait_in_open` (growing per consecutive
//! reopening) has passed; the first acquire after that moves it to HALF_OPEN,
//! which hands out exactly `half_open_calls` probes and decides when the last
//! one reports. Every transition bumps the generation: outcomes of permits from
//! an older generation are counted but never decide. Time is always passed in.

use std::time::Duration;

use crate::time::{Timestamp, duration_nanos};
pub use config::{Backoff, BreakerConfig, OFF, WindowKind};

mod config;
mod window;

pub use window::{Call, Counts, Window};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
    ForcedOpen,
    Disabled,
    MetricsOnly,
}

/// How a call went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    /// Neither: not recorded; a probe permit is returned.
    Ignored,
}

/// The breaker's answer to "may I?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Permitted { generation: u64, probe: bool },
    Rejected { state: State, retry_after: Duration },
}

/// A change of state, for Watch, the log and metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub at: Timestamp,
    pub reason: String,
    /// When OPEN, the time the next probe may be admitted.
    pub next_probe_at: Option<Timestamp>,
}

/// What GetBreaker shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Info {
    pub state: State,
    pub window: Counts,
    pub not_permitted: u64,
    pub stale_outcomes: u64,
    pub opened_at: Option<Timestamp>,
    pub next_probe_at: Option<Timestamp>,
    pub probes_in_flight: u32,
    pub probes_remaining: u32,
    pub generation: u64,
    pub consecutive_openings: u32,
}

#[derive(Clone, Debug)]
pub struct Breaker {
    state: State,
    window: Window,
    generation: u64,
    opened_at: Option<Timestamp>,
    open_until: Timestamp,
    consecutive_openings: u32,
    half_open_since: Timestamp,
    /// Probe permits handed out in this HALF_OPEN round, and their reports.
    probes_issued: u32,
    probes: Counts,
    not_permitted: u64,
    stale_outcomes: u64,
}

impl Breaker {
    pub fn new(cfg: &BreakerConfig) -> Self {
        Breaker {
            state: State::Closed,
            window: Window::new(cfg.window),
            generation: 1,
            opened_at: None,
            open_until: Timestamp::ZERO,
            consecutive_openings: 0,
            half_open_since: Timestamp::ZERO,
            probes_issued: 0,
            probes: Counts::default(),
            not_permitted: 0,
            stale_outcomes: 0,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Keeps the state when the rules change, with a new window if its kind changed.
    pub fn reconfigure(&mut self, cfg: &BreakerConfig) {
        if !self.window.is(cfg.window) {
            self.window = Window::new(cfg.window);
        }
    }

    /// May a call go ahead? Moves OPEN to HALF_OPEN once the wait is over, and
    /// reopens a HALF_OPEN whose probes did not report in time.
    pub fn acquire(&mut self, cfg: &BreakerConfig, now: Timestamp) -> (Admission, Option<Transition>) {
        let mut transition = self.tick(cfg, now);
        if self.state == State::Open && now >= self.open_until {
            transition = Some(self.half_open(now));
        }
        let admission = match self.state {
            State::Closed | State::Disabled | State::MetricsOnly => {
                Admission::Permitted { generation: self.generation, probe: false }
            }
            State::HalfOpen if self.probes_issued < cfg.half_open_calls => {
                self.probes_issued += 1;
                Admission::Permitted { generation: self.generation, probe: true }
            }
            state => {
                self.not_permitted += 1;
                Admission::Rejected { state, retry_after: self.retry_after(cfg, now) }
            }
        };
        (admission, transition)
    }

    /// What `acquire` would answer, changing nothing.
    pub fn would_permit(&self, cfg: &BreakerConfig, now: Timestamp) -> bool {
        match self.state {
            State::Closed | State::Disabled | State::MetricsOnly => true,
            State::Open => now >= self.open_until && cfg.half_open_calls > 0,
            State::HalfOpen => self.probes_issued < cfg.half_open_calls && !self.probes_expired(cfg, now),
            State::ForcedOpen => false,
        }
    }

    /// Gives back a probe permit whose call did not go ahead after all.
    pub fn release(&mut self, generation: u64, probe: bool) {
        if probe && generation == self.generation && self.state == State::HalfOpen {
            self.probes_issued = self.probes_issued.saturating_sub(1);
        }
    }

    /// Records how a permitted call went. `latency` decides slowness. Returns
    /// the call as recorded (`None` when it was not: stale, ignored, disabled).
    pub fn report(
        &mut self,
        cfg: &BreakerConfig,
        now: Timestamp,
        generation: u64,
        outcome: Outcome,
        latency: Duration,
    ) -> (Option<Call>, Option<Transition>) {
        if generation != self.generation {
            self.stale_outcomes += 1;
            return (None, None);
        }
        let call = match outcome {
            Outcome::Ignored => {
                self.release(generation, true);
                return (None, None);
            }
            Outcome::Success => Call { failed: false, slow: latency > cfg.slow_call_duration },
            Outcome::Failure => Call { failed: true, slow: latency > cfg.slow_call_duration },
        };
        let recorded = matches!(self.state, State::Closed | State::MetricsOnly | State::HalfOpen).then_some(call);
        (recorded, self.record(cfg, now, call))
    }

    fn record(&mut self, cfg: &BreakerConfig, now: Timestamp, call: Call) -> Option<Transition> {
        match self.state {
            State::Closed | State::MetricsOnly => {
                self.window.record(now, call);
                let counts = self.window.counts(now);
                let trips = counts.calls >= u64::from(cfg.minimum_calls) && exceeds(cfg, &counts);
                (self.state == State::Closed && trips).then(|| self.open_for(cfg, now, reason("window", &counts)))
            }
            State::HalfOpen => {
                self.probes.add(call);
                if self.probes.calls < u64::from(cfg.half_open_calls) {
                    return None;
                }
                let probes = self.probes;
                Some(if probes_exceed(cfg, &probes) {
                    self.open_for(cfg, now, reason("probes", &probes))
                } else {
                    self.close_for(cfg, now, format!("{} probes succeeded", probes.calls - probes.failures))
                })
            }
            State::Open | State::ForcedOpen | State::Disabled => None,
        }
    }

    /// Whether the next call needs a probe permit: OPEN with its wait over, or HALF_OPEN.
    pub fn needs_probe(&self, now: Timestamp) -> bool {
        (self.state == State::Open && now >= self.open_until) || self.state == State::HalfOpen
    }

    /// Takes the state another replica decided (shared through Redis): `to`,
    /// with OPEN's end at `open_until` and the reopenings so far.
    pub fn adopt(
        &mut self,
        cfg: &BreakerConfig,
        now: Timestamp,
        to: State,
        open_until: Timestamp,
        openings: u32,
    ) -> Option<Transition> {
        self.consecutive_openings = openings;
        let same = self.state == to && (to != State::Open || self.open_until == open_until);
        if same {
            return None;
        }
        match to {
            State::Open => {
                self.open_until = open_until;
                self.opened_at = Some(now);
            }
            State::HalfOpen => self.half_open_since = now,
            _ => {
                self.opened_at = None;
                self.window = Window::new(cfg.window);
            }
        }
        Some(self.transition(now, to, "decided by another replica (shared through Redis)".into()))
    }

    /// Time-driven transitions: a HALF_OPEN whose probes have not all reported
    /// within `max_wait_in_half_open` reopens.
    pub fn tick(&mut self, cfg: &BreakerConfig, now: Timestamp) -> Option<Transition> {
        if self.state == State::HalfOpen && self.probes_expired(cfg, now) {
            let reason = format!("probes did not report within {:?}", cfg.max_wait_in_half_open);
            return Some(self.open_for(cfg, now, reason));
        }
        None
    }

    /// An operator's choice: CLOSED resets; FORCED_OPEN, DISABLED and
    /// METRICS_ONLY pin a mode. Each starts a fresh window and generation.
    pub fn force(&mut self, cfg: &BreakerConfig, now: Timestamp, to: State) -> Option<Transition> {
        match to {
            State::Closed => Some(self.close_for(cfg, now, "reset by an operator".into())),
            State::Open | State::HalfOpen => None,
            mode => {
                let t = self.transition(now, mode, "set by an operator".into());
                self.window = Window::new(cfg.window);
                Some(t)
            }
        }
    }

    pub fn info(&mut self, cfg: &BreakerConfig, now: Timestamp) -> Info {
        let half_open = self.state == State::HalfOpen;
        Info {
            state: self.state,
            window: self.window.counts(now),
            not_permitted: self.not_permitted,
            stale_outcomes: self.stale_outcomes,
            opened_at: self.opened_at,
            next_probe_at: self.next_probe_at(),
            probes_in_flight: if half_open { self.probes_issued.saturating_sub(self.probes.calls as u32) } else { 0 },
            probes_remaining: if half_open { cfg.half_open_calls.saturating_sub(self.probes_issued) } else { 0 },
            generation: self.generation,
            consecutive_openings: self.consecutive_openings,
        }
    }

    fn probes_expired(&self, cfg: &BreakerConfig, now: Timestamp) -> bool {
        now >= self.half_open_since.saturating_add(cfg.max_wait_in_half_open)
    }

    /// How long a rejected caller should wait before asking again.
    pub fn retry_after(&self, cfg: &BreakerConfig, now: Timestamp) -> Duration {
        let until = match self.state {
            State::Open => self.open_until,
            State::HalfOpen => self.half_open_since.saturating_add(cfg.max_wait_in_half_open),
            _ => now.saturating_add(cfg.wait_in_open.initial),
        };
        Duration::from_nanos(until.saturating_since(now))
    }

    fn next_probe_at(&self) -> Option<Timestamp> {
        (self.state == State::Open).then_some(self.open_until)
    }

    fn open_for(&mut self, cfg: &BreakerConfig, now: Timestamp, reason: String) -> Transition {
        self.consecutive_openings += 1;
        let wait = cfg.wait_in_open.wait(self.consecutive_openings);
        self.open_until = now.add_nanos(duration_nanos(wait));
        self.opened_at = Some(now);
        self.transition(now, State::Open, reason)
    }

    fn half_open(&mut self, now: Timestamp) -> Transition {
        self.half_open_since = now;
        self.transition(now, State::HalfOpen, "wait in OPEN is over".into())
    }

    fn close_for(&mut self, cfg: &BreakerConfig, now: Timestamp, reason: String) -> Transition {
        self.consecutive_openings = 0;
        self.opened_at = None;
        self.window = Window::new(cfg.window);
        self.transition(now, State::Closed, reason)
    }

    /// Every transition starts a new generation and a new round of probes.
    fn transition(&mut self, now: Timestamp, to: State, reason: String) -> Transition {
        self.probes_issued = 0;
        self.probes = Counts::default();
        let from = std::mem::replace(&mut self.state, to);
        self.generation += 1;
        Transition { from, to, at: now, reason, next_probe_at: self.next_probe_at() }
    }
}

/// Whether the failure or slow-call rate, or the failures, reach their
/// threshold (equality trips).
fn exceeds(cfg: &BreakerConfig, counts: &Counts) -> bool {
    counts.calls > 0
        && (counts.failure_rate() >= cfg.failure_rate_threshold
            || counts.slow_call_rate() >= cfg.slow_call_rate_threshold
            || cfg.failure_count_threshold.is_some_and(|n| counts.failures >= u64::from(n)))
}

/// Whether HALF_OPEN's probes reopen: as [`exceeds`], the failure count
/// capped at the probes handed out (one failed probe of one reopens).
fn probes_exceed(cfg: &BreakerConfig, probes: &Counts) -> bool {
    let capped = cfg.failure_count_threshold.map(|n| n.min(cfg.half_open_calls));
    exceeds(&BreakerConfig { failure_count_threshold: capped, ..cfg.clone() }, probes)
}

fn reason(of: &str, c: &Counts) -> String {
    format!(
        "{of}: failure rate {:.1}% ({} failures), slow-call rate {:.1}% over {} calls",
        c.failure_rate() * 100.0,
        c.failures,
        c.slow_call_rate() * 100.0,
        c.calls
    )
}

impl State {
    /// Whether every call goes through in this state, without a probe.
    pub fn passes_every_call(self) -> bool {
        matches!(self, State::Closed | State::Disabled | State::MetricsOnly)
    }

    /// Every state, in the order of their numbers.
    pub const ALL: [State; 6] =
        [State::Closed, State::Open, State::HalfOpen, State::ForcedOpen, State::Disabled, State::MetricsOnly];

    /// The state's one number, everywhere it is encoded: the proto enum, the
    /// Redis scripts and the `floodgate_breaker_state` gauge (1 CLOSED ... 6 METRICS_ONLY).
    pub fn number(self) -> u8 {
        match self {
            State::Closed => 1,
            State::Open => 2,
            State::HalfOpen => 3,
            State::ForcedOpen => 4,
            State::Disabled => 5,
            State::MetricsOnly => 6,
        }
    }

    /// The state with this number; `None` for any other number (0 is "unspecified").
    pub fn from_number(n: i64) -> Option<State> {
        State::ALL.into_iter().find(|s| i64::from(s.number()) == n)
    }

    /// Whether an operator may set it (`SetBreakerState`): not OPEN or
    /// HALF_OPEN, which only the breaker itself enters.
    pub fn settable(self) -> bool {
        !matches!(self, State::Open | State::HalfOpen)
    }

    /// The state named `name` (as [`State::name`] writes it).
    pub fn from_name(name: &str) -> Option<State> {
        State::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            State::Closed => "CLOSED",
            State::Open => "OPEN",
            State::HalfOpen => "HALF_OPEN",
            State::ForcedOpen => "FORCED_OPEN",
            State::Disabled => "DISABLED",
            State::MetricsOnly => "METRICS_ONLY",
        }
    }
}

#[cfg(test)]
mod tests;
