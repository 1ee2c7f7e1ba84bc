//! envoyproxy/ratelimit's configuration served over xDS (`--envoy-xds`), as
//! Envoy Gateway serves it: a control plane streams `RateLimitConfig`
//! resources over the Aggregated Discovery Service, state of the world
//! (upstream's `CONFIG_TYPE=GRPC_XDS_SOTW`) or incremental (delta).
//!
//! Each update is read and validated whole, exactly as a directory of files
//! is ([`crate::rules::envoy`]): a valid one is installed atomically and
//! ACKed; an invalid one is NACKed with every error, and the configuration in
//! force keeps deciding. When the stream breaks, the client reconnects with
//! jittered exponential backoff, telling the control plane what it holds, and
//! keeps the last good configuration meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::decider::Decider;
use crate::rules::envoy::{Document, EnvoyConfig, EnvoyOptions};

pub mod convert;
mod delta;
mod sotw;

/// The resource type upstream subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Where the control plane is and how to talk to it.
#[derive(Clone, Debug)]
pub struct XdsConfig {
    /// `http://host:port` or `https://host:port`.
    pub url: String,
    /// The node id the control plane keys its snapshots by.
    pub node_id: String,
    /// The node's cluster.
    pub node_cluster: String,
    /// The node's metadata, as string fields.
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent with the stream (an authorization token...).
    pub headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    pub tls: Option<XdsTls>,
    /// The incremental protocol instead of the state of the world.
    pub delta: bool,
    /// Reconnection backoff: the first wait and the longest.
    pub backoff: (Duration, Duration),
    /// The largest response taken, in bytes; a larger one fails the stream
    /// (it is reopened after the backoff).
    pub max_message: usize,
    /// A stream with no response this long after it opens is reopened.
    pub initial_fetch_timeout: Duration,
    /// How the configuration is read (domain merging).
    pub options: EnvoyOptions,
}

/// TLS towards the control plane, files already read.
#[derive(Clone, Debug)]
pub struct XdsTls {
    /// A CA to trust beside the system's (PEM).
    pub ca: Option<Vec<u8>>,
    /// A client certificate and key (PEM), for a control plane that asks.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify the server's certificate against (upstream's
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`), when not the URL's host.
    pub server_name: Option<String>,
}

/// What the client is doing, for readiness and metrics.
#[derive(Debug, Default)]
pub struct XdsStatus {
    connected: AtomicBool,
    /// A configuration from the control plane is in force.
    applied: AtomicBool,
}

impl XdsStatus {
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Whether a configuration from the control plane has been installed.
    pub fn applied(&self) -> bool {
        self.applied.load(Ordering::Acquire)
    }

    fn set_connected(&self, up: bool) {
        self.connected.store(up, Ordering::Release);
        metrics::gauge!(crate::metrics::ENVOY_XDS_CONNECTED).set(if up { 1.0 } else { 0.0 });
    }
}

/// Starts the client; it runs until the task is aborted.
pub fn spawn(
    config: XdsConfig,
    decider: Arc<Decider>,
) -> anyhow::Result<(tokio::task::JoinHandle<()>, Arc<XdsStatus>)> {
    let endpoint = endpoint(&config)?;
    let status = Arc::new(XdsStatus::default());
    status.set_connected(false);
    let client = Client { config, endpoint, decider, status: status.clone(), refusals: Default::default() };
    Ok((tokio::spawn(client.run()), status))
}

/// The endpoint, with TLS for `https://`; every file was read before.
fn endpoint(config: &XdsConfig) -> anyhow::Result<Endpoint> {
    let mut endpoint = Endpoint::from_shared(config.url.clone())
        .with_context(|| format!("--envoy-xds: bad address '{}'", config.url))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        // A control plane that vanishes without closing is noticed.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if config.url.starts_with("https://") {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(t) = &config.tls {
            if let Some(ca) = &t.ca {
                tls = tls.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &t.identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            if let Some(name) = &t.server_name {
                tls = tls.domain_name(name.clone());
            }
        }
        endpoint = endpoint.tls_config(tls).context("--envoy-xds: TLS settings")?;
    } else if config.tls.is_some() {
        anyhow::bail!("--envoy-xds: TLS files are given, but the address '{}' is not https://", config.url);
    }
    Ok(endpoint)
}

