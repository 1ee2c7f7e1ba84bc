//! Chaos: two replicas under load while their Redis stalls (SIGSTOP), is
//! killed, comes back empty, and comes back with its data. For each outage
//! policy the totals admitted are checked against what the README promises:
//! `deny` admits nothing while Redis is gone, `allow` everything, `local` at
//! most this replica's share of what Redis last reported left; strict limits
//! stay exact when Redis returns empty (the replicas restore what they knew),
//! and no decision that timed out is counted in Redis later.

mod support;

use std::time::{Duration, Instant};

use support::redis::RedisServer;
use support::*;

const RULES: &str = r#"
resources:
  - name: deny
    limits: [ { name: hourly, algorithm: fixed_window, limit: 50, window: 1h, sync: strict, on_redis_error: deny } ]
  - name: allow
    limits: [ { name: hourly, algorithm: fixed_window, limit: 50, window: 1h, sync: strict, on_redis_error: allow } ]
  - name: local
    limits: [ { name: hourly, algorithm: fixed_window, limit: 50, window: 1h, sync: strict, on_redis_error: local } ]
  - name: half
    limits: [ { name: hourly, algorithm: fixed_window, limit: 50, window: 1h, sync: strict, on_redis_error: local } ]
  - name: replicated
    limits: [ { name: hourly, algorithm: fixed_window, limit: 50, window: 1h } ]
"#;

fn replica(dir: &TempDir, url: &str) -> Floodgate {
    let rules = dir.path("rules.yaml");
    if !rules.exists() {
        dir.write("rules.yaml", RULES);
    }
    Floodgate::start(&[
        "--config",
        path_str(&rules),
        "--redis",
        url,
        "--sync-interval",
        "100ms",
        "--redis-timeout",
        "50ms",
    ])
}

/// `n` calls on `resource` through each replica at once: admitted in all.
fn admitted(a: &Floodgate, b: &Floodgate, resource: &str, n: u32) -> u64 {
    let args = ["--resource", resource, "-n", &n.to_string(), "-c", "4", "--rps", "200", "--timeout", "5s"];
    let reports = std::thread::scope(|s| {
        let ha = s.spawn(|| bench(&a.grpc, &args));
        let hb = s.spawn(|| bench(&b.grpc, &args));
        [ha.join().unwrap(), hb.join().unwrap()]
    });
    for r in &reports {
        assert_eq!(r["errorDistribution"], serde_json::json!({}), "no call may fail: {r}");
    }
    reports.iter().map(|r| verdict(r, "ALLOWED")).sum()
}

/// Waits until both replicas have seen Redis come back `n` times.
fn wait_back(a: &Floodgate, b: &Floodgate, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    for fg in [a, b] {
        while fg.logs().matches("Redis answers again").count() < n {
            assert!(Instant::now() < deadline, "a replica never saw Redis back ({n})");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What Redis counts for a resource's current window.
fn counted(redis: &RedisServer, resource: &str) -> u64 {
    let keys = redis.cli(&["KEYS", &format!("fg:b:{{{resource}}}:hourly:fixed_window:*")]).unwrap_or_default();
    keys.lines()
        .filter(|k| !k.ends_with(":l"))
        .filter_map(|k| redis.cli(&["GET", k]))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

#[test]
fn outage_policies_hold_through_a_stall_a_loss_and_a_restart() {
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let url = redis.url();
    let (a, b) = (replica(&dir, &url), replica(&dir, &url));
    wait_live(&a, 2);
    wait_live(&b, 2);
    let mut table = Vec::new();

    // Before: every strict limit used up through both replicas, "half" to 30.
    for resource in ["deny", "allow", "local", "replicated"] {
        assert!(admitted(&a, &b, resource, 40) >= 50 - 1, "{resource} filled");
    }
    // "half": 30 through A, then one through B (B last saw 19 left), then
    // one through A (A last saw 18 left).
    let one = |fg: &Floodgate, n: u32| {
        verdict(&bench(&fg.grpc, &["--resource", "half", "-n", &n.to_string(), "-c", "1"]), "ALLOWED")
    };
    assert_eq!((one(&a, 30), one(&b, 1), one(&a, 1)), (30, 1, 1));
    let before: Vec<u64> = ["deny", "allow", "local", "half"].iter().map(|r| counted(&redis, r)).collect();
    assert_eq!(before, [50, 50, 50, 32], "exact before the outage");

    // Stalled: SIGSTOP. Every request of the outage follows the policy.
    redis.signal("STOP");
    // "half" goes first: its first calls are in flight when Redis stops.
    let during = [("half", 20), ("deny", 20), ("allow", 20), ("local", 20), ("replicated", 20)]
        .map(|(r, n)| (r, admitted(&a, &b, r, n)));
    redis.signal("CONT");
    for (resource, got) in during {
        table.push(format!("stalled   {resource:<11} {got:>3} admitted of 40"));
    }
    // A: half of the 18 it last saw left, B: half of its 19: 9 + 9.
    assert_eq!(during[0].1, 18, "local: each of 2 replicas takes half of what it last saw left");
    assert_eq!(during[1].1, 0, "deny admits nothing while Redis is stalled");
    assert_eq!(during[2].1, 40, "allow admits everything while Redis is stalled");
    assert_eq!(during[3].1, 0, "local: the share of what Redis last reported (nothing left) is nothing");
    assert!(during[4].1 <= 2, "replicated: used up before the stall, got {}", during[4].1);
    // The calls in flight when Redis stopped ran when it resumed, past their
    // deadline: they changed nothing.
    wait_back(&a, &b, 1);
    assert_eq!(counted(&redis, "half"), 32, "a timed-out decision was counted in Redis later");

    // Killed and back with nothing: the replicas restore what they knew.
    redis.restart_empty();
    assert_eq!(counted(&redis, "deny"), 0, "Redis is empty");
    wait_back(&a, &b, 2);
    let after_loss = [("deny", 20), ("local", 20), ("replicated", 20)].map(|(r, n)| (r, admitted(&a, &b, r, n)));
    for (resource, got) in after_loss {
        table.push(format!("empty     {resource:<11} {got:>3} admitted of 40"));
    }
    assert_eq!(after_loss[0].1, 0, "deny: a used-up strict window stays used up after Redis lost its data");
    assert_eq!(after_loss[1].1, 0, "local: likewise");
    assert!(after_loss[2].1 <= 2, "replicated: used up, restored; got {}", after_loss[2].1);
    assert!(a.logs().contains("Redis had lost") || b.logs().contains("Redis had lost"));
    assert_eq!(counted(&redis, "deny"), 50, "the used-up window was restored in Redis, not decided by the policy");

    // Shut down with its data and started again: nothing more is admitted.
    redis.shutdown_save();
    redis.restart();
    wait_back(&a, &b, 3);
    let after_restart = [("deny", 20), ("local", 20)].map(|(r, n)| (r, admitted(&a, &b, r, n)));
    for (resource, got) in after_restart {
        table.push(format!("restarted {resource:<11} {got:>3} admitted of 40"));
    }
    assert_eq!(after_restart.map(|(_, n)| n), [0, 0]);
    println!("{}", table.join("\n"));
}
