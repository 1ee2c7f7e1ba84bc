//! Leases: a client takes a share of a resource's limits for its
//! descriptors, decides its own calls from it for a short time, and returns
//! what it did not use. A lease is a reserve-then-settle (see `settle`): its
//! units are taken from every matched limit when granted, all or nothing, and
//! the unused part is given back when the holder renews or returns it. So a
//! lease never admits more than the limits hold: what leasing trades is
//! accuracy the other way (units a holder keeps and does not use are idle
//! until it returns them, or lost to the window if it never does).
//!
//! Which limits: only those the rules mark (`lease: 2s`, the longest a lease
//! of them lasts); a request matching any other limit, a breaker, a
//! concurrency limit or a shedding level is decided per call.
//!
//! How much: by demand. Each holder says what it wants for the next lease
//! time; the server divides the bucket's capacity for a lease time (what it
//! holds now plus what the other holders' leases took, and at least what it
//! refills in a lease time) among the holders seen on it within two lease
//! times: max-min fair by default (`lease_share: fair`: each gets what it
//! wants up to an equal share, and what smaller holders leave goes to the
//! larger), or in proportion to what each wants (`lease_share:
//! proportional`). A holder that has not said what it wants (its first lease)
//! is given a share as if one more holder were there: the reserve that lets
//! the next newcomer be served at once. A holder's share is a rate: it may take
//! up to one share at once and gets it back at one share per lease time, so
//! renewing more often does not take more; a lease smaller than half a share
//! is not worth its round trip, and the holder is told when to come back
//! instead (unless waiting would not bring more: then what is left). What
//! the other contended holders are owed and do not hold is kept for them
//! (never so much that a holder cannot take its own slice of what is there).
//! Shares and credit are counted in thousandths of a unit, so holders of a
//! share under one unit take turns. So leasing never admits more than the
//! limits hold, and under contention each holder costs about one or two Lease
//! calls per lease time.

use crate::Leasing;
use std::time::Duration;

use dashmap::DashMap;
use smallvec::SmallVec;

use super::Installed;
use super::decide::{limits_for, matched_in};
use super::request::{self, Descriptors, RequestError};
use crate::rules::LeaseShare;
use crate::store::BucketKey;
use crate::time::Timestamp;

/// Holders remembered per bucket; beyond, the one seen longest ago goes.
pub(crate) const MAX_HOLDERS: usize = 64;
/// Buckets with holders remembered; beyond, a holder on a new bucket is
/// planned as if alone (its share comes out larger, never past what is
/// available) until the sweep frees some.
pub const MAX_KEYS: usize = 100_000;

/// What may be leased now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// How long the lease lasts: the shortest `lease` of the matched limits.
    pub ttl: Duration,
    /// Units to grant (0 when none are).
    pub grant: u64,
    /// With nothing to grant: when to ask again.
    pub retry_after: Duration,
    /// With nothing to grant: why.
    pub empty: Option<Empty>,
    /// Holders sharing the bucket now, this one included (the most of the limits).
    pub holders: usize,
    /// This holder's share for a lease time (the least of the limits).
    pub share: u64,
    /// What each matched limit holds now, before the grant.
    pub limits: SmallVec<[Left; 2]>,
    keys: SmallVec<[BucketKey; 2]>,
    holder: u64,
}

/// Why a plan grants nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Empty {
    /// The limits hold less than half of this holder's share.
    NothingLeft,
    /// This holder took its share lately (more comes back at one share per
    /// lease time), or what the limits hold is kept for the others' shares.
    ShareUsed,
}

/// One matched limit and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Left {
    pub name: String,
    pub limit: u64,
    pub remaining: u64,
    pub window: Duration,
}

/// A holder on one bucket.
#[derive(Clone, Copy, Debug)]
struct Holder {
    id: u64,
    seen: Timestamp,
    /// Units it wants for a lease time; 0: not said.
    want: u64,
    /// Units its lease in hand took (0 once returned).
    outstanding: u64,
    /// Thousandths of a unit it may take now (at most one share), as of `credit_at`.
    credit: u64,
    credit_at: Timestamp,
    /// Its lease time (ns): it is forgotten two of them after it was seen.
    ttl: u64,
    /// Its ramp on a window limit (see [`ramp`]).
    ramp: Ramp,
}

