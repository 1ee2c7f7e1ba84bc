//! Replication through Redis: the network side of the `replicated` and
//! `strict` modes. The engine
//! keeps the replication state (`engine::sync`); this module carries it to
//! and from Redis. Only the `Decider` calls in here.
//!
//! - `replicated` limits decide from memory; every `--sync-interval` each
//!   replica pushes what it took and adopts its share of the merged state; a
//!   bucket seen for the first time is pulled before it decides, so a restarted
//!   replica resumes where the replicas are.
//! - `strict` limits are decided by one atomic script per decision.
//! - Breakers share their windows and transitions; probes are granted
//!   cluster-wide; transitions are announced on pub/sub and stored for
//!   replicas that start later. Rules applied through Admin reach every replica.
//! - Concurrency limits count the fleet (`slots`): a strict in-flight set, or
//!   slots leased to each replica; a report of another replica's permit is
//!   passed on to it (`forward`).
//! - A dead Redis never makes a call fail or wait longer than `--redis-timeout`:
//!   after one failure, calls stop asking until the sync loop reaches Redis again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ScriptInvocation, Value};

use floodgate_core::time::Timestamp;
use floodgate_engine::Engine;
use floodgate_engine::sync::Replica;

mod adaptive;
mod adjust;
mod breakers;
mod conn;
mod decide;
mod forward;
mod levels;
mod limits;
mod markers;
mod message;
mod overrides;
mod rules;
mod scripts;
mod slots;
mod traffic;
mod wire;

/// What the conformance test (tests/conformance.rs) needs to run the
/// strict scripts as the server does, but on a clock the test sets. It is
/// public only because an integration test sees nothing else; nothing in
/// the server uses it.
#[doc(hidden)]
pub mod testing {
    pub use super::scripts::{Code, limit_args, marker_key};
    pub use super::wire::{Answered, TakeReply, parse_adjusted, parse_claimed_adjust, parse_sync};

    /// take.lua (a strict decision), whose time is its last argument (us).
    pub fn take_lua() -> String {
        super::scripts::lua_with_test_clock(include_str!("lua/take.lua"))
    }

    /// adjust.lua (units taken beyond the limit, or given back), whose time
    /// is its last argument (us).
    pub fn adjust_lua() -> String {
        super::scripts::lua_with_test_clock(include_str!("lua/adjust.lua"))
    }

    /// sync.lua (a replicated push and lease), whose time is its last
    /// argument (us).
    pub fn sync_lua() -> String {
        super::scripts::lua_with_test_clock(include_str!("lua/sync.lua"))
    }

    /// traffic.lua (a replica's counts added to a traffic record).
    pub fn traffic_lua() -> &'static str {
        include_str!("lua/traffic.lua")
    }
}

pub use adjust::{Adjust, Claimed};
use conn::{CallError, Conn};
pub use conn::{Credentials, Target};
pub use message::Forwarded;
use scripts::{ScriptName, Scripts};
use wire::ReplyError;

/// How this replica uses Redis.
#[derive(Clone, Debug)]
pub struct Config {
    pub target: Target,
    pub credentials: Credentials,
    pub sync_interval: Duration,
    pub timeout: Duration,
    /// This replica's name in the live-replica registry.
    pub replica_id: String,
}

/// The replication seen for one job. Each job's methods live on its own
/// type, so that `Replication`'s own are the connection, the decisions that
/// ask Redis, strict adjustments and forwarded reports:
/// [`Replication::limits`] syncs replicated buckets, runs strict scripts and
/// keeps concurrency slots, [`Replication::breakers`] shares breakers and
/// adaptive windows, and [`Replication::settings`] shares what operators set
/// (rules, overrides, levels) and load reports. A job handle only borrows
/// the replication and dereferences to it.
macro_rules! job {
    ($(#[$doc:meta])* $name:ident, $method:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name<'r>(&'r Replication);

        impl std::ops::Deref for $name<'_> {
            type Target = Replication;

            fn deref(&self) -> &Replication {
                self.0
            }
        }

        impl Replication {
            $(#[$doc])*
            pub fn $method(&self) -> $name<'_> {
                $name(self)
            }
        }
    };
}

