//! A resource's concurrency limit beyond the count: what the limit is now
//! (the rule's, or what its adaptive limit found), partitions by priority,
//! and the samples an adaptive limit learns from.
//!
//! Partitions follow Netflix's partitioned limiter: a call of a class
//! holding less than its guaranteed share of the limit is admitted even
//! when the limit is reached; a call of a class at or past its share only
//! while the limit has room. So a class may borrow what the others leave
//! idle, and gets its share back as the borrowed calls finish: the calls in
//! flight may pass the limit by at most the guarantees not yet used.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Guarded;
use crate::adaptive::{Controller, Estimator, Window};
use crate::rules::{AdaptiveConfig, Concurrency, Partitions, Priority};
use crate::time::Timestamp;

impl Guarded {
    /// The limit on calls in flight now: the rule's, or what its adaptive
    /// limit found (its `initial` until a window closed).
    pub fn limit(&self, c: &Concurrency) -> u32 {
        match &c.adaptive {
            None => c.max_in_flight,
            Some(a) => match self.limit.load(Ordering::Acquire) {
                0 => c.initial_limit(),
                n => n.clamp(a.min, a.max),
            },
        }
    }

    /// Takes a slot for a call of `class` if the cap allows it (`None`: no
    /// cap), keeping the partitions' guarantees.
    pub(crate) fn try_take_for(&self, cap: Option<u32>, class: Priority, partitions: &Partitions) -> bool {
        let cap = cap.map(|cap| match partitions.guaranteed(cap, class) {
            0 => cap,
            g if self.in_flight_of(class) < g => cap.saturating_add(g),
            _ => cap,
        });
        if !self.try_take_slot_within(cap) {
            return false;
        }
        self.by_class[class.index()].fetch_add(1, Ordering::AcqRel);
        self.peak.fetch_max(self.in_flight(), Ordering::AcqRel);
        true
    }

    /// A slot of `class` came back (with [`Guarded::release_slot`]).
    pub(crate) fn release_class(&self, class: Priority) {
        let _ = self.by_class[class.index()].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Calls of `class` in flight here.
    pub(crate) fn in_flight_of(&self, class: Priority) -> u32 {
        self.by_class[class.index()].load(Ordering::Acquire)
    }

    /// The adaptive limit's state, made or reconfigured for `cfg`.
    pub fn controller(&self, cfg: &AdaptiveConfig, now: Timestamp) -> MutexGuard<'_, Option<Controller>> {
        let mut slot = self.adaptive.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_mut() {
            Some(c) => c.reconfigure(*cfg, seed(now)),
            None => *slot = Some(Controller::new(*cfg, now, seed(now))),
        }
        slot
    }

    /// The adaptive state as it is, if there is one.
    pub fn current_controller(&self) -> MutexGuard<'_, Option<Controller>> {
        self.adaptive.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call came back after `latency`, or dropped (`None`: it failed, or
    /// its permit expired).
    pub fn sample(&self, cfg: &AdaptiveConfig, now: Timestamp, latency: Option<Duration>) {
        let mut slot = self.controller(cfg, now);
        let Some(c) = slot.as_mut() else { return };
        match latency {
            Some(l) => c.window_mut().sample(l),
            None => c.window_mut().drop_one(),
        }
    }

    /// Closes the window if it is over, this replica deciding alone: the
    /// new limit, when the window had samples enough.
    pub(crate) fn close_window(&self, cfg: &AdaptiveConfig, now: Timestamp) -> Option<u32> {
        let mut slot = self.controller(cfg, now);
        let c = slot.as_mut()?;
        if !c.due(now) {
            return None;
        }
        let w = self.take_from(c, now);
        let limit = c.apply(now, &w);
        self.limit.store(c.limit(), Ordering::Release);
        limit
    }

    /// Takes the window being gathered, for the fleet's (the sync).
    pub fn take_window(&self, cfg: &AdaptiveConfig, now: Timestamp) -> Window {
        let mut slot = self.controller(cfg, now);
        match slot.as_mut() {
            Some(c) => self.take_from(c, now),
            None => Window::default(),
        }
    }

    fn take_from(&self, c: &mut Controller, now: Timestamp) -> Window {
        // The calls still in flight are the next window's first peak.
        let peak = self.peak.swap(self.in_flight(), Ordering::AcqRel);
        c.window_mut().in_flight(peak.max(self.in_flight()));
        c.take_window(now)
    }

    /// Runs the algorithm on the fleet's merged window (this replica closes
    /// it for all): the new limit, if the window had samples enough.
    pub fn apply_window(&self, cfg: &AdaptiveConfig, now: Timestamp, w: &Window) -> Option<u32> {
        let mut slot = self.controller(cfg, now);
        let c = slot.as_mut()?;
        let limit = c.apply(now, w);
        self.limit.store(c.limit(), Ordering::Release);
        limit
    }

    /// Adopts the fleet's state, as the replica that closed the window
    /// `merged` left it.
    pub fn adopt(&self, cfg: &AdaptiveConfig, now: Timestamp, e: Estimator, merged: Option<&Window>) {
        let mut slot = self.controller(cfg, now);
        let Some(c) = slot.as_mut() else { return };
        c.adopt(now, e, merged);
        self.limit.store(c.limit(), Ordering::Release);
    }
}

/// A Vegas probe's jitter differs between resources and replicas.
fn seed(now: Timestamp) -> u64 {
    std::hash::BuildHasher::hash_one(&ahash::RandomState::new(), now.as_nanos())
}