/// What a holder took in its current lease time (less what it gave back
/// unused) and in the one before: how fast it uses a window limit.
#[derive(Clone, Copy, Debug)]
struct Ramp {
    since: Timestamp,
    now: u64,
    before: u64,
}

impl Ramp {
    /// A holder's first lease time, from `now`: nothing taken yet.
    fn starting(now: Timestamp) -> Ramp {
        Ramp { since: now, now: 0, before: 0 }
    }

    /// Moves to the lease time that holds `now`.
    fn roll(&mut self, now: Timestamp, ttl: u64) {
        let elapsed = now.as_nanos().saturating_sub(self.since.as_nanos());
        if elapsed < ttl {
            return;
        }
        // A holder silent for more than a lease time used nothing in the
        // one just before.
        self.before = if elapsed < 2 * ttl { self.now } else { 0 };
        self.now = 0;
        self.since = now;
    }
}

/// What one bucket's holders allow one of them, in thousandths of a unit
/// (a share may be a fraction of a unit per lease time: four holders on a
/// bucket refilling one a lease time).
struct Allotment {
    share: u64,
    /// `u64::MAX` while uncontended.
    credit: u64,
    holders: usize,
    /// Units kept for the other holders' shares (whole units), but never so
    /// many that this holder cannot take its slice of what the bucket holds
    /// now (in proportion to the shares, rounded up) when that slice is worth
    /// a round trip: when everyone is owed more than there is, each still
    /// gets its turn.
    owed: u64,
    /// What this holder took in its current lease time, and in the one before.
    ramp: Ramp,
}

/// Recent holders per bucket.
#[derive(Debug, Default)]
pub struct Leases {
    holders: DashMap<BucketKey, SmallVec<[Holder; 4]>, ahash::RandomState>,
    /// When a full table was last swept (ns).
    swept_at: std::sync::atomic::AtomicU64,
}

/// How one bucket looks to the holder asking.
struct Ask {
    who: u64,
    want: u64,
    /// Its previous lease was just settled at this many used.
    settled: Option<u64>,
    now: Timestamp,
    ttl: Duration,
    policy: LeaseShare,
    available: u64,
    /// What the bucket refills in a lease time, and holds at most.
    refill: u64,
    at_once: u64,
}

