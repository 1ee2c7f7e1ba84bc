//! The console: a page on the HTTP port (`/`) showing the rules in force,
//! each resource's limits (global buckets' use, hottest keys), breakers with
//! a timeline of transitions, the degradation level and replication; it
//! updates live from the event feed Watch reads, and offers the Admin actions
//! (reset or force a breaker, set the level).
//!
//! Its assets are compiled in. The JSON it reads (`/api/v1/console`,
//! `/api/v1/events`) needs the read role and its actions the admin role,
//! exactly as `Admin` over gRPC: a bearer token in `Authorization` (the page
//! asks for one and keeps it for the tab only), an mTLS identity, or loopback
//! when no credential is configured. Tokens never travel in URLs or cookies;
//! actions must be JSON from the console's own origin, and every request must
//! name a host the server answers to ([`site`](super::site)), so another
//! site's page can neither act through a local browser nor read by DNS
//! rebinding. The page is served with a strict Content-Security-Policy and
//! sets text, never markup.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::HttpState;
use super::reply::{error, json_response};
use crate::access::{Denied, Role};
use crate::breaker::State as BreakerState;
use crate::decider::{BreakerView, Decider};
use crate::engine::Installed;
use crate::engine::concurrency::ConcurrencyView;
use crate::engine::hottest::TopLimit;
use crate::engine::{ErrorKind, LevelTarget, RequestError};
use crate::events::Event;
use crate::listen::Peer;
use crate::lock;
use crate::rules::Rule;

mod propose;
mod series;
use series::{BreakerNow, Reading, Series};

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");
/// Transitions and other events kept for the timeline.
const TIMELINE: usize = 200;
/// Event streams open at once.
const MAX_STREAMS: usize = 256;
/// Event streams one caller (a token, a certificate identity, or an address
/// without either) may hold open at once.
const MAX_STREAMS_PER_CALLER: usize = 32;
/// How often an open event stream checks that its caller may still read: a
/// revoked token's streams end within this.
const RECHECK: Duration = Duration::from_secs(5);

/// The largest action body.
const MAX_BODY: usize = 4096;

/// What the console keeps besides the Decider: the recent events, the
/// charts' series and the ticks that move them.
#[derive(Clone)]
pub(crate) struct Console {
    timeline: Arc<Mutex<VecDeque<Value>>>,
    /// The last refusal of each source of rules (by `source_kind`) whose
    /// rules have not been installed since: the page's banner.
    refused: Arc<Mutex<BTreeMap<&'static str, Value>>>,
    series: Arc<Mutex<Series>>,
    /// Each second's sample, as the `tick` event every stream sends.
    ticks: broadcast::Sender<Arc<str>>,
    streams: Arc<AtomicUsize>,
    /// Streams open per caller.
    callers: Arc<Mutex<HashMap<String, usize>>>,
}

impl Console {
    /// Starts keeping the timeline of `decider`'s events and, once a
    /// second, the charts' series.
    pub fn start(decider: &Arc<Decider>) -> Console {
        let console = Console {
            timeline: Arc::default(),
            refused: Arc::default(),
            series: Arc::default(),
            ticks: broadcast::channel(8).0,
            streams: Arc::default(),
            callers: Arc::default(),
        };
        let mut events = decider.views().subscribe();
        let timeline = Arc::downgrade(&console.timeline);
        let refused = Arc::downgrade(&console.refused);
        let series = Arc::downgrade(&console.series);
        tokio::spawn(async move {
            loop {
                let event = match events.recv().await {
                    Ok(e) => e,
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                };
                let (Some(timeline), Some(series), Some(refused)) =
                    (timeline.upgrade(), series.upgrade(), refused.upgrade())
                else {
                    return;
                };
                match &*event {
                    Event::Breaker { resource, transition: t, .. } => {
                        lock(&series).transition(resource, unix_seconds(), t.from.name(), t.to.name());
                    }
                    // A refusal stays on the page until rules from that
                    // source are installed.
                    Event::RulesRefused { source, .. } => {
                        lock(&refused).insert(source_kind(source), event_json(&event));
                    }
                    Event::Rules { source, .. } => {
                        lock(&refused).remove(source_kind(source));
                    }
                    Event::Degradation(_) | Event::Overrides { .. } => {}
                }
                let mut t = lock(&timeline);
                if t.len() == TIMELINE {
                    t.pop_front();
                }
                t.push_back(event_json(&event));
            }
        });
        let decider = Arc::downgrade(decider);
        let (series, ticks) = (Arc::downgrade(&console.series), console.ticks.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                every.tick().await;
                let (Some(decider), Some(series)) = (decider.upgrade(), series.upgrade()) else { return };
                let tick = sample(&decider, &series, unix_seconds());
                if !tick.is_empty() {
                    let _ = ticks.send(Arc::from(tick));
                }
            }
        });
        console
    }
}

