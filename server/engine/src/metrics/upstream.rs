//! envoyproxy/ratelimit's stats, as Prometheus sees them through the
//! statsd_exporter mapping upstream documents (`examples/prom-statsd-exporter`,
//! and the one its own Prometheus output embeds), so that dashboards and
//! alerts built on upstream keep working:
//!
//! - `ratelimit.service.rate_limit.DOMAIN.KEY1[.KEY2...].STAT` becomes
//!   `ratelimit_service_rate_limit_STAT{domain, key1[, key2]}` for STAT in
//!   `total_hits`, `over_limit`, `near_limit`, `within_limit` and
//!   `shadow_mode`: the stat key is cut at dots, and levels past the second
//!   add up into the series of the first two (the cardinality bound the
//!   mapping gives);
//! - `ratelimit_service_total_requests{grpc_method}`,
//!   `ratelimit_service_response_time_seconds{grpc_method}`,
//!   `ratelimit_service_should_rate_limit_error{err_type}`,
//!   `ratelimit_service_config_load_success` and `_error`.
//!
//! Counts are of hits (`hits_addend`), split as upstream splits them
//! between the near and over ranges, from what the counter held before
//! them. A denial takes nothing from the counter here (upstream's takes its
//! hits anyway), so after one the next hits split from a lower count than
//! upstream's would: counted within (and near) where upstream counts over.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use metrics::{counter, describe_counter, describe_histogram};

pub(crate) const TOTAL_HITS: &str = "ratelimit_service_rate_limit_total_hits";
pub const OVER_LIMIT: &str = "ratelimit_service_rate_limit_over_limit";
pub(crate) const NEAR_LIMIT: &str = "ratelimit_service_rate_limit_near_limit";
pub(crate) const WITHIN_LIMIT: &str = "ratelimit_service_rate_limit_within_limit";
pub const SHADOW_MODE: &str = "ratelimit_service_rate_limit_shadow_mode";
pub const TOTAL_REQUESTS: &str = "ratelimit_service_total_requests";
pub const RESPONSE_TIME: &str = "ratelimit_service_response_time_seconds";
pub const SHOULD_RATE_LIMIT_ERROR: &str = "ratelimit_service_should_rate_limit_error";
pub(crate) const CONFIG_LOAD_SUCCESS: &str = "ratelimit_service_config_load_success";
pub(crate) const CONFIG_LOAD_ERROR: &str = "ratelimit_service_config_load_error";

/// statsd_exporter's default histogram buckets (Prometheus's), which the
/// mapping's timers get.
pub const RESPONSE_TIME_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The label values of a stat key: `domain`, `key1`, and `key2` when the key
/// has a second level, after upstream's sanitising (`:` and `|` become `_`,
/// and so do the dots of anything shaped like an IPv4 address).
pub fn labels(key: &str) -> Vec<(&'static str, String)> {
    let key = sanitize(key);
    let mut parts = key.split('.');
    let mut out = vec![("domain", parts.next().unwrap_or_default().to_string())];
    for name in ["key1", "key2"] {
        match parts.next() {
            Some(p) => out.push((name, p.to_string())),
            None => break,
        }
    }
    out
}

/// The `domain` label of a domain's stat keys.
pub(crate) fn domain_label(domain: &str) -> String {
    labels(domain).swap_remove(0).1
}

/// Upstream's `SanitizeStatName`.
pub(crate) fn sanitize(key: &str) -> String {
    let mut out: Vec<u8> = key.bytes().map(|b| if b == b':' || b == b'|' { b'_' } else { b }).collect();
    let mut i = 0;
    while i < out.len() {
        match ipv4_at(&out, i) {
            Some(end) => {
                out[i..end].iter_mut().filter(|b| **b == b'.').for_each(|b| *b = b'_');
                i = end;
            }
            None => i += 1,
        }
    }
    String::from_utf8(out).expect("only ASCII bytes replaced by ASCII")
}

