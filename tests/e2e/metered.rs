//! A metered call through the client crate against the real binary:
//! reserve an estimate, charge each chunk beyond it, stop when a budget runs
//! out, settle at the end (an LLM response streamed token by token).

use crate::support;

use std::time::Duration;

use floodgate_client::{Acquire, Client, Flow, Metering, Outcome};
use support::*;

const RULES: &str = r#"
resources:
  - name: llm
    limits:
      - { name: tokens-per-user, key: [user], algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001 }
"#;

fn client(fg: &Floodgate) -> Client {
    Client::builder().endpoint(fg.url()).request_timeout(Duration::from_millis(500)).build().unwrap()
}

fn ask(user: &str, cost: u32) -> Acquire {
    Acquire::new("llm").descriptor("user", user).cost(cost)
}

/// What a dry run of cost 1 says is left (after that 1).
async fn left(c: &Client, user: &str) -> u64 {
    let d = c.acquire(&ask(user, 1).dry_run()).await.unwrap();
    d.limits[0].remaining
}

async fn start(c: &Client, user: &str, estimate: u32) -> floodgate_client::Metered {
    match c.meter(&ask(user, estimate)).await.unwrap() {
        Metering::Admitted(m) => m,
        Metering::Denied(d) => panic!("denied at the start: {d:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_stream_stops_within_one_chunk_of_its_budget_and_settles_exactly() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);

    // A short answer: 300 reserved, 120 used, 180 come back at the end.
    let mut short = start(&c, "u1", 300).await;
    assert_eq!(left(&c, "u1").await, 699, "the reservation is taken at the start");
    for _ in 0..4 {
        assert_eq!(short.add(30).await, Flow::Continue);
    }
    short.finish(Outcome::Success);
    c.flush().await;
    assert_eq!(left(&c, "u1").await, 879, "1000 - 120, less the dry run's 1");

    // A long answer on what is left (880): chunks of 70 beyond the 300
    // reserved are charged as they come, and the one that finds the
    // budget used up says stop. The overshoot is at most that chunk.
    let mut long = start(&c, "u1", 300).await;
    let mut chunks = 0;
    let stopped_at = loop {
        chunks += 1;
        assert!(chunks < 100, "the stream was never stopped");
        if let Flow::Stop { limits } = long.add(70).await {
            assert_eq!(limits[0].name, "tokens-per-user");
            break long.used();
        }
    };
    assert!((880..880 + 70).contains(&stopped_at), "stopped after {stopped_at} tokens of a budget of 880");
    long.finish(Outcome::Success);
    c.flush().await;
    let d = c.acquire(&ask("u1", 1).dry_run()).await.unwrap();
    assert!(!d.is_allowed(), "the budget is used up, in debt by the overshoot: {d:?}");
    // The debt is exactly the overshoot: it refills at 1 per 1000 s.
    let debt = stopped_at - 880;
    let wait = d.retry_after.as_secs_f64();
    assert!((wait - (debt + 1) as f64 * 1000.0).abs() < 5.0, "retry after {wait}s for a debt of {debt}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_metered_calls_cannot_all_pass_one_check_and_a_dropped_one_settles() {
    let fg = floodgate().rules(RULES).start();
    let c = client(&fg);
    // Two calls at once with an estimate of 600 each on a budget of 1000:
    // the reservations do not both fit.
    let first = c.meter(&ask("u2", 600)).await.unwrap();
    let second = c.meter(&ask("u2", 600)).await.unwrap();
    assert!(matches!(first, Metering::Admitted(_)));
    assert!(matches!(second, Metering::Denied(_)), "{second:?}");
    let Metering::Admitted(mut first) = first else { unreachable!() };
    // The caller's task is cancelled after 100 tokens: the call settles them.
    assert_eq!(first.add(100).await, Flow::Continue);
    drop(first);
    c.flush().await;
    assert_eq!(left(&c, "u2").await, 899, "1000 - 100, less the dry run's 1");
}

/// A metered call that reports usage at its start (the prompt's input
/// tokens) charges each chunk beyond its reservation in units, not that
/// usage again, and settles the input budget at that usage: it is charged
/// once, whatever the stream's length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_call_with_usage_charges_its_usage_once() {
    const PRICED: &str = r#"
resources:
  - name: chat
    usage: [input_tokens]
    limits:
      - { name: input, key: [user], algorithm: fixed_window, limit: 10000, window: 1h, cost: input_tokens }
      - { name: output, key: [user], algorithm: fixed_window, limit: 10000, window: 1h }
"#;
    let fg = floodgate().rules(PRICED).start();
    let c = client(&fg);
    let req = Acquire::new("chat").descriptor("user", "u").cost(100).usage("input_tokens", 500);
    let Metering::Admitted(mut m) = c.meter(&req).await.unwrap() else { panic!("denied") };
    // 250 used: 100 reserved, 150 charged beyond as they came.
    for _ in 0..5 {
        assert_eq!(m.add(50).await, Flow::Continue);
    }
    m.finish(Outcome::Success);
    c.flush().await;
    let peek = c.acquire(&Acquire::new("chat").descriptor("user", "u").dry_run()).await.unwrap();
    let left: Vec<u64> = peek.limits.iter().map(|l| l.remaining).collect();
    // input: 500 once (the dry run's 1 aside); output: the 250 used.
    assert_eq!(left, [9499, 9749], "{peek:?}");
}
