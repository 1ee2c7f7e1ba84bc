//! Durations as the rules file writes them: `250ms`, `1s`, `5m`, `1m30s`, `1.5s`.

use std::time::Duration;

/// Parses a duration with units: `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`, `d`.
/// Parts add up (`1m30s`); a part may have a decimal fraction (`1.5s`).
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration (write e.g. 250ms, 1s or 5m)".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("duration '{s}' needs a unit, e.g. {s}s or {s}ms"));
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos_per = match unit {
            "ns" => 1u128,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            _ => {
                return Err(format!("duration '{s}' has unknown unit '{unit}' (use ns, us, ms, s, m, h or d)"));
            }
        };
        total += scaled(num, nanos_per).ok_or_else(|| format!("duration '{s}' has a malformed number '{num}'"))?;
        rest = tail;
    }
    let nanos = u64::try_from(total).map_err(|_| format!("duration '{s}' is too long"))?;
    Ok(Duration::from_nanos(nanos))
}

/// `num` (digits with at most one dot) times `per`, exactly, rounding below 1 ns down.
fn scaled(num: &str, per: u128) -> Option<u128> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') || frac.len() > 18 {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_value: u128 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    let frac_scale = 10u128.pow(frac.len() as u32);
    int.checked_mul(per)?.checked_add(frac_value * per / frac_scale)
}

/// The shortest exact spelling of a duration, as the rules file writes it.
pub use crate::limiter::rate::duration_text as format;

/// A duration for people: `250ms`, `1.5s`, `11.809s`, `2m3s`, `40us`,
/// `1h`, `2h30m`, `30d`, `26d15h7m`; `0s` for zero. From an hour up, the
/// larger units are used, so that a calendar window reads as days and not as
/// thousands of minutes; from a day up, seconds are left out.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 if d.is_zero() => "0s".to_string(),
        0 => format!("{}us", d.as_micros().max(1)),
        1..=999 => format!("{ms}ms"),
        1000..=59_999 => {
            let text = format!("{:.3}", ms as f64 / 1000.0);
            format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => {
            let secs = d.as_secs();
            let (days, hours, minutes, seconds) =
                (secs / 86_400, (secs % 86_400) / 3_600, (secs % 3_600) / 60, secs % 60);
            let mut out = String::new();
            for (n, unit) in [(days, "d"), (hours, "h"), (minutes, "m")] {
                if n > 0 {
                    out.push_str(&format!("{n}{unit}"));
                }
            }
            if seconds > 0 && days == 0 {
                out.push_str(&format!("{seconds}s"));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_combinations() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0.1ms"), Ok(Duration::from_micros(100)));
        assert_eq!(parse("10us"), Ok(Duration::from_micros(10)));
        assert_eq!(parse("7ns"), Ok(Duration::from_nanos(7)));
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("5").unwrap_err().contains("needs a unit"));
        assert!(parse("5 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse("1..5s").unwrap_err().contains("malformed"));
        assert!(parse("ms").unwrap_err().contains("malformed"));
        assert!(parse("99999999999999d").unwrap_err().contains("too long"));
    }

    #[test]
    fn human_rounds_to_what_people_read() {
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(Duration::from_nanos(40_500)), "40us");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
        assert_eq!(human(Duration::from_nanos(11_809_133_052)), "11.809s");
        assert_eq!(human(Duration::from_secs(60)), "1m");
        assert_eq!(human(Duration::from_secs(123)), "2m3s");
        assert_eq!(human(Duration::from_secs(3_600)), "1h");
        assert_eq!(human(Duration::from_secs(3_600 + 44 * 60 + 16)), "1h44m16s");
        assert_eq!(human(Duration::from_secs(30 * 86_400)), "30d");
        // A calendar month's reset: seconds are noise at that scale.
        assert_eq!(human(Duration::from_secs(38_347 * 60 + 27)), "26d15h7m");
        assert_eq!(human(Duration::from_secs(86_400 + 5)), "1d");
    }

    #[test]
    fn formats_round_trip() {
        for text in ["250ms", "1s", "5m", "90s", "1h", "1d", "10us", "7ns"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
