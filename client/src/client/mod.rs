//! The client: ask before calling; the permit it hands out reports after.

use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use tonic::transport::Channel;

pub(crate) mod builder;

use self::builder::{Builder, FailMode};
use crate::connection::ServerBreaker;
use crate::decision::{Acquire, BreakerState, Decision, Source, Verdict};
use crate::error::{Error, unreachable};
use crate::finish::{self, Finish};
use crate::last_good::LastGood;
use crate::lease::{self, Granted, Leases};
use crate::local::{self, LocalLimits};
use crate::permit::{Outcome, Permit, Sink};
use crate::reporter::Reporter;
use crate::stats::{Stats, StatsSnapshot};
use crate::watch::Known;

/// A Floodgate client: cheap to clone, shared by every task of a service.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), floodgate_client::Error> {
/// use std::time::Duration;
/// use floodgate_client::{Acquire, Client, FailMode};
/// use floodgate_client::decision::Source;
///
/// // Nothing listens on port 1: the client fails open within its deadline.
/// let client = Client::builder()
///     .endpoint("http://127.0.0.1:1")
///     .request_timeout(Duration::from_millis(20))
///     .fail_mode(FailMode::Open)
///     .build()?;
/// let decision = client.acquire(&Acquire::new("payments").descriptor("user", "u42")).await?;
/// assert!(decision.is_allowed());
/// assert_eq!(decision.source, Source::FailOpen);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) endpoints: Vec<Endpoint>,
    /// What Watch taught: open breakers and the rule patterns.
    pub(crate) known: Arc<Known>,
    pub(crate) request_timeout: Duration,
    pub(crate) fail_mode: FailMode,
    pub(crate) fail_closed_retry_after: Duration,
    pub(crate) cancelled_as: Option<Outcome>,
    /// The limits the server last reported, for `FailMode::Local`.
    pub(crate) local: Option<LocalLimits>,
    pub(crate) last_good: LastGood,
    pub(crate) stats: Arc<Stats>,
    /// Leases held, when the builder turned them on.
    pub(crate) leases: Option<Leases>,
    /// Dropped with the client: the Watch task ends.
    pub(crate) _closed: tokio::sync::watch::Sender<()>,
}

pub(crate) struct Endpoint {
    pub(crate) grpc: FloodgateClient<Channel>,
    pub(crate) breaker: ServerBreaker,
    pub(crate) reporter: Reporter,
}

/// What to do with an answer (from endpoint `usize`) nobody waited for.
type Orphan<T> = Arc<dyn Fn(usize, T) + Send + Sync>;

/// What asking the servers came to.
enum Asked<T> {
    Answer(usize, T),
    BadInput(tonic::Status),
    Unreachable,
}

