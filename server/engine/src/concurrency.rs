//! What an operator reads of a resource's concurrency limit
//! (`Admin.GetConcurrency`, the console, the metrics): the limit now, the
//! calls in flight by priority, and for an adaptive limit its inputs and
//! the windows it closed lately.

use super::Installed;
use super::request::{self, RequestError};
use crate::Views;
use crate::adaptive::{Inputs, Point};
use crate::rules::{Concurrency, Priority};

/// One resource's concurrency limit, as it is now.
#[derive(Clone, Debug)]
pub struct ConcurrencyView {
    pub resource: String,
    pub rule: Concurrency,
    /// The limit in force (an adaptive one's latest).
    pub limit: u32,
    /// Calls in flight on this replica (the fleet's, for the adaptive
    /// windows, are in `history`).
    pub in_flight: u32,
    /// By priority, in [`Priority::ALL`] order: (guaranteed, in flight).
    pub partitions: [(u32, u32); 4],
    /// An adaptive limit's inputs at its last update.
    pub inputs: Option<Inputs>,
    /// An adaptive limit's windows, oldest first.
    pub history: Vec<Point>,
}

impl Views<'_> {
    /// One resource's concurrency limit; NOT_FOUND when no rule gives it one.
    pub fn concurrency(&self, rules: &Installed, resource: &str) -> Result<ConcurrencyView, RequestError> {
        request::check_name("resource", resource, false)?;
        let none = || RequestError::NoConcurrency(resource.into());
        let rule = rules.rules.find(resource).ok_or_else(none)?;
        let c = rule.concurrency.ok_or_else(none)?;
        let g = self.guards.get(resource);
        let limit = g.as_ref().map_or_else(|| c.initial_limit(), |g| g.limit(&c));
        let partitions =
            Priority::ALL.map(|p| (c.partitions.guaranteed(limit, p), g.as_ref().map_or(0, |g| g.in_flight_of(p))));
        let (inputs, history) = match g.as_ref().map(|g| g.current_controller()) {
            Some(slot) => match slot.as_ref() {
                Some(ctl) => (Some(ctl.inputs()), ctl.history().copied().collect()),
                None => (None, Vec::new()),
            },
            None => (None, Vec::new()),
        };
        let inputs = inputs.or(c.adaptive.map(|_| Inputs::default()));
        Ok(ConcurrencyView {
            resource: resource.into(),
            rule: c,
            limit,
            in_flight: g.as_ref().map_or(0, |g| g.in_flight()),
            partitions,
            inputs,
            history,
        })
    }

    /// At most `max` resources with a concurrency limit in memory, by name,
    /// those `keep` (given the resource and its rule's name) chooses.
    pub fn concurrency_views(
        &self,
        rules: &Installed,
        keep: impl Fn(&str, &str) -> bool,
        max: usize,
    ) -> Vec<ConcurrencyView> {
        self.guards
            .all()
            .into_iter()
            .filter(|(r, _)| rules.rules.find(r).is_some_and(|rule| rule.concurrency.is_some() && keep(r, &rule.name)))
            .take(max)
            .filter_map(|(r, _)| self.concurrency(rules, &r).ok())
            .collect()
    }
}
