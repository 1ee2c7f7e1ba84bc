//! The traffic records of limits with `history: true`, kept for the fleet
//! in Redis, so that a proposal reads every replica's calls and a restart
//! loses nothing.
//!
//! Every [`SEND_EVERY`], each replica sends the units it counted since its
//! last send, per key and minute (`traffic.lua`): Redis adds them up in the
//! minute's hash, and a key's peak of the day is raised when the sum passes
//! it. A record's keys are `fg:t:{<hash of its rule, limit and key
//! names>}:...` (one hash slot per record, for Redis Cluster):
//!
//! - `:m:<Unix minute>`: key -> units of every replica that minute, kept
//!   [`MINUTE_TTL`];
//! - `:d:<Unix day>:<part>`: key -> units in its busiest minute of that UTC
//!   day, for the keys of one of the [`SHARDS`] parts, kept [`DAYS`] + 1
//!   days, at most [`MAX_KEYS`] / [`SHARDS`] keys a part.
//!
//! What a send could not deliver (Redis away) goes with the next one, as
//! long as its minute is the one a key counts or the one before.

use std::collections::{BTreeMap, HashMap};
use std::sync::Weak;
use std::time::Duration;

use floodgate_core::recommend::traffic::{DAYS, KeyPeaks, MAX_KEYS, SHARDS, Traffic, Unsent, shared_shard};

use super::Replication;
use super::scripts::ScriptName;
use super::wire::ReplyError;

/// How often a replica sends what it counted.
pub const SEND_EVERY: Duration = Duration::from_secs(5);
/// How long a minute's sums are kept: long enough for a replica whose send
/// was late to add to them.
const MINUTE_TTL: Duration = Duration::from_secs(300);
/// The keys of one script call, at most.
const BATCH: usize = 1_000;
const SECS_A_DAY: u64 = 86_400;

/// The prefix of the keys of the record named `name` (its rule, limit and
/// key names): FNV-1a of the name, so that any name makes one hash tag.
fn prefix(name: &str) -> String {
    use floodgate_core::digest::{FNV_START, fnv1a};
    let hash = fnv1a(FNV_START, name.bytes());
    format!("fg:t:{{{hash:016x}}}")
}

fn day_key(prefix: &str, day: u64, part: usize) -> String {
    format!("{prefix}:d:{day}:{part}")
}

/// `traffic.lua`'s reply: the units not recorded.
fn wire_refused(v: redis::Value) -> Result<u64, ReplyError> {
    match v {
        redis::Value::Int(n) => Ok(n.max(0) as u64),
        other => Err(ReplyError { script: ScriptName::Traffic, what: format!("expected a count, got {other:?}") }),
    }
}

/// Sends what this replica counted every [`SEND_EVERY`], until the
/// replication is dropped.
pub(super) async fn send_loop(weak: Weak<Replication>) {
    loop {
        tokio::time::sleep(SEND_EVERY).await;
        let Some(r) = weak.upgrade() else { return };
        r.records().send().await;
    }
}

impl super::Records<'_> {
    /// Sends the units of every record in force not sent yet; stops at the
    /// first failure (the rest go next time).
    pub async fn send(&self) {
        if !self.sync().up() {
            return;
        }
        let records = self.engine.rules_full().records();
        for record in records {
            for page in 0..SHARDS {
                let mut unsent = record.unsent(page);
                if unsent.is_empty() {
                    continue;
                }
                unsent.sort_unstable_by_key(|u| u.minute);
                for batch in unsent.chunk_by(|a, b| a.minute == b.minute) {
                    for chunk in batch.chunks(BATCH) {
                        if !self.send_chunk(&record, chunk).await {
                            return;
                        }
                        record.sent(page, chunk);
                    }
                }
            }
        }
    }

    /// Adds `chunk` (units of one minute) to `record`'s keys in Redis.
    async fn send_chunk(&self, record: &Traffic, chunk: &[Unsent]) -> bool {
        let Some(first) = chunk.first() else { return true };
        let prefix = prefix(record.name());
        let day = u64::from(first.minute) / 1_440;
        let mut parts: Vec<usize> = Vec::new();
        let mut invocation = self.scripts.get(ScriptName::Traffic).prepare_invoke();
        invocation.key(format!("{prefix}:m:{}", first.minute));
        invocation.arg(MINUTE_TTL.as_millis() as u64);
        invocation.arg((DAYS as u64 + 1) * SECS_A_DAY * 1_000);
        invocation.arg(MAX_KEYS.div_ceil(SHARDS));
        for u in chunk {
            let part = shared_shard(&u.key);
            let index = match parts.iter().position(|&p| p == part) {
                Some(i) => i,
                None => {
                    parts.push(part);
                    invocation.key(day_key(&prefix, day, part));
                    parts.len() - 1
                }
            };
            // KEYS[1] is the minute's: the parts' are from KEYS[2] on.
            invocation.arg(u.key.as_str()).arg(u.units).arg(index + 2);
        }
        match self.run(ScriptName::Traffic, invocation, wire_refused).await {
            Some(refused) => {
                record.refuse(refused);
                true
            }
            None => false,
        }
    }

    /// Part `page` of the fleet's record `record`: its keys, sorted, each
    /// with its peaks of the [`DAYS`] days up to `now_secs` (days with
    /// calls only). `None` when Redis did not answer, or is known to be away.
    pub async fn page(&self, record: &Traffic, page: usize, now_secs: u64) -> Option<Vec<KeyPeaks>> {
        // Known to be away: the replica's own record answers at once, rather
        // than each of 64 pages waiting for Redis. A replica that has not
        // reached Redis since it started (its first sync is still to come)
        // asks: Redis may well answer, and its own record is empty.
        let connected = self.connected.load(std::sync::atomic::Ordering::Acquire);
        if !self.sync().up() && connected {
            return None;
        }
        let prefix = prefix(record.name());
        let today = now_secs / SECS_A_DAY;
        let days: Vec<u64> = (today.saturating_sub(DAYS as u64 - 1)..=today).collect();
        let mut pipe = redis::pipe();
        for &day in &days {
            pipe.cmd("HGETALL").arg(day_key(&prefix, day, page));
        }
        let got: Vec<HashMap<String, u64>> =
            self.call("traffic", |mut h| async move { pipe.query_async(&mut h).await }).await?;
        let mut keys: BTreeMap<String, Vec<(u32, u32)>> = BTreeMap::new();
        for (&day, peaks) in days.iter().zip(got) {
            for (key, peak) in peaks {
                if peak > 0 {
                    let day = u32::try_from(day).unwrap_or(u32::MAX);
                    keys.entry(key).or_default().push((day, u32::try_from(peak).unwrap_or(u32::MAX)));
                }
            }
        }
        Some(keys.into_iter().map(|(key, peaks)| KeyPeaks { key: key.into(), peaks }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_keys_share_one_hash_tag_whatever_its_name() {
        let p = prefix("api\0per-tenant\0tenant");
        assert!(p.starts_with("fg:t:{") && p.ends_with('}') && p.len() == "fg:t:{}".len() + 16, "{p}");
        assert_ne!(p, prefix("api\0per-tenant\0user"), "another key is another record");
        // A name holding braces does not move the tag.
        let odd = prefix("a}b{c");
        assert_eq!(odd.matches('{').count(), 1);
        assert_eq!(day_key(&p, 20_000, 7), format!("{p}:d:20000:7"));
    }
}