/// One second of the charts: every rule's decisions, every breaker, every level.
fn sample(decider: &Decider, series: &Mutex<Series>, now: u64) -> String {
    let installed = decider.views().installed();
    let snapshot = decider.views().snapshot();
    let breakers = snapshot
        .breakers
        .iter()
        .map(|(resource, i)| BreakerNow {
            resource: resource.clone(),
            state: i.state.name(),
            calls: i.window.calls,
            failure_rate: i.window.failure_rate(),
            slow_call_rate: i.window.slow_call_rate(),
            not_permitted: i.not_permitted,
        })
        .collect();
    let levels = std::iter::once(&snapshot.level)
        .chain(snapshot.systems.iter())
        .map(|l| (l.system.to_string(), l.level))
        .collect();
    lock(series).sample(now, |each| installed.tallies(each), Reading { breakers, levels })
}

fn unix_seconds() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub fn routes() -> Router<HttpState> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", PAGE) }))
        .route("/console.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/console.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/api/v1/console", get(state))
        .route("/api/v1/events", get(events))
        .route("/api/v1/series", get(series))
        .route("/api/v1/breakers/{resource}/state", post(set_breaker))
        .route("/api/v1/level", post(set_level))
        .route("/api/v1/rules/revert", post(revert_rules))
        .route("/api/v1/propose", get(propose::show))
        .route("/api/v1/propose/apply", post(propose::apply))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type.parse().expect("valid"));
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
    h.insert(header::CONTENT_SECURITY_POLICY, csp.parse().expect("valid"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, "nosniff".parse().expect("valid"));
    h.insert(header::REFERRER_POLICY, "no-referrer".parse().expect("valid"));
    h.insert(header::CACHE_CONTROL, "no-store".parse().expect("valid"));
    r
}

pub(super) async fn not_found(req: Request) -> Response {
    let path: String = req.uri().path().chars().take(200).collect();
    error(StatusCode::NOT_FOUND, format!("no such page: {path}"))
}

pub(super) async fn method_not_allowed(req: Request) -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, format!("{} is not allowed here", req.method()))
}

