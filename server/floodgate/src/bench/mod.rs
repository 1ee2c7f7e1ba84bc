//! `floodgate bench`: a ghz-style load generator for Floodgate's RPCs.
//!
//! Requests are encoded up front (or per call when spread over many keys) and
//! answers read through small views, so the generator takes as little as it
//! can from a machine it shares with the server. Latency is measured from when
//! a call was due (`--rps`), so a slow server cannot hide queueing.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::{Args, ValueEnum};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3 as envoy_common;
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use floodgate_proto::v1 as pb;
use prost::Message;
use serde_json::json;
use tonic::transport::Channel;

pub mod load;
pub mod report;
mod scrape;
pub mod wire;

pub use load::{Plan, Rpc, Stop};
pub use report::{Report, Samples};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub target: crate::connect::Target,
    /// The call to make.
    #[arg(long, value_enum, default_value_t = Rpc::Acquire)]
    pub rpc: Rpc,
    /// Workers sending at once.
    #[arg(long, short = 'c', default_value_t = 50)]
    pub concurrency: usize,
    /// HTTP/2 connections the workers share.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Calls to make (default 10000 unless --duration is given).
    #[arg(long, short = 'n')]
    pub total: Option<u64>,
    /// Send for this long instead of a number of calls.
    #[arg(long, short = 'z', value_parser = crate::rules::duration::parse)]
    pub duration: Option<Duration>,
    /// Open loop: this many calls per second in total, latency measured from
    /// each call's due time. Without it, each worker sends back to back.
    #[arg(long)]
    pub rps: Option<f64>,
    /// Spread calls over this many values of the key descriptor.
    #[arg(long, default_value_t = 1)]
    pub keys: u64,
    /// The descriptor whose values are spread.
    #[arg(long, default_value = "user")]
    pub key_descriptor: String,
    /// Key values shaped like a UUID (36 characters, as a real user id often
    /// is) instead of the short `k<n>`: for memory figures with keys of a
    /// realistic length. The same `n` always gives the same value.
    #[arg(long)]
    pub uuid_keys: bool,
    /// Items per AcquireBatch call.
    #[arg(long, default_value_t = 100)]
    pub batch_size: usize,
    /// The resource (or Envoy domain) to ask about.
    #[arg(long, default_value = "bench")]
    pub resource: String,
    /// Cost of each decision (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub cost: u32,
    /// Per-call deadline.
    #[arg(long, default_value = "20s", value_parser = crate::rules::duration::parse)]
    pub timeout: Duration,
    /// Summary format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the summary here instead of stdout.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// The server's /metrics URL: scraped before and after to report the
    /// server's keys and resident memory, and the bytes per key added.
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// No progress lines on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Runtime threads for the generator (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// A file of calls to send in turn, as ghz's data files: a JSON list of
    /// {"resource": NAME, "descriptors": {KEY: VALUE, ..}, "cost": N}
    /// (descriptors and cost may be left out). It replaces --resource,
    /// --keys, --key-descriptor and --cost. For --rpc envoy, the resource is
    /// the domain.
    #[arg(long, conflicts_with_all = ["resource", "keys", "key_descriptor", "cost"])]
    pub data: Option<PathBuf>,
    /// With --rpc report: the share of calls reported as FAILURE, from 0 to
    /// 1, spread evenly over the run (0.25: every fourth call), so that a
    /// breaker can be load-tested.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub failure_ratio: f64,
}

/// One call of a `--data` file.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    resource: String,
    #[serde(default)]
    descriptors: std::collections::BTreeMap<String, String>,
    #[serde(default = "one")]
    cost: u32,
}

fn one() -> u32 {
    1
}

/// The largest `--data` file, and the most calls in it.
const MAX_DATA_BYTES: usize = 64 << 20;
const MAX_DATA_CALLS: usize = 1_000_000;

