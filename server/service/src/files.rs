//! Files the server reads while it runs (the rules, TLS certificates, admin
//! tokens): watched for changes and read again once they have stopped changing.
//!
//! The directories are watched rather than the files, so that a file replaced
//! by an atomic rename (editors, `mv`) is seen; so is every directory on the
//! file's symlink chain, so that an edit of a symlink's target in another
//! directory, or a Kubernetes ConfigMap swapping its `..data` link, is seen
//! too. A change is acted on only after `quiet` without events: a file written
//! in several chunks is read once, whole.
//!
//! Only events about the watched paths count: the path itself, a link or a
//! directory on its way (a ConfigMap's `..data`), or, for a watched
//! directory, what is inside it. So a log file written beside a certificate
//! neither reloads it nor keeps its reload waiting for a quiet second.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::lock;
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
    let relevant: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
    let wanted = relevant.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
        Ok(e) if matches!(e.kind, EventKind::Access(_)) => {}
        // An event without a path (the kernel's queue overflowed) may be anything.
        Ok(e) if e.paths.is_empty() || e.paths.iter().any(|p| concerns(p, &lock(&wanted))) => {
            let _ = notify_tx.try_send(());
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "watching a file failed"),
    })?;
    let mut dirs = Dirs { watcher, failed: HashSet::new(), relevant };
    dirs.follow(&paths);
    Ok(tokio::spawn(run(dirs, paths, quiet, rx, changed)))
}

/// Whether an event on `path` concerns the watched paths whose chains are
/// `relevant`: it is one of them or a directory on the way to one (a link
/// swapped, a directory made again), or it is inside one (a watched
/// directory's files).
fn concerns(path: &Path, relevant: &[PathBuf]) -> bool {
    let path = plain(path);
    relevant.iter().any(|r| r.starts_with(&path) || path.starts_with(r))
}

/// `path` without its `.` parts: a file given as `rules.yaml` is watched
/// through `.`, and its events name `./rules.yaml`.
fn plain(path: &Path) -> PathBuf {
    path.components().filter(|c| !matches!(c, std::path::Component::CurDir)).collect()
}

async fn run<F, Fut>(mut dirs: Dirs, paths: Vec<PathBuf>, quiet: Duration, mut rx: mpsc::Receiver<()>, changed: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    while rx.recv().await.is_some() {
        // Wait for the writer to finish: every new event restarts the wait.
        while tokio::time::timeout(quiet, rx.recv()).await.is_ok_and(|e| e.is_some()) {}
        // A directory made again, renamed over or swapped through a symlink
        // is watched anew: before reading (what is written in it from now on
        // is seen) and after (a swapped symlink may now point elsewhere).
        dirs.follow(&paths);
        changed().await;
        dirs.follow(&paths);
    }
}

struct Dirs {
    watcher: RecommendedWatcher,
    /// Directories that could not be watched, said once.
    failed: HashSet<PathBuf>,
    /// Every path on the watched paths' chains, as of the last `follow`.
    relevant: Arc<Mutex<Vec<PathBuf>>>,
}

impl Dirs {
    /// Watches the directory of every path and of every link on its way.
    /// Every time, not once: a watch follows an inode, not a path, and a
    /// directory made again may even get its old inode number back; adding
    /// a watch that exists changes nothing.
    fn follow(&mut self, paths: &[PathBuf]) {
        *lock(&self.relevant) = paths.iter().flat_map(|p| chain(p)).map(|p| plain(&p)).collect();
        let mut seen = HashSet::new();
        for dir in paths.iter().flat_map(|p| chain(p)).filter_map(|p| parent(&p)) {
            // What does not exist now is watched once it does: its parent's
            // watch (the directory itself is one of the paths) says when.
            if !seen.insert(dir.clone()) || !dir.is_dir() {
                continue;
            }
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.failed.remove(&dir);
                }
                Err(e) => {
                    if self.failed.insert(dir.clone()) {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a directory");
                    }
                }
            }
        }
    }
}

/// `path`, then every link target on its way to the file.
fn chain(path: &Path) -> Vec<PathBuf> {
    let mut out = vec![path.to_path_buf()];
    // A link to what is not a file (`/dev/zero`, a FIFO) is refused when
    // read; its directory (`/dev`) is not watched.
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return out;
    }
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

pub use floodgate_rules::files::{read_file, read_text};

/// [`read_text`] off the async threads.
pub(crate) async fn read_bounded(path: &Path, max: usize) -> std::io::Result<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || read_text(&path, max)).await.map_err(std::io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_events_on_the_way_to_a_watched_path_or_inside_it_concern_it() {
        let relevant = [PathBuf::from("/etc/tls/tls.crt"), PathBuf::from("/etc/tls/..data/tls.crt")];
        assert!(concerns(Path::new("/etc/tls/tls.crt"), &relevant));
        assert!(concerns(Path::new("/etc/tls/..data"), &relevant), "a ConfigMap's link swapped");
        assert!(concerns(Path::new("/etc/tls"), &relevant), "the directory made again");
        assert!(!concerns(Path::new("/etc/tls/app.log"), &relevant), "a neighbour");
        assert!(!concerns(Path::new("/etc/tls/..2026_12_06"), &relevant), "a new folder, until the link moves");
        // A watched directory: what is written inside it.
        let dir = [PathBuf::from("/etc/envoy")];
        assert!(concerns(Path::new("/etc/envoy/config.yaml"), &dir));
        assert!(!concerns(Path::new("/etc/envoy-old/config.yaml"), &dir));
        // A relative path, watched through `.`.
        let here = [plain(Path::new("rules.yaml"))];
        assert!(concerns(Path::new("./rules.yaml"), &here));
        assert!(!concerns(Path::new("./other.yaml"), &here));
    }

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
