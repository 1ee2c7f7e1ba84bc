//! Charge, and a metered call: reserve an estimate, charge what goes beyond
//! it while the call streams, settle at the end.
//!
//! An LLM call's tokens, a download's bytes: the cost is known only as the
//! call goes on. A [`Metered`] call reserves an estimate first (an Acquire
//! with `settle`), so concurrent calls cannot all pass one check of the
//! same budget. [`Metered::add`] counts each chunk's units: within the
//! reservation nothing is asked; beyond it, the excess is charged at once,
//! and the answer says when a budget ran out, so a call overshoots its
//! budget by at most one chunk (the one whose charge said so). [`Metered::finish`] settles the reservation
//! at what was used of it (the rest comes back to the limits).

use floodgate_proto::v1 as pb;

use crate::Client;
use crate::client::builder::FailMode;
use crate::decision::{Acquire, Decision, Limit};
use crate::error::Error;
use crate::permit::{Outcome, Permit};

/// What a [`Client::charge`] took.
#[derive(Debug, Clone, PartialEq)]
pub struct Charged {
    /// Every limit the request matched, after the charge.
    pub limits: Vec<Limit>,
    /// A limit (not in shadow mode) is now used up or in debt: the caller
    /// should stop.
    pub exhausted: bool,
    /// The charge's idempotency key was seen before: this one took nothing.
    pub duplicate: bool,
    /// When the resource's rule has a waterfall of budgets: the source the
    /// charge was taken from (the first with room for it); empty when the
    /// rule's own limits took it.
    pub paid_by: String,
}

/// Whether a metered call may go on after [`Metered::add`].
#[derive(Debug, Clone, PartialEq)]
pub enum Flow {
    /// Go on.
    Continue,
    /// A budget ran out with these units: end the call. The units counted so
    /// far are taken all the same (beyond the limit: a debt).
    Stop { limits: Vec<Limit> },
}

/// The start of a metered call.
#[derive(Debug)]
pub enum Metering {
    /// Admitted, with its reservation.
    Admitted(Metered),
    /// Denied before it started.
    Denied(Decision),
}

/// A metered call in progress. Dropped without [`Metered::finish`] (the task
/// was cancelled), it settles what it counted as a cancelled call.
pub struct Metered {
    client: Client,
    req: Acquire,
    permit: Option<Permit>,
    /// Units the start reserved (0 when the server was not reached).
    reserved: u64,
    /// Units counted so far.
    used: u64,
    /// Units beyond the reservation that charges took.
    charged: u64,
    on_drop: Outcome,
    /// The waterfall source that paid for the last units (see `paid_by`).
    paid_by: String,
}

/// A key no other charge of this process or another is likely to have: two
/// hashes (seeded at random per process) of a counter and the time.
fn fresh_key() -> String {
    use std::hash::BuildHasher;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEEDS: OnceLock<[std::collections::hash_map::RandomState; 2]> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let seeds = SEEDS.get_or_init(|| [Default::default(), Default::default()]);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let part = |seed: &std::collections::hash_map::RandomState| seed.hash_one((n, now, std::process::id()));
    format!("{:016x}{:016x}", part(&seeds[0]), part(&seeds[1]))
}

impl Client {
    /// Takes `req`'s cost from every limit it matches, with no question
    /// first: beyond a limit if need be (a debt that later callers wait
    /// out). An error when the server refused it (bad input) or none could
    /// be reached. Each charge carries an idempotency key of its own: when
    /// a server does not answer in time and the next one is asked, a charge
    /// the first took anyway is not taken twice.
    pub async fn charge(&self, req: &Acquire) -> Result<Charged, Error> {
        self.charge_once(req, &fresh_key()).await
    }

    /// [`Client::charge`] under an idempotency key of the caller's: a
    /// charge sent again with the same key (to any server, for at least 10
    /// minutes) takes nothing, and says so (`Charged::duplicate`). Keys are
    /// at most 128 bytes; each names one charge of one resource.
    pub async fn charge_once(&self, req: &Acquire, key: &str) -> Result<Charged, Error> {
        let proto = pb::ChargeRequest {
            resource: req.resource().to_string(),
            descriptors: req.to_proto().descriptors,
            cost: u64::from(req.cost_units()),
            usage: req.usage_of().clone(),
            idempotency_key: key.to_string(),
        };
        let asked = self.ask_charge(proto).await;
        let answer = asked.ok_or_else(|| Error::Server(tonic::Status::unavailable("no Floodgate server answered")))?;
        let answer = answer?;
        let exhausted = answer.limits.iter().any(|l| l.exceeded && !l.shadow);
        let limits = answer.limits.iter().map(Limit::from_proto).collect();
        Ok(Charged { limits, exhausted, duplicate: answer.duplicate, paid_by: answer.paid_by })
    }