/// Where a match of `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` starting at `at`
/// ends, as a backtracking regex finds it (more digits first).
fn ipv4_at(s: &[u8], at: usize) -> Option<usize> {
    fn group(s: &[u8], at: usize, left: usize) -> Option<usize> {
        let digits = s[at.min(s.len())..].iter().take(3).take_while(|b| b.is_ascii_digit()).count();
        (1..=digits).rev().find_map(|n| {
            let end = at + n;
            if left == 0 {
                return Some(end);
            }
            (s.get(end) == Some(&b'.')).then(|| group(s, end + 1, left - 1)).flatten()
        })
    }
    group(s, at, 3)
}

/// The five counters of one series.
#[derive(Debug, Default)]
pub struct LimitStats {
    total_hits: AtomicU64,
    over_limit: AtomicU64,
    near_limit: AtomicU64,
    within_limit: AtomicU64,
    shadow_mode: AtomicU64,
}

impl LimitStats {
    /// One descriptor's hits (see [`Split::of`]).
    pub fn record(&self, limit: u64, before: u64, hits: u64, shadow: bool, near_ratio: f32) {
        let split = Split::of(limit, before, hits, near_ratio);
        let add = |c: &AtomicU64, n: u64| {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.total_hits, hits);
        add(&self.over_limit, split.over);
        add(&self.near_limit, split.near);
        add(&self.within_limit, split.within);
        if shadow {
            add(&self.shadow_mode, split.over);
        }
    }

    /// The counts, in the order of [`STATS`].
    fn values(&self) -> [u64; 5] {
        [&self.total_hits, &self.over_limit, &self.near_limit, &self.within_limit, &self.shadow_mode]
            .map(|c| c.load(Ordering::Relaxed))
    }
}

/// The per-descriptor stats, with their help, in the order
/// [`LimitStats::values`] gives them.
const STATS: [(&str, &str); 5] = [
    (TOTAL_HITS, "envoyproxy/ratelimit's total_hits: hits per descriptor stat key (domain, key1, key2)"),
    (OVER_LIMIT, "envoyproxy/ratelimit's over_limit: hits over the limit"),
    (NEAR_LIMIT, "envoyproxy/ratelimit's near_limit: hits past the near-limit ratio of the limit"),
    (WITHIN_LIMIT, "envoyproxy/ratelimit's within_limit: hits within the limit"),
    (SHADOW_MODE, "envoyproxy/ratelimit's shadow_mode: hits over a shadow-mode limit, answered OK"),
];

/// The default bound of request-dependent series.
pub const MAX_SERIES: usize = 10_000;

