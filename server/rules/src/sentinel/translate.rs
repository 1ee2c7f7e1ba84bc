//! Sentinel's rules as Floodgate's: one [`Rule`] per resource.
//!
//! Where Sentinel's semantics and Floodgate's differ, the translation picks
//! the Floodgate field that gives Sentinel's answer on Sentinel's own tests
//! (see `tests.rs`): strict thresholds become the next double up, the
//! breaker's window is Sentinel's tumbling bucket, HALF_OPEN has one probe.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::read::{Authority, Degrade, Flow, Param, Read, System};
use super::{SentinelOptions, SentinelRules};
use crate::fields::{RuleError, RuleErrors};
use crate::limiter::rate::Rate;
use crate::limiter::{Algorithm, leaky_bucket, sliding_window, warm_up};
use crate::systems::{Percentile, PriorityShedding, SystemConfig};
use crate::{
    BREAKER_OFF, Backoff, BreakerConfig, Concurrency, Condition, Limit, OnRedisError, Origins, Pattern, Rule, SyncMode,
    WindowKind,
};

/// The system Sentinel's system rules become.
pub const SYSTEM: &str = "sentinel";

/// How long a permit of a thread-count rule lives without a report.
const PERMIT_TTL: Duration = Duration::from_secs(60);

/// What one resource gathers from every rule naming it.
#[derive(Default)]
struct Resource {
    limits: Vec<Limit>,
    names: HashSet<String>,
    concurrency: Option<u32>,
    degrade: Vec<Degrade>,
    origins: Option<Origins>,
}

impl Resource {
    /// Adds a limit, its name made unique (`qps`, `qps#2`...).
    fn push(&mut self, mut limit: Limit) {
        let base = limit.name.clone();
        let mut n = 1;
        while !self.names.insert(limit.name.clone()) {
            n += 1;
            limit.name = format!("{base}#{n}");
        }
        self.limits.push(limit);
    }
}

struct Out<'o> {
    options: &'o SentinelOptions,
    order: Vec<String>,
    resources: HashMap<String, Resource>,
    ignored: Vec<String>,
    errors: Vec<RuleError>,
}

impl Out<'_> {
    fn resource(&mut self, name: &str) -> &mut Resource {
        if !self.resources.contains_key(name) {
            self.order.push(name.to_string());
        }
        self.resources.entry(name.to_string()).or_default()
    }

    fn ignore(&mut self, label: String, why: &str) {
        self.ignored.push(format!("{label}: {why}"));
    }

    /// Flow rule `f`'s `field` refused.
    fn flow_error(&mut self, f: &Flow, field: &str, message: impl Into<String>) {
        self.error(&f.at.file, f.at.index, &f.resource, field, message)
    }

    fn error(&mut self, file: &str, index: usize, resource: &str, field: &str, message: impl Into<String>) {
        self.errors.push(RuleError {
            file: file.into(),
            resource: Some(resource.into()),
            field: format!("[{index}].{field}"),
            message: message.into(),
        });
    }
}

