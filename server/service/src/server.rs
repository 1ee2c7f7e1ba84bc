//! The server entry: `run(options, listeners, shutdown)`. `main` only parses
//! flags. `run` is a short sequence of named steps: every conflict between
//! options is refused before anything connects, spawns or listens.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::access::{Access, AccessConfig};
use crate::decider::{self, Decider, Origin};
use crate::engine::sync::Replica;
use crate::engine::{Engine, EngineConfig};
use crate::listen::{Limits, Port, Tls, TlsFiles};
use crate::replication::Replication;
use crate::rules::envoy::EnvoyConfig;
use crate::rules::{RuleErrors, RuleSet};
use crate::time::SharedClock;
use crate::{grpc, http, reload};

/// The rules a fresh server starts with: embedded, memory only.
pub use floodgate_rules::DEFAULT_RULES;

pub struct Options {
    /// Redis, to share limits, breakers and rules with other replicas.
    pub replication: Option<crate::replication::Config>,
    /// A rules file to load and watch; `None` for the embedded default rules.
    pub config: Option<PathBuf>,
    /// An envoyproxy/ratelimit configuration: a directory to load and
    /// watch, or an xDS control plane to stream it from.
    pub envoy: EnvoySources,
    /// A directory of Sentinel's rules to load and watch, and how they meet requests.
    pub sentinel: Option<(PathBuf, crate::rules::sentinel::SentinelOptions)>,
    /// Under mTLS, the descriptor the caller's certificate name sets on
    /// every request; `None` lets callers name their own origin.
    pub origin: Option<String>,
    /// How Envoy's RLS answers.
    pub rls: crate::decider::RlsOptions,
    /// How long the rules file must stay unchanged before it is read again.
    pub reload_quiet: Duration,
    pub max_keys: usize,
    /// `--max-key-bytes`: the bytes of bucket keys held at most.
    pub max_key_bytes: usize,
    pub sweep_interval: Duration,
    /// How long in-flight calls may take to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// Connections, on both ports.
    pub limits: Limits,
    /// Watch streams open at once.
    pub max_watchers: usize,
    /// Host names the HTTP port answers to besides addresses and localhost.
    pub http_hosts: Vec<String>,
    /// Overrides set at run time: the file to keep them in without Redis, how many.
    pub overrides: crate::decider::OverrideOptions,
    /// The decision log: the share of decisions kept (0: off) and how many.
    pub decision_log: (f64, usize),
    /// TLS (and mTLS) on both ports.
    pub tls: Option<TlsFiles>,
    /// Who may call Admin.
    pub access: AccessConfig,
    pub clock: SharedClock,
    /// Called once rules are loaded and both ports are being served.
    pub on_ready: Option<Box<dyn FnOnce() + Send>>,
}

/// Where the envoyproxy/ratelimit configuration comes from (one at most).
#[derive(Clone, Debug, Default)]
pub struct EnvoySources {
    pub dir: Option<PathBuf>,
    pub xds: Option<crate::xds::XdsConfig>,
    /// Read with these options (domain merging).
    pub options: crate::rules::envoy::EnvoyOptions,
    /// With xDS: ready before the first configuration arrives (upstream's
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub ready_without_config: bool,
}

pub struct Listeners {
    pub grpc: TcpListener,
    pub http: TcpListener,
}

/// Reads and validates a rules file; every error names the file.
pub fn load_rules(path: &std::path::Path) -> Result<(RuleSet, String), RuleErrors> {
    let file = path.display().to_string();
    let text = crate::files::read_text(path, crate::rules::bounds::MAX_BYTES)
        .map_err(|e| RuleErrors::one(&file, format!("cannot read: {e}")))?;
    let rules = RuleSet::from_yaml(&text, &file)?;
    Ok((rules, text))
}

