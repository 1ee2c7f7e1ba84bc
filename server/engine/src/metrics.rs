//! Prometheus metrics: every name Floodgate exports and its help text. The
//! server installs the recorder and describes them with [`describe`]. Decision
//! counters are resolved once per rule when rules are installed
//! (`engine::counters`), so that the hot path only adds to an atomic. Labels use
//! the rule's name as `resource`, which keeps cardinality bounded by the rules
//! file even when a glob rule matches unboundedly many resources.
//!
//! Nothing here knows the engine: the layers above read their state and set
//! the gauges at scrape time.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge};

pub(crate) const DECISIONS: &str = "floodgate_decisions_total";
pub(crate) const LIMIT_DECISIONS: &str = "floodgate_limit_decisions_total";
pub const RPC_DURATION: &str = "floodgate_rpc_duration_seconds";
pub const RPC_REQUESTS: &str = "floodgate_rpc_requests_total";
pub const KEYS: &str = "floodgate_keys";
pub const MAX_KEYS: &str = "floodgate_max_keys";
pub(crate) const KEY_BYTES: &str = "floodgate_key_bytes";
pub const MAX_KEY_BYTES: &str = "floodgate_max_key_bytes";
pub(crate) const EVICTIONS: &str = "floodgate_evictions_total";
pub(crate) const RULE_RELOADS: &str = "floodgate_rule_reloads_total";
pub(crate) const RULES_VERSION: &str = "floodgate_rules_version";
pub const RULES_RELOAD_FAILING: &str = "floodgate_rules_reload_failing";
pub const RESIDENT_MEMORY: &str = "floodgate_process_resident_memory_bytes";
pub const BREAKER_STATE: &str = "floodgate_breaker_state";
pub const BREAKERS: &str = "floodgate_breakers";
pub(crate) const BREAKER_TRANSITIONS: &str = "floodgate_breaker_transitions_total";
pub const BREAKER_FAILURE_RATE: &str = "floodgate_breaker_failure_rate";
pub const BREAKER_SLOW_CALL_RATE: &str = "floodgate_breaker_slow_call_rate";
pub const BREAKER_NOT_PERMITTED: &str = "floodgate_breaker_not_permitted_total";
pub(crate) const OUTCOMES: &str = "floodgate_outcomes_total";
pub const PERMITS_IN_FLIGHT: &str = "floodgate_permits_in_flight";
pub(crate) const PERMITS_EXPIRED: &str = "floodgate_permits_expired_total";
pub const DEGRADATION_LEVEL: &str = "floodgate_degradation_level";
pub const SYSTEM_SIGNAL: &str = "floodgate_system_signal";
pub const SYSTEM_INSTANCES: &str = "floodgate_system_instances";
pub const LOAD_REPORTS: &str = "floodgate_load_reports_total";
pub const REDIS_RTT: &str = "floodgate_redis_rtt_seconds";
pub const REDIS_ERRORS: &str = "floodgate_redis_errors_total";
pub const REDIS_SYNC_DURATION: &str = "floodgate_redis_sync_duration_seconds";
pub const REDIS_SYNC_LAG: &str = "floodgate_redis_sync_lag_seconds";
pub const LIVE_REPLICAS: &str = "floodgate_live_replicas";
pub const REDIS_ESCALATIONS: &str = "floodgate_redis_escalations_total";
pub const REPORTS_FORWARDED: &str = "floodgate_reports_forwarded_total";
pub const REDIS_LATE: &str = "floodgate_redis_late_total";
pub const REDIS_RESTORES: &str = "floodgate_redis_restores_total";
pub const REMEMBERED_BUCKETS: &str = "floodgate_redis_remembered_buckets";
pub const REDIS_IDENTITY_CHANGES: &str = "floodgate_redis_identity_changes_total";
pub const REDIS_DEBTS_PAID: &str = "floodgate_redis_debts_paid_total";
pub const REDIS_MESSAGES_UNREADABLE: &str = "floodgate_redis_messages_unreadable_total";
pub const RULES_DIFFER: &str = "floodgate_rules_differing_replicas";
pub const CONNECTIONS: &str = "floodgate_connections";
pub const WATCH_STREAMS: &str = "floodgate_watch_streams";
pub const CONNECTIONS_REJECTED: &str = "floodgate_connections_rejected_total";
pub const REQUESTS_TIMED_OUT: &str = "floodgate_requests_timed_out_total";
pub const RLS_GLOBAL_SHADOW: &str = "floodgate_rls_global_shadow_total";
pub(crate) const RLS_OVERRIDES_REFUSED: &str = "floodgate_rls_overrides_refused_total";
pub const RLQS_BUCKETS_ABANDONED: &str = "floodgate_rlqs_buckets_abandoned_total";
pub const OVERRIDES: &str = "floodgate_overrides";
pub const LEASES: &str = "floodgate_leases_total";
pub const LEASED_UNITS: &str = "floodgate_leased_units_total";
pub const CONCURRENCY_LIMIT: &str = "floodgate_concurrency_limit";
pub const CONCURRENCY_IN_FLIGHT: &str = "floodgate_concurrency_in_flight";
pub const ADAPTIVE_LATENCY: &str = "floodgate_adaptive_latency_seconds";
pub const ADAPTIVE_GRADIENT: &str = "floodgate_adaptive_gradient";
pub const ADAPTIVE_QUEUE: &str = "floodgate_adaptive_queue";
pub const ADAPTIVE_PROBING: &str = "floodgate_adaptive_probing";
pub const ENVOY_XDS_CONNECTED: &str = "floodgate_envoy_xds_connected";
pub(crate) const ENVOY_XDS_UPDATES: &str = "floodgate_envoy_xds_updates_total";
pub(crate) const ENVOY_CONFIG_INFO: &str = "floodgate_envoy_config_info";

