//! Overrides set at run time: checked, kept (Redis when the server
//! replicates, else `--overrides-file` when set, else memory only), then
//! installed beside the rules; one change at a time.

use super::{Control, Views};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::RequestError;
use crate::overrides::{self, Change, Spec, Table};

/// Where overrides set at run time are kept, and how many.
#[derive(Clone, Debug)]
pub struct OverrideOptions {
    /// A file to keep them in on a server without Redis.
    pub file: Option<PathBuf>,
    pub max: usize,
}

impl Default for OverrideOptions {
    fn default() -> Self {
        OverrideOptions { file: None, max: overrides::DEFAULT_MAX }
    }
}

/// An override to set: the spec as sent (an empty id is made up), and how
/// long it lasts.
#[derive(Clone, Debug)]
pub struct NewOverride {
    pub spec: Spec,
    pub ttl: Option<Duration>,
}

/// What `SetOverrides` did.
#[derive(Clone, Debug)]
pub struct OverridesSet {
    pub specs: Vec<Spec>,
    pub rules_version: u64,
    pub persisted: bool,
}

/// A page of `ListOverrides`: specs with why each does not apply (if so).
#[derive(Clone, Debug)]
pub struct OverridesPage {
    pub items: Vec<(Spec, Option<String>)>,
    pub next_after: String,
    pub total: usize,
}

/// The most a page lists.
pub const MAX_PAGE: usize = 1000;

impl Views<'_> {
    /// A page of the overrides, by id after `after`; only `rule`'s when given.
    pub fn list_overrides(&self, rule: &str, after: &str, limit: usize) -> OverridesPage {
        let installed = self.engine.rules_full();
        let limit = if limit == 0 { MAX_PAGE } else { limit.min(MAX_PAGE) };
        let of_rule = |s: &&Spec| rule.is_empty() || s.rule == rule;
        let mut page = installed.runtime.after(after).filter(of_rule);
        let items: Vec<(Spec, Option<String>)> =
            page.by_ref().take(limit).map(|s| (s.clone(), installed.problems.get(&s.id).cloned())).collect();
        let more = page.next().is_some();
        let next_after = match (more, items.last()) {
            (true, Some((s, _))) => s.id.clone(),
            _ => String::new(),
        };
        let total = if rule.is_empty() {
            installed.runtime.len()
        } else {
            installed.runtime.iter().filter(|s| s.rule == rule).count()
        };
        OverridesPage { items, next_after, total }
    }

    /// Whether overrides outlive a restart of this server.
    pub(crate) fn overrides_persisted(&self) -> bool {
        self.replication.is_some() || self.override_options.file.is_some()
    }
}

/// `f` on a blocking thread: copying a table of 100,000 overrides is not
/// work for the threads that decide.
async fn off_workers<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    // Outside a Tokio runtime (the fuzz targets' executor): here and now.
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    match tokio::task::spawn_blocking(f).await {
        Ok(t) => t,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

fn check_count(field: &'static str, count: usize) -> Result<(), RequestError> {
    if count == 0 || count > overrides::MAX_PER_CALL {
        let message = format!("must list 1 to {} items, got {count}", overrides::MAX_PER_CALL);
        return Err(RequestError::BadOverride { field, message });
    }
    Ok(())
}

/// Reads an overrides file: missing is empty; a bad line is an error naming it.
pub fn read_file(path: &Path, max: usize) -> anyhow::Result<Table> {
    // A spec is well under 8 KiB: a file larger than that many cannot be ours.
    let bound = max.saturating_mul(8192).saturating_add(1 << 20);
    let text = match crate::files::read_text(path, bound) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Table::default()),
        Err(e) => anyhow::bail!("reading {}: {e}", path.display()),
    };
    let table = Table::from_lines(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(table.len() <= max, "{}: {} overrides; --max-overrides is {max}", path.display(), table.len());
    Ok(table)
}

/// Writes `text` to a new file beside `path`, then renames it over `path`:
/// a crash leaves the old file or the new one, never half of one.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("overrides");
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

