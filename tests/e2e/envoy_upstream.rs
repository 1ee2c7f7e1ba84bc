//! A configuration shaped like envoyproxy/ratelimit's own example
//! (`examples/ratelimit/config/example.yaml`: replaces, nested descriptors,
//! shadow mode, unlimited, `detailed_metric`, quota descriptors with
//! `metadata`), behind a real Envoy 1.40, with upstream's settings turned on:
//! custom response header names, dynamic metadata. Then upstream's stats, as
//! the dashboards built on them read them, from the binary's /metrics and
//! through a real Prometheus.

use crate::support;

use support::envoy::{Envoy, Setup};
use support::prometheus::{Prometheus, query};
use support::*;

/// Written for this test in the shape of upstream's example (its files are
/// not copied into this repository).
const SHOP: &str = r#"
domain: shop
descriptors:
  # Bulk orders have their own limit, in place of the per-customer one.
  - key: category
    value: bulk
    rate_limit: { unit: day, requests_per_unit: 4, replaces: [ { name: per_customer } ] }
  - key: customer
    rate_limit: { unit: day, requests_per_unit: 2, name: per_customer }
  - key: customer
    value: vip
    rate_limit: { unlimited: true }
  # Nested: the flagship store of any region, and every other store in shadow.
  - key: region
    descriptors:
      - key: store
        value: flagship
        rate_limit: { unit: day, requests_per_unit: 3 }
      - key: store
        shadow_mode: true
        rate_limit: { unit: day, requests_per_unit: 1 }
  # Longer windows, which Envoy numbers out of order (WEEK is 7, after MONTH 5 and YEAR 6).
  - { key: period, value: weekly, rate_limit: { unit: week, requests_per_unit: 3 } }
  - { key: period, value: monthly, rate_limit: { unit: month, requests_per_unit: 4 } }
  - { key: period, value: yearly, rate_limit: { unit: year, requests_per_unit: 5 } }
  # Each client address counted in a series of its own.
  - key: client_ip
    detailed_metric: true
    rate_limit: { unit: day, requests_per_unit: 5 }
  # Two quota plans: over one of them is not over while the other has room.
  - key: plan
    value: gold*
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
    metadata: { tier: { name: gold, rank: 1 } }
  - key: plan
    value: silver*
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 2 }
    metadata: { tier: { name: silver, rank: 2 }, billing: { account: shared } }
"#;

const RATE_LIMITS: &str = r#"[
  { actions: [ { request_headers: { header_name: x-category, descriptor_key: category } } ] },
  { actions: [ { request_headers: { header_name: x-customer, descriptor_key: customer } } ] },
  { actions: [ { request_headers: { header_name: x-region, descriptor_key: region } },
               { request_headers: { header_name: x-store, descriptor_key: store } } ] },
  { actions: [ { request_headers: { header_name: x-client-ip, descriptor_key: client_ip } } ] },
  { actions: [ { request_headers: { header_name: x-period, descriptor_key: period } } ] },
  { actions: [ { request_headers: { header_name: x-plan-a, descriptor_key: plan } } ] },
  { actions: [ { request_headers: { header_name: x-plan-b, descriptor_key: plan } } ] }
]"#;

fn statuses(envoy: &Envoy, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    (0..n).map(|_| envoy.get("/", headers).status).collect()
}

/// A counter of /metrics by its full series (`name{labels}`); 0 when absent.
fn counter(metrics: &str, series: &str) -> f64 {
    Metrics::parse(metrics).series(series).unwrap_or(0.0)
}

