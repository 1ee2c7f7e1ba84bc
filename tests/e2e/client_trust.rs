//! The client crate under cancellation, outage and load, against the real
//! server: cancelled probes and calls, reports on a deadline, last-good values
//! kept per question, fallbacks that say why, the local fail mode, the layers'
//! ergonomics, and no round trip for a resource no rule matches.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::decision::Source;
use floodgate_client::guard::Cause;
use floodgate_client::{Acquire, Client, FailMode, Fallback, GuardError, Outcome, Served, Verdict};
use floodgate_proto::v1 as pb;
use support::*;

const RULES: &str = r#"
resources:
  - name: slots
    concurrency: { max_in_flight: 4, permit_ttl: 60s }
  - name: twenty
    concurrency: { max_in_flight: 20, permit_ttl: 60s }
  - name: fragile
    breaker: { window: { kind: count, size: 20 }, minimum_calls: 4, failure_rate_threshold: 0.5, wait_in_open: 60s }
  - name: items
    limits: [ { name: per-user, key: [user], algorithm: fixed_window, limit: 1, window: 1h } ]
  - name: metered
    limits: [ { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 20, window: 1m } ]
  - name: "GET /api/items/{id}"
    limits: [ { name: all, algorithm: fixed_window, limit: 2, window: 1h } ]
"#;

