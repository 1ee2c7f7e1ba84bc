//! `floodgate recommend --trace FILE`: a limit for a key's calls a minute,
//! proposed from recorded traffic and replayed against it.

use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use floodgate_core::recommend::{self, DAY, History, Proposal, Settings, Shape};

use crate::rules::proposed::{pairs, shown};

#[derive(Args, Debug)]
pub struct RecommendArgs {
    /// The recorded calls: lines of `unix_seconds,key,calls` (for example
    /// `1767571200,tenant=acme,42`), `-` for standard input.
    #[arg(long, required_unless_present = "recorded", conflicts_with = "recorded")]
    trace: Option<PathBuf>,
    /// Read the traffic a server recorded for --limit (a limit with
    /// `history: true`) and the rules it has, instead of --trace and --rules.
    #[arg(long, requires = "limit", conflicts_with = "rules")]
    recorded: bool,
    #[command(flatten)]
    server: super::client::Server,
    /// Which quantile of the keys' typical peaks sets the limit (0 to 1).
    #[arg(long, default_value_t = 0.99)]
    quantile: f64,
    /// The factor above what was observed (1 to 1000).
    #[arg(long, default_value_t = 1.5)]
    headroom: f64,
    /// Read only the last DAYS days of the trace: DAYS x 24 hours up to
    /// its last minute (all of it when not given).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=366))]
    days: Option<u64>,
    /// The limit in force now, in calls a minute: the proposal goes down
    /// from it by at most --max-decrease. With --limit, the limit's own.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000), conflicts_with = "limit")]
    current: Option<u64>,
    /// How far a limit may go down from the one in force, as a fraction (0 to
    /// below 1).
    #[arg(long, default_value_t = 0.2)]
    max_decrease: f64,
    /// The limiter the proposal is replayed with. With --limit, the limit's
    /// own.
    #[arg(long, conflicts_with = "limit", value_enum, default_value_t = ShapeArg::TokenBucket)]
    algorithm: ShapeArg,
    /// Keys listed in the replay, most denied first.
    #[arg(short = 'n', long, default_value_t = 10)]
    top: usize,
    /// The most (key, minute) pairs read; a larger trace is refused.
    #[arg(long, default_value_t = 20_000_000)]
    max_entries: usize,
    /// A rules file holding the limit to propose for (`floodgate rules get >
    /// FILE` saves the rules a server has).
    #[arg(long, requires = "limit")]
    rules: Option<PathBuf>,
    /// The limit in --rules (or the server's rules, with --recorded) to
    /// propose for, as RESOURCE/LIMIT: its numbers are --current and its
    /// algorithm is --algorithm. A limit marked `fixed: true` is refused.
    #[arg(long)]
    limit: Option<String>,
    /// Write --rules with the proposal in it to this file, to try with
    /// `floodgate rules what-if`, then apply.
    #[arg(long, requires = "limit")]
    write: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum ShapeArg {
    TokenBucket,
    FixedWindow,
}

pub fn run(args: RecommendArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings { quantile: args.quantile, headroom: args.headroom, max_decrease: args.max_decrease };
    if let Err(e) = settings.validate() {
        eprintln!("floodgate: {e}");
        return Ok(ExitCode::from(2));
    }
    if args.limit.is_some() && args.rules.is_none() && !args.recorded {
        eprintln!("floodgate: --limit needs --rules FILE (or --recorded, for the server's rules)");
        return Ok(ExitCode::from(2));
    }
    let read = match &args.trace {
        Some(trace) => read_trace(trace, args.max_entries).map(|h| (h, None)),
        None => super::client::block_on_value(recorded(
            &args.server,
            args.limit.as_deref().unwrap_or_default(),
            args.max_entries,
        )),
    };
    let (history, fetched) = read?;
    let rules_text = match (&args.rules, fetched) {
        (Some(file), _) => Some(crate::server::load_rules(file).map_err(|e| anyhow::anyhow!("{e}"))?),
        (None, Some(fetched)) => Some(fetched),
        (None, None) => None,
    };
    let target = match (rules_text, &args.limit) {
        (Some((rules, text)), Some(name)) => match crate::rules::proposed::find(&rules, name) {
            Ok(target) => Some((target, text)),
            Err(why) => {
                eprintln!("floodgate: {why}");
                return Ok(ExitCode::from(2));
            }
        },
        _ => None,
    };
    let Some((first, last)) = history.span() else {
        match &args.trace {
            Some(trace) => anyhow::bail!("{} holds no calls", trace.display()),
            None => anyhow::bail!("the server has recorded no calls of {} yet", args.limit.unwrap_or_default()),
        }
    };
    // A recorded day is kept as its first minute: the period runs to the
    // end of the last day.
    let to = if args.recorded { last + DAY } else { last + 1 };
    let from = match args.days {
        Some(days) => to.saturating_sub(days * DAY).max(first),
        None => first,
    };
    let current = args.current.or(target.as_ref().map(|(t, _)| t.per_minute));
    let current = current.map(|n| Proposal { per_minute: n, observed: n, overrides: Default::default(), keys: 0 });
    let proposal = recommend::propose(&history, from, to, &settings, current.as_ref());
    let shape = match (&target, args.algorithm) {
        (Some((t, _)), _) => t.shape,
        (None, ShapeArg::TokenBucket) => Shape::TokenBucket,
        (None, ShapeArg::FixedWindow) => Shape::FixedWindow,
    };
    if let Some((t, _)) = &target
        && let Err(why) = crate::rules::proposed::check_keys(history.key_names(), t)
    {
        eprintln!("floodgate: the traffic does not fit '{}/{}': {why}", t.resource, t.limit);
        return Ok(ExitCode::from(2));
    }
    let mut kept = Vec::new();
    if let (Some((t, text)), Some(out)) = (&target, &args.write) {
        let written = match crate::rules::proposed::write(text, t, &proposal) {
            Ok(written) => written,
            Err(why) => {
                eprintln!("floodgate: cannot write the proposal into the rules: {why}");
                return Ok(ExitCode::from(2));
            }
        };
        if let Some(rules) = &args.rules
            && same_file(rules, out)
        {
            eprintln!(
                "floodgate: --write {} is the --rules file: write the proposal to another file, try it, then apply it",
                out.display()
            );
            return Ok(ExitCode::from(2));
        }
        write_whole(out, &written.text).with_context(|| format!("writing {}", out.display()))?;
        kept = written.kept;
    }
    let replayed = recommend::replay(&history, from, to, &proposal, shape);
    let calls: u64 = replayed.iter().map(|r| r.calls).sum();
    let denied: u64 = replayed.iter().map(|r| r.denied).sum();
    let period = (minute_text(from), minute_text(to));
    if args.json {
        let keys: Vec<_> = replayed
            .iter()
            .take(args.top)
            .map(|r| serde_json::json!({"key": r.key, "limit": r.limit, "calls": r.calls, "denied": r.denied}))
            .collect();
        let out = serde_json::json!({
            "from": period.0, "to": period.1, "keys": proposal.keys,
            "quantile": settings.quantile, "headroom": settings.headroom,
            "per_minute": proposal.per_minute, "observed": proposal.observed,
            "overrides": proposal.overrides,
            "replay": {"algorithm": shape_name(shape), "calls": calls, "denied": denied, "keys": keys},
        });
        let mut out = out;
        if let Some((t, _)) = &target {
            out["limit"] = format!("{}/{}", t.resource, t.limit).into();
            out["current"] = t.per_minute.into();
            out["written"] = args.write.as_ref().map(|w| w.display().to_string()).into();
        }
        outln!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    outln!("Traffic: {} keys from {} to {}", proposal.keys, period.0, period.1);
    outln!(
        "Proposed limit: {} calls a minute ({} quantile of the keys' typical peaks, times {})",
        proposal.per_minute,
        settings.quantile,
        settings.headroom
    );
    if let (true, Some(current)) = (proposal.per_minute != proposal.observed, &current) {
        outln!(
            "  (observed figure {}; the limit goes down by at most {}% from the one in force, {})",
            proposal.observed,
            settings.max_decrease * 100.0,
            current.per_minute
        );
    }
    if !proposal.overrides.is_empty() {
        outln!("Overrides for {} heavier keys:", proposal.overrides.len());
        for (key, limit) in &proposal.overrides {
            outln!("  {limit:>10}  {}", shown(key));
        }
    }
    match (&target, &args.write) {
        (Some((t, _)), _) => {
            outln!(
                "Change to {}/{}: {} -> {} calls a minute",
                shown(&t.resource),
                shown(&t.limit),
                t.per_minute,
                proposal.per_minute
            );
            if let Some(capacity) = t.capacity.filter(|&c| c != proposal.per_minute) {
                outln!("  (its capacity, the burst it allows, goes from {capacity} to {})", proposal.per_minute);
            }
            for key in &kept {
                outln!("  {} keeps the override the rules file has for it", shown(key));
            }
        }
        (None, _) => match rules_snippet(&history, &proposal, shape) {
            Ok(snippet) => outln!("As rules (the limit's name and key are yours to set):\n{snippet}"),
            Err(why) => outln!("(No rules printed: {why}.)"),
        },
    }
    let share = if calls == 0 { 0.0 } else { denied as f64 * 100.0 / calls as f64 };
    if args.recorded {
        // The server keeps each key's busiest minute of each day: the
        // replay decides those minutes.
        outln!(
            "Replay ({}) of each key's busiest minute of each day: {denied} of {calls} calls would have been denied ({share:.3}%)",
            shape_name(shape)
        );
    } else {
        outln!(
            "Replay ({}): {denied} of {calls} recorded calls would have been denied ({share:.3}%)",
            shape_name(shape)
        );
    }
    for r in replayed.iter().take(args.top).filter(|r| r.denied > 0) {
        outln!("  {:>10} of {:>10} denied  (limit {})  {}", r.denied, r.calls, r.limit, shown(&r.key));
    }
    if let Some(out) = &args.write {
        let out = shown(&out.display().to_string()).into_owned();
        outln!("Wrote {out} with the proposal in it. Try it on live traffic, changing nothing:");
        outln!("  floodgate rules what-if {out} --for 1h");
        outln!("then apply it, and if it goes wrong put the old rules back:");
        outln!("  floodgate rules apply {out}");
        outln!("  floodgate rules revert");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `a` and `b` name the same file (`b` may not exist yet).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Writes `text` to `path` whole or not at all: into a file beside it,
/// then renamed over it, so that a full disk or a crash never leaves half
/// a rules file (which a server watching it would refuse, or worse).
fn write_whole(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    // Renaming over a device or a FIFO would replace it: only a regular
    // file (or none yet) is written.
    if let Ok(meta) = std::fs::metadata(path)
        && !meta.is_file()
    {
        return Err(std::io::Error::other("is not a regular file"));
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::other("not a file name"))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Reads a trace file (`-`: standard input).
fn read_trace(trace: &std::path::Path, max_entries: usize) -> anyhow::Result<History> {
    let mut history = History::new(max_entries);
    let read = if trace.as_os_str() == "-" {
        history.read(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(trace).with_context(|| format!("opening {}", trace.display()))?;
        history.read(BufReader::new(file))
    };
    read.with_context(|| format!("reading {}", trace.display()))?;
    Ok(history)
}

/// The traffic a server recorded for `name` (RESOURCE/LIMIT), as a history
/// of each key's busiest minute of each day, and the rules it has.
async fn recorded(
    server: &super::client::Server,
    name: &str,
    max_entries: usize,
) -> anyhow::Result<(History, Option<(crate::rules::RuleSet, String)>)> {
    use floodgate_proto::v1 as pb;
    let (resource, limit) =
        name.rsplit_once('/').ok_or_else(|| anyhow::anyhow!("--limit: '{name}' is not written RESOURCE/LIMIT"))?;
    // A page holds about 1/64 of up to 100,000 keys, each up to a few KiB.
    let mut admin = pb::admin_client::AdminClient::new(server.connect().await?).max_decoding_message_size(64 << 20);
    let yaml = admin.get_rules(pb::GetRulesRequest {}).await.map_err(super::client::status_error)?.into_inner().yaml;
    let rules = crate::rules::RuleSet::from_yaml(&yaml, "the server's rules").map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut keys = Vec::new();
    let mut page_token = String::new();
    // Which pages were the fleet's record (from Redis): all or none.
    let mut shared = (0, 0);
    loop {
        let request = pb::GetTrafficRequest { resource: resource.into(), limit: limit.into(), page_token };
        let page = admin.get_traffic(request).await.map_err(super::client::status_error)?.into_inner();
        if page.shared {
            shared.0 += 1;
        } else {
            shared.1 += 1;
        }
        for k in page.keys {
            let days = k.days.iter().map(|d| (u32::try_from(d.day / 86_400).unwrap_or(0), d.calls)).collect();
            keys.push(recommend::traffic::KeyPeaks { key: k.key.into(), peaks: days });
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    match shared {
        (0, _) => eprintln!(
            "note: the record is the server's own: it has no Redis, or Redis did not answer (other replicas' calls \
             are not in it)"
        ),
        (_, 0) => {}
        (fleet, own) => anyhow::bail!(
            "Redis stopped or started answering while the record was read ({fleet} pages from Redis, {own} from the \
             server's own record): run recommend again"
        ),
    }
    let (history, left_out) = recommend::traffic::history(&keys, max_entries)?;
    if left_out > 0 {
        eprintln!("note: {left_out} keys longer than {} bytes are left out", recommend::MAX_KEY);
    }
    Ok((history, Some((rules, yaml))))
}

/// The proposal as a limit and overrides of a rules file: the keys must be
/// written `name=value[,name=value...]` with the same names. Every name and
/// value is quoted, so that YAML reads each as the text it is (`0x10`,
/// `true` and `null` too).
fn rules_snippet(history: &History, proposal: &Proposal, shape: Shape) -> Result<String, String> {
    // A key's pairs, refused when it holds a control character (YAML's
    // single quotes cannot hold one).
    fn checked(key: &str) -> Result<Vec<(String, String)>, String> {
        let pairs = pairs(key)?;
        if key.chars().any(char::is_control) {
            return Err(format!("key '{}' holds a control character", shown(key)));
        }
        Ok(pairs)
    }
    let names = |pairs: &[(String, String)]| pairs.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    let first = history.first_key().ok_or("the trace has no key")?;
    let expected = names(&checked(first)?);
    let mut overrides = String::new();
    for (key, limit) in &proposal.overrides {
        let pairs = checked(key)?;
        if names(&pairs) != expected {
            return Err(format!("keys name different descriptors ('{}' and '{}')", shown(first), shown(key)));
        }
        let when: Vec<String> = pairs.iter().map(|(k, v)| format!("{}: {}", quoted(k), quoted(v))).collect();
        overrides
            .push_str(&format!("      - {{ when: {{ {} }}, limits: {{ recommended: {limit} }} }}\n", when.join(", ")));
    }
    let key = expected.iter().map(|n| quoted(n)).collect::<Vec<_>>().join(", ");
    let n = proposal.per_minute;
    let limit = match shape {
        Shape::TokenBucket => {
            format!("algorithm: token_bucket, capacity: {n}, refill_per_second: {}", recommend::refill_per_second(n))
        }
        Shape::FixedWindow => format!("algorithm: fixed_window, limit: {n}, window: 1m"),
    };
    let mut out = format!("    limits:\n      - {{ name: recommended, key: [{key}], {limit} }}\n");
    if !overrides.is_empty() {
        out.push_str("    overrides:\n");
        out.push_str(&overrides);
    }
    Ok(out)
}

/// Text as a single-quoted YAML scalar.
fn quoted(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

/// A Unix minute as `2026-01-05T00:00Z`.
fn minute_text(minute: u64) -> String {
    let secs = i64::try_from(minute.saturating_mul(60)).unwrap_or(i64::MAX);
    jiff::Timestamp::from_second(secs)
        .map_or_else(|_| format!("minute {minute}"), |t| t.strftime("%Y-%m-%dT%H:%MZ").to_string())
}

/// A limiter's name as --algorithm takes it.
fn shape_name(shape: Shape) -> &'static str {
    match shape {
        Shape::TokenBucket => "token-bucket",
        Shape::FixedWindow => "fixed-window",
    }
}
