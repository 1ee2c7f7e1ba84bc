//! `floodgate serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

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

    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        runtime.worker_threads(n.max(1));
    }
    let runtime = runtime.enable_all().build().context("starting the runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let grpc =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding gRPC on {}", args.listen))?;
    let http = tokio::net::TcpListener::bind(args.http_listen)
        .await
        .with_context(|| format!("binding HTTP on {}", args.http_listen))?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);
    let opts = Options {
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