/// The resource label of requests that no rule matched.
pub(crate) const UNMATCHED: &str = "_unmatched";
/// The resource (and limit) label of decisions of the Envoy configuration's
/// limits.
pub const ENVOY: &str = "_envoy";

/// Describes every metric to the recorder installed (help text and unit).
pub fn describe() {
    describe_counter!(DECISIONS, "Decisions by resource (rule), verdict, and the limit that denied (empty if none)");
    describe_counter!(
        LIMIT_DECISIONS,
        "Matched limits by resource (rule), limit and result (admitted, exceeded, shadow_exceeded, or exceeded_admitted: admitted over the limit by over_limit)"
    );
    describe_histogram!(RPC_DURATION, metrics::Unit::Seconds, "gRPC call latency inside the server, by method");
    describe_counter!(RLS_GLOBAL_SHADOW, "RLS answers turned OK by the global shadow mode (--envoy-shadow-mode)");
    describe_counter!(
        RLS_OVERRIDES_REFUSED,
        "RLS descriptor limits (overrides) not honoured: too many distinct sizes; the configured limit applied"
    );
    describe_counter!(
        RLQS_BUCKETS_ABANDONED,
        "RLQS buckets Envoy was told to abandon (it then applies its no_assignment_behavior): the stream held as many as it may"
    );
    describe_counter!(RPC_REQUESTS, "gRPC calls by method and status code");
    describe_gauge!(KEYS, "Buckets held in memory");
    describe_counter!(LEASES, "Lease requests by result: granted, empty (nothing available) or not_leasable");
    describe_counter!(LEASED_UNITS, "Units handed out in leases");
    describe_gauge!(MAX_KEYS, "--max-keys: the most buckets held before the least recently used are evicted");
    describe_gauge!(KEY_BYTES, "Bytes of the bucket keys held (their resources and descriptor values)");
    describe_gauge!(
        MAX_KEY_BYTES,
        "--max-key-bytes: the most bytes of bucket keys held before the least recently used are evicted"
    );
    describe_gauge!(OVERRIDES, "Overrides set at run time (Admin SetOverrides), expired ones not yet removed included");
    describe_counter!(EVICTIONS, "Buckets evicted: idle ones and least recently used ones beyond --max-keys");
    describe_counter!(RULE_RELOADS, "Rule loads by source and result (success or failure)");
    describe_gauge!(RULES_VERSION, "Version of the rules in force");
    describe_gauge!(
        RULES_RELOAD_FAILING,
        "1 while the last rules a source (file, redis, envoy, sentinel) offered were refused, 0 after one is installed"
    );
    describe_gauge!(RESIDENT_MEMORY, metrics::Unit::Bytes, "Resident set size of the server process");
    describe_gauge!(
        BREAKER_STATE,
        "Breaker state: 1 CLOSED, 2 OPEN, 3 HALF_OPEN, 4 FORCED_OPEN, 5 DISABLED, 6 METRICS_ONLY"
    );
    describe_gauge!(BREAKERS, "Breakers in memory by rule and state");
    describe_counter!(BREAKER_TRANSITIONS, "Breaker transitions by resource (rule), from and to");
    describe_gauge!(BREAKER_FAILURE_RATE, "Failure rate in the breaker's window");
    describe_gauge!(BREAKER_SLOW_CALL_RATE, "Slow-call rate in the breaker's window");
    describe_counter!(BREAKER_NOT_PERMITTED, "Acquires rejected by the breaker");
    describe_counter!(OUTCOMES, "Reported outcomes by resource (rule), outcome and result (counted, unknown, expired)");
    describe_gauge!(PERMITS_IN_FLIGHT, "Permits handed out and not yet returned or expired");
    describe_gauge!(CONCURRENCY_LIMIT, "A concurrency limit now (an adaptive limit's latest), by resource");
    describe_gauge!(
        CONCURRENCY_IN_FLIGHT,
        "Calls in flight on this replica under a concurrency limit, by resource and priority"
    );
    describe_gauge!(
        ADAPTIVE_LATENCY,
        metrics::Unit::Seconds,
        "An adaptive limit's latencies at its last update: short (the window's mean), long (Gradient2), no_load (Vegas), min (measured at the probe's floor)"
    );
    describe_gauge!(ADAPTIVE_GRADIENT, "Gradient2's gradient at its last update (long over short latency, 0.5 to 1)");
    describe_gauge!(ADAPTIVE_QUEUE, "Vegas's estimated queue at its last update");
    describe_gauge!(
        ADAPTIVE_PROBING,
        "1 while an adaptive limit is held at its probe's floor to measure the no-load latency, else 0"
    );
    describe_counter!(PERMITS_EXPIRED, "Permits never reported, freed when their TTL passed");
    describe_gauge!(
        DEGRADATION_LEVEL,
        "Degradation level in force (0 to 3), by system (global: the resources no system lists)"
    );
    describe_gauge!(
        SYSTEM_SIGNAL,
        "A system's signals as last evaluated: error_rate, slow_call_rate, latency_seconds, cpu, memory, queue_delay_seconds"
    );
    describe_gauge!(SYSTEM_INSTANCES, "Instances of a system that reported their load within its instance_timeout");
    describe_counter!(LOAD_REPORTS, "ReportLoad calls, by result (counted, refused_full, invalid)");
    describe_histogram!(REDIS_RTT, metrics::Unit::Seconds, "Redis round trips by operation");
    describe_counter!(REDIS_ERRORS, "Redis calls that failed, by operation and kind (timeout, error, not_connected)");
    describe_histogram!(REDIS_SYNC_DURATION, metrics::Unit::Seconds, "One round of the replication sync");
    describe_gauge!(REDIS_SYNC_LAG, metrics::Unit::Seconds, "Time since the last complete sync with Redis");
    describe_gauge!(LIVE_REPLICAS, "Replicas registered in Redis with a live heartbeat");
    describe_gauge!(
        RULES_DIFFER,
        "Live replicas whose rules (file, Sentinel, Envoy configuration) differ from this replica's"
    );
    describe_counter!(REDIS_ESCALATIONS, "Replicated decisions sent to Redis because this replica's lease was short");
    describe_counter!(
        REPORTS_FORWARDED,
        "Reports of permits another replica issued, passed on to it (result: answered, unanswered, undelivered, refused, dropped)"
    );
    describe_counter!(REDIS_LATE, "Strict decisions Redis ran after their deadline (changing nothing) and asked again");
    describe_counter!(REDIS_RESTORES, "Resources whose state Redis had lost, restored from what this replica knew");
    describe_gauge!(
        REMEMBERED_BUCKETS,
        "Buckets no longer in use whose last figure this replica keeps, to restore them should Redis lose its data"
    );
    describe_counter!(
        REDIS_IDENTITY_CHANGES,
        "Times Redis answered as another process (a restart or a failover): every known resource is checked"
    );
    describe_counter!(
        REDIS_DEBTS_PAID,
        "Strict buckets charged in Redis with what this replica admitted (or was charged) while Redis was away"
    );
    describe_counter!(
        REDIS_MESSAGES_UNREADABLE,
        "Messages from other replicas that could not be read (a newer version's, or damaged), ignored"
    );
    describe_gauge!(ENVOY_XDS_CONNECTED, "1 while the xDS stream to the control plane (--envoy-xds) is up");
    describe_counter!(
        ENVOY_XDS_UPDATES,
        "Envoy configurations from the xDS control plane, by result (accepted, rejected)"
    );
    upstream::describe();
    describe_gauge!(CONNECTIONS, "Connections open, by port");
    describe_gauge!(WATCH_STREAMS, "Watch streams open");
    describe_counter!(
        CONNECTIONS_REJECTED,
        "Connections closed at once because the port's --max-connections was reached"
    );
    describe_counter!(
        REQUESTS_TIMED_OUT,
        "gRPC calls ended because their request did not arrive whole within --request-timeout"
    );
}

