//! Idempotency keys of Charge: a retried charge, sent again with the key of
//! the first, takes nothing. With Redis, the key is claimed there (`SET NX`
//! with a time to live), so that a retry sent to another replica is caught
//! too; without it, or while it does not answer, this replica's memory of
//! the keys it saw decides.
//!
//! The memory is two generations of hashed keys: the current one takes new
//! keys, and both are looked in. A generation turns old after the keys'
//! lifetime, or sooner when it is full, so that a flood of keys costs a
//! bounded amount of memory (at worst the oldest keys are forgotten early).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use crate::engine::request::Descriptors;
use crate::time::Timestamp;

/// How long a key is remembered (at least, unless a flood fills a generation).
pub const KEY_LIFETIME: Duration = Duration::from_secs(600);
/// Keys a generation holds, at most (about 16 bytes each, and the set's slack).
const GENERATION: usize = 500_000;
/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 128;

pub(crate) struct ChargedKeys {
    held: Mutex<Generations>,
}

struct Generations {
    current: HashSet<u128>,
    previous: HashSet<u128>,
    /// When `current` started taking keys.
    since: Timestamp,
}

impl ChargedKeys {
    pub fn new(now: Timestamp) -> Self {
        ChargedKeys { held: Mutex::new(Generations { current: HashSet::new(), previous: HashSet::new(), since: now }) }
    }

    /// The key's hash, with its resource and descriptors (a key names a
    /// charge of one resource for one caller: two tenants that use the same
    /// request ids do not share keys): 128 bits of its SHA-256, the same on
    /// every replica (so that Redis holds one entry whichever replica claims
    /// it), and no caller can choose a key that collides with another's.
    pub fn hash<D: Descriptors + ?Sized>(&self, resource: &str, descriptors: &D, key: &str) -> u128 {
        let mut pairs: Vec<(&str, &str)> = descriptors.entries().collect();
        pairs.sort_unstable();
        let mut text = format!("{resource}\u{1f}{key}");
        for (k, v) in pairs {
            text.push('\u{1f}');
            text.push_str(k);
            text.push('\u{1e}');
            text.push_str(v);
        }
        let digest = crate::digest::digest(&text);
        let hex = digest.rsplit(':').next().unwrap_or_default();
        u128::from_str_radix(hex, 16).unwrap_or_default()
    }

    /// Notes the key; false when it was noted before (within its lifetime).
    pub fn first(&self, hash: u128, now: Timestamp) -> bool {
        let mut g = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let age = std::time::Duration::from_nanos(now.saturating_since(g.since));
        if age >= KEY_LIFETIME || g.current.len() >= GENERATION {
            g.previous = std::mem::take(&mut g.current);
            g.since = now;
        }
        if g.previous.contains(&hash) {
            return false;
        }
        g.current.insert(hash)
    }
}

/// Checks a key: at most 128 bytes, no control characters.
pub fn check_key(key: &str) -> Result<(), crate::engine::request::RequestError> {
    use crate::engine::request::RequestError;
    if key.len() > MAX_KEY_BYTES {
        let message = format!("{} bytes; the limit is {MAX_KEY_BYTES}", key.len());
        return Err(RequestError::OutOfRange { field: "idempotency_key", message });
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(RequestError::ControlCharacter { field: "idempotency_key".into(), code: u32::from(c) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_first_once_per_resource_and_forgotten_after_its_lifetime() {
        let t0 = Timestamp::from_secs(1_000);
        let keys = ChargedKeys::new(t0);
        let acme = [("tenant", "acme")];
        let a = keys.hash("chat", &acme[..], "k1");
        assert_ne!(a, keys.hash("other", &acme[..], "k1"), "a key names a charge of one resource");
        assert_ne!(a, keys.hash("chat", &[("tenant", "initech")][..], "k1"), "and of one caller");
        assert!(keys.first(a, t0));
        assert!(!keys.first(a, t0.saturating_add(Duration::from_secs(1))));
        // Into the next generation, still remembered.
        assert!(!keys.first(a, t0.saturating_add(KEY_LIFETIME + Duration::from_secs(1))));
        // Two lifetimes after it was noted, forgotten.
        assert!(keys.first(a, t0.saturating_add(KEY_LIFETIME * 2 + Duration::from_secs(2))));
        assert!(check_key(&"k".repeat(129)).is_err());
        assert!(check_key("a\nb").is_err());
        assert!(check_key("retry-7f3a").is_ok());
    }

    #[test]
    fn a_flood_of_keys_turns_generations_and_stays_bounded() {
        let t0 = Timestamp::from_secs(1_000);
        let keys = ChargedKeys::new(t0);
        for i in 0..(GENERATION * 2 + 10) {
            assert!(keys.first(keys.hash("r", &[("u", "1")][..], &i.to_string()), t0));
        }
        let g = keys.held.lock().unwrap();
        assert!(g.current.len() + g.previous.len() <= GENERATION * 2);
    }
}
