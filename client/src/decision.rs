//! What the client asks and what it is told.

use std::collections::HashMap;
use std::time::Duration;

use floodgate_proto::v1 as pb;

use crate::permit::Permit;

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
    settle: bool,
    priority: Priority,
    usage: HashMap<String, u64>,
}

/// How much a request matters when its system sheds load: by default level 1
/// sheds `Sheddable`, 2 also `SheddablePlus`, 3 everything but `CriticalPlus`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Priority {
    /// Never shed by a degradation level.
    CriticalPlus,
    /// The default.
    #[default]
    Critical,
    SheddablePlus,
    Sheddable,
}

impl Priority {
    /// `critical_plus`, `critical`, `sheddable_plus` or `sheddable` (any case,
    /// with or without a `PRIORITY_` prefix), as a header would carry it.
    pub fn parse(text: &str) -> Option<Priority> {
        let t = text.trim().to_ascii_lowercase();
        match t.strip_prefix("priority_").unwrap_or(&t) {
            "critical_plus" => Some(Priority::CriticalPlus),
            "critical" => Some(Priority::Critical),
            "sheddable_plus" => Some(Priority::SheddablePlus),
            "sheddable" => Some(Priority::Sheddable),
            _ => None,
        }
    }

    fn to_proto(self) -> pb::Priority {
        match self {
            Priority::CriticalPlus => pb::Priority::CriticalPlus,
            Priority::Critical => pb::Priority::Critical,
            Priority::SheddablePlus => pb::Priority::SheddablePlus,
            Priority::Sheddable => pb::Priority::Sheddable,
        }
    }
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
    /// No rule matches the resource (the client knows the rules' patterns
    /// from Watch): allowed, no round trip.
    NoRule,
    /// The server was unreachable and the client fails open.
    FailOpen,
    /// The server was unreachable and the client fails closed.
    FailClosed,
    /// The server was unreachable and the client decided with its own
    /// limiter, at its share of the limits the server last reported.
    Local,
    /// A lease the server granted this client: no round trip.
    Lease,
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
    /// The request went over this limit. It was denied, unless
    /// `admitted_over_limit` is set.
    pub exceeded: bool,
    /// The request went over this limit and was admitted anyway, as one of
    /// the share of calls over it that the limit's `over_limit` admits: the
    /// caller is past its limit and should slow down.
    pub admitted_over_limit: bool,
}

/// The answer to an [`Acquire`]. Read its fields; build one (to test code
/// that takes decisions) with [`Decision::new`] and the `with_` methods.
#[derive(Debug)]
#[non_exhaustive]
pub struct Decision {
    pub verdict: Verdict,
    /// Present when the resource has a breaker or a concurrency limit. It
    /// reports itself when dropped; take it and report the call's outcome.
    pub permit: Option<Permit>,
    pub limits: Vec<Limit>,
    /// When a denied caller may usefully retry.
    pub retry_after: Duration,
    /// Shaping: wait this long before proceeding.
    pub wait: Duration,
    pub breaker_state: Option<BreakerState>,
    pub degradation_level: u32,
    /// The resource's concurrency limit, when it has one (0 otherwise).
    pub max_in_flight: u32,
    /// One human line for denials.
    pub reason: String,
    pub source: Source,
    /// When the resource's rule has a waterfall of budgets: the name of the
    /// source that paid for this allowed call. Empty when the rule's own
    /// limits paid (and for a denial, whose `limits` show every source).
    pub paid_by: String,
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

    /// Usage the call expects, by field (`input_tokens`, `output_tokens`...):
    /// each matched limit with a `cost` formula takes what its formula gives
    /// for it, instead of [`cost`](Self::cost). The names must be usage
    /// fields of the resource's rule.
    pub fn usage(mut self, field: impl Into<String>, value: u64) -> Self {
        self.usage.insert(field.into(), value);
        self
    }

    /// The same request with each usage field at 0: limits priced by
    /// usage take nothing, the others take the request's cost.
    pub(crate) fn zeroed_usage(mut self) -> Self {
        self.usage.values_mut().for_each(|v| *v = 0);
        self
    }

    /// The usage set with [`usage`](Self::usage).
    pub fn usage_of(&self) -> &HashMap<String, u64> {
        &self.usage
    }

