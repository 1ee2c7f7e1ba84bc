//! Replication through real `redis-server` processes (and a real three-master
//! Redis Cluster) on free loopback ports: replicas, strict and replicated
//! limits, restarts, Redis outages, shared breakers and rules.

// Each test runs on its own thread and runtime; the lock held across awaits
// only makes them take turns.
#![allow(clippy::await_holding_lock)]

use crate::support;

use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use support::redis::{RedisCluster, RedisServer};
use support::*;

const RULES: &str = r#"
resources:
  - name: strict
    limits: [ { name: per-minute, algorithm: sliding_window_log, limit: 1000, window: 1m, sync: strict } ]
  - name: replicated
    limits: [ { name: per-minute, algorithm: sliding_window, limit: 1000, window: 1m } ]
  - name: bucket
    limits: [ { name: tokens, key: [user], algorithm: token_bucket, capacity: 100, refill_per_second: 0.001 } ]
  - name: big
    limits: [ { name: tokens, algorithm: token_bucket, capacity: 1000000, refill_per_second: 0.001 } ]
  - name: hourly
    limits: [ { name: hourly, key: [user], algorithm: fixed_window, limit: 50, window: 1h } ]
  - name: daily-strict
    limits: [ { name: per-day, algorithm: fixed_window, limit: 300, calendar: day, time_zone: Asia/Kolkata, sync: strict } ]
  - name: daily
    limits: [ { name: per-day, algorithm: fixed_window, limit: 300, calendar: day, time_zone: Asia/Kolkata } ]
  - name: daily-1
    limits: [ { name: per-day, algorithm: fixed_window, limit: 300, calendar: day, time_zone: Asia/Kolkata } ]
  - name: daily-2
    limits: [ { name: per-day, algorithm: fixed_window, limit: 300, calendar: day, time_zone: Asia/Kolkata } ]
  - name: daily-3
    limits: [ { name: per-day, algorithm: fixed_window, limit: 300, calendar: day, time_zone: Asia/Kolkata } ]
  - name: daily-4
    limits: [ { name: per-day, algorithm: fixed_window, limit: 300, calendar: day, time_zone: Asia/Kolkata } ]
  - name: warm
    limits: [ { name: ramp, algorithm: warm_up, rate_per_second: 20, warm_up_period: 10s } ]
  - name: warm-local
    limits: [ { name: ramp, algorithm: warm_up, rate_per_second: 20, warm_up_period: 10s, sync: local } ]
  - name: payments
    breaker:
      window: { kind: count, size: 20 }
      minimum_calls: 4
      failure_rate_threshold: 0.5
      wait_in_open: 1s
      half_open_calls: 3
      max_wait_in_half_open: 30s
"#;

const SYNC_MS: u64 = 100;

// These tests run one at a time (`one_at_a_time`): each starts Redis, two or
// three servers and load generators, and their timing figures mean little on
// a machine shared with five more of them.

fn replica(dir: &TempDir, redis: &[&str]) -> Floodgate {
    let file = dir.path("rules.yaml");
    if !file.exists() {
        dir.write("rules.yaml", RULES);
    }
    let mut args = vec!["--config", path_str(&file)];
    args.extend_from_slice(redis);
    args.extend_from_slice(&["--sync-interval", "100ms", "--redis-timeout", "50ms"]);
    floodgate().args(&args).start()
}

/// Two replicas sharing one Redis (or cluster), each counting both as live.
fn two_replicas(dir: &TempDir, redis: &[&str]) -> (Floodgate, Floodgate) {
    let (a, b) = (replica(dir, redis), replica(dir, redis));
    wait_live(&a, 2);
    wait_live(&b, 2);
    (a, b)
}

/// Both replicas under load at once: (admitted, denied) summed.
fn load_both(a: &Floodgate, b: &Floodgate, resource: &str, each: u32) -> (u64, u64, Vec<serde_json::Value>) {
    load_both_with(a, b, &["--resource", resource, "-n", &each.to_string(), "-c", "8"])
}

