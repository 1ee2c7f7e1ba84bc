//! The decision log: why calls were answered as they were.
//!
//! Off by default. When on, each decision is kept or not at random, with the
//! share set by `--decision-log` or `Admin/SetDecisionLog`: the request (its
//! resource, descriptors, cost), the rule that matched, every limit it
//! evaluated with its result, and what decided. The log is bounded twice, by
//! decisions and by bytes (a decision's descriptors may be long), and drops
//! the oldest first. Reading it (`Admin/GetDecisions`, `floodgate why`)
//! filters by resource and descriptors.
//!
//! Acquire's decisions are offered to it, and each descriptor of Envoy's
//! ShouldRateLimit (its domain as the resource).
//!
//! A decision costs one atomic load while the log is off. The log is read
//! only by operators, so a plain mutex is enough; a kept decision is built
//! before the lock is taken.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::engine::Denial;
use crate::engine::{Answer, Descriptors, Request, Verdict};

/// Decisions kept at most by default.
pub const DEFAULT_CAPACITY: usize = 10_000;
/// The most `--decision-log-size` may ask for.
pub const MAX_CAPACITY: usize = 1_000_000;
/// Bytes the kept decisions may take in all (their strings and a fixed
/// part each): at most this much memory, however long the descriptors.
pub const MAX_BYTES: usize = 64 * 1024 * 1024;
/// Decisions one read returns by default, and at most.
pub const DEFAULT_READ: usize = 100;
pub const MAX_READ: usize = 10_000;
/// Bytes of decisions one read returns at most (as [`Logged`] counts them):
/// a read of long descriptors costs the server little, and its answer fits
/// a client's default message size (4 MiB in gRPC).
pub const MAX_READ_BYTES: usize = 2 * 1024 * 1024;

/// The share is kept as a threshold on a random `u64`: a decision is kept
/// when a draw is below it. `u64::MAX` keeps every decision, 0 none.
pub struct DecisionLog {
    threshold: AtomicU64,
    capacity: usize,
    max_bytes: usize,
    kept: AtomicU64,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    decisions: VecDeque<Logged>,
    bytes: usize,
}

/// One decision, as it was made.
#[derive(Clone, Debug)]
pub struct Logged {
    pub at: SystemTime,
    pub resource: String,
    pub descriptors: Vec<(String, String)>,
    pub cost: u64,
    pub dry_run: bool,
    pub settle: bool,
    pub verdict: Verdict,
    /// The matched rule as written; empty when none matched.
    pub rule: String,
    pub limits: Vec<LoggedLimit>,
    /// The limits that denied, or the guard that denied before them.
    pub decided_by: Vec<String>,
    pub reason: String,
    pub breaker_state: Option<crate::breaker::State>,
    pub degradation_level: u32,
    /// The usage the request reported, by field, in name order.
    pub usage: Vec<(String, u64)>,
    /// The waterfall source that paid for an allowed call; empty when the
    /// rule's own limits did.
    pub paid_by: String,
}

/// One evaluated limit of a logged decision.
#[derive(Clone, Debug)]
pub struct LoggedLimit {
    pub name: String,
    /// What the call asked of it.
    pub cost: u64,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after: Duration,
    pub retry_after: Duration,
    pub window: Duration,
    pub exceeded: bool,
    pub shadow: bool,
    pub admitted_over_limit: bool,
}

/// What to read from the log.
#[derive(Debug, Default)]
pub struct DecisionQuery {
    pub resource: String,
    pub descriptors: Vec<(String, String)>,
    pub denied_only: bool,
    pub count: usize,
}

/// A share outside 0 to 1 (or not a number).
#[derive(Debug, thiserror::Error)]
#[error("must be between 0 and 1, got {0}")]
pub struct BadShare(pub f64);

