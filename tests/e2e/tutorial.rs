//! The first tutorial (docs/src/tutorials/first-limit.md) shows commands and
//! what they print. This test runs those commands against the real binary,
//! in the order of the page, and compares what they print with the page.
//!
//! What may differ: times (`reset 200ms`, `retry after 5.241s`), the width
//! of the spaces between columns, and a `remaining N/M` that is higher than
//! the page shows (a bucket refills while the commands run, never the other
//! way). Everything else, the verdicts included, must be the same.
//!
//! Which commands run: `floodgate` commands (with `serve`, the server is
//! started again with the file the page gives), `sleep`, `curl` when it is
//! installed, and `echo`. Commands of other programs (grpcurl) are not run,
//! and neither is the section "Change the limit while the server runs",
//! whose steps are edits of a file in an editor.

use std::process::Command;

use crate::support::{self, Floodgate, TempDir};

const PAGE: &str = "docs/src/tutorials/first-limit.md";

/// The section that is not run (its steps are edits by hand).
const NOT_RUN: &str = "## Change the limit while the server runs";

/// One `$ command` of the page and the lines it prints there.
struct Step {
    line: usize,
    command: String,
    output: Vec<String>,
}

/// The `$ ` commands of the page's console and text blocks, before
/// [`NOT_RUN`], and the rules file the page asks the reader to save.
fn read_page() -> (Vec<Step>, String) {
    let page = std::fs::read_to_string(support::repo_path(PAGE)).unwrap();
    let mut steps: Vec<Step> = Vec::new();
    let mut rules = None;
    // The open block: its info string, its text so far, and whether a `$ `
    // line has come yet (lines before one are a log excerpt, not output).
    let mut block: Option<(String, String, bool)> = None;
    for (n, line) in page.lines().enumerate() {
        if line == NOT_RUN {
            break;
        }
        match (block.take(), line.strip_prefix("```")) {
            (None, Some(info)) => block = Some((info.trim().to_string(), String::new(), false)),
            (Some((info, text, _)), Some("")) => {
                if info == "yaml rules" {
                    rules = Some(text);
                }
            }
            (Some((info, mut text, mut commands)), _) => {
                if info == "console" || info == "text" {
                    match line.strip_prefix("$ ") {
                        Some(command) => {
                            commands = true;
                            steps.push(Step { line: n + 1, command: command.to_string(), output: Vec::new() })
                        }
                        None if commands => steps.last_mut().unwrap().output.push(line.to_string()),
                        None => {}
                    }
                }
                text.push_str(line);
                text.push('\n');
                block = Some((info, text, commands));
            }
            (None, None) => {}
        }
    }
    (steps, rules.expect("the page shows a ```yaml rules file to save"))
}

#[test]
fn the_first_tutorial_prints_what_its_page_shows() {
    let (steps, rules) = read_page();
    let dir = TempDir::new();
    dir.write("first-limit.yaml", &rules);
    let bin_dir = std::path::Path::new(support::BIN).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let have_curl = Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success());

    let mut server: Option<Floodgate> = None;
    let mut ran = 0;
    let mut differences = Vec::new();
    for step in &steps {
        let program = step.command.split_whitespace().next().unwrap_or_default();
        if let Some(args) = step.command.strip_prefix("floodgate serve") {
            // A flag as it is; a file name in the directory of the page's files.
            let args: Vec<String> = args
                .split_whitespace()
                .map(|a| if a.starts_with('-') { a.to_string() } else { dir.path(a).display().to_string() })
                .collect();
            drop(server.take());
            server = Some(support::floodgate().args(args).start());
            continue;
        }
        let runs = match program {
            "floodgate" | "sleep" | "echo" => true,
            "curl" => have_curl,
            _ => false,
        };
        if !runs {
            continue;
        }
        // The page's commands name the default addresses; the test's
        // server listens on free ports.
        let fg = server.get_or_insert_with(|| support::floodgate().start());
        let command = step.command.replace("127.0.0.1:50051", &fg.grpc).replace("127.0.0.1:8080", &fg.http);
        let out = Command::new("sh")
            .args(["-c", &command])
            .current_dir(dir.path(""))
            .env("PATH", &path)
            .env("FLOODGATE_SERVER", fg.url())
            .env_remove("FLOODGATE_TOKEN")
            .output()
            .unwrap();
        ran += 1;
        let printed = String::from_utf8_lossy(&out.stdout);
        let printed: Vec<&str> = printed.lines().collect();
        if let Some(why) = differs(&step.output, &printed) {
            differences.push(format!(
                "{PAGE}:{}: $ {}\n  {why}\n  the page shows:\n    {}\n  it printed:\n    {}\n  stderr: {}",
                step.line,
                step.command,
                step.output.join("\n    "),
                printed.join("\n    "),
                String::from_utf8_lossy(&out.stderr).trim(),
            ));
        }
    }
    assert!(differences.is_empty(), "the tutorial's commands print something else:\n\n{}", differences.join("\n\n"));
    assert!(ran >= 5, "only {ran} commands of {PAGE} were run: is the page's format read right?");
}

