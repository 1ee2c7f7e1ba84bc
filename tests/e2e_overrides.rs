//! Overrides and tiers in the rules file, through the real binary: a tier's
//! limits, a factor, absolute numbers and a block, each decided in buckets
//! of its own and counted under the resource's metrics.

mod support;

use std::collections::HashMap;
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
    let fg = Floodgate::start(&["--config", path_str(&dir.write("rules.yaml", RULES))]);
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