pub fn rules(read: Read, options: &SentinelOptions) -> Result<SentinelRules, RuleErrors> {
    let mut out =
        Out { options, order: Vec::new(), resources: HashMap::new(), ignored: Vec::new(), errors: Vec::new() };
    let mut counts = BTreeMap::new();
    counts.insert("flow", read.flow.len());
    counts.insert("degrade", read.degrade.len());
    counts.insert("system", read.system.len());
    counts.insert("param-flow", read.param.len());
    counts.insert("authority", read.authority.len());
    for file in &read.gateway {
        out.ignore(file.clone(), "gateway rules (sentinel-api-gateway-adapter) are not read");
    }
    // The origins each resource's flow rules name one by one: `other` is every origin but these.
    let mut specific: HashMap<&str, Vec<String>> = HashMap::new();
    for f in &read.flow {
        if f.limit_app != "default" && f.limit_app != "other" {
            specific.entry(f.resource.as_str()).or_default().push(f.limit_app.clone());
        }
    }
    for f in &read.flow {
        let others = specific.get(f.resource.as_str()).cloned().unwrap_or_default();
        flow(&mut out, f, &others);
    }
    for p in &read.param {
        param(&mut out, p);
    }
    for a in &read.authority {
        authority(&mut out, a);
    }
    for d in &read.degrade {
        if d.regex {
            out.ignore(d.at.label(&d.resource), "a regex resource is not read: Floodgate names resources exactly");
            continue;
        }
        out.resource(&d.resource).degrade.push(d.clone());
    }
    let system = system(&mut out, &read.system);
    let mut rules = Vec::with_capacity(out.order.len());
    for name in std::mem::take(&mut out.order) {
        let r = out.resources.remove(&name).expect("every ordered resource is gathered");
        let breaker = breaker(&mut out, &name, &r.degrade);
        let concurrency = r.concurrency.map(|max_in_flight| Concurrency {
            max_in_flight,
            adaptive: None,
            partitions: Default::default(),
            permit_ttl: PERMIT_TTL,
            sync: SyncMode::default(),
            on_redis_error: OnRedisError::default(),
        });
        rules.push(Rule {
            pattern: if name == "*" { Pattern::Default } else { Pattern::Exact },
            name,
            limits: r.limits,
            concurrency,
            breaker,
            shed_at_level: None,
            shed_priority: None,
            max_breakers: crate::DEFAULT_MAX_BREAKERS,
            overrides: Default::default(),
            origins: r.origins,
            usage: Vec::new(),
        });
    }
    if !out.errors.is_empty() {
        return Err(RuleErrors(out.errors));
    }
    let system = system.map(|mut s| {
        s.resources = rules.iter().filter(|r| r.pattern == Pattern::Exact).map(|r| r.name.clone()).collect();
        s
    });
    Ok(SentinelRules { rules, system, ignored: out.ignored, counts })
}

/// A rate of `r` a second, to the thousandth this server keeps rates to
/// (at least 0.001).
fn rate_of(r: f64) -> Rate {
    let r = ((r * 1000.0).round() / 1000.0).clamp(0.001, Rate::MAX_PER_SECOND);
    Rate::per_second(r).expect("a rate rounded to a thousandth, in range")
}

/// `r` a second, if a rate keeps it exactly (a whole number of thousandths:
/// 3 a second, 0.25; not 5 a minute, nor 5 a day).
fn exact_rate(r: f64) -> Option<Rate> {
    Rate::per_second(r).ok()
}

/// `n` whole, as Java's `(long)` truncates a double.
fn whole(count: f64) -> u64 {
    count.max(0.0) as u64
}

/// A limit every request it applies to is refused by (a threshold below one
/// call): a window of 0.
/// (Decided in memory, `sync: local`: it never needs Redis.)
fn deny_all() -> Algorithm {
    Algorithm::SlidingWindow(sliding_window::Config::new(0, 1_000_000_000))
}

fn limit(name: String, key: Vec<String>, algorithm: Algorithm, sync: SyncMode, when: Vec<Condition>) -> Limit {
    Limit {
        name,
        key,
        algorithm,
        sync,
        on_redis_error: OnRedisError::default(),
        shadow: false,
        fixed: false,
        history: false,
        lease: None,
        when,
        over_limit: None,
        cost: None,
        source: 0,
    }
}

