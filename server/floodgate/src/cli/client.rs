//! Client commands: `acquire` and `rules`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use floodgate_proto::v1 as pb;

/// Exit status of `acquire` when the last decision was a denial.
const DENIED: u8 = 3;

pub use crate::connect::Target as Server;

#[derive(Args, Debug)]
pub struct AcquireArgs {
    #[command(flatten)]
    server: Server,
    /// The resource to ask about, e.g. "GET /api/orders/:id".
    resource: String,
    /// A descriptor, as key=value; repeat for more.
    #[arg(short = 'd', long = "descriptor", value_parser = parse_pair)]
    descriptors: Vec<(String, String)>,
    /// Units to take (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    cost: u32,
    /// Answer without consuming anything.
    #[arg(long)]
    dry_run: bool,
    /// The cost is an estimate: the answer's permit settles the actual cost
    /// (`floodgate report --actual-cost N`).
    #[arg(long)]
    settle: bool,
    /// Usage the call expects, as field=number (input_tokens=812); repeat
    /// for more. Limits with a `cost` formula take what it gives for it.
    #[arg(long = "usage", value_parser = parse_usage)]
    usage: Vec<(String, u64)>,
    /// Ask this many times, one decision after another.
    #[arg(long, short = 'n', default_value_t = 1)]
    count: u32,
    /// The request's priority when its system sheds load: critical_plus,
    /// critical (the default), sheddable_plus or sheddable.
    #[arg(long, value_parser = parse_priority)]
    priority: Option<pb::Priority>,
}

fn parse_priority(s: &str) -> Result<pb::Priority, String> {
    use crate::rules::Priority;
    match Priority::parse(s) {
        Some(Priority::CriticalPlus) => Ok(pb::Priority::CriticalPlus),
        Some(Priority::Critical) => Ok(pb::Priority::Critical),
        Some(Priority::SheddablePlus) => Ok(pb::Priority::SheddablePlus),
        Some(Priority::Sheddable) => Ok(pb::Priority::Sheddable),
        None => Err(format!("'{s}' is not a priority: critical_plus, critical, sheddable_plus or sheddable")),
    }
}

#[derive(Args, Debug)]
pub struct RulesArgs {
    #[command(flatten)]
    server: Server,
    #[command(subcommand)]
    action: Option<RulesAction>,
}

#[derive(Subcommand, Debug)]
enum RulesAction {
    /// Print the rules in force (the default).
    Get,
    /// Validate a rules file on the server and swap it in atomically.
    Apply {
        /// The rules file to send to the server.
        file: PathBuf,
        /// Validate only; change nothing.
        #[arg(long)]
        validate_only: bool,
    },
    /// Run a rules file in shadow beside the rules in force on real traffic
    /// (changing nothing), then print whom it would have denied.
    WhatIf {
        /// The rules file to run in shadow.
        file: PathBuf,
        /// How long to observe (1s to 24h).
        #[arg(long = "for", value_parser = super::parse_duration)]
        length: std::time::Duration,
        /// Start it and return; `floodgate rules what-if-report` prints it later.
        #[arg(long)]
        no_wait: bool,
    },
    /// Print the report of the last what-if (running or finished).
    WhatIfReport,
    /// List the rules files in force before the one in force now (the
    /// server keeps the last 10 until it stops).
    History,
    /// Put back the rules file in force before the last change (a second
    /// revert undoes the first), or the one of --to.
    Revert {
        /// The version to put back, as `floodgate rules history` lists it.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        to: Option<u64>,
    },
}

/// Runs `f` on a runtime of its own and gives back what it returns.
pub fn block_on_value<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(f)
}

pub fn block_on(f: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    match runtime.block_on(f) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("floodgate: {}", crate::errors::chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// The `--usage` pairs as a map; a field given twice is refused, as the
/// JSON API refuses a key given twice.
pub(crate) fn usage_map(pairs: Vec<(String, u64)>) -> anyhow::Result<std::collections::HashMap<String, u64>> {
    let mut map = std::collections::HashMap::new();
    for (k, v) in pairs {
        if map.insert(k.clone(), v).is_some() {
            anyhow::bail!("--usage: the field '{k}' is given twice");
        }
    }
    Ok(map)
}

/// `input_tokens=812`: a usage field and its value.
pub(crate) fn parse_usage(s: &str) -> Result<(String, u64), String> {
    let (k, v) = parse_pair(s)?;
    let v = v.parse().map_err(|_| format!("'{s}': the value of a usage field is a whole number (field=number)"))?;
    Ok((k, v))
}

pub(crate) fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) => Ok((k.to_string(), v.to_string())),
        None => Err(format!("'{s}' is not key=value")),
    }
}

