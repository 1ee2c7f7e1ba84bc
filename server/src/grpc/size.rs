//! A request size cap per RPC, checked as the body arrives, before anything
//! is decoded: one Acquire is a few kilobytes at most, a rules upload up to a
//! mebibyte. A body over its method's cap ends the call RESOURCE_EXHAUSTED,
//! naming the cap.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

use super::rpc::{self, Rpc};
use super::status::Refusal;

/// The cap for a method path: its row's in [`Rpc`], else the smallest.
pub fn cap(path: &str) -> usize {
    Rpc::from_path(path).map_or(rpc::UNKNOWN_CAP, Rpc::cap)
}

#[derive(Clone, Copy, Debug, Default)]
pub struct SizeLayer;

#[derive(Clone, Debug)]
pub struct Sized<S> {
    inner: S,
}

impl<S> Layer<S> for SizeLayer {
    type Service = Sized<S>;

    fn layer(&self, inner: S) -> Sized<S> {
        Sized { inner }
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
        let cap = cap(req.uri().path());
        let req = req.map(|body| tonic::body::Body::new(Capped { inner: body, cap, seen: 0 }));
        self.inner.call(req)
    }
}

/// A request body that fails once more than `cap` bytes have arrived.
struct Capped<B> {
    inner: B,
    cap: usize,
    seen: usize,
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
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len();
                    if this.seen > this.cap {
                        let status = tonic::Status::from(Refusal::TooLarge { cap: this.cap });
                        return Poll::Ready(Some(Err(Box::new(status))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
