//! What the HTTP layer asks for a request, how it judges the response, and
//! how it answers a denial.

use std::net::SocketAddr;
use std::sync::Arc;

use http::request::Parts;
use http::{Response, StatusCode};

use super::route::Routes;
use crate::decision::{Acquire, Decision, Priority};
use crate::permit::Outcome;

pub(crate) type Describe = Arc<dyn Fn(&Parts) -> Option<Acquire> + Send + Sync>;
pub(crate) type ClassifyFn = Arc<dyn Fn(StatusCode) -> Outcome + Send + Sync>;
pub(crate) type OnDenied = Arc<dyn Fn(&Decision) -> Response<String> + Send + Sync>;
pub(crate) type PriorityFn = Arc<dyn Fn(&Parts) -> Priority + Send + Sync>;
pub(crate) type EstimateFn = Arc<dyn Fn(&Parts) -> u32 + Send + Sync>;

/// Where a layer reads a request's priority: a header (`sheddable`...; a
/// missing or unknown value is the default, CRITICAL), or a closure.
#[derive(Clone, Default)]
pub(crate) enum PriorityFrom {
    #[default]
    Default,
    Header(http::HeaderName),
    With(PriorityFn),
}

impl PriorityFrom {
    pub(crate) fn of(&self, req: &Parts) -> Priority {
        match self {
            PriorityFrom::Default => Priority::default(),
            PriorityFrom::Header(h) => {
                req.headers.get(h).and_then(|v| v.to_str().ok()).and_then(Priority::parse).unwrap_or_default()
            }
            PriorityFrom::With(f) => f(req),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) routes: Routes,
    pub(crate) headers: Vec<(http::HeaderName, String)>,
    pub(crate) client_ip: Option<String>,
    /// Use axum's `MatchedPath` as the route when no template matches.
    pub(crate) matched_path: bool,
    /// Replaces everything above: the question for a request, or `None` to
    /// let it through unasked.
    pub(crate) describe: Option<Describe>,
    pub(crate) classify: ClassifyFn,
    pub(crate) on_denied: Option<OnDenied>,
    /// Every question's cost is an estimate, settled from this response
    /// header (or an [`ActualCost`](super::ActualCost) extension).
    pub(crate) actual_cost_header: Option<http::HeaderName>,
    /// Each request's estimated cost, beside the settings above.
    pub(crate) estimate: Option<EstimateFn>,
    pub(crate) priority: PriorityFrom,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            routes: Routes::default(),
            headers: Vec::new(),
            client_ip: None,
            matched_path: true,
            describe: None,
            classify: Arc::new(|s: StatusCode| if s.is_server_error() { Outcome::Failure } else { Outcome::Success }),
            on_denied: None,
            actual_cost_header: None,
            estimate: None,
            priority: PriorityFrom::Default,
        }
    }
}

impl Config {
    /// The question for one request; `None` lets it through unasked.
    pub(crate) fn describe(&self, req: &Parts) -> Option<Acquire> {
        if let Some(describe) = &self.describe {
            return describe(req);
        }
        let resource = format!("{} {}", req.method, self.route(req));
        let mut ask = Acquire::new(resource).priority(self.priority.of(req));
        if let Some(estimate) = &self.estimate {
            ask = ask.cost(estimate(req));
        }
        for (header, descriptor) in &self.headers {
            if let Some(v) = req.headers.get(header).and_then(|v| v.to_str().ok()) {
                ask = ask.descriptor(descriptor.clone(), v);
            }
        }
        if let Some(descriptor) = &self.client_ip
            && let Some(ip) = client_ip(req)
        {
            ask = ask.descriptor(descriptor.clone(), ip);
        }
        Some(ask)
    }

    /// A template that matches, else the route axum matched, else the path
    /// with its ids replaced.
    fn route(&self, req: &Parts) -> String {
        let path = req.uri.path();
        if let Some(template) = self.routes.template(path) {
            return template.to_string();
        }
        #[cfg(feature = "axum")]
        if self.matched_path
            && let Some(m) = req.extensions.get::<axum::extract::MatchedPath>()
        {
            return m.as_str().to_string();
        }
        self.routes.resolve(path)
    }
}

fn client_ip(req: &Parts) -> Option<String> {
    let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(first) = header("x-forwarded-for").and_then(|v| v.split(',').next()) {
        return Some(first.trim().to_string());
    }
    if let Some(ip) = header("x-real-ip") {
        return Some(ip.trim().to_string());
    }
    let peer = req.extensions.get::<SocketAddr>().copied();
    #[cfg(feature = "axum")]
    let peer = peer.or_else(|| req.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>().map(|c| c.0));
    peer.map(|a| a.ip().to_string())
}
