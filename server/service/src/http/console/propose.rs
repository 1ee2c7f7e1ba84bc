//! The console's proposals for limits with `history: true`, as
//! `Admin.ProposeLimit` makes them: `GET /api/v1/propose` shows one (read
//! role), and `POST /api/v1/propose/apply` makes it again and tries it in
//! shadow or puts it in force (admin role), when it is still the one the
//! operator saw (the same rules written, told by their fingerprint).

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::{HttpState, allow, allow_action, error, json_response, once, query_pairs, read_body, refused};
use crate::access::Role;
use crate::decider::{ProposeError, Proposed};
use crate::listen::Peer;
use floodgate_core::recommend::Settings;

/// What a proposal is asked for: the limit and the settings (each
/// defaulted as `Admin.ProposeLimit` defaults it).
struct Asked {
    resource: String,
    limit: String,
    settings: Settings,
}

/// A setting given as text (a query) or a JSON number.
fn setting(name: &str, value: Option<f64>, given: &str, into: &mut f64) -> Result<(), Box<Response>> {
    match value {
        Some(v) => {
            *into = v;
            Ok(())
        }
        None => {
            let shown: String = given.chars().take(32).collect();
            Err(Box::new(error(StatusCode::BAD_REQUEST, format!("{name}: '{}' is not a number", shown.escape_debug()))))
        }
    }
}

impl Asked {
    fn new() -> Asked {
        Asked { resource: String::new(), limit: String::new(), settings: Settings::default() }
    }

