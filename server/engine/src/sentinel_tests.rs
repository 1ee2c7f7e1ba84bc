//! Sentinel's own tests' expectations, step by step on a fake clock, through
//! the rules its files translate into (alibaba/Sentinel 1.8:
//! `ThrottlingControllerTest`, `DefaultControllerTest`,
//! `ResponseTimeCircuitBreakerTest`, `ExceptionCircuitBreakerTest`,
//! `CircuitBreakingIntegrationTest`, `ParamFlowDefaultCheckerTest`,
//! `AuthorityRuleCheckerTest`; the warm-up controllers' are in
//! `limiter::warm_up::tests`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Engine, EngineConfig, Request, Verdict};
use crate::breaker::{Admission, Breaker, Outcome, State};
use crate::rules::RuleSet;
use crate::rules::sentinel::SentinelRules;
use crate::rules::sentinel::fixtures::{FLOW, PARAM, dashboard, read};
use crate::time::{ManualClock, Timestamp};

/// An engine on a fake clock (at a whole minute, and a multiple of every
/// stat interval below) with these rules installed.
fn engine(s: &SentinelRules) -> (Engine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_700_000_000)));
    let engine = Engine::new(EngineConfig { max_keys: usize::MAX }, clock.clone());
    let set = RuleSet::from_rules(s.rules.clone(), s.system.iter().cloned().collect());
    engine.control().install(set, String::new(), "sentinel".into());
    (engine, clock)
}

/// One Acquire: the verdict and how long the caller is told to wait.
fn ask(e: &Engine, resource: &str, descriptors: &[(&str, &str)]) -> (Verdict, Duration) {
    let d: HashMap<String, String> = descriptors.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let rules = e.rules();
    let a = e.acquire(&rules, &Request::new(resource, &d)).expect("a valid request");
    (a.verdict, a.wait)
}

fn passes(e: &Engine, resource: &str, descriptors: &[(&str, &str)], n: usize) -> usize {
    (0..n).filter(|_| ask(e, resource, descriptors).0 == Verdict::Allowed).count()
}

