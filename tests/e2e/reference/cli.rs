//! docs/src/reference/cli.md: every command of the `floodgate` binary and
//! every flag, read from its clap definition (server/floodgate/src/cli).

use clap::{Arg, ArgAction, Command, CommandFactory};

use super::{check_page, header, inline};

const PAGE: &str = "docs/src/reference/cli.md";

#[test]
fn cli_reference_is_up_to_date() {
    check_page(PAGE, &render());
}

/// The page, from the command tree as clap builds it.
fn render() -> String {
    let mut root = floodgate::cli::Cli::command();
    // Building fills in what clap derives (usage, the globals' copies in
    // every subcommand), so that the page shows what `--help` shows.
    root.build();
    let mut out = header("the clap definitions in server/floodgate/src/cli (tests/e2e/reference/cli.rs)");
    out.push_str("# Command line\n\n");
    out.push_str(
        "This page lists every command of the `floodgate` binary and every flag. \
         `floodgate COMMAND --help` prints the same text. Every command also takes \
         `-h`/`--help`, and `floodgate --version` prints the version.\n\n",
    );
    out.push_str(
        "A flag that names an environment variable takes its value from that variable \
         when the flag is not given. A duration is written like `250ms`, `10s` or `2m`.\n\n",
    );
    out.push_str("## Commands\n\n");
    for (path, cmd) in walk(&root, "floodgate") {
        if path != "floodgate" {
            out.push_str(&format!("- [`{path}`](#{}): {}\n", anchor(&path), about(cmd)));
        }
    }
    out.push('\n');
    for (path, cmd) in walk(&root, "floodgate") {
        command(&mut out, &path, cmd, path == "floodgate");
    }
    out
}

/// Every command that is not hidden, the root first, each followed by its
/// subcommands, with its full name (`floodgate rules apply`).
fn walk<'a>(cmd: &'a Command, path: &str) -> Vec<(String, &'a Command)> {
    let mut all = vec![(path.to_string(), cmd)];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        all.extend(walk(sub, &format!("{path} {}", sub.get_name())));
    }
    all
}

/// The heading id that mdBook gives to `## {path}`.
fn anchor(path: &str) -> String {
    path.replace(' ', "-")
}

fn about(cmd: &Command) -> String {
    cmd.get_about().map(|a| inline(&a.to_string())).unwrap_or_default()
}

fn command(out: &mut String, path: &str, cmd: &Command, root: bool) {
    out.push_str(&format!("## {path}\n\n"));
    let long = cmd.get_long_about().or(cmd.get_about()).map(|a| a.to_string()).unwrap_or_default();
    for paragraph in long.split("\n\n").filter(|p| !p.trim().is_empty()) {
        out.push_str(&inline(paragraph));
        out.push_str("\n\n");
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim().strip_prefix("Usage:").unwrap_or(&usage).trim().to_string();
    out.push_str(&format!("```text\n{usage}\n```\n\n"));
    let subs: Vec<_> = cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help").collect();
    if !subs.is_empty() && !root {
        out.push_str("Commands:\n\n");
        for sub in subs {
            let sub_path = format!("{path} {}", sub.get_name());
            out.push_str(&format!("- [`{}`](#{}): {}\n", sub.get_name(), anchor(&sub_path), about(sub)));
        }
        out.push('\n');
    }
    // The globals are listed once, under the root command.
    let shown = |a: &&Arg| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version");
    let own = |a: &&Arg| root || !a.is_global_set();
    let positionals: Vec<&Arg> = cmd.get_positionals().filter(shown).filter(own).collect();
    let options: Vec<&Arg> = cmd.get_arguments().filter(|a| !a.is_positional()).filter(shown).filter(own).collect();
    if !positionals.is_empty() {
        out.push_str("Arguments:\n\n");
        for arg in positionals {
            argument(out, arg);
        }
        out.push('\n');
    }
    if !options.is_empty() {
        out.push_str(if root { "Options of every command:\n\n" } else { "Options:\n\n" });
        for arg in options {
            argument(out, arg);
        }
        out.push('\n');
    }
}

/// One list item: the flag and its value, then its help, default, possible
/// values and environment variable.
fn argument(out: &mut String, arg: &Arg) {
    let value = value_name(arg);
    let name = if arg.is_positional() {
        let dots = if matches!(arg.get_action(), ArgAction::Append) { "..." } else { "" };
        format!("{}{dots}", value.unwrap_or_else(|| arg.get_id().to_string().to_uppercase()))
    } else {
        let mut names = Vec::new();
        if let Some(short) = arg.get_short() {
            names.push(format!("-{short}"));
        }
        if let Some(long) = arg.get_long() {
            names.push(format!("--{long}"));
        }
        let mut name = names.join(", ");
        if let Some(value) = value {
            name.push_str(&format!(" <{value}>"));
        }
        name
    };
    let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
    out.push_str(&format!("- `{name}`"));
    let help = sentence(&inline(&help));
    if !help.is_empty() {
        out.push_str(&format!(": {help}"));
    }
    let mut facts = Vec::new();
    if arg.is_required_set() {
        facts.push("Required.".to_string());
    }
    let possible: Vec<_> =
        arg.get_possible_values().iter().filter(|v| !v.is_hide_set()).map(|v| format!("`{}`", v.get_name())).collect();
    if !possible.is_empty() && takes_value(arg) {
        facts.push(format!("Values: {}.", possible.join(", ")));
    }
    let defaults: Vec<_> = arg
        .get_default_values()
        .iter()
        .map(|v| match v.to_string_lossy() {
            v if v.is_empty() => "empty".to_string(),
            v => format!("`{v}`"),
        })
        .collect();
    // A switch (`--dry-run`) is off unless given: its default says nothing.
    let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count);
    if !defaults.is_empty() && !switch {
        facts.push(format!("Default: {}.", defaults.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        facts.push(format!("Environment: `{}`.", env.to_string_lossy()));
    }
    if !facts.is_empty() {
        out.push_str(&format!(" {}", facts.join(" ")));
    }
    out.push('\n');
}

/// Help text ends with a full stop on the page, so that the facts after it
/// (`Default: ...`) read as sentences of their own.
fn sentence(text: &str) -> String {
    match text.chars().last() {
        None => String::new(),
        Some('.' | '!' | '?' | ':') => text.to_string(),
        Some(_) => format!("{text}."),
    }
}

/// Whether the flag is followed by a value (`--config FILE`), rather than
/// being a switch (`--dry-run`).
fn takes_value(arg: &Arg) -> bool {
    arg.get_action().takes_values()
}

fn value_name(arg: &Arg) -> Option<String> {
    if !takes_value(arg) {
        return None;
    }
    let names = arg.get_value_names().map(|n| n.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(" "));
    Some(names.unwrap_or_else(|| arg.get_id().to_string().to_uppercase()))
}

/// The page would not show a command whose `--help` says nothing about it.
#[test]
fn every_command_and_flag_has_help() {
    let mut root = floodgate::cli::Cli::command();
    root.build();
    let mut silent = Vec::new();
    for (path, cmd) in walk(&root, "floodgate") {
        if cmd.get_about().is_none() {
            silent.push(path.clone());
        }
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                silent.push(format!("{path} {}", arg.get_id()));
            }
        }
    }
    assert!(silent.is_empty(), "commands and flags with no help text (add a doc comment): {silent:?}");
}
