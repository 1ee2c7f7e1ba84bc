//! Degradation levels 0 to 3, from the error rate over every breaker's calls in
//! the last 10 seconds, with hysteresis so the level does not flap; an
//! operator's override wins until cleared.
//!
//! The level rises as soon as the rate reaches 5%, 15% or 30% (with at least
//! [`MIN_CALLS`] calls in the window), and falls only once the rate is below
//! four fifths of the threshold that raised it (4%, 12%, 24%).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::breaker::{Call, Window};
use crate::rules::WindowKind;
use crate::time::Timestamp;

/// Error rates that raise the level to 1, 2 and 3.
pub const THRESHOLDS: [f64; 3] = [0.05, 0.15, 0.30];
/// A level is left only below this share of its threshold.
pub const HYSTERESIS: f64 = 0.8;
/// Fewer calls than this in the window never raise the level.
pub const MIN_CALLS: u64 = 20;
pub const MAX_LEVEL: u32 = 3;
const WINDOW_SECONDS: u32 = 10;

#[derive(Clone, Debug)]
pub struct Degradation {
    window: Window,
    automatic: u32,
    manual: Option<u32>,
}

/// The effective level moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelChange {
    pub from: u32,
    pub to: u32,
    pub manual: bool,
}

impl Default for Degradation {
    fn default() -> Self {
        Degradation { window: Window::new(WindowKind::Time(WINDOW_SECONDS)), automatic: 0, manual: None }
    }
}

impl Degradation {
    /// The level in force.
    pub fn level(&self) -> u32 {
        self.manual.unwrap_or(self.automatic)
    }

    pub fn automatic(&self) -> u32 {
        self.automatic
    }

    pub fn manual(&self) -> Option<u32> {
        self.manual
    }

    /// One call some breaker recorded.
    pub fn record(&mut self, now: Timestamp, call: Call) {
        self.window.record(now, call);
    }

    /// Recomputes the automatic level at `now`.
    pub fn evaluate(&mut self, now: Timestamp) -> Option<LevelChange> {
        let before = self.level();
        let counts = self.window.counts(now);
        let rate = if counts.calls >= MIN_CALLS { counts.failure_rate() } else { 0.0 };
        let target = THRESHOLDS.iter().filter(|&&t| rate >= t).count() as u32;
        let held = (1..=self.automatic).rev().find(|&l| rate >= THRESHOLDS[l as usize - 1] * HYSTERESIS).unwrap_or(0);
        self.automatic = target.max(held);
        self.change(before, false)
    }

    /// An operator's level (`Some`), or back to automatic (`None`).
    pub fn set_manual(&mut self, level: Option<u32>) -> Option<LevelChange> {
        let before = self.level();
        self.manual = level.map(|l| l.min(MAX_LEVEL));
        self.change(before, true)
    }

    fn change(&self, from: u32, manual: bool) -> Option<LevelChange> {
        let to = self.level();
        (from != to).then_some(LevelChange { from, to, manual })
    }
}

/// The level shared by every decision: the state behind a lock, and the level
/// in force as one atomic load for the hot path.
#[derive(Debug, Default)]
pub struct Levels {
    state: Mutex<Degradation>,
    current: AtomicU32,
}

/// The level in force and how it is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    pub level: u32,
    pub manual: bool,
    pub automatic: u32,
}

impl Levels {
    /// The level in force: one atomic load.
    pub fn current(&self) -> u32 {
        self.current.load(Ordering::Relaxed)
    }

    pub fn record(&self, now: Timestamp, call: Call) {
        self.lock().record(now, call);
    }

    pub fn evaluate(&self, now: Timestamp) -> Option<LevelChange> {
        self.update(|d| d.evaluate(now))
    }

    pub fn set_manual(&self, level: Option<u32>) -> Option<LevelChange> {
        self.update(|d| d.set_manual(level))
    }

    pub fn get(&self) -> Level {
        let d = self.lock();
        Level { level: d.level(), manual: d.manual().is_some(), automatic: d.automatic() }
    }

    /// A change and the atomic level move together, under the lock.
    fn update(&self, f: impl FnOnce(&mut Degradation) -> Option<LevelChange>) -> Option<LevelChange> {
        let mut d = self.lock();
        let change = f(&mut d);
        self.current.store(d.level(), Ordering::Relaxed);
        change
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Degradation> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: Call = Call { failed: false, slow: false };
    const FAIL: Call = Call { failed: true, slow: false };

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_secs(1_700_006_400 + secs)
    }

    fn calls(d: &mut Degradation, now: Timestamp, ok: usize, failed: usize) {
        (0..ok).for_each(|_| d.record(now, OK));
        (0..failed).for_each(|_| d.record(now, FAIL));
    }

    #[test]
    fn levels_follow_the_error_rate_thresholds() {
        let mut d = Degradation::default();
        calls(&mut d, at(0), 96, 4);
        assert_eq!(d.evaluate(at(0)), None, "4% is level 0");
        calls(&mut d, at(0), 0, 1); // 5 of 101 = 4.95%
        assert_eq!(d.evaluate(at(0)), None);
        calls(&mut d, at(0), 0, 1); // 6 of 102 = 5.9%
        assert_eq!(d.evaluate(at(0)), Some(LevelChange { from: 0, to: 1, manual: false }));
        calls(&mut d, at(0), 0, 20); // 26 of 122 = 21%
        assert_eq!(d.evaluate(at(0)).map(|c| c.to), Some(2));
        calls(&mut d, at(0), 0, 30); // 56 of 152 = 37%
        assert_eq!(d.level(), 2, "levels change only when evaluated");
        assert_eq!(d.evaluate(at(0)).map(|c| c.to), Some(3));
    }

    #[test]
    fn hysteresis_holds_a_level_until_the_rate_falls_well_below_it() {
        let mut d = Degradation::default();
        calls(&mut d, at(0), 84, 16); // 16%
        assert_eq!(d.evaluate(at(0)).map(|c| c.to), Some(2));
        calls(&mut d, at(0), 23, 0); // 16 of 123 = 13%: below 15%, above 12%
        assert_eq!(d.evaluate(at(0)), None);
        assert_eq!(d.level(), 2);
        calls(&mut d, at(0), 20, 0); // 16 of 143 = 11.2%
        assert_eq!(d.evaluate(at(0)), Some(LevelChange { from: 2, to: 1, manual: false }));
        // Ten seconds on, the window is empty: back to 0.
        assert_eq!(d.evaluate(at(10)).map(|c| c.to), Some(0));
    }

    #[test]
    fn a_few_failures_are_not_an_error_rate() {
        let mut d = Degradation::default();
        calls(&mut d, at(0), 0, MIN_CALLS as usize - 1);
        assert_eq!(d.evaluate(at(0)), None);
        calls(&mut d, at(0), 0, 1);
        assert_eq!(d.evaluate(at(0)).map(|c| c.to), Some(3));
    }

    #[test]
    fn a_manual_level_wins_until_cleared() {
        let mut d = Degradation::default();
        assert_eq!(d.set_manual(Some(2)), Some(LevelChange { from: 0, to: 2, manual: true }));
        calls(&mut d, at(0), 0, 100);
        assert_eq!(d.evaluate(at(0)), None, "the automatic level moves underneath");
        assert_eq!((d.level(), d.automatic()), (2, 3));
        assert_eq!(d.set_manual(None), Some(LevelChange { from: 2, to: 3, manual: true }));
        assert_eq!(d.set_manual(Some(9)).map(|c| c.to), None, "clamped to 3, which is the level already");
    }
}
