//! Turning a request path into a resource: `/api/orders/123` is
//! `/api/orders/:id`, so that every order shares one set of limits.

/// Route templates, matched segment by segment: `:name` and `{name}` (axum
/// 0.8's syntax) match any one segment, `*rest` and `{*rest}` every segment
/// left. Paths no template matches are normalised: segments that look like
/// ids (all digits, a UUID, or a long hex string) become `:id`.
///
/// ```
/// use floodgate_client::http::Routes;
///
/// let routes = Routes::new(["/api/orders/:id", "/api/users/{user}/cart", "/static/{*path}"]);
/// assert_eq!(routes.resolve("/api/orders/123"), "/api/orders/:id");
/// assert_eq!(routes.resolve("/api/users/ann/cart"), "/api/users/{user}/cart");
/// assert_eq!(routes.resolve("/static/css/site.css"), "/static/{*path}");
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
    /// Every segment left.
    Rest,
}

fn segment(s: &str) -> Segment {
    let braced = s.strip_prefix('{').and_then(|s| s.strip_suffix('}'));
    match (s.strip_prefix(':'), braced) {
        (Some(_), _) => Segment::Param,
        (_, Some(inner)) if inner.starts_with('*') => Segment::Rest,
        (_, Some(_)) => Segment::Param,
        _ if s.starts_with('*') => Segment::Rest,
        _ => Segment::Literal(s.into()),
    }
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
                let segments = split(&t).map(segment).collect();
                (t, segments)
            })
            .collect();
        Routes { templates }
    }

    /// The template that matches `path`, or `path` with its ids replaced.
    pub fn resolve(&self, path: &str) -> String {
        match self.template(path) {
            Some(t) => t.to_string(),
            None => normalise(path),
        }
    }

    /// The template that matches `path`, if any.
    pub fn template(&self, path: &str) -> Option<&str> {
        let parts: Vec<&str> = split(path).collect();
        let matches = |segments: &[Segment]| {
            let rest = segments.last() == Some(&Segment::Rest);
            let fixed = if rest { segments.len() - 1 } else { segments.len() };
            (if rest { parts.len() > fixed } else { parts.len() == fixed })
                && segments[..fixed].iter().zip(&parts).all(|(s, p)| match s {
                    Segment::Literal(l) => l == p,
                    Segment::Param | Segment::Rest => true,
                })
        };
        self.templates.iter().find(|(_, s)| matches(s)).map(|(t, _)| t.as_str())
    }
}

/// `path` with the segments that look like ids replaced by `:id`.
fn normalise(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for p in split(path) {
        out.push('/');
        out.push_str(if looks_like_id(p) { ":id" } else { p });
    }
    if out.is_empty() { "/".into() } else { out }
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
