//! A permit: what an admitted call on a resource with a breaker or a
//! concurrency limit holds until it says how the call went. It reports itself:
//! dropped without a word (the caller's future was cancelled by a timeout, an
//! HTTP client hung up, a panic unwound), it reports its cancellation
//! outcome, so a concurrency slot is freed at once rather than at the permit's
//! expiry, and a timeout counts against the breaker as resilience4j counts it.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use std::sync::Arc;

use floodgate_proto::v1 as pb;

/// How an admitted call went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    /// Neither: not counted by the breaker.
    Ignored,
}

/// Where a permit's report goes: the client that issued it.
pub(crate) trait Sink: Send + Sync {
    fn send_report(&self, permit: &Permit, outcome: Outcome, latency: Duration, actual: Actual);
}

/// What a settled call really cost: units, usage by field, or both.
#[derive(Clone, Debug, Default)]
pub(crate) struct Actual {
    pub cost: Option<u64>,
    pub usage: HashMap<String, u64>,
}

/// Reported when dropped unreported (see [`Permit::on_drop`]).
#[must_use = "a permit reports its call when dropped: report it with the call's outcome"]
pub struct Permit {
    id: String,
    resource: String,
    issued: Instant,
    /// The endpoint that issued it: the report goes back there.
    pub(crate) endpoint: usize,
    /// Holds a concurrency slot or a half-open probe: its report leaves at once.
    pub(crate) urgent: bool,
    on_drop: Outcome,
    /// `None` once reported (or detached).
    sink: Option<Arc<dyn Sink>>,
}

impl Permit {
    pub(crate) fn new(
        sink: Arc<dyn Sink>,
        id: String,
        resource: &str,
        endpoint: usize,
        urgent: bool,
        on_drop: Outcome,
    ) -> Self {
        Permit {
            id,
            resource: resource.to_string(),
            issued: Instant::now(),
            endpoint,
            urgent,
            on_drop,
            sink: Some(sink),
        }
    }

    /// The id, as the server issued it.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// When it was handed out.
    pub fn issued(&self) -> Instant {
        self.issued
    }

    /// How the call went; its latency is the permit's age.
    pub fn report(self, outcome: Outcome) {
        let latency = self.issued.elapsed();
        self.report_latency(outcome, latency);
    }

    /// How the call went, and how long it took.
    pub fn report_latency(mut self, outcome: Outcome, latency: Duration) {
        self.send(outcome, latency, Actual::default());
    }

    /// How the call went and what it really cost, for an
    /// [`Acquire::settle`](crate::Acquire::settle) permit: the server gives
    /// back what the estimate took beyond it, or takes the rest (beyond the
    /// limit if need be: a debt later callers wait out).
    pub fn report_cost(mut self, outcome: Outcome, actual_cost: u64) {
        let latency = self.issued.elapsed();
        self.send(outcome, latency, Actual { cost: Some(actual_cost), usage: HashMap::new() });
    }

    /// How the call went and the usage it really had, by field (an LLM
    /// answer's `input_tokens`, `output_tokens`...), for an
    /// [`Acquire::settle`](crate::Acquire::settle) permit: each limit with
    /// a `cost` formula settles at what its formula gives for this usage;
    /// the others keep the estimate.
    pub fn report_usage<K: Into<String>>(mut self, outcome: Outcome, usage: impl IntoIterator<Item = (K, u64)>) {
        let latency = self.issued.elapsed();
        let usage = usage.into_iter().map(|(k, v)| (k.into(), v)).collect();
        self.send(outcome, latency, Actual { cost: None, usage });
    }

    /// [`report_cost`](Self::report_cost) and [`report_usage`](Self::report_usage)
    /// at once: limits with a `cost` formula settle at the usage, the
    /// others at `actual_cost`.
    pub(crate) fn report_cost_and_usage(mut self, outcome: Outcome, actual_cost: u64, usage: HashMap<String, u64>) {
        let latency = self.issued.elapsed();
        self.send(outcome, latency, Actual { cost: Some(actual_cost), usage });
    }

    /// What is reported if the permit is dropped unreported. The client's
    /// default ([`Builder::cancelled_as`](crate::Builder::cancelled_as)) is
    /// FAILURE on a resource with a breaker (a call cut short counts against
    /// it, as resilience4j counts a timeout) and IGNORED otherwise.
    pub fn on_drop(mut self, outcome: Outcome) -> Self {
        self.on_drop = outcome;
        self
    }

    /// Gives up reporting through this client: the id, for a report sent some
    /// other way (another process). Unreported, the server frees it at expiry.
    pub fn detach(mut self) -> String {
        self.sink = None;
        std::mem::take(&mut self.id)
    }

    fn send(&mut self, outcome: Outcome, latency: Duration, actual: Actual) {
        if let Some(sink) = self.sink.take() {
            sink.send_report(self, outcome, latency, actual);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let latency = self.issued.elapsed();
        self.send(self.on_drop, latency, Actual::default());
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("id", &self.id)
            .field("resource", &self.resource)
            .field("urgent", &self.urgent)
            .field("on_drop", &self.on_drop)
            .field("reported", &self.sink.is_none())
            .finish()
    }
}

// === impl Outcome ===

impl Outcome {
    pub(crate) fn to_proto(self) -> pb::Outcome {
        match self {
            Outcome::Success => pb::Outcome::Success,
            Outcome::Failure => pb::Outcome::Failure,
            Outcome::Ignored => pb::Outcome::Ignored,
        }
    }
}
