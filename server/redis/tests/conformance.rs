//! The conformance harness: every limiter algorithm is written twice, in Rust
//! (`floodgate_core::limiter`, decided in process memory) and in Lua
//! (`src/lua/limits.lua`, run by Redis for `strict` limits). This test holds
//! the two equal.
//!
//! For each algorithm, proptest generates a configuration and a sequence of
//! operations on a few keys: decisions of some cost, time that passes,
//! estimates settled lower (units given back, to the instant they were taken),
//! and units taken beyond the limit (a settle higher, or a `Charge`). Each
//! operation runs twice: on a `Bucket` in memory, and through take.lua or
//! adjust.lua in a real `redis-server`. After every operation both sides must
//! give the same decision (admitted or denied) and the same `remaining`. A
//! failing case is shrunk, and the panic message shows the smallest
//! configuration and sequence that still differ, and the first call where
//! they differ.
//!
//! Time: the memory side takes `now` as an argument. The scripts read Redis's
//! own clock through `now_us()` in limits.lua; the test runs them as
//! `floodgate_redis::testing` builds them, with a `now_us()` that reads the
//! script's last argument instead (see `lua_with_test_clock` in
//! src/scripts.rs). So limits.lua runs unchanged, and both sides see the
//! same instants, in whole microseconds (the unit of the scripts).
//!
//! Algorithms listed in `KNOWN_DIFFERENCES` differ in ways found but not
//! fixed yet; `known_differences` runs them and fails (it is ignored).
//!
//! A new algorithm cannot be left out: `algorithm()` matches the algorithm
//! kinds without a wildcard, so a kind added to `Kind` fails to compile here
//! until it has a generator; every kind in `Kind::NAMED` is run; and
//! `every_lua_code_is_generated` fails unless the generators together reach
//! every algorithm code that the server sends to Lua. An algorithm that Lua
//! does not define makes the script fail, and so the test.
//!
//! What it does not compare, and why:
//! - `reset_after`, `retry_after` and `wait`: the memory side counts in
//!   nanoseconds and the scripts in microseconds (doubles), so these times
//!   may differ by a rounding. The decision and `remaining` must not.
//! - A shaping warm-up: the rules refuse it for `strict` (it queues callers
//!   in one process), and limits.lua has only the policing one.
//! - The replicated path's decisions. A replica decides in memory, from a
//!   lease of what Redis holds (a share of it, renewed at each sync); its
//!   answers depend on when syncs happen and on the other replicas' shares,
//!   not only on the sequence of calls. Their tests are in the engine
//!   (`sync`) and the end-to-end suite. What this harness does compare on
//!   that path is the arithmetic Redis does for it: sync.lua pushes what a
//!   replica took, beyond the limit if need be, through limits.lua. So each
//!   key also has a replicated shadow: every unit the memory side takes (an
//!   admitted decision, or units forced) is pushed by sync.lua to a second
//!   Redis key, as a replica that syncs after every call would push it, and
//!   is forced on a second memory bucket. After every push, what sync.lua
//!   says is available must be what that memory bucket has remaining.
//!   Settles lower are not pushed to the shadow: the replicated path gives
//!   units back "as far as the state allows", without the time of the take,
//!   which is not what a settle in memory does.
//! - Concurrency limits (slot.lua): they are not a limiter algorithm (they
//!   count calls in flight, not units over time), and the script reads
//!   Redis's clock itself for its permits' expiry.

use std::collections::HashMap;
use std::time::Duration;

use floodgate_core::limiter::calendar::{Calendar, Unit};
use floodgate_core::limiter::rate::Rate;
use floodgate_core::limiter::{
    Algorithm, Bucket, Kind, balance, fixed_window, gcra, leaky_bucket, sliding_window, sliding_window_log,
    token_bucket, warm_up,
};
use floodgate_core::time::Timestamp;
use floodgate_redis::testing::{
    Answered, Code, TakeReply, adjust_lua, limit_args, marker_key, parse_adjusted, parse_claimed_adjust, parse_sync,
    sync_lua, take_lua,
};
use floodgate_test_support::redis::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

