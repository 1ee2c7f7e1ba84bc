//! The console in a real browser: Chromium, driven by playwright-core
//! (tests/browser/console.cjs), against the real binary. It asks for a
//! token, shows a breaker, sees it open live as failures are reported, is
//! refused the reset with a read token and resets it with an admin token.
//! Then the console's HTTP API on its own: who may read and act, and the
//! headers that keep the page to itself.

use crate::support;

use std::time::Duration;

use floodgate_proto::v1 as pb;
use support::browser::Browser;
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
  - name: db
    concurrency:
      adaptive: { algorithm: aimd, min: 1, max: 100, initial: 10, window: 100ms, min_samples: 1, probe: off }
  - name: api
    limits:
      - { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 1000, window: 1m, history: true }
systems:
  - { name: shop, resources: [orders] }
"#;
const ADMIN: &str = "console-admin-token-0123456789";
const READER: &str = "console-reader-token-0123456789";

/// Eight more readers, each its own caller.
fn readers() -> Vec<String> {
    (0..8).map(|i| format!("reader-{i}-token-0123456789")).collect()
}

fn tokens_file(with_grafana: bool) -> String {
    let mut text = format!("{ADMIN} admin alice\n");
    if with_grafana {
        text += &format!("{READER} read grafana\n");
    }
    for (i, t) in readers().iter().enumerate() {
        text += &format!("{t} read reader{i}\n");
    }
    text
}

/// The console's server: its rules and its tokens file (`tokens`, in `fg.dir()`).
fn server() -> FloodgateBuilder {
    floodgate().rules(RULES).file("--admin-token-file", "tokens", &tokens_file(true))
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
    let fg = server().start();
    let dir = fg.dir();
    let mut c = fg.client().await;
    assert!(report(&mut c, pb::Outcome::Success).await);
    for u in ["u1", "u1", "u2"] {
        c.acquire(acquire("orders", &[("user", u)], 1)).await.unwrap();
    }
    // An adaptive limit with a few windows for the chart: calls reported
    // across five windows of 100 ms.
    for _ in 0..5 {
        let permits: Vec<String> = futures_util::future::join_all((0..6).map(|_| {
            let mut c = c.clone();
            async move { c.acquire(acquire("db", &[], 1)).await.unwrap().into_inner().permit_id }
        }))
        .await;
        tokio::time::sleep(Duration::from_millis(120)).await;
        for p in permits {
            let r = pb::ReportOutcomeRequest {
                resource: "db".into(),
                permit_id: p,
                outcome: pb::Outcome::Success as i32,
                ..Default::default()
            };
            c.report_outcome(r).await.unwrap();
        }
    }

    let shot = std::env::var("FLOODGATE_CONSOLE_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.path("console.png"));
    let mut browser = Browser::start("console.cjs", &[&format!("http://{}/", fg.http), READER, ADMIN, path_str(&shot)]);
    let expect = |browser: &Browser, word: &str| assert_eq!(browser.line(&fg), word);

    expect(&browser, "NEEDS_TOKEN");
    expect(&browser, "READY");
    expect(&browser, "SAW_CONCURRENCY");
    // Failures until the breaker refuses calls (it opens on the second).
    let mut failures = 0;
    while report(&mut c, pb::Outcome::Failure).await {
        failures += 1;
        assert!(failures < 10, "the breaker never opened");
    }
    expect(&browser, "SAW_OPEN");
    expect(&browser, "REFUSED");
    assert_eq!(breaker_state(&fg).await, pb::BreakerState::Open, "the refused reset changed nothing");
    browser.go_on();
    expect(&browser, "RESET");
    // A rules file the server refuses: the page's banner, and the same in
    // the console's API, until a good file is installed.
    std::fs::write(fg.rules_file(), RULES.replace("limit: 100, window: 1h", "limit: many, window: 1h")).unwrap();
    browser.go_on();
    expect(&browser, "SAW_REFUSED");
    let (_, _, body) = http(&fg.http, "GET", "/api/v1/console", Some(READER), "");
    let console: serde_json::Value = serde_json::from_str(&body).unwrap();
    let refused = &console["rules_refused"][0];
    assert!(refused["source"].as_str().unwrap_or_default().ends_with("rules.yaml"), "{refused}");
    assert!(refused["error"].as_str().unwrap_or_default().contains("'global'.limit"), "{refused}");
    std::fs::write(fg.rules_file(), RULES).unwrap();
    browser.go_on();
    expect(&browser, "BANNER_GONE");
    let (_, _, body) = http(&fg.http, "GET", "/api/v1/console", Some(READER), "");
    let console: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(console["rules_refused"], serde_json::json!([]), "a good file clears the banner");
    // Other rules applied through the JSON API; the page puts the file's back.
    let extra = RULES.replace("limit: 100, window: 1h", "limit: 200, window: 1h");
    let body = serde_json::json!({ "yaml": extra }).to_string();
    let (status, _, answer) = http(&fg.http, "POST", "/v1/admin/apply-rules", Some(ADMIN), &body);
    assert_eq!(status, 200, "{answer}");
    let rules = || {
        let (status, _, answer) = http(&fg.http, "POST", "/v1/admin/get-rules", Some(READER), "{}");
        assert_eq!(status, 200, "{answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        (
            v["yaml"].as_str().unwrap_or_default().to_string(),
            v["version"].as_str().unwrap_or_default().parse::<u64>().unwrap(),
        )
    };
    let before = rules();
    assert_eq!(before.0, extra);
    browser.go_on();
    expect(&browser, "REVERTED");
    assert_eq!(rules(), (RULES.to_string(), before.1 + 1), "the file's rules are back");
    // Traffic on a limit with history: the page proposes a limit from it
    // and tries the proposal in shadow.
    for (tenant, n) in [("a", 4), ("b", 6), ("c", 8)] {
        for _ in 0..n {
            c.acquire(acquire("api", &[("tenant", tenant)], 1)).await.unwrap();
        }
    }
    browser.go_on();
    expect(&browser, "PROPOSED");
    expect(&browser, "SHADOWED");
    expect(&browser, "DONE");
    browser.finish();
    assert_eq!(breaker_state(&fg).await, pb::BreakerState::Closed, "reset for real, through the console");
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a screenshot");
    let logs = eventually("the audit line", Duration::from_secs(5), || async {
        let logs = fg.logs();
        let both = logs.contains("SetBreakerState (console)") && logs.contains("ApplyRules what_if (console proposal)");
        both.then_some(logs)
    })
    .await;
    assert!(logs.contains("who=\"token:alice\""), "{logs}");
    assert!(logs.contains("change=\"ApplyRules what_if (console proposal)\" resource=\"api\""), "{logs}");
    assert!(logs.contains("console action refused"), "the read token's attempt is in the audit log");
    assert!(logs.contains("change=\"RevertRules (console)\""), "{logs}");
}

/// An HTTP/1.1 exchange with a JSON body: (status, head lower-cased, body).
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String, String) {
    let answer = web::Request::new(method, web::url(addr, path))
        .bearer(token)
        .header("content-type", "application/json")
        .header("connection", "close")
        .body(body)
        .send();
    (answer.status, answer.head().to_ascii_lowercase(), answer.text())
}

