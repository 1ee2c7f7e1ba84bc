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
//! between the near and over ranges.

use metrics::{Counter, counter, describe_counter, describe_histogram};

pub const TOTAL_HITS: &str = "ratelimit_service_rate_limit_total_hits";
pub const OVER_LIMIT: &str = "ratelimit_service_rate_limit_over_limit";
pub const NEAR_LIMIT: &str = "ratelimit_service_rate_limit_near_limit";
pub const WITHIN_LIMIT: &str = "ratelimit_service_rate_limit_within_limit";
pub const SHADOW_MODE: &str = "ratelimit_service_rate_limit_shadow_mode";
pub const TOTAL_REQUESTS: &str = "ratelimit_service_total_requests";
pub const RESPONSE_TIME: &str = "ratelimit_service_response_time_seconds";
pub const SHOULD_RATE_LIMIT_ERROR: &str = "ratelimit_service_should_rate_limit_error";
pub const CONFIG_LOAD_SUCCESS: &str = "ratelimit_service_config_load_success";
pub const CONFIG_LOAD_ERROR: &str = "ratelimit_service_config_load_error";

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

/// Upstream's `SanitizeStatName`.
pub fn sanitize(key: &str) -> String {
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
#[derive(Clone, Debug)]
pub struct LimitStats {
    total_hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
}

impl LimitStats {
    /// The series of a stat key (`edge.remote_address`).
    pub fn new(key: &str) -> Self {
        Self::with_labels(&labels(key))
    }

    fn with_labels(labels: &[(&'static str, String)]) -> Self {
        LimitStats {
            total_hits: counter!(TOTAL_HITS, labels),
            over_limit: counter!(OVER_LIMIT, labels),
            near_limit: counter!(NEAR_LIMIT, labels),
            within_limit: counter!(WITHIN_LIMIT, labels),
            shadow_mode: counter!(SHADOW_MODE, labels),
        }
    }

    /// One descriptor's hits (see [`Split::of`]).
    pub fn record(&self, limit: u64, before: u64, hits: u64, shadow: bool, near_ratio: f32) {
        let split = Split::of(limit, before, hits, near_ratio);
        self.total_hits.increment(hits);
        self.over_limit.increment(split.over);
        self.near_limit.increment(split.near);
        self.within_limit.increment(split.within);
        if shadow {
            self.shadow_mode.increment(split.over);
        }
    }
}

/// Series of stat keys that depend on the request (`detailed_metric`,
/// `value_to_metric`, a limit Envoy sends): at most `max` label sets; past
/// it, a domain's new keys count in its `key1="_overflow"` series.
#[derive(Debug)]
pub struct Series {
    max: usize,
    by_labels: dashmap::DashMap<String, std::sync::Arc<LimitStats>>,
}

/// The `key1` of the series that takes what the bound keeps out.
pub const OVERFLOW: &str = "_overflow";

impl Series {
    pub fn new(max: usize) -> Self {
        Series { max, by_labels: dashmap::DashMap::new() }
    }

    /// The series of a stat key.
    pub fn get(&self, key: &str) -> std::sync::Arc<LimitStats> {
        let labels = labels(key);
        let id: String = labels.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>().join("\u{0}");
        if let Some(s) = self.by_labels.get(&id) {
            return s.clone();
        }
        if self.by_labels.len() >= self.max {
            let domain = &labels[0].1;
            let overflow = format!("{domain}\u{0}{OVERFLOW}");
            return self
                .by_labels
                .entry(overflow)
                .or_insert_with(|| std::sync::Arc::new(LimitStats::new(&format!("{domain}.{OVERFLOW}"))))
                .clone();
        }
        self.by_labels.entry(id).or_insert_with(|| std::sync::Arc::new(LimitStats::with_labels(&labels))).clone()
    }

    /// Label sets held (the overflow series included).
    pub fn len(&self) -> usize {
        self.by_labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_labels.is_empty()
    }
}

/// How one descriptor's hits count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
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
    describe_counter!(
        TOTAL_HITS,
        "envoyproxy/ratelimit's total_hits: hits per descriptor stat key (domain, key1, key2)"
    );
    describe_counter!(OVER_LIMIT, "envoyproxy/ratelimit's over_limit: hits over the limit");
    describe_counter!(NEAR_LIMIT, "envoyproxy/ratelimit's near_limit: hits past the near-limit ratio of the limit");
    describe_counter!(WITHIN_LIMIT, "envoyproxy/ratelimit's within_limit: hits within the limit");
    describe_counter!(SHADOW_MODE, "envoyproxy/ratelimit's shadow_mode: hits over a shadow-mode limit, answered OK");
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
        let series = Series::new(3);
        let a = series.get("d.user_1");
        assert!(std::sync::Arc::ptr_eq(&a, &series.get("d.user_1")));
        assert!(std::sync::Arc::ptr_eq(&series.get("d.x.y.deeper"), &series.get("d.x.y.other")), "same labels");
        series.get("d.user_2");
        assert_eq!(series.len(), 3);
        let over = series.get("d.user_3");
        assert!(std::sync::Arc::ptr_eq(&over, &series.get("d.user_4")), "one overflow series per domain");
        assert!(!std::sync::Arc::ptr_eq(&over, &series.get("e.user_5")));
        assert_eq!(series.len(), 5, "the bound and one overflow series per domain");
        assert!(std::sync::Arc::ptr_eq(&a, &series.get("d.user_1")), "known keys keep their series");
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
