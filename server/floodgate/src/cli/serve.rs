//! `floodgate serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::access::AccessConfig;
use crate::listen::{Limits, TlsFiles};
use crate::replication::{self, Credentials, Target};
use crate::server::{self, Listeners, Options};
use crate::time::SystemClock;

mod envoy;
mod sentinel;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Rules file (YAML), watched for changes. Without it, the embedded default rules.
    #[arg(long, short = 'c', env = "FLOODGATE_CONFIG")]
    config: Option<PathBuf>,

    /// gRPC address (Floodgate, Admin, health, reflection). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:50051", env = "FLOODGATE_LISTEN")]
    listen: SocketAddr,

    /// HTTP address for the console, /metrics, /healthz and /readyz.
    #[arg(long, default_value = "127.0.0.1:8080", env = "FLOODGATE_HTTP_LISTEN")]
    http_listen: SocketAddr,

    /// A host name the HTTP port answers to, besides IP addresses and
    /// localhost (`*.example.com` for any name under one); repeat for more.
    /// Requests naming another host are refused (DNS rebinding).
    #[arg(long = "http-host", value_name = "NAME", env = "FLOODGATE_HTTP_HOSTS", value_delimiter = ',', value_parser = crate::http::parse_host_name)]
    http_hosts: Vec<String>,

    /// The most buckets held in memory; beyond it the least recently used are evicted.
    #[arg(long, default_value_t = 10_000_000, value_parser = super::parse_positive)]
    max_keys: usize,

    /// The most bytes of bucket keys (each its resource and the descriptor
    /// values it is keyed on) held in memory; beyond it the least recently
    /// used are evicted. At least 64KiB. A bucket takes about 100 bytes
    /// besides its key.
    #[arg(long, default_value = "1GiB", value_parser = super::parse_key_bytes)]
    max_key_bytes: usize,

    /// How often idle buckets are forgotten.
    #[arg(long, default_value = "10s", value_parser = super::at_least_100ms)]
    sweep_interval: Duration,

    /// How long in-flight calls may take to finish after SIGTERM or SIGINT.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    shutdown_grace: Duration,

    /// Share limits, breakers and rules with other replicas through this Redis
    /// (e.g. redis://127.0.0.1:6379).
    #[arg(long, env = "FLOODGATE_REDIS", conflicts_with_all = ["redis_cluster", "redis_sentinel"])]
    redis: Option<String>,

    /// The same through a Redis Cluster: seed nodes, comma-separated.
    #[arg(long, env = "FLOODGATE_REDIS_CLUSTER", value_delimiter = ',', conflicts_with = "redis_sentinel")]
    redis_cluster: Vec<String>,

    /// The same through the master that these Redis Sentinels name
    /// (comma-separated URLs, e.g. redis://10.0.0.5:26379); the connection
    /// follows every failover. Needs --redis-sentinel-master.
    #[arg(long, env = "FLOODGATE_REDIS_SENTINEL", value_delimiter = ',', requires = "redis_sentinel_master")]
    redis_sentinel: Vec<String>,

    /// The name of the master the Sentinels watch (their `sentinel monitor`
    /// name, e.g. mymaster).
    #[arg(long, env = "FLOODGATE_REDIS_SENTINEL_MASTER", requires = "redis_sentinel")]
    redis_sentinel_master: Option<String>,

    /// How often replicated limits and breakers are synced with Redis.
    #[arg(long, default_value = "100ms", value_parser = super::at_least_10ms)]
    sync_interval: Duration,

    /// The longest any call waits for Redis.
    #[arg(long, default_value = "50ms", value_parser = super::at_least_1ms)]
    redis_timeout: Duration,

    /// This replica's name among the live replicas (default: host and process id).
    #[arg(long, env = "FLOODGATE_REPLICA_ID", value_parser = replica_id)]
    replica_id: Option<String>,

    /// Worker threads (default: one per core).
    #[arg(long, value_parser = super::parse_threads)]
    threads: Option<usize>,

    /// How long the rules file must stay unchanged before it is read again
    /// (a file written in chunks is never installed half-written).
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    reload_debounce: Duration,

    /// Keep overrides set through Admin in this file (JSON lines, written
    /// atomically, read at start) on a server without Redis; with Redis they
    /// are kept there. Without either they last until the process ends.
    #[arg(long, env = "FLOODGATE_OVERRIDES_FILE", conflicts_with_all = ["redis", "redis_cluster", "redis_sentinel"])]
    overrides_file: Option<PathBuf>,

    /// The most overrides set through Admin that the server keeps.
    #[arg(long, default_value_t = crate::overrides::DEFAULT_MAX)]
    max_overrides: usize,

    /// Keep this share of decisions (0 to 1) in the decision log, to read
    /// with `floodgate why` or Admin/GetDecisions: each with the rule that
    /// matched, every limit it evaluated and what decided. 0 is off;
    /// Admin/SetDecisionLog changes it while the server runs.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    decision_log: f64,

    /// The most decisions the decision log holds (the oldest go first). It
    /// also holds at most 64 MiB, whatever the descriptors' length.
    #[arg(long, default_value_t = crate::decider::decisions::DEFAULT_CAPACITY as u32,
          value_parser = clap::value_parser!(u32).range(1..=crate::decider::decisions::MAX_CAPACITY as i64))]
    decision_log_size: u32,

    #[command(flatten)]
    limits: LimitArgs,

    #[command(flatten)]
    tls: TlsArgs,

    #[command(flatten)]
    admin: AdminArgs,

    #[command(flatten)]
    redis_auth: RedisAuthArgs,

    #[command(flatten)]
    envoy: envoy::EnvoyArgs,

    #[command(flatten)]
    sentinel: sentinel::SentinelArgs,

    #[command(flatten)]
    otlp: OtlpArgs,
}

