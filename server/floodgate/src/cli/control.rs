//! Client commands for breakers, outcomes, the degradation level and Watch.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use floodgate_proto::v1 as pb;

use super::client::{Server, state_name, status_error};

#[derive(Args, Debug)]
pub struct BreakersArgs {
    #[command(flatten)]
    server: Server,
    /// One resource's breaker, in detail; without it, a table of all.
    resource: Option<String>,
    /// Set the breaker's state: closed resets it.
    #[arg(long, value_enum, requires = "resource")]
    set: Option<SetState>,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum SetState {
    Closed,
    ForcedOpen,
    Disabled,
    MetricsOnly,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    #[command(flatten)]
    server: Server,
    /// The permit from an admitted acquire.
    permit_id: String,
    /// How the call went: `failure` counts against the breaker, `ignored`
    /// only frees the permit (a call its own caller cancelled).
    #[arg(long, value_enum)]
    outcome: OutcomeArg,
    /// How long the call took (default: the permit's age).
    #[arg(long, value_parser = super::parse_duration)]
    latency: Option<Duration>,
    /// What the call really cost, for a permit of `acquire --settle`.
    #[arg(long)]
    actual_cost: Option<u64>,
    /// The usage the call really had, as field=number (output_tokens=950);
    /// repeat for more. Limits with a `cost` formula settle at what it gives.
    #[arg(long = "usage", value_parser = super::client::parse_usage)]
    usage: Vec<(String, u64)>,
    /// The resource the permit was issued for (optional).
    #[arg(long, default_value = "")]
    resource: String,
}

#[derive(Args, Debug)]
pub struct BalanceArgs {
    #[command(flatten)]
    server: Server,
    /// The resource whose rule has the balance.
    resource: String,
    /// The balance: a limit (or waterfall source) with `algorithm: balance`.
    #[arg(long)]
    limit: String,
    /// A descriptor that selects the balance's key, as key=value; repeat for more.
    #[arg(short = 'd', long = "descriptor", value_parser = super::client::parse_pair)]
    descriptors: Vec<(String, String)>,
    /// Top the balance up by this many units (needs the admin role).
    #[arg(long, conflicts_with = "take", requires = "reason", value_parser = clap::value_parser!(i64).range(1..))]
    add: Option<i64>,
    /// Take this many units from the balance (a correction; admin role).
    #[arg(long, requires = "reason", value_parser = clap::value_parser!(i64).range(1..))]
    take: Option<i64>,
    /// Why, for the server's audit log (with --add or --take).
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum OutcomeArg {
    Success,
    Failure,
    Ignored,
}

#[derive(Args, Debug)]
pub struct LevelArgs {
    #[command(flatten)]
    server: Server,
    /// 0 to 3 to set it, "auto" to return to the automatic level; without
    /// it, show every scope's level and why.
    level: Option<String>,
    /// The system to set, as the rules name it; without it, the global scope.
    #[arg(long, conflicts_with = "every_system")]
    system: Option<String>,
    /// Set the global scope and every system at once.
    #[arg(long)]
    every_system: bool,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    server: Server,
    /// Only breaker events of these resources.
    resources: Vec<String>,
}

fn ago_or_in(t: &Option<prost_types::Timestamp>) -> String {
    match t {
        Some(t) => super::ago_or_in_ts(t),
        None => "-".into(),
    }
}

pub async fn breakers(args: BreakersArgs) -> anyhow::Result<ExitCode> {
    let mut admin = pb::admin_client::AdminClient::new(args.server.connect().await?);
    if let (Some(resource), Some(set)) = (&args.resource, args.set) {
        let state = match set {
            SetState::Closed => pb::BreakerState::Closed,
            SetState::ForcedOpen => pb::BreakerState::ForcedOpen,
            SetState::Disabled => pb::BreakerState::Disabled,
            SetState::MetricsOnly => pb::BreakerState::MetricsOnly,
        };
        let req = pb::SetBreakerStateRequest { resource: resource.clone(), state: state as i32 };
        admin.set_breaker_state(req).await.map_err(status_error)?;
    }
    let infos = match &args.resource {
        Some(resource) => {
            let req = pb::GetBreakerRequest { resource: resource.clone() };
            vec![admin.get_breaker(req).await.map_err(status_error)?.into_inner()]
        }
        None => admin.list_breakers(pb::ListBreakersRequest {}).await.map_err(status_error)?.into_inner().breakers,
    };
    outln!(
        "{:<28} {:<12} {:>6} {:>8} {:>7} {:>7} {:>8} {:>7}  NEXT PROBE",
        "RESOURCE",
        "STATE",
        "CALLS",
        "FAILURES",
        "FAIL%",
        "SLOW%",
        "REJECTED",
        "PROBES"
    );
    for b in &infos {
        outln!(
            "{:<28} {:<12} {:>6} {:>8} {:>6.1}% {:>6.1}% {:>8} {:>3}/{:<3}  {}",
            b.resource,
            state_name(b.state),
            b.calls,
            b.failures,
            b.failure_rate * 100.0,
            b.slow_call_rate * 100.0,
            b.not_permitted,
            b.probes_in_flight,
            b.probes_in_flight + b.probes_remaining,
            ago_or_in(&b.next_probe_at),
        );
    }
    if infos.is_empty() {
        outln!("(no breaker has been used yet)");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn report(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let usage = super::client::usage_map(args.usage)?;
    let mut client = pb::floodgate_client::FloodgateClient::new(args.server.connect().await?);
    let outcome = match args.outcome {
        OutcomeArg::Success => pb::Outcome::Success,
        OutcomeArg::Failure => pb::Outcome::Failure,
        OutcomeArg::Ignored => pb::Outcome::Ignored,
    };
    let req = pb::ReportOutcomeRequest {
        resource: args.resource,
        permit_id: args.permit_id,
        outcome: outcome as i32,
        latency: args.latency.and_then(|d| prost_types::Duration::try_from(d).ok()),
        actual_cost: args.actual_cost,
        usage,
    };
    let r = client.report_outcome(req).await.map_err(status_error)?.into_inner();
    let state = if r.breaker_state == 0 { String::new() } else { format!(", breaker {}", state_name(r.breaker_state)) };
    let settled = if r.settled { ", settled" } else { "" };
    outln!("{}{settled}{state}", if r.counted { "counted" } else { "not counted: the permit is unknown or expired" });
    Ok(if r.counted { ExitCode::SUCCESS } else { ExitCode::from(3) })
}

/// Shows a balance (as Peek reads it), or tops it up or takes from it.
pub async fn balance(args: BalanceArgs) -> anyhow::Result<ExitCode> {
    let mut admin = pb::admin_client::AdminClient::new(args.server.connect().await?);
    // A key given twice would change the balance of only one of the two
    // values, silently: money is not moved on a guess.
    let mut descriptors = std::collections::HashMap::new();
    for (k, v) in args.descriptors {
        if descriptors.insert(k.clone(), v).is_some() {
            anyhow::bail!("--descriptor: the key '{k}' is given twice");
        }
    }
    let amount = args.add.or(args.take.map(|n| -n));
    let Some(amount) = amount else {
        if args.reason.is_some() {
            anyhow::bail!("--reason goes with --add or --take: showing a balance changes nothing");
        }
        let req = pb::PeekRequest { resource: args.resource.clone(), descriptors, limit: args.limit.clone() };
        let peek = admin.peek(req).await.map_err(status_error)?.into_inner();
        let l = peek.limits.first().ok_or_else(|| anyhow::anyhow!("no limit '{}' matched", args.limit))?;
        if l.algorithm != "balance" {
            anyhow::bail!("limit '{}' of '{}' is a {}, not a balance", args.limit, args.resource, l.algorithm);
        }
        outln!("{} of {}: {} (at most {})", args.limit, args.resource, l.remaining, l.limit);
        return Ok(ExitCode::SUCCESS);
    };
    let req = pb::AdjustBalanceRequest {
        resource: args.resource.clone(),
        descriptors,
        limit: args.limit.clone(),
        amount,
        reason: args.reason.unwrap_or_default(),
    };
    let r = admin.adjust_balance(req).await.map_err(status_error)?.into_inner();
    let owes = if r.balance < 0 { " (owed)" } else { "" };
    outln!("{} of {}: {}{owes} (at most {})", args.limit, args.resource, r.balance, r.max_balance);
    Ok(ExitCode::SUCCESS)
}

pub async fn level(args: LevelArgs) -> anyhow::Result<ExitCode> {
    let mut admin = pb::admin_client::AdminClient::new(args.server.connect().await?);
    let system = args.system.clone().unwrap_or_default();
    let every_system = args.every_system;
    let req = match args.level.as_deref() {
        None => None,
        Some("auto") => Some(pb::SetDegradationLevelRequest { level: 0, automatic: true, system, every_system }),
        Some(n) => Some(pb::SetDegradationLevelRequest {
            level: n.parse().map_err(|_| anyhow::anyhow!("'{n}' is not a level: use 0 to 3 or auto"))?,
            automatic: false,
            system,
            every_system,
        }),
    };
    match req {
        Some(req) => {
            let r = admin.set_degradation_level(req).await.map_err(status_error)?.into_inner();
            if r.systems.is_empty() {
                let how = if r.manual { "manual" } else { "automatic" };
                outln!(
                    "{}: degradation level {} ({how}; automatic level {})",
                    scope_name(&r.system),
                    r.level,
                    r.automatic_level
                );
            }
            for s in &r.systems {
                outln!("{}", level_line(s));
            }
        }
        None => {
            let mut client = pb::floodgate_client::FloodgateClient::new(args.server.connect().await?);
            let mut stream = client.watch(pb::WatchRequest::default()).await.map_err(status_error)?.into_inner();
            if let Some(pb::WatchEvent { event: Some(pb::watch_event::Event::Snapshot(s)), .. }) =
                stream.message().await?
            {
                let how = if s.degradation_override { "manual" } else { "automatic" };
                outln!("global: degradation level {} ({how})", s.degradation_level);
                for system in &s.systems {
                    outln!("{}", level_line(system));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn scope_name(system: &str) -> &str {
    if system.is_empty() { "global" } else { system }
}

/// `payments: degradation level 2 (automatic): cpu reached 0.75 (level 2); ...`
fn level_line(s: &pb::SystemLevel) -> String {
    let how = if s.manual { format!("manual; automatic level {}", s.automatic_level) } else { "automatic".into() };
    let why = if s.reason.is_empty() { String::new() } else { format!(": {}", s.reason) };
    format!("{}: degradation level {} ({how}){why}", scope_name(&s.system), s.level)
}

pub async fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    use pb::watch_event::Event;
    let mut client = pb::floodgate_client::FloodgateClient::new(args.server.connect().await?);
    let req = pb::WatchRequest { resources: args.resources };
    let mut stream = client.watch(req).await.map_err(status_error)?.into_inner();
    while let Some(e) = stream.message().await.map_err(status_error)? {
        let line = match e.event {
            Some(Event::Snapshot(s)) => {
                let breakers: Vec<_> =
                    s.breakers.iter().map(|b| format!("{}={}", b.resource, state_name(b.state))).collect();
                format!(
                    "snapshot{}: level {}, rules v{}, breakers [{}]",
                    if s.resync { " (resync)" } else { "" },
                    s.degradation_level,
                    s.rules_version,
                    breakers.join(", ")
                )
            }
            Some(Event::Breaker(t)) => format!(
                "breaker {}: {} -> {} ({}){}",
                t.resource,
                state_name(t.from_state),
                state_name(t.to_state),
                t.reason,
                t.next_probe_at
                    .as_ref()
                    .map(|_| format!(", next probe {}", ago_or_in(&t.next_probe_at)))
                    .unwrap_or_default()
            ),
            Some(Event::Degradation(d)) => {
                format!(
                    "degradation level of {} {} -> {}{}{}",
                    scope_name(&d.system),
                    d.from_level,
                    d.to_level,
                    if d.manual { " (manual)" } else { "" },
                    if d.reason.is_empty() { String::new() } else { format!(": {}", d.reason) }
                )
            }
            Some(Event::Rules(r)) => format!("rules v{} from {}", r.version, r.source),
            Some(Event::Overrides(o)) => format!(
                "overrides (rules v{}): set [{}], deleted [{}], expired [{}]",
                o.rules_version,
                o.set.join(", "),
                o.deleted.join(", "),
                o.expired.join(", ")
            ),
            None => continue,
        };
        outln!("#{} {line}", e.sequence);
    }
    Ok(ExitCode::SUCCESS)
}
