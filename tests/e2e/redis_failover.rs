//! Redis failovers. Behind Sentinel, the replicas find the master through
//! real `redis-server --sentinel` processes and follow it through a failover;
//! in a Redis Cluster, they follow the slots to a promoted replica. In both,
//! the promoted replica may not have received the last writes.

// Each test runs on its own thread; the lock only makes them take turns.
#![allow(clippy::await_holding_lock)]

use crate::support;

use std::time::{Duration, Instant};

use support::redis::{RedisCluster, RedisServer};
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

/// A replica of Floodgate on the rules above. `flag` says what `redis` is:
/// `--redis-sentinel` (the Sentinels) or `--redis-cluster` (the seeds).
fn replica(dir: &TempDir, redis: &str, flag: &str) -> Floodgate {
    let file = dir.path("rules.yaml");
    if !file.exists() {
        dir.write("rules.yaml", RULES);
    }
    floodgate()
        .args(["--config", path_str(&file), flag, redis])
        .args(if flag == "--redis-sentinel" { vec!["--redis-sentinel-master", MASTER] } else { vec![] })
        .args(["--sync-interval", "100ms", "--redis-timeout", "250ms"])
        .start()
}

/// What each resource may admit in all, given what it admitted before the
/// failover. `strict-window` (`on_redis_error: deny`) and the replicated
/// window: their 300. `strict-bucket` decides locally while Redis is away
/// (`on_redis_error: local`): a replica that has not yet seen the new master
/// may admit its share (a half) of what was left when Redis went away, while
/// the other already decides through the new master, as during any outage.
fn most(before: &[u64]) -> [u64; 3] {
    [300, 300 + 300u64.saturating_sub(before[1]).div_ceil(2), 300]
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
    let (a, b) = (replica(&dir, &redis.urls(), "--redis-sentinel"), replica(&dir, &redis.urls(), "--redis-sentinel"));
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

    let most = most(&admitted);
    the_rest_is_refused(&[&a, &b], &RESOURCES, admitted, &most, 2, "a failover to a replica that lagged");
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

/// The same failover in a Redis Cluster, on every master at once: each
/// master's replica is stopped and loses its link, the replicas of Floodgate
/// use 100 more units of every limit, every master dies, and each stopped
/// replica takes its master's slots over (`CLUSTER FAILOVER TAKEOVER`, what
/// an operator does when the cluster cannot vote) without those 100 units.
/// Floodgate follows the slots to the new masters, finds the resources'
/// markers older than what it wrote, and writes back what it knows: every
/// limit still admits at most its 300 in all.
#[test]
fn a_cluster_failover_to_replicas_that_lagged_admits_nothing_twice() {
    let _serial = one_at_a_time();
    let mut cluster = RedisCluster::start_with_replicas();
    let masters = [0, 1, 2];
    let followers: Vec<usize> = masters.iter().map(|&m| cluster.replica_of(m)).collect();
    let dir = TempDir::new();
    let (a, b) =
        (replica(&dir, &cluster.seeds(), "--redis-cluster"), replica(&dir, &cluster.seeds(), "--redis-cluster"));
    wait_live(&a, 2);
    wait_live(&b, 2);

    let mut admitted = vec![0u64; RESOURCES.len()];
    for (i, r) in RESOURCES.iter().enumerate() {
        admitted[i] += admit(&[&a, &b], r, 50);
    }
    std::thread::sleep(Duration::from_millis(500));
    for &m in &masters {
        let acked = cluster.nodes[m].cli(&["WAIT", "1", "5000"]).unwrap_or_default();
        assert_eq!(acked.trim(), "1", "the replica of node {m} did not catch up");
    }
    for (&m, &f) in masters.iter().zip(&followers) {
        cluster.nodes[f].signal("STOP");
        std::thread::sleep(Duration::from_millis(100));
        cluster.nodes[m].cli(&["CLIENT", "KILL", "TYPE", "replica"]).unwrap();
    }
    for (i, r) in RESOURCES.iter().enumerate() {
        admitted[i] += admit(&[&a, &b], r, 50);
    }
    std::thread::sleep(Duration::from_millis(500));
    // The masters that hold the strict limits' markers (and so their buckets).
    let holders: Vec<usize> = RESOURCES[..2].iter().map(|r| cluster.master_holding(&format!("fg:m:{{{r}}}"))).collect();
    let mut lagged = Vec::new();
    for (&m, &f) in masters.iter().zip(&followers) {
        let written = replication_offset(&cluster.nodes[m], "master_repl_offset");
        cluster.nodes[m].kill();
        cluster.nodes[f].signal("CONT");
        let received = replication_offset(&cluster.nodes[f], "slave_repl_offset");
        if received < written {
            lagged.push(m);
        }
        let answer = cluster.nodes[f].cli(&["CLUSTER", "FAILOVER", "TAKEOVER"]).unwrap_or_default();
        assert_eq!(answer, "OK", "node {f} would not take over");
    }
    for h in &holders {
        assert!(lagged.contains(h), "the replica of node {h}, which holds a strict limit, lags ({lagged:?})");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for &f in &followers {
        while !cluster.nodes[f].cli(&["CLUSTER", "INFO"]).unwrap_or_default().contains("cluster_state:ok") {
            assert!(Instant::now() < deadline, "the cluster did not come back after the takeovers");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    let most = most(&admitted);
    the_rest_is_refused(&[&a, &b], &RESOURCES, admitted, &most, 2, "a cluster failover to replicas that lagged");
    let restores: f64 =
        [&a, &b].iter().map(|r| r.metrics().series("floodgate_redis_restores_total").unwrap_or(0.0)).sum();
    assert!(restores >= 1.0, "the replicas wrote back what the new masters had lost ({restores})");
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
    // A replicated bucket it never pulled: it holds no lease of it, so a
    // window admits nothing until Redis answers (it still answers each call).
    assert_eq!(admit(&[&fg], "replicated-window", 10), 0);
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