job!(
    /// Replicated buckets, strict scripts and concurrency slots in Redis.
    Limits,
    limits
);
job!(
    /// Shared breakers, and adaptive limits' windows.
    Breakers,
    breakers
);
job!(
    /// The traffic records of limits with `history: true`, for the fleet.
    Records,
    records
);
job!(
    /// What operators set, shared by every replica (rules, overrides,
    /// degradation levels), and load reports.
    Settings,
    settings
);

/// How long Redis keeps a charge's idempotency key.
pub const CLAIM_TTL: Duration = Duration::from_secs(600);
/// Claims owed to Redis, at most.
const MAX_OWED_CLAIMS: usize = 100_000;

/// Where the idempotency key `hash` of a charge of `resource` is claimed.
fn claim_key_name(resource: &str, hash: u128) -> String {
    format!("{}:{hash:032x}", scripts::claimed_prefix(resource))
}

/// The claim of the idempotency key `hash` of a charge of `resource`: set
/// only when not set (its answer is nil then), for [`CLAIM_TTL`], in the
/// resource's slot.
fn claim_command(resource: &str, hash: u128) -> redis::Cmd {
    let key = claim_key_name(resource, hash);
    let ttl_ms = u64::try_from(CLAIM_TTL.as_millis()).unwrap_or(u64::MAX);
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(1).arg("NX").arg("PX").arg(ttl_ms);
    cmd
}

pub struct Replication {
    engine: Arc<Engine>,
    /// What the engine keeps for the fleet, shared with it.
    replica: Arc<Replica>,
    conn: Arc<Conn>,
    scripts: Scripts,
    config: Config,
    /// The version of the overrides stored in Redis that this replica has
    /// installed; `u64::MAX` before the first load. Loads are one at a time.
    overrides_seen: tokio::sync::Mutex<u64>,
    /// Redis has answered since this replica started.
    connected: std::sync::atomic::AtomicBool,
    /// Itself, for exchanges that run on tasks of their own (so that a
    /// caller that goes away never cuts one in the middle).
    me: std::sync::Weak<Replication>,
    /// This process among the replicas: its replica id and a random part,
    /// so that two processes given the same id still count as two live
    /// replicas and hold leases of their own.
    instance: String,
    /// One sync at a time: the loop's, or the last one at shutdown.
    syncing: tokio::sync::Mutex<()>,
    /// When Redis last answered after being away (engine clock, ns): until
    /// every replica has had time to say it is alive again, the live count
    /// does not drop (the others' entries expired during the outage; a
    /// replica that counted itself alone would lease all of every bucket).
    back_at: std::sync::atomic::AtomicU64,
    /// Woken whenever syncs of replicated buckets land (a bucket has one
    /// sync out at a time; see `lease_now`).
    landed: tokio::sync::Notify,
    /// Reports passed on to the replicas that issued their permits.
    forwards: forward::Forwards,
    /// Idempotency keys of charges taken while Redis did not answer: claimed
    /// there when it answers again, so that a retry sent to another replica
    /// then is caught (at most [`MAX_OWED_CLAIMS`]; beyond, the oldest go).
    owed_claims: std::sync::Mutex<std::collections::VecDeque<(String, u128)>>,
    /// One flush of strict slots at a time, so that they reach Redis in order.
    slot_flush: tokio::sync::Mutex<()>,
    /// Sync rounds done, for work done every few of them.
    rounds: std::sync::atomic::AtomicU64,
    /// The version of the rules the last sync ran with.
    rules_seen: std::sync::atomic::AtomicU64,
    /// Load reports taken here for the other replicas, and the operators' levels.
    levels: levels::Levels,
    /// The run id of the Redis process that answered the last heartbeat.
    identity: std::sync::Mutex<String>,
    /// When the heartbeat met another Redis process: every resource's marker
    /// found before then is checked in the rounds that follow, not only
    /// idle ones. `None` once all are checked.
    identity_changed: std::sync::Mutex<Option<Timestamp>>,
    /// The live replicas whose rules differ from this one's.
    rules_differ: std::sync::Mutex<Vec<String>>,
    /// The digest of this replica's rules, and the rules version it is of:
    /// computed again only when the rules change, not at every heartbeat.
    digest: std::sync::Mutex<Option<(u64, String)>>,
    /// One restore at a time (see `Limits::restore`).
    restoring: tokio::sync::Mutex<()>,
}