#[tokio::test]
async fn the_console_api_asks_for_the_admin_roles_and_the_page_keeps_to_itself() {
    let fg = server().start();
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
    assert_eq!(
        state["resources"][1]["limits"][0]["global"],
        serde_json::json!({ "limit": 100, "remaining": 100, "from_redis": false })
    );
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
    assert_eq!((status, body.as_str()), (200, r#"{"automatic":0,"level":2,"manual":true,"system":""}"#));
    let big = format!(r#"{{"level":1,"pad":"{}"}}"#, "x".repeat(10_000));
    assert_eq!(http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), &big).0, 413);
    assert_eq!(http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), "not json").0, 400);
    // One system's level; the console shows each system and why.
    let (status, _, body) = http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), r#"{"level":3,"system":"shop"}"#);
    assert_eq!((status, body.as_str()), (200, r#"{"automatic":0,"level":3,"manual":true,"system":"shop"}"#));
    let (status, _, body) = http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), r#"{"level":3,"system":"nope"}"#);
    assert_eq!((status, body.as_str()), (400, r#"{"error":"system: 'nope' is not a system of the rules in force"}"#));
    let (status, _, body) = http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), r#"{"level":1,"system":7}"#);
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = http(&fg.http, "GET", "/api/v1/console", Some(READER), "");
    assert_eq!(status, 200, "{body}");
    let console: serde_json::Value = serde_json::from_str(&body).unwrap();
    let shop = &console["systems"][0];
    assert_eq!(
        (shop["system"].as_str(), shop["level"].as_u64(), shop["manual"].as_bool()),
        (Some("shop"), Some(3), Some(true))
    );
    assert_eq!(console["level"]["level"], 2, "the global scope kept its own level");

    // A level and "automatic" at once, an unknown field, a parameter twice:
    // refused, naming what is wrong, and nothing changed.
    for (body, says) in [
        (r#"{"level":1,"automatic":true}"#, "level: 1 with automatic: true"),
        (r#"{"level":1,"automatic":"yes"}"#, "is not true or false"),
        (r#"{"level":1,"levle":2}"#, "'levle' is not a field"),
        (r#"{"level":2,"level":3}"#, "level: given more than once"),
        (r#"{"level":1,"lev\u0065l":3}"#, "level: given more than once"),
        (r#"{"level":1,"every_system":"yes"}"#, "every_system: \\\"yes\\\" is not true or false"),
        (r#"{"level":1,"system":null}"#, "system: null is not a system name"),
        (r#"{"level":null,"automatic":true}"#, "with automatic: true"),
        (r#"[{"level":2}]"#, "expected a JSON object"),
    ] {
        let (status, _, answer) = http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer}");
    }
    let (status, _, answer) = http(
        &fg.http,
        "POST",
        "/api/v1/breakers/payments/state",
        Some(ADMIN),
        r#"{"state":"FORCED_OPEN","state":"CLOSED"}"#,
    );
    assert_eq!((status, answer.contains("state: given more than once")), (400, true), "{answer}");
    let (status, _, answer) =
        http(&fg.http, "POST", "/api/v1/breakers/payments/state", Some(ADMIN), r#"{"state":"CLOSED","x":1}"#);
    assert_eq!((status, answer.contains("'x' is not a field (state)")), (400, true), "{answer}");
    for path in ["/api/v1/console?resource_count=1&resource_count=500", "/api/v1/series?top=1&top=2"] {
        let (status, _, answer) = http(&fg.http, "GET", path, Some(READER), "");
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(answer.contains("given more than once"), "{path}: {answer}");
    }
    let (status, _, answer) = http(&fg.http, "GET", "/api/v1/events?top=1", Some(READER), "");
    assert_eq!((status, answer.contains("'top' is not a parameter")), (400, true), "{answer}");
    let (_, _, body) = http(&fg.http, "GET", "/api/v1/console", Some(READER), "");
    let console: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((console["level"]["level"].as_u64(), console["level"]["manual"].as_bool()), (Some(2), Some(true)));

    // Refused reads are in the audit log too, and a flood of them is not.
    for _ in 0..200 {
        assert_eq!(http(&fg.http, "GET", "/api/v1/series", Some("not-a-token-0123456789"), "").0, 401);
    }
    let logs = fg.logs();
    let refused = logs.lines().filter(|l| l.contains("console read refused")).count();
    assert!((1..=60).contains(&refused), "{refused} lines for 200 refusals (at most 10 a second)");
    assert!(logs.contains("the bearer token is not valid"), "{logs}");
}

/// The level and the payments breaker's state, as Admin reads them.
async fn level_and_breaker(fg: &Floodgate) -> (u64, pb::BreakerState) {
    let mut admin = fg.admin().await;
    let (status, body) = fg.http_get("/api/v1/console");
    assert_eq!(status, 200, "{body}");
    let level = serde_json::from_str::<serde_json::Value>(&body).unwrap()["level"]["level"].as_u64().unwrap();
    let breaker = admin.get_breaker(pb::GetBreakerRequest { resource: "payments".into() }).await.unwrap();
    (level, breaker.into_inner().state())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sites_page_in_a_real_browser_cannot_act_through_the_console_or_read_it_by_rebinding() {
    // No token file: loopback is the credential, as by default.
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RULES);
    let fg = floodgate().args(["--config", path_str(&rules), "--http-host", "floodgate.test"]).start();
    let port = fg.http.rsplit(':').next().unwrap().to_string();
    let mut browser = Browser::start("cross_site.cjs", &[&port]);
    let next = |browser: &Browser| browser.line(&fg);
    assert_eq!(next(&browser), "OWN_PAGE_ACTS");
    let attacked = next(&browser);
    assert!(attacked.starts_with("ATTACKED "), "{attacked}");
    // The CORS fetch never gets past its preflight; the others reach the server.
    assert!(attacked.contains("/api/v1/level blocked"), "{attacked}");
    assert_eq!(level_and_breaker(&fg).await, (1, pb::BreakerState::Closed), "{attacked}");
    let logs = fg.logs();
    assert!(logs.contains("Content-Type: an action must be sent as application/json"), "refused, not unsent: {logs}");
    browser.go_on();
    assert_eq!(next(&browser), "REBIND 421", "the console's data, read by a rebound name");
    assert_eq!(next(&browser), "REBIND_PAGE 421");
    assert_eq!(next(&browser), "DONE");
    browser.finish();
}

/// A request written as its head: the request line, then header lines as
/// given (the same name twice, or no Host, included): (status, body).
fn raw(addr: &str, head: &str, body: &str) -> (u16, String) {
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap().split_whitespace();
    let (method, path) = (request_line.next().unwrap(), request_line.next().unwrap());
    let mut request = web::Request::new(method, web::url(addr, path)).without_host();
    for line in lines {
        let (name, value) = line.split_once(':').unwrap();
        request = request.header(name.trim(), value.trim());
    }
    let answer = request.header("connection", "close").body(body).send();
    (answer.status, answer.text())
}

#[tokio::test]
async fn actions_must_be_json_from_the_consoles_own_site_and_requests_must_name_a_host_it_answers_to() {
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RULES);
    let fg = floodgate().args(["--config", path_str(&rules), "--http-host", "*.floodgate.test"]).start();
    let a = fg.http.as_str();
    let level = r#"{"level":3}"#;
    let post = |lines: &str| format!("POST /api/v1/level HTTP/1.1\r\n{lines}");
    // As the attack report sent it.
    let (status, body) =
        raw(a, &post("Host: evil.test\r\nOrigin: http://evil.test\r\nContent-Type: text/plain"), level);
    assert_eq!(status, 421, "{body}");
    assert!(body.contains("host 'evil.test' is not one this server answers to"), "{body}");
    let own = format!("Host: {a}");
    let cases = [
        (format!("{own}\r\nContent-Type: text/plain"), 415, "Content-Type"),
        (own.to_string(), 415, "Content-Type"),
        (
            format!("{own}\r\nContent-Type: application/json\r\nOrigin: http://evil.test"),
            403,
            "Origin: 'http://evil.test'",
        ),
        (format!("{own}\r\nContent-Type: application/json\r\nOrigin: null"), 403, "Origin: 'null'"),
        (format!("{own}\r\nContent-Type: application/json\r\nSec-Fetch-Site: cross-site"), 403, "Sec-Fetch-Site"),
        (format!("{own}\r\nContent-Type: application/json\r\nSec-Fetch-Site: same-site"), 403, "Sec-Fetch-Site"),
        ("Content-Type: application/json".to_string(), 421, "host ''"),
    ];
    for (lines, want, says) in &cases {
        let (status, body) = raw(a, &post(lines), level);
        assert_eq!(status, *want, "{lines}: {body}");
        assert!(body.contains(says), "{lines}: {body}");
    }
    assert_eq!(level_and_breaker(&fg).await.0, 0, "no refused action changed the level");
    // A client that is not a browser (no Origin), and the console's own page.
    for lines in [
        format!("{own}\r\nContent-Type: application/json"),
        format!(
            "{own}\r\nContent-Type: Application/JSON; charset=utf-8\r\nOrigin: http://{a}\r\nSec-Fetch-Site: same-origin"
        ),
        "Host: console.floodgate.test\r\nContent-Type: application/json\r\nOrigin: https://console.floodgate.test"
            .to_string(),
    ] {
        let (status, body) = raw(a, &post(&lines), level);
        assert_eq!(status, 200, "{lines}: {body}");
    }
    assert_eq!(level_and_breaker(&fg).await.0, 3);

    // Reading: by address, localhost or a given name, never another name.
    let get = |path: &str, host: &str| raw(a, &format!("GET {path} HTTP/1.1\r\nHost: {host}"), "");
    let port = a.rsplit(':').next().unwrap();
    for host in [a.to_string(), format!("localhost:{port}"), format!("fg.floodgate.test:{port}")] {
        assert_eq!(get("/api/v1/console", &host).0, 200, "{host}");
        assert_eq!(get("/metrics", &host).0, 200, "{host}");
    }
    for host in [format!("evil.test:{port}"), format!("floodgate.test:{port}"), format!("127.0.0.1.evil.test:{port}")] {
        assert_eq!(get("/api/v1/console", &host).0, 421, "{host}");
        assert_eq!(get("/", &host).0, 421, "{host}");
    }
    // Two Hosts (or two Origins): which one a check reads would depend on
    // the reader; refused.
    let two_hosts = raw(a, &format!("GET /api/v1/console HTTP/1.1\r\nHost: {a}\r\nHost: evil.test"), "");
    assert_eq!(two_hosts.0, 400, "{}", two_hosts.1);
    let two_origins = raw(
        a,
        &post(&format!("{own}\r\nContent-Type: application/json\r\nOrigin: http://{a}\r\nOrigin: http://evil.test")),
        level,
    );
    assert_eq!(two_origins.0, 400, "{}", two_origins.1);
    // Probes and scrapers are answered whatever they name (a Service or
    // container name): health says nothing, metrics are labelled by rule.
    assert_eq!(get("/metrics", "floodgate-metrics.monitoring.svc:8080").0, 200);
    assert_eq!(get("/healthz", "evil.test").0, 200);
    assert_eq!(get("/readyz", "evil.test").0, 200);
}

/// Opens the event stream with `token` and reads its reply's head; the
/// stream stays open while the returned stream lives.
fn open_events_as(addr: &str, token: &str) -> (u16, web::Stream) {
    let stream = web::get(web::url(addr, "/api/v1/events")).bearer(Some(token)).timeout(Duration::from_secs(10)).open();
    (stream.status, stream)
}

fn open_events(addr: &str) -> (u16, web::Stream) {
    open_events_as(addr, READER)
}

/// Reads the stream until the server ends it; how long that took, or
/// `None` if it was still open after `limit`.
fn ends_within(s: web::Stream, limit: Duration) -> Option<Duration> {
    s.ends_within(limit)
}

#[tokio::test]
async fn event_streams_are_capped_per_caller_and_in_all_and_a_client_that_went_frees_its_place_at_once() {
    let fg = server().start();
    let a = &fg.http;
    // One caller holds at most 32.
    let mut open: Vec<_> = (0..32)
        .map(|i| {
            let (status, s) = open_events(a);
            assert_eq!(status, 200, "stream {i}");
            s
        })
        .collect();
    let (status, _, body) = http(a, "GET", "/api/v1/events", Some(READER), "");
    assert_eq!(status, 429, "a 33rd stream of one caller is refused");
    assert!(body.contains("token:grafana has 32 event streams open"), "{body}");
    // Others fill the rest of the 256.
    for token in readers().iter().cycle().take(256 - 32) {
        let (status, s) = open_events_as(a, token);
        assert_eq!(status, 200);
        open.push(s);
    }
    assert_eq!(open_events_as(a, ADMIN).0, 429, "a 257th stream is refused");
    // The clients go. Their places are free before the next keep-alive ping
    // (15 s): a new stream is served within a few seconds.
    drop(open);
    let start = std::time::Instant::now();
    loop {
        let (status, _s) = open_events(a);
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "places still taken {:?} after the clients went",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_event_stream_ends_and_a_draining_server_ends_every_stream() {
    let mut fg = server().args(["--shutdown-grace", "60s"]).start();
    let (status, revoked) = open_events(&fg.http);
    assert_eq!(status, 200);
    let (status, kept) = open_events_as(&fg.http, &readers()[0]);
    assert_eq!(status, 200);
    fg.dir().replace("tokens", &tokens_file(false));
    let took = ends_within(revoked, Duration::from_secs(20));
    assert!(took.is_some(), "grafana's stream outlived its token by 20 s");
    // The other reader's stream is still live (ticks keep coming).
    let tick = kept.next(Duration::from_secs(5)).unwrap();
    assert!(tick.is_some_and(|bytes| !bytes.is_empty()), "the other stream still sends");
    // SIGTERM: the stream ends at once, and so does a gRPC Watch, and the
    // server stops well before its 60 s grace.
    let mut watch = fg.client().await.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    assert!(watch.message().await.unwrap().is_some(), "the snapshot");
    let started = std::time::Instant::now();
    let stopping = std::thread::spawn(move || {
        let status = fg.terminate();
        (status, fg)
    });
    let took = ends_within(kept, Duration::from_secs(20)).expect("the stream held the drain");
    let (status, _fg) = stopping.join().unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the Watch stream outlived the server");
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the drain took {:?} (stream ended after {took:?})",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_client_that_stops_reading_does_not_hold_the_drain() {
    let mut fg = server().args(["--shutdown-grace", "60s"]).start();
    // `floodgate watch` printing into a pipe nobody reads: once the pipe is
    // full it stops reading its connection, whose buffers fill in turn.
    let mut stuck = std::process::Command::new(BIN)
        .args(["watch", "--server", &fg.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..3000u32 {
        let body = format!(r#"{{"level":{}}}"#, i % 2 + 1);
        assert_eq!(http(&fg.http, "POST", "/api/v1/level", Some(ADMIN), &body).0, 200);
    }
    let started = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        let status = fg.terminate();
        (status, fg)
    })
    .await
    .unwrap()
    .0;
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the drain took {:?}: a client that does not read held it",
        started.elapsed()
    );
    let _ = stuck.kill();
    let _ = stuck.wait();
}
