//! Rules through the real binary: a file is loaded, watched and hot reloaded;
//! an invalid file is refused whole while the old rules keep working.

use crate::support;

use std::process::Command;
use std::time::Duration;

use floodgate_proto::v1 as pb;
use support::*;

fn rules_with_limit(limit: u64) -> String {
    format!(
        r#"
resources:
  - name: orders
    limits:
      - {{ name: hourly, algorithm: fixed_window, limit: {limit}, window: 1h }}
"#
    )
}

async fn limit_of(fg: &Floodgate) -> Option<u64> {
    let mut admin = fg.admin().await;
    let peek = pb::PeekRequest { resource: "orders".into(), ..Default::default() };
    let r = admin.peek(peek).await.ok()?.into_inner();
    r.limits.first().map(|l| l.limit)
}

#[tokio::test]
async fn a_changed_file_applies_and_an_invalid_one_keeps_the_old_rules() {
    let dir = TempDir::new();
    let file = dir.write("rules.yaml", &rules_with_limit(3));
    let fg = floodgate().args(["--config", path_str(&file)]).start();
    let mut client = fg.client().await;

    // Three admitted, the fourth denied: the file's limit is enforced.
    for _ in 0..3 {
        let r = client.acquire(acquire("orders", &[], 1)).await.unwrap().into_inner();
        assert_eq!(r.verdict(), pb::Verdict::Allowed);
    }
    let r = client.acquire(acquire("orders", &[], 1)).await.unwrap().into_inner();
    assert_eq!(r.verdict(), pb::Verdict::RateLimited);
    assert!(r.reason.contains("limit 'hourly'"), "{}", r.reason);

    // Rewritten in place: the new limit applies without a restart, and the
    // bucket keeps what was already taken (3 of 5).
    std::fs::write(&file, rules_with_limit(5)).unwrap();
    eventually("the new limit of 5", Duration::from_secs(10), || async {
        (limit_of(&fg).await == Some(5)).then_some(())
    })
    .await;
    let r = client.acquire(acquire("orders", &[], 1)).await.unwrap().into_inner();
    assert_eq!((r.verdict(), r.limits[0].remaining), (pb::Verdict::Allowed, 1));

    // Replaced by an atomic rename: seen too.
    dir.replace("rules.yaml", &rules_with_limit(8));
    eventually("the new limit of 8", Duration::from_secs(10), || async {
        (limit_of(&fg).await == Some(8)).then_some(())
    })
    .await;

    // An invalid file is ignored and logged; the limit of 8 stays enforced.
    dir.replace("rules.yaml", "resources:\n  - name: orders\n    limits: [ { name: hourly, algorithm: fixed_window, limit: 0, window: 1h } ]\n");
    eventually("the rejection in the log", Duration::from_secs(10), || async {
        fg.logs().contains("invalid rules file ignored").then_some(())
    })
    .await;
    assert!(fg.logs().contains("limits[0] 'hourly'.limit: must be a whole number between 1"), "{}", fg.logs());
    assert_eq!(limit_of(&fg).await, Some(8));
    let mut admitted = 0;
    for _ in 0..6 {
        let r = client.acquire(acquire("orders", &[], 1)).await.unwrap().into_inner();
        admitted += u32::from(r.verdict() == pb::Verdict::Allowed);
    }
    assert_eq!(admitted, 4, "4 + 4 = 8 under the rules still in force");

    // Still healthy.
    assert_eq!(fg.http_get("/healthz"), (200, "ok\n".into()));
    let mut health = tonic_health::pb::health_client::HealthClient::new(fg.channel().await);
    let status = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
    assert_eq!(status.into_inner().status(), tonic_health::pb::health_check_response::ServingStatus::Serving);
}

/// Rule versions installed from the file so far, by the reload counter.
fn file_reloads(fg: &Floodgate) -> u64 {
    let reloads = fg.metrics().value("floodgate_rule_reloads_total", &[("source", "file"), ("result", "success")]);
    reloads.map_or(0, |n| n as u64)
}

#[tokio::test]
async fn a_file_written_in_chunks_is_installed_whole_never_half_written() {
    let dir = TempDir::new();
    let file = dir.write("rules.yaml", &rules_with_limit(3));
    let fg = floodgate().args(["--config", path_str(&file)]).start();
    assert_eq!(file_reloads(&fg), 1);
    // The first chunk is valid YAML on its own: "orders" with no limits at
    // all. Installing it would leave the resource unlimited.
    let whole = rules_with_limit(7);
    let cut = whole.find("    limits:").unwrap();
    let (first, rest) = whole.split_at(cut);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&file).unwrap();
        f.write_all(first.as_bytes()).unwrap();
        f.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        f.write_all(rest.as_bytes()).unwrap();
    }
    eventually("the new limit of 7", Duration::from_secs(10), || async {
        (limit_of(&fg).await == Some(7)).then_some(())
    })
    .await;
    assert_eq!(file_reloads(&fg), 2, "one install: the whole file, never its first half");
}