/// A digest of the rules a replica decides by: its rules file (or the rules
/// applied through Admin or shared through Redis), its Sentinel rules and
/// its envoyproxy/ratelimit configuration. Overrides set at run time are
/// shared through Redis and left out. FNV-1a, 64 bits: it tells two sets of
/// rules apart, it does not keep a secret.
fn digest_of(rules: &floodgate_engine::Installed) -> String {
    use floodgate_core::digest::{FNV_START, fnv1a};
    let parts = [rules.yaml.as_str(), rules.sentinel.text.as_str(), rules.envoy.text.as_str()];
    let hash = parts.iter().fold(FNV_START, |hash, part| fnv1a(hash, part.bytes().chain([0xff])));
    format!("{hash:016x}")
}

impl Replication {
    /// Connects (in the background) and starts the sync loop and the pub/sub
    /// listener. The server serves from memory until Redis answers. The
    /// engine must share its state through `replica`
    /// ([`Engine::with_coordination`]).
    pub async fn start(config: Config, engine: Arc<Engine>, replica: Arc<Replica>) -> anyhow::Result<Arc<Replication>> {
        let conn = Conn::open(&config.target, &config.credentials, config.timeout)?;
        let overrides_seen = tokio::sync::Mutex::new(u64::MAX);
        let connected = std::sync::atomic::AtomicBool::new(false);
        // The tag of this process's permit ids, then a random part.
        let tag = floodgate_engine::guards::PermitId::tag();
        let instance = format!("{}#{tag:08x}{:08x}", config.replica_id, rand::random::<u32>());
        let r = Arc::new_cyclic(|me| Replication {
            engine,
            replica,
            conn,
            scripts: Scripts::default(),
            config,
            overrides_seen,
            connected,
            me: me.clone(),
            instance,
            syncing: tokio::sync::Mutex::new(()),
            landed: tokio::sync::Notify::new(),
            back_at: std::sync::atomic::AtomicU64::new(0),
            forwards: forward::Forwards::default(),
            owed_claims: std::sync::Mutex::new(std::collections::VecDeque::new()),
            slot_flush: tokio::sync::Mutex::new(()),
            rounds: std::sync::atomic::AtomicU64::new(0),
            rules_seen: std::sync::atomic::AtomicU64::new(0),
            levels: levels::Levels::default(),
            identity: std::sync::Mutex::new(String::new()),
            rules_differ: std::sync::Mutex::new(Vec::new()),
            digest: std::sync::Mutex::new(None),
            restoring: tokio::sync::Mutex::new(()),
            identity_changed: std::sync::Mutex::new(None),
        });
        r.settings().load_shared_rules().await;
        r.settings().poll_overrides().await;
        r.settings().load_levels().await;
        tokio::spawn(sync_loop(Arc::downgrade(&r)));
        tokio::spawn(levels::send_loop(Arc::downgrade(&r)));
        tokio::spawn(traffic::send_loop(Arc::downgrade(&r)));
        tokio::spawn(rules::listen(Arc::downgrade(&r)));
        Ok(r)
    }

    /// Runs `work` on a task of its own and waits for it: a caller that
    /// goes away (its future dropped at an `.await`) never cuts an exchange
    /// with Redis in the middle; what the work hands out and nobody takes
    /// drops there. `None` when the replication is gone or the task panicked.
    async fn detached<T, F, Fut>(&self, work: F) -> Option<T>
    where
        F: FnOnce(Arc<Replication>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let me = self.me.upgrade()?;
        tokio::spawn(work(me)).await.ok()
    }

    fn sync(&self) -> &Replica {
        &self.replica
    }

    /// Whether Redis answered last time, and how many replicas are live.
    /// What Redis last said `key` (a bucket it decides) had left, when this
    /// replica last asked it.
    pub fn last_from_redis(&self, key: &floodgate_core::store::BucketKey) -> Option<u64> {
        self.replica.last_from_store(key)
    }

    pub fn health(&self) -> (bool, u32) {
        (self.replica.up(), self.replica.live())
    }