/// A rules reload, good or bad.
pub fn rule_reload(source: &'static str, ok: bool, version: u64) {
    counter!(RULE_RELOADS, "source" => source, "result" => if ok { "success" } else { "failure" }).increment(1);
    gauge!(RULES_VERSION).set(version as f64);
    // Rules applied through Admin are refused to the operator who sent
    // them, who sees the error at once. Rules read in the background (a
    // file, Redis, Envoy's control plane, a Sentinel directory) are refused
    // with nobody watching: the server keeps the old rules, and this gauge
    // stays at 1 until that source offers rules that are installed.
    if source != "admin" {
        gauge!(RULES_RELOAD_FAILING, "source" => source).set(if ok { 0.0 } else { 1.0 });
    }
    if source == "envoy" {
        counter!(if ok { upstream::CONFIG_LOAD_SUCCESS } else { upstream::CONFIG_LOAD_ERROR }).increment(1);
    }
}

/// An update from the xDS control plane, ACKed or NACKed.
pub fn xds_update(accepted: bool) {
    counter!(ENVOY_XDS_UPDATES, "result" => if accepted { "accepted" } else { "rejected" }).increment(1);
}

/// The longest control plane version shown as it is; a longer one (or one
/// with control characters) is shown as its digest.
const MAX_VERSION_LABEL: usize = 128;

