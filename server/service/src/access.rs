//! Who may use Admin (and the console's actions): bearer tokens from a file,
//! reloaded when it changes; client certificate identities under mTLS; and,
//! while neither is configured, callers on loopback only.
//!
//! The token file has one token a line, `TOKEN [ROLE [NAME]]`: ROLE is
//! `admin` (the default: every Admin call) or `read` (`GetRules`,
//! `ListBreakers`, `GetBreaker`, `Peek`); NAME is who the audit log says made
//! the call. Blank lines and `#` comments are skipped; a token shorter than
//! 16 characters is refused. Tokens are compared in constant time.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use anyhow::Context;
use arc_swap::ArcSwap;

use crate::listen::Peer;

/// Refusals logged per second at most: a flood of them costs a counter,
/// not the log (each line logged says how many were not since the last).
const REFUSALS_LOGGED_PER_SECOND: u32 = 10;
/// The shortest token accepted.
pub(crate) const MIN_TOKEN_LEN: usize = 16;
/// The largest token file read.
const MAX_FILE_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// The read-only Admin calls.
    Read,
    /// Everything, changes included.
    Admin,
}

/// Who made a call, as the audit log names them, and what they may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub who: String,
    pub role: Role,
}

/// How Admin is protected: flags of `floodgate serve`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessConfig {
    /// `--admin-token-file`.
    pub token_file: Option<PathBuf>,
    /// `--admin-identity NAME[=ROLE]`: client certificate names (subject CN,
    /// or a DNS, URI or email subject alternative name) and their roles.
    pub identities: Vec<(String, Role)>,
    /// `--admin-read-open`: the read-only calls need no credential.
    pub read_open: bool,
}

/// Why a call was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No credential, or one that is not valid (UNAUTHENTICATED).
    Unauthenticated(String),
    /// A valid credential whose role does not allow the call (PERMISSION_DENIED).
    PermissionDenied(String),
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::Unauthenticated(why) | Denied::PermissionDenied(why) => f.write_str(why),
        }
    }
}

#[derive(Clone)]
struct Token {
    secret: Vec<u8>,
    role: Role,
    name: String,
}

/// Never prints the secret.
impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token").field("role", &self.role).field("name", &self.name).finish()
    }
}

pub struct Access {
    config: AccessConfig,
    tokens: ArcSwap<Vec<Token>>,
    /// Refusals logged (Admin over gRPC and the console alike).
    refusals: Throttle,
    /// What the token file's last read gave (its text, or the error), so
    /// that a change elsewhere in its directory reloads and logs nothing.
    last_read: std::sync::Mutex<Option<Result<String, String>>>,
}

// === impl Role ===

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "read" => Some(Role::Read),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// `NAME` or `NAME=ROLE`, for `--admin-identity`.
pub fn parse_identity(s: &str) -> Result<(String, Role), String> {
    let (name, role) = match s.rsplit_once('=') {
        Some((name, role)) => (name, Role::parse(role).ok_or_else(|| format!("role '{role}' is not admin or read"))?),
        None => (s, Role::Admin),
    };
    if name.is_empty() {
        return Err("an identity needs a name".into());
    }
    Ok((name.to_string(), role))
}

// === impl Access ===

impl Access {
    /// Reads the token file, if any.
    pub fn load(config: AccessConfig) -> anyhow::Result<Arc<Access>> {
        let (tokens, text) = match &config.token_file {
            Some(path) => {
                let text = crate::files::read_text(path, MAX_FILE_BYTES)
                    .with_context(|| format!("reading {}", path.display()))?;
                let tokens = parse_tokens(&text).with_context(|| format!("in {}", path.display()))?;
                (tokens, Some(Ok(text)))
            }
            None => (Vec::new(), None),
        };
        Ok(Arc::new(Access {
            config,
            tokens: ArcSwap::from_pointee(tokens),
            refusals: Throttle::default(),
            last_read: std::sync::Mutex::new(text),
        }))
    }

