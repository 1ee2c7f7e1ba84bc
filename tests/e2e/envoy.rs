//! Envoy's RLS v3 through the real binary, with requests built by hand from
//! Envoy's field numbers (not from our generated code), so the test proves
//! wire compatibility rather than agreement with ourselves.

use crate::support;

use bytes::Bytes;
use floodgate::bench::wire::{Raw, RawCodec};
use http::uri::PathAndQuery;
use support::*;

const RULES: &str = r#"
resources:
  - name: edge
    limits:
      - { name: per-ip, key: [remote_address], algorithm: fixed_window, limit: 3, window: 1m }
"#;

// === protobuf by hand ===

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_varint(tag: u32, v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(tag) << 3, &mut out);
    varint(v, &mut out);
    out
}

fn field_bytes(tag: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint((u64::from(tag) << 3) | 2, &mut out);
    varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

/// RateLimitDescriptor: entries = 1 (Entry: key = 1, value = 2), hits_addend = 3 (UInt64Value: value = 1).
fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> Vec<u8> {
    let mut d = Vec::new();
    for (k, v) in entries {
        d.extend(field_bytes(1, &[field_bytes(1, k.as_bytes()), field_bytes(2, v.as_bytes())].concat()));
    }
    if let Some(h) = hits {
        d.extend(field_bytes(3, &field_varint(1, h)));
    }
    d
}

/// RateLimitRequest: domain = 1, descriptors = 2, hits_addend = 3.
fn request(domain: &str, descriptors: &[Vec<u8>], hits: u64) -> Bytes {
    let mut r = field_bytes(1, domain.as_bytes());
    for d in descriptors {
        r.extend(field_bytes(2, d));
    }
    if hits > 0 {
        r.extend(field_varint(3, hits));
    }
    Bytes::from(r)
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Varint(u64),
    Bytes(Vec<u8>),
}

fn parse(mut buf: &[u8]) -> Vec<(u32, Value)> {
    fn read_varint(buf: &mut &[u8]) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = buf[0];
            *buf = &buf[1..];
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return v;
            }
            shift += 7;
        }
    }
    let mut fields = Vec::new();
    while !buf.is_empty() {
        let key = read_varint(&mut buf);
        let (tag, wire) = ((key >> 3) as u32, key & 7);
        let value = match wire {
            0 => Value::Varint(read_varint(&mut buf)),
            2 => {
                let len = read_varint(&mut buf) as usize;
                let (b, rest) = buf.split_at(len);
                buf = rest;
                Value::Bytes(b.to_vec())
            }
            w => panic!("unexpected wire type {w}"),
        };
        fields.push((tag, value));
    }
    fields
}

fn get(fields: &[(u32, Value)], tag: u32) -> Option<&Value> {
    fields.iter().find(|(t, _)| *t == tag).map(|(_, v)| v)
}

fn varint_of(fields: &[(u32, Value)], tag: u32) -> u64 {
    match get(fields, tag) {
        Some(Value::Varint(v)) => *v,
        None => 0,
        other => panic!("field {tag} is {other:?}"),
    }
}

fn message_of(fields: &[(u32, Value)], tag: u32) -> Option<Vec<(u32, Value)>> {
    match get(fields, tag)? {
        Value::Bytes(b) => Some(parse(b)),
        other => panic!("field {tag} is {other:?}"),
    }
}

/// A DescriptorStatus as (code, (limit name, requests_per_unit, unit), limit_remaining, reset seconds).
type Status = (u64, Option<(String, u64, u64)>, u64, u64);

fn statuses(response: &[(u32, Value)]) -> Vec<Status> {
    response
        .iter()
        .filter(|(t, _)| *t == 2)
        .map(|(_, v)| {
            let Value::Bytes(b) = v else { panic!() };
            let s = parse(b);
            let limit = message_of(&s, 2).map(|l| {
                let Some(Value::Bytes(name)) = get(&l, 3) else { panic!("no name") };
                (String::from_utf8(name.clone()).unwrap(), varint_of(&l, 1), varint_of(&l, 2))
            });
            let reset = message_of(&s, 4).map_or(0, |d| varint_of(&d, 1));
            (varint_of(&s, 1), limit, varint_of(&s, 3), reset)
        })
        .collect()
}

