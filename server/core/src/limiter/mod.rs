//! The six limiter algorithms of SPEC section 4, each a pure state type.
//!
//! Every algorithm takes `now` as an argument; none reads a clock. A bucket does
//! not hold its configuration: the validated [`Algorithm`] is passed in on each
//! call, so a bucket costs only its state and a rule change applies at once.
//!
//! A [`Decision`] is a value: denied is not an error. A cost that a limit can never
//! admit is refused earlier, by [`Algorithm::capacity`], as bad input.

use std::time::Duration;

use crate::time::Timestamp;

pub mod balance;
pub mod calendar;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod rate;
pub mod sliding_window;
pub mod sliding_window_log;
pub mod token_bucket;
pub mod warm_up;

pub use balance::Balance;
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use leaky_bucket::LeakyBucket;
pub use sliding_window::SlidingWindow;
pub use sliding_window_log::SlidingWindowLog;
pub use token_bucket::TokenBucket;
pub use warm_up::WarmUp;

/// The state of one limit after a decision (or a peek).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// What the limit holds when full.
    pub limit: u64,
    /// What could still be taken now, in whole units.
    pub remaining: u64,
    /// Time until the limit is back to its initial state.
    pub reset_after: Duration,
    /// Time until this cost could be admitted; zero when admitted.
    pub retry_after: Duration,
    /// Shaping: how long an admitted caller waits for its turn.
    pub wait: Duration,
    /// Admitted over the limit by its `over_limit` share: the limit was
    /// exceeded, and the cost was taken beyond it.
    pub over_limit: bool,
}

/// One limit's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub admitted: bool,
    pub status: Status,
}

/// A limiter algorithm's per-key state.
pub(crate) trait Limiter: Sized {
    type Config;

    /// The state of a key seen for the first time.
    fn new(cfg: &Self::Config, now: Timestamp) -> Self;

    /// What `try_acquire` would answer, changing nothing.
    fn check(&self, cfg: &Self::Config, now: Timestamp, cost: u64) -> Decision;

    /// Takes `cost`; only called after `check` admitted it at the same `now`.
    fn commit(&mut self, cfg: &Self::Config, now: Timestamp, cost: u64);

    /// Gives back what a `commit` at the same `now` took, as far as the state allows.
    fn refund(&mut self, cfg: &Self::Config, now: Timestamp, cost: u64);

    /// Gives back `cost` of what a `commit` at `taken_at` (up to `now`)
    /// took: an estimate settled lower, a lease returned. Only what that
    /// commit added comes back, never what another caller's did.
    fn give_back(&mut self, cfg: &Self::Config, now: Timestamp, taken_at: Timestamp, cost: u64) {
        let _ = taken_at;
        self.refund(cfg, now, cost);
    }

    fn try_acquire(&mut self, cfg: &Self::Config, now: Timestamp, cost: u64) -> Decision {
        let decision = self.check(cfg, now, cost);
        if decision.admitted {
            self.commit(cfg, now, cost);
        }
        decision
    }
}

/// The algorithms, as the rules file names them: one list the parser reads
/// (`Kind::NAMED`) and [`Algorithm::kind`] matches without a wildcard, so an
/// algorithm added to [`Algorithm`] fails to compile until it is named here,
/// and one named here fails to compile until the parser builds it.
macro_rules! kinds {
    ($($kind:ident = $name:literal;)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Kind {
            $($kind),*
        }

        impl Kind {
            /// Every algorithm, by its name in the rules file.
            pub const NAMED: &'static [(&'static str, Kind)] = &[$(($name, Kind::$kind)),*];

            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$kind => $name),*
                }
            }
        }
    };
}

kinds! {
    TokenBucket = "token_bucket";
    Gcra = "gcra";
    LeakyBucket = "leaky_bucket";
    FixedWindow = "fixed_window";
    SlidingWindowLog = "sliding_window_log";
    SlidingWindow = "sliding_window";
    WarmUp = "warm_up";
    Balance = "balance";
}

/// A validated limit configuration: one algorithm and its numbers.
#[derive(Clone, Debug, PartialEq)]
pub enum Algorithm {
    TokenBucket(token_bucket::Config),
    Gcra(gcra::Config),
    LeakyBucket(leaky_bucket::Config),
    FixedWindow(fixed_window::Config),
    SlidingWindowLog(sliding_window_log::Config),
    SlidingWindow(sliding_window::Config),
    WarmUp(warm_up::Config),
    Balance(balance::Config),
}

