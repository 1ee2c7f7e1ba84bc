//! The Envoy configuration served over xDS (`--envoy-xds`), as Envoy Gateway
//! serves it to a rate limit service, through the real binary: a control
//! plane written here (tonic, ADS, `RateLimitConfig` resources) pushes a
//! configuration and the decisions follow; a bad one is NACKed with its
//! errors while the last good one keeps deciding; the control plane goes
//! away and comes back, and the server reconnects, saying what it holds.
//!
//! Envoy Gateway's own binary is not in any registry this suite may install
//! from (PyPI, npm, Debian, crates.io), so the control plane is ours.

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor as Asked, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use floodgate_proto::v1 as pb;
use support::xds::ControlPlane;
use support::*;

/// `domain` with one key-only descriptor `key` limited to `n` a minute.
fn config(domain: &str, key: &str, n: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// One resource, named after its domain.
fn one(c: RateLimitConfig) -> Vec<(String, RateLimitConfig)> {
    vec![(c.domain.clone(), c)]
}

/// Whether each of `n` calls of `domain` with `key=value` was OVER_LIMIT.
async fn overs(fg: &Floodgate, domain: &str, key: &str, value: &str, n: usize) -> Vec<bool> {
    let mut rls = RateLimitServiceClient::new(fg.channel().await);
    let mut out = Vec::new();
    for _ in 0..n {
        let entry = Entry { key: key.into(), value: value.into() };
        let request = RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![Asked { entries: vec![entry], ..Default::default() }],
            hits_addend: 1,
        };
        let answer = rls.should_rate_limit(request).await.expect("an answer").into_inner();
        out.push(answer.overall_code == Code::OverLimit as i32);
    }
    out
}

/// The error of one call of `domain`, which must fail.
async fn refused(fg: &Floodgate, domain: &str) -> tonic::Status {
    let mut rls = RateLimitServiceClient::new(fg.channel().await);
    let entry = Entry { key: "user".into(), value: "u".into() };
    let request = RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![Asked { entries: vec![entry], ..Default::default() }],
        hits_addend: 1,
    };
    rls.should_rate_limit(request).await.expect_err("an error")
}

/// A server taking its Envoy configuration from `cp`, retrying fast.
fn server(cp: &ControlPlane) -> FloodgateBuilder {
    floodgate().args([
        "--envoy-xds",
        &cp.url(),
        "--envoy-xds-backoff-initial",
        "200ms",
        "--envoy-xds-backoff-max",
        "1s",
    ])
}

