//! Breakers, permits, concurrency limits, degradation and Watch through the
//! real binary.

use crate::support;

use std::time::Duration;

use floodgate_proto::v1 as pb;
use pb::watch_event::Event as Kind;
use support::*;

const RULES: &str = r#"
resources:
  - name: payments
    breaker:
      window: { kind: count, size: 20 }
      minimum_calls: 5
      failure_rate_threshold: 0.5
      wait_in_open: 1s
      half_open_calls: 3
      max_wait_in_half_open: 30s
  - name: db
    concurrency: { max_in_flight: 4, permit_ttl: 500ms }
  - name: reports
    shed_at_level: 2
"#;

fn transitions(events: &[pb::WatchEvent]) -> Vec<(pb::BreakerState, pb::BreakerState)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Kind::Breaker(t)) => Some((t.from_state(), t.to_state())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_open_the_breaker_probes_run_across_clients_and_close_it() {
    use pb::BreakerState::{Closed, HalfOpen, Open};
    let fg = floodgate().rules(RULES).start();
    let mut watch = fg.client().await.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(Kind::Snapshot(_))), "{first:?}");

    let mut client = fg.client().await;
    for i in 0..5 {
        let r = client.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner();
        assert_eq!((r.verdict(), r.breaker_state()), (pb::Verdict::Allowed, Closed), "call {i}");
        let rep = client.report_outcome(report("payments", &r.permit_id, pb::Outcome::Failure)).await.unwrap();
        assert!(rep.get_ref().counted);
    }
    let denied = client.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner();
    assert_eq!((denied.verdict(), denied.breaker_state()), (pb::Verdict::CircuitOpen, Open));
    let retry = denied.retry_after.unwrap();
    assert!(retry.seconds == 0 && retry.nanos > 0, "retry within wait_in_open (1s): {retry:?}");
    assert!(denied.reason.starts_with("circuit breaker of 'payments' is OPEN, next probe in"), "{}", denied.reason);
    assert!(denied.permit_id.is_empty());

    // Wait for the end of OPEN with dry runs, which move nothing.
    let mut dry = acquire("payments", &[], 1);
    dry.dry_run = true;
    eventually("the end of wait_in_open", Duration::from_secs(10), || {
        let (mut c, dry) = (client.clone(), dry.clone());
        async move { (c.acquire(dry).await.unwrap().into_inner().verdict() == pb::Verdict::Allowed).then_some(()) }
    })
    .await;

    // Two clients at once, ten acquires: exactly half_open_calls (3) probes.
    let (a, b) = (fg.client().await, fg.client().await);
    let burst = |c: pb::floodgate_client::FloodgateClient<tonic::transport::Channel>| async move {
        let calls: Vec<_> = (0..5)
            .map(|_| {
                let mut c = c.clone();
                tokio::spawn(async move { c.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner() })
            })
            .collect();
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        answers
    };
    let (ra, rb) = tokio::join!(burst(a), burst(b));
    let all: Vec<_> = ra.into_iter().chain(rb).collect();
    let probes: Vec<_> = all.iter().filter(|r| r.verdict() == pb::Verdict::Allowed).collect();
    assert_eq!(probes.len(), 3, "{:?}", all.iter().map(|r| r.verdict()).collect::<Vec<_>>());
    assert!(probes.iter().all(|p| p.breaker_state() == HalfOpen && !p.permit_id.is_empty()));
    let mut last = None;
    for p in probes {
        let r =
            client.report_outcome(report("payments", &p.permit_id, pb::Outcome::Success)).await.unwrap().into_inner();
        last = Some(r.breaker_state());
    }
    assert_eq!(last, Some(Closed), "the last probe's success closes it");

    // The Watch subscriber saw every transition, in order.
    let mut seen = Vec::new();
    while transitions(&seen).len() < 3 {
        let e =
            tokio::time::timeout(Duration::from_secs(10), watch.message()).await.expect("an event").unwrap().unwrap();
        seen.push(e);
    }
    assert_eq!(transitions(&seen), [(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)]);
    let seqs: Vec<u64> = std::iter::once(first.sequence).chain(seen.iter().map(|e| e.sequence)).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");

    // ... and so does /metrics.
    let page = fg.http_get("/metrics").1;
    for (series, value) in [
        (r#"floodgate_breaker_transitions_total{resource="payments",from="CLOSED",to="OPEN"}"#, "1"),
        (r#"floodgate_breaker_transitions_total{resource="payments",from="OPEN",to="HALF_OPEN"}"#, "1"),
        (r#"floodgate_breaker_transitions_total{resource="payments",from="HALF_OPEN",to="CLOSED"}"#, "1"),
        (r#"floodgate_breaker_state{resource="payments"}"#, "1"),
        (r#"floodgate_decisions_total{resource="payments",verdict="CIRCUIT_OPEN",limit=""}"#, "8"),
        (r#"floodgate_outcomes_total{resource="payments",outcome="FAILURE",result="counted"}"#, "5"),
    ] {
        assert!(page.lines().any(|l| l == format!("{series} {value}")), "{series} {value} in\n{page}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limits_hold_under_load_and_unreported_permits_expire() {
    let fg = floodgate().rules(RULES).start();
    let held = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (mut c, held, peak) = (fg.client().await, held.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            use std::sync::atomic::Ordering::SeqCst;
            let mut limited = 0;
            for _ in 0..50 {
                let r = c.acquire(acquire("db", &[], 1)).await.unwrap().into_inner();
                if r.verdict() == pb::Verdict::ConcurrencyLimited {
                    limited += 1;
                    continue;
                }
                let now = held.fetch_add(1, SeqCst) + 1;
                peak.fetch_max(now, SeqCst);
                tokio::task::yield_now().await;
                held.fetch_sub(1, SeqCst);
                c.report_outcome(report("db", &r.permit_id, pb::Outcome::Success)).await.unwrap();
            }
            limited
        }));
    }
    let mut limited = 0;
    for t in tasks {
        limited += t.await.unwrap();
    }
    assert!(peak.load(std::sync::atomic::Ordering::SeqCst) <= 4);
    assert!(limited > 0, "eight callers on four slots are sometimes turned away");

    // Four permits never reported: the fifth caller waits for permit_ttl (500 ms).
    let mut c = fg.client().await;
    let mut crashed = Vec::new();
    for _ in 0..4 {
        crashed.push(c.acquire(acquire("db", &[], 1)).await.unwrap().into_inner().permit_id);
    }
    let r = c.acquire(acquire("db", &[], 1)).await.unwrap().into_inner();
    assert_eq!(r.verdict(), pb::Verdict::ConcurrencyLimited);
    assert_eq!(r.reason, "concurrency limit of 'db' reached: 4 calls in flight");
    let mut dry = acquire("db", &[], 1);
    dry.dry_run = true;
    eventually("expired permits to free their slots", Duration::from_secs(10), || {
        let (mut c, dry) = (c.clone(), dry.clone());
        async move { (c.acquire(dry).await.unwrap().into_inner().verdict() == pb::Verdict::Allowed).then_some(()) }
    })
    .await;
    let late = c.report_outcome(report("db", &crashed[0], pb::Outcome::Success)).await.unwrap().into_inner();
    assert!(!late.counted, "an expired permit is not counted");
    // The four were issued one after another (far apart on a busy machine):
    // each expires on its own clock.
    eventually("all four unreported permits expired", Duration::from_secs(10), || async {
        fg.http_get("/metrics").1.lines().any(|l| l == "floodgate_permits_expired_total 4").then_some(())
    })
    .await;
}

#[tokio::test]
async fn bad_reports_and_admin_calls_are_refused_with_the_field_named() {
    let fg = floodgate().rules(RULES).start();
    let mut c = fg.client().await;
    let err = c.report_outcome(report("db", "nope", pb::Outcome::Success)).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (tonic::Code::InvalidArgument, "permit_id: 'nope' is not a permit id"));
    let permit = c.acquire(acquire("db", &[], 1)).await.unwrap().into_inner().permit_id;
    let err = c.report_outcome(report("db", &permit, pb::Outcome::Unspecified)).await.unwrap_err();
    assert_eq!(err.message(), "outcome: 0 is not one of OUTCOME_SUCCESS, OUTCOME_FAILURE or OUTCOME_IGNORED");
    let batch = pb::ReportOutcomeBatchRequest {
        reports: vec![report("db", &permit, pb::Outcome::Success), report("db", "zz", pb::Outcome::Success)],
    };
    let err = c.report_outcome_batch(batch).await.unwrap_err();
    assert_eq!(err.message(), "reports[1].permit_id: 'zz' is not a permit id");
    // Refused whole: the first permit is still out, and counts now.
    let batch = pb::ReportOutcomeBatchRequest { reports: vec![report("db", &permit, pb::Outcome::Success)] };
    assert!(c.report_outcome_batch(batch).await.unwrap().into_inner().responses[0].counted);

    let mut admin = fg.admin().await;
    let set = |resource: &str, state: pb::BreakerState| pb::SetBreakerStateRequest {
        resource: resource.into(),
        state: state as i32,
    };
    let err = admin.set_breaker_state(set("payments", pb::BreakerState::Open)).await.unwrap_err();
    assert_eq!(
        err.message(),
        "state: BREAKER_STATE_OPEN cannot be set; use BREAKER_STATE_CLOSED (reset), BREAKER_STATE_FORCED_OPEN, BREAKER_STATE_DISABLED or BREAKER_STATE_METRICS_ONLY"
    );
    let err = admin.get_breaker(pb::GetBreakerRequest { resource: "db".into() }).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (tonic::Code::NotFound, "resource: no rule gives 'db' a circuit breaker"));
    let err = admin
        .set_degradation_level(pb::SetDegradationLevelRequest { level: 5, automatic: false, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.message(), "level: 5 is not a degradation level (0 to 3)");

    // Forced open, then reset.
    let info = admin.set_breaker_state(set("payments", pb::BreakerState::ForcedOpen)).await.unwrap().into_inner();
    assert_eq!(info.state(), pb::BreakerState::ForcedOpen);
    assert_eq!(c.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner().verdict(), pb::Verdict::CircuitOpen);
    admin.set_breaker_state(set("payments", pb::BreakerState::Closed)).await.unwrap();
    assert_eq!(c.acquire(acquire("payments", &[], 1)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    let list = admin.list_breakers(pb::ListBreakersRequest {}).await.unwrap().into_inner();
    assert_eq!(list.breakers.iter().map(|b| b.resource.as_str()).collect::<Vec<_>>(), ["payments"]);
}

#[tokio::test]
async fn shedding_follows_the_level_and_every_answer_carries_it() {
    let fg = floodgate().rules(RULES).start();
    let mut c = fg.client().await;
    let mut admin = fg.admin().await;
    let mut watch = c.watch(pb::WatchRequest { resources: vec!["payments".into()] }).await.unwrap().into_inner();
    watch.message().await.unwrap();
    let r = admin
        .set_degradation_level(pb::SetDegradationLevelRequest { level: 2, automatic: false, ..Default::default() })
        .await
        .unwrap();
    assert_eq!((r.get_ref().level, r.get_ref().manual), (2, true));
    let shed = c.acquire(acquire("reports", &[], 1)).await.unwrap().into_inner();
    assert_eq!((shed.verdict(), shed.degradation_level), (pb::Verdict::Shed, 2));
    let other = c.acquire(acquire("db", &[], 1)).await.unwrap().into_inner();
    assert_eq!((other.verdict(), other.degradation_level), (pb::Verdict::Allowed, 2));
    admin
        .set_degradation_level(pb::SetDegradationLevelRequest { level: 0, automatic: true, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(c.acquire(acquire("reports", &[], 1)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    let mut changes = Vec::new();
    while changes.len() < 2 {
        if let Some(Kind::Degradation(d)) = watch.message().await.unwrap().unwrap().event {
            changes.push((d.from_level, d.to_level, d.manual));
        }
    }
    assert_eq!(changes, [(0, 2, true), (2, 0, true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_does_not_read_never_slows_the_server() {
    let fg = floodgate().rules(RULES).start();
    // Opened and not read while thousands of events are published. (What it
    // is sent when it falls behind, a fresh snapshot, is tested in-process in
    // grpc::watch, where falling behind can be forced deterministically.)
    let mut slow = fg.client().await.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    let mut admin = fg.admin().await;
    for _ in 0..2000 {
        admin
            .apply_rules(pb::ApplyRulesRequest { yaml: RULES.into(), validate_only: false, ..Default::default() })
            .await
            .unwrap();
    }
    let mut c = fg.client().await;
    assert_eq!(c.acquire(acquire("db", &[], 1)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    // The watcher then reads an ordered stream that ends with the last version.
    let (mut last_seq, mut last_version) = (0, 0);
    while last_version < 2001 {
        let e =
            tokio::time::timeout(Duration::from_secs(10), slow.message()).await.expect("an event").unwrap().unwrap();
        assert_eq!(e.sequence, last_seq + 1);
        last_seq = e.sequence;
        match e.event {
            Some(Kind::Rules(r)) => last_version = r.version,
            Some(Kind::Snapshot(s)) => last_version = last_version.max(s.rules_version),
            _ => {}
        }
    }
}

#[test]
fn bench_runs_acquire_then_report_pairs() {
    let fg = floodgate().rules(RULES).start();
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--server",
            &fg.grpc,
            "--rpc",
            "report",
            "--resource",
            "db",
            "-n",
            "200",
            "-c",
            "4",
            "--format",
            "json",
            "-q",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((r["count"].as_u64(), r["verdicts"]["COUNTED"].as_u64()), (Some(200), Some(200)));
    let page = fg.http_get("/metrics").1;
    assert!(
        page.lines().any(|l| l == r#"floodgate_outcomes_total{resource="db",outcome="SUCCESS",result="counted"} 200"#),
        "{page}"
    );
}

/// The sum of the series of `metric` whose labels hold `labels`.
fn sum_of(page: &str, metric: &str, labels: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn bench_sends_the_calls_of_a_data_file_in_turn() {
    let fg = floodgate().rules(RULES).start();
    let data = fg.dir().write(
        "calls.json",
        r#"[{"resource": "reports", "descriptors": {"user": "a"}}, {"resource": "payments", "cost": 2}, {"resource": "db"}]"#,
    );
    let r = bench(&fg.grpc, &["--rpc", "acquire", "--data", path_str(&data), "-n", "30", "-c", "3"]);
    assert_eq!((r["count"].as_u64(), r["statusCodeDistribution"]["OK"].as_u64()), (Some(30), Some(30)), "{r}");
    assert_eq!(r["options"]["data"].as_str(), Some(path_str(&data)));
    let page = fg.http_get("/metrics").1;
    for resource in ["reports", "payments", "db"] {
        let label = format!(r#"resource="{resource}""#);
        assert_eq!(sum_of(&page, "floodgate_decisions_total", &label), 10.0, "{resource}: {page}");
    }
    // A file that is not a list of calls is refused before any call.
    let bad = fg.dir().write("bad.json", r#"[{"resource": "db", "weight": 2}]"#);
    let out = std::process::Command::new(BIN)
        .args(["bench", "--server", &fg.grpc, "--data", path_str(&bad), "-n", "1", "-q"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("not a JSON list of calls"), "{said}");
    // Bad numbers name the flag and the value; a negative ratio is read as
    // a number, not as a flag.
    for (args, says) in [
        (vec!["--rpc", "report", "--failure-ratio", "-0.1"], "--failure-ratio must be between 0 and 1, got -0.1"),
        (vec!["--cost", "0"], "--cost"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["bench", "--server", &fg.grpc, "-n", "1", "-q"])
            .args(&args)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(says), "{args:?}: {said}");
    }
}

#[test]
fn bench_reports_failures_at_a_ratio_and_opens_a_breaker() {
    let fg = floodgate().rules(RULES).start();
    let r = bench(
        &fg.grpc,
        &["--rpc", "report", "--resource", "payments", "--failure-ratio", "0.5", "-n", "100", "-c", "1"],
    );
    assert_eq!(r["statusCodeDistribution"]["OK"].as_u64(), Some(100), "denied calls are answers, not errors: {r}");
    let counted = r["verdicts"]["COUNTED"].as_u64().unwrap_or(0);
    let open = r["verdicts"]["CIRCUIT_OPEN"].as_u64().unwrap_or(0);
    assert!(counted >= 6 && open > 0, "the breaker opened on half of the calls failing: {r}");
    let page = fg.http_get("/metrics").1;
    let failures = sum_of(&page, "floodgate_outcomes_total", r#"outcome="FAILURE""#);
    let successes = sum_of(&page, "floodgate_outcomes_total", r#"outcome="SUCCESS""#);
    assert!(failures >= 3.0 && (failures - successes).abs() <= 1.0, "every other report a failure: {page}");
}
