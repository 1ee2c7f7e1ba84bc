//! Alibaba Sentinel's rules, as its dashboard and data sources keep them: a
//! directory of JSON files, one list of rules per file, the rule type told by
//! the file's name (`flow-rules.json`, `{app}-param-rules`, `DegradeRule.json`,
//! ...). Each rule becomes what Floodgate's rules say the same with, on the
//! resource of the same name (see `translate`):
//!
//! | Sentinel | Floodgate |
//! |---|---|
//! | flow, QPS, reject | a `sliding_window` limit of `count` a second |
//! | flow, QPS, warm up (+ rate limiter) | a `warm_up` limit (`mode: shape`) |
//! | flow, QPS, rate limiter | a `leaky_bucket` limit, `mode: shape` |
//! | flow, thread count | the resource's `concurrency` |
//! | `limitApp`, `strategy: chain` | the limit's `when` / `unless` on the origin and context descriptors |
//! | degrade | the resource's breaker (tumbling window, one probe) |
//! | system | a system named `sentinel` (cpu, latency) |
//! | hot parameter | limits keyed by `param0`, `param1`... and per-value limits |
//! | authority | the resource's `origins` |
//!
//! A rule Sentinel itself would refuse is refused, naming the file, the rule
//! and the field: the directory is refused whole, and the rules in force keep
//! deciding. A valid rule Floodgate cannot enforce (a `relate` strategy, a
//! regex resource, a system rule on QPS) is listed in `ignored`, never
//! dropped silently.

use std::collections::BTreeMap;
use std::path::Path;

use super::fields::{RuleError, RuleErrors};
use super::{Rule, SystemConfig};

mod read;
mod translate;

/// The most files a directory may hold.
pub const MAX_FILES: usize = 64;
/// The largest file, in bytes.
pub const MAX_FILE_BYTES: usize = 4 << 20;
/// The most bytes of every file together.
pub(crate) const MAX_TOTAL_BYTES: usize = 16 << 20;
/// The most rules of every file together.
pub(crate) const MAX_RULES: usize = 50_000;
/// Errors reported at most: past them, one line says how many more.
pub(crate) const MAX_ERRORS: usize = 100;

/// How Sentinel's notions meet requests: the descriptors that carry the
/// caller's origin, the entrance context and each hot parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelOptions {
    /// The descriptor holding the caller's origin (`limitApp`, authority).
    pub origin_key: String,
    /// The descriptor holding the entrance context (`strategy: chain`).
    pub context_key: String,
    /// Hot parameter `i` is the descriptor `{param_prefix}{i}`.
    pub param_prefix: String,
    /// Sentinel's `csp.sentinel.flow.cold.factor`.
    pub cold_factor: u32,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        SentinelOptions {
            origin_key: "origin".into(),
            context_key: "context".into(),
            param_prefix: "param".into(),
            cold_factor: 3,
        }
    }
}

/// The kind of rules a file holds, by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Flow,
    Degrade,
    System,
    Param,
    Authority,
    /// Gateway rules (`gw-flow`, `gw-api-group`): another schema, not read.
    Gateway,
}

/// Whether a file name is an editor's backup or a package manager's
/// leftover: `name~`, `#name#`, `.bak`, `.orig`, `.swp`...
fn is_backup(name: &str) -> bool {
    const SUFFIXES: [&str; 13] = [
        ".bak",
        ".orig",
        ".rej",
        ".old",
        ".swp",
        ".swo",
        ".tmp",
        ".save",
        ".dpkg-old",
        ".dpkg-new",
        ".dpkg-dist",
        ".rpmnew",
        ".rpmsave",
    ];
    let lower = name.to_ascii_lowercase();
    name.ends_with('~') || (name.starts_with('#') && name.ends_with('#')) || SUFFIXES.iter().any(|s| lower.ends_with(s))
}

