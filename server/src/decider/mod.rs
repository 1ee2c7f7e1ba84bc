//! The one decision path. Every entry point (the Floodgate and Admin services,
//! Envoy's RLS, Watch, the HTTP port, rule reloads) calls a [`Decider`]; it
//! owns the engine and, when the server replicates, the Redis side, and it is
//! the only place that knows which mode runs.
//!
//! Answers borrow names from the rules in force, so each call is translated
//! into the caller's type (`R: From<Answer>`) while they are held: the
//! memory-only path then costs no reference count on the rules and no copy of
//! the answer.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::broadcast;

use crate::breaker::{Info, State};
use crate::degradation::{self, Level};
use crate::engine::request::check_batch;
use crate::engine::what_if::{self, WhatIf};
use crate::engine::{
    Answer, Descriptors, Engine, Installed, Prepared, Report, Reported, Request, RequestError, Snapshot, Verdict,
};
use crate::events::Event;
use crate::replication::Replication;
use crate::rules::envoy::EnvoyConfig;
use crate::rules::{RuleErrors, RuleSet};

mod lease;
mod overrides;
mod rls;

pub use lease::{LeaseAsk, Leased};
pub use overrides::{
    MAX_PAGE, NewOverride, OverrideOptions, OverridesPage, OverridesSet, read_file as read_overrides_file,
};
pub use rls::{RlsAnswer, RlsHeaders, RlsOptions, RlsRequest, RlsStatus, Shown};

pub struct Decider {
    engine: Arc<Engine>,
    replication: Option<Arc<Replication>>,
    rls: RlsOptions,
    /// One ApplyRules at a time: parsing is bounded, but not free.
    applying: tokio::sync::Mutex<()>,
    /// Candidate rules observed in shadow (`ApplyRules` with `what_if`).
    what_if: arc_swap::ArcSwapOption<WhatIf>,
    /// Overrides set at run time: where they are kept; one change at a time.
    override_options: OverrideOptions,
    changing: tokio::sync::Mutex<()>,
}

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

/// The rules in force, for `GetRules`.
#[derive(Clone, Debug)]
pub struct RulesInForce {
    pub yaml: String,
    pub version: u64,
    pub source: String,
    pub loaded_at: SystemTime,
    pub resources: Vec<String>,
}

/// One resource's breaker.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerView {
    pub resource: String,
    pub info: Info,
}

/// See [`Decider::replica_health`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaHealth {
    pub replicated: bool,
    pub redis_up: bool,
    pub live_replicas: u32,
}

/// Figures read at scrape time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    pub keys: usize,
    pub evicted: u64,
    pub permits_in_flight: usize,
    pub level: u32,
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
        }
    }

    fn name(&self) -> String {
        match self {
            Origin::File(path) => path.clone(),
            Origin::Embedded => "embedded".into(),
            Origin::Admin => "admin".into(),
            Origin::Envoy => "envoy".into(),
        }
    }
}

// === impl Decider ===

impl Decider {
    pub fn new(engine: Arc<Engine>, replication: Option<Arc<Replication>>) -> Self {
        Decider {
            engine,
            replication,
            rls: RlsOptions::default(),
            applying: tokio::sync::Mutex::new(()),
            what_if: arc_swap::ArcSwapOption::empty(),
            override_options: OverrideOptions::default(),
            changing: tokio::sync::Mutex::new(()),
        }
    }

    /// Where overrides set at run time are kept (a server with Redis keeps
    /// them there whatever `file` says), and how many.
    pub fn with_overrides(mut self, options: OverrideOptions) -> Self {
        self.override_options = options;
        self
    }

    /// How Envoy's RLS answers (global shadow mode, response headers).
    pub fn with_rls(mut self, rls: RlsOptions) -> Self {
        self.rls = rls;
        self
    }

