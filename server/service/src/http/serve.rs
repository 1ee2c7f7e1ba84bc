//! Serving the HTTP router over the port's connections (see
//! [`listen`](crate::listen)): HTTP/1.1 and HTTP/2, a deadline for an
//! HTTP/1 request head (a slowloris client is cut off), and a graceful stop.
//! Every request carries the [`Peer`] it came from.

use std::future::Future;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt;

use crate::listen::drain::{Activity, Drain, InProgress, Open};
use crate::listen::{self, Peer, Port};

/// Serves `router` on `port` until `stop` completes; then waits for the
/// connections in flight (the caller bounds how long).
pub async fn serve(port: Port, router: Router, stop: impl Future<Output = ()>) {
    let limits = port.limits;
    let mut incoming = listen::accept(port);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    let graceful = GracefulShutdown::new();
    let drain = Drain::new();
    tokio::pin!(stop);
    while let Some(io) = listen::next_until(&mut incoming, stop.as_mut()).await {
        let peer: Peer = io.peer().clone();
        let calls = InProgress::default();
        let in_progress = calls.clone();
        let activity = Activity::new();
        let open = activity.clone();
        let service = router.clone().map_request(move |mut req: http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(peer.clone());
            req
        });
        let service = tower::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            // Open from the request until the answer's last byte (an event
            // stream for as long as it lasts).
            let guard = open.open();
            let answered = in_progress.count(service.clone().oneshot(req));
            async move {
                let response = answered.await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| axum::body::Body::new(Tracked { body, _open: guard })),
                )
            }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service));
        let connection = graceful.watch(connection.into_owned());
        drain.spawn("http", connection, calls, (activity, limits.idle_timeout));
    }
    drain.start();
    graceful.shutdown().await;
}

/// An answer's body, counted open on its connection until it ends.
struct Tracked {
    body: axum::body::Body,
    _open: Open,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
