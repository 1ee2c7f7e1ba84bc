//! Overrides set at run time: `floodgate.v1.Override` <-> [`Spec`].

use std::time::Duration;

use floodgate_proto::v1 as pb;
use pb::r#override::Action as PbAction;

use super::{duration, from_duration, instant};
use crate::decider::NewOverride;
use crate::engine::RequestError;
use crate::overrides::{Do, MAX_TTL, MIN_TTL, Spec};
use crate::time::Timestamp;

fn bad(field: &'static str, message: impl Into<String>) -> RequestError {
    RequestError::BadOverride { field, message: message.into() }
}

/// One override of a `SetOverridesRequest`, checked for its shape; the rest
/// is checked against the rules by the Decider.
pub(crate) fn new_override(o: &pb::Override) -> Result<NewOverride, RequestError> {
    let action = match &o.action {
        None => return Err(bad("action", "needs exactly one of block, factor, limits or tier")),
        Some(PbAction::Block(b)) => {
            let retry_after = match &b.retry_after {
                None => Duration::from_secs(60),
                Some(d) => from_duration(d).ok_or_else(|| {
                    bad("block.retry_after", format!("{}s {}ns is not a duration", d.seconds, d.nanos))
                })?,
            };
            Do::Block { retry_after_ms: u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX) }
        }
        Some(PbAction::Factor(f)) => Do::Factor(*f),
        Some(PbAction::Limits(l)) => {
            let mut set: Vec<(String, u64)> = l.values.iter().map(|(k, v)| (k.clone(), *v)).collect();
            set.sort();
            Do::Limits(set)
        }
        Some(PbAction::Tier(t)) => Do::Tier(t.clone()),
    };
    let ttl = match &o.ttl {
        None => None,
        Some(d) => match from_duration(d) {
            Some(t) if (MIN_TTL..=MAX_TTL).contains(&t) => Some(t),
            _ => return Err(bad("ttl", format!("{}s {}ns is not between 1s and 366d", d.seconds, d.nanos))),
        },
    };
    let mut when: Vec<(String, String)> = o.when.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    when.sort();
    let spec = Spec {
        id: o.id.clone(),
        rule: o.rule.clone(),
        when,
        action,
        expires_at: None,
        created_at: 0,
        created_by: String::new(),
        reason: o.reason.clone(),
    };
    Ok(NewOverride { spec, ttl })
}

/// A spec for an answer, with why it does not apply when it does not.
pub(crate) fn to_pb(spec: &Spec, problem: Option<String>) -> pb::Override {
    let action = match &spec.action {
        Do::Block { retry_after_ms } => {
            PbAction::Block(pb::Block { retry_after: duration(Duration::from_millis(*retry_after_ms)) })
        }
        Do::Factor(f) => PbAction::Factor(*f),
        Do::Limits(set) => PbAction::Limits(pb::LimitValues { values: set.iter().cloned().collect() }),
        Do::Tier(t) => PbAction::Tier(t.clone()),
    };
    pb::Override {
        id: spec.id.clone(),
        rule: spec.rule.clone(),
        when: spec.when.iter().cloned().collect(),
        action: Some(action),
        ttl: None,
        expires_at: spec.expires_at.map(|n| instant(Timestamp::from_nanos(n))),
        reason: spec.reason.clone(),
        created_by: spec.created_by.clone(),
        created_at: Some(instant(Timestamp::from_nanos(spec.created_at))),
        active: problem.is_none(),
        problem: problem.unwrap_or_default(),
    }
}
