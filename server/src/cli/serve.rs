//! `floodgate serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::replication::{self, Target};
use crate::server::{self, Listeners, Options};
use crate::time::SystemClock;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Rules file (YAML), watched for changes. Without it, the embedded default rules.
    #[arg(long, short = 'c', env = "FLOODGATE_CONFIG")]
    config: Option<PathBuf>,

    /// gRPC address (Floodgate, Admin, health, reflection). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:50051", env = "FLOODGATE_LISTEN")]
    listen: SocketAddr,

    /// HTTP address for /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:8080", env = "FLOODGATE_HTTP_LISTEN")]
    http_listen: SocketAddr,

    /// The most buckets held in memory; beyond it the least recently used are evicted.
    #[arg(long, default_value_t = 10_000_000)]
    max_keys: usize,

    /// How often idle buckets are forgotten.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    sweep_interval: Duration,

    /// How long in-flight calls may take to finish after SIGTERM or SIGINT.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    shutdown_grace: Duration,

    /// Share limits, breakers and rules with other replicas through this Redis
    /// (e.g. redis://127.0.0.1:6379).
    #[arg(long, env = "FLOODGATE_REDIS", conflicts_with = "redis_cluster")]
    redis: Option<String>,

    /// The same through a Redis Cluster: seed nodes, comma-separated.
    #[arg(long, env = "FLOODGATE_REDIS_CLUSTER", value_delimiter = ',')]
    redis_cluster: Vec<String>,

    /// How often replicated limits and breakers are synced with Redis.
    #[arg(long, default_value = "100ms", value_parser = super::parse_duration)]
    sync_interval: Duration,

    /// The longest any call waits for Redis.
    #[arg(long, default_value = "50ms", value_parser = super::parse_duration)]
    redis_timeout: Duration,

    /// This replica's name among the live replicas (default: host and process id).
    #[arg(long, env = "FLOODGATE_REPLICA_ID")]
    replica_id: Option<String>,

    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    crate::runtime::build(args.threads)?.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let grpc =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding gRPC on {}", args.listen))?;
    let http = tokio::net::TcpListener::bind(args.http_listen)
        .await
        .with_context(|| format!("binding HTTP on {}", args.http_listen))?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);
    let target = match (args.redis, args.redis_cluster.is_empty()) {
        (Some(url), _) => Some(Target::Standalone(url)),
        (None, false) => Some(Target::Cluster(args.redis_cluster)),
        (None, true) => None,
    };
    let replication = target.map(|target| replication::Config {
        target,
        sync_interval: args.sync_interval.max(Duration::from_millis(1)),
        timeout: args.redis_timeout.max(Duration::from_millis(1)),
        replica_id: args.replica_id.unwrap_or_else(default_replica_id),
    });
    let opts = Options {
        replication,
        config: args.config,
        max_keys: args.max_keys,
        sweep_interval: args.sweep_interval,
        shutdown_grace: args.shutdown_grace,
        clock: Arc::new(SystemClock::new()),
        on_ready: Some(Box::new(move || {
            tracing::info!(grpc = %grpc_addr, http = %http_addr, "floodgate listening");
            // One line on stdout, once serving, for scripts and tests that start
            // the server on port 0.
            println!("floodgate listening grpc={grpc_addr} http={http_addr}");
        })),
    };
    server::run(opts, Listeners { grpc, http }, shutdown_signal()).await
}

fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "floodgate".to_string() } else { host };
    format!("{host}-{}", std::process::id())
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
