//! `floodgate recommend` through the real binary: a trace file in, a limit,
//! overrides and the replay of the trace out.

use crate::support;

use std::fmt::Write as _;
use std::process::Command;

use support::*;

/// Two days of 20 tenants: tenant i sends i+1 calls every minute, except a
/// peak of 4 (i+1) at noon; `heavy` sends 400 a minute; `storm` sends 10 a
/// minute, then 1,000 a minute in the last hour.
fn trace() -> String {
    let start = 1_767_571_200u64; // 2026-01-05T00:00Z
    let mut out = String::from("# unix_seconds,key,calls\n");
    for m in 0..2 * 1440u64 {
        let at = start + m * 60;
        for i in 0..20u64 {
            let calls = if m % 1440 == 720 { 4 * (i + 1) } else { i + 1 };
            writeln!(out, "{at},tenant=t{i:02},{calls}").unwrap();
        }
        writeln!(out, "{at},tenant=heavy,400").unwrap();
        let storm = if m >= 2 * 1440 - 60 { 1000 } else { 10 };
        writeln!(out, "{at},tenant=storm,{storm}").unwrap();
    }
    out
}

#[test]
fn recommend_proposes_a_limit_and_replays_the_trace() {
    let dir = TempDir::new();
    let file = dir.write("calls.csv", &trace());
    let out = Command::new(BIN)
        .args([
            "recommend",
            "--json",
            "--quantile",
            "0.9",
            "--headroom",
            "1.5",
            "--algorithm",
            "fixed-window",
            "--trace",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 22 keys' typical peaks: 4, 8, ..., 80 for the tenants, 400 for heavy,
    // and 10 for the storm (its peaks are 10 and 1,000; the median of two
    // days is the lower one).
    assert_eq!(v["keys"], 22);
    // The 0.9 quantile of 22 peaks is the one at index round(21 x 0.9) =
    // 19 of the sorted list: 76; times 1.5, 114.
    assert_eq!(v["per_minute"], 114, "{v}");
    // Heavier keys: heavy (400 x 1.5) and t19 (80 x 1.5).
    assert_eq!(v["overrides"], serde_json::json!({"tenant=heavy": 600, "tenant=t19": 120}), "{v}");
    // The replay: only the storm's last hour is denied, 886 a minute.
    let replay = &v["replay"];
    assert_eq!(replay["denied"], 60 * 886, "{v}");
    assert_eq!(replay["keys"][0]["key"], "tenant=storm");
    assert_eq!(replay["keys"][0]["denied"], 60 * 886);

    // The text form says the same.
    let out = Command::new(BIN).args(["recommend", "--quantile", "0.9", "--trace"]).arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Proposed limit: 114 calls a minute"), "{text}");
    assert!(text.contains("600  tenant=heavy"), "{text}");
    // The rules it prints are a resource's limits and overrides that
    // check-config accepts.
    let (_, snippet) = text.split_once("As rules (the limit's name and key are yours to set):\n").expect(&text);
    let snippet = snippet.split("\n\n").next().unwrap();
    assert!(snippet.contains("{ when: { 'tenant': 'heavy' }, limits: { recommended: 600 } }"), "{snippet}");
    let rules = dir.write("recommended.yaml", &format!("resources:\n  - name: api\n{snippet}\n"));
    let out = Command::new(BIN).arg("check-config").arg(&rules).output().unwrap();
    assert!(out.status.success(), "{snippet}\n{}", String::from_utf8_lossy(&out.stderr));

    // Values YAML would read as numbers, booleans or nothing stay text.
    let odd = trace().replace("tenant=heavy", "tenant=0x10").replace("tenant=t19", "tenant=null");
    let odd_file = dir.write("odd.csv", &odd);
    let out = Command::new(BIN).args(["recommend", "--quantile", "0.9", "--trace"]).arg(&odd_file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("{ when: { 'tenant': '0x10' }, limits: { recommended: 600 } }"), "{text}");
    assert!(text.contains("{ when: { 'tenant': 'null' }, limits: { recommended: 120 } }"), "{text}");
    let (_, snippet) = text.split_once("set):\n").expect(&text);
    let rules =
        dir.write("odd.yaml", &format!("resources:\n  - name: api\n{}\n", snippet.split("\n\n").next().unwrap()));
    let out = Command::new(BIN).arg("check-config").arg(&rules).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Keys that are not name=value pairs get no rules, and the reason.
    let bare = dir.write("bare.csv", "1767571200,alice,5\n1767571200,bob,50\n");
    let out = Command::new(BIN).args(["recommend", "--quantile", "0", "--trace"]).arg(&bare).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(No rules printed: key 'alice' is not written name=value[,name=value...].)"), "{text}");

    // Guard rails: from a limit of 1,000 in force, it goes down by 20%.
    let out = Command::new(BIN)
        .args(["recommend", "--json", "--quantile", "0.9", "--current", "1000", "--trace"])
        .arg(&file)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["per_minute"].as_u64(), v["observed"].as_u64()), (Some(800), Some(114)), "{v}");
}