/// One bucket's state as the replicas share it (computed by Redis): the units
/// takeable now across replicas, this replica's lease of them until its next
/// sync, and for window algorithms the current window's start and counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Shared {
    pub available: f64,
    pub lease: f64,
    pub window_start: Timestamp,
    pub prev: u64,
    pub cur: u64,
    /// Where this state stands among those Redis gave this replica for the
    /// bucket (increasing): a reply overtaken by a newer one is not adopted.
    pub seq: u64,
}

/// One key's state, whatever its algorithm. Kept small: it is stored per key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bucket {
    TokenBucket(TokenBucket),
    Gcra(Gcra),
    LeakyBucket(LeakyBucket),
    FixedWindow(FixedWindow),
    SlidingWindowLog(Box<SlidingWindowLog>),
    SlidingWindow(SlidingWindow),
    WarmUp(Box<WarmUp>),
    Balance(Balance),
}

// === impl Algorithm ===

impl Algorithm {
    pub fn kind(&self) -> Kind {
        match self {
            Algorithm::TokenBucket(_) => Kind::TokenBucket,
            Algorithm::Gcra(_) => Kind::Gcra,
            Algorithm::LeakyBucket(_) => Kind::LeakyBucket,
            Algorithm::FixedWindow(_) => Kind::FixedWindow,
            Algorithm::SlidingWindowLog(_) => Kind::SlidingWindowLog,
            Algorithm::SlidingWindow(_) => Kind::SlidingWindow,
            Algorithm::WarmUp(_) => Kind::WarmUp,
            Algorithm::Balance(_) => Kind::Balance,
        }
    }

    /// The name used in the rules file.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The limit in words, for reasons: a window's `fixed_window 3 per 1m`, a
    /// rate's `token_bucket of 3, refilling 1/s`.
    pub fn summary(&self) -> String {
        let window = |w: u64| rate::duration_text(Duration::from_nanos(w));
        match self {
            Algorithm::TokenBucket(c) => format!("token_bucket of {}, refilling {}", c.capacity, c.refill),
            Algorithm::Gcra(c) => format!("gcra of {}/s, burst {}", c.rate.as_f64(), c.burst),
            Algorithm::LeakyBucket(c) => format!("leaky_bucket of {}, leaking {}", c.capacity, c.leak),
            Algorithm::FixedWindow(c) => match &c.calendar {
                None => format!("fixed_window {} per {}", c.limit, window(c.window)),
                Some(cal) => format!("fixed_window {} per {cal}", c.limit),
            },
            Algorithm::SlidingWindowLog(c) => format!("sliding_window_log {} per {}", c.limit, window(c.window)),
            Algorithm::SlidingWindow(c) => format!("sliding_window {} per {}", c.limit, window(c.window)),
            Algorithm::WarmUp(c) => format!(
                "warm_up to {}/s over {}, from cold {}",
                c.rate,
                window(c.period_ms * 1_000_000),
                (c.cold_rate() * 1000.0).floor() / 1000.0
            ),
            Algorithm::Balance(c) => format!("balance of at most {}, topped up by an operator", c.max),
        }
    }

    /// Whether `at` and `now` fall in the same window of a window algorithm
    /// (always, for the others): what was taken at `at` can still be given
    /// back at `now` only then, as a later window never took it.
    pub fn same_window(&self, at: Timestamp, now: Timestamp) -> bool {
        match self {
            Algorithm::FixedWindow(c) => c.window_of(at) == c.window_of(now),
            Algorithm::SlidingWindow(c) => at.as_nanos() / c.window == now.as_nanos() / c.window,
            // Counted per second.
            Algorithm::WarmUp(_) => at.as_nanos() / 1_000_000_000 == now.as_nanos() / 1_000_000_000,
            Algorithm::TokenBucket(_)
            | Algorithm::Gcra(_)
            | Algorithm::LeakyBucket(_)
            | Algorithm::SlidingWindowLog(_)
            | Algorithm::Balance(_) => true,
        }
    }

    /// Whether it shapes: an admitted caller may be told to wait its turn
    /// (a leaky bucket or a warm-up with `mode: shape`).
    pub fn shapes(&self) -> bool {
        match self {
            Algorithm::LeakyBucket(c) => matches!(c.mode, leaky_bucket::Mode::Shape { .. }),
            Algorithm::WarmUp(c) => matches!(c.mode, warm_up::Mode::Shape { .. }),
            _ => false,
        }
    }