struct Client {
    config: XdsConfig,
    endpoint: Endpoint,
    decider: Arc<Decider>,
    status: Arc<XdsStatus>,
    /// NACKs in a row, and the errors logged last with when: a control
    /// plane that sends bad configurations in a loop is slowed down (each
    /// costs a parse) and its errors are logged once a minute, not each time.
    refusals: std::sync::Mutex<Refusals>,
}

#[derive(Default)]
struct Refusals {
    in_a_row: u32,
    logged: Option<(String, std::time::Instant)>,
}

/// The pause before reading the next update after `in_a_row` NACKs.
fn nack_pause(in_a_row: u32) -> Duration {
    (Duration::from_millis(100) * in_a_row).min(Duration::from_secs(5))
}

/// Why a stream ended.
enum Ended {
    /// After at least one response: reconnect from the first backoff.
    AfterProgress(String),
    /// Before any response.
    Failed(String),
}

impl Client {
    async fn run(self) {
        let (first, max) = self.config.backoff;
        let mut wait = first;
        // What the client holds, for a reconnection to say.
        let mut held = Held::default();
        loop {
            // A control plane that accepts and then says nothing (no HTTP/2
            // handshake, no response headers) is given up like a silent stream.
            let within = self.config.initial_fetch_timeout;
            let ended = match tokio::time::timeout(within, self.endpoint.connect()).await {
                Ok(Ok(channel)) => {
                    let ended = match self.config.delta {
                        false => sotw::stream(&self, channel, &mut held).await,
                        true => delta::stream(&self, channel, &mut held).await,
                    };
                    self.status.set_connected(false);
                    ended
                }
                Ok(Err(e)) => Ended::Failed(format!("cannot connect: {}", crate::errors::chain(&e))),
                Err(_) => Ended::Failed(format!("no HTTP/2 connection within {within:?}")),
            };
            let why = match ended {
                Ended::AfterProgress(why) => {
                    wait = first;
                    why
                }
                Ended::Failed(why) => why,
            };
            let jittered = retry_wait(wait, max);
            tracing::warn!(
                url = %self.config.url,
                error = %why,
                retry_in = ?jittered,
                "xDS stream ended; the Envoy configuration in force keeps deciding"
            );
            tokio::time::sleep(jittered).await;
            wait = (wait * 2).min(max);
        }
    }

    /// The stream is open (the control plane answered with its headers).
    fn opened(&self) {
        tracing::info!(url = %self.config.url, delta = self.config.delta, "connected to the xDS control plane");
        self.status.set_connected(true);
    }

    /// Opens the stream: `open` within the initial fetch timeout.
    async fn open<T>(
        &self,
        open: impl Future<Output = Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>>,
    ) -> Result<tonic::Streaming<T>, Ended> {
        let within = self.config.initial_fetch_timeout;
        match tokio::time::timeout(within, open).await {
            Ok(Ok(r)) => {
                self.opened();
                Ok(r.into_inner())
            }
            Ok(Err(status)) => Err(Ended::Failed(format!("the stream was refused: {status}"))),
            Err(_) => Err(Ended::Failed(format!("the stream was not answered within {within:?}"))),
        }
    }

