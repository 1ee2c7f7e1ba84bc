//! The console in a real browser: Chromium, driven by playwright-core
//! (tests/browser/console.cjs), against the real binary. It asks for a
//! token, shows a breaker, sees it open live as failures are reported, is
//! refused the reset with a read token and resets it with an admin token.
//! Then the console's HTTP API on its own: who may read and act, and the
//! headers that keep the page to itself.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use floodgate_proto::v1 as pb;
use support::*;
use tonic::metadata::MetadataValue;

const RULES: &str = r#"
resources:
  - name: payments
    breaker:
      window: { kind: count, size: 10 }
      minimum_calls: 3
      failure_rate_threshold: 0.5
      wait_in_open: 1h
  - name: orders
    limits:
      - { name: global, algorithm: fixed_window, limit: 100, window: 1h }
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 1, window: 1h }
"#;
const ADMIN: &str = "console-admin-token-0123456789";
const READER: &str = "console-reader-token-0123456789";

fn start() -> (Floodgate, TempDir) {
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RULES);
    let tokens = dir.write("tokens", &format!("{ADMIN} admin alice\n{READER} read grafana\n"));
    let fg = Floodgate::start(&["--config", path_str(&rules), "--admin-token-file", path_str(&tokens)]);
    (fg, dir)
}

/// One call to payments and its outcome; false when the breaker refused it.
async fn report(
    c: &mut pb::floodgate_client::FloodgateClient<tonic::transport::Channel>,
    outcome: pb::Outcome,
) -> bool {
    let p = c.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner();
    if p.verdict() != pb::Verdict::Allowed {
        return false;
    }
    let r = pb::ReportOutcomeRequest {
        resource: "payments".into(),
        permit_id: p.permit_id,
        outcome: outcome as i32,
        ..Default::default()
    };
    c.report_outcome(r).await.unwrap();
    true
}

async fn breaker_state(fg: &Floodgate) -> pb::BreakerState {
    let mut admin = fg.admin().await;
    let mut req = tonic::Request::new(pb::GetBreakerRequest { resource: "payments".into() });
    let bearer: MetadataValue<_> = format!("Bearer {ADMIN}").parse().unwrap();
    req.metadata_mut().insert("authorization", bearer);
    admin.get_breaker(req).await.unwrap().into_inner().state()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_breaker_open_live_and_resets_it_only_with_an_admin_token() {
    let (fg, dir) = start();
    let mut c = fg.client().await;
    assert!(report(&mut c, pb::Outcome::Success).await);
    for u in ["u1", "u1", "u2"] {
        c.acquire(acquire("orders", &[("user", u)], 1)).await.unwrap();
    }

    let shot = std::env::var("FLOODGATE_CONSOLE_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.path("console.png"));
    let mut node = Command::new("node")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/browser/console.cjs"))
        .args([&format!("http://{}/", fg.http), READER, ADMIN, path_str(&shot)])
        .env("NODE_PATH", test_cache().join("npm/node_modules"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node (scripts/test installs it)");
    let (tx, rx) = mpsc::channel();
    let stdout = node.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut stdin = node.stdin.take().unwrap();
    // The script's errors go to this test's stderr.
    let expect = |word: &str| match rx.recv_timeout(Duration::from_secs(90)) {
        Ok(line) => assert_eq!(line, word),
        Err(_) => panic!("the browser never said {word}; server logs:\n{}", fg.logs()),
    };

    expect("NEEDS_TOKEN");
    expect("READY");
    // Failures until the breaker refuses calls (it opens on the second).
    let mut failures = 0;
    while report(&mut c, pb::Outcome::Failure).await {
        failures += 1;
        assert!(failures < 10, "the breaker never opened");
    }
    expect("SAW_OPEN");
    expect("REFUSED");
    assert_eq!(breaker_state(&fg).await, pb::BreakerState::Open, "the refused reset changed nothing");
    stdin.write_all(b"CONTINUE\n").unwrap();
    expect("RESET");
    expect("DONE");
    let status = node.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(breaker_state(&fg).await, pb::BreakerState::Closed, "reset for real, through the console");
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a screenshot");
    let logs = eventually("the audit line", Duration::from_secs(5), || async {
        let logs = fg.logs();
        logs.contains("SetBreakerState (console)").then_some(logs)
    })
    .await;
    assert!(logs.contains("who=\"token:alice\""), "{logs}");
    assert!(logs.contains("console action refused"), "the read token's attempt is in the audit log");
}

/// A raw HTTP/1.1 exchange: (status, headers, body).
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String, String) {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[tokio::test]
async fn the_console_api_asks_for_the_admin_roles_and_the_page_keeps_to_itself() {
    let (fg, _dir) = start();
    let (status, head, page) = http(&fg.http, "GET", "/", None, "");
    assert_eq!(status, 200);
    assert!(page.contains("<title>Floodgate</title>"));
    assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{head}");
    assert!(head.contains("frame-ancestors 'none'") && head.contains("x-content-type-options: nosniff"), "{head}");
    assert_eq!(http(&fg.http, "GET", "/console.js", None, "").0, 200);

    let (status, _, body) = http(&fg.http, "GET", "/api/v1/console", None, "");
    assert_eq!(status, 401, "{body}");
    let (status, _, body) = http(&fg.http, "GET", "/api/v1/console", Some(READER), "");
    assert_eq!(status, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["resources"][1]["limits"][0]["global"], serde_json::json!({ "limit": 100, "remaining": 100 }));
    assert_eq!(state["replication"]["mode"], "memory");

    let reset = r#"{"state":"CLOSED"}"#;
    assert_eq!(http(&fg.http, "POST", "/api/v1/breakers/payments/state", None, reset).0, 401);
    assert_eq!(http(&fg.http, "POST", "/api/v1/breakers/payments/state", Some(READER), reset).0, 403);
    let (status, _, body) =
        http(&fg.http, "POST", "/api/v1/breakers/payments/state", Some(ADMIN), r#"{"state":"OPEN"}"#);
    assert_eq!(
        (status, body.as_str()),
        (400, r#"{"error":"state: 'OPEN' is not CLOSED, FORCED_OPEN, DISABLED or METRICS_ONLY"}"#)
    );
    let (status, _, body) = http(&fg.http, "POST", "/api/v1/breakers/nope/state", Some(ADMIN), reset);
    assert_eq!(status, 404, "{body}");
    let (status, _, body) = http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), r#"{"level":2}"#);
    assert_eq!((status, body.as_str()), (200, r#"{"automatic":0,"level":2,"manual":true}"#));
    let big = format!(r#"{{"level":1,"pad":"{}"}}"#, "x".repeat(10_000));
    assert_eq!(http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), &big).0, 413);
    assert_eq!(http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), "not json").0, 400);
}
