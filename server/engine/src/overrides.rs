//! Overrides set at run time through `Admin.SetOverrides`: "tenant acme gets
//! 10x for a day", "block this key for an hour", without touching the rules
//! file. Each is a [`Spec`] naming a rule (as written in the file), the
//! descriptor values it applies to and what it does; the [`Table`] of them is
//! merged into the rules file's rules at every install, before the file's
//! own overrides (more descriptor values first, then the older), so the
//! decision path reads them exactly like the file's.
//!
//! A spec whose rule, limit or tier the rules in force lack is kept, inactive,
//! and applies again when a reload brings them back. One that has ended
//! stops applying at its `expires_at` exactly (the decision compares) and is
//! removed within a second (`Decider::expire_overrides`).
//!
//! Where they are kept (Redis, `--overrides-file` or memory only) is the
//! Decider's business; this module only knows the JSON each is kept as.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::rules::overrides::{Action, NEVER, Override};
use crate::rules::{MAX_NAME_BYTES, RuleSet};

/// The longest id.
pub(crate) const MAX_ID_BYTES: usize = 128;
/// The longest reason.
pub(crate) const MAX_REASON_BYTES: usize = 256;
/// The most descriptor values one override names.
pub const MAX_WHEN: usize = 8;
/// The most overrides one call sets or deletes.
pub const MAX_PER_CALL: usize = 10_000;
/// How many overrides a server keeps, unless `--max-overrides` says.
pub const DEFAULT_MAX: usize = 250_000;
/// The shortest and longest time to live.
pub const MIN_TTL: Duration = Duration::from_secs(1);
pub const MAX_TTL: Duration = Duration::from_secs(366 * 86_400);
/// The longest `retry_after` a block gives.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(30 * 86_400);

/// One override set at run time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    pub id: String,
    /// The rule's name or pattern as written.
    pub rule: String,
    /// Descriptor values that must all be present, sorted by key.
    pub when: Vec<(String, String)>,
    pub action: Do,
    /// Nanoseconds since the Unix epoch; `None` until deleted.
    #[serde(default)]
    pub expires_at: Option<u64>,
    /// Nanoseconds since the Unix epoch.
    pub created_at: u64,
    #[serde(default)]
    pub created_by: String,
    #[serde(default)]
    pub reason: String,
}

/// What an override does (see [`Action`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Do {
    Block { retry_after_ms: u64 },
    Factor(f64),
    Limits(Vec<(String, u64)>),
    Tier(String),
}

/// A bad spec: the field (as the proto names it) and why.
pub type Invalid = (&'static str, String);

/// The overrides in force, by id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    by_id: BTreeMap<String, Spec>,
}

/// What changed between two tables, for Watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub set: Vec<String>,
    pub deleted: Vec<String>,
    pub expired: Vec<String>,
}

// === impl Spec ===

