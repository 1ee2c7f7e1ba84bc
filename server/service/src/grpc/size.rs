//! What a request body may cost, checked as it arrives, before anything is
//! decoded.
//!
//! - A cap per RPC: one Acquire is a few kilobytes at most, a rules upload
//!   up to a mebibyte. A unary call's whole body counts (its messages after
//!   the first are read too); a stream's cap is per message. Every message's
//!   length prefix is read, so a message declared over the cap is refused
//!   before its bytes arrive; and a stream that lives for days is not cut
//!   off by the sum of what it sent. Over the cap: RESOURCE_EXHAUSTED,
//!   naming it.
//! - A byte budget for unfinished messages, per connection and for the
//!   whole port: bytes of a message still arriving are held in memory until
//!   its last byte comes, and a peer that opens many streams and sends each
//!   message all but its last byte would otherwise hold connections x
//!   streams x cap. A message that arrives whole in one frame (nearly every
//!   call) holds nothing; one that would take the connection or the port
//!   past its budget ends its call RESOURCE_EXHAUSTED, and what it held is
//!   given back as soon as its stream ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

use super::rpc::{self, Rpc};
use super::status::Refusal;

/// The cap for a method path: its row's in [`Rpc`], else the smallest.
pub fn cap(path: &str) -> usize {
    Rpc::from_path(path).map_or(rpc::UNKNOWN_CAP, Rpc::cap)
}

/// Bytes held at most, of unfinished messages.
#[derive(Debug)]
pub struct Budget {
    max: usize,
    held: AtomicUsize,
}

impl Budget {
    pub fn new(max: usize) -> Arc<Budget> {
        Arc::new(Budget { max, held: AtomicUsize::new(0) })
    }

    /// Takes `n` more bytes, if that keeps within the budget.
    fn take(&self, n: usize) -> bool {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            let Some(next) = held.checked_add(n).filter(|next| *next <= self.max) else { return false };
            match self.held.compare_exchange_weak(held, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => held = now,
            }
        }
    }

    fn give_back(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// A connection's budget, put in each of its requests' extensions.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionBudget(pub Arc<Budget>);

#[derive(Clone, Debug)]
pub struct SizeLayer {
    port: Arc<Budget>,
    wait: Duration,
}

impl SizeLayer {
    /// `port`: the budget of every connection's unfinished messages.
    pub fn new(port: Arc<Budget>) -> Self {
        SizeLayer { port, wait: crate::listen::Limits::default().request_timeout }
    }

    /// How long a request (but a client stream) may take to arrive whole.
    pub(crate) fn with_request_timeout(self, wait: Duration) -> Self {
        SizeLayer { wait, ..self }
    }
}

#[derive(Clone, Debug)]
pub struct Sized<S> {
    inner: S,
    port: Arc<Budget>,
    wait: Duration,
}

impl<S> Layer<S> for SizeLayer {
    type Service = Sized<S>;

    fn layer(&self, inner: S) -> Sized<S> {
        Sized { inner, port: self.port.clone(), wait: self.wait }
    }
}

impl<S, B> Service<http::Request<B>> for Sized<S>
where
    S: Service<http::Request<tonic::body::Body>>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tower::BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let rpc = Rpc::from_path(req.uri().path());
        let cap = rpc.map_or(rpc::UNKNOWN_CAP, Rpc::cap);
        let whole = !rpc.is_some_and(Rpc::client_streaming);
        let connection = req.extensions().get::<ConnectionBudget>().map(|c| c.0.clone());
        let budgets = Budgets { port: self.port.clone(), connection, held: 0 };
        let wait = whole.then_some(self.wait);
        let req = req.map(|body| tonic::body::Body::new(Capped::new(body, cap, whole, budgets).within(wait)));
        self.inner.call(req)
    }
}

/// The budgets one body takes from, and what it holds of them.
struct Budgets {
    port: Arc<Budget>,
    connection: Option<Arc<Budget>>,
    held: usize,
}