fn flow(out: &mut Out<'_>, f: &Flow, others: &[String]) {
    let label = f.at.label(&f.resource);
    if f.regex {
        return out.ignore(label, "a regex resource is not read: Floodgate names resources exactly");
    }
    if f.strategy == 1 {
        return out.ignore(
            label,
            "strategy 1 (relate: limited by another resource's traffic) is not enforced: Floodgate counts a resource's own calls",
        );
    }
    if f.strategy > 2 {
        return out.ignore(label, "an unknown strategy: Sentinel applies no such rule");
    }
    let o = out.options;
    // Who the rule is for: `limitApp` on the origin descriptor; `chain` on the context one.
    let mut when = Vec::new();
    let mut key = Vec::new();
    let mut name = String::new();
    match f.limit_app.as_str() {
        "default" => {}
        "other" => {
            // Each origin no rule names on its own gets its own count.
            key.push(o.origin_key.clone());
            // An empty origin is no origin: not "other" (Sentinel's isOtherOrigin).
            let mut not = others.to_vec();
            not.push(String::new());
            when.push(Condition { key: o.origin_key.clone(), values: not, negate: true });
            name.push_str(" other");
        }
        app => {
            when.push(Condition { key: o.origin_key.clone(), values: vec![app.to_string()], negate: false });
            name.push_str(&format!(" {}={app}", o.origin_key));
        }
    }
    if f.strategy == 2 {
        when.push(Condition { key: o.context_key.clone(), values: vec![f.ref_resource.clone()], negate: false });
        name.push_str(&format!(" {}={}", o.context_key, f.ref_resource));
    }
    if f.grade == 0 {
        if !when.is_empty() || !key.is_empty() {
            return out.ignore(
                label,
                "a thread-count rule for one origin or context is not enforced: Floodgate's concurrency limit is the whole resource's",
            );
        }
        if f.count < 1.0 {
            // Sentinel refuses every call (1 thread > count): a kill switch.
            let l = limit(format!("threads{name}"), key, deny_all(), SyncMode::Local, when);
            return out.resource(&f.resource).push(l);
        }
        let n = whole(f.count).min(u64::from(u32::MAX)) as u32;
        let r = out.resource(&f.resource);
        r.concurrency = Some(r.concurrency.map_or(n, |m| m.min(n)));
        return;
    }
    if f.cluster && f.threshold_type == 0 {
        out.ignore(
            label.clone(),
            "clusterConfig.thresholdType 0 (per-instance average): the count is taken as the limit of every caller together",
        );
    }
    let behavior = match f.behavior {
        0..=3 => f.behavior,
        b => {
            out.ignore(label.clone(), &format!("controlBehavior {b} is read as 0 (reject), as Sentinel does"));
            0
        }
    };
    let too_short = |e: warm_up::ConfigError| format!("{e} (Sentinel would refuse every call, or admit every one)");
    // A rate above the largest a limit can keep is refused, as it is in
    // the rules file (not kept at that largest rate without a word).
    if behavior != 0 && f.count > Rate::MAX_PER_SECOND {
        return out.flow_error(
            f,
            "count",
            format!(
                "{} a second is above the largest supported rate ({} a second)",
                if f.count < 1e15 { f.count.to_string() } else { format!("{:e}", f.count) },
                Rate::MAX_PER_SECOND
            ),
        );
    }
    // A count below one call but above none would refuse every call, as in
    // Sentinel: written 0 it says so; written 0.0001 it is most likely a
    // mistake, refused rather than kept without a word. A count past the
    // largest limit a window keeps is refused, as in the rules file.
    if (behavior == 0 || behavior == 1) && f.count > 0.0 && f.count < 1.0 {
        return out.flow_error(
            f,
            "count",
            format!("{} a second admits no call at all (write 0 to refuse every call on purpose)", f.count),
        );
    }
    if behavior == 0 && f.count > crate::overrides::MAX_AMOUNT as f64 {
        return out.flow_error(
            f,
            "count",
            format!(
                "{} a second is above the largest supported limit ({} a second)",
                if f.count < 1e15 { f.count.to_string() } else { format!("{:e}", f.count) },
                crate::overrides::MAX_AMOUNT
            ),
        );
    }
    let (kind, algorithm, sync) = match behavior {
        0 | 1 if f.count < 1.0 => ("qps", deny_all(), SyncMode::Local),
        0 => (
            "qps",
            Algorithm::SlidingWindow(sliding_window::Config::new(whole(f.count), 1_000_000_000)),
            SyncMode::default(),
        ),
        1 => {
            let period = Duration::from_secs(f.warm_up_secs as u64);
            match warm_up::Config::new(rate_of(f.count), period, o.cold_factor, warm_up::Mode::Police) {
                Ok(c) => ("warm_up", Algorithm::WarmUp(c), SyncMode::default()),
                Err(e) => return out.flow_error(f, "warmUpPeriodSec", too_short(e)),
            }
        }
        2 if f.count == 0.0 => ("rate_limiter", deny_all(), SyncMode::Local),
        2 if f.count < 0.5 => {
            return out.flow_error(
                f,
                "count",
                format!(
                    "a rate limiter of {} a second: Sentinel fails to load it (1000 % round(count) = 1000 % 0)",
                    f.count
                ),
            );
        }
        2 => {
            let leak = rate_of(f.count);
            let max_wait = (f.max_queueing_ms as u64).saturating_mul(1_000_000);
            // Room for every caller that may wait: the queue is bounded by max_wait.
            let capacity = ((f.count * f.max_queueing_ms as f64 / 1000.0).ceil() as u64).saturating_add(1);
            let mode = leaky_bucket::Mode::Shape { max_wait: Some(max_wait) };
            (
                "rate_limiter",
                Algorithm::LeakyBucket(leaky_bucket::Config::new(capacity, leak, mode)),
                SyncMode::default(),
            )
        }
        _ => {
            let period = Duration::from_secs(f.warm_up_secs as u64);
            let Some(rate) = Some(rate_of(f.count)).filter(|_| f.count >= 1.0) else {
                return out.flow_error(
                    f,
                    "count",
                    format!("a warm up with a rate limiter of {} a second: Sentinel admits every call", f.count),
                );
            };
            let mode = warm_up::Mode::Shape { max_wait_ms: f.max_queueing_ms as u64 };
            match warm_up::Config::new(rate, period, o.cold_factor, mode) {
                // A shaping warm-up queues on one replica.
                Ok(c) => ("warm_up_rate_limiter", Algorithm::WarmUp(c), SyncMode::Local),
                Err(e) => return out.flow_error(f, "warmUpPeriodSec", too_short(e)),
            }
        }
    };
    let l = limit(format!("{kind}{name}"), key, algorithm, sync, when);
    out.resource(&f.resource).push(l);
}

