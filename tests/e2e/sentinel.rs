//! Alibaba Sentinel's rules through the real binary: a directory as the
//! dashboard's data sources leave it, with every rule type, loaded,
//! deciding, hot-reloaded, refused whole when a file is bad (the rules in
//! force keep deciding), checked by `check-config`; the caller's mTLS
//! identity as its origin.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use floodgate_proto::v1 as pb;
use support::*;

/// Flow (QPS reject, per origin, other, chain), thread count, rate limiter.
const FLOW: &str = r#"[
  {"id":1,"app":"shop","ip":"10.0.0.7","port":8719,"gmtCreate":1700000000000,
   "resource":"GET:/orders","limitApp":"default","grade":1,"count":50,"strategy":0,"controlBehavior":0},
  {"id":2,"app":"shop","resource":"GET:/orders","limitApp":"app-a","grade":1,"count":5},
  {"id":3,"app":"shop","resource":"report","grade":1,"count":10,"controlBehavior":2,"maxQueueingTimeMs":500},
  {"id":4,"app":"shop","resource":"report","grade":1,"count":5,"strategy":1,"refResource":"GET:/orders"}
]"#;

/// An exception-count breaker: opens on the 3rd exception within the hour.
const DEGRADE: &str = r#"[
  {"id":1,"app":"shop","resource":"POST:/pay","grade":2,"count":2,"timeWindow":60,"minRequestAmount":1,"statIntervalMs":3600000}
]"#;

const SYSTEM: &str =
    r#"[{"id":1,"app":"shop","highestSystemLoad":-1,"highestCpuUsage":0.95,"qps":-1,"avgRt":-1,"maxThread":-1}]"#;

/// 3 calls an hour per user id, 10 for `vip`.
const PARAM: &str = r#"[
  {"id":1,"app":"shop","rule":{"resource":"GET:/user","grade":1,"paramIdx":0,"count":3,"durationInSec":3600,
   "paramFlowItemList":[{"object":"vip","count":10,"classType":"java.lang.String"}]}}
]"#;

const AUTHORITY: &str = r#"[{"id":1,"app":"shop","rule":{"resource":"GET:/orders","limitApp":"evil","strategy":1}}]"#;

fn dashboard_dir() -> TempDir {
    let dir = TempDir::new();
    dir.write("shop-flow-rules", FLOW);
    dir.write("shop-degrade-rules.json", DEGRADE);
    dir.write("SystemRule.json", SYSTEM);
    dir.write("shop-param-rules", PARAM);
    dir.write("shop-authority-rules.json", AUTHORITY);
    dir
}

async fn verdicts(fg: &Floodgate, resource: &str, descriptors: &[(&str, &str)], n: usize) -> Vec<pb::Verdict> {
    let mut data = fg.client().await;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(data.acquire(acquire(resource, descriptors, 1)).await.unwrap().into_inner().verdict());
    }
    out
}

