//! Reports accepted by any replica (SPEC section 5). A permit's id names the
//! process that issued it; a replica given a report for a permit another
//! live replica issued passes it on over that replica's pub/sub channel and
//! answers what the issuer answered: the issuer takes the permit back (once:
//! a second report of it is unknown there too), records the outcome in its
//! breaker, returns the slot and settles the estimate, as if the report had
//! come to it. A report whose issuer is gone, or does not answer within
//! four Redis timeouts ([`FORWARD_WAIT`] bounds it), is answered
//! `counted: false`; its slot comes back when the permit expires.
//!
//! Messages, space-separated, the resource last (it may hold spaces):
//! `q <from tag> <request> <permit id> <outcome 1|2|3> <latency us|-> <actual cost|-> <resource>`
//! and the answer `a <request> <counted 0|1> <settled 0|1> <state|->`, or
//! `a <request> m` when the permit was issued for another resource.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Replication;
use super::message::{ForwardAnswer, Forwarded, Message};
use super::scripts::replica_channel;
use floodgate_engine::guards::PermitId;
use floodgate_engine::report::Report;
use floodgate_engine::request::check_permit_id;

/// How long a replica waits for the issuer's answer: four Redis timeouts,
/// within these bounds (two exchanges over Redis, and the issuer's report).
const FORWARD_WAIT: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(2));

/// Reports waiting for their issuer's answer, at most: beyond, a report of
/// another replica's permit is answered `counted: false` at once (a flood of
/// forged ids costs a bounded number of messages and waiting tasks).
const MAX_WAITING: usize = 10_000;

/// Forwarded reports this replica has yet to handle, at most.
pub const INBOX: usize = 4096;

impl Forwarded {
    pub fn report(&self) -> Report<'_> {
        Report {
            resource: &self.resource,
            permit_id: &self.permit_id,
            outcome: self.outcome,
            latency: self.latency,
            actual_cost: self.actual_cost,
            usage: self.usage.as_ref(),
        }
    }
}

type Answer = ForwardAnswer;

/// Reports waiting for an answer, and forwarded ones waiting to be handled.
pub(super) struct Forwards {
    live: std::sync::RwLock<HashSet<u32>>,
    waiting: dashmap::DashMap<u64, tokio::sync::oneshot::Sender<Answer>, ahash::RandomState>,
    next: std::sync::atomic::AtomicU64,
    inbox: tokio::sync::mpsc::Sender<Forwarded>,
    taken: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Forwarded>>>,
}

impl Default for Forwards {
    fn default() -> Self {
        let (inbox, rx) = tokio::sync::mpsc::channel(INBOX);
        Forwards {
            live: Default::default(),
            waiting: Default::default(),
            next: Default::default(),
            inbox,
            taken: std::sync::Mutex::new(Some(rx)),
        }
    }
}

/// Drops the wait for an answer, however the report ends (its caller may go away).
struct Waiting<'a> {
    forwards: &'a Forwards,
    request: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.forwards.waiting.remove(&self.request);
    }
}

impl Replication {
    /// Reports for permits this replica issued that others passed on: the
    /// server hands each to the decision path and answers with
    /// [`Replication::answer_forwarded`]. Taken once.
    pub fn forwarded_reports(&self) -> Option<tokio::sync::mpsc::Receiver<Forwarded>> {
        self.forwards.taken.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The live replicas' tags, from a heartbeat's names (`id#<tag><random>`).
    pub(super) fn learn_live(&self, names: &[String]) {
        let tags: HashSet<u32> = names
            .iter()
            .filter_map(|n| n.rsplit_once('#'))
            .filter_map(|(_, hex)| hex.get(..8).and_then(|t| u32::from_str_radix(t, 16).ok()))
            .collect();
        *self.forwards.live.write().unwrap_or_else(|e| e.into_inner()) = tags;
    }

    /// Passes a report on to the live replica that issued its permit, and
    /// answers what it answered. `None` when the permit is not another live
    /// replica's (the answer given here stands).
    pub async fn forward(&self, r: &Report<'_>) -> Option<Answer> {
        let to = PermitId::issuer(check_permit_id(r.permit_id).ok()?);
        let forwards = &self.forwards;
        if to == PermitId::tag()
            || !self.sync().up()
            || !forwards.live.read().unwrap_or_else(|e| e.into_inner()).contains(&to)
        {
            return None;
        }
        if forwards.waiting.len() >= MAX_WAITING {
            metrics::counter!(floodgate_engine::metrics::REPORTS_FORWARDED, "result" => "refused").increment(1);
            return None;
        }
        let request = forwards.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        forwards.waiting.insert(request, tx);
        let _waiting = Waiting { forwards, request };
        let message = Message::Report(Forwarded {
            from: PermitId::tag(),
            request,
            resource: r.resource.to_string(),
            permit_id: r.permit_id.to_string(),
            outcome: r.outcome,
            latency: r.latency,
            actual_cost: r.actual_cost,
            usage: r.usage.cloned(),
        })
        .encode();
        let channel = replica_channel(to);
        let heard: Option<i64> = self
            .call("forward", |mut h| async move {
                redis::cmd("PUBLISH").arg(channel).arg(message).query_async(&mut h).await
            })
            .await;
        // A standalone Redis (or a master behind Sentinel) counts the
        // listeners; a cluster node only its own.
        let nobody = heard == Some(0) && !matches!(self.config.target, super::Target::Cluster(_));
        if heard.is_none() || nobody {
            metrics::counter!(floodgate_engine::metrics::REPORTS_FORWARDED, "result" => "undelivered").increment(1);
            return None;
        }
        let wait = (self.config.timeout * 4).clamp(FORWARD_WAIT.0, FORWARD_WAIT.1);
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(answer)) => {
                metrics::counter!(floodgate_engine::metrics::REPORTS_FORWARDED, "result" => "answered").increment(1);
                Some(answer)
            }
            _ => {
                metrics::counter!(floodgate_engine::metrics::REPORTS_FORWARDED, "result" => "unanswered").increment(1);
                None
            }
        }
    }

    /// Sends the answer to a forwarded report back to the replica that passed it on.
    pub async fn answer_forwarded(&self, f: &Forwarded, answer: &Answer) {
        let text = Message::ReportAnswer { request: f.request, answer: answer.clone() }.encode();
        let channel = replica_channel(f.from);
        let _: Option<i64> =
            self.call("forward", |mut h| async move {
                redis::cmd("PUBLISH").arg(channel).arg(text).query_async(&mut h).await
            })
            .await;
    }

    /// A report another replica passed on, to handle here.
    pub(super) fn on_forwarded(&self, f: Forwarded) {
        if self.forwards.inbox.try_send(f).is_err() {
            metrics::counter!(floodgate_engine::metrics::REPORTS_FORWARDED, "result" => "dropped").increment(1);
        }
    }

    /// The issuer's answer to a report passed on from here.
    pub(super) fn on_answer(&self, request: u64, answer: Answer) {
        if let Some((_, tx)) = self.forwards.waiting.remove(&request) {
            let _ = tx.send(answer);
        }
    }
}