/// Both replicas under the same `floodgate bench` at once.
fn load_both_with(a: &Floodgate, b: &Floodgate, args: &[&str]) -> (u64, u64, Vec<serde_json::Value>) {
    let reports = std::thread::scope(|s| {
        let ha = s.spawn(|| bench(&a.grpc, args));
        let hb = s.spawn(|| bench(&b.grpc, args));
        vec![ha.join().unwrap(), hb.join().unwrap()]
    });
    for r in &reports {
        assert_eq!(r["errorDistribution"], serde_json::json!({}), "{r}");
    }
    let admitted = reports.iter().map(|r| verdict(r, "ALLOWED")).sum();
    let denied = reports.iter().map(|r| verdict(r, "RATE_LIMITED")).sum();
    (admitted, denied, reports)
}

/// `calls` strict calls on a limit through two replicas: exactly the limit
/// admitted while Redis answers every call within --redis-timeout (50 ms
/// here). On a machine loaded enough that a call waits longer, the replica
/// decides from its share of the limit until Redis answers again (the
/// outage policy, logged), which may deny calls Redis would have admitted:
/// then at most the limit, never more.
fn strict_exactly(
    a: &Floodgate,
    b: &Floodgate,
    (admitted, denied): (u64, u64),
    (limit, calls): (u64, u64),
    what: &str,
) {
    assert_eq!(admitted + denied, calls, "{what}: every call answered");
    let outage = [a, b].iter().any(|r| r.logs().contains("Redis is unreachable"));
    if outage {
        assert!(admitted <= limit, "{what}: {admitted} admitted during an outage of a loaded machine");
    } else {
        assert_eq!(admitted, limit, "{what}; logs:\n{}\n{}", a.logs(), b.logs());
    }
}

#[test]
fn two_replicas_admit_exactly_the_limit_in_strict_mode_and_within_the_bound_when_replicated() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = two_replicas(&dir, &["--redis", &url]);

    let (admitted, denied, _) = load_both(&a, &b, "strict", 1500);
    strict_exactly(&a, &b, (admitted, denied), (1000, 3000), "strict: exactly 1000 across both replicas");

    let started = Instant::now();
    let (admitted, denied, _) = load_both(&a, &b, "replicated", 1500);
    let elapsed = started.elapsed().as_secs_f64();
    // The documented bound: R x rate x sync interval beyond the limit, where a
    // window's rate is limit / window, plus the window's own slide while the
    // test runs.
    let rate = 1000.0 / 60.0;
    let bound = 1000.0 + rate * elapsed + 2.0 * rate * (SYNC_MS as f64 / 1000.0);
    println!("replicated: {admitted} admitted across two replicas in {elapsed:.2}s (bound {bound:.1})");
    assert!(admitted as f64 <= bound.ceil(), "{admitted} admitted, bound {bound:.1}");
    assert!(admitted >= 900, "{admitted} admitted: leases should not starve a loaded pair");
    assert_eq!(admitted + denied, 3000);
}

#[test]
fn a_cold_warm_up_is_the_fleets_not_each_replicas() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = two_replicas(&dir, &["--redis", &url]);
    // Cold, 20 a second ramps up from 20 / 3: over 2 s, about 13 for the whole
    // fleet when it is shared through Redis, about 13 per replica when not.
    let load = |resource: &str| load_both_with(&a, &b, &["--resource", resource, "--rps", "50", "-z", "2s", "-c", "4"]);
    let (shared, ..) = load("warm");
    let (local, ..) = load("warm-local");
    println!("cold warm-up over 2 s: {shared} admitted shared, {local} per replica (two replicas)");
    assert!((8..=24).contains(&shared), "{shared} admitted by the fleet's cold warm-up");
    assert!((shared as f64) < local as f64 * 0.8, "shared {shared} against {local} when each replica had its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_windows_hold_across_two_replicas_and_reset_at_local_midnight() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = two_replicas(&dir, &["--redis", &url]);

    // Strict: Redis picks the window from the boundaries the replica sends.
    let (admitted, denied, _) = load_both(&a, &b, "daily-strict", 250);
    strict_exactly(&a, &b, (admitted, denied), (300, 500), "strict: exactly the day's 300 across both replicas");
    // Replicated: a window has no refill, so leases never add to it.
    let (admitted, denied, _) = load_both(&a, &b, "daily", 250);
    assert!((290..=300).contains(&admitted), "replicated: {admitted} admitted of a day's 300");
    assert_eq!(admitted + denied, 500);

    // Both replicas answer with the same reset: the next midnight in Kolkata.
    for (fg, resource) in [(&a, "daily-strict"), (&b, "daily-strict"), (&a, "daily"), (&b, "daily")] {
        let r = fg
            .client()
            .await
            .acquire(pb::AcquireRequest { resource: resource.into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.verdict(), pb::Verdict::RateLimited, "{resource}: the day is used up");
        let retry = r.retry_after.unwrap().seconds as u64;
        let expected = seconds_to_kolkata_midnight();
        assert!(same_daily_reset(retry, expected, 3), "{resource}: retry after {retry}s, midnight is {expected}s away");
    }
    // The window's counter in Redis is keyed by its start, Unix microseconds
    // of midnight in Kolkata, and expires with the day.
    let midnight_us = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
        + seconds_to_kolkata_midnight()
        - 86_400)
        * 1_000_000;
    let keys = redis.cli(&["--scan", "--pattern", "fg:b:{daily-strict}*"]).unwrap_or_default();
    assert!(keys.contains(&format!(":{midnight_us}")), "a key per local day: {keys}");
}