/// Cases per algorithm: the whole test stays within a few seconds (debug build).
const CASES: u32 = 256;
/// Keys per case: a key's state must not leak into another's.
const KEYS: usize = 3;
/// Operations per case, at most.
const OPS: usize = 40;
/// The start of time: a day boundary in UTC, well away from zero.
const T0_US: u64 = 1_700_006_400_000_000;
/// The resource of every bucket (the scripts check its marker).
const RESOURCE: &str = "conformance";

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Op {
    /// Time passes, in microseconds.
    Wait(u64),
    /// A decision of `cost` on key `key`.
    Take { key: usize, cost: u64 },
    /// The decision a dry run of `cost` (a peek: 0) would get, taking nothing.
    Check { key: usize, cost: u64 },
    /// The `nth` admitted take not settled yet (modulo how many there are)
    /// is settled lower: `back` of its cost (modulo, at least 1) comes back.
    GiveBack { nth: usize, back: u64 },
    /// `units` taken from key `key` beyond the limit if need be.
    Force { key: usize, units: u64 },
    /// A balance topped up by `units` (an operator's AdjustBalance).
    TopUp { key: usize, units: u64 },
}

/// A generated case: the limit, when time starts, and what happens.
#[derive(Clone, Debug)]
struct Case {
    algorithm: Algorithm,
    start_us: u64,
    ops: Vec<Op>,
}

/// A rate of whole units, or one with thousandths (the finest the rules allow).
fn rate(max_whole: u64) -> impl Strategy<Value = Rate> {
    prop_oneof![
        (1..=max_whole).prop_map(Rate::whole_per_second),
        (1..=max_whole * 1000).prop_map(|milli| Rate::per_second(milli as f64 / 1000.0).expect("a valid rate")),
    ]
}

/// A window in microseconds: a few ms to a minute.
fn window_ns() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=1_000, 1u64..=60_000].prop_map(|ms| ms * 1_000_000)
}

fn calendar() -> impl Strategy<Value = Calendar> {
    let unit = prop_oneof![Just(Unit::Day), Just(Unit::Week), Just(Unit::Month), Just(Unit::Year)];
    let zone = prop_oneof![Just("UTC"), Just("Europe/Paris"), Just("America/New_York"), Just("Asia/Kolkata")];
    (unit, zone).prop_map(|(u, z)| Calendar::new(u, z).expect("a known zone"))
}

/// A configuration of the algorithm `kind`, as the rules could give it for a
/// `strict` limit. The `match` has no wildcard on purpose: a new algorithm
/// fails to compile here until the harness generates it.
fn algorithm(kind: Kind) -> BoxedStrategy<Algorithm> {
    match kind {
        Kind::TokenBucket => {
            (1u64..=20, rate(20)).prop_map(|(cap, r)| Algorithm::TokenBucket(token_bucket::Config::new(cap, r))).boxed()
        }
        Kind::Gcra => (rate(20), 1u64..=20).prop_map(|(r, burst)| Algorithm::Gcra(gcra::Config::new(r, burst))).boxed(),
        Kind::LeakyBucket => {
            let mode = prop_oneof![
                Just(leaky_bucket::Mode::Police),
                Just(leaky_bucket::Mode::Shape { max_wait: None }),
                (1u64..=2_000).prop_map(|ms| leaky_bucket::Mode::Shape { max_wait: Some(ms * 1_000_000) }),
            ];
            (1u64..=20, rate(20), mode)
                .prop_map(|(cap, r, mode)| Algorithm::LeakyBucket(leaky_bucket::Config::new(cap, r, mode)))
                .boxed()
        }
        Kind::FixedWindow => prop_oneof![
            (1u64..=20, window_ns()).prop_map(|(l, w)| Algorithm::FixedWindow(fixed_window::Config::new(l, w))),
            (1u64..=20, calendar()).prop_map(|(l, c)| Algorithm::FixedWindow(fixed_window::Config::calendar(l, c))),
        ]
        .boxed(),
        Kind::SlidingWindowLog => (1u64..=20, window_ns())
            .prop_map(|(l, w)| Algorithm::SlidingWindowLog(sliding_window_log::Config::new(l, w)))
            .boxed(),
        Kind::SlidingWindow => (1u64..=20, window_ns())
            .prop_map(|(l, w)| Algorithm::SlidingWindow(sliding_window::Config::new(l, w)))
            .boxed(),
        // Police only: the rules refuse a shaping warm-up for `strict`.
        Kind::WarmUp => (1u64..=50, 1u64..=10, 2u32..=5)
            .prop_filter_map("the rules refuse a warm-up whose warning line is 0", |(r, secs, cold)| {
                let mode = warm_up::Mode::Police;
                let cfg = warm_up::Config::new(Rate::whole_per_second(r), Duration::from_secs(secs), cold, mode);
                cfg.ok().map(Algorithm::WarmUp)
            })
            .boxed(),
        Kind::Balance => (1u64..=50).prop_map(|max| Algorithm::Balance(balance::Config::new(max))).boxed(),
    }
}