/// Traces over OTLP.
#[derive(Args, Debug)]
#[command(next_help_heading = "Traces (OTLP)")]
struct OtlpArgs {
    /// Export a span per gRPC call to this OTLP/gRPC collector (e.g.
    /// http://127.0.0.1:4317). A W3C traceparent in the call's metadata makes
    /// it part of the caller's trace.
    #[arg(long = "otlp-endpoint", env = "FLOODGATE_OTLP_ENDPOINT")]
    endpoint: Option<String>,
    /// Of the calls that carry no sampled traceparent, the fraction traced.
    #[arg(long = "otlp-sample-ratio", default_value_t = 0.0)]
    sample_ratio: f64,
    /// The service.name of the spans.
    #[arg(long = "otlp-service-name", default_value = "floodgate")]
    service_name: String,
}

/// Bounds on connections, on both ports.
#[derive(Args, Debug)]
struct LimitArgs {
    /// Connections open at once, per port; beyond it new ones are closed.
    #[arg(long, default_value_t = 10_000, value_parser = super::parse_positive)]
    max_connections: usize,
    /// From accept to a finished TLS handshake, or to a plaintext first byte.
    #[arg(long, default_value = "10s", value_parser = super::at_least_100ms)]
    handshake_timeout: Duration,
    /// A connection with no call open this long is closed (a Watch stream is
    /// a call open while it lasts; HTTP/2 pings do not count), and so is one
    /// with no traffic at all this long.
    #[arg(long, default_value = "5m", value_parser = super::at_least_1s)]
    idle_timeout: Duration,
    /// HTTP/1: the request head must arrive within this.
    #[arg(long, default_value = "10s", value_parser = super::at_least_100ms)]
    header_read_timeout: Duration,
    /// HTTP/2 streams (calls in flight) per connection.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_concurrent_streams: u32,
    /// gRPC calls (streams) in flight at once on the whole port; more are
    /// RESOURCE_EXHAUSTED at once.
    #[arg(long, default_value_t = 20_000, value_parser = super::parse_positive)]
    max_streams: usize,
    /// HTTP/2 keepalive pings: how often.
    #[arg(long, default_value = "60s", value_parser = super::at_least_1s)]
    keepalive_interval: Duration,
    /// HTTP/2 keepalive pings: how long to wait for the answer.
    #[arg(long, default_value = "20s", value_parser = super::at_least_1s)]
    keepalive_timeout: Duration,
    /// gRPC: bytes of request messages still arriving that the server holds
    /// at once; a call that would pass it fails RESOURCE_EXHAUSTED. The
    /// JSON API's bodies on the HTTP port, as they arrive and while they are
    /// decoded, have a budget of this size too.
    #[arg(long, default_value = "256MiB", value_parser = super::parse_bytes)]
    max_unfinished_request_bytes: usize,
    /// gRPC: the same, per connection (at least the largest request, 8 MiB).
    #[arg(long, default_value = "16MiB", value_parser = super::parse_bytes)]
    max_unfinished_request_bytes_per_connection: usize,
    /// Watch streams open at once.
    #[arg(long, default_value_t = 1024, value_parser = super::parse_positive)]
    max_watchers: usize,
    /// gRPC: a call's request must arrive whole within this of its headers
    /// (but a client stream's: RLQS), or the call ends DEADLINE_EXCEEDED and
    /// frees its stream for --max-streams. The JSON API's bodies on the
    /// HTTP port too (408 beyond).
    #[arg(long, default_value = "10s", value_parser = super::at_least_100ms)]
    request_timeout: Duration,
}

