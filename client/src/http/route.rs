//! Turning a request path into a resource: `/api/orders/123` is
//! `/api/orders/:id`, so that every order shares one set of limits.

/// Route templates, matched segment by segment (`:name` matches any one
/// segment). Paths no template matches are normalised: segments that look like
/// ids (all digits, a UUID, or a long hex string) become `:id`.
///
/// ```
/// use floodgate_client::http::Routes;
///
/// let routes = Routes::new(["/api/orders/:id", "/api/users/:user/cart"]);
/// assert_eq!(routes.resolve("/api/orders/123"), "/api/orders/:id");
/// assert_eq!(routes.resolve("/api/users/ann/cart"), "/api/users/:user/cart");
/// assert_eq!(routes.resolve("/api/items/42/reviews"), "/api/items/:id/reviews");
/// assert_eq!(routes.resolve("/api/items/4e2c3a0e-7b2a-4c55-9f3e-2b9d1a6c0f11"), "/api/items/:id");
/// ```
#[derive(Clone, Debug, Default)]
pub struct Routes {
    templates: Vec<(String, Vec<Segment>)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

impl Routes {
    pub fn new<I, S>(templates: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let templates = templates
            .into_iter()
            .map(|t| {
                let t = t.into();
                let segments = split(&t)
                    .map(|s| if s.starts_with(':') { Segment::Param } else { Segment::Literal(s.into()) })
                    .collect();
                (t, segments)
            })
            .collect();
        Routes { templates }
    }

    /// The template that matches `path`, or `path` with its ids replaced.
    pub fn resolve(&self, path: &str) -> String {
        let parts: Vec<&str> = split(path).collect();
        let matches = |segments: &[Segment]| {
            segments.len() == parts.len()
                && segments.iter().zip(&parts).all(|(s, p)| match s {
                    Segment::Param => true,
                    Segment::Literal(l) => l == p,
                })
        };
        if let Some((template, _)) = self.templates.iter().find(|(_, s)| matches(s)) {
            return template.clone();
        }
        let mut out = String::with_capacity(path.len());
        for p in parts {
            out.push('/');
            out.push_str(if looks_like_id(p) { ":id" } else { p });
        }
        if out.is_empty() { "/".into() } else { out }
    }
}

fn split(path: &str) -> impl Iterator<Item = &str> {
    path.split('?').next().unwrap_or("").split('/').filter(|s| !s.is_empty())
}

fn looks_like_id(s: &str) -> bool {
    let hex = |c: char| c.is_ascii_hexdigit();
    let uuid = s.len() == 36
        && s.chars().enumerate().all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == '-' } else { hex(c) });
    s.chars().all(|c| c.is_ascii_digit()) || uuid || (s.len() >= 16 && s.chars().all(hex))
}
