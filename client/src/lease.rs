//! Leases: with `Builder::leases(true)`,
//! the client asks the server for a share of a resource's limits for the
//! descriptors it sees (only limits the rules mark `lease:`), decides calls
//! from it without a round trip, and renews it in the background before it
//! ends, reporting what it used (the server gives back the rest). A request
//! the server says cannot be leased (a breaker, a concurrency limit, a limit
//! without `lease:`) is asked per call, and the client remembers that for a
//! while. With the server gone, a lease runs out at its end; then the fail
//! mode decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;

use crate::decision::{Acquire, Decision, Limit};

/// Keys with a lease (or a refusal) remembered; beyond, calls are asked.
pub(crate) const MAX_KEYS: usize = 10_000;
/// How long a "cannot be leased" is remembered.
const NOT_LEASABLE_FOR: Duration = Duration::from_secs(30);
/// A lease is renewed once this share of its time has passed...
const RENEW_AT: f64 = 0.6;
/// ... and not used past this share (the server's clock may run ahead).
const USE_UNTIL: f64 = 0.9;

/// One key's state, locked while it is decided or renewed.
pub(crate) type Cell = Arc<tokio::sync::Mutex<State>>;

pub(crate) struct Leases {
    /// This client process, as the server's fair shares count it.
    pub(crate) holder: String,
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<State>>>>,
}

/// One key's lease.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) held: Option<Held>,
    not_leasable_until: Option<Instant>,
    /// Nothing was left, or this process's share is used: denied locally
    /// until then, and why.
    empty_until: Option<(Instant, &'static str)>,
    /// The lease time the server last said, and the limits with what they
    /// held (shown in local denials).
    ttl: Duration,
    limits: Vec<Limit>,
    /// Demand: units asked for since `since` (admitted or not), and the rate
    /// of the last complete measure.
    demand: u64,
    since: Option<Instant>,
    rate: Option<f64>,
    /// The request, to renew in the background.
    pub(crate) template: Option<Acquire>,
}

pub(crate) struct Held {
    pub(crate) id: String,
    pub(crate) remaining: u64,
    pub(crate) used: u64,
    pub(crate) renew_at: Instant,
    pub(crate) use_until: Instant,
}

/// What a lease request came to.
pub(crate) enum Granted {
    NotLeasable,
    /// Nothing granted: ask again after this long, and why.
    Empty(Duration, &'static str, Vec<Limit>),
    Lease {
        id: String,
        granted: u64,
        ttl: Duration,
        /// This grant used up this process's share: once it is spent, the
        /// next comes after this long (zero: whenever).
        next_in: Duration,
        /// The limits it was cut from, and what they hold after it.
        limits: Vec<Limit>,
    },
    /// No server answered.
    Unreachable,
    /// The server refused the request as bad input: ask per call (and get the error).
    Refused,
}

/// Why a lease denies a call, for its reason.
const NOTHING_LEFT: &str = "nothing left to lease";
const SHARE_USED: &str = "this process used its share of the lease";

impl Granted {
    pub(crate) fn from_proto(r: &pb::LeaseResponse) -> Granted {
        use crate::decision::duration;
        let limits = || r.limits.iter().map(Limit::from_proto).collect();
        match r {
            r if !r.leasable => Granted::NotLeasable,
            r if r.granted == 0 => {
                let why = if r.empty_reason == "share used" { SHARE_USED } else { NOTHING_LEFT };
                Granted::Empty(duration(&r.retry_after), why, limits())
            }
            r => Granted::Lease {
                id: r.lease_id.clone(),
                granted: r.granted,
                ttl: duration(&r.ttl),
                next_in: duration(&r.retry_after),
                limits: limits(),
            },
        }
    }
}

impl Leases {
    pub(crate) fn new() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        Leases { holder: format!("pid-{}-{:x}", std::process::id(), nanos & 0xffff_ffff), map: Mutex::default() }
    }

    /// The state of `key`, `None` when the table is full.
    pub(crate) fn cell(&self, key: String) -> Option<Cell> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(&key) {
            return Some(c.clone());
        }
        if map.len() >= MAX_KEYS {
            return None;
        }
        Some(map.entry(key).or_default().clone())
    }

    pub(crate) fn cells(&self) -> Vec<Cell> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }
}

/// Demand is measured over at least this share of a lease time.
const MEASURE_FOR: f64 = 0.5;