    /// The node this client says it is.
    fn node(&self) -> envoy_types::pb::envoy::config::core::v3::Node {
        use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
        let fields = self
            .config
            .node_metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value { kind: Some(Kind::StringValue(v.clone())) }))
            .collect();
        envoy_types::pb::envoy::config::core::v3::Node {
            id: self.config.node_id.clone(),
            cluster: self.config.node_cluster.clone(),
            metadata: (!self.config.node_metadata.is_empty()).then_some(Struct { fields }),
            user_agent_name: "floodgate".into(),
            ..Default::default()
        }
    }

    /// A request carrying the configured gRPC metadata.
    fn request<T>(&self, body: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(body);
        for (k, v) in &self.config.headers {
            request.metadata_mut().insert(k.clone(), v.clone());
        }
        request
    }

    /// Reads, validates and installs one update (every resource of it);
    /// `Err` holds every error, for the NACK. Parsing runs off the workers.
    async fn apply(&self, documents: Vec<Document>, version: &str) -> Result<(), String> {
        let options = self.config.options;
        let parsed = tokio::task::spawn_blocking(move || {
            let text = digest(&documents);
            EnvoyConfig::from_documents(&documents, &options).map(|c| (c, text))
        })
        .await;
        match parsed {
            Ok(Ok((config, text))) => {
                let domains = config.domains().count();
                let installed =
                    self.decider.control().install_envoy_from(config, text, self.config.url.clone(), version.into());
                self.status.applied.store(true, Ordering::Release);
                tracing::info!(url = %self.config.url, version = %shown(version), domains, rules_version = installed, "Envoy configuration from xDS installed");
                Ok(())
            }
            Ok(Err(errors)) => {
                let (source, why) = (format!("envoy:{}", self.config.url), errors.to_string());
                self.decider.control().refused(&crate::decider::Origin::Envoy, source, &why);
                Err(why)
            }
            Err(e) => Err(format!("reading the configuration failed: {e}")),
        }
    }

    /// Counts an update's result, whatever refused it (a resource that does
    /// not decode as well as one that does not validate); logs a refusal
    /// unless the same errors were logged within the minute.
    fn judged(&self, version: &str, errors: Option<&String>) {
        let mut r = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        let Some(errors) = errors else {
            *r = Refusals::default();
            return;
        };
        r.in_a_row = r.in_a_row.saturating_add(1);
        let now = std::time::Instant::now();
        let seen = r.logged.as_ref().is_some_and(|(last, at)| last == errors && now - *at < Duration::from_secs(60));
        if seen {
            tracing::debug!(url = %self.config.url, version = %shown(version), in_a_row = r.in_a_row, "Envoy configuration from xDS refused again, as logged");
        } else {
            let errors = nack_message(errors);
            tracing::error!(url = %self.config.url, version = %shown(version), in_a_row = r.in_a_row, "Envoy configuration from xDS refused; keeping the one in force\n{errors}");
            r.logged = Some((errors.clone(), now));
        }
    }

    /// Waits out the pause a run of NACKs asks for.
    async fn after_refusals(&self) {
        let in_a_row = self.refusals.lock().unwrap_or_else(|e| e.into_inner()).in_a_row;
        if in_a_row > 0 {
            tokio::time::sleep(nack_pause(in_a_row)).await;
        }
    }
}

/// The next response of the type asked for (others are ignored), or why
/// the stream ended: after progress once the stream brought a response. A
/// stream with no response within `first_within` of its start ends.
async fn next<Resp>(
    responses: &mut tonic::Streaming<Resp>,
    progress: &mut bool,
    type_url: fn(&Resp) -> &str,
    first_within: Duration,
) -> Result<Resp, Ended> {
    loop {
        let message = match *progress {
            true => responses.message().await,
            false => match tokio::time::timeout(first_within, responses.message()).await {
                Ok(m) => m,
                Err(_) => {
                    let why = format!("no response within {first_within:?} of opening the stream");
                    return Err(Ended::Failed(why));
                }
            },
        };
        let why = match message {
            Ok(Some(r)) => {
                *progress = true;
                if type_url(&r) == TYPE_URL {
                    return Ok(r);
                }
                tracing::debug!(type_url = type_url(&r), "xDS response of a type not asked for, ignored");
                continue;
            }
            Ok(None) => "the control plane closed the stream".to_string(),
            Err(status) => format!("the stream failed: {status}"),
        };
        return Err(if *progress { Ended::AfterProgress(why) } else { Ended::Failed(why) });
    }
}