// === the test ===

const OK: u64 = 1;
const OVER_LIMIT: u64 = 2;
const MINUTE: u64 = 2;

async fn should_rate_limit(fg: &Floodgate, body: Bytes) -> Result<Vec<(u32, Value)>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(fg.channel().await);
    grpc.ready().await.unwrap();
    let path = PathAndQuery::from_static("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    let r = grpc.unary(tonic::Request::new(body), path, RawCodec::<Raw>::default()).await?;
    Ok(parse(&r.into_inner().0))
}

/// Each descriptor Envoy asks about is a decision in the decision log, its
/// domain as the resource.
#[tokio::test]
async fn envoy_rls_decisions_are_in_the_decision_log() {
    let dir = TempDir::new();
    let config = dir.write("rules.yaml", RULES);
    let fg = floodgate().args(["--config", path_str(&config), "--decision-log", "1"]).start();
    for _ in 0..4 {
        should_rate_limit(&fg, request("edge", &[descriptor(&[("remote_address", "10.0.0.9")], None)], 0))
            .await
            .unwrap();
    }
    let ask = floodgate_proto::v1::GetDecisionsRequest {
        resource: "edge".into(),
        descriptors: [("remote_address".to_string(), "10.0.0.9".to_string())].into(),
        denied_only: true,
        count: 0,
    };
    let got = fg.admin().await.get_decisions(ask).await.unwrap().into_inner();
    assert_eq!(got.decisions.len(), 1, "{got:?}");
    let d = &got.decisions[0];
    assert_eq!((d.decided_by.clone(), d.cost), (vec!["per-ip".to_string()], 1), "{d:?}");
    assert_eq!(got.kept, 4);
}

