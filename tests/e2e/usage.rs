//! Costs from usage through the real binary: limits whose `cost` formula
//! reads the usage a call reports (`input_tokens`, `output_tokens`), each
//! budget taking its own cost, on a strict limit in Redis and on limits
//! each replica keeps alone, with the report sent to the replica that did
//! not issue the permit, Charge, the CLI, the decision log, and usage the
//! rule does not read refused.

use crate::support;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use support::*;

const RULES: &str = r#"
resources:
  - name: chat
    usage: [input_tokens, cached_input_tokens, output_tokens]
    limits:
      - { name: calls, key: [tenant], algorithm: fixed_window, limit: 1000, window: 1h, sync: local }
      - name: input
        key: [tenant]
        algorithm: token_bucket
        capacity: 10000
        refill_per_second: 0.001
        sync: strict
        cost: input_tokens - cached_input_tokens + cached_input_tokens / 10
      - { name: output, key: [tenant], algorithm: token_bucket, capacity: 5000, refill_per_second: 0.001, sync: local, cost: output_tokens * 2 }
"#;

fn usage(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn tenant(t: &str) -> HashMap<String, String> {
    HashMap::from([("tenant".to_string(), t.to_string())])
}

fn ask(t: &str, expected: &[(&str, u64)]) -> pb::AcquireRequest {
    pb::AcquireRequest {
        resource: "chat".into(),
        descriptors: tenant(t),
        settle: true,
        usage: usage(expected),
        ..Default::default()
    }
}

/// What each limit has left for tenant `t`, in rule order, as `fg` sees it.
async fn left(fg: &Floodgate, t: &str) -> Vec<u64> {
    let peek = pb::PeekRequest { resource: "chat".into(), descriptors: tenant(t), ..Default::default() };
    fg.admin().await.peek(peek).await.unwrap().into_inner().limits.iter().map(|l| l.remaining).collect()
}

/// Waits until `fg` sees `want` left for `t`.
async fn until_left(fg: &Floodgate, t: &str, want: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = left(fg, t).await;
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "saw {now:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_budget_takes_its_cost_from_usage_across_two_replicas() {
    let (redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let a = floodgate().args(&args).args(["--decision-log", "1"]).start();
    let b = floodgate().args(&args).start();
    wait_live(&a, 2);
    wait_live(&b, 2);
    let (mut ca, mut cb) = (a.client().await, b.client().await);

    // Reserved on A: 1 call, 1,200 input tokens (strict, in Redis), 1,000
    // output tokens at 2 units each.
    let r = ca.acquire(ask("t1", &[("input_tokens", 1200), ("output_tokens", 1000)])).await.unwrap().into_inner();
    assert_eq!(r.verdict(), pb::Verdict::Allowed, "{r:?}");
    assert_eq!(r.limits.iter().map(|l| l.remaining).collect::<Vec<_>>(), [999, 8800, 3000]);

    // The decision log says what each limit was asked.
    let out = Command::new(BIN).args(["why", "--server", &a.grpc, "-d", "tenant=t1"]).output().unwrap();
    let why = String::from_utf8_lossy(&out.stdout);
    assert!(why.contains("usage input_tokens=1200,output_tokens=1000"), "{why}");
    assert!(why.contains("costs: calls 1, input 1200, output 2000"), "{why}");

    // Reported to B, which did not issue the permit: it passes the report
    // (with its usage) to A. 1,200 input tokens of which 200 cached cost
    // 1,000 + 20; 300 output tokens cost 600.
    let report = pb::ReportOutcomeRequest {
        resource: "chat".into(),
        permit_id: r.permit_id.clone(),
        outcome: pb::Outcome::Success as i32,
        usage: usage(&[("input_tokens", 1200), ("cached_input_tokens", 200), ("output_tokens", 300)]),
        ..Default::default()
    };
    // A misspelt field is refused by A, and B says so (INVALID_ARGUMENT,
    // not "not counted"); the permit is left to report again.
    let typo = pb::ReportOutcomeRequest { usage: usage(&[("outptu_tokens", 3)]), ..report.clone() };
    let refused = cb.report_outcome(typo).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("usage: 'outptu_tokens' is not a usage field of rule 'chat'"), "{refused:?}");
    let reported = cb.report_outcome(report).await.unwrap().into_inner();
    assert!(reported.counted && reported.settled, "{reported:?}");
    until_left(&a, "t1", &[999, 8980, 4400]).await;
    let key = "fg:b:{chat}:input:token_bucket:t1";
    let in_redis: f64 = redis.cli(&["HGET", key, "t"]).and_then(|t| t.parse().ok()).unwrap_or(f64::NAN);
    assert!((8979.0..=8981.0).contains(&in_redis), "the strict budget in Redis: {in_redis}");

    // A Charge through B of input tokens only: the strict budget in Redis
    // takes it, the others do not (its `cost` of 0 takes no call).
    let charge = pb::ChargeRequest {
        idempotency_key: String::new(),
        resource: "chat".into(),
        descriptors: tenant("t1"),
        cost: 0,
        usage: usage(&[("input_tokens", 980)]),
    };
    let charged = cb.charge(charge).await.unwrap().into_inner();
    // B keeps its own `calls` and `output` (local limits): untouched.
    assert_eq!(charged.limits.iter().map(|l| l.remaining).collect::<Vec<_>>(), [1000, 8000, 5000], "{charged:?}");
    until_left(&a, "t1", &[999, 8000, 4400]).await;
    until_left(&b, "t1", &[1000, 8000, 5000]).await;

    // Usage the rule does not read, or that would cost more than a budget
    // holds, is refused, naming the field, and changes nothing.
    let typo = cb.acquire(ask("t1", &[("outptu_tokens", 5)])).await.unwrap_err();
    assert_eq!(typo.code(), tonic::Code::InvalidArgument);
    assert!(typo.message().starts_with("usage: 'outptu_tokens' is not a usage field of rule 'chat'"), "{typo:?}");
    let too_much = cb.acquire(ask("t1", &[("output_tokens", 2501)])).await.unwrap_err();
    assert_eq!(too_much.message(), "cost 5002 exceeds capacity 5000 of limit 'output'");
    let negative = ca.acquire(ask("t1", &[("cached_input_tokens", 50)])).await.unwrap_err();
    assert!(negative.message().starts_with("usage: limit 'input' would cost -45"), "{negative:?}");
    let bad_name = ca.acquire(ask("t1", &[("Input Tokens", 5)])).await.unwrap_err();
    assert!(bad_name.message().starts_with("usage: 'Input Tokens' is not a usage field name"), "{bad_name:?}");
    assert_eq!(left(&a, "t1").await, [999, 8000, 4400]);

    // A batch with one refused item applies none of them.
    let p1 = ca.acquire(ask("t2", &[("output_tokens", 10)])).await.unwrap().into_inner().permit_id;
    let p2 = ca.acquire(ask("t2", &[("output_tokens", 10)])).await.unwrap().into_inner().permit_id;
    let item = |id: &str, field: &str| pb::ReportOutcomeRequest {
        resource: "chat".into(),
        permit_id: id.into(),
        outcome: pb::Outcome::Success as i32,
        usage: usage(&[(field, 1)]),
        ..Default::default()
    };
    let batch = pb::ReportOutcomeBatchRequest { reports: vec![item(&p1, "output_tokens"), item(&p2, "zzz")] };
    let refused = ca.report_outcome_batch(batch).await.unwrap_err();
    assert!(refused.message().starts_with("reports[1].usage: 'zzz'"), "{refused:?}");
    let again = ca.report_outcome(item(&p1, "output_tokens")).await.unwrap().into_inner();
    assert!(again.counted && again.settled, "the first item was not applied: {again:?}");
    // The same through B, which issued neither permit: it refuses the
    // misspelt field from the resource's rule before passing anything on.
    let p3 = ca.acquire(ask("t2", &[("output_tokens", 10)])).await.unwrap().into_inner().permit_id;
    let batch = pb::ReportOutcomeBatchRequest { reports: vec![item(&p2, "output_tokens"), item(&p3, "zzz")] };
    let refused = cb.report_outcome_batch(batch).await.unwrap_err();
    assert!(refused.message().starts_with("reports[1].usage: 'zzz'"), "{refused:?}");
    let again = cb.report_outcome(item(&p2, "output_tokens")).await.unwrap().into_inner();
    assert!(again.counted && again.settled, "p2 was not applied by the refused batch: {again:?}");

    // The CLI reports usage too.
    let out = Command::new(BIN)
        .args(["acquire", "--server", &a.grpc, "chat", "-d", "tenant=cli", "--settle"])
        .args(["--usage", "input_tokens=100", "--usage", "output_tokens=50"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let permit = text.lines().find_map(|l| l.trim().strip_prefix("permit: ")).expect(&text).to_string();
    let out = Command::new(BIN)
        .args(["report", "--server", &b.grpc, "--outcome", "success", "--usage", "output_tokens=10", &permit])
        .args(["--usage", "input_tokens=100"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "counted, settled", "{out:?}");
    until_left(&a, "cli", &[999, 9900, 4980]).await;
}

/// A charge sent again with its idempotency key, to the same replica or the
/// other one, takes nothing and says so; a charge the server refuses (bad
/// input) does not use its key up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_sent_again_with_its_key_is_taken_once_across_replicas() {
    let (_redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_live(&b, 2);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let charge = |key: &str, input: u64| pb::ChargeRequest {
        resource: "chat".into(),
        descriptors: tenant("k"),
        cost: 0,
        usage: usage(&[("input_tokens", input)]),
        idempotency_key: key.into(),
    };
    let bad = cb.charge(pb::ChargeRequest { usage: usage(&[("nope", 1)]), ..charge("k1", 0) }).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let first = ca.charge(charge("k1", 700)).await.unwrap().into_inner();
    assert!(!first.duplicate);
    assert_eq!(first.limits[1].remaining, 9300, "{first:?}");
    for c in [&mut ca, &mut cb] {
        let again = c.charge(charge("k1", 700)).await.unwrap().into_inner();
        assert!(again.duplicate, "{again:?}");
    }
    // The duplicate's answer shows the strict budget as Redis holds it.
    let seen = cb.charge(charge("k1", 700)).await.unwrap().into_inner();
    assert_eq!((seen.limits[1].remaining, seen.limits[1].exceeded), (9300, false), "{seen:?}");
    // Another key is another charge, and so is one key for another caller.
    assert!(!cb.charge(charge("k2", 300)).await.unwrap().into_inner().duplicate);
    let other = pb::ChargeRequest { descriptors: tenant("k-other"), ..charge("k1", 5) };
    assert!(!ca.charge(other).await.unwrap().into_inner().duplicate);
    until_left(&a, "k", &[1000, 9000, 5000]).await;
    let long = cb.charge(charge(&"x".repeat(129), 1)).await.unwrap_err();
    assert!(long.message().starts_with("idempotency_key: 129 bytes"), "{long:?}");
}

/// Many charges of one key sent at the same moment, half of them to each
/// replica, are taken exactly once: never by nobody, never twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_sent_at_once_to_both_replicas_is_taken_once() {
    let (_redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_live(&b, 2);
    let (ca, cb) = (a.client().await, b.client().await);
    const KEYS: u64 = 150;
    for k in 0..KEYS {
        let mut tries = Vec::new();
        for i in 0..8 {
            let mut c = if i % 2 == 0 { ca.clone() } else { cb.clone() };
            let req = pb::ChargeRequest {
                resource: "chat".into(),
                descriptors: tenant("race"),
                cost: 0,
                usage: usage(&[("input_tokens", 1)]),
                idempotency_key: format!("race-{k}"),
            };
            tries.push(tokio::spawn(async move { c.charge(req).await.unwrap().into_inner().duplicate }));
        }
        let mut taken = 0;
        for t in tries {
            taken += u64::from(!t.await.unwrap());
        }
        assert_eq!(taken, 1, "key race-{k}: {taken} of 8 charges were taken");
    }
    // The strict budget (10,000 a window) holds exactly one unit per key.
    until_left(&a, "race", &[1000, 10_000 - KEYS, 5000]).await;
}

/// When one strict budget runs out, the answer names that one, not every
/// strict limit of the rule (each is marked exceeded only when it denied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_denial_names_the_budget_that_ran_out() {
    const TWO: &str = r#"
resources:
  - name: paid
    usage: [input_tokens, output_tokens]
    limits:
      - { name: input, key: [tenant], algorithm: fixed_window, limit: 1000, window: 1h, sync: strict, cost: input_tokens }
      - { name: output, key: [tenant], algorithm: fixed_window, limit: 1000, window: 1h, sync: strict, cost: output_tokens }
"#;
    let (_redis, _dir, args) = replicated(TWO);
    let fg = floodgate().args(strs(&args)).start();
    wait_redis_up(&fg);
    let mut c = fg.client().await;
    let ask = |input: u64, output: u64| pb::AcquireRequest {
        resource: "paid".into(),
        descriptors: tenant("s"),
        usage: usage(&[("input_tokens", input), ("output_tokens", output)]),
        ..Default::default()
    };
    assert_eq!(c.acquire(ask(10, 990)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    let denied = c.acquire(ask(10, 20)).await.unwrap().into_inner();
    assert_eq!(denied.verdict(), pb::Verdict::RateLimited, "{denied:?}");
    let exceeded: Vec<&str> = denied.limits.iter().filter(|l| l.exceeded).map(|l| l.name.as_str()).collect();
    assert_eq!(exceeded, ["output"], "{denied:?}");
    assert_eq!(denied.limits[0].remaining, 990, "input was not taken: {denied:?}");
    assert!(denied.reason.contains("'output'") && !denied.reason.contains("'input'"), "{}", denied.reason);
    // A charge that takes nothing from a strict budget shows what Redis
    // last said it had left, not 0 (which reads as "in debt").
    let charge = pb::ChargeRequest {
        resource: "paid".into(),
        descriptors: tenant("s"),
        usage: usage(&[("input_tokens", 5)]),
        ..Default::default()
    };
    let charged = c.charge(charge).await.unwrap().into_inner();
    let left: Vec<(u64, bool)> = charged.limits.iter().map(|l| (l.remaining, l.exceeded)).collect();
    assert_eq!(left, [(985, false), (10, false)], "{charged:?}");
}

/// A charge's key noted while Redis is away is claimed there when it comes
/// back: a retry that then reaches the other replica takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_noted_while_redis_was_away_is_known_to_the_other_replica_after() {
    let (mut redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_live(&b, 2);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let charge = |key: &str| pb::ChargeRequest {
        resource: "chat".into(),
        descriptors: tenant("o"),
        cost: 0,
        usage: usage(&[("input_tokens", 100)]),
        idempotency_key: key.into(),
    };
    redis.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.http_get("/api/v1/console").1.contains("\"redis_up\":false") {
        assert!(Instant::now() < deadline, "A never saw Redis go");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!ca.charge(charge("while-away")).await.unwrap().into_inner().duplicate);
    assert!(ca.charge(charge("while-away")).await.unwrap().into_inner().duplicate, "A itself remembers it");
    redis.restart();
    wait_redis_up(&a);
    wait_redis_up(&b);
    let retried = cb.charge(charge("while-away")).await.unwrap().into_inner();
    assert!(retried.duplicate, "B knows the key A noted while Redis was away: {retried:?}");
}