    /// Whether it counts calls in windows (fixed, sliding, a sliding log,
    /// calendar windows) rather than refilling at a rate.
    pub fn is_window(&self) -> bool {
        matches!(self, Algorithm::FixedWindow(_) | Algorithm::SlidingWindowLog(_) | Algorithm::SlidingWindow(_))
    }

    /// The largest cost this limit can ever admit at once; a bigger cost is bad input.
    pub fn capacity(&self) -> u64 {
        match self {
            Algorithm::TokenBucket(c) => c.capacity,
            Algorithm::Gcra(c) => c.burst,
            Algorithm::LeakyBucket(c) => c.capacity,
            Algorithm::FixedWindow(c) => c.limit,
            Algorithm::SlidingWindowLog(c) => c.limit,
            Algorithm::SlidingWindow(c) => c.limit,
            // Never more than the warm rate at once; a shaped caller of more waits its turn.
            Algorithm::WarmUp(c) => match c.mode {
                warm_up::Mode::Police => (c.rate.as_f64() as u64).max(1),
                warm_up::Mode::Shape { .. } => u64::MAX,
            },
            Algorithm::Balance(c) => c.max,
        }
    }

    /// The time until the limit is full again, as an answer shows it. A
    /// balance keeps its units until they are spent, so it has no such time:
    /// its answers show none (zero), although its store keeps a far one.
    pub fn shown_reset_after(&self, reset_after: Duration) -> Duration {
        match self {
            Algorithm::Balance(_) => Duration::ZERO,
            _ => reset_after,
        }
    }

    /// The policy window: a window algorithm's window, or the time a rate-based
    /// limit takes to refill from empty.
    pub fn window(&self) -> Duration {
        let nanos = match self {
            Algorithm::TokenBucket(c) => c.refill.time_for(rate::pico(c.capacity)),
            Algorithm::Gcra(c) => c.emission_interval.saturating_mul(c.burst),
            Algorithm::LeakyBucket(c) => c.leak.time_for(rate::pico(c.capacity)),
            Algorithm::FixedWindow(c) => c.window,
            Algorithm::SlidingWindowLog(c) => c.window,
            Algorithm::SlidingWindow(c) => c.window,
            // A second: the rate's.
            Algorithm::WarmUp(_) => 1_000_000_000,
            // No window: nothing comes back with time.
            Algorithm::Balance(_) => 0,
        };
        Duration::from_nanos(nanos)
    }

    /// The same limit scaled to `share` of its capacity and rate (at least one
    /// unit, and the smallest rate): what one of several replicas may spend on
    /// its own when they cannot coordinate.
    pub fn scaled(&self, share: f64) -> Algorithm {
        let units = |n: u64| ((n as f64 * share).floor() as u64).max(1);
        let rate = |r: rate::Rate| {
            rate::Rate::per_second(((r.as_f64() * share) * 1000.0).floor().max(1.0) / 1000.0).unwrap_or(r)
        };
        match self {
            Algorithm::TokenBucket(c) => {
                Algorithm::TokenBucket(token_bucket::Config::new(units(c.capacity), rate(c.refill)))
            }
            Algorithm::Gcra(c) => Algorithm::Gcra(gcra::Config::new(rate(c.rate), units(c.burst))),
            Algorithm::LeakyBucket(c) => {
                Algorithm::LeakyBucket(leaky_bucket::Config::new(units(c.capacity), rate(c.leak), c.mode))
            }
            Algorithm::FixedWindow(c) => {
                Algorithm::FixedWindow(fixed_window::Config { limit: units(c.limit), ..c.clone() })
            }
            Algorithm::SlidingWindowLog(c) => {
                Algorithm::SlidingWindowLog(sliding_window_log::Config::new(units(c.limit), c.window))
            }
            Algorithm::SlidingWindow(c) => {
                Algorithm::SlidingWindow(sliding_window::Config::new(units(c.limit), c.window))
            }
            Algorithm::WarmUp(c) => {
                // The share's rate over the same period, never below the smallest that warms.
                let scaled =
                    warm_up::Config::new(rate(c.rate), Duration::from_millis(c.period_ms), c.cold_factor, c.mode);
                Algorithm::WarmUp(scaled.unwrap_or_else(|_| c.clone()))
            }
            // Never shared out: a balance is decided by Redis or held whole.
            Algorithm::Balance(c) => Algorithm::Balance(c.clone()),
        }
    }

