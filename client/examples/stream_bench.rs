//! The streamed-call benchmark, against a server with
//! `client/examples/stream_bench.yaml` (scripts/stream-bench does it all):
//!
//!     floodgate serve --config client/examples/stream_bench.yaml &
//!     cargo run --release -p floodgate-client --example stream_bench -- http://127.0.0.1:50051
//!
//! LLM-shaped traffic: 50 tenants, each with a budget of 20,000 tokens, run 8
//! streams at a time until the budget says stop. Each stream reserves an
//! estimate of 400 tokens, then streams 100 to 1,500 tokens (drawn at random)
//! in chunks of 1 to 40 (a token bucket of the client's `Metered` call).
//! Reported:
//!
//! - the worst overshoot of a tenant's budget, against its bound: at most one
//!   chunk per stream in flight when the budget ran out;
//! - charges applied twice: what the server's ledger counted for each tenant,
//!   less what the tenant's streams counted (0 expected), and the other way
//!   round, tokens not charged (0 expected);
//! - RPCs a second with metered streams, against plain Acquire calls from as
//!   many tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::{Acquire, Client, Flow, Metering, Outcome};

const TENANTS: usize = 50;
const STREAMS_PER_TENANT: usize = 8;
const BUDGET: u64 = 20_000;
const ESTIMATE: u32 = 400;
const MAX_CHUNK: u64 = 40;
const LEDGER: u64 = 1_000_000_000_000;

/// A small deterministic generator: the same run every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

struct Tenant {
    used: AtomicU64,
    rpcs: AtomicU64,
    /// Streams still going when the first stop came, and the largest chunk.
    in_flight_at_stop: AtomicU64,
    live: AtomicU64,
}

/// One stream: reserve, stream chunks until done or told to stop, settle.
/// Whether it was stopped (or denied at the start: the budget is gone).
async fn stream(client: &Client, tenant: &str, t: &Tenant, rng: &mut Rng) -> bool {
    let req = Acquire::new("llm").descriptor("tenant", tenant).cost(ESTIMATE);
    t.rpcs.fetch_add(1, Ordering::Relaxed);
    let mut call = match client.meter(&req).await.expect("a decision") {
        Metering::Admitted(call) => call,
        Metering::Denied(_) => return true,
    };
    t.live.fetch_add(1, Ordering::Relaxed);
    let length = rng.between(100, 1_500);
    let mut stopped = false;
    while call.used() < length {
        let chunk = rng.between(1, MAX_CHUNK).min(length - call.used());
        let beyond = call.used() + chunk > u64::from(ESTIMATE);
        let flow = call.add(chunk).await;
        t.rpcs.fetch_add(u64::from(beyond), Ordering::Relaxed);
        if let Flow::Stop { .. } = flow {
            let live = t.live.load(Ordering::Relaxed);
            t.in_flight_at_stop.fetch_max(live, Ordering::Relaxed);
            stopped = true;
            break;
        }
    }
    t.used.fetch_add(call.used(), Ordering::Relaxed);
    t.live.fetch_sub(1, Ordering::Relaxed);
    t.rpcs.fetch_add(1, Ordering::Relaxed);
    call.finish(Outcome::Success);
    stopped
}

async fn plain(client: Client, length: Duration, tasks: usize) -> f64 {
    let calls = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for k in 0..tasks {
        let (client, calls) = (client.clone(), calls.clone());
        handles.push(tokio::spawn(async move {
            let req = Acquire::new("plain").descriptor("tenant", format!("t{}", k % TENANTS));
            while started.elapsed() < length {
                client.acquire(&req).await.expect("a decision");
                calls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    calls.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let client = Client::builder().endpoint(&url).request_timeout(Duration::from_secs(5)).build()?;
    let tenants: Arc<Vec<Tenant>> = Arc::new(
        (0..TENANTS)
            .map(|_| Tenant {
                used: AtomicU64::new(0),
                rpcs: AtomicU64::new(0),
                in_flight_at_stop: AtomicU64::new(0),
                live: AtomicU64::new(0),
            })
            .collect(),
    );
    let started = Instant::now();
    let mut handles = Vec::new();
    for i in 0..TENANTS * STREAMS_PER_TENANT {
        let (client, tenants) = (client.clone(), tenants.clone());
        handles.push(tokio::spawn(async move {
            let n = i % TENANTS;
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1));
            // Streams one after another until the budget stops one.
            while !stream(&client, &format!("t{n}"), &tenants[n], &mut rng).await {}
        }));
    }
    for h in handles {
        h.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    client.flush().await;

    let (mut worst, mut worst_bound, mut twice, mut lost, mut rpcs, mut tokens) = (0i64, 0u64, 0i64, 0i64, 0u64, 0u64);
    for (n, t) in tenants.iter().enumerate() {
        let used = t.used.load(Ordering::Relaxed);
        let peek = Acquire::new("llm").descriptor("tenant", format!("t{n}")).cost(1).dry_run();
        let d = client.acquire(&peek).await?;
        let ledger = d.limits.iter().find(|l| l.name == "ledger").expect("the ledger limit");
        // An admitted dry run reports what is left after its own 1; a denied
        // one (the budget is used up) what is left.
        let counted = LEDGER - ledger.remaining - u64::from(d.is_allowed());
        twice = twice.max(counted as i64 - used as i64);
        lost = lost.max(used as i64 - counted as i64);
        let over = used as i64 - BUDGET as i64;
        if over > worst {
            worst = over;
            worst_bound = t.in_flight_at_stop.load(Ordering::Relaxed) * MAX_CHUNK;
        }
        rpcs += t.rpcs.load(Ordering::Relaxed);
        tokens += used;
    }
    println!(
        "tenants {TENANTS}, {STREAMS_PER_TENANT} streams each at a time, budget {BUDGET} tokens, estimate {ESTIMATE}, chunks 1-{MAX_CHUNK}"
    );
    println!(
        "worst overshoot of a budget: {worst} tokens (bound for that tenant: {worst_bound} = streams in flight x largest chunk)"
    );
    println!("charges applied twice (server ledger less the streams' count, worst tenant): {twice}");
    println!("tokens not charged (the streams' count less the server ledger, worst tenant): {lost}");
    println!(
        "metered: {tokens} tokens in {elapsed:.2} s, {:.0} RPCs/s (Acquire, Charge, ReportOutcome)",
        rpcs as f64 / elapsed
    );
    let tasks = TENANTS * STREAMS_PER_TENANT;
    let plain = plain(client.clone(), Duration::from_secs(5), tasks).await;
    println!("plain Acquire from {tasks} tasks: {plain:.0} calls/s");
    Ok(())
}