impl Spec {
    /// Checks what can be checked without the rules: names, sizes, ranges.
    pub fn check(&self) -> Result<(), Invalid> {
        check_id(&self.id)?;
        check_text("rule", &self.rule, MAX_NAME_BYTES, false)?;
        if self.when.is_empty() || self.when.len() > MAX_WHEN {
            return Err(("when", format!("must name 1 to {MAX_WHEN} descriptor values, got {}", self.when.len())));
        }
        for (k, v) in &self.when {
            check_text("when", k, MAX_NAME_BYTES, false)?;
            check_text("when", v, MAX_NAME_BYTES, true)?;
        }
        if self.when.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(("when", "names a descriptor key twice".into()));
        }
        check_text("reason", &self.reason, MAX_REASON_BYTES, true)?;
        match &self.action {
            Do::Block { retry_after_ms } => {
                let d = Duration::from_millis(*retry_after_ms);
                if d < Duration::from_secs(1) || d > MAX_RETRY_AFTER {
                    return Err(("block.retry_after", format!("must be 1s to 30d, got {d:?}")));
                }
            }
            Do::Limits(set) if set.len() > 64 => return Err(("limits", "names more than 64 limits".into())),
            Do::Limits(set) => {
                for (name, _) in set {
                    check_text("limits", name, MAX_NAME_BYTES, false)?;
                }
            }
            Do::Tier(name) => check_text("tier", name, MAX_NAME_BYTES, false)?,
            Do::Factor(_) => {}
        }
        Ok(())
    }

    /// Its override of `rules`' rule, or why it cannot apply to them.
    pub fn build(&self, rules: &RuleSet) -> Result<Override, Invalid> {
        let Some(rule) = rules.rules().iter().find(|r| r.name == self.rule) else {
            return Err(("rule", format!("no rule is named '{}' in the rules in force", self.rule.escape_debug())));
        };
        let o = Override::new(self.when.clone(), self.action(), &rule.limits, rules.tiers())?;
        // A tier's cost formula reads only usage the rule names: a call can
        // report no other field, and an unread field would charge 0.
        for l in &o.limits {
            let Some(formula) = &l.cost else { continue };
            if let Some(field) = formula.fields().find(|f| !rule.usage.iter().any(|u| u == f)) {
                let why = format!(
                    "limit '{}' reads usage field '{field}' in its cost, which rule '{}' does not name in its usage",
                    l.name, rule.name
                );
                return Err(("tier", why));
            }
        }
        Ok(o.until(self.expires_at.unwrap_or(NEVER)).tagged(format!("@{}", self.id)))
    }

    fn action(&self) -> Action {
        match &self.action {
            Do::Block { retry_after_ms } => Action::Block { retry_after: Duration::from_millis(*retry_after_ms) },
            Do::Factor(f) => Action::Factor(*f),
            Do::Limits(set) => Action::Limits(set.clone()),
            Do::Tier(t) => Action::Tier(t.clone()),
        }
    }

    /// Whether it has ended at `now` (nanoseconds since the epoch).
    pub fn ended(&self, now: u64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// As stored in Redis and in the overrides file.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a spec always serializes")
    }

    /// A stored spec, checked again: storage is not trusted more than a caller.
    pub fn from_json(text: &str) -> Result<Spec, String> {
        let spec: Spec = serde_json::from_str(text).map_err(|e| e.to_string())?;
        spec.check().map_err(|(field, why)| format!("{field}: {why}"))?;
        Ok(spec)
    }
}

fn check_id(id: &str) -> Result<(), Invalid> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(("id", format!("must be 1 to {MAX_ID_BYTES} bytes, got {}", id.len())));
    }
    if let Some(c) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))) {
        return Err(("id", format!("'{}' has '{}'; use A-Z a-z 0-9 . _ : -", id.escape_debug(), c.escape_debug())));
    }
    Ok(())
}

fn check_text(field: &'static str, text: &str, max: usize, empty_ok: bool) -> Result<(), Invalid> {
    if text.is_empty() && !empty_ok {
        return Err((field, "must not be empty".into()));
    }
    if text.len() > max {
        return Err((field, format!("is {} bytes long; the limit is {max}", text.len())));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err((field, format!("control character U+{:04X} is not allowed", c as u32)));
    }
    Ok(())
}

// === impl Table ===

impl Table {
    pub fn from_specs(specs: impl IntoIterator<Item = Spec>) -> Table {
        Table { by_id: specs.into_iter().map(|s| (s.id.clone(), s)).collect() }
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn get(&self, id: &str) -> Option<&Spec> {
        self.by_id.get(id)
    }

    /// Every spec, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Spec> {
        self.by_id.values()
    }

