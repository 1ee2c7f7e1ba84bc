//! A tower layer for tonic services: each call is asked of Floodgate under its
//! method path (`/pkg.Service/Method`), with descriptors from metadata; a
//! denial is answered with a gRPC status (`RESOURCE_EXHAUSTED` for limits,
//! `UNAVAILABLE` for an open circuit or shedding) and `grpc-retry-pushback-ms`.
//! A shaping `wait` is waited out before the call. Calls that end in
//! `UNAVAILABLE`, `INTERNAL`, `UNKNOWN`, `DEADLINE_EXCEEDED` or `DATA_LOSS`
//! (seen in the response headers, as unary errors are sent) and errors are
//! reported as failures (`classify` decides otherwise); a call dropped before
//! it finishes is reported as cancelled by its permit. `describe` builds the
//! question from the request, or skips it. A question Floodgate refuses (bad
//! input) is logged and the call served unprotected.
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
use crate::decision::{Acquire, Verdict};
use crate::error::Error;
use crate::permit::Outcome;

type Describe = Arc<dyn Fn(&http::request::Parts) -> Option<Acquire> + Send + Sync>;
type ClassifyFn = Arc<dyn Fn(Option<tonic::Code>) -> Outcome + Send + Sync>;

#[derive(Clone)]
pub struct FloodgateGrpcLayer {
    client: Client,
    metadata: Arc<Vec<(http::HeaderName, String)>>,
    describe: Option<Describe>,
    classify: ClassifyFn,
    priority: crate::http::PriorityFrom,
}

#[derive(Clone)]
pub struct FloodgateGrpc<S> {
    inner: S,
    layer: FloodgateGrpcLayer,
}

impl FloodgateGrpcLayer {
    pub fn new(client: Client) -> Self {
        FloodgateGrpcLayer {
            client,
            metadata: Arc::new(Vec::new()),
            describe: None,
            classify: Arc::new(classify),
            priority: Default::default(),
        }
    }

    /// Builds the question from the request (method path, metadata,
    /// extensions) instead; `None` lets the call through unasked.
    pub fn describe(mut self, f: impl Fn(&http::request::Parts) -> Option<Acquire> + Send + Sync + 'static) -> Self {
        self.describe = Some(Arc::new(f));
        self
    }

    /// How a call's status is reported: given the `grpc-status` the response
    /// headers carry (`None` for a streaming answer whose status comes later).
    pub fn classify(mut self, f: impl Fn(Option<tonic::Code>) -> Outcome + Send + Sync + 'static) -> Self {
        self.classify = Arc::new(f);
        self
    }

    /// The question for one call.
    fn question(&self, parts: &http::request::Parts) -> Option<Acquire> {
        if let Some(describe) = &self.describe {
            return describe(parts);
        }
        let mut ask = Acquire::new(parts.uri.path()).priority(self.priority.of(parts));
        for (key, descriptor) in self.metadata.iter() {
            if let Some(v) = parts.headers.get(key).and_then(|v| v.to_str().ok()) {
                ask = ask.descriptor(descriptor.clone(), v);
            }
        }
        Some(ask)
    }

    /// Each call's priority from this metadata key (`critical_plus`,
    /// `critical`, `sheddable_plus`, `sheddable`; missing or unknown:
    /// critical). Only from metadata your own side sets: a caller who may set
    /// it may claim `critical_plus`.
    pub fn priority_metadata(mut self, key: &str) -> Result<Self, Error> {
        self.priority = crate::http::PriorityFrom::Header(crate::error::header_name(key)?);
        Ok(self)
    }

    /// Each call's priority from a closure.
    pub fn priority(mut self, f: impl Fn(&http::request::Parts) -> crate::Priority + Send + Sync + 'static) -> Self {
        self.priority = crate::http::PriorityFrom::With(Arc::new(f));
        self
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
            let (parts, body) = req.into_parts();
            let ask = layer.question(&parts);
            let req = Request::from_parts(parts, body);
            let Some(ask) = ask else { return inner.call(req).await };
            let mut decision = match layer.client.acquire(&ask).await {
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
            // Dropped before it finishes, the permit reports the call as cancelled.
            let permit = decision.permit.take();
            let start = std::time::Instant::now();
            let result = inner.call(req).await;
            if let Some(permit) = permit {
                let outcome = match &result {
                    Ok(r) => (layer.classify)(status_of(r.headers())),
                    Err(_) => Outcome::Failure,
                };
                permit.report_latency(outcome, start.elapsed());
            }
            result
        })
    }
}

/// The status a response's headers carry (a trailers-only answer).
fn status_of(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let code = headers.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i32>().ok());
    code.map(tonic::Code::from)
}

/// The default: the codes of a failing server are failures.
fn classify(code: Option<tonic::Code>) -> Outcome {
    use tonic::Code::*;
    match code {
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
