//! How a connection ends once the server drains. A graceful HTTP stop waits
//! for every stream of a connection to finish, and a stream whose client
//! does not read never does: its answer waits in the connection's send
//! window. So the drain waits for the calls a connection has in progress
//! (a handler that has not answered yet: a decision waiting on Redis), not
//! for its streams or its readers: once none is in progress, what it still
//! holds has [`FLUSH`] to reach a client that reads, then the connection is
//! closed. Streams of events (Watch, the console's) end by themselves when
//! the drain starts.

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
    /// or until the drain may close it (see [`closable`](Self::closable)).
    pub fn spawn<E: std::fmt::Display>(
        &self,
        port: &'static str,
        connection: impl Future<Output = Result<(), E>> + Send + 'static,
        calls: InProgress,
    ) {
        let closable = self.closable(calls);
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => if let Err(e) = ended {
                    tracing::debug!(port, error = %e, "connection ended");
                },
                () = closable => tracing::debug!(port, "draining: a connection with no call in progress closed"),
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