/// TLS on both ports; with a client CA, mTLS.
#[derive(Args, Debug)]
struct TlsArgs {
    /// The server's certificate chain (PEM); reloaded when it changes.
    #[arg(long, env = "FLOODGATE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The server's private key (PEM); reloaded when it changes.
    #[arg(long, env = "FLOODGATE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mTLS.
    #[arg(long, env = "FLOODGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Under mTLS, the descriptor that the caller's certificate name sets
    /// on every request (Acquire, AcquireBatch, Charge, Lease), whatever
    /// the caller sends: a caller cannot spend another origin's quota or
    /// pass an origin deny list. With --sentinel-rules it is also the
    /// descriptor Sentinel's limitApp and authority rules read.
    #[arg(long, alias = "sentinel-origin-key", env = "FLOODGATE_ORIGIN_KEY", default_value = "origin", value_parser = super::descriptor_key)]
    origin_key: String,
    /// Under mTLS, do NOT set the origin descriptor from the certificate:
    /// callers name their own origin, so any caller can spend another
    /// origin's quota and pass its deny lists. Only for callers that are
    /// all trusted.
    #[arg(long, env = "FLOODGATE_INSECURE_CALLERS_NAME_THEIR_ORIGIN")]
    insecure_callers_name_their_origin: bool,
}

/// Who may call Admin.
#[derive(Args, Debug)]
struct AdminArgs {
    /// Bearer tokens for Admin, one a line: TOKEN [admin|read [NAME]];
    /// reloaded when it changes.
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// A client certificate name (CN or SAN) allowed on Admin under mTLS,
    /// as NAME or NAME=read; repeat for more.
    #[arg(long = "admin-identity", value_parser = crate::access::parse_identity)]
    admin_identities: Vec<(String, crate::access::Role)>,
    /// Let anyone make the read-only Admin calls: those of the read role
    /// (GetRules, ListBreakers, GetBreaker, GetConcurrency, Peek, GetWhatIf,
    /// ListOverrides, GetTopKeys, GetDecisions, GetTraffic, ProposeLimit).
    /// GetTopKeys, GetDecisions, GetTraffic and ProposeLimit show callers'
    /// descriptor values.
    #[arg(long)]
    admin_read_open: bool,
}

/// Redis ACL credentials: never on the command line.
#[derive(Args, Debug)]
struct RedisAuthArgs {
    /// The Redis ACL user.
    #[arg(long, env = "FLOODGATE_REDIS_USER")]
    redis_user: Option<String>,
    /// A file holding the Redis password (or set FLOODGATE_REDIS_PASSWORD).
    #[arg(long, env = "FLOODGATE_REDIS_PASSWORD_FILE")]
    redis_password_file: Option<PathBuf>,
    /// For rediss://: the CA (PEM) to trust when it is not in the system's store.
    #[arg(long, env = "FLOODGATE_REDIS_CA")]
    redis_ca: Option<PathBuf>,
    /// A file holding the password the Redis Sentinels require
    /// (`requirepass` in sentinel.conf; or set
    /// FLOODGATE_REDIS_SENTINEL_PASSWORD). Leave it out for Sentinels
    /// without one: they refuse any password.
    #[arg(long, env = "FLOODGATE_REDIS_SENTINEL_PASSWORD_FILE", requires = "redis_sentinel")]
    redis_sentinel_password_file: Option<PathBuf>,
}

