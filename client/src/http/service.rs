//! The service: ask, then answer the denial or call through and report.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

use http::{Request, Response};
use tower::Service;

use super::config::Config;
use super::headers::{denial_body, denial_status, rate_limit_headers};
use crate::client::Client;
use crate::decision::Outcome;
use crate::in_flight::InFlight;

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
            // Reports a call dropped before it finishes (a timeout, a client gone) as a failure.
            let report = decision.permit.clone().map(|p| InFlight::new(&client, p));
            let result = inner.call(req).await;
            if let Some(report) = report {
                let outcome = match &result {
                    Ok(r) => (config.classify)(r.status()),
                    Err(_) => Outcome::Failure,
                };
                report.finish(outcome);
            }
            result.map(|mut r| {
                rate_limit_headers(&decision, r.headers_mut());
                r
            })
        })
    }
}
