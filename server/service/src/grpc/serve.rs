//! Serving gRPC (HTTP/2) over the port's connections, fairly.
//!
//! A stock HTTP/2 server spawns a task per stream. With many streams in
//! flight on few worker threads, those tasks overflow the worker's local run
//! queue into the shared one, where they wait far longer, and a connection
//! whose stream just finished is polled again at once: some connections are
//! served much less often than others (with one worker, 16 connections x 64
//! streams: median 4 ms, p99 117 ms).
//!
//! Here every connection runs its streams itself, in its own task: a stream
//! is polled by its connection, and a connection that has done a round of
//! work (read, run its streams, written) yields to the others. The runtime
//! then only schedules connections, in turn. No task per call is spawned.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt;
use tracing::Instrument;

use crate::listen::drain::{Activity, Drain, InProgress};
use crate::listen::{self, Peer, Port};

type Stream = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The streams one connection has opened and not yet finished, and those
/// of the whole port (`open`), each counted for as long as it lives, also
/// in the connection's `activity` (for --idle-timeout).
#[derive(Clone)]
struct Streams {
    new: Arc<Mutex<Vec<Stream>>>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    activity: Activity,
}

impl<F> hyper::rt::Executor<F> for Streams
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        self.open.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let counted = (Counted(self.open.clone()), self.activity.open());
        let stream = async move {
            let _counted = counted;
            stream.await
        };
        self.new.lock().unwrap_or_else(|e| e.into_inner()).push(Box::pin(stream));
    }
}

/// A connection and its streams, driven by one task.
struct Driven<C> {
    conn: Pin<Box<C>>,
    conn_done: Option<Result<(), hyper::Error>>,
    new: Arc<Mutex<Vec<Stream>>>,
    running: FuturesUnordered<Stream>,
}

impl<C> Driven<C>
where
    C: Future<Output = Result<(), hyper::Error>>,
{
    fn poll_conn(&mut self, cx: &mut Context<'_>) {
        if self.conn_done.is_none()
            && let Poll::Ready(r) = self.conn.as_mut().poll(cx)
        {
            self.conn_done = Some(r);
        }
    }

    /// Takes the streams the connection opened; whether there were any.
    fn adopt(&mut self) -> bool {
        let new = std::mem::take(&mut *self.new.lock().unwrap_or_else(|e| e.into_inner()));
        let any = !new.is_empty();
        self.running.extend(new);
        any
    }
}

impl<C> Future for Driven<C>
where
    C: Future<Output = Result<(), hyper::Error>>,
{
    type Output = Result<(), hyper::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // One round: read and accept streams, run them, write their answers.
        this.poll_conn(cx);
        let mut busy = this.adopt();
        while let Poll::Ready(Some(())) = this.running.poll_next_unpin(cx) {
            busy = true;
        }
        if busy {
            this.poll_conn(cx);
            busy = this.adopt();
        }
        match &this.conn_done {
            Some(_) if this.running.is_empty() && !busy => Poll::Ready(this.conn_done.take().expect("checked")),
            _ => {
                if busy {
                    // Streams opened while writing: run them on the next turn,
                    // after the other connections have had theirs.
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }
}

/// A stream counted among those open on the port, until it ends.
struct Counted(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Serves the gRPC `service` on `port` until `stop` completes; then waits for
/// the connections in flight (the caller bounds how long).
pub async fn serve<S>(port: Port, service: S, stop: impl Future<Output = ()>)
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    let limits = port.limits;
    let streams = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut incoming = listen::accept(port);
    let graceful = GracefulShutdown::new();
    let drain = Drain::new();
    tokio::pin!(stop);
    while let Some(io) = listen::next_until(&mut incoming, stop.as_mut()).await {
        let peer: Peer = io.peer().clone();
        let calls = InProgress::default();
        let budget = super::size::ConnectionBudget(super::size::Budget::new(limits.unfinished_bytes_per_connection));
        let service = service.clone().map_request(move |req: http::Request<hyper::body::Incoming>| {
            let mut req = req.map(tonic::body::Body::new);
            req.extensions_mut().insert(peer.clone());
            req.extensions_mut().insert(budget.clone());
            req
        });
        let (open, in_progress) = (streams.clone(), calls.clone());
        let service = tower::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let span = crate::traces::rpc_span(req.headers(), req.uri().path());
            // Streams open, this one included: hyper hands the stream to
            // the executor, which counts it, and this runs when the stream
            // is first polled (TowerToHyperService calls the tower service
            // from its future).
            let refused = (open.load(std::sync::atomic::Ordering::Acquire) > limits.max_streams).then(|| {
                let why = format!("{} calls are in flight (--max-streams); retry", limits.max_streams);
                tonic::Status::resource_exhausted(why).into_http()
            });
            let call = service.clone().oneshot(req);
            in_progress
                .count(async move {
                    match refused {
                        Some(refused) => Ok::<_, S::Error>(refused),
                        None => call.await,
                    }
                })
                .instrument(span)
        });
        let activity = Activity::new();
        let streams = Streams { new: Default::default(), open: streams.clone(), activity: activity.clone() };
        let mut builder = hyper::server::conn::http2::Builder::new(streams.clone());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .keep_alive_interval(limits.keepalive_interval)
            .keep_alive_timeout(limits.keepalive_timeout);
        let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        let driven =
            Driven { conn: Box::pin(conn), conn_done: None, new: streams.new, running: FuturesUnordered::new() };
        drain.spawn("grpc", driven, calls, (activity, limits.idle_timeout));
    }
    drain.start();
    graceful.shutdown().await;
}
