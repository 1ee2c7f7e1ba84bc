//! A proposal for one limit of a rules file (`floodgate recommend --limit
//! RESOURCE/LIMIT`, and the Admin call `ProposeLimit`): the limit it is
//! for, read from the rules, and the rules file with the proposal written
//! into it, ready to try in shadow (what-if), apply and revert.

use floodgate_core::limiter::Algorithm;
use floodgate_core::recommend::{self, History, KeyReplay, Proposal, Settings, Shape};
use serde_yaml_ng::{Mapping, Value};

use crate::RuleSet;

/// The limit a proposal is for, as the rules file has it.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub resource: String,
    pub limit: String,
    /// The limiter the proposal is replayed with and written as.
    pub shape: Shape,
    /// The limit in force, in calls a minute.
    pub per_minute: u64,
    /// A token bucket's capacity (its burst), which the proposal replaces
    /// with the limit a minute.
    pub capacity: Option<u64>,
    /// The descriptor names of the limit's key, in the file's order.
    pub key: Vec<String>,
}

/// Finds `RESOURCE/LIMIT` in `rules` (both names may hold a `/`: the first
/// split that names a limit of a resource wins), refused when recommend
/// cannot propose for it: a pattern rule, no key, a cost formula, `fixed`,
/// or not a limit a minute that recommend can replay.
pub fn find(rules: &RuleSet, name: &str) -> Result<Target, String> {
    // Both a resource and a limit name may hold a '/': the first split
    // that names a limit of a resource wins.
    let splits: Vec<(&str, &str)> = name.match_indices('/').map(|(i, _)| (&name[..i], &name[i + 1..])).collect();
    if splits.is_empty() {
        return Err(format!("--limit: '{name}' is not written RESOURCE/LIMIT"));
    }
    let found = splits.iter().find_map(|&(resource, limit)| {
        let rule = rules.rules().iter().find(|r| r.name == resource)?;
        Some((rule, rule.limits.iter().find(|l| l.name == limit && l.source == 0)?, resource, limit))
    });
    let Some((rule, l, resource, limit)) = found else {
        return match splits.iter().find(|(resource, _)| rules.rules().iter().any(|r| r.name == *resource)) {
            Some((resource, limit)) => Err(format!("--limit: resource '{resource}' has no limit named '{limit}'")),
            None => Err(format!("--limit: the rules have no resource named '{}'", splits[0].0)),
        };
    };
    if rule.pattern != crate::Pattern::Exact {
        return Err(format!(
            "'{resource}' is a pattern, not one resource: recommend writes the limits of rules that name one resource"
        ));
    }
    if l.key.is_empty() {
        return Err(format!(
            "'{resource}/{limit}' has no key: recommend proposes limits for each key (a tenant, a user), and this limit is one bucket for all"
        ));
    }
    if l.cost.is_some() {
        return Err(format!(
            "'{resource}/{limit}' takes its cost from a formula: recommend counts calls, and this limit counts units"
        ));
    }
    if l.fixed {
        return Err(format!(
            "'{resource}/{limit}' is marked fixed: its numbers are chosen by people, and recommend proposes no change to it"
        ));
    }
    let (shape, per_minute, capacity) = match &l.algorithm {
        Algorithm::TokenBucket(c) => {
            (Shape::TokenBucket, (c.refill.as_f64() * 60.0).round().max(1.0) as u64, Some(c.capacity))
        }
        Algorithm::FixedWindow(c) if c.window == 60_000_000_000 && c.calendar.is_none() => {
            (Shape::FixedWindow, c.limit.max(1), None)
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
    Ok(Target { resource: resource.into(), limit: limit.into(), shape, per_minute, capacity, key: l.key.clone() })
}

/// `text` (the rules file `target` was found in) with the proposal written
/// in: the limit's numbers, and for each heavier key an override of the
/// limit, appended, unless an override of the file already matches that
/// key's calls (it is left alone, and the key listed in `kept`). Checked
/// like any rules file before it is returned. Comments of the original are
/// not kept.
pub fn write(text: &str, target: &Target, proposal: &Proposal) -> Result<Written, String> {
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
    let mut kept = Vec::new();
    if !proposal.overrides.is_empty() {
        let overrides = resource.entry("overrides".into()).or_insert_with(|| Value::Sequence(Vec::new()));
        let overrides = overrides.as_sequence_mut().ok_or("the resource's overrides are not a list")?;
        for (key, value) in &proposal.overrides {
            let when = when_of(key, &target.key)?;
            // An override the operator wrote that matches this key's calls
            // decides them first (a block, a tier, a factor, other limits):
            // it is theirs, and is left as it is.
            let operators = overrides.iter().any(|o| {
                o.get("when")
                    .and_then(Value::as_mapping)
                    .is_some_and(|w| !w.is_empty() && w.iter().all(|(k, v)| when.get(k) == Some(v)))
            });
            if operators {
                kept.push(key.clone());
                continue;
            }
            let mut limits = Mapping::new();
            limits.insert(target.limit.clone().into(), (*value).into());
            let mut o = Mapping::new();
            o.insert("when".into(), Value::Mapping(when));
            o.insert("limits".into(), Value::Mapping(limits));
            overrides.push(Value::Mapping(o));
        }
    }
    let out = serde_yaml_ng::to_string(&doc).map_err(|e| format!("writing the rules: {e}"))?;
    RuleSet::from_yaml(&out, "the proposed rules").map_err(|e| e.to_string())?;
    Ok(Written { text: out, kept })
}

/// A proposal for a limit of the rules in force, from the traffic a server
/// recorded for it.
#[derive(Debug)]
pub struct FromRecord {
    pub target: Target,
    pub proposal: Proposal,
    /// The minutes the record spans (Unix minutes, `to` excluded): from its
    /// first day to the end of its last.
    pub from: u64,
    pub to: u64,
    /// The replay of each key's busiest minute of each day against the
    /// proposal, heaviest keys first.
    pub replayed: Vec<KeyReplay>,
    /// The rules file with the proposal in it.
    pub written: Written,
}

/// Why a proposal from a record could not be made.
#[derive(Debug, PartialEq, Eq)]
pub enum NoProposal {
    /// The limit is not one recommend proposes for, or the settings are
    /// out of range.
    Refused(String),
    /// The record holds no call yet.
    Empty,
    /// The record or the rules do not fit the limit.
    Unfit(String),
}

/// Proposes new numbers for `name` (RESOURCE/LIMIT) of `rules` (read from
/// `yaml`), from `history`: each key's busiest minute of each day, as
/// [`crate::proposed`]'s callers read it from a server's record. The limit
/// in force is the guard rail's starting point.
pub fn from_record(
    rules: &RuleSet,
    yaml: &str,
    name: &str,
    history: &History,
    settings: &Settings,
) -> Result<FromRecord, NoProposal> {
    settings.validate().map_err(NoProposal::Refused)?;
    let target = find(rules, name).map_err(NoProposal::Refused)?;
    let (first, last) = history.span().ok_or(NoProposal::Empty)?;
    check_keys(history.key_names(), &target).map_err(NoProposal::Unfit)?;
    // A recorded day is kept as its first minute.
    let (from, to) = (first, last + recommend::DAY);
    let current =
        Proposal { per_minute: target.per_minute, observed: target.per_minute, overrides: Default::default(), keys: 0 };
    let proposal = recommend::propose(history, from, to, settings, Some(&current));
    let written = write(yaml, &target, &proposal).map_err(NoProposal::Unfit)?;
    let replayed = recommend::replay(history, from, to, &proposal, target.shape);
    Ok(FromRecord { target, proposal, from, to, replayed, written })
}

/// The rules file with a proposal in it.
#[derive(Debug)]
pub struct Written {
    pub text: String,
    /// Heavier keys left without a new override, because one the rules
    /// file has already decides their calls.
    pub kept: Vec<String>,
}

/// Refuses a trace whose keys do not name the limit's key (every one is
/// checked, not only those that get overrides).
pub fn check_keys<'a>(keys: impl Iterator<Item = &'a str>, target: &Target) -> Result<(), String> {
    for key in keys {
        when_of(key, &target.key)?;
    }
    Ok(())
}

/// A recorded key (`name=value[,name=value...]`) as an override's `when`,
/// refused unless it names exactly the limit's key.
fn when_of(key: &str, names: &[String]) -> Result<Mapping, String> {
    // Parsed as the printed rules snippet parses it: name=value pairs, each
    // name once.
    let when: Mapping = pairs(key)?.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
    let named: std::collections::BTreeSet<&str> = when.keys().filter_map(Value::as_str).collect();
    let wanted: std::collections::BTreeSet<&str> = names.iter().map(String::as_str).collect();
    if named != wanted || when.len() != names.len() {
        return Err(format!("key '{}' does not name the limit's key [{}]", key.escape_debug(), names.join(", ")));
    }
    Ok(when)
}

/// A key as text for a terminal: control characters (which could move the
/// cursor or change colours) escaped.
pub fn shown(key: &str) -> std::borrow::Cow<'_, str> {
    if key.chars().any(char::is_control) { key.escape_debug().to_string().into() } else { key.into() }
}

