//! Decisions per second one client process makes on a hot key, with and
//! without leases, and what four lease holders at once admit against what the
//! bucket holds. Run against a server with `client/examples/lease_bench.yaml`
//! (scripts/lease-bench does it all):
//!
//!     floodgate serve --config client/examples/lease_bench.yaml &
//!     cargo run --release -p floodgate-client --example lease_bench -- http://127.0.0.1:50051

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::{Acquire, Client, Verdict};

const TASKS: usize = 32;

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

async fn four_holders(url: &str, length: Duration) -> anyhow::Result<(u64, f64)> {
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = Client::builder().endpoint(url).leases(true).build()?;
        for _ in 0..4 {
            let (client, admitted) = (client.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                let req = Acquire::new("shared");
                while started.elapsed() < length {
                    if client.acquire(&req).await.expect("a decision").verdict == Verdict::Allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await?;
    }
    Ok((admitted.load(Ordering::Relaxed), started.elapsed().as_secs_f64()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let length = Duration::from_secs(5);
    let (without, rpcs_without) = rate(&url, false, length).await?;
    let (with, rpcs_with) = rate(&url, true, length).await?;
    println!("hot key, {TASKS} tasks, {}s each:", length.as_secs());
    println!("  without leases: {without:>12.0} decisions/s ({rpcs_without} RPCs)");
    println!("  with leases:    {with:>12.0} decisions/s ({rpcs_with} RPCs)");
    println!("  ratio:          {:>12.1}x", with / without);
    let (admitted, secs) = four_holders(&url, length).await?;
    // `shared`: capacity 1000, 1000/s. Leased units are taken before use.
    let bound = 1000.0 + 1000.0 * secs;
    println!("4 lease holders on one bucket (capacity 1000, 1000/s), {secs:.2}s:");
    println!("  admitted {admitted}, the bucket held at most {bound:.0} ({:.3} of it)", admitted as f64 / bound);
    Ok(())
}
