//! The traffic a server records for one limit (`history: true`): each key's
//! busiest minute of each of the last [`DAYS`] days, which is what a
//! proposal is made from (see [`super::propose`]).
//!
//! A key costs one entry (its text, the minute being counted, and one peak
//! a day: about 200 bytes for `user=<uuid>`, see the example
//! `traffic_memory`), whatever its traffic; at most
//! [`MAX_KEYS`] keys are kept per limit, and a key beyond that is not
//! recorded (counted in [`Traffic::refused`]). A key with no call for
//! [`DAYS`] days is forgotten by [`Traffic::sweep`].
//!
//! Days are UTC days (86,400 seconds from the Unix epoch), minutes are
//! Unix minutes; the caller gives the time, so that tests use a fake clock.
//!
//! With Redis, every replica sends what it counted and Redis sums the
//! replicas' calls of one minute (see [`Traffic::unsent`]): the record kept
//! there is the fleet's, and it outlives a restart. The record here is this
//! replica's alone.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use compact_str::CompactString;

use super::{DAY, History, HistoryError, MAX_CALLS, MAX_KEY};

/// Days of peaks kept for each key.
pub const DAYS: usize = 14;
/// Keys kept for one limit.
pub const MAX_KEYS: usize = 100_000;
/// The table is split in this many parts, each locked alone and read as
/// one page.
pub const SHARDS: usize = 64;

const MINUTES_A_DAY: u32 = 1440;
const SECS_A_DAY: u64 = 86_400;

type Map = hashbrown::HashMap<CompactString, Days, ahash::RandomState>;

/// One limit's recorded traffic.
pub struct Traffic {
    /// What tells this record apart from every other one (its rule, limit
    /// and key names): the name of its record in Redis.
    name: String,
    shards: Box<[Mutex<Map>]>,
    hasher: ahash::RandomState,
    keys: AtomicUsize,
    refused: AtomicU64,
    max_keys: usize,
}

/// One key's record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Days {
    /// The Unix minute being counted, and its units so far.
    minute: u32,
    units: u32,
    /// The last day with a peak (a Unix day); `peaks[day % DAYS]` is its.
    day: u32,
    peaks: [u32; DAYS],
    /// Units of `minute` already sent to Redis.
    sent: u32,
    /// An earlier minute's units not sent yet (0: none).
    unsent_minute: u32,
    unsent: u32,
}

/// Units of one key in one minute, not yet in the shared record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsent {
    pub key: CompactString,
    pub minute: u32,
    pub units: u32,
}

/// A key's peaks, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPeaks {
    pub key: CompactString,
    /// (Unix day, units in its busiest minute), oldest first, days with
    /// calls only.
    pub peaks: Vec<(u32, u32)>,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic::new(MAX_KEYS)
    }
}

/// Which of [`SHARDS`] parts a key's shared record is kept in: the same in
/// every replica and every run (FNV-1a, 64 bits).
pub fn shared_shard(key: &str) -> usize {
    let hash = crate::digest::fnv1a(crate::digest::FNV_START, key.bytes());
    (hash % SHARDS as u64) as usize
}

impl std::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traffic").field("keys", &self.keys()).finish()
    }
}

impl Traffic {
    /// A table of at most `max_keys` keys, with no name.
    pub fn new(max_keys: usize) -> Self {
        Traffic::named(String::new(), max_keys)
    }

