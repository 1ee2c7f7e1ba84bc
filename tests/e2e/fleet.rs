//! One fleet, one limit: concurrency limits and permits across replicas,
//! through the real binary, three replicas on one real `redis-server` (and a
//! real 3-node Redis Cluster).

// The tests that measure on the two cores hold `one_at_a_time()` across
// their awaits: one such test at a time in the whole binary.
#![allow(clippy::await_holding_lock)]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use support::redis::{RedisCluster, RedisServer};
use support::*;
use tonic::transport::Channel;

const RULES: &str = r#"
resources:
  - name: db-strict
    concurrency: { max_in_flight: 10, sync: strict, permit_ttl: 3s }
  - name: db-replicated
    concurrency: { max_in_flight: 10, sync: replicated, permit_ttl: 3s }
  - name: db-local
    concurrency: { max_in_flight: 2, sync: local, permit_ttl: 3s }
  - name: db-long
    concurrency: { max_in_flight: 10, sync: strict, permit_ttl: 60s }
  - name: db-deny
    concurrency: { max_in_flight: 10, sync: strict, on_redis_error: deny, permit_ttl: 20s }
  - name: db-switch
    concurrency: { max_in_flight: 10, sync: replicated, permit_ttl: 60s }
  - name: outage-strict
    concurrency: { max_in_flight: 10, sync: strict, permit_ttl: 20s }
  - name: outage-replicated
    concurrency: { max_in_flight: 10, sync: replicated, permit_ttl: 20s }
  - name: probe
    breaker:
      window: { kind: count, size: 10 }
      minimum_calls: 2
      failure_rate_threshold: 0.5
      wait_in_open: 1s
      half_open_calls: 2
      max_wait_in_half_open: 20s
  - name: pay
    breaker:
      window: { kind: count, size: 100 }
      minimum_calls: 10
      failure_rate_threshold: 0.5
      wait_in_open: 30s
"#;

type Client = pb::floodgate_client::FloodgateClient<Channel>;

/// `n` replicas of `rules` on Redis (`redis` holds the `--redis...` arguments).
fn fleet(n: usize, dir: &TempDir, redis: &[&str]) -> Vec<Floodgate> {
    let file = dir.write("rules.yaml", RULES);
    let mut args = vec!["--config", path_str(&file), "--sync-interval", "100ms", "--redis-timeout", "500ms"];
    args.extend_from_slice(redis);
    let replicas: Vec<Floodgate> = (0..n).map(|_| floodgate().args(&args).start()).collect();
    for r in &replicas {
        wait_live(r, n as u32);
    }
    replicas
}

/// `n` replicas on one new `redis-server`, and a client of each.
async fn on_one_redis(n: usize) -> (RedisServer, TempDir, Vec<Floodgate>, Vec<Client>) {
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let replicas = fleet(n, &dir, &["--redis", &url]);
    let clients = clients(&replicas).await;
    (redis, dir, replicas, clients)
}

/// Rewrites the fleet's rules file with `from` replaced by `to`, and waits
/// until every replica has reloaded it and then synced `syncs` more times.
async fn rewrite_rules(dir: &TempDir, replicas: &[Floodgate], from: &str, to: &str, syncs: u64) {
    let rules = RULES.replace(from, to);
    assert_ne!(rules, RULES, "{from:?} is in the rules");
    let version = |r: &Floodgate| r.metrics().series("floodgate_rules_version");
    let before: Vec<_> = replicas.iter().map(version).collect();
    dir.replace("rules.yaml", &rules);
    for (r, before) in replicas.iter().zip(before) {
        eventually("the new rules", Duration::from_secs(10), || async { (version(r) != before).then_some(()) }).await;
    }
    for r in replicas {
        wait_syncs(r, syncs);
    }
}

async fn clients(replicas: &[Floodgate]) -> Vec<Client> {
    let mut out = Vec::new();
    for r in replicas {
        out.push(r.client().await);
    }
    out
}