impl Budgets {
    /// Holds `n` bytes in all, taking or giving back the difference.
    fn hold(&mut self, n: usize) -> Result<(), Refusal> {
        if n > self.held {
            let more = n - self.held;
            if let Some(c) = &self.connection
                && !c.take(more)
            {
                return Err(Refusal::Unfinished { max: c.max(), of: "this connection" });
            }
            if !self.port.take(more) {
                if let Some(c) = &self.connection {
                    c.give_back(more);
                }
                return Err(Refusal::Unfinished { max: self.port.max(), of: "the server" });
            }
        } else {
            let less = self.held - n;
            self.port.give_back(less);
            if let Some(c) = &self.connection {
                c.give_back(less);
            }
        }
        self.held = n;
        Ok(())
    }
}

impl Drop for Budgets {
    fn drop(&mut self) {
        let _ = self.hold(0);
    }
}

/// A request body that fails once its cap or a budget is exceeded.
struct Capped<B> {
    inner: B,
    cap: usize,
    /// The cap counts the whole body (a unary call), else each message.
    whole: bool,
    /// Bytes counted against the cap: the body's, or the message's so far.
    seen: usize,
    /// The length prefix of the message arriving: its bytes so far.
    prefix: [u8; 5],
    prefix_seen: usize,
    /// Bytes of the message arriving still to come, once its prefix is read.
    left: usize,
    /// Bytes of the message arriving so far (its prefix included).
    unfinished: usize,
    budgets: Budgets,
    failed: bool,
    /// How long the body may take to arrive (a unary call's), and the
    /// timer, started the first time the body is not all there (the first
    /// read is when the call starts, so that is from its headers).
    wait: Option<Duration>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> Capped<B> {
    /// The body must end within `wait` (none: it may take its time).
    fn within(mut self, wait: Option<Duration>) -> Self {
        self.wait = wait;
        self
    }

    /// Whether the body's time is up (the timer is made only for a body
    /// that is not all there when first read: nearly every call's is, so it
    /// costs them nothing).
    fn late(&mut self, cx: &mut Context<'_>) -> Option<Duration> {
        let wait = self.wait?;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
        timer.as_mut().poll(cx).is_ready().then_some(wait)
    }

    /// Ends the body with `status`, giving back what it held.
    fn fail(&mut self, status: tonic::Status) -> Poll<Option<Result<Frame<Bytes>, tower::BoxError>>> {
        self.failed = true;
        let _ = self.budgets.hold(0);
        Poll::Ready(Some(Err(Box::new(status))))
    }

    fn new(inner: B, cap: usize, whole: bool, budgets: Budgets) -> Self {
        Capped {
            inner,
            cap,
            whole,
            seen: 0,
            prefix: [0; 5],
            prefix_seen: 0,
            left: 0,
            unfinished: 0,
            budgets,
            failed: false,
            wait: None,
            timer: None,
        }
    }

    /// Follows the messages through `data`; an error ends the call.
    fn follow(&mut self, mut data: &[u8]) -> Result<(), Refusal> {
        if self.whole {
            self.seen = self.seen.saturating_add(data.len());
            if self.seen > self.cap {
                return Err(Refusal::TooLarge { cap: self.cap });
            }
        }
        while !data.is_empty() {
            if self.prefix_seen < 5 {
                let n = (5 - self.prefix_seen).min(data.len());
                self.prefix[self.prefix_seen..self.prefix_seen + n].copy_from_slice(&data[..n]);
                (self.prefix_seen, self.unfinished, data) = (self.prefix_seen + n, self.unfinished + n, &data[n..]);
                if self.prefix_seen < 5 {
                    break;
                }
                let len = u32::from_be_bytes([self.prefix[1], self.prefix[2], self.prefix[3], self.prefix[4]]);
                let len = len as usize;
                // A message declared over the cap is refused before its
                // bytes arrive, in a unary call too: the decoder behind
                // would refuse a message over its own, larger limit with
                // another code (OUT_OF_RANGE) as soon as it read the prefix.
                if len.saturating_add(5) > self.cap {
                    return Err(Refusal::TooLarge { cap: self.cap });
                }
                self.left = len;
            }
            let n = self.left.min(data.len());
            (self.left, self.unfinished, data) = (self.left - n, self.unfinished + n, &data[n..]);
            if self.left == 0 {
                // A whole message: the decoder takes it now.
                (self.prefix_seen, self.unfinished) = (0, 0);
            }
        }
        self.budgets.hold(self.unfinished)
    }
}

impl<B> Body for Capped<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tower::BoxError>,
{
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(refusal) = this.follow(data)
                {
                    return this.fail(tonic::Status::from(refusal));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                let _ = this.budgets.hold(0);
                Poll::Ready(None)
            }
            Poll::Pending => match this.late(cx) {
                Some(wait) => {
                    metrics::counter!(crate::metrics::REQUESTS_TIMED_OUT).increment(1);
                    let why = format!("the request did not arrive whole within {wait:?} (--request-timeout)");
                    this.fail(tonic::Status::deadline_exceeded(why))
                }
                None => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(cap: usize, whole: bool, port: &Arc<Budget>, conn: &Arc<Budget>) -> Capped<()> {
        let budgets = Budgets { port: port.clone(), connection: Some(conn.clone()), held: 0 };
        Capped::new((), cap, whole, budgets)
    }

    fn framed(len: usize) -> Vec<u8> {
        let mut out = vec![0];
        out.extend((len as u32).to_be_bytes());
        out.extend(std::iter::repeat_n(7, len));
        out
    }

    #[test]
    fn a_stream_caps_each_message_and_a_unary_body_the_whole() {
        let (port, conn) = (Budget::new(1 << 20), Budget::new(1 << 20));
        let mut stream = capped(100, false, &port, &conn);
        for _ in 0..1_000 {
            stream.follow(&framed(90)).expect("each message is under the cap");
        }
        let mut over = capped(100, false, &port, &conn);
        // Refused from the prefix alone, before its bytes arrive.
        assert!(matches!(over.follow(&framed(96)[..5]), Err(Refusal::TooLarge { cap: 100 })));
        let mut unary = capped(100, true, &port, &conn);
        unary.follow(&framed(40)).unwrap();
        assert!(matches!(unary.follow(&framed(60)), Err(Refusal::TooLarge { cap: 100 })), "the whole body counts");
    }

    #[test]
    fn unfinished_bytes_are_held_until_the_message_ends_or_the_body_goes() {
        let (port, conn) = (Budget::new(1 << 20), Budget::new(1 << 20));
        let message = framed(1000);
        let mut a = capped(1 << 20, false, &port, &conn);
        a.follow(&message[..300]).unwrap();
        assert_eq!((port.held(), conn.held()), (300, 300));
        a.follow(&message[300..700]).unwrap();
        assert_eq!(port.held(), 700);
        // The rest, and the next message's first bytes in the same frame.
        a.follow(&[&message[700..], &message[..10]].concat()).unwrap();
        assert_eq!(port.held(), 10, "only the next message's prefix and first bytes");
        let mut b = capped(1 << 20, false, &port, &conn);
        b.follow(&message[..100]).unwrap();
        assert_eq!(port.held(), 110);
        drop(a);
        assert_eq!((port.held(), conn.held()), (100, 100), "a stream that ends gives back what it held");
        drop(b);
        assert_eq!((port.held(), conn.held()), (0, 0));
        // A whole message in one frame holds nothing.
        let mut c = capped(1 << 20, true, &port, &conn);
        c.follow(&message).unwrap();
        assert_eq!(port.held(), 0);
    }

    #[test]
    fn a_budget_refuses_what_would_pass_it_and_the_other_budget_is_untouched() {
        let port = Budget::new(1000);
        let (conn1, conn2) = (Budget::new(600), Budget::new(600));
        let message = framed(2000);
        let mut a = capped(1 << 20, false, &port, &conn1);
        a.follow(&message[..500]).unwrap();
        let mut b = capped(1 << 20, false, &port, &conn1);
        let refused = b.follow(&message[..200]);
        assert!(matches!(refused, Err(Refusal::Unfinished { max: 600, of: "this connection" })), "{refused:?}");
        assert_eq!((port.held(), conn1.held()), (500, 500), "a refusal takes nothing");
        let mut c = capped(1 << 20, false, &port, &conn2);
        c.follow(&message[..450]).unwrap();
        let mut d = capped(1 << 20, false, &port, &conn2);
        let refused = d.follow(&message[..100]);
        assert!(matches!(refused, Err(Refusal::Unfinished { max: 1000, of: "the server" })), "{refused:?}");
        assert_eq!((port.held(), conn2.held()), (950, 450), "the connection's share is given back");
        // A message that arrives whole needs no budget, even when none is left.
        let mut e = capped(1 << 20, true, &port, &conn2);
        e.follow(&framed(3000)).expect("a whole message holds nothing");
    }
}