/// How long one of the limit's windows (or its refill from empty) lasts, in
/// microseconds: time steps are drawn around it.
fn scale_us(alg: &Algorithm) -> u64 {
    let us = (alg.window().as_nanos() / 1_000) as u64;
    us.clamp(1_000, 400 * 86_400_000_000)
}

fn ops(capacity: u64, scale: u64, top_ups: bool) -> impl Strategy<Value = Vec<Op>> {
    // Never 0: a decision costs at least 1 (the engine reads a cost of 0 as
    // 1). Only a check (a peek) asks with 0.
    let cost = prop_oneof![Just(1u64), 1..=capacity];
    let check_cost = prop_oneof![Just(0u64), 1..=capacity];
    let wait =
        prop_oneof![Just(0u64), 1u64..=1_000, (0u64..=40).prop_map(move |k| scale * k / 16), (0u64..=scale * 5 / 2),];
    let op = prop_oneof![
        6 => (0..KEYS, cost).prop_map(|(key, cost)| Op::Take { key, cost }),
        2 => (0..KEYS, check_cost).prop_map(|(key, cost)| Op::Check { key, cost }),
        4 => wait.prop_map(Op::Wait),
        2 => (any::<usize>(), 1..=capacity).prop_map(|(nth, back)| Op::GiveBack { nth, back }),
        1 => (0..KEYS, 1..=capacity * 2).prop_map(|(key, units)| Op::Force { key, units }),
        // Only a balance is topped up; it starts empty, so often.
        if top_ups { 5 } else { 0 } => (0..KEYS, 1..=capacity).prop_map(|(key, units)| Op::TopUp { key, units }),
    ];
    proptest::collection::vec(op, 1..=OPS)
}

fn case(kind: Kind) -> impl Strategy<Value = Case> {
    algorithm(kind).prop_flat_map(|alg| {
        let scale = scale_us(&alg);
        let capacity = alg.capacity().min(50);
        let top_ups = matches!(alg, Algorithm::Balance(_));
        (Just(alg), 0..scale * 2, ops(capacity, scale, top_ups)).prop_map(|(algorithm, offset, ops)| Case {
            algorithm,
            start_us: T0_US + offset,
            ops,
        })
    })
}

/// The Lua side: one redis-server for the whole test, the scripts as the
/// server runs them (but on the test's clock), and a fresh set of keys per
/// case.
struct Lua {
    _server: RedisServer,
    con: redis::Connection,
    take: redis::Script,
    adjust: redis::Script,
    sync: redis::Script,
    /// The marker's token (see `start`).
    token: String,
    cases: u64,
}