    /// One decision, as the caller's type.
    pub async fn acquire<D, R>(&self, req: &Request<'_, D>) -> Result<R, RequestError>
    where
        D: Descriptors + Sync + ?Sized,
        R: for<'r> From<Answer<'r>>,
    {
        match &self.replication {
            None => {
                let rules = self.engine.rules();
                let mut answer = self.engine.acquire(&rules, req)?;
                self.observe(req, &answer);
                if req.settle {
                    self.engine.hold_estimate(&rules, req, &mut answer);
                }
                Ok(R::from(answer))
            }
            // Boxed: the memory-only call's future stays small.
            Some(replication) => Box::pin(self.acquire_replicated(replication, req)).await,
        }
    }

    async fn acquire_replicated<D, R>(&self, replication: &Replication, req: &Request<'_, D>) -> Result<R, RequestError>
    where
        D: Descriptors + Sync + ?Sized,
        R: for<'r> From<Answer<'r>>,
    {
        let rules = self.engine.rules_full();
        let prepared = vec![self.engine.prepare(&rules, req)?];
        let again = |_| self.engine.prepare(&rules, req).ok();
        let answer = replication.decide_many(&rules, prepared, again).await.into_iter().next();
        let mut answer = answer.expect("one answer per request");
        self.observe(req, &answer);
        if req.settle {
            self.engine.hold_estimate(&rules, req, &mut answer);
        }
        Ok(R::from(answer))
    }

    /// Independent decisions, answered in order. Every item is checked first:
    /// one bad item refuses the whole batch (named `field[i]`), taking nothing.
    pub async fn acquire_many<D, R>(&self, field: &'static str, reqs: &[Request<'_, D>]) -> Result<Vec<R>, RequestError>
    where
        D: Descriptors + Sync + ?Sized,
        R: for<'r> From<Answer<'r>>,
    {
        check_batch(field, reqs.len())?;
        let Some(replication) = &self.replication else {
            let rules = self.engine.rules();
            let prepared = prepare_all(&self.engine, &rules, field, reqs)?;
            let now = self.engine.clock().now();
            let answers = prepared.into_iter().map(|p| self.engine.decide(p, now));
            return Ok(answers.zip(reqs).map(|(a, req)| self.observed(&rules, req, a)).collect());
        };
        let rules = self.engine.rules_full();
        let prepared = prepare_all(&self.engine, &rules, field, reqs)?;
        let again = |i: usize| self.engine.prepare(&rules, &reqs[i]).ok();
        let answers = replication.decide_many(&rules, prepared, again).await;
        Ok(answers.into_iter().zip(reqs).map(|(a, req)| self.observed(&rules, req, a)).collect())
    }

    /// Shows a decided call to the what-if running, if any.
    #[inline]
    fn observe<D: Descriptors + ?Sized>(&self, req: &Request<'_, D>, answer: &Answer<'_>) {
        if let Some(w) = &*self.what_if.load() {
            w.observe(req, answer.verdict == Verdict::Allowed, self.engine.clock().now());
        }
    }

    /// A batch item decided: shown to the what-if, its estimate held.
    fn observed<'r, D: Descriptors + ?Sized, R: From<Answer<'r>>>(
        &self,
        rules: &Installed,
        req: &Request<'_, D>,
        mut answer: Answer<'r>,
    ) -> R {
        self.observe(req, &answer);
        if req.settle {
            self.engine.hold_estimate(rules, req, &mut answer);
        }
        R::from(answer)
    }

    /// `ApplyRules` with `what_if`: validates `yaml` and runs it in shadow
    /// beside the rules in force for `length`, replacing a what-if running.
    pub async fn start_what_if(&self, yaml: &str, length: std::time::Duration) -> Result<Applied, RuleErrors> {
        let _one_at_a_time = self.applying.lock().await;
        let text = yaml.to_string();
        let rules = tokio::task::spawn_blocking(move || RuleSet::from_yaml(&text, "ApplyRules"))
            .await
            .unwrap_or_else(|e| Err(RuleErrors::one("ApplyRules", format!("the parser failed: {e}"))))?;
        let resources = rules.rules().iter().map(|r| r.name.clone()).collect();
        let now = self.engine.clock().now();
        let until = now.saturating_add(length);
        self.what_if.store(Some(Arc::new(WhatIf::new(rules, now, until))));
        let until = SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(until.as_nanos());
        Ok(Applied { version: self.engine.rules().version, resources, applied: false, what_if_until: Some(until) })
    }

    /// The report of the last what-if started, if any.
    pub fn what_if(&self) -> Option<what_if::Report> {
        Some(self.what_if.load_full()?.report(self.engine.clock().now()))
    }

    /// Takes a permit back with the call's outcome.
    pub async fn report(&self, r: &Report<'_>) -> Result<Reported, RequestError> {
        let reported = self.report_here(r)?;
        if let Some(replication) = &self.replication {
            replication.after_report().await;
        }
        Ok(reported)
    }

    /// Many outcomes, in order; the first that cannot be taken stops the batch.
    pub async fn report_many(
        &self,
        field: &'static str,
        reports: &[Report<'_>],
    ) -> Result<Vec<Reported>, RequestError> {
        check_batch(field, reports.len())?;
        let reported = reports
            .iter()
            .enumerate()
            .map(|(i, r)| self.report_here(r).map_err(|e| e.in_batch(field, i)))
            .collect::<Result<Vec<_>, _>>();
        if let Some(replication) = &self.replication {
            replication.after_report().await;
        }
        reported
    }

    fn report_here(&self, r: &Report<'_>) -> Result<Reported, RequestError> {
        let rules = self.engine.rules();
        let mut reported = self.engine.report(&rules, r.resource, r.permit_id, r.outcome, r.latency)?;
        // A permit of an Acquire with `settle`: its estimate is settled (or,
        // without an actual cost, stands) whether or not it also guarded a call.
        match self.engine.settle_estimate(&rules, r.permit_id, r.resource, r.actual_cost) {
            Ok(settled) => {
                reported.settled = settled;
                reported.counted |= settled;
            }
            Err(RequestError::PermitResourceMismatch { .. }) if reported.counted => {}
            Err(e) => return Err(e),
        }
        Ok(reported)
    }

    /// `Charge`: takes `cost` from every limit the request matches, beyond
    /// the limit if need be.
    pub fn charge<D, R>(&self, resource: &str, descriptors: &D, cost: u64) -> Result<R, RequestError>
    where
        D: Descriptors + ?Sized,
        R: for<'r> From<crate::engine::settle::Charged<'r>>,
    {
        let rules = self.engine.rules();
        Ok(R::from(self.engine.charge(&rules, resource, descriptors, cost)?))
    }

    /// A resource's limits for these descriptors, consuming nothing; `only`
    /// keeps one limit by name (an error when it did not match).
    pub fn peek<D, R>(&self, resource: &str, descriptors: &D, only: Option<&str>) -> Result<R, RequestError>
    where
        D: Descriptors + ?Sized,
        R: for<'r> From<Answer<'r>>,
    {
        let rules = self.engine.rules();
        let answer = self.engine.peek(&rules, resource, descriptors, only)?;
        if let Some(limit) = only
            && answer.limits.is_empty()
        {
            return Err(RequestError::NoSuchLimit { resource: resource.into(), limit: limit.into() });
        }
        Ok(R::from(answer))
    }

    pub fn rules(&self) -> RulesInForce {
        let installed = self.engine.rules();
        RulesInForce {
            yaml: installed.yaml.clone(),
            version: installed.version,
            source: installed.source.clone(),
            loaded_at: installed.loaded_at,
            resources: installed.resource_names(),
        }
    }

    /// The rules in force, whole.
    pub fn installed(&self) -> Arc<Installed> {
        self.engine.rules_full()
    }

    /// Validates a rules file and, unless `validate_only`, swaps it in and
    /// shares it with the other replicas. Invalid rules are refused whole.
    /// One at a time, parsed off the async workers, so that a rules upload
    /// never holds up decisions.
    pub async fn apply_rules(&self, yaml: &str, validate_only: bool) -> Result<Applied, RuleErrors> {
        let _one_at_a_time = self.applying.lock().await;
        let text = yaml.to_string();
        let parsed = tokio::task::spawn_blocking(move || RuleSet::from_yaml(&text, "ApplyRules"))
            .await
            .unwrap_or_else(|e| Err(RuleErrors::one("ApplyRules", format!("the parser failed: {e}"))));
        let rules = parsed.inspect_err(|_| {
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
            replication.share_rules(yaml).await;
        }
        tracing::info!(version, "rules applied through Admin");
        Ok(Applied { version, resources, applied: true, what_if_until: None })
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

    /// Counts a rules file that could not be installed.
    pub fn refused(&self, origin: &Origin) {
        crate::metrics::rule_reload(origin.label(), false, self.engine.rules().version);
    }

    /// Every breaker in use, by resource.
    pub fn breakers(&self) -> Vec<BreakerView> {
        let rules = self.engine.rules();
        self.engine.breakers(&rules).into_iter().map(|(resource, info)| BreakerView { resource, info }).collect()
    }

    /// One resource's breaker; an error when its rule has none.
    pub fn breaker(&self, resource: &str) -> Result<BreakerView, RequestError> {
        let info = self.engine.breaker(&self.engine.rules(), resource)?;
        Ok(BreakerView { resource: resource.into(), info })
    }

    /// CLOSED (reset), FORCED_OPEN, DISABLED or METRICS_ONLY, on every replica.
    pub async fn set_breaker(&self, resource: &str, to: State) -> Result<BreakerView, RequestError> {
        let rules = self.engine.rules_full();
        let mut info = self.engine.set_breaker(&rules, resource, to)?;
        if let Some(replication) = &self.replication {
            replication.force_breaker(&rules, resource, to).await;
            info = self.engine.breaker(&rules, resource)?;
        }
        tracing::info!(resource, state = to.name(), "breaker state set through Admin");
        Ok(BreakerView { resource: resource.into(), info })
    }

    /// An operator's degradation level (0 to 3), or `None` for automatic.
    pub fn set_level(&self, level: Option<u32>) -> Result<Level, RequestError> {
        if let Some(level) = level.filter(|&l| l > degradation::MAX_LEVEL) {
            return Err(RequestError::BadLevel(level));
        }
        Ok(self.engine.set_degradation(level))
    }

    /// What a Watch stream starts with.
    pub fn snapshot(&self) -> Snapshot {
        self.engine.snapshot()
    }

    /// Every event from now on, in order.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.engine.events().subscribe()
    }

    /// What an exact rule of `rules` (the rules in force) has in its
    /// global (keyless) limits now: (name, limit, remaining); empty for a
    /// template rule, whose buckets are per resource.
    pub fn global_use(&self, rules: &Installed, rule: &crate::rules::Rule) -> Vec<(String, u64, u64)> {
        if rule.per_resource() || rule.limits.iter().all(|l| !l.key.is_empty()) {
            return Vec::new();
        }
        let none: std::collections::HashMap<String, String> = std::collections::HashMap::new();
        let Ok(answer) = self.engine.peek(rules, &rule.name, &none, None) else { return Vec::new() };
        answer.limits.iter().map(|l| (l.limit.name.clone(), l.status.limit, l.status.remaining)).collect()
    }

    /// Whether this server replicates, whether Redis answers, and how many
    /// replicas are live.
    pub fn replica_health(&self) -> ReplicaHealth {
        match self.engine.sync() {
            Some(sync) => ReplicaHealth { replicated: true, redis_up: sync.up(), live_replicas: sync.live() },
            None => ReplicaHealth { replicated: false, redis_up: false, live_replicas: 1 },
        }
    }

    /// Per limit, the keys denied and admitted most lately.
    pub fn top_keys(&self, rule: &str, n: usize) -> Vec<crate::engine::hottest::TopLimit> {
        self.engine.top_keys(&self.engine.rules(), rule, n)
    }

    pub fn figures(&self) -> Figures {
        Figures {
            keys: self.engine.buckets().len(),
            evicted: self.engine.buckets().evicted(),
            permits_in_flight: self.engine.permits_in_flight(),
            level: self.engine.degradation_level(),
        }
    }
}

/// Installs an envoyproxy/ratelimit configuration read from `dir` and counts
/// the reload; the version.
pub fn install_envoy(engine: &Engine, config: EnvoyConfig, text: String, dir: &std::path::Path) -> u64 {
    let version = engine.install_envoy(config, text, dir.display().to_string());
    crate::metrics::rule_reload(Origin::Envoy.label(), true, version);
    version
}

/// Installs rules in `engine` and counts the reload; the version.
pub fn install(engine: &Engine, rules: RuleSet, yaml: String, origin: Origin) -> u64 {
    let version = engine.install(rules, yaml, origin.name());
    crate::metrics::rule_reload(origin.label(), true, version);
    version
}

/// Checks and matches every item before any is decided.
fn prepare_all<'r, D: Descriptors + ?Sized>(
    engine: &Engine,
    rules: &'r Installed,
    field: &'static str,
    reqs: &[Request<'_, D>],
) -> Result<Vec<Prepared<'r>>, RequestError> {
    reqs.iter().enumerate().map(|(i, r)| engine.prepare(rules, r).map_err(|e| e.in_batch(field, i))).collect()
}
