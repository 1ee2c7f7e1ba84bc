//! `floodgate top`: who is being limited right now.

use std::process::ExitCode;

use clap::Args;
use floodgate_proto::v1 as pb;

use super::client::{Server, status_error};

#[derive(Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    server: Server,
    /// Only this rule's limits (its name or pattern as written).
    #[arg(long, default_value = "")]
    rule: String,
    /// Keys per limit and outcome (at least 1).
    #[arg(short = 'n', long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,
}

pub async fn top(args: TopArgs) -> anyhow::Result<ExitCode> {
    let mut admin = pb::admin_client::AdminClient::new(args.server.connect().await?);
    let req = pb::GetTopKeysRequest { rule: args.rule, count: args.count };
    let top = admin.get_top_keys(req).await.map_err(status_error)?.into_inner();
    let minutes = top.window.map_or(0, |w| w.seconds / 60);
    if top.limits.is_empty() {
        // Admissions are sampled (one in ADMITTED_SAMPLE, weighted), so a
        // few admitted calls may leave no trace; every denial is counted.
        outln!(
            "(no keyed decision seen in the last {minutes} minutes: every denial is counted, admissions one in {})",
            floodgate_core::hitters::ADMITTED_SAMPLE
        );
    }
    for l in &top.limits {
        outln!("{} / {}  (last {minutes} min)", l.rule, l.limit);
        for (what, keys) in [("denied", &l.denied), ("admitted", &l.admitted)] {
            for k in keys {
                let error = if k.error > 0 { format!(" (+/-{})", k.error) } else { String::new() };
                outln!("  {what:<8} {:>10}{error}  {}", k.count, k.key);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
