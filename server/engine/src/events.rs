//! Breaker transitions, degradation level changes and rule reloads: each is a
//! log line, a metric and an event handed to the one [`Listener`] the server
//! attaches (it broadcasts them to Watch streams and the console). The
//! listener must not block: a publisher may hold a breaker's lock.

use std::sync::{Arc, OnceLock};

use ::metrics::{counter, gauge};

use crate::breaker::Transition;
use crate::degradation::LevelChange;
use crate::metrics;

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
    /// Rules read in the background (a file, a directory, Redis, an xDS
    /// control plane) were refused; the rules in force keep deciding.
    /// `source` is named as a good install from there names it (a file's
    /// path, `sentinel:DIR`, `envoy:DIR`, `redis`); `error` is what was
    /// wrong, cut to a few kilobytes.
    RulesRefused {
        source: String,
        error: String,
    },
    /// Overrides set at run time were set, deleted or reached their expiry.
    Overrides {
        version: u64,
        set: Vec<String>,
        deleted: Vec<String>,
        expired: Vec<String>,
    },
}

/// Where events go once published: called on the publisher's thread, so it
/// must return at once (a bounded channel's `send`, not a wait).
pub(crate) type Listener = Box<dyn Fn(Arc<Event>) + Send + Sync>;

/// The engine's events, handed to a listener attached once.
#[derive(Clone, Default)]
pub struct Events {
    listener: Arc<OnceLock<Listener>>,
}

impl Events {
    /// Attaches the listener; `false` (and nothing changes) when one is
    /// attached already.
    pub fn listen(&self, listener: Listener) -> bool {
        self.listener.set(listener).is_ok()
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
            // The reader that refused the rules logs why, where it knows the file.
            Event::Rules { .. } | Event::RulesRefused { .. } => {}
            Event::Overrides { version, set, deleted, expired } => {
                let (set, deleted, expired) = (set.len(), deleted.len(), expired.len());
                tracing::info!(version, set, deleted, expired, "overrides changed");
            }
        }
        if let Some(listener) = self.listener.get() {
            listener(Arc::new(event));
        }
    }
}