impl DecisionLog {
    /// A log keeping `share` of the decisions, `capacity` at most.
    pub fn new(share: f64, capacity: usize) -> Result<Self, BadShare> {
        let log = DecisionLog {
            threshold: AtomicU64::new(0),
            capacity: capacity.clamp(1, MAX_CAPACITY),
            max_bytes: MAX_BYTES,
            kept: AtomicU64::new(0),
            held: Mutex::new(Held::default()),
        };
        log.set_share(share)?;
        Ok(log)
    }

    /// Sets the share of decisions kept; returns the share before.
    pub fn set_share(&self, share: f64) -> Result<f64, BadShare> {
        if !(0.0..=1.0).contains(&share) {
            return Err(BadShare(share));
        }
        let threshold = if share >= 1.0 { u64::MAX } else { (share * u64::MAX as f64) as u64 };
        Ok(share_of(self.threshold.swap(threshold, Ordering::Relaxed)))
    }

    pub fn share(&self) -> f64 {
        share_of(self.threshold.load(Ordering::Relaxed))
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Decisions kept since the server started.
    pub fn kept(&self) -> u64 {
        self.kept.load(Ordering::Relaxed)
    }

    /// Whether to keep the next decision: drawn at random at the share.
    #[inline]
    pub fn wants(&self) -> bool {
        match self.threshold.load(Ordering::Relaxed) {
            0 => false,
            u64::MAX => true,
            t => rand::random::<u64>() < t,
        }
    }

    /// Keeps a decision (call only when [`DecisionLog::wants`] said so).
    pub fn keep<D: Descriptors + ?Sized>(&self, req: &Request<'_, D>, answer: &Answer<'_>) {
        let mut usage: Vec<(String, u64)> = req.usage.into_iter().flatten().map(|(k, v)| (k.clone(), *v)).collect();
        usage.sort_unstable();
        let asked = Asked { cost: u64::from(req.cost.max(1)), dry_run: req.dry_run, settle: req.settle, usage };
        self.keep_parts(req.resource, req.descriptors.entries(), asked, answer);
    }

    /// Keeps a decision of a request given in parts (one descriptor of
    /// Envoy's ShouldRateLimit: its domain is the resource).
    pub fn keep_parts<'a>(
        &self,
        resource: &str,
        descriptors: impl Iterator<Item = (&'a str, &'a str)>,
        asked: Asked,
        answer: &Answer<'_>,
    ) {
        let logged = Logged::of(resource, descriptors, asked, answer);
        let bytes = logged.bytes();
        self.kept.fetch_add(1, Ordering::Relaxed);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.bytes += bytes;
        held.decisions.push_back(logged);
        while held.decisions.len() > self.capacity || (held.bytes > self.max_bytes && held.decisions.len() > 1) {
            let Some(old) = held.decisions.pop_front() else { break };
            held.bytes -= old.bytes();
        }
    }

    /// The decisions that match `q`, newest first, at most `q.count` and
    /// [`MAX_READ_BYTES`]; and whether more matched than the bytes allowed.
    pub fn read(&self, q: &DecisionQuery) -> (Vec<Logged>, bool) {
        let count = if q.count == 0 { DEFAULT_READ } else { q.count.min(MAX_READ) };
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (mut out, mut bytes) = (Vec::new(), 0);
        for d in held.decisions.iter().rev().filter(|d| d.matches(q)) {
            if out.len() == count {
                break;
            }
            bytes += d.bytes();
            if bytes > MAX_READ_BYTES && !out.is_empty() {
                return (out, true);
            }
            out.push(d.clone());
        }
        (out, false)
    }
}

fn share_of(threshold: u64) -> f64 {
    if threshold == u64::MAX { 1.0 } else { threshold as f64 / u64::MAX as f64 }
}

/// What a logged request asked for besides its resource and descriptors.
#[derive(Clone, Debug)]
pub struct Asked {
    pub cost: u64,
    pub dry_run: bool,
    pub settle: bool,
    /// The usage reported, by field, in name order.
    pub usage: Vec<(String, u64)>,
}

