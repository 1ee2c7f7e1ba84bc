//! Floodgate's server: the network side of the decisions the engine makes.
//!
//! - [`server`]: `run(options, listeners, shutdown)`, wiring everything below.
//! - [`grpc`]: the gRPC services (Floodgate, Admin, Envoy's RLS and RLQS,
//!   health, reflection): proto <-> domain translation, the unary HTTP/2 path
//!   of the decision calls, byte budgets and the RLQS lease book.
//! - [`http`]: the HTTP port: `/healthz`, `/readyz`, `/metrics` and the console.
//! - [`listen`]: both ports' connections: caps, timeouts, TLS and mTLS;
//!   [`access`]: who may call Admin.
//! - [`reload`]: hot reload of the rules files; [`files`]: watching files;
//!   [`xds`]: the Envoy configuration streamed from an xDS control plane.
//! - [`decider`]: the one decision path every entry point calls.
//! - [`metrics`]: the Prometheus recorder; [`traces`]: spans over OTLP;
//!   [`runtime`]: the Tokio runtime.
//!
//! Below it: `floodgate-redis` (coordination through Redis), `floodgate-engine`
//! (decisions), `floodgate-rules` (the rule model) and `floodgate-core` (the
//! algorithms). Cargo keeps each of them from reaching up.

// The layers below, under the names this crate's modules use for them.
use floodgate_core::{breaker, digest, hitters, limiter, store, time};
use floodgate_engine as engine;
use floodgate_engine::{degradation, events, overrides};
use floodgate_redis as replication;
use floodgate_rules as rules;

pub mod access;
pub mod decider;
pub mod errors;
pub mod files;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod grpc;
pub mod http;
pub mod listen;
pub mod memory;
mod metrics;
mod reload;
pub mod runtime;
pub mod server;
pub mod traces;
pub mod xds;

/// A mutex's guard, even after a thread panicked while holding it: the
/// state behind these mutexes (the console's timeline, the paths a watcher
/// follows) stays usable whatever a panic interrupted.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