    /// A fresh bucket: the initial state of a key never seen.
    pub fn new_bucket(&self, now: Timestamp) -> Bucket {
        match self {
            Algorithm::TokenBucket(c) => Bucket::TokenBucket(TokenBucket::new(c, now)),
            Algorithm::Gcra(c) => Bucket::Gcra(Gcra::new(c, now)),
            Algorithm::LeakyBucket(c) => Bucket::LeakyBucket(LeakyBucket::new(c, now)),
            Algorithm::FixedWindow(c) => Bucket::FixedWindow(FixedWindow::new(c, now)),
            Algorithm::SlidingWindowLog(c) => Bucket::SlidingWindowLog(Box::new(SlidingWindowLog::new(c, now))),
            Algorithm::SlidingWindow(c) => Bucket::SlidingWindow(SlidingWindow::new(c, now)),
            Algorithm::WarmUp(c) => Bucket::WarmUp(Box::new(WarmUp::new(c, now))),
            Algorithm::Balance(c) => Bucket::Balance(Balance::new(c, now)),
        }
    }
}

/// Applies `$body` to the state and config of matching variants; `$fallback`
/// when the bucket was made for another algorithm (the rule changed under
/// it). The outer match names every bucket, so a new algorithm's bucket
/// that is not dispatched fails to compile.
macro_rules! dispatch {
    ($bucket:expr, $alg:expr, |$s:ident, $c:ident| $body:expr, $fallback:expr) => {
        match $bucket {
            Bucket::TokenBucket($s) => match $alg {
                Algorithm::TokenBucket($c) => $body,
                _ => $fallback,
            },
            Bucket::Gcra($s) => match $alg {
                Algorithm::Gcra($c) => $body,
                _ => $fallback,
            },
            Bucket::LeakyBucket($s) => match $alg {
                Algorithm::LeakyBucket($c) => $body,
                _ => $fallback,
            },
            Bucket::FixedWindow($s) => match $alg {
                Algorithm::FixedWindow($c) => $body,
                _ => $fallback,
            },
            Bucket::SlidingWindowLog($s) => match $alg {
                Algorithm::SlidingWindowLog($c) => $body,
                _ => $fallback,
            },
            Bucket::SlidingWindow($s) => match $alg {
                Algorithm::SlidingWindow($c) => $body,
                _ => $fallback,
            },
            Bucket::WarmUp($s) => match $alg {
                Algorithm::WarmUp($c) => $body,
                _ => $fallback,
            },
            Bucket::Balance($s) => match $alg {
                Algorithm::Balance($c) => $body,
                _ => $fallback,
            },
        }
    };
}

// === impl Bucket ===

impl Bucket {
    pub fn try_acquire(&mut self, alg: &Algorithm, now: Timestamp, cost: u64) -> Decision {
        if !self.fits(alg) {
            *self = alg.new_bucket(now);
        }
        dispatch!(self, alg, |s, c| s.try_acquire(c, now, cost), unreachable!())
    }

    /// The decision for `cost`, consuming nothing.
    pub fn check(&self, alg: &Algorithm, now: Timestamp, cost: u64) -> Decision {
        dispatch!(self, alg, |s, c| s.check(c, now, cost), alg.new_bucket(now).check(alg, now, cost))
    }

    /// Takes `cost` whether or not it fits (consumption that already happened).
    pub fn force(&mut self, alg: &Algorithm, now: Timestamp, cost: u64) {
        if !self.fits(alg) {
            *self = alg.new_bucket(now);
        }
        dispatch!(self, alg, |s, c| s.commit(c, now, cost), ())
    }

    pub fn refund(&mut self, alg: &Algorithm, now: Timestamp, cost: u64) {
        dispatch!(self, alg, |s, c| s.refund(c, now, cost), ())
    }

    /// See [`Limiter::give_back`].
    pub fn give_back(&mut self, alg: &Algorithm, now: Timestamp, taken_at: Timestamp, cost: u64) {
        dispatch!(self, alg, |s, c| s.give_back(c, now, taken_at, cost), ())
    }

    /// The current state, as a zero-cost check.
    pub fn status(&self, alg: &Algorithm, now: Timestamp) -> Status {
        self.check(alg, now, 0).status
    }

    /// Back to its initial state: the key can be forgotten without changing any answer.
    pub(crate) fn is_idle(&self, alg: &Algorithm, now: Timestamp) -> bool {
        self.status(alg, now).reset_after.is_zero()
    }

