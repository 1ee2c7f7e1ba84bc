//! What the client learns from Watch, to answer without a round trip: the
//! breakers that are OPEN (denied here until their next probe time), and the
//! rule patterns in force (a resource no rule matches is allowed here). While
//! Watch is disconnected, nothing is known and every call asks the server.

use std::collections::HashMap;
use std::sync::{RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use pb::watch_event::Event;
use tonic::transport::Channel;

/// The longest the cache answers for an open breaker on one event.
const MAX_OPEN: Duration = Duration::from_secs(3600);

#[derive(Default)]
pub(crate) struct OpenBreakers {
    /// Resource -> until when it stays open (`None`: forced open, until told).
    map: RwLock<HashMap<String, Option<Instant>>>,
}

/// The rule patterns in force, as Watch last told them.
#[derive(Default)]
pub(crate) struct KnownRules {
    patterns: RwLock<Option<Patterns>>,
}

struct Patterns {
    exact: std::collections::HashSet<String>,
    globs: Vec<String>,
    default: bool,
}

impl KnownRules {
    /// Whether `resource` is known to match no rule.
    pub(crate) fn unmatched(&self, resource: &str) -> bool {
        let patterns = self.patterns.read().unwrap_or_else(|e| e.into_inner());
        let Some(p) = patterns.as_ref() else { return false };
        !p.default && !p.exact.contains(resource) && !p.globs.iter().any(|g| glob_matches(g, resource))
    }

    fn set(&self, patterns: &[String]) {
        let mut p = Patterns { exact: Default::default(), globs: Vec::new(), default: false };
        for pattern in patterns {
            if pattern == "*" {
                p.default = true;
            } else if pattern.contains(['*', '?']) {
                p.globs.push(pattern.clone());
            } else {
                p.exact.insert(pattern.clone());
            }
        }
        *self.patterns.write().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    fn forget(&self) {
        *self.patterns.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The server's glob: `*` any run of characters, `?` exactly one.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Everything Watch feeds.
#[derive(Default)]
pub(crate) struct Known {
    pub(crate) open: OpenBreakers,
    pub(crate) rules: KnownRules,
}

impl Known {
    fn apply(&self, event: Event) {
        match &event {
            Event::Snapshot(s) => self.rules.set(&s.rule_patterns),
            Event::Rules(r) => self.rules.set(&r.rule_patterns),
            _ => {}
        }
        self.open.apply(event);
    }

    fn clear(&self) {
        self.open.clear();
        self.rules.forget();
    }
}

impl OpenBreakers {
    /// `Some(retry_after)` while the resource's breaker is known to be open.
    pub(crate) fn denies(&self, resource: &str) -> Option<Duration> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        match map.get(resource)? {
            None => Some(Duration::ZERO),
            Some(until) => until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()),
        }
    }

    fn set(&self, resource: &str, state: pb::BreakerState, next_probe_at: Option<&prost_types::Timestamp>) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        match state {
            pb::BreakerState::Open => {
                // Whatever the server sends (a time far in the future, nanos
                // out of range), the cache never holds a breaker open longer
                // than MAX_OPEN without hearing from it again.
                let until = next_probe_at.and_then(|t| {
                    let since_epoch = Duration::new(t.seconds.max(0) as u64, t.nanos.clamp(0, 999_999_999) as u32);
                    let at = SystemTime::UNIX_EPOCH.checked_add(since_epoch)?;
                    let left = at.duration_since(SystemTime::now()).unwrap_or_default().min(MAX_OPEN);
                    Instant::now().checked_add(left)
                });
                map.insert(resource.to_string(), Some(until.unwrap_or_else(Instant::now)));
            }
            pb::BreakerState::ForcedOpen => {
                map.insert(resource.to_string(), None);
            }
            _ => {
                map.remove(resource);
            }
        }
    }

    fn clear(&self) {
        self.map.write().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn apply(&self, event: Event) {
        match event {
            Event::Snapshot(s) => {
                self.clear();
                for b in s.breakers {
                    self.set(&b.resource, b.state(), b.next_probe_at.as_ref());
                }
            }
            Event::Breaker(t) => self.set(&t.resource, t.to_state(), t.next_probe_at.as_ref()),
            Event::Degradation(_) | Event::Rules(_) | Event::Overrides(_) => {}
        }
    }
}

/// Follows Watch on the first endpoint that answers (in the order given),
/// reconnecting with backoff, until `closed` fires (the client was dropped).
/// While disconnected nothing is known.
pub(crate) async fn follow(
    known: Weak<Known>,
    endpoints: Vec<FloodgateClient<Channel>>,
    mut closed: tokio::sync::watch::Receiver<()>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        for grpc in &endpoints {
            let mut grpc = grpc.clone();
            let response = tokio::select! {
                r = grpc.watch(pb::WatchRequest::default()) => r,
                _ = closed.changed() => return,
            };
            let Ok(response) = response else { continue };
            backoff = Duration::from_millis(100);
            let mut stream = response.into_inner();
            loop {
                let message = tokio::select! {
                    m = stream.message() => m,
                    _ = closed.changed() => return,
                };
                let Ok(Some(e)) = message else { break };
                let Some(known) = known.upgrade() else { return };
                if let Some(event) = e.event {
                    known.apply(event);
                }
            }
            let Some(known) = known.upgrade() else { return };
            known.clear();
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = closed.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_the_server_matches_them() {
        assert!(glob_matches("svc.*", "svc.orders"));
        assert!(glob_matches("svc.*", "svc."));
        assert!(!glob_matches("svc.*", "svc"));
        assert!(glob_matches("GET /api/*/items", "GET /api/v1/items"));
        assert!(glob_matches("a?c", "abc") && !glob_matches("a?c", "ac"));
        assert!(glob_matches("*", ""));
        let rules = KnownRules::default();
        assert!(!rules.unmatched("x"), "nothing known: ask the server");
        rules.set(&["orders".into(), "svc.*".into()]);
        assert!(rules.unmatched("payments") && !rules.unmatched("orders") && !rules.unmatched("svc.a"));
        rules.set(&["orders".into(), "*".into()]);
        assert!(!rules.unmatched("payments"), "a default rule matches everything");
    }

    #[test]
    fn a_next_probe_time_far_in_the_future_is_capped_not_a_panic() {
        let cache = OpenBreakers::default();
        let far = prost_types::Timestamp { seconds: i64::MAX, nanos: i32::MAX };
        cache.set("r", pb::BreakerState::Open, Some(&far));
        let left = cache.denies("r").expect("open");
        assert!(left <= MAX_OPEN && left > MAX_OPEN - Duration::from_secs(5), "{left:?}");
        cache.set("r", pb::BreakerState::Closed, None);
        assert_eq!(cache.denies("r"), None);
    }
}
