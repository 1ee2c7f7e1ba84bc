//! The `floodgate` binary's commands, as a library so that tests can reach
//! the load generator's raw codec.
//!
//! - [`cli`]: every command (`serve`, `check-config`, `acquire`, `bench`...);
//!   `main` only parses the flags.
//! - [`bench`]: `floodgate bench`, the ghz-style load generator.
//! - [`connect`]: how the commands and the generator reach a server (TLS, tokens).

// The crates below, under the names the commands use for them.
use floodgate_core::time;
use floodgate_engine::{metrics, overrides};
use floodgate_redis as replication;
use floodgate_rules as rules;
use floodgate_server::{access, decider, errors, files, grpc, http, listen, runtime, server, traces, xds};

pub mod bench;
pub mod cli;
pub mod connect;
