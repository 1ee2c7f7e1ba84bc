//! Hot reload of the rules file: a valid change applies without a restart;
//! an invalid one is logged and ignored, and the rules in force stay.
//!
//! The file is read again once it has stopped changing for `quiet` (a file
//! written in chunks is never installed half-written: a valid prefix would
//! leave resources unlimited), through every symlink on its way (see
//! [`files`](crate::files)). Parsing runs off the async workers. SIGHUP
//! forces a re-read.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::decider::{Decider, Origin};
use crate::rules::{RuleSet, bounds};

/// Watches `path` and installs every valid change, until the returned task is
/// aborted. `loaded` is the text already in force.
pub fn spawn(
    path: PathBuf,
    decider: Arc<Decider>,
    loaded: String,
    quiet: Duration,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let read = reader(path.clone(), decider, loaded, |path, decider, last| async move {
        reload(&path, &decider, &mut *last.lock().await).await
    });
    spawn_sighup(read.clone());
    crate::files::watch(vec![path], quiet, read)
}

/// What the watcher calls on every change: `reload` of `target`, one at a
/// time, given the text last seen (`loaded` at first).
fn reader<R, Fut>(target: PathBuf, decider: Arc<Decider>, loaded: String, reload: R) -> impl Fn() -> Fut + Clone
where
    R: Fn(PathBuf, Arc<Decider>, Arc<Mutex<String>>) -> Fut + Clone,
{
    let last = Arc::new(Mutex::new(loaded));
    move || reload(target.clone(), decider.clone(), last.clone())
}

#[cfg(unix)]
fn spawn_sighup<F, Fut>(read: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: reading the rules again");
                    read().await;
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP"),
    }
}

#[cfg(not(unix))]
fn spawn_sighup<F>(_read: F) {}

/// SIGHUP with no file to read again (the embedded rules): said, not fatal.
pub(crate) fn ignore_sighup() {
    spawn_sighup(|| async { tracing::info!("SIGHUP: the rules are the embedded ones; nothing to read again") });
}

/// Reads the file once; installs it when it changed and is valid.
async fn reload(path: &Path, decider: &Decider, last: &mut String) {
    let file = path.display().to_string();
    let origin = Origin::File(file.clone());
    let text = match crate::files::read_bounded(path, bounds::MAX_BYTES).await {
        Ok(t) => t,
        Err(e) => {
            decider.control().refused(&origin, file.clone(), &format!("cannot read the rules file: {e}"));
            tracing::error!(file, error = %e, "cannot read the rules file; keeping the rules in force");
            // Whatever is read next is installed, even the text in force:
            // it ends the refusal (the console's banner, the alert).
            last.clear();
            return;
        }
    };
    if text == *last {
        return;
    }
    let (name, body) = (file.clone(), text.clone());
    let parsed = tokio::task::spawn_blocking(move || RuleSet::from_yaml(&body, &name)).await;
    match parsed {
        Ok(Ok(rules)) => {
            let version = decider.control().install(rules, text.clone(), origin);
            tracing::info!(file, version, "rules reloaded");
        }
        Ok(Err(errors)) => {
            decider.control().refused(&origin, file.clone(), &errors.to_string());
            tracing::error!(file, "invalid rules file ignored; keeping the rules in force\n{errors}");
        }
        Err(e) => {
            decider.control().refused(&origin, file.clone(), &format!("parsing the rules file failed: {e}"));
            tracing::error!(file, error = %e, "parsing the rules file failed; keeping the rules in force");
        }
    }
    *last = text;
}

/// Watches an envoyproxy/ratelimit configuration directory and installs
/// every valid change (the files are read whole, once quiet); an invalid one
/// is logged and ignored. `loaded` is the text already in force.
pub(crate) fn spawn_envoy(
    dir: PathBuf,
    decider: Arc<Decider>,
    loaded: String,
    quiet: Duration,
    options: crate::rules::envoy::EnvoyOptions,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let read = reader(dir.clone(), decider, loaded, move |dir, decider, last| async move {
        reload_envoy(dir, &decider, &mut *last.lock().await, options).await
    });
    spawn_sighup(read.clone());
    // Changes inside the directory (a path in it), to the directory itself
    // (made again, renamed over, a symlink to it swapped: its parent's
    // watch), and to the files in it now, through their symlinks (a
    // Kubernetes ConfigMap's `..data`).
    let mut paths = vec![dir.join(".floodgate"), dir.clone()];
    if let Ok(entries) = std::fs::read_dir(&dir) {
        paths.extend(entries.filter_map(|e| e.ok().map(|e| e.path())).take(crate::rules::envoy::MAX_FILES));
    }
    crate::files::watch(paths, quiet, read)
}