    /// Reads the token file again when it changes; a bad file is logged and
    /// the tokens in force stay.
    pub fn watch(self: &Arc<Self>) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
        let Some(path) = self.config.token_file.clone() else { return Ok(None) };
        let weak = Arc::downgrade(self);
        let file = path.clone();
        let task = crate::files::watch(vec![path], crate::files::QUIET, move || {
            let (weak, file) = (weak.clone(), file.clone());
            async move {
                let Some(access) = weak.upgrade() else { return };
                let read = crate::files::read_bounded(&file, MAX_FILE_BYTES).await.map_err(anyhow::Error::from);
                // What was read (or why nothing was): the same again, after a
                // change elsewhere in the directory, reloads and logs nothing.
                let seen = read.as_ref().map(String::clone).map_err(|e| format!("{e:#}"));
                {
                    let mut last = access.last_read.lock().unwrap_or_else(|e| e.into_inner());
                    if last.as_ref() == Some(&seen) {
                        return;
                    }
                    *last = Some(seen);
                }
                match read.and_then(|text| parse_tokens(&text)) {
                    Ok(tokens) => {
                        tracing::info!(file = %file.display(), tokens = tokens.len(), "admin tokens reloaded");
                        access.tokens.store(Arc::new(tokens));
                        access.warn_if_loopback_only();
                    }
                    Err(e) => {
                        tracing::error!(file = %file.display(), error = format!("{e:#}"), "admin tokens not reloaded; keeping the ones in force")
                    }
                }
            }
        })?;
        Ok(Some(task))
    }

    /// Whether any credential is configured; without one, Admin answers only
    /// on loopback. A token file with no token in it configures none, so a
    /// file shipped empty (a Kubernetes Secret) leaves loopback working until
    /// a token is added; emptying it again opens loopback again.
    pub(crate) fn credentials_configured(&self) -> bool {
        !self.tokens.load().is_empty() || !self.config.identities.is_empty()
    }

    /// Says so when no credential is configured (none given, or a token
    /// file with no token): Admin then answers only on loopback.
    pub(crate) fn warn_if_loopback_only(&self) {
        if self.credentials_configured() {
            return;
        }
        match &self.config.token_file {
            Some(file) => tracing::warn!(
                file = %file.display(),
                "the admin token file has no token: Admin answers only on loopback until one is added"
            ),
            None => tracing::warn!(
                "no admin credential configured: Admin answers only on loopback (see --admin-token-file)"
            ),
        }
    }

    /// Whether a refusal may be logged now: `Some(refusals not logged since
    /// the last one logged)`, or `None` past the bound this second.
    pub(crate) fn refusal_logged(&self) -> Option<u64> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.refusals.admit(now)
    }

    /// Who is calling, if they may make a call that needs `needs`.
    pub fn check(&self, needs: Role, bearer: Option<&str>, peer: &Peer) -> Result<Caller, Denied> {
        let caller = self.identify(bearer, peer)?;
        match caller {
            Some(c) if c.role >= needs => Ok(c),
            Some(c) => Err(Denied::PermissionDenied(format!(
                "{} has the {} role; this call needs {}",
                c.who,
                c.role.name(),
                needs.name()
            ))),
            None if needs == Role::Read && self.config.read_open => {
                Ok(Caller { who: anonymous(peer), role: Role::Read })
            }
            None if !self.credentials_configured() && peer.is_loopback() => {
                Ok(Caller { who: anonymous(peer), role: Role::Admin })
            }
            None if !self.credentials_configured() => Err(Denied::Unauthenticated(
                "Admin answers only on loopback until a token (--admin-token-file) or --admin-identity is configured"
                    .into(),
            )),
            None => Err(Denied::Unauthenticated("Admin needs a credential: authorization: Bearer TOKEN".into())),
        }
    }

    /// The caller a credential names; an invalid token is refused outright.
    fn identify(&self, bearer: Option<&str>, peer: &Peer) -> Result<Option<Caller>, Denied> {
        if let Some(given) = bearer {
            let tokens = self.tokens.load();
            // Every token is compared, in constant time, whatever matches.
            let found =
                tokens.iter().fold(None, |found, t| if equal(&t.secret, given.as_bytes()) { Some(t) } else { found });
            return match found {
                Some(t) => Ok(Some(Caller { who: format!("token:{}", t.name), role: t.role })),
                None => Err(Denied::Unauthenticated("the bearer token is not valid".into())),
            };
        }
        let names = peer
            .certs
            .as_ref()
            .and_then(|c| c.first())
            .map(|leaf| crate::listen::certificate_names(leaf))
            .unwrap_or_default();
        let role = self
            .config
            .identities
            .iter()
            .filter(|(name, _)| names.iter().any(|n| n == name))
            .map(|(_, role)| *role)
            .max();
        Ok(role.map(|role| Caller { who: format!("cert:{}", names.first().map_or("?", String::as_str)), role }))
    }
}

