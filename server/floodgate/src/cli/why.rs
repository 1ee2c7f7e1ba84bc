//! `floodgate why`: why calls were answered as they were, from the server's
//! decision log; and `--share` to turn that log on or off.

use std::process::ExitCode;

use clap::Args;
use floodgate_proto::v1 as pb;

use super::client::{Server, parse_pair, render, status_error};

#[derive(Args, Debug)]
pub struct WhyArgs {
    #[command(flatten)]
    server: Server,
    /// Only decisions on this resource.
    #[arg(long, default_value = "")]
    resource: String,
    /// Only decisions with this descriptor, as key=value; repeat for more.
    #[arg(short = 'd', long = "descriptor", value_parser = parse_pair)]
    descriptors: Vec<(String, String)>,
    /// Only denied decisions.
    #[arg(long)]
    denied: bool,
    /// At most this many, newest first (1 to 10000).
    #[arg(short = 'n', long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    count: u32,
    /// Set the share of decisions the server keeps (0 to 1; 0 turns the log
    /// off) instead of reading them. Needs the admin role.
    #[arg(long)]
    share: Option<f64>,
}

pub async fn why(args: WhyArgs) -> anyhow::Result<ExitCode> {
    let mut admin = pb::admin_client::AdminClient::new(args.server.connect().await?);
    if let Some(share) = args.share {
        let set = admin.set_decision_log(pb::SetDecisionLogRequest { share }).await.map_err(status_error)?;
        let set = set.into_inner();
        outln!("decision log: keeps {} of decisions (was {})", percent(set.share), percent(set.share_before));
        return Ok(ExitCode::SUCCESS);
    }
    let req = pb::GetDecisionsRequest {
        resource: args.resource,
        descriptors: args.descriptors.into_iter().collect(),
        denied_only: args.denied,
        count: args.count,
    };
    let log = admin.get_decisions(req).await.map_err(status_error)?.into_inner();
    if log.decisions.is_empty() {
        let state = if log.share > 0.0 {
            format!("it keeps {} of decisions", percent(log.share))
        } else {
            "it is off: turn it on with `floodgate why --share 0.01` or `floodgate serve --decision-log 0.01`"
                .to_string()
        };
        outln!("(no decision in the log matches; {state})");
    }
    for d in &log.decisions {
        out!("{}", render_logged(d));
    }
    if log.more {
        outln!("(more decisions matched than one answer holds: narrow the filter or lower -n)");
    }
    Ok(ExitCode::SUCCESS)
}

fn percent(share: f64) -> String {
    format!("{}%", (share * 10_000.0).round() / 100.0)
}

/// One logged decision: when, the request, what matched and what decided,
/// then the answer as `floodgate acquire` shows it.
fn render_logged(d: &pb::LoggedDecision) -> String {
    use std::fmt::Write;
    let at = d.at.as_ref().map(ToString::to_string).unwrap_or_default();
    let descriptors = floodgate_engine::request::sorted_pairs_text(&d.descriptors);
    let mut out = format!("{at}  {descriptors}");
    let _ = write!(out, "  cost {}", d.cost);
    if !d.usage.is_empty() {
        let mut usage: Vec<String> = d.usage.iter().map(|(k, v)| format!("{k}={v}")).collect();
        usage.sort();
        let _ = write!(out, "  usage {}", usage.join(","));
    }
    if d.dry_run {
        out.push_str("  (dry run)");
    }
    out.push('\n');
    // With usage, what each limit was asked: its `cost` formula's figure,
    // or the request's cost.
    if !d.usage.is_empty() {
        let each: Vec<String> = d.limits.iter().zip(&d.limit_costs).map(|(l, c)| format!("{} {c}", l.name)).collect();
        let _ = writeln!(out, "  costs: {}", each.join(", "));
    }
    let rule = if d.rule.is_empty() { "(none matched)" } else { d.rule.as_str() };
    let _ = writeln!(out, "  rule: {rule}");
    if !d.decided_by.is_empty() {
        let _ = writeln!(out, "  decided by: {}", d.decided_by.join(", "));
    }
    let answer = pb::AcquireResponse {
        verdict: d.verdict,
        limits: d.limits.clone(),
        reason: d.reason.clone(),
        breaker_state: d.breaker_state,
        degradation_level: d.degradation_level,
        paid_by: d.paid_by.clone(),
        ..Default::default()
    };
    for line in render(&d.resource, &answer).lines() {
        let _ = writeln!(out, "  {line}");
    }
    out
}
