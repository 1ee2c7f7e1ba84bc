//! The one way the tests start the `floodgate` binary: [`Floodgate::builder`],
//! then arguments, environment, a rules file, then [`FloodgateBuilder::start`],
//! which waits until it listens. It is stopped by PID when dropped.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use tonic::transport::Channel;

use crate::TempDir;
use crate::scrape::Metrics;
use crate::web::{self, Request};

/// What to start: see [`Floodgate::builder`].
#[must_use = "nothing starts until .start()"]
pub struct FloodgateBuilder {
    bin: PathBuf,
    listen: String,
    http_listen: String,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    env_removed: Vec<OsString>,
    files: Vec<(String, String, String)>,
}

impl FloodgateBuilder {
    /// Adds one argument of `serve`.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Adds arguments of `serve` (`&["--config", path]`, a `Vec<String>`...).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Sets an environment variable of the process (it also gets
    /// `FLOODGATE_LOG=info` unless this sets it).
    pub fn env(mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env.push((name.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Removes an environment variable from the process's environment.
    pub fn env_remove(mut self, name: impl AsRef<OsStr>) -> Self {
        self.env_removed.push(name.as_ref().to_os_string());
        self
    }

    /// Writes `yaml` as `rules.yaml` in a directory of the server's own
    /// ([`Floodgate::dir`], kept while it lives) and passes `--config` to it.
    pub fn rules(self, yaml: &str) -> Self {
        self.file("--config", "rules.yaml", yaml)
    }

    /// Writes `text` as `name` in the server's own directory
    /// ([`Floodgate::dir`]) and passes `flag PATH` to it: an admin token
    /// file, say, that the test may rewrite while the server runs.
    pub fn file(mut self, flag: &str, name: &str, text: &str) -> Self {
        self.files.push((flag.to_string(), name.to_string(), text.to_string()));
        self
    }

    /// The gRPC port's address: `127.0.0.1:0` (a free port) unless given,
    /// as when a test starts a server again where it was.
    pub fn listen(mut self, addr: &str) -> Self {
        self.listen = addr.to_string();
        self
    }

    /// The HTTP port's address: `127.0.0.1:0` (a free port) unless given.
    pub fn http_listen(mut self, addr: &str) -> Self {
        self.http_listen = addr.to_string();
        self
    }

    /// Starts `floodgate serve` and waits until it listens: it prints
    /// `grpc=ADDR http=ADDR` on its first line of stdout once both ports
    /// are bound. Panics, with its logs, if it exits first.
    pub fn start(self) -> Floodgate {
        let (mut cmd, dir) = self.command();
        cmd.env("FLOODGATE_LOG", "info");
        for (name, value) in &self.env {
            cmd.env(name, value);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
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
        let field =
            |name: &str| line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}="))).map(str::to_string);
        let (Some(grpc), Some(http)) = (field("grpc"), field("http")) else {
            // It exited (or said something else): kill it if it still runs,
            // and show what it logged.
            let _ = child.kill();
            let _ = child.wait();
            let _ = log_reader.join();
            panic!("floodgate never said it listens ({line:?}); logs:\n{}", logs.lock().unwrap());
        };
        std::thread::spawn(move || for _ in stdout.lines() {});
        Floodgate { child, grpc, http, logs, log_reader: Some(log_reader), dir }
    }
}

impl FloodgateBuilder {
    /// `floodgate serve` with its ports, files and arguments, the
    /// environment's removals applied; and the directory of its files.
    fn command(&self) -> (Command, Option<TempDir>) {
        let dir = (!self.files.is_empty()).then(TempDir::new);
        let mut cmd = Command::new(&self.bin);
        cmd.arg("serve").args(["--listen", &self.listen, "--http-listen", &self.http_listen]);
        for (flag, name, text) in &self.files {
            let path = dir.as_ref().unwrap().write(name, text);
            cmd.arg(flag).arg(path);
        }
        cmd.args(&self.args);
        for name in &self.env_removed {
            cmd.env_remove(name);
        }
        (cmd, dir)
    }

    /// Runs `floodgate serve` where it must refuse to start: waits at most
    /// `limit` for it to exit and returns what it wrote and its status;
    /// kills it and panics if it still runs then. Unlike
    /// [`start`](FloodgateBuilder::start) it sets no `FLOODGATE_LOG`: the
    /// process has the test's environment and what [`env`](FloodgateBuilder::env) adds.
    pub fn run_to_exit(self, limit: Duration) -> std::process::Output {
        let (mut cmd, _dir) = self.command();
        for (name, value) in &self.env {
            cmd.env(name, value);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        // Read both pipes while waiting, so a chatty process cannot block.
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf);
            buf
        });
        let err = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });
        let Some(status) = wait_exit(&mut child, limit) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{:?}: still running after {limit:?}: it started instead of refusing", self.args);
        };
        std::process::Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
    }
}

