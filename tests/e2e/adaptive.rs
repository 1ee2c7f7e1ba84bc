//! Adaptive concurrency through the real binary and the client crate: a
//! simulated dependency in this process (C calls served at once, the rest
//! queued), offered twice what it serves; one replica, then two on a real
//! `redis-server` computing one limit for the fleet, through a Redis that
//! dies and comes back empty. (scripts/overload-bench runs the full
//! experiment on release builds.)

// The tests that measure on the two cores hold `one_at_a_time()` across
// their awaits: one such test at a time in the whole binary.
#![allow(clippy::await_holding_lock)]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::{Acquire, Client, FailMode, GuardError};
use floodgate_proto::v1 as pb;
use support::redis::RedisServer;
use support::*;

/// The dependency: C at once, SERVICE each.
const C: usize = 20;
const SERVICE: Duration = Duration::from_millis(100);

const RULES: &str = r#"
resources:
  - name: db
    concurrency:
      adaptive: { algorithm: gradient2, min: 2, max: 500, initial: 5, window: 500ms }
      permit_ttl: 10s
  - name: plain
    concurrency: { max_in_flight: 3 }
  - name: nothing
    limits: [ { name: l, algorithm: token_bucket, capacity: 10, refill_per_second: 10 } ]
"#;

struct Dependency {
    servers: tokio::sync::Semaphore,
    /// Calls inside (queued or served), and the most seen at once.
    inside: AtomicU32,
    most: AtomicU32,
    served: AtomicU64,
}

impl Dependency {
    fn new() -> Arc<Dependency> {
        Arc::new(Dependency {
            servers: tokio::sync::Semaphore::new(C),
            inside: AtomicU32::new(0),
            most: AtomicU32::new(0),
            served: AtomicU64::new(0),
        })
    }