impl Leases {
    /// Notes the holder's ask on `key`; its share and credit there.
    fn allot(&self, key: &BucketKey, a: &Ask) -> Allotment {
        let ttl = a.ttl.as_nanos() as u64;
        if !self.holders.contains_key(key) && self.holders.len() >= MAX_KEYS {
            // Full: forget the holders gone from their buckets (at most once
            // a second: it walks the table), else plan this one untracked,
            // beside a holder not yet heard from (the reserve).
            let swept = self.swept_at.load(std::sync::atomic::Ordering::Relaxed);
            if a.now.as_nanos().saturating_sub(swept) >= 1_000_000_000 {
                self.swept_at.store(a.now.as_nanos(), std::sync::atomic::Ordering::Relaxed);
                self.forget(a.now);
            }
            if self.holders.len() >= MAX_KEYS {
                let share = share_of(a.policy, milli(a.available.max(a.refill)), &[milli(a.want), 0], 0);
                return Allotment { share, credit: share, holders: 2, owed: 0, ramp: Ramp::starting(a.now) };
            }
        }
        let mut list = self.holders.entry(key.clone()).or_default();
        let since = Timestamp::from_nanos(a.now.as_nanos().saturating_sub(2 * ttl));
        list.retain(|h| h.seen >= since);
        let me = match list.iter().position(|h| h.id == a.who) {
            Some(i) => i,
            None => {
                if list.len() >= MAX_HOLDERS
                    && let Some(oldest) = list.iter().enumerate().min_by_key(|(_, h)| h.seen).map(|(i, _)| i)
                {
                    list.remove(oldest);
                }
                let fresh = Holder {
                    id: a.who,
                    seen: a.now,
                    want: 0,
                    outstanding: 0,
                    credit: u64::MAX,
                    credit_at: a.now,
                    ttl,
                    ramp: Ramp::starting(a.now),
                };
                list.push(fresh);
                list.len() - 1
            }
        };
        if let Some(used) = a.settled {
            let h = &mut list[me];
            let unused = h.outstanding.saturating_sub(used);
            h.credit = h.credit.saturating_add(milli(unused));
            h.outstanding = 0;
            h.ramp.now = h.ramp.now.saturating_sub(unused);
        }
        list[me].ramp.roll(a.now, ttl);
        list[me].want = a.want;
        list[me].seen = a.now;
        list[me].ttl = ttl;
        // The other holders' leases come back at their renewals: they are
        // part of what is divided.
        let recent = Timestamp::from_nanos(a.now.as_nanos().saturating_sub(ttl));
        let others: u64 = list
            .iter()
            .filter(|h| h.id != a.who && h.seen >= recent)
            .map(|h| h.outstanding)
            .fold(0, u64::saturating_add);
        let capacity = milli(a.available.saturating_add(others).max(a.refill));
        let wants: SmallVec<[u64; 8]> = list.iter().map(|h| milli(h.want)).collect();
        let share = share_of(a.policy, capacity, &wants, me);
        // Shares are kept to only while holders want more than there is:
        // else each may take what it finds.
        let wanted = wants.iter().map(|&w| if w == 0 { u64::MAX } else { w }).fold(0, u64::saturating_add);
        let contended = list.len() > 1 && wanted > capacity;
        let h = &mut list[me];
        let elapsed = a.now.as_nanos().saturating_sub(h.credit_at.as_nanos());
        // Credit builds up to a share, or to one unit for a share under one.
        let most = share.max(milli(1));
        h.credit = if contended { h.credit.saturating_add(accrue(elapsed, share, ttl)).min(most) } else { share };
        h.credit_at = a.now;
        let credit = if contended { h.credit } else { u64::MAX };
        // Contended, what the others are owed and do not hold is kept for
        // them: else a holder renewing takes back at once what it returned,
        // and one that asks later finds nothing. Each is owed its share, at
        // most its slice of what the bucket holds at once (in proportion to
        // the shares), less what it holds, and no more than it may take now.
        let owed = if contended {
            let shares: SmallVec<[u64; 8]> = (0..list.len()).map(|j| share_of(a.policy, capacity, &wants, j)).collect();
            let total = shares.iter().map(|&s| u128::from(s)).sum::<u128>().max(1);
            let mine = (u128::from(a.available) * u128::from(share)).div_ceil(total) as u64;
            let owed = (0..list.len())
                .filter(|&j| j != me && list[j].seen >= recent)
                .map(|j| {
                    let slice = (u128::from(milli(a.at_once)) * u128::from(shares[j])).div_ceil(total) as u64;
                    let since = a.now.as_nanos().saturating_sub(list[j].credit_at.as_nanos());
                    let may = list[j].credit.saturating_add(accrue(since, shares[j], ttl)).min(shares[j].max(milli(1)));
                    slice.min(shares[j]).saturating_sub(milli(list[j].outstanding)).min(may)
                })
                .fold(0, u64::saturating_add)
                / 1000;
            if mine >= worth(share, a.at_once) { owed.min(a.available.saturating_sub(mine)) } else { owed }
        } else {
            0
        };
        Allotment { share, credit, holders: list.len(), owed, ramp: list[me].ramp }
    }

    /// `units` were granted to `who` on `key`.
    fn taken(&self, key: &BucketKey, who: u64, units: u64) {
        if let Some(mut list) = self.holders.get_mut(key)
            && let Some(h) = list.iter_mut().find(|h| h.id == who)
        {
            h.credit = h.credit.saturating_sub(milli(units));
            h.outstanding = units;
            h.ramp.now = h.ramp.now.saturating_add(units);
        }
    }

    /// `who` holds no lease on `key` any more.
    fn leave(&self, key: &BucketKey, who: u64) {
        if let Some(mut list) = self.holders.get_mut(key) {
            list.retain(|h| h.id != who);
        }
    }

    /// Forgets holders not seen within two of their lease times by `now`.
    pub(super) fn forget(&self, now: Timestamp) {
        self.holders.retain(|_, list| {
            list.retain(|h| h.seen.as_nanos().saturating_add(2 * h.ttl) >= now.as_nanos());
            !list.is_empty()
        });
    }
}

