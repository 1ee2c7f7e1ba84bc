//! Shared by the end-to-end tests: start the real `floodgate` binary on free
//! loopback ports, talk to it, stop it by PID.

#![allow(dead_code)]

pub mod browser;
pub mod envoy;
pub mod pki;
pub mod prometheus;
pub mod redis;
pub mod xds;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use tonic::transport::Channel;

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

/// `args` as `Floodgate::start` takes them.
pub fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Waits until `fg` counts `n` live replicas (their heartbeats reached Redis)
/// and decides with Redis again (the count comes from the heartbeat, before
/// the round that pays what was owed and turns strict decisions to Redis).
pub fn wait_live(fg: &Floodgate, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let series = format!("floodgate_live_replicas {n}");
    while !fg.http_get("/metrics").1.lines().any(|l| l == series) {
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
        let metrics = fg.http_get("/metrics").1;
        let line = metrics.lines().find(|l| l.starts_with("floodgate_redis_sync_duration_seconds_count"));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok()).unwrap_or(0)
    };
    let (start, deadline) = (rounds(), Instant::now() + Duration::from_secs(10));
    while rounds() < start + n {
        assert!(Instant::now() < deadline, "fewer than {n} sync rounds in 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Tests of one file that measure admissions under load take this, so that
/// they do not share the two cores with each other.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The binary under test, built by cargo for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_floodgate");

/// A running `floodgate serve`, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Floodgate {
    child: Child,
    pub grpc: String,
    pub http: String,
    logs: Arc<Mutex<String>>,
    log_reader: Option<std::thread::JoinHandle<()>>,
}

impl Floodgate {
    /// Starts `floodgate serve` with `args` on port 0 and waits until it listens.
    pub fn start(args: &[&str]) -> Floodgate {
        Self::start_on("127.0.0.1:0", args)
    }

    /// The same with gRPC on `listen` (to restart a server where it was).
    pub fn start_on(listen: &str, args: &[&str]) -> Floodgate {
        let mut child = Command::new(BIN)
            .arg("serve")
            .args(["--listen", listen, "--http-listen", "127.0.0.1:0"])
            .args(args)
            .env("FLOODGATE_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting floodgate");
        let logs = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        let log_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading floodgate's stdout");
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name}= in {line:?}; logs:\n{}", logs.lock().unwrap()))
                .to_string()
        };
        let (grpc, http) = (field("grpc"), field("http"));
        std::thread::spawn(move || for _ in stdout.lines() {});
        Floodgate { child, grpc, http, logs, log_reader: Some(log_reader) }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url()).unwrap().connect().await.expect("connecting to floodgate")
    }

    pub async fn client(&self) -> pb::floodgate_client::FloodgateClient<Channel> {
        pb::floodgate_client::FloodgateClient::new(self.channel().await)
    }

    pub async fn admin(&self) -> pb::admin_client::AdminClient<Channel> {
        pb::admin_client::AdminClient::new(self.channel().await)
    }

    /// GETs a path on the HTTP port: (status, body).
    pub fn http_get(&self, path: &str) -> (u16, String) {
        http_get(&self.http, path)
    }

    /// Sends SIGTERM and waits for the process to exit; its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        signal(self.child.id(), "TERM");
        let status = wait_exit(&mut self.child, Duration::from_secs(30)).expect("floodgate did not stop on SIGTERM");
        // Every line it logged has been read once its stderr is closed.
        if let Some(reader) = self.log_reader.take() {
            let _ = reader.join();
        }
        status
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Floodgate {
    fn drop(&mut self) {
        if self.is_running() {
            signal(self.child.id(), "KILL");
            let _ = self.child.wait();
        }
    }
}

/// Sends signal `name` to `pid`; after `STOP`, returns once the process is
/// stopped (the kernel stops it asynchronously), after `CONT` once it runs.
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
        // The state follows the parenthesised command name in /proc/PID/stat.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        if state.is_none() || matches!(state, Some('T') | Some('t')) == want_stopped {
            return;
        }
        assert!(Instant::now() < deadline, "pid {pid} did not take SIG{name}: state {state:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A minimal HTTP/1.1 GET, enough for /healthz, /readyz and /metrics: reads
/// the headers, then exactly Content-Length bytes of body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).expect("connecting to the HTTP port");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reader = BufReader::new(s);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (status, String::from_utf8(body).unwrap())
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

/// Runs `floodgate bench` against `grpc` and returns its JSON report.
pub fn bench(grpc: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["bench", "--server", grpc, "--format", "json", "--quiet"])
        .args(args)
        .output()
        .expect("running floodgate bench");
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("bench's JSON report")
}

/// A count from a bench report's verdicts (0 when absent).
pub fn verdict(report: &serde_json::Value, name: &str) -> u64 {
    report["verdicts"][name].as_u64().unwrap_or(0)
}