/// What `holders` callers saw over `run`, each asking a random replica,
/// holding what it got for 10-40 ms and reporting to another random replica.
#[derive(Debug)]
struct Seen {
    admitted: u64,
    /// The most calls in flight at once, as the callers count them (a call
    /// counts from the answer of its Acquire to the sending of its report,
    /// within the time the server holds its slot).
    peak: i64,
    /// Reports answered `counted: false`.
    uncounted: u64,
    /// Slots in use on average, as the callers count them.
    used: f64,
}

/// How the holders of [`hold_and_report`] hold, and from when the peak counts.
#[derive(Clone, Copy)]
struct Load {
    holders: usize,
    run: Duration,
    /// Each call is held 10 ms plus up to this many more.
    hold_ms: u64,
    /// The peak counts from this far into the run.
    peak_from: Duration,
    /// A denied holder waits what the answer says, within these bounds (ms).
    retry_ms: (u64, u64),
}

impl Load {
    fn new(holders: usize, run: Duration) -> Load {
        Load { holders, run, hold_ms: 30, peak_from: Duration::ZERO, retry_ms: (20, 100) }
    }
}

async fn hold_and_report(clients: &[Client], resource: &'static str, holders: usize, run: Duration) -> Seen {
    hold_and_report_as(clients, resource, Load::new(holders, run)).await
}

