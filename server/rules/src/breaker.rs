//! Reads a `breaker:` block into a [`BreakerConfig`].

use std::time::Duration;

use floodgate_core::breaker::{Backoff, BreakerConfig, OFF, WindowKind};

use super::fields::Fields;

const MS: Duration = Duration::from_millis(1);

/// Reads a `breaker:` block.
pub(super) fn parse(f: &Fields<'_>) -> Option<BreakerConfig> {
    f.deny_unknown(&[
        "failure_rate_threshold",
        "slow_call_rate_threshold",
        "failure_count_threshold",
        "slow_call_duration",
        "window",
        "minimum_calls",
        "wait_in_open",
        "half_open_calls",
        "max_wait_in_half_open",
    ]);
    let rate = |key: &str, default: f64| match f.get(key) {
        Some(serde_yaml_ng::Value::String(s)) if s == "off" => Some(OFF),
        _ => match f.f64(key) {
            Some(r) if r > 0.0 && r <= 1.0 => Some(r),
            Some(r) => {
                f.error(key, format!("must be a rate above 0 and at most 1 (e.g. 0.5), or off, got {r}"));
                None
            }
            None => (!f.has(key)).then_some(default),
        },
    };
    let failure_rate_threshold = rate("failure_rate_threshold", 0.5);
    let slow_call_rate_threshold = rate("slow_call_rate_threshold", 1.0);
    let failure_count_threshold = match f.has("failure_count_threshold") {
        true => Some(f.u64_in("failure_count_threshold", 1, 1_000_000).map(|n| n as u32)),
        false => Some(None),
    };
    let slow_call_duration =
        or_default(f, "slow_call_duration", f.duration("slow_call_duration", MS), Duration::from_secs(60));
    let window = match f.nested("window") {
        Some(w) => parse_window(&w),
        None => (!f.has("window")).then_some(WindowKind::Count(100)),
    };
    let minimum_calls = or_default(f, "minimum_calls", f.u64_in("minimum_calls", 1, 1_000_000).map(|n| n as u32), 100);
    let wait_in_open = parse_backoff(f);
    let half_open_calls =
        or_default(f, "half_open_calls", f.u64_in("half_open_calls", 1, 10_000).map(|n| n as u32), 10);
    let max_wait =
        or_default(f, "max_wait_in_half_open", f.duration("max_wait_in_half_open", MS), Duration::from_secs(60));
    let window = window?;
    // As in resilience4j: a count window cannot hold more calls than its size.
    let minimum_calls = match window {
        WindowKind::Count(size) => minimum_calls?.min(size),
        WindowKind::Time(_) | WindowKind::Tumbling(_) => minimum_calls?,
    };
    let (failure_rate_threshold, slow_call_rate_threshold) = (failure_rate_threshold?, slow_call_rate_threshold?);
    let failure_count_threshold = failure_count_threshold?;
    if failure_rate_threshold == OFF && slow_call_rate_threshold == OFF && failure_count_threshold.is_none() {
        f.error("failure_rate_threshold", "every threshold is off: the breaker would never open");
        return None;
    }
    Some(BreakerConfig {
        failure_rate_threshold,
        slow_call_rate_threshold,
        failure_count_threshold,
        slow_call_duration: slow_call_duration?,
        window,
        minimum_calls,
        wait_in_open: wait_in_open?,
        half_open_calls: half_open_calls?,
        max_wait_in_half_open: max_wait?,
    })
}

/// `value` when the field was given (and valid), the default when it was absent.
fn or_default<T>(f: &Fields<'_>, key: &str, value: Option<T>, default: T) -> Option<T> {
    if f.has(key) { value } else { Some(default) }
}

fn parse_window(w: &Fields<'_>) -> Option<WindowKind> {
    match w.required("kind", |w, k| w.choice(k, &[("count", 0), ("time", 1), ("tumbling", 2)]))? {
        0 => {
            w.deny_unknown(&["kind", "size"]);
            w.required("size", |w, k| w.u64_in(k, 1, 10_000)).map(|n| WindowKind::Count(n as u32))
        }
        1 => {
            w.deny_unknown(&["kind", "seconds"]);
            w.required("seconds", |w, k| w.u64_in(k, 1, 3_600)).map(|n| WindowKind::Time(n as u32))
        }
        _ => {
            w.deny_unknown(&["kind", "length"]);
            let length = w.required("length", |w, k| w.duration(k, MS))?;
            if length > Duration::from_secs(3_600) {
                w.error("length", "must be at most 1h");
                return None;
            }
            Some(WindowKind::Tumbling(length.as_millis() as u32))
        }
    }
}

fn parse_backoff(f: &Fields<'_>) -> Option<Backoff> {
    const KEY: &str = "wait_in_open";
    match f.get(KEY) {
        None => Some(Backoff::fixed(Duration::from_secs(60))),
        Some(serde_yaml_ng::Value::String(_)) => f.duration(KEY, MS).map(Backoff::fixed),
        Some(_) => {
            let b = f.nested(KEY)?;
            b.deny_unknown(&["initial", "multiplier", "max"]);
            let initial = b.required("initial", |b, k| b.duration(k, MS));
            let multiplier = match b.f64("multiplier") {
                Some(m) if (1.0..=100.0).contains(&m) => Some(m),
                Some(m) => {
                    b.error("multiplier", format!("must be between 1 and 100, got {m}"));
                    None
                }
                None => (!b.has("multiplier")).then_some(1.0),
            };
            let max = b.duration("max", MS);
            let initial = initial?;
            let max = if b.has("max") { max? } else { initial.max(Duration::from_secs(300)) };
            if max < initial {
                b.error("max", "must not be shorter than initial");
                return None;
            }
            Some(Backoff { initial, multiplier: multiplier?, max })
        }
    }
}
