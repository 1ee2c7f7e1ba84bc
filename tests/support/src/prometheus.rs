//! A real Prometheus (Debian's, installed by `scripts/test`) scraping a
//! server every second, queried over its HTTP API; stopped when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{TempDir, web};

/// A Prometheus process, killed when dropped.
pub struct Prometheus {
    child: Child,
    pub addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `target` (host:port) every second, with `rules` if given;
    /// waits until it is ready.
    pub fn start(dir: &TempDir, target: &str, rules: Option<&Path>) -> Prometheus {
        let rule_files = rules.map(|r| format!("rule_files: [ {} ]\n", r.display())).unwrap_or_default();
        let config = format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n{rule_files}scrape_configs:\n  - job_name: floodgate\n    static_configs: [ {{ targets: [ '{target}' ] }} ]\n"
        );
        let config = dir.write("prometheus.yml", &config);
        let port = super::redis::free_port(false);
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian's prometheus; scripts/test installs it)");
        let prom = Prometheus { child, addr };
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(&prom.addr, "/-/ready").is_none() {
            assert!(Instant::now() < deadline, "Prometheus never became ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        prom
    }
}

/// A GET of Prometheus' HTTP API: the body of a 200 answer.
pub fn get(addr: &str, path_and_query: &str) -> Option<String> {
    let answer = web::get(web::url(addr, path_and_query)).timeout(Duration::from_secs(10)).try_send().ok()?;
    (answer.status == 200).then(|| answer.text())
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query; panics unless Prometheus answers it.
pub fn query(prom: &Prometheus, q: &str) -> serde_json::Value {
    let body = get(&prom.addr, &format!("/api/v1/query?query={}", encode(q)))
        .unwrap_or_else(|| panic!("Prometheus refused the query {q}"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{q}: {v}");
    v
}
