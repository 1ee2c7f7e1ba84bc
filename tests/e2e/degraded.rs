//! The client crate's degraded modes keep to the limits, against the real
//! binary: leases with `FailMode::local` once the server is gone, a
//! concurrency denial that erases nothing learned, the local concurrency
//! limit, last-good values kept per question, and an Acquire cut short by a
//! timeout that gives its slot back at once.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::decision::Source;
use floodgate_client::{Acquire, Client, FailMode, Fallback, GuardError, Served, Verdict};
use support::*;

const RULES: &str = r#"
resources:
  - name: shared
    limits:
      - { name: all, algorithm: token_bucket, capacity: 100, refill_per_second: 100, lease: 1s }
  - name: guarded
    limits: [ { name: per-user, key: [user], algorithm: fixed_window, limit: 10, window: 1h } ]
    concurrency: { max_in_flight: 1, permit_ttl: 60s }
  - name: pool
    concurrency: { max_in_flight: 5, permit_ttl: 30s }
  - name: items
    limits: [ { name: per-user, key: [user], algorithm: fixed_window, limit: 1, window: 1h } ]
  - name: other-items
    limits: [ { name: per-user, key: [user], algorithm: fixed_window, limit: 1, window: 1h } ]
  - name: metered
    limits: [ { name: tokens, key: [user], algorithm: token_bucket, capacity: 100000, refill_per_second: 0.001 } ]
"#;

fn local(fg: &Floodgate, share: f64, leases: bool) -> Client {
    Client::builder()
        .endpoint(fg.url())
        .request_timeout(Duration::from_millis(50))
        .fail_mode(FailMode::local(share))
        .leases(leases)
        .watch(false)
        .build()
        .unwrap()
}