#[tokio::test]
async fn an_edit_of_a_symlink_target_in_another_directory_is_seen() {
    let links = TempDir::new();
    let targets = TempDir::new();
    let target = targets.write("real-rules.yaml", &rules_with_limit(3));
    let link = links.path("rules.yaml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let fg = floodgate().args(["--config", path_str(&link)]).start();
    assert_eq!(limit_of(&fg).await, Some(3));
    std::fs::write(&target, rules_with_limit(9)).unwrap();
    eventually("the new limit of 9", Duration::from_secs(10), || async {
        (limit_of(&fg).await == Some(9)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn apply_rules_refuses_a_bad_set_whole_and_lists_every_error() {
    let fg = floodgate().start();
    let mut admin = fg.admin().await;
    let before = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    assert_eq!(before.source, "embedded");

    let bad = "resources:\n  - { name: a, limits: [ { name: x, algorithm: gcra, rate_per_second: 0, burst: 1 } ] }\n  - { name: b, shed_at_level: 9 }\n";
    let err = admin
        .apply_rules(pb::ApplyRulesRequest { yaml: bad.into(), validate_only: false, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("2 errors in rules:"), "{}", err.message());
    assert!(
        err.message().contains("resource 'a': limits[0] 'x'.rate_per_second: must be a positive number, got 0"),
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("resource 'b': shed_at_level: must be a whole number between 1 and 3, got 9"),
        "{}",
        err.message()
    );
    let after = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    assert_eq!((after.version, after.yaml), (before.version, before.yaml));

    let good = rules_with_limit(2);
    let check = admin
        .apply_rules(pb::ApplyRulesRequest { yaml: good.clone(), validate_only: true, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(!check.applied);
    assert_eq!(admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner().version, before.version);
    let applied = admin
        .apply_rules(pb::ApplyRulesRequest { yaml: good.clone(), validate_only: false, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(applied.applied);
    assert_eq!(applied.version, before.version + 1);
    let now = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (now.source.as_str(), now.yaml.as_str(), now.resources),
        ("admin", good.as_str(), vec!["orders".to_string()])
    );
}

#[test]
fn check_config_lists_every_error_and_exits_non_zero() {
    let dir = TempDir::new();
    let good = dir.write("good.yaml", &rules_with_limit(3));
    let out = Command::new(BIN).arg("check-config").arg(&good).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK (1 resources, 1 limits)"));

    let bad = dir.write(
        "bad.yaml",
        "resources:\n  - name: orders\n    limits:\n      - { name: a, algorithm: token_bucket, capacity: 10 }\n      - { name: b, algorithm: fixed_window, limit: 5, window: soon }\n",
    );
    let out = Command::new(BIN).arg("check-config").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let file = bad.display();
    assert!(err.contains(&format!("{file}: resource 'orders': limits[0] 'a'.refill_per_second: is required")), "{err}");
    assert!(
        err.contains(&format!("{file}: resource 'orders': limits[1] 'b'.window: duration 'soon' has unknown unit")),
        "{err}"
    );

    let out = Command::new(BIN).arg("check-config").arg(dir.path("missing.yaml")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn serve_refuses_to_start_with_an_invalid_file() {
    let dir = TempDir::new();
    let bad = dir.write("bad.yaml", "resources: [ { name: '' } ]\n");
    let out = floodgate().arg("--config").arg(&bad).run_to_exit(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("name: must not be empty"));
}

/// Runs `floodgate serve` with `args`; it must exit within 10 s, refusing,
/// and say `says`.
fn refuses_to_start(args: &[&str], says: &str) {
    // Still running after 10 s: waiting on the file, or reading it without end.
    let out = floodgate().args(args).run_to_exit(Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
}

fn mkfifo(path: &std::path::Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn files_that_are_not_files_are_refused_at_start_without_waiting_on_them() {
    let dir = TempDir::new();
    let fifo = dir.path("fifo.yaml");
    mkfifo(&fifo);
    let zero = dir.path("zero.yaml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let envoy = dir.path("envoy");
    std::fs::create_dir(&envoy).unwrap();
    mkfifo(&envoy.join("a.yaml"));
    let rules = dir.write("rules.yaml", &rules_with_limit(3));
    for (args, says) in [
        (vec!["--config", path_str(&fifo)], "is not a regular file but a FIFO"),
        (vec!["--config", path_str(&zero)], "is not a regular file but a character device"),
        (vec!["--config", "/dev/zero"], "is not a regular file but a character device"),
        (vec!["--config", path_str(dir.path("").as_path())], "is not a regular file but a directory"),
        (vec!["--envoy-config", path_str(&envoy)], "a.yaml: cannot read: is not a regular file but a FIFO"),
        (vec!["--config", path_str(&rules), "--admin-token-file", path_str(&fifo)], "is not a regular file"),
        (vec!["--config", path_str(&rules), "--admin-token-file", "/dev/zero"], "is not a regular file"),
    ] {
        refuses_to_start(&args, says);
    }
}

#[tokio::test]
async fn a_rules_file_swapped_for_a_fifo_or_dev_zero_keeps_the_old_rules_and_the_server_lean() {
    let dir = TempDir::new();
    let file = dir.write("rules.yaml", &rules_with_limit(3));
    let fg = floodgate().args(["--config", path_str(&file)]).start();
    let before = rss_kib(fg.pid());
    let fifo = dir.path("fifo");
    mkfifo(&fifo);
    let mut refusals = 0;
    for target in [std::path::PathBuf::from("/dev/zero"), fifo.clone(), dir.path("")] {
        // Swapped in by a rename, as a deploy tool would.
        let link = dir.path("next");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        std::fs::rename(&link, &file).unwrap();
        refusals += 1;
        eventually(
            &format!("refusal {refusals} in the log ({})", target.display()),
            Duration::from_secs(10),
            || async { (fg.logs().matches("cannot read the rules file").count() >= refusals).then_some(()) },
        )
        .await;
        // Still deciding, by the old rules.
        assert_eq!(limit_of(&fg).await, Some(3), "{}", target.display());
    }
    let logs = fg.logs();
    assert!(logs.contains("is not a regular file but a character device"), "{logs}");
    assert!(logs.contains("is not a regular file but a FIFO"), "{logs}");
    assert!(logs.contains("is not a regular file but a directory"), "{logs}");
    let after = rss_kib(fg.pid());
    assert!(after < before + 64 * 1024, "RSS {before} KiB before, {after} KiB after reading /dev/zero");

    // A real file again: installed (the watcher was not stuck on the FIFO).
    std::fs::remove_file(&file).unwrap();
    dir.replace("rules.yaml", &rules_with_limit(7));
    eventually("the new limit of 7", Duration::from_secs(10), || async {
        (limit_of(&fg).await == Some(7)).then_some(())
    })
    .await;
}

/// The rules file is replaced for a while by a FIFO (refused: never waited
/// on), then written back with the very text in force: that ends the
/// refusal (the gauge the alert and the console's banner follow).
#[tokio::test]
async fn a_rules_file_that_was_a_fifo_for_a_while_is_read_again_when_it_comes_back() {
    let dir = TempDir::new();
    let good = rules_with_limit(3);
    let file = dir.write("rules.yaml", &good);
    let fg = floodgate().args(["--config", path_str(&file)]).start();
    let failing = |fg: &Floodgate| fg.metrics().value("floodgate_rules_reload_failing", &[("source", "file")]);
    std::fs::remove_file(&file).unwrap();
    assert!(Command::new("mkfifo").arg(&file).status().unwrap().success());
    eventually("the FIFO refused", Duration::from_secs(10), || async { (failing(&fg) == Some(1.0)).then_some(()) })
        .await;
    assert!(fg.logs().contains("is not a regular file"), "{}", fg.logs());
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, &good).unwrap();
    eventually("the good file read again", Duration::from_secs(10), || async {
        (failing(&fg) == Some(0.0)).then_some(())
    })
    .await;
}

/// Runs `floodgate rules ARGS --server` against `fg`: (success, stdout, stderr).
fn rules_cli(fg: &Floodgate, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).arg("rules").args(["--server", &fg.grpc]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[tokio::test]
async fn a_change_is_reverted_with_one_command_and_every_step_is_audited() {
    let dir = TempDir::new();
    let file = dir.write("rules.yaml", &rules_with_limit(3));
    let fg = floodgate().args(["--config", path_str(&file)]).start();

    // Nothing to revert yet: said so, nothing changes.
    let (ok, _, err) = rules_cli(&fg, &["revert"]);
    assert!(!ok && err.contains("no earlier rules are kept"), "{err}");
    assert_eq!(limit_of(&fg).await, Some(3));

    let raised = dir.write("raised.yaml", &rules_with_limit(50));
    let (ok, out, err) = rules_cli(&fg, &["apply", path_str(&raised)]);
    assert!(ok, "{out}{err}");
    assert_eq!(limit_of(&fg).await, Some(50));
    let (ok, history, _) = rules_cli(&fg, &["history"]);
    assert!(ok && history.contains("version 2 in force, from admin"), "{history}");
    let file_shown = format!("version 1 from {}", file.display());
    assert!(history.contains(&file_shown) && history.contains("1 resources (orders)"), "{history}");

    // One command puts the file's rules back, as a new version; a second
    // one undoes the first.
    let (ok, out, err) = rules_cli(&fg, &["revert"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("reverted to the rules of version 1; version 3 in force"), "{out}");
    assert_eq!(limit_of(&fg).await, Some(3));
    let mut admin = fg.admin().await;
    let got = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    assert_eq!((got.yaml, got.version), (rules_with_limit(3), 3));
    let kept: Vec<u64> = got.earlier.iter().map(|e| e.version).collect();
    assert_eq!(kept, [2, 1], "newest first");
    let (ok, out, _) = rules_cli(&fg, &["revert"]);
    assert!(ok && out.contains("reverted to the rules of version 2; version 4 in force"), "{out}");
    assert_eq!(limit_of(&fg).await, Some(50));
    // Or any version kept, by number.
    let (ok, out, _) = rules_cli(&fg, &["revert", "--to", "1"]);
    assert!(ok && out.contains("reverted to the rules of version 1; version 5 in force"), "{out}");
    assert_eq!(limit_of(&fg).await, Some(3));

    // A version not kept is refused by name, and nothing changes.
    let err = admin.revert_rules(pb::RevertRulesRequest { to_version: 99 }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(
        err.message().starts_with("to_version: 99 is not kept; the versions kept are 4, 3, 2, 1"),
        "{}",
        err.message()
    );
    assert_eq!(admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner().version, 5);
    let (ok, _, err) = rules_cli(&fg, &["revert", "--to", "0"]);
    assert!(!ok && err.contains("--to"), "{err}");

    let logs = eventually("three audit lines", Duration::from_secs(5), || async {
        let logs = fg.logs();
        (logs.matches("change=\"RevertRules\"").count() == 3).then_some(logs)
    })
    .await;
    let line = logs.lines().find(|l| l.contains("change=\"RevertRules\"")).unwrap();
    for part in ["reverted_to=1", "version_before=2", "version_after=3", "admin change"] {
        assert!(line.contains(part), "{part} missing from the audit line: {line}");
    }
}

#[tokio::test]
async fn only_the_last_ten_rules_files_are_kept() {
    let fg = floodgate().start();
    let mut admin = fg.admin().await;
    for limit in 1..=15 {
        let apply = pb::ApplyRulesRequest { yaml: rules_with_limit(limit), ..Default::default() };
        admin.apply_rules(apply).await.unwrap();
    }
    let got = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    let kept: Vec<u64> = got.earlier.iter().map(|e| e.version).collect();
    assert_eq!(kept, (6..=15).rev().collect::<Vec<u64>>(), "the embedded rules (1) and versions 2-5 are forgotten");
    // The same file applied again is not a new entry.
    let apply = pb::ApplyRulesRequest { yaml: rules_with_limit(15), ..Default::default() };
    admin.apply_rules(apply).await.unwrap();
    let got = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    assert_eq!(got.earlier.first().map(|e| e.version), Some(15));
    assert_eq!(got.earlier.len(), 10);
    // A large file is listed by its first 20 patterns and its count, so
    // that ten large files keep GetRules small.
    let mut many = String::from("resources:\n");
    for i in 0..30 {
        many += &format!(
            "  - {{ name: r{i:02}, limits: [ {{ name: l, algorithm: fixed_window, limit: 5, window: 1m }} ] }}\n"
        );
    }
    admin.apply_rules(pb::ApplyRulesRequest { yaml: many, ..Default::default() }).await.unwrap();
    admin.apply_rules(pb::ApplyRulesRequest { yaml: rules_with_limit(1), ..Default::default() }).await.unwrap();
    let got = admin.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner();
    let e = &got.earlier[0];
    assert_eq!((e.resources.len(), e.resource_count, e.resources[19].as_str()), (20, 30, "r19"));
}
