//! Shared by Floodgate's end-to-end tests (tests/e2e): start the real
//! `floodgate` binary on free loopback ports ([`Floodgate::builder`]), talk
//! to it over HTTP ([`web`], the one HTTP client), read its metrics
//! ([`scrape`], the one reader of Prometheus' text format), run real
//! Redis, Envoy, Prometheus and a browser beside it, stop them all by PID.
//!
//! The binary's path: only an integration test of the `floodgate` package
//! is compiled with `CARGO_BIN_EXE_floodgate`, so the test crate passes it
//! in ([`Floodgate::builder`]`(env!("CARGO_BIN_EXE_floodgate"))`, [`bench`]);
//! tests/e2e/main.rs binds it once for all its modules. Nothing here reads it
//! from the environment.

pub mod browser;
pub mod envoy;
mod floodgate;
pub mod pki;
pub mod prometheus;
pub mod redis;
pub mod redis_sentinel;
pub mod scrape;
pub mod web;
pub mod xds;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;

pub use floodgate::{Floodgate, FloodgateBuilder, bench, try_bench};
pub use scrape::{Metrics, Sample};

/// The repository's root (where deploy/, fuzz/, bench/ and README.md are),
/// for the files the tests read.
pub fn repo_root() -> PathBuf {
    // This crate is tests/support in the repository.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or_else(|e| panic!("the repository's root {}: {e}", root.display()))
}

/// `path` (relative to the repository's root) as an absolute path.
pub fn repo_path(path: &str) -> PathBuf {
    repo_root().join(path)
}

/// Where `scripts/test` keeps the third-party programs the tests run for real
/// (Envoy, a Python virtualenv, npm packages): `FLOODGATE_TEST_CACHE`, else
/// `~/.cache/floodgate-test`.
pub fn test_cache() -> PathBuf {
    std::env::var("FLOODGATE_TEST_CACHE").map(PathBuf::from).unwrap_or_else(|_| {
        let base = std::env::var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache"));
        base.join("floodgate-test")
    })
}

/// Seconds from now to the next midnight in India (UTC+05:30 all year, no
/// DST), computed by plain arithmetic: what a `calendar: day` window with
/// `time_zone: Asia/Kolkata` must report as its reset.
pub fn seconds_to_kolkata_midnight() -> u64 {
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    86_400 - (unix + 19_800) % 86_400
}

/// Whether two times to a daily reset agree within `slack` seconds (across
/// midnight too, should the test run straddle it).
pub fn same_daily_reset(a: u64, b: u64, slack: u64) -> bool {
    let d = a.abs_diff(b);
    d <= slack || d >= 86_400 - slack
}

/// A Redis, a rules file holding `rules`, and the `serve` arguments of a
/// replica using both (synced every 100 ms).
pub fn replicated(rules: &str) -> (redis::RedisServer, TempDir, Vec<String>) {
    let redis = redis::RedisServer::start();
    let dir = TempDir::new();
    let file = dir.write("rules.yaml", rules);
    let args =
        ["--config", path_str(&file), "--redis", &redis.url(), "--sync-interval", "100ms", "--redis-timeout", "1s"];
    (redis, dir, args.map(String::from).to_vec())
}

/// `args` as `&str`s.
pub fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Waits until `fg` counts `n` live replicas (their heartbeats reached Redis)
/// and decides with Redis again (the count comes from the heartbeat, before
/// the round that pays what was owed and turns strict decisions to Redis).
pub fn wait_live(fg: &Floodgate, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fg.metrics().series("floodgate_live_replicas") != Some(f64::from(n)) {
        assert!(Instant::now() < deadline, "never saw {n} live replicas");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_redis_up(fg);
}

/// Waits until `fg` decides with Redis (its console says `redis_up`).
pub fn wait_redis_up(fg: &Floodgate) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fg.http_get("/api/v1/console").1.contains("\"redis_up\":true") {
        assert!(Instant::now() < deadline, "Redis never answered this replica: {}", fg.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `fg` has finished `n` more rounds of its Redis sync than it
/// had when called.
pub fn wait_syncs(fg: &Floodgate, n: u64) {
    let rounds = || {
        let metrics = fg.metrics();
        let first = metrics.matching("floodgate_redis_sync_duration_seconds_count", &[]).next();
        first.map_or(0, |s| s.value as u64)
    };
    let (start, deadline) = (rounds(), Instant::now() + Duration::from_secs(10));
    while rounds() < start + n {
        assert!(Instant::now() < deadline, "fewer than {n} sync rounds in 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Tests that measure admissions, latency or timing under load take this,
/// so that they do not share the two cores with each other: one lock for
/// the whole e2e binary, whichever module the test is in.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends signal `name` to `pid`; after `STOP`, returns once every thread of
/// the process is stopped (the kernel stops each asynchronously: the main
/// thread may show stopped while a worker still answers a call), after
/// `CONT` once they run.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status();
    assert!(matches!(status, Ok(s) if s.success()), "kill -{name} {pid}: {status:?}");
    let want_stopped = match name {
        "STOP" => true,
        "CONT" => false,
        _ => return,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Each thread's state follows the parenthesised command name in
        // /proc/PID/task/TID/stat. A process gone has no threads: done.
        let states: Vec<char> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
                    .filter_map(|stat| stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()))
                    .collect()
            })
            .unwrap_or_default();
        if states.iter().all(|&s| matches!(s, 'T' | 't') == want_stopped) {
            return;
        }
        assert!(Instant::now() < deadline, "pid {pid} did not take SIG{name}: thread states {states:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A value not used before: every test counts from zero, whatever ran
/// first (in this process or an earlier one).
pub fn fresh(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Runs `f` until it ran within one UTC day (the windows under test), at most twice.
pub fn within_one_day(mut f: impl FnMut()) {
    for _ in 0..2 {
        let day = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 86_400;
        let before = day();
        f();
        if day() == before {
            return;
        }
    }
    panic!("crossed midnight UTC twice");
}

/// Polls `f` until it returns `Some`, or panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A temporary directory holding files for one test.
pub struct TempDir(pub tempfile::TempDir);

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl TempDir {
    pub fn new() -> Self {
        TempDir(tempfile::tempdir().unwrap())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Replaces `name` atomically: written beside it, then renamed over it.
    pub fn replace(&self, name: &str, text: &str) -> PathBuf {
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        let p = self.path(name);
        std::fs::rename(&tmp, &p).unwrap();
        p
    }
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A ReportOutcome of `permit` with a 5 ms latency.
pub fn report(resource: &str, permit: &str, outcome: pb::Outcome) -> pb::ReportOutcomeRequest {
    pb::ReportOutcomeRequest {
        resource: resource.into(),
        permit_id: permit.into(),
        outcome: outcome as i32,
        latency: Some(prost_types::Duration { seconds: 0, nanos: 5_000_000 }),
        actual_cost: None,
        usage: Default::default(),
    }
}

pub fn acquire(resource: &str, descriptors: &[(&str, &str)], cost: u32) -> pb::AcquireRequest {
    pb::AcquireRequest {
        resource: resource.to_string(),
        descriptors: descriptors.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        cost,
        ..Default::default()
    }
}

/// A count from a bench report's verdicts (0 when absent).
pub fn verdict(report: &serde_json::Value, name: &str) -> u64 {
    report["verdicts"][name].as_u64().unwrap_or(0)
}