pub fn run(args: ServeArgs, log_format: super::LogFormat, log_level: String) -> anyhow::Result<()> {
    crate::runtime::build(args.threads)?.block_on(async move {
        let otlp = args.otlp.endpoint.clone().map(|endpoint| crate::traces::OtlpConfig {
            endpoint,
            sample_ratio: args.otlp.sample_ratio,
            service_name: args.otlp.service_name.clone(),
        });
        let exporter = super::init_logging(log_format, &log_level, otlp.as_ref());
        if let Some(o) = &otlp {
            tracing::info!(endpoint = %o.endpoint, sample_ratio = o.sample_ratio, "exporting traces over OTLP");
        }
        let served = serve(args).await;
        if let Some(exporter) = exporter {
            tokio::task::spawn_blocking(move || exporter.shutdown()).await.ok();
        }
        served
    })
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let (listen, http_listen) = (args.listen, args.http_listen);
    // Everything the flags say is read (files included) before a port is bound.
    let mut opts = options(args)?;
    let grpc = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding gRPC on {listen}"))?;
    let http =
        tokio::net::TcpListener::bind(http_listen).await.with_context(|| format!("binding HTTP on {http_listen}"))?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);
    opts.on_ready = Some(Box::new(move || {
        tracing::info!(grpc = %grpc_addr, http = %http_addr, "floodgate listening");
        // One line on stdout, once serving, for scripts and tests that start
        // the server on port 0.
        // A server whose standard output is closed keeps serving: the line
        // is for whoever watches it start, and the log says the same.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stdout(),
            format_args!("floodgate listening grpc={grpc_addr} http={http_addr}\n"),
        );
    }));
    server::run(opts, Listeners { grpc, http }, shutdown_signal()).await
}

/// The server's options from its flags.
fn options(args: ServeArgs) -> anyhow::Result<Options> {
    if !args.admin.admin_identities.is_empty() && args.tls.tls_client_ca.is_none() {
        anyhow::bail!(
            "--admin-identity names client certificates, which only --tls-client-ca asks for: without it no caller has one"
        );
    }
    let replication = replication_config(&args)?;
    let l = &args.limits;
    let limits = Limits {
        max_connections: l.max_connections,
        handshake_timeout: l.handshake_timeout,
        idle_timeout: l.idle_timeout,
        header_read_timeout: l.header_read_timeout,
        max_concurrent_streams: l.max_concurrent_streams,
        max_streams: l.max_streams,
        keepalive_interval: l.keepalive_interval,
        keepalive_timeout: l.keepalive_timeout,
        unfinished_bytes: l.max_unfinished_request_bytes,
        unfinished_bytes_per_connection: l.max_unfinished_request_bytes_per_connection,
        request_timeout: l.request_timeout,
    };
    let largest = crate::grpc::rpc::largest_cap();
    if limits.unfinished_bytes_per_connection < largest {
        anyhow::bail!(
            "--max-unfinished-request-bytes-per-connection {} is below the largest request ({largest} bytes, SetOverrides): such calls would always fail",
            limits.unfinished_bytes_per_connection
        );
    }
    if limits.unfinished_bytes < limits.unfinished_bytes_per_connection {
        anyhow::bail!(
            "--max-unfinished-request-bytes {} is below --max-unfinished-request-bytes-per-connection {}",
            limits.unfinished_bytes,
            limits.unfinished_bytes_per_connection
        );
    }
    let tls = match (args.tls.tls_cert, args.tls.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert, key, client_ca: args.tls.tls_client_ca }),
        _ => None,
    };
    let access = AccessConfig {
        token_file: args.admin.admin_token_file,
        identities: args.admin.admin_identities,
        read_open: args.admin.admin_read_open,
    };
    let (envoy, rls) = args.envoy.sources()?;
    Ok(Options {
        replication,
        config: args.config,
        envoy,
        sentinel: args.sentinel.sources(&args.tls.origin_key),
        origin: (!args.tls.insecure_callers_name_their_origin).then(|| args.tls.origin_key.clone()),
        rls,
        reload_quiet: args.reload_debounce,
        max_keys: args.max_keys,
        max_key_bytes: args.max_key_bytes,
        sweep_interval: args.sweep_interval,
        shutdown_grace: args.shutdown_grace,
        limits,
        max_watchers: l.max_watchers,
        http_hosts: args.http_hosts,
        overrides: crate::decider::OverrideOptions { file: args.overrides_file, max: args.max_overrides },
        decision_log: (args.decision_log, args.decision_log_size as usize),
        tls,
        access,
        clock: Arc::new(SystemClock::new()),
        on_ready: None,
    })
}

