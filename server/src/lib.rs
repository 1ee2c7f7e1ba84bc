//! Floodgate: a centralized rate-limit and circuit-breaker decision service.

pub mod limiter;
pub mod time;
