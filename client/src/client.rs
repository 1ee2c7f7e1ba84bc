//! The client: ask before calling, report after.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

use crate::connection::ServerBreaker;
use crate::decision::{Acquire, BreakerState, Decision, Outcome, Permit, Source, Verdict};
use crate::error::{Error, unreachable};
use crate::open_breakers::{self, OpenBreakers};
use crate::reporter::{Reporter, Settings};
use crate::stats::{Stats, StatsSnapshot};

/// What the client answers when no server can be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailMode {
    /// Admit the call (the protected service stays up without Floodgate).
    #[default]
    Open,
    /// Deny the call (verdict SHED).
    Closed,
}

/// A Floodgate client: cheap to clone, shared by every task of a service.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), floodgate_client::Error> {
/// use std::time::Duration;
/// use floodgate_client::{Acquire, Client, FailMode};
/// use floodgate_client::decision::Source;
///
/// // Nothing listens on port 1: the client fails open within its deadline.
/// let client = Client::builder()
///     .endpoint("http://127.0.0.1:1")
///     .request_timeout(Duration::from_millis(20))
///     .fail_mode(FailMode::Open)
///     .build()?;
/// let decision = client.acquire(&Acquire::new("payments").descriptor("user", "u42")).await?;
/// assert!(decision.is_allowed());
/// assert_eq!(decision.source, Source::FailOpen);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) open: Arc<OpenBreakers>,
    request_timeout: Duration,
    fail_mode: FailMode,
    stats: Arc<Stats>,
    /// The last good value per resource, for `Fallback::LastGood`.
    pub(crate) last_good: Mutex<HashMap<String, Box<dyn Any + Send + Sync>>>,
}

pub(crate) struct Endpoint {
    pub(crate) grpc: FloodgateClient<Channel>,
    breaker: ServerBreaker,
    reporter: Reporter,
}

/// TLS for `https://` endpoints: the CA to trust (besides the system's), and
/// a client certificate when the server requires mTLS.
#[derive(Clone, Debug, Default)]
pub struct Tls {
    ca_pem: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl Tls {
    pub fn new() -> Self {
        Tls::default()
    }

    /// Trust this CA (PEM) for the server's certificate.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Present this certificate and key (PEM) to the server (mTLS).
    pub fn identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    /// The name to check the server's certificate against, when it is not
    /// the endpoint's host.
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    fn config(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut c = ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = &self.ca_pem {
            c = c.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            c = c.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            c = c.domain_name(domain.clone());
        }
        c
    }
}

/// Builds a [`Client`].
#[derive(Clone, Debug)]
pub struct Builder {
    endpoints: Vec<String>,
    tls: Option<Tls>,
    connect_timeout: Duration,
    request_timeout: Duration,
    fail_mode: FailMode,
    watch: bool,
    report_batch: usize,
    report_interval: Duration,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            endpoints: Vec::new(),
            tls: None,
            connect_timeout: Duration::from_millis(250),
            request_timeout: Duration::from_millis(25),
            fail_mode: FailMode::Open,
            watch: true,
            report_batch: 100,
            report_interval: Duration::from_millis(10),
        }
    }
}

impl Builder {
    /// A server to ask; several are tried in order (failover). Reports go to
    /// the server that issued the permit.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoints.push(url.into());
        self
    }

    /// TLS settings for `https://` endpoints (by default, the system's CAs).
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// The longest an `acquire` waits for the server before failing open or
    /// closed (default 25 ms).
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// Keep a local cache of open breakers fed by Watch (default on).
    pub fn watch_breakers(mut self, on: bool) -> Self {
        self.watch = on;
        self
    }

    /// Reports per batch, and how long a report may wait for its batch.
    pub fn report_batching(mut self, batch: usize, interval: Duration) -> Self {
        self.report_batch = batch.clamp(1, 1000);
        self.report_interval = interval;
        self
    }

    /// Builds the client; connections are made when first needed and remade
    /// when lost. Call it inside a Tokio runtime.
    pub fn build(self) -> Result<Client, Error> {
        if self.endpoints.is_empty() {
            return Err(Error::Endpoint { endpoint: String::new(), reason: "no endpoint given".into() });
        }
        let stats = Arc::new(Stats::default());
        let mut endpoints = Vec::new();
        for url in &self.endpoints {
            let bad = |e: &dyn std::fmt::Display| Error::Endpoint { endpoint: url.clone(), reason: e.to_string() };
            let mut endpoint = TonicEndpoint::from_shared(url.clone())
                .map_err(|e| bad(&e))?
                .connect_timeout(self.connect_timeout)
                .tcp_nodelay(true);
            if url.starts_with("https://") {
                let tls = self.tls.clone().unwrap_or_default();
                endpoint = endpoint.tls_config(tls.config()).map_err(|e| bad(&e))?;
            }
            let channel = endpoint.connect_lazy();
            let grpc = FloodgateClient::new(channel);
            let settings =
                Settings { batch: self.report_batch, interval: self.report_interval, timeout: Duration::from_secs(2) };
            let reporter = Reporter::spawn(grpc.clone(), settings, stats.clone());
            endpoints.push(Endpoint { grpc, breaker: ServerBreaker::new(url.clone()), reporter });
        }
        let inner = Arc::new(Inner {
            endpoints,
            open: Arc::new(OpenBreakers::default()),
            request_timeout: self.request_timeout,
            fail_mode: self.fail_mode,
            stats,
            last_good: Mutex::new(HashMap::new()),
        });
        if self.watch {
            let grpcs = inner.endpoints.iter().map(|e| e.grpc.clone()).collect();
            tokio::spawn(open_breakers::follow(Arc::downgrade(&inner.open), grpcs));
        }
        Ok(Client { inner })
    }
}

