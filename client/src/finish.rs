//! Calls that are finished off the caller's task when the caller stops
//! waiting: an Acquire the caller's timeout (or a dropped future) cut short
//! may still be admitted by the server, holding a concurrency slot, a probe
//! or a lease's units until they expire. The client does not drop such a
//! call: it lets it finish in the background and gives back what it was
//! granted (a permit reported IGNORED, a lease returned unused).
//!
//! Why here and not on the server: the server decides an Acquire before the
//! client's cancellation reaches it (a unary call is answered at once), and
//! an answer that was sent cannot be taken back; only the client knows that
//! nobody read it.

use std::pin::Pin;
use std::task::{Context, Poll};

/// What to do with an answer nobody waited for.
pub(crate) type Then<T> = Box<dyn FnOnce(T) + Send>;

/// `fut`, finished in the background with `then` if dropped before it is.
pub(crate) struct Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fut: Option<Pin<Box<F>>>,
    then: Option<Then<F::Output>>,
}

impl<F> Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    pub(crate) fn new(fut: F, then: Option<Then<F::Output>>) -> Self {
        Finish { fut: Some(Box::pin(fut)), then }
    }
}

impl<F> Future for Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let Some(fut) = this.fut.as_mut() else { panic!("Finish polled after it completed") };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        this.fut = None;
        Poll::Ready(out)
    }
}

impl<F> Drop for Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let (Some(fut), Some(then)) = (self.fut.take(), self.then.take())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move { then(fut.await) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn an_answer_nobody_waited_for_is_handed_to_then_and_a_read_one_is_not() {
        let seen = Arc::new(AtomicU32::new(0));
        let then = |seen: &Arc<AtomicU32>| {
            let seen = seen.clone();
            Some(Box::new(move |v: u32| {
                seen.fetch_add(v, Ordering::SeqCst);
            }) as Then<u32>)
        };
        let slow = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            7
        };
        // Cut short by a timeout: finished off the caller's task.
        let r = tokio::time::timeout(Duration::from_millis(1), Finish::new(slow, then(&seen))).await;
        assert!(r.is_err());
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(seen.load(Ordering::SeqCst), 7, "the late answer went to `then`");
        // Awaited to the end: the caller has it, `then` never runs.
        assert_eq!(Finish::new(async { 5 }, then(&seen)).await, 5);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(seen.load(Ordering::SeqCst), 7);
    }
}
