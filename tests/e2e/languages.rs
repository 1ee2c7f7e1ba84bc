//! The protos as other languages use them, against the real binary: Python
//! (grpcio, stubs generated here from proto/ with grpcio-tools, next to grpc's
//! xds-protos in one process) and TypeScript on Node (@grpc/grpc-js, the proto
//! loaded at run time, the example compiled by tsc --strict). `scripts/test`
//! installs the interpreters' packages into the test cache.

use crate::support;

use std::path::PathBuf;
use std::process::Command;

use support::*;

const RULES: &str = r#"
resources:
  - name: py.items
    limits: [ { name: per-user, key: [user], algorithm: fixed_window, limit: 3, window: 1h } ]
  - name: py.db
    breaker: { window: { kind: count, size: 10 }, minimum_calls: 3, failure_rate_threshold: 0.5, wait_in_open: 60s }
  - name: ts.items
    limits: [ { name: per-user, key: [user], algorithm: fixed_window, limit: 3, window: 1h } ]
  - name: ts.db
    breaker: { window: { kind: count, size: 10 }, minimum_calls: 3, failure_rate_threshold: 0.5, wait_in_open: 60s }
"#;

fn repo() -> PathBuf {
    support::repo_root()
}

/// A program `scripts/test` installs into the test cache.
fn cached(relative: &str) -> PathBuf {
    let path = test_cache().join(relative);
    assert!(path.exists(), "{} not found: run scripts/test (it installs it)", path.display());
    path
}

/// Runs `cmd`, fails the test with its output unless it succeeds; its stdout.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A loopback address where nothing listens.
fn nowhere() -> String {
    format!("127.0.0.1:{}", support::redis::free_port(false))
}

/// What both examples must have seen, from their JSON report.
fn check_scenario(seen: &serde_json::Value, prefix: &str) {
    assert_eq!(seen["items"], serde_json::json!(["ALLOWED", "ALLOWED", "ALLOWED", "RATE_LIMITED"]), "{seen}");
    let retry = seen["retry_after_s"].as_f64().unwrap();
    assert!(retry > 0.0 && retry <= 3600.0, "the rest of the hour window: {retry}");
    assert_eq!(seen["first_event"], "snapshot", "a Watch stream starts with a snapshot");
    assert_eq!(
        seen["db"],
        serde_json::json!(["FAILED", "FAILED", "FAILED", "CIRCUIT_OPEN", "CIRCUIT_OPEN", "CIRCUIT_OPEN"]),
        "three reported failures open the breaker: {seen}"
    );
    assert_eq!(seen["permits"], 3, "one distinct permit per admitted call");
    assert_eq!(
        seen["transition"],
        serde_json::json!([format!("{prefix}.db"), "BREAKER_STATE_CLOSED", "BREAKER_STATE_OPEN"]),
        "the Watch event names both states"
    );
    assert_eq!(seen["bad_input"], serde_json::json!(["INVALID_ARGUMENT", "resource: must not be empty"]));
    assert_eq!(seen["fail_open"], "ran", "no server, fail open: the call runs");
    assert_eq!(seen["fail_closed"], "UNAVAILABLE", "no server, fail closed: it does not");
}

#[test]
fn python_stubs_from_our_protos_work_beside_xds_protos() {
    let python = cached("py/bin/python");
    let stubs = TempDir::new();
    let proto = repo().join("proto");
    run(
        Command::new(&python).args(["-m", "grpc_tools.protoc", "-I"]).arg(&proto).args([
            &format!("--python_out={}", stubs.path("").display()),
            &format!("--pyi_out={}", stubs.path("").display()),
            &format!("--grpc_python_out={}", stubs.path("").display()),
            "floodgate/v1/floodgate.proto",
        ]),
        "grpc_tools.protoc",
    );
    // No field is a Python keyword: every one is in the generated type hints.
    let keywords = run(
        Command::new(&python).env("PYTHONPATH", stubs.path("")).args([
            "-c",
            "import keyword\nfrom floodgate.v1 import floodgate_pb2 as pb\n\
             bad = [f'{m.name}.{f.name}' for m in pb.DESCRIPTOR.message_types_by_name.values() for f in m.fields if keyword.iskeyword(f.name)]\n\
             print(','.join(bad))",
        ]),
        "the keyword check",
    );
    assert_eq!(keywords.trim(), "", "fields named like Python keywords");
    let pyi = std::fs::read_to_string(stubs.path("floodgate/v1/floodgate_pb2.pyi")).unwrap();
    assert!(
        pyi.contains(r#"__slots__ = ("resource", "from_state", "to_state", "reason", "next_probe_at")"#)
            && pyi.contains("from_state: _Optional[_Union[BreakerState, str]] = ..."),
        "BreakerTransition.from_state in the .pyi's slots and __init__:\n{pyi}"
    );

    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES))]).start();
    let out = run(
        Command::new(&python)
            .env("PYTHONPATH", stubs.path(""))
            .arg(repo().join("examples/python/floodgate_example.py"))
            .args(["--server", &fg.grpc, "--dead", &nowhere()]),
        "the Python example",
    );
    let seen: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    check_scenario(&seen, "py");
    // Envoy's RLS through xds-protos' stubs, in the same process as ours.
    assert_eq!(seen["rls"], serde_json::json!(["OK", "OK", "OK", "OVER_LIMIT"]));
}

#[test]
fn the_typescript_example_compiles_strict_and_runs_on_node() {
    let modules = cached("npm/node_modules");
    let tsc = cached("npm/node_modules/.bin/tsc");
    let build = TempDir::new();
    std::fs::copy(repo().join("examples/node/floodgate_example.ts"), build.path("floodgate_example.ts")).unwrap();
    std::os::unix::fs::symlink(&modules, build.path("node_modules")).unwrap();
    run(
        Command::new(&tsc)
            .current_dir(build.path(""))
            .args(["--strict", "--module", "commonjs", "--target", "es2022", "--types", "node"])
            .arg("floodgate_example.ts"),
        "tsc",
    );
    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES))]).start();
    let out = run(
        Command::new("node")
            .current_dir(build.path(""))
            .arg("floodgate_example.js")
            .args(["--server", &fg.grpc, "--dead", &nowhere(), "--proto"])
            .arg(repo().join("proto")),
        "the TypeScript example",
    );
    check_scenario(&serde_json::from_str(out.trim()).unwrap(), "ts");
}
