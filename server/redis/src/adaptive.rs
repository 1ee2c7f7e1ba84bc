//! Adaptive concurrency limits for the fleet (SPEC section 5): every sync,
//! each replica adds the window it gathered to the fleet's in Redis
//! (adaptive.lua). The replica whose push finds the fleet's window over
//! runs the algorithm on it, from the state the last one published, and
//! publishes the new state; the others adopt it at their next push. So one
//! limit follows every caller's latency whichever replica they ask, and a
//! replica that dies between taking a window and publishing loses that
//! window only. While Redis cannot answer, each replica adapts from its own
//! samples (`Engine::adapts_alone`), and what it found is where the fleet
//! goes on from should Redis come back empty.

use super::Breakers;
use std::time::Duration;

use super::scripts::{ScriptName, adaptive_key};
use super::wire::{self, AdaptiveReply};
use floodgate_core::adaptive::Estimator;
use floodgate_engine::Installed;
use floodgate_engine::guards::Guarded;
use floodgate_rules::AdaptiveConfig;

/// A resource without calls this long is not pushed (its limit stays).
const QUIET: Duration = Duration::from_secs(10);

impl Breakers<'_> {
    /// Pushes every active adaptive limit's window; closes the fleet's
    /// windows that are over. False when Redis did not answer one.
    pub(super) async fn sync_adaptive(&self, rules: &Installed) -> bool {
        let now = self.engine.clock().now();
        let mut ok = true;
        for (resource, g) in self.engine.views().all_guarded() {
            let Some(c) = rules.rules.find(&resource).and_then(|r| r.concurrency) else { continue };
            let Some(a) = c.adaptive.filter(|_| c.sync.is_shared()) else { continue };
            let due = g.current_controller().as_mut().is_some_and(|c| c.push_due(now));
            if !due || !g.active_within(now, QUIET) {
                continue;
            }
            ok &= self.push_window(&resource, &g, &a).await;
        }
        ok
    }

    async fn push_window(&self, resource: &str, g: &Guarded, a: &AdaptiveConfig) -> bool {
        let now = self.engine.clock().now();
        let w = g.take_window(a, now);
        let key = adaptive_key(resource);
        let mut invocation = self.scripts.get(ScriptName::Adaptive).prepare_invoke();
        invocation
            .key(&key)
            .arg("push")
            .arg(&self.instance)
            .arg(a.window.as_millis().min(u128::from(u32::MAX)) as u64)
            .arg(a.min_samples)
            .arg(w.samples)
            .arg(w.rtt_sum_us)
            .arg(w.min_rtt_us)
            .arg(w.max_in_flight)
            .arg(w.drops);
        let Some(reply) = self.run(ScriptName::Adaptive, invocation, wire::parse_adaptive_push).await else {
            // Not added to the fleet's: kept for the next push, or for this
            // replica's own window should Redis stay away.
            if let Some(c) = g.current_controller().as_mut() {
                c.put_back(&w);
            }
            return false;
        };
        match reply {
            AdaptiveReply::Open { version, state, last } => {
                let fresh = g.current_controller().as_ref().is_some_and(|c| c.fleet_version() != Some(version));
                if let (true, Some(e)) = (fresh, Estimator::decode(&state, a)) {
                    g.adopt(a, now, e, last.as_ref());
                    if let Some(c) = g.current_controller().as_mut() {
                        c.set_fleet_version(version);
                    }
                }
                true
            }
            AdaptiveReply::Close { version, state, window } => {
                // From the fleet's state; from this replica's own when Redis
                // has none (new, or it came back empty).
                // A state that does not decode (corrupted) is ignored.
                if let Some(e) = Estimator::decode(&state, a) {
                    g.adopt(a, now, e, None);
                }
                g.apply_window(a, now, &window);
                let Some(state) = g.current_controller().as_ref().map(|c| c.estimator().encode()) else { return true };
                let mut invocation = self.scripts.get(ScriptName::Adaptive).prepare_invoke();
                invocation.key(&key).arg("publish").arg(version).arg(state).arg(wire::window_text(&window));
                match self.run(ScriptName::Adaptive, invocation, wire::parse_adaptive_publish).await {
                    Some(stored) => {
                        if let (Some(v), Some(c)) = (stored, g.current_controller().as_mut()) {
                            c.set_fleet_version(v);
                        }
                        true
                    }
                    None => false,
                }
            }
        }
    }
}