/// Calls `shared` as fast as it is allowed (a millisecond's pause after a
/// denial) until `until`: (allowed, allowed decided locally).
async fn hammer(c: Client, until: Instant) -> (u64, u64) {
    let (mut allowed, mut local) = (0, 0);
    while Instant::now() < until {
        let d = c.acquire(&Acquire::new("shared")).await.unwrap();
        if d.is_allowed() {
            allowed += 1;
            local += u64::from(d.source == Source::Local);
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    (allowed, local)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_with_the_local_fail_mode_keep_to_the_limits_once_the_server_is_gone() {
    let fg = floodgate().rules(RULES).start();
    let (a, b) = (local(&fg, 0.5, true), local(&fg, 0.5, true));
    // Both lease for a while: the leases carry the limit and what is left.
    let warm = Instant::now() + Duration::from_millis(1500);
    let (wa, wb) = tokio::join!(hammer(a.clone(), warm), hammer(b.clone(), warm));
    assert!(wa.0 > 0 && wb.0 > 0, "both leased: {wa:?} {wb:?}");
    assert!(a.stats().leased > 0 && b.stats().leased > 0);
    signal(fg.pid(), "STOP");
    let stopped = Instant::now();
    let until = stopped + Duration::from_secs(3);
    let (ra, rb) = tokio::join!(hammer(a.clone(), until), hammer(b.clone(), until));
    signal(fg.pid(), "CONT");
    let seconds = stopped.elapsed().as_secs_f64();
    let total = ra.0 + rb.0;
    // What the leases in hand held (at most the bucket, 100), then each at
    // half: at most half of what was left (50) and half the refill.
    let bound = 100.0 + 2.0 * (50.0 + 50.0 * seconds);
    eprintln!(
        "server stopped {seconds:.1}s: admitted {ra:?} + {rb:?} (allowed, of them local) = {total}, bound {bound:.0}"
    );
    assert!((total as f64) <= bound, "{total} admitted while the server was gone; the limit allows {bound:.0}");
    assert!(ra.1 > 0 && rb.1 > 0, "decided locally once the leases ran out: {ra:?} {rb:?}");
    assert!(a.stats().decided_locally > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_returned_unused_erases_none_of_the_limits_learned() {
    let fg = floodgate().rules(RULES).start();
    let c = local(&fg, 1.0, true);
    assert!(c.acquire(&Acquire::new("shared")).await.unwrap().is_allowed());
    // The lease is renewed once (it was used), then returned unused: the
    // answer to a return lists no limit, and must not erase the one learned.
    eventually("the lease renewed, then returned", Duration::from_secs(10), || async {
        (c.stats().rpcs >= 3).then_some(())
    })
    .await;
    signal(fg.pid(), "STOP");
    let stopped = Instant::now();
    let (allowed, local) = hammer(c.clone(), stopped + Duration::from_millis(500)).await;
    signal(fg.pid(), "CONT");
    let bound = 100.0 + 100.0 * stopped.elapsed().as_secs_f64();
    assert!(local > 0, "decided locally: {allowed} allowed, {local} of them locally");
    assert!((allowed as f64) <= bound, "{allowed} admitted without the server; the limit allows {bound:.0}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_denial_erases_none_of_the_limits_learned() {
    let fg = floodgate().rules(RULES).start();
    let c = local(&fg, 1.0, false);
    let ask = Acquire::new("guarded").descriptor("user", "ann");
    let held = c.acquire(&ask).await.unwrap();
    assert!(held.is_allowed());
    let denied = c.acquire(&ask).await.unwrap();
    assert_eq!((denied.verdict, denied.source), (Verdict::ConcurrencyLimited, Source::Server));
    assert_eq!(denied.max_in_flight, 1, "the answer names the concurrency limit");
    drop(held);
    c.flush().await;
    signal(fg.pid(), "STOP");
    let mut admitted = 0;
    for _ in 0..15 {
        let d = c.acquire(&ask).await.unwrap();
        assert_eq!(d.source, Source::Local);
        admitted += u32::from(d.is_allowed());
    }
    signal(fg.pid(), "CONT");
    assert_eq!(admitted, 9, "10 an hour, 1 used: the denial in between erased nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_fail_mode_keeps_to_the_concurrency_limit() {
    let fg = floodgate().rules(RULES).start();
    let c = local(&fg, 1.0, false);
    let ask = Acquire::new("pool");
    let d = c.acquire(&ask).await.unwrap();
    assert_eq!((d.source, d.max_in_flight), (Source::Server, 5));
    drop(d);
    c.flush().await;
    signal(fg.pid(), "STOP");
    let mut held = held_at_once(&c, &ask, 20).await;
    let allowed = held.iter().filter(|d| d.is_allowed()).count();
    let limited = held.iter().filter(|d| d.verdict == Verdict::ConcurrencyLimited).count();
    assert_eq!((allowed, limited), (5, 15), "max_in_flight 5, all held at once");
    // Calls that end give their slots back.
    held.clear();
    let again = held_at_once(&c, &ask, 5).await;
    signal(fg.pid(), "CONT");
    assert!(again.iter().all(|d| d.is_allowed()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_good_key_adds_to_the_question_and_never_serves_another_users_value() {
    let fg = floodgate().rules(RULES).start();
    let c = Client::builder().endpoint(fg.url()).watch(false).build().unwrap();
    let fallback = Fallback::<String, &str>::LastGood;
    let ask = |resource: &str, user: &str| Acquire::new(resource).descriptor("user", user);
    let alice = c
        .guard(ask("items", "alice"))
        .last_good_key("item-7")
        .run_or(&fallback, || async { Ok("alice's item 7".to_string()) })
        .await
        .unwrap();
    assert!(alice.is_fresh());
    // Served stale to alice, for the same item...
    let again = c.guard(ask("items", "alice")).last_good_key("item-7").run_or(&fallback, || async { Ok("x".into()) });
    assert!(matches!(again.await.unwrap(), Served::Stale(ref v, _) if v == "alice's item 7"));
    // ... never to bob, nor to carol on another resource, for the same item.
    for (resource, user) in [("items", "bob"), ("other-items", "carol")] {
        c.acquire(&ask(resource, user)).await.unwrap();
        let r = c.guard(ask(resource, user)).last_good_key("item-7").run_or(&fallback, || async { Ok("x".into()) });
        let err = r.await.unwrap_err();
        assert!(matches!(err, GuardError::Denied(_)), "{user} has no last good value of its own: {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cut_short_by_a_timeout_gives_its_slot_back_at_once() {
    let fg = floodgate().rules(RULES).start();
    let c = Client::builder().endpoint(fg.url()).request_timeout(Duration::from_secs(2)).watch(false).build().unwrap();
    let ask = Acquire::new("pool");
    // 400 guarded calls, each under a timeout of 0 to 2 ms: many are cut
    // short during the Acquire round trip, after the server admitted them.
    let mut seed = 0x9e37_79b9_u64;
    let cut = Arc::new(AtomicU64::new(0));
    for _ in 0..400 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let timeout = Duration::from_micros((seed >> 33) % 2000);
        let run = c.guard(ask.clone()).run(|| async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok::<_, ()>(())
        });
        if tokio::time::timeout(timeout, run).await.is_err() {
            cut.fetch_add(1, Ordering::Relaxed);
        }
    }
    assert!(cut.load(Ordering::Relaxed) > 100, "most calls were cut short: {}", cut.load(Ordering::Relaxed));
    // Every slot comes back within moments, not at permit_ttl (30 s).
    let started = Instant::now();
    eventually("all five slots free again", Duration::from_secs(5), || async {
        let held = held_at_once(&c, &ask, 5).await;
        held.iter().all(|d| d.is_allowed()).then_some(())
    })
    .await;
    eprintln!("400 calls, {} cut short: all 5 slots free {:?} after", cut.load(Ordering::Relaxed), started.elapsed());
}

/// `n` decisions held at once.
async fn held_at_once(c: &Client, ask: &Acquire, n: usize) -> Vec<floodgate_client::Decision> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(c.acquire(ask).await.unwrap());
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_estimate_cut_short_before_its_answer_goes_back_whole() {
    let fg = floodgate().rules(RULES).start();
    let c = Client::builder().endpoint(fg.url()).request_timeout(Duration::from_secs(2)).watch(false).build().unwrap();
    let ask = Acquire::new("metered").descriptor("user", "est").cost(100).settle();
    let (mut seed, mut kept) = (0x2545_f491_u64, 0u64);
    for _ in 0..200 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let timeout = Duration::from_micros((seed >> 33) % 2000);
        // An answer the caller read: its permit settles at the whole estimate.
        if let Ok(d) = tokio::time::timeout(timeout, c.acquire(&ask)).await {
            let d = d.unwrap();
            assert!(d.is_allowed());
            d.permit.expect("a settle permit").report_cost(floodgate_client::Outcome::Success, 100);
            kept += 1;
        }
    }
    assert!(kept < 200, "some were cut short");
    c.flush().await;
    let left = eventually("every cut-short estimate given back", Duration::from_secs(5), || async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.flush().await;
        let peek = floodgate_proto::v1::PeekRequest {
            resource: "metered".into(),
            descriptors: [("user".to_string(), "est".to_string())].into(),
            ..Default::default()
        };
        let left = fg.admin().await.peek(peek).await.unwrap().into_inner().limits[0].remaining;
        (left == 100_000 - 100 * kept).then_some(left)
    })
    .await;
    eprintln!("200 estimates of 100, {kept} read and settled: {left} left");
}