#[test]
fn replicated_windows_never_admit_past_their_limit_while_both_replicas_sync_at_once() {
    // Each replica runs periodic syncs and escalations (a request its lease
    // denies while the replicas have more in common) for the same buckets:
    // a merged state Redis computed before another sync's push arrived once
    // let a replica admit that push's units again (301-323 of 300), and the
    // first touches of several keys at once were taken for a loss of Redis's
    // data (then decided from full buckets: up to 400 of 300).
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = two_replicas(&dir, &["--redis", &url]);
    // Four rounds, each on a window of its own: 250 calls through each
    // replica at once, 500 for a window of 300.
    let mut counts = Vec::new();
    for round in 1..=4 {
        let resource = format!("daily-{round}");
        let (admitted, denied, _) = load_both(&a, &b, &resource, 250);
        assert_eq!(admitted + denied, 500);
        // What Redis counted is what was admitted (every unit is pushed).
        let pattern = format!("fg:b:{{{resource}}}:*");
        let window = || {
            let found = redis.cli(&["--scan", "--pattern", &pattern]).unwrap_or_default();
            let key = found
                .lines()
                .find(|k| !k.ends_with(":l") && !k.ends_with(":r") && !k.ends_with(":p") && !k.ends_with(":w"))
                .map(str::to_string);
            key.and_then(|k| redis.cli(&["GET", &k])).and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while window() != admitted && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(window(), admitted, "{resource}: Redis counts every admitted unit");
        counts.push(admitted);
        // Redis lost nothing, so nothing was restored (`:r` keeps what a
        // restore put back).
        let restored = redis.cli(&["--scan", "--pattern", &format!("{pattern}:r")]).unwrap_or_default();
        assert!(restored.trim().is_empty(), "{resource}: restores where Redis lost nothing: {restored} ({counts:?})");
    }
    for n in &counts {
        assert!(*n <= 300, "{n} admitted of a day's 300 ({counts:?} in the four rounds)");
        assert!(*n >= 290, "{n} admitted: the replicas' leases left too much unused ({counts:?})");
    }
}

#[test]
fn batches_through_two_replicas_are_exact_in_strict_mode_and_pull_what_they_do_not_hold() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = two_replicas(&dir, &["--redis", &url]);

    // 30 batches of 50 through each replica: 3000 strict decisions, one
    // script per item, the items of a batch sent to Redis together.
    let batch = ["--rpc", "batch", "--batch-size", "50", "-n", "30", "-c", "4", "--resource", "strict"];
    let (admitted, denied, _) = load_both_with(&a, &b, &batch);
    assert_eq!((admitted, denied), (1000, 2000), "strict batches: exactly 1000 across both replicas");

    // 100 keys of 100 tokens each, none held by either replica: every item's
    // bucket is pulled before deciding. 20 batches of 100 take 20 per key per
    // replica, 40 of 100 in all: nothing is denied, and Redis saw it all.
    let keyed =
        ["--rpc", "batch", "--batch-size", "100", "-n", "20", "-c", "2", "--resource", "bucket", "--keys", "100"];
    let (admitted, denied, _) = load_both_with(&a, &b, &keyed);
    assert_eq!((admitted, denied), (4000, 0));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tokens: f64 = redis
            .cli(&["HGET", "fg:b:{bucket}:tokens:token_bucket:k7", "t"])
            .and_then(|t| t.parse().ok())
            .unwrap_or(100.0);
        if tokens < 60.5 {
            assert!(tokens > 59.5, "{tokens} tokens left in Redis for k7; 60 expected");
            break;
        }
        assert!(Instant::now() < deadline, "the batches' consumption never reached Redis ({tokens} tokens)");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_replica_resumes_from_redis_instead_of_a_full_bucket() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let mut a = replica(&dir, &["--redis", &url]);
    wait_live(&a, 1);
    // Take 90 of the bucket's 100 tokens, then wait for the sync to push them.
    let r = bench(&a.grpc, &["--resource", "bucket", "--key-descriptor", "user", "-n", "90", "-c", "4"]);
    assert_eq!(verdict(&r, "ALLOWED"), 90);
    let key = "fg:b:{bucket}:tokens:token_bucket:k0";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tokens: f64 = redis.cli(&["HGET", key, "t"]).and_then(|t| t.parse().ok()).unwrap_or(100.0);
        if tokens < 11.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the consumption never reached Redis ({tokens} tokens)");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(a.pid(), "KILL");
    assert!(!wait_stopped(&mut a));
    let a = replica(&dir, &["--redis", &url]);
    let r = bench(&a.grpc, &["--resource", "bucket", "--key-descriptor", "user", "-n", "50", "-c", "1"]);
    assert!(
        verdict(&r, "ALLOWED") <= 10,
        "the restarted replica handed out {} tokens of the 10 left",
        verdict(&r, "ALLOWED")
    );
    assert!(verdict(&r, "RATE_LIMITED") >= 40);
}

