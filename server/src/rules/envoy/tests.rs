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
