//! What the console, the metrics and Admin's read calls see: use of global
//! limits, replication health, the hottest keys, figures read at scrape time.

use super::Views;
use crate::engine::Installed;
use crate::engine::hottest::TopLimit;
use crate::rules::Rule;

/// See [`Decider::replica_health`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaHealth {
    pub replicated: bool,
    pub redis_up: bool,
    pub live_replicas: u32,
    /// Live replicas whose rules differ from this one's.
    pub rules_differ: Vec<String>,
}

/// The use of one global limit, as the console shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalUse {
    pub name: String,
    pub limit: u64,
    /// `None`: a limit Redis decides that this replica has not asked yet.
    pub remaining: Option<u64>,
    /// The figure is Redis's, as of this replica's last call there.
    pub from_redis: bool,
}

/// Figures read at scrape time.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    pub keys: usize,
    /// Bytes of the keys held.
    pub key_bytes: usize,
    pub evicted: u64,
    pub permits_in_flight: usize,
    /// Every scope's level (the global one first).
    pub levels: Vec<crate::degradation::Level>,
}

impl Views<'_> {
    /// What an exact rule of `rules` (the rules in force) has in its
    /// global (keyless) limits now; empty for a template rule, whose buckets
    /// are per resource. A limit Redis decides shows what Redis said when
    /// this replica last asked it (the console asks Redis nothing: it
    /// refreshes every second for every open tab).
    pub(crate) fn global_use(&self, rules: &Installed, rule: &Rule) -> Vec<GlobalUse> {
        if rule.per_resource() || rule.limits.iter().all(|l| !l.key.is_empty()) {
            return Vec::new();
        }
        let none: std::collections::HashMap<String, String> = std::collections::HashMap::new();
        let Ok((answer, keys)) = self.engine.peek_keys(rules, &rule.name, &none, None) else { return Vec::new() };
        answer
            .limits
            .iter()
            .zip(keys)
            .map(|(l, (limit, key))| {
                let redis = self.replication.as_ref().filter(|_| crate::engine::sync::decided_by_store(limit));
                let remaining = match redis {
                    Some(r) => r.last_from_redis(&key),
                    None => Some(l.status.remaining),
                };
                GlobalUse { name: l.limit.name.clone(), limit: l.status.limit, remaining, from_redis: redis.is_some() }
            })
            .collect()
    }

    /// Whether this server replicates, whether Redis answers, and how many
    /// replicas are live.
    pub(crate) fn replica_health(&self) -> ReplicaHealth {
        match &self.replication {
            Some(r) => {
                let (redis_up, live_replicas) = r.health();
                ReplicaHealth { replicated: true, redis_up, live_replicas, rules_differ: r.rules_differ() }
            }
            None => ReplicaHealth { replicated: false, redis_up: false, live_replicas: 1, rules_differ: Vec::new() },
        }
    }

    /// Whether a rule in force is named (or patterned) `name`, as written.
    pub(crate) fn has_rule(&self, name: &str) -> bool {
        self.engine.rules().rules.rules().iter().any(|r| r.name == name)
    }

    /// Per limit, the keys denied and admitted most lately.
    pub(crate) fn top_keys(&self, rule: &str, n: usize) -> Vec<TopLimit> {
        self.engine.views().top_keys(&self.engine.rules(), rule, n)
    }

    /// Page `page` of the traffic recorded for `rule`'s limit `limit`:
    /// the fleet's, from Redis, when this server replicates and Redis
    /// answers; else this replica's own.
    pub(crate) async fn recorded_traffic(
        &self,
        rule: &str,
        limit: &str,
        page: usize,
    ) -> Result<crate::engine::hottest::RecordedPage, crate::engine::RequestError> {
        let rules = self.engine.rules_full();
        let record = self.engine.views().record_of(&rules, rule, limit, page)?;
        let shared = match &self.replication {
            Some(r) => {
                let now = self.engine.clock().now().as_nanos() / 1_000_000_000;
                r.records().page(&record, page, now).await
            }
            None => None,
        };
        self.engine.views().recorded_traffic(&rules, rule, limit, page, shared)
    }

    pub fn figures(&self) -> Figures {
        Figures {
            keys: self.engine.buckets().len(),
            key_bytes: self.engine.buckets().bytes(),
            evicted: self.engine.buckets().evicted(),
            permits_in_flight: self.engine.views().permits_in_flight(),
            levels: self.engine.views().levels(),
        }
    }
}