impl Asked {
    /// What the call asked of `limit`: what its `cost` formula gives for the
    /// usage, or the request's cost. (Worked out again here, only for the
    /// decisions kept, so that answers need not carry it.)
    fn cost_of(&self, limit: &crate::rules::Limit) -> u64 {
        let Some(formula) = &limit.cost else { return self.cost };
        if self.usage.is_empty() {
            return self.cost;
        }
        let read = |k: &str| self.usage.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v);
        formula.cost(read).map_or(self.cost, |c| c.max(1))
    }
}

impl Logged {
    fn of<'a>(
        resource: &str,
        descriptors: impl Iterator<Item = (&'a str, &'a str)>,
        asked: Asked,
        answer: &Answer<'_>,
    ) -> Self {
        let limits: Vec<LoggedLimit> = answer
            .limits
            .iter()
            .map(|r| LoggedLimit {
                name: r.limit.name.clone(),
                cost: asked.cost_of(r.limit),
                limit: r.status.limit,
                remaining: r.status.remaining,
                reset_after: r.limit.algorithm.shown_reset_after(r.status.reset_after),
                retry_after: r.status.retry_after,
                window: r.limit.algorithm.window(),
                exceeded: r.exceeded,
                shadow: r.limit.shadow,
                admitted_over_limit: r.status.over_limit,
            })
            .collect();
        let allowed = answer.verdict == Verdict::Allowed;
        let decided_by = if allowed {
            Vec::new()
        } else if let Some(denial) = &answer.denial {
            vec![guard_name(denial).to_string()]
        } else {
            let by: Vec<String> = answer.limits.iter().filter(|r| r.denied()).map(|r| r.limit.name.clone()).collect();
            if by.is_empty() && answer.rule.is_none() { vec!["no rule matched".to_string()] } else { by }
        };
        Logged {
            at: SystemTime::now(),
            resource: resource.to_string(),
            descriptors: descriptors.map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            cost: asked.cost,
            dry_run: asked.dry_run,
            settle: asked.settle,
            verdict: answer.verdict,
            rule: answer.rule.cloned().unwrap_or_default(),
            limits,
            decided_by,
            reason: if allowed { String::new() } else { answer.reason() },
            breaker_state: answer.breaker_state,
            degradation_level: answer.degradation_level,
            usage: asked.usage,
            paid_by: answer.paid_by.cloned().unwrap_or_default(),
        }
    }

    /// What this decision takes in memory, roughly: its strings and a fixed
    /// part for the rest.
    fn bytes(&self) -> usize {
        let strings = self.resource.len()
            + self.rule.len()
            + self.paid_by.len()
            + self.reason.len()
            + self.descriptors.iter().map(|(k, v)| k.len() + v.len() + 48).sum::<usize>()
            + self.decided_by.iter().map(|s| s.len() + 24).sum::<usize>()
            + self.usage.iter().map(|(k, _)| k.len() + 32).sum::<usize>()
            + self.limits.iter().map(|l| l.name.len() + std::mem::size_of::<LoggedLimit>()).sum::<usize>();
        strings + std::mem::size_of::<Logged>()
    }

    fn matches(&self, q: &DecisionQuery) -> bool {
        (q.resource.is_empty() || self.resource == q.resource)
            && (!q.denied_only || self.verdict != Verdict::Allowed)
            && q.descriptors.iter().all(|(k, v)| self.descriptors.iter().any(|(dk, dv)| dk == k && dv == v))
    }
}

/// The word for a guard that denied before the limits.
fn guard_name(denial: &Denial) -> &'static str {
    match denial {
        // An override that blocks values, or a rule's origins list.
        Denial::Blocked { .. } => "block",
        Denial::Shed { .. } => "degradation level",
        Denial::CircuitOpen { .. } => "breaker",
        Denial::Concurrency { .. } => "concurrency limit",
    }
}

#[cfg(test)]
#[path = "decisions_tests.rs"]
mod tests;