    /// Claims the idempotency key `hash` of a charge of `resource` for
    /// [`CLAIM_TTL`]: `Some(true)` when this is its first claim,
    /// `Some(false)` when another replica (or this one) claimed it before,
    /// `None` when Redis did not answer (or is known to be away: no call is
    /// made then). A claim Redis did not take is owed, and made when it
    /// answers again. The key sits in the resource's slot.
    pub async fn claim_key(&self, resource: &str, hash: u128) -> Option<bool> {
        if !self.sync().up() {
            self.owe_claim(resource, hash);
            return None;
        }
        let claim = claim_command(resource, hash);
        let set: Option<Option<String>> =
            self.call("claim_key", |mut h| async move { claim.query_async(&mut h).await }).await;
        if set.is_none() {
            self.owe_claim(resource, hash);
        }
        set.map(|answer| answer.is_some())
    }

    fn owe_claim(&self, resource: &str, hash: u128) {
        let mut owed = self.owed_claims.lock().unwrap_or_else(|e| e.into_inner());
        if owed.len() >= MAX_OWED_CLAIMS {
            owed.pop_front();
        }
        owed.push_back((resource.to_string(), hash));
    }

    /// Makes the claims owed since Redis stopped answering, a pipeline of
    /// 500 at a time; what Redis does not take stays owed. False when it
    /// stopped answering again.
    pub(crate) async fn pay_claims(&self) -> bool {
        loop {
            let chunk: Vec<(String, u128)> = {
                let mut owed = self.owed_claims.lock().unwrap_or_else(|e| e.into_inner());
                let n = owed.len().min(500);
                owed.drain(..n).collect()
            };
            if chunk.is_empty() {
                return true;
            }
            let mut pipe = redis::pipe();
            for (resource, hash) in &chunk {
                pipe.add_command(claim_command(resource, *hash)).ignore();
            }
            let done: Option<()> = self.call("claim_key", |mut h| async move { pipe.query_async(&mut h).await }).await;
            if done.is_none() {
                let mut owed = self.owed_claims.lock().unwrap_or_else(|e| e.into_inner());
                for claim in chunk.into_iter().rev() {
                    owed.push_front(claim);
                }
                owed.truncate(MAX_OWED_CLAIMS);
                return false;
            }
        }
    }

