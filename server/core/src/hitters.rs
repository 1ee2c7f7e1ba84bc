//! The hottest keys of each limit: which descriptor values it admits and
//! denies most, over the last few minutes, in bounded memory.
//!
//! Per limit and per outcome, a Space-Saving sketch (Metwally et al.) of
//! [`TOP`] entries for each of the last [`EPOCHS`] minutes: a key not kept
//! replaces the least counted one and inherits its count as its possible
//! error, so a key seen more than 1/TOP of a minute's calls is never missed.
//! Memory is fixed (allocated on first use), whatever the number of keys.
//!
//! The decision path pays little: every denial is counted, one admission in
//! [`ADMITTED_SAMPLE`] is (and counts for that many); a sketch another thread
//! holds at that instant is skipped rather than waited for.

use std::cell::Cell;
use std::sync::Mutex;

use compact_str::CompactString;

/// Entries per sketch.
pub const TOP: usize = 16;
/// Length of one epoch, and how many are kept.
pub const EPOCH_SECS: u64 = 60;
pub const EPOCHS: usize = 5;
/// One admission in this many is counted.
pub const ADMITTED_SAMPLE: u32 = 16;

/// One limit's sketches.
#[derive(Default)]
pub struct Hitters {
    admitted: Mutex<Option<Box<Windows>>>,
    denied: Mutex<Option<Box<Windows>>>,
}

/// A key and its estimated count over the window; the true count is between
/// `count - error` and `count`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hitter {
    pub scope: CompactString,
    pub count: u64,
    pub error: u64,
}

#[derive(Default)]
struct Windows {
    epochs: [Epoch; EPOCHS],
}

#[derive(Default)]
struct Epoch {
    /// The minute (seconds since the epoch / EPOCH_SECS) it counts.
    minute: u64,
    entries: Vec<Hitter>,
}

thread_local! {
    /// A xorshift generator: which admissions are counted must not follow
    /// the order of limits in a request (a counter would count only the
    /// first limit of two-limit rules).
    static SAMPLE: Cell<u32> = const { Cell::new(0x9E37_79B9) };
}

impl std::fmt::Debug for Hitters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hitters")
    }
}

impl Hitters {
    /// One decision of this limit for the bucket `scope`, at `now_secs()`
    /// (asked only when the decision is counted).
    #[inline]
    pub fn observe(&self, scope: &CompactString, denied: bool, now_secs: impl FnOnce() -> u64) {
        let weight = if denied {
            1
        } else {
            let n = SAMPLE.with(|c| {
                let mut x = c.get();
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                c.set(x);
                x
            });
            if !n.is_multiple_of(ADMITTED_SAMPLE) {
                return;
            }
            u64::from(ADMITTED_SAMPLE)
        };
        let sketch = if denied { &self.denied } else { &self.admitted };
        let Ok(mut guard) = sketch.try_lock() else { return };
        let windows = guard.get_or_insert_with(Box::default);
        let minute = now_secs() / EPOCH_SECS;
        let epoch = &mut windows.epochs[(minute % EPOCHS as u64) as usize];
        if epoch.minute > minute {
            // Another thread's older clock reading: the minute is gone.
            return;
        }
        if epoch.minute != minute {
            epoch.minute = minute;
            epoch.entries.clear();
        }
        epoch.observe(scope, weight);
    }

    /// The `n` keys counted most over the last [`EPOCHS`] minutes, most first.
    pub fn top(&self, denied: bool, now_secs: u64, n: usize) -> Vec<Hitter> {
        let sketch = if denied { &self.denied } else { &self.admitted };
        let guard = sketch.lock().unwrap_or_else(|e| e.into_inner());
        let Some(windows) = guard.as_ref() else { return Vec::new() };
        let now = now_secs / EPOCH_SECS;
        let mut merged: Vec<Hitter> = Vec::new();
        for epoch in windows.epochs.iter().filter(|e| e.minute + EPOCHS as u64 > now && e.minute <= now) {
            // A key missing from one epoch's sketch may have been counted up
            // to that epoch's smallest count there.
            let floor =
                if epoch.entries.len() < TOP { 0 } else { epoch.entries.iter().map(|e| e.count).min().unwrap_or(0) };
            for m in merged.iter_mut() {
                if !epoch.entries.iter().any(|e| e.scope == m.scope) {
                    m.count += floor;
                    m.error += floor;
                }
            }
            for e in &epoch.entries {
                match merged.iter_mut().find(|m| m.scope == e.scope) {
                    Some(m) => {
                        m.count += e.count;
                        m.error += e.error;
                    }
                    None => merged.push(e.clone()),
                }
            }
        }
        merged.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.scope.cmp(&b.scope)));
        merged.truncate(n);
        merged
    }
}