/// The most a holder may lease now of a window longer than its lease
/// time. In each lease time it may take twice what it took (and used) in
/// the one before, and at least the window's limit spread over the window
/// (`pace`: what the window would refill in a lease time, at least one
/// unit). A holder that uses what it leases doubles its rate each lease
/// time; one lease can no longer take a whole window (an hour's quota in a
/// one-second lease), so the holders that come later in the window find
/// their share, while a steady holder soon leases what it uses.
fn ramp(pace: u64, r: &Ramp) -> u64 {
    pace.max(1).max(r.before.saturating_mul(2)).saturating_sub(r.now)
}

/// The least lease worth its round trip for a share of `share_m`
/// thousandths: half a share (of what the limits hold at once, `at_once`: a
/// share for a lease time may be more), at least one unit.
fn worth(share_m: u64, at_once: u64) -> u64 {
    ((share_m / 1000).max(1).min(at_once) / 2).max(1)
}

/// `units` in thousandths.
fn milli(units: u64) -> u64 {
    units.saturating_mul(1000)
}

/// Credit regained in `nanos` at `share` per `ttl` nanoseconds.
fn accrue(nanos: u64, share: u64, ttl: u64) -> u64 {
    (u128::from(nanos) * u128::from(share) / u128::from(ttl.max(1))).min(u128::from(u64::MAX)) as u64
}

/// Holder `me`'s share of `capacity` among holders wanting `wants` (0: not
/// said; such a holder counts as wanting without bound, and when `me` is one,
/// one more such holder is counted: the reserve for the next newcomer).
pub fn share_of(policy: LeaseShare, capacity: u64, wants: &[u64], me: usize) -> u64 {
    let unsaid = wants[me] == 0;
    let n = wants.len() + usize::from(unsaid);
    match policy {
        LeaseShare::Fair => {
            // Max-min fair: the water level that `capacity` fills.
            let mut demands: SmallVec<[u64; 8]> = wants.iter().map(|&w| if w == 0 { u64::MAX } else { w }).collect();
            if unsaid {
                demands.push(u64::MAX);
            }
            demands.sort_unstable();
            let (mut left, mut k) = (capacity, n as u64);
            let mut level = u64::MAX;
            for d in demands {
                if d <= left / k {
                    left -= d;
                    k -= 1;
                } else {
                    level = left.div_ceil(k);
                    break;
                }
            }
            let mine = if unsaid { u64::MAX } else { wants[me] };
            mine.min(level)
        }
        LeaseShare::Proportional => {
            // A holder that has not said counts as wanting an equal share.
            let equal = capacity.div_ceil(n as u64);
            let value = |w: u64| if w == 0 { equal } else { w };
            let total: u128 =
                wants.iter().map(|&w| u128::from(value(w))).sum::<u128>() + if unsaid { u128::from(equal) } else { 0 };
            let mine = value(wants[me]);
            if total <= u128::from(capacity) {
                mine
            } else {
                (u128::from(capacity) * u128::from(mine)).div_ceil(total) as u64
            }
        }
    }
}

/// Why a request cannot be leased, for the client (which then asks per call).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotLeasable {
    #[error("no rule matches the resource")]
    NoRule,
    #[error("the resource has a circuit breaker: each call is decided by the server")]
    Breaker,
    #[error("the resource has a concurrency limit: each call is decided by the server")]
    Concurrency,
    #[error("the resource is shed by degradation level: each call is decided by the server")]
    Shed,
    #[error("blocked by {0}")]
    Blocked(String),
    #[error("no limit applies to these descriptors")]
    NoLimit,
    #[error("limit '{0}' is in shadow mode")]
    Shadow(String),
    #[error("limit '{0}' may not be leased (no `lease:` in the rules)")]
    NotMarked(String),
}

/// The shortest time a holder told to come back waits.
const MIN_ASK_AGAIN: Duration = Duration::from_millis(1);

impl Plan {
    /// What to take after taking `self.grant` (at attempt `attempt`, from 0)
    /// found only `available`: another caller came first, or a replicated
    /// bucket was first pulled from Redis at this replica's share. Once, what
    /// is there; then nothing (`None`) until the holder asks again.
    pub fn after_shortfall(&self, attempt: u32, available: u64) -> Option<u64> {
        (attempt == 0 && available > 0).then(|| available.min(self.grant))
    }