impl Lua {
    fn start() -> Lua {
        let server = RedisServer::start();
        let client = redis::Client::open(server.url()).expect("a Redis URL");
        let mut con = client.get_connection().expect("a connection to the test's redis-server");
        // The scripts decide nothing unless the resource's marker holds the
        // token the replica knows, and that token ends with the run id of
        // the Redis process that answers.
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).expect("INFO server");
        let run_id = info
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .expect("INFO server names the run id")
            .trim()
            .to_string();
        let token = format!("1:{run_id}");
        let _: () = redis::cmd("SET").arg(marker_key(RESOURCE)).arg(&token).query(&mut con).expect("SET the marker");
        let take = redis::Script::new(&take_lua());
        let adjust = redis::Script::new(&adjust_lua());
        let sync = redis::Script::new(&sync_lua());
        Lua { _server: server, con, take, adjust, sync, token, cases: 0 }
    }

    /// The Redis key of bucket `key` of the current case.
    fn key(&self, key: usize) -> String {
        format!("fg:b:{{{RESOURCE}}}:case{}:k{key}", self.cases)
    }

    /// The Redis key of the replicated shadow of bucket `key`.
    fn shadow_key(&self, key: usize) -> String {
        format!("fg:b:{{{RESOURCE}}}:case{}:r{key}", self.cases)
    }

    /// sync.lua over the shadow of bucket `key`: one replica that has taken
    /// `total` units from it since the case began pushes them (Redis applies
    /// only what it has not applied yet); what is available after, negative
    /// for a debt.
    fn push(&mut self, alg: &Algorithm, key: usize, total: u64, now_us: u64) -> Result<f64, String> {
        let mut inv = self.sync.prepare_invoke();
        inv.key(marker_key(RESOURCE)).key(self.shadow_key(key));
        // This replica, alone (a share of 1), a lease of 1 s, no least lease
        // wanted, no deadline, the marker's token.
        inv.arg("conformance").arg(1).arg(1_000_000).arg(0).arg(0).arg(&self.token);
        // Units not pushed yet (read only on the first push), nothing held,
        // the epoch of this replica's count and its total in that epoch.
        inv.arg(total).arg(0).arg("e1").arg(total);
        inv.arg(&limit_args(alg, at(now_us))[..]);
        inv.arg(now_us);
        let v: redis::Value = inv.invoke(&mut self.con).map_err(|e| format!("sync.lua failed: {e}"))?;
        match parse_sync(v, 1).map_err(|e| e.to_string())? {
            Answered::Done(shared) => Ok(shared[0].available),
            other => Err(format!("sync.lua did nothing: {other:?}")),
        }
    }

    /// take.lua over one limit: (admitted, remaining, Redis time of the
    /// take). With `check`, as a dry run: nothing is taken.
    fn take(
        &mut self,
        alg: &Algorithm,
        key: usize,
        cost: u64,
        check: bool,
        now_us: u64,
    ) -> Result<(bool, u64, i64), String> {
        let mut inv = self.take.prepare_invoke();
        inv.key(marker_key(RESOURCE)).key(self.key(key));
        // No deadline, the marker's token, one decision of one limit, and
        // the limit's cost after its numbers.
        inv.arg(0).arg(&self.token).arg(1).arg(1).arg(u8::from(check));
        inv.arg(&limit_args(alg, at(now_us))[..]).arg(cost);
        inv.arg(now_us);
        let v: redis::Value = inv.invoke(&mut self.con).map_err(|e| format!("take.lua failed: {e}"))?;
        match TakeReply::parse_many(v, &[1]).map_err(|e| e.to_string())? {
            Answered::Done(replies) => {
                let r = &replies[0];
                Ok((r.admitted, r.limits[0].remaining, r.at_us))
            }
            other => Err(format!("take.lua did nothing: {other:?}")),
        }
    }

    /// adjust.lua over one bucket: `units` taken (given back when negative,
    /// `at_us` being the time of the take); what is available after.
    fn adjust(&mut self, alg: &Algorithm, key: usize, units: i64, at_us: i64, now_us: u64) -> Result<i64, String> {
        let mut inv = self.adjust.prepare_invoke();
        inv.key(marker_key(RESOURCE)).key(self.key(key));
        inv.arg(0).arg(&self.token).arg(units).arg(at_us);
        inv.arg(&limit_args(alg, at(now_us))[..]);
        inv.arg(now_us);
        let v: redis::Value = inv.invoke(&mut self.con).map_err(|e| format!("adjust.lua failed: {e}"))?;
        match parse_adjusted(v, 1).map_err(|e| e.to_string())? {
            Answered::Done((_, left)) => Ok(left[0]),
            other => Err(format!("adjust.lua did nothing: {other:?}")),
        }
    }
}