fn param(out: &mut Out<'_>, p: &Param) {
    let label = p.at.label(&p.resource);
    if p.regex {
        return out.ignore(label, "a regex resource is not read: Floodgate names resources exactly");
    }
    if p.param_idx < 0 {
        return out.ignore(
            label,
            "a negative paramIdx counts from the end of the call's arguments, which Floodgate does not see: name the parameter by its index",
        );
    }
    if p.grade == 0 {
        return out.ignore(label, "a thread-count rule per parameter value is not enforced");
    }
    if p.grade != 1 {
        return out.ignore(label, &format!("grade {}: Sentinel limits nothing with it", p.grade));
    }
    let key = format!("{}{}", out.options.param_prefix, p.param_idx);
    let shape = p.behavior == 2;
    let duration = p.duration_secs as f64;
    // One limit for `count` per value, and one per listed value for its own
    // count; a value listed twice takes its last count (Sentinel keeps a map).
    let mut items: Vec<(String, u64)> = Vec::with_capacity(p.items.len());
    let mut at: HashMap<&str, usize> = HashMap::with_capacity(p.items.len());
    for (value, count) in &p.items {
        match at.get(value.as_str()) {
            Some(&i) => items[i].1 = *count as u64,
            None => {
                at.insert(value, items.len());
                items.push((value.clone(), *count as u64));
            }
        }
    }
    let listed: Vec<String> = items.iter().map(|(v, _)| v.clone()).collect();
    let mut limits = Vec::new();
    let base_when = match listed.is_empty() {
        true => Vec::new(),
        false => vec![Condition { key: key.clone(), values: listed, negate: true }],
    };
    limits.push((key.clone(), whole(p.count), base_when));
    for (value, count) in items {
        let when = vec![Condition { key: key.clone(), values: vec![value.clone()], negate: false }];
        limits.push((format!("{key}={value}"), count, when));
    }
    for (name, tokens, when) in limits {
        let sync = if tokens == 0 { SyncMode::Local } else { SyncMode::default() };
        let exact = exact_rate(tokens as f64 / duration);
        let algorithm = if tokens == 0 {
            deny_all()
        } else if exact.is_none() && tokens as f64 / duration < Rate::MAX_PER_SECOND {
            // A refill a rate cannot keep exactly (5 a minute, 5 a day): at
            // most the tokens (and burst) per `durationInSec`, counted over a
            // sliding window, which is closer to Sentinel's refill once a
            // whole duration has passed than a rate rounded would be.
            let most = if shape { tokens } else { tokens.saturating_add(p.burst as u64) };
            let window = (p.duration_secs as u64).saturating_mul(1_000_000_000);
            Algorithm::SlidingWindow(sliding_window::Config::new(most, window))
        } else if shape {
            let leak = rate_of(tokens as f64 / duration);
            let max_wait = p.max_queueing_ms as u64;
            let capacity = ((tokens as f64 / duration * max_wait as f64 / 1000.0).ceil() as u64).saturating_add(1);
            let mode = leaky_bucket::Mode::Shape { max_wait: Some(max_wait.saturating_mul(1_000_000)) };
            Algorithm::LeakyBucket(leaky_bucket::Config::new(capacity, leak, mode))
        } else {
            // Sentinel refills a value's tokens once `durationInSec` has passed,
            // by the whole periods elapsed; here they refill continuously.
            let refill = rate_of(tokens as f64 / duration);
            let capacity = tokens.saturating_add(p.burst as u64);
            Algorithm::TokenBucket(crate::limiter::token_bucket::Config::new(capacity, refill))
        };
        let l = limit(name, vec![key.clone()], algorithm, sync, when);
        out.resource(&p.resource).push(l);
    }
}

