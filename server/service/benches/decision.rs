//! One decision inside the server, no network (SPEC target: < 1 us median).
//!
//! - `algorithm/*`: one bucket's `try_acquire`, the pure algorithm.
//! - `engine/*`: `Engine::acquire` end to end (validation, rule match, key,
//!   store, all-or-nothing), on one hot key and spread over 100,000 keys.
//! - `multi_limit/*`: 1, 2 and 3 limits taken all or nothing.
//! - `contention/*`: the sharded store under 1, 2 and 4 threads at once.
//! - `overrides/*`: one decision on a resource with 0, 1 and 100,000
//!   overrides (none matching the caller, and one that does): from the rules
//!   file, and set at run time with an expiry (`run_time_*`).
//!
//! Limits are sized so that every decision admits: the steady state measured is
//! the common path, not the denial path.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use floodgate_core::limiter::rate::Rate;
use floodgate_core::limiter::{
    Algorithm, fixed_window, gcra, leaky_bucket, sliding_window, sliding_window_log, token_bucket, warm_up,
};
use floodgate_core::time::{Clock, SystemClock};
use floodgate_engine::overrides::{Change, Do, Spec, Table};
use floodgate_engine::{Engine, EngineConfig, Request, Verdict};
use floodgate_rules::RuleSet;
use floodgate_rules::overrides::Override;

const ALGORITHMS: &[(&str, &str)] = &[
    ("token_bucket", "algorithm: token_bucket, capacity: 1000000000000, refill_per_second: 1000000000"),
    ("gcra", "algorithm: gcra, rate_per_second: 1000000000, burst: 1000000000000"),
    ("leaky_bucket", "algorithm: leaky_bucket, capacity: 1000000000000, leak_per_second: 1000000000"),
    ("fixed_window", "algorithm: fixed_window, limit: 1000000000000, window: 1ms"),
    ("sliding_window_log", "algorithm: sliding_window_log, limit: 10000, window: 1ms"),
    ("sliding_window", "algorithm: sliding_window, limit: 1000000000000, window: 1ms"),
    ("warm_up", "algorithm: warm_up, rate_per_second: 1000000000, warm_up_period: 10s"),
];

fn engine(yaml: &str) -> Engine {
    let engine = Engine::new(EngineConfig { max_keys: 10_000_000 }, Arc::new(SystemClock::new()));
    engine.control().install(RuleSet::from_yaml(yaml, "bench").unwrap(), yaml.to_string(), "bench".into());
    engine
}

/// One admitted decision on resource `api`.
fn decide(e: &Engine, d: &HashMap<String, String>) -> Verdict {
    let rules = e.rules();
    let req = Request::new("api", d);
    e.acquire(&rules, &req).unwrap().verdict
}

fn descriptors(user: &str) -> HashMap<String, String> {
    HashMap::from([("user".to_string(), user.to_string()), ("tenant".to_string(), "acme".to_string())])
}

fn algorithms(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm");
    let rate = Rate::whole_per_second(1_000_000_000);
    let cases = [
        Algorithm::TokenBucket(token_bucket::Config::new(1 << 40, rate)),
        Algorithm::Gcra(gcra::Config::new(rate, 1 << 40)),
        Algorithm::LeakyBucket(leaky_bucket::Config::new(1 << 40, rate, leaky_bucket::Mode::Police)),
        Algorithm::FixedWindow(fixed_window::Config::new(1 << 40, 1_000_000)),
        Algorithm::SlidingWindowLog(sliding_window_log::Config::new(10_000, 1_000_000)),
        Algorithm::SlidingWindow(sliding_window::Config::new(1 << 40, 1_000_000)),
        Algorithm::WarmUp(
            warm_up::Config::new(rate, std::time::Duration::from_secs(10), 3, warm_up::Mode::Police).unwrap(),
        ),
    ];
    for alg in cases {
        let clock = SystemClock::new();
        let mut bucket = alg.new_bucket(clock.now());
        group.bench_function(alg.name(), |b| b.iter(|| black_box(bucket.try_acquire(&alg, clock.now(), 1))));
    }
    group.finish();
}

fn engine_hot_and_spread(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    for (name, limit) in ALGORITHMS {
        let yaml = format!("resources:\n  - name: api\n    limits:\n      - {{ name: l, key: [user], {limit} }}\n");
        let e = engine(&yaml);
        let hot = descriptors("u42");
        group.bench_function(BenchmarkId::new("hot_key", name), |b| b.iter(|| black_box(decide(&e, &hot))));
        let users: Vec<_> = (0..100_000).map(|i| descriptors(&format!("user-{i}"))).collect();
        let mut i = 0;
        group.bench_function(BenchmarkId::new("100k_keys", name), |b| {
            b.iter(|| {
                i = (i + 1) % users.len();
                black_box(decide(&e, &users[i]))
            })
        });
    }
    group.finish();
}

