//! Acquire, AcquireBatch and Peek through the real binary, bad input included.

use crate::support;

use std::collections::HashMap;
use std::process::Command;

use floodgate_proto::v1 as pb;
use support::*;

const RULES: &str = r#"
resources:
  - name: orders
    limits:
      - { name: global, algorithm: token_bucket, capacity: 100, refill_per_second: 0.001 }
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 3, window: 1h }
  - name: shaped
    limits:
      - { name: pace, algorithm: leaky_bucket, capacity: 10, leak_per_second: 10, mode: shape, max_wait: 250ms }
"#;

async fn remaining(fg: &Floodgate, user: &str) -> Vec<u64> {
    let mut admin = fg.admin().await;
    let peek = pb::PeekRequest {
        resource: "orders".into(),
        descriptors: HashMap::from([("user".into(), user.into())]),
        limit: String::new(),
    };
    admin.peek(peek).await.unwrap().into_inner().limits.iter().map(|l| l.remaining).collect()
}

#[tokio::test]
async fn every_bad_input_is_invalid_argument_naming_field_and_value_and_changes_nothing() {
    let fg = floodgate().rules(RULES).start();
    let mut client = fg.client().await;
    client.acquire(acquire("orders", &[("user", "u1")], 1)).await.unwrap();
    let before = remaining(&fg, "u1").await;
    assert_eq!(before, [99, 2]);

    let long = "x".repeat(257);
    let many: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let cases: Vec<(pb::AcquireRequest, String)> = vec![
        (acquire("", &[("user", "u1")], 1), "resource: must not be empty".into()),
        (
            acquire(&long, &[("user", "u1")], 1),
            format!("resource: '{}…' is 257 bytes long; the limit is 256", &long[..40]),
        ),
        (
            acquire("orders", &[("user", &long)], 1),
            format!("descriptors[\"user\"]: '{}…' is 257 bytes long", &long[..40]),
        ),
        (
            acquire("orders", &[(&long, "v")], 1),
            "descriptors key: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' is 257 bytes long".into(),
        ),
        (acquire("orders", &[("", "v")], 1), "descriptors key: must not be empty".into()),
        (acquire("orders", &many, 1), "descriptors: 33 entries; the limit is 32".into()),
        (acquire("orders", &[("user", "u1")], 500), "cost 500 exceeds capacity 100 of limit 'global'".into()),
        (acquire("orders", &[("user", "u1")], 4), "cost 4 exceeds capacity 3 of limit 'per-user'".into()),
    ];
    for (req, want) in cases {
        let err = client.acquire(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{want}");
        assert!(err.message().contains(&want), "got {:?}, want {want:?}", err.message());
    }

    // A batch of 1001 items, and a batch with one bad item: refused whole.
    let big = pb::AcquireBatchRequest { requests: vec![acquire("orders", &[], 1); 1001] };
    let err = client.acquire_batch(big).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (tonic::Code::InvalidArgument, "requests: 1001 items; the limit is 1000"));
    let mixed = pb::AcquireBatchRequest {
        requests: vec![
            acquire("orders", &[("user", "u1")], 1),
            acquire("orders", &[("user", "u1")], 1),
            acquire("", &[], 1),
        ],
    };
    let err = client.acquire_batch(mixed).await.unwrap_err();
    assert_eq!(err.message(), "requests[2].resource: must not be empty");

    // Nothing was taken by any of it, and the server is still answering.
    assert_eq!(remaining(&fg, "u1").await, before);
    let ok = client.acquire(acquire("orders", &[("user", "u1")], 1)).await.unwrap().into_inner();
    assert_eq!(ok.verdict(), pb::Verdict::Allowed);
}

#[tokio::test]
async fn a_batch_is_answered_in_order_and_each_item_decided_on_its_own() {
    let fg = floodgate().rules(RULES).start();
    let mut client = fg.client().await;
    let requests =
        (0..5).map(|_| acquire("orders", &[("user", "u2")], 1)).chain([acquire("unknown", &[], 1)]).collect();
    let r = client.acquire_batch(pb::AcquireBatchRequest { requests }).await.unwrap().into_inner();
    let verdicts: Vec<_> = r.responses.iter().map(|r| r.verdict()).collect();
    use pb::Verdict::*;
    assert_eq!(verdicts, [Allowed, Allowed, Allowed, RateLimited, RateLimited, Allowed]);
    assert_eq!(r.responses[2].limits[1].remaining, 0);
    assert!(r.responses[3].limits[1].exceeded && !r.responses[3].limits[0].exceeded);
    assert!(r.responses[5].limits.is_empty(), "no rule matches 'unknown'");
    // The denied items took nothing from 'global': 100 - 3.
    assert_eq!(remaining(&fg, "u2").await, [97, 0]);
}

#[tokio::test]
async fn dry_run_and_shaping_waits_come_back_over_the_wire() {
    let fg = floodgate().rules(RULES).start();
    let mut client = fg.client().await;
    let mut dry = acquire("orders", &[("user", "u3")], 2);
    dry.dry_run = true;
    for _ in 0..3 {
        let r = client.acquire(dry.clone()).await.unwrap().into_inner();
        assert_eq!((r.verdict(), r.limits[1].remaining), (pb::Verdict::Allowed, 1));
    }
    assert_eq!(remaining(&fg, "u3").await, [100, 3]);

    // Shaped callers are spaced 100 ms apart; beyond max_wait they are refused.
    // One batch is decided at one instant, so the waits are exact.
    let batch = pb::AcquireBatchRequest { requests: vec![acquire("shaped", &[], 1); 4] };
    let r = client.acquire_batch(batch).await.unwrap().into_inner();
    let got: Vec<_> = r.responses.iter().map(|r| (r.verdict(), r.wait.map_or(0, |d| d.nanos / 1_000_000))).collect();
    use pb::Verdict::*;
    assert_eq!(got, [(Allowed, 0), (Allowed, 100), (Allowed, 200), (RateLimited, 0)]);
    assert_eq!(r.responses[3].retry_after.unwrap().nanos, 50_000_000, "300 ms wait - 250 ms max_wait");
}