fn wait_stopped(fg: &mut Floodgate) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fg.is_running() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    fg.is_running()
}

#[test]
fn redis_stopped_mid_load_fails_no_call_and_the_replicas_catch_up_when_it_returns() {
    let _serial = one_at_a_time();
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = two_replicas(&dir, &["--redis", &url]);
    let args = ["--resource", "big", "-z", "3s", "--rps", "400", "-c", "8", "--timeout", "5s"];
    let reports = std::thread::scope(|s| {
        let ha = s.spawn(|| bench(&a.grpc, &args));
        let hb = s.spawn(|| bench(&b.grpc, &args));
        std::thread::sleep(Duration::from_millis(1000));
        redis.shutdown_save();
        std::thread::sleep(Duration::from_millis(1000));
        redis.restart();
        vec![ha.join().unwrap(), hb.join().unwrap()]
    });
    let mut admitted = 0;
    for r in &reports {
        assert_eq!(r["errorDistribution"], serde_json::json!({}), "no call failed: {r}");
        assert_eq!(r["statusCodeDistribution"]["OK"], r["count"]);
        assert_eq!(verdict(r, "ALLOWED"), r["count"].as_u64().unwrap(), "replicated limits kept deciding from memory");
        admitted += verdict(r, "ALLOWED");
        let slowest = Duration::from_nanos(r["slowest"].as_u64().unwrap());
        assert!(slowest < Duration::from_secs(1), "a call took {slowest:?}");
    }
    // No call into Redis waited past --redis-timeout (50 ms), by the servers' own clocks.
    for fg in [&a, &b] {
        let page = fg.http_get("/metrics").1;
        let metrics = Metrics::parse(&page);
        let sum = |le: &str| metrics.sum("floodgate_redis_rtt_seconds_bucket", &[("le", le)]);
        // 50 ms plus the scheduling slack of a loaded 2-core machine.
        assert_eq!(sum("0.25"), sum("+Inf"), "a Redis call outlasted the timeout:\n{page}");
        assert!(page.lines().any(|l| l.starts_with("floodgate_redis_errors_total")), "the outage was seen");
    }
    // Redis came back with what it had saved; the replicas push what they
    // took while it was gone, so the shared bucket accounts for everything.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let tokens: f64 =
            redis.cli(&["HGET", "fg:b:{big}:tokens:token_bucket:", "t"]).and_then(|t| t.parse().ok()).unwrap_or(0.0);
        let taken = 1_000_000.0 - tokens;
        if tokens > 0.0 && (taken - admitted as f64).abs() <= 2.0 {
            break;
        }
        assert!(Instant::now() < deadline, "Redis holds {taken} taken, the replicas admitted {admitted}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_opened_on_one_replica_opens_on_the_other_and_probes_are_counted_across_both() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = two_replicas(&dir, &["--redis", &url]);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    // B has seen the breaker closed.
    let r = cb.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner();
    assert_eq!(r.breaker_state(), pb::BreakerState::Closed);
    let report = |permit: String, outcome: pb::Outcome| pb::ReportOutcomeRequest {
        permit_id: permit,
        outcome: outcome as i32,
        ..Default::default()
    };
    cb.report_outcome(report(r.permit_id, pb::Outcome::Success)).await.unwrap();
    for _ in 0..4 {
        let r = ca.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner();
        ca.report_outcome(report(r.permit_id, pb::Outcome::Failure)).await.unwrap();
    }
    // Open on A at once; on B within a sync interval or so.
    let opened = Instant::now();
    let mut dry = acquire("payments", &[], 1);
    dry.dry_run = true;
    eventually("B to see the breaker open", Duration::from_secs(5), || {
        let (mut c, dry) = (cb.clone(), dry.clone());
        async move { (c.acquire(dry).await.unwrap().into_inner().verdict() == pb::Verdict::CircuitOpen).then_some(()) }
    })
    .await;
    let took = opened.elapsed();
    println!("breaker open on B {took:?} after the failures on A");
    assert!(took < Duration::from_millis(3 * SYNC_MS + 400), "{took:?}");

    // After wait_in_open, ten calls across both replicas: exactly three probes.
    eventually("the end of wait_in_open", Duration::from_secs(10), || {
        let (mut c, dry) = (ca.clone(), dry.clone());
        async move { (c.acquire(dry).await.unwrap().into_inner().verdict() == pb::Verdict::Allowed).then_some(()) }
    })
    .await;
    let mut calls = Vec::new();
    for i in 0..10 {
        let mut c = if i % 2 == 0 { ca.clone() } else { cb.clone() };
        calls.push(tokio::spawn(
            async move { (i % 2, c.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner()) },
        ));
    }
    let mut probes = Vec::new();
    for call in calls {
        let (side, r) = call.await.unwrap();
        if r.verdict() == pb::Verdict::Allowed {
            probes.push((side, r.permit_id));
        }
    }
    assert_eq!(probes.len(), 3, "probes across both replicas");
    for (side, permit) in probes {
        let c = if side == 0 { &mut ca } else { &mut cb };
        assert!(c.report_outcome(report(permit, pb::Outcome::Success)).await.unwrap().into_inner().counted);
    }
    for c in [&ca, &cb] {
        eventually("both replicas to see it closed", Duration::from_secs(5), || {
            let mut c = c.clone();
            async move {
                let r = c.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner();
                (r.breaker_state() == pb::BreakerState::Closed).then_some(())
            }
        })
        .await;
    }
}

#[tokio::test]
async fn rules_applied_on_one_replica_reach_the_others_and_later_ones() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = (replica(&dir, &["--redis", &url]), replica(&dir, &["--redis", &url]));
    let new_rules =
        "resources:\n  - { name: fresh, limits: [ { name: l, algorithm: fixed_window, limit: 7, window: 1h } ] }\n";
    a.admin()
        .await
        .apply_rules(pb::ApplyRulesRequest { yaml: new_rules.into(), validate_only: false, ..Default::default() })
        .await
        .unwrap();
    let mut admin_b = b.admin().await;
    eventually("B to take the rules", Duration::from_secs(5), || {
        let mut admin = admin_b.clone();
        async move { (admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner().yaml == new_rules).then_some(()) }
    })
    .await;
    let got = admin_b.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    assert_eq!(got.source, "redis");
    let c = replica(&dir, &["--redis", &url]);
    let got = c.admin().await.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    assert_eq!((got.yaml.as_str(), got.source.as_str()), (new_rules, "redis"), "a replica started later loads them");
    // A revert on A is shared like an apply: every replica has the file back.
    let reverted = a.admin().await.revert_rules(pb::RevertRulesRequest::default()).await.unwrap().into_inner();
    assert_eq!(reverted.resources.first().map(String::as_str), Some("strict"), "the file's rules");
    for (name, fg) in [("B", &b), ("C", &c)] {
        let mut admin = fg.admin().await;
        eventually(&format!("{name} to take the reverted rules"), Duration::from_secs(5), || {
            let mut admin = admin.clone();
            async move { (admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner().yaml == RULES).then_some(()) }
        })
        .await;
        let got = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
        assert_eq!(got.source, "redis");
    }
}

