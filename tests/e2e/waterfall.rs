//! A waterfall of budgets through the real binary, two replicas and Redis:
//! a tenant streams until its first budget runs out mid stream, goes on
//! from its monthly allowance, then from its credits, then is stopped; each
//! answer and the decision log say which source paid, and the budgets
//! match the ledger exactly after the replica it streamed through is
//! killed mid stream.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use floodgate_client::{Acquire, Client, Flow, Metering, Outcome};
use floodgate_proto::v1 as pb;
use support::*;

/// Three strict budgets, each refilling so slowly (1 token in 1000 s)
/// that what a budget has taken can be read back from its reset time.
const RULES: &str = r#"
resources:
  - name: chat
    limits:
      - { name: minute, key: [tenant], algorithm: token_bucket, capacity: 300, refill_per_second: 0.001, sync: strict }
    waterfall:
      - { name: month, key: [tenant], algorithm: token_bucket, capacity: 500, refill_per_second: 0.001, sync: strict }
      - { name: credits, key: [tenant], algorithm: token_bucket, capacity: 200, refill_per_second: 0.001, sync: strict }
"#;

fn tenant(t: &str) -> HashMap<String, String> {
    HashMap::from([("tenant".to_string(), t.to_string())])
}

/// Seconds until each budget of `t` is full again, as replica `fg` reads
/// them (from Redis): at 1 token in 1000 s, a thousand times what it holds
/// taken (and owed).
async fn taken(fg: &Floodgate, t: &str) -> Vec<(String, f64)> {
    let peek = pb::PeekRequest { resource: "chat".into(), descriptors: tenant(t), ..Default::default() };
    let limits = fg.admin().await.peek(peek).await.unwrap().into_inner().limits;
    let reset = |l: &pb::LimitStatus| l.reset_after.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
    limits.iter().map(|l| (l.name.clone(), (reset(l) / 1000.0 * 100.0).round() / 100.0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_pays_from_each_budget_in_turn_and_the_ledger_holds_after_a_replica_dies() {
    let (_redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let a = floodgate().args(&args).args(["--decision-log", "1"]).start();
    let b = floodgate().args(&args).args(["--decision-log", "1"]).start();
    wait_live(&a, 2);
    wait_live(&b, 2);

    // The stream asks B first, A when B does not answer.
    let client = Client::builder()
        .endpoint(b.url())
        .endpoint(a.url())
        .request_timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let ask = Acquire::new("chat").descriptor("tenant", "t").cost(100);
    let Metering::Admitted(mut stream) = client.meter(&ask).await.unwrap() else { panic!("denied at the start") };
    assert_eq!(stream.paid_by(), "", "the reservation comes from the rule's own budget");

    // Chunks of 20: 5 within the reservation, 10 charged to the minute's
    // budget (300 in all), then 25 to the month's, then 10 to the credits;
    // the next finds no room anywhere and stops the stream, in debt by that
    // one chunk. B is killed after 5 chunks from the month.
    let mut b = Some(b);
    let mut paid = Vec::new();
    let stopped = loop {
        assert!(paid.len() < 100, "the stream was never stopped: {paid:?}");
        let flow = stream.add(20).await;
        paid.push(stream.paid_by().to_string());
        if paid.iter().filter(|p| *p == "month").count() == 5 && b.is_some() {
            drop(b.take()); // SIGKILL
        }
        if let Flow::Stop { limits } = flow {
            break limits;
        }
    };
    let count = |name: &str| paid.iter().filter(|p| *p == name).count();
    assert_eq!(paid.len(), 51, "{paid:?}");
    assert_eq!((count(""), count("month"), count("credits")), (15, 25, 11), "{paid:?}");
    assert_eq!(paid[14..16], ["", "month"], "the month pays from the chunk the minute has no room for");
    assert_eq!(paid[39..41], ["month", "credits"]);
    let names: Vec<&str> = stopped.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["credits"], "the stop names the last source, in debt: {stopped:?}");
    assert!(stopped[0].exceeded);
    stream.finish(Outcome::Success);

    // The ledger: 300 + 500 + 200 taken, and the credits owe the last chunk;
    // no chunk was lost or taken twice when B died.
    let want = vec![("minute".to_string(), 300.0), ("month".to_string(), 500.0), ("credits".to_string(), 220.0)];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = taken(&a, "t").await;
        // Refill while the test runs (a token in 1000 s) is within 0.05.
        let close = now.len() == 3 && now.iter().zip(&want).all(|(n, w)| n.0 == w.0 && (n.1 - w.1).abs() < 0.05);
        if close {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "taken {now:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A call after: denied, every source's budget in the answer and in A's
    // decision log, with the same reason.
    let mut ca = a.client().await;
    let req = pb::AcquireRequest { resource: "chat".into(), descriptors: tenant("t"), ..Default::default() };
    let denied = ca.acquire(req).await.unwrap().into_inner();
    assert_eq!(denied.verdict(), pb::Verdict::RateLimited, "{denied:?}");
    let shown: Vec<(&str, bool)> = denied.limits.iter().map(|l| (l.name.as_str(), l.exceeded)).collect();
    assert_eq!(shown, [("minute", true), ("month", true), ("credits", true)], "{denied:?}");
    assert!(denied.paid_by.is_empty());

    // Another tenant's plain calls: each answer and logged decision names
    // the source that paid.
    for _ in 0..11 {
        let req =
            pb::AcquireRequest { resource: "chat".into(), descriptors: tenant("u"), cost: 100, ..Default::default() };
        ca.acquire(req).await.unwrap();
    }
    let q = pb::GetDecisionsRequest { resource: "chat".into(), descriptors: tenant("u"), ..Default::default() };
    let logged = a.admin().await.get_decisions(q).await.unwrap().into_inner().decisions;
    let mut by: Vec<(i32, String)> = logged.iter().map(|d| (d.verdict, d.paid_by.clone())).collect();
    by.reverse(); // newest first in the log
    let allowed = pb::Verdict::Allowed as i32;
    let mut want: Vec<(i32, String)> = vec![(allowed, String::new()); 3];
    want.extend(vec![(allowed, "month".to_string()); 5]);
    want.extend(vec![(allowed, "credits".to_string()); 2]);
    want.push((pb::Verdict::RateLimited as i32, String::new()));
    assert_eq!(by, want);
    let last = &logged[0];
    assert_eq!(last.decided_by, ["minute", "month", "credits"], "{last:?}");

    // `floodgate why` prints the source that paid.
    let out = std::process::Command::new(BIN)
        .args(["why", "--server", &a.grpc, "--resource", "chat", "--descriptor", "tenant=u", "-n", "11"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text.matches("paid by: month").count(), 5, "{text}");
    assert_eq!(text.matches("paid by: credits").count(), 2, "{text}");
}

/// Charges sent at once by many callers through both replicas: each is
/// taken from one source, in order, and the budgets hold exactly what was
/// charged, beyond the last only by the charges in flight when it ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_charges_through_two_replicas_are_each_taken_once() {
    let (_redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_live(&b, 2);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let url = if i % 2 == 0 { a.url() } else { b.url() };
        tasks.push(tokio::spawn(async move {
            let mut c = pb::floodgate_client::FloodgateClient::connect(url).await.unwrap();
            let mut charged = 0u64;
            for n in 0..20 {
                let req = pb::ChargeRequest {
                    resource: "chat".into(),
                    descriptors: tenant("c"),
                    cost: 10,
                    idempotency_key: format!("{i}-{n}"),
                    ..Default::default()
                };
                let answer = c.charge(req).await.unwrap().into_inner();
                charged += 10;
                if answer.limits.iter().any(|l| l.exceeded) {
                    break;
                }
            }
            charged
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    // 1000 fit in the three budgets; at most one charge per caller beyond.
    assert!((1000..=1000 + 8 * 10).contains(&total), "charged {total}");
    let now = taken(&a, "c").await;
    let sum: f64 = now.iter().map(|(_, t)| t).sum();
    assert!((sum - total as f64).abs() < 0.5, "the budgets hold {now:?}, {total} was charged");
    assert!((now[0].1 - 300.0).abs() < 0.5 && (now[1].1 - 500.0).abs() < 0.5, "{now:?}");
}

/// Without Redis, charges and calls go through the waterfall the same way,
/// and a charge no source has room for goes into debt on the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_alone_takes_charges_from_each_source_in_turn() {
    let fg = floodgate().rules(RULES).start();
    let mut c = fg.client().await;
    let mut paid = Vec::new();
    for n in 0..11 {
        let req = pb::ChargeRequest {
            resource: "chat".into(),
            descriptors: tenant("m"),
            cost: 100,
            idempotency_key: format!("m-{n}"),
            ..Default::default()
        };
        let answer = c.charge(req).await.unwrap().into_inner();
        let exceeded = answer.limits.iter().any(|l| l.exceeded);
        paid.push((answer.paid_by, exceeded));
    }
    let mut want = vec![(String::new(), false); 3];
    want.extend(vec![("month".to_string(), false); 5]);
    want.extend(vec![("credits".to_string(), false); 2]);
    want.push(("credits".to_string(), true));
    assert_eq!(paid, want);
    let now = taken(&fg, "m").await;
    assert_eq!(now.iter().map(|(_, t)| t.round()).collect::<Vec<_>>(), [300.0, 500.0, 300.0], "{now:?}");
}

const CREDITS: &str = r#"
resources:
  - name: api
    limits:
      - { name: free, key: [tenant], algorithm: token_bucket, capacity: 2, refill_per_second: 0.001, sync: strict }
      - { name: calls, algorithm: fixed_window, limit: 1000000, window: 1h }
    waterfall:
      - { name: credits, key: [tenant], algorithm: balance, max_balance: 1000 }
"#;

fn adjust(t: &str, limit: &str, amount: i64, reason: &str) -> pb::AdjustBalanceRequest {
    pb::AdjustBalanceRequest {
        resource: "api".into(),
        descriptors: tenant(t),
        limit: limit.into(),
        amount,
        reason: reason.into(),
    }
}

async fn call(fg: &Floodgate, t: &str, cost: u32) -> pb::AcquireResponse {
    let req = pb::AcquireRequest { resource: "api".into(), descriptors: tenant(t), cost, ..Default::default() };
    fg.client().await.acquire(req).await.unwrap().into_inner()
}

/// Credits topped up through Admin on one replica pay on the other, each
/// change in the audit log; bad changes are refused and change nothing;
/// while Redis is down nothing changes; and a Redis that comes back older
/// does not give back credits that were spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_are_topped_up_through_admin_and_spent_exactly_across_replicas() {
    let (mut redis, _dir, args) = replicated(CREDITS);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    wait_live(&b, 2);
    // The free calls first; then no credits: denied, naming both.
    for _ in 0..2 {
        assert_eq!(call(&b, "t", 1).await.paid_by, "");
    }
    let denied = call(&b, "t", 1).await;
    assert_eq!(denied.verdict(), pb::Verdict::RateLimited);
    assert!(denied.reason.contains("'free'") && denied.reason.contains("'credits'"), "{}", denied.reason);

    // Topped up through the CLI on A (the admin role: loopback, no tokens).
    let out = std::process::Command::new(BIN)
        .args(["balance", "--server", &a.grpc, "api", "--limit", "credits", "-d", "tenant=t"])
        .args(["--add", "300", "--reason", "invoice 17"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "credits of api: 300 (at most 1000)");
    // The server writes its audit line to its log, which the test reads
    // as it comes: it may come just after the answer.
    eventually("the audit line of the top-up", Duration::from_secs(5), || async {
        let logs = a.logs();
        (logs.contains("AdjustBalance") && logs.contains("invoice 17")).then_some(())
    })
    .await;

    // B spends them, exactly: 300 in calls of 7 is 42 calls, and 6 left.
    let mut paid = 0;
    loop {
        let r = call(&b, "t", 7).await;
        if r.verdict() != pb::Verdict::Allowed {
            break;
        }
        assert_eq!(r.paid_by, "credits");
        paid += 1;
    }
    assert_eq!(paid, 42);
    let left = |fg: &Floodgate| {
        let out = std::process::Command::new(BIN)
            .args(["balance", "--server", &fg.grpc, "api", "--limit", "credits", "-d", "tenant=t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(left(&a), "credits of api: 6 (at most 1000)");
    // The CLI refuses a key given twice (which value would it top up?) and
    // a reason with nothing to change, before it asks the server.
    for extra in [&["-d", "tenant=u", "--add", "5", "--reason", "two keys"][..], &["--reason", "only a reason"]] {
        let out = std::process::Command::new(BIN)
            .args(["balance", "--server", &a.grpc, "api", "--limit", "credits", "-d", "tenant=t"])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{out:?}");
    }
    assert_eq!(left(&a), "credits of api: 6 (at most 1000)");
    assert!(!a.logs().contains("two keys"), "a refused change is not audited");

    // Refused, changing nothing: each error names the field.
    let mut admin = a.admin().await;
    let refused = [
        (adjust("t", "credits", 0, "zero"), "amount: 0"),
        (adjust("t", "credits", 995, "too much"), "more than its max_balance 1000"),
        (adjust("t", "free", 5, "not a balance"), "'free' of resource 'api' is not a balance"),
        (adjust("t", "credits", 5, ""), "reason: must not be empty"),
        (adjust("t", "nope", 5, "no such"), "no matched limit 'nope'"),
        (
            pb::AdjustBalanceRequest { descriptors: HashMap::new(), ..adjust("t", "credits", 5, "no key") },
            "no matched limit 'credits'",
        ),
    ];
    for (req, want) in refused {
        let e = admin.adjust_balance(req).await.unwrap_err();
        assert!(e.message().contains(want), "{:?}: {}", e.code(), e.message());
        assert!(matches!(e.code(), tonic::Code::InvalidArgument | tonic::Code::NotFound), "{e:?}");
    }
    assert_eq!(left(&b), "credits of api: 6 (at most 1000)");

    // Through the JSON API too.
    let answer = a
        .request("POST", "/v1/admin/adjust-balance")
        .header("content-type", "application/json")
        .body(r#"{"resource":"api","descriptors":{"tenant":"t"},"limit":"credits","amount":"94","reason":"json"}"#)
        .send_async()
        .await;
    let body = String::from_utf8_lossy(&answer.body).to_string();
    assert_eq!(answer.status, 200, "{body}");
    assert!(body.contains("\"balance\":\"100\""), "{body}");

    // Redis saves here (100 credits), then 70 are spent: a Redis that comes
    // back from that save must not hand the 70 out again.
    redis.bgsave();
    for _ in 0..10 {
        assert_eq!(call(&a, "t", 7).await.paid_by, "credits");
    }
    redis.kill();
    let e = admin.adjust_balance(adjust("t", "credits", 50, "while down")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    redis.restart();
    wait_redis_up(&a);
    wait_redis_up(&b);
    let mut more = 0;
    while call(&b, "t", 7).await.verdict() == pb::Verdict::Allowed {
        more += 1;
        assert!(more < 20, "the credits spent before Redis went back are spent again");
    }
    assert_eq!(more, 4, "30 credits were left: 4 calls of 7");
    assert!(!a.logs().contains("while down"), "a change that did not happen is not in the audit log");

    // Redis comes back empty: the replicas put the 2 credits left back, no
    // more and no fewer (an empty balance is where a lost one starts).
    redis.cli(&["FLUSHALL"]).expect("FLUSHALL");
    assert_eq!(call(&a, "t", 2).await.paid_by, "credits", "the credits left are put back");
    assert_eq!(call(&b, "t", 1).await.verdict(), pb::Verdict::RateLimited, "no more than were left");
}

/// A server alone never evicts credits, so a store full of balances
/// refuses a top-up of another key (RESOURCE_EXHAUSTED, no audit line)
/// rather than answer that it made it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_up_the_store_has_no_room_for_is_refused() {
    let fg = floodgate().rules(CREDITS).args(["--max-keys", "10"]).start();
    let mut admin = fg.admin().await;
    let mut kept = 0;
    for n in 0..14 {
        match admin.adjust_balance(adjust(&format!("full-{n}"), "credits", 5, &format!("order {n}"))).await {
            Ok(r) => {
                assert_eq!(r.into_inner().balance, 5);
                kept += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                assert!(e.message().contains("raise --max-keys"), "{e:?}");
                assert!(!fg.logs().contains(&format!("reason=\"order {n}\"")), "a refused top-up is not audited");
            }
        }
    }
    assert_eq!(kept, 10, "every key the store holds is a balance with credits");
    // The credits that were kept are all still there.
    for n in 0..kept {
        let left = call(&fg, &format!("full-{n}"), 5).await;
        assert_eq!(left.paid_by, "credits", "{left:?}");
    }
}
