//! Which site a request on the HTTP port comes from, and whether the server
//! answers it.
//!
//! - Every request but `/healthz` and `/readyz` must name a host the server
//!   answers to (`Host`, or HTTP/2's `:authority`): an IP address, `localhost`
//!   (or a name under it), or a name given with `--http-host`. A page on
//!   `http://evil.test` whose name an attacker re-points at 127.0.0.1 (DNS
//!   rebinding) still sends `Host: evil.test`, so it reads nothing.
//! - An action (a POST) must be JSON (`Content-Type: application/json`,
//!   which a cross-site form or a no-cors fetch cannot send without a
//!   preflight the server never grants), and when a browser says where it
//!   comes from (`Origin`, `Sec-Fetch-Site`) that must be the console itself.
//!   So loopback, the only credential when no token file is set, is not
//!   consent for what another site's page asks a local browser to send.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::HttpState;

/// The names the HTTP port answers to, besides IP addresses and localhost.
#[derive(Clone, Debug, Default)]
pub struct Hosts {
    /// Lower case; `*.example.com` stands for any name under example.com.
    names: Vec<String>,
}

impl Hosts {
    /// `names` as `--http-host` gives them (each checked by [`parse_name`]).
    pub fn new(names: &[String]) -> Hosts {
        Hosts { names: names.iter().map(|n| n.to_ascii_lowercase()).collect() }
    }

    /// Whether a request naming `authority` (a Host header's value) is one
    /// this server answers.
    pub fn allows(&self, authority: &str) -> bool {
        let Some((host, _)) = split_authority(authority) else { return false };
        if host.starts_with('[') || host.parse::<std::net::Ipv4Addr>().is_ok() {
            return true;
        }
        let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        // A name, or nothing: `a..localhost`, `evil.test?.example.com`.
        if parse_name(&host).is_err() || host.starts_with("*.") {
            return false;
        }
        host == "localhost"
            || host.ends_with(".localhost")
            || self.names.iter().any(|n| match n.strip_prefix('*') {
                Some(suffix) => host.ends_with(suffix) && host.len() > suffix.len(),
                None => *n == host,
            })
    }
}

/// `--http-host`: a DNS name (letters, digits, `-` and `.`), or `*.` and one.
pub fn parse_name(s: &str) -> Result<String, String> {
    let name = s.strip_prefix("*.").unwrap_or(s);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "'{}' is not a host name (letters, digits, '-' and '.', or '*.' and one)",
            s.escape_debug()
        ));
    }
    Ok(s.to_string())
}

/// Host and port of an authority (`name`, `name:port`, `1.2.3.4:port`,
/// `[::1]:port`); `None` when it is not one.
fn split_authority(authority: &str) -> Option<(&str, Option<&str>)> {
    if authority.is_empty() || authority.bytes().any(|b| b.is_ascii_whitespace() || b == b'/' || b == b'@') {
        return None;
    }
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, rest) = authority.split_at(end + 1);
        if host[1..end].parse::<std::net::Ipv6Addr>().is_err() {
            return None;
        }
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() || port.is_some_and(|p| p.parse::<u16>().is_err() || p.starts_with('+')) {
        return None;
    }
    Some((host, port))
}

/// The authority a request names: HTTP/2's `:authority`, else `Host`.
fn authority(req: &Request) -> Option<&str> {
    req.uri().authority().map(|a| a.as_str()).or_else(|| req.headers().get(header::HOST)?.to_str().ok())
}

/// Refuses a request for a host the server does not answer to.
pub(crate) async fn check_host(State(s): State<HttpState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    // Probes and scrapers name the server as their platform knows it (a
    // Service name, a container name): these answer every Host.
    if path == "/healthz" || path == "/readyz" || path == "/metrics" {
        return next.run(req).await;
    }
    // Two of a header a check reads: which one counts depends on who reads
    // it (RFC 9112 says a request with two Hosts is a 400).
    for name in [header::HOST, header::ORIGIN, header::CONTENT_TYPE, header::HeaderName::from_static("sec-fetch-site")]
    {
        if req.headers().get_all(&name).iter().nth(1).is_some() {
            return super::reply::error(StatusCode::BAD_REQUEST, format!("{name}: sent more than once"));
        }
    }
    // HTTP/2 names the host twice when a Host header is sent beside
    // `:authority`: both must name the same one, or a check of one could be
    // passed while the other is used.
    if let (Some(a), Some(h)) = (req.uri().authority(), req.headers().get(header::HOST))
        && !h.to_str().is_ok_and(|h| h.eq_ignore_ascii_case(a.as_str()))
    {
        return super::reply::error(StatusCode::BAD_REQUEST, "Host: does not name the host :authority names");
    }
    match authority(&req) {
        Some(a) if s.hosts.allows(a) => next.run(req).await,
        a => {
            let shown = a.unwrap_or("").chars().take(100).flat_map(char::escape_default).collect::<String>();
            let message = format!(
                "host '{shown}' is not one this server answers to: use its address, or name it with --http-host"
            );
            super::reply::error(StatusCode::MISDIRECTED_REQUEST, message)
        }
    }
}

