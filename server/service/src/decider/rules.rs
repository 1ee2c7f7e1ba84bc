//! The rules in force: read, applied through Admin (shared with the other
//! replicas), installed from a file or an Envoy configuration, and tried as a
//! what-if beside the rules in force.

use super::{Control, Views};
use std::sync::Arc;
use std::time::SystemTime;

use crate::engine::what_if::{self, WhatIf};
use crate::engine::{Engine, Installed, RequestError};
use crate::rules::envoy::EnvoyConfig;
use crate::rules::sentinel::SentinelRules;
use crate::rules::{RuleErrors, RuleSet};

/// Where a rule set comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The rules file, by path.
    File(String),
    /// The default rules built into the binary.
    Embedded,
    /// `Admin.ApplyRules`.
    Admin,
    /// An envoyproxy/ratelimit configuration directory.
    Envoy,
    /// A directory of Sentinel's rules.
    Sentinel,
}

/// The outcome of `ApplyRules`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The version in force afterwards.
    pub version: u64,
    pub resources: Vec<String>,
    /// False when only validated, or tried as a what-if.
    pub applied: bool,
    /// When the what-if this started ends.
    pub what_if_until: Option<SystemTime>,
}

/// The outcome of `RevertRules`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reverted {
    /// The version in force afterwards.
    pub version: u64,
    /// The version whose rules file was put back.
    pub reverted_to: u64,
    pub resources: Vec<String>,
}

/// Why `RevertRules` changed nothing.
#[derive(Debug)]
pub enum RevertError {
    /// No such rules file is kept.
    Request(RequestError),
    /// The rules file kept no longer parses.
    Rules(RuleErrors),
}

impl From<RequestError> for RevertError {
    fn from(e: RequestError) -> Self {
        RevertError::Request(e)
    }
}

/// The rules in force, for `GetRules`.
#[derive(Clone, Debug)]
pub struct RulesInForce {
    pub yaml: String,
    pub version: u64,
    pub source: String,
    pub loaded_at: SystemTime,
    pub resources: Vec<String>,
    /// The envoyproxy/ratelimit configuration in force, if one is.
    pub envoy: Option<EnvoyInForce>,
    /// Sentinel's rules in force, if there are.
    pub sentinel: Option<SentinelInForce>,
    /// The rules files in force before, newest first.
    pub earlier: Vec<EarlierRules>,
}

/// A rules file in force before the one in force now, for `GetRules`.
#[derive(Clone, Debug)]
pub struct EarlierRules {
    pub version: u64,
    pub source: String,
    pub loaded_at: SystemTime,
    pub replaced_at: SystemTime,
    /// The first 20 patterns, and how many there are.
    pub resources: Vec<String>,
    pub resource_count: usize,
}

/// Sentinel's rules in force, for `GetRules`.
#[derive(Clone, Debug)]
pub struct SentinelInForce {
    /// The directory.
    pub source: String,
    /// Their resources, in the order they first appear.
    pub resources: Vec<String>,
    /// Rules read but not enforced, each with why.
    pub ignored: Vec<String>,
    /// Resources the rules file names too (its rule decides them).
    pub left_out: Vec<String>,
    pub loaded_at: SystemTime,
    /// The files, as read.
    pub json: String,
}

/// An envoyproxy/ratelimit configuration in force, for `GetRules`.
#[derive(Clone, Debug)]
pub struct EnvoyInForce {
    /// A directory, or an xDS control plane's address.
    pub source: String,
    /// The control plane's version (empty for a directory).
    pub version: String,
    /// Sorted.
    pub domains: Vec<String>,
    pub loaded_at: SystemTime,
    pub yaml: String,
}

// === impl Origin ===

impl Origin {
    /// The `source` label of `floodgate_rule_reloads_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Origin::File(_) => "file",
            Origin::Embedded => "embedded",
            Origin::Admin => "admin",
            Origin::Envoy => "envoy",
            Origin::Sentinel => "sentinel",
        }
    }

    fn name(&self) -> String {
        match self {
            Origin::File(path) => path.clone(),
            Origin::Embedded => "embedded".into(),
            Origin::Admin => "admin".into(),
            Origin::Envoy => "envoy".into(),
            Origin::Sentinel => "sentinel".into(),
        }
    }
}

