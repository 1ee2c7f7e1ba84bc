//! The `floodgate` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod check_config;
mod client;
mod control;
mod overrides;
mod recommend;
mod serve;
mod top;
mod why;

#[derive(Parser, Debug)]
#[command(name = "floodgate", version, about = "A rate-limit and circuit-breaker decision service")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human, env = "FLOODGATE_LOG_FORMAT")]
    log_format: LogFormat,

    /// Log filter, e.g. `info` or `floodgate=debug` (RUST_LOG syntax).
    #[arg(long, global = true, default_value = "info", env = "FLOODGATE_LOG")]
    log_level: String,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the server (embedded default rules and memory only unless told otherwise).
    Serve(Box<serve::ServeArgs>),
    /// Validate a rules file; exits non-zero listing every error.
    CheckConfig(check_config::CheckConfigArgs),
    /// Ask a server for one decision and print it.
    Acquire(client::AcquireArgs),
    /// Show the rules a server has, apply a rules file to it, or revert one.
    Rules(client::RulesArgs),
    /// Report how a call admitted with a permit went.
    Report(control::ReportArgs),
    /// Show circuit breakers (all, or one in detail), or set one's state.
    Breakers(control::BreakersArgs),
    /// Show the degradation level, set it (0-3), or return it to automatic.
    Level(control::LevelArgs),
    /// Stream breaker transitions, level changes and rule reloads.
    Watch(control::WatchArgs),
    /// Overrides set at run time: list (default), set, delete.
    Overrides(overrides::OverridesArgs),
    /// Who is being limited: each limit's most denied and admitted keys lately.
    Top(top::TopArgs),
    /// Why calls were answered as they were, from the server's decision log.
    Why(why::WhyArgs),
    /// Show a balance (a limit with algorithm: balance), or top it up or take
    /// from it with a reason for the audit log.
    Balance(control::BalanceArgs),
    /// Propose a limit a minute from recorded calls, and replay them
    /// against it.
    Recommend(recommend::RecommendArgs),
    /// Load-test a server, ghz-style.
    Bench(crate::bench::BenchArgs),
}

impl Cli {
    pub fn run(self) -> ExitCode {
        let filter = std::env::var("RUST_LOG").ok().unwrap_or_else(|| self.log_level.clone());
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&filter) {
            eprintln!("floodgate: --log-level (or RUST_LOG) '{}': {e}", filter.escape_debug());
            return ExitCode::from(2);
        }
        // The server sets up logging on its runtime, where traces are exported from.
        if !matches!(self.command, Command::Serve(_)) {
            init_logging(self.log_format, &self.log_level, None);
        }
        let result = match self.command {
            Command::Serve(args) => serve::run(*args, self.log_format, self.log_level),
            Command::Bench(args) => crate::bench::run(args),
            Command::Recommend(args) => match recommend::run(args) {
                Ok(code) => return code,
                Err(e) => Err(e),
            },
            Command::CheckConfig(args) => return check_config::run(args),
            Command::Acquire(args) => return client::block_on(client::acquire(args)),
            Command::Rules(args) => return client::block_on(client::rules(args)),
            Command::Report(args) => return client::block_on(control::report(args)),
            Command::Breakers(args) => return client::block_on(control::breakers(args)),
            Command::Level(args) => return client::block_on(control::level(args)),
            Command::Watch(args) => return client::block_on(control::watch(args)),
            Command::Overrides(args) => return client::block_on(overrides::overrides(args)),
            Command::Top(args) => return client::block_on(top::top(args)),
            Command::Why(args) => return client::block_on(why::why(args)),
            Command::Balance(args) => return client::block_on(control::balance(args)),
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("floodgate: {}", crate::errors::chain(e.as_ref()));
                ExitCode::FAILURE
            }
        }
    }
}

