//! Resource name globs: `*` matches any run of characters (even none), `?` one.

/// A compiled glob pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    pattern: Vec<char>,
}

impl Glob {
    /// Whether `name` is written as a glob rather than an exact name.
    pub(crate) fn is_glob(name: &str) -> bool {
        name.contains(['*', '?'])
    }

    pub fn new(pattern: &str) -> Self {
        Glob { pattern: pattern.chars().collect() }
    }

    /// Iterative matching with one backtrack point: linear in practice, never
    /// exponential, whatever the pattern. `ni` is a byte offset into `name`.
    pub fn matches(&self, name: &str) -> bool {
        let p = &self.pattern;
        let (mut pi, mut ni) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while let Some(c) = name[ni..].chars().next() {
            match p.get(pi) {
                Some('*') => {
                    star = Some((pi, ni));
                    pi += 1;
                }
                Some(&want) if want == '?' || want == c => {
                    pi += 1;
                    ni += c.len_utf8();
                }
                _ => match star {
                    Some((sp, sn)) => {
                        let skipped = name[sn..].chars().next().map_or(1, char::len_utf8);
                        pi = sp + 1;
                        ni = sn + skipped;
                        star = Some((sp, ni));
                    }
                    None => return false,
                },
            }
        }
        p[pi..].iter().all(|&c| c == '*')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_like_a_shell() {
        let g = Glob::new("payments.*");
        assert!(g.matches("payments.charge"));
        assert!(g.matches("payments."));
        assert!(!g.matches("payments"));
        assert!(!g.matches("billing.payments.charge"));
        assert!(Glob::new("GET /api/*/items").matches("GET /api/orders/items"));
        assert!(!Glob::new("GET /api/*/items").matches("GET /api/orders/items/1"));
        assert!(Glob::new("db-?").matches("db-1"));
        assert!(!Glob::new("db-?").matches("db-12"));
        assert!(Glob::new("*").matches(""));
        assert!(Glob::new("a*b*c").matches("aXXbYYc"));
        assert!(!Glob::new("a*b*c").matches("aXXbYY"));
        assert!(Glob::new("é*").matches("étoile"));
    }

    #[test]
    fn tells_globs_from_exact_names() {
        assert!(Glob::is_glob("payments.*"));
        assert!(Glob::is_glob("db-?"));
        assert!(!Glob::is_glob("GET /api/orders/:id"));
    }

    #[test]
    fn pathological_patterns_stay_fast() {
        let g = Glob::new(&"*a".repeat(50));
        let name = "a".repeat(49) + "b";
        // Exponential backtracking would not finish.
        assert!(!g.matches(&name));
        assert!(g.matches(&(name + "a")));
    }
}