/// A decider's error as the console answers it: by its kind, as gRPC does.
fn refused(e: RequestError) -> Response {
    let status = match e.kind() {
        ErrorKind::BadInput => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::TooMany => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

/// An action's sender: who it is, if the request is one the console acts on
/// (JSON, from its own site) and the caller may act (the admin role).
fn allow_action(state: &HttpState, req: &Request, what: &str) -> Result<String, Box<Response>> {
    if let Err((status, why)) = super::site::check_action(req) {
        let peer = req.extensions().get::<Peer>().and_then(|p| p.addr).map(|a| a.to_string()).unwrap_or_default();
        if let Some(suppressed) = state.access.refusal_logged() {
            tracing::warn!(target: "floodgate::audit", peer, method = what, reason = why.as_str(), suppressed, "console action refused");
        }
        return Err(Box::new(error(status, why)));
    }
    allow(state, req.headers(), req.extensions().get::<Peer>(), Role::Admin, what)
}

/// Who may do this, as Admin decides it; the refusal as the answer.
fn allow(
    state: &HttpState,
    headers: &HeaderMap,
    peer: Option<&Peer>,
    needs: Role,
    what: &str,
) -> Result<String, Box<Response>> {
    let peer = peer.cloned().unwrap_or_default();
    match state.access.check(needs, crate::access::bearer(headers), &peer) {
        Ok(caller) => Ok(caller.who),
        Err(denied) => {
            let (status, why) = match denied {
                Denied::Unauthenticated(why) => (StatusCode::UNAUTHORIZED, why),
                Denied::PermissionDenied(why) => (StatusCode::FORBIDDEN, why),
            };
            let peer = peer.addr.map(|a| a.to_string()).unwrap_or_default();
            if let Some(suppressed) = state.access.refusal_logged() {
                let refused = if needs == Role::Admin { "console action refused" } else { "console read refused" };
                tracing::warn!(target: "floodgate::audit", peer, method = what, reason = why.as_str(), suppressed, "{refused}");
            }
            Err(Box::new(error(status, why)))
        }
    }
}

async fn state(State(s): State<HttpState>, req: Request) -> Response {
    if let Err(refused) = allow(&s, req.headers(), req.extensions().get::<Peer>(), Role::Read, "console") {
        return *refused;
    }
    let page = match ResourcePage::from_query(req.uri().query().unwrap_or("")) {
        Ok(p) => p,
        Err(refused) => return *refused,
    };
    let timeline: Vec<Value> = lock(&s.console.timeline).iter().cloned().collect();
    let refused: Vec<Value> = lock(&s.console.refused).values().cloned().collect();
    json_response(StatusCode::OK, snapshot(&s.decider, timeline, refused, &page))
}

/// Which resources the page lists: those whose name holds `filter` (any
/// case), `count` of them from `offset`. The page shows a page at a time,
/// so 5,000 rules cost the server and the tab what 25 do.
struct ResourcePage {
    filter: String,
    offset: usize,
    count: usize,
}

/// The most resources one answer lists.
const MAX_RESOURCES_SHOWN: usize = 500;

impl ResourcePage {
    fn from_query(query: &str) -> Result<ResourcePage, Box<Response>> {
        let mut page = ResourcePage { filter: String::new(), offset: 0, count: MAX_RESOURCES_SHOWN };
        let mut seen = Vec::new();
        for pair in query_pairs(query) {
            let (key, value) = pair?;
            once(&mut seen, key)?;
            let bad = |why: &str| Box::new(error(StatusCode::BAD_REQUEST, format!("{}: {why}", key.escape_debug())));
            let number = |most: usize| {
                value.parse::<usize>().ok().filter(|n| *n <= most).ok_or_else(|| {
                    bad(&format!(
                        "'{}' is not a number from 0 to {most}",
                        value.chars().take(32).collect::<String>().escape_debug()
                    ))
                })
            };
            match key {
                "resource_filter" if value.len() <= crate::rules::MAX_NAME_BYTES => page.filter = value.to_lowercase(),
                "resource_filter" => return Err(bad("longer than any resource name")),
                "resource_offset" => page.offset = number(usize::MAX)?,
                "resource_count" => page.count = number(MAX_RESOURCES_SHOWN)?,
                other => {
                    return Err(Box::new(not_a_parameter(other, "resource_filter, resource_offset, resource_count")));
                }
            }
        }
        Ok(page)
    }
}

/// Which kind of source rules came from, as `Event::Rules` and
/// `Event::RulesRefused` name their source: a refusal is cleared by the next
/// rules installed from the same kind.
fn source_kind(source: &str) -> &'static str {
    match source {
        s if s.starts_with("envoy:") || s == "envoy" => "envoy",
        s if s.starts_with("sentinel:") || s == "sentinel" => "sentinel",
        "redis" => "redis",
        "admin" => "admin",
        "embedded" => "embedded",
        _ => "file",
    }
}

/// Everything the page shows.
fn snapshot(decider: &Decider, timeline: Vec<Value>, refused: Vec<Value>, page: &ResourcePage) -> Value {
    let installed = decider.views().installed();
    let top = decider.views().top_keys("", 5);
    let all = installed.rules.rules();
    let matching: Vec<&Rule> =
        all.iter().filter(|r| page.filter.is_empty() || r.name.to_lowercase().contains(&page.filter)).collect();
    let resources: Vec<Value> = matching
        .iter()
        .skip(page.offset)
        .take(page.count)
        .map(|rule| resource_json(decider, &installed, rule, &top))
        .collect();
    let breakers: Vec<Value> = decider.views().breakers().iter().map(breaker_json).collect();
    let snapshot = decider.views().snapshot();
    let health = decider.views().replica_health();
    json!({
        "rules": {
            "version": installed.version,
            "source": installed.source,
            "loaded_at": rfc3339(installed.loaded_at),
            "pattern_count": all.len(),
            "earlier": decider.views().earlier_rules().iter().map(|e| json!({
                "version": e.version, "source": e.source, "replaced_at": rfc3339(e.replaced_at),
                "pattern_count": e.resource_count,
            })).collect::<Vec<Value>>(),
        },
        "envoy": (!installed.envoy.source.is_empty()).then(|| json!({
            "source": installed.envoy.source,
            "version": installed.envoy.version,
            "domains": installed.envoy.config.domains().count(),
            "loaded_at": rfc3339(installed.envoy.loaded_at),
        })),
        "sentinel": (!installed.sentinel.source.is_empty()).then(|| json!({
            "source": installed.sentinel.source,
            "resources": installed.sentinel.rules.rules.len(),
            "ignored": installed.sentinel.rules.ignored.len(),
            "loaded_at": rfc3339(installed.sentinel.loaded_at),
        })),
        "resources": resources,
        "resources_listed": { "total": all.len(), "matching": matching.len(), "offset": page.offset },
        "breakers": breakers,
        "timeline": timeline,
        "rules_refused": refused,
        "level": { "level": snapshot.level.level, "manual": snapshot.level.manual, "automatic": snapshot.level.automatic },
        "systems": snapshot.systems.iter().map(level_json).collect::<Vec<_>>(),
        "replication": {
            "mode": if health.replicated { "redis" } else { "memory" },
            "redis_up": health.redis_up,
            "live_replicas": health.live_replicas,
            "rules_differ": health.rules_differ,
        },
        "overrides": installed.runtime.len(),
        "concurrency": decider.views().concurrency_views(|_, _| true, CONCURRENCY_SHOWN).iter().map(concurrency_json).collect::<Vec<_>>(),
        "now": rfc3339(SystemTime::now()),
    })
}

/// The most series one request names, and the most it may ask for by `top`.
const MAX_NAMED: usize = 32;
const MAX_TOP: usize = 64;

/// The charts' series: `resource=NAME` and `breaker=NAME` (repeated) name
/// what to send, `top=N` (default 8) the busiest when none is named; the
/// levels and "other" always come.
async fn series(State(s): State<HttpState>, req: Request) -> Response {
    if let Err(refused) = allow(&s, req.headers(), req.extensions().get::<Peer>(), Role::Read, "console series") {
        return *refused;
    }
    let (mut resources, mut breakers, mut top) = (Vec::new(), Vec::new(), 8);
    let mut seen = Vec::new();
    for pair in query_pairs(req.uri().query().unwrap_or("")) {
        let (key, value) = match pair {
            Ok(p) => p,
            Err(refused) => return *refused,
        };
        if key == "top"
            && let Err(refused) = once(&mut seen, key)
        {
            return *refused;
        }
        match key {
            "resource" | "breaker" => {
                let list = if key == "resource" { &mut resources } else { &mut breakers };
                if list.len() == MAX_NAMED {
                    return error(StatusCode::BAD_REQUEST, format!("{key}: more than {MAX_NAMED} named"));
                }
                list.push(value);
            }
            "top" => match value.parse::<usize>() {
                Ok(n) if n <= MAX_TOP => top = n,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("top: '{}' is not a number from 0 to {MAX_TOP}", value.escape_debug()),
                    );
                }
            },
            other => return not_a_parameter(other, "resource, breaker, top"),
        }
    }
    let body = lock(&s.console.series).json(&resources, &breakers, top);
    json_response(StatusCode::OK, body)
}