/// Logs to stderr, filtered by `filter`; with `otlp`, the spans of gRPC
/// calls are exported too, whatever the log filter.
fn init_logging(
    format: LogFormat,
    filter: &str,
    otlp: Option<&crate::traces::OtlpConfig>,
) -> Option<crate::traces::Exporter> {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::prelude::*;
    let filter = std::env::var("RUST_LOG").ok().unwrap_or_else(|| filter.to_string());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Human => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let (exporter, spans) = match otlp.map(crate::traces::Exporter::start) {
        Some(Ok((exporter, layer))) => {
            let only_calls = tracing_subscriber::filter::filter_fn(|m| m.target() == "floodgate::rpc");
            (Some(exporter), Some(layer.with_filter(only_calls)))
        }
        Some(Err(e)) => {
            eprintln!("floodgate: OTLP exporter: {e:#}; no traces will be exported");
            (None, None)
        }
        None => (None, None),
    };
    let _ = tracing_subscriber::registry().with(fmt.with_filter(filter)).with(spans).try_init();
    exporter
}

/// Parses a duration flag such as `10s` or `250ms`.
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    crate::rules::duration::parse(s)
}

/// A duration flag of at least `min` (an interval or a timeout: below it the
/// server would spin, flood Redis, or close connections before they speak).
fn at_least(s: &str, min: std::time::Duration) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if d < min {
        return Err(format!("must be at least {}", crate::rules::duration::format(min)));
    }
    Ok(d)
}

pub(crate) fn at_least_1ms(s: &str) -> Result<std::time::Duration, String> {
    at_least(s, std::time::Duration::from_millis(1))
}

pub(crate) fn at_least_10ms(s: &str) -> Result<std::time::Duration, String> {
    at_least(s, std::time::Duration::from_millis(10))
}

pub(crate) fn at_least_100ms(s: &str) -> Result<std::time::Duration, String> {
    at_least(s, std::time::Duration::from_millis(100))
}

pub(crate) fn at_least_1s(s: &str) -> Result<std::time::Duration, String> {
    at_least(s, std::time::Duration::from_secs(1))
}

/// `--threads`: 1 to 1024 workers (more than the OS gives a process fails
/// to start, not a reason to crash).
pub(crate) fn parse_threads(s: &str) -> Result<usize, String> {
    match parse_positive(s)? {
        n if n > 1024 => Err("must be at most 1024".into()),
        n => Ok(n),
    }
}

/// A count flag that must be at least 1.
/// A size in bytes: a number, or one with a `KiB`, `MiB` or `GiB` suffix.
pub(crate) fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&s[..i], s[i..].trim()),
        None => (s, ""),
    };
    let shift = match unit {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        other => return Err(format!("'{other}' is not a unit: use KiB, MiB or GiB")),
    };
    let n: usize = number.parse().map_err(|e| format!("'{s}': {e}"))?;
    let bytes = n.checked_mul(1 << shift).ok_or_else(|| format!("'{s}' is too large"))?;
    if bytes == 0 {
        return Err("must be at least 1 byte".into());
    }
    Ok(bytes)
}

/// `--max-key-bytes`: a size of at least 64 KiB. A bound smaller than a
/// few keys would evict every key as soon as it is made, and no limit keyed
/// on them would ever apply.
pub(crate) fn parse_key_bytes(s: &str) -> Result<usize, String> {
    let bytes = parse_bytes(s)?;
    if bytes < 64 << 10 {
        return Err(format!("'{s}' is less than 64KiB: so few bytes of keys would keep no limit in force"));
    }
    Ok(bytes)
}

/// A descriptor key: 1 to 256 bytes, no control characters.
pub(crate) fn descriptor_key(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > crate::rules::MAX_NAME_BYTES || s.chars().any(char::is_control) {
        return Err("must be 1 to 256 bytes, without control characters".into());
    }
    Ok(s.to_string())
}

pub(crate) fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Writes `args` to standard output for [`out!`] and [`outln!`]. A closed
/// pipe (the reader went away) exits with success at once; another error
/// exits with status 1 and says why.
pub fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("floodgate: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// "in 5m" or "3s ago".
fn ago_or_in_ts(t: &prost_types::Timestamp) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::new(t.seconds.max(0) as u64, t.nanos.max(0) as u32);
    match at.duration_since(std::time::SystemTime::now()) {
        Ok(d) => format!("in {}", crate::rules::duration::human(d)),
        Err(e) => format!("{} ago", crate::rules::duration::human(e.duration())),
    }
}
