//! Permits: handed out by an admitted Acquire when the resource has a breaker
//! or a concurrency limit, returned by ReportOutcome, or expired after their
//! TTL so that a crashed client never holds a slot forever.
//!
//! An id is 128 bits written as 32 hex digits
//! ([`check_permit_id`](crate::request::check_permit_id)): the first
//! 32 name the process that issued it (random, chosen at start), the other
//! 96 come from a cryptographic generator, so a caller cannot guess another
//! caller's permit to report on it. A replica given a permit another one
//! issued passes the report on to it (`replication::forward`). Anything else
//! is malformed (bad input); a well-formed id no replica holds is unknown
//! (answered `counted: false`). No answer says whose a permit is.

use std::sync::Arc;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::Guarded;
pub use crate::permit_id::PermitId;
use crate::request::RequestError;
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
    /// The priority whose slot it holds (its partition).
    pub class: crate::rules::Priority,
    /// The slot is also in the fleet's in-flight set in Redis (strict).
    pub strict_slot: bool,
}

#[derive(Default)]
pub struct Permits {
    map: DashMap<u128, Permit, ahash::RandomState>,
}

impl Permits {
    /// Issues `permit` under `id` (a strict slot taken in Redis under it);
    /// under a fresh id should `id` be in use (96 random bits: never).
    pub(crate) fn issue_as(&self, id: PermitId, permit: Permit) -> PermitId {
        match self.map.entry(id.get()) {
            Entry::Vacant(slot) => {
                slot.insert(permit);
                id
            }
            Entry::Occupied(_) => self.issue(permit),
        }
    }

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
    pub fn take(&self, id: &str, resource: &str) -> Result<Option<(PermitId, Permit)>, RequestError> {
        let key = crate::request::check_permit_id(id)?;
        if let Some((k, p)) = self.map.remove_if(&key, |_, p| resource.is_empty() || p.resource == resource) {
            return Ok(PermitId::from_raw(k).map(|id| (id, p)));
        }
        if self.map.contains_key(&key) {
            return Err(RequestError::PermitResourceMismatch { resource: resource.into() });
        }
        Ok(None)
    }

    /// Removes and returns every permit expired at `now`.
    pub fn expire(&self, now: Timestamp) -> Vec<(PermitId, Permit)> {
        let expired: Vec<u128> = self.map.iter().filter(|e| e.expires_at <= now).map(|e| *e.key()).collect();
        expired
            .into_iter()
            .filter_map(|k| self.map.remove(&k).and_then(|(k, p)| Some((PermitId::from_raw(k)?, p))))
            .collect()
    }

    /// The permits holding a strict slot, by resource: (id, expiry) each.
    /// A permit holding a slot of a resource whose limit is strict now
    /// (`strict(resource)`: its rule changed since) becomes one, so that the
    /// fleet's set counts it and it gives its slot back there.
    pub fn strict_slots(
        &self,
        strict: impl Fn(&str) -> bool,
    ) -> std::collections::HashMap<String, Vec<(PermitId, Timestamp)>> {
        let mut by_resource: std::collections::HashMap<String, Vec<(PermitId, Timestamp)>> = Default::default();
        for mut e in self.map.iter_mut() {
            if !e.strict_slot && e.holds_slot && strict(&e.resource) {
                e.strict_slot = true;
            }
            if !e.strict_slot {
                continue;
            }
            if let Some(id) = PermitId::from_raw(*e.key()) {
                by_resource.entry(e.resource.clone()).or_default().push((id, e.expires_at));
            }
        }
        by_resource
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
            class: Default::default(),
            strict_slot: false,
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
        // The first 8 digits name this process; after them, consecutive ids
        // share no long prefix: nothing to count up from.
        let tag = format!("{:08x}", PermitId::tag());
        assert!(ids.iter().all(|id| id.starts_with(&tag)));
        let random = |id: &String| id[8..].to_string();
        let shared = ids
            .windows(2)
            .map(|w| random(&w[0]).bytes().zip(random(&w[1]).bytes()).take_while(|(a, b)| a == b).count())
            .max();
        assert!(shared.unwrap() < 8, "consecutive ids share a prefix of {shared:?} digits");
        let issuer = crate::request::check_permit_id(&ids[0]).map(PermitId::issuer);
        assert_eq!(issuer, Ok(PermitId::tag()));
    }

    #[test]
    fn a_wrong_resource_does_not_say_whose_permit_it_is() {
        let p = Permits::default();
        let id = p.issue(permit("secret-payments-db")).to_string();
        let err = p.take(&id, "other").unwrap_err().to_string();
        assert!(!err.contains("secret"), "{err}");
        assert!(p.take(&id, "secret-payments-db").unwrap().is_some_and(|(taken, _)| taken.to_string() == id));
        assert!(p.take(&id, "secret-payments-db").unwrap().is_none(), "once");
    }
}
