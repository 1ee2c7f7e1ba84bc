//! Overrides and tiers in the rules file, through the real binary: a tier's
//! limits, a factor, absolute numbers and a block, each decided in buckets
//! of its own and counted under the resource's metrics. Then overrides set at
//! run time through Admin and the CLI: kept in a file or in Redis across
//! restarts, shared by replicas, announced on Watch, ended at their expiry.

use crate::support;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use tonic::transport::Channel;

type Client = FloodgateClient<Channel>;
use support::*;

const RULES: &str = r#"
tiers:
  gold:
    - { name: per-key, key: [api_key], algorithm: fixed_window, limit: 6, window: 1h }
    - { name: burst, key: [api_key], algorithm: fixed_window, limit: 5, window: 1h }
resources:
  - name: api
    limits:
      - { name: per-key, key: [api_key], algorithm: fixed_window, limit: 2, window: 1h }
    overrides:
      - { when: { api_key: k-gold }, tier: gold }
      - { when: { tenant: acme }, factor: 10 }
      - { when: { api_key: k-big }, limits: { per-key: 4 } }
      - { when: { ip: 6.6.6.6 }, block: true, retry_after: 10m }
"#;

fn ask(pairs: &[(&str, &str)]) -> pb::AcquireRequest {
    pb::AcquireRequest {
        resource: "api".into(),
        descriptors: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>(),
        ..Default::default()
    }
}

async fn admitted(c: &mut Client, pairs: &[(&str, &str)], n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if c.acquire(ask(pairs)).await.unwrap().into_inner().verdict() == pb::Verdict::Allowed {
            ok += 1;
        }
    }
    ok
}

#[tokio::test]
async fn tiers_factors_absolute_limits_and_blocks_from_the_rules_file() {
    let dir = TempDir::new();
    let fg = floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES))]).start();
    let mut c = fg.client().await;
    assert_eq!(admitted(&mut c, &[("api_key", "plain")], 5).await, 2, "the resource's own limit");
    assert_eq!(admitted(&mut c, &[("api_key", "k-big")], 6).await, 4, "an absolute limit");
    assert_eq!(admitted(&mut c, &[("api_key", "k1"), ("tenant", "acme")], 25).await, 20, "ten times");
    assert_eq!(admitted(&mut c, &[("api_key", "k-gold")], 8).await, 5, "the gold tier: its burst of 5 bites first");
    let blocked = c.acquire(ask(&[("api_key", "k9"), ("ip", "6.6.6.6")])).await.unwrap().into_inner();
    assert_eq!(blocked.verdict(), pb::Verdict::RateLimited);
    assert_eq!(blocked.retry_after.unwrap().seconds, 600);
    assert_eq!(blocked.reason, "blocked by an override for ip=6.6.6.6, retry in 10m");

    // A tier's own limit is counted under the resource, by its name.
    let metrics = fg.http_get("/metrics").1;
    let line = r#"floodgate_limit_decisions_total{resource="api",limit="burst",result="exceeded"} 3"#;
    assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");

    // A bad override is refused whole at reload; the old ones keep working.
    dir.replace("rules.yaml", &RULES.replace("tier: gold", "tier: platinum"));
    let failed = r#"floodgate_rule_reloads_total{source="file",result="failure"} 1"#;
    eventually("the bad reload refused", Duration::from_secs(10), || async {
        fg.http_get("/metrics").1.lines().any(|l| l == failed).then_some(())
    })
    .await;
    assert_eq!(admitted(&mut c, &[("api_key", "k2"), ("tenant", "acme")], 22).await, 20, "still ten times");
}

/// The limit `api` has for these descriptors now (Peek), or `None` when
/// nothing matched (a block matches no limit).
async fn limit_of(fg: &Floodgate, pairs: &[(&str, &str)]) -> Option<u64> {
    let mut admin = fg.admin().await;
    let req = pb::PeekRequest { resource: "api".into(), descriptors: ask(pairs).descriptors, limit: String::new() };
    let peek = admin.peek(req).await.unwrap().into_inner();
    peek.limits.first().map(|l| l.limit)
}