    /// Ask without consuming anything.
    pub fn dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }

    /// The cost is an estimate: settle the actual cost with
    /// [`Permit::report_cost`](crate::Permit::report_cost) (an LLM call's
    /// tokens, bytes streamed). Unsettled, the estimate stands.
    pub fn settle(mut self) -> Self {
        self.settle = true;
        self
    }

    /// Which requests go first when the resource's system sheds load.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    pub fn priority_of(&self) -> Priority {
        self.priority
    }

    pub fn resource(&self) -> &str {
        &self.resource
    }

    pub fn descriptors(&self) -> &HashMap<String, String> {
        &self.descriptors
    }

    pub(crate) fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    pub(crate) fn is_settle(&self) -> bool {
        self.settle
    }

    /// The units it takes (0 is read as 1).
    pub fn cost_units(&self) -> u32 {
        self.cost.max(1)
    }

    pub(crate) fn to_proto(&self) -> pb::AcquireRequest {
        pb::AcquireRequest {
            resource: self.resource.clone(),
            descriptors: self.descriptors.clone(),
            cost: self.cost,
            dry_run: self.dry_run,
            settle: self.settle,
            priority: self.priority.to_proto() as i32,
            usage: self.usage.clone(),
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
            admitted_over_limit: false,
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

    /// Allowed from a lease.
    pub(crate) fn leased() -> Self {
        Decision { source: Source::Lease, ..Decision::fail_open() }
    }

    /// Denied from a lease: the last one asked for found nothing left, or
    /// this process used its share (`why`); with the limits as the last
    /// lease answer said.
    pub(crate) fn lease_empty(retry_after: Duration, why: &str, limits: Vec<Limit>) -> Self {
        Decision {
            verdict: Verdict::RateLimited,
            retry_after,
            limits,
            reason: format!("rate limited ({why}), retry in {}ms", retry_after.as_millis()),
            source: Source::Lease,
            ..Decision::fail_open()
        }
    }

    /// What the client answers on the server's behalf when it cannot be
    /// reached and fails open ([`Source::FailOpen`]): allowed, with no limits
    /// and no permit. Also the base the other constructors fill in.
    pub fn fail_open() -> Self {
        Decision {
            verdict: Verdict::Allowed,
            permit: None,
            limits: Vec::new(),
            retry_after: Duration::ZERO,
            wait: Duration::ZERO,
            breaker_state: None,
            degradation_level: 0,
            max_in_flight: 0,
            reason: String::new(),
            source: Source::FailOpen,
            paid_by: String::new(),
        }
    }

    /// ... and when it fails closed: shed, retry after `retry_after`.
    pub fn fail_closed(retry_after: Duration) -> Self {
        Decision {
            verdict: Verdict::Shed,
            retry_after,
            reason: "the rate limit service is unreachable".into(),
            source: Source::FailClosed,
            ..Decision::fail_open()
        }
    }

    /// Copies everything but the permit (which belongs to one caller).
    pub fn without_permit(&self) -> Decision {
        Decision {
            verdict: self.verdict,
            permit: None,
            limits: self.limits.clone(),
            retry_after: self.retry_after,
            wait: self.wait,
            breaker_state: self.breaker_state,
            degradation_level: self.degradation_level,
            max_in_flight: self.max_in_flight,
            reason: self.reason.clone(),
            source: self.source,
            paid_by: self.paid_by.clone(),
        }
    }

    /// The server's answer as a decision with no permit, for a process that
    /// passes an answer on rather than makes the call: Floodgate's own JSON
    /// API sets its HTTP rate limit fields from it with
    /// [`rate_limit_headers`](crate::http::rate_limit_headers).
    pub fn from_answer(r: pb::AcquireResponse) -> Self {
        let r = pb::AcquireResponse { permit_id: String::new(), ..r };
        Decision::from_proto(r, |_, _, _| unreachable!("an answer without a permit id makes no permit"))
    }

    /// The server's answer; `permit` makes the permit when it sent one.
    pub(crate) fn from_proto(
        r: pb::AcquireResponse,
        permit: impl FnOnce(String, bool, Option<BreakerState>) -> Permit,
    ) -> Self {
        let verdict = match r.verdict() {
            pb::Verdict::RateLimited => Verdict::RateLimited,
            pb::Verdict::CircuitOpen => Verdict::CircuitOpen,
            pb::Verdict::ConcurrencyLimited => Verdict::ConcurrencyLimited,
            pb::Verdict::Shed => Verdict::Shed,
            pb::Verdict::Allowed | pb::Verdict::Unspecified => Verdict::Allowed,
        };
        let breaker = breaker_state(r.breaker_state);
        // A probe in HALF_OPEN and a concurrency slot are waited on: their
        // reports leave at once.
        let urgent = r.holds_slot || breaker == Some(BreakerState::HalfOpen);
        Decision {
            verdict,
            permit: (!r.permit_id.is_empty()).then(|| permit(r.permit_id.clone(), urgent, breaker)),
            limits: r.limits.iter().map(Limit::from_proto).collect(),
            retry_after: duration(&r.retry_after),
            wait: duration(&r.wait),
            breaker_state: breaker,
            degradation_level: r.degradation_level,
            max_in_flight: r.max_in_flight,
            reason: r.reason,
            source: Source::Server,
            paid_by: r.paid_by,
        }
    }
}

impl Limit {
    pub(crate) fn from_proto(l: &pb::LimitStatus) -> Limit {
        Limit {
            name: l.name.clone(),
            limit: l.limit,
            remaining: l.remaining,
            reset_after: duration(&l.reset_after),
            retry_after: duration(&l.retry_after),
            window: duration(&l.window),
            exceeded: l.exceeded,
            admitted_over_limit: l.admitted_over_limit,
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