#[tokio::test]
async fn envoy_rls_answers_ok_over_limit_and_descriptor_statuses() {
    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES))]).start();

    // One descriptor, default hits: OK, 2 of 3 left, reset within the minute.
    let r = should_rate_limit(&fg, request("edge", &[descriptor(&[("remote_address", "10.0.0.1")], None)], 0))
        .await
        .unwrap();
    assert_eq!(varint_of(&r, 1), OK);
    let s = statuses(&r);
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].0, s[0].1.clone(), s[0].2), (OK, Some(("per-ip".to_string(), 3, MINUTE)), 2));
    assert!(s[0].3 <= 60, "reset in {} s", s[0].3);

    // The request's hits_addend takes 2 at once: 0 left.
    let r = should_rate_limit(&fg, request("edge", &[descriptor(&[("remote_address", "10.0.0.1")], None)], 2))
        .await
        .unwrap();
    assert_eq!((varint_of(&r, 1), statuses(&r)[0].2), (OK, 0));

    // Over the limit now.
    let r = should_rate_limit(&fg, request("edge", &[descriptor(&[("remote_address", "10.0.0.1")], None)], 0))
        .await
        .unwrap();
    assert_eq!(varint_of(&r, 1), OVER_LIMIT);
    assert_eq!(statuses(&r)[0].0, OVER_LIMIT);

    // Several descriptors: one status each, in order; any over limit makes the whole OVER_LIMIT.
    // The per-descriptor hits_addend (3) overrides the request's (1); a descriptor
    // no limit matches is OK with no current limit.
    let body = request(
        "edge",
        &[
            descriptor(&[("remote_address", "10.0.0.2")], Some(3)),
            descriptor(&[("remote_address", "10.0.0.1")], None),
            descriptor(&[("user", "u1")], None),
        ],
        1,
    );
    let r = should_rate_limit(&fg, body).await.unwrap();
    assert_eq!(varint_of(&r, 1), OVER_LIMIT);
    let s = statuses(&r);
    assert_eq!(s.len(), 3);
    assert_eq!((s[0].0, s[0].2), (OK, 0), "hits_addend 3 took the whole window");
    assert_eq!(s[1].0, OVER_LIMIT);
    assert_eq!((s[2].0, s[2].1.clone()), (OK, None));

    // A domain with no rule is OK.
    let r = should_rate_limit(&fg, request("elsewhere", &[descriptor(&[("remote_address", "10.0.0.1")], None)], 0))
        .await
        .unwrap();
    assert_eq!(varint_of(&r, 1), OK);

    // A cost above the limit's capacity is OVER_LIMIT (as upstream), not an
    // error Envoy would let through, and it takes nothing.
    let r = should_rate_limit(&fg, request("edge", &[descriptor(&[("remote_address", "10.0.0.3")], Some(4))], 0))
        .await
        .unwrap();
    assert_eq!((varint_of(&r, 1), statuses(&r)[0].0), (OVER_LIMIT, OVER_LIMIT));
    // hits_addend 0 only checks.
    let r = should_rate_limit(&fg, request("edge", &[descriptor(&[("remote_address", "10.0.0.3")], Some(0))], 0))
        .await
        .unwrap();
    assert_eq!((varint_of(&r, 1), statuses(&r)[0].2), (OK, 3), "nothing was taken");
    // A value of any length is decided, never an error: a long header or
    // path gets its own counter (kept as its digest).
    let long = format!("10.0.0.{}", "9".repeat(4_000));
    for expect in [OK, OK, OK, OVER_LIMIT] {
        let r = should_rate_limit(&fg, request("edge", &[descriptor(&[("remote_address", &long)], None)], 0))
            .await
            .unwrap();
        assert_eq!(varint_of(&r, 1), expect);
    }

    // Bad input is INVALID_ARGUMENT naming the field.
    let err = should_rate_limit(&fg, request("", &[descriptor(&[("remote_address", "10.0.0.3")], None)], 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(err.message(), "domain: must not be empty");
    let err = should_rate_limit(&fg, Bytes::from_static(&[0x0a, 0xff])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "undecodable: {err:?}");
}

#[test]
fn check_config_validates_an_envoy_directory_naming_file_domain_and_path() {
    use std::process::Command;
    let dir = TempDir::new();
    let good = dir.path("good");
    std::fs::create_dir_all(&good).unwrap();
    std::fs::write(
        good.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: minute, requests_per_unit: 4 }\n",
    )
    .unwrap();
    std::fs::write(
        good.join("api.yml"),
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: { unlimited: true }\n",
    )
    .unwrap();
    std::fs::write(good.join("notes.txt"), "not a configuration file").unwrap();
    let out = Command::new(BIN).args(["check-config", "--envoy-config"]).arg(&good).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("OK (2 domains: api, edge; 2 limits)"), "{stdout}");

    let bad = dir.path("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: user\n        rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
    )
    .unwrap();
    std::fs::write(bad.join("twice.yaml"), "domain: edge\ndescriptors: []\n").unwrap();
    let out = Command::new(BIN).args(["check-config", "--envoy-config"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let file = bad.join("edge.yaml");
    assert!(
        err.contains(&format!(
            "{}: domain 'edge': descriptors.tenant.descriptors.user.rate_limit.unit: 'fortnight' is not second",
            file.display()
        )),
        "{err}"
    );
    assert!(err.contains("twice.yaml: domain 'edge': is also defined in"), "{err}");

    // `serve` refuses to start on it, listing the same errors.
    let out = floodgate().arg("--envoy-config").arg(&bad).run_to_exit(std::time::Duration::from_secs(30));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("'fortnight' is not second"));
}