/// Reads a `--data` file as the server reads its own files: a regular file
/// only (a FIFO or /dev/zero is refused, never waited on), at most 64 MiB;
/// every call checked.
fn read_data(path: &std::path::Path) -> anyhow::Result<Vec<Call>> {
    let text =
        crate::rules::files::read_file(path, MAX_DATA_BYTES).with_context(|| format!("--data {}", path.display()))?;
    let calls: Vec<Call> = serde_json::from_slice(&text)
        .with_context(|| format!("--data {}: not a JSON list of calls", path.display()))?;
    anyhow::ensure!(!calls.is_empty(), "--data {}: no calls", path.display());
    anyhow::ensure!(calls.len() <= MAX_DATA_CALLS, "--data {}: more than {MAX_DATA_CALLS} calls", path.display());
    for (i, c) in calls.iter().enumerate() {
        anyhow::ensure!(!c.resource.is_empty(), "--data {}: call {i} has an empty resource", path.display());
        anyhow::ensure!(c.cost >= 1, "--data {}: call {i} has a cost of 0", path.display());
    }
    Ok(calls)
}

/// Where the calls come from: one resource over `--keys` values of one
/// descriptor, or a `--data` file.
#[derive(Clone)]
enum Calls {
    Keys { resource: String, descriptor: String, keys: u64, cost: u32, uuid: bool },
    Data(std::sync::Arc<[Call]>),
}

impl Calls {
    /// How many calls before they repeat.
    fn period(&self) -> u64 {
        match self {
            Calls::Keys { keys, .. } => *keys,
            Calls::Data(calls) => calls.len() as u64,
        }
    }

    /// The `n`th call.
    fn nth(&self, n: u64) -> Call {
        match self {
            Calls::Keys { resource, descriptor, keys, cost, uuid } => Call {
                resource: resource.clone(),
                descriptors: [(descriptor.clone(), key_value(n % keys, *uuid))].into(),
                cost: *cost,
            },
            Calls::Data(calls) => calls[(n % calls.len() as u64) as usize].clone(),
        }
    }
}

/// The value of key `n`: `k<n>`, or a UUID-shaped string made from `n`
/// (its bits spread by a multiplication, so that values do not share long
/// prefixes, as real ids do not).
fn key_value(n: u64, uuid: bool) -> String {
    if !uuid {
        return format!("k{n}");
    }
    let a = n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let b = a.rotate_left(29) ^ n;
    let hex = format!("{a:016x}{b:016x}");
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    crate::runtime::build(args.threads)?.block_on(bench(args))
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.keys >= 1, "--keys must be at least 1");
    anyhow::ensure!((1..=1000).contains(&args.batch_size), "--batch-size must be between 1 and 1000");
    anyhow::ensure!(args.rps.is_none_or(|r| r > 0.0), "--rps must be positive");
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.failure_ratio),
        "--failure-ratio must be between 0 and 1, got {}",
        args.failure_ratio
    );
    anyhow::ensure!(
        args.failure_ratio == 0.0 || args.rpc == Rpc::Report,
        "--failure-ratio needs --rpc report (only reports have an outcome)"
    );
    let calls = match &args.data {
        Some(path) => Calls::Data(read_data(path)?.into()),
        None => Calls::Keys {
            resource: args.resource.clone(),
            descriptor: args.key_descriptor.clone(),
            keys: args.keys,
            cost: args.cost,
            uuid: args.uuid_keys,
        },
    };
    let channels = connect(&args).await?;
    let before = match &args.metrics_url {
        Some(url) => Some(scrape::server_figures(url).await?),
        None => None,
    };
    let stop = match (args.total, args.duration) {
        (Some(n), _) => Stop::Total(n),
        (None, Some(d)) => Stop::After(d),
        (None, None) => Stop::Total(10_000),
    };
    if !args.quiet {
        eprintln!(
            "floodgate bench: {:?} on {} with {} workers over {} connections",
            args.rpc, args.target.server, args.concurrency, args.connections
        );
    }
    let plan = Plan {
        rpc: args.rpc,
        payload: payloads(&args, calls),
        failure_ratio: args.failure_ratio,
        concurrency: args.concurrency,
        stop,
        rps: args.rps,
        timeout: args.timeout,
    };
    let (samples, took) = load::run(channels, plan, !args.quiet).await;
    let mut report = Report::new(samples, took);
    if let (Some(url), Some(before)) = (&args.metrics_url, before) {
        let after = scrape::server_figures(url).await?;
        report.server = Some(scrape::memory_per_key(&before, &after));
    }
    let text = match args.format {
        Format::Text => report.to_text(),
        Format::Json => serde_json::to_string_pretty(&report.to_json(&now_rfc3339(), options(&args)))? + "\n",
    };
    match &args.output {
        Some(path) => std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?,
        None => out!("{text}"),
    }
    Ok(())
}

