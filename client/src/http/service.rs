//! The service: ask, then answer the denial or call through and report.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use tower::Service;

use super::config::Config;
use super::headers::{denial_body, denial_status, rate_limit_headers};
use crate::client::Client;
use crate::decision::Decision;
use crate::permit::Outcome;

/// The service [`FloodgateLayer`](super::FloodgateLayer) makes.
#[derive(Clone)]
pub struct Floodgate<S> {
    inner: S,
    client: Client,
    config: Arc<Config>,
}

impl<S> Floodgate<S> {
    pub(crate) fn new(inner: S, client: Client, config: Arc<Config>) -> Self {
        Floodgate { inner, client, config }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<Request<B>> for Floodgate<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    B: Send + 'static,
    RB: From<String> + Send + 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<RB>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone is not ready; the one that is goes with this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (client, config) = (self.client.clone(), self.config.clone());
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let ask = config.describe(&parts);
            let req = Request::from_parts(parts, body);
            let Some(mut ask) = ask else { return inner.call(req).await };
            if config.actual_cost_header.is_some() {
                ask = ask.settle();
            }
            let mut decision = match client.acquire(&ask).await {
                Ok(d) => d,
                Err(e) => {
                    // Bad input (say, an over-long header): serve unprotected, loudly.
                    tracing::warn!(resource = ask.resource(), error = %e, "Floodgate refused the question; serving anyway");
                    return inner.call(req).await;
                }
            };
            if !decision.is_allowed() {
                return Ok(denial(&decision, &config).map(RB::from));
            }
            if !decision.wait.is_zero() {
                tokio::time::sleep(decision.wait).await;
            }
            // Dropped before it finishes (a timeout, a client gone), the
            // permit reports the call as cancelled.
            let permit = decision.permit.take();
            let start = Instant::now();
            let result = inner.call(req).await;
            let mut result = result;
            if let Some(permit) = permit {
                let outcome = match &result {
                    Ok(r) => (config.classify)(r.status()),
                    Err(_) => Outcome::Failure,
                };
                let actual = match (&mut result, &config.actual_cost_header) {
                    (Ok(r), Some(header)) => actual_cost(r, header),
                    _ => None,
                };
                match actual {
                    Some(cost) => permit.report_cost(outcome, cost),
                    None => permit.report_latency(outcome, start.elapsed()),
                }
            }
            result.map(|mut r| {
                rate_limit_headers(&decision, r.headers_mut());
                r
            })
        })
    }
}

/// The answer to a denied request: the layer's own, or the JSON default,
/// with the rate limit fields.
fn denial(decision: &Decision, config: &Config) -> Response<String> {
    let mut response = match &config.on_denied {
        Some(f) => f(decision),
        None => {
            let mut r = Response::new(denial_body(decision));
            *r.status_mut() = denial_status(decision.verdict);
            r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
            r
        }
    };
    rate_limit_headers(decision, response.headers_mut());
    response
}

/// What a call really cost, set by the service on its response (see
/// [`FloodgateLayer::actual_cost_header`](super::FloodgateLayer::actual_cost_header)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActualCost(pub u64);

/// The response's actual cost: its extension (removed), else its header (kept).
fn actual_cost<RB>(r: &mut Response<RB>, header: &http::HeaderName) -> Option<u64> {
    if let Some(ActualCost(n)) = r.extensions_mut().remove::<ActualCost>() {
        return Some(n);
    }
    r.headers().get(header)?.to_str().ok()?.trim().parse().ok()
}