fn client(fg: &Floodgate) -> Client {
    Client::builder().endpoint(fg.url()).request_timeout(Duration::from_secs(2)).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_probe_does_not_cut_the_client_off() {
    let fg = floodgate().rules(RULES).start();
    let c =
        Client::builder().endpoint(fg.url()).request_timeout(Duration::from_millis(30)).watch(false).build().unwrap();
    let ask = Acquire::new("items").descriptor("user", "probe");
    assert_eq!(c.acquire(&ask).await.unwrap().source, Source::Server);
    signal(fg.pid(), "STOP");
    for _ in 0..3 {
        assert_eq!(c.acquire(&ask).await.unwrap().source, Source::FailOpen);
    }
    assert!(c.is_degraded(), "three timeouts in a row open the local breaker");
    // After the cool-down one call probes (it is sent: the client's count of
    // calls sent grows); an outer timeout cancels it. Until then each call is
    // answered without the server.
    eventually("a call that probes the stopped server", Duration::from_secs(10), || async {
        let sent = c.stats().rpcs;
        let _ = tokio::time::timeout(Duration::from_millis(5), c.acquire(&ask)).await;
        (c.stats().rpcs > sent).then_some(())
    })
    .await;
    signal(fg.pid(), "CONT");
    let reached = eventually("a call that reaches the server again", Duration::from_secs(10), || async {
        let d = c.acquire(&ask).await.unwrap();
        (d.source == Source::Server).then_some(d)
    })
    .await;
    assert_eq!(reached.source, Source::Server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_worker_never_sees_its_own_permits_in_flight() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);
    let mut limited = 0;
    let started = Instant::now();
    for i in 0..150u32 {
        let mut d = c.acquire(&Acquire::new("slots")).await.unwrap();
        if d.verdict == Verdict::ConcurrencyLimited {
            limited += 1;
            assert!(d.retry_after > Duration::ZERO, "CONCURRENCY_LIMITED says when to retry");
            continue;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        d.permit.take().expect("a permit").report(Outcome::Success);
        tokio::time::sleep_until((started + Duration::from_micros(6_667) * (i + 1)).into()).await;
    }
    assert_eq!(limited, 0, "at 150 calls/s, one at a time, against 4 slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_open_the_breaker_after_minimum_calls_not_after_a_batch() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);
    let mut went_through = 0;
    for _ in 0..30 {
        let mut d = c.acquire(&Acquire::new("fragile")).await.unwrap();
        if d.verdict == Verdict::CircuitOpen {
            break;
        }
        went_through += 1;
        d.permit.take().unwrap().report(Outcome::Failure);
        tokio::time::sleep(Duration::from_micros(6_667)).await;
    }
    assert!((4..=6).contains(&went_through), "{went_through} failing calls before the breaker opened (minimum 4)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_guarded_calls_free_their_slots_at_once_and_count_against_the_breaker() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);
    let slow = || async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok::<(), ()>(())
    };
    for _ in 0..20 {
        let call = c.guard(Acquire::new("twenty")).run(slow);
        assert!(tokio::time::timeout(Duration::from_millis(50), call).await.is_err(), "cut short");
    }
    eventually("20 free slots", Duration::from_secs(5), || async {
        let mut held = Vec::new();
        for _ in 0..20 {
            let d = c.acquire(&Acquire::new("twenty")).await.unwrap();
            if !d.is_allowed() {
                return None;
            }
            held.push(d);
        }
        Some(held)
    })
    .await;
    // A cancelled call on a resource with a breaker is a failure.
    for _ in 0..4 {
        let call = c.guard(Acquire::new("fragile")).run(slow);
        let _ = tokio::time::timeout(Duration::from_millis(50), call).await;
    }
    let mut admin = fg.admin().await;
    let failures = eventually("4 failures counted", Duration::from_secs(5), || {
        let mut admin = admin.clone();
        async move {
            let b = admin.get_breaker(pb::GetBreakerRequest { resource: "fragile".into() }).await.ok()?.into_inner();
            (b.failures == 4).then_some(b.failures)
        }
    })
    .await;
    assert_eq!(failures, 4);
    let _ = admin.list_breakers(pb::ListBreakersRequest {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_layer_frees_a_cancelled_calls_slot() {
    use floodgate_client::grpc::FloodgateGrpcLayer;
    use tower::{Layer, ServiceExt};
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);
    let slow = tower::service_fn(|_req: http::Request<()>| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok::<_, std::convert::Infallible>(http::Response::new(()))
    });
    let layer = FloodgateGrpcLayer::new(c.clone()).describe(|_| Some(Acquire::new("twenty")));
    for _ in 0..20 {
        let svc = layer.layer(slow);
        let call = svc.oneshot(http::Request::new(()));
        assert!(tokio::time::timeout(Duration::from_millis(50), call).await.is_err());
    }
    eventually("the slots back", Duration::from_secs(5), || async {
        let d = c.acquire(&Acquire::new("twenty")).await.unwrap();
        d.is_allowed().then_some(d)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_good_values_never_cross_users_and_fallbacks_say_why() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);
    let fallback = Fallback::<String, &str>::LastGood;
    let item = |user: &str| Acquire::new("items").descriptor("user", user);
    // u1's first call succeeds and is kept; u1's second is denied: served stale.
    let fresh = c.guard(item("u1")).run_or(&fallback, || async { Ok("u1's order".to_string()) }).await.unwrap();
    assert!(fresh.is_fresh());
    let stale = c.guard(item("u1")).run_or(&fallback, || async { Ok("unused".to_string()) }).await.unwrap();
    match stale {
        Served::Stale(v, Cause::Denied(d)) => {
            assert_eq!(v, "u1's order");
            assert_eq!(d.verdict, Verdict::RateLimited);
        }
        other => panic!("{other:?}"),
    }
    // u2 is denied too (its own first call used its quota elsewhere): never u1's value.
    c.acquire(&item("u2")).await.unwrap();
    let err = c.guard(item("u2")).run_or(&fallback, || async { Ok("x".to_string()) }).await.unwrap_err();
    assert!(matches!(err, GuardError::Denied(_)), "nothing of u2's to fall back on: {err:?}");
    // A closure sees the cause: the failure's error.
    let with = Fallback::with(|cause: &Cause<&str>| match cause {
        Cause::Failed(e) => format!("failed: {e}"),
        Cause::Denied(d) => format!("denied: {:?}", d.verdict),
        _ => "other".into(),
    });
    let served = c.guard(Acquire::new("unruled")).run_or(&with, || async { Err("boom") }).await.unwrap();
    assert_eq!(served.into_inner(), "failed: boom");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_fail_mode_holds_its_share_while_the_server_is_down() {
    let fg = floodgate().rules(RULES).start();
    let c = Client::builder()
        .endpoint(fg.url())
        .request_timeout(Duration::from_millis(30))
        .fail_mode(FailMode::local(0.5))
        .build()
        .unwrap();
    let ask = Acquire::new("metered").descriptor("tenant", "acme");
    for _ in 0..10 {
        assert_eq!(c.acquire(&ask).await.unwrap().source, Source::Server, "the limits are learnt");
    }
    signal(fg.pid(), "STOP");
    let mut admitted = 0;
    for _ in 0..200 {
        let d = c.acquire(&ask).await.unwrap();
        assert!(matches!(d.source, Source::Local), "{:?}", d.source);
        admitted += u32::from(d.is_allowed());
    }
    signal(fg.pid(), "CONT");
    // The server said 10 were left (20 a minute, 10 used): half of those,
    // not a full bucket of 10 (and perhaps one more refilled meanwhile).
    assert!((5..=6).contains(&admitted), "{admitted} admitted locally: half of the 10 left is 5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_without_a_rule_costs_no_round_trip() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);
    eventually("the rules from Watch", Duration::from_secs(5), || async {
        let d = c.acquire(&Acquire::new("no-such-resource")).await.unwrap();
        (d.source == Source::NoRule).then_some(())
    })
    .await;
    let rpcs = c.stats().rpcs;
    for _ in 0..100 {
        assert!(c.acquire(&Acquire::new("no-such-resource")).await.unwrap().is_allowed());
    }
    assert_eq!(c.stats().rpcs, rpcs, "no call reached the server");
    assert_eq!(c.acquire(&Acquire::new("slots")).await.unwrap().source, Source::Server, "ruled ones still ask");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_layer_uses_axum_routes_a_describe_closure_and_a_custom_denial() {
    use axum::{Router, routing::get};
    use floodgate_client::http::FloodgateLayer;
    use tower::ServiceExt;
    let fg = floodgate().rules(RULES).start();
    let failures = Arc::new(AtomicU64::new(0));
    let seen = failures.clone();
    let app = Router::new()
        .route("/api/items/{id}", get(|| async { "item" }))
        .route("/healthz", get(|| async { "ok" }))
        .layer(
            FloodgateLayer::new(client(&fg))
                .describe(|req| {
                    (req.uri.path() != "/healthz").then(|| Acquire::new(format!("{} {}", req.method, route_of(req))))
                })
                .classify(move |status| {
                    if status.is_server_error() {
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Success
                })
                .on_denied(|d| {
                    let mut r = http::Response::new(format!("slow down: {}", d.reason));
                    *r.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                    r
                }),
        );
    let get = |path: &str| http::Request::get(path).body(axum::body::Body::empty()).unwrap();
    for id in ["1", "2"] {
        assert_eq!(app.clone().oneshot(get(&format!("/api/items/{id}"))).await.unwrap().status(), 200);
    }
    let denied = app.clone().oneshot(get("/api/items/3")).await.unwrap();
    assert_eq!(denied.status(), 429, "the template route, shared by every item");
    assert!(denied.headers().contains_key("retry-after"));
    let body = axum::body::to_bytes(denied.into_body(), 1 << 16).await.unwrap();
    assert!(String::from_utf8_lossy(&body).starts_with("slow down: limit 'all'"));
    for _ in 0..5 {
        assert_eq!(app.clone().oneshot(get("/healthz")).await.unwrap().status(), 200, "health checks are not asked");
    }
    assert_eq!(failures.load(Ordering::Relaxed), 0);
}

/// The route axum matched, as the resource names it.
fn route_of(req: &http::request::Parts) -> String {
    req.extensions
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| req.uri.path().to_string(), |m| m.as_str().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_asks_once_and_answers_in_order() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);
    let reqs: Vec<Acquire> = (0..5).map(|i| Acquire::new("items").descriptor("user", format!("b{}", i % 2))).collect();
    let before = c.stats().rpcs;
    let verdicts: Vec<Verdict> = c.acquire_batch(&reqs).await.unwrap().into_iter().map(|d| d.verdict).collect();
    assert_eq!(
        verdicts,
        [Verdict::Allowed, Verdict::Allowed, Verdict::RateLimited, Verdict::RateLimited, Verdict::RateLimited]
    );
    assert_eq!(c.stats().rpcs - before, 1, "one round trip");
    let again = Acquire::new("items").descriptor("user", "b0");
    let until = c.acquire_until(&again, Instant::now() + Duration::from_millis(50)).await.unwrap();
    assert_eq!(until.verdict, Verdict::RateLimited, "an hour away: the deadline comes first");
}
