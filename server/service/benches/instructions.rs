//! Decisions to count instructions of, under callgrind: `scripts/callgrind`
//! runs this binary with `--scenario NAME --decisions N` under
//! `valgrind --tool=callgrind --toggle-collect=*measured*` and divides the
//! instructions by N. Setup and warm-up are outside `measured`, so the figure
//! is what one decision costs on the memory-only path, whatever the machine
//! is doing at the time.
//!
//! Scenarios (every decision admits):
//! - `hot_key`: one keyed token bucket, one key.
//! - `hot_key_history`: the same limit with `history: true` (each call is
//!   also counted in the limit's recorded traffic).
//! - `three_limits`: a token bucket, a sliding window and a GCRA, one key.
//! - `guarded`: the three limits, a breaker and a concurrency limit; each
//!   decision is an Acquire and the ReportOutcome that returns its permit.
//!
//! - `rpc_health`, `rpc_acquire`, `rpc_rls`: one whole unary call through
//!   the gRPC port's service stack as the server builds it (size and metrics
//!   layers, routing, decoding, the decision, encoding), from an HTTP/2
//!   request to the response's trailers, without the socket: Health/Check,
//!   Acquire and ShouldRateLimit on the same keyed limit (`bench/rules.yaml`,
//!   as `scripts/h2load` drives them), so their costs compare per call.
//!
//! With `--in-system`, the rules also name a system holding `api` (and a
//! dozen others, exact and globs): the same decisions, on a resource whose
//! answer carries its system's level. A binary built before systems ignores
//! the flag, so `scripts/callgrind --baseline OLD --in-system` compares a
//! decision in a system with one before systems existed.
//!
//! Without arguments (as `cargo test --benches` runs it) each scenario runs a
//! thousand times, so the suite checks it still works.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use floodgate_core::breaker::Outcome;
use floodgate_core::time::SystemClock;
use floodgate_engine::{Answer, Engine, EngineConfig, Report, Request, Verdict};
use floodgate_rules::RuleSet;
use floodgate_server::decider::Decider;

// The server's allocator: allocations cost here what they cost there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const THREE: &str = "
      - { name: global, algorithm: token_bucket, capacity: 1000000000000, refill_per_second: 1000000000 }
      - { name: per-user, key: [user], algorithm: sliding_window, limit: 1000000000000, window: 1s }
      - { name: per-tenant, key: [tenant], algorithm: gcra, rate_per_second: 1000000000, burst: 1000000000000 }";

fn rules(scenario: &str) -> String {
    match scenario {
        s if s.starts_with("rpc_") => include_str!("../../../bench/rules.yaml").into(),
        "hot_key" => "resources:\n  - name: api\n    limits:\n      - { name: l, key: [user], algorithm: token_bucket, capacity: 1000000000000, refill_per_second: 1000000000 }\n".into(),
        "hot_key_history" => "resources:\n  - name: api\n    limits:\n      - { name: l, key: [user], algorithm: token_bucket, capacity: 1000000000000, refill_per_second: 1000000000, history: true }\n".into(),
        "three_limits" => format!("resources:\n  - name: api\n    limits:{THREE}\n"),
        "guarded" => format!(
            "resources:\n  - name: api\n    limits:{THREE}\n    concurrency: {{ max_in_flight: 1000000 }}\n    breaker: {{ window: {{ kind: count, size: 100 }}, minimum_calls: 10 }}\n"
        ),
        other => panic!("no scenario {other}: hot_key, hot_key_history, three_limits or guarded"),
    }
}

/// What the bench keeps of an answer.
struct Kept {
    verdict: Verdict,
    permit: Option<String>,
}

impl floodgate_server::decider::FromAnswer<Answer<'_>> for Kept {
    fn from_answer(a: Answer<'_>) -> Self {
        // As the gRPC answer carries it.
        Kept { verdict: a.verdict, permit: a.permit_id.map(|p| p.to_string()) }
    }
}

/// Polls a future that never waits (the memory-only path) to its end.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a memory-only decision waited"),
    }
}

fn decide(decider: &Decider, descriptors: &HashMap<String, String>) {
    let req = Request::new("api", descriptors);
    let kept: Kept = now(decider.acquire(&req)).expect("a valid request");
    assert_eq!(kept.verdict, Verdict::Allowed);
    if let Some(permit) = &kept.permit {
        let report = Report {
            resource: "api",
            permit_id: permit,
            outcome: Outcome::Success,
            latency: None,
            actual_cost: None,
            usage: None,
        };
        black_box(now(decider.report(&report)).expect("a valid report"));
    }
}

#[inline(never)]
fn measured(decider: &Decider, descriptors: &HashMap<String, String>, decisions: u64) {
    for _ in 0..decisions {
        decide(decider, descriptors);
    }
}

/// A system holding `api`, among others.
const SYSTEMS: &str = "systems:\n  - { name: search, resources: [\"search.*\", suggest] }\n  - name: checkout\n    resources: [\"pay.*\", \"cart.*\", basket, orders, refunds, api, \"inventory-*\", ledger]\n    latency: { p90: [200ms, 500ms, 1s] }\n";

