//! The JSON API on the HTTP port (`POST /v1/...`) through the real binary:
//! the same decisions as gRPC on the same buckets, errors as HTTP statuses
//! with the gRPC code, Admin's tokens, the browser checks, size caps, and
//! the OpenAPI document.

use std::io::{Read, Write};

use crate::support;
use support::*;

const RULES: &str = r#"
resources:
  - name: orders
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 4, window: 1h }
  - name: paced
    limits:
      - { name: pace, algorithm: gcra, rate_per_second: 500, burst: 100 }
"#;

fn call(fg: &Floodgate, path: &str, body: &str) -> web::Response {
    fg.request("POST", path).header("content-type", "application/json").body(body).send()
}

#[tokio::test]
async fn json_and_grpc_decide_on_the_same_buckets() {
    let fg = floodgate().rules(RULES).start();
    let ask = r#"{"resource":"orders","descriptors":{"user":"u1"}}"#;
    let first = call(&fg, "/v1/acquire", ask);
    assert_eq!(first.status, 200, "{}", first.text());
    let body = first.json();
    assert_eq!(body["verdict"], "VERDICT_ALLOWED", "{body}");
    assert_eq!(body["limits"][0]["remaining"], "3", "64-bit integers are strings in proto3 JSON: {body}");
    assert_eq!(first.header("ratelimit-policy"), Some(r#""per-user";q=4;w=3600"#));
    assert!(first.header("ratelimit").unwrap().starts_with(r#""per-user";r=3;t="#), "{}", first.head());
    assert_eq!(first.header("retry-after"), None);
    assert_eq!(first.header("x-ratelimit-remaining"), Some("3"));
    // GCRA 500 a second with a burst of 100 holds 100 per 0.2 s: said as
    // the quota of a whole second, not as 100 per second.
    let paced = call(&fg, "/v1/acquire", r#"{"resource":"paced"}"#);
    assert_eq!(paced.header("ratelimit-policy"), Some(r#""pace";q=500;w=1"#), "{}", paced.head());

    // Two over gRPC on the same key, then one more over JSON: the bucket is shared.
    let mut client = fg.client().await;
    for _ in 0..2 {
        let req = floodgate_proto::v1::AcquireRequest {
            resource: "orders".into(),
            descriptors: [("user".to_string(), "u1".to_string())].into(),
            ..Default::default()
        };
        let r = client.acquire(req).await.unwrap().into_inner();
        assert_eq!(r.verdict(), floodgate_proto::v1::Verdict::Allowed);
    }
    assert_eq!(call(&fg, "/v1/acquire", ask).json()["verdict"], "VERDICT_ALLOWED");
    let denied = call(&fg, "/v1/acquire", ask);
    assert_eq!(denied.status, 200, "a denial is an answer, not an error");
    let body = denied.json();
    assert_eq!(body["verdict"], "VERDICT_RATE_LIMITED", "{body}");
    assert!(body["reason"].as_str().unwrap().contains("per-user"), "{body}");
    let retry: u64 = denied.header("retry-after").expect("a denial says when to retry").parse().unwrap();
    assert!((1..=3600).contains(&retry), "{retry}");
    assert!(denied.header("ratelimit").unwrap().starts_with(r#""per-user";r=0;t="#), "{}", denied.head());

    // A batch answers each item; another user still has its own quota.
    let batch = call(
        &fg,
        "/v1/acquire-batch",
        r#"{"requests":[{"resource":"orders","descriptors":{"user":"u2"}},{"resource":"orders","descriptors":{"user":"u1"}}]}"#,
    )
    .json();
    assert_eq!(batch["responses"][0]["verdict"], "VERDICT_ALLOWED", "{batch}");
    assert_eq!(batch["responses"][1]["verdict"], "VERDICT_RATE_LIMITED", "{batch}");

    // The calls are counted as the gRPC calls they are.
    let metrics = fg.metrics();
    let json_and_grpc =
        metrics.value("floodgate_rpc_requests_total", &[("method", "Floodgate/Acquire"), ("code", "OK")]);
    assert_eq!(json_and_grpc, Some(6.0), "4 over JSON (one of them on paced), 2 over gRPC");
}

#[test]
fn bad_calls_get_the_grpc_code_and_change_nothing() {
    let fg = floodgate().rules(RULES).start();
    let code = |r: &web::Response| r.json()["code"].as_str().unwrap_or_default().to_string();

    let empty = call(&fg, "/v1/acquire", r#"{"resource":"","descriptors":{"user":"u1"}}"#);
    assert_eq!((empty.status, code(&empty)), (400, "INVALID_ARGUMENT".into()), "{}", empty.text());
    assert!(empty.json()["message"].as_str().unwrap().contains("resource"), "{}", empty.text());

    let typo = call(&fg, "/v1/acquire", r#"{"resourse":"orders"}"#);
    assert_eq!(typo.status, 400);
    assert!(typo.text().contains("resourse"), "the unknown field is named: {}", typo.text());

    for not_json in ["{", "[]", "\"orders\"", "{\"resource\":\"orders\"} trailing", "\u{0}\u{1}"] {
        let r = call(&fg, "/v1/acquire", not_json);
        assert_eq!((r.status, code(&r)), (400, "INVALID_ARGUMENT".into()), "{not_json:?}: {}", r.text());
    }
    let wrong_type = call(&fg, "/v1/acquire", r#"{"resource":"orders","cost":"many"}"#);
    assert_eq!(wrong_type.status, 400, "{}", wrong_type.text());

    let unknown = call(&fg, "/v1/acquir", "{}");
    assert_eq!((unknown.status, code(&unknown)), (404, "NOT_FOUND".into()));
    assert!(unknown.text().contains("acquire"), "the calls are listed: {}", unknown.text());
    assert_eq!(fg.request("GET", "/v1/acquire").send().status, 405);

    let form = fg.request("POST", "/v1/acquire").header("content-type", "text/plain").body("{}").send();
    assert_eq!(form.status, 415, "{}", form.text());

    // None of the above took anything: u1 still has its whole quota.
    let left = call(&fg, "/v1/admin/peek", r#"{"resource":"orders","descriptors":{"user":"u1"}}"#).json();
    assert_eq!(left["limits"][0]["remaining"], "4", "{left}");
}

#[test]
fn another_sites_page_cannot_spend_quota() {
    let fg = floodgate().rules(RULES).start();
    let ask = r#"{"resource":"orders","descriptors":{"user":"victim"}}"#;
    let from = |headers: &[(&str, &str)]| {
        fg.request("POST", "/v1/acquire").header("content-type", "application/json").headers(headers).body(ask).send()
    };
    let evil = from(&[("origin", "http://evil.test")]);
    assert_eq!(evil.status, 403, "{}", evil.text());
    assert_eq!(evil.json()["code"], "PERMISSION_DENIED");
    assert_eq!(from(&[("sec-fetch-site", "cross-site")]).status, 403);
    let rebound = fg
        .request("POST", "/v1/acquire")
        .header("host", "evil.test")
        .header("content-type", "application/json")
        .body(ask)
        .send();
    assert_eq!(rebound.status, 421, "a name re-pointed at the server is refused: {}", rebound.text());
    // The server's own page may call it.
    let own = format!("http://{}", fg.http);
    assert_eq!(from(&[("origin", &own), ("sec-fetch-site", "same-origin")]).status, 200);
    let left = call(&fg, "/v1/admin/peek", ask).json();
    assert_eq!(left["limits"][0]["remaining"], "3", "only the server's own call took one: {left}");
}

#[test]
fn admin_calls_need_the_same_tokens_as_over_grpc() {
    let dir = TempDir::new();
    let tokens = dir.write("tokens", "admin-token-0123456789 admin alice\nreader-token-0123456789 read grafana\n");
    let fg = floodgate().rules(RULES).args(["--admin-token-file", path_str(&tokens)]).start();
    let admin = |path: &str, token: Option<&str>, body: &str| {
        fg.request("POST", path).header("content-type", "application/json").bearer(token).body(body).send()
    };
    let anonymous = admin("/v1/admin/list-breakers", None, "{}");
    assert_eq!((anonymous.status, anonymous.json()["code"].clone()), (401, "UNAUTHENTICATED".into()));
    assert_eq!(admin("/v1/admin/list-breakers", Some("reader-token-0123456789"), "").status, 200);
    let lowered = RULES.replace("limit: 4", "limit: 2");
    let body = serde_json::json!({ "yaml": lowered }).to_string();
    let reader = admin("/v1/admin/apply-rules", Some("reader-token-0123456789"), &body);
    assert_eq!((reader.status, reader.json()["code"].clone()), (403, "PERMISSION_DENIED".into()), "{}", reader.text());
    let applied = admin("/v1/admin/apply-rules", Some("admin-token-0123456789"), &body);
    assert_eq!(applied.status, 200, "{}", applied.text());
    let rules = admin("/v1/admin/get-rules", Some("reader-token-0123456789"), "{}").json();
    assert!(rules["yaml"].as_str().unwrap().contains("limit: 2"), "{rules}");
    // The data plane needs no token, as over gRPC.
    let ask = r#"{"resource":"orders","descriptors":{"user":"u1"}}"#;
    assert_eq!(call(&fg, "/v1/acquire", ask).json()["limits"][0]["limit"], "2");
}

#[test]
fn bodies_over_the_cap_are_refused_before_they_are_read() {
    let fg = floodgate().rules(RULES).start();
    // Acquire's gRPC cap is 64 KiB; a JSON body may be twice that.
    let huge = format!(r#"{{"resource":"orders","descriptors":{{"user":"{}"}}}}"#, "x".repeat(200 * 1024));
    let r = call(&fg, "/v1/acquire", &huge);
    assert_eq!((r.status, r.json()["code"].clone()), (413, "RESOURCE_EXHAUSTED".into()), "{}", r.text());

    // Without a Content-Length (chunked), the cap ends the read.
    let mut s = std::net::TcpStream::connect(&fg.http).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/acquire HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        fg.http
    )
    .unwrap();
    let chunk = vec![b' '; 64 * 1024];
    for _ in 0..3 {
        if write!(s, "{:x}\r\n", chunk.len())
            .and_then(|_| s.write_all(&chunk))
            .and_then(|_| s.write_all(b"\r\n"))
            .is_err()
        {
            break;
        }
    }
    let mut head = [0u8; 64];
    let n = s.read(&mut head).unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");

    // A JSON body within its cap whose request is over gRPC's cap (4 MiB
    // for a batch) is refused by the same check as over gRPC.
    let user = "u".repeat(5000);
    let items: Vec<String> =
        (0..900).map(|_| format!(r#"{{"resource":"orders","descriptors":{{"user":"{user}"}}}}"#)).collect();
    let batch = format!(r#"{{"requests":[{}]}}"#, items.join(","));
    assert!(batch.len() < 8 << 20 && batch.len() > 4 << 20);
    let r = call(&fg, "/v1/acquire-batch", &batch);
    assert_eq!((r.status, r.json()["code"].clone()), (429, "RESOURCE_EXHAUSTED".into()), "{}", r.text());
    assert!(fg.http_get("/healthz").0 == 200, "the server still answers");
}

#[test]
fn the_openapi_document_describes_every_call_it_serves() {
    let fg = floodgate().rules(RULES).start();
    let doc = fg.request("GET", "/v1/openapi.json").send().json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    for want in ["/v1/acquire", "/v1/acquire-batch", "/v1/report", "/v1/charge", "/v1/lease", "/v1/admin/get-rules"] {
        assert!(paths.contains_key(want), "{want}: {:?}", paths.keys());
    }
    assert!(!paths.contains_key("/v1/watch"), "a stream is not a JSON call");
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let text = doc.to_string();
    // Every reference points at a schema the document has.
    for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = &part[..part.find('"').unwrap()];
        assert!(schemas.contains_key(name), "{name} is referred to but not defined");
    }
    // A third party's validator (openapi-spec-validator, installed by
    // scripts/test) finds the document valid OpenAPI 3.1.
    let dir = TempDir::new();
    let file = dir.write("openapi.json", &text);
    let out = std::process::Command::new(test_cache().join("py/bin/openapi-spec-validator"))
        .args(["--schema", "3.1", path_str(&file)])
        .output()
        .expect("openapi-spec-validator (scripts/test installs it)");
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let acquire = &schemas["floodgate.v1.AcquireRequest"]["properties"];
    assert_eq!(acquire["resource"]["type"], "string", "{acquire}");
    assert_eq!(acquire["descriptors"]["type"], "object", "{acquire}");
    // Every path it lists is served: an empty body reaches the call (which
    // may refuse it), not the list of calls.
    for path in paths.keys() {
        let r = call(&fg, path, "{}");
        assert!(!r.text().contains("no call '/v1/"), "{path}: {}", r.text());
        assert!(r.status < 500, "{path}: {}", r.text());
    }
}

#[test]
fn bodies_that_never_arrive_hold_nothing_and_time_out() {
    // A budget of 16 MiB would be spent by 128 bodies that each declare
    // 128 KiB, if what a body declares were held rather than what arrived.
    let fg =
        floodgate().rules(RULES).args(["--max-unfinished-request-bytes", "16MiB", "--request-timeout", "2s"]).start();
    let mut stalled = Vec::new();
    for _ in 0..300 {
        let mut s = std::net::TcpStream::connect(&fg.http).unwrap();
        write!(
            s,
            "POST /v1/acquire HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: 131072\r\n\r\n{{",
            fg.http
        )
        .unwrap();
        stalled.push(s);
    }
    let ok = call(&fg, "/v1/acquire", r#"{"resource":"orders","descriptors":{"user":"u1"}}"#);
    assert_eq!(ok.status, 200, "300 stalled bodies shut out another caller: {}", ok.text());

    // A body that decoding would need more than the whole budget for is too
    // large, not a reason to retry: a ninth of 16 MiB is under 2 MB.
    let items: Vec<String> =
        (0..700).map(|i| format!(r#"{{"resource":"orders","descriptors":{{"user":"{i:0>4000}"}}}}"#)).collect();
    let batch = format!(r#"{{"requests":[{}]}}"#, items.join(","));
    assert!(batch.len() > 2 << 20 && batch.len() < 4 << 20);
    let r = call(&fg, "/v1/acquire-batch", &batch);
    assert_eq!((r.status, r.json()["code"].clone()), (413, "RESOURCE_EXHAUSTED".into()), "{}", r.text());

    // A stalled body ends with 408 once the request timeout has passed.
    let s = &mut stalled[0];
    s.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let mut head = [0u8; 200];
    let n = s.read(&mut head).unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(head.contains("DEADLINE_EXCEEDED"), "{head}");
}

#[tokio::test]
async fn errors_say_where_in_the_body_and_a_key_given_twice_is_refused() {
    let fg = floodgate().rules(RULES).start();
    let message = |body: &str| {
        let r = call(&fg, "/v1/acquire", body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        r.json()["message"].as_str().unwrap().to_string()
    };
    let m = message(r#"{"resource":"orders","descriptors":{"user":null}}"#);
    assert!(m.starts_with("descriptors.user: "), "{m}");
    let m = message(r#"{"resource":"orders","cost":-1}"#);
    assert!(m.starts_with("cost: "), "{m}");
    let m = message(r#"{"resource":"orders","priority":"PRIORITY_BOGUS"}"#);
    assert!(m.starts_with("priority: ") && m.contains("PRIORITY_BOGUS"), "{m}");
    let m = message(r#"{"resource":"orders","dryRun":true,"dryRun":false,"descriptors":{"user":"u1"}}"#);
    assert!(m.contains("'dryRun' is given twice"), "{m}");
    let m = message(r#"{"resource":"orders","descriptors":{"user":"a","user":"b"}}"#);
    assert!(m.starts_with("descriptors") && m.contains("'user' is given twice"), "{m}");
    // One field under both of its names is given twice too.
    let m = message(r#"{"resource":"orders","dryRun":true,"dry_run":false,"descriptors":{"user":"u1"}}"#);
    assert!(m.contains("'dry_run' is given twice (also as 'dryRun')"), "{m}");
    // But a map's keys are the caller's own: both spellings are two keys.
    let two = call(&fg, "/v1/admin/peek", r#"{"resource":"orders","descriptors":{"user_id":"a","userId":"b"}}"#);
    assert_eq!(two.status, 200, "{}", two.text());
    let m = message(r#"{"resource":"orders""#);
    assert!(m.starts_with("body: "), "{m}");
    let batch =
        call(&fg, "/v1/acquire-batch", r#"{"requests":[{"resource":"orders"},{"resource":"orders","cost":"x"}]}"#);
    assert!(batch.json()["message"].as_str().unwrap().starts_with("requests[1].cost: "), "{}", batch.text());
    // None of them took anything, and each was counted as the gRPC call's error.
    let left = call(&fg, "/v1/admin/peek", r#"{"resource":"orders","descriptors":{"user":"u1"}}"#).json();
    assert_eq!(left["limits"][0]["remaining"], "4", "{left}");
    let invalid = fg
        .metrics()
        .value("floodgate_rpc_requests_total", &[("method", "Floodgate/Acquire"), ("code", "INVALID_ARGUMENT")]);
    assert_eq!(invalid, Some(7.0));

    // A refusal of another site's page is in the audit log.
    let r = fg
        .request("POST", "/v1/acquire")
        .header("content-type", "application/json")
        .header("origin", "http://evil.test")
        .body("{}")
        .send();
    assert_eq!(r.status, 403);
    // The test reads the server's log through a pipe: on a busy machine the
    // line arrives a moment after the answer.
    eventually("the audit line", std::time::Duration::from_secs(10), || async {
        let logs = fg.logs();
        (logs.contains("JSON call refused") && logs.contains("evil.test")).then_some(())
    })
    .await;
}
