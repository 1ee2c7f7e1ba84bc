//! The decision log through the real binary: `--decision-log`, `floodgate
//! why`, Admin/GetDecisions and Admin/SetDecisionLog over JSON, their roles,
//! and bad input.

use crate::support;
use support::*;

const RULES: &str = r#"
resources:
  - name: chat
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 2, window: 1h }
      - { name: all, algorithm: fixed_window, limit: 1000, window: 1h }
"#;

const ADMIN: &str = "admin-token-0123456789";
const READER: &str = "reader-token-0123456789";

fn why(fg: &Floodgate, token: Option<&str>, args: &[&str]) -> String {
    let token = token.map(|t| vec!["--token", t]).unwrap_or_default();
    let out =
        std::process::Command::new(BIN).args(["why", "--server", &fg.grpc]).args(token).args(args).output().unwrap();
    assert!(out.status.success(), "floodgate why {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn the_decision_log_says_which_limit_denied_a_call() {
    let dir = TempDir::new();
    let tokens = dir.write("tokens", &format!("{ADMIN} admin alice\n{READER} read grafana\n"));
    let fg = floodgate().rules(RULES).args(["--admin-token-file", path_str(&tokens), "--decision-log", "1"]).start();
    let mut c = fg.client().await;
    for user in ["u1", "u1", "u1", "u2"] {
        c.acquire(acquire("chat", &[("user", user)], 1)).await.unwrap();
    }
    let admin = |path: &str, token: Option<&str>, body: &str| {
        fg.request("POST", path).header("content-type", "application/json").bearer(token).body(body).send()
    };

    // The CLI: the third call of u1 was denied by per-user, the others not.
    let text = why(&fg, Some(READER), &["-d", "user=u1", "--denied"]);
    assert_eq!(text.matches("decided by: per-user").count(), 1, "{text}");
    assert!(text.contains("user=u1") && text.contains("rule: chat") && text.contains("RATE_LIMITED"), "{text}");
    let u2 = why(&fg, Some(READER), &["-d", "user=u2"]);
    assert!(u2.contains("ALLOWED") && !u2.contains("decided by"), "{u2}");
    assert_eq!(why(&fg, Some(READER), &["--resource", "chat", "-n", "10"]).matches("rule: chat").count(), 4);

    // JSON, with the reader's token; every limit evaluated is there.
    let got = admin("/v1/admin/get-decisions", Some(READER), r#"{"descriptors":{"user":"u1"},"deniedOnly":true}"#);
    assert_eq!(got.status, 200, "{}", got.text());
    let body = got.json();
    let d = &body["decisions"][0];
    assert_eq!(body["decisions"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(d["decidedBy"], serde_json::json!(["per-user"]), "{body}");
    assert_eq!(d["limits"][0]["exceeded"], true);
    assert_eq!(d["limits"][1]["name"], "all");
    assert_eq!((body["share"].as_f64(), body["kept"].as_str()), (Some(1.0), Some("4")), "{body}");

    // Setting the share needs the admin role; a bad share changes nothing.
    let reader = admin("/v1/admin/set-decision-log", Some(READER), r#"{"share":0}"#);
    assert_eq!(reader.status, 403, "{}", reader.text());
    let anonymous = admin("/v1/admin/get-decisions", None, "{}");
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());
    for bad in ["7", "-0.5"] {
        let r = admin("/v1/admin/set-decision-log", Some(ADMIN), &format!(r#"{{"share":{bad}}}"#));
        assert_eq!((r.status, r.json()["code"].clone()), (400, "INVALID_ARGUMENT".into()), "{}", r.text());
        let message = r.json()["message"].as_str().unwrap().to_string();
        assert!(message.starts_with("share:") && message.contains(bad), "{message}");
    }
    assert_eq!(admin("/v1/admin/get-decisions", Some(READER), "{}").json()["share"].as_f64(), Some(1.0));

    // Turned off, it keeps nothing more, and says what it held.
    let off = admin("/v1/admin/set-decision-log", Some(ADMIN), r#"{"share":0}"#);
    assert_eq!(off.json()["shareBefore"].as_f64(), Some(1.0), "{}", off.text());
    c.acquire(acquire("chat", &[("user", "u3")], 1)).await.unwrap();
    let after = admin("/v1/admin/get-decisions", Some(READER), "{}").json();
    assert_eq!((after["kept"].as_str(), after["decisions"].as_array().map(Vec::len)), (Some("4"), Some(4)), "{after}");
    assert!(fg.logs().contains(r#"change="SetDecisionLog" share_before=1.0 share=0.0"#), "{}", fg.logs());
}

#[tokio::test]
async fn the_decision_log_is_off_unless_asked_for() {
    let fg = floodgate().rules(RULES).start();
    let mut c = fg.client().await;
    c.acquire(acquire("chat", &[("user", "u1")], 1)).await.unwrap();
    let got =
        fg.request("POST", "/v1/admin/get-decisions").header("content-type", "application/json").body("{}").send();
    let body = got.json();
    let decisions = body["decisions"].as_array().map(Vec::len);
    assert_eq!((body["share"].as_f64(), decisions, body["kept"].as_str()), (Some(0.0), Some(0), Some("0")), "{body}");
    let text = why(&fg, None, &[]);
    assert!(text.contains("it is off"), "{text}");
}
