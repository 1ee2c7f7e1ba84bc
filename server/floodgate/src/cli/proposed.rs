//! `floodgate recommend --rules FILE --limit RESOURCE/LIMIT`: the limit a
//! proposal is for, read from a rules file, and the rules file with the
//! proposal written into it (`--write`), ready to try in shadow
//! (`floodgate rules what-if`), apply and revert.

use floodgate_core::limiter::Algorithm;
use floodgate_core::recommend::{self, Proposal, Shape};
use serde_yaml_ng::{Mapping, Value};

use crate::rules::RuleSet;

/// The limit a proposal is for, as the rules file has it.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub resource: String,
    pub limit: String,
    /// The limiter the proposal is replayed with and written as.
    pub shape: Shape,
    /// The limit in force, in calls a minute.
    pub per_minute: u64,
    /// The descriptor names of the limit's key, in the file's order.
    pub key: Vec<String>,
}

/// Finds `RESOURCE/LIMIT` (split at the last `/`, since a resource name may
/// hold one) in `rules`, refused when the limit is marked `fixed` or is not
/// a limit a minute that recommend can replay.
pub fn find(rules: &RuleSet, name: &str) -> Result<Target, String> {
    let (resource, limit) =
        name.rsplit_once('/').ok_or_else(|| format!("--limit: '{name}' is not written RESOURCE/LIMIT"))?;
    let rule = rules
        .rules()
        .iter()
        .find(|r| r.name == resource)
        .ok_or_else(|| format!("--limit: the rules have no resource named '{resource}'"))?;
    let l = rule
        .limits
        .iter()
        .find(|l| l.name == limit && l.source == 0)
        .ok_or_else(|| format!("--limit: resource '{resource}' has no limit named '{limit}'"))?;
    if l.fixed {
        return Err(format!(
            "'{resource}/{limit}' is marked fixed: its numbers are chosen by people, and recommend proposes no change to it"
        ));
    }
    let (shape, per_minute) = match &l.algorithm {
        Algorithm::TokenBucket(c) => (Shape::TokenBucket, (c.refill.as_f64() * 60.0).round().max(1.0) as u64),
        Algorithm::FixedWindow(c) if c.window == 60_000_000_000 && c.calendar.is_none() => {
            (Shape::FixedWindow, c.limit.max(1))
        }
        Algorithm::FixedWindow(_) => {
            return Err(format!(
                "'{resource}/{limit}' is a fixed window of another length than 1m: recommend proposes limits a minute"
            ));
        }
        other => {
            return Err(format!(
                "'{resource}/{limit}' is a {} limit: recommend replays and writes token_bucket and fixed_window (1m) limits",
                other.name()
            ));
        }
    };
    Ok(Target { resource: resource.into(), limit: limit.into(), shape, per_minute, key: l.key.clone() })
}

/// `text` (the rules file `target` was found in) with the proposal written
/// in: the limit's numbers, and for each heavier key an override of the
/// limit (an override with the same `when` that sets limits gets this one
/// added or replaced; otherwise one is appended). Checked like any rules
/// file before it is returned. Comments of the original are not kept.
pub fn write(text: &str, target: &Target, proposal: &Proposal) -> Result<String, String> {
    let mut doc: Value = serde_yaml_ng::from_str(text).map_err(|e| format!("the rules file: {e}"))?;
    let resource = doc
        .get_mut("resources")
        .and_then(Value::as_sequence_mut)
        .and_then(|rs| rs.iter_mut().find(|r| r.get("name").and_then(Value::as_str) == Some(&target.resource)))
        .and_then(Value::as_mapping_mut)
        .ok_or_else(|| format!("the rules file has no resource named '{}'", target.resource))?;
    let limit = resource
        .get_mut("limits")
        .and_then(Value::as_sequence_mut)
        .and_then(|ls| ls.iter_mut().find(|l| l.get("name").and_then(Value::as_str) == Some(&target.limit)))
        .and_then(Value::as_mapping_mut)
        .ok_or_else(|| format!("resource '{}' has no limit named '{}'", target.resource, target.limit))?;
    let n = proposal.per_minute;
    match target.shape {
        Shape::TokenBucket => {
            limit.insert("capacity".into(), n.into());
            limit.insert("refill_per_second".into(), recommend::refill_per_second(n).into());
        }
        Shape::FixedWindow => {
            limit.insert("limit".into(), n.into());
        }
    }
    if !proposal.overrides.is_empty() {
        let overrides = resource.entry("overrides".into()).or_insert_with(|| Value::Sequence(Vec::new()));
        let overrides = overrides.as_sequence_mut().ok_or("the resource's overrides are not a list")?;
        for (key, value) in &proposal.overrides {
            let when = when_of(key, &target.key)?;
            let same = overrides.iter_mut().find(|o| {
                o.get("when").and_then(Value::as_mapping) == Some(&when)
                    && o.get("limits").is_some_and(Value::is_mapping)
            });
            match same.and_then(|o| o.get_mut("limits")).and_then(Value::as_mapping_mut) {
                Some(limits) => {
                    limits.insert(target.limit.clone().into(), (*value).into());
                }
                None => {
                    let mut limits = Mapping::new();
                    limits.insert(target.limit.clone().into(), (*value).into());
                    let mut o = Mapping::new();
                    o.insert("when".into(), Value::Mapping(when));
                    o.insert("limits".into(), Value::Mapping(limits));
                    overrides.push(Value::Mapping(o));
                }
            }
        }
    }
    let out = serde_yaml_ng::to_string(&doc).map_err(|e| format!("writing the rules: {e}"))?;
    RuleSet::from_yaml(&out, "the proposed rules").map_err(|e| e.to_string())?;
    Ok(out)
}

