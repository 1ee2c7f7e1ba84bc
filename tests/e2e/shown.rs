//! What Floodgate shows is what it decides: Peek and dry runs through a
//! replica that shares its limits give the figures a real call would be
//! decided by, not the replica's own copy. A strict limit's figure is
//! Redis's; a replicated bucket this replica does not hold is pulled first.

// Each test runs on its own thread and runtime; the lock held across awaits
// only makes them take turns.
#![allow(clippy::await_holding_lock)]

use crate::support;

use std::collections::HashMap;

use floodgate_proto::v1 as pb;
use support::redis::RedisServer;
use support::*;

const RULES: &str = r#"
resources:
  - name: strict-window
    limits: [ { name: hour, algorithm: fixed_window, limit: 1000, window: 1h, sync: strict } ]
  - name: strict-bucket
    limits: [ { name: tokens, algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001, sync: strict } ]
  - name: replicated-window
    limits: [ { name: hour, algorithm: fixed_window, limit: 400, window: 1h } ]
  - name: replicated-log
    limits: [ { name: hour, algorithm: sliding_window_log, limit: 400, window: 1h } ]
"#;

fn replica(dir: &TempDir, url: &str) -> Floodgate {
    let file = dir.path("rules.yaml");
    if !file.exists() {
        dir.write("rules.yaml", RULES);
    }
    floodgate().args(["--config", path_str(&file), "--redis", url, "--sync-interval", "100ms"]).start()
}

async fn peek(fg: &Floodgate, resource: &str) -> u64 {
    let mut admin = fg.admin().await;
    let req = pb::PeekRequest { resource: resource.into(), descriptors: HashMap::new(), limit: String::new() };
    let answer = admin.peek(req).await.unwrap().into_inner();
    answer.limits[0].remaining
}

/// The console's figure of a global limit: (remaining, from Redis).
fn console_figure(fg: &Floodgate, resource: &str) -> (serde_json::Value, bool) {
    let state: serde_json::Value = serde_json::from_str(&fg.http_get("/api/v1/console").1).unwrap();
    let resources = state["resources"].as_array().unwrap();
    let r = resources.iter().find(|r| r["rule"] == resource).unwrap_or_else(|| panic!("{resource} in {state}"));
    let global = &r["limits"][0]["global"];
    (global["remaining"].clone(), global["from_redis"].as_bool().unwrap())
}

async fn decide(fg: &Floodgate, resource: &str, cost: u32, dry_run: bool) -> (pb::Verdict, u64) {
    let mut client = fg.client().await;
    let req = pb::AcquireRequest { dry_run, ..acquire(resource, &[], cost) };
    let answer = client.acquire(req).await.unwrap().into_inner();
    (answer.verdict(), answer.limits[0].remaining)
}

/// Replica A uses 600 of a strict 1000 and the whole of a replicated 400;
/// replica B, which never used them, must show 400 and 0 left, and decide
/// its dry runs the way a real call would be decided.
#[tokio::test]
async fn peek_and_dry_runs_through_another_replica_show_what_a_call_would_find() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let (a, b) = (replica(&dir, &redis.url()), replica(&dir, &redis.url()));
    wait_live(&a, 2);
    wait_live(&b, 2);
    for strict in ["strict-window", "strict-bucket"] {
        assert_eq!(decide(&a, strict, 600, false).await.0, pb::Verdict::Allowed, "{strict}");
        // The console asks Redis nothing: it shows what Redis said at the
        // replica's last call, and nothing where it never asked.
        assert_eq!(console_figure(&a, strict), (serde_json::json!(400), true), "{strict}");
        assert_eq!(console_figure(&b, strict), (serde_json::Value::Null, true), "{strict}");
        assert_eq!(peek(&b, strict).await, 400, "{strict}: Peek through the other replica shows Redis's figure");
        assert_eq!(console_figure(&b, strict), (serde_json::json!(400), true), "{strict}: as Peek found it");
        assert_eq!(peek(&a, strict).await, 400, "{strict}: and so does the replica that took them");
        // Dry runs: decided by Redis, nothing taken.
        assert_eq!(decide(&b, strict, 401, true).await.0, pb::Verdict::RateLimited, "{strict}: 401 of 400");
        assert_eq!(decide(&b, strict, 400, true).await, (pb::Verdict::Allowed, 0), "{strict}: 400 of 400");
        assert_eq!(peek(&b, strict).await, 400, "{strict}: a dry run takes nothing");
        // The real call agrees with the dry runs.
        assert_eq!(decide(&b, strict, 401, false).await.0, pb::Verdict::RateLimited, "{strict}");
        assert_eq!(decide(&b, strict, 400, false).await.0, pb::Verdict::Allowed, "{strict}");
        assert_eq!(peek(&a, strict).await, 0, "{strict}: used up, seen from either replica");
    }
    for replicated in ["replicated-window", "replicated-log"] {
        assert_eq!(decide(&a, replicated, 400, false).await.0, pb::Verdict::Allowed, "{replicated}");
    }
    // Let A push what it took.
    wait_syncs(&a, 3);
    for replicated in ["replicated-window", "replicated-log"] {
        assert_eq!(decide(&b, replicated, 1, true).await.0, pb::Verdict::RateLimited, "{replicated}: a dry run");
        assert_eq!(peek(&b, replicated).await, 0, "{replicated}: Peek through the replica that holds no bucket");
        assert_eq!(decide(&b, replicated, 1, false).await.0, pb::Verdict::RateLimited, "{replicated}: a real call");
    }
}

/// While Redis does not answer, a dry run on a strict limit decides as the
/// outage policy would, and owes Redis nothing: when Redis is back, the
/// limit still has everything a real call did not take.
#[tokio::test]
async fn a_dry_run_during_an_outage_owes_nothing() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let a = replica(&dir, &redis.url());
    wait_live(&a, 1);
    assert_eq!(decide(&a, "strict-window", 100, false).await.0, pb::Verdict::Allowed);
    redis.signal("STOP");
    // Peek shows what Redis said last; a dry run decides from the bucket a
    // real call would make from it (this replica alone: all of the 900).
    assert_eq!(peek(&a, "strict-window").await, 900, "Redis's last figure while it is away");
    assert_eq!(decide(&a, "strict-window", 901, true).await.0, pb::Verdict::RateLimited, "901 of 900");
    for _ in 0..5 {
        // The rules say nothing of on_redis_error: `local`, from this
        // replica's share of what Redis last said.
        let (verdict, _) = decide(&a, "strict-window", 100, true).await;
        assert_eq!(verdict, pb::Verdict::Allowed);
    }
    redis.signal("CONT");
    wait_redis_up(&a);
    wait_syncs(&a, 3);
    assert_eq!(peek(&a, "strict-window").await, 900, "five dry runs of 100 during the outage took nothing");
}