impl Client {
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A client of one server, with the defaults.
    pub fn connect(url: impl Into<String>) -> Result<Client, Error> {
        Client::builder().endpoint(url).build()
    }

    /// May I? A denial is a [`Decision`], not an error; an unreachable server
    /// gives the fail mode's decision within `request_timeout`. Errors are
    /// the server refusing bad input.
    pub async fn acquire(&self, req: &Acquire) -> Result<Decision, Error> {
        let inner = &self.inner;
        if let Some(retry_after) = inner.open.denies(req.resource()) {
            inner.stats.cached_denial();
            return Ok(Decision {
                verdict: Verdict::CircuitOpen,
                retry_after,
                breaker_state: Some(BreakerState::Open),
                reason: format!("circuit breaker of '{}' is open (cached from Watch)", req.resource()),
                source: Source::OpenBreakerCache,
                ..Decision::fail_open()
            });
        }
        let deadline = Instant::now() + inner.request_timeout;
        for (i, ep) in inner.endpoints.iter().enumerate() {
            if !ep.breaker.allow() {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            inner.stats.rpc();
            let issued = Instant::now();
            match tokio::time::timeout(left, ep.grpc.clone().acquire(req.to_proto())).await {
                Ok(Ok(response)) => {
                    ep.breaker.success();
                    let mut d = Decision::from_proto(response.into_inner(), req.resource(), issued);
                    if let Some(p) = &mut d.permit {
                        p.endpoint = i;
                    }
                    return Ok(d);
                }
                Ok(Err(status)) if unreachable(&status) => ep.breaker.failure(status.message()),
                Ok(Err(status)) => {
                    ep.breaker.success();
                    return Err(status.into());
                }
                Err(_) => ep.breaker.failure("no answer within the request timeout"),
            }
        }
        inner.stats.without_server();
        Ok(match inner.fail_mode {
            FailMode::Open => Decision::fail_open(),
            FailMode::Closed => Decision::fail_closed(Duration::from_secs(1)),
        })
    }

    /// How the call went. Never blocks and never fails: reports are batched in
    /// the background and sent to the server that issued the permit.
    pub fn report(&self, permit: &Permit, outcome: Outcome, latency: Option<Duration>) {
        let Some(ep) = self.inner.endpoints.get(permit.endpoint) else { return };
        let latency = latency.unwrap_or_else(|| permit.issued.elapsed());
        let report = pb::ReportOutcomeRequest {
            resource: permit.resource.clone(),
            permit_id: permit.id.clone(),
            outcome: outcome.to_proto() as i32,
            latency: Some(prost_types::Duration {
                seconds: latency.as_secs() as i64,
                nanos: latency.subsec_nanos() as i32,
            }),
        };
        if !ep.reporter.send(report) {
            self.inner.stats.dropped(1);
        }
    }

    /// Waits until every report made so far was delivered (or given up on).
    pub async fn flush(&self) {
        for ep in &self.inner.endpoints {
            ep.reporter.flush().await;
        }
    }

    /// Whether every server is currently unreachable.
    pub fn is_degraded(&self) -> bool {
        self.inner.endpoints.iter().all(|e| e.breaker.is_open())
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }
}