async fn hold_and_report_as(clients: &[Client], resource: &'static str, load: Load) -> Seen {
    let Load { holders, run, hold_ms, peak_from, retry_ms } = load;
    let peak_from = Instant::now() + peak_from;
    let in_flight = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let uncounted = Arc::new(AtomicU64::new(0));
    let busy_us = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for h in 0..holders {
        let clients = clients.to_vec();
        let (in_flight, peak, admitted, uncounted) =
            (in_flight.clone(), peak.clone(), admitted.clone(), uncounted.clone());
        let busy_us = busy_us.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = h;
            while Instant::now() < end {
                i = i.wrapping_mul(31).wrapping_add(7);
                let mut at = clients[i % clients.len()].clone();
                let r = at.acquire(acquire(resource, &[], 1)).await.unwrap().into_inner();
                if r.verdict() != pb::Verdict::Allowed {
                    // As a client does: back off as told, within reason.
                    let told =
                        r.retry_after.map_or(Duration::ZERO, |d| Duration::new(d.seconds as u64, d.nanos as u32));
                    let (least, most) = (Duration::from_millis(retry_ms.0), Duration::from_millis(retry_ms.1));
                    tokio::time::sleep(told.clamp(least, most)).await;
                    continue;
                }
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                if Instant::now() >= peak_from {
                    peak.fetch_max(now, Ordering::SeqCst);
                }
                admitted.fetch_add(1, Ordering::SeqCst);
                let held = Instant::now();
                tokio::time::sleep(Duration::from_millis(10 + (i as u64 % (hold_ms + 1)))).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                busy_us.fetch_add(held.elapsed().as_micros() as u64, Ordering::SeqCst);
                let mut to = clients[(i / 7) % clients.len()].clone();
                let rep = to.report_outcome(report(resource, &r.permit_id, pb::Outcome::Success)).await.unwrap();
                if !rep.get_ref().counted {
                    uncounted.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Seen {
        admitted: admitted.load(Ordering::SeqCst),
        peak: peak.load(Ordering::SeqCst),
        uncounted: uncounted.load(Ordering::SeqCst),
        used: busy_us.load(Ordering::SeqCst) as f64 / 1e6 / run.as_secs_f64(),
    }
}

/// 200 holders over three replicas on `max_in_flight: 10`, strict then
/// replicated: never more than 10 in flight, and every report counts
/// wherever it goes. Replicated leases keep as many slots in use as the one
/// strict set does (a lease idle on one replica while another's callers
/// wait would show as fewer): the two cores are saturated by 200 holders
/// of debug builds, so the figure is compared, not absolute.
async fn ten_in_flight_fleet_wide(clients: &[Client]) {
    let strict = hold_and_report(clients, "db-strict", 200, Duration::from_secs(4)).await;
    let replicated = hold_and_report(clients, "db-replicated", 200, Duration::from_secs(4)).await;
    eprintln!("strict: {strict:?}\nreplicated: {replicated:?}");
    for (name, seen) in [("strict", &strict), ("replicated", &replicated)] {
        assert!(seen.peak <= 10, "{name}: {} in flight at once, of 10", seen.peak);
        assert_eq!(seen.uncounted, 0, "{name}: every report counts, whichever replica gets it");
        assert!(seen.admitted >= 50, "{name}: only {} admitted in 4 s", seen.admitted);
    }
    assert!(
        replicated.used >= 0.7 * strict.used,
        "replicated keeps {:.1} slots in use, strict {:.1}",
        replicated.used,
        strict.used
    );
}

/// Callers move from one replica to another: the slots the first leased
/// and no longer uses reach the second within a few syncs.
async fn idle_leases_move_to_the_replica_that_needs_them(clients: &[Client]) {
    let take_all = |c: &Client| {
        let c = c.clone();
        async move {
            let mut held = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(3);
            while held.len() < 10 && Instant::now() < deadline {
                let r = c.clone().acquire(acquire("db-replicated", &[], 1)).await.unwrap().into_inner();
                if r.verdict() == pb::Verdict::Allowed {
                    held.push(r.permit_id);
                } else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            held
        }
    };
    let held = take_all(&clients[0]).await;
    assert_eq!(held.len(), 10, "all 10 through the first replica");
    for p in &held {
        let rep = clients[0].clone().report_outcome(report("db-replicated", p, pb::Outcome::Success)).await.unwrap();
        assert!(rep.get_ref().counted);
    }
    let moved = Instant::now();
    let held = take_all(&clients[1]).await;
    assert_eq!(held.len(), 10, "all 10 through the second replica, {:?} after the first let go", moved.elapsed());
    for p in &held {
        clients[2].clone().report_outcome(report("db-replicated", p, pb::Outcome::Success)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_and_replicated_concurrency_hold_across_three_replicas() {
    let _one = one_at_a_time();
    let (_redis, _dir, _replicas, clients) = on_one_redis(3).await;
    ten_in_flight_fleet_wide(&clients).await;
    idle_leases_move_to_the_replica_that_needs_them(&clients).await;
    // `local` is per replica, as it says: 2 on each.
    let mut held = Vec::new();
    for c in &clients {
        for _ in 0..2 {
            let r = c.clone().acquire(acquire("db-local", &[], 1)).await.unwrap().into_inner();
            assert_eq!(r.verdict(), pb::Verdict::Allowed);
            held.push(r.permit_id);
        }
        let full = c.clone().acquire(acquire("db-local", &[], 1)).await.unwrap().into_inner();
        assert_eq!(full.verdict(), pb::Verdict::ConcurrencyLimited);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_and_replicated_concurrency_hold_on_a_redis_cluster() {
    let _one = one_at_a_time();
    let cluster = RedisCluster::start();
    let dir = TempDir::new();
    let seeds = cluster.seeds();
    let replicas = fleet(3, &dir, &["--redis-cluster", &seeds]);
    let clients = clients(&replicas).await;
    ten_in_flight_fleet_wide(&clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_reported_to_any_replica_open_the_breaker_after_exactly_minimum_calls() {
    let _one = one_at_a_time();
    let (_redis, _dir, replicas, clients) = on_one_redis(3).await;
    let fail_once = |i: usize| {
        let (mut from, mut to) = (clients[i % 3].clone(), clients[(i + 1) % 3].clone());
        async move {
            let r = from.acquire(acquire("pay", &[], 1)).await.unwrap().into_inner();
            assert_eq!(r.verdict(), pb::Verdict::Allowed, "call {i}");
            let rep = to.report_outcome(report("pay", &r.permit_id, pb::Outcome::Failure)).await.unwrap();
            assert!(rep.get_ref().counted, "failure {i}, reported to another replica, counts");
            // Reported again, to the third replica: not counted twice.
            let mut third = from.clone();
            let again = third.report_outcome(report("pay", &r.permit_id, pb::Outcome::Failure)).await.unwrap();
            assert!(!again.get_ref().counted, "failure {i} reported twice counts once");
        }
    };
    for i in 0..9 {
        fail_once(i).await;
    }
    for r in &replicas {
        wait_syncs(r, 3);
    }
    for (n, c) in clients.iter().enumerate() {
        let mut dry = acquire("pay", &[], 1);
        dry.dry_run = true;
        let r = c.clone().acquire(dry).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::Allowed, "9 failures of minimum_calls 10: closed on replica {n}");
    }
    fail_once(9).await;
    for (n, c) in clients.iter().enumerate() {
        eventually(&format!("the breaker open on replica {n}"), Duration::from_secs(5), || {
            let mut c = c.clone();
            async move {
                let r = c.acquire(acquire("pay", &[], 1)).await.unwrap().into_inner();
                (r.verdict() == pb::Verdict::CircuitOpen).then_some(())
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_forged_to_name_another_replica_frees_nothing() {
    let _one = one_at_a_time();
    let (_redis, _dir, replicas, clients) = on_one_redis(2).await;
    let (mut a, mut b) = (clients[0].clone(), clients[1].clone());
    let mut held = Vec::new();
    for _ in 0..10 {
        let r = a.acquire(acquire("db-strict", &[], 1)).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::Allowed);
        held.push(r.permit_id);
    }
    let full = b.acquire(acquire("db-strict", &[], 1)).await.unwrap().into_inner();
    assert_eq!(full.verdict(), pb::Verdict::ConcurrencyLimited, "10 held through A: none left through B");
    // Ids that name A (its first 8 digits) with other random digits.
    for n in 0..50u32 {
        let forged = format!("{}{:024x}", &held[0][..8], u128::from(n) * 0x9e37_79b9_7f4a_7c15);
        let rep = b.report_outcome(report("db-strict", &forged, pb::Outcome::Success)).await.unwrap();
        assert!(!rep.get_ref().counted, "forged {forged}");
    }
    // A real permit with the wrong resource: refused, naming the field.
    let err = b.report_outcome(report("db-replicated", &held[0], pb::Outcome::Success)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("resource"), "{}", err.message());
    let still = b.acquire(acquire("db-strict", &[], 1)).await.unwrap().into_inner();
    assert_eq!(still.verdict(), pb::Verdict::ConcurrencyLimited, "nothing was freed");
    // In a batch, the same item is answered `counted: false` (the batch's
    // other items are applied; one another replica refuses cannot be
    // checked before), and a real one beside it counts.
    let batch = pb::ReportOutcomeBatchRequest {
        reports: vec![
            report("db-replicated", &held[1], pb::Outcome::Success),
            report("db-strict", &held[2], pb::Outcome::Success),
        ],
    };
    let answers = b.report_outcome_batch(batch).await.unwrap().into_inner().responses;
    assert_eq!(answers.iter().map(|r| r.counted).collect::<Vec<_>>(), [false, true]);
    let refilled = b.acquire(acquire("db-strict", &[], 1)).await.unwrap().into_inner();
    assert_eq!(refilled.verdict(), pb::Verdict::Allowed, "the slot the batch freed");
    let still = b.acquire(acquire("db-strict", &[], 1)).await.unwrap().into_inner();
    assert_eq!(still.verdict(), pb::Verdict::ConcurrencyLimited, "and only that one");
    // The real one, reported through B, frees one slot for the fleet.
    let rep = b.report_outcome(report("db-strict", &held[0], pb::Outcome::Success)).await.unwrap();
    assert!(rep.get_ref().counted);
    let freed = b.acquire(acquire("db-strict", &[], 1)).await.unwrap().into_inner();
    assert_eq!(freed.verdict(), pb::Verdict::Allowed);
    let mut replicas = replicas;
    assert!(replicas[0].is_running() && replicas[1].is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_s_slots_come_back_within_permit_ttl() {
    let _one = one_at_a_time();
    let (_redis, _dir, mut replicas, clients) = on_one_redis(3).await;
    for resource in ["db-strict", "db-replicated"] {
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while got < 10 && Instant::now() < deadline {
            let r = clients[2].clone().acquire(acquire(resource, &[], 1)).await.unwrap().into_inner();
            if r.verdict() == pb::Verdict::Allowed {
                got += 1;
            }
        }
        assert_eq!(got, 10, "{resource}: all 10 held through the third replica");
    }
    signal(replicas[2].pid(), "KILL");
    let killed = Instant::now();
    let _ = replicas.pop();
    for resource in ["db-strict", "db-replicated"] {
        let r = clients[0].clone().acquire(acquire(resource, &[], 1)).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::ConcurrencyLimited, "{resource}: the dead replica's calls may still run");
    }
    for resource in ["db-strict", "db-replicated"] {
        let back = eventually(&format!("{resource}'s slots back"), Duration::from_secs(10), || {
            let mut c = clients[(killed.elapsed().as_millis() % 2) as usize].clone();
            async move {
                let r = c.acquire(acquire(resource, &[], 1)).await.unwrap().into_inner();
                (r.verdict() == pb::Verdict::Allowed).then(|| killed.elapsed())
            }
        })
        .await;
        // permit_ttl 3 s; a replicated lease stands 1 s more.
        assert!(back <= Duration::from_millis(4_500), "{resource}: back after {back:?}");
    }
}

/// While Redis is stopped (SIGSTOP) or killed, each policy admits what the
/// README says: `local`, at most its share (10 / 3 replicas, rounded up: 4)
/// per replica; `deny`, nothing new. Once Redis answers again (after a
/// stall, or started again empty after a kill), the strict set counts what
/// the outage admitted.
async fn outage_policies(kill: bool) {
    let _one = one_at_a_time();
    let (mut redis, _dir, replicas, clients) = on_one_redis(3).await;
    if kill {
        redis.kill();
    } else {
        redis.signal("STOP");
    }
    // The replicas notice within one Redis timeout (500 ms) of asking.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for resource in ["outage-strict", "outage-replicated", "db-deny"] {
        let mut admitted = Vec::new();
        for c in &clients {
            let mut n = 0;
            for _ in 0..20 {
                let r = c.clone().acquire(acquire(resource, &[], 1)).await.unwrap().into_inner();
                n += u32::from(r.verdict() == pb::Verdict::Allowed);
            }
            admitted.push(n);
        }
        let want = if resource == "db-deny" { vec![0, 0, 0] } else { vec![4, 4, 4] };
        assert_eq!(admitted, want, "{resource} while Redis is away (killed: {kill}): admitted per replica");
    }
    if kill {
        redis.restart_empty();
    } else {
        redis.signal("CONT");
    }
    // Back: the strict set counts what the outage admitted (12 of 10 held,
    // for 20 s): nothing more until enough come back.
    for r in &replicas {
        wait_syncs(r, 2);
    }
    for c in &clients {
        for resource in ["outage-strict", "outage-replicated"] {
            let r = c.clone().acquire(acquire(resource, &[], 1)).await.unwrap().into_inner();
            assert_eq!(
                r.verdict(),
                pb::Verdict::ConcurrencyLimited,
                "{resource}: the outage's 12 count once Redis is back"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_admits_what_each_policy_says() {
    outage_policies(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_admits_what_each_policy_says() {
    outage_policies(true).await;
}

/// Redis restarts empty while permits are in flight: the replicas that hold
/// them put them back, so the fleet still counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_in_flight_survive_a_redis_that_comes_back_empty() {
    let _one = one_at_a_time();
    let (mut redis, _dir, _replicas, clients) = on_one_redis(2).await;
    let (mut a, mut b) = (clients[0].clone(), clients[1].clone());
    for i in 0..10 {
        let r = a.acquire(acquire("db-long", &[], 1)).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::Allowed, "call {i}");
    }
    redis.restart_empty();
    // Within a few seconds (Redis back, one reassertion a second) the 10
    // are counted again; from then on, nothing is admitted.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for i in 0..20 {
        let r = b.acquire(acquire("db-long", &[], 1)).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::ConcurrencyLimited, "call {i} through B after the empty restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Long holds (up to a second) by 150 holders who retry soon after a
/// denial: the strict set stays exact, with reports going anywhere. (A
/// strict call that Redis did not answer in time was decided by the outage
/// policy while Redis was up, and a give-back waiting to be sent made calls
/// skip Redis: 11-12 of 10 in flight.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_stays_exact_under_long_holds() {
    let _one = one_at_a_time();
    let (_redis, _dir, _replicas, clients) = on_one_redis(3).await;
    let load = Load {
        holders: 150,
        run: Duration::from_secs(10),
        hold_ms: 1000,
        peak_from: Duration::ZERO,
        retry_ms: (10, 30),
    };
    let seen = hold_and_report_as(&clients, "db-long", load).await;
    eprintln!("strict, long holds: {seen:?}");
    assert!(seen.peak <= 10, "{} in flight at once, of 10", seen.peak);
    assert_eq!(seen.uncounted, 0);
}

/// After a 2 s stall under load, the replicas each held their outage share
/// (4 + 4 + 4 of 10) and their leases kept them there: a lease never went
/// below what a replica held. Now the fleet is back under the limit once
/// the calls of the outage end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_is_exact_again_after_a_stall() {
    let _one = one_at_a_time();
    let (redis, _dir, _replicas, clients) = on_one_redis(3).await;
    let load = Load {
        holders: 150,
        run: Duration::from_secs(12),
        hold_ms: 2500,
        peak_from: Duration::from_secs(6),
        retry_ms: (10, 30),
    };
    let stall = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        redis.signal("STOP");
        tokio::time::sleep(Duration::from_secs(2)).await;
        redis.signal("CONT");
    };
    let (seen, ()) = tokio::join!(hold_and_report_as(&clients, "db-replicated", load), stall);
    eprintln!("replicated after a stall: {seen:?}");
    // From 3 s after Redis is back (the outage's calls held at most 2.5 s).
    assert!(seen.peak <= 10, "{} in flight at once, of 10, 3 s after the stall", seen.peak);
}

/// A rule changed from `strict` 10 to `replicated` 3 while 10 permits are
/// held: the old permits count against the new limit (before, the replica
/// holding them was leased all it held, and filled its lease again as they
/// were reported: 10 in flight under a limit of 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_lowered_while_permits_are_held_counts_them() {
    let _one = one_at_a_time();
    let (_redis, dir, replicas, clients) = on_one_redis(3).await;
    let mut held = Vec::new();
    for _ in 0..10 {
        let r = clients[0].clone().acquire(acquire("db-long", &[], 1)).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::Allowed);
        held.push(r.permit_id);
    }
    let (from, to) = (
        "concurrency: { max_in_flight: 10, sync: strict, permit_ttl: 60s }",
        "concurrency: { max_in_flight: 3, sync: replicated, permit_ttl: 60s }",
    );
    rewrite_rules(&dir, &replicas, from, to, 3).await;
    // Eight reported, and at once 30 calls through the replica that held
    // them (before its next sync) and the others.
    let reports = held.drain(2..).map(|p| {
        let mut c = clients[0].clone();
        async move { c.report_outcome(report("db-long", &p, pb::Outcome::Success)).await.unwrap().into_inner() }
    });
    assert!(futures_util::future::join_all(reports).await.iter().all(|r| r.counted));
    let calls = (0..30).map(|i| {
        let mut c = clients[if i < 20 { 0 } else { i % 3 }].clone();
        async move { c.acquire(acquire("db-long", &[], 1)).await.unwrap().into_inner().verdict() }
    });
    let verdicts = futures_util::future::join_all(calls).await;
    let mut admitted = verdicts.iter().filter(|v| **v == pb::Verdict::Allowed).count();
    assert!(admitted <= 1, "2 old permits held on a limit of 3: {admitted} more");
    // The one free slot reaches a replica that asks (leases move within a
    // few syncs), and nothing more is admitted.
    for i in 0..100 {
        let r = clients[i % 3].clone().acquire(acquire("db-long", &[], 1)).await.unwrap().into_inner();
        admitted += usize::from(r.verdict() == pb::Verdict::Allowed);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(admitted, 1, "2 old permits held on a limit of 3: one more in all");
}

/// Half-open probes across replicas: exactly `half_open_calls` are handed
/// out by the three together, and probes reported to other replicas decide
/// the round (here, close the breaker everywhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_reported_to_other_replicas_decide_the_round() {
    let _one = one_at_a_time();
    let (_redis, _dir, _replicas, clients) = on_one_redis(3).await;
    for i in 0..2 {
        let r = clients[i].clone().acquire(acquire("probe", &[], 1)).await.unwrap().into_inner();
        let mut to = clients[(i + 1) % 3].clone();
        let rep = to.report_outcome(report("probe", &r.permit_id, pb::Outcome::Failure)).await.unwrap();
        assert!(rep.get_ref().counted);
    }
    // Open (on every replica by the next sync), then half-open after 1 s:
    // the three replicas together hand out exactly two probes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut probes = Vec::new();
    for i in 0..30 {
        let r = clients[i % 3].clone().acquire(acquire("probe", &[], 1)).await.unwrap().into_inner();
        if r.verdict() == pb::Verdict::Allowed {
            probes.push((i % 3, r.permit_id));
        }
    }
    assert_eq!(probes.len(), 2, "half_open_calls: 2, across the replicas: {probes:?}");
    for (from, permit) in &probes {
        let mut to = clients[(from + 1) % 3].clone();
        assert!(to.report_outcome(report("probe", permit, pb::Outcome::Success)).await.unwrap().get_ref().counted);
        let again = to.report_outcome(report("probe", permit, pb::Outcome::Success)).await.unwrap();
        assert!(!again.get_ref().counted, "a probe reported twice counts once");
    }
    for (n, c) in clients.iter().enumerate() {
        eventually(&format!("the breaker closed on replica {n}"), Duration::from_secs(5), || {
            let mut c = c.clone();
            async move {
                let r = c.acquire(acquire("probe", &[], 1)).await.unwrap().into_inner();
                (r.verdict() == pb::Verdict::Allowed && r.breaker_state() == pb::BreakerState::Closed).then_some(())
            }
        })
        .await;
    }
}

/// Every slot busy on two replicas, then callers arrive at the third: it
/// gets its share as the others' calls end (before, the busy replicas kept
/// renewing what they held and the third admitted nothing for the whole run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starved_replica_gets_its_share_of_busy_replicated_slots() {
    let _one = one_at_a_time();
    let (_redis, _dir, _replicas, clients) = on_one_redis(3).await;
    let busy = Load {
        holders: 100,
        run: Duration::from_secs(10),
        hold_ms: 1000,
        peak_from: Duration::ZERO,
        retry_ms: (10, 30),
    };
    let late =
        Load { holders: 50, run: Duration::from_secs(6), hold_ms: 1000, peak_from: Duration::ZERO, retry_ms: (10, 30) };
    let third = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        hold_and_report_as(&clients[2..], "db-replicated", late).await
    };
    let (first_two, third) = tokio::join!(hold_and_report_as(&clients[..2], "db-replicated", busy), third);
    eprintln!("two busy replicas: {first_two:?}\nthe third, from 3 s: {third:?}");
    assert!(first_two.peak <= 10 && third.peak <= 10);
    // A fair share is about a third of the 10 slots for 6 s of calls held
    // 10 ms-1 s: some 40 calls. Starved, it admits none.
    assert!(third.admitted >= 10, "the third replica admitted {} calls in 6 s", third.admitted);
}

/// A rule changed from `replicated` to `strict` while 10 permits are held:
/// they join the new in-flight set (before, the set started empty and the
/// fleet admitted 10 more: 16-20 of 10 in flight under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_made_strict_while_permits_are_held_counts_them() {
    let _one = one_at_a_time();
    let (_redis, dir, replicas, clients) = on_one_redis(3).await;
    let mut held = Vec::new();
    while held.len() < 10 {
        let r = clients[0].clone().acquire(acquire("db-switch", &[], 1)).await.unwrap().into_inner();
        if r.verdict() == pb::Verdict::Allowed {
            held.push(r.permit_id);
        }
    }
    let (from, to) = (
        "concurrency: { max_in_flight: 10, sync: replicated, permit_ttl: 60s }",
        "concurrency: { max_in_flight: 10, sync: strict, permit_ttl: 60s }",
    );
    rewrite_rules(&dir, &replicas, from, to, 2).await;
    for (n, c) in clients.iter().enumerate() {
        let r = c.clone().acquire(acquire("db-switch", &[], 1)).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::ConcurrencyLimited, "replica {n}: the 10 held count in the strict set");
    }
    // Reported, each gives its slot back to the set.
    for p in held.drain(..5) {
        let rep = clients[1].clone().report_outcome(report("db-switch", &p, pb::Outcome::Success)).await.unwrap();
        assert!(rep.get_ref().counted);
    }
    let mut admitted = 0;
    for i in 0..10 {
        let r = clients[i % 3].clone().acquire(acquire("db-switch", &[], 1)).await.unwrap().into_inner();
        admitted += u32::from(r.verdict() == pb::Verdict::Allowed);
    }
    assert_eq!(admitted, 5);
}

/// Two replicas on one Redis with different rules files say so, each of
/// the other (log, metric, /readyz, console), and stop once the files agree.
#[tokio::test]
async fn replicas_whose_rules_differ_say_so_until_they_agree() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (dir_a, dir_b) = (TempDir::new(), TempDir::new());
    let file_a = dir_a.write("rules.yaml", RULES);
    let other = RULES.replace("max_in_flight: 2, sync: local", "max_in_flight: 3, sync: local");
    let file_b = dir_b.write("rules.yaml", &other);
    let start = |file: &std::path::Path| {
        floodgate().args(["--config", path_str(file), "--sync-interval", "100ms", "--redis", &url]).start()
    };
    let (a, b) = (start(&file_a), start(&file_b));
    wait_live(&a, 2);
    wait_live(&b, 2);
    for (me, other) in [(&a, "b"), (&b, "a")] {
        eventually("the difference seen", Duration::from_secs(10), || async {
            (me.metrics().series("floodgate_rules_differing_replicas") == Some(1.0)).then_some(())
        })
        .await;
        let (status, body) = me.http_get("/readyz");
        assert_eq!(status, 200, "still ready: {body}");
        assert!(body.contains("warning: 1 live replicas decide by other rules than this one"), "{other}: {body}");
        let (_, console) = me.http_get("/api/v1/console");
        let console: serde_json::Value = serde_json::from_str(&console).unwrap();
        assert_eq!(console["replication"]["rules_differ"].as_array().map(Vec::len), Some(1), "{console}");
        assert!(me.logs().contains("live replicas decide by other rules than this one"), "{}", me.logs());
    }
    // B gets A's rules: both agree again.
    dir_b.replace("rules.yaml", RULES);
    for me in [&a, &b] {
        eventually("the rules agreeing", Duration::from_secs(10), || async {
            (me.metrics().series("floodgate_rules_differing_replicas") == Some(0.0)).then_some(())
        })
        .await;
        assert_eq!(me.http_get("/readyz").1, "ready\n");
    }
}
