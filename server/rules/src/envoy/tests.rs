use super::*;

const EDGE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 4 }
  - key: generic_key
    value: foo
    rate_limit: { unit: second, requests_per_unit: 1, name: foo }
  - key: generic_key
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: path
    value: "/api/*"
    rate_limit: { unit: day, requests_per_unit: 7 }
  - key: tenant
    descriptors:
      - key: user
        rate_limit: { unit: week, requests_per_unit: 3 }
      - key: vip
        rate_limit: { unlimited: true }
  - key: bulk
    rate_limit: { unit: minute, requests_per_unit: 1000, replaces: [ { name: foo } ] }
    shadow_mode: true
"#;

fn config() -> EnvoyConfig {
    EnvoyConfig::parse(&[("edge.yaml".into(), EDGE.into())]).unwrap()
}

fn found<'c>(c: &'c EnvoyConfig, entries: &[(&str, &str)]) -> Option<(&'c str, u32, Unit, bool)> {
    match c.find("edge", entries)? {
        Matched::Limit(l) => Some((l.path.as_str(), l.requests_per_unit, l.unit, false)),
        Matched::Unlimited(l) => Some((l.path.as_str(), 0, l.unit, true)),
    }
}

#[test]
fn matching_follows_upstream_value_first_then_wildcard_then_key() {
    let c = config();
    assert_eq!(found(&c, &[("remote_address", "10.0.0.1")]), Some(("edge.remote_address", 4, Unit::Minute, false)));
    assert_eq!(found(&c, &[("generic_key", "foo")]), Some(("edge.generic_key_foo", 1, Unit::Second, false)));
    assert_eq!(found(&c, &[("generic_key", "bar")]), Some(("edge.generic_key", 100, Unit::Hour, false)));
    assert_eq!(found(&c, &[("path", "/api/v1/items")]), Some(("edge.path_/api/*", 7, Unit::Day, false)));
    assert_eq!(found(&c, &[("path", "/other")]), None, "no key-only entry for path");
    assert_eq!(found(&c, &[("tenant", "acme"), ("user", "u1")]), Some(("edge.tenant.user", 3, Unit::Week, false)));
    assert_eq!(found(&c, &[("tenant", "acme")]), None, "a limit applies only at the request's depth");
    assert_eq!(found(&c, &[("tenant", "acme"), ("user", "u1"), ("extra", "x")]), None);
    assert!(matches!(c.find("edge", &[("tenant", "a"), ("vip", "y")]), Some(Matched::Unlimited(_))));
    assert!(c.find("other", &[("remote_address", "1")]).is_none());
    let bulk = c.find("edge", &[("bulk", "x")]).unwrap();
    let Matched::Limit(bulk) = bulk else { panic!() };
    assert_eq!(bulk.replaces, ["foo"]);
    assert!(c.limit_of(bulk).shadow);
}

#[test]
fn wildcards_match_anywhere() {
    assert!(wildcard("path_/api/*", "path_/api/v1"));
    assert!(wildcard("a*b*c", "aXXbYYc"));
    assert!(!wildcard("a*b*c", "aXXcYYb"));
    assert!(wildcard("k_*", "k_"));
    assert!(!wildcard("ab*ba", "aba"));
}

#[test]
fn every_error_names_the_file_the_domain_and_the_descriptor_path() {
    let bad = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: fortnight, requests_per_unit: 4 }
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 4 }
  - key: tenant
    descriptors:
      - key: user
        rate_limit: { unlimited: true, unit: second }
      - value: orphan
  - key: x
    rate_limit: { unit: minute }
    colour: red
  - key: y
    value: exact
    share_threshold: true