    /// Specs after the id `after` (all when empty), in id order.
    pub fn after<'a>(&'a self, after: &str) -> impl Iterator<Item = &'a Spec> + 'a {
        use std::ops::Bound;
        let start = if after.is_empty() { Bound::Unbounded } else { Bound::Excluded(after.to_string()) };
        self.by_id.range((start, Bound::Unbounded)).map(|(_, s)| s)
    }

    /// This table with `specs` set (replacing those with their ids).
    pub fn with(&self, specs: &[Spec]) -> Table {
        let mut next = self.clone();
        for s in specs {
            next.by_id.insert(s.id.clone(), s.clone());
        }
        next
    }

    /// This table without `ids`, and those of them it had.
    pub fn without(&self, ids: &[String]) -> (Table, Vec<String>) {
        let mut next = self.clone();
        let gone = ids.iter().filter(|id| next.by_id.remove(id.as_str()).is_some()).cloned().collect();
        (next, gone)
    }

    /// The specs that have ended at `now`.
    pub fn ended(&self, now: u64) -> Vec<&Spec> {
        self.by_id.values().filter(|s| s.ended(now)).collect()
    }

    /// `file`'s rules with these overrides first in each rule's list, and
    /// why those that cannot apply do not, by id.
    pub fn merge(&self, file: &RuleSet) -> (RuleSet, BTreeMap<String, String>) {
        let mut problems = BTreeMap::new();
        let mut by_rule: HashMap<&str, Vec<&Spec>> = HashMap::new();
        for s in self.by_id.values() {
            by_rule.entry(s.rule.as_str()).or_default().push(s);
        }
        let mut merged = file.clone();
        for rule in file.rules() {
            let Some(specs) = by_rule.remove(rule.name.as_str()) else { continue };
            let mut built: Vec<(&Spec, Override)> = Vec::with_capacity(specs.len());
            for s in specs {
                match s.build(file) {
                    Ok(o) => built.push((s, o)),
                    Err((field, why)) => {
                        problems.insert(s.id.clone(), format!("{field}: {why}"));
                    }
                }
            }
            built.sort_by(|(a, _), (b, _)| {
                b.when.len().cmp(&a.when.len()).then(a.created_at.cmp(&b.created_at)).then(a.id.cmp(&b.id))
            });
            let list = built.into_iter().map(|(_, o)| o).chain(rule.overrides.list().iter().cloned()).collect();
            merged.set_overrides(&rule.name, list);
        }
        for s in by_rule.into_values().flatten() {
            let why = format!("rule: no rule is named '{}' in the rules in force", s.rule.escape_debug());
            problems.insert(s.id.clone(), why);
        }
        (merged, problems)
    }

    /// What changed from `old` to `self`: ids new or different, and ids gone.
    pub fn diff(&self, old: &Table) -> (Vec<String>, Vec<String>) {
        let set = self.by_id.iter().filter(|(id, s)| old.by_id.get(*id) != Some(s)).map(|(id, _)| id.clone());
        let gone = old.by_id.keys().filter(|id| !self.by_id.contains_key(*id)).cloned();
        (set.collect(), gone.collect())
    }

    /// One JSON spec per line, as `--overrides-file` keeps them.
    pub fn to_lines(&self) -> String {
        let mut out = String::new();
        for s in self.by_id.values() {
            out.push_str(&s.to_json());
            out.push('\n');
        }
        out
    }

    /// Reads what [`Table::to_lines`] wrote; an error names the line.
    pub fn from_lines(text: &str) -> Result<Table, String> {
        let mut specs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            specs.push(Spec::from_json(line).map_err(|e| format!("line {}: {e}", i + 1))?);
        }
        Ok(Table::from_specs(specs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = r#"
tiers:
  gold:
    - { name: gold-rps, key: [tenant], algorithm: token_bucket, capacity: 1000, refill_per_second: 1000 }
  priced:
    - { name: tokens, key: [tenant], algorithm: token_bucket, capacity: 1000, refill_per_second: 10, cost: tokens * 2 }
resources:
  - name: api
    limits:
      - { name: per-tenant, key: [tenant], algorithm: token_bucket, capacity: 10, refill_per_second: 10 }
    overrides:
      - { when: { tenant: acme }, factor: 2 }
"#;

    fn spec(id: &str, when: &[(&str, &str)], action: Do, created_at: u64) -> Spec {
        Spec {
            id: id.into(),
            rule: "api".into(),
            when: when.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            action,
            expires_at: None,
            created_at,
            created_by: "test".into(),
            reason: String::new(),
        }
    }

    fn rules() -> RuleSet {
        RuleSet::from_yaml(RULES, "test").unwrap()
    }

    #[test]
    fn run_time_overrides_come_before_the_files_more_values_first_then_older() {
        let table = Table::from_specs([
            spec("b-older", &[("tenant", "acme")], Do::Factor(3.0), 1),
            spec("a-newer", &[("tenant", "acme")], Do::Factor(4.0), 2),
            spec("two-values", &[("tenant", "acme"), ("user", "u1")], Do::Tier("gold".into()), 3),
        ]);
        let (merged, problems) = table.merge(&rules());
        assert!(problems.is_empty(), "{problems:?}");
        let list = merged.rules()[0].overrides.list();
        let tags: Vec<&str> = list.iter().map(|o| o.tag.as_str()).collect();
        assert_eq!(tags, ["@two-values", "@b-older", "@a-newer", "#0"]);
        assert_eq!(list[1].limits[0].algorithm.capacity(), 30);
        assert_eq!(list[0].limits[0].name, "gold-rps");
        // The file's rules are untouched.
        assert_eq!(rules().rules()[0].overrides.len(), 1);
    }

    #[test]
    fn one_that_cannot_apply_is_kept_inactive_with_the_reason() {
        let table = Table::from_specs([
            Spec { rule: "gone".into(), ..spec("r", &[("tenant", "x")], Do::Factor(2.0), 1) },
            spec("t", &[("tenant", "x")], Do::Tier("platinum".into()), 1),
            spec("l", &[("tenant", "x")], Do::Limits(vec![("nope".into(), 5)]), 1),
            spec("ok", &[("tenant", "x")], Do::Limits(vec![("per-tenant".into(), 5)]), 1),
            spec("p", &[("tenant", "y")], Do::Tier("priced".into()), 1),
        ]);
        let (merged, problems) = table.merge(&rules());
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems["p"].contains("limit 'tokens' reads usage field 'tokens'"), "{problems:?}");
        assert!(problems["r"].contains("no rule is named 'gone'"), "{problems:?}");
        assert!(problems["t"].contains("'platinum' is not a tier"), "{problems:?}");
        assert!(problems["l"].contains("'nope' is not a limit"), "{problems:?}");
        assert_eq!(merged.rules()[0].overrides.len(), 2, "the valid one and the file's");
    }

    #[test]
    fn check_names_the_field_and_the_value() {
        let bad = |s: Spec| s.check().unwrap_err();
        let ok = spec("ok", &[("tenant", "x")], Do::Factor(2.0), 1);
        assert!(ok.check().is_ok());
        assert_eq!(bad(Spec { id: "has space".into(), ..ok.clone() }).0, "id");
        assert!(bad(Spec { id: "has space".into(), ..ok.clone() }).1.contains("'has space'"));
        assert_eq!(bad(Spec { id: String::new(), ..ok.clone() }).0, "id");
        assert_eq!(bad(Spec { when: Vec::new(), ..ok.clone() }).0, "when");
        assert_eq!(bad(Spec { when: vec![("k".into(), "a\nb".into())], ..ok.clone() }).0, "when");
        assert_eq!(bad(Spec { rule: String::new(), ..ok.clone() }).0, "rule");
        assert_eq!(bad(Spec { reason: "x".repeat(300), ..ok.clone() }).0, "reason");
        assert_eq!(bad(Spec { action: Do::Block { retry_after_ms: 10 }, ..ok.clone() }).0, "block.retry_after");
    }

    #[test]
    fn the_file_format_round_trips_and_an_error_names_the_line() {
        let mut s = spec("x", &[("tenant", "x")], Do::Block { retry_after_ms: 60_000 }, 5);
        s.expires_at = Some(99);
        let table = Table::from_specs([s, spec("y", &[("k", "v")], Do::Factor(0.5), 6)]);
        assert_eq!(Table::from_lines(&table.to_lines()).unwrap(), table);
        let err = Table::from_lines(&format!("{}{{\"id\":\"bad id\"}}\n", table.to_lines())).unwrap_err();
        assert!(err.starts_with("line 3:"), "{err}");
    }

    #[test]
    fn diff_sees_set_changed_and_gone() {
        let a = Table::from_specs([
            spec("x", &[("k", "v")], Do::Factor(2.0), 1),
            spec("y", &[("k", "w")], Do::Factor(2.0), 1),
        ]);
        let b = a.with(&[spec("x", &[("k", "v")], Do::Factor(3.0), 1), spec("z", &[("k", "z")], Do::Factor(2.0), 1)]);
        let (b, gone) = b.without(&["y".into(), "nope".into()]);
        assert_eq!(gone, ["y"]);
        assert_eq!(b.diff(&a), (vec!["x".into(), "z".into()], vec!["y".into()]));
    }
}
