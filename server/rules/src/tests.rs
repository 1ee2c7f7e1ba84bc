//! Rules file parsing, validation and matching.

use std::time::Duration;

use super::*;
use crate::limiter::leaky_bucket::Mode;

const SPEC_EXAMPLE: &str = r#"
resources:
  - name: "GET /api/orders/:id"
    limits:
      - name: global
        algorithm: token_bucket
        capacity: 200
        refill_per_second: 100
      - name: per-user
        key: [user]
        algorithm: sliding_window
        limit: 10
        window: 1s
    concurrency: { max_in_flight: 50, permit_ttl: 30s }
    breaker:
      failure_rate_threshold: 0.5
      slow_call_rate_threshold: 1.0
      slow_call_duration: 800ms
      window: { kind: count, size: 100 }
      minimum_calls: 20
      wait_in_open: 30s
      half_open_calls: 3
      max_wait_in_half_open: 10s
    shed_at_level: 2
  - name: "payments.*"
    limits: [ { name: shaped, algorithm: leaky_bucket, capacity: 10, leak_per_second: 5, mode: shape, max_wait: 1s } ]
  - name: "*"
    limits: [ { name: default, algorithm: gcra, rate_per_second: 1000, burst: 100 } ]
"#;

fn errors_of(yaml: &str) -> Vec<String> {
    match RuleSet::from_yaml(yaml, "rules.yaml") {
        Ok(_) => panic!("expected errors"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn parses_the_spec_example() {
    let set = RuleSet::from_yaml(SPEC_EXAMPLE, "rules.yaml").unwrap();
    let rule = set.find("GET /api/orders/:id").unwrap();
    assert_eq!(rule.limits.len(), 2);
    assert_eq!(rule.limits[0].algorithm.capacity(), 200);
    assert_eq!(rule.limits[1].key, ["user"]);
    assert_eq!(
        rule.concurrency,
        Some(Concurrency {
            max_in_flight: 50,
            adaptive: None,
            partitions: Default::default(),
            permit_ttl: Duration::from_secs(30),
            sync: SyncMode::Replicated,
            on_redis_error: OnRedisError::Local
        })
    );
    let b = rule.breaker.as_ref().unwrap();
    assert_eq!(b.slow_call_duration, Duration::from_millis(800));
    assert_eq!(b.window, WindowKind::Count(100));
    assert_eq!(b.minimum_calls, 20);
    assert_eq!(b.wait_in_open, Backoff::fixed(Duration::from_secs(30)));
    assert_eq!(rule.shed_at_level, Some(2));
    let shaped = &set.find("payments.charge").unwrap().limits[0];
    match &shaped.algorithm {
        Algorithm::LeakyBucket(c) => assert_eq!(c.mode, Mode::Shape { max_wait: Some(1_000_000_000) }),
        other => panic!("{other:?}"),
    }
    assert_eq!(set.find("anything else").unwrap().name, "*");
}

#[test]
fn exact_wins_then_first_glob_then_default() {
    let set = RuleSet::from_yaml(
        r#"
resources:
  - { name: "*" }
  - { name: "api.*" }
  - { name: "api.orders.*" }
  - { name: "api.orders.get" }
"#,
        "r.yaml",
    )
    .unwrap();
    assert_eq!(set.find("api.orders.get").unwrap().name, "api.orders.get");
    assert_eq!(set.find("api.orders.put").unwrap().name, "api.*", "first glob in file order");
    assert_eq!(set.find("db").unwrap().name, "*");
    let no_default = RuleSet::from_yaml("resources: [ { name: a } ]", "r.yaml").unwrap();
    assert!(no_default.find("b").is_none());
}

#[test]
fn every_error_names_file_resource_and_field() {
    let errors = errors_of(
        r#"
resources:
  - name: orders
    limits:
      - { name: a, algorithm: token_bucket, capacity: 0, refill_per_second: -1 }
      - { name: b, algorithm: fixed_window, limit: 5 }
      - { name: c, algorithm: teleport }
  - name: users
    limits:
      - { name: d, algorithm: sliding_window_log, limit: 20000, window: 5 }
      - { name: d, algorithm: gcra, rate_per_second: 10, burst: 5, capacity: 3 }
    shed_at_level: 7
"#,
    );
    let expected = [
        "rules.yaml: resource 'orders': limits[0] 'a'.capacity: must be a whole number between 1 and 1000000000000, got 0",
        "rules.yaml: resource 'orders': limits[0] 'a'.refill_per_second: must be a positive number, got -1",
        "rules.yaml: resource 'orders': limits[1] 'b'.window: is required",
        "rules.yaml: resource 'orders': limits[2] 'c'.algorithm: must be one of token_bucket, gcra, leaky_bucket, fixed_window, sliding_window_log, sliding_window, warm_up, balance, got 'teleport'",
        "rules.yaml: resource 'users': limits[0] 'd'.limit: must be a whole number between 1 and 10000, got 20000",
        "rules.yaml: resource 'users': limits[0] 'd'.window: duration '5' needs a unit, e.g. 5s or 5ms",
        "rules.yaml: resource 'users': limits[1] 'd'.capacity: unknown field (expected one of: name, key, algorithm, sync, on_redis_error, shadow, fixed, history, lease, lease_share, lease_start, when, unless, over_limit, cost, rate_per_second, burst)",
        "rules.yaml: resource 'users': shed_at_level: must be a whole number between 1 and 3, got 7",
    ];
    for e in expected {
        assert!(errors.iter().any(|got| got == e), "missing {e:?} in {errors:#?}");
    }
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
}

#[test]
fn duplicates_are_refused() {
    let errors = errors_of(
        r#"
resources:
  - { name: a, limits: [ { name: x, algorithm: fixed_window, limit: 1, window: 1s }, { name: x, algorithm: fixed_window, limit: 1, window: 1s } ] }
  - { name: a }
"#,
    );
    assert!(
        errors.iter().any(|e| e.contains("resource 'a': limits[1] 'x'.name: is used by another limit")),
        "{errors:?}"
    );
    assert!(errors.iter().any(|e| e.contains("resource 'a': name: is defined twice")), "{errors:?}");
}

#[test]
fn structural_errors_are_reported() {
    assert!(errors_of("")[0].contains("the file is empty"));
    assert!(errors_of("resources: [")[0].contains("not valid YAML"));
    assert!(
        errors_of("limits: []")
            .iter()
            .any(|e| e == "rules.yaml: limits: unknown field (expected one of: resources, tiers, systems, global)")
    );
    assert!(errors_of("resources: 5")[0].contains("resources: must be a list"));
    let e = errors_of("resources: [ { limits: [] } ]");
    assert_eq!(e, ["rules.yaml: resource '#1': name: is required"]);
    let long = "x".repeat(300);
    let e = errors_of(&format!("resources: [ {{ name: {long} }} ]"));
    assert!(e[0].contains("name: is 300 bytes long; the limit is 256"), "{e:?}");
}

#[test]
fn leaky_bucket_and_breaker_options_are_checked() {
    let e = errors_of(
        r#"
resources:
  - name: a
    limits: [ { name: l, algorithm: leaky_bucket, capacity: 5, leak_per_second: 1, max_wait: 1s } ]
    breaker:
      failure_rate_threshold: 1.5
      window: { kind: time, size: 10 }
      wait_in_open: { initial: 5s, multiplier: 0.5 }
"#,
    );
    assert!(e.iter().any(|e| e.ends_with("limits[0] 'l'.max_wait: applies only to mode: shape")), "{e:#?}");
    assert!(
        e.iter().any(|e| e.ends_with(
            "breaker.failure_rate_threshold: must be a rate above 0 and at most 1 (e.g. 0.5), or off, got 1.5"
        )),
        "{e:#?}"
    );
    assert!(
        e.iter().any(|e| e.ends_with("breaker.window.size: unknown field (expected one of: kind, seconds)")),
        "{e:#?}"
    );
    assert!(e.iter().any(|e| e.ends_with("breaker.window.seconds: is required")), "{e:#?}");
    assert!(
        e.iter().any(|e| e.ends_with("breaker.wait_in_open.multiplier: must be between 1 and 100, got 0.5")),
        "{e:#?}"
    );
}

#[test]
fn breaker_defaults_follow_resilience4j() {
    let set =
        RuleSet::from_yaml("resources: [ { name: a, breaker: { window: { kind: count, size: 10 } } } ]", "r").unwrap();
    let b = set.find("a").unwrap().breaker.clone().unwrap();
    assert_eq!(b.failure_rate_threshold, 0.5);
    assert_eq!(b.slow_call_rate_threshold, 1.0);
    assert_eq!(b.minimum_calls, 10, "capped at the count window's size");
    assert_eq!(b.half_open_calls, 10);
    let set = RuleSet::from_yaml(
        "resources: [ { name: a, breaker: { wait_in_open: { initial: 5s, multiplier: 1.5, max: 5m } } } ]",
        "r",
    )
    .unwrap();
    let w = set.find("a").unwrap().breaker.as_ref().unwrap().wait_in_open;
    assert_eq!(w.wait(2), Duration::from_millis(7500));
}

#[test]
fn calendar_windows_are_checked() {
    let e = errors_of(
        r#"
resources:
  - name: a
    limits:
      - { name: both, algorithm: fixed_window, limit: 5, window: 1h, calendar: day }
      - { name: unit, algorithm: fixed_window, limit: 5, calendar: fortnight }
      - { name: zone, algorithm: fixed_window, limit: 5, calendar: month, time_zone: Mars/Olympus }
      - { name: stray, algorithm: fixed_window, limit: 5, window: 1h, time_zone: UTC }
"#,
    );
    for want in [
        "limits[0] 'both'.window: give either window or calendar, not both",
        "limits[1] 'unit'.calendar: must be one of day, week, month, year, got 'fortnight'",
        "limits[2] 'zone'.time_zone: 'Mars/Olympus' is not an IANA time zone (e.g. Europe/Paris, UTC)",
        "limits[3] 'stray'.time_zone: applies only with calendar: day, week, month or year",
    ] {
        assert!(e.iter().any(|e| e.ends_with(want)), "missing {want:?} in {e:#?}");
    }
    let ok = RuleSet::from_yaml(
        "resources:\n  - name: a\n    limits: [ { name: m, key: [api_key], algorithm: fixed_window, limit: 10000, calendar: month, time_zone: Europe/Paris } ]\n",
        "rules.yaml",
    )
    .unwrap();
    assert_eq!(ok.rules()[0].limits[0].algorithm.summary(), "fixed_window 10000 per calendar month (Europe/Paris)");
}

#[test]
fn overrides_and_tiers_are_checked() {
    let e = errors_of(
        r#"
tiers:
  gold:
    - { name: per-key, key: [api_key], algorithm: token_bucket, capacity: 1000, refill_per_second: 100 }
resources:
  - name: api
    limits: [ { name: per-key, key: [api_key], algorithm: token_bucket, capacity: 100, refill_per_second: 10 } ]
    overrides:
      - { when: { api_key: a }, tier: platinum }
      - { when: { api_key: b }, factor: 0 }
      - { when: { api_key: c }, limits: { nope: 5 } }
      - { when: { api_key: d }, factor: 2, block: true }
      - { when: {}, factor: 2 }
      - { factor: 2 }
      - { when: { api_key: e }, factor: 2, retry_after: 1m }
"#,
    );
    for want in [
        "overrides[0].tier: 'platinum' is not a tier (define it under tiers:)",
        "overrides[1].factor: must be above 0 and at most 1000000, got 0",
        "overrides[2].limits: 'nope' is not a limit of this resource",
        "overrides[3].when: needs exactly one of block, factor, limits or tier",
        "overrides[4].when: must name 1 to 8 descriptor values, got 0",
        "overrides[5].when: is required: a mapping of descriptor keys to values, e.g. { tenant: acme }",
        "overrides[6].retry_after: applies only with block: true",
    ] {
        assert!(e.iter().any(|e| e.ends_with(want)), "missing {want:?} in {e:#?}");
    }
}

#[test]
fn validated_rules_are_plain_data_compared_as_such() {
    // Nothing the engine keeps at run time (ids, hottest keys, counters) is
    // inside the rules: the same file read twice is the same value.
    let a = RuleSet::from_yaml(SPEC_EXAMPLE, "a.yaml").unwrap();
    assert_eq!(a, RuleSet::from_yaml(SPEC_EXAMPLE, "b.yaml").unwrap());
    let changed = SPEC_EXAMPLE.replace("capacity: 200", "capacity: 201");
    assert_ne!(a, RuleSet::from_yaml(&changed, "a.yaml").unwrap());
}

#[test]
fn adaptive_concurrency_and_partitions_parse_with_netflix_defaults() {
    let yaml = r#"
resources:
  - name: db
    concurrency:
      adaptive: { algorithm: gradient2, min: 5, max: 200, initial: 10, window: 500ms }
      partitions: { critical: 70%, sheddable: 30 }
  - name: cache
    concurrency: { adaptive: { algorithm: vegas }, sync: local }
  - name: api
    concurrency: { adaptive: { algorithm: aimd, timeout: 25ms, backoff_ratio: 0.5 } }
"#;
    let set = RuleSet::from_yaml(yaml, "rules.yaml").unwrap();
    let c = set.find("db").unwrap().concurrency.unwrap();
    let a = c.adaptive.unwrap();
    assert_eq!((a.min, a.max, a.initial, a.window, a.min_samples), (5, 200, 10, Duration::from_millis(500), 10));
    assert_eq!(c.max_in_flight, 200, "the ceiling");
    let AlgorithmConfig::Gradient2(g) = a.algorithm else { panic!("{a:?}") };
    assert_eq!((g.smoothing, g.queue_size, g.long_window, g.tolerance), (0.2, 4, 600, 1.0));
    assert_eq!(c.partitions.percent(Priority::Critical), 70);
    assert_eq!(c.partitions.percent(Priority::Sheddable), 30);
    assert_eq!(c.partitions.guaranteed(10, Priority::Critical), 7);
    assert_eq!(c.partitions.guaranteed(1, Priority::Sheddable), 1, "rounded up, at least one");
    assert_eq!(c.partitions.guaranteed(10, Priority::SheddablePlus), 0, "no share, borrow only");
    let v = set.find("cache").unwrap().concurrency.unwrap().adaptive.unwrap();
    assert_eq!((v.min, v.max, v.initial, v.window), (1, 1000, 20, Duration::from_secs(1)));
    let AlgorithmConfig::Vegas(vc) = v.algorithm else { panic!("{v:?}") };
    assert_eq!((vc.smoothing, vc.probe_multiplier), (1.0, 30));
    let m = set.find("api").unwrap().concurrency.unwrap().adaptive.unwrap();
    let AlgorithmConfig::Aimd(ac) = m.algorithm else { panic!("{m:?}") };
    assert_eq!((ac.backoff_ratio, ac.timeout), (0.5, Duration::from_millis(25)));
}

#[test]
fn an_adaptive_limit_measures_its_no_load_latency_unless_told_not_to() {
    let yaml = r#"
resources:
  - name: default
    concurrency: { adaptive: { algorithm: gradient2 } }
  - name: tuned
    concurrency: { adaptive: { algorithm: vegas, window: 500ms, probe: { interval: 1m, floor: 5, samples: 20 } } }
  - name: off
    concurrency: { adaptive: { algorithm: aimd, probe: off } }
"#;
    let set = RuleSet::from_yaml(yaml, "rules.yaml").unwrap();
    let probe = |name: &str| set.find(name).unwrap().concurrency.unwrap().adaptive.unwrap().probe;
    assert_eq!(probe("default"), Some(ProbeConfig { interval: Duration::from_secs(300), floor: 3, samples: 50 }));
    assert_eq!(probe("tuned"), Some(ProbeConfig { interval: Duration::from_secs(60), floor: 5, samples: 20 }));
    assert_eq!(probe("off"), None);
    let e = errors_of(
        r#"
resources:
  - name: a
    concurrency: { adaptive: { algorithm: gradient2, window: 1s, probe: { interval: 10s } } }
  - name: b
    concurrency: { adaptive: { algorithm: vegas, probe: { floor: 0, every: 1m } } }
  - name: c
    concurrency: { adaptive: { algorithm: aimd, probe: sometimes } }
  - name: d
    concurrency: { adaptive: { algorithm: gradient2, max: 10, initial: 5, probe: { floor: 50 } } }
"#,
    );
    assert_eq!(
        e,
        [
            "rules.yaml: resource 'a': concurrency.adaptive.probe.interval: must be at least 20 windows (20s), got 10s",
            "rules.yaml: resource 'b': concurrency.adaptive.probe.every: unknown field (expected one of: interval, floor, samples)",
            "rules.yaml: resource 'b': concurrency.adaptive.probe.floor: must be a whole number between 1 and 10000000, got 0",
            "rules.yaml: resource 'c': concurrency.adaptive.probe: must be off or a mapping (interval, floor, samples), got 'sometimes'",
            "rules.yaml: resource 'd': concurrency.adaptive.probe.floor: must be at most max (10), got 50",
        ]
    );
}

#[test]
fn bad_adaptive_settings_are_refused_naming_the_field() {
    let e = errors_of(
        r#"
resources:
  - name: a
    concurrency: { max_in_flight: 5, adaptive: { algorithm: aimd } }
  - name: b
    concurrency: { adaptive: { algorithm: bbr } }
  - name: c
    concurrency: { adaptive: { algorithm: vegas, min: 10, max: 5 } }
  - name: d
    concurrency: { adaptive: { algorithm: gradient2, initial: 0, smoothing: 2, tolerance: 0.5, window: 10ms } }
  - name: e
    concurrency: { adaptive: { algorithm: aimd, queue_size: 3, backoff_ratio: 0.2 } }
  - name: f
    concurrency: { max_in_flight: 5, partitions: { critical: 80%, sheddable: 30% } }
  - name: g
    concurrency: { max_in_flight: 5, partitions: { critical: 7.5%, urgent: 10% } }
  - name: h
    concurrency: { max_in_flight: 5, partitions: { critical: 0% } }
  - name: i
    concurrency: { adaptive: { algorithm: gradient2, initial: 50, max: 10 } }
"#,
    );
    let expect = [
        "resource 'a': concurrency.max_in_flight: cannot be set beside 'adaptive'",
        "resource 'b': concurrency.adaptive.algorithm: must be one of gradient2, vegas, aimd, got 'bbr'",
        "resource 'c': concurrency.adaptive.min: must be at most max (5), got 10",
        "resource 'd': concurrency.adaptive.initial: must be a whole number between 1 and 10000000, got 0",
        "resource 'd': concurrency.adaptive.smoothing: must be above 0 and at most 1, got 2",
        "resource 'd': concurrency.adaptive.tolerance: must be at least 1, got 0.5",
        "resource 'd': concurrency.adaptive.window: must be at least 100ms, got 10ms",
        "resource 'e': concurrency.adaptive.queue_size: unknown field",
        "resource 'e': concurrency.adaptive.backoff_ratio: must be at least 0.5 and below 1, got 0.2",
        "resource 'f': concurrency.partitions: the shares add up to 110%, more than 100%",
        "resource 'g': concurrency.partitions.critical: must be a whole percentage from 0% to 100%, got '7.5%'",
        "resource 'g': concurrency.partitions.urgent: unknown field",
        "resource 'h': concurrency.partitions: must give at least one priority a share above 0%",
        "resource 'i': concurrency.adaptive.initial: must be between min (1) and max (10), got 50",
    ];
    for want in expect {
        assert!(e.iter().any(|got| got.contains(want)), "missing {want:?} in {e:#?}");
    }
}

#[test]
fn conditions_and_origins_are_read_and_their_errors_named() {
    let set = RuleSet::from_yaml(
        r#"
resources:
  - name: api
    origins: { allow: [a, 7] }
    limits:
      - { name: x, algorithm: fixed_window, limit: 1, window: 1s, when: { origin: a } }
      - { name: y, algorithm: fixed_window, limit: 1, window: 1s, unless: { origin: [a, b] }, when: { context: web } }
"#,
        "r.yaml",
    )
    .unwrap();
    let api = set.find("api").unwrap();
    let cond = |key: &str, values: &[&str], negate| Condition {
        key: key.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
        negate,
    };
    assert_eq!(api.limits[0].when, [cond("origin", &["a"], false)]);
    assert_eq!(api.limits[1].when, [cond("context", &["web"], false), cond("origin", &["a", "b"], true)]);
    let origins = Origins { key: "origin".into(), allow: true, values: vec!["a".into(), "7".into()] };
    assert_eq!(api.origins, Some(origins));
    let errors = errors_of(
        r#"
resources:
  - name: api
    origins: { allow: [a], deny: [b] }
    limits:
      - { name: x, algorithm: fixed_window, limit: 1, window: 1s, when: {} }
      - { name: y, algorithm: fixed_window, limit: 1, window: 1s, unless: [a] }
      - { name: z, algorithm: fixed_window, limit: 1, window: 1s, when: { a: [] } }
"#,
    );
    let expected = [
        "rules.yaml: resource 'api': limits[0] 'x'.when: must map descriptor keys to their values, e.g. { origin: [app-a, app-b] }",
        "rules.yaml: resource 'api': limits[1] 'y'.unless: must map descriptor keys to their values, e.g. { origin: [app-a, app-b] }",
        "rules.yaml: resource 'api': limits[2] 'z'.when.a: must be a value or a list of 1 to 1000 values",
        "rules.yaml: resource 'api': origins.allow: needs exactly one of allow or deny: a list of values",
    ];
    assert_eq!(errors, expected);
}

#[test]
fn a_breaker_may_count_failures_turn_rates_off_and_use_a_tumbling_window() {
    let set = RuleSet::from_yaml(
        r#"
resources:
  - name: api
    breaker:
      failure_rate_threshold: off
      failure_count_threshold: 5
      window: { kind: tumbling, length: 20s }
"#,
        "r.yaml",
    )
    .unwrap();
    let b = set.find("api").unwrap().breaker.clone().unwrap();
    assert_eq!(b.failure_rate_threshold, BREAKER_OFF);
    assert_eq!(b.failure_count_threshold, Some(5));
    assert_eq!(b.window, WindowKind::Tumbling(20_000));
    let errors = errors_of(
        r#"
resources:
  - name: a
    breaker: { failure_rate_threshold: off, slow_call_rate_threshold: off }
  - name: b
    breaker: { failure_count_threshold: 0, window: { kind: tumbling, length: 2h } }
"#,
    );
    assert_eq!(
        errors,
        [
            "rules.yaml: resource 'a': breaker.failure_rate_threshold: every threshold is off: the breaker would never open",
            "rules.yaml: resource 'b': breaker.failure_count_threshold: must be a whole number between 1 and 1000000, got 0",
            "rules.yaml: resource 'b': breaker.window.length: must be at most 1h",
        ]
    );
}

#[test]
fn over_limit_admits_a_share_and_is_refused_where_it_cannot_hold() {
    let rules = RuleSet::from_yaml(
        "resources:\n  - name: r\n    limits: [ { name: l, algorithm: fixed_window, limit: 10, window: 1m, over_limit: { admit: 12.5% } } ]\n",
        "rules.yaml",
    )
    .unwrap();
    assert_eq!(rules.find("r").unwrap().limits[0].over_limit, Some(OverLimit { admit_ppm: 125_000, ramp: false }));
    let errors = errors_of(
        r#"
resources:
  - name: r
    limits:
      - { name: strict, algorithm: fixed_window, limit: 10, window: 1m, sync: strict, over_limit: { admit: 10% } }
      - { name: shadow, algorithm: fixed_window, limit: 10, window: 1m, shadow: true, over_limit: { admit: 10% } }
      - { name: leased, algorithm: fixed_window, limit: 10, window: 1m, lease: 1s, over_limit: { admit: 10% } }
      - { name: none, algorithm: fixed_window, limit: 10, window: 1m, over_limit: { admit: 0% } }
      - { name: all, algorithm: fixed_window, limit: 10, window: 1m, over_limit: { admit: 100% } }
      - { name: word, algorithm: fixed_window, limit: 10, window: 1m, over_limit: { admit: some } }
      - { name: other, algorithm: fixed_window, limit: 10, window: 1m, over_limit: { admit: 5%, ramp: 2x } }
      - { name: bare, algorithm: fixed_window, limit: 10, window: 1m, over_limit: { admit: 0.1 } }
      - { name: ramped, algorithm: fixed_window, limit: 10, window: 1m, over_limit: { admit: 5%, ramp: true } }
      - { name: typo, algorithm: gcra, rate_per_second: 10, burst: 5, over_limit: { admit: 5%, rmap: true } }
      - { name: shaped, algorithm: leaky_bucket, capacity: 10, leak_per_second: 1, mode: shape, over_limit: { admit: 5% } }
  - name: shadowed
    shadow: true
    limits:
      - { name: l, algorithm: fixed_window, limit: 10, window: 1m, over_limit: { admit: 5% } }
"#,
    );
    let expected = [
        "rules.yaml: resource 'r': limits[0] 'strict'.over_limit: cannot be used with 'sync: strict', which promises to admit exactly the limit",
        "rules.yaml: resource 'r': limits[1] 'shadow'.over_limit: changes nothing on a shadow limit, which denies nothing",
        "rules.yaml: resource 'r': limits[2] 'leased'.over_limit: cannot be used with 'lease': a lease's holder decides its calls alone",
        "rules.yaml: resource 'r': limits[3] 'none'.over_limit.admit: must be a share from 0.0001% to below 100%, with its percent sign (e.g. 10%), got 0%",
        "rules.yaml: resource 'r': limits[4] 'all'.over_limit.admit: must be a share from 0.0001% to below 100%, with its percent sign (e.g. 10%), got 100%",
        "rules.yaml: resource 'r': limits[5] 'word'.over_limit.admit: must be a share from 0.0001% to below 100%, with its percent sign (e.g. 10%), got some",
        "rules.yaml: resource 'r': limits[6] 'other'.over_limit.ramp: must be true or false, got '2x'",
        "rules.yaml: resource 'r': limits[7] 'bare'.over_limit.admit: must be a share from 0.0001% to below 100%, with its percent sign (e.g. 10%), got 0.1",
        "rules.yaml: resource 'r': limits[8] 'ramped'.over_limit.ramp: needs a token_bucket, gcra or leaky_bucket: a window's count does not say how far over a caller is",
        "rules.yaml: resource 'r': limits[9] 'typo'.over_limit.rmap: unknown field (expected one of: admit, ramp)",
        "rules.yaml: resource 'r': limits[10] 'shaped'.over_limit: cannot be used on a shaping limit: the calls over it would go ahead of the callers that wait their turn",
        "rules.yaml: resource 'shadowed': shadow: cannot be set beside over_limit (limit 'l'): a shadow limit denies nothing",
    ];
    for e in expected {
        assert!(errors.iter().any(|got| got == e), "missing {e:?} in {errors:#?}");
    }
}

#[test]
fn cost_formulas_read_only_the_usage_their_rule_names() {
    let rules = RuleSet::from_yaml(
        r#"
resources:
  - name: chat
    usage: [input_tokens, cached_input_tokens, output_tokens]
    limits:
      - { name: tokens, algorithm: fixed_window, limit: 100000, window: 1m, cost: "input_tokens + cached_input_tokens/10 + output_tokens*6" }
      - { name: output, algorithm: fixed_window, limit: 5000, window: 1m, cost: output_tokens }
      - { name: calls, algorithm: fixed_window, limit: 50, window: 1m }
    overrides:
      - { when: { tenant: big }, factor: 10 }
"#,
        "rules.yaml",
    )
    .unwrap();
    let chat = rules.find("chat").unwrap();
    assert_eq!(chat.usage, ["input_tokens", "cached_input_tokens", "output_tokens"]);
    let formula = chat.limits[0].cost.as_ref().unwrap();
    assert_eq!(formula.text(), "input_tokens + cached_input_tokens/10 + output_tokens*6");
    assert!(chat.limits[2].cost.is_none());
    // An override's limits keep their formula.
    assert!(chat.overrides.list()[0].limits[0].cost.is_some());

    let errors = errors_of(
        r#"
resources:
  - name: a
    usage: [input_tokens]
    limits:
      - { name: typo, algorithm: fixed_window, limit: 10, window: 1m, cost: "input_tokens + outptu_tokens" }
      - { name: zero, algorithm: fixed_window, limit: 10, window: 1m, cost: "input_tokens / 0" }
      - { name: negative, algorithm: fixed_window, limit: 10, window: 1m, cost: "input_tokens - 3" }
      - { name: leased, algorithm: fixed_window, limit: 10, window: 1m, lease: 1s, cost: input_tokens }
  - name: b
    limits: [ { name: l, algorithm: fixed_window, limit: 10, window: 1m, cost: tokens } ]
  - name: c
    usage: [tokens, tokens, Tokens]
    limits: [ { name: l, algorithm: fixed_window, limit: 10, window: 1m } ]
  - name: d
    usage: [tokens]
    limits: [ { name: l, algorithm: fixed_window, limit: 10, window: 1m, cost: tokens / 0 } ]
"#,
    );
    assert_eq!(
        errors,
        [
            "rules.yaml: resource 'a': limits[1] 'zero'.cost: 'input_tokens / 0' divides by zero",
            "rules.yaml: resource 'a': limits[2] 'negative'.cost: 'input_tokens - 3' is negative when no usage is reported",
            "rules.yaml: resource 'a': limits[3] 'leased'.cost: cannot be used with 'lease': a lease's holder counts calls, not usage",
            "rules.yaml: resource 'a': usage: limit 'typo' reads usage field 'outptu_tokens' in its cost, which 'usage' does not name (the rule's usage fields are: input_tokens)",
            "rules.yaml: resource 'b': usage: limit 'l' reads usage field 'tokens' in its cost, which 'usage' does not name (the rule has no 'usage' list)",
            "rules.yaml: resource 'c': usage: names 'tokens' twice",
            "rules.yaml: resource 'c': usage: 'Tokens' is not a usage field name (lowercase letters, digits and _, at most 64 bytes, not starting with a digit)",
            "rules.yaml: resource 'c': usage: is given, but no limit has a 'cost' formula that reads it",
            "rules.yaml: resource 'd': limits[0] 'l'.cost: 'tokens / 0' divides by zero",
        ]
    );
}

#[test]
fn a_waterfall_appends_its_sources_in_order_after_the_rule_s_own_limits() {
    let rules = RuleSet::from_yaml(
        r#"
resources:
  - name: chat
    usage: [tokens]
    limits: [ { name: minute, key: [tenant], algorithm: fixed_window, limit: 10, window: 1m } ]
    waterfall:
      - { name: month, key: [tenant], algorithm: fixed_window, calendar: month, limit: 100, cost: tokens * 2 }
      - { name: credits, key: [tenant], algorithm: fixed_window, window: 3650d, limit: 1000, sync: strict }
  - name: plain
    limits: [ { name: l, algorithm: fixed_window, limit: 10, window: 1m } ]
"#,
        "rules.yaml",
    )
    .unwrap();
    let chat = rules.find("chat").unwrap();
    let sources: Vec<_> = chat.limits.iter().map(|l| (l.name.as_str(), l.source)).collect();
    assert_eq!(sources, [("minute", 0), ("month", 1), ("credits", 2)]);
    assert_eq!(chat.waterfall_len(), 2);
    assert_eq!(chat.source_name(0), None);
    assert_eq!(chat.source_name(2).map(String::as_str), Some("credits"));
    assert_eq!(rules.find("plain").unwrap().waterfall_len(), 0);
}

#[test]
fn a_waterfall_is_refused_where_a_source_could_not_pay_alone() {
    let errors = errors_of(
        r#"
resources:
  - name: alone
    waterfall: [ { name: month, algorithm: fixed_window, calendar: month, limit: 100 } ]
  - name: shadowed
    shadow: true
    limits: [ { name: l, algorithm: fixed_window, limit: 10, window: 1m } ]
    waterfall: [ { name: month, algorithm: fixed_window, calendar: month, limit: 100 } ]
  - name: bad
    limits: [ { name: l, algorithm: fixed_window, limit: 10, window: 1m } ]
    waterfall:
      - { name: l, algorithm: fixed_window, calendar: month, limit: 100 }
      - { name: leased, algorithm: fixed_window, window: 1m, limit: 100, lease: 1s }
      - { name: soft, algorithm: fixed_window, window: 1m, limit: 100, over_limit: { admit: 10% } }
      - { name: shaped, algorithm: leaky_bucket, capacity: 10, leak_per_second: 1, mode: shape }
      - { name: quiet, algorithm: fixed_window, window: 1m, limit: 100, shadow: true }
      - { name: priced, algorithm: fixed_window, window: 1m, limit: 100, cost: tokens }
  - name: long
    limits: [ { name: l, algorithm: fixed_window, limit: 10, window: 1m } ]
    waterfall: [ {name: a, algorithm: gcra, rate_per_second: 1, burst: 1}, {name: b, algorithm: gcra, rate_per_second: 1, burst: 1}, {name: c, algorithm: gcra, rate_per_second: 1, burst: 1}, {name: d, algorithm: gcra, rate_per_second: 1, burst: 1}, {name: e, algorithm: gcra, rate_per_second: 1, burst: 1}, {name: f, algorithm: gcra, rate_per_second: 1, burst: 1}, {name: g, algorithm: gcra, rate_per_second: 1, burst: 1}, {name: h, algorithm: gcra, rate_per_second: 1, burst: 1}, {name: i, algorithm: gcra, rate_per_second: 1, burst: 1} ]
"#,
    );
    let want = [
        "resource 'alone': waterfall: follows the rule's own limits",
        "resource 'shadowed': waterfall: cannot be used on a shadow rule",
        "resource 'bad': waterfall: source 'l' is the name of another limit of this resource",
        "resource 'bad': waterfall: source 'leased' cannot have a 'lease'",
        "resource 'bad': waterfall: source 'soft' cannot have 'over_limit'",
        "resource 'bad': waterfall: source 'shaped' cannot be a shaping limit",
        "resource 'bad': waterfall: source 'quiet' cannot be a shadow limit",
        "resource 'bad': usage: limit 'priced' reads usage field 'tokens' in its cost",
        "resource 'long': waterfall: lists 9 sources; the limit is 8",
    ];
    for w in want {
        assert!(errors.iter().any(|e| e.contains(w)), "no error contains {w:?}:\n{}", errors.join("\n"));
    }
    assert_eq!(errors.len(), want.len(), "{}", errors.join("\n"));
}

#[test]
fn a_balance_is_strict_and_refuses_what_would_share_it_out() {
    let rules = RuleSet::from_yaml(
        r#"
resources:
  - name: api
    limits: [ { name: free, algorithm: fixed_window, limit: 1, window: 1h } ]
    waterfall:
      - { name: credits, key: [tenant], algorithm: balance }
  - name: prepaid
    limits: [ { name: wallet, key: [tenant], algorithm: balance, max_balance: 500, sync: local } ]
"#,
        "rules.yaml",
    )
    .unwrap();
    let credits = &rules.find("api").unwrap().limits[1];
    assert_eq!(credits.algorithm.capacity(), crate::limiter::balance::MAX);
    assert_eq!((credits.sync, credits.on_redis_error), (SyncMode::Strict, OnRedisError::Deny));
    let wallet = &rules.find("prepaid").unwrap().limits[0];
    assert_eq!((wallet.algorithm.capacity(), wallet.sync), (500, SyncMode::Local));
    let errors = errors_of(
        r#"
resources:
  - name: r
    limits:
      - { name: a, algorithm: balance, sync: replicated }
      - { name: b, algorithm: balance, lease: 1s }
      - { name: c, algorithm: balance, sync: local, over_limit: { admit: 10% } }
      - { name: d, algorithm: balance, max_balance: 0 }
      - { name: e, algorithm: balance, limit: 5 }
      - { name: f, algorithm: balance, on_redis_error: allow }
      - { name: g, algorithm: balance, on_redis_error: local }
"#,
    );
    let want = [
        "limits[0] 'a'.sync: a balance cannot be replicated",
        "limits[1] 'b'.lease: a balance cannot be leased",
        "limits[2] 'c'.over_limit: cannot be used on a balance",
        "limits[3] 'd'.max_balance: must be",
        "limits[4] 'e'.limit: unknown field",
        "limits[5] 'f'.on_redis_error: a balance pays for nothing while Redis is away",
        "limits[6] 'g'.on_redis_error: a balance pays for nothing while Redis is away",
    ];
    for w in want {
        assert!(errors.iter().any(|e| e.contains(w)), "no error contains {w:?}:\n{}", errors.join("\n"));
    }
    // An override cannot size a balance by name (it would be ignored).
    let errors = errors_of(
        r#"
resources:
  - name: api
    limits: [ { name: free, key: [tenant], algorithm: fixed_window, limit: 1, window: 1h } ]
    waterfall:
      - { name: credits, key: [tenant], algorithm: balance }
    overrides:
      - { when: { tenant: acme }, limits: { credits: 5000 } }
      - { when: { tenant: beta }, limits: { free: 50 } }
      - { when: { tenant: gamma }, factor: 3 }
"#,
    );
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let want = "overrides[0].limits: 'credits' is a balance: it holds what an operator topped up \
                (floodgate balance), and an override cannot change it";
    assert!(errors[0].ends_with(want), "{errors:#?}");
}

#[test]
fn fixed_and_history_are_read_and_history_needs_a_key() {
    let rules = RuleSet::from_yaml(
        "resources:\n  - name: api\n    limits:\n      - { name: a, key: [tenant], algorithm: fixed_window, limit: 5, window: 1m, fixed: true, history: true }\n      - { name: b, algorithm: fixed_window, limit: 5, window: 1m }\n",
        "rules.yaml",
    )
    .unwrap();
    let (a, b) = (&rules.rules()[0].limits[0], &rules.rules()[0].limits[1]);
    assert_eq!((a.fixed, a.history, b.fixed, b.history), (true, true, false, false));
    let err = RuleSet::from_yaml(
        "resources:\n  - name: api\n    limits: [ { name: a, algorithm: fixed_window, limit: 5, window: 1m, history: true } ]\n",
        "rules.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("limits[0] 'a'.history: records each key's calls, and this limit has no key"), "{err}");
    let err = RuleSet::from_yaml(
        "resources:\n  - name: api\n    limits: [ { name: a, key: [t], algorithm: fixed_window, limit: 5, window: 1m, fixed: 1 } ]\n",
        "rules.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("'a'.fixed"), "{err}");
}
