//! Overrides set at run time, shared by every replica: one Redis hash of
//! id -> JSON spec, and a version that every change increments. A replica
//! changes both in one script, announces the change on pub/sub, and every
//! replica (the announcement, or at the latest its next sync) sees a version
//! it has not installed and reads the hash again, a page at a time so that a
//! large table never holds the connection decisions share.
//!
//! Expiry is decided by each replica's clock, and a removal only removes the
//! spec it saw end: one set again meanwhile (same id, new expiry) stays.

use super::Settings;
use redis::Script;
use std::sync::LazyLock;

use floodgate_engine::overrides::{Change, Spec, Table};

/// id -> the spec as JSON.
pub const OVERRIDES: &str = "{fg}:overrides";
/// Increments with every change.
pub const OVERRIDES_VERSION: &str = "{fg}:overrides:v";
/// Hash entries read per call when loading.
const PAGE: usize = 1000;

/// ARGV: n, then n (id, json) pairs to set, then ids to delete. Returns the new version.
static STORE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local n = tonumber(ARGV[1])
for i = 0, n - 1 do redis.call('HSET', KEYS[1], ARGV[2 + 2 * i], ARGV[3 + 2 * i]) end
for i = 2 + 2 * n, #ARGV do redis.call('HDEL', KEYS[1], ARGV[i]) end
return redis.call('INCR', KEYS[2])
",
    )
});

/// ARGV: (id, json) pairs; each is removed only if still stored as that JSON.
/// Returns the version after (0 when nothing was removed) and the ids removed.
static EXPIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local removed = {}
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    removed[#removed + 1] = ARGV[i]
  end
end
local version = 0
if #removed > 0 then version = redis.call('INCR', KEYS[2]) end
return {version, removed}
",
    )
});