    /// Starts a metered call: reserves `req`'s cost as an estimate (an
    /// Acquire with `settle`). A server that cannot be reached gives the
    /// fail mode's decision; admitted then, the call reserves nothing and
    /// each unit counted is charged.
    pub async fn meter(&self, req: &Acquire) -> Result<Metering, Error> {
        let req = req.clone().settle();
        let mut decision = self.acquire(&req).await?;
        if !decision.is_allowed() {
            return Ok(Metering::Denied(decision));
        }
        let permit = decision.permit.take();
        let reserved = if permit.is_some() { u64::from(req.cost_units()) } else { 0 };
        let on_drop = self.inner().cancelled_as.unwrap_or(Outcome::Ignored);
        let paid_by = std::mem::take(&mut decision.paid_by);
        Ok(Metering::Admitted(Metered {
            client: self.clone(),
            req,
            permit,
            reserved,
            used: 0,
            charged: 0,
            on_drop,
            paid_by,
        }))
    }
}

impl Metered {
    /// Counts `units` more of the call's use. Beyond the reservation, the
    /// excess is charged now; [`Flow::Stop`] when a budget is used up. When
    /// no server answers the charge, the call goes on unless the client
    /// fails closed, and those units are not charged again later: a charge
    /// whose answer was lost may have been applied, and charging it again
    /// would count it twice.
    pub async fn add(&mut self, units: u64) -> Flow {
        self.used = self.used.saturating_add(units);
        let due = self.used.saturating_sub(self.reserved).saturating_sub(self.charged);
        if due == 0 {
            return Flow::Continue;
        }
        // Units, not usage: the limits priced by the usage reported at the
        // start take nothing more (each of its fields is sent as 0).
        let ask = self.req.clone().zeroed_usage().cost(u32::try_from(due).unwrap_or(u32::MAX));
        self.charged += u64::from(ask.cost_units());
        match self.client.charge(&ask).await {
            Ok(charged) => {
                self.paid_by = charged.paid_by;
                if charged.exhausted { Flow::Stop { limits: charged.limits } } else { Flow::Continue }
            }
            Err(_) if matches!(self.client.inner().fail_mode, FailMode::Closed) => Flow::Stop { limits: Vec::new() },
            Err(_) => Flow::Continue,
        }
    }

    /// Units counted so far.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// When the resource's rule has a waterfall of budgets: the source that
    /// paid for the units charged last (at the start, for the reservation).
    /// Empty when the rule's own limits paid, or no server answered.
    pub fn paid_by(&self) -> &str {
        &self.paid_by
    }

    /// Units the start reserved.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Ends the call: settles the reservation at the units used within it
    /// (the rest comes back to the limits).
    pub fn finish(mut self, outcome: Outcome) {
        self.settle(outcome);
    }

    /// What the settlement takes: the reservation's used part (units
    /// beyond it were charged as they came).
    fn actual(&self) -> u64 {
        self.used.min(self.reserved)
    }

    /// Settles the reservation. Limits priced by the usage reported at the
    /// start settle at that usage (what they reserved); the others at the
    /// units used.
    fn settle(&mut self, outcome: Outcome) {
        let actual = self.actual();
        if let Some(permit) = self.permit.take() {
            if self.req.usage_of().is_empty() {
                permit.report_cost(outcome, actual);
            } else {
                permit.report_cost_and_usage(outcome, actual, self.req.usage_of().clone());
            }
        }
    }
}

impl std::fmt::Debug for Metered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metered")
            .field("resource", &self.req.resource())
            .field("reserved", &self.reserved)
            .field("used", &self.used)
            .field("charged", &self.charged)
            .finish()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.settle(self.on_drop);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metered(reserved: u64, used: u64, charged: u64) -> u64 {
        let client = Client::connect("http://127.0.0.1:1").unwrap();
        let m = Metered {
            client,
            req: Acquire::new("r"),
            permit: None,
            reserved,
            used,
            charged,
            on_drop: Outcome::Ignored,
            paid_by: String::new(),
        };
        let actual = m.actual();
        std::mem::forget(m);
        actual
    }

    #[tokio::test]
    async fn the_settlement_takes_what_the_reservation_covered() {
        // 120 of 300 used: 120 settled, 180 come back.
        assert_eq!(metered(300, 120, 0), 120);
        // 450 used, 150 beyond charged as they came: the 300 reserved.
        assert_eq!(metered(300, 450, 150), 300);
        // Nothing reserved (no server at the start): charged as it went.
        assert_eq!(metered(0, 100, 100), 0);
    }
}
