//! Leases through the client crate against the real binary: calls decided
//! locally from a lease without a round trip, never more than the limit
//! holds, renewed in the background, returned when unused; limits the rules
//! do not mark are asked per call; a dead server means the lease runs out
//! and the fail mode applies; four holders at once stay within the limit.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::decision::Source;
use floodgate_client::{Acquire, Client, FailMode, Verdict};
use support::*;

const RULES: &str = r#"
resources:
  - name: hot
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 1000, window: 1h, lease: 1s }
  - name: exact
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 1000, window: 1h }
  - name: shared
    limits:
      - { name: all, algorithm: token_bucket, capacity: 200, refill_per_second: 100, lease: 500ms }
"#;

fn client(fg: &Floodgate, mode: FailMode) -> Client {
    Client::builder()
        .endpoint(fg.url())
        .request_timeout(Duration::from_millis(500))
        .fail_mode(mode)
        .leases(true)
        .build()
        .unwrap()
}

fn leases_granted(fg: &Floodgate) -> u64 {
    let page = fg.http_get("/metrics").1;
    page.lines().find_map(|l| l.strip_prefix(r#"floodgate_leases_total{result="granted"} "#)?.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_decided_from_a_lease_exactly_within_the_limit_and_unmarked_limits_are_asked() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg, FailMode::Closed);
    let hot = Acquire::new("hot").descriptor("user", "u1");
    let mut allowed = 0;
    for _ in 0..1100 {
        let d = c.acquire(&hot).await.unwrap();
        assert_eq!(d.source, Source::Lease);
        if d.verdict == Verdict::Allowed {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 1000, "never more than the limit, never less while units are left");
    let stats = c.stats();
    assert!(stats.rpcs <= 3, "a lease and a renewal or two, not a call per decision: {stats:?}");
    assert_eq!(stats.leased, 1100);

    // A limit without `lease:` is asked per call (after one refusal).
    let exact = Acquire::new("exact").descriptor("user", "u1");
    let before = c.stats().rpcs;
    for _ in 0..10 {
        let d = c.acquire(&exact).await.unwrap();
        assert_eq!((d.source, d.verdict), (Source::Server, Verdict::Allowed));
    }
    assert_eq!(c.stats().rpcs - before, 11, "one Lease refused, then ten Acquires");

    // Renewed in the background while used: calls keep coming from leases.
    let u2 = Acquire::new("hot").descriptor("user", "u2");
    let until = Instant::now() + Duration::from_millis(2500);
    let mut n = 0;
    while Instant::now() < until {
        assert_eq!(c.acquire(&u2).await.unwrap().source, Source::Lease);
        n += 1;
        if n >= 900 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(leases_granted(&fg) >= 3, "renewed: {} leases granted", leases_granted(&fg));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_server_gone_a_lease_runs_out_and_the_fail_mode_decides() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg, FailMode::Closed);
    let hot = Acquire::new("hot").descriptor("user", "u3");
    assert_eq!(c.acquire(&hot).await.unwrap().source, Source::Lease);
    let killed = Instant::now();
    signal(fg.pid(), "KILL");
    // Within the lease: still decided locally.
    let d = c.acquire(&hot).await.unwrap();
    assert_eq!((d.source, d.verdict), (Source::Lease, Verdict::Allowed));
    // Past its end (0.9 of its 1 s): the fail mode.
    let d = eventually("the lease runs out", Duration::from_secs(10), || async {
        let d = c.acquire(&hot).await.unwrap();
        (d.source != Source::Lease).then_some(d)
    })
    .await;
    assert!(killed.elapsed() >= Duration::from_millis(500), "not before the lease's end");
    assert_eq!((d.source, d.verdict), (Source::FailClosed, Verdict::Shed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_holders_at_once_stay_within_what_the_bucket_holds() {
    let fg = floodgate().rules(RULES).start();
    let allowed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let length = Duration::from_secs(2);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = client(&fg, FailMode::Closed);
        let allowed = allowed.clone();
        tasks.push(tokio::spawn(async move {
            let req = Acquire::new("shared");
            while started.elapsed() < length {
                if c.acquire(&req).await.unwrap().verdict == Verdict::Allowed {
                    allowed.fetch_add(1, Ordering::Relaxed);
                } else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let admitted = allowed.load(Ordering::Relaxed);
    // Units are taken before they are used: capacity + refill over the run.
    let bound = 200.0 + 100.0 * elapsed;
    assert!(admitted as f64 <= bound, "{admitted} admitted; the bucket held at most {bound:.0}");
    assert!(admitted >= 200, "the holders shared the bucket: {admitted}");
}

/// `lease_start: paced` on an hour's quota: a holder that calls without
/// pause is leased the hour's pace (one unit a second here) and then twice
/// what it used each second, not the whole hour at once; a second holder
/// that comes later still finds units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_lease_grows_with_use_and_leaves_the_hour_to_later_holders() {
    let rules = r#"
resources:
  - name: hourly
    limits:
      - { name: all, algorithm: fixed_window, limit: 600, window: 1h, lease: 1s, lease_start: paced }
"#;
    let fg = floodgate().rules(rules).start();
    let first = client(&fg, FailMode::Closed);
    let req = Acquire::new("hourly");
    let started = Instant::now();
    let mut allowed = 0u64;
    while started.elapsed() < Duration::from_millis(3500) {
        if first.acquire(&req).await.unwrap().verdict == Verdict::Allowed {
            allowed += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // 1 + 2 + 4 + 8 in four lease times at most (the first lease time may
    // begin a little before the loop).
    assert!((3..=15).contains(&allowed), "{allowed} admitted from paced leases in 3.5 s");
    assert!(first.stats().rpcs < 60, "told when to come back, not asking in a loop: {:?}", first.stats());
    let second = client(&fg, FailMode::Closed);
    let d = second.acquire(&req).await.unwrap();
    assert_eq!(d.verdict, Verdict::Allowed, "a later holder finds units: {d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_two_replicas_share_one_replicated_limit() {
    let rules = r#"
resources:
  - name: fleet
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 100, window: 1h, lease: 1s }
"#;
    let (_redis, _dir, args) = replicated(rules);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_live(&b, 2);
    let allowed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for fg in [&a, &b] {
        let c = client(fg, FailMode::Closed);
        let allowed = allowed.clone();
        tasks.push(tokio::spawn(async move {
            let req = Acquire::new("fleet").descriptor("user", "u1");
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(3) {
                if c.acquire(&req).await.unwrap().verdict == Verdict::Allowed {
                    allowed.fetch_add(1, Ordering::Relaxed);
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let admitted = allowed.load(Ordering::Relaxed);
    eprintln!("two replicas, a leasing client on each: {admitted} admitted of 100");
    assert!(admitted <= 100, "{admitted} admitted; the limit is 100 an hour");
    assert!(admitted >= 50, "each replica leased its share: {admitted} admitted");
}
