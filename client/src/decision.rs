//! What the client asks and what it is told.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;

/// One question for Floodgate: may I call `resource`?
///
/// ```
/// use floodgate_client::Acquire;
///
/// let ask = Acquire::new("GET /api/orders/:id").descriptor("user", "u42").cost(2);
/// assert_eq!(ask.resource(), "GET /api/orders/:id");
/// assert_eq!(ask.descriptors().get("user").map(String::as_str), Some("u42"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acquire {
    resource: String,
    descriptors: HashMap<String, String>,
    cost: u32,
    dry_run: bool,
}

/// The verdict, as the server (or the client on its behalf) gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    Allowed,
    RateLimited,
    CircuitOpen,
    ConcurrencyLimited,
    Shed,
}

/// Where a decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// The Floodgate server.
    Server,
    /// The local cache of open breakers (fed by Watch): no round trip.
    OpenBreakerCache,
    /// The server was unreachable and the client fails open.
    FailOpen,
    /// The server was unreachable and the client fails closed.
    FailClosed,
}

/// A circuit breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
    ForcedOpen,
    Disabled,
    MetricsOnly,
}

/// One matched limit after the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limit {
    pub name: String,
    /// What the limit holds when full.
    pub limit: u64,
    pub remaining: u64,
    /// Until the limit is back to its initial state.
    pub reset_after: Duration,
    /// Until this cost would fit; zero when admitted.
    pub retry_after: Duration,
    /// The policy window (for `RateLimit-Policy`).
    pub window: Duration,
    /// This limit denied the request.
    pub exceeded: bool,
}

/// A permit to return with [`Client::report`](crate::Client::report).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Permit {
    pub id: String,
    pub resource: String,
    /// When it was handed out, to time the call.
    pub issued: Instant,
    /// The endpoint that issued it: reports go back there.
    pub(crate) endpoint: usize,
}

/// The answer to an [`Acquire`]. Read its fields; build one (to test code
/// that takes decisions) with [`Decision::new`] and the `with_` methods.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Decision {
    pub verdict: Verdict,
    /// Present when the resource has a breaker or a concurrency limit.
    pub permit: Option<Permit>,
    pub limits: Vec<Limit>,
    /// When a denied caller may usefully retry.
    pub retry_after: Duration,
    /// Shaping: wait this long before proceeding.
    pub wait: Duration,
    pub breaker_state: Option<BreakerState>,
    pub degradation_level: u32,
    /// One human line for denials.
    pub reason: String,
    pub source: Source,
}

/// How an admitted call went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    /// Neither: not counted by the breaker.
    Ignored,
}

// === impl Acquire ===

impl Acquire {
    pub fn new(resource: impl Into<String>) -> Self {
        Acquire { resource: resource.into(), ..Acquire::default() }
    }

    /// Adds a descriptor (`user`, `tenant`, `ip`...).
    pub fn descriptor(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.descriptors.insert(key.into(), value.into());
        self
    }

    /// How much to take (default 1).
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    /// Ask without consuming anything.
    pub fn dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }

    pub fn resource(&self) -> &str {
        &self.resource
    }

    pub fn descriptors(&self) -> &HashMap<String, String> {
        &self.descriptors
    }

    pub(crate) fn to_proto(&self) -> pb::AcquireRequest {
        pb::AcquireRequest {
            resource: self.resource.clone(),
            descriptors: self.descriptors.clone(),
            cost: self.cost,
            dry_run: self.dry_run,
        }
    }
}

// === impl Limit ===

impl Limit {
    /// A limit of `limit` per `window`, full, not exceeded.
    pub fn new(name: impl Into<String>, limit: u64, window: Duration) -> Self {
        Limit {
            name: name.into(),
            limit,
            remaining: limit,
            reset_after: Duration::ZERO,
            retry_after: Duration::ZERO,
            window,
            exceeded: false,
        }
    }

    pub fn with_remaining(mut self, n: u64) -> Self {
        self.remaining = n;
        self
    }

    pub fn with_reset_after(mut self, d: Duration) -> Self {
        self.reset_after = d;
        self
    }

    /// Exceeded, with when this cost would fit.
    pub fn exceeded(mut self, retry_after: Duration) -> Self {
        self.exceeded = true;
        self.retry_after = retry_after;
        self
    }
}

// === impl Decision ===

