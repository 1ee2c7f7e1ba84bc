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

/// Writes a command's output to standard output, as `print!` does. A reader
/// that went away (`floodgate top | head`) ends the command quietly with
/// success, as Unix tools end; any other failure to write ends it with an
/// error. SIGPIPE stays ignored, so that a server that dies in the middle
/// of a call is an error the command reports, not a silent end.
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::write_out(format_args!($($arg)*)) };
}

/// Writes a line of a command's output, as `println!` does; see [`out!`].
macro_rules! outln {
    () => { $crate::cli::write_out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

pub mod bench;
pub mod cli;
pub mod connect;
