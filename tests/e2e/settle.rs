//! Reserve, then settle, through the real binary: an estimate taken by
//! Acquire with `settle`, settled by ReportOutcome's `actual_cost` (given
//! back, or a debt), `Charge` for usage metered after the fact, the CLI, and
//! two replicas on a real Redis seeing each other's settlements.

use crate::support;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use support::*;

const RULES: &str = r#"
resources:
  - name: llm
    limits:
      - { name: tokens, key: [user], algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001 }
  - name: POST /v1/complete
    limits:
      - { name: tokens, key: [user], algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001 }
"#;

fn ask(user: &str, cost: u32) -> pb::AcquireRequest {
    pb::AcquireRequest {
        resource: "llm".into(),
        descriptors: HashMap::from([("user".into(), user.into())]),
        cost,
        settle: true,
        ..Default::default()
    }
}

fn settle(permit: &str, actual: u64) -> pb::ReportOutcomeRequest {
    pb::ReportOutcomeRequest {
        resource: "llm".into(),
        permit_id: permit.into(),
        outcome: pb::Outcome::Success as i32,
        actual_cost: Some(actual),
        ..Default::default()
    }
}

async fn tokens_left(fg: &Floodgate, user: &str) -> u64 {
    let peek = pb::PeekRequest {
        resource: "llm".into(),
        descriptors: HashMap::from([("user".into(), user.into())]),
        ..Default::default()
    };
    fg.admin().await.peek(peek).await.unwrap().into_inner().limits[0].remaining
}

