//! The fault checker: two real replicas and a real `redis-server` (and, for
//! one schedule, a real three-master Redis Cluster) under seeded random
//! schedules of faults while clients send traffic, and after each schedule
//! the invariants the README states.
//!
//! A schedule is a list of faults, one after another with gaps between them,
//! drawn from its seed:
//!
//! - Redis stalled (SIGSTOP), or killed and back empty, or shut down and back
//!   with its data;
//! - Redis restarted from an older dump: BGSAVE, traffic goes on for 0.5-3 s,
//!   SIGKILL (nothing is saved at exit), and back from that dump, older than
//!   what the replicas saw and with another run id;
//! - two faults at once: a stall that begins 50-300 ms after Redis came back
//!   from a restart (empty or with its data), while the replicas restore and
//!   pay; and a replica killed (SIGKILL) while Redis is stalled, which may
//!   start again before Redis answers;
//! - a replica killed (SIGKILL) or stopped (SIGTERM) and started again on its
//!   port;
//! - the rules file rewritten (reloaded by both), overrides set and deleted,
//!   an operator's level set;
//! - bursts of calls the client gives up on after a few milliseconds
//!   (cancelled at whatever `.await` the server is in).
//!
//! Meanwhile each replica gets 20 calls a second on every limit below, some
//! of them cancelled too.
//!
//! After each schedule, once Redis is back and leases have expired, what is
//! left is drained and the totals checked:
//!
//! - `strict`, `on_redis_error: deny`: never more than the limit, through an
//!   older dump too (the replicas put back what they knew).
//! - `strict`, `on_redis_error: local`: at most the limit plus, per outage,
//!   what the replicas admit in one sync interval (the README's bound). A
//!   stall during a restart is two outages. The README's two exceptions are
//!   added, counted from what happened: the debt of a replica killed while
//!   Redis is away or before it paid, and the calls of a replica that starts
//!   while Redis is away (it never saw the bucket and decides from its share
//!   of the whole limit).
//! - `replicated`: at most the limit plus R x rate x sync interval per fault
//!   (an older dump is one fault, like a restart).
//! - nothing lost: what was admitted, drained or cancelled covers the limit,
//!   less the same slack (a lease lost for good would show here).
//! - concurrency slots (`replicated` and `strict`, fleet-wide): once
//!   `permit_ttl` has passed, the replicas together grant exactly all the
//!   slots again (none lost to a cancelled call, a dead client, a dead
//!   replica or an empty or older Redis; none granted twice).
//! - a breaker whose calls all fail admits at most what it needs to open
//!   and then its probes, counted across the replicas. Breaker states are
//!   not restored, so after an empty Redis or an older dump it may open once
//!   more.
//! - settle and Charge (a `strict`, `deny` window taking estimates of 4
//!   settled at 0-4, and charges of 1): what Redis counts is what the
//!   clients know was taken, within what they cannot know, and at most the
//!   limit but for charges. After an older dump this is checked from both
//!   sides; after an empty Redis only from above.
//! - every replica is ready at the end, and no log has a panic.
//!
//! On the cluster, Redis faults are stalls of one master at a time (the
//! resources on the others go on), with the same replica faults, and a
//! replica killed while a master is stalled. The cluster has no Redis
//! replicas, so there is no failover to a lagging replica here.
//!
//! `FLOODGATE_CHAOS_SECONDS` (default 100) bounds the run;
//! `FLOODGATE_CHAOS_SEED=N` replays one schedule (`FLOODGATE_CHAOS_FAULTS=0,2`
//! keeps only those of its faults, to narrow a failure down); `FLOODGATE_CHAOS_BASE`
//! picks the first seed (CI's is fixed, `scripts/chaos` draws one);
//! `FLOODGATE_CHAOS_CLUSTER_SEED=N` replays a cluster schedule.

// Each test runs on its own thread and runtime; the lock held across awaits
// only makes them take turns.
#![allow(clippy::await_holding_lock)]

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use support::redis::{RedisCluster, RedisServer};
use support::*;
use tonic::transport::{Channel, Endpoint};

/// Per window limit, per schedule.
const LIMIT: u64 = 400;
/// Concurrency slots of the fleet, and their permits' TTL.
const SLOTS: usize = 4;
const PERMIT_TTL: Duration = Duration::from_secs(2);
/// Calls a second per replica and limit.
const RATE: u64 = 20;
const SYNC: Duration = Duration::from_millis(100);
const REPLICAS: usize = 2;
/// The `br-` breaker: calls it needs to open, and probes per half-open
/// period (it waits 1 s open). Every call it admits fails.
const BREAKER_MINIMUM: u64 = 4;
const HALF_OPEN_CALLS: u64 = 2;
/// Faults happen within this much of a schedule's start.
const FAULT_SPAN: Duration = Duration::from_secs(12);

fn rules(noise: u64) -> String {
    format!(
        r#"
resources:
  - name: "sd-*"
    limits: [ {{ name: hourly, algorithm: fixed_window, limit: {LIMIT}, window: 1h, sync: strict, on_redis_error: deny }} ]
  - name: "sl-*"
    limits: [ {{ name: hourly, algorithm: fixed_window, limit: {LIMIT}, window: 1h, sync: strict, on_redis_error: local }} ]
  - name: "rp-*"
    limits: [ {{ name: hourly, algorithm: fixed_window, limit: {LIMIT}, window: 1h }} ]
  - name: "st-*"
    limits: [ {{ name: hourly, algorithm: fixed_window, limit: {LIMIT}, window: 1h, sync: strict, on_redis_error: deny }} ]
  - name: "cc-*"
    concurrency: {{ max_in_flight: {SLOTS}, permit_ttl: 2s }}
  - name: "cs-*"
    concurrency: {{ max_in_flight: {SLOTS}, permit_ttl: 2s, sync: strict }}
  - name: "br-*"
    breaker:
      window: {{ kind: count, size: 10 }}
      minimum_calls: {BREAKER_MINIMUM}
      failure_rate_threshold: 0.5
      wait_in_open: 1s
      half_open_calls: {HALF_OPEN_CALLS}
      max_wait_in_half_open: 2s
  - name: ov
    limits: [ {{ name: per-tenant, key: [tenant], algorithm: token_bucket, capacity: 1000, refill_per_second: 100 }} ]
  # reload {noise}
  - name: noise-{noise}
    limits: [ {{ name: n, algorithm: fixed_window, limit: 5, window: 1m }} ]
systems:
  - {{ name: chaos, resources: ["lv-*"] }}
"#
    )
}

