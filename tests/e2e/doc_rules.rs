//! The rules files shown in the book are valid: every fenced block marked
//! ```` ```yaml rules ```` in docs/src is a complete rules file, and
//! `floodgate check-config` must accept it.
//!
//! A YAML block that shows only part of a file (a few fields of one rule) is
//! marked ```` ```yaml ```` alone, and is not checked. A block that starts
//! with a top-level key of the rules file (`resources:`, `tiers:`,
//! `systems:`) is a whole file, so it must carry the `rules` mark: an
//! unmarked one fails here, so that no complete example escapes the check.

use std::process::Command;

use crate::support::{self, TempDir, path_str};

/// The top-level keys of a rules file.
const TOP_LEVEL: &[&str] = &["resources:", "tiers:", "systems:"];

/// A fenced code block of a page.
struct Block {
    place: String,
    info: String,
    text: String,
}

/// Every fenced code block (```` ``` ```` at the start of a line) of every
/// page of the book.
fn blocks() -> Vec<Block> {
    let mut pages = Vec::new();
    let mut dirs = vec![support::repo_path("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    let mut all = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(support::repo_path("")).unwrap().display().to_string();
        let mut open: Option<Block> = None;
        for (n, line) in text.lines().enumerate() {
            match (open.take(), line.strip_prefix("```")) {
                (None, Some(info)) => {
                    open = Some(Block {
                        place: format!("{name}:{}", n + 1),
                        info: info.trim().into(),
                        text: String::new(),
                    })
                }
                (Some(block), Some(rest)) if rest.trim().is_empty() => all.push(block),
                (Some(mut block), _) => {
                    block.text.push_str(line);
                    block.text.push('\n');
                    open = Some(block);
                }
                (None, None) => {}
            }
        }
        assert!(open.is_none(), "{name}: a code block is never closed");
    }
    all
}

fn is_marked_rules(block: &Block) -> bool {
    let words: Vec<&str> = block.info.split_whitespace().collect();
    words.first() == Some(&"yaml") && words.contains(&"rules")
}

#[test]
fn every_rules_file_in_the_docs_passes_check_config() {
    let dir = TempDir::new();
    let mut checked = 0;
    let mut failed = Vec::new();
    for (i, block) in blocks().iter().filter(|b| is_marked_rules(b)).enumerate() {
        let file = dir.write(&format!("block-{i}.yaml"), &block.text);
        let out = Command::new(support::BIN).args(["check-config", path_str(&file)]).output().unwrap();
        checked += 1;
        if !out.status.success() {
            failed.push(format!("{}:\n{}", block.place, String::from_utf8_lossy(&out.stderr).trim()));
        }
    }
    assert!(failed.is_empty(), "rules files in the docs that check-config refuses:\n\n{}", failed.join("\n\n"));
    // The book shows about a dozen; none found means the scan is broken.
    assert!(checked >= 5, "only {checked} ```yaml rules blocks found in docs/src");
}

#[test]
fn every_complete_rules_file_in_the_docs_is_marked() {
    let unmarked: Vec<String> = blocks()
        .iter()
        .filter(|b| b.info == "yaml" || b.info == "yml")
        .filter(|b| {
            let first = b.text.lines().map(str::trim_end).find(|l| !l.is_empty() && !l.starts_with('#'));
            first.is_some_and(|l| TOP_LEVEL.iter().any(|key| l.starts_with(key)))
        })
        .map(|b| b.place.clone())
        .collect();
    assert!(
        unmarked.is_empty(),
        "YAML blocks that are whole rules files but not marked ```yaml rules (so never checked): {unmarked:?}"
    );
}
