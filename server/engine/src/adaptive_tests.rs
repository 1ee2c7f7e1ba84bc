//! Adaptive concurrency through the engine, on a fake clock, against a
//! simulated dependency: `CAPACITY` servers taking `SERVICE` per call, the
//! rest queued first come first served, offered twice what it can serve.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::breaker::Outcome;
use crate::rules::Priority;
use crate::time::{Clock, ManualClock};

const CAPACITY: usize = 40;
const SERVICE: Duration = Duration::from_millis(40);

/// What one run saw.
#[derive(Debug, Default)]
struct Run {
    /// The limit every simulated second.
    limits: Vec<u32>,
    /// (admitted, denied) by priority index.
    by_class: [(u64, u64); 4],
    /// Latencies of the calls admitted in the last 10 s, in ms.
    late_latencies: Vec<u64>,
    served: u64,
    /// Every admitted call: (when it was issued, its latency), in ms.
    calls: Vec<(u64, u64)>,
    /// Milliseconds during which the limit was held at its floor to measure
    /// the no-load latency.
    probing_ms: u64,
}

impl Run {
    /// The p90 latency (ms) of the calls issued in `[from, to)` seconds.
    fn p90(&self, from: u64, to: u64) -> u64 {
        let mut v: Vec<u64> =
            self.calls.iter().filter(|(at, _)| (from * 1000..to * 1000).contains(at)).map(|&(_, l)| l).collect();
        assert!(!v.is_empty(), "no call admitted from {from} s to {to} s");
        v.sort_unstable();
        v[(v.len() * 9).div_ceil(10) - 1]
    }

    /// Calls admitted per second in `[from, to)` seconds.
    fn goodput(&self, from: u64, to: u64) -> f64 {
        let n = self.calls.iter().filter(|(at, _)| (from * 1000..to * 1000).contains(at)).count();
        n as f64 / (to - from) as f64
    }

    /// The share of the run spent measuring.
    fn probing_share(&self) -> f64 {
        self.probing_ms as f64 / (self.limits.len() as f64 * 1000.0)
    }
}

fn rules(adaptive: &str, partitions: &str) -> String {
    format!("resources:\n  - name: db\n    concurrency: {{ adaptive: {adaptive}, permit_ttl: 30s{partitions} }}\n")
}

/// `seconds` of offered load: each millisecond, `per_ms` calls, of which
/// every `critical_every`th is critical (0: all the default priority) and
/// the rest sheddable. Halves the servers from `halve.0` s to `halve.1` s.
fn run(yaml: &str, seconds: u64, critical_every: u64, halve: (u64, u64)) -> Run {
    let dependency = |ms: u64| {
        let servers = if (halve.0 * 1000..halve.1 * 1000).contains(&ms) { CAPACITY / 2 } else { CAPACITY };
        (servers, SERVICE.as_millis() as u64)
    };
    simulate(yaml, seconds, critical_every, dependency)
}

/// As [`run`], against a dependency that has `dependency(ms).0` servers,
/// each taking `dependency(ms).1` ms per call, at millisecond `ms`. The
/// offered load stays twice what `CAPACITY` servers at `SERVICE` serve.
fn simulate(yaml: &str, seconds: u64, critical_every: u64, dependency: impl Fn(u64) -> (usize, u64)) -> Run {
    let (e, clock): (Engine, Arc<ManualClock>) = super::tests::engine(yaml);
    let none = HashMap::<String, String>::new();
    let mut servers: BinaryHeap<Reverse<u64>> = (0..CAPACITY).map(|_| Reverse(0)).collect();
    let mut parked: Vec<u64> = Vec::new();
    let mut out: BinaryHeap<Reverse<(u64, u64, String)>> = BinaryHeap::new();
    let mut out_run = Run::default();
    // 2x capacity: CAPACITY / SERVICE calls per ms, twice.
    let per_ms = 2 * CAPACITY as u64 / SERVICE.as_millis() as u64;
    let mut n = 0u64;
    let start = clock.now();
    for ms in 0..seconds * 1000 {
        let now = ms;
        // Servers leave and come back as the dependency's shape says.
        let (wanted, service) = dependency(ms);
        while servers.len() > wanted {
            let Reverse(free) = servers.pop().unwrap();
            parked.push(free);
        }
        while servers.len() < wanted {
            servers.push(Reverse(parked.pop().unwrap_or(now).max(now)));
        }
        while let Some(Reverse((done, issued, _))) = out.peek().cloned() {
            if done > now {
                break;
            }
            let Reverse((_, _, permit)) = out.pop().unwrap();
            let latency = Duration::from_millis(done - issued);
            e.outcomes().report(&e.rules(), "db", &permit, Outcome::Success, Some(latency)).unwrap();
        }
        for _ in 0..per_ms {
            n += 1;
            let priority = match critical_every {
                0 => Priority::Critical,
                k if n.is_multiple_of(k) => Priority::Critical,
                _ => Priority::Sheddable,
            };
            let rules = e.rules();
            let a = e.acquire(&rules, &Request { priority, ..Request::new("db", &none) }).unwrap();
            let class = &mut out_run.by_class[priority.index()];
            match a.permit_id {
                Some(p) => {
                    class.0 += 1;
                    let Reverse(free) = servers.pop().unwrap();
                    let done = free.max(now) + service;
                    servers.push(Reverse(done));
                    if ms >= (seconds - 10) * 1000 {
                        out_run.late_latencies.push(done - now);
                    }
                    out_run.calls.push((now, done - now));
                    out_run.served += 1;
                    out.push(Reverse((done, now, p.to_string())));
                }
                None => class.1 += 1,
            }
        }
        if ms % 100 == 0 {
            e.outcomes().tick();
        }
        if ms % 10 == 0 {
            let view = e.views().concurrency(&e.rules(), "db").unwrap();
            if view.inputs.is_some_and(|i| i.probing) {
                out_run.probing_ms += 10;
            }
        }
        if ms % 1000 == 999 {
            let limit =
                e.views().concurrency_limit("db", e.rules().rules.find("db").unwrap().concurrency.as_ref().unwrap());
            out_run.limits.push(limit);
        }
        clock.set(start.saturating_add(Duration::from_millis(ms + 1)));
    }
    out_run
}

