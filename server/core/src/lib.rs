//! Floodgate's decision core, the part without rules: pure state types that
//! take the time as an argument and never read a clock, touch the network or
//! know about gRPC.
//!
//! - [`limiter`]: the seven limiter algorithms, one state type each.
//! - [`breaker`]: the circuit breaker's state machine and its window.
//! - [`adaptive`]: adaptive concurrency limits (Gradient2, Vegas, AIMD).
//! - [`store`]: every bucket, sharded in memory, with idle and LRU eviction.
//! - [`hitters`]: each limit's hottest keys (Space-Saving sketches).
//! - [`recommend`]: limits proposed from recorded traffic, proven by replay.
//! - [`time`]: the injected clock; [`digest`]: long values kept as a digest.
//!
//! The rules crate validates configuration into the plain data types defined
//! here (`limiter::Algorithm`, `breaker::BreakerConfig`,
//! `adaptive::AdaptiveConfig`); the engine crate decides with them.

pub mod adaptive;
pub mod breaker;
pub mod digest;
pub mod hitters;
pub mod limiter;
pub mod recommend;
pub mod store;
pub mod time;