fn run(scenario: &str, decisions: u64, in_system: bool) {
    let mut yaml = rules(scenario);
    if in_system {
        yaml.push_str(SYSTEMS);
    }
    let engine = Arc::new(Engine::new(EngineConfig { max_keys: 10_000_000 }, Arc::new(SystemClock::new())));
    engine.control().install(RuleSet::from_yaml(&yaml, "bench").unwrap(), yaml.clone(), "bench".into());
    let decider = Decider::new(engine, None);
    if let Some(rpc) = scenario.strip_prefix("rpc_") {
        return rpc::run(decider, rpc, decisions);
    }
    let descriptors =
        HashMap::from([("user".to_string(), "u42".to_string()), ("tenant".to_string(), "acme".to_string())]);
    // Warm: the bucket exists, the metrics are registered.
    warm_up(&decider, &descriptors);
    measured(&decider, &descriptors, decisions);
}

#[inline(never)]
fn warm_up(decider: &Decider, descriptors: &HashMap<String, String>) {
    for _ in 0..1000 {
        decide(decider, descriptors);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    match value("--scenario") {
        Some(scenario) => {
            let decisions = value("--decisions").map_or(100_000, |n| n.parse().expect("--decisions N"));
            run(&scenario, decisions, args.iter().any(|a| a == "--in-system"));
        }
        None => {
            for scenario in ["hot_key", "hot_key_history", "three_limits", "guarded"] {
                run(scenario, 1000, false);
                run(scenario, 1000, true);
            }
            for scenario in ["rpc_health", "rpc_acquire", "rpc_rls"] {
                run(scenario, 1000, false);
            }
        }
    }
}

/// Whole unary calls through the gRPC port's service stack.
mod rpc {
    use std::sync::Arc;

    use bytes::Bytes;
    use floodgate_server::access::{Access, AccessConfig};
    use floodgate_server::decider::Decider;
    use floodgate_server::grpc;
    use http_body_util::BodyExt;
    use tower::{Service, ServiceBuilder};

    use super::now;

    /// A length-delimited protobuf field.
    fn field(tag: u8, payload: &[u8]) -> Vec<u8> {
        assert!(payload.len() < 128);
        let mut out = vec![tag << 3 | 2, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    /// The path and gRPC frame of one call, as `scripts/h2load` sends them.
    fn call(rpc: &str) -> (&'static str, Bytes) {
        let (path, message) = match rpc {
            "health" => ("/grpc.health.v1.Health/Check", Vec::new()),
            // Acquire{resource: "bench", descriptors: {"user": "k1"}}
            "acquire" => ("/floodgate.v1.Floodgate/Acquire", {
                let mut m = field(1, b"bench");
                m.extend(field(2, &[field(1, b"user"), field(2, b"k1")].concat()));
                m
            }),
            // RateLimitRequest{domain: "bench", descriptors: [{entries: [{key: "user", value: "k1"}]}]}
            "rls" => ("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", {
                let mut m = field(1, b"bench");
                m.extend(field(2, &field(1, &[field(1, b"user"), field(2, b"k1")].concat())));
                m
            }),
            other => panic!("no rpc scenario rpc_{other}: rpc_health, rpc_acquire or rpc_rls"),
        };
        let mut frame = vec![0];
        frame.extend((message.len() as u32).to_be_bytes());
        frame.extend(message);
        (path, Bytes::from(frame))
    }

    fn request(path: &str, frame: &Bytes) -> http::Request<tonic::body::Body> {
        http::Request::post(path)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(http_body_util::Full::new(frame.clone())))
            .expect("a request")
    }

    pub fn run(decider: Decider, rpc: &str, calls: u64) {
        let decider = Arc::new(decider);
        let access = Access::load(AccessConfig::default()).expect("no token file");
        let (reporter, health) = tonic_health::server::health_reporter();
        now(reporter.set_service_status("", tonic_health::ServingStatus::Serving));
        let routes = grpc::routes(decider, health, access, 16).expect("routes");
        let mut service = ServiceBuilder::new()
            .layer(grpc::ObserveLayer::new())
            .layer(grpc::SizeLayer::new(grpc::size::Budget::new(256 << 20)))
            .service(routes);
        let (path, frame) = call(rpc);
        let mut one = || {
            let response = now(service.call(request(path, &frame))).expect("infallible");
            let body = now(response.into_body().collect()).expect("a body");
            let status = body.trailers().and_then(|t| t.get("grpc-status")).map(|v| v.as_bytes().to_vec());
            assert_eq!(status.as_deref(), Some(&b"0"[..]), "{path}: not OK");
            std::hint::black_box(body.to_bytes());
        };
        for _ in 0..1000 {
            one();
        }
        measured(&mut one, calls);
    }

    #[inline(never)]
    fn measured(one: &mut impl FnMut(), calls: u64) {
        for _ in 0..calls {
            one();
        }
    }
}
