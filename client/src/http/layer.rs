//! The layer and its settings. Every setting can be changed on a clone; a
//! setting that cannot be used (a bad header name) is an error, never a panic.

use std::sync::Arc;

use http::request::Parts;
use http::{Response, StatusCode};
use tower::Layer;

use super::config::{Config, PriorityFrom};
use super::route::Routes;
use super::service::Floodgate;
use crate::client::Client;
use crate::decision::{Acquire, Decision, Priority};
use crate::error::Error;
use crate::permit::Outcome;

/// Protects every request of the wrapped service with Floodgate.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), floodgate_client::Error> {
/// use floodgate_client::{Acquire, Client, Outcome};
/// use floodgate_client::http::FloodgateLayer;
///
/// let client = Client::connect("http://127.0.0.1:50051")?;
/// let tenant_limits = FloodgateLayer::new(client)
///     // The question for each request, or None to let it through unasked.
///     .describe(|req| {
///         let tenant = req.headers.get("x-tenant")?.to_str().ok()?;
///         (req.uri.path() != "/healthz").then(|| Acquire::new("api").descriptor("tenant", tenant))
///     })
///     // A closure may capture: 429s from upstream are failures too.
///     .classify(move |status| if status.is_server_error() || status.as_u16() == 429 { Outcome::Failure } else { Outcome::Success });
/// # let _ = tenant_limits;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FloodgateLayer {
    client: Client,
    config: Arc<Config>,
}

impl FloodgateLayer {
    pub fn new(client: Client) -> Self {
        FloodgateLayer { client, config: Arc::new(Config::default()) }
    }

    fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Route templates that resources are named after: `/api/orders/:id` or
    /// axum's `/api/orders/{id}` (and `{*rest}`). Without a matching template
    /// the route axum matched (`MatchedPath`) is used, else the path with its
    /// ids replaced by `:id`.
    pub fn routes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, templates: I) -> Self {
        self.config().routes = Routes::new(templates);
        self
    }

    /// Whether axum's `MatchedPath` names the resource when no template
    /// matches (default on).
    pub fn matched_path(mut self, on: bool) -> Self {
        self.config().matched_path = on;
        self
    }

    /// The value of request header `header` becomes descriptor `descriptor`.
    /// An invalid header name is an [`Error::InvalidHeader`].
    pub fn descriptor_header(mut self, header: &str, descriptor: &str) -> Result<Self, Error> {
        let name = crate::error::header_name(header)?;
        self.config().headers.push((name, descriptor.into()));
        Ok(self)
    }

    /// The client's IP becomes descriptor `descriptor`: the first
    /// `X-Forwarded-For` address, else `X-Real-IP`, else the peer address (a
    /// `SocketAddr` or axum's `ConnectInfo<SocketAddr>` in the request's
    /// extensions).
    pub fn client_ip(mut self, descriptor: &str) -> Self {
        self.config().client_ip = Some(descriptor.into());
        self
    }

    /// Builds the question from the request instead (method, URI, headers,
    /// extensions); `None` lets the request through unasked (health checks).
    /// Replaces the routes, headers and client IP settings.
    pub fn describe(mut self, f: impl Fn(&Parts) -> Option<Acquire> + Send + Sync + 'static) -> Self {
        self.config().describe = Some(Arc::new(f));
        self
    }

    /// How a response's status is reported (default: 5xx is a failure).
    pub fn classify(mut self, f: impl Fn(StatusCode) -> Outcome + Send + Sync + 'static) -> Self {
        self.config().classify = Arc::new(f);
        self
    }

    /// Reserve, then settle: each question's cost is an estimate
    /// ([`Acquire::settle`](crate::Acquire::settle)), and the response says
    /// what the call really cost, in response header `header` (a whole
    /// number) or as an [`ActualCost`](super::ActualCost) response extension
    /// (kept from the client). Without either, the estimate stands. An
    /// invalid header name is an [`Error::InvalidHeader`].
    pub fn actual_cost_header(mut self, header: &str) -> Result<Self, Error> {
        self.config().actual_cost_header = Some(crate::error::header_name(header)?);
        Ok(self)
    }

    /// What each request is estimated to cost (by default 1), beside
    /// [`routes`](Self::routes), [`descriptor_header`](Self::descriptor_header)
    /// and [`client_ip`](Self::client_ip): an LLM route's `max_tokens`, an
    /// upload's `content-length`. With [`actual_cost_header`](Self::actual_cost_header)
    /// the response then settles it. Not used with [`describe`](Self::describe),
    /// whose question carries its own cost.
    pub fn estimate(mut self, f: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.config().estimate = Some(Arc::new(f));
        self
    }

    /// Each request's priority from this header (`critical_plus`,
    /// `critical`, `sheddable_plus`, `sheddable`; missing or unknown:
    /// critical). Take it from a header only your own edge sets: a caller
    /// who may set it may claim `critical_plus`. An invalid name is an
    /// [`Error::InvalidHeader`].
    pub fn priority_header(mut self, header: &str) -> Result<Self, Error> {
        self.config().priority = PriorityFrom::Header(crate::error::header_name(header)?);
        Ok(self)
    }

    /// Each request's priority from a closure (a route's importance, the
    /// caller's tier).
    pub fn priority(mut self, f: impl Fn(&Parts) -> Priority + Send + Sync + 'static) -> Self {
        self.config().priority = PriorityFrom::With(Arc::new(f));
        self
    }

    /// The answer to a denied request, instead of the JSON default. The rate
    /// limit fields and `Retry-After` are added to it.
    pub fn on_denied(mut self, f: impl Fn(&Decision) -> Response<String> + Send + Sync + 'static) -> Self {
        self.config().on_denied = Some(Arc::new(f));
        self
    }
}

impl<S> Layer<S> for FloodgateLayer {
    type Service = Floodgate<S>;

    fn layer(&self, inner: S) -> Floodgate<S> {
        Floodgate::new(inner, self.client.clone(), self.config.clone())
    }
}
