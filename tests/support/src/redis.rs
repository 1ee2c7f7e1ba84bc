//! Real `redis-server` processes on free loopback ports, started and stopped
//! by PID: one standalone server, or a three-master cluster.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    cluster: bool,
    /// More arguments for redis-server (`--replicaof` for a replica).
    extra: Vec<String>,
}

/// A port nobody listens on now (and, for cluster nodes, its bus port too).
pub fn free_port(with_bus: bool) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_on(free_port(false), false)
    }

    /// One started with more arguments for redis-server.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let extra = extra.iter().map(|a| a.to_string()).collect();
        let mut s = RedisServer { child: None, port: free_port(false), dir, cluster: false, extra };
        s.spawn();
        s
    }

    fn start_on(port: u16, cluster: bool) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RedisServer { child: None, port, dir, cluster, extra: Vec::new() };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--dir"])
            .arg(self.dir.path())
            .args(&self.extra);
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--cluster-config-file"])
                .arg(self.dir.path().join("nodes.conf"));
        }
        let child =
            cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("redis-server (scripts/test installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while cli(self.port, &["PING"]).as_deref() != Some("PONG") {
            assert!(Instant::now() < deadline, "redis-server on {} did not answer", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops it (SIGKILL by PID): everything it held is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (with what it saved, if anything).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills it and starts it again with nothing: it lost every key.
    pub fn restart_empty(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
        self.spawn();
    }

    /// SIGSTOP or SIGCONT: a Redis that stalls (it neither answers nor refuses).
    pub fn signal(&self, name: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill").arg(format!("-{name}")).arg(c.id().to_string()).status();
        }
    }

    /// Stops it as an operator would: SHUTDOWN SAVE, so a restart has the data.
    pub fn shutdown_save(&mut self) {
        let _ = cli(self.port, &["SHUTDOWN", "SAVE"]);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// BGSAVE, and waits until the dump file is written: `dump.rdb` in its
    /// directory then holds what Redis holds now. After [`kill`](RedisServer::kill)
    /// (SIGKILL: nothing is saved at exit), [`restart`](RedisServer::restart)
    /// loads this dump, so Redis comes back older than it was when it died.
    pub fn bgsave(&self) {
        let info = || self.cli(&["INFO", "persistence"]).unwrap_or_default();
        let field = |info: &str, name: &str| {
            info.lines().find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':').map(str::to_string))
        };
        // `rdb_saves` (Redis 7) counts the saves since start. `LASTSAVE` has
        // a resolution of one second and may not change; an older Redis
        // saves in the foreground instead.
        let Some(before) = field(&info(), "rdb_saves").and_then(|n| n.parse::<u64>().ok()) else {
            assert_eq!(self.cli(&["SAVE"]).as_deref(), Some("OK"), "SAVE failed");
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut asked = false;
        loop {
            let now = info();
            let saves = field(&now, "rdb_saves").and_then(|n| n.parse::<u64>().ok()).unwrap_or(before);
            let idle = field(&now, "rdb_bgsave_in_progress").as_deref() == Some("0");
            if saves > before && idle {
                return;
            }
            // Asked again while another save runs: Redis refuses then.
            if !asked || idle {
                asked = self.cli(&["BGSAVE"]).is_some_and(|a| a.starts_with("Background saving"));
            }
            assert!(Instant::now() < deadline, "BGSAVE on {} never finished: {now}", self.port);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn cli(&self, args: &[&str]) -> Option<String> {
        cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// redis-cli's answer, trimmed; `None` when it could not connect.
pub fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli").args(["-p", &port.to_string()]).args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
}

/// Three masters, slots spread by `redis-cli --cluster create`, and with
/// `start_with_replicas` one replica for each master.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        RedisCluster::create(0)
    }

    /// Three masters and three replicas: `nodes[0..3]` start as masters and
    /// `nodes[3..6]` as their replicas (which replica follows which master
    /// is `redis-cli`'s choice: ask `replica_of`).
    pub fn start_with_replicas() -> RedisCluster {
        RedisCluster::create(1)
    }

    fn create(replicas: usize) -> RedisCluster {
        let count = 3 * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..count).map(|_| RedisServer::start_on(free_port(true), true)).collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in &nodes {
            while !n.cli(&["CLUSTER", "INFO"]).unwrap_or_default().contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "the cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes }
    }

    /// `--redis-cluster`'s argument.
    pub fn seeds(&self) -> String {
        self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>().join(",")
    }

    /// The index of the node that replicates the master `nodes[master]`, once
    /// its link to the master is up.
    pub fn replica_of(&self, master: usize) -> usize {
        let port = self.nodes[master].port.to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.nodes.iter().position(|n| {
                let info = n.cli(&["INFO", "replication"]).unwrap_or_default();
                info.contains(&format!("master_port:{port}")) && info.contains("master_link_status:up")
            });
            if let Some(i) = found {
                return i;
            }
            assert!(Instant::now() < deadline, "no replica of the master on {port} is linked");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The index of the master that holds keys matching `pattern` now.
    pub fn master_holding(&self, pattern: &str) -> usize {
        let found = self.nodes.iter().position(|n| {
            let role = n.cli(&["ROLE"]).unwrap_or_default();
            role.starts_with("master") && !n.cli(&["KEYS", pattern]).unwrap_or_default().is_empty()
        });
        found.unwrap_or_else(|| panic!("no master holds a key matching {pattern}"))
    }
}

pub fn temp_path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}
