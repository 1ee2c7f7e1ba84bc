//! The attacks of the security review, against the real binary on loopback:
//! each now fails, and normal traffic keeps its latency while it runs.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use floodgate::bench::wire::{Raw, RawCodec};
use floodgate_proto::v1 as pb;
use http::uri::PathAndQuery;
use support::*;
use tonic::Code;

const RULES: &str = r#"
resources:
  - name: demo
    limits: [ { name: per-user, key: [user], algorithm: token_bucket, capacity: 1000000, refill_per_second: 1000 } ]
  - name: db
    concurrency: { max_in_flight: 100, permit_ttl: 30s }
  - name: "svc.*"
    max_breakers: 50
    breaker: { window: { kind: count, size: 10 }, minimum_calls: 5, wait_in_open: 30s }
"#;

/// Sends raw bytes as the request of `path`; the status code.
async fn raw_call(fg: &Floodgate, path: &'static str, body: Vec<u8>) -> Code {
    let mut grpc = tonic::client::Grpc::new(fg.channel().await);
    grpc.ready().await.unwrap();
    let r = grpc
        .unary(tonic::Request::new(Bytes::from(body)), PathAndQuery::from_static(path), RawCodec::<Raw>::default())
        .await;
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// A bench run alongside an attack: (p99 latency in ms, errors).
fn traffic_p99(grpc: &str, seconds: u32) -> (f64, serde_json::Value) {
    let r =
        bench(grpc, &["--resource", "demo", "--keys", "100", "-z", &format!("{seconds}s"), "--rps", "500", "-c", "8"]);
    let p99 = r["latencyDistribution"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["percentage"].as_f64() == Some(99.0))
        .unwrap()["latency"]
        .as_f64()
        .unwrap()
        / 1e6;
    (p99, r["errorDistribution"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_upload_cannot_freeze_the_server() {
    let fg = floodgate().rules(RULES).args(["--threads", "2"]).start();
    // The same traffic alone first: on a machine busy with other work the
    // bound is relative to what it does there without the attack.
    let grpc = fg.grpc.clone();
    let (quiet, _) = tokio::task::spawn_blocking(move || traffic_p99(&grpc, 2)).await.unwrap();
    let attack = {
        let url = fg.url();
        tokio::spawn(async move {
            let channel = tonic::transport::Channel::from_shared(url).unwrap().connect().await.unwrap();
            let mut admin = pb::admin_client::AdminClient::new(channel);
            let deep = "[".repeat(200_000);
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut refused = 0;
            while Instant::now() < deadline {
                let err = admin
                    .apply_rules(pb::ApplyRulesRequest {
                        yaml: deep.clone(),
                        validate_only: true,
                        ..Default::default()
                    })
                    .await
                    .unwrap_err();
                assert_eq!(err.code(), Code::InvalidArgument);
                assert!(err.message().contains("nesting deeper than 100 levels"), "{}", err.message());
                refused += 1;
            }
            refused
        })
    };
    let grpc = fg.grpc.clone();
    let (p99, errors) = tokio::task::spawn_blocking(move || traffic_p99(&grpc, 3)).await.unwrap();
    let refused = attack.await.unwrap();
    println!(
        "ApplyRules of 200,000 '[' refused {refused} times in 3 s; Acquire p99 meanwhile {p99:.2} ms ({quiet:.2} ms without)"
    );
    assert_eq!(errors, serde_json::json!({}), "no Acquire failed during the attack");
    let bound = (10.0 * quiet).max(1000.0);
    assert!(
        p99 < bound,
        "Acquire p99 {p99:.1} ms while rules uploads were refused ({quiet:.1} ms without): the server froze"
    );
    assert!(refused > 10, "only {refused} uploads answered in 3 s");

    let mut admin = fg.admin().await;
    let huge = "#".repeat(4 << 20);
    let err = admin
        .apply_rules(pb::ApplyRulesRequest { yaml: huge, validate_only: true, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let mut data = fg.client().await;
    let fat = pb::AcquireRequest {
        resource: "demo".into(),
        descriptors: [("user".into(), "u".repeat(100_000))].into(),
        ..Default::default()
    };
    let err = data.acquire(fat).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "a 100 KB Acquire is over its 64 KiB cap: {err:?}");
    // A batch over its 4 MiB cap, and one over every cap (tonic's own
    // limit sits above them): RESOURCE_EXHAUSTED both, as documented.
    for mib in [5, 17] {
        let item = pb::AcquireRequest {
            resource: "demo".into(),
            descriptors: [("user".into(), "u".repeat(200))].into(),
            ..Default::default()
        };
        let requests = vec![item; mib * 1024 * 1024 / 210];
        let err = data.acquire_batch(pb::AcquireBatchRequest { requests }).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "a {mib} MiB AcquireBatch: {err:?}");
    }
}

#[tokio::test]
async fn undecodable_messages_and_control_characters_are_invalid_arguments() {
    let fg = floodgate().rules(RULES).start();
    let acquire_path = "/floodgate.v1.Floodgate/Acquire";
    // Field 1 (resource), length 2, bytes that are not UTF-8.
    assert_eq!(raw_call(&fg, acquire_path, vec![0x0a, 0x02, 0xff, 0xfe]).await, Code::InvalidArgument);
    // Field 1 as a varint: the wrong wire type for a string.
    assert_eq!(raw_call(&fg, acquire_path, vec![0x08, 0x01]).await, Code::InvalidArgument);
    // Truncated: a length of 10 with 2 bytes behind it.
    assert_eq!(raw_call(&fg, acquire_path, vec![0x0a, 0x0a, b'a', b'b']).await, Code::InvalidArgument);

    let mut data = fg.client().await;
    let err = data.acquire(acquire("demo\u{1b}[31m", &[], 1)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "resource: control character U+001B is not allowed");
    assert!(!fg.http_get("/metrics").1.contains('\u{1b}'), "no escape sequence reaches a label");
}

#[tokio::test]
async fn permits_cannot_be_guessed_and_errors_do_not_name_their_owner() {
    let fg = floodgate().rules(RULES).start();
    let mut data = fg.client().await;
    let mut permits = Vec::new();
    for _ in 0..2 {
        permits.push(data.acquire(acquire("db", &[], 1)).await.unwrap().into_inner().permit_id);
    }
    for p in &permits {
        assert!(p.len() == 32 && p.bytes().all(|b| b.is_ascii_hexdigit()), "{p}");
    }
    // The next id by counting up from one seen is not a permit.
    let guessed = format!("{:032x}", u128::from_str_radix(&permits[1], 16).unwrap().wrapping_add(1));
    let report = |id: &str, resource: &str| pb::ReportOutcomeRequest {
        usage: Default::default(),
        resource: resource.into(),
        permit_id: id.into(),
        outcome: pb::Outcome::Failure as i32,
        latency: None,
        actual_cost: None,
    };
    assert!(!data.report_outcome(report(&guessed, "")).await.unwrap().into_inner().counted);
    let err = data.report_outcome(report(&permits[0], "other")).await.unwrap_err();
    assert!(!err.message().contains("db"), "the error names the owner: {}", err.message());
    assert!(
        data.report_outcome(report(&permits[0], "db")).await.unwrap().into_inner().counted,
        "the owner's own report counts"
    );
}

/// The value of one series of /metrics (0 when absent).
fn gauge(fg: &Floodgate, series: &str) -> f64 {
    fg.metrics().series(series).unwrap_or(0.0)
}

#[tokio::test]
async fn long_keys_are_bounded_by_their_bytes_not_only_their_number() {
    let fg = floodgate().rules(RULES).args(["--max-key-bytes", "64KiB"]).start();
    let mut c = fg.client().await;
    // 2,000 users with 200-byte names: 400 KB of keys, six times the bound.
    let mut batch = Vec::new();
    for i in 0..2000 {
        let user = format!("{i:0>200}");
        batch.push(acquire("demo", &[("user", user.as_str())], 1));
        if batch.len() == 500 {
            let items = std::mem::take(&mut batch);
            c.acquire_batch(pb::AcquireBatchRequest { requests: items }).await.unwrap();
        }
    }
    let (bytes, keys) = (gauge(&fg, "floodgate_key_bytes"), gauge(&fg, "floodgate_keys"));
    assert!(bytes > 0.0 && bytes <= 65536.0, "{bytes} bytes of keys held for a bound of 64 KiB");
    assert!(keys >= 200.0, "{keys} keys: the bound is on bytes, so about 300 of these fit");
    assert!(gauge(&fg, "floodgate_evictions_total") >= 1000.0, "the least recently used went");
    assert_eq!(gauge(&fg, "floodgate_max_key_bytes"), 65536.0);
}

#[tokio::test]
async fn cancelled_watch_streams_end_at_once_and_their_number_is_capped() {
    let fg = floodgate().rules(RULES).args(["--max-watchers", "20"]).start();
    let channel = fg.channel().await;
    for _ in 0..300 {
        let mut c = pb::floodgate_client::FloodgateClient::new(channel.clone());
        let mut stream = c.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
        stream.message().await.unwrap().expect("the snapshot");
        drop(stream);
    }
    eventually("every cancelled Watch stream to end", Duration::from_secs(10), || async {
        (gauge(&fg, "floodgate_watch_streams") == 0.0).then_some(())
    })
    .await;
    let mut open = Vec::new();
    for _ in 0..20 {
        let mut c = pb::floodgate_client::FloodgateClient::new(channel.clone());
        open.push(c.watch(pb::WatchRequest::default()).await.unwrap().into_inner());
    }
    let mut c = pb::floodgate_client::FloodgateClient::new(channel.clone());
    let err = c.watch(pb::WatchRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    drop(open);
}

#[tokio::test]
async fn breakers_of_a_glob_rule_are_capped_and_labelled_by_rule() {
    let fg = floodgate().rules(RULES).start();
    let mut data = fg.client().await;
    for i in 0..500 {
        data.acquire(acquire(&format!("svc.{i}"), &[], 1)).await.unwrap();
    }
    let mut admin = fg.admin().await;
    let listed = admin.list_breakers(pb::ListBreakersRequest {}).await.unwrap().into_inner().breakers.len();
    assert!(listed <= 50, "{listed} breakers under svc.* whose rule caps them at 50");
    let metrics = fg.http_get("/metrics").1;
    assert!(!metrics.contains("svc.4"), "no series per resource under a glob rule");
    assert!(metrics.contains("floodgate_breakers{rule=\"svc.*\",state=\"CLOSED\"}"), "{metrics}");
}

#[test]
fn connections_are_capped_and_silent_ones_closed() {
    let fg = floodgate()
        .rules(RULES)
        .args(["--max-connections", "20", "--handshake-timeout", "500ms", "--header-read-timeout", "500ms"])
        .start();
    // 30 connections that never send a byte: the cap holds 20 of them for the
    // handshake timeout at most; the rest are closed at once.
    let silent: Vec<TcpStream> = (0..30).map(|_| TcpStream::connect(&fg.grpc).unwrap()).collect();
    let started = Instant::now();
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "a silent connection was served");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "silent connections held for {:?}", started.elapsed());
    // Slowloris on HTTP: a request head that never ends is cut off.
    let mut slow = TcpStream::connect(&fg.http).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = Vec::new();
    let _ = slow.read_to_end(&mut answer);
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"), "the half request was answered");
    // The server still serves.
    assert_eq!(fg.http_get("/healthz").0, 200);
    assert!(gauge(&fg, "floodgate_connections_rejected_total{port=\"grpc\"}") >= 10.0);
}

/// The server's resident memory, from /proc.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Opens `streams` ShouldRateLimit calls on one new connection, each sending
/// all but the end of a 1 MB message; the calls answered within a second
/// (refused: none is whole) and the connection, to keep the rest open.
async fn unfinished(fg: &Floodgate, streams: usize, part: &Bytes) -> (Vec<http::HeaderMap>, impl Sized) {
    let tcp = tokio::net::TcpStream::connect(&fg.grpc).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    let mut calls = Vec::new();
    for _ in 0..streams {
        let req = http::Request::post(format!(
            "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            fg.grpc
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (answer, mut send) = client.clone().ready().await.unwrap().send_request(req, false).unwrap();
        send.send_data(part.clone(), false).unwrap();
        calls.push((answer, send));
    }
    let mut refused = Vec::new();
    let mut open = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    for (answer, send) in calls {
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(r)) => refused.push(r.headers().clone()),
            Ok(Err(e)) => panic!("a stream reset instead of answered: {e}"),
            Err(_) => open.push(send),
        }
    }
    (refused, (client, driver, open))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_requests_hold_no_more_than_their_budgets() {
    let fg = floodgate()
        .rules(RULES)
        .args(["--max-unfinished-request-bytes", "20MiB", "--max-unfinished-request-bytes-per-connection", "9MiB"])
        .start();
    let before = rss(fg.pid());
    // A message declared 1,000,000 bytes long, 600,000 of them sent.
    let mut part = vec![0u8];
    part.extend(1_000_000u32.to_be_bytes());
    part.resize(600_005, b'x');
    let part = Bytes::from(part);
    // 4 connections x 100 calls: 240 MB of messages if every call were held
    // (the server grew by 490 MB without the budgets).
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..4 {
        let (answers, conn) = unfinished(&fg, 100, &part).await;
        for headers in &answers {
            let status = tonic::Status::from_header_map(headers).expect("a trailers-only answer");
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            assert!(status.message().contains("bytes of unfinished requests at most"), "{status:?}");
        }
        refused += answers.len();
        held.push(conn);
    }
    // 20 MiB hold 34 such parts at most, 9 MiB 15 per connection.
    assert!(refused >= 400 - 34, "{refused} of 400 refused");
    let grown = rss(fg.pid()).saturating_sub(before);
    assert!(grown < 128 << 20, "the server grew by {grown} bytes");
    // A whole small call needs no budget: served while it is spent.
    let mut data = fg.client().await;
    data.acquire(acquire("demo", &[("user", "u")], 1)).await.expect("served");
    // A call of many frames needs some: refused while it is spent (at most
    // 600 KB is left of it)...
    let rls = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let mut big = vec![0x0a]; // domain: 900,000 bytes
    big.extend([0xa0, 0xf7, 0x36]);
    big.resize(4 + 900_000, b'd');
    // descriptors: [ { entries: [ { key: k, value: v } ] } ]
    big.extend([0x12, 0x08, 0x0a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v']);
    assert_eq!(raw_call(&fg, rls, big.clone()).await, Code::ResourceExhausted);
    // ...and served once the callers that held it are gone.
    drop(held);
    eventually("the budget given back", Duration::from_secs(10), || {
        let big = big.clone();
        let fg = &fg;
        async move { (raw_call(fg, rls, big).await == Code::Ok).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_on_the_whole_port_are_capped() {
    let fg = floodgate().rules(RULES).args(["--max-streams", "50"]).start();
    // 60 calls each holding its stream open (a message never finished).
    let mut part = vec![0u8];
    part.extend(100u32.to_be_bytes());
    part.push(b'x');
    let part = Bytes::from(part);
    let (answers, held) = unfinished(&fg, 60, &part).await;
    // (A refused call's stream counts until its answer is written: one or
    // two more may be refused in a burst.)
    assert!((10..=12).contains(&answers.len()), "{} of the calls past 50 answered at once", answers.len());
    for headers in &answers {
        let status = tonic::Status::from_header_map(headers).expect("a trailers-only answer");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("50 calls are in flight (--max-streams)"), "{status:?}");
    }
    let mut data = fg.client().await;
    let err = data.acquire(acquire("demo", &[("user", "u")], 1)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    drop(held);
    eventually("room again", Duration::from_secs(10), || {
        let mut data = data.clone();
        async move { data.acquire(acquire("demo", &[("user", "u")], 1)).await.ok() }
    })
    .await;
}

/// `--max-streams 1` serves one call at a time (the call being decided is
/// one of those in flight, not one more: every call was refused).
#[tokio::test]
async fn one_stream_in_flight_is_one_call_served() {
    let fg = floodgate().rules(RULES).args(["--max-streams", "1"]).start();
    let mut data = fg.client().await;
    for _ in 0..3 {
        data.acquire(acquire("demo", &[("user", "u")], 1)).await.expect("served");
    }
}

/// A call whose request never arrives whole (headers and part of a
/// message, or nothing after the headers, the connection kept alive) ends
/// DEADLINE_EXCEEDED after --request-timeout and frees its stream: a few
/// such callers cannot hold --max-streams for as long as they like.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_arrives_whole_frees_its_stream() {
    let fg = floodgate().rules(RULES).args(["--max-streams", "4", "--request-timeout", "1s"]).start();
    let mut part = vec![0u8];
    part.extend(100u32.to_be_bytes());
    part.push(b'x');
    let (part, nothing) = (Bytes::from(part), Bytes::new());
    let started = std::time::Instant::now();
    let (mut answers, held) = unfinished(&fg, 2, &part).await;
    let (nothing, held_too) = unfinished(&fg, 2, &nothing).await;
    answers.extend(nothing);
    assert_eq!(answers.len(), 4, "every unfinished call answered within the helper's 3 s");
    for headers in &answers {
        let status = tonic::Status::from_header_map(headers).expect("a trailers-only answer");
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("--request-timeout"), "{status:?}");
    }
    assert!(started.elapsed() >= Duration::from_millis(900), "answered before the timeout");
    // Their connections are still open, their streams free: served.
    let mut data = fg.client().await;
    data.acquire(acquire("demo", &[("user", "u")], 1)).await.expect("served");
    let metrics = fg.http_get("/metrics").1;
    assert!(metrics.lines().any(|l| l == "floodgate_requests_timed_out_total 4"), "{metrics}");
    drop((held, held_too));
}

#[tokio::test]
async fn the_grpc_port_advertises_max_concurrent_streams() {
    let fg = floodgate().rules(RULES).args(["--max-concurrent-streams", "77"]).start();
    let tcp = tokio::net::TcpStream::connect(&fg.grpc).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    client = client.ready().await.unwrap();
    let streams = eventually("the server's SETTINGS", Duration::from_secs(5), || {
        let n = client.current_max_send_streams();
        async move { (n != usize::MAX && n > 0).then_some(n) }
    })
    .await;
    assert_eq!(streams, 77);
}

/// Flags that cannot work are refused before the server binds a port or
/// connects anywhere: it exits at once, naming the flag.
#[test]
fn flags_that_cannot_work_are_refused_before_anything_starts() {
    let dir = TempDir::new();
    let overrides = dir.path("overrides.jsonl");
    let overrides = overrides.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--sync-interval", "0s"], "--sync-interval"),
        (&["--redis-timeout", "0ms"], "--redis-timeout"),
        (&["--sweep-interval", "0s"], "--sweep-interval"),
        (&["--max-keys", "0"], "--max-keys"),
        (&["--threads", "0"], "--threads"),
        (&["--max-connections", "0"], "--max-connections"),
        (&["--max-concurrent-streams", "0"], "--max-concurrent-streams"),
        (&["--max-watchers", "0"], "--max-watchers"),
        (&["--max-streams", "0"], "--max-streams"),
        (&["--max-unfinished-request-bytes", "0"], "--max-unfinished-request-bytes"),
        (&["--max-unfinished-request-bytes", "1PB"], "--max-unfinished-request-bytes"),
        (&["--max-unfinished-request-bytes", "10MiB"], "--max-unfinished-request-bytes"),
        (&["--max-unfinished-request-bytes-per-connection", "1MiB"], "--max-unfinished-request-bytes-per-connection"),
        // Not zero, but too small to work: a 1ns idle timeout closes every
        // connection before it speaks, a 1us sync floods Redis.
        (&["--idle-timeout", "1ns"], "--idle-timeout"),
        (&["--keepalive-timeout", "10ms"], "--keepalive-timeout"),
        (&["--handshake-timeout", "1ms"], "--handshake-timeout"),
        (&["--sync-interval", "1us"], "--sync-interval"),
        (&["--threads", "100000"], "--threads"),
        (&["--replica-id", "two words"], "--replica-id"),
        (&["--replica-id", ""], "--replica-id"),
        // Flags that would do nothing, silently: an identity no caller can
        // have without client certificates, Redis credentials without Redis,
        // a log filter that does not parse (it fell back to `info`).
        (&["--admin-identity", "ops-admin"], "--admin-identity"),
        (&["--redis-user", "floodgate"], "--redis-user"),
        (&["--redis-ca", "/etc/hostname"], "--redis-ca"),
        (&["--log-level", "floodgate=loud"], "--log-level"),
        // Port 1 on loopback: nothing listens, so a server that got as far as
        // connecting would sit retrying rather than exit.
        (&["--overrides-file", overrides, "--redis", "redis://127.0.0.1:1"], "--overrides-file"),
    ];
    for (args, flag) in cases {
        let out = floodgate().args(*args).env_remove("RUST_LOG").run_to_exit(Duration::from_secs(10));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(out.stdout.is_empty(), "{args:?}: the server said it listens");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_no_call_open_is_closed_whatever_pings_it_answers() {
    let fg = floodgate().args(["--idle-timeout", "2s"]).start();
    let open = |fg: &Floodgate| fg.metrics().value("floodgate_connections", &[("port", "grpc")]).unwrap_or(0.0);
    // Both clients answer the server's pings and send their own, every 300 ms.
    let connect = || async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", fg.grpc))
            .unwrap()
            .http2_keep_alive_interval(Duration::from_millis(300))
            .keep_alive_while_idle(true);
        pb::floodgate_client::FloodgateClient::new(endpoint.connect().await.unwrap())
    };
    let mut quiet = connect().await;
    quiet.acquire(acquire("demo", &[("user", "a")], 1)).await.unwrap();
    let mut watching = connect().await;
    let mut events = watching.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    events.message().await.unwrap().expect("the snapshot");
    assert_eq!(open(&fg), 2.0);
    // The quiet one is closed 2 s after its call; the Watch stream is a
    // call open for as long as it lasts, so its connection stays.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while open(&fg) > 1.0 {
        assert!(std::time::Instant::now() < deadline, "the idle connection was not closed: {} open", open(&fg));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(open(&fg), 1.0, "the Watch stream's connection stays open");
    // The closed connection's client reconnects on its next call.
    assert!(quiet.acquire(acquire("demo", &[("user", "a")], 1)).await.is_ok());
}
