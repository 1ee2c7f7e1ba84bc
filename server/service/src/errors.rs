//! Errors as people read them.

/// An error and its causes on one line, `: ` between them, each cause said
/// once: tonic and hyper wrap an error in another that prints the same words
/// ("tcp connect error: tcp connect error: Connection refused"). A transport
/// error alone says little; the TLS or socket error under it says what went
/// wrong.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    let mut next = Some(e);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !text.is_empty() && !last.ends_with(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
            last = text;
        }
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::chain;

    /// An error that says `text`, caused by `source`.
    #[derive(Debug)]
    struct Wrap(&'static str, Option<Box<Wrap>>);

    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Wrap {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|w| w as &(dyn std::error::Error + 'static))
        }
    }

    #[test]
    fn a_cause_that_repeats_its_wrapper_is_said_once() {
        let leaf = Wrap("Connection refused (os error 111)", None);
        let same = Wrap("tcp connect error", Some(Box::new(leaf)));
        let again = Wrap("tcp connect error", Some(Box::new(same)));
        let top = Wrap("cannot reach floodgate", Some(Box::new(again)));
        assert_eq!(chain(&top), "cannot reach floodgate: tcp connect error: Connection refused (os error 111)");
    }
}
