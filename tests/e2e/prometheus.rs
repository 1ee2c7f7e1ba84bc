//! The shipped monitoring against the real thing: `promtool` checks and
//! unit-tests the alerting rules in deploy/prometheus/, a real Prometheus
//! scrapes the real binary and fires an alert when a breaker opens, and every
//! query of the Grafana dashboard in deploy/grafana/ runs against it.
//!
//! The alerts' `for:` durations (minutes) are shortened to one second here;
//! the rules are otherwise the shipped file, byte for byte.

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use support::prometheus::{Prometheus, get, query};
use support::*;

const RULES: &str = r#"
resources:
  - name: payments
    breaker:
      window: { kind: count, size: 10 }
      minimum_calls: 3
      failure_rate_threshold: 0.5
      wait_in_open: 1h
  - name: api
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 1, window: 1h }
"#;

fn deploy(path: &str) -> PathBuf {
    support::repo_path("deploy").join(path)
}

fn promtool(args: &[&str]) -> String {
    let out =
        Command::new("promtool").args(args).output().expect("promtool (Debian's prometheus; scripts/test installs it)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn promtool_checks_and_unit_tests_the_alerting_rules() {
    let rules = deploy("prometheus/floodgate-alerts.yml");
    let said = promtool(&["check", "rules", rules.to_str().unwrap()]);
    assert!(said.contains("SUCCESS: 11 rules found"), "{said}");
    let tests = deploy("prometheus/floodgate-alerts.test.yml");
    let said = promtool(&["test", "rules", tests.to_str().unwrap()]);
    assert!(said.contains("SUCCESS"), "{said}");
}

fn start_prometheus(dir: &TempDir, floodgate_http: &str) -> Prometheus {
    let shipped = std::fs::read_to_string(deploy("prometheus/floodgate-alerts.yml")).unwrap();
    let fast: String = shipped
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("for: ") {
                format!("{}for: 1s", &l[..l.len() - l.trim_start().len()])
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_ne!(fast, shipped.trim_end(), "the for: lines were shortened");
    let rules = dir.write("alerts.yml", &fast);
    Prometheus::start(dir, floodgate_http, Some(&rules))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_binary_and_fires_the_breaker_alert() {
    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES))]).start();
    let prom = start_prometheus(&dir, &fg.http);

    // Three failures open the payments breaker; two calls to api, one denied.
    let mut c = fg.client().await;
    for _ in 0..3 {
        let p = c.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner();
        let report = pb::ReportOutcomeRequest {
            resource: "payments".into(),
            permit_id: p.permit_id,
            outcome: pb::Outcome::Failure as i32,
            ..Default::default()
        };
        c.report_outcome(report).await.unwrap();
    }
    for _ in 0..2 {
        c.acquire(acquire("api", &[("user", "u1")], 1)).await.unwrap();
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let alert = loop {
        let body = get(&prom.addr, "/api/v1/alerts").unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let firing = v["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["labels"]["alertname"] == "FloodgateBreakerOpenTooLong" && a["state"] == "firing");
        if let Some(a) = firing {
            break a.clone();
        }
        assert!(Instant::now() < deadline, "the breaker alert never fired: {body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(alert["labels"]["resource"], "payments");
    assert_eq!(alert["labels"]["severity"], "warning");
    let summary = alert["annotations"]["summary"].as_str().unwrap();
    assert!(summary.starts_with("Breaker payments on 127.0.0.1:"), "{summary}");

    // Every query of the dashboard runs; the breaker and denial panels see
    // what happened.
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(deploy("grafana/floodgate.json")).unwrap()).unwrap();
    assert_eq!(dash["uid"], "floodgate");
    let mut results = std::collections::HashMap::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let q = expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$resource", ".*");
            results.insert(
                panel["title"].as_str().unwrap().to_string() + "/" + target["refId"].as_str().unwrap(),
                query(&prom, &q),
            );
        }
    }
    assert!(results.len() >= 20, "{} queries", results.len());
    let state = &results["Breaker state/A"]["data"]["result"];
    let payments = state.as_array().unwrap().iter().find(|s| s["metric"]["resource"] == "payments");
    assert_eq!(payments.map(|s| s["value"][1].clone()), Some(serde_json::json!("2")), "{state}");
    let keys = &results["Buckets held and --max-keys/B"]["data"]["result"][0]["value"][1];
    assert_eq!(keys, &serde_json::json!("10000000"), "floodgate_max_keys is the default --max-keys");
    let bytes = &results["Bucket key bytes and --max-key-bytes/B"]["data"]["result"][0]["value"][1];
    assert_eq!(bytes, &serde_json::json!("1073741824"), "floodgate_max_key_bytes is the default --max-key-bytes");
    let held = &results["Bucket key bytes and --max-key-bytes/A"]["data"]["result"][0]["value"][1];
    assert!(held.as_str().and_then(|b| b.parse::<u64>().ok()).is_some_and(|b| b > 0), "key bytes held: {held}");
}
