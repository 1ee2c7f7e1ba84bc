//! `floodgate overrides`: set, list and delete overrides at run time.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use floodgate_proto::v1 as pb;
use pb::r#override::Action;

use super::client::{Server, status_error};

#[derive(Args, Debug)]
pub struct OverridesArgs {
    #[command(flatten)]
    server: Server,
    #[command(subcommand)]
    command: Option<OverridesCommand>,
}

#[derive(Subcommand, Debug)]
enum OverridesCommand {
    /// List them (the default): id, rule, values, action, expiry, whether it applies.
    List {
        /// Only this rule's.
        #[arg(long, default_value = "")]
        rule: String,
    },
    /// Set one (an existing id is replaced).
    Set(SetArgs),
    /// Delete some by id.
    Delete {
        /// The ids of the overrides to delete (`floodgate overrides` lists them).
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["factor", "limit", "tier", "block"])))]
struct SetArgs {
    /// The rule it applies to, as named in the rules file.
    rule: String,
    /// A descriptor value it applies to, KEY=VALUE; repeat for several (all must match).
    #[arg(long = "when", required = true, value_parser = pair)]
    when: Vec<(String, String)>,
    /// Every limit of the rule times this.
    #[arg(long)]
    factor: Option<f64>,
    /// A limit at an absolute number, NAME=N; repeat for several.
    #[arg(long = "limit", value_parser = limit_pair)]
    limit: Vec<(String, u64)>,
    /// A tier of the rules file instead of the rule's limits.
    #[arg(long)]
    tier: Option<String>,
    /// Deny matching calls.
    #[arg(long)]
    block: bool,
    /// With --block: the retry_after denied callers get.
    #[arg(long, requires = "block", value_parser = super::parse_duration)]
    retry_after: Option<Duration>,
    /// How long it lasts (default: until deleted).
    #[arg(long = "for", value_parser = super::parse_duration)]
    ttl: Option<Duration>,
    /// Its id (default: one the server makes up).
    #[arg(long, default_value = "")]
    id: String,
    /// Why, for the operators who find it later.
    #[arg(long, default_value = "")]
    reason: String,
}

fn pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("'{s}' is not KEY=VALUE"))
}

fn limit_pair(s: &str) -> Result<(String, u64), String> {
    let (k, v) = pair(s)?;
    let n = v.parse().map_err(|_| format!("'{v}' is not a whole number"))?;
    Ok((k, n))
}

fn wire(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

pub async fn overrides(args: OverridesArgs) -> anyhow::Result<ExitCode> {
    let mut admin = pb::admin_client::AdminClient::new(args.server.connect().await?);
    match args.command.unwrap_or(OverridesCommand::List { rule: String::new() }) {
        OverridesCommand::List { rule } => list(&mut admin, rule).await?,
        OverridesCommand::Set(a) => set(&mut admin, a).await?,
        OverridesCommand::Delete { ids } => {
            let req = pb::DeleteOverridesRequest { ids: ids.clone() };
            let done = admin.delete_overrides(req).await.map_err(status_error)?.into_inner();
            for id in &ids {
                let what = if done.deleted.contains(id) { "deleted" } else { "not found" };
                outln!("{id}: {what}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

type Admin = pb::admin_client::AdminClient<crate::connect::Authed>;

/// Every page of the list, as a table.
async fn list(admin: &mut Admin, rule: String) -> anyhow::Result<()> {
    let mut after = String::new();
    let mut shown = 0;
    loop {
        let req = pb::ListOverridesRequest { rule: rule.clone(), after, limit: 0 };
        let page = admin.list_overrides(req).await.map_err(status_error)?.into_inner();
        if shown == 0 {
            outln!("{:<24} {:<16} {:<28} {:<22} {:<20} APPLIES", "ID", "RULE", "WHEN", "ACTION", "EXPIRES");
        }
        for o in &page.overrides {
            outln!(
                "{:<24} {:<16} {:<28} {:<22} {:<20} {}",
                o.id,
                o.rule,
                when_text(o),
                action_text(o),
                o.expires_at.as_ref().map(super::ago_or_in_ts).unwrap_or_else(|| "never".into()),
                if o.active { "yes".to_string() } else { format!("no: {}", o.problem) }
            );
        }
        shown += page.overrides.len();
        if page.next_after.is_empty() {
            if shown == 0 {
                outln!("(no overrides set at run time)");
            }
            return Ok(());
        }
        after = page.next_after;
    }
}

async fn set(admin: &mut Admin, a: SetArgs) -> anyhow::Result<()> {
    let action = match (a.factor, a.limit.is_empty(), a.tier, a.block) {
        (Some(f), _, _, _) => Action::Factor(f),
        (_, false, _, _) => Action::Limits(pb::LimitValues { values: a.limit.into_iter().collect() }),
        (_, _, Some(t), _) => Action::Tier(t),
        _ => Action::Block(pb::Block { retry_after: a.retry_after.map(wire) }),
    };
    let o = pb::Override {
        id: a.id,
        rule: a.rule,
        when: a.when.into_iter().collect(),
        action: Some(action),
        ttl: a.ttl.map(wire),
        reason: a.reason,
        ..Default::default()
    };
    let req = pb::SetOverridesRequest { overrides: vec![o] };
    let set = admin.set_overrides(req).await.map_err(status_error)?.into_inner();
    for o in &set.overrides {
        outln!("set {} (rules v{})", o.id, set.rules_version);
    }
    if !set.persisted {
        outln!("note: this server keeps overrides in memory only; a restart loses them (--overrides-file)");
    }
    Ok(())
}

fn when_text(o: &pb::Override) -> String {
    floodgate_engine::request::sorted_pairs_text(&o.when)
}

fn action_text(o: &pb::Override) -> String {
    match &o.action {
        Some(Action::Block(b)) => match &b.retry_after {
            Some(d) => format!("block (retry {}s)", d.seconds),
            None => "block".into(),
        },
        Some(Action::Factor(f)) => format!("factor {f}"),
        Some(Action::Limits(l)) => {
            let mut v: Vec<String> = l.values.iter().map(|(k, n)| format!("{k}={n}")).collect();
            v.sort();
            format!("limits {}", v.join(","))
        }
        Some(Action::Tier(t)) => format!("tier {t}"),
        None => "-".into(),
    }
}
