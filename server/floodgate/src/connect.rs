//! How the binary's own clients (the CLI commands and `floodgate bench`)
//! reach a server: the address, TLS and mTLS material, and the bearer token
//! Admin calls carry.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A server and how to talk to it.
#[derive(Args, Clone, Debug)]
pub struct Target {
    /// The Floodgate server: host:port, http://host:port, or https://host:port for TLS.
    #[arg(long, short = 's', default_value = "http://127.0.0.1:50051", env = "FLOODGATE_SERVER")]
    pub server: String,
    /// A CA (PEM) to trust for the server's certificate (implies TLS).
    #[arg(long, env = "FLOODGATE_CA")]
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM), for a server that requires mTLS.
    #[arg(long, env = "FLOODGATE_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "FLOODGATE_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// A bearer token for Admin calls (rules, breakers, level).
    #[arg(long, env = "FLOODGATE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Adds `authorization: Bearer TOKEN` to every call when there is a token.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

pub type Authed = InterceptedService<Channel, Bearer>;

impl Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

impl Target {
    /// The URL, `http://` added when no scheme is given (`https://` with a CA).
    pub fn url(&self) -> String {
        match (self.server.contains("://"), self.ca.is_some() || self.cert.is_some()) {
            (true, _) => self.server.clone(),
            (false, true) => format!("https://{}", self.server),
            (false, false) => format!("http://{}", self.server),
        }
    }

    /// An endpoint, with TLS when the URL is `https://`.
    pub fn endpoint(&self) -> anyhow::Result<Endpoint> {
        let url = self.url();
        let mut endpoint = Endpoint::from_shared(url.clone())
            .with_context(|| format!("bad server address '{url}'"))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true);
        if url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new().with_native_roots();
            if let Some(ca) = &self.ca {
                let pem = std::fs::read(ca).with_context(|| format!("reading the CA {}", ca.display()))?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                let cert = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
                let key = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(tls).context("TLS settings")?;
        }
        Ok(endpoint)
    }

    /// A connected channel.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        let url = self.url();
        self.endpoint()?.connect().await.with_context(|| format!("cannot reach floodgate at {url}"))
    }

    /// A connected channel whose calls carry the bearer token.
    pub async fn connect(&self) -> anyhow::Result<Authed> {
        let token = match &self.token {
            Some(t) => Some(format!("Bearer {t}").parse().context("the token is not valid ASCII")?),
            None => None,
        };
        Ok(InterceptedService::new(self.channel().await?, Bearer(token)))
    }
}