fn authority(out: &mut Out<'_>, a: &Authority) {
    let label = a.at.label(&a.resource);
    if a.regex {
        return out.ignore(label, "a regex resource is not read: Floodgate names resources exactly");
    }
    let allow = match a.strategy {
        0 => true,
        1 => false,
        s => {
            return out.ignore(
                label,
                &format!(
                    "strategy {s} is neither a white (0) nor a black (1) list: Sentinel lets every caller through"
                ),
            );
        }
    };
    let key = out.options.origin_key.clone();
    let r = out.resource(&a.resource);
    if r.origins.is_some() {
        return out.ignore(label, "a second authority rule of the resource: Sentinel keeps the first");
    }
    // Sentinel splits on commas and trims nothing.
    let values = a.limit_app.split(',').map(str::to_string).collect();
    r.origins = Some(Origins { key, allow, values });
}

/// The resource's breaker, from its degrade rules: one breaker per resource
/// here, so several rules must agree on the window, the wait and the
/// minimum; each grade gives its threshold.
fn breaker(out: &mut Out<'_>, resource: &str, rules: &[Degrade]) -> Option<BreakerConfig> {
    let first = rules.first()?;
    for d in &rules[1..] {
        let same = (d.stat_interval_ms, d.time_window, d.min_requests)
            == (first.stat_interval_ms, first.time_window, first.min_requests);
        if !same {
            out.error(
                &d.at.file,
                d.at.index,
                resource,
                "statIntervalMs",
                format!(
                    "this resource's degrade rules must share statIntervalMs, timeWindow and minRequestAmount \
                     (Floodgate keeps one breaker per resource); {}[{}] has {}, {}, {}",
                    first.at.file, first.at.index, first.stat_interval_ms, first.time_window, first.min_requests
                ),
            );
            return None;
        }
        let identical = |x: &Degrade| (x.grade, x.count, x.slow_ratio) == (d.grade, d.count, d.slow_ratio);
        if rules.iter().take_while(|x| !std::ptr::eq(*x, d)).any(|x| x.grade == d.grade && !identical(x)) {
            out.error(
                &d.at.file,
                d.at.index,
                resource,
                "grade",
                "a second degrade rule of the same grade on this resource: Floodgate keeps one threshold per grade",
            );
            return None;
        }
    }
    let mut b = BreakerConfig {
        failure_rate_threshold: BREAKER_OFF,
        slow_call_rate_threshold: BREAKER_OFF,
        failure_count_threshold: None,
        slow_call_duration: Duration::from_secs(3_600),
        window: WindowKind::Tumbling(first.stat_interval_ms as u32),
        minimum_calls: first.min_requests.min(i64::from(u32::MAX)) as u32,
        wait_in_open: Backoff::fixed(Duration::from_secs(first.time_window as u64)),
        half_open_calls: 1,
        max_wait_in_half_open: Duration::from_secs(60),
    };
    for d in rules {
        match d.grade {
            // Slow iff rt > round(count) ms; opens iff ratio > threshold, or == 1.0 at 1.0.
            0 => {
                b.slow_call_duration = Duration::from_millis((d.count + 0.5).floor() as u64);
                b.slow_call_rate_threshold = if d.slow_ratio >= 1.0 { 1.0 } else { d.slow_ratio.next_up() };
            }
            // Opens iff the exception ratio > count (never when count is 1).
            1 => b.failure_rate_threshold = if d.count >= 1.0 { BREAKER_OFF } else { d.count.next_up() },
            // Opens iff exceptions > count.
            _ => b.failure_count_threshold = Some(whole(d.count).saturating_add(1).min(u64::from(u32::MAX)) as u32),
        }
    }
    if b.failure_rate_threshold == BREAKER_OFF
        && b.slow_call_rate_threshold == BREAKER_OFF
        && b.failure_count_threshold.is_none()
    {
        out.ignore(
            first.at.label(resource),
            "an exception ratio of 1: the ratio is never above it, so the breaker never opens",
        );
        return None;
    }
    Some(b)
}