#[test]
fn throttling_controller_test_queue_timeout_and_normal_pace() {
    // ThrottlingController(maxQueueingTimeMs 500, count 10): 10 callers at once.
    let s = read(&[("flow.json", r#"[{"resource":"pace","count":10,"controlBehavior":2,"maxQueueingTimeMs":500}]"#)])
        .unwrap();
    let (e, clock) = engine(&s);
    let answers: Vec<(Verdict, Duration)> = (0..10).map(|_| ask(&e, "pace", &[])).collect();
    let ms = Duration::from_millis;
    let passed: Vec<Duration> = answers.iter().filter(|a| a.0 == Verdict::Allowed).map(|a| a.1).collect();
    assert_eq!(passed, [ms(0), ms(100), ms(200), ms(300), ms(400), ms(500)], "waits of 0 to 500 pass");
    assert_eq!(answers.iter().filter(|a| a.0 == Verdict::RateLimited).count(), 4, "600 to 900 would wait too long");
    // testThrottlingControllerNormal: one caller at a time, each waiting its turn.
    clock.advance(Duration::from_secs(10));
    let mut waits = Vec::new();
    for _ in 0..6 {
        let (v, wait) = ask(&e, "pace", &[]);
        assert_eq!(v, Verdict::Allowed);
        waits.push(wait);
        clock.advance(wait.max(ms(0)));
    }
    assert_eq!(waits, [ms(0), ms(100), ms(100), ms(100), ms(100), ms(100)], "passes at +0, +100 ... +500");
    // testThrottlingControllerZeroThreshold: a count of 0 refuses.
    let zero =
        read(&[("flow.json", r#"[{"resource":"z","count":0,"controlBehavior":2,"maxQueueingTimeMs":500}]"#)]).unwrap();
    let (e, _) = engine(&zero);
    assert_eq!(ask(&e, "z", &[]).0, Verdict::RateLimited);
}

#[test]
fn default_controller_and_the_cold_start_of_a_warm_up() {
    let s = read(&[(
        "flow.json",
        r#"[{"resource":"q","count":10},{"resource":"w","count":10,"controlBehavior":1,"warmUpPeriodSec":10}]"#,
    )])
    .unwrap();
    let (e, _) = engine(&s);
    // DefaultControllerTest: 9 + 1 <= 10 passes, 10 + 1 does not.
    assert_eq!(passes(&e, "q", &[], 11), 10);
    // WarmUpControllerTest's first step: cold, the threshold is about 10 / 3 (3.378).
    assert_eq!(passes(&e, "w", &[], 10), 3);
}

/// A breaker driven as Sentinel's tests drive an entry: `entry` at `at` ms,
/// `exit` `rt` ms later, with or without an error.
struct Entries {
    b: Breaker,
    cfg: crate::rules::BreakerConfig,
    t0: Timestamp,
    states: Vec<(u64, State)>,
}

impl Entries {
    fn new(degrade: &str) -> Self {
        let s = read(&[("degrade.json", degrade)]).unwrap();
        let cfg = s.rules[0].breaker.clone().unwrap();
        // A multiple of every stat interval below, as Sentinel's tests start at 0.
        Entries { b: Breaker::new(&cfg), cfg, t0: Timestamp::from_secs(1_700_000_000), states: Vec::new() }
    }

    fn at(&self, ms: u64) -> Timestamp {
        self.t0.saturating_add(Duration::from_millis(ms))
    }

    /// One call: true when it passed (then it exits `rt` ms later).
    fn call(&mut self, at: u64, rt: u64, error: bool) -> bool {
        let (admission, _) = self.b.acquire(&self.cfg, self.at(at));
        let Admission::Permitted { generation, .. } = admission else { return false };
        let outcome = if error { Outcome::Failure } else { Outcome::Success };
        self.b.report(&self.cfg, self.at(at + rt), generation, outcome, Duration::from_millis(rt));
        self.states.push((at + rt, self.b.state()));
        true
    }

    fn state(&self) -> State {
        self.b.state()
    }
}

#[test]
fn response_time_circuit_breaker_test_max_slow_ratio_threshold() {
    let mut e = Entries::new(
        r#"[{"resource":"r","grade":0,"count":10,"minRequestAmount":3,"slowRatioThreshold":1.0,"statIntervalMs":5000,"timeWindow":5}]"#,
    );
    assert!(e.call(0, 20, false) && e.call(20, 20, false));
    assert_eq!(e.state(), State::Closed);
    assert!(e.call(40, 20, false));
    assert_eq!(e.state(), State::Open, "3 of 3 slow: a ratio of 1.0 at a threshold of 1.0 opens");
    assert!(!e.call(60, 0, false));
    assert!(!e.call(1060, 0, false));
    assert!(e.call(5060, 20, false), "the probe, 5 s after opening");
    assert_eq!(e.state(), State::Open, "a slow probe reopens");
}

#[test]
fn exception_circuit_breaker_test_record_error_or_success() {
    let mut e = Entries::new(
        r#"[{"resource":"r","grade":1,"count":0.2,"minRequestAmount":1,"statIntervalMs":20000,"timeWindow":10}]"#,
    );
    assert!(e.call(0, 10, false));
    assert!(e.call(10, 5, true));
    assert_eq!(e.state(), State::Open, "1 of 2 = 0.5 > 0.2");
    assert!(!e.call(15, 5, true) && !e.call(15, 100, false) && !e.call(5015, 100, false));
    assert!(e.call(10015, 5, true), "the probe");
    assert_eq!(e.state(), State::Open, "a failed probe reopens");
    assert!(!e.call(10020, 100, false) && !e.call(10020, 100, false));
    assert!(e.call(20020, 100, false), "the next probe");
    assert_eq!(e.state(), State::Closed);
    for i in 0..6 {
        assert!(e.call(20120 + i * 100, 100, false));
    }
    assert!(e.call(20720, 5, true));
    assert_eq!(e.state(), State::Closed, "1 of 7 = 0.143 <= 0.2: the window started again at closing");
    assert!(e.call(20725, 100, false));
}

#[test]
fn circuit_breaking_integration_test_slow_request_mode() {
    let mut e = Entries::new(
        r#"[{"resource":"r","grade":0,"count":50,"minRequestAmount":10,"slowRatioThreshold":0.8,"statIntervalMs":20000,"timeWindow":5}]"#,
    );
    let (slow, fast) = (65, 35);
    let mut t = 0;
    for rt in [slow; 7].into_iter().chain([fast; 3]).chain([slow; 5]) {
        assert!(e.call(t, rt, false));
        t += rt;
    }
    assert_eq!((t, e.state()), (885, State::Closed), "12 of 15 = 0.8: not above 0.8");
    assert!(e.call(t, slow, false));
    assert_eq!(e.state(), State::Open, "13 of 16 = 0.8125 > 0.8");
    assert!(!e.call(950, 1, false) && !e.call(1950, 1, false));
    assert!(e.call(6950, slow, false), "the probe");
    assert_eq!(e.state(), State::Open, "a slow probe reopens (retry at 12015)");
    assert!(e.call(13015, fast, false));
    assert_eq!(e.state(), State::Closed);
    assert!(e.call(13050, slow, false));
    assert_eq!(e.state(), State::Closed, "1 slow of 1: fewer than 10 calls");
}

#[test]
fn circuit_breaking_integration_test_exception_ratio_mode() {
    let mut e = Entries::new(
        r#"[{"resource":"r","grade":1,"count":0.5,"minRequestAmount":10,"statIntervalMs":25000,"timeWindow":5}]"#,
    );
    let mut t = 0;
    for error in [true; 6].into_iter().chain([false; 3]) {
        assert!(e.call(t, 5, error));
        t += 5;
    }
    assert_eq!(e.state(), State::Closed, "6 of 9: fewer than 10 calls");
    assert!(e.call(45, 5, true));
    assert_eq!(e.state(), State::Open, "7 of 10 = 0.7 > 0.5");
    assert!(!e.call(50, 5, false) && !e.call(2050, 5, false));
    assert!(e.call(7050, 5, true));
    assert_eq!(e.state(), State::Open);
    assert!(e.call(13055, 5, false));
    assert_eq!(e.state(), State::Closed);
    assert!(e.call(13060, 5, true));
    assert_eq!(e.state(), State::Closed, "1 of 1: fewer than 10 calls");
}

#[test]
fn an_exception_count_breaker_opens_on_the_count_plus_one_and_its_bucket_tumbles() {
    let mut e = Entries::new(
        r#"[{"resource":"r","grade":2,"count":5,"minRequestAmount":1,"statIntervalMs":1000,"timeWindow":2}]"#,
    );
    for i in 0..5 {
        assert!(e.call(i * 10, 5, true));
    }
    assert_eq!(e.state(), State::Closed, "5 exceptions: not more than 5");
    // A new second: Sentinel's one bucket starts again.
    for i in 0..5 {
        assert!(e.call(1000 + i * 10, 5, true));
    }
    assert_eq!(e.state(), State::Closed);
    assert!(e.call(1100, 5, true));
    assert_eq!(e.state(), State::Open, "the 6th exception of the second");
}

#[test]
fn param_flow_default_checker_tests() {
    let s = read(&[(
        "param-flow.json",
        r#"[{"resource":"single","paramIdx":0,"count":5},
            {"resource":"burst","paramIdx":0,"count":5,"burstCount":3},
            {"resource":"long","paramIdx":0,"count":5,"durationInSec":60}]"#,
    )])
    .unwrap();
    let (e, clock) = engine(&s);
    let v = [("param0", "value")];
    // testParamFlowDefaultCheckSingleQps: 5, then none; after 3 s, 5 again.
    assert_eq!(passes(&e, "single", &v, 6), 5);
    clock.advance(Duration::from_millis(3000));
    assert_eq!(passes(&e, "single", &v, 6), 5);
    assert_eq!(passes(&e, "single", &[("param0", "other")], 6), 5, "per value");
    // testParamFlowDefaultCheckSingleQpsWithBurst: 8; +1002 ms: 5; +1002: 5; +2000: 8; +1002: 5.
    let mut got = vec![passes(&e, "burst", &v, 9)];
    for ms in [1002, 1002, 2000, 1002] {
        clock.advance(Duration::from_millis(ms));
        got.push(passes(&e, "burst", &v, 9));
    }
    assert_eq!(got, [8, 5, 5, 8, 5]);
    // testParamFlowDefaultCheckQpsInDifferentDuration: 5 in 60 s. Sentinel
    // refills only once 60 s have passed; 5 a minute is no exact rate, so
    // here it is a sliding window of 5 a minute: none at +1 s, +11 s, +41 s
    // (Sentinel: none), some once the minute has turned.
    assert_eq!(passes(&e, "long", &v, 6), 5);
    let mut got = Vec::new();
    for s in [1, 10, 30, 30] {
        clock.advance(Duration::from_secs(s));
        got.push(passes(&e, "long", &v, 6));
    }
    assert_eq!(got, [0, 0, 0, 3]);
    // A listed value with a count of 0 is always refused; an absent parameter is not limited.
    let listed = read(&[("param.json", PARAM)]).unwrap();
    let (e, _) = engine(&listed);
    assert_eq!(passes(&e, "/user/info/{id}", &[("param0", "7")], 3), 0);
    assert_eq!(passes(&e, "/user/info/{id}", &[("param0", "vip")], 12), 10);
    assert_eq!(passes(&e, "/user/info/{id}", &[("param0", "u1")], 4), 3);
    assert_eq!(passes(&e, "/user/info/{id}", &[], 50), 50);
}

#[test]
fn authority_rule_checker_test_and_origins_on_flow_rules() {
    let rules = |list: &str, strategy: u8| {
        read(&[("authority.json", &format!(r#"[{{"resource":"r","limitApp":"{list}","strategy":{strategy}}}]"#))])
            .unwrap()
    };
    let verdict = |s: &SentinelRules, origin: &str| ask(&engine(s).0, "r", &[("origin", origin)]).0;
    assert_eq!(verdict(&rules("appA,appB", 0), "appA"), Verdict::Allowed);
    assert_eq!(verdict(&rules("appB", 0), "appA"), Verdict::RateLimited);
    assert_eq!(verdict(&rules("appA", 1), "appA"), Verdict::RateLimited);
    assert_eq!(verdict(&rules("appA", 1), "appC"), Verdict::Allowed);
    assert_eq!(verdict(&rules("appB", 0), ""), Verdict::Allowed, "no origin passes a white list, as in Sentinel");

    // limitApp: app-a's own 5 and the default 20; every other origin 2 of its own; chain: 1 through `web`.
    let s = dashboard();
    let (e, _) = engine(&s);
    let orders = "GET:/orders";
    assert_eq!(passes(&e, orders, &[("origin", "evil")], 10), 0, "on the authority rule's black list");
    assert_eq!(passes(&e, orders, &[("origin", "app-a")], 10), 5);
    let (e, _) = engine(&read(&[("shop-flow-rules", FLOW)]).unwrap());
    assert_eq!(passes(&e, orders, &[("origin", "app-a")], 10), 5);
    assert_eq!(passes(&e, orders, &[("origin", "app-b")], 10), 2);
    assert_eq!(passes(&e, orders, &[("origin", "app-c")], 10), 2);
    assert_eq!(passes(&e, orders, &[("context", "web")], 10), 1);
    assert_eq!(passes(&e, orders, &[], 20), 20 - 5 - 2 - 2 - 1, "the default rule counts every caller");
}