fn at(us: u64) -> Timestamp {
    Timestamp::from_nanos(us * 1_000)
}

/// An admitted take that may still be settled.
struct Taken {
    key: usize,
    cost: u64,
    at_us: u64,
    redis_at_us: i64,
}

/// Runs `case` on both sides; the first call where they differ is an error.
fn run(lua: &mut Lua, case: &Case) -> Result<(), TestCaseError> {
    lua.cases += 1;
    let alg = &case.algorithm;
    let mut now = case.start_us;
    let mut buckets: HashMap<usize, Bucket> = HashMap::new();
    let mut open: Vec<Taken> = Vec::new();
    // The replicated shadows: a memory bucket per key and the units pushed.
    let mut shadows: HashMap<usize, (Bucket, u64)> = HashMap::new();
    let mut shadow = |lua: &mut Lua, key: usize, units: u64, now: u64| -> Result<(), String> {
        let (bucket, total) = shadows.entry(key).or_insert_with(|| (alg.new_bucket(at(now)), 0));
        bucket.force(alg, at(now), units);
        *total += units;
        let memory = bucket.status(alg, at(now)).remaining;
        let available = lua.push(alg, key, *total, now)?;
        if memory != available.max(0.0).floor() as u64 {
            return Err(format!(
                "replicated: {units} pushed ({total} in all); remaining in memory {memory}, sync.lua says {available}"
            ));
        }
        Ok(())
    };
    for (i, op) in case.ops.iter().enumerate() {
        let t = now - case.start_us;
        let fail = |what: String| TestCaseError::fail(format!("operation {i} ({op:?}) at start + {t} us: {what}"));
        match *op {
            Op::Wait(us) => now += us,
            Op::Take { key, cost } => {
                let bucket = buckets.entry(key).or_insert_with(|| alg.new_bucket(at(now)));
                let memory = bucket.try_acquire(alg, at(now), cost);
                let (admitted, remaining, redis_at) = lua.take(alg, key, cost, false, now).map_err(fail)?;
                if (memory.admitted, memory.status.remaining) != (admitted, remaining) {
                    return Err(fail(format!(
                        "memory: admitted {} remaining {}; Lua: admitted {admitted} remaining {remaining}",
                        memory.admitted, memory.status.remaining
                    )));
                }
                if admitted && cost > 0 {
                    open.push(Taken { key, cost, at_us: now, redis_at_us: redis_at });
                    shadow(lua, key, cost, now).map_err(fail)?;
                }
            }
            Op::Check { key, cost } => {
                let memory = match buckets.get(&key) {
                    Some(bucket) => bucket.check(alg, at(now), cost),
                    None => alg.new_bucket(at(now)).check(alg, at(now), cost),
                };
                let (admitted, remaining, _) = lua.take(alg, key, cost, true, now).map_err(fail)?;
                // A check of nothing (a peek) is compared by what is left:
                // whether "nothing" fits a bucket taken beyond its limit is
                // not kept alike. Redis's sliding log keeps at most `limit`
                // entries (those past it are all of one instant), so it cannot
                // tell a log taken beyond its limit from a full one.
                let same = if cost == 0 {
                    memory.status.remaining == remaining
                } else {
                    (memory.admitted, memory.status.remaining) == (admitted, remaining)
                };
                if !same {
                    return Err(fail(format!(
                        "a check: memory: admitted {} remaining {}; Lua: admitted {admitted} remaining {remaining}",
                        memory.admitted, memory.status.remaining
                    )));
                }
            }
            Op::GiveBack { nth, back } => {
                if open.is_empty() {
                    continue;
                }
                let taken = open.remove(nth % open.len());
                let back = 1 + (back - 1) % taken.cost;
                let bucket = buckets.get_mut(&taken.key).expect("a bucket that took");
                // As the engine settles: only while the take's window is the current one.
                if alg.same_window(at(taken.at_us), at(now)) {
                    bucket.give_back(alg, at(now), at(taken.at_us), back);
                }
                let memory = bucket.status(alg, at(now)).remaining;
                let left = lua.adjust(alg, taken.key, -(back as i64), taken.redis_at_us, now).map_err(fail)?;
                if memory != left.max(0) as u64 {
                    return Err(fail(format!(
                        "{back} given back of {} taken at start + {} us; remaining in memory {memory}, in Lua {left}",
                        taken.cost,
                        taken.at_us - case.start_us
                    )));
                }
            }
            Op::Force { key, units } => {
                let bucket = buckets.entry(key).or_insert_with(|| alg.new_bucket(at(now)));
                bucket.force(alg, at(now), units);
                let memory = bucket.status(alg, at(now)).remaining;
                let left = lua.adjust(alg, key, units as i64, 0, now).map_err(fail)?;
                if memory != left.max(0) as u64 {
                    return Err(fail(format!("remaining in memory {memory}, in Lua {left}")));
                }
                shadow(lua, key, units, now).map_err(fail)?;
            }
            Op::TopUp { key, units } => {
                let bucket = buckets.entry(key).or_insert_with(|| alg.new_bucket(at(now)));
                bucket.refund(alg, at(now), units);
                let memory = bucket.status(alg, at(now)).remaining;
                let left = lua.adjust(alg, key, -(units as i64), 0, now).map_err(fail)?;
                if memory != left.max(0) as u64 {
                    return Err(fail(format!("topped up: remaining in memory {memory}, in Lua {left}")));
                }
            }
        }
    }
    Ok(())
}

