//! The measured no-load latency of an adaptive limit (see
//! [`ProbeConfig`]): when to measure, the phases of a measurement, and what
//! it found.

use super::Window;
use super::config::ProbeConfig;
use crate::time::Timestamp;

/// Windows of measuring at most, once the queue drained: a resource too
/// slow to give `samples` calls in that time is measured from what it gave.
const MAX_MEASURING: u32 = 3;

/// Windows of draining at most. A window drains until it closes with no
/// more calls in flight than the floor; a resource whose queue takes
/// longer than this is not measured this time (what it would give is its
/// queue's latency, not its no-load latency).
const MAX_DRAINING: u32 = 10;

/// How far a slot's measurement may move from the slot's start, as a share
/// of the interval.
const JITTER: f64 = 0.15;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Not measuring; the next measurement starts at the first window that
    /// closes at or after `next_at`.
    Idle,
    /// The limit is held at the floor; the calls admitted before finish.
    Draining { windows: u32 },
    /// The limit is held at the floor; the calls that come back are counted.
    Measuring { samples: u64, rtt_sum_us: u64, windows: u32 },
}

/// A limit's measurements of its no-load latency.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    cfg: ProbeConfig,
    phase: Phase,
    next_at: Timestamp,
    min_rtt_us: Option<f64>,
    /// The window that closed as the measurement began: its mean latency
    /// (µs) and its most calls in flight, when it had samples.
    before: Option<(f64, u32)>,
    /// What the limit should come down to, set when a measurement found
    /// that the window before it queued (see [`Probe::take_resume`]).
    resume: Option<f64>,
    /// When the last measurement ended.
    finished_at: Option<Timestamp>,
}

impl Probe {
    /// A limit made at `now` measures at its first window's close.
    pub fn new(cfg: ProbeConfig, now: Timestamp) -> Probe {
        Probe { cfg, phase: Phase::Idle, next_at: now, min_rtt_us: None, before: None, resume: None, finished_at: None }
    }

    pub fn config(&self) -> &ProbeConfig {
        &self.cfg
    }

    /// New settings: a measurement under way goes on; the next one is
    /// planned by the new interval.
    pub fn reconfigure(&mut self, cfg: ProbeConfig, now: Timestamp) {
        if cfg.interval != self.cfg.interval && self.phase == Phase::Idle && self.min_rtt_us.is_some() {
            self.next_at = next_slot(now, cfg.interval);
        }
        self.cfg = cfg;
    }

    /// Whether the limit is held at the floor now.
    pub fn pinned(&self) -> bool {
        self.phase != Phase::Idle
    }

    /// The no-load latency last measured (µs).
    pub fn min_rtt_us(&self) -> Option<f64> {
        self.min_rtt_us
    }

    /// Measures at the next window's close rather than at the planned slot,
    /// when the algorithm has said nothing for long (see
    /// `Controller::apply`), at most once a quarter of an interval after
    /// the last measurement, so that the time at the floor stays bounded.
    /// Whether it moved the measurement.
    pub fn hurry(&mut self, now: Timestamp) -> bool {
        let due = self.finished_at.is_none_or(|at| now >= at.saturating_add(self.cfg.interval / 4));
        if self.phase == Phase::Idle && due && self.next_at > now {
            self.next_at = now;
            return true;
        }
        false
    }

    /// Once a measurement found that the window before it queued: the
    /// limit that, at the throughput of that window, keeps the latency near
    /// twice the no-load latency. The limit resumes from there rather than
    /// from where it was, which after the measurement at start is
    /// `initial`, perhaps far above what the resource serves.
    pub fn take_resume(&mut self) -> Option<f64> {
        self.resume.take()
    }

    /// When the next measurement starts (the first window close from then).
    pub fn next_at(&self) -> Timestamp {
        self.next_at
    }

