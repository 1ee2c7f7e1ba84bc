//! docker-compose.yml, checked without a Docker engine: every floodgate
//! command in it uses flags the binary has, and the demo runs the default rules.
//! (.ci/run also runs `docker-compose config` from PyPI on it.)

use crate::support;

use std::process::Command;

use serde_yaml_ng::Value;
use support::BIN;

fn compose() -> Value {
    let root = support::repo_root();
    serde_yaml_ng::from_str(&std::fs::read_to_string(root.join("docker-compose.yml")).unwrap()).unwrap()
}

#[test]
fn every_floodgate_command_uses_known_flags() {
    let compose = compose();
    let services = compose["services"].as_mapping().unwrap();
    for name in ["redis", "floodgate-a", "floodgate-b", "bench"] {
        assert!(services.contains_key(name), "service {name}");
    }
    let mut checked = 0;
    for (name, service) in services {
        let Some(command) = service["command"].as_sequence() else { continue };
        let words: Vec<&str> = command.iter().filter_map(Value::as_str).collect();
        let sub = words[0];
        if !["serve", "bench"].contains(&sub) {
            continue;
        }
        let help = Command::new(BIN).args([sub, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in words[1..].iter().filter(|w| w.starts_with("--")) {
            let flag = flag.split('=').next().unwrap();
            assert!(help.contains(flag), "{name:?}: `floodgate {sub}` has no {flag}");
        }
        checked += 1;
    }
    assert_eq!(checked, 3);
}

/// The demo runs the embedded default rules: the benchmark's rules (limits of
/// a billion) would show a newcomer a limiter that never says no.
#[test]
fn the_replicas_run_the_embedded_default_rules() {
    let compose = compose();
    for name in ["floodgate-a", "floodgate-b"] {
        let service = &compose["services"][name];
        let command: Vec<&str> = service["command"].as_sequence().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(!command.iter().any(|w| w.starts_with("--config")), "{name} passes a rules file: {command:?}");
        assert!(service["volumes"].is_null(), "{name} mounts files: {:?}", service["volumes"]);
    }
    // The load generator asks about a resource the default rules have.
    let bench: Vec<&str> =
        compose["services"]["bench"]["command"].as_sequence().unwrap().iter().filter_map(Value::as_str).collect();
    let resource = bench.iter().find_map(|w| w.strip_prefix("--resource=")).expect("bench names its resource");
    let defaults = floodgate_rules_defaults();
    assert!(defaults.contains(&format!("- name: {resource}\n")), "the default rules have no resource {resource:?}");
}

/// The embedded default rules, as the repository holds them.
fn floodgate_rules_defaults() -> String {
    std::fs::read_to_string(support::repo_root().join("server/rules/src/default_rules.yaml")).unwrap()
}