#[tokio::test]
async fn an_rlqs_bucket_named_twice_in_one_report_gets_one_assignment_for_its_summed_usage() {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
    let dir = TempDir::new();
    let rules = "resources:\n  - name: api\n    limits:\n      - { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 40, window: 1h, lease: 10s }\n";
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", rules))]).start();
    let mut client = rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient::new(fg.channel().await);
    let bucket = |tenant: &str, allowed: u64| rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage {
        bucket_id: Some(rlqs::BucketId {
            bucket: [("name".to_string(), "api".to_string()), ("tenant".to_string(), tenant.to_string())].into(),
        }),
        num_requests_allowed: allowed,
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers =
        client.stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let report = |usages| rlqs::RateLimitQuotaUsageReports { domain: "edge".into(), bucket_quota_usages: usages };
    let tokens = |a: &rlqs::rate_limit_quota_response::BucketAction| format!("{:?}", a.bucket_action);

    // acme twice and beta once: two assignments, one a bucket.
    tx.send(report(vec![bucket("acme", 0), bucket("beta", 0), bucket("acme", 0)])).await.unwrap();
    let first = answers.message().await.unwrap().unwrap();
    let tenants: Vec<String> =
        first.bucket_action.iter().map(|a| a.bucket_id.as_ref().unwrap().bucket["tenant"].clone()).collect();
    assert_eq!(tenants, ["acme", "beta"], "{first:?}");
    // acme's first lease was half of its 40 (the other half kept for a next
    // holder). What its two entries used adds up: 15 + 15, counted as the
    // whole lease of 20 (a report counts at most what its lease granted);
    // its next lease is the 20 left.
    tx.send(report(vec![bucket("acme", 15), bucket("acme", 15)])).await.unwrap();
    let second = answers.message().await.unwrap().unwrap();
    assert_eq!(second.bucket_action.len(), 1, "{second:?}");
    let mut admin = fg.admin().await;
    let peek = floodgate_proto::v1::PeekRequest {
        resource: "api".into(),
        descriptors: acquire("api", &[("tenant", "acme")], 1).descriptors,
        limit: String::new(),
    };
    let limit = &admin.peek(peek).await.unwrap().into_inner().limits[0];
    // A stream lives for days: its size cap is per report, not for all it
    // ever sends (here 1.5 MB of reports, over the 1 MiB cap).
    let idle = vec![bucket("beta", 0); 600];
    assert!(prost::Message::encoded_len(&report(idle.clone())) * 100 > 3 << 19);
    for i in 0..100 {
        tx.send(report(idle.clone())).await.unwrap();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), answers.message()).await;
        let answer = answer.expect("an answer to every report").unwrap_or_else(|e| panic!("report {i}: {e:?}"));
        assert_eq!(answer.expect("the stream goes on").bucket_action.len(), 1);
    }
    // A count past 32 bits (Envoy's are 64) is answered, not dropped: it
    // counts as the whole lease.
    tx.send(report(vec![bucket("beta", 1 << 32)])).await.unwrap();
    let third = tokio::time::timeout(std::time::Duration::from_secs(10), answers.message())
        .await
        .expect("no answer to a report of 2^32 allowed")
        .unwrap()
        .unwrap();
    assert_eq!(third.bucket_action.len(), 1, "{third:?}");
    // A report over the size limit ends its stream with RESOURCE_EXHAUSTED,
    // not with OK (which reads as "nothing to say").
    let (big_tx, big_rx) = tokio::sync::mpsc::channel(1);
    let mut big = client
        .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(big_rx))
        .await
        .unwrap()
        .into_inner();
    let many = (0..40_000).map(|i| bucket(&format!("tenant-{i}"), 0)).collect();
    big_tx.send(report(many)).await.unwrap();
    let err =
        tokio::time::timeout(std::time::Duration::from_secs(10), big.message()).await.expect("no end").unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    // 20 used and 20 leased anew: the whole 40 is out, the new lease is 20,
    // refilled over its 10 s (Envoy holds at most what the rest of it refills).
    assert_eq!(limit.remaining, 0, "{limit:?}");
    let next = tokens(&second.bucket_action[0]);
    assert!(next.contains("tokens_per_fill: Some(UInt32Value { value: 20 })"), "40 - 20 = 20 left to lease: {next}");
    assert!(next.contains("fill_interval: Some(Duration { seconds: 10,"), "{next}");
}