/// Installs `table` off the async workers: with 100,000 overrides a change
/// re-merges the rules for about half a second, which on a worker would hold
/// up the decisions queued behind it.
async fn install(engine: &std::sync::Arc<floodgate_engine::Engine>, table: Table, change: Change) -> u64 {
    let engine = engine.clone();
    match tokio::task::spawn_blocking(move || engine.control().install_overrides(std::sync::Arc::new(table), change))
        .await
    {
        Ok(version) => version,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

impl Settings<'_> {
    /// Stores `set` and removes `delete` in one step, then installs the
    /// result here; the rules version in force after, or `None` when Redis
    /// did not answer (then nothing changed, there or here).
    pub async fn change_overrides(&self, set: &[Spec], delete: &[String], change: Change) -> Option<u64> {
        let mut invocation = STORE.prepare_invoke();
        invocation.key(OVERRIDES).key(OVERRIDES_VERSION).arg(set.len());
        for s in set {
            invocation.arg(&s.id).arg(s.to_json());
        }
        for id in delete {
            invocation.arg(id);
        }
        let mut seen = self.overrides_seen.lock().await;
        let version: u64 = self
            .call_within("overrides", self.conn.longest(), |mut h| async move { invocation.invoke_async(&mut h).await })
            .await?;
        let rules_version = self.install_after(&mut seen, version, set, delete, change).await;
        drop(seen);
        self.announce().await;
        Some(rules_version)
    }

    /// Removes `ended` specs unless they were set again meanwhile, here too;
    /// the ids removed, or `None` when Redis did not answer.
    pub async fn expire_overrides(&self, ended: &[Spec]) -> Option<Vec<String>> {
        let mut invocation = EXPIRE.prepare_invoke();
        invocation.key(OVERRIDES).key(OVERRIDES_VERSION);
        for s in ended {
            invocation.arg(&s.id).arg(s.to_json());
        }
        let mut seen = self.overrides_seen.lock().await;
        let (version, removed): (u64, Vec<String>) = self
            .call_within("overrides", self.conn.longest(), |mut h| async move { invocation.invoke_async(&mut h).await })
            .await?;
        if removed.is_empty() {
            return Some(removed);
        }
        let change = Change { expired: removed.clone(), ..Change::default() };
        self.install_after(&mut seen, version, &[], &removed, change).await;
        drop(seen);
        self.announce().await;
        Some(removed)
    }

    /// Installs what Redis holds at `version`, just made by this replica
    /// setting `set` and removing `delete`: from the table installed here
    /// when that was the version before, else read whole. The rules version.
    async fn install_after(
        &self,
        seen: &mut u64,
        version: u64,
        set: &[Spec],
        delete: &[String],
        change: Change,
    ) -> u64 {
        let next = if *seen != u64::MAX && *seen + 1 == version {
            let (next, _) = self.engine.rules_full().runtime.with(set).without(delete);
            next
        } else {
            match self.read_overrides().await {
                Some(table) => table,
                // Stored, not read back: the next poll installs it.
                None => return self.engine.rules_full().version,
            }
        };
        *seen = version;
        install(&self.engine, next, change).await
    }

    /// Tells the other replicas to read the overrides again.
    async fn announce(&self) {
        self.publish(&super::message::Message::OverridesChanged).await;
    }

    /// Installs the overrides stored in Redis when their version is not the
    /// one installed here.
    pub(super) async fn poll_overrides(&self) {
        let mut seen = self.overrides_seen.lock().await;
        let version: Option<Option<u64>> =
            self.call("overrides", |mut h| async move {
                redis::cmd("GET").arg(OVERRIDES_VERSION).query_async(&mut h).await
            })
            .await;
        let Some(version) = version else { return };
        let version = version.unwrap_or(0);
        if version == *seen {
            return;
        }
        let Some(table) = self.read_overrides().await else { return };
        if *seen != u64::MAX && version < *seen {
            // Redis went back: it came back empty or from an older dump, and
            // lost changes this replica installed. What is in force here is
            // the newest known: it is stored again, not replaced by the
            // older table (every replica that held it does the same, and
            // they agree on the next version).
            let ours: Vec<Spec> = self.engine.rules_full().runtime.iter().cloned().collect();
            let stale: Vec<String> =
                table.iter().filter(|s| !ours.iter().any(|o| o.id == s.id)).map(|s| s.id.clone()).collect();
            let had = *seen;
            drop(seen);
            if self.change_overrides(&ours, &stale, Change::default()).await.is_some() {
                tracing::warn!(
                    overrides = ours.len(),
                    redis_version = version,
                    installed_version = had,
                    "Redis lost overrides this replica had installed: stored them again"
                );
            }
            return;
        }
        let current = self.engine.rules_full().runtime.clone();
        let (set, gone) = table.diff(&current);
        if !set.is_empty() || !gone.is_empty() || *seen == u64::MAX {
            let count = table.len();
            // Gone because it ended (another replica removed it first), or deleted.
            let now = self.engine.clock().now().as_nanos();
            let (expired, deleted) = gone.into_iter().partition(|id| current.get(id).is_some_and(|s| s.ended(now)));
            let change = Change { set, deleted, expired };
            let rules_version = install(&self.engine, table, change).await;
            tracing::info!(overrides = count, version, rules_version, "overrides stored in Redis installed");
        }
        // Changes made while the pages were read show as a newer version next time.
        *seen = version;
    }

    /// Every stored spec, a page at a time; a spec that does not parse is
    /// logged and left out.
    async fn read_overrides(&self) -> Option<Table> {
        let mut cursor = 0u64;
        let mut specs = Vec::new();
        loop {
            let page: (u64, Vec<(String, String)>) = self
                .call("overrides", |mut h| async move {
                    redis::cmd("HSCAN").arg(OVERRIDES).arg(cursor).arg("COUNT").arg(PAGE).query_async(&mut h).await
                })
                .await?;
            for (id, json) in page.1 {
                match Spec::from_json(&json) {
                    Ok(s) if s.id == id => specs.push(s),
                    Ok(_) => tracing::error!(
                        id = id.escape_debug().to_string(),
                        "an override stored in Redis under another id; skipped"
                    ),
                    Err(e) => {
                        tracing::error!(id = id.escape_debug().to_string(), error = %e, "an override stored in Redis does not parse; skipped")
                    }
                }
            }
            cursor = page.0;
            if cursor == 0 {
                return Some(Table::from_specs(specs));
            }
        }
    }
}
