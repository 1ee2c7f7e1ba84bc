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
    Breaker { resource: String, transition: Transition },
    Degradation(LevelChange),
    Rules { version: u64, source: String },
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
            Event::Breaker { resource, transition: t } => {
                tracing::info!(resource, from = t.from.name(), to = t.to.name(), reason = %t.reason, "breaker transition");
                let (from, to) = (t.from.name(), t.to.name());
                counter!(metrics::BREAKER_TRANSITIONS, "resource" => resource.clone(), "from" => from, "to" => to)
                    .increment(1);
                gauge!(metrics::BREAKER_STATE, "resource" => resource.clone()).set(f64::from(t.to.number()));
            }
            Event::Degradation(c) => {
                tracing::warn!(from = c.from, to = c.to, manual = c.manual, "degradation level changed");
                gauge!(metrics::DEGRADATION_LEVEL).set(f64::from(c.to));
            }
            Event::Rules { .. } => {}
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(Arc::new(event));
    }
}
