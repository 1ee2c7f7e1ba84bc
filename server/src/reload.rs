//! Hot reload of the rules file.
//!
//! The file's directory is watched rather than the file, so that a file
//! replaced by an atomic rename (editors, `mv`, Kubernetes ConfigMaps swapping a
//! symlink) is seen too. Events are debounced, the content is compared with what
//! was last read, and an invalid file is logged and ignored: the rules in force
//! stay. SIGHUP forces a re-read.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::decider::{Decider, Origin};
use crate::rules::RuleSet;

/// How long the directory must stay quiet before the file is read.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Watches `path` and installs every valid change, until the returned task is
/// aborted. `loaded` is the text already in force.
pub fn spawn(path: PathBuf, decider: Arc<Decider>, loaded: String) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let notify_tx = tx.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
        Ok(e) if matches!(e.kind, EventKind::Access(_)) => {}
        Ok(_) => {
            let _ = notify_tx.try_send(());
        }
        Err(e) => tracing::warn!(error = %e, "watching the rules file failed"),
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    spawn_sighup(tx);
    Ok(tokio::spawn(async move {
        let _watcher = watcher;
        let mut last = loaded;
        while rx.recv().await.is_some() {
            while tokio::time::timeout(DEBOUNCE, rx.recv()).await.is_ok() {}
            reload(&path, &decider, &mut last).await;
        }
    }))
}

#[cfg(unix)]
fn spawn_sighup(tx: mpsc::Sender<()>) {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: re-reading the rules file");
                    let _ = tx.try_send(());
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP"),
    }
}

#[cfg(not(unix))]
fn spawn_sighup(_tx: mpsc::Sender<()>) {}

/// Reads the file once; installs it when it changed and is valid.
async fn reload(path: &Path, decider: &Decider, last: &mut String) {
    let file = path.display().to_string();
    let origin = Origin::File(file.clone());
    let text = match tokio::fs::read_to_string(path).await {
        Ok(t) => t,
        Err(e) => {
            decider.refused(&origin);
            tracing::error!(file, error = %e, "cannot read the rules file; keeping the rules in force");
            return;
        }
    };
    if text == *last {
        return;
    }
    match RuleSet::from_yaml(&text, &file) {
        Ok(rules) => {
            let version = decider.install(rules, text.clone(), origin);
            tracing::info!(file, version, "rules reloaded");
        }
        Err(errors) => {
            decider.refused(&origin);
            tracing::error!(file, "invalid rules file ignored; keeping the rules in force\n{errors}");
        }
    }
    *last = text;
}