    /// A table of at most `max_keys` keys, named `name` in Redis.
    pub fn named(name: String, max_keys: usize) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(Map::with_hasher(ahash::RandomState::new()))).collect();
        Traffic {
            name,
            shards,
            hasher: ahash::RandomState::new(),
            keys: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            max_keys,
        }
    }

    /// The name of this record (its rule, limit and key names).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counts `calls` calls not recorded (the shared record was full).
    pub fn refuse(&self, calls: u64) {
        self.refused.fetch_add(calls, Ordering::Relaxed);
    }

    /// Keys kept now.
    pub fn keys(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Calls of new keys not recorded because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn shard(&self, key: &str) -> &Mutex<Map> {
        &self.shards[(self.hasher.hash_one(key) % SHARDS as u64) as usize]
    }

    /// `units` asked for by `key` at `now_secs` (Unix seconds).
    pub fn count(&self, key: &CompactString, units: u64, now_secs: u64) {
        let minute = u32::try_from(now_secs / 60).unwrap_or(u32::MAX);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        let mut map = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        let days = match map.get_mut(key.as_str()) {
            Some(days) => days,
            None => {
                // Counted under the shard's lock, so that two new keys at
                // once cannot both take the last place.
                if self.keys.fetch_add(1, Ordering::Relaxed) >= self.max_keys {
                    self.keys.fetch_sub(1, Ordering::Relaxed);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                map.entry(key.clone()).or_insert(Days { minute, day: minute / MINUTES_A_DAY, ..Days::default() })
            }
        };
        days.count(minute, units);
    }

    /// The keys of page `page` (0 to [`SHARDS`] - 1), sorted, each with its
    /// peaks of the [`DAYS`] days up to `now_secs`.
    pub fn page(&self, page: usize, now_secs: u64) -> Vec<KeyPeaks> {
        let Some(shard) = self.shards.get(page) else { return Vec::new() };
        let today = u32::try_from(now_secs / SECS_A_DAY).unwrap_or(u32::MAX);
        let copied: Vec<(CompactString, Days)> = {
            let map = shard.lock().unwrap_or_else(|e| e.into_inner());
            map.iter().map(|(k, d)| (k.clone(), *d)).collect()
        };
        let mut out: Vec<KeyPeaks> = copied
            .into_iter()
            .map(|(key, d)| KeyPeaks { key, peaks: d.peaks_to(today) })
            .filter(|k| !k.peaks.is_empty())
            .collect();
        out.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// The units of part `page` (0 to [`SHARDS`] - 1) not sent to Redis
    /// yet: of each key, those of the minute being counted since the last
    /// send, and those of the minute before it if they were not sent.
    /// Nothing is marked: [`Traffic::sent`] does that once Redis has them,
    /// so that a send that fails is made again.
    pub fn unsent(&self, page: usize) -> Vec<Unsent> {
        let Some(shard) = self.shards.get(page) else { return Vec::new() };
        let map = shard.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (key, d) in map.iter() {
            if d.unsent > 0 {
                out.push(Unsent { key: key.clone(), minute: d.unsent_minute, units: d.unsent });
            }
            if d.units > d.sent {
                out.push(Unsent { key: key.clone(), minute: d.minute, units: d.units - d.sent });
            }
        }
        out
    }

    /// Marks `sent` (read from part `page` by [`Traffic::unsent`]) as in Redis.
    pub fn sent(&self, page: usize, sent: &[Unsent]) {
        let Some(shard) = self.shards.get(page) else { return };
        let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
        for u in sent {
            let Some(d) = map.get_mut(u.key.as_str()) else { continue };
            if d.minute == u.minute {
                d.sent = d.sent.saturating_add(u.units).min(d.units);
            } else if d.unsent_minute == u.minute {
                d.unsent = d.unsent.saturating_sub(u.units);
            }
        }
    }

    /// Forgets the keys with no call in the [`DAYS`] days up to `now_secs`.
    pub fn sweep(&self, now_secs: u64) {
        let today = u32::try_from(now_secs / SECS_A_DAY).unwrap_or(u32::MAX);
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            let before = map.len();
            map.retain(|_, d| today.saturating_sub(d.day) < DAYS as u32);
            self.keys.fetch_sub(before - map.len(), Ordering::Relaxed);
        }
    }
}

impl Days {
    fn count(&mut self, minute: u32, units: u32) {
        if minute < self.minute {
            // A reading of an older clock by another thread: counted in the
            // minute being counted, which is as close as it gets.
        } else if minute != self.minute {
            // What was not sent of the minute that ends waits for the next
            // send (an older minute still waiting is lost to the shared
            // record: Redis has been away for a minute).
            if self.units > self.sent {
                self.unsent_minute = self.minute;
                self.unsent = self.units - self.sent;
            }
            self.minute = minute;
            self.units = 0;
            self.sent = 0;
        }
        self.units = self.units.saturating_add(units);
        let day = self.minute / MINUTES_A_DAY;
        if day > self.day {
            // The days between had no call: their peaks are 0.
            for d in (self.day + 1)..=day.min(self.day + DAYS as u32) {
                self.peaks[d as usize % DAYS] = 0;
            }
            if day > self.day + DAYS as u32 {
                self.peaks = [0; DAYS];
            }
            self.day = day;
        }
        let peak = &mut self.peaks[day as usize % DAYS];
        *peak = (*peak).max(self.units);
    }

    /// (day, peak) of the days up to `today` with calls, oldest first.
    fn peaks_to(&self, today: u32) -> Vec<(u32, u32)> {
        let first = today.saturating_sub(DAYS as u32 - 1);
        (first..=today.min(self.day))
            .filter(|&d| self.day.saturating_sub(d) < DAYS as u32)
            .map(|d| (d, self.peaks[d as usize % DAYS]))
            .filter(|&(_, p)| p > 0)
            .collect()
    }
}

/// Recorded peaks as a [`History`]: each day's peak as that day's first
/// minute, which is all a proposal reads of a day. A replay of it decides
/// each key's busiest minute of each day: a key it does not deny is not
/// denied in any other minute of that day either (its other minutes hold
/// fewer calls), and one it denies is denied at least that much. A peak
/// above [`MAX_CALLS`] counts as that many; a key longer than [`MAX_KEY`]
/// bytes is left out. Returns the history and the keys left out.
pub fn history(pages: &[KeyPeaks], max_entries: usize) -> Result<(History, usize), HistoryError> {
    let mut history = History::new(max_entries);
    let mut left_out = 0;
    for k in pages {
        if k.key.len() > MAX_KEY {
            left_out += 1;
            continue;
        }
        for &(day, peak) in &k.peaks {
            history.record(&k.key, u64::from(day) * DAY, peak.min(MAX_CALLS))?;
        }
    }
    Ok((history, left_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: u64 = SECS_A_DAY;

    fn key(s: &str) -> CompactString {
        CompactString::from(s)
    }

    fn all(t: &Traffic, now: u64) -> Vec<KeyPeaks> {
        let mut out: Vec<KeyPeaks> = (0..SHARDS).flat_map(|p| t.page(p, now)).collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    #[test]
    fn each_day_keeps_its_busiest_minute() {
        let t = Traffic::new(10);
        let start = 20_000 * D;
        // Day 0: 3 calls in one minute, 5 in another (2 + 3 units).
        t.count(&key("a"), 1, start + 10);
        t.count(&key("a"), 2, start + 20);
        t.count(&key("a"), 2, start + 70);
        t.count(&key("a"), 3, start + 100);
        // Day 1 nothing; day 2: 7 in a minute.
        t.count(&key("a"), 7, start + 2 * D + 5);
        t.count(&key("b"), 4, start + 2 * D + 5);
        let got = all(&t, start + 2 * D + 100);
        assert_eq!(got[0].peaks, [(20_000, 5), (20_002, 7)]);
        assert_eq!(got[1].peaks, [(20_002, 4)]);
        assert_eq!(t.keys(), 2);
    }

    #[test]
    fn days_older_than_the_window_are_dropped_and_idle_keys_swept() {
        let t = Traffic::new(10);
        let start = 20_000 * D;
        for day in 0..20u64 {
            t.count(&key("a"), day + 1, start + day * D);
        }
        t.count(&key("old"), 1, start);
        let now = start + 19 * D;
        let got = all(&t, now);
        let days: Vec<u32> = got[0].peaks.iter().map(|p| p.0).collect();
        assert_eq!(days, (20_006..=20_019).collect::<Vec<u32>>(), "the last 14 days");
        assert_eq!(got[0].peaks[0].1, 7);
        assert_eq!(got.len(), 1, "a key with no call in 14 days shows nothing");
        t.sweep(now);
        assert_eq!(t.keys(), 1, "and is forgotten by a sweep");
        // A key silent for more than 14 days starts again from nothing.
        t.count(&key("a"), 2, now + 30 * D);
        assert_eq!(all(&t, now + 30 * D)[0].peaks, [(20_049, 2)]);
    }

    #[test]
    fn keys_past_the_bound_are_refused_and_counted() {
        let t = Traffic::new(3);
        for i in 0..10 {
            t.count(&key(&format!("k{i}")), 1, 0);
        }
        assert_eq!((t.keys(), t.refused()), (3, 7));
        // Kept keys still count.
        t.count(&key("k0"), 1, 1);
        let kept: usize = (0..SHARDS).map(|p| t.page(p, 1).len()).sum();
        assert_eq!(kept, 3);
    }

    fn unsent_of(t: &Traffic) -> Vec<(usize, Unsent)> {
        let mut out: Vec<(usize, Unsent)> =
            (0..SHARDS).flat_map(|p| t.unsent(p).into_iter().map(move |u| (p, u))).collect();
        out.sort_by_key(|(_, u)| (u.key.clone(), u.minute));
        out
    }

    #[test]
    fn units_are_sent_once_and_a_send_that_fails_is_made_again() {
        let t = Traffic::new(10);
        let m = 28_800_000u64; // a minute's first second / 60
        t.count(&key("a"), 3, m * 60);
        t.count(&key("b"), 1, m * 60 + 5);
        let first = unsent_of(&t);
        let got: Vec<(&str, u32, u32)> = first.iter().map(|(_, u)| (u.key.as_str(), u.minute, u.units)).collect();
        assert_eq!(got, [("a", m as u32, 3), ("b", m as u32, 1)]);
        // A send that failed marks nothing: the same units go again.
        assert_eq!(unsent_of(&t), first);
        // Sent; then 2 more of a in the same minute, and the minute ends
        // before they are sent, and 4 in the next.
        for (p, u) in &first {
            t.sent(*p, std::slice::from_ref(u));
        }
        assert!(unsent_of(&t).is_empty(), "nothing is sent twice");
        t.count(&key("a"), 2, m * 60 + 30);
        t.count(&key("a"), 4, m * 60 + 61);
        let got: Vec<(u32, u32)> = unsent_of(&t).iter().map(|(_, u)| (u.minute, u.units)).collect();
        assert_eq!(got, [(m as u32, 2), (m as u32 + 1, 4)], "the ended minute's rest, then the new one's");
        // Read, then 1 more before the mark: only what was read is marked.
        let read = unsent_of(&t);
        t.count(&key("a"), 1, m * 60 + 62);
        for (p, u) in &read {
            t.sent(*p, std::slice::from_ref(u));
        }
        let got: Vec<(u32, u32)> = unsent_of(&t).iter().map(|(_, u)| (u.minute, u.units)).collect();
        assert_eq!(got, [(m as u32 + 1, 1)]);
        // The local peaks are what they were without any send.
        assert_eq!(all(&t, m * 60 + 62)[0].peaks, [((m / 1440) as u32, 5)]);
    }

    #[test]
    fn a_keys_shared_part_is_the_same_everywhere() {
        // FNV-1a of "tenant=acme", fixed: another hash would put the keys
        // recorded before an upgrade in other parts.
        assert_eq!(shared_shard("tenant=acme"), 62);
        let parts: std::collections::HashSet<usize> = (0..1000).map(|i| shared_shard(&format!("user={i}"))).collect();
        assert_eq!(parts.len(), SHARDS, "keys spread over every part");
    }

    #[test]
    fn recorded_peaks_make_the_same_proposal_as_the_whole_trace() {
        use super::super::{Settings, propose};
        // 30 keys, 10 days: key i calls i+1 a minute, with a peak at one
        // minute of each day, and the last key 10 times more.
        let start = 20_000 * D;
        let t = Traffic::new(100);
        let mut text = String::new();
        for day in 0..10u64 {
            for m in (0..1440u64).step_by(7) {
                let at = start + day * D + m * 60;
                for i in 0..30u64 {
                    // Each day's peak differs, so that a day lost or
                    // shifted changes the medians.
                    let n = if m == 700 { (2 + day * day % 7) * (i + 1) } else { i + 1 };
                    let n = if i == 29 { n * 10 } else { n };
                    let k = format!("tenant=t{i}");
                    t.count(&key(&k), n, at);
                    text.push_str(&format!("{at},{k},{n}\n"));
                }
            }
        }
        let now = start + 10 * D - 1;
        let mut whole = History::new(1_000_000);
        whole.read(text.as_bytes()).unwrap();
        let (recorded, left_out) = history(&all(&t, now), 1_000_000).unwrap();
        assert_eq!(left_out, 0);
        let settings = Settings { quantile: 0.9, headroom: 1.5, max_decrease: 0.2 };
        let (from, to) = (start / 60, now / 60 + 1);
        let (a, b) = (propose(&recorded, from, to, &settings, None), propose(&whole, from, to, &settings, None));
        assert_eq!(a, b);
        assert!(!a.overrides.is_empty(), "{a:?}");
        // Without the last 3 days the proposal differs: the test sees days.
        let (short, _) = history(&all(&t, now), 1_000_000).unwrap();
        assert_ne!(propose(&short, from, to - 3 * DAY, &settings, None), a);
    }
}