/// Why an action (a POST to the console's API) is refused before anyone
/// looks at who sent it: (status, message).
pub(crate) fn check_action(req: &Request) -> Result<(), (StatusCode, String)> {
    let headers = req.headers();
    if !is_json(headers) {
        let message = "Content-Type: an action must be sent as application/json".to_string();
        return Err((StatusCode::UNSUPPORTED_MEDIA_TYPE, message));
    }
    let own = authority(req).unwrap_or_default();
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if !same_authority(origin, own) {
            let shown = origin.chars().take(100).flat_map(char::escape_default).collect::<String>();
            return Err((StatusCode::FORBIDDEN, format!("Origin: '{shown}' is not this console")));
        }
    }
    match headers.get("sec-fetch-site").map(|v| v.as_bytes()) {
        None | Some(b"same-origin" | b"none") => Ok(()),
        Some(_) => Err((StatusCode::FORBIDDEN, "Sec-Fetch-Site: the action comes from another site".to_string())),
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Whether `origin` (`scheme://authority`) names the same host and port as
/// `own` (a request's authority). The scheme is not compared: behind a proxy
/// that ends TLS the page is https and the request plain.
fn same_authority(origin: &str, own: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else { return false };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    let (Some((h1, p1)), Some((h2, p2))) = (split_authority(authority), split_authority(own)) else { return false };
    let port = |p: Option<&str>| p.unwrap_or(default_port).to_string();
    // `own` has no scheme of its own: a port left out there is the origin's default.
    h1.eq_ignore_ascii_case(h2) && port(p1) == port(p2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_localhost_are_answered_and_other_names_only_when_given() {
        let hosts = Hosts::new(&["floodgate.example.com".into(), "*.svc.cluster.local".into()]);
        for ok in [
            "127.0.0.1:9090",
            "10.1.2.3",
            "[::1]:9090",
            "[fe80::1]",
            "localhost:9090",
            "LOCALHOST",
            "console.localhost:1",
            "floodgate.example.com:9090",
            "Floodgate.Example.com.",
            "fg.ns.svc.cluster.local:9090",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "evil.test",
            "evil.test:9090",
            "",
            "127.0.0.1.evil.test",
            "localhost.evil.test",
            "svc.cluster.local",
            "example.com",
            "[::1",
            "[not-ip]:1",
            "127.0.0.1:",
            "127.0.0.1:x",
            "a b",
            "user@127.0.0.1",
            "notfloodgate.example.com",
            "localhost:99999",
            "localhost..",
            ".localhost",
            "a..localhost",
            "evil.test?.fg.svc.cluster.local",
            "evil.test#.fg.svc.cluster.local",
            "evil.test\\.fg.svc.cluster.local",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
    }

    #[test]
    fn host_flags_must_be_names() {
        assert!(parse_name("floodgate.example.com").is_ok());
        assert!(parse_name("*.example.com").is_ok());
        for bad in ["", "*", "a..b", "-a.com", "a b", "a/b", "*.*.com", "ex_ample.com", &"a".repeat(64)] {
            assert!(parse_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_origin_is_the_consoles_own_when_host_and_port_match() {
        assert!(same_authority("http://127.0.0.1:9090", "127.0.0.1:9090"));
        assert!(same_authority("https://fg.example.com", "fg.example.com"));
        assert!(same_authority("http://fg.example.com", "fg.example.com:80"));
        assert!(same_authority("http://[::1]:9090", "[::1]:9090"));
        assert!(!same_authority("http://evil.test", "127.0.0.1:9090"));
        assert!(!same_authority("http://127.0.0.1:3000", "127.0.0.1:9090"), "another port is another site");
        assert!(!same_authority("null", "127.0.0.1:9090"));
        assert!(!same_authority("file://127.0.0.1:9090", "127.0.0.1:9090"));
    }
}
