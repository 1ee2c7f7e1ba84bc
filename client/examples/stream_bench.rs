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
//!
//! With `--waterfall URL URL...` (scripts/waterfall-bench does it all), the
//! same streams run against resource `chat` of
//! `client/examples/waterfall_bench.yaml` on two replicas that share Redis:
//! each tenant's 20,000 tokens are a minute budget of 3,000, then a monthly
//! allowance of 5,000, then 12,000 credits that the benchmark tops up
//! through Admin first. The client knows every replica, so a replica killed
//! mid run (the script kills the first) sends its streams to the next, and
//! the same charge sent again is not taken twice. The ledger is read from
//! the last replica: what each budget took, and what the credits spent.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::proto::v1 as pb;
use floodgate_client::proto::v1::admin_client::AdminClient;
use floodgate_client::{Acquire, Client, Flow, Metering, Outcome};

const TENANTS: usize = 50;
const STREAMS_PER_TENANT: usize = 8;
const BUDGET: u64 = 20_000;
const ESTIMATE: u32 = 400;
const MAX_CHUNK: u64 = 40;
const LEDGER: u64 = 1_000_000_000_000;
/// The waterfall's budgets, in the order they pay (waterfall_bench.yaml).
const MINUTE: u64 = 3_000;
const MONTH: u64 = 5_000;
const CREDITS: u64 = 12_000;
/// The minute and month budgets refill 1 token in 1,000 s: during a run they
/// do not refill, and what each took is its reset time times that rate.
const REFILL_PER_SECOND: f64 = 0.001;

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
    /// Streams whose last charge (or start) each source paid: the rule's own
    /// limits, then the waterfall's sources in order.
    paid: [AtomicU64; 3],
    rpcs: AtomicU64,
    /// Streams still going when the first stop came, and the largest chunk.
    in_flight_at_stop: AtomicU64,
    live: AtomicU64,
}

/// One stream: reserve, stream chunks until done or told to stop, settle.
/// Whether it was stopped (or denied at the start: the budget is gone).
async fn stream(client: &Client, resource: &str, tenant: &str, t: &Tenant, rng: &mut Rng) -> bool {
    let req = Acquire::new(resource).descriptor("tenant", tenant).cost(ESTIMATE);
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
    let source = match call.paid_by() {
        "month" => 1,
        "credits" => 2,
        _ => 0,
    };
    t.paid[source].fetch_add(1, Ordering::Relaxed);
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

/// What the server took from tenant `n`, in total: read from the `ledger`
/// limit of `llm`, or from the three budgets of `chat` (the credits by
/// taking one and giving it back: the answer says what the balance holds,
/// below 0 when it owes, which a Peek does not).
async fn counted(client: &Client, admin_url: Option<&str>, n: usize) -> anyhow::Result<u64> {
    let tenant = format!("t{n}");
    let Some(url) = admin_url else {
        let peek = Acquire::new("llm").descriptor("tenant", tenant).cost(1).dry_run();
        let d = client.acquire(&peek).await?;
        let ledger = d.limits.iter().find(|l| l.name == "ledger").expect("the ledger limit");
        // An admitted dry run reports what is left after its own 1; a denied
        // one (the budget is used up) what is left.
        return Ok(LEDGER - ledger.remaining - u64::from(d.is_allowed()));
    };
    let mut admin = AdminClient::connect(url.to_string()).await?;
    let descriptors = HashMap::from([("tenant".to_string(), tenant)]);
    let peek = pb::PeekRequest { resource: "chat".into(), descriptors: descriptors.clone(), limit: String::new() };
    let mut taken = 0;
    for l in admin.peek(peek).await?.into_inner().limits {
        if l.name == "minute" || l.name == "month" {
            let reset = l.reset_after.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
            taken += (reset * REFILL_PER_SECOND).round() as u64;
        }
    }
    let adjust = |amount: i64| {
        let req = pb::AdjustBalanceRequest {
            resource: "chat".into(),
            descriptors: descriptors.clone(),
            limit: "credits".into(),
            amount,
            reason: "stream_bench: read the balance".into(),
        };
        let mut admin = admin.clone();
        async move { anyhow::Ok(admin.adjust_balance(req).await?.into_inner().balance) }
    };
    let left = adjust(-1).await? + 1;
    adjust(1).await?;
    Ok(taken + (CREDITS as i64 - left) as u64)
}

/// Tops up every tenant's credits (the waterfall's last source).
async fn top_up(url: &str) -> anyhow::Result<()> {
    let mut admin = AdminClient::connect(url.to_string()).await?;
    for n in 0..TENANTS {
        let req = pb::AdjustBalanceRequest {
            resource: "chat".into(),
            descriptors: HashMap::from([("tenant".to_string(), format!("t{n}"))]),
            limit: "credits".into(),
            amount: CREDITS as i64,
            reason: "stream_bench: the credits each tenant bought".into(),
        };
        admin.adjust_balance(req).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let waterfall = args.first().is_some_and(|a| a == "--waterfall");
    if waterfall {
        args.remove(0);
    }
    if args.is_empty() {
        args.push("http://127.0.0.1:50051".into());
    }
    let (resource, budget) = if waterfall { ("chat", MINUTE + MONTH + CREDITS) } else { ("llm", BUDGET) };
    let mut builder = Client::builder().request_timeout(Duration::from_secs(if waterfall { 2 } else { 5 }));
    for url in &args {
        builder = builder.endpoint(url);
    }
    let client = builder.build()?;
    // The ledger is read where the run ends: the last replica named.
    let survivor = args.last().expect("a server").clone();
    if waterfall {
        top_up(&args[0]).await?;
    }
    let tenants: Arc<Vec<Tenant>> = Arc::new(
        (0..TENANTS)
            .map(|_| Tenant {
                used: AtomicU64::new(0),
                paid: Default::default(),
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
            while !stream(&client, resource, &format!("t{n}"), &tenants[n], &mut rng).await {}
        }));
    }
    for h in handles {
        h.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    client.flush().await;

    let (mut worst, mut worst_bound, mut twice, mut lost, mut rpcs, mut tokens) = (0i64, 0u64, 0i64, 0i64, 0u64, 0u64);
    let mut paid = [0u64; 3];
    for (n, t) in tenants.iter().enumerate() {
        let used = t.used.load(Ordering::Relaxed);
        let counted = counted(&client, waterfall.then_some(survivor.as_str()), n).await?;
        twice = twice.max(counted as i64 - used as i64);
        lost = lost.max(used as i64 - counted as i64);
        let over = used as i64 - budget as i64;
        if over > worst {
            worst = over;
            worst_bound = t.in_flight_at_stop.load(Ordering::Relaxed) * MAX_CHUNK;
        }
        rpcs += t.rpcs.load(Ordering::Relaxed);
        tokens += used;
        for (sum, p) in paid.iter_mut().zip(&t.paid) {
            *sum += p.load(Ordering::Relaxed);
        }
    }
    println!(
        "tenants {TENANTS}, {STREAMS_PER_TENANT} streams each at a time, budget {budget} tokens, estimate {ESTIMATE}, chunks 1-{MAX_CHUNK}"
    );
    if waterfall {
        println!(
            "budgets: minute {MINUTE}, then month {MONTH}, then credits {CREDITS}; streams last paid by each: {} / {} / {}",
            paid[0], paid[1], paid[2]
        );
    }
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
