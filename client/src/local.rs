//! `FailMode::Local`: while no server can be reached, the client decides in
//! this process, at its share of what the server last said: a token bucket
//! per limit (so many per window, starting from what the server last said
//! was left, times the share: not full), and the resource's concurrency
//! limit (its share of `max_in_flight` calls at once). What the server says
//! is learned from every answer that looked at the limits (Acquire answers
//! and leases); a denial before the limits (an open breaker, a concurrency
//! limit, shedding) leaves what was learned alone. A question the server
//! never answered has no known limit and is allowed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::decision::{Acquire, Decision, Limit, Source, Verdict};
use crate::permit::{Outcome, Permit, Sink};

/// Questions remembered at most; the least recently asked are forgotten.
const MAX_KEYS: usize = 10_000;

pub(crate) struct LocalLimits {
    share: f64,
    entries: Mutex<HashMap<String, Entry>>,
    slots: Arc<Slots>,
}

struct Entry {
    buckets: Vec<Bucket>,
    used: Instant,
}

#[derive(Clone)]
struct Bucket {
    name: String,
    /// The server's limit and window: the bucket is remade when they change.
    limit: u64,
    window: Duration,
    capacity: f64,
    per_second: f64,
    tokens: f64,
    at: Instant,
}

/// Calls in flight by resource, against the share of its concurrency limit:
/// those this process admitted on its own, and those the server admitted
/// with a slot that are still running (by permit id). A call the server
/// admitted goes on running when the server goes away, so the calls decided
/// locally meanwhile are counted beside it, not from zero.
#[derive(Default)]
struct Slots {
    by_resource: Mutex<HashMap<String, InFlight>>,
    from_server: Mutex<HashMap<String, String>>,
}

#[derive(Clone, Copy, Default)]
struct InFlight {
    /// This process's share of the resource's `max_in_flight` (0: none known).
    cap: u32,
    now: u32,
}

/// One question's identity: its resource and its descriptors, sorted, each
/// part length-prefixed (so no value can pass for another's parts).
pub(crate) fn key(req: &Acquire) -> String {
    let mut pairs: Vec<(&String, &String)> = req.descriptors().iter().collect();
    pairs.sort();
    let size = req.descriptors().iter().map(|(k, v)| k.len() + v.len() + 8).sum::<usize>();
    let mut key = String::with_capacity(req.resource().len() + 4 + size);
    push_part(&mut key, req.resource());
    for (k, v) in pairs {
        push_part(&mut key, k);
        push_part(&mut key, v);
    }
    key
}

/// `s` as `length:s` (by hand: this is on every leased decision's path).
pub(crate) fn push_part(key: &mut String, s: &str) {
    let (mut digits, mut n, mut i) = ([0u8; 20], s.len(), 20);
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        key.push(char::from(d));
    }
    key.push(':');
    key.push_str(s);
}

impl Bucket {
    fn new(l: &Limit, share: f64, now: Instant) -> Bucket {
        let capacity = (l.limit as f64 * share).max(1.0);
        let seconds = l.window.as_secs_f64().max(1e-3);
        Bucket {
            name: l.name.clone(),
            limit: l.limit,
            window: l.window,
            capacity,
            per_second: capacity / seconds,
            tokens: 0.0,
            at: now,
        }
    }

    /// What the server said is left, at this process's share.
    fn told(&mut self, remaining: u64, share: f64, now: Instant) {
        self.tokens = (remaining as f64 * share).min(self.capacity);
        self.at = now;
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.at = now;
    }

    fn wait_for(&self, cost: f64) -> Duration {
        Duration::from_secs_f64(((cost - self.tokens) / self.per_second).max(0.0))
    }
}

impl LocalLimits {
    pub(crate) fn new(share: f64) -> Self {
        LocalLimits { share: share.clamp(0.0, 1.0), entries: Mutex::new(HashMap::new()), slots: Arc::default() }
    }

