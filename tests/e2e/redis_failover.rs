//! Redis behind Sentinel: the replicas find the master through real
//! `redis-server --sentinel` processes and follow it through a failover,
//! including a failover to a replica that had not received the last writes.

// Each test runs on its own thread; the lock only makes them take turns.
#![allow(clippy::await_holding_lock)]

use crate::support;

use std::time::{Duration, Instant};

use support::redis::RedisServer;
use support::redis_sentinel::{MASTER, RedisSentinels};
use support::*;

use super::rollback::{admit, the_rest_is_refused};

const RULES: &str = r#"
resources:
  - name: strict-window
    limits: [ { name: hour, algorithm: fixed_window, limit: 300, window: 1h, sync: strict, on_redis_error: deny } ]
  - name: strict-bucket
    limits: [ { name: tokens, algorithm: token_bucket, capacity: 300, refill_per_second: 0.001, sync: strict, on_redis_error: local } ]
  - name: replicated-window
    limits: [ { name: hour, algorithm: fixed_window, limit: 300, window: 1h } ]
"#;

const RESOURCES: [&str; 3] = ["strict-window", "strict-bucket", "replicated-window"];

fn replica(dir: &TempDir, sentinels: &str) -> Floodgate {
    let file = dir.path("rules.yaml");
    if !file.exists() {
        dir.write("rules.yaml", RULES);
    }
    floodgate()
        .args(["--config", path_str(&file), "--redis-sentinel", sentinels, "--redis-sentinel-master", MASTER])
        .args(["--sync-interval", "100ms", "--redis-timeout", "250ms"])
        .start()
}

/// A number from `INFO replication`.
fn replication_offset(redis: &RedisServer, field: &str) -> u64 {
    let info = redis.cli(&["INFO", "replication"]).unwrap_or_default();
    let line = info.lines().find_map(|l| l.strip_prefix(&format!("{field}:")));
    line.and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("no {field} in {info}"))
}

/// The failover Redis Sentinel is for, at its worst: the replica stops
/// receiving the master's writes (it is stopped, and the master drops the
/// link), the replicas of Floodgate use 100 more units of every limit, the
/// master dies, and the Sentinels promote the replica that never saw those
/// 100. Floodgate follows the new master, notices that it is another Redis
/// process, and writes back what it knows: every limit still admits at
/// most its 300 in all.
#[test]
fn a_failover_to_a_replica_that_lagged_admits_nothing_twice() {
    let _serial = one_at_a_time();
    let mut redis = RedisSentinels::start();
    let dir = TempDir::new();
    let (a, b) = (replica(&dir, &redis.urls()), replica(&dir, &redis.urls()));
    wait_live(&a, 2);
    wait_live(&b, 2);

    let mut admitted = vec![0u64; RESOURCES.len()];
    for (i, r) in RESOURCES.iter().enumerate() {
        admitted[i] += admit(&[&a, &b], r, 50);
    }
    // The replicated window pushes what it took; the replica receives it.
    std::thread::sleep(Duration::from_millis(500));
    redis.wait_replica_caught_up();
    // The replica stops, and the master drops its link: what the master
    // writes from now on never reaches the replica.
    redis.replica.signal("STOP");
    std::thread::sleep(Duration::from_millis(100));
    redis.master.cli(&["CLIENT", "KILL", "TYPE", "replica"]).unwrap();
    for (i, r) in RESOURCES.iter().enumerate() {
        admitted[i] += admit(&[&a, &b], r, 50);
    }
    std::thread::sleep(Duration::from_millis(500));
    let written = replication_offset(&redis.master, "master_repl_offset");
    redis.master.kill();
    redis.replica.signal("CONT");
    let received = replication_offset(&redis.replica, "slave_repl_offset");
    assert!(received < written, "the replica lags: it received up to {received} of {written}");
    let promoted = Instant::now();
    redis.wait_master(redis.replica.port, Duration::from_secs(30));
    println!("the Sentinels promoted the replica in {:?}", promoted.elapsed());

    the_rest_is_refused(&[&a, &b], &RESOURCES, admitted, 2, "a failover to a replica that lagged");
    // Both replicas said that they followed the failover.
    let port = redis.replica.port.to_string();
    for r in [&a, &b] {
        let logs = r.logs();
        assert!(logs.contains("a failover") && logs.contains(&port), "the failover is logged: {logs}");
    }
    // The new master holds the whole of the strict limits' use (written back
    // by the replicas), not only what it had received.
    let restores: f64 =
        [&a, &b].iter().map(|r| r.metrics().series("floodgate_redis_restores_total").unwrap_or(0.0)).sum();
    assert!(restores >= 1.0, "the replicas wrote back what the new master had lost ({restores})");
}

/// Wrong names and unreachable Sentinels are said, and the server goes on
/// serving from memory, as with a Redis that is away.
#[test]
fn a_master_name_no_sentinel_knows_is_said_and_the_server_serves() {
    let _serial = one_at_a_time();
    let redis = RedisSentinels::start();
    let dir = TempDir::new();
    dir.write("rules.yaml", RULES);
    let fg = floodgate()
        .args(["--config", path_str(&dir.path("rules.yaml")), "--redis-sentinel", &redis.urls()])
        .args(["--redis-sentinel-master", "no-such-master"])
        .start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fg.logs().contains("no Redis Sentinel names the master") {
        assert!(Instant::now() < deadline, "the unknown name was never said: {}", fg.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fg.logs().contains("does not know a master named"), "{}", fg.logs());
    // A replicated limit decides from memory meanwhile.
    assert_eq!(admit(&[&fg], "replicated-window", 10), 10);
}

/// A Sentinel flag without the other is refused before the server starts.
#[test]
fn sentinels_without_a_master_name_are_refused() {
    let out = std::process::Command::new(support::BIN)
        .args(["serve", "--redis-sentinel", "redis://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--redis-sentinel-master"), "{err}");
    let out = std::process::Command::new(support::BIN)
        .args(["serve", "--redis-sentinel", "redis://127.0.0.1:1", "--redis-sentinel-master", "a b"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("master name"), "{err}");
    // A password in any Redis URL is refused before anything is logged, and
    // never shown.
    for args in [
        vec!["--redis-sentinel", "redis://u:topsecret@127.0.0.1:1", "--redis-sentinel-master", "m"],
        vec!["--redis", "redis://u:topsecret@127.0.0.1:1"],
        vec!["--redis-cluster", "redis://127.0.0.1:1,redis://u:topsecret@127.0.0.1:2"],
    ] {
        let out = std::process::Command::new(support::BIN).arg("serve").args(&args).output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{args:?}: {said}");
        assert!(said.contains("a password in the URL is refused") && !said.contains("topsecret"), "{args:?}: {said}");
    }
}