/// A recorded key (`name=value[,name=value...]`) as an override's `when`,
/// refused unless it names exactly the limit's key.
fn when_of(key: &str, names: &[String]) -> Result<Mapping, String> {
    let mut when = Mapping::new();
    for pair in key.split(',') {
        let (name, value) = pair.split_once('=').ok_or_else(|| format!("key '{key}' is not written name=value"))?;
        when.insert(name.into(), value.into());
    }
    let named: std::collections::BTreeSet<&str> = when.keys().filter_map(Value::as_str).collect();
    let wanted: std::collections::BTreeSet<&str> = names.iter().map(String::as_str).collect();
    if named != wanted || when.len() != names.len() {
        return Err(format!("key '{}' does not name the limit's key [{}]", key.escape_debug(), names.join(", ")));
    }
    Ok(when)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = r#"
resources:
  - name: api
    limits:
      - { name: per-tenant, key: [tenant], algorithm: token_bucket, capacity: 200, refill_per_second: 2 }
      - { name: hard, key: [tenant], algorithm: fixed_window, limit: 900, window: 1m, fixed: true }
      - { name: hourly, key: [tenant], algorithm: fixed_window, limit: 900, window: 1h }
    overrides:
      - { when: { tenant: acme }, limits: { hard: 5000 } }
  - name: other
    limits: [ { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 60, window: 1m } ]
"#;

    fn proposal(per_minute: u64, overrides: &[(&str, u64)]) -> Proposal {
        Proposal {
            per_minute,
            observed: per_minute,
            overrides: overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            keys: 10,
        }
    }

    #[test]
    fn the_limit_is_found_with_its_figures_and_fixed_or_other_limits_are_refused() {
        let rules = RuleSet::from_yaml(RULES, "t").unwrap();
        let t = find(&rules, "api/per-tenant").unwrap();
        assert_eq!((t.shape, t.per_minute, t.key.clone()), (Shape::TokenBucket, 120, vec!["tenant".to_string()]));
        assert_eq!(find(&rules, "other/per-tenant").unwrap().per_minute, 60);
        for (name, why) in [
            ("api/hard", "is marked fixed"),
            ("api/hourly", "another length than 1m"),
            ("api/nope", "has no limit named 'nope'"),
            ("nope/per-tenant", "no resource named 'nope'"),
            ("api", "is not written RESOURCE/LIMIT"),
        ] {
            let err = find(&rules, name).unwrap_err();
            assert!(err.contains(why), "{name}: {err}");
        }
    }

    #[test]
    fn the_proposal_is_written_into_the_file_and_the_rest_is_kept() {
        let rules = RuleSet::from_yaml(RULES, "t").unwrap();
        let t = find(&rules, "api/per-tenant").unwrap();
        let out = write(RULES, &t, &proposal(90, &[("tenant=acme", 700), ("tenant=0x10", 400)])).unwrap();
        let new = RuleSet::from_yaml(&out, "out").unwrap();
        let api = &new.rules()[0];
        let Algorithm::TokenBucket(c) = &api.limits[0].algorithm else { panic!("{out}") };
        assert_eq!((c.capacity, c.refill.as_f64()), (90, 1.5));
        // The other limits are as they were, the fixed one still marked.
        assert!(api.limits[1].fixed);
        assert_eq!(api.limits[2], rules.rules()[0].limits[2]);
        assert_eq!(new.rules()[1], rules.rules()[1]);
        // acme's override gains the limit beside the one it had; the key
        // that reads like a number stays text.
        let doc: Value = serde_yaml_ng::from_str(&out).unwrap();
        let overrides = doc["resources"][0]["overrides"].as_sequence().unwrap();
        assert_eq!(overrides.len(), 2, "{out}");
        assert_eq!(overrides[0]["limits"]["hard"], Value::from(5000));
        assert_eq!(overrides[0]["limits"]["per-tenant"], Value::from(700));
        assert_eq!(overrides[1]["when"]["tenant"], Value::from("0x10"));
        assert_eq!(overrides[1]["limits"]["per-tenant"], Value::from(400));
        // Written again with the same proposal: the same file.
        let t = find(&new, "api/per-tenant").unwrap();
        assert_eq!(write(&out, &t, &proposal(90, &[("tenant=acme", 700), ("tenant=0x10", 400)])).unwrap(), out);
    }

    #[test]
    fn keys_that_do_not_name_the_limits_key_are_refused() {
        let rules = RuleSet::from_yaml(RULES, "t").unwrap();
        let t = find(&rules, "api/per-tenant").unwrap();
        for key in ["user=ann", "tenant=a,user=b", "tenant"] {
            let err = write(RULES, &t, &proposal(90, &[(key, 700)])).unwrap_err();
            assert!(err.contains(key), "{key}: {err}");
        }
    }
}