/// A query string's `key=value` pairs in order, each value decoded; a value
/// that is not UTF-8 once decoded is the refusal naming its key.
fn query_pairs(query: &str) -> impl Iterator<Item = Result<(&str, String), Box<Response>>> {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        percent_decoded(value).map(|v| (key, v)).ok_or_else(|| {
            Box::new(error(StatusCode::BAD_REQUEST, format!("{}: not UTF-8 once decoded", key.escape_debug())))
        })
    })
}

/// Refuses a single-valued parameter given twice (which one would win is
/// a guess a caller should not have to make).
fn once<'a>(seen: &mut Vec<&'a str>, key: &'a str) -> Result<(), Box<Response>> {
    if seen.contains(&key) {
        return Err(Box::new(given_twice(key)));
    }
    seen.push(key);
    Ok(())
}

/// The refusal of a single-valued parameter or field given more than once.
fn given_twice(key: &str) -> Response {
    let key: String = key.chars().take(64).collect();
    error(StatusCode::BAD_REQUEST, format!("{}: given more than once", key.escape_debug()))
}

/// The refusal of a parameter the endpoint does not take, naming those it does.
fn not_a_parameter(key: &str, known: &str) -> Response {
    let key: String = key.chars().take(64).collect();
    error(StatusCode::BAD_REQUEST, format!("'{}' is not a parameter ({known})", key.escape_debug()))
}

