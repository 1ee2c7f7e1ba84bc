//! The service: ask, then answer the denial or call through and report.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower::Service;

use super::headers::{denial_body, denial_status, rate_limit_headers};
use super::layer::FloodgateLayer;
use crate::client::Client;
use crate::decision::{Outcome, Permit};

/// The service [`FloodgateLayer`] makes.
#[derive(Clone)]
pub struct Floodgate<S> {
    pub(crate) inner: S,
    pub(crate) layer: FloodgateLayer,
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
        let (client, config) = (self.layer.client.clone(), self.layer.config.clone());
        Box::pin(async move {
            let ask = config.describe(&req);
            let decision = match client.acquire(&ask).await {
                Ok(d) => d,
                Err(e) => {
                    // Bad input (say, an over-long header): serve unprotected, loudly.
                    tracing::warn!(resource = ask.resource(), error = %e, "Floodgate refused the question; serving anyway");
                    return inner.call(req).await;
                }
            };
            if !decision.is_allowed() {
                let mut response = Response::new(RB::from(denial_body(&decision)));
                *response.status_mut() = denial_status(decision.verdict);
                rate_limit_headers(&decision, response.headers_mut());
                response
                    .headers_mut()
                    .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
                return Ok(response);
            }
            if !decision.wait.is_zero() {
                tokio::time::sleep(decision.wait).await;
            }
            let report = decision.permit.clone().map(|p| Report::new(&client, p));
            let result = inner.call(req).await;
            if let Some(report) = report {
                let outcome = match &result {
                    Ok(r) => (config.classify)(r.status()),
                    Err(_) => Outcome::Failure,
                };
                report.send(outcome);
            }
            result.map(|mut r| {
                rate_limit_headers(&decision, r.headers_mut());
                r
            })
        })
    }
}

/// Reports the call's outcome; a call dropped before it finished (an outer
/// timeout, a client gone) is reported as a failure.
struct Report {
    client: Client,
    permit: Option<Permit>,
    start: Instant,
}

impl Report {
    fn new(client: &Client, permit: Permit) -> Self {
        Report { client: client.clone(), permit: Some(permit), start: Instant::now() }
    }

    fn send(mut self, outcome: Outcome) {
        if let Some(p) = self.permit.take() {
            self.client.report(&p, outcome, Some(self.start.elapsed()));
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            self.client.report(&p, Outcome::Failure, Some(self.start.elapsed()));
        }
    }
}
