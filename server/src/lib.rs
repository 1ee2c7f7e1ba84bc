//! Floodgate: a centralized rate-limit and circuit-breaker decision service.

pub mod engine;
pub mod limiter;
pub mod rules;
pub mod store;
pub mod time;
