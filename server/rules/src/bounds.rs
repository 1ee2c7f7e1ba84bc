//! Bounds checked before a rules file is parsed: its size and how deeply it
//! nests. A YAML parser's time grows with the square of the nesting depth;
//! 200 KB of `[` took 23 s. Real rules files nest a handful of levels.

/// The largest rules file, in bytes.
pub const MAX_BYTES: usize = 1 << 20;
/// The deepest nesting accepted (indentation, sequence dashes and brackets
/// together): far beyond any real rules file.
pub(crate) const MAX_DEPTH: usize = 100;

/// Why a text is refused before parsing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TooBig {
    #[error("{0} bytes; the limit is {MAX_BYTES}")]
    Size(usize),
    #[error("nesting deeper than {MAX_DEPTH} levels at line {0}")]
    Depth(usize),
}

/// Checks size and nesting in one pass, without parsing. The depth counted is
/// an upper bound: every space of indentation, every leading `- ` and every
/// open `[` or `{` outside quotes and comments counts as a level.
pub fn check(text: &str) -> Result<(), TooBig> {
    if text.len() > MAX_BYTES {
        return Err(TooBig::Size(text.len()));
    }
    let mut flow = 0usize;
    for (n, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let mut rest = &line[indent..];
        let mut dashes = 0;
        while let Some(r) = rest.strip_prefix('-').filter(|r| r.is_empty() || r.starts_with([' ', '\t'])) {
            dashes += 1;
            rest = r.trim_start_matches([' ', '\t']);
        }
        if indent + dashes + flow > MAX_DEPTH {
            return Err(TooBig::Depth(n + 1));
        }
        flow = scan_flow(rest, flow).ok_or(TooBig::Depth(n + 1))?;
    }
    Ok(())
}

/// The bracket depth after one line; `None` once it passes the limit.
fn scan_flow(line: &str, mut depth: usize) -> Option<usize> {
    let mut quote = None;
    let mut prev = ' ';
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q && prev != '\\' => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if prev.is_whitespace() => break,
            (None, '[' | '{') => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return None;
                }
            }
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        prev = c;
    }
    Some(depth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_rules_pass_and_deep_or_huge_texts_do_not() {
        let rules =
            "resources:\n  - name: a\n    limits: [ { name: l, algorithm: gcra, rate_per_second: 1, burst: 1 } ]\n";
        assert_eq!(check(rules), Ok(()));
        assert_eq!(check(crate::DEFAULT_RULES), Ok(()));
        assert_eq!(check(&"[".repeat(100_000)), Err(TooBig::Depth(1)));
        assert_eq!(check(&"- ".repeat(101)), Err(TooBig::Depth(1)));
        let indented = format!("a:\n{}b: 1\n", " ".repeat(150));
        assert_eq!(check(&indented), Err(TooBig::Depth(2)));
        assert_eq!(check(&"#".repeat(MAX_BYTES + 1)), Err(TooBig::Size(MAX_BYTES + 1)));
        assert_eq!(check("k: '[[[[[[['  # [[[[[\n"), Ok(()), "brackets in quotes and comments do not nest");
    }
}
