//! Rules applied through Admin on one replica reach every replica: stored in
//! Redis (for replicas that start later) and announced on pub/sub. The same
//! channel carries breaker transitions.

use super::Settings;
use std::sync::Weak;
use std::time::Duration;

use tokio_stream::StreamExt;

use super::Replication;
use super::message::Message;
use super::scripts::{EVENTS, RULES};
use floodgate_rules::RuleSet;

/// Listens on the events channel; reconnects with backoff.
pub(super) async fn listen(weak: Weak<Replication>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(r) = weak.upgrade() else { return };
        // Classic pub/sub reaches every node of a cluster: its first seed
        // will do. Behind Sentinel it is the master of the moment, so a
        // failover moves the subscription at the next reconnection.
        let url = r.conn.pubsub_node();
        let credentials = r.config.credentials.clone();
        drop(r);
        let Some(url) = url else {
            // The Sentinels have not named a master yet.
            tokio::time::sleep(backoff).await;
            continue;
        };
        match subscribe(&url, &credentials).await {
            Ok(mut pubsub) => {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let Some(r) = weak.upgrade() else { return };
                    let text: String = msg.get_payload().unwrap_or_default();
                    match Message::decode(&text) {
                        Ok(message) => handle(&r, message).await,
                        Err(e) => unreadable(&r, msg.get_channel_name(), &text, &e),
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "subscribing to Redis events; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn subscribe(url: &str, credentials: &super::Credentials) -> anyhow::Result<redis::aio::PubSub> {
    let mut pubsub = super::conn::client(url, credentials)?.get_async_pubsub().await?;
    pubsub.subscribe(EVENTS).await?;
    // Reports of this process's permits that other replicas pass on.
    pubsub.subscribe(super::scripts::replica_channel(floodgate_engine::guards::PermitId::tag())).await?;
    Ok(pubsub)
}

async fn handle(r: &Replication, message: Message) {
    match message {
        Message::RulesChanged => r.settings().load_shared_rules().await,
        Message::OverridesChanged => r.settings().poll_overrides().await,
        Message::LevelsChanged => r.settings().load_levels().await,
        Message::BreakerChanged { resource } => {
            let rules = r.engine.rules_full();
            r.breakers().refresh_breaker(&rules, &resource).await;
        }
        Message::Loads { from, reports } => r.settings().on_loads(from, reports),
        Message::Report(forwarded) => r.on_forwarded(forwarded),
        Message::ReportAnswer { request, answer } => r.on_answer(request, answer),
    }
}

/// A message this replica cannot read (sent by a newer version, or
/// damaged): counted, and logged at most once a second, never acted on.
fn unreadable(r: &Replication, channel: &str, text: &str, e: &super::message::Unreadable) {
    static THROTTLE: floodgate_core::time::Throttle = floodgate_core::time::Throttle::new(1);
    metrics::counter!(floodgate_engine::metrics::REDIS_MESSAGES_UNREADABLE).increment(1);
    if THROTTLE.due(r.engine.clock().now()) {
        let start: String = text.chars().take(64).collect();
        tracing::warn!(channel, message = start.escape_debug().to_string(), error = %e, "a message from another replica could not be read; ignored");
    }
}

impl Settings<'_> {
    /// Stores rules just applied here, and tells the other replicas.
    pub async fn share_rules(&self, yaml: &str) {
        let yaml = yaml.to_string();
        let stored: Option<()> = self
            .call("rules", |mut h| async move { redis::cmd("SET").arg(RULES).arg(yaml).query_async(&mut h).await })
            .await;
        if stored.is_some() {
            self.publish(&Message::RulesChanged).await;
        }
    }

    /// Installs the rules stored in Redis, if any and if they differ.
    pub(super) async fn load_shared_rules(&self) {
        let yaml: Option<Option<String>> =
            self.call("rules", |mut h| async move { redis::cmd("GET").arg(RULES).query_async(&mut h).await }).await;
        let Some(Some(yaml)) = yaml else { return };
        if self.engine.rules().yaml == yaml {
            return;
        }
        match RuleSet::from_yaml(&yaml, "redis") {
            Ok(rules) => {
                let version = self.engine.control().install(rules, yaml, "redis".into());
                floodgate_engine::metrics::rule_reload("redis", true, version);
                tracing::info!(version, "rules applied on another replica installed");
            }
            Err(errors) => {
                floodgate_engine::metrics::rule_reload("redis", false, self.engine.rules().version);
                self.engine.control().refused("redis".into(), &errors.to_string());
                tracing::error!("rules stored in Redis are invalid; keeping the rules in force\n{errors}");
            }
        }
    }
}