#[tokio::test]
async fn estimates_are_settled_charged_and_carried_as_debt() {
    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES))]).start();
    let mut c = fg.client().await;

    // An LLM call estimated at 800 tokens used 300: 500 come back.
    let a = c.acquire(ask("u1", 800)).await.unwrap().into_inner();
    assert_eq!((a.verdict(), a.limits[0].remaining), (pb::Verdict::Allowed, 200));
    assert_eq!(a.permit_id.len(), 32, "a permit to settle with");
    let r = c.report_outcome(settle(&a.permit_id, 300)).await.unwrap().into_inner();
    assert!(r.counted && r.settled);
    assert_eq!(tokens_left(&fg, "u1").await, 700);
    let again = c.report_outcome(settle(&a.permit_id, 1)).await.unwrap().into_inner();
    assert!(!again.settled, "settled once");

    // One estimated at 500 used 1,900: 700 - 1,900 = a debt of 1,200.
    let b = c.acquire(ask("u1", 500)).await.unwrap().into_inner();
    assert!(c.report_outcome(settle(&b.permit_id, 1_900)).await.unwrap().into_inner().settled);
    let denied = c.acquire(ask("u1", 1)).await.unwrap().into_inner();
    assert_eq!(denied.verdict(), pb::Verdict::RateLimited);
    let retry = denied.retry_after.unwrap().seconds;
    assert!((1_200_000..=1_201_000).contains(&retry), "1,201 tokens at 0.001/s: {retry}s");

    // Reported without an actual cost, the estimate stands: the report is
    // counted (the permit was known), nothing is settled, and it is used up.
    let e = c.acquire(ask("u2", 100)).await.unwrap().into_inner();
    let mut plain_report = settle(&e.permit_id, 0);
    plain_report.actual_cost = None;
    let r = c.report_outcome(plain_report.clone()).await.unwrap().into_inner();
    assert!(r.counted && !r.settled, "{r:?}");
    assert!(!c.report_outcome(plain_report).await.unwrap().into_inner().counted, "reported once");
    assert_eq!(tokens_left(&fg, "u2").await, 900);

    // Unsettled, the estimate stands; without `settle`, no permit.
    let plain = c.acquire(pb::AcquireRequest { settle: false, ..ask("u2", 10) }).await.unwrap().into_inner();
    assert!(plain.permit_id.is_empty());

    // Charge: usage without asking, beyond the limit.
    let charged = c
        .charge(pb::ChargeRequest {
            idempotency_key: String::new(),
            usage: Default::default(),
            resource: "llm".into(),
            descriptors: HashMap::from([("user".into(), "u3".into())]),
            cost: 1_500,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((charged.limits[0].remaining, charged.limits[0].exceeded), (0, true));
    assert_eq!(c.acquire(ask("u3", 1)).await.unwrap().into_inner().verdict(), pb::Verdict::RateLimited);
    let bad = c.charge(pb::ChargeRequest { resource: "".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!((bad.code(), bad.message()), (tonic::Code::InvalidArgument, "resource: must not be empty"));

    // The CLI: acquire --settle, then report --actual-cost.
    let out = Command::new(BIN)
        .args(["acquire", "--server", &fg.grpc, "llm", "-d", "user=cli", "--cost", "100", "--settle"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let permit = text.lines().find_map(|l| l.trim().strip_prefix("permit: ")).expect(&text).to_string();
    let out = Command::new(BIN)
        .args(["report", "--server", &fg.grpc, "--outcome", "success", "--actual-cost", "40", &permit])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "counted, settled", "{out:?}");
    assert_eq!(tokens_left(&fg, "cli").await, 960);
}

/// Waits until `fg` answers `want` for one token of `user`'s bucket (real
/// calls: a replica pulls a bucket from Redis when traffic first touches it).
async fn eventually_verdict(fg: &Floodgate, user: &str, want: pb::Verdict) {
    let mut c = fg.client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let one = pb::AcquireRequest { settle: false, ..ask(user, 1) };
        if c.acquire(one).await.unwrap().into_inner().verdict() == want {
            return;
        }
        assert!(Instant::now() < deadline, "{user}: never {want:?} on the other replica");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_reach_the_other_replica_through_redis() {
    let (redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    let mut ca = a.client().await;

    // A debt settled on A empties the bucket for B too.
    let p = ca.acquire(ask("debt", 10)).await.unwrap().into_inner();
    assert!(ca.report_outcome(settle(&p.permit_id, 3_000)).await.unwrap().into_inner().settled);
    eventually_verdict(&b, "debt", pb::Verdict::RateLimited).await;

    // The whole bucket estimated on A and pushed to Redis (its tokens read
    // there), then given back: B admits again.
    let p = ca.acquire(ask("back", 1_000)).await.unwrap().into_inner();
    assert_eq!(p.verdict(), pb::Verdict::Allowed);
    // The bucket's hash (its leases live beside it, under `...:l`).
    let tokens_in_redis = || {
        let key = redis.cli(&["--scan", "--pattern", "fg:b:{llm}:tokens:token_bucket:*back"]).unwrap_or_default();
        let key = key.lines().next().unwrap_or_default().to_string();
        redis.cli(&["HGET", &key, "t"]).and_then(|t| t.parse::<f64>().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokens_in_redis().is_none_or(|t| t > 1.0) {
        assert!(Instant::now() < deadline, "A never pushed its estimate: {:?}", tokens_in_redis());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually_verdict(&b, "back", pb::Verdict::RateLimited).await;
    assert!(ca.report_outcome(settle(&p.permit_id, 0)).await.unwrap().into_inner().settled);
    eventually_verdict(&b, "back", pb::Verdict::Allowed).await;
    assert!(tokens_in_redis().is_some_and(|t| t > 900.0), "given back in Redis: {:?}", tokens_in_redis());
}

#[tokio::test]
async fn the_client_crate_settles_from_a_guard_and_from_an_http_response() {
    use axum::{Router, routing::get};
    use floodgate_client::http::{ActualCost, FloodgateLayer};
    use floodgate_client::{Acquire, Client};
    use tower::ServiceExt;

    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES))]).start();
    let client = Client::builder().endpoint(fg.url()).watch(false).build().unwrap();

    // A guard: estimated at 500, the call says it used 120.
    let answer = client
        .guard(Acquire::new("llm").descriptor("user", "guard").cost(500))
        .run_metered(|| async { (Ok::<_, std::io::Error>("completion"), 120) })
        .await
        .unwrap();
    assert_eq!(answer, "completion");
    client.flush().await;
    assert_eq!(tokens_left(&fg, "guard").await, 880);

    // The HTTP layer: estimated at 300; one response says 70 in a header,
    // another 450 in an extension.
    let app = Router::new()
        .route("/header", get(|| async { ([("x-tokens-used", "70")], "ok") }))
        .route(
            "/extension",
            get(|| async {
                let mut r = http::Response::new(axum::body::Body::from("ok"));
                r.extensions_mut().insert(ActualCost(450));
                r
            }),
        )
        .layer(
            FloodgateLayer::new(client.clone())
                .describe(|req| Some(Acquire::new("llm").descriptor("user", &req.uri.path()[1..]).cost(300)))
                .actual_cost_header("x-tokens-used")
                .unwrap(),
        );
    for path in ["/header", "/extension"] {
        let r = app.clone().oneshot(http::Request::get(path).body(axum::body::Body::empty()).unwrap()).await.unwrap();
        assert_eq!(r.status(), 200);
    }
    client.flush().await;
    assert_eq!(tokens_left(&fg, "header").await, 930);
    assert_eq!(tokens_left(&fg, "extension").await, 550);
    assert!(FloodgateLayer::new(client).actual_cost_header("bad header").is_err(), "bad input is an error");
}

const LOG: &str = r#"
resources:
  - name: log
    limits:
      - { name: exact, algorithm: sliding_window_log, limit: 10, window: 2s }
"#;

/// Giving back on a sliding log returns only the settling caller's entries:
/// an estimate of 5 at 0 s, five other calls at 0.6 s, the estimate settled
/// at 0. At 2.1 s the estimate's entries would have left the window, the
/// others' not: only 5 more fit. (Before, the newest five, the others', went
/// back: 10 more were admitted, 15 within 1.5 s on a limit of 10 per 2 s.)
#[tokio::test]
async fn a_sliding_log_gives_back_only_the_settled_callers_entries() {
    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", LOG))]).start();
    let mut c = fg.client().await;
    let call =
        |cost: u32, settle: bool| pb::AcquireRequest { resource: "log".into(), cost, settle, ..Default::default() };
    let started = Instant::now();
    let estimate = c.acquire(call(5, true)).await.unwrap().into_inner();
    assert_eq!(estimate.verdict(), pb::Verdict::Allowed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    for _ in 0..5 {
        assert_eq!(c.acquire(call(1, false)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    }
    let settled = pb::ReportOutcomeRequest {
        resource: "log".into(),
        permit_id: estimate.permit_id,
        outcome: pb::Outcome::Success as i32,
        actual_cost: Some(0),
        ..Default::default()
    };
    assert!(c.report_outcome(settled).await.unwrap().into_inner().settled);
    tokio::time::sleep(Duration::from_millis(2100).saturating_sub(started.elapsed())).await;
    let mut admitted = 0;
    for _ in 0..12 {
        admitted += u32::from(c.acquire(call(1, false)).await.unwrap().into_inner().verdict() == pb::Verdict::Allowed);
    }
    assert!(started.elapsed() < Duration::from_millis(2550), "the others' entries must still be in the window");
    assert_eq!(admitted, 5, "the others' 5 + 5 more = the limit of 10 in the window");
}

const STRICT: &str = r#"
resources:
  - name: strict
    limits:
      - { name: tokens, key: [user], algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001, sync: strict }
  - name: log
    limits:
      - { name: exact, key: [user], algorithm: sliding_window_log, limit: 10, window: 1h, sync: strict }
  - name: debt
    limits:
      - { name: tokens, key: [user], algorithm: token_bucket, capacity: 10, refill_per_second: 1 }
"#;

fn on(resource: &str, user: &str, cost: u32, settle: bool) -> pb::AcquireRequest {
    pb::AcquireRequest {
        resource: resource.into(),
        descriptors: HashMap::from([("user".into(), user.into())]),
        cost,
        settle,
        ..Default::default()
    }
}

fn settled_at(resource: &str, permit: &str, actual: u64) -> pb::ReportOutcomeRequest {
    pb::ReportOutcomeRequest { resource: resource.into(), ..settle(permit, actual) }
}

/// Calls `resource` (cost 1, user "other") through `fg` until it logs a
/// restore after byte `from` of its logs: a replica finds Redis older at its
/// next call and puts back what it knew first.
async fn call_until_restored(fg: &Floodgate, resource: &str, from: usize, deadline: Instant) {
    let mut c = fg.client().await;
    while !fg.logs()[from..].contains("Redis had lost this resource's state") {
        assert!(Instant::now() < deadline, "the replica never restored: {}", fg.logs());
        let _ = c.acquire(on(resource, "other", 1, false)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The tokens Redis holds in `user`'s bucket of STRICT's `strict` resource.
fn strict_tokens(redis: &support::redis::RedisServer, user: &str) -> f64 {
    let key = format!("fg:b:{{strict}}:tokens:token_bucket:{user}");
    redis.cli(&["HGET", &key, "t"]).and_then(|t| t.parse().ok()).unwrap_or(f64::NAN)
}

/// Strict limits are charged and settled in Redis too (before: Charge left
/// a strict limit untouched, and estimates on strict limits stood).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charge_and_settle_reach_strict_limits_in_redis() {
    let (_redis, _dir, args) = replicated(STRICT);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    let (mut ca, mut cb) = (a.client().await, b.client().await);

    // Charge 5000 on a strict bucket of 1000: a debt of 4000, on both replicas.
    let charge = pb::ChargeRequest {
        idempotency_key: String::new(),
        usage: Default::default(),
        resource: "strict".into(),
        descriptors: HashMap::from([("user".into(), "c".into())]),
        cost: 5000,
    };
    let charged = ca.charge(charge).await.unwrap().into_inner();
    assert_eq!((charged.limits[0].remaining, charged.limits[0].exceeded), (0, true), "{charged:?}");
    let after = cb.acquire(on("strict", "c", 1, false)).await.unwrap().into_inner();
    assert_eq!(after.verdict(), pb::Verdict::RateLimited, "{after:?}");

    // An estimate of 600 settled at 100 on A: 500 back, as B sees.
    let e = ca.acquire(on("strict", "s", 600, true)).await.unwrap().into_inner();
    assert_eq!((e.verdict(), e.limits[0].remaining), (pb::Verdict::Allowed, 400));
    assert!(ca.report_outcome(settled_at("strict", &e.permit_id, 100)).await.unwrap().into_inner().settled);
    let seen = cb.acquire(on("strict", "s", 1, false)).await.unwrap().into_inner();
    assert_eq!(seen.limits[0].remaining, 899, "1000 - 100 - 1: {seen:?}");

    // A strict sliding log gives back only the settled estimate's entries.
    let est = ca.acquire(on("log", "l", 5, true)).await.unwrap().into_inner();
    assert_eq!(est.verdict(), pb::Verdict::Allowed);
    for _ in 0..5 {
        assert_eq!(cb.acquire(on("log", "l", 1, false)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    }
    assert!(ca.report_outcome(settled_at("log", &est.permit_id, 0)).await.unwrap().into_inner().settled);
    let mut admitted = 0;
    for _ in 0..8 {
        let v = cb.acquire(on("log", "l", 1, false)).await.unwrap().into_inner().verdict();
        admitted += u32::from(v == pb::Verdict::Allowed);
    }
    assert_eq!(admitted, 5, "the estimate's 5 came back, not the others'");
}

/// A strict Charge that leaves a bucket owing 1 or 2 is done once. Redis's
/// answer is what the bucket has left, and -1 and -2 used to be the words for
/// "too late" (so the charge was asked again) and "Redis lost the resource"
/// (so a stale figure was restored, and the charge asked again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_charge_into_a_debt_of_one_or_two_is_taken_once() {
    let (redis, _dir, args) = replicated(STRICT);
    let fg = floodgate().args(strs(&args)).start();
    // Redis answers before the charges (while it is away they are owed).
    wait_redis_up(&fg);
    let mut c = fg.client().await;
    for (user, cost, left) in [("one", 1001, -1.0), ("two", 1002, -2.0), ("three", 1003, -3.0)] {
        let charge = pb::ChargeRequest {
            idempotency_key: String::new(),
            usage: Default::default(),
            resource: "strict".into(),
            descriptors: HashMap::from([("user".into(), user.into())]),
            cost,
        };
        let charged = c.charge(charge).await.unwrap().into_inner();
        assert!(charged.limits[0].exceeded, "{charged:?}");
        let key = format!("fg:b:{{strict}}:tokens:token_bucket:{user}");
        let tokens: f64 = redis.cli(&["HGET", &key, "t"]).and_then(|t| t.parse().ok()).unwrap();
        assert!((tokens - left).abs() < 0.1, "{user}: Charge {cost} on 1000 left {tokens} in Redis, not {left}");
    }
    assert!(!fg.logs().contains("Redis had lost"), "nothing was lost: {}", fg.logs());
}

/// A strict Charge while Redis is away is owed and paid when it is back;
/// meanwhile (`on_redis_error: local`) it is taken from this replica's
/// outage figure like what it admits, and a charge Redis answered before the
/// outage is where that figure starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_charge_while_redis_is_away_is_owed_and_paid() {
    let (mut redis, _dir, args) = replicated(STRICT);
    let fg = floodgate().args(strs(&args)).start();
    wait_live(&fg, 1);
    let mut c = fg.client().await;
    let charge = |user: &str, cost: u64| pb::ChargeRequest {
        idempotency_key: String::new(),
        usage: Default::default(),
        resource: "strict".into(),
        descriptors: HashMap::from([("user".into(), user.into())]),
        cost,
    };
    // Charged only (never acquired) while Redis answers: 700 left there.
    let before = c.charge(charge("known", 300)).await.unwrap().into_inner();
    assert_eq!(before.limits[0].remaining, 700, "{before:?}");
    redis.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fg.http_get("/api/v1/console").1.contains("\"redis_up\":false") {
        assert!(Instant::now() < deadline, "the replica never saw Redis go");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (user, cost, exceeded, remaining) in
        [("big", 1001, true, 0), ("whole", 1000, true, 0), ("small", 10, false, 990), ("known", 100, false, 600)]
    {
        let charged = c.charge(charge(user, cost)).await.unwrap().into_inner();
        let got = (charged.limits[0].exceeded, charged.limits[0].remaining);
        assert_eq!(got, (exceeded, remaining), "{user}: {charged:?}");
    }
    // Used up stays used up here; "known" had 600 left of Redis's 700.
    assert_eq!(
        c.acquire(on("strict", "whole", 100, false)).await.unwrap().into_inner().verdict(),
        pb::Verdict::RateLimited
    );
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u32::from(
            c.acquire(on("strict", "known", 100, false)).await.unwrap().into_inner().verdict() == pb::Verdict::Allowed,
        );
    }
    assert_eq!(admitted, 6, "the outage starts from Redis's 700 less the 100 charged in it");
    redis.restart();
    wait_redis_up(&fg);
    for (user, left) in [("big", -1.0), ("whole", 0.0), ("small", 990.0), ("known", 0.0)] {
        let key = format!("fg:b:{{strict}}:tokens:token_bucket:{user}");
        let tokens: f64 = redis.cli(&["HGET", &key, "t"]).and_then(|t| t.parse().ok()).unwrap();
        assert!((tokens - left).abs() < 0.1, "{user}: {tokens} left in Redis after the outage, not {left}");
    }
}

/// A strict bucket that charges took beyond its limit keeps that debt when
/// Redis comes back from an older dump: the replica puts back what Redis
/// last told it, below zero (before, it knew at most 0, and the units
/// charged beyond the limit were free again after the restore).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_beyond_a_strict_limit_survives_redis_coming_back_older() {
    let (mut redis, _dir, args) = replicated(STRICT);
    let fg = floodgate().args(strs(&args)).start();
    wait_redis_up(&fg);
    let mut c = fg.client().await;
    let charge = |user: &str, cost: u64| pb::ChargeRequest {
        idempotency_key: String::new(),
        usage: Default::default(),
        resource: "strict".into(),
        descriptors: HashMap::from([("user".into(), user.into())]),
        cost,
    };
    // The dump knows "over" with 900 left; then a charge takes it to -300.
    c.charge(charge("over", 100)).await.unwrap();
    redis.bgsave();
    let charged = c.charge(charge("over", 1200)).await.unwrap().into_inner();
    assert!(charged.limits[0].exceeded, "{charged:?}");
    // A decision reads the debt back from Redis (it answers 0 left).
    let denied = c.acquire(on("strict", "over", 1, false)).await.unwrap().into_inner();
    assert_eq!(denied.verdict(), pb::Verdict::RateLimited, "{denied:?}");
    redis.restart();
    // The next decision finds Redis older and restores before it decides.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let asked = c.acquire(on("strict", "over", 1, false)).await;
        if fg.logs().contains("Redis had lost this resource's state") {
            assert_eq!(asked.unwrap().into_inner().verdict(), pb::Verdict::RateLimited);
            break;
        }
        assert!(Instant::now() < deadline, "the replica never restored: {}", fg.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = "fg:b:{strict}:tokens:token_bucket:over";
    let tokens: f64 = redis.cli(&["HGET", key, "t"]).and_then(|t| t.parse().ok()).unwrap();
    assert!((tokens + 300.0).abs() < 1.0, "Redis holds {tokens} after the restore, not the debt of -300");
}

/// Give-backs on a strict bucket survive Redis coming back older. Every
/// change to a strict bucket answers its replica with the figure after it,
/// so the most recent answer is the truth; the lowest one may predate a
/// give-back (before, a restore kept the lowest figure across replicas and
/// Redis's own, and both give-backs here were lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_give_backs_survive_redis_coming_back_older() {
    let (mut redis, _dir, args) = replicated(STRICT);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_redis_up(&b);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let remaining = |r: pb::AcquireResponse| (r.verdict(), r.limits[0].remaining);

    // "later": the dump holds its estimate; the settle after it gives back.
    let later = ca.acquire(on("strict", "later", 600, true)).await.unwrap().into_inner();
    assert_eq!(remaining(later.clone()), (pb::Verdict::Allowed, 400));
    redis.bgsave();
    assert!(ca.report_outcome(settled_at("strict", &later.permit_id, 100)).await.unwrap().into_inner().settled);

    // "stale": B's last answer (300 left) predates A's give-back (800 left).
    let stale = ca.acquire(on("strict", "stale", 600, true)).await.unwrap().into_inner();
    assert_eq!(remaining(stale.clone()), (pb::Verdict::Allowed, 400));
    assert_eq!(
        remaining(cb.acquire(on("strict", "stale", 100, false)).await.unwrap().into_inner()),
        (pb::Verdict::Allowed, 300)
    );
    assert!(ca.report_outcome(settled_at("strict", &stale.permit_id, 100)).await.unwrap().into_inner().settled);

    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    for fg in [&a, &b] {
        call_until_restored(fg, "strict", 0, deadline).await;
    }
    let (later, stale) = (strict_tokens(&redis, "later"), strict_tokens(&redis, "stale"));
    assert!((later - 900.0).abs() < 1.0, "\"later\" holds {later} after the restore, not 1000 - 100");
    assert!((stale - 800.0).abs() < 1.0, "\"stale\" holds {stale} after the restore, not 1000 - 100 - 100");
}

/// A replica that knew nothing of a strict bucket, and changes it after
/// Redis came back older but before the replica that knew it restores it,
/// does not make the older figure look like the newest: the knowing
/// replica's figure still lowers it (before, the change dated Redis's
/// figure after the knowing replica's last answer, and the 800 units taken
/// since the dump were free again for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_an_unknowing_replica_does_not_hide_a_strict_loss() {
    let (mut redis, _dir, args) = replicated(STRICT);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_redis_up(&b);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    assert_eq!(ca.acquire(on("strict", "hidden", 100, false)).await.unwrap().into_inner().limits[0].remaining, 900);
    redis.bgsave();
    assert_eq!(ca.acquire(on("strict", "hidden", 800, false)).await.unwrap().into_inner().limits[0].remaining, 100);

    // A cannot restore while it is stopped; B, which never used "hidden",
    // takes 1 from the older figure (900) meanwhile.
    signal(a.pid(), "STOP");
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "B never took from the older figure: {}", b.logs());
        if let Ok(r) = cb.acquire(on("strict", "hidden", 1, false)).await
            && r.get_ref().verdict() == pb::Verdict::Allowed
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(a.pid(), "CONT");
    call_until_restored(&a, "strict", 0, deadline).await;
    let tokens = strict_tokens(&redis, "hidden");
    // Exact is 99 (A's 100 less B's 1); B's take may be lost (100), never the 800.
    assert!((98.5..=100.5).contains(&tokens), "\"hidden\" holds {tokens} after A's restore, not 99 or 100");
}

/// Redis goes back to the same older dump twice, and between the two a
/// replica takes from the first restore before the replica that knew more
/// could restore it. That take's figure is newer, but lacks what the other
/// replica knew: figures given under different marker tokens are not
/// compared by time (before, it won, and 400 units taken after the dump
/// were free again: 550 left instead of 150).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rollbacks_to_one_dump_do_not_free_what_was_taken_after_it() {
    let (mut redis, _dir, args) = replicated(STRICT);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_redis_up(&b);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let left = |r: pb::AcquireResponse| r.limits[0].remaining;
    assert_eq!(left(ca.acquire(on("strict", "twice", 300, false)).await.unwrap().into_inner()), 700);
    assert_eq!(left(cb.acquire(on("strict", "twice", 100, false)).await.unwrap().into_inner()), 600);
    redis.bgsave();
    assert_eq!(left(ca.acquire(on("strict", "twice", 400, false)).await.unwrap().into_inner()), 200);

    // A cannot restore: stopped through the first rollback and B's take.
    signal(a.pid(), "STOP");
    redis.restart();
    // B's take goes through Redis, not its outage policy (whose answers
    // say B's share, 500, as the limit): B restores what it knew (the
    // dump's own figure), then takes 50 from it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let from = b.logs().len();
    loop {
        assert!(Instant::now() < deadline, "B never asked Redis after the first rollback: {}", b.logs());
        let peek = cb.acquire(pb::AcquireRequest { dry_run: true, ..on("strict", "twice", 1, false) }).await;
        if peek.is_ok_and(|r| r.get_ref().limits[0].limit == 1000) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // From the dump's 600 when B knew only its own figure; from A's 200
    // (exact) when B had refreshed its figure of the bucket from Redis
    // after A's take, which a slow (busy) machine gives it time to do.
    let took = cb.acquire(on("strict", "twice", 50, false)).await.unwrap().into_inner();
    assert_eq!(took.verdict(), pb::Verdict::Allowed, "{took:?}");
    assert!([550, 150].contains(&took.limits[0].remaining), "from the dump's 600 or A's 200: {took:?}");
    assert!(
        b.logs()[from..].contains("Redis had lost this resource's state"),
        "B took without restoring: {}",
        b.logs()
    );
    redis.restart();
    let from = [a.logs().len(), b.logs().len()];
    signal(a.pid(), "CONT");
    for (fg, from) in [&a, &b].into_iter().zip(from) {
        call_until_restored(fg, "strict", from, deadline).await;
    }
    let tokens = strict_tokens(&redis, "twice");
    // Exact is 150 (A's 200 less B's 50); B's take may be lost (200).
    assert!((149.5..=200.5).contains(&tokens), "\"twice\" holds {tokens} after both rollbacks, not 150 or 200");
}

/// A strict sliding log restored from a newer figure than Redis's older
/// copy: the copy's entries count from that figure's time, so that those
/// given back since (and standing in for later ones) do not free their
/// units when the older entries expire (before, 200 units given back after
/// the dump were free again once the first entries expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_strict_sliding_log_frees_nothing_before_its_time() {
    let (mut redis, _dir, args) = replicated(STRICT);
    let fg = floodgate().args(strs(&args)).start();
    wait_redis_up(&fg);
    let mut c = fg.client().await;
    let est = c.acquire(on("log", "x", 6, true)).await.unwrap().into_inner();
    assert_eq!(est.verdict(), pb::Verdict::Allowed);
    redis.bgsave();
    let redis_now = || -> i64 {
        let t = redis.cli(&["TIME"]).unwrap_or_default();
        let mut parts = t.lines().map(|l| l.trim().parse::<i64>().unwrap_or(0));
        parts.next().unwrap_or(0) * 1_000_000 + parts.next().unwrap_or(0)
    };
    let after_dump = redis_now();
    // 4 of the 6 given back, then 6 more taken: 8 entries stand, 6 from
    // after the dump. The dump holds the 6 of the estimate.
    assert!(c.report_outcome(settled_at("log", &est.permit_id, 2)).await.unwrap().into_inner().settled);
    assert_eq!(c.acquire(on("log", "x", 6, false)).await.unwrap().into_inner().limits[0].remaining, 2);
    redis.restart();
    call_until_restored(&fg, "log", 0, Instant::now() + Duration::from_secs(10)).await;
    let key = "fg:b:{log}:exact:sliding_window_log:x";
    let entries = redis.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"]).unwrap_or_default();
    let scores: Vec<i64> = entries.lines().skip(1).step_by(2).filter_map(|s| s.trim().parse().ok()).collect();
    assert_eq!(scores.len(), 8, "8 entries stand (2 of them restored): {entries}");
    assert!(scores.iter().all(|&s| s >= after_dump), "an entry of the older copy expires too soon: {entries}");
}

/// A charge far past a strict sliding log's limit is taken once, and costs
/// Redis what one of the limit does (before: one entry per unit; a charge
/// of 50,000 ran past --redis-timeout, was owed, paid again and again, and
/// the log grew without end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_charge_on_a_strict_sliding_log_is_taken_once_and_bounded() {
    let (redis, _dir, args) = replicated(STRICT);
    let fg = floodgate().args(strs(&args)).start();
    wait_live(&fg, 1);
    let mut c = fg.client().await;
    let charge = pb::ChargeRequest {
        idempotency_key: String::new(),
        usage: Default::default(),
        resource: "log".into(),
        descriptors: HashMap::from([("user".into(), "h".into())]),
        cost: 4_000_000_000,
    };
    let charged = c.charge(charge).await.unwrap().into_inner();
    assert!(charged.limits[0].exceeded, "{charged:?}");
    let key = "fg:b:{log}:exact:sliding_window_log:h";
    assert_eq!(redis.cli(&["ZCARD", key]).as_deref(), Some("10"), "entries after the charge");
    wait_syncs(&fg, 5);
    assert_eq!(redis.cli(&["ZCARD", key]).as_deref(), Some("10"), "entries five syncs later");
    assert_eq!(c.acquire(on("log", "h", 1, false)).await.unwrap().into_inner().verdict(), pb::Verdict::RateLimited);
    assert_eq!(c.acquire(on("log", "other", 1, false)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    assert!(!fg.logs().contains("unreachable"), "{}", fg.logs());
}

/// A debt on a replicated bucket is the replicas' debt: Charge 40 on a bucket
/// of 10 refilling 1/s through A, and B waits it out too (before: both said
/// 1 s and admitted as the local bucket refilled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_debt_is_waited_out_on_every_replica() {
    let (_redis, _dir, args) = replicated(STRICT);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    // B knows the bucket before the charge.
    assert_eq!(cb.acquire(on("debt", "d", 1, false)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);
    let charge = pb::ChargeRequest {
        idempotency_key: String::new(),
        usage: Default::default(),
        resource: "debt".into(),
        descriptors: HashMap::from([("user".into(), "d".into())]),
        cost: 40,
    };
    ca.charge(charge).await.unwrap();
    wait_syncs(&a, 2);
    wait_syncs(&b, 2);
    for fg in [&mut ca, &mut cb] {
        let denied = fg.acquire(on("debt", "d", 1, false)).await.unwrap().into_inner();
        assert_eq!(denied.verdict(), pb::Verdict::RateLimited);
        let retry = denied.retry_after.unwrap().seconds;
        assert!((25..=32).contains(&retry), "a debt of about 31 tokens at 1/s: retry in {retry}s");
    }
    // Nothing admitted for the next 2 s on either (the debt lasts about 30 s).
    let started = Instant::now();
    let mut admitted = 0;
    while started.elapsed() < Duration::from_secs(2) {
        for fg in [&mut ca, &mut cb] {
            admitted += u32::from(
                fg.acquire(on("debt", "d", 1, false)).await.unwrap().into_inner().verdict() == pb::Verdict::Allowed,
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(admitted, 0, "admitted during the debt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_layer_estimates_a_metered_route_beside_its_convenience_settings() {
    use axum::Router;
    use axum::routing::post;
    use floodgate_client::Client;
    use floodgate_client::http::FloodgateLayer;
    use tower::ServiceExt;

    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES))]).start();
    let client = Client::builder().endpoint(fg.url()).watch(false).build().unwrap();
    let app = Router::new().route("/v1/complete", post(|| async { ([("x-tokens-used", "250")], "ok") })).layer(
        FloodgateLayer::new(client.clone())
            .routes(["/v1/complete"])
            .descriptor_header("x-user", "user")
            .unwrap()
            .estimate(|req| req.headers.get("x-max-tokens").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1))
            .actual_cost_header("x-tokens-used")
            .unwrap(),
    );
    let call = |max_tokens: &str| {
        let req = http::Request::post("/v1/complete")
            .header("x-user", "ann")
            .header("x-max-tokens", max_tokens)
            .body(axum::body::Body::empty())
            .unwrap();
        app.clone().oneshot(req)
    };
    let left = || async {
        let peek = pb::PeekRequest {
            resource: "POST /v1/complete".into(),
            descriptors: HashMap::from([("user".into(), "ann".into())]),
            ..Default::default()
        };
        fg.admin().await.peek(peek).await.unwrap().into_inner().limits[0].remaining
    };
    // Estimated at 300 and settled at the 250 it used.
    assert_eq!(call("300").await.unwrap().status(), 200);
    client.flush().await;
    assert_eq!(left().await, 750);
    // An estimate of 900 does not fit in the 750 left: refused before the
    // call, not admitted on an estimate of 1.
    assert_eq!(call("900").await.unwrap().status(), 429);
    assert_eq!(left().await, 750);
}
