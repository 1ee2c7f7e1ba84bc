//! What-if through the real binary: candidate rules observed in shadow on
//! real traffic, changing nothing, reported per limit with the heaviest
//! descriptor values; the CLI's `rules what-if` and `rules what-if-report`.

use crate::support;

use std::collections::HashMap;
use std::process::Command;

use floodgate_proto::v1 as pb;
use support::*;

const LIVE: &str = r#"
resources:
  - name: api
    limits: [ { name: per-user, key: [user], algorithm: fixed_window, limit: 100, window: 1h } ]
"#;

/// Tightened from 100 to 2 per user, plus a global limit.
const CANDIDATE: &str = r#"
resources:
  - name: api
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 2, window: 1h }
      - { name: all, algorithm: fixed_window, limit: 1000, window: 1h }
"#;

fn ask(user: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        resource: "api".into(),
        descriptors: HashMap::from([("user".into(), user.into())]),
        ..Default::default()
    }
}

fn seconds(s: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds: s, nanos: 0 })
}

#[tokio::test]
async fn candidate_rules_are_observed_in_shadow_and_report_whom_they_would_deny() {
    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", LIVE))]).start();
    let (mut admin, mut data) = (fg.admin().await, fg.client().await);
    let version = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner().version;

    // Bad input starts nothing.
    let none = admin.get_what_if(pb::GetWhatIfRequest {}).await.unwrap_err();
    assert_eq!(none.code(), tonic::Code::NotFound);
    let start = |yaml: &str, what_if| pb::ApplyRulesRequest { yaml: yaml.into(), what_if, ..Default::default() };
    let err = admin.apply_rules(start(CANDIDATE, seconds(0))).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::InvalidArgument, "what_if: 0s 0ns is not between 1s and 24h")
    );
    let err = admin.apply_rules(start("resources: 7", seconds(60))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // validate_only with what_if: one says "install nothing", the other
    // "observe": refused rather than one silently winning.
    let both = pb::ApplyRulesRequest { validate_only: true, ..start(CANDIDATE, seconds(60)) };
    let err = admin.apply_rules(both).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("validate_only: cannot go with what_if"), "{}", err.message());
    assert_eq!(admin.get_what_if(pb::GetWhatIfRequest {}).await.unwrap_err().code(), tonic::Code::NotFound);

    let started = admin.apply_rules(start(CANDIDATE, seconds(600))).await.unwrap().into_inner();
    assert!(!started.applied && started.what_if_until.is_some(), "{started:?}");
    let mut verdicts = Vec::new();
    for _ in 0..10 {
        verdicts.push(data.acquire(ask("heavy")).await.unwrap().into_inner().verdict());
    }
    data.acquire(ask("light")).await.unwrap();
    data.acquire(pb::AcquireRequest { dry_run: true, ..ask("light") }).await.unwrap();
    assert!(verdicts.iter().all(|v| *v == pb::Verdict::Allowed), "the live rules still decide: {verdicts:?}");

    let r = admin.get_what_if(pb::GetWhatIfRequest {}).await.unwrap().into_inner();
    assert!(r.running);
    assert_eq!((r.calls, r.unmatched), (11, 0), "dry runs are not calls");
    let per_user = &r.limits[0];
    assert_eq!((per_user.rule.as_str(), per_user.limit.as_str()), ("api", "per-user"));
    assert_eq!((per_user.evaluated, per_user.would_deny, per_user.newly_denied), (11, 8, 8));
    assert_eq!(per_user.top.len(), 1);
    assert_eq!((per_user.top[0].key.as_str(), per_user.top[0].count), ("user=heavy", 8));
    assert_eq!((r.limits[1].evaluated, r.limits[1].would_deny), (11, 0));
    let now = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    assert_eq!(now.version, version, "a what-if changes nothing");

    // The CLI prints the report.
    let out = Command::new(BIN).args(["rules", "--server", &fg.grpc, "what-if-report"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with("what-if running: 11 calls seen, 0 matched no candidate rule"), "{text}");
    assert!(text.contains("    user=heavy: 8\n"), "{text}");

    // `rules what-if FILE --for 1s` replaces it, waits it out and prints it.
    let file = dir.write("candidate.yaml", CANDIDATE);
    let out = Command::new(BIN)
        .args(["rules", "--server", &fg.grpc, "what-if", path_str(&file), "--for", "1s"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("what-if finished: "), "{text}");
    let r = admin.get_what_if(pb::GetWhatIfRequest {}).await.unwrap().into_inner();
    assert!(!r.running);
    let calls = r.calls;
    data.acquire(ask("late")).await.unwrap();
    assert_eq!(
        admin.get_what_if(pb::GetWhatIfRequest {}).await.unwrap().into_inner().calls,
        calls,
        "ended: not counted"
    );
}
