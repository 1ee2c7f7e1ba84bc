//! Files the server reads while it runs (the rules, TLS certificates, admin
//! tokens): watched for changes and read again once they have stopped changing.
//!
//! The directories are watched rather than the files, so that a file replaced
//! by an atomic rename (editors, `mv`) is seen; so is every directory on the
//! file's symlink chain, so that an edit of a symlink's target in another
//! directory, or a Kubernetes ConfigMap swapping its `..data` link, is seen
//! too. A change is acted on only after `quiet` without events: a file written
//! in several chunks is read once, whole.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// How long a file must stay quiet before it is read again, by default.
pub const QUIET: Duration = Duration::from_secs(1);
/// Symlinks followed, at most, from a watched path.
const MAX_LINKS: usize = 16;

/// Calls `changed` after every change to any of `paths` (once they have been
/// quiet for `quiet`), until the returned task is aborted.
pub fn watch<F, Fut>(paths: Vec<PathBuf>, quiet: Duration, changed: F) -> anyhow::Result<tokio::task::JoinHandle<()>>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<()>(1);
    let notify_tx = tx.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
        Ok(e) if matches!(e.kind, EventKind::Access(_)) => {}
        Ok(_) => {
            let _ = notify_tx.try_send(());
        }
        Err(e) => tracing::warn!(error = %e, "watching a file failed"),
    })?;
    let mut dirs = Dirs { watcher, watched: HashSet::new() };
    dirs.follow(&paths);
    Ok(tokio::spawn(run(dirs, paths, quiet, rx, changed)))
}

/// A sender that makes the watcher read the files now (SIGHUP).
pub type Poke = mpsc::Sender<()>;

async fn run<F, Fut>(mut dirs: Dirs, paths: Vec<PathBuf>, quiet: Duration, mut rx: mpsc::Receiver<()>, changed: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    while rx.recv().await.is_some() {
        // Wait for the writer to finish: every new event restarts the wait.
        while tokio::time::timeout(quiet, rx.recv()).await.is_ok_and(|e| e.is_some()) {}
        changed().await;
        // A swapped symlink may now point into another directory.
        dirs.follow(&paths);
    }
}

struct Dirs {
    watcher: RecommendedWatcher,
    watched: HashSet<PathBuf>,
}

impl Dirs {
    /// Watches the directory of every path and of every link on its way.
    fn follow(&mut self, paths: &[PathBuf]) {
        for dir in paths.iter().flat_map(|p| chain(p)).filter_map(|p| parent(&p)) {
            if self.watched.contains(&dir) {
                continue;
            }
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(dir);
                }
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a directory"),
            }
        }
    }
}

/// `path`, then every link target on its way to the file.
fn chain(path: &Path) -> Vec<PathBuf> {
    let mut out = vec![path.to_path_buf()];
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let Ok(target) = std::fs::read_link(&at) else { break };
        at = match parent(&at) {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
        out.push(at.clone());
    }
    if let Ok(real) = std::fs::canonicalize(path) {
        out.push(real);
    }
    out
}

fn parent(p: &Path) -> Option<PathBuf> {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => Some(d.to_path_buf()),
        _ => Some(PathBuf::from(".")),
    }
}

/// Reads a file the server depends on, refusing one larger than `max` bytes.
pub async fn read_bounded(path: &Path, max: usize) -> std::io::Result<String> {
    let size = tokio::fs::metadata(path).await?.len();
    if size > max as u64 {
        return Err(std::io::Error::other(format!("{size} bytes; the limit is {max}")));
    }
    tokio::fs::read_to_string(path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_of_a_symlink_reaches_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let target = other.path().join("rules.yaml");
        std::fs::write(&target, "x").unwrap();
        let link = dir.path().join("rules.yaml");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dirs: Vec<PathBuf> = chain(&link).iter().filter_map(|p| parent(p)).collect();
        assert!(dirs.contains(&dir.path().to_path_buf()));
        assert!(dirs.iter().any(|d| d.canonicalize().unwrap() == other.path().canonicalize().unwrap()), "{dirs:?}");
    }
}