impl Decision {
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allowed
    }

    /// A decision with this verdict and nothing else, as if from the server.
    pub fn new(verdict: Verdict) -> Self {
        Decision { verdict, source: Source::Server, ..Decision::fail_open() }
    }

    pub fn with_limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    pub fn with_retry_after(mut self, d: Duration) -> Self {
        self.retry_after = d;
        self
    }

    pub fn with_wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = reason.into();
        self
    }

    /// The limit that matters most to a caller: the one that denied, else the
    /// one with the least left.
    ///
    /// ```
    /// use std::time::Duration;
    /// use floodgate_client::{Decision, Verdict};
    /// use floodgate_client::decision::Limit;
    ///
    /// let minute = Duration::from_secs(60);
    /// let d = Decision::new(Verdict::Allowed)
    ///     .with_limit(Limit::new("global", 10, minute).with_remaining(7))
    ///     .with_limit(Limit::new("per-user", 10, minute).with_remaining(2));
    /// assert_eq!(d.tightest().unwrap().name, "per-user");
    /// ```
    pub fn tightest(&self) -> Option<&Limit> {
        self.limits.iter().find(|l| l.exceeded).or_else(|| self.limits.iter().min_by_key(|l| l.remaining))
    }

    /// What the client answers on the server's behalf when it cannot be reached
    /// and fails open: allowed, with no limits.
    pub fn fail_open() -> Self {
        Decision {
            verdict: Verdict::Allowed,
            permit: None,
            limits: Vec::new(),
            retry_after: Duration::ZERO,
            wait: Duration::ZERO,
            breaker_state: None,
            degradation_level: 0,
            reason: String::new(),
            source: Source::FailOpen,
        }
    }

    /// ... and when it fails closed: shed, retry after `retry_after`.
    pub fn fail_closed(retry_after: Duration) -> Self {
        Decision {
            verdict: Verdict::Shed,
            retry_after,
            reason: "Floodgate is unreachable and this client fails closed".into(),
            source: Source::FailClosed,
            ..Decision::fail_open()
        }
    }

    pub(crate) fn from_proto(r: pb::AcquireResponse, resource: &str, issued: Instant) -> Self {
        let verdict = match r.verdict() {
            pb::Verdict::RateLimited => Verdict::RateLimited,
            pb::Verdict::CircuitOpen => Verdict::CircuitOpen,
            pb::Verdict::ConcurrencyLimited => Verdict::ConcurrencyLimited,
            pb::Verdict::Shed => Verdict::Shed,
            pb::Verdict::Allowed | pb::Verdict::Unspecified => Verdict::Allowed,
        };
        Decision {
            verdict,
            permit: (!r.permit_id.is_empty()).then(|| Permit {
                id: r.permit_id.clone(),
                resource: resource.into(),
                issued,
                endpoint: 0,
            }),
            limits: r
                .limits
                .iter()
                .map(|l| Limit {
                    name: l.name.clone(),
                    limit: l.limit,
                    remaining: l.remaining,
                    reset_after: duration(&l.reset_after),
                    retry_after: duration(&l.retry_after),
                    window: duration(&l.window),
                    exceeded: l.exceeded,
                })
                .collect(),
            retry_after: duration(&r.retry_after),
            wait: duration(&r.wait),
            breaker_state: breaker_state(r.breaker_state),
            degradation_level: r.degradation_level,
            reason: r.reason,
            source: Source::Server,
        }
    }
}

pub(crate) fn duration(d: &Option<prost_types::Duration>) -> Duration {
    d.as_ref().map_or(Duration::ZERO, |d| Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
}

pub(crate) fn breaker_state(n: i32) -> Option<BreakerState> {
    Some(match pb::BreakerState::try_from(n).ok()? {
        pb::BreakerState::Unspecified => return None,
        pb::BreakerState::Closed => BreakerState::Closed,
        pb::BreakerState::Open => BreakerState::Open,
        pb::BreakerState::HalfOpen => BreakerState::HalfOpen,
        pb::BreakerState::ForcedOpen => BreakerState::ForcedOpen,
        pb::BreakerState::Disabled => BreakerState::Disabled,
        pb::BreakerState::MetricsOnly => BreakerState::MetricsOnly,
    })
}

impl Outcome {
    pub(crate) fn to_proto(self) -> pb::Outcome {
        match self {
            Outcome::Success => pb::Outcome::Success,
            Outcome::Failure => pb::Outcome::Failure,
            Outcome::Ignored => pb::Outcome::Ignored,
        }
    }
}