    /// A window closed at `now`: moves the measurement on. Whether the
    /// window belonged to it (the algorithm must not learn from a window
    /// taken at the floor).
    /// `floor` is the limit held while measuring.
    pub fn on_window(&mut self, now: Timestamp, w: &Window, floor: u32) -> bool {
        match self.phase {
            Phase::Idle => {
                if now >= self.next_at {
                    self.phase = Phase::Draining { windows: 0 };
                    // A window with no call admitted says nothing of the
                    // throughput.
                    self.before = w.mean_rtt_us().filter(|_| w.max_in_flight > 0).map(|rtt| (rtt, w.max_in_flight));
                }
                false
            }
            Phase::Draining { windows } => {
                // Drained once a whole window had no more in flight than
                // the floor: the calls of the next one were admitted at it.
                if w.max_in_flight <= floor {
                    self.phase = Phase::Measuring { samples: 0, rtt_sum_us: 0, windows: 0 };
                } else if windows + 1 >= MAX_DRAINING {
                    self.finish(now, None);
                } else {
                    self.phase = Phase::Draining { windows: windows + 1 };
                }
                true
            }
            Phase::Measuring { samples, rtt_sum_us, windows } => {
                // A window with more in flight than the floor (the
                // partitions' guarantees may let calls past it) is not a
                // measurement at the floor: it counts as time, not samples.
                let (samples, rtt_sum_us) = match w.max_in_flight <= floor {
                    true => (samples + w.samples, rtt_sum_us.saturating_add(w.rtt_sum_us)),
                    false => (samples, rtt_sum_us),
                };
                let windows = windows + 1;
                if samples >= u64::from(self.cfg.samples) || windows >= MAX_MEASURING {
                    let mean = (samples > 0).then(|| rtt_sum_us as f64 / samples as f64);
                    self.finish(now, mean);
                } else {
                    self.phase = Phase::Measuring { samples, rtt_sum_us, windows };
                }
                true
            }
        }
    }

    /// Ends a measurement at `now` with the mean latency it found (`None`:
    /// none; the last one stays), and plans the next: the slot after half an
    /// interval from now, so that a measurement at start is not followed at
    /// once by the first slot's.
    fn finish(&mut self, now: Timestamp, mean_us: Option<f64>) {
        if let Some(m) = mean_us {
            let m = m.max(1.0);
            self.min_rtt_us = Some(m);
            // The window before the measurement took more than twice the
            // no-load latency: it queued. At the throughput it had (calls in
            // flight over latency), twice the no-load latency is reached
            // with `in_flight * 2m / rtt` calls in flight (Little's law).
            if let Some((rtt, in_flight)) = self.before
                && rtt > 2.0 * m
            {
                self.resume = Some(f64::from(in_flight) * 2.0 * m / rtt);
            }
        }
        self.before = None;
        self.finished_at = Some(now);
        self.phase = Phase::Idle;
        self.next_at = next_slot(now.saturating_add(self.cfg.interval / 2), self.cfg.interval);
    }
}

/// The start of the measurement after `now`: the next slot of `interval`
/// on the clock, moved by up to [`JITTER`] of it by a hash of the slot, so
/// that every replica computes the same time.
fn next_slot(now: Timestamp, interval: std::time::Duration) -> Timestamp {
    let period = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX).max(1);
    let slot = now.as_nanos() / period + 1;
    let offset = (JITTER * period as f64 * unit(slot)) as u64;
    Timestamp::from_nanos(slot.saturating_mul(period).saturating_add(offset))
}

/// A number in [0, 1) from `x` (splitmix64's finaliser).
fn unit(x: u64) -> f64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_replica_plans_the_same_slot_within_the_jitter() {
        let interval = Duration::from_secs(60);
        let a = next_slot(Timestamp::from_secs(1_700_000_010), interval);
        let b = next_slot(Timestamp::from_secs(1_700_000_030), interval);
        assert_eq!(a, b, "two replicas at different times in one slot plan the same measurement");
        let start = Timestamp::from_secs(1_700_000_040);
        assert!(a.as_nanos() >= start.as_nanos(), "the next slot starts at 1_700_000_040");
        assert!(a.as_nanos() < start.as_nanos() + 9_000_000_000, "within 15% of the interval");
        let later = next_slot(a, interval);
        assert!(later.as_nanos() - a.as_nanos() > 50_000_000_000, "the one after is about an interval later");
    }
}