/// Serves until `shutdown` completes, then drains in-flight calls.
pub async fn run(
    opts: Options,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    check(&opts)?;
    let prometheus = start_metrics();
    let access = Access::load(opts.access.clone()).context("loading the admin tokens")?;
    let _tokens = access.watch()?;
    access.warn_if_loopback_only();
    let tls = load_tls(&opts)?;
    let (engine, replica) = build_engine(&opts);
    let sources = install_sources(&opts, &engine)?;
    let replication = start_replication(&opts, &engine, replica).await?;
    let last_sync = replication.clone();
    if opts.origin.is_none() && opts.tls.as_ref().is_some_and(|t| t.client_ca.is_some()) {
        tracing::warn!("--insecure-callers-name-their-origin: under mTLS, callers name their own origin");
    }
    let decider = Arc::new(
        Decider::new(engine.clone(), replication)
            .with_rls(opts.rls)
            .with_overrides(opts.overrides.clone())
            .with_origin_key(opts.origin.clone())
            .with_decision_log(crate::decider::decisions::DecisionLog::new(opts.decision_log.0, opts.decision_log.1)?),
    );
    if !decider.views().overrides_persisted() {
        tracing::info!("overrides set through Admin are kept in memory only (see --overrides-file)");
    }
    let (_background, gate) = spawn_background(&opts, &engine, &decider, sources, prometheus.clone())?;
    let ports = Ports { listeners, access, tls, prometheus, gate };
    serve(opts, ports, decider, shutdown).await?;
    // Drained: no call decides any more. What this replica took and owes
    // goes to Redis before the process ends.
    if let Some(replication) = last_sync {
        replication.last_sync(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// Options that cannot go together, refused before anything starts.
fn check(opts: &Options) -> anyhow::Result<()> {
    if opts.replication.is_some() && opts.overrides.file.is_some() {
        anyhow::bail!("--overrides-file is for a server without Redis: with Redis, overrides are kept there");
    }
    if opts.envoy.dir.is_some() && opts.envoy.xds.is_some() {
        anyhow::bail!("--envoy-config and --envoy-xds are two sources of one configuration: give one");
    }
    Ok(())
}

/// The Prometheus recorder (its upkeep runs in the background, see
/// [`spawn_background`]).
fn start_metrics() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    crate::metrics::install()
}

/// TLS for each port (both or neither), reloaded when the files change.
struct PortsTls {
    grpc: Option<Arc<Tls>>,
    http: Option<Arc<Tls>>,
}

fn load_tls(opts: &Options) -> anyhow::Result<PortsTls> {
    let Some(files) = &opts.tls else { return Ok(PortsTls { grpc: None, http: None }) };
    let grpc = Tls::load("gRPC", files.clone(), &[b"h2"]).context("TLS for gRPC")?;
    let http = Tls::load("HTTP", files.clone(), &[b"h2", b"http/1.1"]).context("TLS for HTTP")?;
    grpc.watch()?;
    http.watch()?;
    Ok(PortsTls { grpc: Some(grpc), http: Some(http) })
}

/// The engine, and what it keeps for the other replicas when it shares its
/// state through Redis.
fn build_engine(opts: &Options) -> (Arc<Engine>, Option<Arc<Replica>>) {
    metrics::gauge!(crate::metrics::MAX_KEYS).set(opts.max_keys as f64);
    metrics::gauge!(crate::metrics::MAX_KEY_BYTES).set(opts.max_key_bytes as f64);
    let config = EngineConfig { max_keys: opts.max_keys };
    let engine = Engine::new(config, opts.clock.clone()).with_max_key_bytes(opts.max_key_bytes);
    match opts.replication {
        Some(_) => {
            let replica = Arc::new(Replica::new());
            (Arc::new(engine.with_coordination(replica.clone())), Some(replica))
        }
        None => (Arc::new(engine), None),
    }
}

/// What the server reads at start and then watches.
struct Sources {
    /// The rules file and the text read from it.
    rules: Option<(PathBuf, String)>,
    /// The envoyproxy/ratelimit directory and the text read from it.
    envoy: Option<(PathBuf, String)>,
    /// Sentinel's directory and the text read from it.
    sentinel: Option<(PathBuf, String)>,
}

/// The rules file (or the embedded rules), the Envoy configuration and the
/// overrides file, installed before replication starts: rules another
/// replica applied through Admin (stored in Redis) then win over the file
/// until it changes.
fn install_sources(opts: &Options, engine: &Engine) -> anyhow::Result<Sources> {
    let rules = install_rules_in_force(opts, engine)?;
    let envoy = match &opts.envoy.dir {
        Some(dir) => {
            let (config, text) = EnvoyConfig::load_dir(dir, &opts.envoy.options).map_err(|e| anyhow::anyhow!("{e}"))?;
            let domains = config.domains().count();
            let version = decider::install_envoy(engine, config, text.clone(), dir);
            tracing::info!(dir = %dir.display(), domains, version, "envoyproxy/ratelimit configuration loaded");
            Some((dir.clone(), text))
        }
        None => None,
    };
    let sentinel = match &opts.sentinel {
        Some((dir, options)) => {
            let (rules, text) = crate::rules::sentinel::SentinelRules::load_dir(dir, options)
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(|| format!("--sentinel-rules {}", dir.display()))?;
            let (resources, ignored) = (rules.rules.len(), rules.ignored.len());
            let version = decider::install_sentinel(engine, rules, text.clone(), dir);
            tracing::info!(dir = %dir.display(), resources, ignored, version, "Sentinel's rules loaded");
            Some((dir.clone(), text))
        }
        None => None,
    };
    if let Some(path) = &opts.overrides.file {
        let table = decider::read_overrides_file(path, opts.overrides.max).context("reading the overrides file")?;
        let (count, version) = (table.len(), engine.control().install_overrides(Arc::new(table), Default::default()));
        tracing::info!(file = %path.display(), count, version, "overrides set at run time restored");
    }
    Ok(Sources { rules, envoy, sentinel })
}

async fn start_replication(
    opts: &Options,
    engine: &Arc<Engine>,
    replica: Option<Arc<Replica>>,
) -> anyhow::Result<Option<Arc<Replication>>> {
    let (Some(config), Some(replica)) = (opts.replication.clone(), replica) else { return Ok(None) };
    tracing::info!(redis = %config.target, sync_interval = ?config.sync_interval, "replicating through Redis");
    Ok(Some(Replication::start(config, engine.clone(), replica).await?))
}

/// Everything that runs beside the ports; stopped when dropped.
struct Background(Vec<tokio::task::JoinHandle<()>>);

/// What the ports are served with.
struct Ports {
    listeners: Listeners,
    access: Arc<Access>,
    tls: PortsTls,
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// What readiness waits for besides the ports.
    gate: Option<http::ReadyGate>,
}

impl Drop for Background {
    fn drop(&mut self) {
        self.0.iter().for_each(|t| t.abort());
    }
}

/// The file watchers, the xDS client, and the sweeper, the ticker (permit
/// and probe expiry, the degradation level), the override expiry and the
/// recorder's upkeep; and what readiness waits for (the first xDS
/// configuration).
fn spawn_background(
    opts: &Options,
    engine: &Arc<Engine>,
    decider: &Arc<Decider>,
    sources: Sources,
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
) -> anyhow::Result<(Background, Option<http::ReadyGate>)> {
    let mut tasks = Vec::new();
    let mut gate = None;
    if let Some(xds) = &opts.envoy.xds {
        let url = xds.url.clone();
        if !opts.envoy.ready_without_config {
            decider.await_envoy_config(url.clone());
        }
        let (task, status) = crate::xds::spawn(xds.clone(), decider.clone())?;
        tasks.push(task);
        if !opts.envoy.ready_without_config {
            let waiting: http::ReadyGate = Arc::new(move || {
                (!status.applied()).then(|| format!("waiting for the first Envoy configuration from {url}"))
            });
            gate = Some(waiting);
        }
    }
    let watched = sources.rules.is_some() || sources.sentinel.is_some() || sources.envoy.is_some();
    if let Some((path, text)) = sources.rules {
        tasks.push(reload::spawn(path, decider.clone(), text, opts.reload_quiet).context("watching the rules file")?);
    }
    if !watched {
        // SIGHUP must not end a server that has nothing to read again.
        reload::ignore_sighup();
    }
    if let Some(((dir, text), (_, options))) = sources.sentinel.zip(opts.sentinel.clone()) {
        let watcher = reload::spawn_sentinel(dir, decider.clone(), text, opts.reload_quiet, options)
            .context("watching Sentinel's rules")?;
        tasks.push(watcher);
    }
    if let Some((dir, text)) = sources.envoy {
        let watcher = reload::spawn_envoy(dir, decider.clone(), text, opts.reload_quiet, opts.envoy.options)
            .context("watching the envoyproxy/ratelimit configuration")?;
        tasks.push(watcher);
    }
    tasks.extend([
        crate::runtime::spawn_sweeper(engine, opts.sweep_interval),
        crate::runtime::spawn_ticker(engine, Duration::from_millis(100)),
        // Overrides that have ended stopped applying at their expiry
        // already; this removes them within a second.
        crate::runtime::every(Duration::from_secs(1), decider, |d| async move { d.control().expire_overrides().await }),
    ]);
    tasks.extend(decider.spawn_forwarded_reports());
    if let Some(handle) = prometheus {
        tasks.push(crate::runtime::every(Duration::from_secs(5), decider, move |_| {
            let handle = handle.clone();
            async move { handle.run_upkeep() }
        }));
    }
    Ok((Background(tasks), gate))
}

/// Both ports, until `shutdown`; then a drain of at most the grace period.
async fn serve(
    opts: Options,
    ports: Ports,
    decider: Arc<Decider>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Ports { listeners, access, tls, prometheus, gate } = ports;
    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
    let routes = grpc::routes(decider.clone(), health_service, access.clone(), opts.max_watchers)?;
    let health = http::HttpState::new(decider, prometheus, access, http::Hosts::new(&opts.http_hosts)).with_gate(gate);

    let (stop_tx, stop_rx) = watch::channel(false);
    let limits = opts.limits;
    let grpc_port = Port { name: "grpc", listener: listeners.grpc, tls: tls.grpc, limits };
    let http_port = Port { name: "http", listener: listeners.http, tls: tls.http, limits };
    let unfinished = grpc::size::Budget::new(limits.unfinished_bytes);
    let service = tower::ServiceBuilder::new()
        .layer(grpc::ObserveLayer::new())
        .layer(grpc::SizeLayer::new(unfinished).with_request_timeout(limits.request_timeout))
        .service(routes);
    let api = http::Api::new(
        tower::util::BoxCloneSyncService::new(service.clone()),
        limits.unfinished_bytes,
        limits.request_timeout,
    )?;
    let health = health.with_api(api);
    let grpc = grpc::serve(grpc_port, service, stopped(stop_rx.clone()));
    let http = http::serve(http_port, http::router(health.clone()), stopped(stop_rx));

    let grace = opts.shutdown_grace;
    let signal = {
        let health = health.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down: draining in-flight calls");
            health.set_ready(false);
            health.drain_streams();
            reporter.set_service_status("", tonic_health::ServingStatus::NotServing).await;
            let _ = stop_tx.send(true);
            // Clients that keep their connections open do not hold the exit forever.
            tokio::time::sleep(grace).await;
        }
    };
    health.set_ready(true);
    if let Some(ready) = opts.on_ready {
        ready();
    }
    tokio::select! {
        ((), ()) = async { tokio::join!(grpc, http) } => {}
        () = signal => tracing::warn!(?grace, "connections still open after the shutdown grace period; closing them"),
    }
    tracing::info!("stopped");
    Ok(())
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Installs the rules file or the embedded default rules; the file (to watch)
/// and the text read from it.
fn install_rules_in_force(opts: &Options, engine: &Engine) -> anyhow::Result<Option<(PathBuf, String)>> {
    let Some(path) = &opts.config else {
        if opts.envoy.dir.is_some() || opts.envoy.xds.is_some() || opts.sentinel.is_some() {
            tracing::info!("no rules file: only the Envoy configuration or Sentinel's rules decide");
            return Ok(None);
        }
        let rules = RuleSet::from_yaml(DEFAULT_RULES, "embedded").expect("the embedded rules are valid");
        decider::install(engine, rules, DEFAULT_RULES.to_string(), Origin::Embedded);
        tracing::info!("embedded default rules loaded");
        return Ok(None);
    };
    let (rules, text) = load_rules(path)?;
    let version = decider::install(engine, rules, text.clone(), Origin::File(path.display().to_string()));
    tracing::info!(file = %path.display(), version, "rules loaded");
    Ok(Some((path.clone(), text)))
}