impl Epoch {
    fn observe(&mut self, scope: &CompactString, weight: u64) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.scope == *scope) {
            e.count += weight;
            return;
        }
        if self.entries.len() < TOP {
            self.entries.push(Hitter { scope: scope.clone(), count: weight, error: 0 });
            return;
        }
        let min = self.entries.iter_mut().min_by_key(|e| e.count).expect("TOP entries");
        *min = Hitter { scope: scope.clone(), count: min.count + weight, error: min.count };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> CompactString {
        CompactString::new(s)
    }

    #[test]
    fn the_heaviest_keys_stay_among_many_light_ones_with_bounded_error() {
        let h = Hitters::default();
        // 10,000 distinct light keys, and two heavy ones, in one minute:
        // 13,000 calls, so any key above 13,000 / TOP = 812 is kept.
        for i in 0..10_000u64 {
            h.observe(&key(&format!("u{i}")), true, || 60);
            if i % 5 == 0 {
                h.observe(&key("heavy"), true, || 60);
            }
            if i % 10 == 0 {
                h.observe(&key("medium"), true, || 60);
            }
        }
        let top = h.top(true, 60, 2);
        assert_eq!(top.iter().map(|t| t.scope.as_str()).collect::<Vec<_>>(), ["heavy", "medium"]);
        for t in &top {
            let truth = if t.scope == "heavy" { 2000 } else { 1000 };
            assert!(t.count >= truth && t.count - t.error <= truth, "{t:?} vs {truth}");
        }
        assert!(h.top(false, 60, 5).is_empty(), "nothing admitted");
    }

    #[test]
    fn admissions_are_sampled_and_weighted_and_old_minutes_fall_out() {
        let h = Hitters::default();
        let calls = u64::from(ADMITTED_SAMPLE) * 1000;
        for _ in 0..calls {
            h.observe(&key("a"), false, || 0);
        }
        let counted = h.top(false, 0, 1)[0].count;
        assert_eq!(counted % u64::from(ADMITTED_SAMPLE), 0);
        assert!(counted.abs_diff(calls) < calls / 10, "{counted} estimates {calls}");
        // Minute 0 still counts four minutes later, not five.
        assert_eq!(h.top(false, 4 * EPOCH_SECS, 1).len(), 1);
        assert!(h.top(false, 5 * EPOCH_SECS, 1).is_empty());
        // A new minute in the same slot starts afresh.
        h.observe(&key("b"), true, || 5 * EPOCH_SECS);
        h.observe(&key("c"), true, || 0);
        assert_eq!(h.top(true, 5 * EPOCH_SECS, 5).iter().map(|t| t.scope.as_str()).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn the_second_limit_of_every_call_is_sampled_as_often_as_the_first() {
        let (a, b) = (Hitters::default(), Hitters::default());
        for _ in 0..80_000 {
            a.observe(&key("k"), false, || 0);
            b.observe(&key("k"), false, || 0);
        }
        let (ca, cb) = (a.top(false, 0, 1)[0].count, b.top(false, 0, 1)[0].count);
        assert!(ca.abs_diff(80_000) < 8_000 && cb.abs_diff(80_000) < 8_000, "{ca} {cb}");
    }

    #[test]
    fn minutes_are_merged() {
        let h = Hitters::default();
        for m in 0..3 {
            for _ in 0..5 {
                h.observe(&key("k"), true, || m * EPOCH_SECS);
            }
        }
        assert_eq!(h.top(true, 2 * EPOCH_SECS, 1), [Hitter { scope: key("k"), count: 15, error: 0 }]);
    }
}
