//! The layer and its settings. Every setting can be changed on a clone; a
//! setting that cannot be used (a bad header name) is an error, never a panic.

use std::sync::Arc;

use http::StatusCode;
use tower::Layer;

use super::config::Config;
use super::route::Routes;
use super::service::Floodgate;
use crate::client::Client;
use crate::decision::Outcome;
use crate::error::Error;

/// Protects every request of the wrapped service with Floodgate.
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

    /// Route templates (`/api/orders/:id`) that resources are named after.
    pub fn routes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, templates: I) -> Self {
        self.config().routes = Routes::new(templates);
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

    /// How a response's status is reported (default: 5xx is a failure).
    pub fn classify(mut self, f: fn(StatusCode) -> Outcome) -> Self {
        self.config().classify = f;
        self
    }
}

impl<S> Layer<S> for FloodgateLayer {
    type Service = Floodgate<S>;

    fn layer(&self, inner: S) -> Floodgate<S> {
        Floodgate::new(inner, self.client.clone(), self.config.clone())
    }
}