impl State {
    /// Decides from the lease when it can: `Some` allowed (units taken) or
    /// denied (nothing was left, or this process's share is used); `None`
    /// when the server must be asked (for a lease, or per call).
    pub(crate) fn local(&mut self, cost: u64, now: Instant) -> Option<Decision> {
        self.demand = self.demand.saturating_add(cost);
        self.since.get_or_insert(now);
        if let Some(h) = &mut self.held
            && now < h.use_until
            && h.remaining >= cost
        {
            h.remaining -= cost;
            h.used += cost;
            return Some(Decision::leased());
        }
        if let Some((until, why)) = self.empty_until.filter(|(u, _)| *u > now) {
            return Some(Decision::lease_empty(until - now, why, self.limits.clone()));
        }
        None
    }

    pub(crate) fn not_leasable(&self, now: Instant) -> bool {
        self.not_leasable_until.is_some_and(|u| u > now)
    }

    /// What this process wants for a lease time: its recent rate (admitted
    /// and denied) and a quarter more; 0 (not known) before any measure.
    fn want(&mut self, cost: u64, now: Instant) -> u64 {
        let Some(since) = self.since else { return 0 };
        let elapsed = now.saturating_duration_since(since).as_secs_f64();
        if self.ttl.is_zero() {
            return 0;
        }
        if elapsed >= self.ttl.as_secs_f64() * MEASURE_FOR {
            self.rate = Some(self.demand as f64 / elapsed);
            (self.demand, self.since) = (0, Some(now));
        }
        let rate = match self.rate {
            Some(r) => r,
            None if elapsed > 0.0 => self.demand as f64 / elapsed.max(0.01),
            None => return 0,
        };
        ((rate * self.ttl.as_secs_f64() * 1.25).ceil() as u64).max(cost).max(1)
    }

    /// What to ask: (previous lease, units it used, units wanted).
    pub(crate) fn renewal(&mut self, cost: u64, now: Instant) -> (String, u64, u64) {
        let want = self.want(cost, now);
        match &self.held {
            Some(h) => (h.id.clone(), h.used, want),
            None => (String::new(), 0, want),
        }
    }

    /// Whether the lease is due for renewal at `now`: Some(used) if so.
    pub(crate) fn due(&self, now: Instant) -> Option<u64> {
        self.held.as_ref().filter(|h| now >= h.renew_at).map(|h| h.used)
    }

    /// Takes in the server's answer (the previous lease is then settled);
    /// the decision for a call of `cost` (`None`: ask per call, or without a
    /// server; 0: a background renewal, no call).
    pub(crate) fn granted(&mut self, g: Granted, cost: u64, now: Instant) -> Option<Decision> {
        if matches!(g, Granted::Unreachable | Granted::Refused) {
            // The lease in hand, if any, stays usable until its end.
            return None;
        }
        self.held = None;
        match g {
            Granted::NotLeasable => {
                self.not_leasable_until = Some(now + NOT_LEASABLE_FOR);
                None
            }
            Granted::Empty(retry_after, why, limits) => {
                let retry_after = retry_after.max(Duration::from_millis(1));
                self.empty_until = Some((now + retry_after, why));
                self.limits = limits;
                if cost == 0 { None } else { Some(Decision::lease_empty(retry_after, why, self.limits.clone())) }
            }
            Granted::Lease { id, granted, ttl, next_in, limits } => {
                (self.ttl, self.limits) = (ttl, limits);
                // Once this lease is spent, the next is not worth asking for
                // before `next_in`.
                self.empty_until = (!next_in.is_zero()).then(|| (now + next_in, SHARE_USED));
                self.held = Some(Held {
                    id,
                    remaining: granted,
                    used: 0,
                    renew_at: now + ttl.mul_f64(RENEW_AT),
                    use_until: now + ttl.mul_f64(USE_UNTIL),
                });
                if cost == 0 {
                    return None;
                }
                // The call that asked was counted when it came.
                self.demand = self.demand.saturating_sub(cost);
                self.local(cost, now)
            }
            Granted::Unreachable | Granted::Refused => None,
        }
    }
}

/// The request for a lease on `req`'s resource and descriptors.
pub(crate) fn request(
    req: &Acquire,
    holder: &str,
    previous: String,
    used: u64,
    want: u64,
    release: bool,
) -> pb::LeaseRequest {
    pb::LeaseRequest {
        resource: req.resource().to_string(),
        descriptors: req.descriptors().clone(),
        want,
        previous_lease_id: previous,
        used,
        holder: holder.to_string(),
        release,
    }
}