    /// When a holder granted nothing asks again: within one lease time at
    /// most, since units may come back before the limit's own `retry_after`
    /// (another holder returns some).
    pub fn ask_again_in(&self, retry_after: Duration) -> Duration {
        retry_after.clamp(MIN_ASK_AGAIN, self.ttl)
    }
}

/// What a holder that reports its demand (Envoy's RLQS: what it allowed and
/// denied since its last report, `elapsed` ago) wants for a lease time of
/// `ttl`: its rate, with a quarter more for growth.
pub fn want_from_demand(allowed: u64, denied: u64, elapsed: Duration, ttl: Duration) -> u64 {
    let demand = u128::from(allowed.saturating_add(denied));
    let per_ttl = demand * ttl.as_nanos() * 5 / (elapsed.as_nanos().max(1_000_000) * 4);
    (per_ttl.min(u128::from(u64::MAX)) as u64).max(1)
}

/// One holder's leases by what it calls each bucket (an RLQS stream's bucket
/// ids), bounded: a holder cannot make the server keep more than
/// [`Book::MAX`] of them.
#[derive(Debug)]
pub struct Book<K> {
    leases: std::collections::HashMap<K, Booked>,
}

/// A bucket's last answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Booked {
    /// The lease in hand; empty when the last answer granted nothing.
    pub id: String,
    /// When it was answered, and the lease time.
    pub at: Timestamp,
    pub ttl: Duration,
}

impl<K: std::hash::Hash + Eq> Book<K> {
    /// The most buckets one holder has leases for.
    pub const MAX: usize = 10_000;

    /// The last answer for `bucket` (`Some(None)` when none); `None` when
    /// the book is full and `bucket` is not in it.
    pub fn lease_of<Q>(&self, bucket: &Q) -> Option<Option<&Booked>>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        match self.leases.get(bucket) {
            Some(b) => Some(Some(b)),
            None if self.leases.len() >= Self::MAX => None,
            None => Some(None),
        }
    }

    pub fn hold(&mut self, bucket: K, booked: Booked) {
        self.leases.insert(bucket, booked);
    }

    pub fn forget<Q>(&mut self, bucket: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.leases.remove(bucket);
    }
}

impl<K> Default for Book<K> {
    fn default() -> Self {
        Book { leases: std::collections::HashMap::new() }
    }
}

/// A holder name: 1 to 256 bytes, no control characters.
pub fn check_holder(holder: &str) -> Result<(), RequestError> {
    let why = if holder.is_empty() {
        "is required (a name stable for the client process)".to_string()
    } else if holder.len() > 256 {
        format!("is {} bytes; at most 256", holder.len())
    } else if let Some(c) = holder.chars().find(|c| c.is_control()) {
        format!("control character U+{:04X} is not allowed", u32::from(c))
    } else {
        return Ok(());
    };
    Err(RequestError::BadHolder(why))
}

pub(super) fn holder_hash(holder: &str) -> u64 {
    // Fixed keys: the same holder is the same entry on every call.
    ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(holder)
}