"#;
    let errors = EnvoyConfig::parse(&[("edge.yaml".into(), bad.into())]).unwrap_err().to_string();
    for want in [
        "edge.yaml: domain 'edge': descriptors.remote_address.rate_limit.unit: 'fortnight' is not second, minute, hour, day, week, month or year",
        "edge.yaml: domain 'edge': descriptors.remote_address: duplicate descriptor 'remote_address' at this level",
        "descriptors.tenant.descriptors.user.rate_limit.unit: must not be given with unlimited",
        "descriptors.tenant.descriptors[1].key: is required and must not be empty",
        "descriptors.x.rate_limit.requests_per_unit: is required",
        "descriptors[3]: unknown key 'colour' (expected one of: key, value, rate_limit,",
        "descriptors.y_exact.share_threshold: applies only to a wildcard value (containing '*'), not 'exact'",
    ] {
        assert!(errors.contains(want), "missing {want:?} in\n{errors}");
    }
    let twice = EnvoyConfig::parse(&[("a.yaml".into(), EDGE.into()), ("b.yaml".into(), EDGE.into())]).unwrap_err();
    assert!(twice.to_string().contains("b.yaml: domain 'edge': is also defined in a.yaml"), "{twice}");
}

fn limit<'c>(c: &'c EnvoyConfig, domain: &str, entries: &[(&str, &str)]) -> &'c EnvoyLimit {
    match c.find(domain, entries) {
        Some(Matched::Limit(l)) => l,
        other => panic!("{entries:?}: {other:?}"),
    }
}

/// The stat key upstream's stats use for a request.
fn stat_key(c: &EnvoyConfig, domain: &str, entries: &[(&str, &str)]) -> String {
    let l = limit(c, domain, entries);
    if l.dynamic_stat { c.stat_key(domain, entries, l) } else { l.path.clone() }
}

