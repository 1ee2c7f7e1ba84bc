//! What the HTTP layer asks for a request, and how it judges the response.

use std::net::SocketAddr;

use http::{Request, StatusCode};

use super::route::Routes;
use crate::decision::{Acquire, Outcome};

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) routes: Routes,
    pub(crate) headers: Vec<(http::HeaderName, String)>,
    pub(crate) client_ip: Option<String>,
    pub(crate) classify: fn(StatusCode) -> Outcome,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            routes: Routes::default(),
            headers: Vec::new(),
            client_ip: None,
            classify: |s| if s.is_server_error() { Outcome::Failure } else { Outcome::Success },
        }
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
