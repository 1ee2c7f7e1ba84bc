//! Degradation across replicas, so that every replica answers with the same
//! level whichever one an instance reports to:
//! - a load report one replica takes reaches every other replica: the
//!   reports taken are kept (the latest per instance, bounded) and sent on
//!   the events channel every 250 ms in one message;
//! - an operator's level per system is kept in Redis (`{fg}:levels`, system
//!   -> "<level or - for automatic> <when it was set>"; the global scope is
//!   the empty name; `#v` a random version per change), newest wins
//!   (`levels.lua`), and applied by every replica when announced, every 10
//!   syncs, when one starts and when its rules change. A level set on a
//!   replica cut off from Redis is written once it answers, unless a newer
//!   one was set meanwhile; a Redis that came back empty gets back every
//!   level the replicas know.

use super::Settings;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use super::Replication;
use super::message::{LoadReport, Message};
use floodgate_core::time::Timestamp;
use floodgate_engine::LevelTarget;
use floodgate_engine::degradation::Load;
use floodgate_engine::guards::PermitId;

/// An operator's level per system: system -> level.
pub const LEVELS: &str = "{fg}:levels";
/// The most load reports held between two sends; more wait for the next.
const MAX_PENDING: usize = 20_000;
const SEND_EVERY: Duration = Duration::from_millis(250);

/// The field of `{fg}:levels` counting changes.
const VERSION: &str = "#v";

/// Load reports taken here, not yet sent to the other replicas; and what
/// this replica knows of the operators' levels in Redis.
#[derive(Debug, Default)]
pub(super) struct Levels {
    pending: Mutex<HashMap<(String, String), (Load, Timestamp)>>,
    /// The version of `{fg}:levels` applied here (0: none yet).
    seen: AtomicU64,
    /// The version of the rules it was applied with: a system the rules add
    /// later takes its stored level then.
    rules_seen: AtomicU64,
    /// Levels set here that Redis does not have yet (it was away), with
    /// when they were set.
    unsaved: Mutex<Vec<Entry>>,
    /// Every level this replica knows of, by system, with when it was set:
    /// what it writes back to a Redis that came back empty.
    known: Mutex<HashMap<String, (Option<u32>, u64)>>,
}

/// A system's operator's level (`None`: automatic) and when it was set (ns).
type Entry = (String, Option<u32>, u64);

/// `levels.lua`'s reply: how many it wrote.
fn wire_count(v: redis::Value) -> Result<u64, super::wire::ReplyError> {
    match v {
        redis::Value::Int(n) => Ok(n.max(0) as u64),
        other => Err(super::wire::ReplyError {
            script: super::scripts::ScriptName::Levels,
            what: format!("expected a count, got {other:?}"),
        }),
    }
}

/// One field of `{fg}:levels`: "<level|-> <ns>" (or a bare level, as
/// written before levels carried their time: the oldest).
fn parse_level(name: &str, value: &str) -> Option<Entry> {
    let (level, at) = value.split_once(' ').unwrap_or((value, "0"));
    let at = at.parse().ok()?;
    let level = match level {
        "-" => None,
        l => Some(l.parse::<u32>().ok().filter(|&l| l <= 3)?),
    };
    Some((name.to_string(), level, at))
}

/// Sends the load reports taken every 250 ms until the replication is dropped.
pub(super) async fn send_loop(weak: Weak<Replication>) {
    loop {
        tokio::time::sleep(SEND_EVERY).await;
        let Some(r) = weak.upgrade() else { return };
        r.settings().send_loads().await;
    }
}

