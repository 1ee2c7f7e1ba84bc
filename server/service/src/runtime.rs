//! The Tokio runtime the server and the load generator run on, and the one
//! way background work repeats on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::engine::Engine;

/// A multi-threaded runtime with `threads` workers (default: one per core;
/// 0 is refused where the flag is read). A worker going idle makes a memory
/// release asked for since its last (see [`crate::memory`]).
pub fn build(threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        runtime.worker_threads(n);
    }
    runtime.on_thread_park(crate::memory::on_worker_park);
    anyhow::Context::context(runtime.enable_all().build(), "starting the runtime")
}

/// Runs `work` on `owner` every `period`, the first time one period from
/// now, until `owner` is dropped. A run that takes longer than the period
/// delays the next one rather than bunching them up.
pub fn every<T, F, Fut>(period: Duration, owner: &Arc<T>, work: F) -> JoinHandle<()>
where
    T: Send + Sync + 'static,
    F: Fn(Arc<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let weak = Arc::downgrade(owner);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(owner) = weak.upgrade() else { return };
            work(owner).await;
        }
    })
}

/// Runs the engine's tick (permit expiry, breaker and level checks) every
/// `every` until the engine is dropped.
pub(crate) fn spawn_ticker(engine: &Arc<Engine>, every: Duration) -> JoinHandle<()> {
    self::every(every, engine, |engine| async move { engine.outcomes().tick() })
}

/// Forgets idle buckets every `every` (off the async workers: it walks every
/// bucket) until the engine is dropped. A sweep that forgot many keys asks
/// for their memory to go back to the system (see [`crate::memory`]), and
/// wakes the workers so that idle ones make the release too.
pub(crate) fn spawn_sweeper(engine: &Arc<Engine>, every: Duration) -> JoinHandle<()> {
    // The sweep after a release releases again: the allocator gives back
    // some freed memory only after a delay of its own.
    let again = Arc::new(std::sync::atomic::AtomicBool::new(false));
    self::every(every, engine, move |engine| {
        let again = again.clone();
        async move {
            let release = tokio::task::spawn_blocking(move || {
                let removed = engine.sweep();
                tracing::debug!(removed, "swept idle buckets");
                let many = removed >= crate::memory::RELEASE_AFTER_KEYS;
                let release = many || again.swap(false, std::sync::atomic::Ordering::Relaxed);
                again.fetch_or(many, std::sync::atomic::Ordering::Relaxed);
                if release {
                    crate::memory::ask_release();
                }
                release
            })
            .await
            .unwrap_or(false);
            if release {
                // A task per worker: a parked worker is woken to run one, and
                // parks again after it, releasing then.
                for _ in 0..tokio::runtime::Handle::current().metrics().num_workers() {
                    tokio::spawn(async {});
                }
            }
        }
    })
}

/// Runs `work` on a blocking thread and waits for it: for engine work long
/// enough to hold up the decisions queued behind it on a worker (installing
/// 100,000 overrides re-merges the rules for about half a second). A panic
/// in `work` is the caller's. Outside a runtime (the fuzzers poll futures
/// by hand) `work` runs here.
pub(crate) async fn off_workers<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn work_repeats_every_period_and_stops_with_its_owner() {
        let owner = Arc::new(AtomicU32::new(0));
        let task = every(Duration::from_secs(1), &owner, |n| async move {
            n.fetch_add(1, Ordering::SeqCst);
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(owner.load(Ordering::SeqCst), 0, "not at once");
        tokio::time::sleep(Duration::from_millis(2600)).await;
        assert_eq!(owner.load(Ordering::SeqCst), 3);
        drop(owner);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(task.is_finished(), "ends once the owner is gone");
    }
}
