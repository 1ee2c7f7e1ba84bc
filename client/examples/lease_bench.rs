//! The lease benchmark, against a server with `client/examples/lease_bench.yaml`
//! (scripts/lease-bench does it all):
//!
//!     floodgate serve --config client/examples/lease_bench.yaml &
//!     cargo run --release -p floodgate-client --example lease_bench -- http://127.0.0.1:50051
//!
//! 1. Decisions per second one client process makes on a hot key, with and
//!    without leases.
//! 2. Fair shares: two and four worker processes (this program, run with
//!    `--worker`), each with its own client, offering a steady demand on one
//!    token bucket (1,000 at once, 200 a second, leases of 1 s): under, at and
//!    over what it refills. Each process's admitted rate once three renewals
//!    have passed, against its max-min fair share of the 200 a second; the
//!    total admitted against what the bucket held; Lease calls per process
//!    per second; and "nothing left" answers while the bucket held a share.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::{Acquire, Client, Verdict};

const TASKS: usize = 32;
/// The bucket of `fair`: what it refills a second, what it holds at once.
const RATE: f64 = 200.0;
const CAPACITY: f64 = 1000.0;
/// Three renewals (at 0.6 of a 1 s lease) and some.
const WARM_UP: Duration = Duration::from_secs(3);
const RUN: Duration = Duration::from_secs(12);

async fn rate(url: &str, leases: bool, length: Duration) -> anyhow::Result<(f64, u64)> {
    let client = Client::builder().endpoint(url).leases(leases).build()?;
    let decisions = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (client, decisions) = (client.clone(), decisions.clone());
        tasks.push(tokio::spawn(async move {
            let req = Acquire::new("hot").descriptor("user", "u1");
            while started.elapsed() < length {
                let d = client.acquire(&req).await.expect("a decision");
                assert_eq!(d.verdict, Verdict::Allowed);
                decisions.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let n = decisions.load(Ordering::Relaxed);
    Ok((n as f64 / started.elapsed().as_secs_f64(), client.stats().rpcs))
}

/// Max-min fair shares of `capacity` among `demands`.
fn max_min(capacity: f64, demands: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&a, &b| demands[a].total_cmp(&demands[b]));
    let (mut left, mut out) = (capacity, vec![0.0; demands.len()]);
    for (k, &i) in order.iter().enumerate() {
        let level = left / (demands.len() - k) as f64;
        out[i] = demands[i].min(level);
        left -= out[i];
    }
    out
}

/// One worker process: `demand` calls a second on `fair` for `run`, paced
/// by the millisecond; prints what it saw.
async fn worker(url: &str, run: &str, demand: f64, share: f64) -> anyhow::Result<()> {
    let client = Client::builder().endpoint(url).leases(true).build()?;
    let req = Acquire::new("fair").descriptor("run", run);
    let started = Instant::now();
    let (mut owed, mut last) = (0.0, started);
    let (mut admitted, mut measured, mut held_empty, mut was_allowed) = (0u64, 0u64, 0u64, true);
    let mut rpcs_at_warm_up = None;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    while started.elapsed() < RUN {
        tick.tick().await;
        let now = Instant::now();
        owed += demand * (now - last).as_secs_f64();
        last = now;
        let warm = started.elapsed() >= WARM_UP;
        if warm && rpcs_at_warm_up.is_none() {
            rpcs_at_warm_up = Some(client.stats().rpcs);
        }
        while owed >= 1.0 {
            owed -= 1.0;
            let d = client.acquire(&req).await?;
            if d.is_allowed() {
                admitted += 1;
                measured += u64::from(warm);
            } else if was_allowed
                && d.reason.contains("nothing left")
                && d.limits.first().is_some_and(|l| l.remaining as f64 >= share)
            {
                held_empty += 1;
            }
            was_allowed = d.is_allowed();
        }
    }
    let seconds = (RUN - WARM_UP).as_secs_f64();
    let rpcs = client.stats().rpcs - rpcs_at_warm_up.unwrap_or(0);
    println!("{} {} {} {}", measured as f64 / seconds, admitted, rpcs as f64 / seconds, held_empty);
    Ok(())
}

/// What each worker of one scenario printed.
struct Seen {
    rate: f64,
    admitted: u64,
    rpcs_per_second: f64,
    nothing_left_while_held: u64,
}

fn scenario(url: &str, name: &str, demands: &[f64]) -> anyhow::Result<bool> {
    let fair = max_min(RATE, demands);
    let exe = std::env::current_exe()?;
    let children: Vec<_> = demands
        .iter()
        .zip(&fair)
        .map(|(d, f)| {
            Command::new(&exe)
                .args([url, "--worker", name, &d.to_string(), &f.to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut seen = Vec::new();
    for child in children {
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let f: Vec<f64> = text.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        anyhow::ensure!(out.status.success() && f.len() == 4, "a worker failed: {text}");
        seen.push(Seen {
            rate: f[0],
            admitted: f[1] as u64,
            rpcs_per_second: f[2],
            nothing_left_while_held: f[3] as u64,
        });
    }
    let total: u64 = seen.iter().map(|s| s.admitted).sum();
    let bound = CAPACITY + RATE * RUN.as_secs_f64();
    let mut ok = (total as f64) <= bound * 1.01;
    println!("{name}: demands {demands:?}/s");
    for ((s, f), d) in seen.iter().zip(&fair).zip(demands) {
        let ratio = s.rate / f;
        ok &= ratio >= 0.95 && s.nothing_left_while_held == 0;
        println!(
            "  demand {d:>5.0}/s: admitted {:>6.1}/s after warm-up, fair share {f:>5.1}/s ({ratio:.3}), {:.2} Lease calls/s, {} 'nothing left' with a share in the bucket",
            s.rate, s.rpcs_per_second, s.nothing_left_while_held
        );
    }
    println!(
        "  total admitted {total} in {}s; the bucket held at most {bound:.0} ({:.3} of it)",
        RUN.as_secs(),
        total as f64 / bound
    );
    Ok(ok)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).cloned().unwrap_or_else(|| "http://127.0.0.1:50051".into());
    if args.get(2).map(String::as_str) == Some("--worker") {
        let (run, demand, share) = (&args[3], args[4].parse()?, args[5].parse()?);
        return worker(&url, run, demand, share).await;
    }
    let length = Duration::from_secs(5);
    let (without, rpcs_without) = rate(&url, false, length).await?;
    let (with, rpcs_with) = rate(&url, true, length).await?;
    println!("hot key, {TASKS} tasks, {}s each:", length.as_secs());
    println!("  without leases: {without:>12.0} decisions/s ({rpcs_without} RPCs)");
    println!("  with leases:    {with:>12.0} decisions/s ({rpcs_with} RPCs)");
    println!("  ratio:          {:>12.1}x", with / without);
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let mut all = with / without >= 10.0;
    for (name, demands) in [
        ("two-under", &[50.0, 50.0][..]),
        ("two-at", &[100.0, 100.0]),
        ("two-over", &[300.0, 100.0]),
        ("four-under", &[20.0, 30.0, 40.0, 50.0]),
        ("four-at", &[50.0, 50.0, 50.0, 50.0]),
        ("four-over", &[400.0, 300.0, 100.0, 20.0]),
    ] {
        all &= scenario(&url, &format!("{name}-{stamp}"), demands)?;
    }
    println!("{}", if all { "every target met" } else { "TARGET MISSED" });
    Ok(())
}