/// Watches a directory of Sentinel's rules like `spawn_envoy`.
pub(crate) fn spawn_sentinel(
    dir: PathBuf,
    decider: Arc<Decider>,
    loaded: String,
    quiet: Duration,
    options: crate::rules::sentinel::SentinelOptions,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let read = reader(dir.clone(), decider, loaded, move |dir, decider, last| {
        let options = options.clone();
        async move { reload_sentinel(dir, &decider, &mut *last.lock().await, options).await }
    });
    spawn_sighup(read.clone());
    let mut paths = vec![dir.join(".floodgate"), dir.clone()];
    if let Ok(entries) = std::fs::read_dir(&dir) {
        paths.extend(entries.filter_map(|e| e.ok().map(|e| e.path())).take(crate::rules::sentinel::MAX_FILES));
    }
    crate::files::watch(paths, quiet, read)
}

async fn reload_sentinel(
    dir: PathBuf,
    decider: &Decider,
    last: &mut String,
    options: crate::rules::sentinel::SentinelOptions,
) {
    let name = dir.display().to_string();
    let loaded = tokio::task::spawn_blocking(move || {
        crate::rules::sentinel::SentinelRules::load_dir(&dir, &options).map(|r| (r, dir))
    })
    .await;
    match loaded {
        Ok(Ok(((rules, text), dir))) => {
            if text == *last {
                return;
            }
            let version = decider.control().install_sentinel(rules, text.clone(), &dir);
            tracing::info!(dir = name, version, "Sentinel's rules reloaded");
            *last = text;
        }
        Ok(Err(errors)) => {
            decider.control().refused(&Origin::Sentinel, format!("sentinel:{name}"), &errors.to_string());
            // The next good reading is installed even if it is the text in force.
            last.clear();
            tracing::error!(dir = name, "invalid Sentinel rules ignored; keeping the ones in force\n{errors}");
        }
        Err(e) => {
            let why = format!("reading Sentinel's rules failed: {e}");
            decider.control().refused(&Origin::Sentinel, format!("sentinel:{name}"), &why);
            // The next good reading is installed even if it is the text in force.
            last.clear();
            tracing::error!(dir = name, error = %e, "reading Sentinel's rules failed");
        }
    }
}

async fn reload_envoy(dir: PathBuf, decider: &Decider, last: &mut String, options: crate::rules::envoy::EnvoyOptions) {
    let name = dir.display().to_string();
    let loaded = tokio::task::spawn_blocking(move || {
        crate::rules::envoy::EnvoyConfig::load_dir(&dir, &options).map(|c| (c, dir))
    })
    .await;
    match loaded {
        Ok(Ok(((config, text), dir))) => {
            if text == *last {
                return;
            }
            let version = decider.control().install_envoy(config, text.clone(), &dir);
            tracing::info!(dir = name, version, "envoyproxy/ratelimit configuration reloaded");
            *last = text;
        }
        Ok(Err(errors)) => {
            decider.control().refused(&Origin::Envoy, format!("envoy:{name}"), &errors.to_string());
            // The next good reading is installed even if it is the text in force.
            last.clear();
            tracing::error!(
                dir = name,
                "invalid envoyproxy/ratelimit configuration ignored; keeping the one in force\n{errors}"
            );
        }
        Err(e) => {
            let why = format!("reading the envoyproxy/ratelimit configuration failed: {e}");
            decider.control().refused(&Origin::Envoy, format!("envoy:{name}"), &why);
            // The next good reading is installed even if it is the text in force.
            last.clear();
            tracing::error!(dir = name, error = %e, "reading the envoyproxy/ratelimit configuration failed");
        }
    }
}
