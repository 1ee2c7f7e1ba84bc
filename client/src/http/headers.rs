//! Rate limit response fields: the IETF `RateLimit` and `RateLimit-Policy`
//! (draft-ietf-httpapi-ratelimit-headers, structured fields), the older
//! `X-RateLimit-Limit/-Remaining/-Reset`, and `Retry-After`.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};

use crate::decision::{Decision, Verdict};

fn secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Adds the rate limit fields of `d` to `headers`.
///
/// ```
/// use std::time::Duration;
/// use floodgate_client::{Decision, Verdict};
/// use floodgate_client::decision::Limit;
/// use floodgate_client::http::rate_limit_headers;
///
/// let limit = Limit::new("per-user", 10, Duration::from_secs(60))
///     .with_remaining(0)
///     .with_reset_after(Duration::from_secs(30))
///     .exceeded(Duration::from_millis(1500));
/// let d = Decision::new(Verdict::RateLimited).with_retry_after(Duration::from_millis(1500)).with_limit(limit);
/// let mut h = http::HeaderMap::new();
/// rate_limit_headers(&d, &mut h);
/// assert_eq!(h["ratelimit-policy"], r#""per-user";q=10;w=60"#);
/// assert_eq!(h["ratelimit"], r#""per-user";r=0;t=30"#);
/// assert_eq!(h["x-ratelimit-limit"], "10");
/// assert_eq!(h["x-ratelimit-remaining"], "0");
/// assert_eq!(h["x-ratelimit-reset"], "30");
/// assert_eq!(h["retry-after"], "2");
/// ```
pub fn rate_limit_headers(d: &Decision, headers: &mut HeaderMap) {
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    };
    if !d.limits.is_empty() {
        let policies: Vec<String> =
            d.limits.iter().map(|l| format!("\"{}\";q={};w={}", l.name, l.limit, secs(l.window).max(1))).collect();
        put("ratelimit-policy", policies.join(", "));
    }
    if let Some(l) = d.tightest() {
        put("ratelimit", format!("\"{}\";r={};t={}", l.name, l.remaining, secs(l.reset_after)));
        put("x-ratelimit-limit", l.limit.to_string());
        put("x-ratelimit-remaining", l.remaining.to_string());
        put("x-ratelimit-reset", secs(l.reset_after).to_string());
    }
    if !d.is_allowed() {
        put("retry-after", secs(d.retry_after).max(1).to_string());
    }
}

/// 429 for rate and concurrency limits, 503 for an open circuit or shedding.
pub fn denial_status(v: Verdict) -> StatusCode {
    match v {
        Verdict::RateLimited | Verdict::ConcurrencyLimited => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The small JSON body of a denial.
pub fn denial_body(d: &Decision) -> String {
    let error = match d.verdict {
        Verdict::RateLimited => "rate_limited",
        Verdict::ConcurrencyLimited => "concurrency_limited",
        Verdict::CircuitOpen => "circuit_open",
        Verdict::Shed => "shed",
        Verdict::Allowed => "allowed",
    };
    let reason = d.reason.replace('\\', "\\\\").replace('"', "\\\"");
    format!(r#"{{"error":"{error}","reason":"{reason}","retry_after_seconds":{}}}"#, secs(d.retry_after).max(1))
}