/// Why `printed` is not what the page `shows`, if it is not.
fn differs(shows: &[String], printed: &[&str]) -> Option<String> {
    if shows.len() != printed.len() {
        return Some(format!("{} lines on the page, {} printed", shows.len(), printed.len()));
    }
    for (n, (shown, printed)) in shows.iter().zip(printed).enumerate() {
        let (a, b) = (words(shown), words(printed));
        let same =
            a.len() == b.len() && a.iter().zip(&b).enumerate().all(|(i, (x, y))| x == y || may_differ(&a, i, x, y));
        if !same {
            return Some(format!("line {} differs", n + 1));
        }
    }
    None
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

/// Whether the word `shown` at `i` may read `printed` instead: a time after
/// `reset`, `after`, `in` or `retry`, or a `remaining` count that is higher
/// (but not above the limit).
fn may_differ(shown_words: &[String], i: usize, shown: &str, printed: &str) -> bool {
    let before = if i > 0 { shown_words[i - 1].as_str() } else { "" };
    match before {
        "reset" | "after" | "in" | "retry" => is_duration(shown) && is_duration(printed),
        "remaining" => {
            let count = |w: &str| -> Option<(u64, u64)> {
                let (n, of) = w.split_once('/')?;
                Some((n.parse().ok()?, of.parse().ok()?))
            };
            match (count(shown), count(printed)) {
                (Some((n, of)), Some((m, of2))) => of == of2 && m >= n && m <= of,
                _ => false,
            }
        }
        _ => false,
    }
}

/// `200ms`, `13.262s`, `1m30s`: digits, dots and time units, with a
/// trailing comma or full stop allowed.
fn is_duration(word: &str) -> bool {
    let word = word.trim_end_matches([',', '.']);
    let units = word.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    !word.is_empty()
        && word.starts_with(|c: char| c.is_ascii_digit())
        && word.chars().all(|c| c.is_ascii_digit() || c == '.' || "nsumh".contains(c))
        && !units.is_empty()
}

#[test]
fn the_comparison_allows_only_times_and_refills() {
    let shown = ["  global   remaining   9/10  per 2s   reset 200ms".to_string()];
    assert!(differs(&shown, &["  global remaining 10/10 per 2s reset 0s"]).is_none());
    assert!(differs(&shown, &["  global remaining 8/10 per 2s reset 200ms"]).is_some(), "fewer remain");
    assert!(differs(&shown, &["  global remaining 9/10 per 3s reset 200ms"]).is_some(), "another window");
    let verdict = ["RATE_LIMITED  demo  retry after 5.241s".to_string()];
    assert!(differs(&verdict, &["ALLOWED       demo"]).is_some());
    assert!(differs(&verdict, &["RATE_LIMITED demo retry after 994ms"]).is_none());
}
