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
        let policies: Vec<String> = d
            .limits
            .iter()
            .map(|l| {
                // A limit without a window (a balance of credits) has no
                // time over which its quota comes back: `w` is left out.
                if l.window.is_zero() {
                    return format!("\"{}\";q={}", l.name, l.limit);
                }
                let (quota, window) = policy(l.limit, l.window);
                format!("\"{}\";q={quota};w={window}", l.name)
            })
            .collect();
        put("ratelimit-policy", policies.join(", "));
    }
    if let Some(l) = d.tightest() {
        // A denied call's limit resets no sooner than the call may be tried
        // again: a decision made in the client (a local fail mode) knows the
        // retry time but not the reset time.
        let reset = match d.is_allowed() {
            true => secs(l.reset_after),
            false => secs(l.reset_after).max(secs(d.retry_after).max(1)),
        };
        put("ratelimit", format!("\"{}\";r={};t={reset}", l.name, l.remaining));
        put("x-ratelimit-limit", l.limit.to_string());
        put("x-ratelimit-remaining", l.remaining.to_string());
        put("x-ratelimit-reset", reset.to_string());
    }
    if !d.is_allowed() {
        put("retry-after", secs(d.retry_after).max(1).to_string());
    }
}

/// A limit's quota and window as `RateLimit-Policy` writes them: the window
/// in whole seconds, and the quota scaled to it. A window under a second, or
/// not a whole number of seconds (GCRA 500/s with a burst of 100 reports 100
/// units per 0.2 s), would otherwise be rounded up and the quota said for a
/// longer window than it holds for: 100 per second instead of 500.
fn policy(limit: u64, window: Duration) -> (u64, u64) {
    let whole = secs(window).max(1);
    let nanos = window.as_nanos();
    if nanos == 0 || nanos == u128::from(whole) * 1_000_000_000 {
        return (limit, whole);
    }
    let quota = u128::from(limit) * u128::from(whole) * 1_000_000_000 / nanos;
    (u64::try_from(quota).unwrap_or(u64::MAX), whole)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Limit;

    fn headers(d: &Decision) -> HeaderMap {
        let mut h = HeaderMap::new();
        rate_limit_headers(d, &mut h);
        h
    }

    #[test]
    fn a_window_under_a_second_is_said_per_second_with_its_quota_scaled() {
        // GCRA 500/s with a burst of 100: 100 units per 0.2 s.
        let limit = Limit::new("gcra", 100, Duration::from_millis(200)).with_remaining(100);
        let h = headers(&Decision::new(Verdict::Allowed).with_limit(limit));
        assert_eq!(h["ratelimit-policy"], r#""gcra";q=500;w=1"#);
        // 10 per 1.5 s is 13 (rounded down) per 2 s.
        let limit = Limit::new("odd", 10, Duration::from_millis(1500)).with_remaining(3);
        let h = headers(&Decision::new(Verdict::Allowed).with_limit(limit));
        assert_eq!(h["ratelimit-policy"], r#""odd";q=13;w=2"#);
    }

    #[test]
    fn a_limit_without_a_window_has_no_w_in_its_policy() {
        // A balance of 1,000 credits: nothing comes back with time.
        let limit = Limit::new("credits", 1000, Duration::ZERO).with_remaining(40);
        let h = headers(&Decision::new(Verdict::Allowed).with_limit(limit));
        assert_eq!(h["ratelimit-policy"], r#""credits";q=1000"#);
    }

    #[test]
    fn a_denial_without_a_reset_time_says_when_to_retry() {
        // As a local fail mode decides: a retry time, no reset time.
        let limit = Limit::new("local", 4, Duration::from_secs(1)).with_remaining(0);
        let d = Decision::new(Verdict::RateLimited).with_retry_after(Duration::from_millis(250)).with_limit(limit);
        let h = headers(&d);
        assert_eq!(h["ratelimit"], r#""local";r=0;t=1"#);
        assert_eq!(h["x-ratelimit-reset"], "1");
        assert_eq!(h["retry-after"], "1");
    }
}