/// At most [`REFUSALS_LOGGED_PER_SECOND`] refusals logged a second; each logged
/// line says how many were not logged since the last one.
#[derive(Default)]
struct Throttle {
    second: AtomicU64,
    this_second: AtomicU32,
    suppressed: AtomicU64,
}

impl Throttle {
    /// `Some(suppressed since the last line)` if this one may be logged.
    fn admit(&self, now: u64) -> Option<u64> {
        if self.second.swap(now, Ordering::AcqRel) != now {
            self.this_second.store(0, Ordering::Release);
        }
        if self.this_second.fetch_add(1, Ordering::AcqRel) < REFUSALS_LOGGED_PER_SECOND {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access").field("config", &self.config).field("tokens", &self.tokens.load().len()).finish()
    }
}

/// The token of an `authorization: Bearer TOKEN` header (gRPC metadata or
/// the console's HTTP requests).
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn anonymous(peer: &Peer) -> String {
    peer.addr.map_or_else(|| "unknown peer".into(), |a| format!("peer {a}"))
}

/// Constant time in the length of `given`: no early exit on the first difference.
fn equal(secret: &[u8], given: &[u8]) -> bool {
    let mut diff = u8::from(secret.len() != given.len());
    for (i, g) in given.iter().enumerate() {
        diff |= secret.get(i).copied().unwrap_or(0) ^ g;
    }
    diff == 0
}

fn parse_tokens(text: &str) -> anyhow::Result<Vec<Token>> {
    let mut tokens = Vec::new();
    let mut lines = std::collections::HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split_once('#').map_or(line, |(l, _)| l).trim();
        let mut words = line.split_whitespace();
        let Some(secret) = words.next() else { continue };
        anyhow::ensure!(
            secret.len() >= MIN_TOKEN_LEN,
            "line {}: a token needs at least {MIN_TOKEN_LEN} characters",
            n + 1
        );
        let role = match words.next() {
            Some(r) => Role::parse(r).with_context(|| format!("line {}: role '{r}' is not admin or read", n + 1))?,
            None => Role::Admin,
        };
        let name = words.next().map_or_else(|| format!("line{}", n + 1), str::to_string);
        // A token given twice would take one line's role and name and
        // silently drop the other's: an appended line could change a role.
        if let Some(first) = lines.get(secret) {
            anyhow::bail!("line {}: the same token as line {first}; give each token once", n + 1);
        }
        lines.insert(secret, n + 1);
        tokens.push(Token { secret: secret.as_bytes().to_vec(), role, name });
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> Peer {
        Peer { addr: Some("127.0.0.1:5000".parse().unwrap()), certs: None, identity: None }
    }

    fn remote() -> Peer {
        Peer { addr: Some("10.1.2.3:5000".parse().unwrap()), certs: None, identity: None }
    }

    fn with_tokens(text: &str, read_open: bool) -> Access {
        Access {
            config: AccessConfig { token_file: Some("t".into()), identities: Vec::new(), read_open },
            tokens: ArcSwap::from_pointee(parse_tokens(text).unwrap()),
            refusals: Throttle::default(),
            last_read: std::sync::Mutex::new(Some(Ok(text.to_string()))),
        }
    }

    #[test]
    fn without_credentials_only_loopback_may_call() {
        let a = Access {
            config: AccessConfig::default(),
            tokens: ArcSwap::from_pointee(Vec::new()),
            refusals: Throttle::default(),
            last_read: std::sync::Mutex::new(None),
        };
        assert_eq!(a.check(Role::Admin, None, &loopback()).unwrap().role, Role::Admin);
        assert!(
            matches!(a.check(Role::Read, None, &remote()), Err(Denied::Unauthenticated(m)) if m.contains("loopback"))
        );
    }

    #[test]
    fn a_token_given_twice_is_refused_whatever_its_roles() {
        let err = parse_tokens("admin-token-0123456789 admin alice\n\nadmin-token-0123456789 read bob\n").unwrap_err();
        assert_eq!(err.to_string(), "line 3: the same token as line 1; give each token once");
    }

    #[test]
    fn refusals_are_logged_ten_a_second_and_the_rest_counted() {
        let t = Throttle::default();
        let first: Vec<_> = (0..25).map(|_| t.admit(100)).collect();
        assert_eq!(first.iter().filter(|l| l.is_some()).count(), 10);
        assert!(first[..10].iter().all(|l| *l == Some(0)) && first[10..].iter().all(Option::is_none));
        assert_eq!(t.admit(101), Some(15), "the next second's first line says how many were not logged");
        assert_eq!(t.admit(101), Some(0));
    }

    #[test]
    fn a_token_file_with_no_token_configures_no_credential() {
        let a = with_tokens("# nothing yet\n\n", false);
        assert!(!a.credentials_configured());
        assert_eq!(a.check(Role::Admin, None, &loopback()).unwrap().role, Role::Admin);
        assert!(matches!(a.check(Role::Read, None, &remote()), Err(Denied::Unauthenticated(_))));
        a.tokens.store(Arc::new(parse_tokens("admin-token-0123456789\n").unwrap()));
        assert!(a.credentials_configured());
        assert!(matches!(a.check(Role::Read, None, &loopback()), Err(Denied::Unauthenticated(_))));
    }

    #[test]
    fn tokens_carry_roles_and_names() {
        let a = with_tokens("# ops\nadmin-token-0123456789 admin alice\nreader-token-0123456789 read grafana\n", false);
        let alice = a.check(Role::Admin, Some("admin-token-0123456789"), &remote()).unwrap();
        assert_eq!(alice, Caller { who: "token:alice".into(), role: Role::Admin });
        assert!(a.check(Role::Read, Some("reader-token-0123456789"), &remote()).is_ok());
        assert!(matches!(
            a.check(Role::Admin, Some("reader-token-0123456789"), &remote()),
            Err(Denied::PermissionDenied(m)) if m.contains("token:grafana has the read role")
        ));
        assert!(matches!(
            a.check(Role::Read, Some("wrong-token-0123456789"), &loopback()),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(
            matches!(a.check(Role::Read, None, &loopback()), Err(Denied::Unauthenticated(_))),
            "configured: loopback is not enough"
        );
    }

    #[test]
    fn read_only_calls_may_be_opened() {
        let a = with_tokens("admin-token-0123456789\n", true);
        assert_eq!(a.check(Role::Read, None, &remote()).unwrap().role, Role::Read);
        assert!(a.check(Role::Admin, None, &remote()).is_err());
    }

    #[test]
    fn bad_token_files_are_refused_with_the_line() {
        assert_eq!(parse_tokens("short\n").unwrap_err().to_string(), "line 1: a token needs at least 16 characters");
        let e = parse_tokens("\nlong-enough-token-000 root\n").unwrap_err().to_string();
        assert_eq!(e, "line 2: role 'root' is not admin or read");
        assert_eq!(parse_identity("ops=read"), Ok(("ops".into(), Role::Read)));
        assert!(parse_identity("=admin").is_err());
    }

    #[test]
    fn comparison_needs_the_whole_token() {
        assert!(equal(b"abcdef", b"abcdef"));
        assert!(!equal(b"abcdef", b"abcde"));
        assert!(!equal(b"abcdef", b"abcdefg"));
        assert!(!equal(b"abcdef", b""));
    }
}