/// A query string value with `+` and `%XX` decoded; `None` if not UTF-8.
fn percent_decoded(v: &str) -> Option<String> {
    let mut out = Vec::with_capacity(v.len());
    let mut bytes = v.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = |b: Option<u8>| b.and_then(|b| (b as char).to_digit(16));
                let (hi, lo) = (bytes.clone().next(), bytes.clone().nth(1));
                match (hex(hi), hex(lo)) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        bytes.nth(1);
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

/// One rule: its limits (with the use of global ones) and hottest keys.
fn resource_json(decider: &Decider, installed: &Installed, rule: &Rule, top: &[TopLimit]) -> Value {
    let used = decider.views().global_use(installed, rule);
    let limits: Vec<Value> = rule
        .limits
        .iter()
        .map(|l| {
            let global = used.iter().find(|u| u.name == l.name).map(|u| {
                json!({ "limit": u.limit, "remaining": u.remaining, "from_redis": u.from_redis })
            });
            json!({ "name": l.name, "algorithm": l.algorithm.summary(), "key": l.key, "shadow": l.shadow, "history": l.history, "global": global })
        })
        .collect();
    let keys = |k: &[(String, u64, u64)]| -> Vec<Value> {
        k.iter().map(|(key, count, error)| json!({ "key": key, "count": count, "error": error })).collect()
    };
    let hot: Vec<Value> = top
        .iter()
        .filter(|t| t.rule == rule.name)
        .map(|t| json!({ "limit": t.limit, "denied": keys(&t.denied), "admitted": keys(&t.admitted) }))
        .collect();
    json!({
        "rule": rule.name,
        "limits": limits,
        "overrides": rule.overrides.len(),
        "breaker": rule.breaker.is_some(),
        "concurrency": rule.concurrency.map(|c| c.max_in_flight),
        "adaptive": rule.concurrency.and_then(|c| c.adaptive).map(|a| a.algorithm_name()),
        "shed_at_level": rule.shed_at_level,
        "top": hot,
    })
}

/// The most concurrency limits the console shows (by resource name).
const CONCURRENCY_SHOWN: usize = 50;

/// One concurrency limit: the limit now, by priority, and an adaptive
/// limit's inputs and windows (the chart).
fn concurrency_json(v: &ConcurrencyView) -> Value {
    let ms = |us: f64| (us / 1000.0 * 100.0).round() / 100.0;
    let partitions: Vec<Value> = crate::rules::Priority::ALL
        .iter()
        .zip(v.partitions)
        .filter(|(p, _)| v.rule.partitions.percent(**p) > 0)
        .map(|(p, (guaranteed, in_flight))| {
            json!({ "priority": p.key(), "percent": v.rule.partitions.percent(*p), "guaranteed": guaranteed, "in_flight": in_flight })
        })
        .collect();
    let windows: Vec<Value> = v
        .history
        .iter()
        .map(|p| {
            json!({
                "at": rfc3339(p.at.to_system_time()),
                "limit": p.limit,
                "max_in_flight": p.window.max_in_flight,
                "mean_rtt_ms": p.window.mean_rtt_us().map(ms),
                "samples": p.window.samples,
                "drops": p.window.drops,
            })
        })
        .collect();
    let i = v.inputs.unwrap_or_default();
    json!({
        "resource": v.resource,
        "algorithm": v.rule.adaptive.map(|a| a.algorithm_name()),
        "limit": v.limit,
        "in_flight": v.in_flight,
        "short_rtt_ms": ms(i.short_rtt_us),
        "long_rtt_ms": ms(i.long_rtt_us),
        "no_load_rtt_ms": ms(i.no_load_rtt_us),
        "min_rtt_ms": ms(i.min_rtt_us),
        "probing": i.probing,
        "next_probe_at": i.next_probe_at.map(|t| rfc3339(t.to_system_time())),
        "gradient": i.gradient,
        "queue": i.queue,
        "partitions": partitions,
        "windows": windows,
    })
}

fn breaker_json(b: &BreakerView) -> Value {
    let i = &b.info;
    json!({
        "resource": b.resource,
        "state": i.state.name(),
        "calls": i.window.calls,
        "failure_rate": i.window.failure_rate(),
        "slow_call_rate": i.window.slow_call_rate(),
        "not_permitted": i.not_permitted,
        "opened_at": i.opened_at.map(|t| rfc3339(t.to_system_time())),
        "next_probe_at": i.next_probe_at.map(|t| rfc3339(t.to_system_time())),
    })
}

/// Server-sent events: one `data:` line of JSON per event, a comment every
/// 15 s to keep proxies from closing the stream.
async fn events(State(s): State<HttpState>, req: Request) -> Response {
    match query_pairs(req.uri().query().unwrap_or("")).next() {
        Some(Ok((key, _))) => return not_a_parameter(key, "none"),
        Some(Err(refused)) => return *refused,
        None => {}
    }
    let peer = req.extensions().get::<Peer>().cloned().unwrap_or_default();
    let who = match allow(&s, req.headers(), Some(&peer), Role::Read, "console events") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    // A caller without a credential is known by its address (not its port).
    let caller = match peer.addr {
        Some(addr) if who.starts_with("peer ") => format!("address {}", addr.ip()),
        _ => who,
    };
    let slot = match StreamSlot::take(&s.console, caller) {
        Ok(slot) => slot,
        Err(refused) => return *refused,
    };
    let bearer = crate::access::bearer(req.headers()).map(str::to_string);
    let access = s.access.clone();
    let mut rx = s.decider.views().subscribe();
    let mut ticks = s.console.ticks.subscribe();
    let drained = s.decider.drained();
    let stream = async_stream(move |tx| async move {
        let _slot = slot;
        tokio::pin!(drained);
        let mut ping = tokio::time::interval(Duration::from_secs(15));
        let mut recheck = tokio::time::interval_at(tokio::time::Instant::now() + RECHECK, RECHECK);
        loop {
            let chunk = tokio::select! {
                // The client went: its slot is free now, not at the next ping.
                () = tx.closed() => return,
                // The server is draining: the page reconnects elsewhere.
                () = &mut drained => return,
                // A token revoked (or a role taken away) ends its streams.
                _ = recheck.tick() => match access.check(Role::Read, bearer.as_deref(), &peer) {
                    Ok(_) => continue,
                    Err(_) => return,
                },
                e = rx.recv() => match e {
                    Ok(e) => format!("data: {}\n\n", event_json(&e)),
                    Err(broadcast::error::RecvError::Lagged(_)) => "data: {\"kind\":\"resync\"}\n\n".to_string(),
                    Err(_) => return,
                },
                t = ticks.recv() => match t {
                    Ok(t) => format!("data: {t}\n\n"),
                    // A slow reader misses ticks, not events: the page's
                    // charts show the gap, and the next tick goes on.
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                },
                _ = ping.tick() => ": ping\n\n".to_string(),
            };
            if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                return;
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_TYPE, "text/event-stream".parse().expect("valid"));
    r.headers_mut().insert(header::CACHE_CONTROL, "no-store".parse().expect("valid"));
    r
}

/// A stream's place under the caps, freed when the stream ends.
struct StreamSlot {
    streams: Arc<AtomicUsize>,
    callers: Arc<Mutex<HashMap<String, usize>>>,
    caller: String,
}

impl StreamSlot {
    fn take(console: &Console, caller: String) -> Result<StreamSlot, Box<Response>> {
        let mut callers = lock(&console.callers);
        let theirs = callers.get(&caller).copied().unwrap_or(0);
        if theirs >= MAX_STREAMS_PER_CALLER {
            return Err(Box::new(error(
                StatusCode::TOO_MANY_REQUESTS,
                format!("{caller} has {MAX_STREAMS_PER_CALLER} event streams open"),
            )));
        }
        if console.streams.fetch_add(1, Ordering::AcqRel) >= MAX_STREAMS {
            console.streams.fetch_sub(1, Ordering::AcqRel);
            return Err(Box::new(error(
                StatusCode::TOO_MANY_REQUESTS,
                format!("{MAX_STREAMS} event streams are open"),
            )));
        }
        callers.insert(caller.clone(), theirs + 1);
        Ok(StreamSlot { streams: console.streams.clone(), callers: console.callers.clone(), caller })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.streams.fetch_sub(1, Ordering::AcqRel);
        let mut callers = lock(&self.callers);
        if let Some(n) = callers.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                callers.remove(&self.caller);
            }
        }
    }
}

/// A stream fed by a task through a small channel; the task ends when the
/// client goes (the send fails).
fn async_stream<F, Fut>(f: F) -> tokio_stream::wrappers::ReceiverStream<Result<Bytes, std::io::Error>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// An action's body: a JSON object naming each field once, and only fields
/// the action takes (`known`); the object as a `Value` to read them from.
async fn read_body(req: Request, known: &[&str]) -> Result<Value, Response> {
    let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(|_| error(StatusCode::PAYLOAD_TOO_LARGE, format!("the body is over {MAX_BODY} bytes")))?;
    let Fields(fields) = serde_json::from_slice(&bytes).map_err(|e| error(StatusCode::BAD_REQUEST, format!("{e}")))?;
    let mut object = serde_json::Map::new();
    for (key, value) in fields {
        if !known.contains(&key.as_str()) {
            let shown: String = key.chars().take(64).collect();
            let known = known.join(", ");
            return Err(error(StatusCode::BAD_REQUEST, format!("'{}' is not a field ({known})", shown.escape_debug())));
        }
        if object.contains_key(&key) {
            return Err(given_twice(&key));
        }
        object.insert(key, value);
    }
    Ok(Value::Object(object))
}

/// A JSON object's fields in order, duplicates kept (a map would keep the
/// last silently).
struct Fields(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    fields.push(entry);
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A field that must be true or false if given.
fn flag(body: &Value, key: &str) -> Result<bool, Box<Response>> {
    match &body[key] {
        Value::Null if body.get(key).is_none() => Ok(false),
        Value::Bool(b) => Ok(*b),
        other => Err(Box::new(error(StatusCode::BAD_REQUEST, format!("{key}: {other} is not true or false")))),
    }
}

async fn set_breaker(
    State(s): State<HttpState>,
    resource: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    let who = match allow_action(&s, &req, "console SetBreakerState") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let Ok(Path(resource)) = resource else {
        return error(StatusCode::BAD_REQUEST, "resource: the path does not name a resource in UTF-8");
    };
    let body = match read_body(req, &["state"]).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let to = body["state"].as_str().and_then(BreakerState::from_name).filter(|s| s.settable());
    let Some(to) = to else {
        let given = match &body["state"] {
            Value::String(name) => format!("'{}'", name.escape_debug()),
            Value::Null => "missing".to_string(),
            other => other.to_string(),
        };
        return error(
            StatusCode::BAD_REQUEST,
            format!("state: {given} is not CLOSED, FORCED_OPEN, DISABLED or METRICS_ONLY"),
        );
    };
    match s.decider.control().set_breaker(&resource, to).await {
        Ok(view) => {
            let (resource, version) = (resource.escape_debug().to_string(), s.decider.views().rules().version);
            tracing::info!(target: "floodgate::audit", who, change = "SetBreakerState (console)", resource, to = to.name(), version_before = version, version_after = version, "admin change");
            json_response(StatusCode::OK, json!({ "resource": view.resource, "state": view.info.state.name() }))
        }
        Err(e) => refused(e),
    }
}

/// The fields of a level action.
const LEVEL_KEYS: [&str; 4] = ["level", "automatic", "system", "every_system"];

async fn set_level(State(s): State<HttpState>, req: Request) -> Response {
    let who = match allow_action(&s, &req, "console SetDegradationLevel") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let body = match read_body(req, &LEVEL_KEYS).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (automatic, every_system) = match (flag(&body, "automatic"), flag(&body, "every_system")) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(r), _) | (_, Err(r)) => return *r,
    };
    let level = if automatic {
        if body.get("level").is_some() {
            return error(
                StatusCode::BAD_REQUEST,
                format!("level: {} with automatic: true; send one or the other", body["level"]),
            );
        }
        None
    } else {
        match body["level"].as_u64().and_then(|l| u32::try_from(l).ok()) {
            Some(l) => Some(l),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("level: {} is not a degradation level (0 to 3)", body["level"]),
                );
            }
        }
    };
    let system = match body.get("system") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return error(StatusCode::BAD_REQUEST, format!("system: {other} is not a system name")),
    };
    let target = match every_system {
        true if system.is_empty() => LevelTarget::Every,
        true => return refused(RequestError::SystemWithEverySystem(system)),
        false => LevelTarget::One(&system),
    };
    match s.decider.control().set_level(target, level).await {
        Ok(levels) => {
            for l in &levels {
                let system = crate::metrics::system_label(&l.system);
                tracing::info!(target: "floodgate::audit", who, change = "SetDegradationLevel (console)", system, level = l.level, manual = l.manual, "admin change");
            }
            let list: Vec<Value> = levels.iter().map(level_json).collect();
            let first = list.first().cloned().unwrap_or(Value::Null);
            let mut answer = json!({
                "level": first["level"], "manual": first["manual"], "automatic": first["automatic"], "system": first["system"],
            });
            if list.len() > 1 {
                answer["systems"] = Value::Array(list);
            }
            json_response(StatusCode::OK, answer)
        }
        Err(e) => refused(e),
    }
}