    /// The server admitted a call of `resource` with a slot of its
    /// concurrency limit (permit `permit_id`): it counts as in flight here
    /// until its permit reports.
    pub(crate) fn server_slot(&self, permit_id: &str, resource: &str) {
        self.slots.hold(permit_id, resource);
    }

    /// The call of a permit the server issued ended.
    pub(crate) fn server_slot_ended(&self, permit_id: &str) {
        self.slots.release(permit_id);
    }

    /// What the server said of a question: its verdict, the limits it
    /// looked at and what they hold, and the resource's concurrency limit.
    pub(crate) fn learn(&self, key: String, resource: &str, verdict: Verdict, limits: &[Limit], max_in_flight: u32) {
        // A denial before the limits says nothing of them (nor, for an open
        // breaker or shedding, of the concurrency limit).
        if matches!(verdict, Verdict::Allowed | Verdict::RateLimited | Verdict::ConcurrencyLimited) {
            self.slots.learn(resource, max_in_flight, self.share);
        }
        if !matches!(verdict, Verdict::Allowed | Verdict::RateLimited) {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = entries.entry(key).or_insert_with(|| Entry { buckets: Vec::new(), used: now });
        entry.used = now;
        let mut buckets = Vec::with_capacity(limits.len());
        for l in limits {
            let same = |b: &Bucket| b.name == l.name && b.limit == l.limit && b.window == l.window;
            let mut b = match entry.buckets.iter().position(same) {
                Some(i) => entry.buckets.swap_remove(i),
                None => Bucket::new(l, self.share, now),
            };
            b.told(l.remaining, self.share, now);
            buckets.push(b);
        }
        entry.buckets = buckets;
        if entries.len() > MAX_KEYS {
            forget_oldest(&mut entries);
        }
    }

    /// A decision in this process: the resource's share of concurrency, and
    /// every known limit, all or nothing.
    pub(crate) fn decide(&self, key: &str, resource: &str, cost: u32) -> Decision {
        let slot = match self.slots.take(resource) {
            Ok(slot) => slot,
            Err(cap) => {
                return Decision {
                    verdict: Verdict::ConcurrencyLimited,
                    retry_after: Duration::from_millis(10),
                    reason: format!(
                        "concurrency limited at {cap} in flight (decided locally: the rate limit service is unreachable)"
                    ),
                    source: Source::Local,
                    ..Decision::fail_open()
                };
            }
        };
        let permit =
            slot.then(|| Permit::new(self.slots.clone(), String::new(), resource, usize::MAX, false, Outcome::Ignored));
        let now = Instant::now();
        let cost = f64::from(cost.max(1));
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = entries.get_mut(key) else {
            return Decision { source: Source::Local, permit, ..Decision::fail_open() };
        };
        entry.used = now;
        entry.buckets.iter_mut().for_each(|b| b.refill(now));
        let short: Vec<&Bucket> = entry.buckets.iter().filter(|b| b.tokens < cost).collect();
        let retry_after = short.iter().map(|b| b.wait_for(cost)).max().unwrap_or_default();
        let denied = !short.is_empty();
        if !denied {
            entry.buckets.iter_mut().for_each(|b| b.tokens -= cost);
        }
        let limits = entry
            .buckets
            .iter()
            .map(|b| {
                let l =
                    Limit::new(b.name.clone(), b.capacity as u64, b.window).with_remaining(b.tokens.max(0.0) as u64);
                if b.tokens < cost && denied { l.exceeded(b.wait_for(cost)) } else { l }
            })
            .collect();
        Decision {
            verdict: if denied { Verdict::RateLimited } else { Verdict::Allowed },
            // Denied: the slot taken goes back as the permit drops.
            permit: if denied { None } else { permit },
            limits,
            retry_after,
            reason: if denied {
                "rate limited (decided locally: the rate limit service is unreachable)".into()
            } else {
                String::new()
            },
            source: Source::Local,
            ..Decision::fail_open()
        }
    }
}

impl Slots {
    fn learn(&self, resource: &str, max_in_flight: u32, share: f64) {
        let mut map = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        if max_in_flight == 0 {
            if map.get(resource).is_some_and(|f| f.now == 0) {
                map.remove(resource);
            } else if let Some(f) = map.get_mut(resource) {
                f.cap = 0;
            }
            return;
        }
        if !map.contains_key(resource) && map.len() >= MAX_KEYS {
            return;
        }
        let cap = ((f64::from(max_in_flight) * share).floor() as u32).max(1);
        map.entry(resource.to_string()).or_default().cap = cap;
    }