#[test]
fn upstreams_example_behind_a_real_envoy_with_its_settings_and_its_stats() {
    let dir = TempDir::new();
    let config = dir.path("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("shop.yaml"), SHOP).unwrap();
    let fg = floodgate()
        .args([
            "--envoy-config",
            path_str(&config),
            "--envoy-response-headers",
            "ratelimit",
            "--envoy-limit-header",
            "x-shop-limit",
            "--envoy-remaining-header",
            "x-shop-remaining",
            "--envoy-reset-header",
            "x-shop-reset",
            "--envoy-response-dynamic-metadata",
        ])
        .start();
    let envoy =
        Envoy::start(Setup { domain: "shop", rate_limits: RATE_LIMITS, failure_mode_deny: true, floodgate: &fg.grpc });
    let ip_last = std::process::id() % 250;
    let ip = format!("10.1.2.{ip_last}");
    within_one_day(|| {
        // Per customer, 2 a day, with upstream's headers under the names given.
        let c = fresh("c");
        let r = envoy.get("/", &[("x-customer", &c)]);
        assert_eq!(r.status, 200, "{}", envoy.logs());
        assert_eq!((r.header("x-shop-limit"), r.header("x-shop-remaining")), (Some("2"), Some("1")), "{r:?}");
        assert_eq!(statuses(&envoy, &[("x-customer", &c)], 2), [200, 429]);
        // Bulk orders replace the per-customer limit with their own 4.
        let c = fresh("c");
        assert_eq!(statuses(&envoy, &[("x-customer", &c), ("x-category", "bulk")], 5), [200, 200, 200, 200, 429]);
        assert_eq!(statuses(&envoy, &[("x-customer", "vip")], 5), [200; 5], "unlimited");
        // The flagship store of any region: 3 a day; other stores only in shadow.
        let r = fresh("r");
        assert_eq!(statuses(&envoy, &[("x-region", &r), ("x-store", "flagship")], 4), [200, 200, 200, 429]);
        assert_eq!(statuses(&envoy, &[("x-region", &r), ("x-store", "corner")], 3), [200; 3], "shadow mode");
        // Quota: gold (1) and silver (2) together deny only once both are used up.
        let (gold, silver) = (fresh("gold"), fresh("silver"));
        let plans = [("x-plan-a", gold.as_str()), ("x-plan-b", silver.as_str())];
        assert_eq!(statuses(&envoy, &plans, 3), [200, 200, 429]);
    });
    // The dynamic metadata Envoy received: what was asked, and the metadata
    // of the quota descriptors that passed (gold's first: the first of a key wins).
    let log = eventually_sync("three quota lines in Envoy's access log", || {
        let log = envoy.access_log();
        (log.lines().filter(|l| l.contains("plan=gold")).count() >= 3).then_some(log)
    });
    let quota: Vec<&str> = log.lines().filter(|l| l.contains("plan=gold")).collect();
    assert!(quota[0].starts_with("200 ") && quota[0].contains(r#""name":"gold""#), "{}", quota[0]);
    assert!(quota[0].contains(r#""account":"shared""#) && quota[0].contains(r#""domain":"shop""#), "{}", quota[0]);
    assert!(quota[1].starts_with("200 ") && quota[1].contains(r#""name":"silver""#), "gold was over: {}", quota[1]);
    assert!(quota[2].starts_with("429 ") && !quota[2].contains(r#""tier""#), "none passed: {}", quota[2]);

    // Envoy's own headers name each window by the unit it was told.
    for (period, limit) in [("weekly", "3, 3;w=604800"), ("monthly", "4, 4;w=2592000"), ("yearly", "5, 5;w=31536000")] {
        let r = envoy.get("/", &[("x-period", period)]);
        assert_eq!(r.header("x-ratelimit-limit"), Some(limit), "{period}: {r:?}");
    }

    // The detailed series of one client address.
    assert_eq!(statuses(&envoy, &[("x-client-ip", &ip)], 2), [200, 200]);

    // Upstream's stats, as statsd_exporter's mapping names them.
    let metrics = fg.http_get("/metrics").1;
    let c = |stat: &str, labels: &str| {
        counter(&metrics, &format!("ratelimit_service_rate_limit_{stat}{{domain=\"shop\",{labels}}}"))
    };
    let customer = "key1=\"customer\"";
    assert!(c("total_hits", customer) >= 3.0 && c("over_limit", customer) >= 1.0, "{metrics}");
    assert_eq!(c("near_limit", customer), c("over_limit", customer), "one near and one over per customer");
    let store = "key1=\"region\",key2=\"store\"";
    assert!(c("shadow_mode", store) >= 2.0 && c("shadow_mode", store) == c("over_limit", store), "{metrics}");
    let flagship = "key1=\"region\",key2=\"store_flagship\"";
    assert!(c("over_limit", flagship) >= 1.0 && c("within_limit", flagship) >= 3.0, "{metrics}");
    let client = format!("key1=\"client_ip_10_1_2_{ip_last}\"");
    assert_eq!(c("total_hits", &client), 2.0, "{metrics}");
    assert_eq!(c("total_hits", "key1=\"customer_vip\""), 0.0, "unlimited counts nothing");
    assert!(counter(&metrics, "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}") >= 20.0);
    assert!(
        metrics
            .contains("ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"0.005\"}")
    );
    assert_eq!(counter(&metrics, "ratelimit_service_config_load_success"), 1.0);

    // A real Prometheus scrapes them; queries of upstream's dashboards answer.
    let prom = Prometheus::start(&dir, &fg.http, None);
    let shadow = "ratelimit_service_rate_limit_shadow_mode{domain=\"shop\",key1=\"region\",key2=\"store\"}";
    let value = eventually_sync("the shadow series in Prometheus", || {
        let v = query(&prom, shadow);
        v["data"]["result"][0]["value"][1].as_str().map(String::from)
    });
    assert_eq!(value.parse::<f64>().unwrap(), c("shadow_mode", store));
    let by_key = query(&prom, "sum by (key1) (ratelimit_service_rate_limit_over_limit{domain=\"shop\"})");
    let keys: Vec<&str> =
        by_key["data"]["result"].as_array().unwrap().iter().filter_map(|r| r["metric"]["key1"].as_str()).collect();
    for k in ["customer", "region", "category_bulk", "plan_gold*"] {
        assert!(keys.contains(&k), "{k} in {keys:?}");
    }
}

/// Polls `f` until it returns `Some`, for up to 30 s.
fn eventually_sync<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