impl Settings<'_> {
    /// A load report this replica took, to pass on to the others.
    pub fn share_load(&self, system: &str, instance: &str, load: Load, taken_at: Timestamp) {
        let mut pending = self.levels.pending.lock().unwrap_or_else(|e| e.into_inner());
        let key = (system.to_string(), instance.to_string());
        if pending.len() < MAX_PENDING || pending.contains_key(&key) {
            pending.insert(key, (load, taken_at));
        }
    }

    /// Sends the load reports taken since the last send, in one message.
    async fn send_loads(&self) {
        let taken = std::mem::take(&mut *self.levels.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if taken.is_empty() {
            return;
        }
        let reports = taken
            .into_iter()
            .map(|((system, instance), (load, taken_at))| LoadReport { system, instance, load, taken_at })
            .collect();
        self.publish(&Message::Loads { from: PermitId::tag(), reports }).await;
    }

    /// Another replica's load reports: taken as if reported here (those this
    /// replica sent itself are skipped; refusals are not answered to anyone).
    pub(super) fn on_loads(&self, from: u32, reports: Vec<LoadReport>) {
        if from == PermitId::tag() {
            return;
        }
        for r in reports {
            let _ = self.engine.control().report_load(&r.system, &r.instance, r.load, Some(r.taken_at));
        }
    }

    /// Stores an operator's level for `target` (`None`: back to automatic),
    /// set now, and tells the other replicas. While Redis is away the level
    /// holds here and is written once it answers.
    pub async fn set_level(&self, target: LevelTarget<'_>, level: Option<u32>) {
        let names: Vec<String> = match target {
            LevelTarget::One(name) => vec![name.to_string()],
            LevelTarget::Every => self.engine.views().levels().into_iter().map(|l| l.system.to_string()).collect(),
        };
        let at = self.engine.clock().now().as_nanos();
        let writes: Vec<Entry> = names.into_iter().map(|n| (n, level, at)).collect();
        // Kept first: should this call be cut short, the next load writes them.
        self.unsaved().extend(writes.iter().cloned());
        self.know(&writes);
        if self.write_levels(&writes).await.is_some() {
            self.unsaved().retain(|w| !writes.contains(w));
        }
    }

    fn unsaved(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.levels.unsaved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers levels, keeping the newer of two for a system.
    fn know(&self, entries: &[Entry]) {
        let mut known = self.levels.known.lock().unwrap_or_else(|e| e.into_inner());
        for (name, level, at) in entries {
            let newer = known.get(name).is_none_or(|&(_, held)| *at >= held);
            if newer {
                known.insert(name.clone(), (*level, *at));
            }
        }
    }

    /// Writes `writes`, each only where the hash holds nothing newer for
    /// its system, under a new version (a random number: a Redis that came
    /// back empty cannot hand out a version a replica has seen already)
    /// when one was written, and announces it. `None` when Redis did not answer.
    async fn write_levels(&self, writes: &[Entry]) -> Option<u64> {
        let version = rand::random::<u64>().max(1);
        let mut invocation = self.scripts.get(super::scripts::ScriptName::Levels).key(LEVELS);
        invocation.arg(version);
        for (name, level, at) in writes {
            invocation.arg(name).arg(level.map_or("-".to_string(), |l| l.to_string())).arg(*at);
        }
        let written: u64 = self.run(super::scripts::ScriptName::Levels, invocation, wire_count).await?;
        if written > 0 {
            self.publish(&Message::LevelsChanged).await;
        }
        Some(written)
    }

    /// Applies the levels operators stored: every scope named in Redis takes
    /// its level, every other goes back to automatic. Levels set here while
    /// Redis was away are written first (newest wins); when Redis lost them
    /// all (it came back empty: no version), this replica writes back every
    /// level it knows, with when each was set.
    pub(super) async fn load_levels(&self) {
        let stored: Option<HashMap<String, String>> = self
            .call("levels", |mut h| async move { redis::cmd("HGETALL").arg(LEVELS).query_async(&mut h).await })
            .await;
        let Some(mut stored) = stored else { return };
        let version: u64 = stored.remove(VERSION).and_then(|v| v.parse().ok()).unwrap_or(0);
        let seen = self.levels.seen.load(Ordering::Relaxed);
        // Looked at before this replica writes anything: its own write would
        // hide that Redis lost what the others stored.
        let lost = version == 0 && seen > 0;
        let unsaved = std::mem::take(&mut *self.unsaved());
        let writes: Vec<Entry> = if lost {
            // Every level known here, those set while Redis was away included.
            let known = self.levels.known.lock().unwrap_or_else(|e| e.into_inner());
            known.iter().map(|(n, &(l, at))| (n.clone(), l, at)).collect()
        } else {
            unsaved.clone()
        };
        if !writes.is_empty() {
            match self.write_levels(&writes).await {
                None => {
                    let mut now = self.unsaved();
                    let later = std::mem::take(&mut *now);
                    *now = unsaved.into_iter().chain(later).collect();
                    return;
                }
                // Announced: every replica, this one too, reads it again.
                Some(written) if written > 0 => return,
                // Older than what Redis holds: what it holds applies.
                Some(_) => {}
            }
        }
        let rules = self.engine.rules().version;
        if version == seen && rules == self.levels.rules_seen.load(Ordering::Relaxed) {
            return;
        }
        let entries: Vec<Entry> = stored.iter().filter_map(|(k, v)| parse_level(k, v)).collect();
        self.know(&entries);
        let levels: HashMap<String, u32> =
            entries.into_iter().filter_map(|(name, level, _)| Some((name, level?))).collect();
        self.engine.control().apply_manual_levels(&levels);
        self.levels.seen.store(version, Ordering::Relaxed);
        self.levels.rules_seen.store(rules, Ordering::Relaxed);
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_level_reads_back_as_written() {
        assert_eq!(parse_level("p", "2 1700000000000000000"), Some(("p".into(), Some(2), 1_700_000_000_000_000_000)));
        assert_eq!(parse_level("p", "- 5"), Some(("p".into(), None, 5)));
        assert_eq!(parse_level("p", "3"), Some(("p".into(), Some(3), 0)), "a bare level is the oldest");
        assert_eq!(parse_level("p", "7 5"), None);
        assert_eq!(parse_level("p", "x"), None);
    }
}