impl Kind {
    /// The kind of a file, from its name: `param` before `flow`, so that
    /// `param-flow-rules.json` holds hot-parameter rules.
    pub fn of(file_name: &str) -> Option<Kind> {
        let n = file_name.to_ascii_lowercase();
        let n = n.strip_suffix(".json").unwrap_or(&n);
        Some(if n.contains("gw-") || n.contains("gw_") || n.contains("gateway") || n.contains("api-group") {
            Kind::Gateway
        } else if n.contains("param") {
            Kind::Param
        } else if n.contains("degrade") {
            Kind::Degrade
        } else if n.contains("authority") {
            Kind::Authority
        } else if n.contains("system") {
            Kind::System
        } else if n.contains("flow") {
            Kind::Flow
        } else {
            return None;
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Flow => "flow",
            Kind::Degrade => "degrade",
            Kind::System => "system",
            Kind::Param => "param-flow",
            Kind::Authority => "authority",
            Kind::Gateway => "gateway",
        }
    }
}

/// Sentinel's rules, read and translated.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SentinelRules {
    /// One rule per resource, in the order resources first appear.
    pub rules: Vec<Rule>,
    /// The system of the system rules (none without any).
    pub system: Option<SystemConfig>,
    /// Rules read but not enforced, each with why.
    pub ignored: Vec<String>,
    /// Rules read, by kind.
    pub counts: BTreeMap<&'static str, usize>,
}

impl SentinelRules {
    /// Reads every file of `dir` (not those whose name starts with a dot:
    /// a Kubernetes ConfigMap's `..data`); returns the rules and the files'
    /// text, for `GetRules`.
    pub fn load_dir(dir: &Path, options: &SentinelOptions) -> Result<(SentinelRules, String), RuleErrors> {
        let dir_name = dir.display().to_string();
        let entries = std::fs::read_dir(dir).map_err(|e| RuleErrors::one(&dir_name, format!("cannot read: {e}")))?;
        // Not read, and said so: subdirectories, editors' backups and
        // package managers' leftovers (`flow-rules.json~`, `.bak`, `.orig`...),
        // which would otherwise be read as a second copy of the rules.
        let mut skipped = Vec::new();
        let mut paths: Vec<_> = entries
            .filter_map(|e| e.ok())
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let why = if p.is_dir() {
                    "not read: a directory"
                } else if is_backup(&name) {
                    "not read: a backup or temporary file"
                } else {
                    return true;
                };
                if skipped.len() < MAX_FILES {
                    let line = RuleError { file: name, resource: None, field: String::new(), message: why.into() };
                    skipped.push(line.to_string());
                }
                false
            })
            .take(MAX_FILES + 1)
            .collect();
        paths.sort();
        skipped.sort();
        if paths.len() > MAX_FILES {
            return Err(RuleErrors::one(&dir_name, format!("more than {MAX_FILES} files; that is the limit")));
        }
        let mut files = Vec::new();
        let mut total = 0;
        for path in paths {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let text = crate::files::read_text(&path, MAX_FILE_BYTES)
                .map_err(|e| RuleErrors::one(&name, format!("cannot read: {e}")))?;
            total += text.len();
            if total > MAX_TOTAL_BYTES {
                return Err(RuleErrors::one(
                    &dir_name,
                    format!("over {MAX_TOTAL_BYTES} bytes in all; that is the limit"),
                ));
            }
            files.push((name, text));
        }
        let digest = files.iter().map(|(n, t)| format!("# {n}\n{t}\n")).collect();
        let mut rules = SentinelRules::parse(&files, options)?;
        rules.ignored.extend(skipped);
        Ok((rules, digest))
    }

    /// Files as (name, JSON text): validated whole; every error names the
    /// file, the rule (its index and resource) and the field.
    pub fn parse(files: &[(String, String)], options: &SentinelOptions) -> Result<SentinelRules, RuleErrors> {
        let mut read = read::Read::default();
        let mut errors = Vec::new();
        for (name, text) in files {
            let Some(kind) = Kind::of(name) else {
                errors.push(RuleError {
                    file: name.clone(),
                    resource: None,
                    field: String::new(),
                    message: "cannot tell the rule type from the name: it must name one of flow, degrade, system, \
                              param (hot-parameter), authority (e.g. flow-rules.json, myapp-param-rules)"
                        .into(),
                });
                continue;
            };
            read.file(name, kind, text, &mut errors);
            if read.len() > MAX_RULES {
                return Err(RuleErrors::one(name, format!("more than {MAX_RULES} rules in all; that is the limit")));
            }
            if errors.len() >= MAX_ERRORS {
                errors.truncate(MAX_ERRORS);
                errors.push(RuleError {
                    file: name.clone(),
                    resource: None,
                    field: String::new(),
                    message: format!("and more: only the first {MAX_ERRORS} errors are shown"),
                });
                break;
            }
        }
        if !errors.is_empty() {
            return Err(RuleErrors(errors));
        }
        translate::rules(read, options)
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
#[cfg(test)]
mod tests;