#[tokio::test]
async fn a_descriptor_entry_carries_the_priority_a_shedding_system_reads() {
    let rules = "resources:\n  - name: edge\n    limits: [ { name: all, algorithm: fixed_window, limit: 1000, window: 1m } ]\nsystems:\n  - { name: web, resources: [edge] }\n";
    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", rules))]).start();
    let set = floodgate_proto::v1::SetDegradationLevelRequest { system: "web".into(), level: 1, ..Default::default() };
    fg.admin().await.set_degradation_level(set).await.unwrap();
    let ask = |priority: &str| {
        let entries = [("remote_address", "10.0.0.1"), ("priority", priority)];
        request("edge", &[descriptor(&entries, None)], 0)
    };
    let code = |r: Vec<(u32, Value)>| varint_of(&r, 1);
    assert_eq!(code(should_rate_limit(&fg, ask("sheddable")).await.unwrap()), OVER_LIMIT, "shed at level 1");
    assert_eq!(code(should_rate_limit(&fg, ask("SHEDDABLE_PLUS")).await.unwrap()), OK);
    // A value that names no priority is CRITICAL, not an error (which Envoy's
    // failure mode might turn into an allow).
    assert_eq!(code(should_rate_limit(&fg, ask("urgent!")).await.unwrap()), OK);
    let no_priority = request("edge", &[descriptor(&[("remote_address", "10.0.0.1")], None)], 0);
    assert_eq!(code(should_rate_limit(&fg, no_priority).await.unwrap()), OK);
    // Another key, named by --envoy-priority-key.
    let fg =
        floodgate().args(["--config", path_str(&dir.path("rules.yaml")), "--envoy-priority-key", "x-class"]).start();
    fg.admin()
        .await
        .set_degradation_level(floodgate_proto::v1::SetDegradationLevelRequest {
            system: "web".into(),
            level: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let by_class = request("edge", &[descriptor(&[("x-class", "sheddable")], None)], 0);
    assert_eq!(code(should_rate_limit(&fg, by_class).await.unwrap()), OVER_LIMIT);
    assert_eq!(
        code(should_rate_limit(&fg, ask("sheddable")).await.unwrap()),
        OK,
        "'priority' is just a descriptor now"
    );
}

#[tokio::test]
async fn an_rlqs_stream_past_its_bucket_limit_is_told_to_abandon_new_buckets() {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
    use rlqs::rate_limit_quota_response::bucket_action::BucketAction as Action;
    let dir = TempDir::new();
    let rules = "resources:\n  - name: api\n    limits:\n      - { name: per-user, key: [user], algorithm: fixed_window, limit: 40, window: 1h, lease: 10s }\n";
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", rules))]).start();
    let mut client = rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient::new(fg.channel().await);
    let bucket = |user: usize| rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage {
        bucket_id: Some(rlqs::BucketId {
            bucket: [("name".to_string(), "api".to_string()), ("user".to_string(), format!("u{user}"))].into(),
        }),
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers =
        client.stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    // The book holds 10,000 buckets a stream; the 10,001st and after are
    // abandoned, each one answered (none left waiting).
    let usages: Vec<_> = (0..10_003).map(bucket).collect();
    tx.send(rlqs::RateLimitQuotaUsageReports { domain: "edge".into(), bucket_quota_usages: usages }).await.unwrap();
    let answer =
        tokio::time::timeout(std::time::Duration::from_secs(60), answers.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(answer.bucket_action.len(), 10_003, "every bucket answered");
    let abandoned =
        |a: &rlqs::rate_limit_quota_response::BucketAction| matches!(a.bucket_action, Some(Action::AbandonAction(_)));
    assert!(answer.bucket_action[..10_000].iter().all(|a| !abandoned(a)));
    assert!(answer.bucket_action[10_000..].iter().all(abandoned), "{:?}", &answer.bucket_action[10_000..]);
    let abandoned = fg.metrics().value("floodgate_rlqs_buckets_abandoned_total", &[]);
    assert_eq!(abandoned, Some(3.0), "the abandoned buckets are counted");
}
