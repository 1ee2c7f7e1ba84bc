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

use crate::decision::{Acquire, Decision};

/// Keys with a lease (or a refusal) remembered; beyond, calls are asked.
pub(crate) const MAX_KEYS: usize = 10_000;
/// How long a "cannot be leased" is remembered.
const NOT_LEASABLE_FOR: Duration = Duration::from_secs(30);
/// A lease is renewed once this share of its time has passed...
const RENEW_AT: f64 = 0.6;
/// ... and not used past this share (the server's clock may run ahead).
const USE_UNTIL: f64 = 0.9;

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
    /// Nothing was left: denied locally until then.
    empty_until: Option<Instant>,
    /// Units the previous lease used: the next asks for about twice that.
    last_used: u64,
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
    Empty(Duration),
    Lease {
        id: String,
        granted: u64,
        ttl: Duration,
    },
    /// No server answered.
    Unreachable,
    /// The server refused the request as bad input: ask per call (and get the error).
    Refused,
}

impl Leases {
    pub(crate) fn new() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        Leases { holder: format!("pid-{}-{:x}", std::process::id(), nanos & 0xffff_ffff), map: Mutex::default() }
    }

    /// The state of `key`, `None` when the table is full.
    pub(crate) fn cell(&self, key: String) -> Option<Arc<tokio::sync::Mutex<State>>> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(&key) {
            return Some(c.clone());
        }
        if map.len() >= MAX_KEYS {
            return None;
        }
        Some(map.entry(key).or_default().clone())
    }

    pub(crate) fn cells(&self) -> Vec<Arc<tokio::sync::Mutex<State>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }
}

impl State {
    /// Decides from the lease when it can: `Some` allowed (units taken) or
    /// denied (nothing was left); `None` when the server must be asked
    /// (for a lease, or per call).
    pub(crate) fn local(&mut self, cost: u64, now: Instant) -> Option<Decision> {
        if let Some(h) = &mut self.held
            && now < h.use_until
            && h.remaining >= cost
        {
            h.remaining -= cost;
            h.used += cost;
            return Some(Decision::leased());
        }
        if let Some(until) = self.empty_until.filter(|u| *u > now) {
            return Some(Decision::lease_empty(until - now));
        }
        None
    }

    pub(crate) fn not_leasable(&self, now: Instant) -> bool {
        self.not_leasable_until.is_some_and(|u| u > now)
    }

    /// What to ask: (previous lease, units it used, units wanted: about
    /// twice what the last lease used; the first time, a fair share).
    pub(crate) fn renewal(&self, cost: u64) -> (String, u64, u64) {
        match &self.held {
            Some(h) => (h.id.clone(), h.used, (h.used * 2).max(cost)),
            None if self.last_used > 0 => (String::new(), 0, (self.last_used * 2).max(cost)),
            None => (String::new(), 0, 0),
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
        if let Some(h) = self.held.take() {
            self.last_used = h.used;
        }
        match g {
            Granted::NotLeasable => {
                self.not_leasable_until = Some(now + NOT_LEASABLE_FOR);
                None
            }
            Granted::Empty(retry_after) => {
                self.empty_until = Some(now + retry_after.max(Duration::from_millis(1)));
                if cost == 0 { None } else { Some(Decision::lease_empty(retry_after)) }
            }
            Granted::Lease { id, granted, ttl } => {
                self.empty_until = None;
                self.held = Some(Held {
                    id,
                    remaining: granted,
                    used: 0,
                    renew_at: now + ttl.mul_f64(RENEW_AT),
                    use_until: now + ttl.mul_f64(USE_UNTIL),
                });
                if cost == 0 { None } else { self.local(cost, now) }
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
