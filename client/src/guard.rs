//! Acquire, run the call, time it, classify its result, report it; fall back
//! when denied or failed, saying why.
//!
//! The permit goes into the call: if the caller's future is dropped midway
//! (an outer timeout, a client that hung up), the permit reports itself as
//! cancelled (FAILURE where a breaker counts it, IGNORED otherwise), so no
//! concurrency slot waits for its expiry.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::client::Client;
use crate::decision::{Acquire, Decision};
use crate::error::Error;
use crate::permit::{Outcome, Permit};

/// Decides how a call went from its result.
pub trait Classify<T, E> {
    fn classify(&self, result: &Result<T, E>) -> Outcome;
}

/// The default: `Ok` is a success, `Err` a failure.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByResult;

impl<T, E> Classify<T, E> for ByResult {
    fn classify(&self, result: &Result<T, E>) -> Outcome {
        if result.is_ok() { Outcome::Success } else { Outcome::Failure }
    }
}

/// Any closure, capturing or not.
impl<T, E, F: Fn(&Result<T, E>) -> Outcome> Classify<T, E> for F {
    fn classify(&self, result: &Result<T, E>) -> Outcome {
        self(result)
    }
}

/// Why a guarded call gave no value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError<E> {
    /// Floodgate said no; the call did not run. `retry_after` says when to try again.
    #[error("denied: {}", .0.reason)]
    Denied(Box<Decision>),
    /// The call ran and failed.
    #[error("the call failed: {0}")]
    Failed(E),
    /// Floodgate refused the question as bad input (a resource name too long,
    /// say): a bug in the caller, not a reason to fall back.
    #[error(transparent)]
    Client(Error),
}

/// Why a fallback was served.
#[derive(Debug)]
#[non_exhaustive]
pub enum Cause<E> {
    /// Denied, with the decision (verdict, `retry_after`, reason).
    Denied(Box<Decision>),
    /// The call ran and failed with this error.
    Failed(E),
}

/// What to answer instead of a denied or failed call.
#[non_exhaustive]
pub enum Fallback<T, E> {
    /// This value.
    Value(T),
    /// The last good value for the same question (see [`Guard::last_good_key`]),
    /// served as [`Served::Stale`]; none before the first good value.
    LastGood,
    /// What this closure makes of the cause.
    With(FallbackFn<T, E>),
}

/// A fallback closure: given the cause.
pub type FallbackFn<T, E> = Arc<dyn Fn(&Cause<E>) -> T + Send + Sync>;

/// A value, and where it came from.
#[derive(Debug)]
#[non_exhaustive]
pub enum Served<T, E> {
    /// From the call.
    Fresh(T),
    /// A fallback value ([`Fallback::Value`] or [`Fallback::With`]), and why.
    Fallback(T, Cause<E>),
    /// The last good value, and why it was served instead.
    Stale(T, Cause<E>),
}

/// One guarded call: see [`Client::guard`].
pub struct Guard<'c, C = ByResult> {
    client: &'c Client,
    req: Acquire,
    classify: C,
    cancelled: Option<Outcome>,
    key: Option<String>,
}

// === impl Served ===

impl<T, E> Served<T, E> {
    pub fn into_inner(self) -> T {
        match self {
            Served::Fresh(v) | Served::Fallback(v, _) | Served::Stale(v, _) => v,
        }
    }

    pub fn is_fresh(&self) -> bool {
        matches!(self, Served::Fresh(_))
    }

    /// Why it is not fresh.
    pub fn cause(&self) -> Option<&Cause<E>> {
        match self {
            Served::Fresh(_) => None,
            Served::Fallback(_, c) | Served::Stale(_, c) => Some(c),
        }
    }
}

impl<T, E> Fallback<T, E> {
    pub fn with(f: impl Fn(&Cause<E>) -> T + Send + Sync + 'static) -> Self {
        Fallback::With(Arc::new(f))
    }
}

// === impl Client ===

impl Client {
    /// Guards one call: acquires, runs `f` only if allowed (after any shaping
    /// wait), times it, classifies its result and reports it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use floodgate_client::{Acquire, Client, Outcome};
    ///
    /// let client = Client::connect("http://127.0.0.1:1").unwrap(); // fails open
    /// let answer = client
    ///     .guard(Acquire::new("inventory"))
    ///     // A 404 is an answer, not a failure of the downstream.
    ///     .classify(|r: &Result<u32, u16>| if matches!(r, Ok(_) | Err(404)) { Outcome::Success } else { Outcome::Failure })
    ///     .run(|| async { Ok::<u32, u16>(7) })
    ///     .await;
    /// assert_eq!(answer.unwrap(), 7);
    /// # }
    /// ```
    pub fn guard(&self, req: Acquire) -> Guard<'_> {
        Guard { client: self, req, classify: ByResult, cancelled: None, key: None }
    }
}

// === impl Guard ===