/// A series' labels and its counts.
type Sample = (Vec<(&'static str, String)>, [u64; 5]);

/// The `key1` of the series that takes what the bound keeps out.
pub(crate) const OVERFLOW: &str = "_overflow";

/// Every series of the per-descriptor stats, rendered by [`Registry::render`]
/// (not through the `metrics` recorder, which keeps a series forever): the
/// configuration's own (one per stat key that does not depend on the
/// request, kept while a configuration in force has it), and those of
/// stat keys that depend on the request (`detailed_metric`,
/// `value_to_metric`, a limit Envoy sends), at most `max` label sets; past
/// it, a domain's new keys count in its `key1="_overflow"` series.
///
/// A series that stays keeps counting across configurations; one that goes
/// (its limit left the configuration, or its domain did) is forgotten, and
/// starts again from 0 if it comes back (a counter reset to Prometheus).
#[derive(Debug)]
pub struct Registry {
    max: AtomicUsize,
    /// Series of request-dependent keys held (not the overflow ones).
    dynamic: AtomicUsize,
    /// Configurations installed so far: a request-dependent series is kept
    /// across an install only when a request used it since the one before.
    epoch: AtomicU64,
    by_labels: dashmap::DashMap<String, Entry>,
}

#[derive(Debug)]
struct Entry {
    labels: Vec<(&'static str, String)>,
    stats: Arc<LimitStats>,
    kind: Kind,
    /// The epoch a request last used it in.
    used: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Configured,
    Dynamic,
    Overflow,
}

/// The identity of a label set.
fn id_of(labels: &[(&'static str, String)]) -> String {
    labels.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>().join("\u{0}")
}

impl Registry {
    pub fn new(max: usize) -> Self {
        Registry {
            max: AtomicUsize::new(max),
            dynamic: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            by_labels: dashmap::DashMap::new(),
        }
    }

    /// Sets the bound of request-dependent series.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// The series of a configured stat key (one that does not depend on the
    /// request): kept until [`Registry::retain`] leaves it out.
    pub fn configured(&self, key: &str) -> Arc<LimitStats> {
        let labels = labels(key);
        let mut entry = self.by_labels.entry(id_of(&labels)).or_insert_with(|| Entry {
            labels,
            stats: Arc::default(),
            kind: Kind::Configured,
            used: AtomicU64::new(0),
        });
        if entry.kind == Kind::Dynamic {
            self.dynamic.fetch_sub(1, Ordering::Relaxed);
        }
        entry.kind = Kind::Configured;
        entry.stats.clone()
    }

    /// The series of a stat key that depends on the request.
    pub fn get(&self, key: &str) -> Arc<LimitStats> {
        let labels = labels(key);
        let id = id_of(&labels);
        let epoch = self.epoch.load(Ordering::Relaxed);
        let used = |e: &Entry| {
            if e.used.load(Ordering::Relaxed) != epoch {
                e.used.store(epoch, Ordering::Relaxed);
            }
            e.stats.clone()
        };
        if let Some(s) = self.by_labels.get(&id) {
            return used(&s);
        }
        let entry = |labels, kind| Entry { labels, stats: Arc::default(), kind, used: AtomicU64::new(epoch) };
        if self.dynamic.load(Ordering::Relaxed) >= self.max.load(Ordering::Relaxed) {
            let domain = labels[0].1.clone();
            let labels = vec![("domain", domain), ("key1", OVERFLOW.to_string())];
            return used(&self.by_labels.entry(id_of(&labels)).or_insert_with(|| entry(labels, Kind::Overflow)));
        }
        used(&self.by_labels.entry(id).or_insert_with(|| {
            self.dynamic.fetch_add(1, Ordering::Relaxed);
            entry(labels, Kind::Dynamic)
        }))
    }

    /// After a configuration is installed: keeps the configured series of
    /// `configured` stat keys only, and the others of the domains `domain`
    /// keeps that a request used since the configuration before (a series
    /// of a descriptor no longer configured is not used again).
    pub fn retain<'a>(&self, configured: impl IntoIterator<Item = &'a str>, domain: impl Fn(&str) -> bool) {
        let configured: std::collections::HashSet<String> =
            configured.into_iter().map(|key| id_of(&labels(key))).collect();
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed);
        self.by_labels.retain(|id, e| match e.kind {
            Kind::Configured => configured.contains(id),
            Kind::Dynamic | Kind::Overflow => domain(&e.labels[0].1) && e.used.load(Ordering::Relaxed) >= epoch,
        });
        let dynamic = self.by_labels.iter().filter(|e| e.kind == Kind::Dynamic).count();
        self.dynamic.store(dynamic, Ordering::Relaxed);
    }

    /// Label sets held (the overflow series included).
    pub fn len(&self) -> usize {
        self.by_labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_labels.is_empty()
    }

    /// The series in Prometheus's text format, each stat's in label order
    /// (nothing when there are none).
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let mut series: Vec<Sample> = self.by_labels.iter().map(|e| (e.labels.clone(), e.stats.values())).collect();
        if series.is_empty() {
            return;
        }
        series.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (i, (name, help)) in STATS.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, values) in &series {
                out.push_str(name);
                write_labels(out, labels.iter().map(|(n, v)| (*n, v.as_str())));
                let _ = writeln!(out, " {}", values[i]);
            }
            out.push('\n');
        }
    }
}

/// `{name="value",...}`, values escaped as the text format asks.
pub(crate) fn write_labels<'a>(out: &mut String, labels: impl Iterator<Item = (&'a str, &'a str)>) {
    out.push('{');
    for (i, (name, value)) in labels.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

/// How one descriptor's hits count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    pub over: u64,
    pub near: u64,
    pub within: u64,
}