#[test]
fn strict_mode_is_exact_on_a_three_master_redis_cluster() {
    let _serial = one_at_a_time();
    let cluster = RedisCluster::start();
    let dir = TempDir::new();
    let seeds = cluster.seeds();
    let (a, b) = two_replicas(&dir, &["--redis-cluster", &seeds]);
    let (admitted, denied, _) = load_both(&a, &b, "strict", 1500);
    strict_exactly(&a, &b, (admitted, denied), (1000, 3000), "strict on a cluster: exactly 1000");
    // Keys of other resources land on other masters: the cluster is really used.
    let (admitted, _, _) = load_both(&a, &b, "replicated", 600);
    assert!(admitted <= 1000 + 5);
    let holding: Vec<usize> =
        cluster.nodes.iter().map(|n| n.cli(&["DBSIZE"]).and_then(|s| s.parse().ok()).unwrap_or(0)).collect();
    assert!(holding.iter().filter(|&&k| k > 0).count() >= 2, "keys per master: {holding:?}");
}

#[tokio::test]
async fn a_replicated_fixed_window_reports_when_its_window_really_ends() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let a = replica(&dir, &["--redis", &url]);
    wait_live(&a, 1);
    let mut client = a.client().await;
    let ask = || acquire("hourly", &[("user", "u1")], 1);
    client.acquire(ask()).await.unwrap();
    // Past two syncs: the bucket is now this replica's lease of Redis's window.
    wait_syncs(&a, 2);
    let r = client.acquire(ask()).await.unwrap().into_inner();
    let reset = r.limits[0].reset_after.as_ref().map_or(0, |d| d.seconds);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let to_end = (3600 - now % 3600) as i64;
    assert!(reset <= 3600, "reset_after {reset} s on a 1 h window");
    assert!(reset.abs_diff(to_end) <= 2, "reset_after {reset} s; the window ends in {to_end} s");
}