impl<'c, C> Guard<'c, C> {
    /// Decides success and failure another way (by default `Err` is a failure).
    pub fn classify<C2>(self, classify: C2) -> Guard<'c, C2> {
        Guard { client: self.client, req: self.req, classify, cancelled: self.cancelled, key: self.key }
    }

    /// How this call counts if it is cancelled before it finishes.
    pub fn cancelled_as(mut self, outcome: Outcome) -> Self {
        self.cancelled = Some(outcome);
        self
    }

    /// What else the last good value depends on, beyond the question (the
    /// resource and its descriptors, which the value is always kept under):
    /// an item's id, say. It adds to the question's identity, never replaces
    /// it, so one caller's value is never served for another's question.
    pub fn last_good_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Asks; when allowed, waits out any shaping and hands over the permit
    /// (set to report this guard's cancellation outcome if dropped).
    async fn admit<E>(&self) -> Result<Option<Permit>, GuardError<E>> {
        let asked = Instant::now();
        let mut decision = self.client.acquire(&self.req).await.map_err(GuardError::Client)?;
        if !decision.is_allowed() {
            return Err(GuardError::Denied(Box::new(decision)));
        }
        if !decision.wait.is_zero() {
            tokio::time::sleep(decision.wait).await;
        }
        // How long the call waited before it ran: the load reporter sends
        // the mean as this process's queueing delay.
        self.client.inner().stats.queued(asked.elapsed());
        Ok(decision.permit.take().map(|p| match self.cancelled {
            Some(outcome) => p.on_drop(outcome),
            None => p,
        }))
    }

    /// Runs `f` if allowed. Denied calls never run `f`.
    pub async fn run<T, E, F, Fut>(self, f: F) -> Result<T, GuardError<E>>
    where
        C: Classify<T, E>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let permit = self.admit().await?;
        let start = Instant::now();
        let _running = self.client.inner().stats.running();
        // If this future is dropped here, the permit reports itself as cancelled.
        let result = f().await;
        if let Some(permit) = permit {
            permit.report_latency(self.classify.classify(&result), start.elapsed());
        }
        result.map_err(GuardError::Failed)
    }

    /// Reserve, then settle: runs `f` if allowed, with the request's cost as
    /// an estimate ([`Acquire::settle`](crate::Acquire::settle) is set); `f`
    /// answers its result and what the call really cost (an LLM call's
    /// tokens), which settles the estimate: the server gives back the
    /// difference, or takes the rest beyond the limit (a debt later callers
    /// wait out).
    pub async fn run_metered<T, E, F, Fut>(mut self, f: F) -> Result<T, GuardError<E>>
    where
        C: Classify<T, E>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = (Result<T, E>, u64)>,
    {
        self.req = self.req.settle();
        let permit = self.admit().await?;
        let _running = self.client.inner().stats.running();
        // If this future is dropped here, the permit reports itself as cancelled.
        let (result, actual) = f().await;
        if let Some(permit) = permit {
            permit.report_cost(self.classify.classify(&result), actual);
        }
        result.map_err(GuardError::Failed)
    }

    /// Runs `f` if allowed; when denied or failed, serves `fallback` instead,
    /// with the cause. Errors only when there is nothing to fall back on
    /// (`LastGood` before a first good value) or the question was bad input.
    pub async fn run_or<T, E, F, Fut>(self, fallback: &Fallback<T, E>, f: F) -> Result<Served<T, E>, GuardError<E>>
    where
        T: Clone + Send + Sync + 'static,
        C: Classify<T, E>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let client = self.client;
        let mut key = crate::local::key(&self.req);
        if let Some(extra) = &self.key {
            key.push('+');
            crate::local::push_part(&mut key, extra);
        }
        let cause = match self.run(f).await {
            Ok(v) => {
                if matches!(fallback, Fallback::LastGood) {
                    client.inner().last_good.put(key, &v);
                }
                return Ok(Served::Fresh(v));
            }
            Err(GuardError::Client(e)) => return Err(GuardError::Client(e)),
            Err(GuardError::Denied(d)) => Cause::Denied(d),
            Err(GuardError::Failed(e)) => Cause::Failed(e),
        };
        match fallback {
            Fallback::Value(v) => Ok(Served::Fallback(v.clone(), cause)),
            Fallback::With(f) => Ok(Served::Fallback(f(&cause), cause)),
            Fallback::LastGood => match client.inner().last_good.get::<T>(&key) {
                Some(v) => Ok(Served::Stale(v, cause)),
                None => Err(match cause {
                    Cause::Denied(d) => GuardError::Denied(d),
                    Cause::Failed(e) => GuardError::Failed(e),
                }),
            },
        }
    }
}

/// A resource with its fallback, reusable for every call to it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use floodgate_client::guard::{Cause, ResourceGuard};
/// use floodgate_client::{Client, Fallback, FailMode, Served};
///
/// let client = Client::builder().endpoint("http://127.0.0.1:1").fail_mode(FailMode::Closed).build().unwrap();
/// let prices = ResourceGuard::new(&client, "prices", Fallback::Value(vec![1.0_f64]));
/// // The server is unreachable and the client fails closed: the fallback is served, with why.
/// let served = prices.run(|a| a, || async { Ok::<_, ()>(vec![2.0]) }).await.unwrap();
/// assert!(matches!(served, Served::Fallback(ref v, Cause::Denied(_)) if *v == vec![1.0]));
/// # }
/// ```
pub struct ResourceGuard<T, E> {
    client: Client,
    resource: String,
    fallback: Fallback<T, E>,
}

impl<T: Clone + Send + Sync + 'static, E> ResourceGuard<T, E> {
    pub fn new(client: &Client, resource: impl Into<String>, fallback: Fallback<T, E>) -> Self {
        ResourceGuard { client: client.clone(), resource: resource.into(), fallback }
    }

    /// One call; `describe` adds descriptors (and cost) to the question.
    pub async fn run<F, Fut>(
        &self,
        describe: impl FnOnce(Acquire) -> Acquire,
        f: F,
    ) -> Result<Served<T, E>, GuardError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let req = describe(Acquire::new(self.resource.clone()));
        self.client.guard(req).run_or(&self.fallback, f).await
    }
}
