//! Breakers and the degradation level: read, set by an operator (on every
//! replica), and their events for Watch.

use super::{Control, Views};
use std::sync::Arc;

use tokio::sync::broadcast;

use crate::breaker::{Info, State};
use crate::degradation::{Level, Load};
use crate::engine::{LevelTarget, RequestError, Snapshot};
use crate::events::Event;

/// One resource's breaker.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerView {
    pub resource: String,
    pub info: Info,
}

impl Views<'_> {
    /// Every breaker in use, by resource.
    pub fn breakers(&self) -> Vec<BreakerView> {
        let rules = self.engine.rules();
        self.engine
            .views()
            .breakers(&rules)
            .into_iter()
            .map(|(resource, info)| BreakerView { resource, info })
            .collect()
    }

    /// One resource's breaker; an error when its rule has none.
    pub fn breaker(&self, resource: &str) -> Result<BreakerView, RequestError> {
        let info = self.engine.views().breaker(&self.engine.rules(), resource)?;
        Ok(BreakerView { resource: resource.into(), info })
    }

    /// One resource's concurrency limit; an error when its rule has none.
    pub fn concurrency(&self, resource: &str) -> Result<crate::engine::concurrency::ConcurrencyView, RequestError> {
        self.engine.views().concurrency(&self.engine.rules(), resource)
    }

    /// At most `max` concurrency limits in memory, by resource name, those
    /// `keep` (the resource, its rule's name) chooses.
    pub(crate) fn concurrency_views(
        &self,
        keep: impl Fn(&str, &str) -> bool,
        max: usize,
    ) -> Vec<crate::engine::concurrency::ConcurrencyView> {
        self.engine.views().concurrency_views(&self.engine.rules(), keep, max)
    }

    /// What a Watch stream starts with.
    pub fn snapshot(&self) -> Snapshot {
        self.engine.views().snapshot()
    }

    /// Every event from now on, in order.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }
}

impl Control<'_> {
    /// CLOSED (reset), FORCED_OPEN, DISABLED or METRICS_ONLY, on every replica.
    pub(crate) async fn set_breaker(&self, resource: &str, to: State) -> Result<BreakerView, RequestError> {
        let rules = self.engine.rules_full();
        let mut info = self.engine.control().set_breaker(&rules, resource, to)?;
        if let Some(replication) = &self.replication {
            replication.breakers().force_breaker(&rules, resource, to).await;
            info = self.engine.views().breaker(&rules, resource)?;
        }
        tracing::info!(resource, state = to.name(), "breaker state set through Admin");
        Ok(BreakerView { resource: resource.into(), info })
    }

    /// An operator's degradation level (0 to 3), or `None` for automatic,
    /// for one system (empty: the global scope) or every scope; the levels after.
    /// With Redis, stored for every replica (and replicas started later).
    pub async fn set_level(&self, target: LevelTarget<'_>, level: Option<u32>) -> Result<Vec<Level>, RequestError> {
        if let Some(level) = level.filter(|&l| l > crate::rules::systems::MAX_LEVEL) {
            return Err(RequestError::BadLevel(level));
        }
        let levels = self.engine.control().set_degradation(target, level)?;
        if let Some(replication) = &self.replication {
            replication.settings().set_level(target, level).await;
        }
        Ok(levels)
    }

    /// One instance's load: the system's level and live instances after it.
    /// With Redis, passed on to every replica.
    pub fn report_load(&self, system: &str, instance: &str, load: Load) -> Result<(u32, usize), RequestError> {
        let taken_at = self.engine.clock().now();
        let answer = self.engine.control().report_load(system, instance, load, Some(taken_at))?;
        if let Some(replication) = &self.replication {
            replication.settings().share_load(system, instance, load, taken_at);
        }
        Ok(answer)
    }
}
