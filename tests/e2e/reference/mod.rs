//! The generated reference pages of the book (docs/src/reference/cli.md,
//! metrics.md and api.md): each test here renders its page from the code
//! and fails when the committed page differs, so that a page cannot fall
//! behind the code.
//!
//! To rewrite the pages after a change, run:
//!
//! ```sh
//! FLOODGATE_BLESS=1 cargo test -p floodgate --test e2e reference
//! ```

mod api;
mod cli;
mod metrics;

use crate::support;

/// The command that rewrites every generated page.
const REGENERATE: &str = "FLOODGATE_BLESS=1 cargo test -p floodgate --test e2e reference";

/// The first lines of a generated page: an HTML comment (the book does not
/// show it) that says where the page comes from and how to rewrite it.
fn header(source: &str) -> String {
    format!(
        "<!-- This page is generated from {source}. Do not edit it by hand.\n     \
         To rewrite it after a change, run: {REGENERATE} -->\n\n"
    )
}

/// Compares `generated` with the committed page at `path` (relative to the
/// repository). With FLOODGATE_BLESS=1 it writes the page instead.
fn check_page(path: &str, generated: &str) {
    let file = support::repo_path(path);
    if std::env::var_os("FLOODGATE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&file, generated).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
        return;
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    if committed == generated {
        return;
    }
    let first_difference = committed
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
    let line = |text: &str| text.lines().nth(first_difference).unwrap_or("(end of page)").to_string();
    panic!(
        "{path} is out of date: it differs from what the code gives at line {}.\n  \
         committed: {}\n  generated: {}\nRewrite it with: {REGENERATE}",
        first_difference + 1,
        line(&committed),
        line(generated),
    );
}

/// Text for one cell of a Markdown table: as [`inline`], and a `|` in a
/// code span escaped too (a table would end the cell there).
fn cell(text: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in inline(text).chars() {
        if c == '`' {
            in_code = !in_code;
        }
        if c == '|' && in_code {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Text for one line of Markdown: no line breaks, and the
/// characters that Markdown would read as markup (`|`, `<`, `*`, `_`)
/// escaped, so that the page shows the text as the code has it.
fn inline(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    escape(&out)
}

/// Escapes Markdown's markup characters, but not inside `code spans`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let next = chars.peek().copied();
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '|' | '<' | '>' | '*' | '[' | ']' | '\\' if !in_code => {
                out.push('\\');
                out.push(c);
            }
            // `_` inside a word (RUST_LOG) is never emphasis; elsewhere it may be.
            '_' if !in_code && !inside_word(&out, next) => out.push_str("\\_"),
            c => out.push(c),
        }
    }
    out
}

/// Whether a `_` between the text so far and `next` is inside a word.
fn inside_word(out: &str, next: Option<char>) -> bool {
    let before = out.chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_');
    before && next.is_some_and(|n| n.is_alphanumeric())
}

#[test]
fn escape_leaves_code_spans_alone() {
    assert_eq!(escape("a_b `c_d` <e> _f_"), "a_b `c_d` \\<e\\> \\_f\\_");
    assert_eq!(inline("one\n  two"), "one two");
    assert_eq!(cell("`a|b` c|d"), "`a\\|b` c\\|d");
}