/// Sentinel's system rules: the least of each threshold (as Sentinel takes
/// them), on the system `sentinel`; CPU and the average response time have
/// signals here, the others are listed as ignored.
fn system(out: &mut Out<'_>, rules: &[System]) -> Option<SystemConfig> {
    let (mut cpu, mut rt): (Option<f64>, Option<i64>) = (None, None);
    for s in rules {
        let label = format!("{}[{}]", s.at.file, s.at.index);
        if s.cpu > 1.0 {
            out.ignore(label.clone(), &format!("highestCpuUsage {} is above 1: Sentinel ignores it", s.cpu));
        } else if s.cpu >= 0.0 {
            cpu = Some(cpu.map_or(s.cpu, |c| c.min(s.cpu)));
        }
        if s.avg_rt >= 0 {
            rt = Some(rt.map_or(s.avg_rt, |r| r.min(s.avg_rt)));
        }
        for (field, set) in
            [("qps", s.qps >= 0.0), ("maxThread", s.max_thread >= 0), ("highestSystemLoad", s.load >= 0.0)]
        {
            if set {
                out.ignore(
                    label.clone(),
                    &format!("{field} has no signal here (use a flow rule, a concurrency limit, or the cpu signal)"),
                );
            }
        }
    }
    if cpu.is_none() && rt.is_none() {
        return None;
    }
    let mut s = SystemConfig::named(SYSTEM);
    // Over a threshold, Sentinel refuses every inbound call: level 3 at once.
    s.cpu = cpu.map(|c| [c.max(f64::MIN_POSITIVE); 3]);
    s.memory = None;
    s.error_rate = None;
    s.latency = rt.map(|ms| (Percentile(0.5), [Duration::from_millis(ms as u64); 3]));
    s.min_time_at_level = Duration::ZERO;
    s.hysteresis = 1.0;
    s.shed_priority = PriorityShedding::DEFAULT;
    Some(s)
}
