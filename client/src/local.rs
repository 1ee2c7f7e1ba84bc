//! `FailMode::Local`: while no server can be reached, the client decides in
//! this process, with a token bucket per limit at its share of what the server
//! last reported for the same question (so many per window). A question the
//! server never answered has no known limit and is allowed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::decision::{Acquire, Decision, Limit, Source, Verdict};

/// Questions remembered at most; the least recently asked are forgotten.
const MAX_KEYS: usize = 10_000;

pub(crate) struct LocalLimits {
    share: f64,
    entries: Mutex<HashMap<String, Entry>>,
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

/// One question's identity: its resource and descriptors.
pub(crate) fn key(req: &Acquire) -> String {
    let mut pairs: Vec<(&String, &String)> = req.descriptors().iter().collect();
    pairs.sort();
    let mut key = req.resource().to_string();
    for (k, v) in pairs {
        key.push('\u{1f}');
        key.push_str(k);
        key.push('=');
        key.push_str(v);
    }
    key
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
            tokens: capacity,
            at: now,
        }
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
        LocalLimits { share: share.clamp(0.0, 1.0), entries: Mutex::new(HashMap::new()) }
    }

    /// What the server said of a question's limits.
    pub(crate) fn learn(&self, key: String, limits: &[Limit]) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = entries.entry(key).or_insert_with(|| Entry { buckets: Vec::new(), used: now });
        entry.used = now;
        let same = entry.buckets.len() == limits.len()
            && entry
                .buckets
                .iter()
                .zip(limits)
                .all(|(b, l)| b.name == l.name && b.limit == l.limit && b.window == l.window);
        if !same {
            entry.buckets = limits.iter().map(|l| Bucket::new(l, self.share, now)).collect();
        }
        if entries.len() > MAX_KEYS {
            forget_oldest(&mut entries);
        }
    }

    /// A decision in this process: every known limit, all or nothing.
    pub(crate) fn decide(&self, key: &str, cost: u32) -> Decision {
        let now = Instant::now();
        let cost = f64::from(cost.max(1));
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = entries.get_mut(key) else {
            return Decision { source: Source::Local, ..Decision::fail_open() };
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

    #[test]
    fn a_share_of_the_last_known_limit_is_enforced_locally() {
        let local = LocalLimits::new(0.5);
        let req = Acquire::new("work").descriptor("tenant", "acme");
        assert_eq!(local.decide(&key(&req), 1).verdict, Verdict::Allowed, "nothing known: allowed");
        local.learn(key(&req), &[Limit::new("per-tenant", 20, Duration::from_secs(60))]);
        let admitted = (0..30).filter(|_| local.decide(&key(&req), 1).verdict == Verdict::Allowed).count();
        assert_eq!(admitted, 10, "half of 20 per minute");
        let denied = local.decide(&key(&req), 1);
        assert_eq!(denied.verdict, Verdict::RateLimited);
        assert!(denied.retry_after > Duration::ZERO && denied.retry_after <= Duration::from_secs(6));
        assert_eq!(denied.source, Source::Local);
    }

    #[test]
    fn the_key_is_the_resource_and_its_sorted_descriptors() {
        let a = Acquire::new("r").descriptor("b", "2").descriptor("a", "1");
        let b = Acquire::new("r").descriptor("a", "1").descriptor("b", "2");
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&Acquire::new("r").descriptor("a", "1")));
    }
}
