//! Redis that goes back in time: restarted from a dump file older than its
//! last writes, or emptied after the replicas stopped using a bucket. The
//! replicas must notice and put back what they know before they decide
//! again, so that a used-up limit stays used up.

// Each test runs on its own thread; the lock only makes them take turns.
#![allow(clippy::await_holding_lock)]

use crate::support;

use std::time::Duration;

use support::redis::RedisServer;
use support::*;

const RULES: &str = r#"
resources:
  - name: strict-window
    limits: [ { name: hour, algorithm: fixed_window, limit: 300, window: 1h, sync: strict, on_redis_error: deny } ]
  - name: strict-bucket
    limits: [ { name: tokens, algorithm: token_bucket, capacity: 300, refill_per_second: 0.001, sync: strict } ]
  - name: strict-log
    limits: [ { name: hour, algorithm: sliding_window_log, limit: 300, window: 1h, sync: strict } ]
  - name: replicated-window
    limits: [ { name: hour, algorithm: fixed_window, limit: 300, window: 1h } ]
  - name: replicated-bucket
    limits: [ { name: tokens, algorithm: token_bucket, capacity: 300, refill_per_second: 0.001 } ]
  - name: replicated-log
    limits: [ { name: hour, algorithm: sliding_window_log, limit: 300, window: 1h } ]
"#;

const RESOURCES: [&str; 6] =
    ["strict-window", "strict-bucket", "strict-log", "replicated-window", "replicated-bucket", "replicated-log"];

fn replica(dir: &TempDir, url: &str) -> Floodgate {
    let file = dir.path("rules.yaml");
    if !file.exists() {
        dir.write("rules.yaml", RULES);
    }
    floodgate()
        .args(["--config", path_str(&file), "--redis", url, "--sync-interval", "100ms", "--redis-timeout", "250ms"])
        .start()
}

/// `n` calls of cost 1 on `resource` through each replica at once: how many
/// were admitted in all.
pub(crate) fn admit(replicas: &[&Floodgate], resource: &str, n: u32) -> u64 {
    let args = ["--resource", resource, "-n", &n.to_string(), "-c", "4"];
    let reports = std::thread::scope(|s| {
        let handles: Vec<_> = replicas.iter().map(|r| s.spawn(|| bench(&r.grpc, &args))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    reports.iter().map(|r| verdict(r, "ALLOWED")).sum()
}

/// The scenario of an operator's worst day: Redis saves a dump, the replicas
/// go on using their limits, Redis is killed and starts again from the dump.
/// The counts in Redis are now older than what the replicas saw. Every limit
/// here, strict or replicated, must still admit at most its 300 in all.
#[test]
fn a_redis_restarted_from_an_older_dump_admits_nothing_twice() {
    let _serial = one_at_a_time();
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = (replica(&dir, &url), replica(&dir, &url));
    wait_live(&a, 2);
    wait_live(&b, 2);

    let mut admitted = vec![0u64; RESOURCES.len()];
    for (i, r) in RESOURCES.iter().enumerate() {
        admitted[i] += admit(&[&a, &b], r, 50);
    }
    // Let the replicated limits push what they took before the dump.
    std::thread::sleep(Duration::from_millis(500));
    redis.bgsave();
    for (i, r) in RESOURCES.iter().enumerate() {
        admitted[i] += admit(&[&a, &b], r, 50);
    }
    std::thread::sleep(Duration::from_millis(500));
    // kill -9, then a start that loads the dump: 100 of each used since.
    redis.restart();
    wait_redis_up(&a);
    wait_redis_up(&b);
    the_rest_is_refused(&[&a, &b], &RESOURCES, admitted, &[300; 6], 3, "a restart from an older dump");
}

/// After Redis went back in time (and the replicas noticed): 200 more calls
/// of every resource through every replica, and 100 more a little later,
/// when every replica has surely restored. Each resource must have admitted
/// at most `most[i]` in all (its 300, or more where an outage allows it), and
/// at least the 200 of before. The first
/// `strict` resources may admit a little less than 300, never more: a call
/// whose answer from Redis comes after --redis-timeout is denied (the limit
/// says `deny` or decides locally from its share) although Redis took its
/// unit. On a busy machine there are more of those: each strict take that
/// failed may have cost one unit.
pub(crate) fn the_rest_is_refused(
    replicas: &[&Floodgate],
    resources: &[&str],
    mut admitted: Vec<u64>,
    most: &[u64],
    strict: usize,
    what: &str,
) {
    for (i, r) in resources.iter().enumerate() {
        admitted[i] += admit(replicas, r, 200);
    }
    std::thread::sleep(Duration::from_millis(1000));
    for (i, r) in resources.iter().enumerate() {
        admitted[i] += admit(replicas, r, 100);
    }
    let report: Vec<String> = resources.iter().zip(&admitted).map(|(r, n)| format!("{r}: {n}")).collect();
    println!("admitted of 300: {}", report.join(", "));
    if admitted.iter().zip(most).any(|(n, most)| n > most) {
        for r in replicas {
            eprintln!("=== a replica's log\n{}", r.logs());
        }
    }
    for ((r, n), most) in resources.iter().zip(&admitted).zip(most) {
        assert!(n <= most, "{r} admitted {n} of {most} after {what} ({report:?})");
        assert!(*n >= 200, "{r} admitted only {n}: the 200 before {what} were allowed ({report:?})");
    }
    let failed: f64 = replicas.iter().map(|r| r.metrics().sum("floodgate_redis_errors_total", &[("op", "take")])).sum();
    for (r, n) in resources[..strict].iter().zip(&admitted) {
        assert!(*n as f64 >= 280.0 - failed, "strict {r} admitted only {n} of 300, {failed} takes failed ({report:?})");
    }
}

/// Redis loses everything (FLUSHALL) while the buckets sit used up and idle,
/// long after the replicas stopped syncing them. The replica that used them
/// notices within about a second and puts back what it remembers, so the
/// other replica, which never used them, finds them used up too.
#[test]
fn a_bucket_idle_when_redis_loses_it_stays_used_up_through_another_replica() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    // The first replica is alone while it uses the limits up: it may take
    // all of a replicated limit, not only its share of two.
    let a = replica(&dir, &url);
    wait_live(&a, 1);
    let resources = ["strict-window", "strict-log", "replicated-window", "replicated-bucket"];
    for r in resources {
        assert_eq!(admit(&[&a], r, 300), 300, "{r}: the first 300 through one replica");
    }
    // The second replica starts now and never touches the limits before
    // Redis loses them.
    let b = replica(&dir, &url);
    wait_live(&b, 2);
    // Longer than a replicated bucket is kept in use (10 s): only what the
    // replica remembers of it is left.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(redis.cli(&["FLUSHALL"]).as_deref(), Some("OK"));
    // The replica checks idle resources once a second.
    std::thread::sleep(Duration::from_millis(2500));
    let restores = a.metrics().series("floodgate_redis_restores_total").unwrap_or(0.0);
    let mut more = Vec::new();
    for r in resources {
        more.push((r, admit(&[&b], r, 50)));
    }
    println!("admitted after the flush through the other replica: {more:?}; restores by the first: {restores}");
    for (r, n) in &more {
        assert_eq!(*n, 0, "{r}: a used-up limit stays used up after Redis lost it ({more:?})");
    }
    assert!(restores >= 4.0, "the replica that knew restored every resource ({restores})");
}
