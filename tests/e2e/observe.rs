//! What operators watch, through the real binary: /metrics after some calls,
//! who is being limited (`GetTopKeys`, `floodgate top`), and `floodgate
//! bench` with its JSON report.

use crate::support;

use std::process::{Command, Stdio};

use floodgate_proto::v1 as pb;
use support::*;

const RULES: &str = r#"
resources:
  - name: orders
    limits:
      - { name: global, algorithm: fixed_window, limit: 100, window: 1h }
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 2, window: 1h }
  - name: bench
    limits:
      - { name: hourly, algorithm: fixed_window, limit: 250, window: 1h }
  - name: "svc.*"
    limits:
      - { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 1, window: 1h }
"#;

/// The value of the sample whose name and labels are exactly `series`.
fn sample(page: &str, series: &str) -> Option<f64> {
    Metrics::parse(page).series(series)
}

#[tokio::test]
async fn metrics_count_decisions_by_resource_limit_and_verdict() {
    let fg = floodgate().rules(RULES).start();
    let mut client = fg.client().await;
    for _ in 0..3 {
        client.acquire(acquire("orders", &[("user", "u1")], 1)).await.unwrap();
    }
    client.acquire(acquire("orders", &[], 1)).await.unwrap();
    client.acquire(acquire("nobody-knows", &[], 1)).await.unwrap();
    let _ = client.acquire(acquire("", &[], 1)).await.unwrap_err();

    let (status, page) = fg.http_get("/metrics");
    assert_eq!(status, 200);
    let expect = [
        (r#"floodgate_decisions_total{resource="orders",verdict="ALLOWED",limit=""}"#, 3.0),
        (r#"floodgate_decisions_total{resource="orders",verdict="RATE_LIMITED",limit="per-user"}"#, 1.0),
        (r#"floodgate_decisions_total{resource="_unmatched",verdict="ALLOWED",limit=""}"#, 1.0),
        (r#"floodgate_limit_decisions_total{resource="orders",limit="global",result="admitted"}"#, 4.0),
        (r#"floodgate_limit_decisions_total{resource="orders",limit="per-user",result="admitted"}"#, 2.0),
        (r#"floodgate_limit_decisions_total{resource="orders",limit="per-user",result="exceeded"}"#, 1.0),
        (r#"floodgate_rpc_requests_total{method="Floodgate/Acquire",code="OK"}"#, 5.0),
        (r#"floodgate_rpc_requests_total{method="Floodgate/Acquire",code="INVALID_ARGUMENT"}"#, 1.0),
        (r#"floodgate_rpc_duration_seconds_count{method="Floodgate/Acquire"}"#, 6.0),
        (r#"floodgate_rule_reloads_total{source="file",result="success"}"#, 1.0),
        ("floodgate_keys", 2.0),
        ("floodgate_rules_version", 1.0),
    ];
    for (series, value) in expect {
        assert_eq!(sample(&page, series), Some(value), "{series} in:\n{page}");
    }
    assert!(sample(&page, "floodgate_process_resident_memory_bytes").unwrap() > 1e6);
    assert!(page.contains("# TYPE floodgate_rpc_duration_seconds histogram"), "{page}");
}

/// A refused reload is counted, and `floodgate_rules_reload_failing` (what
/// the FloodgateRulesReloadFailing alert watches) stays at 1 for the file
/// until a good file is installed. A refused Admin apply is told to its
/// caller and raises no alarm.
#[tokio::test]
async fn a_rejected_reload_is_counted_as_a_failure() {
    let fg = floodgate().rules(RULES).start();
    let failing = r#"floodgate_rules_reload_failing{source="file"}"#;
    assert_eq!(sample(&fg.http_get("/metrics").1, failing), Some(0.0), "the first load succeeded");
    fg.dir().replace("rules.yaml", "resources: [ { name: '' } ]\n");
    let series = r#"floodgate_rule_reloads_total{source="file",result="failure"}"#;
    eventually("a failed reload on /metrics", std::time::Duration::from_secs(10), || async {
        (sample(&fg.http_get("/metrics").1, series) == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(sample(&fg.http_get("/metrics").1, failing), Some(1.0), "the file's rules are refused");
    let mut admin = fg.admin().await;
    let bad = pb::ApplyRulesRequest { yaml: "resources: 7".into(), validate_only: false, ..Default::default() };
    assert!(admin.apply_rules(bad).await.is_err());
    let page = fg.http_get("/metrics").1;
    assert_eq!(sample(&page, r#"floodgate_rule_reloads_total{source="admin",result="failure"}"#), Some(1.0), "{page}");
    assert_eq!(sample(&page, r#"floodgate_rules_reload_failing{source="admin"}"#), None, "{page}");
    // A good file clears it.
    fg.dir().replace("rules.yaml", RULES);
    eventually("the file's rules installed again", std::time::Duration::from_secs(10), || async {
        (sample(&fg.http_get("/metrics").1, failing) == Some(0.0)).then_some(())
    })
    .await;
}

fn bench(fg: &Floodgate, args: &[&str]) -> serde_json::Value {
    support::bench(&fg.grpc, args)
}

#[tokio::test]
async fn bench_reports_counts_verdicts_and_percentiles_as_json() {
    let fg = floodgate().rules(RULES).start();
    let r = bench(&fg, &["--rpc", "acquire", "-n", "400", "-c", "8", "--keys", "50"]);
    assert_eq!(r["count"], 400);
    assert_eq!(r["statusCodeDistribution"]["OK"], 400);
    // The rule admits exactly 250 in the hour.
    assert_eq!(r["verdicts"]["ALLOWED"], 250);
    assert_eq!(r["verdicts"]["RATE_LIMITED"], 150);
    assert_eq!(r["options"]["call"], "/floodgate.v1.Floodgate/Acquire");
    let percentiles: Vec<f64> =
        r["latencyDistribution"].as_array().unwrap().iter().map(|p| p["percentage"].as_f64().unwrap()).collect();
    assert_eq!(percentiles, [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9]);
    let latency = |i: usize| r["latencyDistribution"][i]["latency"].as_u64().unwrap();
    assert!(latency(2) <= latency(4) && latency(4) <= latency(6) && latency(6) <= latency(7));
    assert!(r["fastest"].as_u64().unwrap() <= latency(0) && latency(7) <= r["slowest"].as_u64().unwrap());
    let histogram = r["histogram"].as_array().unwrap();
    assert_eq!(histogram.iter().map(|b| b["count"].as_u64().unwrap()).sum::<u64>(), 400);
    assert!(r["rps"].as_f64().unwrap() > 0.0);

    // A batch of 10 items per call: 30 calls are 300 decisions.
    let r = bench(
        &fg,
        &["--rpc", "batch", "--batch-size", "10", "-n", "30", "-c", "3", "--resource", "orders", "--keys", "1000"],
    );
    assert_eq!(r["count"], 30);
    let decisions: u64 = r["verdicts"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(decisions, 300);

    // Health and Envoy run too; and the server's memory figures come back.
    let r = bench(&fg, &["--rpc", "health", "-n", "50", "--metrics-url", &format!("http://{}/metrics", fg.http)]);
    assert_eq!(r["verdicts"]["SERVING"], 50);
    assert!(r["server"]["residentBytesAfter"].as_f64().unwrap() > 0.0);
    let r = bench(&fg, &["--rpc", "envoy", "-n", "20", "--resource", "unlimited", "--keys", "20"]);
    assert_eq!(r["verdicts"]["OK"], 20);
}

#[test]
fn bench_text_shows_the_latency_distribution() {
    let fg = floodgate().rules(RULES).start();
    let out =
        Command::new(BIN).args(["bench", "--server", &fg.grpc, "--rpc", "health", "-n", "100", "-q"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "Count:\t100",
        "Requests/sec:",
        "50 % in",
        "90 % in",
        "99 % in",
        "99.9 % in",
        "max in",
        "[OK]\t100 responses",
        "[SERVING]\t100",
    ] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
}

/// A server killed in the middle of a load test is a set of errors in the
/// report, never the end of the load generator: writing to a connection the
/// server closed must not kill `floodgate bench` with SIGPIPE. And a
/// command whose reader went away (`| head`) ends quietly with success.
#[test]
fn bench_outlives_a_killed_server_and_output_to_a_closed_pipe_ends_quietly() {
    for round in 0..3 {
        let fg = floodgate().rules(RULES).start();
        let bench = Command::new(BIN)
            .args(["bench", "--server", &fg.grpc, "--format", "json", "--quiet", "--rpc", "acquire"])
            .args(["--resource", "orders", "--keys", "100", "-z", "3s", "--rps", "2000", "-c", "16", "--timeout", "1s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(800));
        support::signal(fg.pid(), "KILL");
        let out = bench.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "round {round}: bench ended with {} once its server was killed: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let ok = r["statusCodeDistribution"]["OK"].as_u64().unwrap_or(0);
        let count = r["count"].as_u64().unwrap();
        assert!(ok > 0 && ok < count, "round {round}: some calls answered, the rest errors: {r}");
    }

    // The reader of standard output is gone before the command writes.
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RULES);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN)
        .args(["check-config", path_str(&rules)])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "check-config into a closed pipe: {} {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn logs_are_json_when_asked_and_quiet_per_request_at_info() {
    let fg = floodgate().args(["--log-format", "json"]).start();
    let mut client = fg.client().await;
    for _ in 0..20 {
        client.acquire(acquire("demo", &[], 1)).await.unwrap();
    }
    let logs = fg.logs();
    let lines: Vec<&str> = logs.lines().collect();
    assert!(lines.len() >= 2, "{logs}");
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
    }
    assert!(lines.len() < 10, "nothing is logged per request at info level: {logs}");
}

#[tokio::test]
async fn top_keys_name_who_is_denied_most_through_admin_and_the_cli() {
    let fg = floodgate().rules(RULES).start();
    let mut client = fg.client().await;
    // greedy asks 12 times (2 admitted, 10 denied); polite-0..4 once each.
    for _ in 0..12 {
        client.acquire(acquire("orders", &[("user", "greedy")], 1)).await.unwrap();
    }
    for i in 0..5 {
        client.acquire(acquire("orders", &[("user", &format!("polite-{i}"))], 1)).await.unwrap();
    }
    // A template rule's keys name the resource too.
    for _ in 0..3 {
        client.acquire(acquire("svc.search", &[("tenant", "acme")], 1)).await.unwrap();
    }
    // Dry runs are not counted.
    let mut dry = acquire("orders", &[("user", "dry")], 1);
    dry.dry_run = true;
    client.acquire(dry).await.unwrap();

    let mut admin = fg.admin().await;
    let top = admin.get_top_keys(pb::GetTopKeysRequest::default()).await.unwrap().into_inner();
    assert_eq!(top.window.unwrap().seconds, 300);
    let names: Vec<(&str, &str)> = top.limits.iter().map(|l| (l.rule.as_str(), l.limit.as_str())).collect();
    assert_eq!(names, [("orders", "per-user"), ("svc.*", "per-tenant")], "keyed limits only: global has no key");
    let per_user = &top.limits[0];
    assert_eq!(per_user.denied.len(), 1);
    assert_eq!(
        (per_user.denied[0].key.as_str(), per_user.denied[0].count, per_user.denied[0].error),
        ("user=greedy", 10, 0)
    );
    // Admissions are sampled (one in admitted_sample, counted that many).
    let admitted: u64 = per_user.admitted.iter().map(|k| k.count).sum();
    assert_eq!(admitted % u64::from(top.admitted_sample), 0);
    assert!(admitted <= 7 + u64::from(top.admitted_sample), "{admitted}");
    assert!(per_user.admitted.iter().all(|k| k.key != "user=dry"), "{:?}", per_user.admitted);
    assert_eq!(top.limits[1].denied[0].key, "svc.search,tenant=acme");
    assert_eq!(top.limits[1].denied[0].count, 2);

    let only = admin.get_top_keys(pb::GetTopKeysRequest { rule: "svc.*".into(), count: 1 }).await.unwrap();
    assert_eq!(only.into_inner().limits.len(), 1);
    // A rule that is not in force is NOT_FOUND, not an empty list that
    // reads as "nobody is being limited".
    let err = admin.get_top_keys(pb::GetTopKeysRequest { rule: "order".into(), count: 1 }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert_eq!(err.message(), "rule: no rule in force is named 'order'");

    let out = Command::new(BIN).args(["top", "--server", &fg.grpc, "--rule", "orders", "-n", "3"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("orders / per-user  (last 5 min)"), "{text}");
    assert_eq!(
        lines.next().map(str::split_whitespace).map(Iterator::collect::<Vec<_>>),
        Some(vec!["denied", "10", "user=greedy"]),
        "{text}"
    );
}
