//! The one decision path. Every entry point (the Floodgate and Admin services,
//! Envoy's RLS, Watch, the HTTP port, rule reloads) calls a [`Decider`]; it
//! owns the engine and, when the server replicates, the Redis side, and it is
//! the only place that knows which mode runs. Its methods are split by job:
//!
//! - [`decide`](self::decide): decisions, reports, Charge and Peek;
//! - [`rules`](self::rules): the rules in force, ApplyRules and the what-if;
//! - [`overrides`](self::overrides): overrides set at run time;
//! - [`breakers`](self::breakers): breakers and the degradation level;
//! - [`views`](self::views): what the console, metrics and Admin read;
//! - [`lease`](self::lease) and [`rls`](self::rls): leases, Envoy's RLS.
//!
//! Answers borrow names from the rules in force, so each call is translated
//! into the caller's type (`R: FromAnswer<Answer>`) while they are held: the
//! memory-only path then costs no reference count on the rules and no copy of
//! the answer.

use std::sync::Arc;

use crate::engine::Engine;
use crate::engine::what_if::WhatIf;
use crate::replication::Replication;

mod breakers;
pub(crate) mod charged_keys;
mod decide;
pub mod decisions;
mod lease;
mod overrides;
mod rls;
mod rules;
mod views;

pub use breakers::BreakerView;
pub use lease::{LeaseAsk, Leased};
pub use overrides::{
    MAX_PAGE, NewOverride, OverrideOptions, OverridesPage, OverridesSet, read_file as read_overrides_file,
};
pub use rls::{HeaderNames, RlsAnswer, RlsHeaders, RlsOptions, RlsRequest, RlsStatus, Shown};
pub use rules::{
    Applied, EarlierRules, EnvoyInForce, Origin, RevertError, Reverted, RulesInForce, SentinelInForce, install,
    install_envoy, install_sentinel,
};
pub use views::{Figures, MAX_REPLAYED, ProposeError, Proposed, ReplicaHealth};

/// Turns an answer that borrows the rules in force into the caller's own
/// type while the rules are held (the gRPC layer builds its message from
/// it). A trait of this crate rather than `From`, because the orphan rule
/// forbids `From` between the engine's types and the generated messages.
pub trait FromAnswer<A> {
    fn from_answer(answer: A) -> Self;
}

/// The decider seen for one job. Each job's methods live on its own type,
/// so that the decider's own methods are the decisions (Acquire, reports,
/// Charge, Peek, Envoy's RLS): [`Decider::control`] changes what is in force
/// (rules, overrides, breaker states, levels), [`Decider::views`] reads what
/// the console, Admin and the CLI show, and [`Decider::leasing`] serves
/// leases. A job handle only borrows the decider and dereferences to it.
macro_rules! job {
    ($(#[$doc:meta])* $name:ident, $method:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name<'d>(&'d Decider);

        impl std::ops::Deref for $name<'_> {
            type Target = Decider;

            fn deref(&self) -> &Decider {
                self.0
            }
        }

        impl Decider {
            $(#[$doc])*
            pub fn $method(&self) -> $name<'_> {
                $name(self)
            }
        }
    };
}

job!(
    /// What is in force: rules (ApplyRules, the what-if), overrides, breaker
    /// states, degradation levels and load reports.
    Control,
    control
);
job!(
    /// What the console, Admin and the CLI read.
    Views,
    views
);
job!(
    /// Leases: granted and given back.
    Leasing,
    leasing
);

pub struct Decider {
    engine: Arc<Engine>,
    replication: Option<Arc<Replication>>,
    rls: RlsOptions,
    /// The xDS control plane Envoy's configuration is awaited from, until
    /// the first one is installed (`--envoy-xds` without
    /// `--envoy-xds-ready-without-config`).
    envoy_awaited: std::sync::OnceLock<String>,
    /// With Sentinel's rules: the descriptor a caller's mTLS identity sets.
    origin_key: Option<String>,
    envoy_waiting: std::sync::atomic::AtomicBool,
    /// One ApplyRules at a time: parsing is bounded, but not free.
    applying: tokio::sync::Mutex<()>,
    /// Candidate rules observed in shadow (`ApplyRules` with `what_if`).
    what_if: arc_swap::ArcSwapOption<WhatIf>,
    /// Overrides set at run time: where they are kept; one change at a time.
    override_options: OverrideOptions,
    changing: tokio::sync::Mutex<()>,
    /// Set when the server starts draining: streams (Watch, the console's
    /// events) end then rather than hold the drain to its grace period.
    draining: tokio::sync::watch::Sender<bool>,
    /// The engine's events, broadcast to Watch streams and the console. A
    /// slow reader never slows the engine: it falls behind, loses events,
    /// and is told so (it then takes a fresh snapshot).
    events: tokio::sync::broadcast::Sender<Arc<crate::events::Event>>,
    /// Why calls were answered as they were, for a share of them (off by
    /// default).
    decisions: decisions::DecisionLog,
    /// The idempotency keys of the charges this replica took.
    charged_keys: charged_keys::ChargedKeys,
}

