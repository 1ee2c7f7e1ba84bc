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
use super::scripts::replica_channel;
use floodgate_core::breaker::{Outcome, State};
use floodgate_engine::guards::PermitId;
use floodgate_engine::report::{Report, Reported};
use floodgate_engine::request::{RequestError, check_permit_id};

/// How long a replica waits for the issuer's answer: four Redis timeouts,
/// within these bounds (two exchanges over Redis, and the issuer's report).
const FORWARD_WAIT: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(2));

/// Reports waiting for their issuer's answer, at most: beyond, a report of
/// another replica's permit is answered `counted: false` at once (a flood of
/// forged ids costs a bounded number of messages and waiting tasks).
const MAX_WAITING: usize = 10_000;

/// Forwarded reports this replica has yet to handle, at most.
pub const INBOX: usize = 4096;

/// A report another replica passed on, for a permit this one issued.
#[derive(Clone, Debug, PartialEq)]
pub struct Forwarded {
    from: u32,
    request: u64,
    pub resource: String,
    pub permit_id: String,
    pub outcome: Outcome,
    pub latency: Option<Duration>,
    pub actual_cost: Option<u64>,
}

impl Forwarded {
    pub fn report(&self) -> Report<'_> {
        Report {
            resource: &self.resource,
            permit_id: &self.permit_id,
            outcome: self.outcome,
            latency: self.latency,
            actual_cost: self.actual_cost,
        }
    }
}

type Answer = Result<Reported, RequestError>;

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
        let outcome = match r.outcome {
            Outcome::Success => 1,
            Outcome::Failure => 2,
            Outcome::Ignored => 3,
        };
        let latency = r.latency.map_or("-".to_string(), |l| l.as_micros().to_string());
        let cost = r.actual_cost.map_or("-".to_string(), |c| c.to_string());
        let message =
            format!("q {:08x} {request} {} {outcome} {latency} {cost} {}", PermitId::tag(), r.permit_id, r.resource);
        let channel = replica_channel(to);
        let heard: Option<i64> = self
            .call("forward", |mut h| async move {
                redis::cmd("PUBLISH").arg(channel).arg(message).query_async(&mut h).await
            })
            .await;
        // A standalone Redis counts the listeners; a cluster node only its own.
        let nobody = heard == Some(0) && matches!(self.config.target, super::Target::Standalone(_));
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
        let text = match answer {
            Ok(r) => format!(
                "a {} {} {} {}",
                f.request,
                u8::from(r.counted),
                u8::from(r.settled),
                r.breaker_state.map_or("-".to_string(), |s| s.number().to_string())
            ),
            Err(RequestError::PermitResourceMismatch { .. }) => format!("a {} m", f.request),
            Err(_) => format!("a {} 0 0 -", f.request),
        };
        let channel = replica_channel(f.from);
        let _: Option<i64> =
            self.call("forward", |mut h| async move {
                redis::cmd("PUBLISH").arg(channel).arg(text).query_async(&mut h).await
            })
            .await;
    }

    /// A message on this replica's channel: a report to handle, or an answer.
    pub(super) fn on_replica_message(&self, text: &str) {
        if let Some(rest) = text.strip_prefix("q ") {
            match parse_forwarded(rest) {
                Some(f) => {
                    if self.forwards.inbox.try_send(f).is_err() {
                        metrics::counter!(floodgate_engine::metrics::REPORTS_FORWARDED, "result" => "dropped")
                            .increment(1);
                    }
                }
                None => tracing::debug!(message = text, "an unreadable forwarded report; ignored"),
            }
        } else if let Some(rest) = text.strip_prefix("a ") {
            let Some((request, answer)) = parse_answer(rest) else { return };
            if let Some((_, tx)) = self.forwards.waiting.remove(&request) {
                let _ = tx.send(answer);
            }
        }
    }
}

fn parse_forwarded(rest: &str) -> Option<Forwarded> {
    let mut parts = rest.splitn(7, ' ');
    let from = u32::from_str_radix(parts.next()?, 16).ok()?;
    let request = parts.next()?.parse().ok()?;
    let permit_id = parts.next()?.to_string();
    check_permit_id(&permit_id).ok()?;
    let outcome = match parts.next()? {
        "1" => Outcome::Success,
        "2" => Outcome::Failure,
        "3" => Outcome::Ignored,
        _ => return None,
    };
    let latency = match parts.next()? {
        "-" => None,
        us => Some(Duration::from_micros(us.parse().ok()?)),
    };
    let actual_cost = match parts.next()? {
        "-" => None,
        c => Some(c.parse().ok()?),
    };
    let resource = parts.next().unwrap_or_default().to_string();
    Some(Forwarded { from, request, resource, permit_id, outcome, latency, actual_cost })
}

fn parse_answer(rest: &str) -> Option<(u64, Answer)> {
    let mut parts = rest.split(' ');
    let request = parts.next()?.parse().ok()?;
    let counted = parts.next()?;
    if counted == "m" {
        return Some((request, Err(RequestError::PermitResourceMismatch { resource: String::new() })));
    }
    let settled = parts.next()? == "1";
    let breaker_state = parts.next()?.parse().ok().and_then(State::from_number);
    Some((request, Ok(Reported { counted: counted == "1", breaker_state, settled })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_report_reads_back_as_sent() {
        let id = PermitId::random().to_string();
        let text = format!("00c0ffee 7 {id} 2 1500 - a resource with spaces");
        let f = parse_forwarded(&text).unwrap();
        assert_eq!((f.from, f.request, f.permit_id.as_str()), (0xc0ffee, 7, id.as_str()));
        assert_eq!((f.outcome, f.latency, f.actual_cost), (Outcome::Failure, Some(Duration::from_micros(1500)), None));
        assert_eq!(f.resource, "a resource with spaces");
        assert!(parse_forwarded(&format!("00c0ffee 7 {id} 4 - - r")).is_none(), "no such outcome");
        assert!(parse_forwarded("00c0ffee 7 not-an-id 1 - - r").is_none());
    }

    #[test]
    fn answers_read_back_as_sent() {
        assert_eq!(
            parse_answer("9 1 0 2"),
            Some((9, Ok(Reported { counted: true, breaker_state: Some(State::Open), settled: false })))
        );
        assert_eq!(
            parse_answer("9 0 0 -"),
            Some((9, Ok(Reported { counted: false, breaker_state: None, settled: false })))
        );
        assert!(matches!(parse_answer("3 m"), Some((3, Err(RequestError::PermitResourceMismatch { .. })))));
        assert_eq!(parse_answer("x 1 1 -"), None);
    }
}