#[test]
fn recommend_refuses_bad_input_by_name() {
    let dir = TempDir::new();
    let run = |args: &[&str]| {
        let out = Command::new(BIN).arg("recommend").args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let bad = dir.write("bad.csv", "1767571200,tenant=a,5\n1767571260,tenant=a,many\n");
    let (code, err) = run(&["--trace", bad.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("line 2: calls 'many' is not a whole number"), "{err}");
    // A device without line ends is refused at its first line, not read whole.
    let (code, err) = run(&["--trace", "/dev/zero"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("line 1: the line is longer than 4096 bytes"), "{err}");
    let (code, err) = run(&["--trace", bad.to_str().unwrap(), "--headroom", "0.5"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("headroom 0.5 is not between 1 and 1000"), "{err}");
    let empty = dir.write("empty.csv", "# nothing\n");
    let (code, err) = run(&["--trace", empty.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("holds no calls"), "{err}");
    // A trace larger than --max-entries is refused.
    let two = dir.write("two.csv", "0,a,1\n60,a,1\n");
    let (code, err) = run(&["--trace", two.to_str().unwrap(), "--max-entries", "2"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("line 2: the history holds at most 2 pairs of a key and a minute"), "{err}");
}

const FLOW_RULES: &str = r#"
resources:
  - name: api
    limits:
      - { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 60, window: 1m }
      - { name: ceiling, key: [tenant], algorithm: fixed_window, limit: 5000, window: 1m, fixed: true }
"#;

/// Runs the binary with `args`: (success, stdout, stderr).
fn run_bin(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The per-tenant limit a tenant meets now, read with Peek.
async fn per_tenant_limit(fg: &Floodgate, tenant: &str) -> u64 {
    let mut admin = fg.admin().await;
    let peek = floodgate_proto::v1::PeekRequest {
        resource: "api".into(),
        descriptors: [("tenant".to_string(), tenant.to_string())].into(),
        limit: "per-tenant".into(),
    };
    admin.peek(peek).await.unwrap().into_inner().limits[0].limit
}

#[tokio::test]
async fn a_proposal_is_written_tried_in_shadow_applied_and_reverted_through_the_binary() {
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", FLOW_RULES);
    let calls = dir.write("calls.csv", &trace());
    let proposed = dir.path("proposed.yaml");
    let fg = floodgate().args(["--config", path_str(&rules)]).start();

    // The rules of the running server, saved as the docs say.
    let (ok, saved, err) = run_bin(&["rules", "--server", &fg.grpc, "get"]);
    assert!(ok, "{err}");
    let saved = dir.write("saved.yaml", &saved);
    // A limit marked fixed gets no proposal.
    let base = ["recommend", "--quantile", "0.9", "--trace", path_str(&calls), "--rules", path_str(&saved)];
    let (ok, _, err) = run_bin(&[&base[..], &["--limit", "api/ceiling"]].concat());
    assert!(!ok && err.contains("'api/ceiling' is marked fixed"), "{err}");

    // The proposal, from the limit in force (60 a minute): 76 x 1.5, the
    // two heavier tenants as overrides, written into a copy of the rules.
    let args = [&base[..], &["--limit", "api/per-tenant", "--write", path_str(&proposed)]].concat();
    let (ok, out, err) = run_bin(&args);
    assert!(ok, "{out}{err}");
    assert!(out.contains("Change to api/per-tenant: 60 -> 114 calls a minute"), "{out}");
    assert!(out.contains("Replay (fixed-window)"), "the limit's own algorithm: {out}");
    assert!(out.contains(&format!("floodgate rules what-if {}", proposed.display())), "{out}");
    let (ok, out, err) = run_bin(&["check-config", path_str(&proposed)]);
    assert!(ok, "{out}{err}");

    // In shadow first: the live rules still answer.
    let tenant = [("tenant", "heavy")];
    let (ok, out, err) =
        run_bin(&["rules", "--server", &fg.grpc, "what-if", path_str(&proposed), "--for", "2s", "--no-wait"]);
    assert!(ok, "{out}{err}");
    let mut client = fg.client().await;
    let mut allowed = 0;
    for _ in 0..100 {
        let r = client.acquire(acquire("api", &tenant, 1)).await.unwrap().into_inner();
        allowed += u32::from(r.verdict() == floodgate_proto::v1::Verdict::Allowed);
    }
    assert_eq!(allowed, 60, "the limit in force decides while the proposal is in shadow");
    let report = eventually("the what-if to finish", std::time::Duration::from_secs(10), || async {
        let (_, out, _) = run_bin(&["rules", "--server", &fg.grpc, "what-if-report"]);
        out.starts_with("what-if finished").then_some(out)
    })
    .await;
    let line = report.lines().find(|l| l.contains("per-tenant")).unwrap_or_default().to_string();
    let figures: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(figures[2..], ["100", "0", "0"], "the override of 600 would deny none of heavy's 100: {report}");

    // Approved: enforced. Then reverted with one command.
    let (ok, out, err) = run_bin(&["rules", "--server", &fg.grpc, "apply", path_str(&proposed)]);
    assert!(ok && out.contains("applied; version 2"), "{out}{err}");
    assert_eq!((per_tenant_limit(&fg, "heavy").await, per_tenant_limit(&fg, "t01").await), (600, 114));
    let (ok, out, err) = run_bin(&["rules", "--server", &fg.grpc, "revert"]);
    assert!(ok && out.contains("reverted to the rules of version 1; version 3 in force"), "{out}{err}");
    assert_eq!((per_tenant_limit(&fg, "heavy").await, per_tenant_limit(&fg, "t01").await), (60, 60));

    let logs = eventually("the audit lines", std::time::Duration::from_secs(5), || async {
        let logs = fg.logs();
        logs.contains("change=\"RevertRules\"").then_some(logs)
    })
    .await;
    let changes: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("admin change"))
        .filter_map(|l| l.split("change=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(changes, ["ApplyRules what_if", "ApplyRules", "RevertRules"], "{logs}");
}

const RECORDED_RULES: &str = r#"
resources:
  - name: api
    limits:
      - { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 1000, window: 1m, history: true }
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 1000, window: 1m }
"#;

#[tokio::test]
async fn the_server_records_traffic_and_recommend_proposes_from_it() {
    use floodgate_proto::v1 as pb;
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RECORDED_RULES);
    let proposed = dir.path("proposed.yaml");
    let fg = floodgate().args(["--config", path_str(&rules)]).start();
    // Nothing recorded yet: no proposal.
    let ask = pb::ProposeLimitRequest { resource: "api".into(), limit: "per-tenant".into(), ..Default::default() };
    let err = fg.admin().await.propose_limit(ask).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::FailedPrecondition, "'api/per-tenant' has recorded no calls yet")
    );
    // All of one burst in one minute: not too close to a minute's end.
    let second = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 60;
    if second > 45 {
        tokio::time::sleep(std::time::Duration::from_secs(61 - second)).await;
    }
    // Tenant ti calls 2 (i + 1) times, heavy 100 times.
    let mut client = fg.client().await;
    let mut calls: Vec<(String, u32)> = (0..10).map(|i| (format!("t{i}"), 2 * (i + 1))).collect();
    calls.push(("heavy".into(), 100));
    for (tenant, n) in &calls {
        for _ in 0..*n {
            let ask = acquire("api", &[("tenant", tenant.as_str()), ("user", "u")], 1);
            assert_eq!(client.acquire(ask).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
        }
    }

    // Through Admin: every key with today's peak, page by page.
    let mut admin = fg.admin().await;
    let mut seen = std::collections::BTreeMap::new();
    let mut page_token = String::new();
    let mut pages = 0;
    loop {
        let request = pb::GetTrafficRequest { resource: "api".into(), limit: "per-tenant".into(), page_token };
        let page = admin.get_traffic(request).await.unwrap().into_inner();
        assert_eq!((page.keys_recorded, page.calls_not_recorded), (11, 0));
        for k in page.keys {
            assert_eq!(k.days.len(), 1, "{k:?}");
            assert_eq!(k.days[0].day % 86_400, 0, "a day starts at midnight");
            seen.insert(k.key, k.days[0].calls);
        }
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(pages, 64);
    let expected: std::collections::BTreeMap<String, u32> =
        calls.iter().map(|(t, n)| (format!("tenant={t}"), *n)).collect();
    assert_eq!(seen, expected);
    // A limit without history, and a bad page, are refused by name.
    let request = pb::GetTrafficRequest { resource: "api".into(), limit: "per-user".into(), page_token: String::new() };
    let err = admin.get_traffic(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("'api/per-user' records no traffic (set history: true on it)"), "{}", err.message());
    let request = pb::GetTrafficRequest { resource: "api".into(), limit: "per-tenant".into(), page_token: "64".into() };
    let err = admin.get_traffic(request).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::InvalidArgument, "page_token: '64' is not a page of recorded traffic")
    );

    // recommend reads it with the server's rules. Typical peaks 2, 4, ...,
    // 20 and 100: the median (12) x 1.5 = 18; the limit in force (1000) may
    // fall by 99% at once; five keys are heavier than 18 x 1.5.
    let args = [
        "recommend",
        "--recorded",
        "--server",
        &fg.grpc,
        "--limit",
        "api/per-tenant",
        "--quantile",
        "0.5",
        "--max-decrease",
        "0.99",
        "--write",
        path_str(&proposed),
    ];
    let (ok, out, err) = run_bin(&args);
    assert!(ok, "{out}{err}");
    assert!(out.contains("Traffic: 11 keys"), "{out}");
    assert!(out.contains("Change to api/per-tenant: 1000 -> 18 calls a minute"), "{out}");
    assert!(out.contains("Overrides for 5 heavier keys:"), "{out}");
    assert!(out.contains("Replay (fixed-window) of each key's busiest minute of each day: 0 of 210 calls"), "{out}");

    // Admin.ProposeLimit makes the same proposal on the server, and writes
    // the same rules file.
    let ask = |quantile: Option<f64>, max_decrease: Option<f64>, limit: &str| pb::ProposeLimitRequest {
        resource: "api".into(),
        limit: limit.into(),
        quantile,
        headroom: None,
        max_decrease,
    };
    let got = admin.propose_limit(ask(Some(0.5), Some(0.99), "per-tenant")).await.unwrap().into_inner();
    assert_eq!((got.current_per_minute, got.per_minute, got.observed_per_minute), (1000, 18, 18));
    assert_eq!((got.keys, got.replayed_calls, got.replayed_denied, got.shared), (11, 210, 0, false));
    assert_eq!(got.algorithm, "fixed_window");
    let overrides: Vec<(&str, u64)> = got.overrides.iter().map(|o| (o.key.as_str(), o.per_minute)).collect();
    assert_eq!(
        overrides,
        [("tenant=heavy", 150), ("tenant=t6", 21), ("tenant=t7", 24), ("tenant=t8", 27), ("tenant=t9", 30)]
    );
    assert_eq!(got.rules_yaml, std::fs::read_to_string(&proposed).unwrap());
    assert_eq!((got.recorded_to - got.recorded_from) % 86_400, 0, "whole days");
    // The guard rail: by default the limit falls by at most 20% at once,
    // and the replay shows what that limit would deny.
    let got = admin.propose_limit(ask(Some(0.5), None, "per-tenant")).await.unwrap().into_inner();
    assert_eq!((got.per_minute, got.observed_per_minute), (800, 18));
    // Bad settings and limits are refused by name.
    let err = admin.propose_limit(ask(Some(2.0), None, "per-tenant")).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (tonic::Code::InvalidArgument, "quantile 2 is not between 0 and 1"));
    let err = admin.propose_limit(ask(None, Some(1.0), "per-tenant")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{}", err.message());
    let err = admin.propose_limit(ask(None, None, "per-user")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{}", err.message());
    let err = admin.propose_limit(ask(None, None, "")).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (tonic::Code::InvalidArgument, "limit: required"));

    // The console shows the same proposal, and tries it in shadow only
    // while it is still the one shown.
    let shown =
        fg.request("GET", "/api/v1/propose?resource=api&limit=per-tenant&quantile=0.5&max_decrease=0.99").send();
    assert_eq!(shown.status, 200, "{}", shown.text());
    let shown = shown.json();
    assert_eq!((shown["current"].as_u64(), shown["per_minute"].as_u64()), (Some(1000), Some(18)));
    assert_eq!(shown["overrides"].as_array().map(Vec::len), Some(5));
    assert_eq!(shown["rules_yaml"].as_str(), Some(std::fs::read_to_string(&proposed).unwrap().as_str()));
    let bad = fg.request("GET", "/api/v1/propose?resource=api&limit=per-tenant&quantile=abc").send();
    assert_eq!((bad.status, bad.json()["error"].as_str()), (400, Some("quantile: 'abc' is not a number")));
    let apply = |body: &str| {
        web::post(web::url(&fg.http, "/api/v1/propose/apply"), body.to_string())
            .header("Content-Type", "application/json")
            .send()
    };
    let shown_print = shown["fingerprint"].as_str().unwrap().to_string();
    let body = |print: &str| {
        format!(
            r#"{{"resource":"api","limit":"per-tenant","quantile":0.5,"max_decrease":0.99,"fingerprint":"{print}","what_if_seconds":60}}"#
        )
    };
    let stale = apply(&body("0000000000000000"));
    assert_eq!(
        (stale.status, stale.json()["error"].as_str()),
        (
            409,
            Some("the proposal changed since it was shown (now 18 calls a minute and 5 overrides): look at it again")
        )
    );
    let tried = apply(&body(&shown_print));
    assert_eq!(tried.status, 200, "{}", tried.text());
    assert!(tried.json()["what_if_until"].as_u64().is_some());
    // The audit line reaches the log a moment after the answer.
    let line = "change=\"ApplyRules what_if (console proposal)\" resource=\"api\" limit=\"per-tenant\" per_minute=18";
    eventually("the audit line of the console's proposal", std::time::Duration::from_secs(5), || async {
        fg.logs().contains(line).then_some(())
    })
    .await;

    let (ok, out, err) = run_bin(&["rules", "--server", &fg.grpc, "apply", path_str(&proposed)]);
    assert!(ok, "{out}{err}");
    let limit_of = |tenant: &str| {
        let mut admin = admin.clone();
        let peek = pb::PeekRequest {
            resource: "api".into(),
            descriptors: [("tenant".to_string(), tenant.to_string()), ("user".to_string(), "u".to_string())].into(),
            limit: "per-tenant".into(),
        };
        async move { admin.peek(peek).await.unwrap().into_inner().limits[0].limit }
    };
    assert_eq!((limit_of("heavy").await, limit_of("t0").await, limit_of("t9").await), (150, 18, 30));
    // The history goes on across the apply: the same limit keeps its record.
    let request =
        pb::GetTrafficRequest { resource: "api".into(), limit: "per-tenant".into(), page_token: String::new() };
    assert_eq!(admin.get_traffic(request).await.unwrap().into_inner().keys_recorded, 11);

    let (ok, _, err) = run_bin(&["recommend", "--recorded", "--server", &fg.grpc, "--limit", "api/per-user"]);
    assert!(!ok && err.contains("records no traffic"), "{err}");

    // A call of cost 7 is 7 units in the record, as the limit counts it.
    let ask = acquire("api", &[("tenant", "bulk"), ("user", "u")], 7);
    assert_eq!(client.acquire(ask).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    let mut bulk = None;
    for page in 0..64 {
        let request =
            pb::GetTrafficRequest { resource: "api".into(), limit: "per-tenant".into(), page_token: page.to_string() };
        let page = admin.get_traffic(request).await.unwrap().into_inner();
        bulk = bulk.or(page.keys.into_iter().find(|k| k.key == "tenant=bulk"));
    }
    assert_eq!(bulk.map(|k| k.days[0].calls), Some(7));
}

#[tokio::test]
async fn recommend_refuses_what_it_cannot_write_and_leaves_the_operators_overrides() {
    let dir = TempDir::new();
    let rules = dir.write(
        "rules.yaml",
        r#"
resources:
  - name: api
    limits:
      - { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 60, window: 1m }
      - { name: all, algorithm: fixed_window, limit: 6000, window: 1m }
    overrides:
      - { when: { tenant: heavy }, tier: big }
  - name: 'pay.*'
    limits: [ { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 60, window: 1m, history: true } ]
tiers:
  big: [ { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 10000, window: 1m } ]
"#,
    );
    let calls = dir.write("calls.csv", &trace());
    let out = dir.path("out.yaml");
    let base = ["recommend", "--quantile", "0.9", "--trace", path_str(&calls), "--rules", path_str(&rules)];
    // A pattern, a limit of no key, and a trace of another key: refused,
    // nothing written.
    for (limit, why) in [("pay.*/per-tenant", "is a pattern"), ("api/all", "has no key")] {
        let (ok, _, err) = run_bin(&[&base[..], &["--limit", limit, "--write", path_str(&out)]].concat());
        assert!(!ok && err.contains(why), "{limit}: {err}");
    }
    let users = dir.write("users.csv", "1767571200,user=ann,5\n");
    let args = ["recommend", "--trace", path_str(&users), "--rules", path_str(&rules), "--limit", "api/per-tenant"];
    let (ok, _, err) = run_bin(&[&args[..], &["--write", path_str(&out)]].concat());
    assert!(!ok && err.contains("does not name the limit's key"), "{err}");
    assert!(!out.exists());
    // Never onto the rules file itself: it is unchanged.
    let (ok, _, err) = run_bin(&[&base[..], &["--limit", "api/per-tenant", "--write", path_str(&rules)]].concat());
    assert!(!ok && err.contains("is the --rules file"), "{err}");
    assert!(std::fs::read_to_string(&rules).unwrap().contains("tier: big"));
    // heavy's calls are decided by the operator's tier: its override stays
    // the only one for heavy, and the output says so.
    let (ok, text, err) = run_bin(&[&base[..], &["--limit", "api/per-tenant", "--write", path_str(&out)]].concat());
    assert!(ok, "{text}{err}");
    assert!(text.contains("tenant=heavy keeps the override the rules file has for it"), "{text}");
    let written: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let overrides = written["resources"][0]["overrides"].as_sequence().unwrap();
    let heavy: Vec<_> = overrides.iter().filter(|o| o["when"]["tenant"] == "heavy").collect();
    assert_eq!((heavy.len(), heavy[0]["tier"].as_str()), (1, Some("big")));
    assert!(overrides.iter().any(|o| o["when"]["tenant"] == "t19"), "{overrides:?}");

    // --recorded on a pattern rule: refused by name, not a crash.
    let fg = floodgate().args(["--config", path_str(&rules)]).start();
    let mut client = fg.client().await;
    client.acquire(acquire("pay.card", &[("tenant", "a")], 1)).await.unwrap();
    let args = ["recommend", "--recorded", "--server", &fg.grpc, "--limit", "pay.*/per-tenant", "--write"];
    let (ok, _, err) = run_bin(&[&args[..], &[path_str(&out)]].concat());
    assert!(!ok && err.contains("is a pattern"), "{err}");
}

/// `n` calls of `tenant` to api through `fg`, each admitted.
async fn send(fg: &Floodgate, tenant: &str, n: u32) {
    use floodgate_proto::v1 as pb;
    let mut client = fg.client().await;
    for _ in 0..n {
        let ask = acquire("api", &[("tenant", tenant), ("user", "u")], 1);
        let answer = client.acquire(ask).await.unwrap().into_inner();
        assert_eq!(answer.verdict(), pb::Verdict::Allowed, "{answer:?}");
    }
}

/// Every key of `fg`'s record of api/per-tenant, through Admin: (key,
/// calls in its busiest minute today) and whether every page was the
/// fleet's (read from Redis).
async fn recorded_today(fg: &Floodgate) -> (std::collections::BTreeMap<String, u32>, bool) {
    use floodgate_proto::v1 as pb;
    let mut admin = fg.admin().await;
    let (mut seen, mut shared) = (std::collections::BTreeMap::new(), true);
    let mut page_token = String::new();
    loop {
        let request = pb::GetTrafficRequest { resource: "api".into(), limit: "per-tenant".into(), page_token };
        let page = admin.get_traffic(request).await.unwrap().into_inner();
        shared &= page.shared;
        for k in page.keys {
            seen.insert(k.key, k.days.last().map_or(0, |d| d.calls));
        }
        if page.next_page_token.is_empty() {
            return (seen, shared);
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_record_one_traffic_in_redis_and_a_new_replica_reads_it() {
    let redis = support::redis::RedisServer::start();
    let url = redis.url();
    one_record_of_two_replicas(&["--redis", &url], redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_record_one_traffic_in_a_redis_cluster() {
    let cluster = support::redis::RedisCluster::start();
    let seeds = cluster.seeds();
    one_record_of_two_replicas(&["--redis-cluster", &seeds], cluster).await;
}

/// Two replicas on `redis` (started with `backend`, dropped to stop it) add
/// to one record; a third started later reads it.
async fn one_record_of_two_replicas(backend: &[&str], redis: impl Sized) {
    use floodgate_proto::v1 as pb;
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RECORDED_RULES);
    let replica = || {
        let mut args = vec!["--config", path_str(&rules), "--sync-interval", "100ms"];
        args.extend_from_slice(backend);
        floodgate().args(args).start()
    };
    let (mut a, b) = (replica(), replica());
    // Each sees the other before the calls: a replica alone leases all of
    // a replicated limit, and the other's first calls would wait for it.
    tokio::task::block_in_place(|| {
        wait_live(&a, 2);
        wait_live(&b, 2);
    });
    // All calls in one minute: not too close to a minute's end.
    let second = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 60;
    if second > 40 {
        tokio::time::sleep(Duration::from_secs(61 - second)).await;
    }
    // One tenant calls both replicas (30 + 20), another only B (5).
    send(&a, "t1", 30).await;
    send(&b, "t1", 20).await;
    send(&b, "t2", 5).await;
    // Each replica's own record holds its own calls only.
    let (own, shared) = {
        let mut admin = a.admin().await;
        let mut all = BTreeMap::new();
        let mut shared = false;
        for page in 0..64 {
            let request = pb::GetTrafficRequest {
                resource: "api".into(),
                limit: "per-tenant".into(),
                page_token: page.to_string(),
            };
            let got = admin.get_traffic(request).await.unwrap().into_inner();
            assert_eq!(got.keys_recorded, 1, "A recorded t1 only");
            shared |= got.shared;
            all.extend(got.keys.into_iter().map(|k| (k.key, k.days[0].calls)));
        }
        (all, shared)
    };
    assert!(shared, "with Redis the pages are the fleet's");
    // Redis sums the two replicas' calls of the minute, within a few sends.
    let expected: BTreeMap<String, u32> = [("tenant=t1".to_string(), 50), ("tenant=t2".to_string(), 5)].into();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (seen, shared) = recorded_today(&a).await;
        if seen == expected && shared {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A reads {seen:?} (shared: {shared}), not the fleet's {expected:?}; own {own:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Calls just before a replica stops are sent as it stops.
    send(&a, "t3", 3).await;
    a.terminate();
    drop(b);
    // A replica that starts afterwards reads what both recorded.
    let c = replica();
    let (seen, shared) = recorded_today(&c).await;
    let mut expected = expected;
    expected.insert("tenant=t3".into(), 3);
    assert_eq!((seen, shared), (expected, true));
    // recommend proposes from it: 3 keys, and no note of a partial record.
    let args = ["recommend", "--recorded", "--server", &c.grpc, "--limit", "api/per-tenant"];
    let (ok, out, err) = run_bin(&args);
    assert!(ok, "{out}{err}");
    assert!(out.contains("Traffic: 3 keys"), "{out}");
    assert!(!err.contains("the server's own"), "{err}");
    // Without Redis a replica answers with its own record (empty here), not
    // an error, and recommend says whose record it read.
    drop(redis);
    let (seen, shared) = recorded_today(&c).await;
    assert_eq!((seen.len(), shared), (0, false));
    let (_, _, err) = run_bin(&args);
    assert!(err.contains("note: the record is the server's own: it has no Redis, or Redis did not answer"), "{err}");
}

/// A call denied by a replica's lease and decided again after a sync (a
/// larger lease) is one call in the record, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_decided_again_after_a_sync_is_recorded_once() {
    use std::time::{Duration, Instant};
    let redis = support::redis::RedisServer::start();
    let url = redis.url();
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RECORDED_RULES);
    let replica =
        || floodgate().args(["--config", path_str(&rules), "--redis", &url, "--sync-interval", "100ms"]).start();
    let (a, b) = (replica(), replica());
    tokio::task::block_in_place(|| {
        wait_live(&a, 2);
        wait_live(&b, 2);
    });
    let second = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 60;
    if second > 40 {
        tokio::time::sleep(Duration::from_secs(61 - second)).await;
    }
    // 1,500 calls of one tenant to A, 50 at a time: A's lease (half of
    // 1000) runs out and calls are decided again after a sync.
    let args =
        ["bench", "--server", &a.grpc, "--resource", "api", "--key-descriptor", "tenant", "-n", "1500", "-c", "50"];
    let (ok, out, err) = tokio::task::block_in_place(|| run_bin(&args));
    assert!(ok, "{out}{err}");
    let escalated = a.metrics().series("floodgate_redis_escalations_total").unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (seen, _) = recorded_today(&a).await;
        let got = seen.get("tenant=k0").copied().unwrap_or(0);
        if got == 1500 {
            break;
        }
        assert!(got <= 1500, "{got} calls recorded of 1500 ({escalated} escalations)");
        assert!(Instant::now() < deadline, "the record never reached 1500 (at {got})");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(escalated > 0.0, "no call was decided again: the test shows nothing");
}