/// A running `floodgate serve`, stopped (SIGKILL by PID) when dropped.
pub struct Floodgate {
    child: Child,
    /// The gRPC port's address (host:port).
    pub grpc: String,
    /// The HTTP port's address (host:port).
    pub http: String,
    logs: Arc<Mutex<String>>,
    log_reader: Option<std::thread::JoinHandle<()>>,
    dir: Option<TempDir>,
}

impl Floodgate {
    /// A server of the binary at `bin` to start. Only a test of the
    /// `floodgate` package knows where cargo built it
    /// (`env!("CARGO_BIN_EXE_floodgate")`), so the test passes it in.
    pub fn builder(bin: impl Into<PathBuf>) -> FloodgateBuilder {
        FloodgateBuilder {
            bin: bin.into(),
            listen: "127.0.0.1:0".into(),
            http_listen: "127.0.0.1:0".into(),
            args: Vec::new(),
            env: Vec::new(),
            env_removed: Vec::new(),
            files: Vec::new(),
        }
    }

    /// The directory holding the files given by [`FloodgateBuilder::rules`]
    /// and [`FloodgateBuilder::file`]; panics if none was.
    pub fn dir(&self) -> &TempDir {
        self.dir.as_ref().expect("a Floodgate started without .rules() or .file() has no directory")
    }

    /// The rules file given by [`FloodgateBuilder::rules`] (rewrite it to reload).
    pub fn rules_file(&self) -> PathBuf {
        self.dir().path("rules.yaml")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// The gRPC port's URL, `http://host:port`.
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

    /// The URL of `path` on the HTTP port.
    pub fn http_url(&self, path: &str) -> String {
        web::url(&self.http, path)
    }

    /// A request of `method` to `path` on the HTTP port, to add to and send.
    pub fn request(&self, method: &str, path: &str) -> Request {
        Request::new(method, self.http_url(path))
    }

    /// GETs a path on the HTTP port: (status, body).
    pub fn http_get(&self, path: &str) -> (u16, String) {
        let answer = web::get(self.http_url(path)).send();
        (answer.status, answer.text())
    }

    /// /metrics, parsed.
    pub fn metrics(&self) -> Metrics {
        let (status, text) = self.http_get("/metrics");
        assert_eq!(status, 200, "/metrics: {text}");
        Metrics::parse(&text)
    }

    /// Sends SIGTERM and waits for the process to exit; its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        crate::signal(self.child.id(), "TERM");
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
            crate::signal(self.child.id(), "KILL");
            let _ = self.child.wait();
        }
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

/// Runs `floodgate bench` (the binary at `bin`) against `grpc` and returns
/// its JSON report.
pub fn bench(bin: &Path, grpc: &str, args: &[&str]) -> serde_json::Value {
    try_bench(bin, grpc, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `floodgate bench` as [`bench`] does, and returns what went wrong
/// instead of panicking. A test that runs benches on its own threads uses it
/// so that the failure, with bench's standard error, is told by the test's
/// own thread, where the test's output shows it.
pub fn try_bench(bin: &Path, grpc: &str, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new(bin)
        .args(["bench", "--server", grpc, "--format", "json", "--quiet"])
        .args(args)
        .output()
        .map_err(|e| format!("running floodgate bench: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "bench on {grpc} with {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("bench's JSON report: {e}"))
}