/// Runs `CASES` generated cases of `kind`; panics with the smallest failing one.
fn check(lua: &mut Lua, kind: Kind) {
    // Shrinking runs a case per step: enough steps to reach a short sequence.
    let config = Config { cases: CASES, max_shrink_iters: 4096, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    // The runner takes a `Fn`: the connection is borrowed for each case.
    let lua = std::cell::RefCell::new(lua);
    let result = runner.run(&case(kind), |case| run(&mut lua.borrow_mut(), &case));
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, case)) => {
            panic!("{}: memory and Lua differ.\n{why}\nsmallest failing case: {case:#?}", kind.name())
        }
        Err(TestError::Abort(why)) => panic!("{}: proptest gave up: {why}", kind.name()),
    }
}

/// Algorithms whose two sides the harness found to differ, not fixed yet,
/// each with the smallest sequence found and the reason. They are not
/// skipped silently: `known_differences` runs them (it is ignored, so run
/// it with `--ignored`), and a fix removes the line here. Nothing else may
/// be added to this list to make the test pass.
const KNOWN_DIFFERENCES: &[(Kind, &str)] = &[
    (
        Kind::TokenBucket,
        "capacity 13, 17/s, at one instant: take 1, take 9, force 4 (a debt of 1), give back 2 of the 9: \
         Lua has 1 remaining (-1 + 2), memory 0. token_bucket.rs keeps a debt as time rounded up to a ns, \
         and paying it back takes the gain of that time (1.00000001 units), so memory loses 1e-8 unit. \
         The docs (tokens below zero refill from there) say Lua is right: token_bucket.rs must change.",
    ),
    (
        Kind::LeakyBucket,
        "capacity 2, 3/s, police, at one instant: take 2, give back 1: memory has 1 remaining, Lua 0. \
         Lua keeps the drain time as a Unix time in us in a double (a step of 0.25 us today), so the \
         level comes out as 1.0000002 and 'remaining' is floored to 0. Lua must keep the drain time \
         exact, as it now does for GCRA.",
    ),
    (
        Kind::WarmUp,
        "1/s over 6 s, cold factor 5, from start + 1.5 s: force 2 on a key, wait 0.5625 s, take 1, \
         wait 0.9375 s, take 1: memory admits the last take, Lua denies it. Not analysed yet.",
    ),
];

