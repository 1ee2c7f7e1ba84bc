//! Cancellation is an input: a call cut off while the server waits for Redis
//! gives back what the guards handed it (a concurrency slot, a half-open
//! probe) at once, not at `permit_ttl`, and never keeps it for good.

use crate::support;

use std::time::Duration;

use floodgate_proto::v1 as pb;
use support::redis::RedisServer;
use support::*;

const RULES: &str = r#"
resources:
  - name: db
    concurrency: { max_in_flight: 1, permit_ttl: 60s }
    limits: [ { name: hourly, algorithm: fixed_window, limit: 1000, window: 1h, sync: strict } ]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_strict_call_cut_off_during_a_redis_stall_frees_its_slot_at_once() {
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RULES);
    // A long Redis timeout: the call waits on the stalled Redis until it is cut off.
    let fg = floodgate()
        .args([
            "--config",
            path_str(&rules),
            "--redis",
            &redis.url(),
            "--sync-interval",
            "100ms",
            "--redis-timeout",
            "2s",
        ])
        .start();
    wait_live(&fg, 1);
    let mut client = fg.client().await;
    let ask = || acquire("db", &[], 1);

    // The slot works: taken and returned.
    let first = client.acquire(ask()).await.unwrap().into_inner();
    assert_eq!(first.verdict(), pb::Verdict::Allowed);
    let report = pb::ReportOutcomeRequest {
        permit_id: first.permit_id.clone(),
        outcome: pb::Outcome::Success as i32,
        ..Default::default()
    };
    assert!(client.report_outcome(report).await.unwrap().into_inner().counted);

    // Redis stalls; a call takes the slot, waits on Redis, and is cut off.
    redis.signal("STOP");
    let cut = tokio::time::timeout(Duration::from_millis(300), client.acquire(ask())).await;
    assert!(cut.is_err(), "the call should still be waiting on Redis: {cut:?}");
    // At once, with Redis still stopped: a dry run (decided here, taking
    // nothing) finds the slot free.
    let started = std::time::Instant::now();
    loop {
        let dry = pb::AcquireRequest { dry_run: true, ..ask() };
        let r = client.acquire(dry).await.unwrap().into_inner();
        if r.verdict() == pb::Verdict::Allowed {
            break;
        }
        assert_eq!(r.verdict(), pb::Verdict::ConcurrencyLimited);
        assert!(started.elapsed() < Duration::from_secs(1), "the cut call still holds the slot");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    redis.signal("CONT");

    // Once Redis answers again the slot is free: the next call is admitted
    // (it would be CONCURRENCY_LIMITED until the server restarted if the cut
    // call had kept it; it holds no permit that could expire).
    wait_syncs(&fg, 2);
    let next = client.acquire(ask()).await.unwrap().into_inner();
    assert_eq!(next.verdict(), pb::Verdict::Allowed, "{next:?}");
    drop(redis);
}

const BREAKER: &str = r#"
resources:
  - name: brk
    limits:
      - { name: s, algorithm: fixed_window, limit: 100000, window: 1h, sync: strict }
    breaker:
      failure_rate_threshold: 0.5
      window: { kind: count, size: 10 }
      minimum_calls: 2
      wait_in_open: 1s
      half_open_calls: 2
      max_wait_in_half_open: 60s
"#;

type Client = pb::floodgate_client::FloodgateClient<tonic::transport::Channel>;

/// Opens the breaker (two failures), then waits until it is due for probes.
async fn opened(client: &mut Client) {
    for _ in 0..2 {
        let a = client.acquire(acquire("brk", &[], 1)).await.unwrap().into_inner();
        let failed = pb::ReportOutcomeRequest {
            permit_id: a.permit_id,
            outcome: pb::Outcome::Failure as i32,
            ..Default::default()
        };
        client.report_outcome(failed).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;
}

/// Probes until the breaker closes: each admitted call reports success.
async fn closes(client: &mut Client) -> bool {
    for _ in 0..6 {
        let a = client.acquire(acquire("brk", &[], 1)).await.unwrap().into_inner();
        if a.verdict() == pb::Verdict::Allowed && a.breaker_state() == pb::BreakerState::Closed {
            return true;
        }
        if !a.permit_id.is_empty() {
            let ok = pb::ReportOutcomeRequest {
                permit_id: a.permit_id,
                outcome: pb::Outcome::Success as i32,
                ..Default::default()
            };
            client.report_outcome(ok).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Probes the shared breaker counts as handed out and not reported.
fn probes_out(redis: &RedisServer) -> i64 {
    let out = redis.cli(&["HMGET", "fg:k:{brk}", "pi", "pr"]).unwrap_or_default();
    let n: Vec<i64> = out.lines().map(|l| l.trim().parse().unwrap_or(0)).collect();
    n.first().copied().unwrap_or(0) - n.get(1).copied().unwrap_or(0)
}

/// A half-open probe asked of Redis while it stalls is not lost: a call cut
/// off meanwhile gives its grant back (the ask runs on a task of its own,
/// and the IGNORED outcome is sent again until Redis takes it), and an ask
/// Redis only runs after the replica gave up on it changes nothing. Either
/// way no probe stays out and the round can complete. (Before, the probe
/// stayed out in Redis and the breaker waited out max_wait_in_half_open.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_not_lost_to_a_stall_or_a_cut() {
    for (redis_timeout, cut) in [("2s", true), ("50ms", false)] {
        let redis = RedisServer::start();
        let dir = TempDir::new();
        let rules = dir.write("rules.yaml", BREAKER);
        let fg = floodgate()
            .args(["--config", path_str(&rules), "--redis", &redis.url(), "--redis-timeout", redis_timeout])
            .start();
        wait_live(&fg, 1);
        let mut client = fg.client().await;
        opened(&mut client).await;
        // An operator looks at it meanwhile (Admin, on another connection).
        let shown = std::process::Command::new(BIN).args(["breakers", "--server", &fg.url()]).output().unwrap();
        assert!(String::from_utf8_lossy(&shown.stdout).contains("brk"));
        redis.signal("STOP");
        if cut {
            // A caller killed while it waits (its connection closes).
            let mut caller = std::process::Command::new(BIN)
                .args(["acquire", "--server", &fg.url(), "brk"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(caller.try_wait().unwrap().is_none(), "the call should still be waiting on Redis");
            caller.kill().unwrap();
            caller.wait().unwrap();
            tokio::time::sleep(Duration::from_millis(600)).await;
            redis.signal("CONT");
        } else {
            // Decided here once Redis does not answer; Redis runs the probe
            // script when it resumes, past its deadline.
            let call = client.acquire(acquire("brk", &[], 1)).await.unwrap().into_inner();
            tokio::time::sleep(Duration::from_millis(500)).await;
            redis.signal("CONT");
            if !call.permit_id.is_empty() {
                let ok = pb::ReportOutcomeRequest {
                    permit_id: call.permit_id,
                    outcome: pb::Outcome::Success as i32,
                    ..Default::default()
                };
                client.report_outcome(ok).await.unwrap();
            }
        }
        wait_syncs(&fg, 3);
        assert_eq!(probes_out(&redis), 0, "redis timeout {redis_timeout}, cut {cut}: a probe is still out in Redis");
        assert!(closes(&mut client).await, "redis timeout {redis_timeout}, cut {cut}: the probe round never completed");
    }
}
