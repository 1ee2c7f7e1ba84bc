//! Sentinel's rules read and translated (the decisions they make, step by
//! step as Sentinel's own tests expect them, are in
//! `engine::sentinel_tests`).

use std::time::Duration;

use super::fixtures::*;
use super::*;
use crate::limiter::Algorithm;
use crate::{BREAKER_OFF, Condition, WindowKind};

fn errors(files: &[(&str, &str)]) -> Vec<String> {
    read(files).expect_err("refused").0.iter().map(ToString::to_string).collect()
}

fn rule<'a>(s: &'a SentinelRules, name: &str) -> &'a Rule {
    s.rules.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no rule {name} in {:?}", s.rules))
}

#[test]
fn every_kind_of_rule_the_dashboard_writes_is_read() {
    let s = dashboard();
    let names: Vec<&str> = s.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["GET:/orders", "POST:/pay", "report", "burst", "/user/info/{id}"]);
    assert_eq!(s.counts.values().sum::<usize>(), 9 + 2 + 2 + 1 + 2);

    // limitApp and chain: conditions on the origin and context descriptors.
    let orders = rule(&s, "GET:/orders");
    let shown: Vec<(&str, &Vec<String>, &Vec<Condition>)> =
        orders.limits.iter().map(|l| (l.name.as_str(), &l.key, &l.when)).collect();
    let is = |k: &str, v: &str, negate| Condition { key: k.into(), values: vec![v.into()], negate };
    assert_eq!(
        shown,
        [
            ("qps", &vec![], &vec![]),
            ("qps origin=app-a", &vec![], &vec![is("origin", "app-a", false)]),
            (
                "qps other",
                &vec!["origin".to_string()],
                &vec![Condition { key: "origin".into(), values: vec!["app-a".into(), String::new()], negate: true }]
            ),
            ("qps context=web", &vec![], &vec![is("context", "web", false)]),
        ]
    );
    assert!(
        matches!(&orders.limits[0].algorithm, Algorithm::SlidingWindow(c) if c.limit == 20 && c.window == 1_000_000_000)
    );
    // Authority: the first rule of a resource (a black list); the second is listed as ignored.
    let origins = orders.origins.as_ref().unwrap();
    assert_eq!((origins.allow, origins.values.clone()), (false, vec!["evil".to_string(), "worse".to_string()]));

    // Warm up, a thread count and the breaker of two degrade rules.
    let pay = rule(&s, "POST:/pay");
    let warm = crate::limiter::warm_up::Config::new(
        crate::limiter::rate::Rate::per_second(10.0).unwrap(),
        Duration::from_secs(10),
        3,
        crate::limiter::warm_up::Mode::Police,
    )
    .unwrap();
    assert_eq!(pay.limits[0].algorithm, Algorithm::WarmUp(warm));
    assert_eq!(pay.concurrency.unwrap().max_in_flight, 8);
    let b = pay.breaker.as_ref().unwrap();
    assert_eq!(b.window, WindowKind::Tumbling(20_000));
    assert_eq!((b.minimum_calls, b.half_open_calls), (10, 1));
    assert_eq!(b.wait_in_open.wait(1), Duration::from_secs(5));
    assert_eq!(b.slow_call_duration, Duration::from_millis(50));
    assert_eq!(b.slow_call_rate_threshold, 0.8f64.next_up(), "above 0.8, strictly");
    assert_eq!(b.failure_count_threshold, Some(6), "more than 5 exceptions");
    assert_eq!(b.failure_rate_threshold, BREAKER_OFF);

    // The rate limiter: a shaping leaky bucket; warm up + rate limiter: a shaping warm-up, on one replica.
    assert!(matches!(&rule(&s, "report").limits[0].algorithm, Algorithm::LeakyBucket(c)
        if c.capacity == 6 && matches!(c.mode, crate::limiter::leaky_bucket::Mode::Shape { max_wait: Some(500_000_000) })));
    let burst = &rule(&s, "burst").limits[0];
    assert_eq!((burst.name.as_str(), burst.sync), ("warm_up_rate_limiter", crate::SyncMode::Local));

    // Hot parameters: keyed by param0, with a limit per listed value.
    let user = rule(&s, "/user/info/{id}");
    let params: Vec<(&str, u64)> = user.limits.iter().map(|l| (l.name.as_str(), l.algorithm.capacity())).collect();
    assert_eq!(params, [("param0", 3), ("param0=vip", 10), ("param0=7", 0)]);
    assert_eq!(
        user.limits[0].when,
        [Condition { key: "param0".into(), values: vec!["vip".into(), "7".into()], negate: true }]
    );

    // The system: CPU and the average response time; qps is listed.
    let system = s.system.as_ref().unwrap();
    assert_eq!(system.cpu, Some([0.8; 3]));
    assert_eq!(system.latency.map(|(_, t)| t[0]), Some(Duration::from_millis(200)));
    assert!(system.resources.contains(&"POST:/pay".to_string()));

    let ignored = s.ignored.join("\n");
    for why in [
        "shop-flow-rules[7] 'report': strategy 1 (relate",
        "shop-authority-rules.json[1] 'GET:/orders': a second authority rule of the resource: Sentinel keeps the first",
        "SystemRule.json[1]: qps has no signal here",
    ] {
        assert!(ignored.contains(why), "{why} not in\n{ignored}");
    }
    assert_eq!(s.ignored.len(), 3, "{ignored}");
}

