//! A tower layer for tonic services: each call is asked of Floodgate under its
//! method path (`/pkg.Service/Method`), with descriptors from metadata; a
//! denial is answered with a gRPC status (`RESOURCE_EXHAUSTED` for limits,
//! `UNAVAILABLE` for an open circuit or shedding) and `grpc-retry-pushback-ms`.
//! A shaping `wait` is waited out before the call. Calls that end in
//! `UNAVAILABLE`, `INTERNAL`, `UNKNOWN`, `DEADLINE_EXCEEDED` or `DATA_LOSS`
//! (seen in the response headers, as unary errors are sent), errors, and calls
//! dropped before they finish (timeouts) are reported as failures. A question
//! Floodgate refuses (bad input) is logged and the call served unprotected.
//!
//! ```no_run
//! # fn wrap<S>(svc: S) -> Result<floodgate_client::grpc::FloodgateGrpc<S>, floodgate_client::Error> {
//! use floodgate_client::{Client, grpc::FloodgateGrpcLayer};
//! use tower::Layer;
//!
//! let client = Client::connect("http://127.0.0.1:50051")?;
//! Ok(FloodgateGrpcLayer::new(client).descriptor_metadata("x-tenant", "tenant")?.layer(svc))
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tower::{Layer, Service};

use crate::client::Client;
use crate::decision::{Acquire, Outcome, Verdict};
use crate::error::Error;
use crate::in_flight::InFlight;

#[derive(Clone)]
pub struct FloodgateGrpcLayer {
    client: Client,
    metadata: Arc<Vec<(http::HeaderName, String)>>,
}

#[derive(Clone)]
pub struct FloodgateGrpc<S> {
    inner: S,
    layer: FloodgateGrpcLayer,
}

impl FloodgateGrpcLayer {
    pub fn new(client: Client) -> Self {
        FloodgateGrpcLayer { client, metadata: Arc::new(Vec::new()) }
    }

    /// The value of metadata key `key` becomes descriptor `descriptor`. An
    /// invalid key is an [`Error::InvalidHeader`].
    pub fn descriptor_metadata(mut self, key: &str, descriptor: &str) -> Result<Self, Error> {
        let name = crate::error::header_name(key)?;
        Arc::make_mut(&mut self.metadata).push((name, descriptor.into()));
        Ok(self)
    }
}

impl<S> Layer<S> for FloodgateGrpcLayer {
    type Service = FloodgateGrpc<S>;

    fn layer(&self, inner: S) -> FloodgateGrpc<S> {
        FloodgateGrpc { inner, layer: self.clone() }
    }
}

impl<S, B, RB> Service<Request<B>> for FloodgateGrpc<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    B: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let mut ask = Acquire::new(req.uri().path());
            for (key, descriptor) in layer.metadata.iter() {
                if let Some(v) = req.headers().get(key).and_then(|v| v.to_str().ok()) {
                    ask = ask.descriptor(descriptor.clone(), v);
                }
            }
            let decision = match layer.client.acquire(&ask).await {
                Ok(d) => d,
                Err(e) => {
                    // Bad input (say, an over-long metadata value): serve unprotected, loudly.
                    tracing::warn!(resource = ask.resource(), error = %e, "Floodgate refused the question; serving anyway");
                    return inner.call(req).await;
                }
            };
            if !decision.is_allowed() {
                let code = match decision.verdict {
                    Verdict::RateLimited | Verdict::ConcurrencyLimited => tonic::Code::ResourceExhausted,
                    _ => tonic::Code::Unavailable,
                };
                let mut response = Response::new(RB::default());
                let h = response.headers_mut();
                h.insert("content-type", HeaderValue::from_static("application/grpc"));
                h.insert("grpc-status", HeaderValue::from(code as i32));
                if let Ok(m) = HeaderValue::from_str(&percent_encode(&decision.reason)) {
                    h.insert("grpc-message", m);
                }
                h.insert("grpc-retry-pushback-ms", HeaderValue::from(decision.retry_after.as_millis() as u64));
                return Ok(response);
            }
            if !decision.wait.is_zero() {
                tokio::time::sleep(decision.wait).await;
            }
            let in_flight = decision.permit.clone().map(|p| InFlight::new(&layer.client, p));
            let result = inner.call(req).await;
            if let Some(in_flight) = in_flight {
                in_flight.finish(match &result {
                    Ok(r) => classify(r.headers()),
                    Err(_) => Outcome::Failure,
                });
            }
            result
        })
    }
}

fn classify(headers: &http::HeaderMap) -> Outcome {
    use tonic::Code::*;
    let code = headers.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i32>().ok());
    match code.map(tonic::Code::from) {
        Some(Unavailable | Internal | Unknown | DeadlineExceeded | DataLoss) => Outcome::Failure,
        _ => Outcome::Success,
    }
}

/// grpc-message is percent-encoded (gRPC over HTTP/2).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| if (0x20..0x7f).contains(&b) && b != b'%' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}
