//! Exact rate arithmetic.
//!
//! Rates are kept in thousandths of a unit per second, which is the same number as
//! picounits per nanosecond. Fractional amounts are kept in picounits. So a refill
//! over any elapsed time is an exact integer product: nothing is ever lost to
//! rounding, and a bucket refilled 0.4 token twice holds exactly 0.8 more.

use std::fmt;

/// Picounits per unit.
pub(crate) const PICO: u128 = 1_000_000_000_000;

/// A rate in units per second, exact to a thousandth of a unit per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Thousandths of a unit per second; equally, picounits per nanosecond.
    milli: u64,
}

/// An amount in whole units plus picounits, without the 16-byte alignment a
/// `u128` field would force on every bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Amount {
    whole: u64,
    pico: u64,
}

/// Why a number cannot be a rate.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RateError {
    #[error("must be a positive number, got {0}")]
    NotPositive(f64),
    #[error("{0} is below the smallest supported rate of 0.001 per second")]
    TooSmall(f64),
    #[error("{0} is above the largest supported rate of 1000000000 per second")]
    TooLarge(f64),
    #[error("{0} has more than 3 decimal places")]
    TooPrecise(f64),
}

// === impl Rate ===

impl Rate {
    pub const MAX_PER_SECOND: f64 = 1e9;

    /// A rate from units per second, refusing what cannot be represented exactly.
    pub fn per_second(r: f64) -> Result<Rate, RateError> {
        if !r.is_finite() || r <= 0.0 {
            return Err(RateError::NotPositive(r));
        }
        if r > Self::MAX_PER_SECOND {
            return Err(RateError::TooLarge(r));
        }
        let scaled = r * 1000.0;
        let milli = scaled.round();
        if milli < 1.0 {
            return Err(RateError::TooSmall(r));
        }
        if (scaled - milli).abs() > 1e-6 * scaled.max(1.0) {
            return Err(RateError::TooPrecise(r));
        }
        Ok(Rate { milli: milli as u64 })
    }

    /// A rate of `n` whole units per second.
    pub fn whole_per_second(n: u64) -> Rate {
        Rate { milli: n.saturating_mul(1000).max(1) }
    }

    pub fn as_f64(self) -> f64 {
        self.milli as f64 / 1000.0
    }

    /// Picounits gained over `nanos`.
    pub fn gain(self, nanos: u64) -> u128 {
        nanos as u128 * self.milli as u128
    }

    /// Nanoseconds until `pico` picounits have been gained, rounded up.
    pub fn time_for(self, pico: u128) -> u64 {
        let m = self.milli as u128;
        u64::try_from(pico.div_ceil(m)).unwrap_or(u64::MAX)
    }

    /// Picounits per nanosecond, for callers that keep time in 1/rate units.
    pub(crate) fn pico_per_nano(self) -> u64 {
        self.milli
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.as_f64())
    }
}

// === impl Amount ===

impl Amount {
    pub fn units(n: u64) -> Amount {
        Amount { whole: n, pico: 0 }
    }

    pub(crate) fn from_pico(p: u128) -> Amount {
        let whole = u64::try_from(p / PICO).unwrap_or(u64::MAX);
        Amount { whole, pico: (p % PICO) as u64 }
    }

    pub(crate) fn to_pico(self) -> u128 {
        self.whole as u128 * PICO + self.pico as u128
    }

    #[cfg(test)]
    fn whole(self) -> u64 {
        self.whole
    }
}

/// Whole units in a picounit amount, rounded down.
pub(crate) fn floor_units(pico: u128) -> u64 {
    u64::try_from(pico / PICO).unwrap_or(u64::MAX)
}

/// `n` whole units in picounits.
pub fn pico(n: u64) -> u128 {
    n as u128 * PICO
}

/// The shortest exact spelling of a duration, as the rules file writes it.
pub fn duration_text(d: std::time::Duration) -> String {
    let n = d.as_nanos();
    for (unit, per) in [
        ("d", 86_400_000_000_000u128),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if n >= per && n.is_multiple_of(per) {
            return format!("{}{unit}", n / per);
        }
    }
    format!("{n}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_exact_to_a_thousandth() {
        assert_eq!(Rate::per_second(100.0).unwrap().milli, 100_000);
        assert_eq!(Rate::per_second(0.5).unwrap().milli, 500);
        assert_eq!(Rate::per_second(0.001).unwrap().milli, 1);
        assert_eq!(Rate::per_second(33.333).unwrap().milli, 33_333);
        assert!(matches!(Rate::per_second(0.0), Err(RateError::NotPositive(_))));
        assert!(matches!(Rate::per_second(-1.0), Err(RateError::NotPositive(_))));
        assert!(matches!(Rate::per_second(0.0004), Err(RateError::TooSmall(_))));
        assert!(matches!(Rate::per_second(0.3333), Err(RateError::TooPrecise(_))));
        assert!(matches!(Rate::per_second(2e9), Err(RateError::TooLarge(_))));
    }

    #[test]
    fn gain_and_time_for_are_inverse_without_loss() {
        let r = Rate::per_second(3.0).unwrap();
        // One third of a second gains exactly one unit minus 1/3 ns worth.
        assert_eq!(r.gain(1_000_000_000), pico(3));
        assert_eq!(r.time_for(pico(1)), 333_333_334);
        // Two gains of 0.4 unit sum to exactly 0.8 unit.
        let r = Rate::per_second(1.0).unwrap();
        let a = r.gain(400_000_000) + r.gain(400_000_000);
        assert_eq!(a, pico(8) / 10);
    }

    #[test]
    fn amount_round_trips() {
        let p = pico(7) + 123;
        assert_eq!(Amount::from_pico(p).to_pico(), p);
        assert_eq!(Amount::from_pico(p).whole(), 7);
        assert_eq!(floor_units(pico(2) - 1), 1);
    }
}