async fn connect(args: &BenchArgs) -> anyhow::Result<Vec<Channel>> {
    let url = args.target.url();
    let endpoint = args.target.endpoint()?.connect_timeout(Duration::from_secs(5));
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        channels.push(endpoint.connect().await.with_context(|| format!("cannot reach {url}"))?);
    }
    Ok(channels)
}

/// Builds call number `i`: pre-encoded when few distinct calls, encoded per
/// call otherwise.
fn payloads(args: &BenchArgs, calls: Calls) -> Box<dyn Fn(u64) -> Bytes + Send + Sync> {
    const PRE_ENCODED: u64 = 4096;
    let (rpc, batch) = (args.rpc, args.batch_size as u64);
    // Call i uses call i (batch i, calls i*B..i*B+B): they repeat with this period.
    let period = calls.period();
    let distinct = match rpc {
        Rpc::Batch => period / gcd(period, batch),
        _ => period,
    };
    if distinct <= PRE_ENCODED {
        let all: Vec<Bytes> = (0..distinct).map(|i| encode(rpc, batch, &calls, i)).collect();
        Box::new(move |i| all[(i % all.len() as u64) as usize].clone())
    } else {
        Box::new(move |i| encode(rpc, batch, &calls, i))
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn acquire_item(call: Call) -> pb::AcquireRequest {
    pb::AcquireRequest {
        settle: false,
        priority: 0,
        resource: call.resource,
        descriptors: call.descriptors.into_iter().collect(),
        cost: call.cost,
        dry_run: false,
        usage: Default::default(),
    }
}

fn encode(rpc: Rpc, batch: u64, calls: &Calls, i: u64) -> Bytes {
    let bytes = match rpc {
        Rpc::Acquire | Rpc::Report => acquire_item(calls.nth(i)).encode_to_vec(),
        Rpc::Batch => {
            let requests = (0..batch).map(|j| acquire_item(calls.nth(i * batch + j))).collect();
            pb::AcquireBatchRequest { requests }.encode_to_vec()
        }
        Rpc::Health => Vec::new(),
        Rpc::Envoy => {
            let call = calls.nth(i);
            let entries = call
                .descriptors
                .into_iter()
                .map(|(key, value)| envoy_common::rate_limit_descriptor::Entry { key, value })
                .collect();
            rls::RateLimitRequest {
                domain: call.resource,
                descriptors: vec![envoy_common::RateLimitDescriptor { entries, ..Default::default() }],
                hits_addend: call.cost,
            }
            .encode_to_vec()
        }
    };
    Bytes::from(bytes)
}

fn options(args: &BenchArgs) -> serde_json::Value {
    json!({
        "host": args.target.server,
        "call": args.rpc.path().as_str(),
        "concurrency": args.concurrency,
        "connections": args.connections,
        "total": args.total,
        "duration": args.duration.map(|d| d.as_nanos() as u64),
        "rps": args.rps,
        "keys": args.keys,
        "batchSize": args.batch_size,
        "resource": args.resource,
        "data": args.data.as_ref().map(|p| p.display().to_string()),
        "failureRatio": args.failure_ratio,
        "timeout": args.timeout.as_nanos() as u64,
    })
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn uuid_keys_are_uuid_shaped_distinct_and_stable() {
        let values: std::collections::HashSet<String> = (0..10_000).map(|n| key_value(n, true)).collect();
        assert_eq!(values.len(), 10_000, "every key is its own value");
        let v = key_value(7, true);
        assert_eq!(v, key_value(7, true));
        assert_eq!(v.len(), 36);
        let groups: Vec<usize> = v.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert!(v.chars().all(|c| c == '-' || c.is_ascii_hexdigit()), "{v}");
        assert_eq!(key_value(7, false), "k7");
    }
}
