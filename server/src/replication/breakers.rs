//! Breakers through Redis: window news pushed every sync, probes granted
//! cluster-wide, probe outcomes decided there, operators' states stored; the
//! shared state adopted by every replica and announced on pub/sub.

use std::time::Duration;

use super::Replication;
use super::scripts::{EVENTS, breaker_args, breaker_keys};
use crate::breaker::{Outcome, State};
use crate::engine::{BreakerSync, Installed, RemoteBreaker, RemoteOutcome, SharedBreaker};
use crate::rules::BreakerConfig;

/// What every breaker script returns:
/// {result, state, generation, open until us, openings, now us, changed}.
type Reply = Vec<i64>;

fn state(n: i64) -> State {
    match n {
        2 => State::Open,
        3 => State::HalfOpen,
        4 => State::ForcedOpen,
        5 => State::Disabled,
        6 => State::MetricsOnly,
        _ => State::Closed,
    }
}

pub fn state_number(s: State) -> i64 {
    crate::events::state_number(s) as i64
}

impl Replication {
    async fn run_breaker(&self, op: &'static str, resource: &str, cfg: &BreakerConfig, extra: &[f64]) -> Option<Reply> {
        let script = match op {
            "breaker_sync" => &self.scripts.breaker_sync,
            "breaker_probe" => &self.scripts.breaker_probe,
            "breaker_report" => &self.scripts.breaker_report,
            _ => &self.scripts.breaker_force,
        };
        let [state_key, window_key] = breaker_keys(resource);
        let mut invocation = script.prepare_invoke();
        invocation.key(state_key).key(window_key).arg(&breaker_args(cfg)[..]).arg(extra);
        let reply: Reply = self.call(op, |mut h| async move { invocation.invoke_async(&mut h).await }).await?;
        (reply.len() == 7).then_some(reply)
    }

    /// Adopts the shared state a breaker script returned, and announces a change.
    async fn adopt_reply(&self, rules: &Installed, resource: &str, r: &Reply) {
        let now = self.engine.clock().now();
        let open_until = now.add_nanos(((r[3] - r[5]).max(0) as u64).saturating_mul(1000));
        let shared = SharedBreaker { generation: r[2] as u64, state: state(r[1]), open_until, openings: r[4] as u32 };
        self.engine.adopt_breaker(rules, resource, shared);
        if r[6] == 1 {
            self.publish(format!("b {resource}")).await;
        }
    }

    /// Asks the shared breaker whether a call may go ahead as a probe.
    pub(super) async fn probe(&self, rules: &Installed, resource: &str) -> Option<RemoteBreaker> {
        let cfg = rules.rules.find(resource)?.breaker.as_ref()?;
        let r = self.run_breaker("breaker_probe", resource, cfg, &[]).await?;
        self.adopt_reply(rules, resource, &r).await;
        Some(match r[0] {
            1 => RemoteBreaker::Probe { generation: r[2] as u64 },
            2 => RemoteBreaker::Plain,
            _ => {
                let retry = match state(r[1]) {
                    State::Open => Duration::from_micros((r[3] - r[5]).max(0) as u64),
                    State::HalfOpen => cfg.max_wait_in_half_open,
                    _ => cfg.wait_in_open.initial,
                };
                RemoteBreaker::Deny { state: state(r[1]), retry_after: retry }
            }
        })
    }

    /// Sends probe outcomes (and probes given back) to the shared breakers.
    pub(super) async fn flush_outbox(&self, rules: &Installed) {
        for o in self.engine.take_outbox() {
            let RemoteOutcome { resource, generation, outcome, slow } = o;
            let Some(cfg) = rules.rules.find(&resource).and_then(|r| r.breaker.as_ref()) else { continue };
            let code = match outcome {
                Outcome::Success => 1.0,
                Outcome::Failure => 2.0,
                Outcome::Ignored => 3.0,
            };
            let extra = [generation as f64, code, f64::from(u8::from(slow))];
            if let Some(r) = self.run_breaker("breaker_report", &resource, cfg, &extra).await {
                self.adopt_reply(rules, &resource, &r).await;
            }
        }
    }

    /// One round: every breaker's window news pushed, its shared state adopted.
    pub(super) async fn sync_breakers(&self, rules: &Installed) -> bool {
        let mut ok = true;
        for BreakerSync { resource, config, calls, tripped } in self.engine.breaker_news(rules) {
            let extra = [calls.calls as f64, calls.failures as f64, calls.slow as f64, f64::from(u8::from(tripped))];
            match self.run_breaker("breaker_sync", &resource, &config, &extra).await {
                Some(r) => self.adopt_reply(rules, &resource, &r).await,
                None => ok = false,
            }
        }
        ok
    }

    /// The shared breaker of one resource, now (after a pub/sub message).
    pub(super) async fn refresh_breaker(&self, rules: &Installed, resource: &str) {
        let Some(cfg) = rules.rules.find(resource).and_then(|r| r.breaker.clone()) else { return };
        if let Some(r) = self.run_breaker("breaker_sync", resource, &cfg, &[0.0; 4]).await {
            self.adopt_reply(rules, resource, &r).await;
        }
    }

    /// An operator's state for the shared breaker.
    pub async fn force_breaker(&self, rules: &Installed, resource: &str, to: State) {
        let Some(cfg) = rules.rules.find(resource).and_then(|r| r.breaker.clone()) else { return };
        if let Some(r) = self.run_breaker("breaker_force", resource, &cfg, &[state_number(to) as f64]).await {
            self.adopt_reply(rules, resource, &r).await;
            self.publish(format!("b {resource}")).await;
        }
    }

    pub(super) async fn publish(&self, message: String) {
        let _: Option<i64> =
            self.call("publish", |mut h| async move {
                redis::cmd("PUBLISH").arg(EVENTS).arg(message).query_async(&mut h).await
            })
            .await;
    }
}
