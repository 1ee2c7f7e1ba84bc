//! What a guarded call costs a service: sequential `guard(..).run(..)` of a
//! call that does nothing, against a running server, on a resource with a
//! rule and on one without. Prints the median and p99 of each.
//!
//!   floodgate serve --config bench/rules.yaml &
//!   cargo run --release -p floodgate-client --example guard_overhead -- http://127.0.0.1:50051 bench
//!   FG_REPORT_LOAD=payments cargo run ...   # with the load reporter on

use std::time::{Duration, Instant};

use floodgate_client::{Acquire, Client};

async fn measure(client: &Client, resource: &str, n: usize) -> (Duration, Duration) {
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let ask = Acquire::new(resource).descriptor("user", format!("u{}", i % 100));
        let start = Instant::now();
        let _ = client.guard(ask).run(|| async { Ok::<_, ()>(()) }).await;
        took.push(start.elapsed());
    }
    took.sort();
    (took[n / 2], took[n * 99 / 100])
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let resource = args.next().unwrap_or_else(|| "bench".into());
    let n: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(5000);
    // FG_REPORT_LOAD=system: the same with the load reporter running
    // (Builder::report_load), to see what it costs the calls (nothing: it
    // runs on a task of its own).
    let mut builder = Client::builder().endpoint(url);
    if let Ok(system) = std::env::var("FG_REPORT_LOAD") {
        builder = builder.report_load(system, "guard_overhead");
    }
    let client = builder.build().expect("a client");
    // Warm up, and give Watch time to bring the rules.
    measure(&client, &resource, 500).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (what, r) in [("with a rule", resource.as_str()), ("without a rule", "no-rule-matches-this")] {
        let (p50, p99) = measure(&client, r, n).await;
        println!("{what:<15} median {:>7.1} us  p99 {:>7.1} us", p50.as_secs_f64() * 1e6, p99.as_secs_f64() * 1e6);
    }
}