    async fn call(&self) -> Result<(), ()> {
        let n = self.inside.fetch_add(1, Ordering::AcqRel) + 1;
        self.most.fetch_max(n, Ordering::AcqRel);
        {
            let _server = self.servers.acquire().await.map_err(|_| ())?;
            tokio::time::sleep(SERVICE).await;
        }
        self.inside.fetch_sub(1, Ordering::AcqRel);
        self.served.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// `rate` calls a second through `client` into `dep` for `length`, open
/// loop; (admitted, denied).
async fn offer(client: Client, dep: Arc<Dependency>, rate: f64, length: Duration) -> (u64, u64) {
    let (admitted, denied) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut owed = 0.0;
    let mut calls = tokio::task::JoinSet::new();
    while started.elapsed() < length {
        tick.tick().await;
        owed += rate * 0.005;
        while owed >= 1.0 {
            owed -= 1.0;
            let (client, dep, admitted, denied) = (client.clone(), dep.clone(), admitted.clone(), denied.clone());
            calls.spawn(async move {
                match client.guard(Acquire::new("db")).run(|| dep.call()).await {
                    Err(GuardError::Denied(_)) => denied.fetch_add(1, Ordering::Relaxed),
                    _ => admitted.fetch_add(1, Ordering::Relaxed),
                };
            });
        }
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    client.flush().await;
    (admitted.load(Ordering::Relaxed), denied.load(Ordering::Relaxed))
}

/// The limit the algorithm found. It may be held at the floor (3) right now,
/// measuring the no-load latency at its slot on the clock: then it is the
/// last limit before.
fn found(got: &pb::ConcurrencyInfo) -> u32 {
    match got.probing {
        false => got.limit,
        true => got.windows.iter().rev().map(|w| w.limit).find(|l| *l != 3).unwrap_or(got.limit),
    }
}

async fn info(fg: &Floodgate) -> pb::ConcurrencyInfo {
    let req = pb::GetConcurrencyRequest { resource: "db".into() };
    fg.admin().await.get_concurrency(req).await.expect("GetConcurrency").into_inner()
}

/// The limit found is near C: twice C would be offered without it, and it
/// started at 5. Loose bounds: the two cores may be busy with other tests.
fn near_capacity(limit: u32) -> bool {
    (C as u32 * 6 / 10..=C as u32 * 16 / 10).contains(&limit)
}

/// Fails closed, with time to answer on busy cores: what reaches the
/// dependency is what the server admitted.
fn client(fg: &Floodgate) -> Client {
    let b = Client::builder().endpoint(fg.url()).request_timeout(Duration::from_secs(2));
    b.fail_mode(FailMode::Closed).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_finds_the_capacity_and_says_so() {
    let _one = one_at_a_time();
    let dir = TempDir::new();
    let file = dir.write("rules.yaml", RULES);
    let fg = floodgate().args(["--config", path_str(&file)]).start();
    let dep = Dependency::new();
    let capacity = C as f64 / SERVICE.as_secs_f64();
    let (admitted, denied) = offer(client(&fg), dep.clone(), 2.0 * capacity, Duration::from_secs(20)).await;
    let got = info(&fg).await;
    let found = found(&got);
    assert!(near_capacity(found), "limit {found} for C = {C}; {got:?}");
    assert_eq!(got.algorithm, "gradient2");
    assert!(denied > admitted / 4, "the excess was shed: {admitted} admitted, {denied} denied");
    // What the limit let in never queued far past C.
    let most = dep.most.load(Ordering::Acquire);
    assert!(most as f64 <= 1.6 * C as f64, "{most} inside the dependency at once");
    // Its inputs and windows are there to read.
    assert!(got.windows.len() >= 20, "{} windows", got.windows.len());
    let last = got.windows.last().unwrap();
    assert!(last.samples > 0 && last.mean_rtt.is_some(), "{last:?}");
    let short = got.short_rtt.expect("a short latency");
    assert!(short.nanos > 0 || short.seconds > 0);
    assert!(got.long_rtt.is_some() && got.gradient > 0.0 && got.gradient <= 1.0, "{got:?}");
    // The no-load latency was measured at the floor when the limit started:
    // the dependency's service time, not its queue.
    let measured = got.min_rtt.expect("a measured no-load latency");
    let measured = Duration::new(measured.seconds as u64, measured.nanos as u32);
    assert!(measured >= SERVICE && measured < SERVICE * 2, "{measured:?}; {got:?}");
    assert!(got.next_probe_at.is_some(), "{got:?}");
    assert!(got.windows.iter().any(|w| w.limit == 3), "a window at the floor: {:?}", got.windows);
    // And in the metrics.
    let (_, metrics) = fg.http_get("/metrics");
    assert!(metrics.contains(&format!("floodgate_concurrency_limit{{resource=\"db\"}} {}", got.limit)), "{metrics}");
    assert!(metrics.contains("floodgate_adaptive_latency_seconds{resource=\"db\",measure=\"long\"}"));
    assert!(metrics.contains("floodgate_adaptive_latency_seconds{resource=\"db\",measure=\"min\"}"), "{metrics}");
    assert!(metrics.contains("floodgate_adaptive_probing{resource=\"db\"}"), "{metrics}");
    // The answers carry the limit in force.
    let mut raw = fg.client().await;
    let a = raw.acquire(acquire("db", &[], 1)).await.unwrap().into_inner();
    let pinned = info(&fg).await.probing && a.max_in_flight == 3;
    assert!(near_capacity(a.max_in_flight) || pinned, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_concurrency_refuses_what_is_not_there() {
    let _one = one_at_a_time();
    let dir = TempDir::new();
    let file = dir.write("rules.yaml", RULES);
    let fg = floodgate().args(["--config", path_str(&file)]).start();
    let mut admin = fg.admin().await;
    for (resource, code) in [("nothing", tonic::Code::NotFound), ("", tonic::Code::InvalidArgument)] {
        let err = admin.get_concurrency(pb::GetConcurrencyRequest { resource: resource.into() }).await.unwrap_err();
        assert_eq!(err.code(), code, "{resource:?}: {err:?}");
    }
    let err = admin.get_concurrency(pb::GetConcurrencyRequest { resource: "x".repeat(300) }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("resource"), "{}", err.message());
    // A static limit answers too, with no algorithm.
    let plain = admin.get_concurrency(pb::GetConcurrencyRequest { resource: "plain".into() }).await.unwrap();
    let plain = plain.into_inner();
    assert_eq!((plain.limit, plain.algorithm.as_str(), plain.windows.len()), (3, "", 0));
}

/// Two replicas, each asked by its own caller at the fleet's rate: the
/// windows merge in Redis, so both hold one limit near C (not 2C), and the
/// calls let in across both stay near C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_compute_one_limit_for_the_fleet_through_a_redis_that_dies() {
    let _one = one_at_a_time();
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let file = dir.write("rules.yaml", RULES);
    let args =
        ["--config", path_str(&file), "--redis", &redis.url(), "--sync-interval", "100ms", "--redis-timeout", "300ms"];
    let (a, b) = (floodgate().args(args).start(), floodgate().args(args).start());
    wait_live(&a, 2);
    let dep = Dependency::new();
    let capacity = C as f64 / SERVICE.as_secs_f64();
    let run = |fg: &Floodgate, length| offer(client(fg), dep.clone(), capacity, length);
    let ((_, da), (_, db)) = tokio::join!(run(&a, Duration::from_secs(20)), run(&b, Duration::from_secs(20)));
    let (ia, ib) = (info(&a).await, info(&b).await);
    let (la, lb) = (found(&ia), found(&ib));
    assert!(near_capacity(la) && near_capacity(lb), "limits {la} and {lb} for C = {C}");
    assert!(la.abs_diff(lb) <= 2, "one limit for the fleet: {la} and {lb}");
    assert!(da + db > 0, "the excess was shed");
    let most = dep.most.load(Ordering::Acquire);
    assert!(most as f64 <= 1.6 * C as f64, "{most} inside the dependency at once across the fleet");
    // A window holds both replicas' calls: at half a second, about
    // capacity / 2 calls, where one replica sees half as many.
    let per_window = capacity * 0.5;
    let merged = |i: &pb::ConcurrencyInfo| i.windows.iter().rev().take(6).map(|w| w.samples).max().unwrap_or(0);
    assert!(merged(&ia) as f64 > 0.7 * per_window && merged(&ib) as f64 > 0.7 * per_window, "{ia:?}\n{ib:?}");

    // Redis dies: each replica adapts on its own, and still sheds.
    redis.kill();
    let ((_, da), (_, db)) = tokio::join!(run(&a, Duration::from_secs(6)), run(&b, Duration::from_secs(6)));
    assert!(da + db > 0, "still shed while Redis is away");
    let (ia, ib) = (info(&a).await, info(&b).await);
    assert!(ia.limit >= 2 && ib.limit >= 2 && ia.limit <= 500 && ib.limit <= 500);

    // It comes back empty: the fleet goes on from what a replica found, not
    // from the initial 5.
    redis.restart_empty();
    let ((_, _), (_, _)) = tokio::join!(run(&a, Duration::from_secs(10)), run(&b, Duration::from_secs(10)));
    let (ia, ib) = (info(&a).await, info(&b).await);
    let (la, lb) = (found(&ia), found(&ib));
    assert!(near_capacity(la) && near_capacity(lb), "after Redis came back: {la} and {lb}");
    assert!(la.abs_diff(lb) <= 2, "one limit again: {la} and {lb}");
}