impl Control<'_> {
    /// Sets overrides, all or none.
    pub async fn set_overrides(&self, new: Vec<NewOverride>, who: &str) -> Result<OverridesSet, RequestError> {
        check_count("overrides", new.len())?;
        let _one_at_a_time = self.changing.lock().await;
        let installed = self.engine.rules_full();
        let now = self.engine.clock().now();
        let mut specs = Vec::with_capacity(new.len());
        let mut ids = std::collections::HashSet::new();
        for (i, NewOverride { mut spec, ttl }) in new.into_iter().enumerate() {
            let at = |field: &'static str, message: String| {
                RequestError::BadOverride { field, message }.in_batch("overrides", i)
            };
            if spec.id.is_empty() {
                spec.id = format!("ov-{:016x}", rand::random::<u64>());
            }
            spec.created_at = now.as_nanos();
            spec.created_by = who.to_string();
            spec.expires_at = ttl.map(|t| now.saturating_add(t).as_nanos());
            spec.check().map_err(|(field, why)| at(field, why))?;
            spec.build(&installed.file).map_err(|(field, why)| at(field, why))?;
            if !ids.insert(spec.id.clone()) {
                return Err(at("id", format!("'{}' appears twice in this call", spec.id)));
            }
            specs.push(spec);
        }
        let (runtime, added) = (installed.runtime.clone(), specs.clone());
        let next = off_workers(move || runtime.with(&added)).await;
        if next.len() > self.override_options.max {
            return Err(RequestError::TooManyOverrides { count: next.len(), max: self.override_options.max });
        }
        let change = Change { set: specs.iter().map(|s| s.id.clone()).collect(), ..Change::default() };
        let rules_version = self.keep_and_install(next, &specs, &[], change).await?;
        Ok(OverridesSet { specs, rules_version, persisted: self.views().overrides_persisted() })
    }

    /// Deletes overrides; the ids that existed, and the rules version.
    pub async fn delete_overrides(&self, ids: Vec<String>) -> Result<(Vec<String>, u64), RequestError> {
        check_count("ids", ids.len())?;
        let _one_at_a_time = self.changing.lock().await;
        let installed = self.engine.rules_full();
        let runtime = installed.runtime.clone();
        let (next, gone) = off_workers(move || runtime.without(&ids)).await;
        if gone.is_empty() {
            return Ok((gone, installed.version));
        }
        let change = Change { deleted: gone.clone(), ..Change::default() };
        let version = self.keep_and_install(next, &[], &gone, change).await?;
        Ok((gone, version))
    }

    /// Removes the overrides that have ended (they stopped applying at their
    /// expiry already; this frees them and tells Watch).
    pub async fn expire_overrides(&self) {
        let now = self.engine.clock().now().as_nanos();
        if self.engine.rules().runtime.ended(now).is_empty() {
            return;
        }
        let _one_at_a_time = self.changing.lock().await;
        let installed = self.engine.rules_full();
        let ended: Vec<Spec> = installed.runtime.ended(now).into_iter().cloned().collect();
        if ended.is_empty() {
            return;
        }
        if let Some(replication) = &self.replication {
            // Another replica may have removed some, or set them again.
            let _ = replication.settings().expire_overrides(&ended).await;
            return;
        }
        let ids: Vec<String> = ended.iter().map(|s| s.id.clone()).collect();
        let (runtime, gone) = (installed.runtime.clone(), ids.clone());
        let (next, _) = off_workers(move || runtime.without(&gone)).await;
        let change = Change { expired: ids, ..Change::default() };
        if let Err(e) = self.keep_and_install(next, &[], &[], change).await {
            tracing::warn!(error = %e, "removing ended overrides; they no longer apply, and removal is tried again");
        }
    }

    /// Keeps `next` (Redis: by setting `set` and removing `delete`), then
    /// installs it; the rules version. Nothing changes when keeping fails.
    async fn keep_and_install(
        &self,
        next: Table,
        set: &[Spec],
        delete: &[String],
        change: Change,
    ) -> Result<u64, RequestError> {
        if let Some(replication) = &self.replication {
            return replication.settings().change_overrides(set, delete, change).await.ok_or(RequestError::OverridesNotKept(
                "Redis did not answer, so it is not in force; if Redis stored it late, every replica installs it at its next sync".into(),
            ));
        }
        let next = Arc::new(next);
        if let Some(path) = &self.override_options.file {
            // Written whole off the workers: 100,000 lines take a while.
            let (path, table) = (path.clone(), next.clone());
            tokio::task::spawn_blocking(move || write_atomically(&path, &table.to_lines()))
                .await
                .map_err(|e| RequestError::OverridesNotKept(e.to_string()))?
                .map_err(|e| {
                    RequestError::OverridesNotKept(format!("writing the overrides file: {e}; nothing changed"))
                })?;
        }
        let engine = self.engine.clone();
        Ok(crate::runtime::off_workers(move || engine.control().install_overrides(next, change)).await)
    }
}