/// A key written `name=value[,name=value...]` as its pairs.
pub fn pairs(key: &str) -> Result<Vec<(String, String)>, String> {
    let bad = || format!("key '{}' is not written name=value[,name=value...]", shown(key));
    let mut pairs: Vec<(String, String)> = Vec::new();
    let (mut name, mut part, mut in_value) = (String::new(), String::new(), false);
    let mut chars = key.chars();
    loop {
        match chars.next() {
            // The server writes ',', '=' and '\' of a name or value with a
            // backslash before them (`tenant=a\,b`); the value is `a,b`.
            Some('\\') => part.push(chars.next().ok_or_else(bad)?),
            Some('=') if !in_value => {
                name = std::mem::take(&mut part);
                in_value = true;
            }
            c @ (Some(',') | None) => {
                if !in_value || name.is_empty() {
                    return Err(bad());
                }
                pairs.push((std::mem::take(&mut name), std::mem::take(&mut part)));
                in_value = false;
                if c.is_none() {
                    break;
                }
            }
            Some(c) => part.push(c),
        }
    }
    let mut names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    match names.windows(2).find(|w| w[0] == w[1]) {
        Some(twice) => Err(format!("key '{}' names '{}' twice", shown(key), shown(twice[0]))),
        None => Ok(pairs),
    }
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
        let slashed = RuleSet::from_yaml(
            "resources:\n  - name: 'a/b'\n    limits: [ { name: 'c/d', key: [t], algorithm: fixed_window, limit: 5, window: 1m } ]\n  - name: 'x.*'\n    limits: [ { name: l, key: [t], algorithm: fixed_window, limit: 5, window: 1m } ]\n",
            "t",
        )
        .unwrap();
        let t = find(&slashed, "a/b/c/d").unwrap();
        assert_eq!((t.resource.as_str(), t.limit.as_str()), ("a/b", "c/d"));
        assert!(find(&slashed, "x.*/l").unwrap_err().contains("is a pattern"));
        assert!(find(&slashed, "a/b/nope").unwrap_err().contains("resource 'a/b' has no limit named 'nope'"));
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
        let written = write(RULES, &t, &proposal(90, &[("tenant=acme", 700), ("tenant=0x10", 400)])).unwrap();
        assert_eq!(written.kept, ["tenant=acme"], "acme has an override of the operator's");
        let out = written.text;
        let new = RuleSet::from_yaml(&out, "out").unwrap();
        let api = &new.rules()[0];
        let Algorithm::TokenBucket(c) = &api.limits[0].algorithm else { panic!("{out}") };
        assert_eq!((c.capacity, c.refill.as_f64()), (90, 1.5));
        // The other limits are as they were, the fixed one still marked.
        assert!(api.limits[1].fixed);
        assert_eq!(api.limits[2], rules.rules()[0].limits[2]);
        assert_eq!(new.rules()[1], rules.rules()[1]);
        // acme's override is the operator's and stays as it was; the key
        // that reads like a number stays text.
        let doc: Value = serde_yaml_ng::from_str(&out).unwrap();
        let overrides = doc["resources"][0]["overrides"].as_sequence().unwrap();
        assert_eq!(overrides.len(), 2, "{out}");
        assert_eq!(overrides[0]["limits"]["hard"], Value::from(5000));
        assert_eq!(overrides[0]["limits"].as_mapping().unwrap().len(), 1);
        assert_eq!(overrides[1]["when"]["tenant"], Value::from("0x10"));
        assert_eq!(overrides[1]["limits"]["per-tenant"], Value::from(400));
        // Written again with the same proposal: the same file, 0x10's
        // override now the file's own.
        let t = find(&new, "api/per-tenant").unwrap();
        let again = write(&out, &t, &proposal(90, &[("tenant=acme", 700), ("tenant=0x10", 400)])).unwrap();
        assert_eq!((again.text, again.kept.len()), (out, 2));
    }

    #[test]
    fn a_recorded_keys_escaped_commas_and_equals_signs_are_its_values() {
        // As the server records them: ',', '=' and '\\' escaped.
        let got = pairs(r"tenant=x\=y heavy,user=a\,b\\c").unwrap();
        assert_eq!(got, [("tenant".to_string(), "x=y heavy".to_string()), ("user".into(), r"a,b\c".into())]);
        assert!(pairs(r"tenant=a\").is_err(), "a lone backslash at the end");
        // The override written for such a key matches the value the caller sent.
        let rules = RuleSet::from_yaml(RULES, "t").unwrap();
        let t = find(&rules, "api/per-tenant").unwrap();
        let written = write(RULES, &t, &proposal(90, &[(r"tenant=x\=y\,z", 400)])).unwrap();
        let doc: Value = serde_yaml_ng::from_str(&written.text).unwrap();
        let overrides = doc["resources"][0]["overrides"].as_sequence().unwrap();
        assert_eq!(overrides[1]["when"]["tenant"], Value::from("x=y,z"), "{}", written.text);
    }

    #[test]
    fn keys_that_do_not_name_the_limits_key_are_refused() {
        let rules = RuleSet::from_yaml(RULES, "t").unwrap();
        let t = find(&rules, "api/per-tenant").unwrap();
        for key in ["user=ann", "tenant=a,user=b", "tenant", "tenant=a,tenant=b"] {
            let err = write(RULES, &t, &proposal(90, &[(key, 700)])).unwrap_err();
            assert!(err.contains(key), "{key}: {err}");
        }
    }
}
