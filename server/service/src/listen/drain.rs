//! How a connection ends once the server drains. A graceful HTTP stop waits
//! for every stream of a connection to finish, and a stream whose client
//! does not read never does: its answer waits in the connection's send
//! window. So the drain waits for the calls a connection has in progress
//! (a handler that has not answered yet: a decision waiting on Redis), not
//! for its streams or its readers: once none is in progress, what it still
//! holds has [`FLUSH`] to reach a client that reads, then the connection is
//! closed. Streams of events (Watch, the console's) end by themselves when
//! the drain starts.
//!
//! The same task closes a connection that has had no call open for
//! `--idle-timeout` ([`Activity`]): a call is open from its request until
//! its answer's last byte (a Watch stream for as long as it lasts), and
//! HTTP/2 pings, which every live client answers, do not count.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// How long answers already written have to reach their clients once a
/// draining connection has no call in progress.
pub(crate) const FLUSH: Duration = Duration::from_secs(1);
/// How often a draining connection looks at its calls in progress.
const LOOK: Duration = Duration::from_millis(20);

/// The port's drain: started once, seen by every connection.
#[derive(Clone)]
pub(crate) struct Drain(watch::Sender<bool>);

/// One connection's calls in progress.
#[derive(Clone, Default)]
pub(crate) struct InProgress(Arc<AtomicUsize>);

/// A call counted in progress until dropped (answered or cancelled).
pub struct Call(Arc<AtomicUsize>);

/// One connection's calls open (request received, answer not yet wholly
/// sent), and when the last one ended.
#[derive(Clone)]
pub(crate) struct Activity(Arc<ActivityState>);

struct ActivityState {
    open: AtomicUsize,
    /// When the connection was last busy: when its last open call ended,
    /// or when it was accepted.
    since: std::sync::Mutex<tokio::time::Instant>,
}

/// A call counted open on its connection until dropped.
pub struct Open(Arc<ActivityState>);

impl Drain {
    pub fn new() -> Self {
        Drain(watch::Sender::new(false))
    }

    pub fn start(&self) {
        self.0.send_replace(true);
    }

    /// Completes when a connection with these calls in progress may be
    /// closed: the drain started, none is in progress and [`FLUSH`] passed
    /// with none in progress. Never completes before the drain.
    pub(crate) fn closable(&self, calls: InProgress) -> impl Future<Output = ()> + Send + 'static {
        let mut started = self.0.subscribe();
        async move {
            if started.wait_for(|d| *d).await.is_err() {
                // The port is gone without a drain: nothing to close early.
                std::future::pending::<()>().await;
            }
            loop {
                while calls.0.load(Ordering::Acquire) > 0 {
                    tokio::time::sleep(LOOK).await;
                }
                tokio::time::sleep(FLUSH).await;
                if calls.0.load(Ordering::Acquire) == 0 {
                    return;
                }
            }
        }
    }

    /// Runs a connection of port `port` in a task of its own until it ends,
    /// until the drain may close it (see [`closable`](Self::closable)), or
    /// until it has had no call open for `idle_for`.
    pub fn spawn<E: std::fmt::Display>(
        &self,
        port: &'static str,
        connection: impl Future<Output = Result<(), E>> + Send + 'static,
        calls: InProgress,
        (activity, idle_for): (Activity, std::time::Duration),
    ) {
        let closable = self.closable(calls);
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => if let Err(e) = ended {
                    tracing::debug!(port, error = %e, "connection ended");
                },
                () = closable => tracing::debug!(port, "draining: a connection with no call in progress closed"),
                () = activity.idle(idle_for) => tracing::debug!(port, "a connection with no call open for --idle-timeout closed"),
            }
        });
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

impl InProgress {
    pub fn begin(&self) -> Call {
        self.0.fetch_add(1, Ordering::AcqRel);
        Call(self.0.clone())
    }

    /// `call`, counted in progress from now until it completes or is dropped.
    pub fn count<F: Future>(&self, call: F) -> impl Future<Output = F::Output> + use<F> {
        let counted = self.begin();
        async move {
            let _counted = counted;
            call.await
        }
    }
}

impl Activity {
    pub fn new() -> Self {
        Activity(Arc::new(ActivityState {
            open: AtomicUsize::new(0),
            since: std::sync::Mutex::new(tokio::time::Instant::now()),
        }))
    }

    /// A call open from now until the returned guard is dropped.
    pub fn open(&self) -> Open {
        self.0.open.fetch_add(1, Ordering::AcqRel);
        Open(self.0.clone())
    }

    /// Completes once the connection has had no call open for `idle_for`.
    pub(crate) fn idle(&self, idle_for: Duration) -> impl Future<Output = ()> + Send + 'static {
        let state = self.0.clone();
        async move {
            loop {
                let since = *state.since.lock().unwrap_or_else(|e| e.into_inner());
                let quiet_until = since + idle_for;
                if state.open.load(Ordering::Acquire) > 0 {
                    tokio::time::sleep(idle_for.min(Duration::from_secs(1))).await;
                } else if tokio::time::Instant::now() >= quiet_until {
                    return;
                } else {
                    tokio::time::sleep_until(quiet_until).await;
                }
            }
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        // The time is set before the count falls, so that an idle check that
        // sees no call open also sees when the last one ended.
        *self.0.since.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_closes_after_its_calls_answer_and_the_flush() {
        let drain = Drain::new();
        let calls = InProgress::default();
        let call = calls.begin();
        let closable = tokio::spawn(drain.closable(calls.clone()));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!closable.is_finished(), "never before the drain");
        drain.start();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!closable.is_finished(), "not while a call is in progress");
        let answered = tokio::time::Instant::now();
        drop(call);
        closable.await.unwrap();
        let waited = answered.elapsed();
        assert!(waited >= FLUSH && waited < FLUSH + 2 * LOOK, "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_with_no_call_open_for_the_whole_timeout() {
        let idle_for = Duration::from_secs(300);
        let activity = Activity::new();
        let idle = tokio::spawn(activity.idle(idle_for));
        // A call open far longer than the timeout (a Watch stream).
        let call = activity.open();
        tokio::time::sleep(Duration::from_secs(1000)).await;
        assert!(!idle.is_finished(), "not while a call is open");
        drop(call);
        let ended = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(299)).await;
        assert!(!idle.is_finished(), "not before the timeout since the last call ended");
        idle.await.unwrap();
        assert!(
            ended.elapsed() >= idle_for && ended.elapsed() < idle_for + Duration::from_secs(2),
            "{:?}",
            ended.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_closes_one_flush_after_the_drain() {
        let drain = Drain::new();
        let closable = tokio::spawn(drain.closable(InProgress::default()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = tokio::time::Instant::now();
        drain.start();
        closable.await.unwrap();
        assert!(started.elapsed() < FLUSH + 2 * LOOK, "{:?}", started.elapsed());
    }
}