fn known(kind: Kind) -> bool {
    KNOWN_DIFFERENCES.iter().any(|(k, _)| *k == kind)
}

#[test]
fn every_algorithm_decides_alike_in_memory_and_in_lua() {
    let mut lua = Lua::start();
    for &(_, kind) in Kind::NAMED {
        if !known(kind) {
            check(&mut lua, kind);
        }
    }
}

/// The algorithms of `KNOWN_DIFFERENCES`: this fails until they are fixed.
#[test]
#[ignore = "the differences listed in KNOWN_DIFFERENCES are not fixed yet"]
fn known_differences() {
    let mut lua = Lua::start();
    for &(kind, why) in KNOWN_DIFFERENCES {
        eprintln!("{}: known to differ: {why}", kind.name());
        check(&mut lua, kind);
    }
}

/// The generators together reach every algorithm code the server sends to
/// limits.lua (the calendar is a fixed window's option, with a code of its own).
/// A Charge's idempotency key is claimed by the script that takes the
/// charge: the first run claims and takes, a second run of the same key
/// answers that it was claimed and takes nothing, and a charge without a
/// key is taken as before.
#[test]
fn a_claimed_adjust_claims_and_takes_together_once() {
    let mut lua = Lua::start();
    let alg = Algorithm::TokenBucket(token_bucket::Config::new(100, Rate::whole_per_second(1)));
    let claim = format!("fg:i:{{{RESOURCE}}}:charge-1");
    let claimed = |lua: &mut Lua, units: i64| {
        let mut inv = lua.adjust.prepare_invoke();
        inv.key(marker_key(RESOURCE)).key(lua.key(0)).key(&claim);
        inv.arg(0).arg(&lua.token).arg(units).arg(0);
        inv.arg(&limit_args(&alg, at(T0_US))[..]);
        inv.arg(600_000.0_f64).arg(T0_US);
        let v: redis::Value = inv.invoke(&mut lua.con).expect("adjust.lua with a claim");
        match parse_claimed_adjust(v, 1).expect("a reply of adjust.lua") {
            Answered::Done(done) => done.map(|(_, left)| left[0]),
            other => panic!("adjust.lua did nothing: {other:?}"),
        }
    };
    assert_eq!(claimed(&mut lua, 30), Some(70), "the first charge of the key is taken");
    assert_eq!(claimed(&mut lua, 30), None, "the second is a duplicate");
    assert_eq!(lua.adjust(&alg, 0, 0, 0, T0_US), Ok(70), "and took nothing");
    let ttl: i64 = redis::cmd("PTTL").arg(&claim).query(&mut lua.con).expect("PTTL");
    assert!((599_000..=600_000).contains(&ttl), "the claim lives as long as it was told: {ttl} ms");
    assert_eq!(lua.adjust(&alg, 0, 5, 0, T0_US), Ok(65), "a charge without a key is taken as before");
}

#[test]
fn every_lua_code_is_generated() {
    let mut runner = TestRunner::deterministic();
    let mut seen: Vec<Code> = Vec::new();
    for &(_, kind) in Kind::NAMED {
        let strategy = algorithm(kind);
        for _ in 0..200 {
            let alg = strategy.new_tree(&mut runner).expect("a configuration").current();
            let code = Code::of(&alg);
            if !seen.contains(&code) {
                seen.push(code);
            }
        }
    }
    let missing: Vec<&Code> = Code::ALL.iter().filter(|c| !seen.contains(c)).collect();
    assert!(missing.is_empty(), "no generator in the conformance test makes {missing:?}");
}
