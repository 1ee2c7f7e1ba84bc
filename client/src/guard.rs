//! Acquire, run the call, time it, classify its result, report it; fall back
//! when denied or failed.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::client::Client;
use crate::decision::{Acquire, Decision, Outcome};
use crate::error::Error;

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
    /// Floodgate refused the question (bad input).
    #[error(transparent)]
    Client(Error),
}

/// What to answer instead of a denied or failed call.
#[non_exhaustive]
pub enum Fallback<T> {
    /// This value.
    Value(T),
    /// The resource's last good value (marked stale); none before the first.
    LastGood,
    /// What this closure makes of the denial (`None` when the call failed).
    With(FallbackFn<T>),
}

/// A fallback closure: given the denial, if there was one.
pub type FallbackFn<T> = Arc<dyn Fn(Option<&Decision>) -> T + Send + Sync>;

/// A value, and whether it came from the call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Served<T> {
    Fresh(T),
    /// A fallback value (`Fallback::Value` or `Fallback::With`).
    Fallback(T),
    /// The last good value.
    Stale(T),
}

/// One guarded call: see [`Client::guard`].
pub struct Guard<'c, C = ByResult> {
    client: &'c Client,
    req: Acquire,
    classify: C,
}

impl<T> Served<T> {
    pub fn into_inner(self) -> T {
        match self {
            Served::Fresh(v) | Served::Fallback(v) | Served::Stale(v) => v,
        }
    }

    pub fn is_fresh(&self) -> bool {
        matches!(self, Served::Fresh(_))
    }
}

impl<T> Fallback<T> {
    pub fn with(f: impl Fn(Option<&Decision>) -> T + Send + Sync + 'static) -> Self {
        Fallback::With(Arc::new(f))
    }
}

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
    ///     .classify(|r: &Result<u32, u16>| if matches!(r, Err(404)) { Outcome::Success } else if r.is_ok() { Outcome::Success } else { Outcome::Failure })
    ///     .run(|| async { Ok::<u32, u16>(7) })
    ///     .await;
    /// assert_eq!(answer.unwrap(), 7);
    /// # }
    /// ```
    pub fn guard(&self, req: Acquire) -> Guard<'_> {
        Guard { client: self, req, classify: ByResult }
    }
}

impl<'c, C> Guard<'c, C> {
    /// Decides success and failure another way (by default `Err` is a failure).
    pub fn classify<C2>(self, classify: C2) -> Guard<'c, C2> {
        Guard { client: self.client, req: self.req, classify }
    }

    /// Runs `f` if allowed. Denied calls never run `f`.
    pub async fn run<T, E, F, Fut>(self, f: F) -> Result<T, GuardError<E>>
    where
        C: Classify<T, E>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let decision = self.client.acquire(&self.req).await.map_err(GuardError::Client)?;
        if !decision.is_allowed() {
            return Err(GuardError::Denied(Box::new(decision)));
        }
        if !decision.wait.is_zero() {
            tokio::time::sleep(decision.wait).await;
        }
        let start = Instant::now();
        let result = f().await;
        if let Some(permit) = &decision.permit {
            self.client.report(permit, self.classify.classify(&result), Some(start.elapsed()));
        }
        result.map_err(GuardError::Failed)
    }

    /// Runs `f` if allowed; when denied or failed, serves `fallback` instead.
    /// Errors only when there is nothing to fall back on (`LastGood` before a
    /// first good value) or Floodgate refused the question.
    pub async fn run_or<T, E, F, Fut>(self, fallback: &Fallback<T>, f: F) -> Result<Served<T>, GuardError<E>>
    where
        T: Clone + Send + Sync + 'static,
        C: Classify<T, E>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let (client, resource) = (self.client, self.req.resource().to_string());
        match self.run(f).await {
            Ok(v) => {
                if matches!(fallback, Fallback::LastGood) {
                    client
                        .inner()
                        .last_good
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(resource, Box::new(v.clone()));
                }
                Ok(Served::Fresh(v))
            }
            Err(GuardError::Client(e)) => Err(GuardError::Client(e)),
            Err(e) => {
                let denial = match &e {
                    GuardError::Denied(d) => Some(&**d),
                    _ => None,
                };
                match fallback {
                    Fallback::Value(v) => Ok(Served::Fallback(v.clone())),
                    Fallback::With(f) => Ok(Served::Fallback(f(denial))),
                    Fallback::LastGood => {
                        let stored = client.inner().last_good.lock().unwrap_or_else(|e| e.into_inner());
                        match stored.get(&resource).and_then(|v| v.downcast_ref::<T>()) {
                            Some(v) => Ok(Served::Stale(v.clone())),
                            None => Err(e),
                        }
                    }
                }
            }
        }
    }
}

/// A resource with its fallback, reusable for every call to it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use floodgate_client::guard::ResourceGuard;
/// use floodgate_client::{Client, Fallback, FailMode, Served};
///
/// let client = Client::builder().endpoint("http://127.0.0.1:1").fail_mode(FailMode::Closed).build().unwrap();
/// let prices = ResourceGuard::new(&client, "prices", Fallback::Value(vec![1.0_f64]));
/// // The server is unreachable and the client fails closed: the fallback is served.
/// let served = prices.run(|a| a, || async { Ok::<_, ()>(vec![2.0]) }).await.unwrap();
/// assert_eq!(served, Served::Fallback(vec![1.0]));
/// # }
/// ```
pub struct ResourceGuard<T> {
    client: Client,
    resource: String,
    fallback: Fallback<T>,
}

impl<T: Clone + Send + Sync + 'static> ResourceGuard<T> {
    pub fn new(client: &Client, resource: impl Into<String>, fallback: Fallback<T>) -> Self {
        ResourceGuard { client: client.clone(), resource: resource.into(), fallback }
    }

    /// One call; `describe` adds descriptors (and cost) to the question.
    pub async fn run<E, F, Fut>(
        &self,
        describe: impl FnOnce(Acquire) -> Acquire,
        f: F,
    ) -> Result<Served<T>, GuardError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let req = describe(Acquire::new(self.resource.clone()));
        self.client.guard(req).run_or(&self.fallback, f).await
    }
}
