//! Breakers through Redis: window news pushed every sync, probes granted
//! cluster-wide, probe outcomes decided there, operators' states stored; the
//! shared state adopted by every replica and announced on pub/sub.

use super::Breakers;
use super::Replication;
use super::message::Message;
use super::scripts::{BreakerOp, EVENTS, breaker_args, breaker_keys};
use super::wire::{BreakerReply, Grant};
use floodgate_core::breaker::State;
use floodgate_engine::Installed;
use floodgate_engine::sync::{BreakerNews, RemoteBreaker, SharedBreaker};

impl Replication {
    /// Sends `message` to every replica on the events channel.
    pub(super) async fn publish(&self, message: &Message) {
        let message = message.encode();
        let _: Option<i64> =
            self.call("publish", |mut h| async move {
                redis::cmd("PUBLISH").arg(EVENTS).arg(message).query_async(&mut h).await
            })
            .await;
    }
}

impl Breakers<'_> {
    /// Runs one breaker script for `resource`, whose rule has a breaker.
    async fn run_breaker(&self, rules: &Installed, resource: &str, op: BreakerOp) -> Option<BreakerReply> {
        let cfg = rules.rules.find(resource)?.breaker.as_ref()?;
        let script = op.script();
        let [state_key, window_key] = breaker_keys(resource);
        let deadline = self.sync().redis_time(self.engine.clock().now().saturating_add(self.config.timeout));
        let mut invocation = self.scripts.get(script).prepare_invoke();
        invocation.key(state_key).key(window_key).arg(&breaker_args(cfg)[..]).arg(deadline).arg(&op.args()[..]);
        let Some(reply) = self.run(script, invocation, |v| BreakerReply::parse(script, v)).await? else {
            metrics::counter!(floodgate_engine::metrics::REDIS_LATE).increment(1);
            return None;
        };
        self.adopt_reply(rules, resource, &reply).await;
        Some(reply)
    }

    /// Adopts the shared state a breaker script returned, and announces a change.
    async fn adopt_reply(&self, rules: &Installed, resource: &str, r: &BreakerReply) {
        let open_until = self.engine.clock().now().saturating_add(r.open_for());
        let shared = SharedBreaker { generation: r.generation, state: r.state, open_until, openings: r.openings };
        self.sync().on(&self.engine).adopt_breaker(rules, resource, shared);
        if r.changed {
            self.publish(&Message::BreakerChanged { resource: resource.to_string() }).await;
        }
    }

    /// Asks the shared breaker whether a call may go ahead as a probe.
    pub(super) async fn probe(&self, rules: &Installed, resource: &str) -> Option<RemoteBreaker> {
        let cfg = rules.rules.find(resource)?.breaker.as_ref()?;
        let r = self.run_breaker(rules, resource, BreakerOp::Probe).await?;
        let grant = match r.grant() {
            Ok(grant) => grant,
            Err(e) => {
                tracing::error!(error = %e, "Redis answered a probe with an unexpected result");
                metrics::counter!(floodgate_engine::metrics::REDIS_ERRORS, "op" => "breaker_probe", "kind" => "bad_reply")
                    .increment(1);
                return None;
            }
        };
        Some(match grant {
            Grant::Probe => RemoteBreaker::Probe(Box::new(self.sync().probe_granted(resource, r.generation))),
            Grant::Plain => RemoteBreaker::Plain,
            Grant::Denied => {
                let retry_after = match r.state {
                    State::Open => r.open_for(),
                    State::HalfOpen => cfg.max_wait_in_half_open,
                    _ => cfg.wait_in_open.initial,
                };
                RemoteBreaker::Deny { state: r.state, retry_after }
            }
        })
    }

    /// After ReportOutcome: probe outcomes go to the shared breakers.
    pub async fn after_report(&self) {
        // While Redis is away the sync loop sends them once it is back: a
        // request does not wait on a dead Redis for them.
        if self.sync().up() && !self.sync().outbox_is_empty() {
            self.flush_outbox(&self.engine.rules_full()).await;
        }
        if self.sync().up() && self.sync().slot_ops_waiting() {
            self.limits().flush_slot_ops().await;
        }
    }

    /// Sends probe outcomes (and probes given back) to the shared breakers.
    /// One that could not be sent (Redis away, or too late) goes again at
    /// the next flush: a late one changed nothing, so none counts twice.
    pub(super) async fn flush_outbox(&self, rules: &Installed) {
        for o in self.sync().take_outbox() {
            // A rule that lost its breaker has no probe to report.
            if rules.rules.find(&o.resource).is_none_or(|r| r.breaker.is_none()) {
                continue;
            }
            let op = BreakerOp::Report { generation: o.generation, outcome: o.outcome, slow: o.slow };
            if self.run_breaker(rules, &o.resource, op).await.is_none() {
                self.sync().resend(o);
            }
        }
    }

    /// One round: every breaker's window news pushed, its shared state adopted.
    pub(super) async fn sync_breakers(&self, rules: &Installed) -> bool {
        let mut ok = true;
        for BreakerNews { resource, calls, tripped } in self.sync().on(&self.engine).breaker_news(rules) {
            let op = BreakerOp::Sync { calls: calls.calls, failures: calls.failures, slow: calls.slow, tripped };
            ok &= self.run_breaker(rules, &resource, op).await.is_some();
        }
        ok
    }

    /// The shared breaker of one resource, now (after a pub/sub message).
    pub(super) async fn refresh_breaker(&self, rules: &Installed, resource: &str) {
        let op = BreakerOp::Sync { calls: 0, failures: 0, slow: 0, tripped: false };
        self.run_breaker(rules, resource, op).await;
    }

    /// An operator's state for the shared breaker, announced to every replica.
    pub async fn force_breaker(&self, rules: &Installed, resource: &str, to: State) {
        if self.run_breaker(rules, resource, BreakerOp::Force(to)).await.is_some() {
            self.publish(&Message::BreakerChanged { resource: resource.to_string() }).await;
        }
    }
}