impl Leasing<'_> {
    /// How much `holder` may lease of `resource`'s limits for `d` now, given
    /// that it wants `want` for a lease time (0: not said) and that its
    /// previous lease was just settled at `settled` used (if it was); `Err`
    /// when they may not be leased.
    pub fn lease_plan<D: Descriptors + ?Sized>(
        &self,
        rules: &Installed,
        resource: &str,
        d: &D,
        want: u64,
        holder: &str,
        settled: Option<u64>,
    ) -> Result<Result<Plan, NotLeasable>, RequestError> {
        request::validate(resource, d)?;
        let Some((rule, handles)) = rules.find(resource) else {
            return Ok(Err(NotLeasable::NoRule));
        };
        if rule.breaker.is_some() {
            return Ok(Err(NotLeasable::Breaker));
        }
        if rule.concurrency.is_some() {
            return Ok(Err(NotLeasable::Concurrency));
        }
        if rule.shed_at_level.is_some() {
            return Ok(Err(NotLeasable::Shed));
        }
        let matched = match limits_for(rule, handles, d, &self.clock) {
            Ok(limits) => matched_in(limits, rule.per_resource(), resource, d, Some(0)),
            Err((_, values)) => return Ok(Err(NotLeasable::Blocked(values))),
        };
        if matched.is_empty() {
            return Ok(Err(NotLeasable::NoLimit));
        }
        let mut ttl = Duration::MAX;
        for (l, ..) in &matched {
            match l.lease {
                _ if l.shadow => return Ok(Err(NotLeasable::Shadow(l.name.clone()))),
                Some(lease) => ttl = ttl.min(lease.ttl),
                None => return Ok(Err(NotLeasable::NotMarked(l.name.clone()))),
            }
        }
        let now = self.clock.now();
        let who = holder_hash(holder);
        let mut plan = Plan {
            ttl,
            grant: u64::MAX,
            retry_after: Duration::ZERO,
            empty: None,
            holders: 1,
            share: u64::MAX,
            limits: SmallVec::new(),
            keys: SmallVec::new(),
            holder: who,
        };
        // The most the limits hold at once.
        let (mut credit, mut available, mut at_once, mut owed) = (u64::MAX, u64::MAX, u64::MAX, 0);
        // What the limits hold, before what is owed to the others.
        let mut held = u64::MAX;
        // This holder's share, in thousandths.
        let mut share_m = u64::MAX;
        // The most a window limit lets this holder lease now (see `ramp`),
        // and when it may lease more.
        let (mut ramp, mut ramp_next) = (u64::MAX, Duration::ZERO);
        for (l, _, k) in &matched {
            let status = self.buckets.check(k, &l.algorithm, now, 0).status;
            let refill = (u128::from(l.algorithm.capacity()) * ttl.as_nanos() / l.algorithm.window().as_nanos().max(1))
                .min(u128::from(u64::MAX)) as u64;
            let policy = l.lease.map(|lease| lease.share).unwrap_or_default();
            let at_once_here = l.algorithm.capacity();
            let ask = Ask {
                who,
                want,
                settled,
                now,
                ttl,
                policy,
                available: status.remaining,
                refill,
                at_once: at_once_here,
            };
            let a = self.leases.allot(k, &ask);
            if l.lease.is_some_and(|lease| lease.paced) && l.algorithm.is_window() && refill < at_once_here {
                ramp = ramp.min(self::ramp(refill, &a.ramp));
                // When this holder's next lease time begins: more then.
                let next = a.ramp.since.as_nanos().saturating_add(ttl.as_nanos() as u64).saturating_sub(now.as_nanos());
                ramp_next = ramp_next.max(Duration::from_nanos(next));
            }
            share_m = share_m.min(a.share);
            plan.holders = plan.holders.max(a.holders);
            credit = credit.min(if a.credit == u64::MAX { u64::MAX } else { a.credit / 1000 });
            available = available.min(status.remaining.saturating_sub(a.owed));
            held = held.min(status.remaining);
            owed = owed.max(a.owed);
            at_once = at_once.min(at_once_here);
            let window = l.algorithm.window();
            plan.limits.push(Left { name: l.name.clone(), limit: status.limit, remaining: status.remaining, window });
            plan.keys.push(k.clone());
        }
        // A lease is at most u32::MAX units (a cost), so is a share; a share
        // under one unit is said as one, and granted as one once it accrued.
        share_m = share_m.min(milli(u64::from(u32::MAX)));
        plan.share = share_m.div_ceil(1000);
        let whole = (share_m / 1000).max(1);
        let worth = worth(share_m, at_once);
        // How long this holder's share takes to give back `units`.
        let time_to_accrue = |units: u64| {
            Duration::from_nanos((u128::from(milli(units)) * ttl.as_nanos() / u128::from(share_m.max(1))) as u64)
        };
        plan.grant = credit.min(available).min(whole);
        let ramped = ramp < plan.grant;
        plan.grant = plan.grant.min(ramp);
        // When the limits would hold `worth` (never, within a lease time: then
        // what they hold is all there is).
        let filled_for = |units: u64| {
            matched
                .iter()
                .map(|(l, _, k)| self.buckets.check(k, &l.algorithm, now, units).status.retry_after)
                .max()
                .unwrap_or_default()
        };
        let filled = || filled_for(worth.saturating_add(owed));
        // Waiting would not help when the limits cannot come to hold `worth`
        // beside what is owed to the others.
        let hopeless = worth.saturating_add(owed) > at_once || filled_for(worth.saturating_add(owed)) >= ttl;
        // A grant the ramp cut is all this holder may have now: it is not
        // held back for being under half a share.
        if plan.grant >= worth || (plan.grant > 0 && (hopeless || ramped)) {
            // A grant that uses up the holder's share says when the next
            // can be had: a holder that uses it up before then need not ask.
            if plan.grant >= credit {
                plan.retry_after = time_to_accrue(worth).clamp(MIN_ASK_AGAIN, ttl);
            }
            return Ok(Ok(plan));
        }
        // "Nothing left" only when the limits hold too little; units kept
        // for the others' shares are this holder's share used.
        let (retry_after, why) = if credit < worth {
            let filled = if available < worth { filled() } else { Duration::ZERO };
            (time_to_accrue(worth - credit).max(filled), Empty::ShareUsed)
        } else if held >= worth {
            (filled(), Empty::ShareUsed)
        } else {
            (filled(), Empty::NothingLeft)
        };
        // Paced, and this lease time's part taken: more at the next one.
        let (retry_after, why) =
            if ramp == 0 && held > 0 { (ramp_next.max(retry_after), Empty::ShareUsed) } else { (retry_after, why) };
        plan.grant = 0;
        plan.empty = Some(why);
        plan.retry_after = retry_after.clamp(MIN_ASK_AGAIN, ttl);
        Ok(Ok(plan))
    }

    /// `holder` returned its lease on `resource` for `d` for good: it no
    /// longer shares the limits' buckets.
    pub fn lease_released<D: Descriptors + ?Sized>(&self, rules: &Installed, resource: &str, d: &D, holder: &str) {
        let Some((rule, handles)) = rules.find(resource) else { return };
        let Ok(limits) = limits_for(rule, handles, d, &self.clock) else { return };
        let who = holder_hash(holder);
        for (_, _, k) in matched_in(limits, rule.per_resource(), resource, d, None) {
            self.leases.leave(&k, who);
        }
    }

    /// `units` of `plan` were granted: the holder's credit goes down by them,
    /// and they are its lease in hand until it renews.
    pub fn lease_taken(&self, plan: &Plan, units: u64) {
        for k in &plan.keys {
            self.leases.taken(k, plan.holder, units);
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LimitId;

    fn ask(who: u64, now: Timestamp) -> Ask {
        let ttl = Duration::from_secs(1);
        Ask {
            who,
            want: 0,
            settled: None,
            now,
            ttl,
            policy: LeaseShare::Fair,
            available: 1000,
            refill: 200,
            at_once: 1000,
        }
    }

    fn key(i: u64) -> BucketKey {
        BucketKey::new(LimitId(0), [i.to_string().as_str()])
    }

    #[test]
    fn a_full_table_forgets_the_holders_gone_and_never_plans_a_holder_alone() {
        let leases = Leases::default();
        let t0 = Timestamp::from_secs(1_700_000_000);
        for i in 0..MAX_KEYS as u64 {
            leases.allot(&key(i), &ask(1, t0));
        }
        // Full, and everyone still there: a new bucket is planned beside a
        // holder not yet heard from (half of it), not as if alone.
        let full = leases.allot(&key(u64::MAX), &ask(2, t0));
        assert_eq!(
            (full.holders, full.share),
            (2, 333_334),
            "a third (in thousandths): itself, the other, the reserve"
        );
        // Two lease times later the holders are gone: the new bucket is tracked.
        let later = t0.saturating_add(Duration::from_millis(2001));
        let first = leases.allot(&key(u64::MAX), &ask(2, later));
        let second = leases.allot(&key(u64::MAX), &ask(3, later));
        assert_eq!((first.holders, second.holders), (1, 2));
        assert!(leases.holders.len() < 10);
    }

    #[test]
    fn a_holder_name_is_checked() {
        assert!(check_holder("pid-42-abc").is_ok());
        let err = |h: &str| check_holder(h).unwrap_err().to_string();
        assert_eq!(err(""), "holder: is required (a name stable for the client process)");
        assert_eq!(err(&"h".repeat(300)), "holder: is 300 bytes; at most 256");
        assert_eq!(err("a\u{1}b"), "holder: control character U+0001 is not allowed");
    }
}