#[test]
fn bad_rules_are_refused_naming_file_rule_and_field() {
    let got = errors(&[
        ("flow-rules.json", r#"[{"resource":"a","grade":7,"count":1},{"resource":"b","count":-1},{"resource":" "}]"#),
        (
            "degrade-rules.json",
            r#"[{"resource":"c","grade":5,"timeWindow":1},{"resource":"d","grade":1,"count":1.5,"timeWindow":1}]"#,
        ),
        ("param-rules.json", r#"[{"resource":"e","count":1}]"#),
        ("rate-flow.json", r#"[{"resource":"f","count":10,"controlBehavior":2,"maxQueueingTimeMs":0}]"#),
        ("authority-rules.json", r#"{"resource":"g"}"#),
        ("system-rules.json", "[{"),
        ("rules.json", "[]"),
    ]);
    let expected = [
        "flow-rules.json: resource 'a': [0].grade: 7 is not a grade: 0 (thread count) or 1 (QPS)",
        "flow-rules.json: resource 'b': [1].count: must be at least 0, got -1",
        "flow-rules.json: [2].resource: is required and must not be blank",
        "degrade-rules.json: resource 'c': [0].grade: 5 is not a grade: 0 (slow request ratio), 1 (exception ratio) or 2 (exception count)",
        "degrade-rules.json: resource 'd': [1].count: an exception ratio must be from 0 to 1, got 1.5",
        "param-rules.json: resource 'e': [0].paramIdx: is required: the index of the parameter",
        "rate-flow.json: resource 'f': [0].maxQueueingTimeMs: must be above 0 with a rate limiter (Sentinel refuses 0), got 0",
        "authority-rules.json: must be a JSON list of authority rules, got an object",
    ];
    for e in expected {
        assert!(got.iter().any(|g| g == e), "missing {e:?} in {got:#?}");
    }
    assert!(got.iter().any(|g| g.starts_with("system-rules.json: is not JSON: EOF while parsing")), "{got:#?}");
    assert!(got.iter().any(|g| g.starts_with("rules.json: cannot tell the rule type from the name")), "{got:#?}");
    assert_eq!(got.len(), expected.len() + 2, "{got:#?}");
    // What Sentinel fails to load, or would answer absurdly, is refused too.
    let got = errors(&[(
        "flow.json",
        r#"[{"resource":"a","count":0.3,"controlBehavior":2},{"resource":"b","count":1,"controlBehavior":1,"warmUpPeriodSec":1}]"#,
    )]);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].contains("Sentinel fails to load it"), "{got:#?}");
    assert!(got[1].contains("warmUpPeriodSec: rate_per_second x warm_up_period must be at least 2"), "{got:#?}");
    // Degrade rules of one resource must share one breaker's window.
    let got = errors(&[(
        "degrade.json",
        r#"[{"resource":"a","grade":1,"count":0.5,"timeWindow":5},{"resource":"a","grade":2,"count":3,"timeWindow":9}]"#,
    )]);
    assert!(got[0].contains("must share statIntervalMs, timeWindow and minRequestAmount"), "{got:#?}");
}

/// Every number and boolean of `json` written as text, as some tools keep
/// them (fastjson reads them into the rule's fields all the same).
fn quoted(json: &str) -> String {
    fn quote(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Number(n) => *v = serde_json::Value::String(n.to_string()),
            serde_json::Value::Bool(b) => *v = serde_json::Value::String(b.to_string()),
            serde_json::Value::Array(items) => items.iter_mut().for_each(quote),
            serde_json::Value::Object(map) => map.values_mut().for_each(quote),
            _ => {}
        }
    }
    let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
    quote(&mut v);
    v.to_string()
}

#[test]
fn numbers_and_booleans_as_text_and_a_byte_order_mark_read_as_sentinel_reads_them() {
    let plain = dashboard();
    let files = [
        ("shop-flow-rules", FLOW),
        ("shop-degrade-rules.json", DEGRADE),
        ("SystemRule.json", SYSTEM),
        ("shop-param-rules", PARAM),
        ("shop-authority-rules.json", AUTHORITY),
    ];
    let texts: Vec<(&str, String)> = files.iter().map(|(n, t)| (*n, format!("\u{feff}{}", quoted(t)))).collect();
    assert!(texts[0].1.contains(r#""count":"20.0""#) && texts[0].1.contains(r#""clusterMode":"false""#));
    let texts: Vec<(&str, &str)> = texts.iter().map(|(n, t)| (*n, t.as_str())).collect();
    assert_eq!(read(&texts).unwrap(), plain);
    // Text that is not a number is still refused, naming the field.
    let got = errors(&[("flow.json", r#"[{"resource":"a","count":"ten"},{"resource":"b","count":" "}]"#)]);
    assert_eq!(got, ["flow.json: resource 'a': [0].count: must be a number, got a string"]);
}

#[test]
fn what_sentinel_could_not_read_is_refused_not_read_as_something_else() {
    let got = errors(&[
        (
            "flow.json",
            r#"[{"resource":"a","count":1,"clusterMode":true,"clusterConfig":{"thresholdType":"abc"}},
                {"resource":"b","count":10,"controlBehavior":2,"maxQueueingTimeMs":99999999999}]"#,
        ),
        ("param.json", r#"[{"resource":"d","paramIdx":0,"count":5,"burstCount":99999999999}]"#),
    ]);
    let expected = [
        r#"flow.json: resource 'a': [0].clusterConfig.thresholdType: must be 0 (average local) or 1 (global), got "abc""#,
        "flow.json: resource 'b': [1].maxQueueingTimeMs: must fit Sentinel's int (-2147483648 to 2147483647), got 99999999999",
        "param.json: resource 'd': [0].burstCount: must fit Sentinel's int (-2147483648 to 2147483647), got 99999999999",
    ];
    assert_eq!(got, expected);
    // Read, then refused when translated: rates past the largest a limit keeps.
    let got = errors(&[(
        "flow.json",
        r#"[{"resource":"c","count":2000000000,"controlBehavior":1,"warmUpPeriodSec":10},
            {"resource":"r","count":1e308,"controlBehavior":2,"maxQueueingTimeMs":500}]"#,
    )]);
    let expected = [
        "flow.json: resource 'c': [0].count: 2000000000 a second is above the largest supported rate (1000000000 a second)",
        "flow.json: resource 'r': [1].count: 1e308 a second is above the largest supported rate (1000000000 a second)",
    ];
    assert_eq!(got, expected);
    // A QPS count past the largest window limit, or below one call but above
    // none, is refused naming the count (0 is a kill switch, kept).
    let got = errors(&[(
        "flow.json",
        r#"[{"resource":"q","count":1e308},{"resource":"z","count":0.0001},{"resource":"w","count":0.5,"controlBehavior":1}]"#,
    )]);
    let expected = [
        "flow.json: resource 'q': [0].count: 1e308 a second is above the largest supported limit (1000000000000 a second)",
        "flow.json: resource 'z': [1].count: 0.0001 a second admits no call at all (write 0 to refuse every call on purpose)",
        "flow.json: resource 'w': [2].count: 0.5 a second admits no call at all (write 0 to refuse every call on purpose)",
    ];
    assert_eq!(got, expected);
    assert!(read(&[("flow.json", r#"[{"resource":"k","count":0}]"#)]).is_ok(), "0: every call refused, on purpose");
    // A count written 100.0 or "100.0" is 100, as fastjson reads it.
    let read = read(&[(
        "param.json",
        r#"[{"resource":"d","paramIdx":0,"count":5,"paramFlowItemList":[{"object":"vip","count":"100.0"},{"object":"x","count":7.0}]}]"#,
    )])
    .unwrap();
    let limits: Vec<u64> = rule(&read, "d").limits.iter().map(|l| l.algorithm.capacity()).collect();
    assert!(limits.contains(&100) && limits.contains(&7), "{limits:?}");
}

#[test]
fn a_hundred_thousand_rules_are_refused_with_the_bound() {
    let one = r#"{"resource":"r","grade":1,"count":10},"#;
    let file = |n: usize| format!("[{}{{}}]", one.repeat(n)).replace(",{}]", "]");
    let files: Vec<(String, String)> = (0..3).map(|i| (format!("flow-{i}.json"), file(34_000))).collect();
    let started = std::time::Instant::now();
    let err = SentinelRules::parse(&files, &SentinelOptions::default()).unwrap_err();
    assert_eq!(err.0[0].to_string(), "flow-1.json: more than 50000 rules in all; that is the limit");
    // Bounded: refused after reading two files, not translating 100,000 rules.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_thread_count_of_zero_is_a_kill_switch_as_in_sentinel() {
    let s = read(&[("flow.json", r#"[{"resource":"d","grade":0,"count":0},{"resource":"e","grade":0,"count":0.5}]"#)])
        .unwrap();
    for name in ["d", "e"] {
        let r = rule(&s, name);
        assert_eq!(r.concurrency, None);
        assert_eq!(r.limits.len(), 1, "{r:?}");
        assert!(matches!(&r.limits[0].algorithm, Algorithm::SlidingWindow(c) if c.limit == 0), "{r:?}");
    }
}

#[test]
fn numbers_past_every_range_are_kept_in_range_not_overflowed() {
    let s = read(&[
        (
            "flow.json",
            r#"[{"resource":"q","count":1e9,"grade":1,"controlBehavior":2,"maxQueueingTimeMs":2147483647},
                {"resource":"r","count":1e9,"grade":1,"controlBehavior":2,"maxQueueingTimeMs":500}]"#,
        ),
        ("degrade.json", r#"[{"resource":"a","grade":2,"count":18446744073709551614,"timeWindow":1}]"#),
    ])
    .unwrap();
    assert_eq!(rule(&s, "a").breaker.as_ref().unwrap().failure_count_threshold, Some(u32::MAX));
    assert!(matches!(&rule(&s, "q").limits[0].algorithm, Algorithm::LeakyBucket(_)));
    assert!(matches!(&rule(&s, "r").limits[0].algorithm, Algorithm::LeakyBucket(_)));
}

#[test]
fn a_refill_finer_than_a_thousandth_a_second_is_a_window_not_a_rounded_up_rate() {
    let s = read(&[(
        "param.json",
        r#"[{"resource":"perday","paramIdx":0,"count":5,"durationInSec":86400},
            {"resource":"third","paramIdx":0,"count":10,"durationInSec":3}]"#,
    )])
    .unwrap();
    match &rule(&s, "perday").limits[0].algorithm {
        Algorithm::SlidingWindow(c) => assert_eq!((c.limit, c.window), (5, 86_400_000_000_000)),
        other => panic!("{other:?}"),
    }
    // 10 in 3 s is 3.333... a second: a window too; 10 in 4 s a bucket.
    assert!(matches!(&rule(&s, "third").limits[0].algorithm, Algorithm::SlidingWindow(c) if c.limit == 10));
    let s = read(&[("param.json", r#"[{"resource":"quarter","paramIdx":0,"count":10,"durationInSec":4}]"#)]).unwrap();
    assert!(matches!(&rule(&s, "quarter").limits[0].algorithm, Algorithm::TokenBucket(c) if c.capacity == 10));
}

#[test]
fn a_value_listed_twice_takes_its_last_count() {
    let s = read(&[(
        "param.json",
        r#"[{"resource":"hot","paramIdx":0,"count":10,"paramFlowItemList":[
            {"object":"a","classType":"String","count":1},{"object":"a","classType":"String","count":5}]}]"#,
    )])
    .unwrap();
    let r = rule(&s, "hot");
    let names: Vec<&str> = r.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["param0", "param0=a"]);
    assert!(matches!(&r.limits[1].algorithm, Algorithm::TokenBucket(c) if c.capacity == 5), "{r:?}");
    assert_eq!(r.limits[0].when, [Condition { key: "param0".into(), values: vec!["a".into()], negate: true }]);
}

#[test]
fn an_empty_origin_is_not_other() {
    let s = read(&[("flow.json", r#"[{"resource":"o","limitApp":"other","grade":1,"count":3}]"#)]).unwrap();
    let l = &rule(&s, "o").limits[0];
    assert!(!l.when.iter().all(|c| c.holds(Some(""))), "an empty origin is concerned: {l:?}");
    assert!(l.when.iter().all(|c| c.holds(Some("app-x"))), "{l:?}");
}

#[test]
fn errors_are_bounded_one_line_each_and_cut() {
    let million = format!("[{}{{}}]", "{},".repeat(1_000_000));
    let got = errors(&[("flow-rules.json", &million)]);
    assert_eq!(got, ["flow-rules.json: more than 50000 rules in all; that is the limit"]);
    let many = format!("[{}{{}}]", "{},".repeat(500));
    assert_eq!(errors(&[("flow-rules.json", &many)]).len(), MAX_ERRORS + 1);
    let evil = format!(r#"[{{"resource":"evil\nINFO forged line {}","grade":1,"count":1}}]"#, "x".repeat(100_000));
    let got = errors(&[("flow\u{1b}[31m.json", &evil)]);
    assert!(!got.is_empty());
    for line in &got {
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line:?}");
        assert!(line.len() < 10_000, "{}", line.len());
    }
    assert!(got[0].starts_with("flow\\u{1b}[31m.json: "), "{:?}", got[0]);
    assert!(got.iter().any(|l| l.contains("evil\\nINFO forged line") && l.contains("more bytes)")), "{got:?}");
}

#[test]
fn a_sentinel_rule_that_only_restricts_keeps_the_rules_files_glob_beneath_it() {
    let file = crate::RuleSet::from_yaml(
        r#"
resources:
  - name: "*"
    limits: [{ name: qps, algorithm: fixed_window, limit: 3, window: 3s }]
    breaker: { failure_rate_threshold: 0.5 }
  - name: "api/*"
    limits: [{ name: api, algorithm: fixed_window, limit: 9, window: 1s }]
"#,
        "rules.yaml",
    )
    .unwrap();
    let s = read(&[
        ("authority.json", r#"[{"resource":"authB","limitApp":"evil","strategy":1}]"#),
        ("flow.json", r#"[{"resource":"api/x","grade":1,"count":5}]"#),
    ])
    .unwrap();
    let (merged, left_out) = file.with_extra(&s.rules, None);
    assert!(left_out.is_empty());
    let auth = merged.find("authB").unwrap();
    assert!(auth.origins.is_some(), "Sentinel's restriction");
    let names: Vec<&str> = auth.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["qps"], "the default rule's limit still applies");
    assert!(auth.breaker.is_some(), "and its breaker");
    let api = merged.find("api/x").unwrap();
    let names: Vec<&str> = api.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["qps", "api"], "Sentinel's limit, then the glob's");
    // A name both give a limit keeps both, the file's renamed.
    let s = read(&[("flow.json", r#"[{"resource":"other","grade":1,"count":5}]"#)]).unwrap();
    let (merged, _) = file.with_extra(&s.rules, None);
    let names: Vec<&str> = merged.find("other").unwrap().limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["qps", "qps(*)"]);
}