#[tokio::test]
async fn reflection_v1_and_v1alpha_and_health_are_served() {
    let fg = floodgate().rules(RULES).start();
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient as V1;
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut v1 = V1::new(fg.channel().await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = v1.server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
    let msg = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else { panic!("{msg:?}") };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "floodgate.v1.Floodgate",
        "floodgate.v1.Admin",
        "grpc.health.v1.Health",
        "envoy.service.ratelimit.v3.RateLimitService",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    // A client that only has reflection (grpcurl) must be able to build
    // Envoy's request, so the file that defines it must come back whole.
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "envoy.service.ratelimit.v3.RateLimitService".into(),
        )),
    };
    let mut stream = v1.server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
    let msg = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::FileDescriptorResponse(files)) = msg.message_response else { panic!("{msg:?}") };
    use prost::Message;
    let names: Vec<String> = files
        .file_descriptor_proto
        .iter()
        .map(|bytes| prost_types::FileDescriptorProto::decode(bytes.as_slice()).unwrap().name().to_string())
        .collect();
    assert!(names.iter().any(|n| n == "envoy/service/ratelimit/v3/rls.proto"), "{names:?}");

    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as V1Alpha;
    use tonic_reflection::pb::v1alpha::{
        ServerReflectionRequest as AlphaRequest, server_reflection_request::MessageRequest as AlphaMessage,
    };
    let mut alpha = V1Alpha::new(fg.channel().await);
    let req = AlphaRequest {
        host: String::new(),
        message_request: Some(AlphaMessage::FileContainingSymbol("floodgate.v1.Floodgate".into())),
    };
    let mut stream = alpha.server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
    let msg = stream.message().await.unwrap().unwrap();
    assert!(msg.message_response.is_some());
    assert_eq!(fg.http_get("/readyz"), (200, "ready\n".into()));
}

#[tokio::test]
async fn the_acquire_command_prints_the_decision_and_exits_by_verdict() {
    let fg = floodgate().rules(RULES).start();
    let run =
        || Command::new(BIN).args(["acquire", "--server", &fg.grpc, "orders", "-d", "user=cli"]).output().unwrap();
    for left in [2, 1, 0] {
        let out = run();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("ALLOWED       orders"), "{text}");
        assert!(text.contains(&format!("remaining      {left}/3")), "{text}");
    }
    let out = run();
    assert_eq!(out.status.code(), Some(3), "a denial exits 3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("RATE_LIMITED  orders  retry after"), "{text}");
    assert!(text.contains("reason: limit 'per-user' (fixed_window 3 per 1h) exceeded"), "{text}");

    let out = Command::new(BIN).args(["acquire", "--server", &fg.grpc, ""]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("InvalidArgument: resource: must not be empty"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_server_cleanly() {
    let mut fg = floodgate().rules(RULES).start();
    let mut client = fg.client().await;
    client.acquire(acquire("orders", &[], 1)).await.unwrap();
    // The client's connection stays open: the server drains it and exits.
    let status = tokio::task::block_in_place(|| fg.terminate());
    assert!(status.success(), "{status:?}");
    assert!(fg.logs().contains("stopped"));
}

#[tokio::test]
async fn a_calendar_day_in_a_time_zone_resets_at_its_local_midnight() {
    let dir = TempDir::new();
    let rules = "resources:\n  - name: daily\n    limits: [ { name: per-day, key: [user], algorithm: fixed_window, limit: 2, calendar: day, time_zone: Asia/Kolkata } ]\n";
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", rules))]).start();
    let mut c = fg.client().await;
    let ask = || pb::AcquireRequest {
        resource: "daily".into(),
        descriptors: HashMap::from([("user".into(), "u1".into())]),
        ..Default::default()
    };
    let mut verdicts = Vec::new();
    let mut resets = Vec::new();
    for _ in 0..3 {
        let r = c.acquire(ask()).await.unwrap().into_inner();
        verdicts.push(r.verdict());
        let l = &r.limits[0];
        resets.push((l.reset_after.unwrap().seconds as u64, l.retry_after.unwrap_or_default().seconds as u64));
    }
    assert_eq!(verdicts, [pb::Verdict::Allowed, pb::Verdict::Allowed, pb::Verdict::RateLimited]);
    let expected = seconds_to_kolkata_midnight();
    for (reset, _) in &resets {
        assert!(same_daily_reset(*reset, expected, 3), "reset after {reset}s, midnight in Kolkata is {expected}s away");
    }
    let (_, retry) = resets[2];
    assert!(same_daily_reset(retry, expected, 3), "retry after {retry}s: the denied caller waits for local midnight");
    let window = c.acquire(ask()).await.unwrap().into_inner().limits[0].window.unwrap();
    assert_eq!(window.seconds, 86_400, "the policy window a client is told is the nominal day");
}