impl Split {
    /// Hits against a limit of `limit` that held `before` (the count they
    /// would reach is `before + hits`), as upstream splits them: over the
    /// limit, every hit past it is over (and, in shadow mode, shadow) and
    /// the part of the near range it crossed is near; within it, every hit
    /// is within and the part past `near_ratio` of the limit is near too.
    pub fn of(limit: u64, before: u64, hits: u64, near_ratio: f32) -> Split {
        let after = before.saturating_add(hits);
        // As upstream computes it, in single precision.
        let near = (limit as f32 * near_ratio).floor() as u64;
        if after > limit {
            let over = if before >= limit { hits } else { after - limit };
            let near = if before >= limit { 0 } else { limit - near.max(before) };
            Split { over, near, within: 0 }
        } else {
            let near = match after > near {
                true if before >= near => hits,
                true => after - near,
                false => 0,
            };
            Split { over: 0, near, within: hits }
        }
    }
}

/// The service-wide series, registered at once so that they show at 0.
pub fn describe() {
    describe_counter!(TOTAL_REQUESTS, "envoyproxy/ratelimit's total_requests, by gRPC method");
    describe_histogram!(RESPONSE_TIME, metrics::Unit::Seconds, "envoyproxy/ratelimit's response_time, by gRPC method");
    describe_counter!(
        SHOULD_RATE_LIMIT_ERROR,
        "envoyproxy/ratelimit's should_rate_limit errors: service_error (a request refused), redis_error"
    );
    describe_counter!(
        CONFIG_LOAD_SUCCESS,
        "envoyproxy/ratelimit's config_load_success: Envoy configurations installed"
    );
    describe_counter!(CONFIG_LOAD_ERROR, "envoyproxy/ratelimit's config_load_error: Envoy configurations refused");
    for err_type in ["redis_error", "service_error"] {
        counter!(SHOULD_RATE_LIMIT_ERROR, "err_type" => err_type).absolute(0);
    }
    counter!(CONFIG_LOAD_SUCCESS).absolute(0);
    counter!(CONFIG_LOAD_ERROR).absolute(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_short_value_reads_like_another_values_digest_even_sanitised() {
        use crate::digest::{MAX_PLAIN, bounded, digest};
        let long = "v".repeat(MAX_PLAIN + 1);
        let d = digest(&long);
        assert_eq!(bounded(&long), d);
        // As a stat label sanitises it (`:` becomes `_`), or as it is.
        for spelled in [d.clone(), d.replace(':', "_"), d.replace(':', "|")] {
            let b = bounded(&spelled);
            assert_ne!(sanitize(&b), sanitize(&d), "{spelled}");
        }
        assert_eq!(bounded("#sha25"), "#sha25", "not a digest's start: as it is");
        assert_eq!(bounded("plain"), "plain");
    }

    #[test]
    fn keys_become_labels_as_the_statsd_mapping_cuts_them() {
        let l = |k: &str| labels(k).into_iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(",");
        assert_eq!(l("mongo_cps.database_users"), "domain=mongo_cps,key1=database_users");
        assert_eq!(l("rl.foo.bar"), "domain=rl,key1=foo,key2=bar");
        assert_eq!(l("rl.a_1.b_2.c_3"), "domain=rl,key1=a_1,key2=b_2", "deeper levels add up");
        assert_eq!(l("edge.remote_address_10.0.0.1"), "domain=edge,key1=remote_address_10_0_0_1");
        assert_eq!(l("d.k:v|w"), "domain=d,key1=k_v_w");
    }

    #[test]
    fn hits_split_as_upstreams_base_limiter_splits_them() {
        let split = |limit, before, hits| Split::of(limit, before, hits, 0.8);
        // A limit of 10 (near from 8), one hit at a time.
        let one_by_one: Vec<Split> = (0..12).map(|before| split(10, before, 1)).collect();
        let within = |near| Split { over: 0, near, within: 1 };
        assert_eq!(one_by_one[..8], [within(0); 8], "the first 8 are within and not near");
        assert_eq!(one_by_one[8..10], [within(1); 2], "the 9th and 10th are near");
        assert_eq!(one_by_one[10..], [Split { over: 1, near: 0, within: 0 }; 2]);
        // Upstream's TestGetResponseStatusOverLimit: limit 5 (near 4), from 2 to 7.
        assert_eq!(split(5, 2, 5), Split { over: 2, near: 1, within: 0 });
        // Crossing into the near range within the limit: only the part past it.
        assert_eq!(split(10, 6, 3), Split { over: 0, near: 1, within: 3 });
        // Checks (0 hits) count nothing, even over.
        assert_eq!(split(10, 10, 0), Split { over: 0, near: 0, within: 0 });
        // A limit of 0: every hit is over, none near.
        assert_eq!(split(0, 0, 3), Split { over: 3, near: 0, within: 0 });
        // Single precision, as upstream: 0.13 of 900 is 116 there (117 in double).
        assert_eq!(Split::of(900, 116, 1, 0.13), within(1));
    }

    #[test]
    fn series_past_the_bound_add_up_in_their_domains_overflow() {
        let series = Registry::new(3);
        let a = series.get("d.user_1");
        assert!(Arc::ptr_eq(&a, &series.get("d.user_1")));
        assert!(Arc::ptr_eq(&series.get("d.x.y.deeper"), &series.get("d.x.y.other")), "same labels");
        series.get("d.user_2");
        assert_eq!(series.len(), 3);
        let over = series.get("d.user_3");
        assert!(Arc::ptr_eq(&over, &series.get("d.user_4")), "one overflow series per domain");
        assert!(!Arc::ptr_eq(&over, &series.get("e.user_5")));
        assert_eq!(series.len(), 5, "the bound and one overflow series per domain");
        assert!(Arc::ptr_eq(&a, &series.get("d.user_1")), "known keys keep their series");
        let configured = series.configured("d.static");
        assert!(Arc::ptr_eq(&configured, &series.get("d.static")), "configured series are not bounded");
    }

    #[test]
    fn a_new_configuration_keeps_the_series_it_has_and_forgets_the_rest() {
        let series = Registry::new(2);
        let kept = series.configured("d.kept");
        let gone = series.configured("d.gone");
        let of_d = series.get("d.k_1");
        series.get("x.k_1");
        kept.record(10, 0, 1, false, 0.8);
        // The next configuration has d.kept and d.new, and no domain x.
        let new = series.configured("d.new");
        series.retain(["d.kept", "d.new"], |domain| domain == "d");
        assert!(Arc::ptr_eq(&kept, &series.configured("d.kept")), "counting on");
        assert!(Arc::ptr_eq(&new, &series.configured("d.new")));
        assert!(!Arc::ptr_eq(&gone, &series.configured("d.gone")), "forgotten, then new");
        assert!(Arc::ptr_eq(&of_d, &series.get("d.k_1")), "a kept domain's request series stays, used");
        series.retain(["d.kept"], |domain| domain == "d");
        assert_eq!(series.len(), 2, "d.kept and d.k_1 (used since the install before)");
        // Not used since: a request-dependent series goes at the next install.
        series.retain(["d.kept"], |domain| domain == "d");
        assert_eq!(series.len(), 1, "d.kept");
        series.get("d.k_1");
        // x's series went, and with it its place under the bound.
        let x2 = series.get("x.k_2");
        assert!(!Arc::ptr_eq(&x2, &series.get("x.k_3")), "room for two again, not the overflow");
        let mut text = String::new();
        series.render(&mut text);
        assert!(text.contains("ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"kept\"} 1\n"), "{text}");
        assert!(text.contains("ratelimit_service_rate_limit_within_limit{domain=\"d\",key1=\"kept\"} 1\n"), "{text}");
        assert_eq!(text.matches("# TYPE ratelimit_service_rate_limit_over_limit counter").count(), 1, "{text}");
        assert!(!text.contains("gone"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut text = String::new();
        write_labels(&mut text, [("a", "q\"b\\n\nl")].into_iter());
        assert_eq!(text, r#"{a="q\"b\\n\nl"}"#);
    }

    #[test]
    fn sanitizing_finds_addresses_as_a_backtracking_regex_does() {
        assert_eq!(sanitize("1234.5.6.7"), "1234_5_6_7");
        assert_eq!(sanitize("1.2.3.4567"), "1_2_3_4567");
        assert_eq!(sanitize("a.1.2.3.b"), "a.1.2.3.b");
        assert_eq!(sanitize("1.2.3.4.5.6.7.8"), "1_2_3_4.5_6_7_8");
        assert_eq!(sanitize("path_/v1.2.3.4/x"), "path_/v1_2_3_4/x");
    }
}