impl From<crate::engine::Earlier> for EarlierRules {
    fn from(e: crate::engine::Earlier) -> Self {
        EarlierRules {
            version: e.version,
            source: e.source,
            loaded_at: e.loaded_at,
            replaced_at: e.replaced_at,
            resources: e.resources,
            resource_count: e.resource_count,
        }
    }
}

// === impl Decider ===

impl Views<'_> {
    pub fn rules(&self) -> RulesInForce {
        let installed = self.engine.rules();
        RulesInForce {
            yaml: installed.yaml.clone(),
            version: installed.version,
            source: installed.source.clone(),
            loaded_at: installed.loaded_at,
            resources: installed.resource_names(),
            envoy: (!installed.envoy.source.is_empty()).then(|| {
                let e = &installed.envoy;
                let mut domains: Vec<String> = e.config.domains().map(String::from).collect();
                domains.sort_unstable();
                EnvoyInForce {
                    source: e.source.clone(),
                    version: e.version.clone(),
                    domains,
                    loaded_at: e.loaded_at,
                    yaml: e.text.clone(),
                }
            }),
            earlier: self.earlier_rules(),
            sentinel: (!installed.sentinel.source.is_empty()).then(|| {
                let s = &installed.sentinel;
                SentinelInForce {
                    source: s.source.clone(),
                    resources: s.rules.rules.iter().map(|r| r.name.clone()).collect(),
                    ignored: s.rules.ignored.clone(),
                    left_out: s.left_out(&installed.file),
                    loaded_at: s.loaded_at,
                    json: s.text.clone(),
                }
            }),
        }
    }

    /// The rules files in force before the rules in force, newest first.
    pub fn earlier_rules(&self) -> Vec<EarlierRules> {
        self.engine.earlier_rules().into_iter().map(EarlierRules::from).collect()
    }

    /// The rules in force, whole.
    pub fn installed(&self) -> Arc<Installed> {
        self.engine.rules_full()
    }

    /// What the last what-if started found, if one was.
    pub fn what_if(&self) -> Option<what_if::Findings> {
        Some(self.what_if.load_full()?.findings(self.engine.clock().now()))
    }
}

/// A rules upload parsed on a blocking thread: parsing is bounded, but a
/// large file takes long enough to hold up the decisions on a worker.
async fn parse_off_the_workers(yaml: &str) -> Result<RuleSet, RuleErrors> {
    let text = yaml.to_string();
    tokio::task::spawn_blocking(move || RuleSet::from_yaml(&text, "ApplyRules"))
        .await
        .unwrap_or_else(|e| Err(RuleErrors::one("ApplyRules", format!("the parser failed: {e}"))))
}

/// Installs an envoyproxy/ratelimit configuration read from `dir` and counts
/// the reload; the version.
pub fn install_envoy(engine: &Engine, config: EnvoyConfig, text: String, dir: &std::path::Path) -> u64 {
    let version = engine.control().install_envoy(config, text, dir.display().to_string(), String::new());
    crate::metrics::rule_reload(Origin::Envoy.label(), true, version);
    version
}

/// Installs Sentinel's rules read from `dir` and counts the reload; the
/// version. What is listed as ignored is logged.
pub fn install_sentinel(engine: &Engine, rules: SentinelRules, text: String, dir: &std::path::Path) -> u64 {
    for why in &rules.ignored {
        tracing::warn!(dir = %dir.display(), "a Sentinel rule is not enforced: {why}");
    }
    let version = engine.control().install_sentinel(rules, text, dir.display().to_string());
    crate::metrics::rule_reload(Origin::Sentinel.label(), true, version);
    for name in engine.rules().sentinel.left_out(&engine.rules().file) {
        tracing::warn!(dir = %dir.display(), "Sentinel's rules for {name} are not in force: the rules file has its own");
    }
    version
}

/// Installs rules in `engine` and counts the reload; the version.
pub fn install(engine: &Engine, rules: RuleSet, yaml: String, origin: Origin) -> u64 {
    let version = engine.control().install(rules, yaml, origin.name());
    crate::metrics::rule_reload(origin.label(), true, version);
    version
}

