//! Redis Sentinel for real: a master, one replica of it, and three
//! `redis-server --sentinel` processes watching the master, all on free
//! loopback ports and stopped by PID. The Sentinels fail over a second after
//! the master stops answering.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis::{RedisServer, cli, free_port};

/// The name the Sentinels watch the master under.
pub const MASTER: &str = "floodgate-test";

pub struct RedisSentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<(Child, u16)>,
    _dir: tempfile::TempDir,
}

impl RedisSentinels {
    pub fn start() -> RedisSentinels {
        let master = RedisServer::start();
        let of = master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &of]);
        let dir = tempfile::tempdir().unwrap();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port(false);
            // Sentinel rewrites its configuration file, so each has its own.
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {of} 2\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 4000\n\
                 sentinel parallel-syncs {MASTER} 1\n",
                dir = dir.path().display()
            );
            std::fs::write(&conf, text).unwrap();
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel (scripts/test installs redis-server)");
            sentinels.push((child, port));
        }
        let s = RedisSentinels { master, replica, sentinels, _dir: dir };
        // Ready when every Sentinel names the master and knows the replica
        // and the other two Sentinels (a failover needs a quorum of them).
        let deadline = Instant::now() + Duration::from_secs(30);
        for (_, port) in &s.sentinels {
            loop {
                let named = s.master_port_by(*port) == Some(s.master.port);
                let replicas = cli(*port, &["SENTINEL", "REPLICAS", MASTER]).unwrap_or_default();
                let others = cli(*port, &["SENTINEL", "SENTINELS", MASTER]).unwrap_or_default();
                let knows_replica = replicas.contains(&s.replica.port.to_string());
                let peers = s.sentinels.iter().filter(|(_, p)| p != port && others.contains(&p.to_string())).count();
                if named && knows_replica && peers == 2 {
                    break;
                }
                assert!(Instant::now() < deadline, "Sentinel {port} did not see the master, the replica and its peers");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        s
    }

    /// `--redis-sentinel`'s argument.
    pub fn urls(&self) -> String {
        self.sentinels.iter().map(|(_, p)| format!("redis://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// The port of the master Sentinel `port` names.
    fn master_port_by(&self, port: u16) -> Option<u16> {
        let answer = cli(port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])?;
        answer.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until every Sentinel names `port` as the master.
    pub fn wait_master(&self, port: u16, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.sentinels.iter().all(|(_, p)| self.master_port_by(*p) == Some(port)) {
            assert!(Instant::now() < deadline, "the Sentinels did not name {port} as the master");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the replica has received everything the master wrote.
    pub fn wait_replica_caught_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let acked = self.master.cli(&["WAIT", "1", "500"]).unwrap_or_default();
            if acked.trim() == "1" {
                return;
            }
            assert!(Instant::now() < deadline, "the replica did not catch up with the master");
        }
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for (child, _) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