/// How this replica uses Redis, if it does.
fn replication_config(args: &ServeArgs) -> anyhow::Result<Option<replication::Config>> {
    let target = match (&args.redis, args.redis_cluster.is_empty(), &args.redis_sentinel_master) {
        (Some(url), _, _) => Target::Standalone(url.clone()),
        (None, false, _) => Target::Cluster(args.redis_cluster.clone()),
        (None, true, Some(master)) => {
            anyhow::ensure!(
                !master.is_empty()
                    && master.len() <= 256
                    && !master.chars().any(|c| c.is_control() || c.is_whitespace()),
                "--redis-sentinel-master {master:?}: a master name is 1 to 256 printable characters, without spaces"
            );
            let sentinels: Vec<String> = args.redis_sentinel.iter().filter(|s| !s.is_empty()).cloned().collect();
            anyhow::ensure!(!sentinels.is_empty(), "--redis-sentinel: at least one Sentinel URL is needed");
            Target::Sentinel { sentinels, master: master.clone() }
        }
        (None, true, None) => {
            let auth = &args.redis_auth;
            let given = [
                (auth.redis_user.is_some(), "--redis-user (FLOODGATE_REDIS_USER)"),
                (auth.redis_password_file.is_some(), "--redis-password-file (FLOODGATE_REDIS_PASSWORD_FILE)"),
                (auth.redis_ca.is_some(), "--redis-ca (FLOODGATE_REDIS_CA)"),
                (auth.redis_sentinel_password_file.is_some(), "--redis-sentinel-password-file"),
            ];
            if let Some((_, flag)) = given.iter().find(|(set, _)| *set) {
                anyhow::bail!(
                    "{flag} is for a server with --redis, --redis-cluster or --redis-sentinel; none is given"
                );
            }
            return Ok(None);
        }
    };
    target.check()?;
    Ok(Some(replication::Config {
        target,
        credentials: redis_credentials(&args.redis_auth)?,
        sync_interval: args.sync_interval,
        timeout: args.redis_timeout,
        replica_id: args.replica_id.clone().unwrap_or_else(default_replica_id),
    }))
}

/// The Redis user and password, from a file or the environment: a password
/// on the command line would show in `ps` and shell history.
fn redis_credentials(args: &RedisAuthArgs) -> anyhow::Result<Credentials> {
    let password = secret(&args.redis_password_file, "FLOODGATE_REDIS_PASSWORD", "the Redis password")?;
    let sentinel_password = secret(
        &args.redis_sentinel_password_file,
        "FLOODGATE_REDIS_SENTINEL_PASSWORD",
        "the Redis Sentinels' password",
    )?;
    let ca = match &args.redis_ca {
        Some(file) => Some(
            crate::files::read_file(file, 4 << 20)
                .with_context(|| format!("reading the Redis CA {}", file.display()))?,
        ),
        None => None,
    };
    Ok(Credentials { user: args.redis_user.clone(), password, ca, sentinel_password })
}

/// A password from its file (the line ending dropped) or, without a file,
/// from the environment variable `env`.
fn secret(file: &Option<PathBuf>, env: &str, what: &str) -> anyhow::Result<Option<String>> {
    Ok(match (file, std::env::var(env)) {
        (Some(file), _) => {
            let text = crate::files::read_text(file, 64 << 10)
                .with_context(|| format!("reading {what} from {}", file.display()))?;
            let password = text.trim_end_matches(['\n', '\r']).to_string();
            anyhow::ensure!(!password.is_empty(), "{}: {what} is empty", file.display());
            Some(password)
        }
        (None, Ok(p)) if !p.is_empty() => Some(p),
        _ => None,
    })
}

/// A replica id: 1 to 128 printable characters, no spaces.
fn replica_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 || s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("must be 1 to 128 printable characters, without spaces".into());
    }
    Ok(s.to_string())
}

fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "floodgate".to_string() } else { host };
    format!("{host}-{}", std::process::id())
}

/// SIGINT or SIGTERM. The handlers are installed now, before the server says
/// it is listening: a signal that arrives at once still stops it cleanly
/// (an async fn would install them only when first polled).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
        async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A share between 0 and 1.
fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a share between 0 and 1 (0.01 keeps one decision in a hundred)")),
    }
}