/// splitmix64: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

#[derive(Clone, Debug)]
enum Fault {
    /// SIGSTOP (of Redis, or of one master of a cluster) for this long, then
    /// SIGCONT.
    Stall(Duration),
    /// SIGKILL; down this long; back with nothing.
    RedisEmpty(Duration),
    /// SHUTDOWN SAVE; down this long; back with its data.
    RedisRestart(Duration),
    /// SIGKILL replica i; down this long; started again on its port.
    KillReplica(usize, Duration),
    /// SIGTERM replica i (it drains and syncs a last time); down this long;
    /// started again on its port.
    StopReplica(usize, Duration),
    /// The rules file rewritten (same limits, another unrelated rule).
    Reload,
    /// An override set (or the last one deleted) through replica i.
    Override(usize, bool),
    /// This many calls through replica i, each given up on after 1-20 ms.
    Cancels(usize, u32),
    /// An operator's level for system `chaos` (`None`: back to automatic)
    /// set through replica i.
    Level(usize, Option<u32>),
    /// BGSAVE (until the dump is written); traffic goes on for `gap`; SIGKILL
    /// (nothing is saved at exit); down for `down`; back from the dump, so
    /// Redis is older than what the replicas saw (and has another run id).
    RedisOlderDump { gap: Duration, down: Duration },
    /// Two faults at once: Redis restarted after `down` (SIGKILL and back
    /// with nothing when `empty`, else SHUTDOWN SAVE and back with its data),
    /// then, `after` it answers again, stalled (SIGSTOP) for `stall`. The
    /// stall meets the replicas while they restore and pay their debts.
    StallDuringRestart { empty: bool, down: Duration, after: Duration, stall: Duration },
    /// Two faults at once: Redis (or one master) stalled for `stall`, and
    /// `after` it stopped, replica `replica` killed (SIGKILL) and down for
    /// `down`. The replica may start again while Redis is still stalled.
    KillDuringStall { replica: usize, stall: Duration, after: Duration, down: Duration },
}

impl Fault {
    /// How many times Redis goes away in it (0: it stays up).
    fn outages(&self) -> u64 {
        match self {
            Fault::Stall(_)
            | Fault::RedisEmpty(_)
            | Fault::RedisRestart(_)
            | Fault::RedisOlderDump { .. }
            | Fault::KillDuringStall { .. } => 1,
            Fault::StallDuringRestart { .. } => 2,
            _ => 0,
        }
    }

    /// How many replicas it kills or stops.
    fn kills(&self) -> u64 {
        u64::from(matches!(self, Fault::KillReplica(..) | Fault::StopReplica(..) | Fault::KillDuringStall { .. }))
    }

    /// Whether Redis comes back with nothing: what it counts is then what
    /// the replicas put back.
    fn empties_redis(&self) -> bool {
        matches!(self, Fault::RedisEmpty(_) | Fault::StallDuringRestart { empty: true, .. })
    }

    /// Whether Redis comes back without the breaker state it had: empty, or
    /// from an older dump. Breaker states are not restored (the README), so
    /// the shared breaker may have to open again.
    fn forgets_breakers(&self) -> bool {
        self.empties_redis() || matches!(self, Fault::RedisOlderDump { .. })
    }

    /// How long it lasts, as planned (restarts take a little longer).
    fn length(&self) -> Duration {
        match self {
            Fault::Stall(d)
            | Fault::RedisEmpty(d)
            | Fault::RedisRestart(d)
            | Fault::KillReplica(_, d)
            | Fault::StopReplica(_, d) => *d,
            Fault::RedisOlderDump { gap, down } => *gap + *down,
            Fault::StallDuringRestart { down, after, stall, .. } => *down + *after + *stall,
            Fault::KillDuringStall { stall, after, down, .. } => (*stall).max(*after + *down),
            _ => Duration::ZERO,
        }
    }
}

/// A schedule: (start offset, fault), in order. On a cluster, Redis is only
/// stalled (a master at a time), not restarted.
fn schedule(seed: u64, cluster: bool) -> Vec<(Duration, Fault)> {
    let mut rng = Rng(seed);
    let mut at = rng.millis(300, 2000);
    let mut out = Vec::new();
    while at < FAULT_SPAN {
        // Ten kinds of one draw in twelve each, as before the last two were
        // added: an older dump, and two faults at once.
        let fault = match rng.below(12) {
            9 => Fault::Level(rng.below(REPLICAS as u64) as usize, Some(rng.below(5) as u32).filter(|&l| l <= 3)),
            0 | 1 => Fault::Stall(rng.millis(200, 3000)),
            2 | 3 | 10 if cluster => Fault::Stall(rng.millis(100, 2000)),
            2 => Fault::RedisEmpty(rng.millis(100, 2000)),
            3 => Fault::RedisRestart(rng.millis(100, 1500)),
            4 => Fault::KillReplica(rng.below(REPLICAS as u64) as usize, rng.millis(100, 1000)),
            5 => Fault::Reload,
            8 => Fault::StopReplica(rng.below(REPLICAS as u64) as usize, rng.millis(100, 1000)),
            6 => Fault::Override(rng.below(REPLICAS as u64) as usize, rng.below(3) != 0),
            10 => Fault::RedisOlderDump { gap: rng.millis(500, 3000), down: rng.millis(100, 2000) },
            // A cluster's nodes are not restarted: only the second kind.
            11 if cluster || rng.below(2) == 0 => {
                let stall = rng.millis(500, 3000);
                Fault::KillDuringStall {
                    replica: rng.below(REPLICAS as u64) as usize,
                    stall,
                    after: rng.millis(100, stall.as_millis() as u64 - 100),
                    down: rng.millis(100, 1000),
                }
            }
            11 => Fault::StallDuringRestart {
                empty: rng.below(2) == 0,
                down: rng.millis(100, 1500),
                after: rng.millis(50, 300),
                stall: rng.millis(200, 1500),
            },
            _ => Fault::Cancels(rng.below(REPLICAS as u64) as usize, 20 + rng.below(80) as u32),
        };
        let length = fault.length();
        out.push((at, fault));
        at += length + rng.millis(200, 2000);
    }
    // To narrow a failure down: FLOODGATE_CHAOS_FAULTS=0,2 keeps only those.
    if let Ok(keep) = std::env::var("FLOODGATE_CHAOS_FAULTS") {
        let keep: Vec<usize> = keep.split(',').filter_map(|i| i.trim().parse().ok()).collect();
        out = out.into_iter().enumerate().filter(|(i, _)| keep.contains(i)).map(|(_, f)| f).collect();
    }
    out
}