impl Client {
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A client of one server, with the defaults.
    pub fn connect(url: impl Into<String>) -> Result<Client, Error> {
        Client::builder().endpoint(url).build()
    }

    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        Client { inner }
    }

    /// May I? A denial is a [`Decision`], not an error. Without a round trip
    /// when Watch says no rule matches the resource, or its breaker is open.
    /// An unreachable server gives the fail mode's decision within
    /// `request_timeout`. The only error is bad input the server refused.
    pub async fn acquire(&self, req: &Acquire) -> Result<Decision, Error> {
        if let Some(d) = self.known_answer(req) {
            return Ok(d);
        }
        if let Some(d) = self.leased_answer(req).await {
            return Ok(d);
        }
        let proto = req.to_proto();
        let asked = self.ask(
            |mut grpc| {
                let proto = proto.clone();
                async move { grpc.acquire(proto).await }
            },
            Some(self.give_back(req)),
        );
        match asked.await {
            Asked::Answer(endpoint, r) => Ok(self.decision(r, req, endpoint)),
            Asked::BadInput(status) => Err(status.into()),
            Asked::Unreachable => Ok(self.without_server(req)),
        }
    }

    /// Many questions in one round trip (`AcquireBatch`), answered in order.
    /// Those the client can answer itself are not sent. A batch the server
    /// refuses (one bad item) is an error naming the item.
    pub async fn acquire_batch(&self, reqs: &[Acquire]) -> Result<Vec<Decision>, Error> {
        let mut out: Vec<Option<Decision>> = reqs.iter().map(|r| self.known_answer(r)).collect();
        let asked: Vec<usize> = (0..reqs.len()).filter(|&i| out[i].is_none()).collect();
        for chunk in asked.chunks(1000) {
            let batch = pb::AcquireBatchRequest { requests: chunk.iter().map(|&i| reqs[i].to_proto()).collect() };
            let answer = self.ask(
                |mut grpc| {
                    let batch = batch.clone();
                    async move { grpc.acquire_batch(batch).await }
                },
                Some(self.give_back_batch(
                    chunk.iter().map(|&i| (reqs[i].resource().to_string(), reqs[i].is_settle())).collect(),
                )),
            );
            match answer.await {
                Asked::Answer(_, r) if r.responses.len() != chunk.len() => {
                    let (asked, answered) = (chunk.len(), r.responses.len());
                    return Err(Error::Protocol(format!("{asked} questions in a batch got {answered} answers")));
                }
                Asked::Answer(endpoint, r) => {
                    for (&i, response) in chunk.iter().zip(r.responses) {
                        out[i] = Some(self.decision(response, &reqs[i], endpoint));
                    }
                }
                Asked::BadInput(status) => return Err(status.into()),
                Asked::Unreachable => chunk.iter().for_each(|&i| out[i] = Some(self.without_server(&reqs[i]))),
            }
        }
        // Every question was answered: known, sent and answered, or failed over.
        Ok(out.into_iter().flatten().collect())
    }

    /// Asks until allowed or until `deadline`, waiting out each denial's
    /// `retry_after` in between. The last denial when the deadline comes first.
    pub async fn acquire_until(&self, req: &Acquire, deadline: Instant) -> Result<Decision, Error> {
        loop {
            let d = self.acquire(req).await?;
            let wait = d.retry_after.max(Duration::from_millis(1));
            if d.is_allowed() || Instant::now() + wait > deadline {
                return Ok(d);
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// One Charge, asked of the servers in turn: `None` when none answered.
    pub(crate) async fn ask_charge(&self, proto: pb::ChargeRequest) -> Option<Result<pb::ChargeResponse, Error>> {
        let asked = self.ask(
            |mut grpc| {
                let proto = proto.clone();
                async move { grpc.charge(proto).await }
            },
            None,
        );
        match asked.await {
            Asked::Answer(_, r) => Some(Ok(r)),
            Asked::BadInput(status) => Some(Err(status.into())),
            Asked::Unreachable => None,
        }
    }

    /// Waits until every report made so far was delivered (or given up on).
    pub async fn flush(&self) {
        for ep in &self.inner.endpoints {
            ep.reporter.flush().await;
        }
    }

    /// Whether every server is currently unreachable.
    pub fn is_degraded(&self) -> bool {
        self.inner.endpoints.iter().all(|e| e.breaker.is_open())
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// An answer without a round trip: no rule matches, or the breaker is open.
    fn known_answer(&self, req: &Acquire) -> Option<Decision> {
        let known = &self.inner.known;
        if known.rules.unmatched(req.resource()) {
            self.inner.stats.no_rule();
            return Some(Decision { source: Source::NoRule, ..Decision::new(Verdict::Allowed) });
        }
        let retry_after = known.open.denies(req.resource())?;
        self.inner.stats.cached_denial();
        Some(Decision {
            verdict: Verdict::CircuitOpen,
            retry_after,
            breaker_state: Some(BreakerState::Open),
            reason: format!("circuit breaker of '{}' is open", req.resource()),
            source: Source::OpenBreakerCache,
            ..Decision::fail_open()
        })
    }

    /// A decision from the lease on `req`'s key, asking for one when there
    /// is none or it is used up; `None` when the call must be asked.
    async fn leased_answer(&self, req: &Acquire) -> Option<Decision> {
        let leases = self.inner.leases.as_ref()?;
        if req.is_dry_run() || req.is_settle() {
            return None;
        }
        let cell = leases.cell(local::key(req))?;
        let mut state = cell.lock().await;
        let cost = u64::from(req.cost_units());
        let now = Instant::now();
        if state.not_leasable(now) {
            return None;
        }
        if let Some(d) = state.local(cost, now) {
            self.inner.stats.leased();
            return Some(d);
        }
        if state.template.is_none() {
            state.template = Some(req.clone());
        }
        let (previous, used, want) = state.renewal(cost, now);
        let granted = self.lease(req, previous, used, want, false, Some(&cell)).await;
        if matches!(granted, Granted::Unreachable) {
            return Some(self.without_server(req));
        }
        let d = state.granted(granted, cost, Instant::now())?;
        self.inner.stats.leased();
        Some(d)
    }

    /// One Lease call.
    /// `cell`: the key's state, holding lease `previous` (see `return_lease`).
    async fn lease(
        &self,
        req: &Acquire,
        previous: String,
        used: u64,
        want: u64,
        release: bool,
        cell: Option<&lease::Cell>,
    ) -> Granted {
        let Some(leases) = &self.inner.leases else { return Granted::Refused };
        let previous_id = previous.clone();
        let proto = lease::request(req, &leases.holder, previous, used, want, release);
        let asked = self.ask(
            |mut grpc| {
                let proto = proto.clone();
                async move { grpc.lease(proto).await }
            },
            (!release).then(|| self.return_lease(req, &previous_id, cell)),
        );
        match asked.await {
            Asked::Answer(_, r) => {
                // What the limits hold after the lease: what the local fail
                // mode keeps to once the lease is over and the server gone.
                // The answer to a returned lease lists no limit: it says
                // nothing of them, and must not erase what was learned.
                let granted = Granted::from_proto(&r);
                if let (Some(local), Granted::Lease { limits, .. } | Granted::Empty(_, _, limits), false) =
                    (&self.inner.local, &granted, release)
                {
                    local.learn(local::key(req), req.resource(), Verdict::Allowed, limits, 0);
                }
                granted
            }
            Asked::BadInput(_) => Granted::Refused,
            Asked::Unreachable => Granted::Unreachable,
        }
    }

    /// Renews the leases due (used ones; unused ones are returned). A
    /// renewal that finds no server keeps the lease in hand until its end.
    pub(crate) async fn renew_leases(&self) {
        let Some(leases) = &self.inner.leases else { return };
        for cell in leases.cells() {
            let Ok(mut state) = cell.try_lock() else { continue };
            let now = Instant::now();
            let (Some(_), Some(template)) = (state.due(now), state.template.clone()) else { continue };
            let (previous, used, want) = state.renewal(1, now);
            // Not used since it was granted: returned, not renewed.
            let want = if used == 0 { 0 } else { want };
            let granted = self.lease(&template, previous, used, want, want == 0, Some(&cell)).await;
            if want == 0 && !matches!(granted, Granted::Unreachable) {
                state.held = None;
                continue;
            }
            state.granted(granted, 0, Instant::now());
        }
    }

    /// What an Acquire nobody waited for gives back: its permit (see
    /// `finish`).
    fn give_back(&self, req: &Acquire) -> Orphan<pb::AcquireResponse> {
        let (inner, resource, settle) = (self.inner.clone(), req.resource().to_string(), req.is_settle());
        Arc::new(move |endpoint, r: pb::AcquireResponse| give_back(&inner, endpoint, r, &resource, settle))
    }

    /// The same for a batch: each permit in it.
    fn give_back_batch(&self, reqs: Vec<(String, bool)>) -> Orphan<pb::AcquireBatchResponse> {
        let inner = self.inner.clone();
        Arc::new(move |endpoint, r: pb::AcquireBatchResponse| {
            for (response, (resource, settle)) in r.responses.into_iter().zip(&reqs) {
                give_back(&inner, endpoint, response, resource, *settle);
            }
        })
    }

    /// A lease granted to nobody: returned unused. And when the answer says
    /// the lease it renewed (`previous`, in `cell`) was settled, that lease
    /// is dropped from the state: its unused units went back to the limits.
    fn return_lease(&self, req: &Acquire, previous: &str, cell: Option<&lease::Cell>) -> Orphan<pb::LeaseResponse> {
        let (inner, req) = (Arc::downgrade(&self.inner), req.clone());
        let settles = cell.cloned().map(|c| (c, previous.to_string()));
        Arc::new(move |_, r: pb::LeaseResponse| {
            let Some(inner) = inner.upgrade() else { return };
            let (req, settles) = (req.clone(), settles.clone());
            tokio::spawn(async move {
                if let Some((cell, previous)) = settles.filter(|_| r.returned) {
                    let mut state = cell.lock().await;
                    if state.held.as_ref().is_some_and(|h| h.id == previous) {
                        state.held = None;
                    }
                }
                if !r.lease_id.is_empty() {
                    Client::from_inner(inner).lease(&req, r.lease_id, 0, 0, true, None).await;
                }
            });
        })
    }

    /// Tries each server in turn within `request_timeout`. An answer that
    /// comes after the caller stopped waiting (the timeout, or its future
    /// dropped) goes to `orphan`.
    async fn ask<T, F, Fut>(&self, call: F, orphan: Option<Orphan<T>>) -> Asked<T>
    where
        F: Fn(FloodgateClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
        T: Send + 'static,
    {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.request_timeout;
        for (i, ep) in inner.endpoints.iter().enumerate() {
            let Some(attempt) = ep.breaker.attempt() else { continue };
            let left = deadline.saturating_duration_since(Instant::now());
            inner.stats.rpc();
            let then = orphan.clone().map(|orphan| {
                Box::new(move |answer: Result<tonic::Response<T>, tonic::Status>| {
                    if let Ok(answer) = answer {
                        orphan(i, answer.into_inner());
                    }
                }) as finish::Then<_>
            });
            match tokio::time::timeout(left, Finish::new(call(ep.grpc.clone()), then)).await {
                Ok(Ok(response)) => {
                    attempt.success();
                    return Asked::Answer(i, response.into_inner());
                }
                Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                    attempt.success();
                    return Asked::BadInput(status);
                }
                Ok(Err(status)) if unreachable(&status) => attempt.failure(status.message()),
                Ok(Err(status)) => {
                    // It answered, but not a decision: as good as no answer.
                    attempt.success();
                    inner.stats.server_error();
                    tracing::warn!(code = ?status.code(), error = status.message(), "Floodgate answered an error; trying without it");
                }
                Err(_) => attempt.failure("no answer within the request timeout"),
            }
        }
        Asked::Unreachable
    }

    fn decision(&self, r: pb::AcquireResponse, req: &Acquire, endpoint: usize) -> Decision {
        let holds_slot = r.holds_slot;
        let d = Decision::from_proto(r, |id, urgent, breaker| {
            Permit::new(self.inner.clone(), id, req.resource(), endpoint, urgent, self.cancelled_outcome(breaker))
        });
        if let Some(local) = &self.inner.local {
            local.learn(local::key(req), req.resource(), d.verdict, &d.limits, d.max_in_flight);
            if let Some(permit) = d.permit.as_ref().filter(|_| holds_slot) {
                local.server_slot(permit.id(), req.resource());
            }
        }
        d
    }

    /// What a cancelled call's permit reports: FAILURE where a breaker
    /// counts it, IGNORED where only limits do, unless the builder said.
    fn cancelled_outcome(&self, breaker: Option<BreakerState>) -> Outcome {
        self.inner.cancelled_as.unwrap_or(if breaker.is_some() { Outcome::Failure } else { Outcome::Ignored })
    }

    /// The fail mode's answer.
    fn without_server(&self, req: &Acquire) -> Decision {
        let inner = &self.inner;
        inner.stats.without_server();
        match inner.fail_mode {
            FailMode::Open => Decision::fail_open(),
            FailMode::Closed => Decision::fail_closed(inner.fail_closed_retry_after),
            FailMode::Local { .. } => match &inner.local {
                Some(local) => {
                    inner.stats.decided_locally();
                    local.decide(&local::key(req), req.resource(), req.cost_units())
                }
                None => Decision::fail_open(),
            },
        }
    }
}

// === impl Inner ===

impl Sink for Inner {
    /// A permit's report, queued for the server that issued it.
    fn send_report(&self, permit: &Permit, outcome: Outcome, latency: Duration, actual: crate::permit::Actual) {
        if let Some(local) = &self.local {
            local.server_slot_ended(permit.id());
        }
        let Some(ep) = self.endpoints.get(permit.endpoint) else { return };
        let report = pb::ReportOutcomeRequest {
            resource: permit.resource().to_string(),
            permit_id: permit.id().to_string(),
            outcome: outcome.to_proto() as i32,
            latency: prost_types::Duration::try_from(latency).ok(),
            actual_cost: actual.cost,
            usage: actual.usage,
        };
        if !ep.reporter.send(report, permit.urgent) {
            self.stats.dropped(1);
        }
    }
}

/// An answer nobody read: its permit reported IGNORED; with `settle`, at a
/// cost of 0 (the call never ran: its estimate goes back).
fn give_back(inner: &Arc<Inner>, endpoint: usize, r: pb::AcquireResponse, resource: &str, settle: bool) {
    if r.permit_id.is_empty() {
        return;
    }
    let permit = Permit::new(inner.clone(), r.permit_id, resource, endpoint, r.holds_slot, Outcome::Ignored);
    if settle { permit.report_cost(Outcome::Ignored, 0) } else { permit.report(Outcome::Ignored) }
}

/// Renews the leases due, in the background, until the client is dropped.
pub(crate) async fn renew_leases(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        Client::from_inner(inner).renew_leases().await;
    }
}