fn multi_limit(c: &mut Criterion) {
    let mut group = c.benchmark_group("multi_limit");
    let limits = [
        "      - { name: global, algorithm: token_bucket, capacity: 1000000000000, refill_per_second: 1000000000 }\n",
        "      - { name: per-user, key: [user], algorithm: sliding_window, limit: 1000000000000, window: 1s }\n",
        "      - { name: per-tenant, key: [tenant], algorithm: gcra, rate_per_second: 1000000000, burst: 1000000000000 }\n",
    ];
    for n in 1..=limits.len() {
        let yaml = format!("resources:\n  - name: api\n    limits:\n{}", limits[..n].concat());
        let e = engine(&yaml);
        let d = descriptors("u42");
        group.bench_function(BenchmarkId::from_parameter(n), |b| b.iter(|| black_box(decide(&e, &d))));
    }
    group.finish();
}

/// Decisions per second from `threads` threads at once on one engine: hot key
/// (every thread on one bucket) and spread (each thread its own keys).
fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("contention");
    let yaml = "resources:\n  - name: api\n    limits:\n      - { name: l, key: [user], algorithm: token_bucket, capacity: 1000000000000, refill_per_second: 1000000000 }\n";
    let e = Arc::new(engine(yaml));
    for threads in [1usize, 2, 4] {
        for spread in [false, true] {
            let label = if spread { "spread" } else { "hot" };
            group.throughput(Throughput::Elements(threads as u64));
            group.bench_function(BenchmarkId::new(label, threads), |b| {
                b.iter_custom(|iters| run_threads(&e, threads, iters, spread))
            });
        }
    }
    group.finish();
}

fn run_threads(e: &Arc<Engine>, threads: usize, iters: u64, spread: bool) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let e = e.clone();
            s.spawn(move || {
                let users: Vec<_> =
                    (0..1024).map(|i| descriptors(&if spread { format!("t{t}-{i}") } else { "hot".into() })).collect();
                for i in 0..iters as usize {
                    black_box(decide(&e, &users[i % 1024]));
                }
            });
        }
    });
    start.elapsed()
}

fn overrides(c: &mut Criterion) {
    let mut group = c.benchmark_group("overrides");
    let limit =
        "{ name: l, key: [user], algorithm: token_bucket, capacity: 1000000000000, refill_per_second: 1000000000 }";
    for n in [0usize, 1, 100_000] {
        let yaml = format!("resources:\n  - name: api\n    limits: [ {limit} ]\n");
        let mut rules = RuleSet::from_yaml(&yaml, "bench").unwrap();
        let base = rules.rules()[0].limits.clone();
        let list = (0..n).map(|i| Override::factor(vec![("user".into(), format!("vip-{i}"))], 10.0, &base)).collect();
        assert!(rules.set_overrides("api", list));
        let e = Engine::new(EngineConfig { max_keys: 10_000_000 }, Arc::new(SystemClock::new()));
        e.control().install(rules, yaml, "bench".into());
        let plain = descriptors("u42");
        group.bench_function(BenchmarkId::new("no_match", n), |b| b.iter(|| black_box(decide(&e, &plain))));
        if n > 0 {
            let vip = descriptors(&format!("vip-{}", n - 1));
            group.bench_function(BenchmarkId::new("match", n), |b| b.iter(|| black_box(decide(&e, &vip))));
        }
    }
    // Set at run time, each ending in an hour: a match also reads the clock.
    for n in [1usize, 100_000] {
        let yaml = format!("resources:\n  - name: api\n    limits: [ {limit} ]\n");
        let e = engine(&yaml);
        let now = e.clock().now().as_nanos();
        let specs = (0..n).map(|i| Spec {
            id: format!("vip-{i}"),
            rule: "api".into(),
            when: vec![("user".into(), format!("vip-{i}"))],
            action: Do::Factor(10.0),
            expires_at: Some(now + 3_600_000_000_000),
            created_at: now,
            created_by: "bench".into(),
            reason: String::new(),
        });
        e.control().install_overrides(Arc::new(Table::from_specs(specs)), Change::default());
        let (plain, vip) = (descriptors("u42"), descriptors(&format!("vip-{}", n - 1)));
        group.bench_function(BenchmarkId::new("run_time_no_match", n), |b| b.iter(|| black_box(decide(&e, &plain))));
        group.bench_function(BenchmarkId::new("run_time_match", n), |b| b.iter(|| black_box(decide(&e, &vip))));
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = algorithms, engine_hot_and_spread, multi_limit, contention, overrides
}
criterion_main!(benches);