    fn set(&mut self, key: &str, text: &str, number: Option<f64>) -> Result<bool, Box<Response>> {
        match key {
            "resource" => self.resource = text.to_string(),
            "limit" => self.limit = text.to_string(),
            "quantile" => setting(key, number, text, &mut self.settings.quantile)?,
            "headroom" => setting(key, number, text, &mut self.settings.headroom)?,
            "max_decrease" => setting(key, number, text, &mut self.settings.max_decrease)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn check(&self) -> Result<(), Box<Response>> {
        for (name, value) in [("resource", &self.resource), ("limit", &self.limit)] {
            if value.is_empty() {
                return Err(Box::new(error(StatusCode::BAD_REQUEST, format!("{name}: required"))));
            }
        }
        Ok(())
    }
}

/// A proposal's refusal as the console answers it.
fn not_made(e: ProposeError) -> Response {
    let status = match &e {
        ProposeError::Request(_) => {
            let ProposeError::Request(e) = e else { unreachable!() };
            return refused(e);
        }
        ProposeError::Invalid(_) => StatusCode::BAD_REQUEST,
        ProposeError::Empty(_) | ProposeError::Unfit(_) | ProposeError::TooLarge(_) => StatusCode::CONFLICT,
        ProposeError::Busy => StatusCode::TOO_MANY_REQUESTS,
        ProposeError::Mixed => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

fn proposal_json(asked: &Asked, p: &Proposed) -> Value {
    let made = &p.made;
    let most_denied: Vec<Value> = made
        .replayed
        .iter()
        .filter(|r| r.denied > 0)
        .take(20)
        .map(|r| json!({ "key": r.key, "per_minute": r.limit, "calls": r.calls, "denied": r.denied }))
        .collect();
    json!({
        "resource": asked.resource,
        "limit": asked.limit,
        "settings": { "quantile": asked.settings.quantile, "headroom": asked.settings.headroom,
                      "max_decrease": asked.settings.max_decrease },
        "current": made.target.per_minute,
        "per_minute": made.proposal.per_minute,
        "observed": made.proposal.observed,
        "algorithm": match made.target.shape {
            floodgate_core::recommend::Shape::TokenBucket => "token_bucket",
            floodgate_core::recommend::Shape::FixedWindow => "fixed_window",
        },
        "overrides": made.proposal.overrides.iter().map(|(k, n)| json!({ "key": k, "per_minute": n })).collect::<Vec<_>>(),
        "kept": made.written.kept,
        "keys": made.proposal.keys,
        "from": made.from * 60,
        "to": made.to * 60,
        "replayed_calls": made.replayed.iter().map(|r| r.calls).sum::<u64>(),
        "replayed_denied": made.replayed.iter().map(|r| r.denied).sum::<u64>(),
        "most_denied": most_denied,
        "shared": p.shared,
        "rules_yaml": made.written.text,
        "fingerprint": fingerprint(&made.written.text),
    })
}

/// The fingerprint of a proposal's rules (FNV-1a, 64 bits): the apply
/// acts only on the proposal that was shown, limit and overrides alike.
fn fingerprint(text: &str) -> String {
    use floodgate_core::digest::{FNV_START, fnv1a};
    let hash = fnv1a(FNV_START, text.bytes());
    format!("{hash:016x}")
}

/// `GET /api/v1/propose?resource=R&limit=L[&quantile=Q&headroom=H&max_decrease=D]`.
pub(super) async fn show(State(s): State<HttpState>, req: Request) -> Response {
    if let Err(refused) = allow(&s, req.headers(), req.extensions().get::<Peer>(), Role::Read, "console propose") {
        return *refused;
    }
    let mut asked = Asked::new();
    let mut seen = Vec::new();
    for pair in query_pairs(req.uri().query().unwrap_or("")) {
        let (key, value) = match pair {
            Ok(p) => p,
            Err(refused) => return *refused,
        };
        if let Err(refused) = once(&mut seen, key) {
            return *refused;
        }
        let number = value.parse::<f64>().ok().filter(|v| v.is_finite());
        match asked.set(key, &value, number) {
            Ok(true) => {}
            Ok(false) => {
                let shown: String = key.chars().take(64).collect();
                let why = format!(
                    "'{}' is not a parameter (resource, limit, quantile, headroom, max_decrease)",
                    shown.escape_debug()
                );
                return error(StatusCode::BAD_REQUEST, why);
            }
            Err(refused) => return *refused,
        }
    }
    if let Err(refused) = asked.check() {
        return *refused;
    }
    match s.decider.views().propose_limit(&asked.resource, &asked.limit, asked.settings).await {
        Ok(p) => json_response(StatusCode::OK, proposal_json(&asked, &p)),
        Err(e) => not_made(e),
    }
}

const APPLY_KEYS: [&str; 7] =
    ["resource", "limit", "quantile", "headroom", "max_decrease", "fingerprint", "what_if_seconds"];

/// `POST /api/v1/propose/apply` `{"resource", "limit", "fingerprint": the
/// one shown, ["what_if_seconds": N], [settings]}`: the proposal made
/// again, refused when it is no longer the one shown (the traffic moved
/// on: another limit or other overrides), then tried in shadow for N
/// seconds or put in force, as `ApplyRules` would, with an audit line.
pub(super) async fn apply(State(s): State<HttpState>, req: Request) -> Response {
    let who = match allow_action(&s, &req, "console ProposeLimit apply") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let body = match read_body(req, &APPLY_KEYS).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut asked = Asked::new();
    let (mut expected, mut what_if) = (None, None);
    for (key, value) in body.as_object().into_iter().flatten() {
        let text = value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string());
        match key.as_str() {
            "fingerprint" => match value.as_str() {
                Some(f) => expected = Some(f.to_string()),
                None => return error(StatusCode::BAD_REQUEST, format!("fingerprint: {value} is not text")),
            },
            "what_if_seconds" => match value.as_u64().filter(|n| (1..=86_400).contains(n)) {
                Some(n) => what_if = Some(std::time::Duration::from_secs(n)),
                None => {
                    return error(StatusCode::BAD_REQUEST, format!("what_if_seconds: {value} is not 1 to 86400"));
                }
            },
            "resource" | "limit" if !value.is_string() => {
                return error(StatusCode::BAD_REQUEST, format!("{key}: {value} is not text"));
            }
            key => {
                if let Err(refused) = asked.set(key, &text, value.as_f64()) {
                    return *refused;
                }
            }
        }
    }
    if let Err(refused) = asked.check() {
        return *refused;
    }
    let Some(expected) = expected else {
        return error(StatusCode::BAD_REQUEST, "fingerprint: required (the proposal's, as shown)".to_string());
    };
    let proposed = match s.decider.views().propose_limit(&asked.resource, &asked.limit, asked.settings).await {
        Ok(p) => p,
        Err(e) => return not_made(e),
    };
    let now = proposed.made.proposal.per_minute;
    if fingerprint(&proposed.made.written.text) != expected {
        let overrides = proposed.made.proposal.overrides.len();
        let why = format!(
            "the proposal changed since it was shown (now {now} calls a minute and {overrides} overrides): look at it again"
        );
        return error(StatusCode::CONFLICT, why);
    }
    let yaml = &proposed.made.written.text;
    let (resource, limit) = (asked.resource.as_str(), asked.limit.as_str());
    let control = s.decider.control();
    if let Some(length) = what_if {
        return match control.start_what_if(yaml, length).await {
            Ok(started) => {
                let seconds = length.as_secs();
                tracing::info!(target: "floodgate::audit", who, change = "ApplyRules what_if (console proposal)", resource, limit, per_minute = now, seconds, "admin change");
                let until =
                    started.what_if_until.map(|t| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()));
                json_response(StatusCode::OK, json!({ "what_if_until": until, "per_minute": now }))
            }
            Err(e) => error(StatusCode::CONFLICT, e.to_string()),
        };
    }
    let before = s.decider.views().rules().version;
    match control.apply_rules(yaml, false).await {
        Ok(applied) => {
            let after = applied.version;
            tracing::info!(target: "floodgate::audit", who, change = "ApplyRules (console proposal)", resource, limit, per_minute = now, version_before = before, version_after = after, "admin change");
            json_response(StatusCode::OK, json!({ "version": after, "per_minute": now }))
        }
        Err(e) => error(StatusCode::CONFLICT, e.to_string()),
    }
}
