//! Cancellation is an input: a call cut off while the server waits for Redis
//! gives back what the guards handed it (a concurrency slot, a half-open
//! probe) at once, not at `permit_ttl`, and never keeps it for good.

mod support;

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
    let fg = Floodgate::start(&[
        "--config",
        path_str(&rules),
        "--redis",
        &redis.url(),
        "--sync-interval",
        "100ms",
        "--redis-timeout",
        "2s",
    ]);
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
