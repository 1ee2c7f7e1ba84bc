//! The layer and its settings.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, StatusCode};
use tower::Layer;

use super::route::Routes;
use super::service::Floodgate;
use crate::client::Client;
use crate::decision::{Acquire, Outcome};

/// Protects every request of the wrapped service with Floodgate.
#[derive(Clone)]
pub struct FloodgateLayer {
    pub(crate) client: Client,
    pub(crate) config: Arc<Config>,
}

pub(crate) struct Config {
    routes: Routes,
    headers: Vec<(http::HeaderName, String)>,
    client_ip: Option<String>,
    pub(crate) classify: fn(StatusCode) -> Outcome,
}

impl FloodgateLayer {
    pub fn new(client: Client) -> Self {
        FloodgateLayer {
            client,
            config: Arc::new(Config {
                routes: Routes::default(),
                headers: Vec::new(),
                client_ip: None,
                classify: |s| if s.is_server_error() { Outcome::Failure } else { Outcome::Success },
            }),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::get_mut(&mut self.config).expect("configure the layer before cloning it")
    }

    /// Route templates (`/api/orders/:id`) that resources are named after.
    pub fn routes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, templates: I) -> Self {
        self.config().routes = Routes::new(templates);
        self
    }

    /// The value of request header `header` becomes descriptor `descriptor`.
    pub fn descriptor_header(mut self, header: &str, descriptor: &str) -> Self {
        let name = http::HeaderName::from_bytes(header.as_bytes()).expect("a valid header name");
        self.config().headers.push((name, descriptor.into()));
        self
    }

    /// The client's IP becomes descriptor `descriptor`: the first
    /// `X-Forwarded-For` address, else `X-Real-IP`, else the peer address (a
    /// `SocketAddr` or axum's `ConnectInfo<SocketAddr>` in the request's
    /// extensions).
    pub fn client_ip(mut self, descriptor: &str) -> Self {
        self.config().client_ip = Some(descriptor.into());
        self
    }

    /// How a response's status is reported (default: 5xx is a failure).
    pub fn classify(mut self, f: fn(StatusCode) -> Outcome) -> Self {
        self.config().classify = f;
        self
    }
}

impl<S> Layer<S> for FloodgateLayer {
    type Service = Floodgate<S>;

    fn layer(&self, inner: S) -> Floodgate<S> {
        Floodgate { inner, layer: self.clone() }
    }
}

impl Config {
    /// The question for one request.
    pub(crate) fn describe<B>(&self, req: &Request<B>) -> Acquire {
        let resource = format!("{} {}", req.method(), self.routes.resolve(req.uri().path()));
        let mut ask = Acquire::new(resource);
        for (header, descriptor) in &self.headers {
            if let Some(v) = req.headers().get(header).and_then(|v| v.to_str().ok()) {
                ask = ask.descriptor(descriptor.clone(), v);
            }
        }
        if let Some(descriptor) = &self.client_ip
            && let Some(ip) = client_ip(req)
        {
            ask = ask.descriptor(descriptor.clone(), ip);
        }
        ask
    }
}

fn client_ip<B>(req: &Request<B>) -> Option<String> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(first) = header("x-forwarded-for").and_then(|v| v.split(',').next()) {
        return Some(first.trim().to_string());
    }
    if let Some(ip) = header("x-real-ip") {
        return Some(ip.trim().to_string());
    }
    let peer = req.extensions().get::<SocketAddr>().copied();
    #[cfg(feature = "axum")]
    let peer = peer.or_else(|| req.extensions().get::<axum::extract::ConnectInfo<SocketAddr>>().map(|c| c.0));
    peer.map(|a| a.ip().to_string())
}