    fn hold(&self, permit_id: &str, resource: &str) {
        let mut server = self.from_server.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded like the questions: past it, a call is not counted (the
        // local share may then admit more while the server is away).
        if server.len() >= MAX_KEYS * 10 || server.contains_key(permit_id) {
            return;
        }
        server.insert(permit_id.to_string(), resource.to_string());
        drop(server);
        let mut map = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get_mut(resource) {
            f.now += 1;
        } else if map.len() < MAX_KEYS {
            map.insert(resource.to_string(), InFlight { cap: 0, now: 1 });
        }
    }

    fn release(&self, permit_id: &str) {
        let resource = self.from_server.lock().unwrap_or_else(|e| e.into_inner()).remove(permit_id);
        let Some(resource) = resource else { return };
        let mut map = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get_mut(&resource) {
            f.now = f.now.saturating_sub(1);
        }
    }

    /// A slot of `resource` (`Ok(true)`), no limit known (`Ok(false)`), or
    /// all of this process's share in use (`Err(cap)`).
    fn take(&self, resource: &str) -> Result<bool, u32> {
        let mut map = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(resource) {
            Some(f) if f.cap > 0 && f.now >= f.cap => Err(f.cap),
            Some(f) if f.cap > 0 => {
                f.now += 1;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

impl Sink for Slots {
    /// A local permit's call ended: its slot is free.
    fn send_report(&self, permit: &Permit, _: Outcome, _: Duration, _: crate::permit::Actual) {
        let mut map = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get_mut(permit.resource()) {
            f.now = f.now.saturating_sub(1);
        }
    }
}

fn forget_oldest(entries: &mut HashMap<String, Entry>) {
    let mut ages: Vec<(Instant, String)> = entries.iter().map(|(k, e)| (e.used, k.clone())).collect();
    ages.sort();
    for (_, k) in ages.into_iter().take(MAX_KEYS / 10) {
        entries.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learn(local: &LocalLimits, req: &Acquire, verdict: Verdict, limits: &[Limit]) {
        local.learn(key(req), req.resource(), verdict, limits, 0);
    }

    #[test]
    fn a_share_of_the_last_known_limit_is_enforced_locally_from_what_was_left() {
        let local = LocalLimits::new(0.5);
        let req = Acquire::new("work").descriptor("tenant", "acme");
        assert_eq!(local.decide(&key(&req), "work", 1).verdict, Verdict::Allowed, "nothing known: allowed");
        let minute = Duration::from_secs(60);
        learn(&local, &req, Verdict::Allowed, &[Limit::new("per-tenant", 20, minute).with_remaining(20)]);
        let admitted = (0..30).filter(|_| local.decide(&key(&req), "work", 1).verdict == Verdict::Allowed).count();
        assert_eq!(admitted, 10, "half of 20 per minute");
        let denied = local.decide(&key(&req), "work", 1);
        assert_eq!(denied.verdict, Verdict::RateLimited);
        assert!(denied.retry_after > Duration::ZERO && denied.retry_after <= Duration::from_secs(6));
        assert_eq!(denied.source, Source::Local);
        // The server said 4 are left: 2 at this share, not a full bucket.
        learn(&local, &req, Verdict::Allowed, &[Limit::new("per-tenant", 20, minute).with_remaining(4)]);
        let admitted = (0..30).filter(|_| local.decide(&key(&req), "work", 1).verdict == Verdict::Allowed).count();
        assert_eq!(admitted, 2);
    }

    #[test]
    fn a_denial_before_the_limits_does_not_erase_them() {
        let local = LocalLimits::new(1.0);
        let req = Acquire::new("work").descriptor("user", "u");
        let limit = Limit::new("per-user", 10, Duration::from_secs(10)).with_remaining(9);
        local.learn(key(&req), "work", Verdict::Allowed, std::slice::from_ref(&limit), 5);
        // As the server answers them: a concurrency denial names the limit
        // it hit, an open breaker or shedding nothing.
        local.learn(key(&req), "work", Verdict::ConcurrencyLimited, &[], 5);
        for verdict in [Verdict::CircuitOpen, Verdict::Shed] {
            local.learn(key(&req), "work", verdict, &[], 0);
        }
        let held: Vec<Decision> = (0..15).map(|_| local.decide(&key(&req), "work", 1)).collect();
        assert_eq!(held.iter().filter(|d| d.is_allowed()).count(), 5, "the concurrency limit still applies");
        drop(held);
        let admitted = (0..15).filter(|_| local.decide(&key(&req), "work", 1).verdict == Verdict::Allowed).count();
        assert_eq!(admitted, 9 - 5, "and the 9 left: 5 were taken, 4 remain");
    }

    #[test]
    fn the_concurrency_limit_applies_at_the_share_and_a_dropped_permit_frees_its_slot() {
        let local = LocalLimits::new(0.5);
        let req = Acquire::new("db");
        local.learn(key(&req), "db", Verdict::Allowed, &[], 5);
        let held: Vec<Decision> = (0..20).map(|_| local.decide(&key(&req), "db", 1)).collect();
        let allowed = held.iter().filter(|d| d.is_allowed()).count();
        assert_eq!(allowed, 2, "half of 5, rounded down");
        let denied = held.iter().find(|d| !d.is_allowed()).unwrap();
        assert_eq!(denied.verdict, Verdict::ConcurrencyLimited);
        drop(held);
        assert!(local.decide(&key(&req), "db", 1).is_allowed(), "the slots came back");
    }

    /// Calls the server admitted are still running when it goes away: the
    /// calls decided here count beside them, so the resource never has more
    /// in flight than its limit.
    #[test]
    fn calls_the_server_admitted_still_hold_their_slots_when_deciding_locally() {
        let local = LocalLimits::new(1.0);
        let req = Acquire::new("db");
        local.learn(key(&req), "db", Verdict::Allowed, &[], 4);
        for id in ["p1", "p2", "p3"] {
            local.server_slot(id, "db");
        }
        local.server_slot("p3", "db");
        let first = local.decide(&key(&req), "db", 1);
        assert!(first.is_allowed(), "3 of 4 in flight: one more");
        assert_eq!(local.decide(&key(&req), "db", 1).verdict, Verdict::ConcurrencyLimited, "4 of 4");
        local.server_slot_ended("p1");
        local.server_slot_ended("p1");
        let again = local.decide(&key(&req), "db", 1);
        assert!(again.is_allowed(), "a server call ended (once): one slot");
        assert_eq!(local.decide(&key(&req), "db", 1).verdict, Verdict::ConcurrencyLimited);
    }

    #[test]
    fn the_key_is_the_resource_and_its_sorted_descriptors_unambiguously() {
        let a = Acquire::new("r").descriptor("b", "2").descriptor("a", "1");
        let b = Acquire::new("r").descriptor("a", "1").descriptor("b", "2");
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&Acquire::new("r").descriptor("a", "1")));
        let x = Acquire::new("r").descriptor("user", "x").descriptor("org", "1\u{1f}user=x");
        let y = Acquire::new("r").descriptor("org", "1").descriptor("user", "x\u{1f}user=x");
        assert_ne!(key(&x), key(&y));
        assert_eq!(key(&Acquire::new("orders").descriptor("user", "ann")), "6:orders4:user3:ann");
        let long = "x".repeat(1234);
        assert!(key(&Acquire::new(long.clone())).starts_with("1234:x"));
        let z = Acquire::new("r").descriptor("a", "1:b");
        let w = Acquire::new("r").descriptor("a", "1").descriptor("b", "");
        assert_ne!(key(&z), key(&w));
    }
}
