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

/// A proposal from `Admin.ProposeLimit`.
#[derive(Debug)]
pub struct Proposed {
    pub made: crate::rules::proposed::FromRecord,
    /// The record was the fleet's (read from Redis).
    pub shared: bool,
}

/// Why `Admin.ProposeLimit` made no proposal.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error(transparent)]
    Request(#[from] crate::engine::RequestError),
    /// Settings out of range, or a limit recommend cannot propose for.
    #[error("{0}")]
    Invalid(String),
    #[error("'{0}' has recorded no calls yet")]
    Empty(String),
    /// The record does not fit the limit (or the rules its override).
    #[error("{0}")]
    Unfit(String),
    #[error("another proposal is being made on this server; retry when it is done")]
    Busy,
    #[error(
        "the record holds {0} calls, more than the {MAX_REPLAYED} a replay on the server may take: run floodgate \
         recommend --recorded, which replays on the machine it runs on"
    )]
    TooLarge(u64),
    #[error("Redis stopped or started answering while the record was read; retry")]
    Mixed,
}

/// The most calls (summed over the record's keys and days) that a proposal
/// on the server replays: about 5 seconds of one blocking thread.
pub const MAX_REPLAYED: u64 = 200_000_000;

/// One proposal at a time on a server: each takes a blocking thread for
/// up to a few seconds and memory for the whole record.
static PROPOSING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

impl Views<'_> {
    /// A proposal for `rule`'s limit `limit` from its recorded traffic (the
    /// fleet's with Redis), with the rules in force written with it.
    pub(crate) async fn propose_limit(
        &self,
        rule: &str,
        limit: &str,
        settings: floodgate_core::recommend::Settings,
    ) -> Result<Proposed, ProposeError> {
        use floodgate_core::recommend::traffic::{self, KeyPeaks, SHARDS};
        settings.validate().map_err(ProposeError::Invalid)?;
        let _one = PROPOSING.try_acquire().map_err(|_| ProposeError::Busy)?;
        let mut keys: Vec<KeyPeaks> = Vec::new();
        let (mut from_redis, mut own) = (0, 0);
        let mut calls: u64 = 0;
        for page in 0..SHARDS {
            let got = self.recorded_traffic(rule, limit, page).await?;
            if got.shared {
                from_redis += 1;
            } else {
                own += 1;
            }
            for (key, peaks) in got.page {
                calls = calls.saturating_add(peaks.iter().map(|&(_, p)| u64::from(p)).sum::<u64>());
                keys.push(KeyPeaks { key: key.into(), peaks });
            }
        }
        if from_redis > 0 && own > 0 {
            return Err(ProposeError::Mixed);
        }
        if calls > MAX_REPLAYED {
            return Err(ProposeError::TooLarge(calls));
        }
        let rules = self.engine.rules_full();
        let name = format!("{rule}/{limit}");
        let made = crate::runtime::off_workers(move || {
            // Held until the replay ends, even when the caller goes away.
            let _one = _one;
            let (history, _) = traffic::history(&keys, 2 * traffic::MAX_KEYS * traffic::DAYS)
                .map_err(|e| ProposeError::Unfit(e.to_string()))?;
            crate::rules::proposed::from_record(&rules.file, &rules.yaml, &name, &history, &settings).map_err(|e| {
                use crate::rules::proposed::NoProposal;
                match e {
                    NoProposal::Refused(why) => {
                        // The reasons name the CLI's flag; here the field is `limit`.
                        ProposeError::Invalid(format!("limit: {}", why.strip_prefix("--limit: ").unwrap_or(&why)))
                    }
                    NoProposal::Empty => ProposeError::Empty(name.clone()),
                    NoProposal::Unfit(why) => ProposeError::Unfit(why),
                }
            })
        })
        .await?;
        Ok(Proposed { made, shared: from_redis > 0 })
    }
}