fn allowed(v: &[pb::Verdict]) -> usize {
    v.iter().filter(|v| **v == pb::Verdict::Allowed).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_export_decides_reloads_and_is_refused_whole_when_a_file_is_bad() {
    let dir = dashboard_dir();
    let fg = floodgate().args(["--sentinel-rules", path_str(dir.0.path()), "--reload-debounce", "100ms"]).start();

    // What is in force, and what is not enforced, named.
    let rules = fg.admin().await.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    let s = rules.sentinel.expect("Sentinel's rules in force");
    assert_eq!(s.resources, ["GET:/orders", "report", "GET:/user", "POST:/pay"]);
    assert_eq!(s.ignored.len(), 1, "{:?}", s.ignored);
    assert!(s.ignored[0].contains("shop-flow-rules[3] 'report': strategy 1 (relate"), "{:?}", s.ignored);
    assert!(s.json.contains("# shop-param-rules"));

    // Hot parameters: 3 per user, 10 for vip; no parameter, no limit.
    let u = fresh("u");
    assert_eq!(allowed(&verdicts(&fg, "GET:/user", &[("param0", &u)], 5).await), 3);
    assert_eq!(allowed(&verdicts(&fg, "GET:/user", &[("param0", "vip")], 12).await), 10);
    // limitApp app-a: 5 a second of its own (the default 50 beside it).
    let a = verdicts(&fg, "GET:/orders", &[("origin", "app-a")], 10).await;
    assert!((5..=6).contains(&allowed(&a)), "a sliding second of 5: {a:?}");
    // Authority: a black-listed origin is refused before any limit.
    assert_eq!(verdicts(&fg, "GET:/orders", &[("origin", "evil")], 1).await, [pb::Verdict::RateLimited]);
    // The rate limiter: callers paced 100 ms apart, told how long to wait.
    let mut data = fg.client().await;
    let mut waits = Vec::new();
    for _ in 0..3 {
        let r = data.acquire(acquire("report", &[], 1)).await.unwrap().into_inner();
        waits.push(r.wait.map_or(0, |w| w.nanos / 1_000_000 + w.seconds as i32 * 1000));
    }
    assert!(waits[2] > waits[1] && waits[1] > waits[0], "each waits its turn: {waits:?}");

    // The exception-count breaker: the 3rd exception opens it.
    for _ in 0..3 {
        let r = data.acquire(acquire("POST:/pay", &[], 1)).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::Allowed);
        data.report_outcome(report("POST:/pay", &r.permit_id, pb::Outcome::Failure)).await.unwrap();
    }
    assert_eq!(verdicts(&fg, "POST:/pay", &[], 1).await, [pb::Verdict::CircuitOpen]);

    // Hot reload: `GET:/user` now 1 an hour per user.
    dir.replace("shop-param-rules", &PARAM.replace(r#""count":3,"#, r#""count":1,"#));
    eventually("the reloaded hot-parameter rule", Duration::from_secs(10), || {
        let (fg, u) = (&fg, fresh("u"));
        async move { (allowed(&verdicts(fg, "GET:/user", &[("param0", &u)], 2).await) == 1).then_some(()) }
    })
    .await;

    // A bad file refuses the change whole: the flow file's new limit is not taken either.
    // (The bad file first: every reading from then on sees it.)
    dir.replace("shop-degrade-rules.json", r#"[{"resource":"POST:/pay","grade":7,"timeWindow":1}]"#);
    dir.replace("shop-flow-rules", &FLOW.replace(r#""count":5}"#, r#""count":1}"#));
    eventually("the refusal in the log", Duration::from_secs(10), || async {
        fg.logs().contains("invalid Sentinel rules ignored").then_some(())
    })
    .await;
    assert!(fg.logs().contains("shop-degrade-rules.json: resource 'POST:/pay': [0].grade: 7 is not a grade"));
    let u = fresh("u");
    assert_eq!(allowed(&verdicts(&fg, "GET:/user", &[("param0", &u)], 3).await), 1, "the rules in force keep deciding");
    // Two seconds on, the sliding second's previous window is empty.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let a = verdicts(&fg, "GET:/orders", &[("origin", "app-a")], 10).await;
    assert!((5..=6).contains(&allowed(&a)), "app-a keeps its 5: {a:?}");
    let metrics = fg.http_get("/metrics").1;
    assert!(metrics.contains(r#"floodgate_rule_reloads_total{source="sentinel",result="failure"}"#), "{metrics}");
}

#[test]
fn check_config_reads_a_sentinel_directory_and_names_what_is_wrong() {
    let dir = dashboard_dir();
    let out = std::process::Command::new(BIN)
        .args(["check-config", "--sentinel-rules", path_str(dir.0.path())])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("OK (8 rules: 1 authority, 1 degrade, 4 flow, 1 param-flow, 1 system; 4 resources"),
        "{text}"
    );
    assert!(text.contains("not enforced: shop-flow-rules[3] 'report': strategy 1"), "{text}");

    // Malformed JSON, an unknown grade, a 10 MiB file: each named, exit 1.
    let bad = TempDir::new();
    bad.write("flow-rules.json", r#"[{"resource":"a","count":1},"#);
    bad.write("degrade-rules.json", r#"[{"resource":"b","grade":9,"timeWindow":1}]"#);
    let run = |dir: &TempDir| {
        std::process::Command::new(BIN)
            .args(["check-config", "--sentinel-rules", path_str(dir.0.path())])
            .output()
            .unwrap()
    };
    let out = run(&bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("flow-rules.json: is not JSON: EOF while parsing"), "{err}");
    assert!(err.contains("degrade-rules.json: resource 'b': [0].grade: 9 is not a grade"), "{err}");
    let huge = TempDir::new();
    huge.write("flow-rules.json", &format!("[{}]", " ".repeat(10 << 20)));
    let out = run(&huge);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("flow-rules.json: cannot read:") && err.contains("4194304"), "{err}");
    // The server refuses to start on them, naming the flag.
    let out = floodgate().arg("--sentinel-rules").arg(bad.0.path()).run_to_exit(Duration::from_secs(30));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--sentinel-rules"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Editors' backups and subdirectories are not read (a backup would be
    // a second copy of the rules; these hold JSON that would refuse them),
    // and each is listed.
    let edited = TempDir::new();
    edited.write("flow-rules.json", r#"[{"resource":"a","count":1}]"#);
    for backup in ["flow-rules.json~", "#flow-rules.json#", "flow-rules.json.bak", "flow-rules.json.orig"] {
        edited.write(backup, "[{");
    }
    std::fs::create_dir(edited.path("old-flow-rules")).unwrap();
    let out = run(&edited);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("OK (1 rules: ") && text.contains(" 1 flow,") && text.contains("5 not enforced)"), "{text}");
    assert!(text.contains("not enforced: flow-rules.json~: not read: a backup or temporary file"), "{text}");
    assert!(text.contains("not enforced: old-flow-rules: not read: a directory"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mtls_the_callers_certificate_is_its_origin_whatever_it_says() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let pki = support::pki::Pki::new("floodgate");
    let server = pki.server("server", "floodgate");
    let evil = pki.client("evil", "evil");
    let good = pki.client("good", "good-app");
    let dir = TempDir::new();
    dir.write("authority-rules.json", AUTHORITY);
    dir.write("flow-rules.json", r#"[{"resource":"metered","grade":1,"count":100,"limitApp":"good-app"}]"#);
    let fg = floodgate()
        .args([
            "--sentinel-rules",
            path_str(dir.0.path()),
            "--tls-cert",
            path_str(&server.cert),
            "--tls-key",
            path_str(&server.key),
            "--tls-client-ca",
            path_str(&pki.ca_path()),
        ])
        .start();
    let connect = |who: &support::pki::Pair| {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pki.ca_pem()))
            .domain_name("localhost")
            .identity(Identity::from_pem(&who.cert_pem, &who.key_pem));
        let endpoint = Endpoint::from_shared(format!("https://{}", fg.grpc)).unwrap().tls_config(tls).unwrap();
        async move { pb::floodgate_client::FloodgateClient::new(endpoint.connect().await.unwrap()) }
    };
    // `evil` claims another origin: its certificate decides.
    let mut as_evil = connect(&evil).await;
    let claimed = acquire("GET:/orders", &[("origin", "good-app")], 1);
    assert_eq!(as_evil.acquire(claimed.clone()).await.unwrap().into_inner().verdict(), pb::Verdict::RateLimited);
    let batch = pb::AcquireBatchRequest { requests: vec![claimed.clone(), claimed] };
    let answers = as_evil.acquire_batch(batch).await.unwrap().into_inner().responses;
    assert!(answers.iter().all(|a| a.verdict() == pb::Verdict::RateLimited), "{answers:?}");
    // `good-app` claims to be evil: its certificate decides too.
    let mut as_good = connect(&good).await;
    let claimed = acquire("GET:/orders", &[("origin", "evil")], 1);
    assert_eq!(as_good.acquire(claimed).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    // A certificate with no name is known by its fingerprint: claiming to be
    // `evil` does not make it evil, nor could claiming a listed name pass.
    let nameless = pki.nameless("nameless");
    let mut as_nameless = connect(&nameless).await;
    let claimed = acquire("GET:/orders", &[("origin", "evil")], 1);
    assert_eq!(as_nameless.acquire(claimed).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    // Charge and Lease take from the limits of the origin the certificate
    // proves: `evil` naming `good-app` neither uses up good-app's limit nor
    // leases from it (no limit of `metered` is evil's).
    let descriptors = HashMap::from([("origin".to_string(), "good-app".to_string())]);
    let charge = pb::ChargeRequest {
        idempotency_key: String::new(),
        usage: Default::default(),
        resource: "metered".into(),
        descriptors: descriptors.clone(),
        cost: 1000,
    };
    let charged = as_evil.charge(charge).await.unwrap().into_inner();
    assert!(charged.limits.is_empty(), "evil was charged on good-app's limit: {charged:?}");
    let lease = pb::LeaseRequest {
        resource: "metered".into(),
        descriptors,
        want: 50,
        holder: "evil-1".into(),
        ..Default::default()
    };
    let leased = as_evil.lease(lease).await.unwrap().into_inner();
    assert!(leased.limits.is_empty(), "evil leased from good-app's limit: {leased:?}");
    let mine = acquire("metered", &[("origin", "good-app")], 1);
    let answer = as_good.acquire(mine).await.unwrap().into_inner();
    assert_eq!((answer.verdict(), answer.limits[0].remaining), (pb::Verdict::Allowed, 99), "{answer:?}");
}

/// Waits until the Sentinel rules in force are `resource`'s alone, then
/// checks it decides: `n` of `n + 2` admitted.
async fn until_admits(fg: &Floodgate, resource: &str, n: usize, what: &str) {
    let start = std::time::Instant::now();
    loop {
        let rules = fg.admin().await.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
        if rules.sentinel.is_some_and(|s| s.resources == [resource]) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "timed out waiting for {what}; logs:\n{}", fg.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(allowed(&verdicts(fg, resource, &[], n + 2).await), n, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_is_followed_by_its_path_and_sighup_reads_it_again() {
    let root = TempDir::new();
    let flow = |count: u32| format!(r#"[{{"resource":"r{count}","grade":1,"count":{count}}}]"#);
    let v1 = root.path("v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("flow-rules.json"), flow(2)).unwrap();
    // The directory Floodgate is given is a symlink, swapped as deployments do.
    let current = root.path("current");
    std::os::unix::fs::symlink("v1", &current).unwrap();
    let fg = floodgate().args(["--sentinel-rules", path_str(&current)]).start();
    until_admits(&fg, "r2", 2, "r2's limit").await;

    let v2 = root.path("v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v2.join("flow-rules.json"), flow(3)).unwrap();
    let swap = root.path("current.tmp");
    std::os::unix::fs::symlink("v2", &swap).unwrap();
    std::fs::rename(&swap, &current).unwrap();
    until_admits(&fg, "r3", 3, "the swapped-in directory's rules").await;
    // Edits in the directory the link now points to are seen; edits in the
    // old one are not read.
    std::fs::write(v2.join("flow-rules.json"), flow(4)).unwrap();
    until_admits(&fg, "r4", 4, "an edit in the new directory").await;

    // The directory deleted and made again.
    std::fs::remove_file(&current).unwrap();
    std::fs::remove_dir_all(&v2).unwrap();
    std::fs::create_dir(&current).unwrap();
    std::fs::write(current.join("flow-rules.json"), flow(5)).unwrap();
    until_admits(&fg, "r5", 5, "the directory made again").await;
    std::fs::write(current.join("flow-rules.json"), flow(6)).unwrap();
    until_admits(&fg, "r6", 6, "an edit in the directory made again").await;

    // SIGHUP reads it again, and ends nothing.
    let pid = fg.pid().to_string();
    let hup = std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    eventually("SIGHUP's line", Duration::from_secs(10), || async {
        fg.logs().contains("SIGHUP: reading the rules again").then_some(())
    })
    .await;
    std::fs::write(current.join("flow-rules.json"), flow(7)).unwrap();
    until_admits(&fg, "r7", 7, "the server alive and watching after SIGHUP").await;
}