const REVERT_KEYS: [&str; 1] = ["to_version"];

/// `POST /api/v1/rules/revert` `{"to_version": N}` (0 or absent: the rules
/// the ones in force replaced), as `Admin.RevertRules`.
async fn revert_rules(State(s): State<HttpState>, req: Request) -> Response {
    let who = match allow_action(&s, &req, "console RevertRules") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let body = match read_body(req, &REVERT_KEYS).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let to = match body.get("to_version") {
        None => 0,
        Some(v) => match v.as_u64() {
            Some(n) => n,
            None => return error(StatusCode::BAD_REQUEST, format!("to_version: {v} is not a version")),
        },
    };
    let before = s.decider.views().rules().version;
    match s.decider.control().revert_rules(to).await {
        Ok(r) => {
            let (after, to, resources) = (r.version, r.reverted_to, r.resources.len());
            tracing::info!(target: "floodgate::audit", who, change = "RevertRules (console)", reverted_to = to, resources, version_before = before, version_after = after, "admin change");
            json_response(StatusCode::OK, json!({ "version": r.version, "reverted_to": r.reverted_to }))
        }
        Err(crate::decider::RevertError::Request(e)) => refused(e),
        Err(crate::decider::RevertError::Rules(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// One scope's level as the page reads it (`system` empty: the global scope).
fn level_json(l: &crate::degradation::Level) -> Value {
    let s = &l.signals;
    json!({
        "system": &*l.system, "level": l.level, "manual": l.manual, "automatic": l.automatic, "reason": l.reason,
        "signals": {
            "calls": s.calls, "error_rate": s.error_rate, "slow_call_rate": s.slow_call_rate,
            "latency_ms": s.latency.map(|d| d.as_secs_f64() * 1000.0), "cpu": s.cpu, "memory": s.memory,
            "queue_delay_ms": s.queue_delay.map(|d| d.as_secs_f64() * 1000.0),
            "instances": s.instances, "in_flight": s.in_flight,
        },
    })
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map(|t| t.to_string()).unwrap_or_default()
}

/// An event as the page reads it.
fn event_json(e: &Event) -> Value {
    let at = rfc3339(SystemTime::now());
    match e {
        Event::Breaker { resource, transition: t, .. } => json!({
            "kind": "breaker", "at": at, "resource": resource,
            "from": t.from.name(), "to": t.to.name(), "reason": t.reason,
        }),
        Event::Degradation(c) => json!({
            "kind": "degradation", "at": at, "system": &*c.system, "from": c.from, "to": c.to,
            "manual": c.manual, "reason": c.reason,
        }),
        Event::Rules { version, source, .. } => {
            json!({ "kind": "rules", "at": at, "version": version, "source": source })
        }
        Event::RulesRefused { source, error } => {
            json!({ "kind": "rules_refused", "at": at, "source": source, "error": error })
        }
        Event::Overrides { version, set, deleted, expired } => json!({
            "kind": "overrides", "at": at, "version": version, "set": set.len(), "deleted": deleted.len(), "expired": expired.len(),
        }),
    }
}
