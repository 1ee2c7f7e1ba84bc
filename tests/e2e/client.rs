//! The client crate against the real server binary: the HTTP layer's answers
//! and headers, the guard and the open-breaker cache, fail open and fail
//! closed, reports under load, and the gRPC layer.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::decision::Source;
use floodgate_client::http::FloodgateLayer;
use floodgate_client::{Acquire, Client, FailMode, GuardError, Verdict};
use floodgate_proto::v1 as pb;
use support::*;

const RULES: &str = r#"
resources:
  - name: "GET /api/orders/:id"
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 3, window: 1h }
  - name: flaky
    breaker: { window: { kind: count, size: 10 }, minimum_calls: 4, failure_rate_threshold: 0.5, wait_in_open: 60s, half_open_calls: 1 }
  - name: counted
    breaker: { window: { kind: count, size: 10000 }, minimum_calls: 10000, failure_rate_threshold: 1.0 }
  - name: "/grpc.health.v1.Health/Check"
    limits: [ { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 2, window: 1h } ]
systems:
  - { name: shop, resources: ["GET /shop/*"] }
"#;

fn client(fg: &Floodgate) -> Client {
    Client::builder().endpoint(fg.url()).request_timeout(Duration::from_millis(500)).build().unwrap()
}

/// A GET with headers: (status, headers, body).
fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>, String) {
    let answer = web::get(web::url(&addr.to_string(), path)).header("host", "test").headers(headers).send();
    (answer.status, answer.headers.clone(), answer.text())
}

fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_axum_app_answers_429_with_the_rate_limit_fields() {
    use axum::{Router, routing::get as route};
    let fg = floodgate().rules(RULES).start();
    let app = Router::new().route("/api/orders/{id}", route(|| async { "an order" })).layer(
        FloodgateLayer::new(client(&fg)).routes(["/api/orders/:id"]).descriptor_header("x-user-id", "user").unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    for remaining in ["2", "1", "0"] {
        let (status, hs, body) =
            tokio::task::spawn_blocking(move || get(addr, "/api/orders/17", &[("x-user-id", "u1")])).await.unwrap();
        assert_eq!((status, body.as_str()), (200, "an order"));
        assert_eq!(header(&hs, "ratelimit-policy"), Some(r#""per-user";q=3;w=3600"#));
        assert_eq!(
            header(&hs, "ratelimit").map(|v| v.starts_with(&format!("\"per-user\";r={remaining};t="))),
            Some(true),
            "{hs:?}"
        );
        assert_eq!(header(&hs, "x-ratelimit-limit"), Some("3"));
        assert_eq!(header(&hs, "x-ratelimit-remaining"), Some(remaining));
        assert!(header(&hs, "retry-after").is_none());
    }
    let (status, hs, body) =
        tokio::task::spawn_blocking(move || get(addr, "/api/orders/99", &[("x-user-id", "u1")])).await.unwrap();
    assert_eq!(status, 429);
    // The window is aligned to the hour: reset and retry both come at its end.
    let reset: u64 = header(&hs, "x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&reset), "reset in {reset} s");
    let retry: u64 = header(&hs, "retry-after").unwrap().parse().unwrap();
    assert!(retry.abs_diff(reset) <= 1, "retry after {retry} s, reset in {reset} s");
    assert_eq!(header(&hs, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&hs, "ratelimit"), Some(format!("\"per-user\";r=0;t={reset}").as_str()));
    assert_eq!(header(&hs, "content-type"), Some("application/json"));
    assert!(
        body.starts_with(r#"{"error":"rate_limited","reason":"limit 'per-user' (fixed_window 3 per 1h) exceeded"#),
        "{body}"
    );
    // Another user still has the full quota.
    let (status, hs, _) =
        tokio::task::spawn_blocking(move || get(addr, "/api/orders/1", &[("x-user-id", "u2")])).await.unwrap();
    assert_eq!((status, header(&hs, "x-ratelimit-remaining")), (200, Some("2")));
}

fn acquire_rpcs(fg: &Floodgate) -> u64 {
    let rpcs = fg.metrics().value("floodgate_rpc_requests_total", &[("method", "Floodgate/Acquire"), ("code", "OK")]);
    rpcs.map_or(0, |n| n as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_stops_calls_to_the_downstream_and_costs_no_round_trip() {
    let fg = floodgate().rules(RULES).start();
    let client = client(&fg);
    let calls = Arc::new(AtomicU64::new(0));
    let downstream = || {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>("downstream is down")
        }
    };
    for _ in 0..4 {
        let r = client.guard(Acquire::new("flaky")).run(downstream).await;
        assert!(matches!(r, Err(GuardError::Failed(_))));
    }
    client.flush().await;
    // The breaker opened; soon the Watch feed has the client deny locally.
    eventually("a denial from the client's cache", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let d = client.acquire(&Acquire::new("flaky")).await.unwrap();
            assert_eq!(d.verdict, Verdict::CircuitOpen);
            (d.source == Source::OpenBreakerCache).then_some(())
        }
    })
    .await;
    let (before_calls, before_rpcs, before_cached) =
        (calls.load(Ordering::SeqCst), acquire_rpcs(&fg), client.stats().cached_denials);
    assert_eq!(before_calls, 4);
    for _ in 0..50 {
        match client.guard(Acquire::new("flaky")).run(downstream).await {
            Err(GuardError::Denied(d)) => assert!(d.retry_after > Duration::from_secs(50), "{:?}", d.retry_after),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), before_calls, "the downstream got no call while the circuit was open");
    assert_eq!(acquire_rpcs(&fg), before_rpcs, "and Floodgate got no Acquire");
    assert_eq!(client.stats().cached_denials, before_cached + 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_and_fail_closed_within_the_deadline_and_recovery_when_the_server_returns() {
    let port = support::redis::free_port(false);
    let listen = format!("127.0.0.1:{port}");
    let start = || floodgate().listen(&listen).rules(RULES).start();
    let mut fg = start();
    let deadline = Duration::from_millis(50);
    let build = |mode| Client::builder().endpoint(fg.url()).request_timeout(deadline).fail_mode(mode).build().unwrap();
    let (open, closed) = (build(FailMode::Open), build(FailMode::Closed));
    let ask = Acquire::new("GET /api/orders/:id").descriptor("user", "u9");
    assert_eq!(open.acquire(&ask).await.unwrap().source, Source::Server);
    assert_eq!(closed.acquire(&ask).await.unwrap().source, Source::Server);

    signal(fg.pid(), "KILL");
    while fg.is_running() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..20 {
        let t = Instant::now();
        let d = open.acquire(&ask).await.unwrap();
        assert!(t.elapsed() < deadline + Duration::from_millis(200), "{:?}", t.elapsed());
        assert_eq!((d.verdict, d.source), (Verdict::Allowed, Source::FailOpen));
        let t = Instant::now();
        let d = closed.acquire(&ask).await.unwrap();
        assert!(t.elapsed() < deadline + Duration::from_millis(200), "{:?}", t.elapsed());
        assert_eq!((d.verdict, d.source), (Verdict::Shed, Source::FailClosed));
    }
    assert!(open.is_degraded() && closed.is_degraded(), "a dead server costs no waiting: the local breaker is open");

    let _fg = start();
    for c in [&open, &closed] {
        eventually("the client to recover", Duration::from_secs(20), || {
            let (c, ask) = (c.clone(), ask.clone());
            async move { (c.acquire(&ask).await.unwrap().source == Source::Server).then_some(()) }
        })
        .await;
    }
    assert!(!open.is_degraded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_delivered_under_concurrent_load() {
    let fg = floodgate().rules(RULES).start();
    let client = client(&fg);
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..50u64 {
                let fail = (t * 50 + i) % 5 == 0;
                let r = client
                    .guard(Acquire::new("counted"))
                    .run(|| async move { if fail { Err("no") } else { Ok(()) } })
                    .await;
                assert_eq!(r.is_err(), fail);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    client.flush().await;
    let mut admin = fg.admin().await;
    let b = admin.get_breaker(pb::GetBreakerRequest { resource: "counted".into() }).await.unwrap().into_inner();
    assert_eq!((b.calls, b.failures), (400, 80));
    let s = client.stats();
    assert_eq!((s.reports_counted, s.reports_uncounted, s.reports_dropped), (400, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_layer_answers_resource_exhausted() {
    use floodgate_client::grpc::FloodgateGrpcLayer;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let fg = floodgate().rules(RULES).start();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = FloodgateGrpcLayer::new(client(&fg)).descriptor_metadata("x-tenant", "tenant").unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap()
    });
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    let check = || {
        let mut r = tonic::Request::new(HealthCheckRequest { service: String::new() });
        r.metadata_mut().insert("x-tenant", "acme".parse().unwrap());
        r
    };
    assert!(health.check(check()).await.is_ok());
    assert!(health.check(check()).await.is_ok());
    let err = health.check(check()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.message().contains("limit 'per-tenant'"), "{}", err.message());
    assert!(err.metadata().get("grpc-retry-pushback-ms").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_reads_each_request_priority_and_a_shedding_system_drops_the_least_important() {
    use axum::{Router, routing::get as route};
    let fg = floodgate().rules(RULES).start();
    let set = pb::SetDegradationLevelRequest { system: "shop".into(), level: 2, ..Default::default() };
    fg.admin().await.set_degradation_level(set).await.unwrap();
    let by_header = FloodgateLayer::new(client(&fg)).priority_header("x-priority").unwrap();
    let by_route = FloodgateLayer::new(client(&fg)).priority(|req| {
        if req.uri.path().ends_with("/prefetch") {
            floodgate_client::Priority::Sheddable
        } else {
            floodgate_client::Priority::Critical
        }
    });
    let serve = |layer: FloodgateLayer| async move {
        let app = Router::new().route("/shop/{page}", route(|| async { "a page" })).layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    };
    let (header_app, route_app) = (serve(by_header).await, serve(by_route).await);
    let status = |addr, path: &'static str, headers: &'static [(&'static str, &'static str)]| {
        tokio::task::spawn_blocking(move || get(addr, path, headers).0)
    };
    assert_eq!(
        status(header_app, "/shop/cart", &[("x-priority", "sheddable_plus")]).await.unwrap(),
        503,
        "level 2 sheds it"
    );
    assert_eq!(status(header_app, "/shop/cart", &[("x-priority", "critical")]).await.unwrap(), 200);
    assert_eq!(status(header_app, "/shop/cart", &[]).await.unwrap(), 200, "no header: CRITICAL");
    assert_eq!(
        status(header_app, "/shop/cart", &[("x-priority", "whatever")]).await.unwrap(),
        200,
        "unknown: CRITICAL"
    );
    assert_eq!(status(route_app, "/shop/prefetch", &[]).await.unwrap(), 503);
    assert_eq!(status(route_app, "/shop/checkout", &[]).await.unwrap(), 200);
}
