//! Calendar windows for fixed-window limits: a day, an ISO week (from Monday),
//! a month or a year in an IANA time zone. "10,000 per month" resets at
//! midnight on the 1st where the customer is, whatever the month's length;
//! a day with a DST change lasts 23 or 25 hours.
//!
//! Every bucket of a limit shares one calendar, so the window in force is
//! computed once per window (and cached), not per decision.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use jiff::tz::TimeZone;
use jiff::{ToSpan, Zoned};

/// How long a calendar window is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s {
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// A typical length, in nanoseconds, for what needs one number (the
    /// policy window a client is told, a unit Envoy shows): 1, 7, 30 or 365 days.
    pub fn nominal(self) -> u64 {
        const DAY: u64 = 86_400_000_000_000;
        match self {
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }
}

/// A calendar window's unit and zone.
#[derive(Clone)]
pub struct Calendar {
    unit: Unit,
    /// The zone's name as the rules file writes it.
    zone: Arc<str>,
    tz: TimeZone,
    /// The window computed last, `[start, end)` in Unix nanoseconds.
    last: Arc<ArcSwap<(u64, u64)>>,
}

impl Calendar {
    /// `zone` is an IANA name (`Europe/Paris`, `America/New_York`, `UTC`).
    pub fn new(unit: Unit, zone: &str) -> Result<Calendar, String> {
        let tz =
            TimeZone::get(zone).map_err(|_| format!("'{zone}' is not an IANA time zone (e.g. Europe/Paris, UTC)"))?;
        Ok(Calendar { unit, zone: zone.into(), tz, last: Arc::new(ArcSwap::from_pointee((0, 0))) })
    }

    pub fn unit(&self) -> Unit {
        self.unit
    }

    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The window holding `now`: `[start, end)`, Unix nanoseconds.
    pub fn window(&self, now: u64) -> (u64, u64) {
        let last = **self.last.load();
        if last.0 <= now && now < last.1 {
            return last;
        }
        let w = self.compute(now);
        self.last.store(Arc::new(w));
        w
    }

    /// The end of the window that starts at `start`.
    pub fn end_of(&self, start: u64) -> u64 {
        let last = **self.last.load();
        if last.0 == start { last.1 } else { self.compute(start).1 }
    }

    fn compute(&self, now: u64) -> (u64, u64) {
        let fallback = (now, now.saturating_add(self.unit.nominal()));
        let Ok(at) = jiff::Timestamp::from_nanosecond(i128::from(now)) else { return fallback };
        let here = at.to_zoned(self.tz.clone());
        let start = match self.unit {
            Unit::Day => here.start_of_day(),
            Unit::Week => {
                let back = i64::from(here.weekday().to_monday_zero_offset());
                here.checked_sub(back.days()).and_then(|d| d.start_of_day())
            }
            Unit::Month => here.first_of_month().and_then(|d| d.start_of_day()),
            Unit::Year => here.first_of_year().and_then(|d| d.start_of_day()),
        };
        let Ok(start) = start else { return fallback };
        let next = match self.unit {
            Unit::Day => start.checked_add(1.day()),
            Unit::Week => start.checked_add(1.week()),
            Unit::Month => start.checked_add(1.month()),
            Unit::Year => start.checked_add(1.year()),
        }
        .and_then(|z| z.start_of_day());
        let Ok(next) = next else { return fallback };
        match (nanos(&start), nanos(&next)) {
            (Some(s), Some(e)) if s <= now && now < e => (s, e),
            _ => fallback,
        }
    }
}

fn nanos(z: &Zoned) -> Option<u64> {
    u64::try_from(z.timestamp().as_nanosecond()).ok()
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.unit == other.unit && self.zone == other.zone
    }
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Calendar({} in {})", self.unit.name(), self.zone)
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "calendar {} ({})", self.unit.name(), self.zone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix nanoseconds of a civil time in a zone.
    fn at(zone: &str, civil: &str) -> u64 {
        let dt: jiff::civil::DateTime = civil.parse().unwrap();
        let z = dt.to_zoned(TimeZone::get(zone).unwrap()).unwrap();
        nanos(&z).unwrap()
    }

    const HOUR: u64 = 3_600_000_000_000;

    #[test]
    fn months_of_every_length_end_at_local_midnight_on_the_first() {
        let c = Calendar::new(Unit::Month, "Europe/Paris").unwrap();
        for (inside, start, end, days) in [
            ("2026-01-31T23:59:59", "2026-01-01T00:00", "2026-02-01T00:00", 31),
            ("2026-02-14T12:00", "2026-02-01T00:00", "2026-03-01T00:00", 28),
            ("2028-02-29T00:00", "2028-02-01T00:00", "2028-03-01T00:00", 29),
            ("2026-04-01T00:00", "2026-04-01T00:00", "2026-05-01T00:00", 30),
        ] {
            let (s, e) = c.window(at("Europe/Paris", inside));
            assert_eq!((s, e), (at("Europe/Paris", start), at("Europe/Paris", end)), "{inside}");
            // March and October hold a DST change: a month is then an hour off.
            assert_eq!((e - s) / HOUR, days * 24, "{inside}");
        }
    }

    #[test]
    fn days_across_dst_changes_last_23_and_25_hours() {
        let c = Calendar::new(Unit::Day, "America/New_York").unwrap();
        let spring = c.window(at("America/New_York", "2026-03-08T12:00"));
        assert_eq!(spring, (at("America/New_York", "2026-03-08T00:00"), at("America/New_York", "2026-03-09T00:00")));
        assert_eq!(spring.1 - spring.0, 23 * HOUR);
        let fall = c.window(at("America/New_York", "2026-11-01T01:30"));
        assert_eq!(fall.1 - fall.0, 25 * HOUR);
        // Just before midnight: the window ends a minute later.
        let late = at("America/New_York", "2026-11-01T23:59");
        assert_eq!(c.window(late).1 - late, 60_000_000_000);
    }

    #[test]
    fn weeks_start_on_monday_and_years_on_january_first() {
        let week = Calendar::new(Unit::Week, "Asia/Tokyo").unwrap();
        // 2026-12-03 is a Thursday.
        assert_eq!(
            week.window(at("Asia/Tokyo", "2026-12-03T08:00")),
            (at("Asia/Tokyo", "2026-11-30T00:00"), at("Asia/Tokyo", "2026-12-07T00:00"))
        );
        let year = Calendar::new(Unit::Year, "UTC").unwrap();
        assert_eq!(
            year.window(at("UTC", "2026-12-31T23:59:59.999")),
            (at("UTC", "2026-01-01T00:00"), at("UTC", "2027-01-01T00:00"))
        );
        assert_eq!(year.end_of(at("UTC", "2025-01-01T00:00")), at("UTC", "2026-01-01T00:00"), "a past window's end");
    }

    #[test]
    fn unknown_zones_are_refused() {
        assert!(
            Calendar::new(Unit::Day, "Mars/Olympus").unwrap_err().contains("'Mars/Olympus' is not an IANA time zone")
        );
    }
}
