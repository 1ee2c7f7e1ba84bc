//! Giving memory back to the system once the idle sweep has forgotten many
//! keys.
//!
//! An allocator keeps the memory a program frees, to reuse it; without being
//! told, it keeps what a burst of keys took after those keys are gone. How
//! to tell it is the allocator's own business, so the binary that chose the
//! allocator installs that function here ([`set_release`]); a library or a
//! test that installs none releases nothing.
//!
//! Memory is owned per thread: a block freed on one thread may sit in a page
//! that another thread allocated, and only that thread can give the page
//! back. So a release is asked for ([`ask_release`]) and each runtime worker
//! makes it for its own memory when it next goes idle ([`on_worker_park`]),
//! which costs a worker one atomic load when nothing was asked.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Keys a sweep must forget before memory is released: releasing walks the
/// allocator's pages, which is worth it after a burst, not after a few keys.
pub const RELEASE_AFTER_KEYS: usize = 4096;

static RELEASE: OnceLock<fn()> = OnceLock::new();
/// Counts the releases asked for; each thread remembers the last it made.
static ASKED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static MADE: Cell<u64> = const { Cell::new(0) };
}

/// Installs how the allocator gives this thread's free memory back to the
/// system. Only the first call counts.
pub fn set_release(release: fn()) {
    let _ = RELEASE.set(release);
}

/// Asks every runtime worker to release its free memory when it next goes
/// idle, and releases this thread's now.
pub fn ask_release() {
    let Some(release) = RELEASE.get() else { return };
    let asked = ASKED.fetch_add(1, Ordering::Relaxed) + 1;
    MADE.with(|m| m.set(asked));
    release();
}

/// A runtime worker is about to go idle: it makes a release asked for since
/// its last one.
pub fn on_worker_park() {
    let asked = ASKED.load(Ordering::Relaxed);
    if asked == 0 || MADE.with(Cell::get) == asked {
        return;
    }
    MADE.with(|m| m.set(asked));
    if let Some(release) = RELEASE.get() {
        release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static MADE_HERE: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        MADE_HERE.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn each_thread_releases_once_per_ask() {
        set_release(count);
        let start = MADE_HERE.load(Ordering::Relaxed);
        // Nothing asked since this thread's last release: a park costs nothing.
        ask_release();
        assert_eq!(MADE_HERE.load(Ordering::Relaxed), start + 1, "the asking thread releases at once");
        on_worker_park();
        assert_eq!(MADE_HERE.load(Ordering::Relaxed), start + 1, "and not again when it parks");
        // Another thread releases once, at its first park after the ask.
        std::thread::spawn(|| {
            on_worker_park();
            on_worker_park();
        })
        .join()
        .unwrap();
        assert_eq!(MADE_HERE.load(Ordering::Relaxed), start + 2);
    }
}