#[test]
fn two_processes_given_the_same_replica_id_count_as_two_live_replicas() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    // A copy-pasted deployment: both say they are "api-0". Counted as one,
    // each would lease as if it were alone and their leases would overwrite
    // each other in Redis.
    let same = ["--redis", url.as_str(), "--replica-id", "api-0"];
    let (a, b) = two_replicas(&dir, &same);
    let members = redis.cli(&["ZRANGE", "{fg}:replicas", "0", "-1"]).unwrap();
    assert_eq!(members.lines().filter(|l| l.starts_with("api-0#")).count(), 2, "{members}");
    drop((a, b));
}

/// A key no replica has seen, first asked while Redis is away: each replica
/// starts it from its share of the limit (here half of 50), not from a
/// full bucket, so the two together admit the limit, not twice it.
#[test]
fn a_key_first_seen_while_redis_is_away_starts_from_each_replicas_share() {
    let _serial = one_at_a_time();
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = two_replicas(&dir, &["--redis", &url]);
    redis.kill();
    for fg in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fg.http_get("/api/v1/console").1.contains("\"redis_up\":false") {
            assert!(Instant::now() < deadline, "the replica never saw Redis go");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let args = ["--resource", "hourly", "--key-descriptor", "user", "-n", "50", "-c", "1"];
    let admitted: Vec<u64> = [&a, &b].iter().map(|fg| verdict(&bench(&fg.grpc, &args), "ALLOWED")).collect();
    assert_eq!(admitted, [25, 25], "each replica its share of the hourly window of 50");
}
