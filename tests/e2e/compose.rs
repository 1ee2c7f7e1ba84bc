//! docker-compose.yml, checked without a Docker engine: every floodgate
//! command in it uses flags the binary has, and the rules it mounts are valid.
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

#[test]
fn the_mounted_rules_are_valid() {
    let compose = compose();
    let root = support::repo_root();
    let volumes = compose["services"]["floodgate-a"]["volumes"].as_sequence().unwrap();
    let source = volumes[0].as_str().unwrap().split(':').next().unwrap();
    let out = Command::new(BIN).arg("check-config").arg(root.join(source)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