fn factor(id: &str, tenant: &str, f: f64, ttl: Option<u64>) -> pb::Override {
    pb::Override {
        id: id.into(),
        rule: "api".into(),
        when: [("tenant".to_string(), tenant.to_string())].into(),
        action: Some(pb::r#override::Action::Factor(f)),
        ttl: ttl.map(|s| prost_types::Duration { seconds: s as i64, nanos: 0 }),
        reason: "e2e".into(),
        ..Default::default()
    }
}

fn set(overrides: Vec<pb::Override>) -> pb::SetOverridesRequest {
    pb::SetOverridesRequest { overrides }
}

async fn list(fg: &Floodgate) -> pb::ListOverridesResponse {
    let mut admin = fg.admin().await;
    admin.list_overrides(pb::ListOverridesRequest::default()).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_overrides_are_kept_in_a_file_announced_on_watch_and_end_at_their_expiry() {
    let dir = TempDir::new();
    let rules = dir.write("rules.yaml", RULES);
    let file = dir.path("overrides.jsonl");
    let args = ["--config", path_str(&rules), "--overrides-file", path_str(&file)];
    let mut fg = floodgate().args(args).start();
    let mut watch = fg.client().await.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(pb::watch_event::Event::Snapshot(_))));
    let mut admin = fg.admin().await;

    // acme: 10x from the file; an override set at run time wins over it.
    assert_eq!(limit_of(&fg, &[("api_key", "k1"), ("tenant", "acme")]).await, Some(20));
    let answer = admin.set_overrides(set(vec![factor("acme-x3", "acme", 3.0, None)])).await.unwrap().into_inner();
    assert!(answer.persisted, "kept in --overrides-file");
    assert_eq!(answer.overrides[0].id, "acme-x3");
    assert!(answer.overrides[0].active);
    assert_eq!(limit_of(&fg, &[("api_key", "k1"), ("tenant", "acme")]).await, Some(6));
    let event = watch.message().await.unwrap().unwrap();
    let Some(pb::watch_event::Event::Overrides(changed)) = event.event else { panic!("{event:?}") };
    assert_eq!((changed.set, changed.rules_version), (vec!["acme-x3".to_string()], answer.rules_version));

    // Bad input: INVALID_ARGUMENT naming the item and field; nothing changes.
    let before = list(&fg).await;
    let mut unknown_tier = factor("t", "x", 2.0, None);
    unknown_tier.action = Some(pb::r#override::Action::Tier("platinum".into()));
    let cases = [
        (factor("ok", "x", 2.0, None), "overrides[1].factor: must be above 0", factor("bad", "y", -1.0, None)),
        (factor("ok", "x", 2.0, None), "overrides[1].tier: 'platinum' is not a tier", unknown_tier),
        (factor("ok", "x", 2.0, None), "overrides[1].id: 'bad id' has ' '", factor("bad id", "y", 2.0, None)),
        (
            factor("ok", "x", 2.0, None),
            "overrides[1].ttl: 0s 0ns is not between 1s and 366d",
            factor("z", "y", 2.0, Some(0)),
        ),
        (factor("ok", "x", 2.0, None), "overrides[1].id: 'ok' appears twice", factor("ok", "y", 2.0, None)),
    ];
    for (good, want, bad) in cases {
        let err = admin.set_overrides(set(vec![good, bad])).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with(want), "{} does not start with {want}", err.message());
    }
    let mut no_rule = factor("r", "x", 2.0, None);
    no_rule.rule = "nope".into();
    let err = admin.set_overrides(set(vec![no_rule])).await.unwrap_err();
    assert!(err.message().contains("overrides[0].rule: no rule is named 'nope'"), "{}", err.message());
    assert_eq!(list(&fg).await, before, "a refused call changed nothing");

    // The most one call may carry: 10,000 set, paged through, deleted.
    let many: Vec<pb::Override> =
        (0..10_000).map(|i| factor(&format!("bulk-{i:05}"), &format!("b{i}"), 2.0, None)).collect();
    let ids: Vec<String> = many.iter().map(|o| o.id.clone()).collect();
    admin.set_overrides(set(many)).await.unwrap();
    let page = admin.list_overrides(pb::ListOverridesRequest { after: "bulk-00999".into(), ..Default::default() });
    let page = page.await.unwrap().into_inner();
    assert_eq!((page.total, page.overrides.len(), page.next_after.as_str()), (10_001, 1000, "bulk-01999"));
    let done = admin.delete_overrides(pb::DeleteOverridesRequest { ids }).await.unwrap().into_inner();
    assert_eq!(done.deleted.len(), 10_000);
    let _ = watch.message().await.unwrap();
    let _ = watch.message().await.unwrap();

    // One that lasts two seconds: applies, then ends on its own (announced),
    // and acme is back to the run-time 3x.
    let short = factor("acme-short", "acme", 5.0, Some(2));
    let mut short_more = short.clone();
    short_more.when.insert("api_key".into(), "k-short".into());
    admin.set_overrides(set(vec![short_more])).await.unwrap();
    assert_eq!(limit_of(&fg, &[("api_key", "k-short"), ("tenant", "acme")]).await, Some(10), "more values win");
    let _ = watch.message().await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(20), watch.message()).await.unwrap().unwrap().unwrap();
    let Some(pb::watch_event::Event::Overrides(changed)) = event.event else { panic!("{event:?}") };
    assert_eq!(changed.expired, ["acme-short"]);
    assert_eq!(limit_of(&fg, &[("api_key", "k-short"), ("tenant", "acme")]).await, Some(6));

    // The CLI: set a block for an hour, list, and (after a restart) delete.
    let cli = |args: &[&str]| {
        let out = Command::new(BIN).arg("overrides").args(["--server", &fg.grpc]).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let said = cli(&[
        "set",
        "api",
        "--when",
        "api_key=k-bad",
        "--block",
        "--retry-after",
        "5m",
        "--for",
        "1h",
        "--id",
        "block-k-bad",
    ]);
    assert!(said.starts_with("set block-k-bad (rules v"), "{said}");
    let blocked = fg.client().await.acquire(ask(&[("api_key", "k-bad")])).await.unwrap().into_inner();
    assert_eq!((blocked.verdict(), blocked.retry_after.unwrap().seconds), (pb::Verdict::RateLimited, 300));
    let table = cli(&["list"]);
    assert!(
        table.lines().any(|l| l.starts_with("acme-x3 ") && l.contains("factor 3") && l.ends_with("yes")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("block-k-bad ") && l.contains("block (retry 300s)") && l.contains("in 59m")),
        "{table}"
    );

    // A restart keeps them (read back from the file).
    let status = fg.terminate();
    assert!(status.success(), "{status:?}");
    drop(fg);
    let fg = floodgate().args(args).start();
    assert_eq!(list(&fg).await.total, 2);
    assert_eq!(limit_of(&fg, &[("api_key", "k1"), ("tenant", "acme")]).await, Some(6));
    let out =
        Command::new(BIN).args(["overrides", "--server", &fg.grpc, "delete", "acme-x3", "nope"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "acme-x3: deleted\nnope: not found\n");
    assert_eq!(limit_of(&fg, &[("api_key", "k1"), ("tenant", "acme")]).await, Some(20), "the file's 10x again");
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 1, "the file keeps the block only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_overrides_are_shared_by_replicas_through_redis_and_outlive_them() {
    let (redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    // Both talk to Redis before the override (only then is it persisted).
    wait_live(&a, 2);
    let mut admin_a = a.admin().await;
    let answer = admin_a.set_overrides(set(vec![factor("t7", "t7", 4.0, None)])).await.unwrap().into_inner();
    assert!(answer.persisted);
    assert_eq!(
        limit_of(&a, &[("api_key", "k"), ("tenant", "t7")]).await,
        Some(8),
        "at once on the replica that set it"
    );
    eventually("B applies A's override", Duration::from_secs(10), || async {
        (limit_of(&b, &[("api_key", "k"), ("tenant", "t7")]).await == Some(8)).then_some(())
    })
    .await;
    // Deleted on B: gone on A too.
    let mut admin_b = b.admin().await;
    admin_b.set_overrides(set(vec![factor("t8", "t8", 0.5, None)])).await.unwrap();
    let done = admin_b.delete_overrides(pb::DeleteOverridesRequest { ids: vec!["t7".into()] }).await.unwrap();
    assert_eq!(done.into_inner().deleted, ["t7"]);
    eventually("A sees the delete", Duration::from_secs(10), || async {
        (limit_of(&a, &[("api_key", "k"), ("tenant", "t7")]).await == Some(2)).then_some(())
    })
    .await;
    assert_eq!(redis.cli(&["HLEN", "{fg}:overrides"]).as_deref(), Some("1"));

    // Both replicas gone; a new one reads them from Redis before it serves.
    drop((a, b));
    let c = floodgate().args(&args).start();
    assert_eq!(limit_of(&c, &[("api_key", "k"), ("tenant", "t8")]).await, Some(1));
    let listed = list(&c).await;
    assert_eq!(listed.overrides.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["t8"]);
    assert!(listed.overrides[0].created_by.starts_with("peer 127.0.0.1:"), "{:?}", listed.overrides[0]);

    // Redis down: a change is refused (UNAVAILABLE) and nothing changes here.
    drop(redis);
    let mut admin_c = c.admin().await;
    let err = admin_c.set_overrides(set(vec![factor("t9", "t9", 2.0, None)])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_eq!(limit_of(&c, &[("api_key", "k"), ("tenant", "t9")]).await, Some(2));
}

/// A Redis that comes back empty has lost the overrides; the replicas that
/// held them store them again instead of adopting the empty table (before,
/// every replica deleted them, with no audit line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_survive_a_redis_that_comes_back_empty() {
    let (mut redis, _dir, args) = replicated(RULES);
    let args = strs(&args);
    let (a, b) = (floodgate().args(&args).start(), floodgate().args(&args).start());
    wait_live(&a, 2);
    let mut admin_a = a.admin().await;
    assert!(admin_a.set_overrides(set(vec![factor("kept", "t1", 4.0, None)])).await.unwrap().into_inner().persisted);
    eventually("B applies A's override", Duration::from_secs(10), || async {
        (limit_of(&b, &[("api_key", "k"), ("tenant", "t1")]).await == Some(8)).then_some(())
    })
    .await;
    redis.restart_empty();
    wait_redis_up(&a);
    wait_redis_up(&b);
    eventually("the override is stored again", Duration::from_secs(10), || async {
        (redis.cli(&["HLEN", "{fg}:overrides"]).as_deref() == Some("1")).then_some(())
    })
    .await;
    // Some sync rounds later, both still apply it.
    std::thread::sleep(Duration::from_millis(500));
    for fg in [&a, &b] {
        assert_eq!(limit_of(fg, &[("api_key", "k"), ("tenant", "t1")]).await, Some(8));
        assert_eq!(list(fg).await.overrides.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["kept"]);
    }
    // A third replica, started now, reads it from Redis.
    let c = floodgate().args(&args).start();
    assert_eq!(limit_of(&c, &[("api_key", "k"), ("tenant", "t1")]).await, Some(8));
}

#[tokio::test]
async fn an_override_cannot_lift_a_limit_past_what_its_algorithm_allows() {
    let dir = TempDir::new();
    let rules = dir.write(
        "rules.yaml",
        "resources:\n  - name: api\n    limits:\n      - { name: log, key: [tenant], algorithm: sliding_window_log, limit: 100, window: 1s }\n",
    );
    let fg = floodgate().args(["--config", path_str(&rules)]).start();
    let mut admin = fg.admin().await;
    // A sliding log keeps one entry a unit: 10,000 is its cap in a rules
    // file, and so it is through an override (before: 10^12 was accepted,
    // and 317,000 entries were kept for one key in one second).
    let mut absolute = factor("abs", "acme", 1.0, None);
    absolute.action = Some(pb::r#override::Action::Limits(pb::LimitValues {
        values: [("log".to_string(), 1_000_000_000_000u64)].into(),
    }));
    for (o, says) in [
        (absolute, "overrides[0].limits: would make 'log' 1000000000000; sliding_window_log allows at most 10000"),
        (
            factor("x", "acme", 1000.0, None),
            "overrides[0].factor: would make 'log' 100000; sliding_window_log allows at most 10000",
        ),
    ] {
        let err = admin.set_overrides(set(vec![o])).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(says), "{}", err.message());
    }
    assert!(list(&fg).await.overrides.is_empty(), "nothing was set");
    // Up to the cap is fine.
    admin.set_overrides(set(vec![factor("x100", "acme", 100.0, None)])).await.unwrap();
    let peek = pb::PeekRequest {
        resource: "api".into(),
        descriptors: ask(&[("tenant", "acme")]).descriptors,
        limit: String::new(),
    };
    assert_eq!(admin.peek(peek).await.unwrap().into_inner().limits[0].limit, 10_000);

    // In the rules file too: refused whole.
    let bad = dir.write(
        "bad.yaml",
        "resources:\n  - name: api\n    limits:\n      - { name: log, key: [tenant], algorithm: sliding_window_log, limit: 100, window: 1s }\n    overrides:\n      - { when: { tenant: big }, factor: 200 }\n",
    );
    let out = std::process::Command::new(BIN).arg("check-config").arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("overrides[0].factor: would make 'log' 20000"), "{err}");
}
