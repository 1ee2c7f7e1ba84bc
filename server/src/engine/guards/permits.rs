//! Permits: handed out by an admitted Acquire when the resource has a breaker
//! or a concurrency limit, returned by ReportOutcome, or expired after their
//! TTL so that a crashed client never holds a slot forever.
//!
//! An id is 24 hex digits: this process's random nonce, then a sequence number
//! ([`check_permit_id`](crate::engine::request::check_permit_id)). Anything else is
//! malformed (bad input); a well-formed id this process did not issue, or no
//! longer holds, is unknown (answered `counted: false`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

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

pub struct Permits {
    map: DashMap<u64, Permit, ahash::RandomState>,
    next: AtomicU64,
    nonce: u32,
}

impl Default for Permits {
    fn default() -> Self {
        Permits { map: DashMap::default(), next: AtomicU64::new(1), nonce: rand_nonce() }
    }
}

/// A nonce that differs between processes (and restarts) with high probability.
fn rand_nonce() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = ahash::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.write_u32(std::process::id());
    h.finish() as u32
}

impl Permits {
    pub fn issue(&self, permit: Permit) -> String {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        self.map.insert(seq, permit);
        format!("{:08x}{seq:016x}", self.nonce)
    }

    /// Takes a permit back: `Ok(None)` when unknown or already returned. A
    /// non-empty `resource` must be the one the permit was issued for.
    pub fn take(&self, id: &str, resource: &str) -> Result<Option<Permit>, RequestError> {
        let (nonce, seq) = crate::engine::request::check_permit_id(id)?;
        if nonce != self.nonce {
            return Ok(None);
        }
        if let Some(p) = self.map.remove_if(&seq, |_, p| resource.is_empty() || p.resource == resource) {
            return Ok(Some(p.1));
        }
        match self.map.get(&seq) {
            Some(p) => Err(RequestError::PermitResourceMismatch {
                permit: id.into(),
                issued_for: p.resource.clone(),
                resource: resource.into(),
            }),
            None => Ok(None),
        }
    }

    /// Removes and returns every permit expired at `now`.
    pub fn expire(&self, now: Timestamp) -> Vec<Permit> {
        let expired: Vec<u64> = self.map.iter().filter(|e| e.expires_at <= now).map(|e| *e.key()).collect();
        expired.into_iter().filter_map(|k| self.map.remove(&k).map(|(_, p)| p)).collect()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