#[test]
fn detailed_metric_keys_name_the_values_as_upstreams_tests_expect() {
    // Upstream's TestDetailedMetric, its realistic nested configuration.
    let yaml = r#"
domain: nested
descriptors:
  - { key: key_1, detailed_metric: true, rate_limit: { requests_per_unit: 500, unit: minute } }
  - { key: key_1, value: some-value-for-key-1, rate_limit: { requests_per_unit: 500, unit: minute } }
  - key: key_2
    detailed_metric: true
    rate_limit: { requests_per_unit: 5000, unit: minute }
    descriptors:
      - { key: key_3, detailed_metric: true }
      - { key: key_3, value: requested-key3-value, detailed_metric: true, rate_limit: { requests_per_unit: 5, unit: minute } }
"#;
    let c = EnvoyConfig::parse(&[("n.yaml".into(), yaml.into())]).unwrap();
    assert_eq!(stat_key(&c, "nested", &[("key_1", "value-for-key-1")]), "nested.key_1_value-for-key-1");
    assert_eq!(stat_key(&c, "nested", &[("key_2", "key-2-value")]), "nested.key_2_key-2-value");
    assert_eq!(
        stat_key(&c, "nested", &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")]),
        "nested.key_2_key-2-value.key_3_requested-key3-value"
    );
    assert_eq!(stat_key(&c, "nested", &[("key_1", "some-value-for-key-1")]), "nested.key_1_some-value-for-key-1");
    assert_eq!(stat_key(&c, "nested", &[("key_1", "")]), "nested.key_1_", "an empty value still writes its _");
}

#[test]
fn value_to_metric_keys_follow_upstreams_tests() {
    let yaml = r#"
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - { key: subject_id, rate_limit: { requests_per_unit: 60, unit: minute } }
  - key: k1
    value_to_metric: true
    descriptors:
      - { key: k2, rate_limit: { requests_per_unit: 1, unit: second } }
  - key: m1
    descriptors:
      - key: m2
        value_to_metric: true
        descriptors:
          - { key: m3, rate_limit: { requests_per_unit: 1, unit: second } }
  - key: n1
    descriptors:
      - { key: n2, rate_limit: { requests_per_unit: 1, unit: second } }
  - key: w
    value: "pre*"
    value_to_metric: true
    descriptors:
      - { key: x, rate_limit: { requests_per_unit: 1, unit: second } }
  - key: v
    value: "pre*"
    descriptors:
      - { key: x, rate_limit: { requests_per_unit: 1, unit: second } }
  - key: s
    value: "pre*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - { key: x, rate_limit: { requests_per_unit: 1, unit: second } }
"#;
    let c = EnvoyConfig::parse(&[("d.yaml".into(), yaml.into())]).unwrap();
    let k = |e: &[(&str, &str)]| stat_key(&c, "d", e);
    assert_eq!(
        k(&[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")]),
        "d.route_draw.http_method_GET.subject_id"
    );
    assert_eq!(k(&[("k1", "A"), ("k2", "foo")]), "d.k1_A.k2");
    assert_eq!(k(&[("m1", "X"), ("m2", "Y"), ("m3", "Z")]), "d.m1.m2_Y.m3");
    assert_eq!(k(&[("n1", "X"), ("n2", "Y")]), "d.n1.n2", "no flag: the path");
    assert!(!limit(&c, "d", &[("n1", "X"), ("n2", "Y")]).dynamic_stat);
    assert_eq!(k(&[("w", "prefix"), ("x", "1")]), "d.w_prefix.x", "a wildcard with the flag: the value");
    assert_eq!(k(&[("v", "prefix"), ("x", "1")]), "d.v_pre*.x", "without: the wildcard");
    assert_eq!(k(&[("s", "prefix"), ("x", "1")]), "d.s_pre*.x", "share_threshold keeps the wildcard");
}

#[test]
fn metadata_quota_mode_and_every_upstream_field_are_read() {
    let yaml = r#"
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1, metadata: { ignored: here } }
    metadata:
      service_with_quota: { name: "service_1", weight: 2, tags: [a, b], on: true, none: null }
  - key: plain
    rate_limit: { unit: minute, requests_per_unit: 1 }
    metadata: {}
"#;
    let c = EnvoyConfig::parse(&[("rl.yaml".into(), yaml.into())]).unwrap();
    let l = limit(&c, "rl", &[("service", "service_1")]);
    assert!(l.quota);
    let metadata = serde_json::Value::Object((**l.metadata.as_ref().unwrap()).clone());
    assert_eq!(
        metadata,
        serde_json::json!({ "service_with_quota": { "name": "service_1", "weight": 2, "tags": ["a", "b"], "on": true, "none": null } })
    );
    let plain = limit(&c, "rl", &[("plain", "x")]);
    assert!(!plain.quota && plain.metadata.is_none());
    for (bad, want) in [
        ("metadata: [1, 2]", "descriptors.k.metadata: must be a mapping"),
        ("metadata: { a: .nan }", "descriptors.k.metadata: the number .nan cannot be carried in metadata"),
        ("quota_mode: yes", "descriptors.k.quota_mode: must be true or false"),
        ("value_to_metric: 1", "descriptors.k.value_to_metric: must be true or false"),
    ] {
        let yaml = format!(
            "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n    {bad}\n"
        );
        let errors = EnvoyConfig::parse(&[("rl.yaml".into(), yaml)]).unwrap_err().to_string();
        assert!(errors.contains(want), "{bad}: {errors}");
    }
}

#[test]
fn merged_domains_add_up_and_a_descriptor_twice_is_still_an_error() {
    let a = "domain: test-domain\ndescriptors:\n  - { key: key1, value: value1, rate_limit: { unit: minute, requests_per_unit: 10 } }\n";
    let b = "domain: test-domain\ndescriptors:\n  - { key: key2, value: value2, rate_limit: { unit: minute, requests_per_unit: 20 } }\n";
    let files = |x: &str, y: &str| vec![("a.yaml".to_string(), x.to_string()), ("b.yaml".to_string(), y.to_string())];
    let merge = EnvoyOptions { merge_domains: true };
    let c = EnvoyConfig::parse_with(&files(a, b), &merge).unwrap();
    assert_eq!(limit(&c, "test-domain", &[("key1", "value1")]).requests_per_unit, 10);
    assert_eq!(limit(&c, "test-domain", &[("key2", "value2")]).requests_per_unit, 20);
    let refused = EnvoyConfig::parse(&files(a, b)).unwrap_err().to_string();
    assert!(refused.contains("b.yaml: domain 'test-domain': is also defined in a.yaml"), "{refused}");
    let twice = EnvoyConfig::parse_with(&files(a, a), &merge).unwrap_err().to_string();
    assert!(twice.contains("b.yaml: domain 'test-domain': descriptors.key1_value1: duplicate descriptor"), "{twice}");
}
