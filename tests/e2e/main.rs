//! Floodgate's end-to-end tests: one test binary, one module per feature.
//!
//! Each module starts the real `floodgate` binary (built by the same `cargo
//! test; see `support` below), real `redis-server` processes, Envoy,
//! Prometheus or a browser on free loopback ports, and checks what a user of
//! that feature sees. A new file in tests/e2e/ must be named by a `mod` line
//! here: `every_file_is_a_module` fails otherwise, so that no file is left
//! uncompiled.

/// The support crate (tests/support), with this package's binary bound in.
/// Only an integration test of the `floodgate` package is compiled with
/// `CARGO_BIN_EXE_floodgate`, so this is where its path is known; the
/// support crate's starter takes it as an argument, and every module here
/// starts the binary with `support::floodgate()...start()`.
mod support {
    pub use floodgate_test_support::*;

    /// The binary under test, built by cargo for this test run.
    pub const BIN: &str = env!("CARGO_BIN_EXE_floodgate");

    /// A `floodgate serve` of the binary under test, to set up and start.
    pub fn floodgate() -> FloodgateBuilder {
        Floodgate::builder(BIN)
    }

    /// Runs `floodgate bench` against `grpc` and returns its JSON report.
    pub fn bench(grpc: &str, args: &[&str]) -> serde_json::Value {
        floodgate_test_support::bench(BIN.as_ref(), grpc, args)
    }

    /// Runs `floodgate bench` as [`bench`] does; a failure is returned, not panicked.
    pub fn try_bench(grpc: &str, args: &[&str]) -> Result<serde_json::Value, String> {
        floodgate_test_support::try_bench(BIN.as_ref(), grpc, args)
    }
}

mod abuse;
mod acquire;
mod adaptive;
mod admin;
mod breaker;
mod cancel;
mod chaos;
mod client;
mod client_trust;
mod compose;
mod console;
mod console_charts;
mod degraded;
mod doc_rules;
mod envoy;
mod envoy_proxy;
mod envoy_upstream;
mod envoy_xds;
mod faults;
mod fleet;
mod fuzz_seeds;
mod http_api;
mod kubernetes;
mod languages;
mod leases;
mod metered;
mod observe;
mod overrides;
mod prometheus;
mod recommend;
mod redis;
mod redis_failover;
mod reference;
mod rollback;
mod rules;
mod sentinel;
mod settle;
mod shown;
mod soft_limits;
mod systems;
mod tls;
mod traces;
mod tutorial;
mod usage;
mod waterfall;
mod what_if;
mod why;

/// Every `.rs` file beside this one is a module of this binary, and every
/// module has its file: a file left off is never compiled, and nothing else
/// would say so.
#[test]
fn every_file_is_a_module() {
    use std::collections::BTreeSet;
    let here = support::repo_path("tests/e2e");
    let files: BTreeSet<String> = std::fs::read_dir(&here)
        .unwrap_or_else(|e| panic!("listing {}: {e}", here.display()))
        .map(|entry| entry.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            if p.is_dir() {
                p.join("mod.rs").exists().then_some(name)
            } else {
                name.strip_suffix(".rs").filter(|n| *n != "main").map(String::from)
            }
        })
        .collect();
    // `mod name;` lines of this file, but not those given a #[path] elsewhere.
    let source = include_str!("main.rs");
    let mut declared = BTreeSet::new();
    let mut pathed = false;
    for line in source.lines().map(str::trim) {
        if line.starts_with("#[path") {
            pathed = true;
            continue;
        }
        let name = line.strip_prefix("pub ").unwrap_or(line).strip_prefix("mod ").and_then(|r| r.strip_suffix(';'));
        if let Some(name) = name
            && !std::mem::take(&mut pathed)
        {
            declared.insert(name.trim().to_string());
        }
    }
    let unlisted: Vec<_> = files.difference(&declared).collect();
    let missing: Vec<_> = declared.difference(&files).collect();
    assert!(
        unlisted.is_empty(),
        "tests/e2e files with no `mod` line in tests/e2e/main.rs (never compiled): {unlisted:?}"
    );
    assert!(missing.is_empty(), "`mod` lines in tests/e2e/main.rs with no file in tests/e2e: {missing:?}");
}