pub async fn acquire(args: AcquireArgs) -> anyhow::Result<ExitCode> {
    let usage = usage_map(args.usage)?;
    let mut client = pb::floodgate_client::FloodgateClient::new(args.server.connect().await?);
    let request = pb::AcquireRequest {
        resource: args.resource.clone(),
        descriptors: args.descriptors.into_iter().collect(),
        cost: args.cost,
        dry_run: args.dry_run,
        settle: args.settle,
        priority: args.priority.map_or(0, |p| p as i32),
        usage,
    };
    let mut code = ExitCode::SUCCESS;
    for _ in 0..args.count.max(1) {
        let response = client.acquire(request.clone()).await.map_err(status_error)?.into_inner();
        out!("{}", render(&args.resource, &response));
        code = if response.verdict == pb::Verdict::Allowed as i32 { ExitCode::SUCCESS } else { ExitCode::from(DENIED) };
    }
    Ok(code)
}

pub async fn rules(args: RulesArgs) -> anyhow::Result<ExitCode> {
    let mut client = pb::admin_client::AdminClient::new(args.server.connect().await?);
    match args.action.unwrap_or(RulesAction::Get) {
        RulesAction::Get => {
            let r = client.get_rules(pb::GetRulesRequest {}).await.map_err(status_error)?.into_inner();
            outln!("# version {} from {}", r.version, r.source);
            out!("{}", r.yaml);
            if let Some(e) = r.envoy {
                // A control plane chooses the version and the domains: shown
                // escaped, so they cannot write to the terminal.
                let version = if e.version.is_empty() {
                    String::new()
                } else {
                    format!(" version {}", crate::xds::shown(&e.version))
                };
                let domains: Vec<String> = e.domains.iter().map(|d| d.escape_debug().to_string()).collect();
                outln!(
                    "# envoyproxy/ratelimit configuration from {}{version}: domains {}",
                    e.source.escape_debug(),
                    domains.join(", ")
                );
            }
            if let Some(s) = r.sentinel {
                let resources: Vec<String> = s.resources.iter().map(|r| r.escape_debug().to_string()).collect();
                outln!("# Sentinel's rules from {}: resources {}", s.source.escape_debug(), resources.join(", "));
                for why in &s.ignored {
                    outln!("#   not enforced: {}", why.escape_debug());
                }
                for name in &s.left_out {
                    outln!("#   {} is decided by the rules file's rule", name.escape_debug());
                }
            }
        }
        RulesAction::Apply { file, validate_only } => {
            let yaml = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let r = client
                .apply_rules(pb::ApplyRulesRequest { yaml, validate_only, what_if: None })
                .await
                .map_err(status_error)?
                .into_inner();
            let what = if r.applied { "applied" } else { "valid, not applied" };
            outln!("{}: {what}; version {} ({} resources)", file.display(), r.version, r.resources.len());
        }
        RulesAction::WhatIf { file, length, no_wait } => {
            let yaml = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let what_if = prost_types::Duration::try_from(length).ok();
            let request = pb::ApplyRulesRequest { yaml, validate_only: false, what_if };
            client.apply_rules(request).await.map_err(status_error)?;
            eprintln!("{}: observing in shadow for {}", file.display(), crate::rules::duration::format(length));
            if no_wait {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::time::sleep(length).await;
            // The server's clock decides when it ends: wait for it to say so.
            loop {
                let r = client.get_what_if(pb::GetWhatIfRequest {}).await.map_err(status_error)?.into_inner();
                if !r.running {
                    out!("{}", render_what_if(&r));
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        RulesAction::WhatIfReport => {
            let r = client.get_what_if(pb::GetWhatIfRequest {}).await.map_err(status_error)?.into_inner();
            out!("{}", render_what_if(&r));
        }
        RulesAction::History => {
            let r = client.get_rules(pb::GetRulesRequest {}).await.map_err(status_error)?.into_inner();
            let in_force = r.loaded_at.as_ref().map_or_else(|| "-".into(), super::ago_or_in_ts);
            outln!("version {} in force, from {}, installed {in_force}", r.version, r.source.escape_debug());
            if r.earlier.is_empty() {
                outln!("no earlier rules are kept");
            }
            for e in &r.earlier {
                let replaced = e.replaced_at.as_ref().map_or_else(|| "-".into(), super::ago_or_in_ts);
                let resources: Vec<String> = e.resources.iter().map(|r| r.escape_debug().to_string()).collect();
                let more = if e.resource_count as usize > e.resources.len() { ", ..." } else { "" };
                outln!(
                    "version {} from {}, replaced {replaced}: {} resources ({}{more})",
                    e.version,
                    e.source.escape_debug(),
                    e.resource_count,
                    resources.join(", ")
                );
            }
        }
        RulesAction::Revert { to } => {
            let request = pb::RevertRulesRequest { to_version: to.unwrap_or(0) };
            let r = client.revert_rules(request).await.map_err(status_error)?.into_inner();
            outln!(
                "reverted to the rules of version {}; version {} in force ({} resources)",
                r.reverted_to,
                r.version,
                r.resources.len()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How many terminal columns `s` takes: a CJK character or an emoji takes
/// two, so counting characters would misalign a table of such names.
fn columns(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// `s` padded with spaces to `width` terminal columns.
fn cell(s: &str, width: usize) -> String {
    format!("{s}{}", " ".repeat(width.saturating_sub(columns(s))))
}

/// A what-if report, readably.
fn render_what_if(r: &pb::GetWhatIfResponse) -> String {
    use std::fmt::Write;
    let state = if r.running { "running" } else { "finished" };
    let mut out = format!("what-if {state}: {} calls seen, {} matched no candidate rule\n", r.calls, r.unmatched);
    // As wide as the longest rule and limit names, at least the usual width.
    let rule_w = r.limits.iter().map(|l| columns(&l.rule)).max().unwrap_or(0).max(24);
    let limit_w = r.limits.iter().map(|l| columns(&l.limit)).max().unwrap_or(0).max(16);
    let _ = writeln!(
        out,
        "{} {} {:>10} {:>11} {:>13}",
        cell("rule", rule_w),
        cell("limit", limit_w),
        "evaluated",
        "would deny",
        "newly denied"
    );
    for l in &r.limits {
        let _ = writeln!(
            out,
            "{} {} {:>10} {:>11} {:>13}",
            cell(&l.rule, rule_w),
            cell(&l.limit, limit_w),
            l.evaluated,
            l.would_deny,
            l.newly_denied
        );
        for h in &l.top {
            let key = if h.key.is_empty() { "(all)" } else { h.key.as_str() };
            let error = if h.error > 0 { format!(" (+-{})", h.error) } else { String::new() };
            let _ = writeln!(out, "    {key}: {}{error}", h.count);
        }
    }
    out
}

pub fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

/// A decision, readably.
pub(crate) fn render(resource: &str, r: &pb::AcquireResponse) -> String {
    use std::fmt::Write;
    let verdict =
        pb::Verdict::try_from(r.verdict).map_or("UNKNOWN", |v| v.as_str_name().trim_start_matches("VERDICT_"));
    let mut out = format!("{verdict:<13} {resource}");
    let retry = r.retry_after.as_ref().map(human).unwrap_or_default();
    if !retry.is_empty() {
        let _ = write!(out, "  retry after {retry}");
    }
    if let Some(wait) = r.wait.as_ref().map(human).filter(|w| !w.is_empty()) {
        let _ = write!(out, "  wait {wait}");
    }
    out.push('\n');
    if !r.reason.is_empty() {
        let _ = writeln!(out, "  reason: {}", r.reason);
    }
    if !r.paid_by.is_empty() {
        let _ = writeln!(out, "  paid by: {} (the rule's waterfall)", r.paid_by);
    }
    if !r.permit_id.is_empty() {
        let _ = writeln!(out, "  permit: {}", r.permit_id);
    }
    if r.breaker_state != 0 {
        let state = state_name(r.breaker_state);
        let _ = writeln!(out, "  breaker: {state}");
    }
    if r.degradation_level > 0 {
        let _ = writeln!(out, "  degradation level: {}", r.degradation_level);
    }
    // The columns are as wide as the longest name and window, so that a long
    // limit name does not push its line out of line with the others.
    let name_width = r.limits.iter().map(|l| columns(&l.name)).max().unwrap_or(0).max(16);
    let windows: Vec<String> = r.limits.iter().map(|l| l.window.as_ref().map(human).unwrap_or_default()).collect();
    let window_width = windows.iter().map(|w| w.len()).max().unwrap_or(0).max(6);
    for (l, window) in r.limits.iter().zip(&windows) {
        // A limit with no window (a balance) leaves the column blank.
        let per = if window.is_empty() { String::new() } else { format!("per {window}") };
        let _ = write!(
            out,
            "  {} remaining {:>6}/{:<6} {per:<per_width$}",
            cell(&l.name, name_width),
            l.remaining,
            l.limit,
            per_width = window_width + 4
        );
        if let Some(reset) = l.reset_after.as_ref().map(human).filter(|s| !s.is_empty()) {
            let _ = write!(out, "  reset {reset}");
        }
        if l.admitted_over_limit {
            out.push_str("  EXCEEDED, admitted over the limit (over_limit)");
        } else if l.exceeded {
            let _ = write!(out, "  EXCEEDED, retry {}", l.retry_after.as_ref().map(human).unwrap_or_default());
        }
        out.push('\n');
    }
    out
}

/// A proto duration for people; empty for zero.
fn human(d: &prost_types::Duration) -> String {
    match std::time::Duration::try_from(*d).ok() {
        Some(d) if !d.is_zero() => crate::rules::duration::human(d),
        _ => String::new(),
    }
}

/// A breaker state as people read it: `OPEN`, not `BREAKER_STATE_OPEN`.
pub(crate) fn state_name(n: i32) -> &'static str {
    pb::BreakerState::try_from(n).map_or("UNKNOWN", |s| s.as_str_name().trim_start_matches("BREAKER_STATE_"))
}

#[cfg(test)]
mod tests {
    use super::{cell, columns};

    #[test]
    fn wide_characters_take_two_columns_and_cells_line_up() {
        assert_eq!(columns("orders"), 6);
        assert_eq!(columns("注文"), 4);
        assert_eq!(cell("注文", 6), "注文  ");
        assert_eq!(columns(&cell("注文", 6)), columns(&cell("orders", 6)));
        assert_eq!(cell("longer than the cell", 4), "longer than the cell");
    }
}