/// The Envoy configuration in force, at scrape time: where it came from
/// and the control plane's version of it. One series, the one in force
/// (rendered here: the recorder would keep every version's).
pub fn render_envoy_config_info(source: &str, version: &str, out: &mut String) {
    if source.is_empty() {
        return;
    }
    let version = match version.len() > MAX_VERSION_LABEL || version.chars().any(char::is_control) {
        true => std::borrow::Cow::Owned(crate::digest::digest(version)),
        false => std::borrow::Cow::Borrowed(version),
    };
    out.push_str(&format!(
        "# HELP {ENVOY_CONFIG_INFO} The Envoy configuration in force: its source (directory or xDS URL) and the control plane's version\n# TYPE {ENVOY_CONFIG_INFO} gauge\n{ENVOY_CONFIG_INFO}"
    ));
    upstream::write_labels(out, [("source", source), ("version", &*version)].into_iter());
    out.push_str(" 1\n\n");
}

/// Values read at scrape time rather than kept up to date on the hot path.
pub fn scrape_time(keys: usize, key_bytes: usize, evicted: u64) {
    gauge!(KEYS).set(keys as f64);
    gauge!(KEY_BYTES).set(key_bytes as f64);
    counter!(EVICTIONS).absolute(evicted);
    if let Some(rss) = resident_memory() {
        gauge!(RESIDENT_MEMORY).set(rss as f64);
    }
}

/// The process's resident set size, from /proc (Linux only).
pub(crate) fn resident_memory() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The `system` label of a degradation scope: its name, `global` for the
/// resources no system lists (no system may be named `global`).
pub fn system_label(system: &str) -> String {
    if system.is_empty() { "global".to_string() } else { system.to_string() }
}

pub mod upstream;
