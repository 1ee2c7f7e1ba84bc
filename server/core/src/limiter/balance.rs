//! A balance: units that never come back on their own, such as prepaid
//! credits. A key's balance starts at 0 and holds what an operator tops it
//! up with (up to `max`); a call takes its cost only if the balance holds
//! all of it. A charge takes its cost whatever the balance holds, so a
//! balance may go below 0: a debt, which the next top-up pays first.
//!
//! A balance has no window and no refill: its `reset_after` says only
//! whether the key holds anything ([`KEPT`] while it does, so that an idle
//! sweep never forgets credits), and a denial asks to retry after
//! [`RETRY`], as only a top-up can change the answer.

use super::{Decision, Limiter, Status, nanos};
use crate::time::Timestamp;

/// The `reset_after` of a balance that holds something (or owes): about a
/// hundred years, as it never resets.
pub const KEPT: u64 = 100 * 365 * 86_400 * 1_000_000_000;

/// The `retry_after` of a call a balance cannot pay: an hour, for want of
/// knowing when the next top-up comes.
pub const RETRY: u64 = 3_600 * 1_000_000_000;

/// The most a balance may hold, and the largest `max_balance`.
pub const MAX: u64 = 1_000_000_000_000_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The most the balance may hold; a top-up beyond it is refused.
    pub max: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Balance {
    /// What the balance holds; below 0 while it owes.
    units: i64,
}

impl Config {
    pub fn new(max: u64) -> Self {
        Config { max: max.clamp(1, MAX) }
    }
}

impl Balance {
    /// A balance holding `units` (below 0: owing).
    pub fn with_units(units: i64) -> Self {
        Balance { units }
    }

    /// What the balance holds now (below 0 while it owes).
    pub fn units(&self) -> i64 {
        self.units
    }
}

/// `cost` as a signed amount (costs are far below `i64::MAX`).
fn signed(cost: u64) -> i64 {
    i64::try_from(cost).unwrap_or(i64::MAX)
}

impl Limiter for Balance {
    type Config = Config;

    fn new(_cfg: &Config, _now: Timestamp) -> Self {
        Balance { units: 0 }
    }

    fn check(&self, cfg: &Config, _now: Timestamp, cost: u64) -> Decision {
        let admitted = self.units >= signed(cost);
        let after = if admitted { self.units - signed(cost) } else { self.units };
        Decision {
            admitted,
            status: Status {
                limit: cfg.max,
                remaining: u64::try_from(after).unwrap_or(0),
                reset_after: nanos(if after != 0 { KEPT } else { 0 }),
                retry_after: nanos(if admitted { 0 } else { RETRY }),
                wait: nanos(0),
                over_limit: false,
            },
        }
    }

    fn commit(&mut self, _cfg: &Config, _now: Timestamp, cost: u64) {
        self.units = self.units.saturating_sub(signed(cost));
    }

    /// Gives units back (a call that took them was settled lower) or tops
    /// the balance up: never beyond `max`.
    fn refund(&mut self, cfg: &Config, _now: Timestamp, cost: u64) {
        self.units = self.units.saturating_add(signed(cost)).min(signed(cfg.max));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_secs(1_700_000_000);

    #[test]
    fn a_balance_starts_empty_and_pays_only_what_it_holds() {
        let cfg = Config::new(1_000);
        let mut b = Balance::new(&cfg, NOW);
        let d = b.try_acquire(&cfg, NOW, 1);
        assert!(!d.admitted);
        assert_eq!((d.status.remaining, d.status.retry_after), (0, nanos(RETRY)));
        assert_eq!(d.status.reset_after, nanos(0), "an empty balance is as new: it may be forgotten");
        b.refund(&cfg, NOW, 300);
        assert!(b.try_acquire(&cfg, NOW, 200).admitted);
        let d = b.try_acquire(&cfg, NOW, 101);
        assert!(!d.admitted, "100 left: all or nothing");
        assert_eq!(d.status.remaining, 100);
        assert_eq!(d.status.reset_after, nanos(KEPT), "a balance that holds units is kept");
        // Time changes nothing.
        let later = NOW.add_nanos(KEPT / 2);
        assert_eq!(b.check(&cfg, later, 0).status.remaining, 100);
    }

    #[test]
    fn a_charge_goes_into_debt_and_a_top_up_pays_it_first() {
        let cfg = Config::new(1_000);
        let mut b = Balance::with_units(50);
        b.commit(&cfg, NOW, 80);
        assert_eq!(b.units(), -30);
        let d = b.check(&cfg, NOW, 0);
        assert_eq!((d.status.remaining, d.status.reset_after), (0, nanos(KEPT)), "a debt is never forgotten");
        b.refund(&cfg, NOW, 100);
        assert_eq!(b.units(), 70);
    }

    #[test]
    fn a_top_up_never_goes_beyond_the_most_the_balance_holds() {
        let cfg = Config::new(1_000);
        let mut b = Balance::with_units(900);
        b.refund(&cfg, NOW, 500);
        assert_eq!(b.units(), 1_000);
        assert_eq!(Config::new(u64::MAX).max, MAX);
    }
}
