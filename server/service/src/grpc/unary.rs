//! The two calls every protected request makes, `Acquire` and Envoy's
//! `ShouldRateLimit`, served as plain unary gRPC over HTTP/2 without tonic's
//! general streaming machinery (a decoder state machine, an encoder stream,
//! a metadata map built and dropped per call): the body is read, its one
//! length-prefixed message handed over as bytes, and the answer written
//! straight into the one data frame that precedes the `grpc-status: 0`
//! trailers. Failures are trailers-only responses, as tonic writes them.
//!
//! What tonic would refuse is refused the same way, before the call is
//! handled: no message at all, a message cut short, a compressed message
//! (this server accepts none), a bad compression flag. Messages after the
//! first are decoded and then ignored, as tonic's unary calls do (one that
//! is cut short or undecodable fails the call). The body's size cap is the
//! layer's in front.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body as _, Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;

/// A message to answer with, written into the response's data frame.
pub(crate) trait Reply {
    /// Writes the message (no length prefix).
    fn write(&self, buf: &mut BytesMut);
    /// About how long it is, to size the frame.
    fn size_hint(&self) -> usize;
}

/// Decodes a message after the first, only to see that it decodes.
pub type Extra = fn(&[u8]) -> Result<(), prost::DecodeError>;

/// Serves one unary call: `handle` gets the request's message and answers;
/// `extra` decodes any message after it.
pub async fn serve<R, F, Fut>(req: http::Request<Body>, extra: Extra, handle: F) -> http::Response<Body>
where
    R: Reply,
    F: FnOnce(Bytes) -> Fut,
    Fut: Future<Output = Result<R, Status>>,
{
    let (parts, body) = req.into_parts();
    let message = match read(body).await.and_then(|bytes| message(&parts.headers, bytes, extra)) {
        Ok(m) => m,
        Err(status) => return status.into_http(),
    };
    match handle(message).await {
        Ok(reply) => respond(&reply),
        Err(status) => status.into_http(),
    }
}

/// The whole request body (one data frame, as a client sends a unary call,
/// is taken as it is; more are joined).
async fn read(mut body: Body) -> Result<Bytes, Status> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame?;
        let Ok(data) = frame.into_data() else { continue };
        match (&mut joined, first.take()) {
            (Some(j), _) => j.put(data),
            (None, None) => first = Some(data),
            (None, Some(f)) => {
                let mut j = BytesMut::with_capacity(f.len() + data.len());
                j.put(f);
                j.put(data);
                joined = Some(j);
            }
        }
    }
    Ok(joined.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze))
}

/// The first length-prefixed message of a body, as tonic reads it (and
/// the rest, decoded by `extra`).
fn message(headers: &HeaderMap, mut bytes: Bytes, extra: Extra) -> Result<Bytes, Status> {
    if bytes.is_empty() {
        return Err(Status::internal("Missing request message."));
    }
    let first = frame(headers, &bytes)?;
    let mut rest = &bytes[5 + first..];
    while !rest.is_empty() {
        let len = frame(headers, rest)?;
        extra(&rest[5..5 + len]).map_err(undecodable)?;
        rest = &rest[5 + len..];
    }
    let _ = bytes.split_to(5);
    bytes.truncate(first);
    Ok(bytes)
}

/// A message that does not decode, as this server's codec answers it.
pub fn undecodable(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("the message cannot be decoded: {e}"))
}

/// The length of the whole, uncompressed message `bytes` starts with.
fn frame(headers: &HeaderMap, bytes: &[u8]) -> Result<usize, Status> {
    if bytes.len() < 5 {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    let (flag, len) = (bytes[0], u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize);
    match flag {
        0 => {}
        1 => {
            return Err(match headers.get("grpc-encoding").and_then(|v| v.to_str().ok()) {
                Some(encoding) if encoding != "identity" => {
                    Status::unimplemented(format!("Content is compressed with `{encoding}` which isn't supported"))
                }
                _ => Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ),
            });
        }
        other => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {other} (valid flags are 0 and 1), while sending request"
            )));
        }
    }
    if bytes.len() - 5 < len {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    Ok(len)
}

/// `content-type: application/grpc`, one data frame, `grpc-status: 0`.
fn respond<R: Reply>(reply: &R) -> http::Response<Body> {
    let mut frame = BytesMut::with_capacity(5 + reply.size_hint());
    frame.put_slice(&[0; 5]);
    reply.write(&mut frame);
    let len = u32::try_from(frame.len() - 5).unwrap_or(u32::MAX);
    frame[1..5].copy_from_slice(&len.to_be_bytes());
    let body = Body::new(OneMessage { data: Some(frame.freeze()), trailers: true });
    let mut response = http::Response::new(body);
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    response
}

/// A body of one data frame, then the OK trailers.
struct OneMessage {
    data: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for OneMessage {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut self.trailers) {
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && !self.trailers
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
