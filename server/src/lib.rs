//! Floodgate: a centralized rate-limit and circuit-breaker decision service.
//!
//! Read top to bottom, from the wire to the state:
//! - [`cli`]: the `floodgate` binary's commands; `main` only parses flags.
//! - [`bench`]: `floodgate bench`, the ghz-style load generator;
//!   [`connect`]: how the CLI and the generator reach a server (TLS, tokens).
//! - [`server`]: `run(options, listeners, shutdown)`, wiring everything below.
//! - [`grpc`]: proto <-> domain translation and error mapping, nothing else.
//! - [`http`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`listen`]: both ports' connections: caps, timeouts, TLS and mTLS;
//!   [`access`]: who may call Admin.
//! - [`reload`]: hot reload of the rules file; [`files`]: watching files;
//!   [`xds`]: the Envoy configuration streamed from an xDS control plane.
//! - [`decider`]: the one decision path every entry point calls; the only
//!   place that knows whether the server replicates.
//! - [`replication`]: Redis: replicated and strict limits and concurrency limits,
//!   shared breakers and rules, reports passed on to the replica that issued the permit.
//! - [`engine`]: the decision core: rules in force, all-or-nothing over limits,
//!   breakers and permits; `engine::sync` keeps what replication needs.
//! - [`events`]: transitions and reloads, for Watch; [`metrics`]: names and the recorder;
//!   [`traces`]: spans over OTLP, continuing the caller's trace.
//! - [`rules`]: the rules file, validated into plain data that cannot hold a bad value;
//!   [`overrides`]: overrides set at run time, merged into the rules at install.
//! - [`hitters`]: each limit's hottest keys (Space-Saving sketches).
//! - [`store`]: every bucket, sharded in memory, with idle and LRU eviction.
//! - [`limiter`]: the six algorithms, pure state types that take `now`.
//! - [`breaker`], [`degradation`]: the breaker state machine and the levels;
//!   [`adaptive`]: adaptive concurrency limits (Gradient2, Vegas, AIMD), pure
//!   state over windows of samples.
//! - [`time`]: the injected clock; [`runtime`]: the Tokio runtime;
//!   [`digest`]: long descriptor values kept as their digest.
//!
//! Dependencies point down only (`scripts/module-cycles` checks there is no
//! cycle):
//! - `cli` -> `server` -> `grpc`, `http`, `xds` -> `decider` -> `replication` -> `engine`;
//! - `engine` -> `store`, `events`, `overrides`, `hitters`, `adaptive`;
//! - `adaptive` -> `rules`, `time`;
//! - `events` -> `degradation` -> `breaker` -> `rules` -> `limiter` -> `time`;
//! - `store` -> `limiter`; `overrides` -> `rules`; `metrics` and `hitters`
//!   import nothing of the crate.

pub mod access;
pub mod adaptive;
pub mod bench;
pub mod breaker;
pub mod cli;
pub mod connect;
pub mod decider;
pub mod degradation;
pub mod digest;
pub mod engine;
pub mod events;
pub mod files;
#[doc(hidden)]
pub mod fuzz;
pub mod grpc;
pub mod hitters;
pub mod http;
pub mod limiter;
pub mod listen;
pub mod metrics;
pub mod overrides;
pub mod reload;
pub mod replication;
pub mod rules;
pub mod runtime;
pub mod server;
pub mod store;
pub mod time;
pub mod traces;
pub mod xds;