impl Control<'_> {
    /// Validates a rules file and, unless `validate_only`, swaps it in and
    /// shares it with the other replicas. Invalid rules are refused whole.
    /// One at a time, parsed off the async workers, so that a rules upload
    /// never holds up decisions.
    pub async fn apply_rules(&self, yaml: &str, validate_only: bool) -> Result<Applied, RuleErrors> {
        let _one_at_a_time = self.applying.lock().await;
        let rules = parse_off_the_workers(yaml).await.inspect_err(|_| {
            if !validate_only {
                crate::metrics::rule_reload(Origin::Admin.label(), false, self.engine.rules().version);
            }
        })?;
        let resources = rules.rules().iter().map(|r| r.name.clone()).collect();
        if validate_only {
            return Ok(Applied {
                version: self.engine.rules().version,
                resources,
                applied: false,
                what_if_until: None,
            });
        }
        let version = self.install(rules, yaml.to_string(), Origin::Admin);
        if let Some(replication) = &self.replication {
            replication.settings().share_rules(yaml).await;
        }
        tracing::info!(version, "rules applied through Admin");
        Ok(Applied { version, resources, applied: true, what_if_until: None })
    }

    /// Puts back the rules file last in force as version `to` (0: the one
    /// the rules in force replaced), as `apply_rules` would install it.
    pub async fn revert_rules(&self, to: u64) -> Result<Reverted, RevertError> {
        let _one_at_a_time = self.applying.lock().await;
        let earlier = self.engine.earlier_rules();
        let chosen = match to {
            0 => earlier.first().ok_or(RequestError::NothingToRevert)?,
            to => earlier.iter().find(|e| e.version == to).ok_or_else(|| match earlier.is_empty() {
                true => RequestError::NothingToRevert,
                false => RequestError::NotKept {
                    version: to,
                    kept: earlier.iter().map(|e| e.version.to_string()).collect::<Vec<_>>().join(", "),
                },
            })?,
        };
        let rules = parse_off_the_workers(&chosen.yaml).await.map_err(RevertError::Rules)?;
        let resources = rules.rules().iter().map(|r| r.name.clone()).collect();
        let version = self.install(rules, chosen.yaml.clone(), Origin::Admin);
        if let Some(replication) = &self.replication {
            replication.settings().share_rules(&chosen.yaml).await;
        }
        tracing::info!(version, reverted_to = chosen.version, "rules reverted through Admin");
        Ok(Reverted { version, reverted_to: chosen.version, resources })
    }

    /// `ApplyRules` with `what_if`: validates `yaml` and runs it in shadow
    /// beside the rules in force for `length`, replacing a what-if running.
    pub(crate) async fn start_what_if(&self, yaml: &str, length: std::time::Duration) -> Result<Applied, RuleErrors> {
        let _one_at_a_time = self.applying.lock().await;
        let rules = parse_off_the_workers(yaml).await?;
        let resources = rules.rules().iter().map(|r| r.name.clone()).collect();
        let now = self.engine.clock().now();
        let until = now.saturating_add(length);
        self.what_if.store(Some(Arc::new(WhatIf::new(rules, now, until))));
        let until = SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(until.as_nanos());
        Ok(Applied { version: self.engine.rules().version, resources, applied: false, what_if_until: Some(until) })
    }

    /// Installs rules read here (the file, or the embedded default), for this
    /// replica only. Returns the version.
    pub fn install(&self, rules: RuleSet, yaml: String, origin: Origin) -> u64 {
        install(&self.engine, rules, yaml, origin)
    }

    /// Installs an envoyproxy/ratelimit configuration read from `dir`.
    pub fn install_envoy(&self, config: EnvoyConfig, text: String, dir: &std::path::Path) -> u64 {
        install_envoy(&self.engine, config, text, dir)
    }

    /// Installs an envoyproxy/ratelimit configuration an xDS control plane
    /// at `source` served as `version`.
    pub(crate) fn install_envoy_from(&self, config: EnvoyConfig, text: String, source: String, version: String) -> u64 {
        let installed = self.engine.control().install_envoy(config, text, source, version);
        self.envoy_waiting.store(false, std::sync::atomic::Ordering::Release);
        crate::metrics::rule_reload(Origin::Envoy.label(), true, installed);
        installed
    }

    /// Installs Sentinel's rules read from `dir`.
    pub fn install_sentinel(&self, rules: SentinelRules, text: String, dir: &std::path::Path) -> u64 {
        install_sentinel(&self.engine, rules, text, dir)
    }

    /// Counts rules read from `source` that could not be installed, and
    /// tells the console why (`error`): it shows a banner until rules from
    /// that source are installed.
    pub fn refused(&self, origin: &Origin, source: String, error: &str) {
        crate::metrics::rule_reload(origin.label(), false, self.engine.rules().version);
        self.engine.control().refused(source, error);
    }
}
