//! Rules applied through Admin on one replica reach every replica: stored in
//! Redis (for replicas that start later) and announced on pub/sub. The same
//! channel carries breaker transitions.

use std::sync::Weak;
use std::time::Duration;

use tokio_stream::StreamExt;

use super::Replication;
use super::conn::Target;
use super::scripts::{EVENTS, RULES};
use floodgate_rules::RuleSet;

impl Replication {
    /// Stores rules just applied here, and tells the other replicas.
    pub async fn share_rules(&self, yaml: &str) {
        let yaml = yaml.to_string();
        let stored: Option<()> = self
            .call("rules", |mut h| async move { redis::cmd("SET").arg(RULES).arg(yaml).query_async(&mut h).await })
            .await;
        if stored.is_some() {
            self.publish("r".into()).await;
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
                let version = self.engine.install(rules, yaml, "redis".into());
                floodgate_engine::metrics::rule_reload("redis", true, version);
                tracing::info!(version, "rules applied on another replica installed");
            }
            Err(errors) => {
                floodgate_engine::metrics::rule_reload("redis", false, self.engine.rules().version);
                tracing::error!("rules stored in Redis are invalid; keeping the rules in force\n{errors}");
            }
        }
    }
}

/// Listens on the events channel; reconnects with backoff.
pub(super) async fn listen(weak: Weak<Replication>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(r) = weak.upgrade() else { return };
        let url = match &r.config.target {
            Target::Standalone(url) => url.clone(),
            // Classic pub/sub reaches every node of a cluster: any seed will do.
            Target::Cluster(nodes) => nodes.first().cloned().unwrap_or_default(),
        };
        let credentials = r.config.credentials.clone();
        drop(r);
        match subscribe(&url, &credentials).await {
            Ok(mut pubsub) => {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let Some(r) = weak.upgrade() else { return };
                    let text: String = msg.get_payload().unwrap_or_default();
                    if msg.get_channel_name() == EVENTS {
                        handle(&r, &text).await;
                    } else {
                        r.on_replica_message(&text);
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

async fn handle(r: &Replication, text: &str) {
    if text.starts_with("l ") {
        return r.on_loads(text);
    }
    match text.split_once(' ') {
        Some(("b", resource)) => {
            let rules = r.engine.rules_full();
            r.refresh_breaker(&rules, resource).await;
        }
        _ if text == "r" => r.load_shared_rules().await,
        _ if text == "o" => r.poll_overrides().await,
        _ if text == "v" => r.load_levels().await,
        _ => {}
    }
}