/// Events kept for slow readers before they fall behind.
pub(crate) const EVENTS_KEPT: usize = 1024;

// === impl Decider ===

impl Decider {
    pub fn new(engine: Arc<Engine>, replication: Option<Arc<Replication>>) -> Self {
        let events = tokio::sync::broadcast::channel(EVENTS_KEPT).0;
        let sender = events.clone();
        // No receivers is fine: nobody is watching.
        engine.events().listen(Box::new(move |event| drop(sender.send(event))));
        let engine_now = engine.clock().now();
        Decider {
            engine,
            replication,
            rls: RlsOptions::default(),
            envoy_awaited: std::sync::OnceLock::new(),
            origin_key: None,
            envoy_waiting: std::sync::atomic::AtomicBool::new(false),
            applying: tokio::sync::Mutex::new(()),
            what_if: arc_swap::ArcSwapOption::empty(),
            override_options: OverrideOptions::default(),
            changing: tokio::sync::Mutex::new(()),
            draining: tokio::sync::watch::Sender::new(false),
            events,
            decisions: decisions::DecisionLog::new(0.0, decisions::DEFAULT_CAPACITY).expect("0 is a share"),
            charged_keys: charged_keys::ChargedKeys::new(engine_now),
        }
    }

    /// The decision log to keep (`--decision-log`, `--decision-log-size`).
    pub(crate) fn with_decision_log(mut self, log: decisions::DecisionLog) -> Self {
        self.decisions = log;
        self
    }

    /// The decision log: read by Admin, its share set by it.
    pub fn decisions(&self) -> &decisions::DecisionLog {
        &self.decisions
    }

    /// Ends every open stream: the server is draining.
    pub(crate) fn drain_streams(&self) {
        self.draining.send_replace(true);
    }

    /// Completes once the server starts draining.
    pub fn drained(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.draining.subscribe();
        async move {
            let _ = rx.wait_for(|d| *d).await;
        }
    }

    /// The engine's clock.
    pub fn now(&self) -> crate::time::Timestamp {
        self.engine.clock().now()
    }

    /// Where overrides set at run time are kept (a server with Redis keeps
    /// them there whatever `file` says), and how many.
    pub(crate) fn with_overrides(mut self, options: OverrideOptions) -> Self {
        self.override_options = options;
        self
    }

    /// A caller with a client certificate has its name as this descriptor
    /// (its origin), whatever it sends; `None` lets callers name their own.
    pub(crate) fn with_origin_key(mut self, key: Option<String>) -> Self {
        self.origin_key = key;
        self
    }

    /// The descriptor a caller's mTLS identity sets, if one does.
    pub fn origin_key(&self) -> Option<&str> {
        self.origin_key.as_deref()
    }

    /// The descriptor a caller's mTLS certificate sets, and its value (the
    /// certificate's name), for a caller that presented a certificate.
    pub(crate) fn origin_of<'p>(&'p self, peer: Option<&'p crate::listen::Peer>) -> Option<(&'p str, &'p str)> {
        let key = self.origin_key.as_deref()?;
        let peer = peer?;
        // Only a certificate proves who calls: without mTLS the caller's
        // descriptor stands. A certificate without a name proves no origin,
        // and claims none either.
        peer.certs.as_ref()?;
        Some((key, peer.identity.as_deref().unwrap_or("")))
    }

    /// How Envoy's RLS answers (global shadow mode, response headers).
    pub(crate) fn with_rls(mut self, rls: RlsOptions) -> Self {
        self.engine.views().upstream_stats().set_max(rls.stat_series);
        self.rls = rls;
        self
    }

    /// How Envoy's RLS answers.
    pub(crate) fn rls_options(&self) -> &RlsOptions {
        &self.rls
    }

    /// Until an Envoy configuration is installed, RLS calls for domains our
    /// rules do not have are UNAVAILABLE (Envoy's failure mode decides
    /// them), rather than answered OK as if no limit existed.
    pub(crate) fn await_envoy_config(&self, from: String) {
        let _ = self.envoy_awaited.set(from);
        self.envoy_waiting.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Why an RLS call for `domain` cannot be decided yet, if it cannot.
    pub(crate) fn rls_waiting(&self, domain: &str) -> Option<String> {
        if !self.envoy_waiting.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        if self.engine.rules().rules.position(domain).is_some() {
            return None;
        }
        let from = self.envoy_awaited.get().map_or("", String::as_str);
        Some(format!("no Envoy configuration yet: waiting for the first one from {from}"))
    }

    /// Upstream's per-descriptor stats in Prometheus's text format.
    pub(crate) fn render_upstream_stats(&self, out: &mut String) {
        self.engine.views().upstream_stats().render(out);
    }
}
