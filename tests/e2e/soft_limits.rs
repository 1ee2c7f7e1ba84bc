//! Soft limits (`over_limit: { admit: P% }`) through the real binary: the
//! share of calls over a limit admitted anyway, over gRPC, JSON and Envoy's
//! RLS, each told in the answer and counted in the metrics; and a rules file
//! that asks for it where it cannot hold is refused whole.

use crate::support;
use support::*;

const RULES: &str = r#"
resources:
  - name: soft
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 5, window: 1h, over_limit: { admit: 20% } }
  - name: hard
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 5, window: 1h }
"#;

#[tokio::test]
async fn a_fifth_of_the_calls_over_a_soft_limit_are_admitted_and_said_to_be() {
    let fg = floodgate().rules(RULES).start();
    let mut client = fg.client().await;
    let mut over_admitted = 0;
    for i in 0..505 {
        let a = client.acquire(acquire("soft", &[("user", "u1")], 1)).await.unwrap().into_inner();
        let l = &a.limits[0];
        if i < 5 {
            assert!(a.verdict() == floodgate_proto::v1::Verdict::Allowed && !l.exceeded, "call {i}: {a:?}");
        } else if a.verdict() == floodgate_proto::v1::Verdict::Allowed {
            assert!(l.exceeded && l.admitted_over_limit && l.remaining == 0, "call {i}: {a:?}");
            assert!(a.reason.is_empty(), "{a:?}");
            over_admitted += 1;
        } else {
            assert!(l.exceeded && !l.admitted_over_limit, "call {i}: {a:?}");
            assert!(a.reason.contains("per-user"), "{a:?}");
        }
    }
    // 100 expected of 500; about five standard deviations either side.
    assert!((55..=145).contains(&over_admitted), "{over_admitted} of 500 admitted over the limit");
    // The same limit without over_limit admits nothing over it.
    for _ in 0..5 {
        client.acquire(acquire("hard", &[("user", "u1")], 1)).await.unwrap();
    }
    for _ in 0..100 {
        let a = client.acquire(acquire("hard", &[("user", "u1")], 1)).await.unwrap().into_inner();
        assert_eq!(a.verdict(), floodgate_proto::v1::Verdict::RateLimited, "{a:?}");
    }

    // The metrics count the calls admitted over the limit apart from the
    // ones it denied.
    let m = fg.metrics();
    let result = |r: &str| {
        m.value("floodgate_limit_decisions_total", &[("resource", "soft"), ("limit", "per-user"), ("result", r)])
            .unwrap_or(0.0)
    };
    assert_eq!(result("exceeded_admitted"), f64::from(over_admitted));
    assert_eq!(result("exceeded"), f64::from(500 - over_admitted));
    // A limit without over_limit has no such series.
    let hard = m.value(
        "floodgate_limit_decisions_total",
        &[("resource", "hard"), ("limit", "per-user"), ("result", "exceeded_admitted")],
    );
    assert_eq!(hard, None);

    // Over JSON, the field is named as proto3's JSON mapping names it.
    let mut seen = 0;
    for _ in 0..100 {
        let r = fg
            .request("POST", "/v1/acquire")
            .header("content-type", "application/json")
            .body(r#"{"resource":"soft","descriptors":{"user":"u2"}}"#)
            .send();
        assert_eq!(r.status, 200, "{}", r.text());
        let body = r.json();
        if body["limits"][0]["admittedOverLimit"] == true {
            assert_eq!(body["verdict"], "VERDICT_ALLOWED", "{body}");
            seen += 1;
        }
    }
    assert!(seen > 0, "no JSON call was admitted over the limit");

    // Envoy's RLS answers OK for a call admitted over the limit.
    let r = support::bench(&fg.grpc, &["--rpc", "envoy", "--resource", "soft", "-n", "300", "-c", "1"]);
    let ok = verdict(&r, "OK");
    let over = verdict(&r, "OVER_LIMIT");
    assert_eq!(ok + over, 300, "{r}");
    assert!((5 + 20..=5 + 100).contains(&ok), "RLS: {ok} OK of 300 (5 within the limit, a fifth of the rest): {r}");
}

#[test]
fn the_cli_says_a_call_was_admitted_over_its_limit() {
    let fg = floodgate().rules(RULES).start();
    let mut seen = false;
    for _ in 0..60 {
        let out = std::process::Command::new(BIN)
            .args(["acquire", "--server", &fg.url(), "soft", "-d", "user=cli"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("admitted over the limit") {
            assert!(out.status.success(), "an admitted call exits 0: {text}");
            assert!(!text.contains("retry \n"), "{text}");
            seen = true;
            break;
        }
    }
    assert!(seen, "no call of 60 was admitted over a limit of 5 with admit: 20%");
}

#[test]
fn over_limit_where_it_cannot_hold_refuses_the_whole_file() {
    let dir = TempDir::new();
    let bad = dir.write(
        "rules.yaml",
        "resources:\n  - name: r\n    limits: [ { name: l, algorithm: fixed_window, limit: 5, window: 1h, sync: strict, over_limit: { admit: 10% } } ]\n",
    );
    let out = std::process::Command::new(BIN).args(["check-config", path_str(&bad)]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("limits[0] 'l'.over_limit: cannot be used with 'sync: strict'"), "{stderr}");
}