async fn envoy_version(fg: &Floodgate) -> Option<String> {
    let rules = fg.admin().await.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    rules.envoy.map(|e| e.version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_config_decides_a_bad_one_is_nacked_and_a_lost_control_plane_is_found_again() {
    let cp = ControlPlane::start().await;
    let fg = server(&cp).start();
    // Nothing pushed yet: not ready, and a call is UNAVAILABLE (Envoy's
    // failure mode decides it), not OK as if there were no limit.
    let (code, body) = fg.http_get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("waiting for the first Envoy configuration from http://"), "{body}");
    let waiting = refused(&fg, "edge").await;
    assert_eq!(waiting.code(), tonic::Code::Unavailable, "{waiting:?}");
    assert!(waiting.message().contains(&format!("waiting for the first one from {}", cp.url())), "{waiting:?}");

    cp.push("v1", one(config("edge", "user", 2)));
    cp.answer_where("ACK of v1", |a| a.version == "v1" && a.error.is_none()).await;
    let u = fresh("u");
    assert_eq!(overs(&fg, "edge", "user", &u, 3).await, [false, false, true], "2 a minute");
    assert_eq!(fg.http_get("/readyz").0, 200);
    assert_eq!(envoy_version(&fg).await.as_deref(), Some("v1"));
    let metrics = fg.http_get("/metrics").1;
    assert!(metrics.contains("floodgate_envoy_xds_connected 1"), "{metrics}");
    assert!(metrics.contains(&format!("floodgate_envoy_config_info{{source=\"{}\",version=\"v1\"}} 1", cp.url())));
    assert!(metrics.contains("ratelimit_service_config_load_success 1"), "upstream's stat");

    // A descriptor without a key, and a unit this message does not have: NACKed, v1 keeps deciding.
    let mut bad = config("edge", "user", 100);
    bad.descriptors.push(RateLimitDescriptor { key: String::new(), ..Default::default() });
    bad.descriptors[0].rate_limit.as_mut().unwrap().unit = 42;
    cp.push("v2", one(bad));
    let nack = cp.answer_where("NACK of v2", |a| a.error.is_some()).await;
    let error = nack.error.unwrap();
    assert_eq!(nack.version, "v1", "a NACK names the version still in force");
    assert!(error.contains("edge: domain 'edge': descriptors[1].key: is required and must not be empty"), "{error}");
    assert!(error.contains("descriptors.user.rate_limit.unit: 'unit number 42' is not second"), "{error}");
    let u = fresh("u");
    assert_eq!(overs(&fg, "edge", "user", &u, 3).await, [false, false, true], "still v1");
    assert_eq!(envoy_version(&fg).await.as_deref(), Some("v1"));
    assert!(fg.http_get("/metrics").1.contains("floodgate_envoy_xds_updates_total{result=\"rejected\"} 1"));
    // The same errors again: NACKed again, logged once.
    let mut again = config("edge", "user", 100);
    again.descriptors.push(RateLimitDescriptor { key: String::new(), ..Default::default() });
    again.descriptors[0].rate_limit.as_mut().unwrap().unit = 42;
    cp.push("v2b", one(again));
    cp.answer_where("NACK of v2b", |a| a.error.is_some() && a.nonce == "3").await;
    let logged = fg.logs().matches("Envoy configuration from xDS refused; keeping the one in force").count();
    assert_eq!(logged, 1, "{}", fg.logs());

    cp.push("v3", one(config("edge", "user", 3)));
    cp.answer_where("ACK of v3", |a| a.version == "v3").await;
    let u = fresh("u");
    assert_eq!(overs(&fg, "edge", "user", &u, 4).await, [false, false, false, true], "3 a minute");
    let metrics = fg.http_get("/metrics").1;
    let info: Vec<&str> = metrics.lines().filter(|l| l.starts_with("floodgate_envoy_config_info{")).collect();
    assert_eq!(
        info,
        [format!("floodgate_envoy_config_info{{source=\"{}\",version=\"v3\"}} 1", cp.url())],
        "one series, v3's"
    );

    // The control plane goes away: the last good configuration keeps deciding.
    let addr = cp.go_away().await;
    eventually("the stream to be seen down", Duration::from_secs(10), || async {
        fg.http_get("/metrics").1.contains("floodgate_envoy_xds_connected 0").then_some(())
    })
    .await;
    let u = fresh("u");
    assert_eq!(overs(&fg, "edge", "user", &u, 4).await, [false, false, false, true], "v3 while it is away");
    assert_eq!(fg.http_get("/readyz").0, 200, "a server with a configuration stays ready");

    // It comes back on the same address with v4: the server reconnects, saying it holds v3.
    let back = support::xds::Snapshot { version: "v4".into(), resources: one(config("edge", "user", 1)) };
    let cp = ControlPlane::start_on(addr, Some(back)).await;
    cp.answer_where("ACK of v4", |a| a.version == "v4").await;
    assert_eq!(cp.hellos()[0].1, "v3", "the first request after reconnecting names what it holds");
    assert_eq!(cp.hellos()[0].0, "default", "the node id");
    let u = fresh("u");
    assert_eq!(overs(&fg, "edge", "user", &u, 2).await, [false, true], "1 a minute");
    assert_eq!(envoy_version(&fg).await.as_deref(), Some("v4"));
    assert!(fg.logs().contains("xDS stream ended"), "the loss is logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delta_protocol_adds_replaces_and_removes_resources_by_name() {
    let cp = ControlPlane::start().await;
    let fg = server(&cp).args(["--envoy-xds-delta", "--envoy-xds-node-id", "rls-7"]).start();
    cp.push("1", vec![("edge".into(), config("edge", "user", 1)), ("api".into(), config("api", "key", 2))]);
    cp.answer_where("ACK of the first update", |a| a.error.is_none()).await;
    assert_eq!(cp.hellos()[0].0, "rls-7");
    let (u, k) = (fresh("u"), fresh("k"));
    assert_eq!(overs(&fg, "edge", "user", &u, 2).await, [false, true]);
    assert_eq!(overs(&fg, "api", "key", &k, 3).await, [false, false, true]);

    // Only `api` changes: `edge` keeps what it had (its counter too).
    let acked = cp.answers().len();
    cp.push("2", vec![("edge".into(), config("edge", "user", 1)), ("api".into(), config("api", "key", 5))]);
    cp.answer_where("ACK of the second update", |a| a.error.is_none() && a.nonce == "2").await;
    assert!(cp.answers().len() > acked);
    assert_eq!(overs(&fg, "edge", "user", &u, 1).await, [true], "edge's counter was kept");
    let k2 = fresh("k");
    assert_eq!(overs(&fg, "api", "key", &k2, 6).await, [false, false, false, false, false, true]);

    // Removing `edge`: its domain has no limit any more.
    cp.push("3", vec![("api".into(), config("api", "key", 5))]);
    cp.answer_where("ACK of the removal", |a| a.error.is_none() && a.nonce == "3").await;
    assert_eq!(overs(&fg, "edge", "user", &fresh("u"), 3).await, [false; 3]);

    // Two resources of one domain: refused whole (no --envoy-merge-domains), the set held stays.
    cp.push("4", vec![("api".into(), config("api", "key", 5)), ("api-2".into(), config("api", "other", 1))]);
    let nack = cp.answer_where("NACK of the duplicate domain", |a| a.error.is_some()).await;
    assert!(nack.error.unwrap().contains("api-2: domain 'api': is also defined in api"));
    let k3 = fresh("k");
    assert_eq!(overs(&fg, "api", "key", &k3, 6).await.iter().filter(|o| **o).count(), 1, "still 5 a minute");
    let rules = fg.admin().await.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    let envoy = rules.envoy.expect("an Envoy configuration in force");
    assert_eq!((envoy.version.as_str(), envoy.domains), ("3", vec!["api".to_string()]));
    assert!(envoy.source.starts_with("http://127.0.0.1:"), "{}", envoy.source);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_that_cannot_work_are_refused_before_anything_starts() {
    for (args, want) in [
        (vec!["--envoy-xds", "127.0.0.1:1"], "must start with http:// or https://"),
        (vec!["--envoy-xds", "http://127.0.0.1:1", "--envoy-config", "/tmp"], "cannot be used with"),
        (vec!["--envoy-xds", "http://127.0.0.1:1", "--envoy-xds-ca", "/nonexistent/ca.pem"], "--envoy-xds-ca: reading"),
        (vec!["--envoy-xds", "http://127.0.0.1:1", "--envoy-xds-ca", "/dev/zero"], "--envoy-xds-ca"),
        (vec!["--envoy-xds-delta"], "--envoy-xds"),
        (vec!["--envoy-near-limit-ratio", "1.5"], "must be from 0 to 1"),
        (vec!["--envoy-limit-header", "x-l"], "--envoy-response-headers"),
        (vec!["--envoy-response-headers", "ratelimit", "--envoy-limit-header", "bad header"], "is not a header name"),
    ] {
        let out = floodgate().args(&args).run_to_exit(Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mtls_the_control_plane_and_the_server_check_each_other() {
    let pki = support::pki::Pki::new("xds");
    let server = pki.server("control-plane", "control-plane");
    let client = pki.client("rls", "rls");
    let cp = ControlPlane::start_tls(&server, Some(&pki.ca_pem())).await;
    cp.push("tls-1", one(config("edge", "user", 1)));
    let url = format!("https://localhost:{}", cp.addr.port());
    let ca = pki.ca_path();
    let base = ["--envoy-xds", url.as_str(), "--envoy-xds-ca", path_str(&ca), "--envoy-xds-backoff-initial", "200ms"];
    let fg = floodgate()
        .args(
            [&base[..], &["--envoy-xds-cert", path_str(&client.cert), "--envoy-xds-key", path_str(&client.key)]]
                .concat(),
        )
        .start();
    cp.answer_where("ACK over mTLS", |a| a.version == "tls-1").await;
    assert_eq!(overs(&fg, "edge", "user", &fresh("u"), 2).await, [false, true]);

    // Without a client certificate the control plane refuses it: nothing is installed, never ready.
    let cp = ControlPlane::start_tls(&server, Some(&pki.ca_pem())).await;
    cp.push("tls-2", one(config("edge", "user", 1)));
    let url = format!("https://localhost:{}", cp.addr.port());
    let fg = floodgate()
        .args(["--envoy-xds", url.as_str(), "--envoy-xds-ca", path_str(&ca), "--envoy-xds-backoff-initial", "200ms"])
        .start();
    eventually("a refused handshake in the log", Duration::from_secs(15), || async {
        fg.logs().contains("xDS stream ended").then_some(())
    })
    .await;
    assert!(cp.answers().is_empty(), "{:?}", cp.answers());
    assert_eq!(fg.http_get("/readyz").0, 503);
    // A server whose certificate the CA did not sign is not trusted either.
    let other = support::pki::Pki::new("other");
    let cp = ControlPlane::start_tls(&other.server("impostor", "impostor"), None).await;
    cp.push("tls-3", one(config("edge", "user", 1)));
    let url = format!("https://localhost:{}", cp.addr.port());
    let fg = floodgate()
        .args(["--envoy-xds", url.as_str(), "--envoy-xds-ca", path_str(&ca), "--envoy-xds-backoff-initial", "200ms"])
        .start();
    eventually("an untrusted certificate in the log", Duration::from_secs(15), || async {
        fg.logs().contains("xDS stream ended").then_some(())
    })
    .await;
    assert!(cp.answers().is_empty(), "{:?}", cp.answers());
    assert!(fg.logs().contains("invalid peer certificate: UnknownIssuer"), "{}", fg.logs());
    assert_eq!(refused(&fg, "edge").await.code(), tonic::Code::Unavailable, "nothing installed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_control_plane_is_asked_again_and_ready_without_config_answers_meanwhile() {
    let cp = ControlPlane::start().await;
    let fg =
        server(&cp).args(["--envoy-xds-initial-fetch-timeout", "300ms", "--envoy-xds-ready-without-config"]).start();
    // Ready at once, and calls answered (no limit yet) rather than refused.
    assert_eq!(fg.http_get("/readyz").0, 200);
    assert_eq!(overs(&fg, "edge", "user", &fresh("u"), 3).await, [false; 3]);
    // The control plane opens streams and sends nothing: each is given up
    // after 300 ms and opened again, after the backoff.
    eventually("three streams opened", Duration::from_secs(15), || async { (cp.hellos().len() >= 3).then_some(()) })
        .await;
    assert!(fg.logs().contains("no response within 300ms of opening the stream"), "{}", fg.logs());
    // Once it speaks, the configuration is taken.
    cp.push("v1", one(config("edge", "user", 1)));
    cp.answer_where("ACK of v1", |a| a.version == "v1").await;
    assert_eq!(overs(&fg, "edge", "user", &fresh("u"), 2).await, [false, true]);

    // A black hole: connections accepted, never a byte back (no HTTP/2
    // handshake, no response headers). Each attempt is given up too.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", hole.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in hole.incoming().take(20) {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(s);
        }
    });
    let args = [
        "--envoy-xds",
        &url,
        "--envoy-xds-initial-fetch-timeout",
        "300ms",
        "--envoy-xds-backoff-initial",
        "200ms",
        "--envoy-xds-backoff-max",
        "1s",
    ];
    let fg = floodgate().args(args).start();
    eventually("three connections to the black hole", Duration::from_secs(15), || async {
        (accepted.load(std::sync::atomic::Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    assert!(fg.logs().contains("within 300ms"), "{}", fg.logs());
    assert!(!fg.logs().contains("connected to the xDS control plane"), "never connected: {}", fg.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_delta_updates_is_validated_once_and_a_bad_one_is_nacked_alone() {
    let cp = ControlPlane::start().await;
    let fg = server(&cp).args(["--envoy-xds-delta"]).start();
    cp.push("base", vec![("edge".into(), config("edge", "user", 1))]);
    cp.answer_where("ACK of the base", |a| a.error.is_none()).await;
    let installs = || fg.logs().matches("Envoy configuration from xDS installed").count();
    let before = installs();
    // 200 responses at once, each adding a domain.
    let burst: Vec<_> = (0..200)
        .map(|i| {
            ControlPlane::delta(&format!("b{i}"), vec![(format!("d{i}"), Some(config(&format!("d{i}"), "user", 2)))])
        })
        .collect();
    cp.burst(burst);
    cp.answer_where("ACK of the last", |a| a.nonce == "b199").await;
    let answers: Vec<_> = cp.answers().into_iter().filter(|a| a.nonce.starts_with('b')).collect();
    assert_eq!(answers.len(), 200, "one answer per response");
    assert!(answers.iter().all(|a| a.error.is_none()), "{answers:?}");
    let envoy = fg.admin().await.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner().envoy.unwrap();
    assert_eq!(envoy.domains.len(), 201);
    let validated = installs() - before;
    assert!(validated < 150, "{validated} installs for 200 responses: bursts are read as one");
    assert_eq!(overs(&fg, "d150", "user", &fresh("u"), 3).await, [false, false, true]);

    // A burst with a bad response in the middle (a second resource for
    // domain `edge`) and a heartbeat of `edge` (no content: it stays): the
    // bad one is NACKed alone, the others take effect.
    let mut burst: Vec<_> = (0..20)
        .map(|i| {
            ControlPlane::delta(&format!("c{i}"), vec![(format!("e{i}"), Some(config(&format!("e{i}"), "user", 2)))])
        })
        .collect();
    burst[10] = ControlPlane::delta("c10", vec![("dup".into(), Some(config("edge", "user", 9)))]);
    burst[15] = ControlPlane::delta("c15", vec![("edge".into(), None)]);
    cp.burst(burst);
    cp.answer_where("an answer to the last", |a| a.nonce == "c19").await;
    let answers: Vec<_> = cp.answers().into_iter().filter(|a| a.nonce.starts_with('c')).collect();
    let nacked: Vec<&str> = answers.iter().filter(|a| a.error.is_some()).map(|a| a.nonce.as_str()).collect();
    assert_eq!((answers.len(), nacked), (20, vec!["c10"]), "{answers:?}");
    assert_eq!(overs(&fg, "edge", "user", &fresh("u"), 2).await, [false, true], "edge as it was: 1 a minute");
    assert_eq!(overs(&fg, "e19", "user", &fresh("u"), 3).await, [false, false, true]);
    // A heartbeat of a resource not held is NACKed.
    cp.burst(vec![ControlPlane::delta("h1", vec![("never".into(), None)])]);
    let nack = cp.answer_where("the NACK of an unknown heartbeat", |a| a.nonce == "h1").await;
    assert!(nack.error.unwrap().contains("resource 'never': no content, and none is held by that name"));
    // Undecodable resources, over and over: each NACKed, logged once.
    let undecodable = |nonce: &str| {
        let mut r = ControlPlane::delta(nonce, vec![("junk".into(), Some(config("junk", "user", 1)))]);
        r.resources[0].resource.as_mut().unwrap().value = vec![0xff, 0xff, 0xff];
        r
    };
    for round in 0..3 {
        cp.burst((0..5).map(|i| undecodable(&format!("u{round}-{i}"))).collect());
        cp.answer_where("the NACK of the round", |a| a.nonce == format!("u{round}-4")).await;
    }
    let nacks = cp.answers().iter().filter(|a| a.nonce.starts_with('u') && a.error.is_some()).count();
    assert_eq!(nacks, 15);
    let logged = fg.logs().matches("resource 'junk': cannot be decoded").count();
    assert_eq!(logged, 1, "{}", fg.logs());
}
