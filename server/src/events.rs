//! Breaker transitions, degradation level changes and rule reloads: each is a
//! log line, a metric and an event on a bounded broadcast channel that Watch
//! streams read. A slow reader never slows a publisher: it falls behind, loses
//! events, and is told so (it then takes a fresh snapshot).

use std::sync::Arc;

use ::metrics::{counter, gauge};
use tokio::sync::broadcast;

use crate::breaker::Transition;
use crate::degradation::LevelChange;
use crate::metrics;

/// Events kept for slow readers before they fall behind.
pub const CAPACITY: usize = 1024;

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// `rule` is the rule that made the breaker: the metric label.
    Breaker {
        resource: String,
        rule: String,
        transition: Transition,
    },
    Degradation(LevelChange),
    /// `patterns`: the rule patterns now in force, in file order.
    Rules {
        version: u64,
        source: String,
        patterns: Arc<[String]>,
    },
    /// Overrides set at run time were set, deleted or reached their expiry.
    Overrides {
        version: u64,
        set: Vec<String>,
        deleted: Vec<String>,
        expired: Vec<String>,
    },
}

#[derive(Clone)]
pub struct Events {
    tx: broadcast::Sender<Arc<Event>>,
}

impl Default for Events {
    fn default() -> Self {
        Events { tx: broadcast::channel(CAPACITY).0 }
    }
}

impl Events {
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    pub fn publish(&self, event: Event) {
        match &event {
            Event::Breaker { resource, rule, transition: t } => {
                let (from, to) = (t.from.name(), t.to.name());
                tracing::info!(resource = resource.escape_debug().to_string(), rule, from, to, reason = %t.reason, "breaker transition");
                // Labelled by rule, so a glob rule cannot grow the series without bound.
                counter!(metrics::BREAKER_TRANSITIONS, "resource" => rule.clone(), "from" => from, "to" => to)
                    .increment(1);
                if resource == rule {
                    gauge!(metrics::BREAKER_STATE, "resource" => rule.clone()).set(f64::from(t.to.number()));
                }
            }
            Event::Degradation(c) => {
                let system = metrics::system_label(&c.system);
                tracing::warn!(
                    system,
                    from = c.from,
                    to = c.to,
                    manual = c.manual,
                    reason = c.reason,
                    "degradation level changed"
                );
                gauge!(metrics::DEGRADATION_LEVEL, "system" => system).set(f64::from(c.to));
            }
            Event::Rules { .. } => {}
            Event::Overrides { version, set, deleted, expired } => {
                let (set, deleted, expired) = (set.len(), deleted.len(), expired.len());
                tracing::info!(version, set, deleted, expired, "overrides changed");
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(Arc::new(event));
    }
}
