//! Replication through Redis: the network side of SPEC section 8.
//!
//! - `replicated` limits decide from memory; every `--sync-interval` each
//!   replica pushes what it took and adopts its share of the merged state; a
//!   bucket seen for the first time is pulled before it decides, so a restarted
//!   replica resumes where the replicas are.
//! - `strict` limits are decided by one atomic script per decision.
//! - Breakers share their windows and transitions; probes are granted
//!   cluster-wide; transitions are announced on pub/sub and stored for
//!   replicas that start later. Rules applied through Admin reach every replica.
//! - A dead Redis never makes a call fail or wait longer than `--redis-timeout`:
//!   after one failure, calls stop asking until the sync loop reaches Redis again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::{Answer, Descriptors, Engine, Installed, Prepared, Request, RequestError, Step, Verdict};
use crate::rules::SyncMode;

mod breakers;
mod conn;
mod limits;
mod rules;
mod scripts;

pub use conn::Target;
use conn::{CallError, Conn};
use scripts::Scripts;

/// How this replica uses Redis.
#[derive(Clone, Debug)]
pub struct Config {
    pub target: Target,
    pub sync_interval: Duration,
    pub timeout: Duration,
    /// This replica's name in the live-replica registry.
    pub replica_id: String,
}

pub struct Replication {
    engine: Arc<Engine>,
    conn: Arc<Conn>,
    scripts: Scripts,
    config: Config,
}

impl Replication {
    /// Connects (in the background) and starts the sync loop and the pub/sub
    /// listener. The server serves from memory until Redis answers.
    pub async fn start(config: Config, engine: Arc<Engine>) -> anyhow::Result<Arc<Replication>> {
        let conn = Conn::open(&config.target, config.timeout)?;
        engine.replica().enable();
        let r = Arc::new(Replication { engine, conn, scripts: Scripts::default(), config });
        r.load_shared_rules().await;
        tokio::spawn(sync_loop(Arc::downgrade(&r)));
        tokio::spawn(rules::listen(Arc::downgrade(&r)));
        Ok(r)
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// One Redis exchange. A failure marks Redis down, so that calls stop
    /// asking until the sync loop reaches it again.
    async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Option<T>
    where
        F: FnOnce(conn::Handle) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        match self.conn.call(what, f).await {
            Ok(v) => Some(v),
            Err(e) => {
                if self.engine.replica().up() {
                    tracing::warn!(op = what, error = %e, "Redis is unreachable: deciding from memory until it is back");
                }
                self.engine.replica().set_up(false);
                let kind = match e {
                    CallError::NotConnected => "not_connected",
                    CallError::Timeout(_) => "timeout",
                    CallError::Redis(_) => "error",
                };
                metrics::counter!(crate::metrics::REDIS_ERRORS, "op" => what, "kind" => kind).increment(1);
                None
            }
        }
    }

    /// One decision, asking Redis where it must: first touch of replicated
    /// buckets, probes of shared breakers, strict limits.
    pub async fn acquire<'r, D: Descriptors + ?Sized>(
        &self,
        rules: &'r Installed,
        req: &Request<'_, D>,
    ) -> Result<Answer<'r>, RequestError> {
        let mut p = self.engine.prepare(rules, req)?;
        if self.engine.replica().up() && !req.dry_run {
            let missing: Vec<_> = p
                .replicated_keys()
                .filter(|(_, k)| !self.engine.buckets().contains_key(k))
                .map(|(_, k)| k.clone())
                .collect();
            if !missing.is_empty() {
                self.pull(rules, req.resource, missing).await;
            }
            if self.engine.needs_remote_probe(&p, req.resource)
                && let Some(answer) = self.probe(rules, req.resource).await
            {
                p = p.with_remote_breaker(answer);
            }
        }
        let answer = self.decide(p).await;
        // Denied by this replica's lease while the replicas had more in
        // common: sync those buckets now, asking for a lease of at least the
        // cost, and decide again (nothing was taken the first time).
        let short_lease = answer.verdict == Verdict::RateLimited
            && self.engine.replica().up()
            && answer.limits.iter().filter(|r| r.exceeded).all(|r| r.limit.sync == SyncMode::Replicated);
        if short_lease {
            let p = self.engine.prepare(rules, req)?;
            if self.engine.worth_escalating(&p) {
                metrics::counter!(crate::metrics::REDIS_ESCALATIONS).increment(1);
                let keys = p.replicated_keys().map(|(_, k)| k.clone()).collect();
                self.lease_now(rules, req.resource, keys, p.cost()).await;
                return Ok(self.decide(p).await);
            }
        }
        Ok(answer)
    }

    async fn decide<'r>(&self, p: Prepared<'r>) -> Answer<'r> {
        let rules_answer = match self.engine.begin(p, self.engine.clock().now()) {
            Step::Done(answer) => answer,
            Step::Remote(pending) => {
                let decisions = self.strict(&pending).await;
                self.engine.finish(*pending, decisions)
            }
        };
        if !self.engine.outbox_is_empty() {
            self.flush_outbox(&self.engine.rules_full()).await;
        }
        rules_answer
    }

    /// After ReportOutcome: probe outcomes go to the shared breakers.
    pub async fn after_report(&self, rules: &Installed) {
        self.flush_outbox(rules).await;
    }

    /// Registers this replica and counts the live ones.
    async fn heartbeat(&self) -> bool {
        let ttl_ms = (self.config.sync_interval * 5).max(Duration::from_secs(1)).as_millis() as u64;
        let mut invocation = self.scripts.heartbeat.prepare_invoke();
        invocation.key(scripts::REPLICAS).arg(&self.config.replica_id).arg(ttl_ms);
        let live: Option<u32> =
            self.call("heartbeat", |mut h| async move { invocation.invoke_async(&mut h).await }).await;
        if let Some(n) = live {
            self.engine.replica().set_live(n);
            metrics::gauge!(crate::metrics::LIVE_REPLICAS).set(f64::from(n));
        }
        live.is_some()
    }

    async fn sync_once(&self) -> bool {
        if !self.heartbeat().await {
            return false;
        }
        // Redis answered: requests may ask it again.
        self.engine.replica().set_up(true);
        let rules = self.engine.rules_full();
        let buckets = self.sync_buckets(&rules).await;
        let breakers = self.sync_breakers(&rules).await;
        self.flush_outbox(&rules).await;
        buckets && breakers
    }
}

/// Every `--sync-interval`: heartbeat, buckets, breakers. While Redis is
/// unreachable, the attempts back off up to two seconds apart.
async fn sync_loop(weak: std::sync::Weak<Replication>) {
    let mut last_ok = Instant::now();
    let mut backoff = Duration::ZERO;
    loop {
        let Some(r) = weak.upgrade() else { return };
        let interval = r.config.sync_interval;
        let started = Instant::now();
        let ok = r.sync_once().await;
        if ok {
            last_ok = Instant::now();
            backoff = Duration::ZERO;
        } else {
            backoff = (backoff * 2).clamp(interval, Duration::from_secs(2));
        }
        metrics::histogram!(crate::metrics::REDIS_SYNC_DURATION).record(started.elapsed().as_secs_f64());
        metrics::gauge!(crate::metrics::REDIS_SYNC_LAG).set(last_ok.elapsed().as_secs_f64());
        drop(r);
        tokio::time::sleep(interval.max(backoff).saturating_sub(started.elapsed())).await;
    }
}