fn p99(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

/// The limit settles within 25% of the capacity within 30 s, and latency
/// stays under 3x the service time.
fn settles(name: &str, adaptive: &str) {
    let mut r = run(&rules(adaptive, ""), 40, 0, (1000, 1000));
    let c = CAPACITY as f64;
    let after_30: Vec<u32> = r.limits[29..].to_vec();
    assert!(after_30.iter().all(|&l| (f64::from(l) - c).abs() <= 0.25 * c), "{name}: limits per second {:?}", r.limits);
    let p99 = p99(&mut r.late_latencies);
    assert!(p99 < 3 * SERVICE.as_millis() as u64, "{name}: p99 {p99} ms; limits {:?}", r.limits);
}

#[test]
fn gradient2_finds_the_capacity() {
    settles("gradient2", "{ algorithm: gradient2, min: 5, max: 1000, initial: 20 }");
}

#[test]
fn vegas_finds_the_capacity() {
    settles("vegas", "{ algorithm: vegas, min: 5, max: 1000, initial: 20 }");
}

#[test]
fn aimd_finds_the_capacity_at_its_timeout() {
    settles("aimd", "{ algorithm: aimd, min: 5, max: 1000, initial: 20, timeout: 48ms }");
}

#[test]
fn the_limit_follows_a_dependency_that_halves_and_comes_back() {
    let r = run(&rules("{ algorithm: gradient2, min: 5, max: 1000, initial: 20, window: 500ms }", ""), 70, 0, (30, 50));
    let half = CAPACITY as f64 / 2.0;
    // Halved at 30 s: within 25% of 20 by 40 s, until 50 s.
    assert!(r.limits[40..50].iter().all(|&l| (f64::from(l) - half).abs() <= 0.25 * half), "{:?}", r.limits);
    // Back at 50 s: within 25% of 40 again by 65 s.
    let c = CAPACITY as f64;
    assert!(r.limits[65..].iter().all(|&l| (f64::from(l) - c).abs() <= 0.25 * c), "{:?}", r.limits);
}

#[test]
fn partitions_keep_critical_calls_going_while_sheddable_ones_are_shed() {
    // While the limit measures its no-load latency, the partitions share
    // its floor, and critical calls past their share of it wait: this test
    // is of the partitions, so the measurement is off.
    let r = run(
        &rules(
            "{ algorithm: gradient2, min: 5, max: 1000, initial: 20, probe: off }",
            ", partitions: { critical: 70%, sheddable: 30% }",
        ),
        40,
        5,
        (1000, 1000),
    );
    let (ok, denied) = r.by_class[Priority::Critical.index()];
    assert!(ok as f64 >= 0.99 * (ok + denied) as f64, "critical {ok} admitted, {denied} denied");
    let (s_ok, s_denied) = r.by_class[Priority::Sheddable.index()];
    assert!(s_denied > s_ok / 4, "sheddable: {s_ok} admitted, {s_denied} denied");
    // Without partitions, critical calls are shed like the rest.
    let r = run(&rules("{ algorithm: gradient2, min: 5, max: 1000, initial: 20 }", ""), 40, 5, (1000, 1000));
    let (ok, denied) = r.by_class[Priority::Critical.index()];
    assert!((ok as f64) < 0.9 * (ok + denied) as f64, "critical {ok} admitted, {denied} denied");
}

#[test]
fn a_static_limit_lets_latency_grow_without_bound() {
    let yaml = "resources:\n  - name: db\n    concurrency: { max_in_flight: 500, permit_ttl: 30s }\n";
    let mut r = run(yaml, 20, 0, (1000, 1000));
    assert!(r.limits.iter().all(|&l| l == 500));
    assert!(p99(&mut r.late_latencies) > 5 * SERVICE.as_millis() as u64);
}

#[test]
fn expired_permits_and_failures_are_drops() {
    // The limit's own measurement would hold it at its floor after this
    // window: off, to read what the drops did.
    let yaml = rules("{ algorithm: aimd, min: 1, max: 100, initial: 10, min_samples: 3, probe: off }", "");
    let (e, clock) = super::tests::engine(&yaml);
    let none = HashMap::<String, String>::new();
    let rule = e.rules();
    let c = *rule.rules.find("db").unwrap().concurrency.as_ref().unwrap();
    let permits: Vec<String> =
        (0..5).map(|_| e.acquire(&rule, &Request::new("db", &none)).unwrap().permit_id.unwrap().to_string()).collect();
    for p in &permits[..2] {
        e.outcomes().report(&rule, "db", p, Outcome::Failure, Some(Duration::from_millis(5))).unwrap();
    }
    // Ignored is no sample at all.
    e.outcomes().report(&rule, "db", &permits[2], Outcome::Ignored, None).unwrap();
    // The other two never report: they expire after permit_ttl (30 s).
    clock.advance(Duration::from_secs(31));
    e.outcomes().tick();
    // Four drops in the window: floor(10 * 0.9).
    assert_eq!(e.views().concurrency_limit("db", &c), 9);
}

/// The algorithms with their default settings, with `initial` as the limit
/// before the first window. AIMD keeps its default timeout (5 s): it backs
/// off on latency past twice the measured no-load latency, which follows a
/// dependency that slows, where a fixed timeout would not.
fn algorithms(initial: u32) -> [(&'static str, String); 3] {
    ["gradient2", "vegas", "aimd"]
        .map(|name| (name, format!("{{ algorithm: {name}, min: 5, max: 1000, initial: {initial} }}")))
}

/// Started overloaded: the limit starts at four times what the dependency
/// serves, with callers from the first millisecond, so that every window
/// the algorithm sees is queued until it measures the no-load latency.
/// Within 30 s: p90 at most 2.5 times the no-load latency, goodput at
/// least 80% of capacity; measuring took under 5% of the time.
#[test]
fn every_algorithm_started_overloaded_finds_the_capacity_within_30_s() {
    let capacity = CAPACITY as f64 / SERVICE.as_secs_f64();
    let no_load = SERVICE.as_millis() as u64;
    let mut failures = Vec::new();
    for (name, adaptive) in algorithms(4 * CAPACITY as u32) {
        let r = run(&rules(&adaptive, ""), 90, 0, (1000, 1000));
        let (p90, goodput, share) = (r.p90(30, 90), r.goodput(30, 90), r.probing_share());
        println!(
            "{name}: p90 {p90} ms, goodput {:.0}% of capacity, measuring {:.1}%; limits {:?}",
            100.0 * goodput / capacity,
            100.0 * share,
            r.limits
        );
        if p90 as f64 > 2.5 * no_load as f64 || goodput < 0.8 * capacity || share >= 0.05 {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "missed the targets: {failures:?}");
}

/// A dependency that slows by 2% a minute for ten minutes (each call takes
/// 2% longer each minute, so it serves 2% less). Every minute after the
/// first 30 s, p90 stays within 2.5 times the no-load latency of that
/// minute and goodput at least 80% of that minute's capacity.
#[test]
fn every_algorithm_follows_a_dependency_that_slows_two_percent_a_minute() {
    let service_at = |ms: u64| (SERVICE.as_millis() as f64 * 1.02f64.powf(ms as f64 / 60_000.0)).round() as u64;
    let mut failures = Vec::new();
    for (name, adaptive) in algorithms(20) {
        let r = simulate(&rules(&adaptive, ""), 600, 0, |ms| (CAPACITY, service_at(ms)));
        let mut worst = (0.0f64, f64::MAX);
        for minute in 0..10 {
            let (from, to) = (minute * 60 + 30, minute * 60 + 60);
            let service = service_at(from * 1000) as f64;
            let capacity = CAPACITY as f64 * 1000.0 / service;
            let (p90, goodput) = (r.p90(from, to) as f64 / service, r.goodput(from, to) / capacity);
            worst = (worst.0.max(p90), worst.1.min(goodput));
        }
        println!(
            "{name}: worst minute p90 {:.2}x no-load, goodput {:.0}% of capacity, measuring {:.1}%",
            worst.0,
            100.0 * worst.1,
            100.0 * r.probing_share()
        );
        if worst.0 > 2.5 || worst.1 < 0.8 || r.probing_share() >= 0.05 {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "missed the targets: {failures:?}");
}