/// What clients saw of one limit in one schedule.
#[derive(Default)]
struct Seen {
    allowed: AtomicU64,
    denied: AtomicU64,
    /// Given up on by the client: the server may have admitted them.
    cancelled: AtomicU64,
    errors: AtomicU64,
    /// Settled estimates (`st-`): the units they came to, where the report
    /// said so (`settled` true, or false: the estimate stands).
    settled_units: AtomicU64,
    /// Reports with no answer: between their actual cost and the estimate.
    unsure_low: AtomicU64,
    unsure_high: AtomicU64,
    /// Charges answered, and charges with no answer (0 or 1 unit each).
    charged: AtomicU64,
    charged_unsure: AtomicU64,
}

impl Seen {
    fn count(&self, r: Option<Result<pb::Verdict, tonic::Status>>) {
        match r {
            None => self.cancelled.fetch_add(1, Ordering::Relaxed),
            Some(Ok(pb::Verdict::Allowed)) => self.allowed.fetch_add(1, Ordering::Relaxed),
            Some(Ok(_)) => self.denied.fetch_add(1, Ordering::Relaxed),
            Some(Err(_)) => self.errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}

fn channel(grpc: &str) -> Channel {
    Endpoint::from_shared(format!("http://{grpc}")).unwrap().connect_timeout(Duration::from_millis(500)).connect_lazy()
}

/// One Acquire, given up on after `patience`: `None` when it was.
async fn ask(
    channel: &Channel,
    resource: &str,
    patience: Duration,
) -> Option<Result<pb::AcquireResponse, tonic::Status>> {
    ask_for(channel, acquire(resource, &[("tenant", "t1")], 1), patience).await
}

async fn ask_for(
    channel: &Channel,
    req: pb::AcquireRequest,
    patience: Duration,
) -> Option<Result<pb::AcquireResponse, tonic::Status>> {
    let mut c = pb::floodgate_client::FloodgateClient::new(channel.clone());
    tokio::time::timeout(patience, c.acquire(req)).await.ok().map(|r| r.map(|r| r.into_inner()))
}

/// What a settled estimate on `st-` limits takes.
const ESTIMATE: u64 = 4;

/// One call on a `st-` limit: every eighth a Charge of 1, the others an
/// estimate of [`ESTIMATE`] with `settle`, reported at 0 to 4 once admitted.
async fn settle_once(channel: &Channel, resource: &str, rng: &mut Rng, patience: Duration, seen: &Seen) {
    let mut c = pb::floodgate_client::FloodgateClient::new(channel.clone());
    if rng.below(8) == 0 {
        let charge = pb::ChargeRequest { resource: resource.into(), cost: 1, ..Default::default() };
        match tokio::time::timeout(patience, c.charge(charge)).await {
            Ok(Ok(_)) => seen.charged.fetch_add(1, Ordering::Relaxed),
            // An error may still have charged (Redis took it, the answer was lost).
            _ => seen.charged_unsure.fetch_add(1, Ordering::Relaxed),
        };
        return;
    }
    let req = pb::AcquireRequest { settle: true, ..acquire(resource, &[], ESTIMATE as u32) };
    let r = ask_for(channel, req, patience).await;
    if let Some(Ok(p)) = &r
        && p.verdict() == pb::Verdict::Allowed
    {
        let actual = rng.below(ESTIMATE + 1);
        let report = pb::ReportOutcomeRequest {
            resource: resource.into(),
            permit_id: p.permit_id.clone(),
            outcome: pb::Outcome::Success as i32,
            actual_cost: Some(actual),
            ..Default::default()
        };
        match tokio::time::timeout(Duration::from_secs(2), c.report_outcome(report)).await {
            Ok(Ok(done)) => {
                let units = if done.into_inner().settled { actual } else { ESTIMATE };
                seen.settled_units.fetch_add(units, Ordering::Relaxed);
            }
            _ => {
                seen.unsure_low.fetch_add(actual, Ordering::Relaxed);
                seen.unsure_high.fetch_add(ESTIMATE, Ordering::Relaxed);
            }
        }
    }
    seen.count(r.map(|r| r.map(|r| r.verdict())));
}

/// Where the replicas keep their shared state.
enum Backend {
    One(RedisServer),
    Cluster(RedisCluster),
}

impl Backend {
    /// The replicas' arguments to reach it.
    fn args(&self) -> [String; 2] {
        match self {
            Backend::One(r) => ["--redis".into(), r.url()],
            Backend::Cluster(c) => ["--redis-cluster".into(), c.seeds()],
        }
    }

    fn nodes(&self) -> &[RedisServer] {
        match self {
            Backend::One(r) => std::slice::from_ref(r),
            Backend::Cluster(c) => &c.nodes,
        }
    }

    /// The server to restart (a single one: a cluster's are only stalled).
    fn single(&mut self) -> &mut RedisServer {
        match self {
            Backend::One(r) => r,
            Backend::Cluster(_) => unreachable!("a cluster's nodes are stalled, not restarted"),
        }
    }

    /// The value of the first key matching `pattern` on whichever node has it.
    fn first_value(&self, pattern: &str, skip: impl Fn(&str) -> bool) -> Option<String> {
        self.nodes().iter().find_map(|node| {
            let found = node.cli(&["--scan", "--pattern", pattern]).unwrap_or_default();
            let key = found.lines().find(|k| !skip(k))?.to_string();
            node.cli(&["GET", &key])
        })
    }
}

/// What happened when, as it happened (faults run a little later and longer
/// than planned: restarts wait for the process).
#[derive(Clone, Copy, Debug)]
enum Mark {
    /// Redis (or a master) stops answering: stalled, killed or shut down.
    Away,
    /// Redis answers again.
    Back,
    /// Replica killed with SIGKILL (not SIGTERM: that one pays before it exits).
    Killed,
    /// A replica (killed or stopped before) started again.
    Started,
}

/// The replicas, their Redis and their rules file, kept across schedules.
struct World {
    redis: Mutex<Backend>,
    /// Schedules for a cluster: Redis is stalled a master at a time.
    cluster: bool,
    /// Which master the next stall stops.
    stalls: AtomicU64,
    replicas: Mutex<Vec<Floodgate>>,
    grpc: Vec<String>,
    dir: TempDir,
    /// Logs of replicas killed so far, for the panic check.
    dead_logs: Mutex<String>,
    reloads: AtomicU64,
    override_ids: Mutex<Vec<String>>,
    /// The last operator's level set for system `chaos`, the replica it was
    /// set through, and whether that replica was killed or stopped since
    /// (a level it could not store yet may be lost with it).
    level: Mutex<(Option<u32>, usize, bool)>,
    /// This schedule's marks, in order.
    marks: Mutex<Vec<(Instant, Mark)>>,
}

impl World {
    fn args(&self) -> Vec<String> {
        let rules = self.dir.path("rules.yaml");
        let mut args: Vec<String> =
            ["--config", path_str(&rules), "--sync-interval", "100ms", "--redis-timeout", "50ms"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.extend(self.redis.lock().unwrap().args());
        args
    }

    fn start(cluster: bool) -> World {
        let redis = if cluster { Backend::Cluster(RedisCluster::start()) } else { Backend::One(RedisServer::start()) };
        let dir = TempDir::new();
        dir.write("rules.yaml", &rules(0));
        let mut world = World {
            redis: Mutex::new(redis),
            cluster,
            stalls: AtomicU64::new(0),
            replicas: Mutex::new(Vec::new()),
            grpc: Vec::new(),
            dir,
            dead_logs: Mutex::default(),
            reloads: AtomicU64::new(0),
            override_ids: Mutex::default(),
            level: Mutex::new((None, 0, false)),
            marks: Mutex::default(),
        };
        let args = world.args();
        let replicas: Vec<Floodgate> = (0..REPLICAS).map(|_| floodgate().args(strs(&args)).start()).collect();
        for fg in &replicas {
            wait_live(fg, REPLICAS as u32);
        }
        world.grpc = replicas.iter().map(|f| f.grpc.clone()).collect();
        *world.replicas.lock().unwrap() = replicas;
        world
    }

    fn mark(&self, mark: Mark) {
        self.marks.lock().unwrap().push((Instant::now(), mark));
    }

    /// SIGSTOP of Redis (on a cluster, of the next master in turn) for `d`,
    /// then SIGCONT.
    fn stall(&self, d: Duration) {
        let backend = self.redis.lock().unwrap();
        let nodes = backend.nodes();
        let redis = &nodes[self.stalls.fetch_add(1, Ordering::Relaxed) as usize % nodes.len()];
        self.mark(Mark::Away);
        redis.signal("STOP");
        std::thread::sleep(d);
        redis.signal("CONT");
        if matches!(*backend, Backend::Cluster(_)) {
            // A stall longer than the node timeout gets the master marked
            // failed, and the cluster refuses commands until every node
            // sees it again (seconds after SIGCONT): the outage lasts until
            // then, and the exceptions are counted to that point.
            let ok = |n: &RedisServer| n.cli(&["CLUSTER", "INFO"]).is_some_and(|i| i.contains("cluster_state:ok"));
            let deadline = Instant::now() + Duration::from_secs(20);
            while !nodes.iter().all(ok) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.mark(Mark::Back);
    }

    /// Stops Redis (SIGKILL, or SHUTDOWN SAVE unless `empty`), waits `d`, and
    /// starts it again: with nothing when `empty`, else with its data.
    fn restart_redis(&self, empty: bool, d: Duration) {
        let mut backend = self.redis.lock().unwrap();
        let redis = backend.single();
        self.mark(Mark::Away);
        if empty {
            redis.kill();
        } else {
            redis.shutdown_save();
        }
        std::thread::sleep(d);
        if empty {
            redis.restart_empty();
        } else {
            redis.restart();
        }
        self.mark(Mark::Back);
    }

    /// Kills replica `i` (SIGKILL when `kill`, else SIGTERM, which drains and
    /// syncs a last time), waits `d`, and starts it again on its port with
    /// `args` (taken before: [`World::args`] waits for the Redis lock).
    fn replace_replica(&self, i: usize, kill: bool, d: Duration, args: &[String]) {
        let mut replicas = self.replicas.lock().unwrap();
        {
            let mut level = self.level.lock().unwrap();
            level.2 |= level.1 == i;
        }
        if kill {
            signal(replicas[i].pid(), "KILL");
            self.mark(Mark::Killed);
        } else {
            replicas[i].terminate();
        }
        std::thread::sleep(d);
        let next = floodgate().listen(&self.grpc[i]).args(strs(args)).start();
        self.mark(Mark::Started);
        let dead = std::mem::replace(&mut replicas[i], next);
        self.dead_logs.lock().unwrap().push_str(&dead.logs());
    }

    /// Runs one fault to its end (blocking: call off the traffic's threads).
    fn inflict(&self, fault: &Fault, rt: &tokio::runtime::Handle, burst: &(String, Arc<Seen>)) {
        match fault {
            Fault::Stall(d) => self.stall(*d),
            Fault::RedisEmpty(d) => self.restart_redis(true, *d),
            Fault::RedisRestart(d) => self.restart_redis(false, *d),
            Fault::KillReplica(i, d) | Fault::StopReplica(i, d) => {
                let kill = matches!(fault, Fault::KillReplica(..));
                self.replace_replica(*i, kill, *d, &self.args());
            }
            Fault::RedisOlderDump { gap, down } => {
                let mut backend = self.redis.lock().unwrap();
                let redis = backend.single();
                redis.bgsave();
                // The replicas go on taking and syncing: Redis's figures
                // move past the dump's.
                std::thread::sleep(*gap);
                self.mark(Mark::Away);
                redis.kill();
                std::thread::sleep(*down);
                redis.restart();
                self.mark(Mark::Back);
            }
            Fault::StallDuringRestart { empty, down, after, stall } => {
                self.restart_redis(*empty, *down);
                std::thread::sleep(*after);
                self.stall(*stall);
            }
            Fault::KillDuringStall { replica, stall, after, down } => {
                let args = self.args();
                std::thread::scope(|s| {
                    s.spawn(|| self.stall(*stall));
                    std::thread::sleep(*after);
                    self.replace_replica(*replica, true, *down, &args);
                });
            }
            Fault::Reload => {
                let n = self.reloads.fetch_add(1, Ordering::Relaxed) + 1;
                self.dir.replace("rules.yaml", &rules(n));
            }
            Fault::Override(i, set) => {
                let channel = channel(&self.grpc[*i]);
                let mut ids = self.override_ids.lock().unwrap();
                rt.block_on(async {
                    let mut admin = pb::admin_client::AdminClient::new(channel);
                    let call = async {
                        if *set || ids.is_empty() {
                            let id = format!("chaos-{}", ids.len());
                            let o = pb::Override {
                                id: id.clone(),
                                rule: "ov".into(),
                                when: [("tenant".to_string(), "t1".to_string())].into(),
                                action: Some(pb::r#override::Action::Factor(2.0)),
                                ..Default::default()
                            };
                            if admin.set_overrides(pb::SetOverridesRequest { overrides: vec![o] }).await.is_ok() {
                                ids.push(id);
                            }
                        } else {
                            let id = ids.pop().unwrap();
                            let _ = admin.delete_overrides(pb::DeleteOverridesRequest { ids: vec![id] }).await;
                        }
                    };
                    // Redis may be away: an override not kept is an error, not a hang.
                    let _ = tokio::time::timeout(Duration::from_secs(10), call).await;
                });
            }
            Fault::Level(i, to) => {
                let channel = channel(&self.grpc[*i]);
                let req = pb::SetDegradationLevelRequest {
                    system: "chaos".into(),
                    level: to.unwrap_or(0),
                    automatic: to.is_none(),
                    ..Default::default()
                };
                let set = rt.block_on(async {
                    let mut admin = pb::admin_client::AdminClient::new(channel);
                    tokio::time::timeout(Duration::from_secs(10), admin.set_degradation_level(req)).await
                });
                if matches!(set, Ok(Ok(_))) {
                    *self.level.lock().unwrap() = (*to, *i, false);
                }
            }
            Fault::Cancels(i, n) => {
                let channel = channel(&self.grpc[*i]);
                rt.block_on(async {
                    let mut calls = Vec::new();
                    for k in 0..*n {
                        let (channel, resource, seen) = (channel.clone(), burst.0.clone(), burst.1.clone());
                        let patience = Duration::from_millis(1 + u64::from(k % 20));
                        calls.push(tokio::spawn(async move {
                            let r = ask(&channel, &resource, patience).await;
                            seen.count(r.map(|r| r.map(|r| r.verdict())));
                        }));
                    }
                    for c in calls {
                        let _ = c.await;
                    }
                });
            }
        }
    }

    /// The most outages one running replica logged. A fault's side effect
    /// can be an outage the plan does not count: a BGSAVE's fork may hold
    /// Redis up past the replicas' timeout on a busy machine.
    fn outages_seen(&self) -> u64 {
        let replicas = self.replicas.lock().unwrap();
        replicas.iter().map(|fg| fg.logs().matches("Redis is unreachable").count() as u64).max().unwrap_or(0)
    }

    fn logs(&self) -> String {
        let mut all = self.dead_logs.lock().unwrap().clone();
        for fg in self.replicas.lock().unwrap().iter() {
            all.push_str(&fg.logs());
        }
        all
    }
}

/// 20 calls a second through each replica on `resource` until `stop`; one
/// in ten is given up on after 1-30 ms.
async fn traffic(grpc: Vec<String>, resource: String, seen: Arc<Seen>, stop: Arc<AtomicBool>, seed: u64) {
    let mut tasks = Vec::new();
    for (i, addr) in grpc.into_iter().enumerate() {
        let (resource, seen, stop) = (resource.clone(), seen.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let channel = channel(&addr);
            let mut rng = Rng(seed ^ (i as u64 + 1));
            let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let patience =
                    if rng.below(10) == 0 { Duration::from_millis(1 + rng.below(30)) } else { Duration::from_secs(5) };
                if resource.starts_with("st-") {
                    settle_once(&channel, &resource, &mut rng, patience, &seen).await;
                    continue;
                }
                let r = ask(&channel, &resource, patience).await;
                let slot = resource.starts_with("cc-") || resource.starts_with("cs-");
                let breaker = resource.starts_with("br-");
                if (slot || breaker)
                    && let Some(Ok(p)) = &r
                {
                    // Half the slots' permits are reported; the rest are left
                    // to expire. Every call the breaker admits fails.
                    if p.verdict() == pb::Verdict::Allowed && (breaker || rng.below(2) == 0) {
                        let mut c = pb::floodgate_client::FloodgateClient::new(channel.clone());
                        let outcome = if breaker { pb::Outcome::Failure } else { pb::Outcome::Success };
                        let report = pb::ReportOutcomeRequest {
                            resource: resource.clone(),
                            permit_id: p.permit_id.clone(),
                            outcome: outcome as i32,
                            ..Default::default()
                        };
                        let _ = tokio::time::timeout(Duration::from_secs(2), c.report_outcome(report)).await;
                    }
                }
                seen.count(r.map(|r| r.map(|r| r.verdict())));
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Asks through every replica, alternately, until each has denied 20 in a
/// row: what was still admitted.
/// Every replica's operator's level for system `chaos` (`None`: automatic),
/// from a fresh Watch snapshot.
async fn levels(grpc: &[String]) -> Vec<Option<Option<u32>>> {
    let mut out = Vec::new();
    for g in grpc {
        let mut c = pb::floodgate_client::FloodgateClient::new(channel(g));
        let snapshot = async {
            let mut watch = c.watch(pb::WatchRequest::default()).await.ok()?.into_inner();
            match watch.message().await.ok()??.event? {
                pb::watch_event::Event::Snapshot(s) => {
                    let l = s.systems.into_iter().find(|l| l.system == "chaos")?;
                    Some(l.manual.then_some(l.level))
                }
                _ => None,
            }
        };
        out.push(tokio::time::timeout(Duration::from_secs(5), snapshot).await.ok().flatten());
    }
    out
}

/// Waits up to 5 s for every replica to hold `want` (or, when it may have
/// been lost, the same level as each other).
async fn eventually_levels(grpc: &[String], want: Option<u32>, may_be_lost: bool) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seen = levels(grpc).await;
        let agree = seen.iter().all(|l| l.is_some() && *l == seen[0]);
        if agree && (may_be_lost || seen[0] == Some(want)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("operators' level of 'chaos': the last set was {want:?}; the replicas hold {seen:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn drain(grpc: &[String], resource: &str) -> u64 {
    let channels: Vec<Channel> = grpc.iter().map(|g| channel(g)).collect();
    let mut admitted = 0;
    let mut denied_in_a_row = vec![0; channels.len()];
    for round in 0..(LIMIT * 4) {
        let i = (round as usize) % channels.len();
        match ask(&channels[i], resource, Duration::from_secs(5)).await {
            Some(Ok(r)) if r.verdict() == pb::Verdict::Allowed => {
                admitted += 1;
                denied_in_a_row.iter_mut().for_each(|d| *d = 0);
            }
            _ => denied_in_a_row[i] += 1,
        }
        if denied_in_a_row.iter().all(|&d| d >= 20) {
            break;
        }
        // Leases move at every sync: give them time to.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    admitted
}

/// The replicas, asked in turn, grant all the fleet's slots on `resource`,
/// and no more.
async fn slots_all_free(grpc: &[String], resource: &str) -> Result<(), String> {
    let channels: Vec<Channel> = grpc.iter().map(|g| channel(g)).collect();
    let mut granted = vec![0; channels.len()];
    for round in 0..(SLOTS + 2) * channels.len() {
        let i = round % channels.len();
        if let Some(Ok(r)) = ask(&channels[i], resource, Duration::from_secs(5)).await {
            granted[i] += usize::from(r.verdict() == pb::Verdict::Allowed);
        }
    }
    if granted.iter().sum::<usize>() != SLOTS {
        return Err(format!("the replicas granted {granted:?} of {SLOTS} slots of {resource} after their TTL"));
    }
    Ok(())
}

/// The settle and Charge arithmetic of a `st-` limit (strict, `deny`): what
/// Redis counted is what the clients know was taken (settled estimates at
/// what they came to, charges, the drain; and what it counts), within what they cannot know
/// (reports and charges with no answer, calls given up on), and never more
/// than the limit but for charges, which take beyond it. Where Redis lost
/// its data, the count is what the replicas put back, and is not checked
/// from below. A replica killed owing (the README's exception, `unpaid`
/// calls) loses what it owed Redis both ways: settlements it answered but
/// had not passed on (so the count is not checked from above), and charges
/// it took on its own while Redis was away, one unit at most for each of
/// those calls (so the count may be that much below what the clients know).
fn settle_arithmetic(
    world: &World,
    name: &str,
    seen: &Seen,
    drained: u64,
    lost_data: bool,
    unpaid: u64,
) -> (u64, Vec<String>) {
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let pattern = format!("fg:b:{{{name}}}:hourly:fixed_window:*");
    let value =
        world.redis.lock().unwrap().first_value(&pattern, |k| {
            k.ends_with(":l") || k.ends_with(":r") || k.ends_with(":p") || k.ends_with(":w")
        });
    let counted: u64 = value.and_then(|v| v.parse().ok()).unwrap_or(0);
    let charges = n(&seen.charged) + n(&seen.charged_unsure);
    let known = n(&seen.settled_units) + n(&seen.charged) + drained;
    let low = known + n(&seen.unsure_low);
    let high =
        known + n(&seen.unsure_high) + n(&seen.charged_unsure) + ESTIMATE * (n(&seen.cancelled) + n(&seen.errors));
    let mut broken = Vec::new();
    if counted > LIMIT + charges {
        broken.push(format!("{name}: Redis counts {counted} of {LIMIT} with {charges} charged: deny is exact"));
    }
    if !lost_data && counted + unpaid < low {
        broken.push(format!(
            "{name}: Redis counts {counted}, the clients know of at least {low} (less {unpaid} a killed \
             replica may have owed): units given back twice"
        ));
    }
    if unpaid == 0 && counted > high {
        broken.push(format!("{name}: Redis counts {counted}, the clients know of at most {high}: a settlement lost"));
    }
    (counted, broken)
}

/// How long after Redis is back a replica may still admit on its own: it
/// tries Redis again every 0.5 s at most while Redis is away, and pays its
/// debt at the next sync (100 ms).
const NOTICE: Duration = Duration::from_millis(800);

/// Two exceptions to the outage bounds, stated by the README, in calls on
/// one limit. They are counted from what happened, not from the plan.
#[derive(Debug, Default, PartialEq)]
struct Exceptions {
    /// A replica killed (SIGKILL) while Redis is away, or before it saw
    /// Redis back and paid, loses its debt: what it admitted on its own since
    /// Redis went away, at most [`RATE`] calls a second. A replica killed
    /// during the outage owes what it admitted until it died; one killed
    /// after owes the whole outage and [`NOTICE`]. Outages less than
    /// [`NOTICE`] apart count as one: the debt of the first may still be
    /// unpaid when the next begins.
    unpaid: u64,
    /// A replica that starts while Redis is away never saw the buckets.
    /// Under `on_redis_error: local` it decides from its share of the whole
    /// limit, not of what was left (the README). What it admits until it
    /// sees Redis back, at most [`RATE`] calls a second, adds to the bound.
    fresh: u64,
}

fn exceptions(marks: &[(Instant, Mark)]) -> Exceptions {
    let mut marks = marks.to_vec();
    marks.sort_by_key(|(t, _)| *t);
    // The outages (from, to), those less than NOTICE apart joined.
    let mut outages: Vec<(Instant, Option<Instant>)> = Vec::new();
    for (t, mark) in &marks {
        match mark {
            Mark::Away => match outages.last_mut() {
                Some((_, to)) if to.is_none_or(|to| *t < to + NOTICE) => *to = None,
                _ => outages.push((*t, None)),
            },
            Mark::Back => {
                if let Some((_, to)) = outages.last_mut() {
                    *to = Some(*t);
                }
            }
            Mark::Killed | Mark::Started => {}
        }
    }
    let calls = |d: Duration| RATE * d.as_millis() as u64 / 1000 + 1;
    let mut out = Exceptions::default();
    for (t, mark) in &marks {
        let Some(&(from, to)) = outages.iter().rev().find(|(from, _)| from <= t) else { continue };
        // A schedule ends with Redis back; `None` only while it runs.
        let to = to.unwrap_or(*t + NOTICE);
        match mark {
            Mark::Killed if *t < to => out.unpaid += calls(*t - from),
            Mark::Killed if *t < to + NOTICE => out.unpaid += calls(to - from + NOTICE),
            Mark::Started if *t < to => out.fresh += calls(to + NOTICE - *t),
            _ => {}
        }
    }
    out
}

/// Runs one schedule; the invariants it broke (empty: none), and its figures.
async fn run_schedule(world: &Arc<World>, seed: u64) -> (Vec<String>, String) {
    // The window limits are hourly: a schedule (and its drain) must not
    // cross the hour, where every window starts afresh.
    let into_hour = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 3600;
    if into_hour > 3600 - 60 {
        tokio::time::sleep(Duration::from_secs(3600 - into_hour + 1)).await;
    }
    let plan = schedule(seed, world.cluster);
    let tag = format!("{seed:x}");
    // Fresh resources of each glob: every schedule starts from full limits.
    let limits: Vec<(String, Arc<Seen>)> = ["sd", "sl", "rp", "cc", "cs", "st", "br"]
        .iter()
        .map(|kind| (format!("{kind}-{tag}"), Arc::new(Seen::default())))
        .collect();
    // Cancel bursts go to the strict, local limit, and count in its totals.
    let burst = limits[1].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let mut traffic_tasks = Vec::new();
    for (name, seen) in &limits {
        traffic_tasks.push(tokio::spawn(traffic(world.grpc.clone(), name.clone(), seen.clone(), stop.clone(), seed)));
    }
    // The faults, in order, on a thread of their own.
    world.marks.lock().unwrap().clear();
    let started = Instant::now();
    let (w, p, b) = (world.clone(), plan.clone(), burst.clone());
    let rt = tokio::runtime::Handle::current();
    let faults = tokio::task::spawn_blocking(move || {
        for (at, fault) in &p {
            if let Some(wait) = at.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
            w.inflict(fault, &rt, &b);
        }
    });
    faults.await.unwrap();
    tokio::time::sleep((FAULT_SPAN + Duration::from_secs(2)).saturating_sub(started.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    for t in traffic_tasks {
        t.await.unwrap();
    }
    let traffic_time = started.elapsed();
    // Redis back, debts paid, leases of the dead expired (3 syncs), permits
    // past their TTL.
    tokio::time::sleep(PERMIT_TTL + Duration::from_millis(1500)).await;

    // Times Redis went away: two for a stall during a restart, or as many
    // as a replica saw when that is more. A stall that
    // begins while the replicas recover from a restart is still bounded as
    // an outage of its own: for 3 s after a replica admitted on its own, the
    // next outage starts from Redis's figure less the others' presumed
    // share (the README's flapping Redis).
    let outages: u64 = plan.iter().map(|(_, f)| f.outages()).sum::<u64>().max(world.outages_seen());
    let kills: u64 = plan.iter().map(|(_, f)| f.kills()).sum();
    let marks = world.marks.lock().unwrap().clone();
    let Exceptions { unpaid, fresh } = exceptions(&marks);
    // What the replicas admit in one sync interval, both together.
    let per_sync = REPLICAS as u64 * (RATE * SYNC.as_millis() as u64 / 1000).max(1);
    let mut broken = Vec::new();
    let mut figures = Vec::new();
    for (name, seen) in &limits {
        let allowed = seen.allowed.load(Ordering::Relaxed);
        let cancelled = seen.cancelled.load(Ordering::Relaxed);
        let errors = seen.errors.load(Ordering::Relaxed);
        if name.starts_with("br-") {
            // Calls failing all along: the breaker admits, per replica, the
            // calls it needs to open (again after a replica starts afresh or
            // Redis loses the shared state or goes back to an older one: a
            // breaker state is not restored) and a sync interval's more, then
            // per second open at most its probes, counted across replicas
            // (per replica while Redis is away).
            let restarts = kills + plan.iter().filter(|(_, f)| f.forgets_breakers()).count() as u64;
            let opening = REPLICAS as u64 * (BREAKER_MINIMUM + RATE / 2);
            let seconds = traffic_time.as_secs() + 1;
            let upper = (1 + restarts) * opening + seconds * HALF_OPEN_CALLS * REPLICAS as u64;
            if allowed > upper {
                broken.push(format!(
                    "{name}: a breaker fed only failures admitted {allowed} calls in {seconds} s; at most {upper}"
                ));
            }
            figures.push(format!("{name}: {allowed} admitted of calls that all fail (at most {upper})"));
            continue;
        }
        if name.starts_with("cc-") || name.starts_with("cs-") {
            if let Err(e) = slots_all_free(&world.grpc, name).await {
                broken.push(e);
            }
            figures.push(format!("{name}: {allowed} admitted, {cancelled} cancelled, {errors} errors"));
            continue;
        }
        let drained = drain(&world.grpc, name).await;
        if name.starts_with("st-") {
            // An older dump is checked from below too: a replica that knew
            // a bucket puts back at least what it knew (the README), and the
            // last answer Redis gave before it died counts every take before.
            let lost_data = plan.iter().any(|(_, f)| f.empties_redis());
            let (counted, wrong) = settle_arithmetic(world, name, seen, drained, lost_data, unpaid);
            broken.extend(wrong);
            figures.push(format!(
                "{name}: {allowed} estimates admitted, {} units after settling, {} charged, {drained} drained; \
                 Redis counts {counted}",
                seen.settled_units.load(Ordering::Relaxed),
                seen.charged.load(Ordering::Relaxed)
            ));
            continue;
        }
        let total = allowed + drained;
        let (upper, what) = match &name[..2] {
            "sd" => (LIMIT, "strict, deny: exact"),
            "sl" => (
                LIMIT + outages * per_sync + unpaid + fresh,
                "strict, local: the limit + one sync's calls per outage (+ a debt killed unpaid, \
                 + the calls of a replica started during an outage)",
            ),
            _ => (
                LIMIT + (outages + kills + 1) * per_sync + unpaid,
                "replicated: the limit + R x rate x sync per fault (+ takes killed unpushed)",
            ),
        };
        if total > upper {
            broken.push(format!(
                "{name}: {total} admitted ({allowed} + {drained} drained) of {LIMIT}; {what} allows {upper}"
            ));
        }
        let lower = LIMIT.saturating_sub((outages + kills + 1) * per_sync);
        if total + cancelled < lower {
            broken.push(format!(
                "{name}: only {total} admitted and {cancelled} cancelled of {LIMIT} (at least {lower}): units lost"
            ));
        }
        figures.push(format!(
            "{name}: {total} of {LIMIT} ({allowed} + {drained} drained, {cancelled} cancelled, {errors} errors)"
        ));
    }
    // Operators' levels: every replica holds the last one set (unless the
    // replica it was set through died since: then they only agree).
    let (want, _, may_be_lost) = *world.level.lock().unwrap();
    let held = eventually_levels(&world.grpc, want, may_be_lost).await;
    if let Err(e) = held {
        broken.push(e);
    }
    figures.push(format!("chaos system: operator's level {want:?} (may be lost: {may_be_lost})"));
    for (i, fg) in world.replicas.lock().unwrap().iter().enumerate() {
        let (status, _) = fg.http_get("/readyz");
        if status != 200 {
            broken.push(format!("replica {i} is not ready at the end: {status}"));
        }
    }
    let logs = world.logs();
    // To look into a failure: FLOODGATE_CHAOS_LOGS=DIR keeps each schedule's logs.
    if let Ok(dir) = std::env::var("FLOODGATE_CHAOS_LOGS") {
        let _ = std::fs::write(std::path::Path::new(&dir).join(format!("{seed}.log")), &logs);
    }
    if logs.contains("panicked") {
        let line = logs.lines().find(|l| l.contains("panicked")).unwrap_or_default();
        broken.push(format!("a replica panicked: {line}"));
    }
    // What happened when, for a reader of a failure.
    let happened: Vec<String> =
        marks.iter().map(|(t, m)| format!("{:.2}s {m:?}", t.duration_since(started).as_secs_f64())).collect();
    figures.push(format!("happened: {}; unpaid {unpaid}, fresh {fresh}", happened.join(", ")));
    let faults: Vec<String> = plan.iter().map(|(at, f)| format!("{:.1}s {f:?}", at.as_secs_f64())).collect();
    let text = format!("seed {seed}: {} faults [{}]\n  {}", plan.len(), faults.join(", "), figures.join("\n  "));
    (broken, text)
}

/// Runs schedules from `first` (only that one when `only_one`) for about
/// `seconds`, on one Redis or a cluster, and fails on any broken invariant.
async fn run_schedules(cluster: bool, first: u64, only_one: bool, seconds: u64) {
    let world = Arc::new(tokio::task::block_in_place(|| World::start(cluster)));
    let begun = Instant::now();
    let (mut schedules, mut faults, mut checks) = (0u64, 0u64, 0u64);
    let mut failures = Vec::new();
    let mut seed = first;
    let (what, replay) =
        if cluster { ("on a cluster", "FLOODGATE_CHAOS_CLUSTER_SEED") } else { ("", "FLOODGATE_CHAOS_SEED") };
    loop {
        let (broken, text) = run_schedule(&world, seed).await;
        schedules += 1;
        faults += schedule(seed, cluster).len() as u64;
        // Per window limit: upper and lower bound; slots; settling (three);
        // the breaker; readiness per replica; the logs.
        checks += 3 * 2 + 1 + 3 + 1 + REPLICAS as u64 + 1;
        println!("{text}");
        for b in &broken {
            println!("  BROKEN: {b}");
            failures.push(format!(
                "seed {seed} {what}: {b}\n  replay: {replay}={seed} cargo test -p floodgate --test e2e -- faults:: --nocapture"
            ));
        }
        seed = Rng(seed).next();
        // The next schedule must fit in what is left (one takes about 25 s).
        if only_one || begun.elapsed() + Duration::from_secs(25) > Duration::from_secs(seconds) {
            break;
        }
    }
    println!(
        "fault checker{}: {schedules} schedules, {faults} faults, {checks} invariants checked in {:.0} s; {} broken",
        if cluster { " (cluster)" } else { "" },
        begun.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_fault_schedules_keep_every_stated_invariant() {
    let _serial = one_at_a_time();
    let seconds = env("FLOODGATE_CHAOS_SECONDS").unwrap_or(100);
    let (first, only_one) = match env("FLOODGATE_CHAOS_SEED") {
        Some(seed) => (seed, true),
        None => (env("FLOODGATE_CHAOS_BASE").unwrap_or(0x5eed_0001), false),
    };
    if env("FLOODGATE_CHAOS_CLUSTER_SEED").is_some() {
        println!("not run: FLOODGATE_CHAOS_CLUSTER_SEED replays a cluster schedule");
        return;
    }
    run_schedules(false, first, only_one, seconds).await;
}

/// The same on a three-master Redis Cluster, one schedule (a master stalled
/// at a time; replicas killed and stopped; reloads, overrides, cancels):
/// `FLOODGATE_CHAOS_CLUSTER_SEED` replays another, and `scripts/chaos` runs
/// one after its single-Redis schedules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_schedule_on_a_redis_cluster_keeps_every_stated_invariant() {
    let _serial = one_at_a_time();
    if env("FLOODGATE_CHAOS_SEED").is_some() {
        println!("not run: FLOODGATE_CHAOS_SEED replays a single-Redis schedule");
        return;
    }
    // A seed of its own, not the single-Redis run's first.
    let base = env("FLOODGATE_CHAOS_BASE").map(|b| Rng(b ^ 0xc105_7e25).next());
    let seed = env("FLOODGATE_CHAOS_CLUSTER_SEED").or(base).unwrap_or(0x5eed_c105);
    run_schedules(true, seed, true, 0).await;
}

/// The README's exceptions, counted from marks: a replica killed during an
/// outage owes what it admitted until it died, one killed soon after owes
/// the whole outage and [`NOTICE`], outages less than [`NOTICE`] apart are
/// one, and a replica started during an outage decides on its own until it
/// sees Redis back.
#[test]
fn the_exceptions_follow_what_happened() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let calls = |ms: u64| RATE * ms / 1000 + 1;
    let owed = |marks: &[(u64, Mark)]| exceptions(&marks.iter().map(|&(ms, m)| (at(ms), m)).collect::<Vec<_>>());
    use Mark::*;
    // Killed 1 s into a stall, started again after it.
    let marks = [(0, Away), (1000, Killed), (1500, Back), (2000, Started)];
    assert_eq!(owed(&marks), Exceptions { unpaid: calls(1000), fresh: 0 });
    // Killed 0.5 s after a 1 s outage, or 0.9 s after (it has paid then).
    assert_eq!(owed(&[(0, Away), (1000, Back), (1500, Killed)]), Exceptions { unpaid: calls(1800), fresh: 0 });
    assert_eq!(owed(&[(0, Away), (1000, Back), (1900, Killed)]), Exceptions::default());
    // A restart, a stall 0.2 s after it, a kill in the stall: owed since the
    // restart began. Marks may come out of order from two threads.
    let marks = [(0, Away), (1000, Back), (1200, Away), (1500, Killed), (1400, Started), (2000, Back)];
    assert_eq!(owed(&marks), Exceptions { unpaid: calls(1500), fresh: calls(600 + 800) });
    // Nothing to do with an outage.
    assert_eq!(owed(&[(0, Killed), (300, Started), (1000, Away), (1100, Back)]), Exceptions::default());
}