/// The responses of the type asked for that are already here, after one
/// that was awaited (at most `max` in all), and why the stream ended if it
/// did meanwhile: updates that came in a burst are read as one.
fn ready<Resp>(
    responses: &mut tonic::Streaming<Resp>,
    type_url: fn(&Resp) -> &str,
    max: usize,
) -> (Vec<Resp>, Option<Ended>) {
    use futures_util::FutureExt;
    let mut out = Vec::new();
    while out.len() < max {
        match responses.message().now_or_never() {
            None => break,
            Some(Ok(Some(r))) if type_url(&r) == TYPE_URL => out.push(r),
            Some(Ok(Some(_))) => continue,
            Some(Ok(None)) => return (out, Some(Ended::AfterProgress("the control plane closed the stream".into()))),
            Some(Err(status)) => return (out, Some(Ended::AfterProgress(format!("the stream failed: {status}")))),
        }
    }
    (out, None)
}

/// Updates read as one, at most.
const BURST: usize = 64;

/// What the client holds: the version accepted last (SotW) and each
/// resource by name with its version (delta).
#[derive(Default)]
struct Held {
    version: String,
    resources: std::collections::BTreeMap<String, (String, Document)>,
}

/// The text `GetRules` shows: each resource as YAML, by name.
fn digest(documents: &[Document]) -> String {
    documents
        .iter()
        .map(|d| format!("# {}\n{}\n", d.name, serde_yaml_ng::to_string(&d.value).unwrap_or_default()))
        .collect()
}

/// A control plane's version as logs show it: escaped, and as its digest
/// when longer than 128 bytes (a control plane chooses it, at any length).
pub fn shown(version: &str) -> String {
    if version.len() > 128 { crate::digest::digest(version) } else { version.escape_debug().to_string() }
}

/// An error for a NACK: at most 16 KiB of it.
fn nack_message(errors: &str) -> String {
    const MAX: usize = 16 << 10;
    if errors.len() <= MAX {
        return errors.to_string();
    }
    let mut end = MAX;
    while !errors.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &errors[..end], errors.len())
}

/// `d` give or take half of it.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.5..1.5))
}

/// The wait before reconnecting: `wait` jittered, never past `max`.
fn retry_wait(wait: Duration, max: Duration) -> Duration {
    jitter(wait).min(max)
}

/// Decodes the resources of an update into documents; `Err` names the one
/// that could not be read.
fn documents<'a>(
    resources: impl Iterator<Item = (&'a str, &'a envoy_types::pb::google::protobuf::Any)>,
) -> Result<Vec<Document>, String> {
    use prost::Message;
    let mut out = Vec::new();
    for (name, any) in resources {
        if any.type_url != TYPE_URL {
            return Err(format!("resource '{name}': type {} is not {TYPE_URL}", any.type_url));
        }
        let config = envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("resource '{name}': cannot be decoded: {e}"))?;
        out.push(convert::document(name, &config));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_nacks_slows_the_next_read_up_to_five_seconds() {
        assert_eq!(nack_pause(0), Duration::ZERO);
        assert_eq!(nack_pause(1), Duration::from_millis(100));
        assert_eq!(nack_pause(20), Duration::from_secs(2));
        assert_eq!(nack_pause(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn a_version_is_logged_escaped_and_a_long_one_as_its_digest() {
        assert_eq!(shown("v1"), "v1");
        assert_eq!(shown("v1\n\u{1b}[31m"), "v1\\n\\u{1b}[31m");
        let long = "v".repeat(15 << 20);
        assert!(shown(&long).starts_with("#sha256:") && shown(&long).len() < 64);
    }

    #[test]
    fn a_jittered_wait_never_passes_the_longest() {
        let max = Duration::from_secs(60);
        for _ in 0..1_000 {
            let d = retry_wait(max, max);
            assert!(d >= max / 2 && d <= max, "{d:?}");
        }
    }
}
