//! Permits: handed out by an admitted Acquire when the resource has a breaker
//! or a concurrency limit, returned by ReportOutcome, or expired after their
//! TTL so that a crashed client never holds a slot forever.
//!
//! An id is 128 random bits from a cryptographic generator, written as 32 hex
//! digits ([`check_permit_id`](crate::engine::request::check_permit_id)): a
//! caller cannot guess another caller's permit to report on it. Anything else
//! is malformed (bad input); a well-formed id this process did not issue, or
//! no longer holds, is unknown (answered `counted: false`). No answer says
//! whose a permit is.

use std::sync::Arc;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::Guarded;
use crate::engine::request::RequestError;
use crate::time::Timestamp;

#[derive(Debug)]
pub struct Permit {
    pub resource: String,
    pub guarded: Arc<Guarded>,
    pub issued_at: Timestamp,
    pub expires_at: Timestamp,
    /// The breaker's generation when admitted, and whether this is a probe.
    pub breaker: Option<(u64, bool)>,
    /// A probe granted by the shared breaker: its shared generation.
    pub remote_probe: Option<u64>,
    /// Holds one of the resource's concurrency slots.
    pub holds_slot: bool,
}

#[derive(Default)]
pub struct Permits {
    map: DashMap<u128, Permit, ahash::RandomState>,
}

/// A permit's id: 128 random bits, never 0, written as 32 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PermitId(std::num::NonZeroU128);

impl PermitId {
    /// A fresh id. ThreadRng: ChaCha12, seeded and reseeded from the
    /// operating system.
    pub fn random() -> PermitId {
        loop {
            if let Some(id) = std::num::NonZeroU128::new(rand::random()) {
                return PermitId(id);
            }
        }
    }

    pub fn get(self) -> u128 {
        self.0.get()
    }
}

impl std::fmt::Display for PermitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0.get())
    }
}

impl Permits {
    pub fn issue(&self, permit: Permit) -> PermitId {
        let mut permit = Some(permit);
        loop {
            let id = PermitId::random();
            if let Entry::Vacant(slot) = self.map.entry(id.get()) {
                slot.insert(permit.take().expect("inserted once"));
                return id;
            }
        }
    }

    /// Takes a permit back: `Ok(None)` when unknown or already returned. A
    /// non-empty `resource` must be the one the permit was issued for.
    pub fn take(&self, id: &str, resource: &str) -> Result<Option<Permit>, RequestError> {
        let key = crate::engine::request::check_permit_id(id)?;
        if let Some((_, p)) = self.map.remove_if(&key, |_, p| resource.is_empty() || p.resource == resource) {
            return Ok(Some(p));
        }
        if self.map.contains_key(&key) {
            return Err(RequestError::PermitResourceMismatch { resource: resource.into() });
        }
        Ok(None)
    }

    /// Removes and returns every permit expired at `now`.
    pub fn expire(&self, now: Timestamp) -> Vec<Permit> {
        let expired: Vec<u128> = self.map.iter().filter(|e| e.expires_at <= now).map(|e| *e.key()).collect();
        expired.into_iter().filter_map(|k| self.map.remove(&k).map(|(_, p)| p)).collect()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permit(resource: &str) -> Permit {
        Permit {
            resource: resource.into(),
            guarded: Arc::default(),
            issued_at: Timestamp::ZERO,
            expires_at: Timestamp::from_secs(60),
            breaker: None,
            remote_probe: None,
            holds_slot: false,
        }
    }

    #[test]
    fn ids_are_128_random_bits_and_do_not_follow_each_other() {
        let p = Permits::default();
        let ids: Vec<String> = (0..1000).map(|_| p.issue(permit("r")).to_string()).collect();
        assert!(ids.iter().all(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())));
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 1000);
        // Consecutive ids share no long prefix: nothing to count up from.
        let shared = ids.windows(2).map(|w| w[0].bytes().zip(w[1].bytes()).take_while(|(a, b)| a == b).count()).max();
        assert!(shared.unwrap() < 8, "consecutive ids share a prefix of {shared:?} digits");
    }

    #[test]
    fn a_wrong_resource_does_not_say_whose_permit_it_is() {
        let p = Permits::default();
        let id = p.issue(permit("secret-payments-db")).to_string();
        let err = p.take(&id, "other").unwrap_err().to_string();
        assert!(!err.contains("secret"), "{err}");
        assert!(p.take(&id, "secret-payments-db").unwrap().is_some());
        assert!(p.take(&id, "secret-payments-db").unwrap().is_none(), "once");
    }
}
