//! Chaos: two replicas under load while their Redis stalls (SIGSTOP), is
//! killed, comes back empty, and comes back with its data. For each outage
//! policy the totals admitted are checked against what the README promises:
//! `deny` admits nothing while Redis is gone, `allow` everything, `local` at
//! most this replica's share of what Redis last reported left; strict limits
//! stay exact when Redis returns empty (the replicas restore what they knew),
//! and no decision that timed out is counted in Redis later.

use crate::support;

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
    replica_of(&rules, url)
}

/// A replica of the rules file `rules` on the Redis at `url`, syncing every
/// 100 ms and waiting at most 50 ms on Redis.
fn replica_of(rules: &std::path::Path, url: &str) -> Floodgate {
    floodgate()
        .args(["--config", path_str(rules), "--redis", url, "--sync-interval", "100ms", "--redis-timeout", "50ms"])
        .start()
}

/// Two replicas of `rules`, each seeing the other live.
fn quota_replicas(rules: &std::path::Path, url: &str) -> (Floodgate, Floodgate) {
    let (a, b) = (replica_of(rules, url), replica_of(rules, url));
    wait_live(&a, 2);
    wait_live(&b, 2);
    (a, b)
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

/// Waits until both replicas have seen Redis come back `n` times (after an
/// outage, not their first connection).
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
        .filter(|k| !k.ends_with(":l") && !k.ends_with(":w"))
        .filter_map(|k| redis.cli(&["GET", k]))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

#[test]
fn outage_policies_hold_through_a_stall_a_loss_and_a_restart() {
    let _serial = one_at_a_time();
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
    // Back: what each replica admitted on its own was paid into Redis before
    // it decided again. The calls in flight when Redis stopped ran when it
    // resumed, past their deadline: they changed nothing (else 8 more).
    wait_back(&a, &b, 1);
    assert_eq!(counted(&redis, "half"), 32 + 18, "the outage's 18 are paid; the timed-out calls count nothing");
    assert_eq!(counted(&redis, "allow"), 50 + 40, "what allow admitted is usage too: paid");
    assert_eq!(counted(&redis, "deny"), 50);

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

const QUOTAS: &str = r#"
resources:
  - name: stalled
    limits: [ { name: quota, algorithm: token_bucket, capacity: 500, refill_per_second: 0.001, sync: strict } ]
  - name: emptied
    limits: [ { name: quota, algorithm: token_bucket, capacity: 500, refill_per_second: 0.001, sync: strict } ]
  - name: replicated
    limits: [ { name: quota, algorithm: token_bucket, capacity: 500, refill_per_second: 0.001 } ]
  - name: window
    limits: [ { name: quota, algorithm: fixed_window, limit: 500, window: 1d } ]
  - name: flap
    limits: [ { name: quota, algorithm: fixed_window, limit: 500, window: 1h, sync: strict } ]
"#;

/// Load on `resource` through both replicas, 40 calls a second each, for
/// `seconds`, while `fault` runs on this thread: what both admitted.
fn admitted_during(a: &Floodgate, b: &Floodgate, resource: &str, seconds: u32, fault: impl FnOnce()) -> u64 {
    admitted_at(a, b, resource, seconds, 40, fault)
}

/// The same at `rps` calls a second through each replica.
fn admitted_at(a: &Floodgate, b: &Floodgate, resource: &str, seconds: u32, rps: u32, fault: impl FnOnce()) -> u64 {
    let (z, rps) = (format!("{seconds}s"), rps.to_string());
    let args = ["--resource", resource, "-z", &z, "--rps", &rps, "-c", "4", "--timeout", "5s"];
    let reports = std::thread::scope(|s| {
        let ha = s.spawn(|| bench(&a.grpc, &args));
        let hb = s.spawn(|| bench(&b.grpc, &args));
        fault();
        [ha.join().unwrap(), hb.join().unwrap()]
    });
    for r in &reports {
        assert_eq!(r["errorDistribution"], serde_json::json!({}), "no call may fail: {r}");
    }
    reports.iter().map(|r| verdict(r, "ALLOWED")).sum()
}

/// Redis flapping: stalled 0.4 s, back 0.3 s, six times, under load through
/// both replicas (80 calls a second each). A replica sees each return within half a second, pays what
/// it admitted on its own, and the next outage starts from Redis's figure
/// less the others' presumed share; with retries 2 s apart it missed the
/// short returns and admitted 531-672 of 500.
#[test]
fn strict_through_a_flapping_redis_admits_at_most_the_limit() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", QUOTAS);
    let (a, b) = quota_replicas(&rules, &redis.url());
    let admitted = admitted_at(&a, &b, "flap", 8, 80, || {
        std::thread::sleep(Duration::from_secs(1));
        for _ in 0..6 {
            redis.signal("STOP");
            std::thread::sleep(Duration::from_millis(400));
            redis.signal("CONT");
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    println!("flapping: {admitted} admitted of 500");
    // One sync interval's calls of both replicas.
    let slack = 2 * (80 / 10);
    assert!(admitted <= 500 + slack, "{admitted} admitted of 500 through a flapping Redis");
    assert!(admitted >= 450, "{admitted} admitted of 500");
}

/// `strict` with the default `on_redis_error: local` admits at most what was
/// left when Redis went away, over the outage and after it: what a replica
/// admitted on its own is paid into Redis before it decides again, and a
/// Redis back empty is restored, then paid. (Before: 619 and 745-818
/// admitted of 500.)
#[test]
fn strict_admits_at_most_what_was_left_through_a_stall_and_an_empty_restart() {
    let _serial = one_at_a_time();
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", QUOTAS);
    let (a, b) = quota_replicas(&rules, &redis.url());

    // 40 calls a second through each replica for 12 s: Redis stalls for 3 s
    // after 4 s (about 320 of 500 admitted by then).
    let stalled = admitted_during(&a, &b, "stalled", 12, || {
        std::thread::sleep(Duration::from_secs(4));
        redis.signal("STOP");
        std::thread::sleep(Duration::from_secs(3));
        redis.signal("CONT");
    });
    println!("stalled: {stalled} admitted of 500");
    // The bound: what was left when each replica last heard from Redis
    // (which it reads every sync), shared: beyond 500, at most what the other
    // replica admitted in one sync interval (40/s x 100 ms), halved, each.
    let slack = 2 * (40 / 10) / 2;
    assert!(stalled <= 500 + slack, "{stalled} admitted of 500 through a stall");
    assert!(stalled >= 450, "{stalled} admitted of 500: the outage's shares went unused");

    // The same, Redis killed after 4 s and back empty 2 s later.
    let emptied = admitted_during(&a, &b, "emptied", 12, || {
        std::thread::sleep(Duration::from_secs(4));
        redis.kill();
        std::thread::sleep(Duration::from_secs(2));
        redis.restart_empty();
    });
    println!("emptied: {emptied} admitted of 500");
    assert!(emptied <= 500 + slack, "{emptied} admitted of 500 through an empty restart");
    assert!(a.logs().contains("Redis had lost") || b.logs().contains("Redis had lost"), "restored");

    // Replicated limits through the same: they decide from memory all along
    // and push what they took when Redis is back (restored first, if empty).
    // The bound: R x rate x sync interval, next to nothing for these quotas.
    for resource in ["replicated", "window"] {
        let admitted = admitted_during(&a, &b, resource, 12, || {
            std::thread::sleep(Duration::from_secs(4));
            redis.kill();
            std::thread::sleep(Duration::from_secs(2));
            redis.restart_empty();
        });
        println!("{resource}, emptied: {admitted} admitted of 500");
        assert!(admitted <= 500 + slack, "{resource}: {admitted} admitted of 500 through an empty restart");
    }
}

/// A replica stopped as a deploy stops it (SIGTERM) syncs a last time after
/// draining: what it took since its last sync is in Redis, not lost with it
/// (before: up to a sync interval of takes was admitted again after every
/// rolling restart).
#[test]
fn a_replica_stopped_with_sigterm_pushes_what_it_took_before_it_exits() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let rules = dir.write(
        "rules.yaml",
        "resources:\n  - name: deploy\n    limits: [ { name: hourly, algorithm: fixed_window, limit: 1000, window: 1h } ]\n",
    );
    // A sync every 10 s: none runs between the calls and the SIGTERM.
    let mut a =
        floodgate().args(["--config", path_str(&rules), "--redis", &redis.url(), "--sync-interval", "10s"]).start();
    wait_live(&a, 1);
    let report = bench(&a.grpc, &["--resource", "deploy", "-n", "40", "-c", "1"]);
    assert_eq!(verdict(&report, "ALLOWED"), 40);
    assert!(a.terminate().success());
    assert_eq!(counted(&redis, "deploy"), 40, "the 40 taken are in Redis after the replica exited");
    assert!(a.logs().contains("last sync done"), "{}", a.logs());
}

/// Redis lost twice, the second time while the replicas still recover from
/// the first: the second restore starts from what they had in common after
/// the first, not from before it. (Found by the fault checker: 482 of 400,
/// the second restore putting back a figure from before the first loss.)
#[test]
fn a_second_loss_during_recovery_restores_the_figure_after_the_first() {
    let _serial = one_at_a_time();
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", QUOTAS);
    let (a, b) = quota_replicas(&rules, &redis.url());
    let admitted = admitted_during(&a, &b, "window", 14, || {
        std::thread::sleep(Duration::from_secs(3));
        redis.kill();
        std::thread::sleep(Duration::from_millis(1500));
        redis.restart_empty();
        // Back, restored, recovering (2.5 s without new leases): lost again.
        std::thread::sleep(Duration::from_millis(1500));
        redis.kill();
        std::thread::sleep(Duration::from_millis(1500));
        redis.restart_empty();
    });
    println!("window, emptied twice: {admitted} admitted of 500");
    let slack = 3 * 2 * (40 / 10);
    assert!(admitted <= 500 + slack, "{admitted} admitted of 500 through two losses");
    assert!(admitted >= 450, "{admitted} admitted of 500");
}

/// Redis stalls, comes back empty, stalls again, and 1.15 s after it is
/// back one replica is killed (SIGKILL) while both take calls on replicated
/// windows and buckets, 100 a second each. What the killed replica admitted
/// since its last sync is lost: its lease goes back to the bucket whole when
/// it expires, Redis having no way to know what of it was used. So the
/// fleet may admit up to that much more than the limit: the killed replica's
/// rate times the sync interval (10 here; 2 to 9 seen with and without the
/// Redis faults before the kill). The bound asserted allows the sync to run
/// up to two intervals late on a busy machine.
#[test]
fn a_replica_killed_after_redis_faults_loses_at_most_one_sync_of_its_calls() {
    const KILLED: &str = r#"
resources:
  - name: window
    limits: [ { name: hourly, algorithm: fixed_window, limit: 1500, window: 1h } ]
  - name: bucket
    limits: [ { name: tokens, algorithm: token_bucket, capacity: 1500, refill_per_second: 0.001 } ]
"#;
    let _serial = one_at_a_time();
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", KILLED);
    let (a, b) = quota_replicas(&rules, &redis.url());
    let args = |r: &str| {
        [
            "--resource".to_string(),
            r.to_string(),
            "-z".into(),
            "14s".into(),
            "--rps".into(),
            "100".into(),
            "-c".into(),
            "4".into(),
            "--timeout".into(),
            "2s".into(),
        ]
    };
    let reports = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for r in ["window", "bucket"] {
            for fg in [&a, &b] {
                let args = args(r);
                let grpc = fg.grpc.clone();
                handles.push(s.spawn(move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    (r, try_bench(&grpc, &args))
                }));
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        redis.signal("STOP");
        std::thread::sleep(Duration::from_secs(2));
        redis.signal("CONT");
        redis.restart_empty();
        wait_back(&a, &b, 1);
        redis.signal("STOP");
        std::thread::sleep(Duration::from_secs(1));
        redis.signal("CONT");
        std::thread::sleep(Duration::from_millis(1150));
        signal(b.pid(), "KILL");
        handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    let log = a.logs().lines().filter(|l| l.contains("WARN") || l.contains("INFO")).collect::<Vec<_>>().join("\n");
    let reports: Vec<_> =
        reports.into_iter().map(|(r, rep)| (r, rep.unwrap_or_else(|e| panic!("{e}\na's log:\n{log}")))).collect();
    for r in ["window", "bucket"] {
        let n: u64 = reports.iter().filter(|(name, _)| *name == r).map(|(_, rep)| verdict(rep, "ALLOWED")).sum();
        println!("{r}: {n} admitted of 1500");
        // The killed replica took 100 calls a second and synced every 100 ms:
        // 10 calls lost, 20 if its last sync ran one interval late.
        assert!(n <= 1500 + 20, "{r}: {n} admitted of 1500 with one replica killed\na's log:\n{log}");
        assert!(n >= 1450, "{r}: only {n} admitted of 1500\na's log:\n{log}");
    }
}
