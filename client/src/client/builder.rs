//! How a [`Client`] is built: endpoints, TLS, timeouts, what to do without a
//! server, how cancelled calls count, report batching.

use std::sync::Arc;
use std::time::Duration;

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use tonic::transport::Endpoint as TonicEndpoint;

use super::{Client, Endpoint, Inner};
use crate::connection::ServerBreaker;
use crate::error::Error;
use crate::last_good::LastGood;
use crate::local::LocalLimits;
use crate::permit::Outcome;
use crate::reporter::{Reporter, Settings};
use crate::stats::Stats;
use crate::watch::{self, Known};

/// What the client answers when no server can be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum FailMode {
    /// Admit the call (the protected service stays up without Floodgate).
    #[default]
    Open,
    /// Deny the call (verdict SHED, `retry_after` from
    /// [`Builder::fail_closed_retry_after`]).
    Closed,
    /// Decide in this process, at `share` (0 to 1) of the limits the server
    /// last reported for the same question: a fleet of N clients would use
    /// 1/N. A question the server never answered is admitted.
    Local { share: f64 },
}

/// TLS for `https://` endpoints: the CA to trust (besides the system's), and
/// a client certificate when the server requires mTLS.
#[derive(Clone, Debug, Default)]
pub struct Tls {
    ca_pem: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

/// Builds a [`Client`].
#[derive(Clone, Debug)]
pub struct Builder {
    endpoints: Vec<String>,
    tls: Option<Tls>,
    connect_timeout: Duration,
    request_timeout: Duration,
    fail_mode: FailMode,
    fail_closed_retry_after: Duration,
    cancelled_as: Option<Outcome>,
    watch: bool,
    report_batch: usize,
    report_interval: Duration,
    last_good_capacity: usize,
    leases: bool,
    load_report: Option<crate::load::LoadReport>,
}

// === impl FailMode ===

impl FailMode {
    /// Decide locally at `share` of the last known limits.
    pub fn local(share: f64) -> Self {
        FailMode::Local { share }
    }
}

// === impl Tls ===

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

// === impl Builder ===

impl Default for Builder {
    fn default() -> Self {
        Builder {
            endpoints: Vec::new(),
            tls: None,
            connect_timeout: Duration::from_millis(250),
            request_timeout: Duration::from_millis(25),
            fail_mode: FailMode::Open,
            fail_closed_retry_after: Duration::from_secs(1),
            cancelled_as: None,
            watch: true,
            report_batch: 100,
            report_interval: Duration::from_millis(10),
            last_good_capacity: 10_000,
            leases: false,
            load_report: None,
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

    /// The longest an `acquire` waits for the servers before its fail mode
    /// answers (default 25 ms).
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// The `retry_after` of a [`FailMode::Closed`] denial (default 1 s).
    pub fn fail_closed_retry_after(mut self, d: Duration) -> Self {
        self.fail_closed_retry_after = d;
        self
    }

    /// How a permit dropped unreported (its call cancelled) is reported. By
    /// default FAILURE on a resource with a breaker, IGNORED otherwise.
    pub fn cancelled_as(mut self, outcome: Outcome) -> Self {
        self.cancelled_as = Some(outcome);
        self
    }

    /// Follow Watch (default on): open breakers and resources without a rule
    /// are answered without a round trip.
    pub fn watch(mut self, on: bool) -> Self {
        self.watch = on;
        self
    }

    /// The same as [`Builder::watch`].
    pub fn watch_breakers(self, on: bool) -> Self {
        self.watch(on)
    }

    /// Reports per batch (1 to 1000), and how long after its first report a
    /// batch leaves at the latest (default 100 and 10 ms). Reports of permits
    /// that hold a concurrency slot or a half-open probe leave at once.
    pub fn report_batching(mut self, batch: usize, interval: Duration) -> Self {
        self.report_batch = batch.clamp(1, 1000);
        self.report_interval = interval;
        self
    }

    /// Decide from leases where the rules allow (limits marked `lease:`): the
    /// client takes a share of a key's limits and answers its calls without a
    /// round trip, renewing in the background (default off). Denials then
    /// come from the lease running out (`Source::Lease`); what leasing
    /// trades is described in the README.
    pub fn leases(mut self, on: bool) -> Self {
        self.leases = on;
        self
    }

    /// Last good values kept for [`Fallback::LastGood`](crate::Fallback::LastGood)
    /// (default 10,000; the least recently stored go first).
    pub fn last_good_capacity(mut self, n: usize) -> Self {
        self.last_good_capacity = n.max(1);
        self
    }

    /// Reports this process's CPU and memory use to the servers once a
    /// second (`ReportLoad`), as instance `instance` of system `system` (the
    /// rules' `systems:` name it), on a task of its own: the system's
    /// degradation level follows its instances' load. Utilization is a share
    /// of what the process may use: its container's CPU quota and memory
    /// limit (cgroup v2 or v1), else its CPUs and the host's memory. Linux
    /// only; elsewhere nothing is reported (logged once).
    pub fn report_load(mut self, system: impl Into<String>, instance: impl Into<String>) -> Self {
        let (system, instance) = (system.into(), instance.into());
        self.load_report = Some(crate::load::LoadReport { system, instance, every: Duration::from_secs(1) });
        self
    }

    /// Builds the client; connections are made when first needed and remade
    /// when lost. Call it inside a Tokio runtime.
    pub fn build(self) -> Result<Client, Error> {
        if self.endpoints.is_empty() {
            return Err(Error::Endpoint { endpoint: String::new(), reason: "no endpoint given".into() });
        }
        if let FailMode::Local { share } = self.fail_mode
            && !(share > 0.0 && share <= 1.0)
        {
            return Err(Error::Config(format!("FailMode::Local share {share} is not in (0, 1]")));
        }
        if let Some(r) = &self.load_report
            && (r.system.is_empty() || r.instance.is_empty())
        {
            return Err(Error::Config("report_load needs a system and an instance id".into()));
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
            let grpc = FloodgateClient::new(endpoint.connect_lazy());
            let settings =
                Settings { batch: self.report_batch, interval: self.report_interval, timeout: Duration::from_secs(2) };
            let reporter = Reporter::spawn(grpc.clone(), settings, stats.clone());
            endpoints.push(Endpoint { grpc, breaker: ServerBreaker::new(url.clone()), reporter });
        }
        let (closed, on_close) = tokio::sync::watch::channel(());
        let inner = Arc::new(Inner {
            endpoints,
            known: Arc::new(Known::default()),
            request_timeout: self.request_timeout,
            fail_mode: self.fail_mode,
            fail_closed_retry_after: self.fail_closed_retry_after,
            cancelled_as: self.cancelled_as,
            local: match self.fail_mode {
                FailMode::Local { share } => Some(LocalLimits::new(share)),
                _ => None,
            },
            last_good: LastGood::new(self.last_good_capacity),
            stats,
            leases: self.leases.then(crate::lease::Leases::new),
            _closed: closed,
        });
        if self.leases {
            tokio::spawn(super::renew_leases(Arc::downgrade(&inner)));
        }
        if let Some(report) = self.load_report {
            let grpcs = inner.endpoints.iter().map(|e| e.grpc.clone()).collect();
            tokio::spawn(crate::load::run(report, grpcs, inner.stats.clone(), on_close.clone()));
        }
        if self.watch {
            let grpcs = inner.endpoints.iter().map(|e| e.grpc.clone()).collect();
            tokio::spawn(watch::follow(Arc::downgrade(&inner.known), grpcs, on_close));
        }
        Ok(Client::from_inner(inner))
    }
}