    /// One Redis exchange. A failure marks Redis down, so that calls stop
    /// asking until the sync loop reaches it again.
    async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Option<T>
    where
        F: FnOnce(conn::Handle) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.call_within(what, self.config.timeout, f).await
    }

    /// [`Replication::call`] with another timeout.
    async fn call_within<T, F, Fut>(&self, what: &'static str, timeout: Duration, f: F) -> Option<T>
    where
        F: FnOnce(conn::Handle) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        match self.conn.call_within(what, timeout, f).await {
            Ok(v) => Some(v),
            Err(e) => {
                if self.sync().up() {
                    tracing::warn!(op = what, error = %e, "Redis is unreachable: deciding from memory and the outage policies until it is back");
                }
                self.sync().set_up(false);
                let kind = match e {
                    CallError::NotConnected => "not_connected",
                    CallError::Timeout(_) => "timeout",
                    CallError::Redis(_) => "error",
                };
                metrics::counter!(floodgate_engine::metrics::REDIS_ERRORS, "op" => what, "kind" => kind).increment(1);
                None
            }
        }
    }

    /// Runs a script and parses its reply. A reply of the wrong shape is
    /// logged and counted (`kind="bad_reply"`) and answers `None`, like a
    /// failed call, without marking Redis down.
    async fn run<T>(
        &self,
        name: ScriptName,
        invocation: ScriptInvocation<'_>,
        parse: impl FnOnce(Value) -> Result<T, ReplyError>,
    ) -> Option<T> {
        let reply: Value = self.call(name.op(), |mut h| async move { invocation.invoke_async(&mut h).await }).await?;
        match parse(reply) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::error!(error = %e, "Redis answered a script with an unexpected reply");
                metrics::counter!(floodgate_engine::metrics::REDIS_ERRORS, "op" => name.op(), "kind" => "bad_reply")
                    .increment(1);
                None
            }
        }
    }

    /// Registers this replica and counts the live ones.
    async fn heartbeat(&self) -> bool {
        let ttl = (self.config.sync_interval * 5).max(Duration::from_secs(1));
        let mut invocation = self.scripts.get(ScriptName::Heartbeat).prepare_invoke();
        let digest = self.rules_digest();
        invocation.key(scripts::REPLICAS).key(scripts::RULES_DIGESTS);
        invocation.arg(&self.instance).arg(ttl.as_millis() as u64).arg(&digest);
        let Some(wire::Live { live, now_us: redis_now, identity, names, digests }) =
            self.run(ScriptName::Heartbeat, invocation, wire::parse_live).await
        else {
            return false;
        };
        self.learn_rules_of_others(&digest, &names, &digests);
        self.learn_live(&names);
        self.learn_identity(identity);
        let now = self.engine.clock().now();
        let sync = self.sync();
        if !sync.up() && self.connected.load(std::sync::atomic::Ordering::Acquire) {
            self.back_at.store(now.as_nanos(), std::sync::atomic::Ordering::Release);
            // Back, perhaps empty: the strict permits held here go back first.
            self.rounds.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let back_at = Timestamp::from_nanos(self.back_at.load(std::sync::atomic::Ordering::Acquire));
        let returning =
            back_at != Timestamp::ZERO && now.saturating_since(back_at) < floodgate_core::time::duration_nanos(ttl);
        let live = if returning { live.max(sync.live()) } else { live };
        sync.set_live(live);
        sync.set_redis_clock(redis_now, now);
        let rules = self.engine.rules_full();
        sync.forget_idle(now, |limit| rules.algorithm(limit).map(|a| a.window().saturating_mul(2)));
        metrics::gauge!(floodgate_engine::metrics::REMEMBERED_BUCKETS).set(sync.remembered() as f64);
        metrics::gauge!(floodgate_engine::metrics::LIVE_REPLICAS).set(f64::from(live));
        true
    }

    /// Notes which live replicas decide by other rules than this one (their
    /// digests differ), and says so when that changes: each replica decides
    /// by its own rules meanwhile, so one limit may hold different figures.
    fn learn_rules_of_others(&self, mine: &str, names: &[String], digests: &[String]) {
        let differ: Vec<String> = names
            .iter()
            .zip(digests)
            .filter(|(name, digest)| **name != self.instance && !digest.is_empty() && digest.as_str() != mine)
            .map(|(name, _)| name.clone())
            .collect();
        metrics::gauge!(floodgate_engine::metrics::RULES_DIFFER).set(differ.len() as f64);
        let mut known = self.rules_differ.lock().unwrap_or_else(|e| e.into_inner());
        if *known == differ {
            return;
        }
        match differ.is_empty() {
            true => tracing::info!("every live replica now decides by the same rules as this one"),
            false => tracing::warn!(
                replicas = ?differ,
                digest = mine,
                "live replicas decide by other rules than this one: each decides by its own meanwhile"
            ),
        }
        *known = differ;
    }

    /// The digest of the rules in force (see [`digest_of`]), hashed once
    /// per rules version: the texts may be megabytes, and the heartbeat runs
    /// every sync interval.
    fn rules_digest(&self) -> String {
        let rules = self.engine.rules_full();
        let mut cached = self.digest.lock().unwrap_or_else(|e| e.into_inner());
        match &*cached {
            Some((version, digest)) if *version == rules.version => digest.clone(),
            _ => {
                let digest = digest_of(&rules);
                *cached = Some((rules.version, digest.clone()));
                digest
            }
        }
    }

    /// The live replicas whose rules differ from this one's, as of the last
    /// heartbeat (empty when all agree, or without Redis).
    pub fn rules_differ(&self) -> Vec<String> {
        self.rules_differ.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Notes the run id of the Redis that answered a heartbeat. Another one
    /// than before means Redis restarted or failed over, and may hold older
    /// counts than the replicas saw: every known resource is checked.
    fn learn_identity(&self, identity: String) {
        let mut known = self.identity.lock().unwrap_or_else(|e| e.into_inner());
        if *known == identity {
            return;
        }
        if !known.is_empty() {
            tracing::warn!(
                before = %known,
                now = %identity,
                "Redis is another process than before (a restart or a failover): checking every resource this \
                 replica knows, and restoring what Redis lost"
            );
            metrics::counter!(floodgate_engine::metrics::REDIS_IDENTITY_CHANGES).increment(1);
            let now = self.engine.clock().now();
            *self.identity_changed.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        }
        *known = identity;
    }

    /// The last sync of a replica shutting down: what it took and what it
    /// owes reach Redis rather than die with it. Bounded by `within`.
    pub async fn last_sync(&self, within: Duration) {
        // What the traffic records counted since their last send goes too.
        let last = async {
            let synced = self.sync_once().await;
            self.records().send().await;
            synced
        };
        match tokio::time::timeout(within, last).await {
            Ok(true) => tracing::info!("last sync done: what this replica took and owes is in Redis"),
            Ok(false) => tracing::warn!("last sync failed: what this replica took since its last sync is lost"),
            Err(_) => {
                tracing::warn!(?within, "last sync timed out: what this replica took since its last sync is lost")
            }
        }
    }

    async fn sync_once(&self) -> bool {
        let _one_at_a_time = self.syncing.lock().await;
        if !self.heartbeat().await {
            return false;
        }
        let rules = self.engine.rules_full();
        // Redis answered: what was admitted here while it was away is paid
        // first; then requests ask it again, and the outage's local buckets go.
        if !self.come_back(&rules).await {
            return false;
        }
        // Resources nobody uses here: did Redis lose them or go back in time?
        // After Redis changed identity, every resource known before, a batch
        // each round until none is left.
        let every_second = (Duration::from_secs(1).as_nanos() / self.config.sync_interval.as_nanos().max(1)).max(1);
        let changed = *self.identity_changed.lock().unwrap_or_else(|e| e.into_inner());
        let round = self.rounds.load(std::sync::atomic::Ordering::Relaxed);
        if changed.is_some() || u128::from(round) % every_second == 0 {
            match self.limits().check_markers(&rules, changed).await {
                markers::Checked::Failed => return false,
                markers::Checked::More => {}
                markers::Checked::All => {
                    // Only the change checked here is done: another one may
                    // have come in the meantime.
                    let mut slot = self.identity_changed.lock().unwrap_or_else(|e| e.into_inner());
                    if *slot == changed {
                        *slot = None;
                    }
                }
            }
        }
        self.settings().poll_overrides().await;
        // Strict concurrency slots: given back and added; every second (and
        // first when Redis is back) those held here put back, should Redis
        // have lost them.
        // New rules may have made a limit strict: its calls in flight join the set now.
        if self.limits().rules_changed(rules.version) {
            self.rounds.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let round = self.rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Operators' levels, should an announcement have been missed: every 10 rounds.
        if round.is_multiple_of(10) {
            self.settings().load_levels().await;
        }
        if u128::from(round) % every_second == 0 {
            self.limits().reassert_slots().await;
        } else {
            self.limits().flush_slot_ops().await;
        }
        self.refresh_strict(&rules).await;
        let buckets = self.limits().sync_buckets(&rules).await;
        let breakers = self.breakers().sync_breakers(&rules).await;
        self.breakers().flush_outbox(&rules).await;
        self.limits().sync_leases(&rules).await;
        let adaptive = self.breakers().sync_adaptive(&rules).await;
        buckets && breakers && adaptive
    }
}

/// How far apart sync attempts get while Redis is unreachable. Short: until
/// a replica sees Redis back, it decides strict limits on its own, what it
/// admitted is only in its memory (a crash then loses it), and a Redis that
/// flaps (back for less than this) is missed, so the replicas' outages no
/// longer line up.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Every `--sync-interval`: heartbeat, buckets, breakers. While Redis is
/// unreachable, the attempts back off up to [`MAX_BACKOFF`] apart.
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
            backoff = (backoff * 2).clamp(interval, MAX_BACKOFF.max(interval));
        }
        metrics::histogram!(floodgate_engine::metrics::REDIS_SYNC_DURATION).record(started.elapsed().as_secs_f64());
        metrics::gauge!(floodgate_engine::metrics::REDIS_SYNC_LAG).set(last_ok.elapsed().as_secs_f64());
        drop(r);
        tokio::time::sleep(interval.max(backoff).saturating_sub(started.elapsed())).await;
    }
}