    /// The bucket a replica decides from until its next sync: one that admits
    /// its lease. Rate-based buckets go on refilling locally. A fixed window
    /// ends where it ends (its `reset_after` is the real one), but the next
    /// window admits only this replica's `share` of it until the next sync,
    /// not a whole window per replica. A sliding log is never shared this way
    /// (Redis decides it exactly).
    pub fn adopt(alg: &Algorithm, now: Timestamp, shared: &Shared, share: f64) -> Bucket {
        // A debt in common (units taken beyond the limit) is every
        // replica's: it is what the bucket holds here, not an empty lease.
        let lease = if shared.available < 0.0 { shared.available } else { shared.lease.max(0.0) };
        match alg {
            Algorithm::TokenBucket(c) => Bucket::TokenBucket(TokenBucket::with_tokens(c, now, lease)),
            Algorithm::Gcra(c) => Bucket::Gcra(Gcra::with_available(c, now, lease)),
            Algorithm::LeakyBucket(c) => Bucket::LeakyBucket(LeakyBucket::with_room(c, now, lease)),
            Algorithm::FixedWindow(c) => {
                let used = if lease < 0.0 {
                    c.limit.saturating_add(-lease.floor() as u64)
                } else {
                    c.limit.saturating_sub(lease.floor() as u64)
                };
                let next_share = ((c.limit as f64) * share.clamp(0.0, 1.0)).ceil() as u64;
                let carry = c.limit.saturating_sub(next_share);
                Bucket::FixedWindow(FixedWindow::with_count(shared.window_start, used, carry))
            }
            Algorithm::SlidingWindow(c) => {
                // What other replicas hold counts as taken here.
                let theirs = (shared.available - lease).max(0.0).ceil() as u64;
                Bucket::SlidingWindow(SlidingWindow::with_counts(
                    c,
                    shared.window_start,
                    shared.prev,
                    shared.cur + theirs,
                ))
            }
            Algorithm::SlidingWindowLog(_) => alg.new_bucket(now),
            // Redis runs the warm-up for the fleet; a replica admits its lease.
            Algorithm::WarmUp(c) => Bucket::WarmUp(Box::new(WarmUp::with_lease(c, now, lease))),
            // A balance is never leased out (the rules refuse it replicated):
            // what Redis holds is what it holds.
            Algorithm::Balance(_) => Bucket::Balance(Balance::with_units(shared.available.floor() as i64)),
        }
    }

    fn fits(&self, alg: &Algorithm) -> bool {
        dispatch!(self, alg, |_s, _c| true, false)
    }
}

/// Nanoseconds as a `Duration`.
pub(crate) fn nanos(n: u64) -> Duration {
    Duration::from_nanos(n)
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_stays_small() {
        // Stored once per active key: keep it within 32 bytes.
        assert!(std::mem::size_of::<Bucket>() <= 32, "{}", std::mem::size_of::<Bucket>());
    }

    #[test]
    fn an_adopted_fixed_window_resets_at_its_real_end_to_this_replicas_share() {
        let hour = 3_600_000_000_000;
        let fw = Algorithm::FixedWindow(fixed_window::Config::new(50, hour));
        let window_start = Timestamp::from_secs(1_700_000_000 - 1_700_000_000 % 3600);
        let now = window_start.add_nanos(hour - 10_000_000_000); // 10 s before the end
        // 20 of 50 left in common; this replica (one of two) leases 10.
        let shared = Shared { available: 20.0, lease: 10.0, window_start, prev: 0, cur: 30, seq: 1 };
        let mut b = Bucket::adopt(&fw, now, &shared, 0.5);
        let s = b.status(&fw, now);
        assert_eq!((s.remaining, s.reset_after), (10, Duration::from_secs(10)), "the real end, not an hour past it");
        assert!(b.try_acquire(&fw, now, 10).admitted);
        assert!(!b.try_acquire(&fw, now, 1).admitted);
        // The next window, before the next sync: half of 50, not all of it.
        let next = window_start.add_nanos(hour + 1);
        assert_eq!(b.status(&fw, next).remaining, 25);
        assert!(b.try_acquire(&fw, next, 25).admitted);
        assert!(!b.try_acquire(&fw, next, 1).admitted);
    }

    #[test]
    fn a_bucket_made_for_another_algorithm_starts_fresh() {
        let now = Timestamp::from_secs(100);
        let tb = Algorithm::TokenBucket(token_bucket::Config::new(2, rate::Rate::whole_per_second(1)));
        let fw = Algorithm::FixedWindow(fixed_window::Config::new(5, 1_000_000_000));
        let mut b = tb.new_bucket(now);
        assert!(b.try_acquire(&tb, now, 2).admitted);
        let d = b.try_acquire(&fw, now, 1);
        assert!(d.admitted);
        assert_eq!(d.status.remaining, 4);
    }
}
