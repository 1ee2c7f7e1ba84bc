//! The Lua scripts, named by an enum, and how their arguments are laid out.
//! Scripts run with EVALSHA (loaded on first use); see lua/*.lua for what each
//! one does, and `wire` for what each one returns.

use redis::Script;

use super::conn::tag;
use floodgate_core::breaker::{Outcome, State};
use floodgate_core::limiter::Algorithm;
use floodgate_core::limiter::leaky_bucket::Mode;
use floodgate_core::store::BucketKey;
use floodgate_core::time::Timestamp;
use floodgate_rules::{BreakerConfig, Limit, WindowKind};

const LIMITS: &str = include_str!("lua/limits.lua");
const BREAKER: &str = include_str!("lua/breaker.lua");

/// How limits.lua is told which algorithm a limit runs: `CODE.<lua name>`,
/// a table prepended to the Lua from this list, so the two cannot drift; a
/// test checks that limits.lua defines every one.
macro_rules! codes {
    ($($code:ident = $n:literal, $lua:literal;)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Code {
            $($code = $n),*
        }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$code),*];

            /// Its name in limits.lua's `CODE` table.
            pub fn lua_name(self) -> &'static str {
                match self {
                    $(Code::$code => $lua),*
                }
            }
        }
    };
}

codes! {
    TokenBucket = 1, "token_bucket";
    Gcra = 2, "gcra";
    LeakyBucket = 3, "leaky_bucket";
    FixedWindow = 4, "fixed_window";
    SlidingLog = 5, "sliding_log";
    SlidingWindow = 6, "sliding_window";
    Calendar = 7, "calendar";
    WarmUp = 8, "warm_up";
    Balance = 9, "balance";
}

impl Code {
    /// How a limit's algorithm goes to Redis.
    pub fn of(alg: &Algorithm) -> Code {
        match alg {
            Algorithm::TokenBucket(_) => Code::TokenBucket,
            Algorithm::Gcra(_) => Code::Gcra,
            Algorithm::LeakyBucket(_) => Code::LeakyBucket,
            Algorithm::FixedWindow(c) if c.calendar.is_some() => Code::Calendar,
            Algorithm::FixedWindow(_) => Code::FixedWindow,
            Algorithm::SlidingWindowLog(_) => Code::SlidingLog,
            Algorithm::SlidingWindow(_) => Code::SlidingWindow,
            Algorithm::WarmUp(_) => Code::WarmUp,
            Algorithm::Balance(_) => Code::Balance,
        }
    }

    fn number(self) -> f64 {
        f64::from(self as u8)
    }
}

/// limits.lua with its `CODE` table first.
fn limits_lua() -> String {
    let codes: Vec<String> = Code::ALL.iter().map(|c| format!("{} = {}", c.lua_name(), *c as u8)).collect();
    format!("local CODE = {{ {} }}\n{LIMITS}", codes.join(", "))
}

/// The conformance test's clock (server/redis/tests/conformance.rs): a
/// `now_us` that reads the script's last argument instead of Redis's TIME.
/// It is declared after limits.lua and before the script's own body, so it
/// hides limits.lua's `now_us` from that body. The body reads only the
/// arguments at the places it names (and the decisions or keys it counts),
/// so the extra last argument changes nothing else. Production scripts never
/// contain this: a replica always decides on Redis's own clock.
const TEST_CLOCK: &str = "local function now_us() return tonumber(ARGV[#ARGV]) end";

/// The Lua of a script made of limits.lua and `body`, as `Scripts` builds
/// it, but with the test clock above. For the conformance test only.
pub fn lua_with_test_clock(body: &str) -> String {
    assert!(
        !body.contains("redis.call('TIME')"),
        "this script reads Redis's clock itself, so a test cannot set its time"
    );
    format!("{}\n{TEST_CLOCK}\n{body}", limits_lua())
}

/// Keys not tied to a resource share one tag, so they sit together.
pub const REPLICAS: &str = "{fg}:replicas";
/// The digest of each live replica's rules.
pub const RULES_DIGESTS: &str = "{fg}:rules-digests";
pub const RULES: &str = "{fg}:rules";
pub const EVENTS: &str = "{fg}:events";

/// Every script Floodgate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptName {
    /// A strict decision over a request's strict limits.
    Take,
    /// The replicated sync of a batch of buckets.
    Sync,
    /// This replica is alive; how many are.
    Heartbeat,
    /// Puts back what a replica knew of a resource Redis lost.
    Restore,
    /// Whether a resource's marker is still the one a replica knows.
    Marker,
    /// Takes units beyond the limit, or gives some back, on strict buckets.
    Adjust,
    BreakerSync,
    BreakerProbe,
    BreakerReport,
    BreakerForce,
    /// Takes, gives back or adds a strict concurrency slot.
    Slot,
    /// Renews this replica's lease of a replicated concurrency limit.
    SlotLease,
    /// Operators' degradation levels, newest wins.
    Levels,
    /// An adaptive concurrency limit's windows and state, for the fleet.
    Adaptive,
    /// Units a replica counted, added to the fleet's traffic record.
    Traffic,
}

pub struct Scripts {
    take: Script,
    sync: Script,
    heartbeat: Script,
    restore: Script,
    marker: Script,
    adjust: Script,
    breaker_sync: Script,
    breaker_probe: Script,
    breaker_report: Script,
    breaker_force: Script,
    slot: Script,
    slot_lease: Script,
    levels: Script,
    adaptive: Script,
    traffic: Script,
}

/// What a breaker script is asked to do, with its own arguments.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BreakerOp {
    /// Push this replica's calls since the last sync; bring back the shared state.
    Sync { calls: u64, failures: u64, slow: u64, tripped: bool },
    /// May a call go ahead as a probe?
    Probe,
    /// A probe's outcome.
    Report { generation: u64, outcome: Outcome, slow: bool },
    /// An operator's state: CLOSED (reset), FORCED_OPEN, DISABLED or METRICS_ONLY.
    Force(State),
}

impl ScriptName {
    /// The `op` label of Redis metrics.
    pub fn op(self) -> &'static str {
        match self {
            ScriptName::Take => "take",
            ScriptName::Sync => "sync",
            ScriptName::Heartbeat => "heartbeat",
            ScriptName::Restore => "restore",
            ScriptName::Marker => "marker",
            ScriptName::Adjust => "adjust",
            ScriptName::BreakerSync => "breaker_sync",
            ScriptName::BreakerProbe => "breaker_probe",
            ScriptName::BreakerReport => "breaker_report",
            ScriptName::BreakerForce => "breaker_force",
            ScriptName::Slot => "slot",
            ScriptName::SlotLease => "slot_lease",
            ScriptName::Levels => "levels",
            ScriptName::Adaptive => "adaptive",
            ScriptName::Traffic => "traffic",
        }
    }
}

impl Scripts {
    pub fn get(&self, name: ScriptName) -> &Script {
        match name {
            ScriptName::Take => &self.take,
            ScriptName::Sync => &self.sync,
            ScriptName::Heartbeat => &self.heartbeat,
            ScriptName::Restore => &self.restore,
            ScriptName::Marker => &self.marker,
            ScriptName::Adjust => &self.adjust,
            ScriptName::BreakerSync => &self.breaker_sync,
            ScriptName::BreakerProbe => &self.breaker_probe,
            ScriptName::BreakerReport => &self.breaker_report,
            ScriptName::BreakerForce => &self.breaker_force,
            ScriptName::Slot => &self.slot,
            ScriptName::SlotLease => &self.slot_lease,
            ScriptName::Levels => &self.levels,
            ScriptName::Adaptive => &self.adaptive,
            ScriptName::Traffic => &self.traffic,
        }
    }
}

impl BreakerOp {
    pub fn script(self) -> ScriptName {
        match self {
            BreakerOp::Sync { .. } => ScriptName::BreakerSync,
            BreakerOp::Probe => ScriptName::BreakerProbe,
            BreakerOp::Report { .. } => ScriptName::BreakerReport,
            BreakerOp::Force(_) => ScriptName::BreakerForce,
        }
    }

    /// The arguments after breaker.lua's ten and its deadline (ARGV[12] on).
    pub fn args(self) -> Vec<f64> {
        let flag = |b: bool| f64::from(u8::from(b));
        match self {
            BreakerOp::Sync { calls, failures, slow, tripped } => {
                vec![calls as f64, failures as f64, slow as f64, flag(tripped)]
            }
            BreakerOp::Probe => Vec::new(),
            BreakerOp::Report { generation, outcome, slow } => {
                let code = match outcome {
                    Outcome::Success => 1.0,
                    Outcome::Failure => 2.0,
                    Outcome::Ignored => 3.0,
                };
                vec![generation as f64, code, flag(slow)]
            }
            BreakerOp::Force(state) => vec![f64::from(state.number())],
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        let lua = limits_lua();
        let limits = |body: &str| Script::new(&format!("{lua}\n{body}"));
        let breaker = |body: &str| Script::new(&format!("{BREAKER}\n{body}"));
        Scripts {
            take: limits(include_str!("lua/take.lua")),
            sync: limits(include_str!("lua/sync.lua")),
            heartbeat: Script::new(include_str!("lua/heartbeat.lua")),
            restore: limits(include_str!("lua/restore.lua")),
            marker: limits(include_str!("lua/marker.lua")),
            adjust: limits(include_str!("lua/adjust.lua")),
            breaker_sync: breaker(include_str!("lua/breaker_sync.lua")),
            breaker_probe: breaker(include_str!("lua/breaker_probe.lua")),
            breaker_report: breaker(include_str!("lua/breaker_report.lua")),
            breaker_force: breaker(include_str!("lua/breaker_force.lua")),
            slot: Script::new(include_str!("lua/slot.lua")),
            slot_lease: Script::new(include_str!("lua/slot_lease.lua")),
            levels: Script::new(include_str!("lua/levels.lua")),
            adaptive: Script::new(include_str!("lua/adaptive.lua")),
            traffic: Script::new(include_str!("lua/traffic.lua")),
        }
    }
}

/// An adaptive concurrency limit's key: the fleet's window and state.
pub fn adaptive_key(resource: &str) -> String {
    format!("fg:a:{{{}}}", tag(resource))
}

/// A concurrency limit's keys: the strict in-flight set, the replicated leases.
pub fn slot_keys(resource: &str) -> [String; 2] {
    let k = format!("fg:c:{{{}}}", tag(resource));
    [k.clone(), format!("{k}:l")]
}

/// A replica's channel: reports of the permits it issued, passed on by others.
pub fn replica_channel(tag: u32) -> String {
    format!("{{fg}}:to:{tag:08x}")
}

/// A bucket's key in Redis: tagged with the request's resource, so one
/// decision's keys share a slot.
pub fn bucket_key(resource: &str, limit: &Limit, key: &BucketKey) -> String {
    format!("fg:b:{{{}}}:{}:{}:{}", tag(resource), limit.name, limit.algorithm.name(), key.scope)
}

/// Where the idempotency keys of a resource's charges are claimed (each
/// under this prefix, by its hash): in the resource's slot.
pub fn claimed_prefix(resource: &str) -> String {
    format!("fg:i:{{{}}}", tag(resource))
}

/// A resource's marker: present while Redis holds what replicas pushed for it.
pub fn marker_key(resource: &str) -> String {
    format!("fg:m:{{{}}}", tag(resource))
}

/// A breaker's keys: its state and its time window.
pub fn breaker_keys(resource: &str) -> [String; 2] {
    let k = format!("fg:k:{{{}}}", tag(resource));
    [k.clone(), format!("{k}:w")]
}

/// The five numbers limits.lua reads for an algorithm (times in microseconds).
/// A calendar window passes its boundaries around `now` (this replica's
/// clock): Redis picks the window its own clock falls in.
pub fn limit_args(alg: &Algorithm, now: Timestamp) -> [f64; 5] {
    let us = |ns: u64| ns as f64 / 1000.0;
    let code = Code::of(alg).number();
    match alg {
        Algorithm::TokenBucket(c) => [code, c.capacity as f64, c.refill.as_f64(), 0.0, 0.0],
        Algorithm::Gcra(c) => [code, c.rate.as_f64(), c.burst as f64, 0.0, 0.0],
        Algorithm::LeakyBucket(c) => {
            let (max_wait, shape) = match c.mode {
                Mode::Police => (-1.0, 0.0),
                Mode::Shape { max_wait } => (max_wait.map_or(-1.0, us), 1.0),
            };
            [code, c.capacity as f64, c.leak.as_f64(), max_wait, shape]
        }
        Algorithm::FixedWindow(c) => match &c.calendar {
            None => [code, c.limit as f64, us(c.window), 0.0, 0.0],
            Some(cal) => {
                let (start, end) = cal.window(now.as_nanos());
                [code, c.limit as f64, us(start), us(end), us(cal.end_of(end))]
            }
        },
        Algorithm::SlidingWindowLog(c) => [code, c.limit as f64, us(c.window), 0.0, 0.0],
        Algorithm::SlidingWindow(c) => [code, c.limit as f64, us(c.window), 0.0, 0.0],
        Algorithm::WarmUp(c) => [code, c.rate.as_f64(), c.period_ms as f64, f64::from(c.cold_factor), 0.0],
        Algorithm::Balance(c) => [code, c.max as f64, 0.0, 0.0, 0.0],
    }
}

/// The eleven numbers breaker.lua reads.
pub fn breaker_args(c: &BreakerConfig) -> [f64; 11] {
    let us = |d: std::time::Duration| d.as_micros() as f64;
    let (kind, size) = match c.window {
        WindowKind::Count(n) => (1.0, f64::from(n)),
        WindowKind::Time(s) => (2.0, f64::from(s)),
        WindowKind::Tumbling(ms) => (3.0, f64::from(ms.max(1))),
    };
    // A threshold that is off is a rate no window reaches (Lua reads no "inf").
    let rate = |r: f64| if r.is_finite() { r } else { 2.0 };
    [
        rate(c.failure_rate_threshold),
        rate(c.slow_call_rate_threshold),
        f64::from(c.minimum_calls),
        kind,
        size,
        us(c.wait_in_open.initial),
        c.wait_in_open.multiplier,
        us(c.wait_in_open.max),
        f64::from(c.half_open_calls),
        us(c.max_wait_in_half_open),
        f64::from(c.failure_count_threshold.unwrap_or(0)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_core::store::LimitId;

    #[test]
    fn limits_lua_defines_every_code_and_no_other() {
        let defined: Vec<&str> =
            LIMITS.lines().filter_map(|l| l.strip_prefix("A[")?.split_once(']').map(|(code, _)| code)).collect();
        let wanted: Vec<String> = Code::ALL.iter().map(|c| format!("CODE.{}", c.lua_name())).collect();
        let missing: Vec<&String> = wanted.iter().filter(|w| !defined.contains(&w.as_str())).collect();
        assert!(missing.is_empty(), "limits.lua defines no algorithm for {missing:?}");
        let unknown: Vec<&&str> = defined.iter().filter(|d| !wanted.iter().any(|w| w == *d)).collect();
        assert!(unknown.is_empty(), "limits.lua defines algorithms the server never sends: {unknown:?}");
        // Each defines every step the scripts call.
        for block in LIMITS.split("\nA[").skip(1) {
            let name = block.split(']').next().unwrap_or_default();
            let body = block.split("\n}\n").next().unwrap_or_default();
            for step in ["restored =", "status = function", "take = function", "give = function"] {
                assert!(body.contains(step), "limits.lua's {name} has no `{step}`");
            }
        }
        assert!(limits_lua().starts_with("local CODE = { token_bucket = 1, gcra = 2,"), "{}", &limits_lua()[..80]);
    }

    #[test]
    fn keys_share_the_resource_tag_even_with_braces() {
        let rules = floodgate_rules::RuleSet::from_yaml(
            "resources: [ { name: 'a}b', limits: [ { name: l, key: [user], algorithm: fixed_window, limit: 1, window: 1s } ] } ]",
            "t",
        )
        .unwrap();
        let limit = &rules.rules()[0].limits[0];
        let k = bucket_key("a}b", limit, &BucketKey::new(LimitId(1), ["u1"]));
        assert_eq!(k, "fg:b:{a%7Db}:l:fixed_window:u1");
        assert_eq!(breaker_keys("a}b")[1], "fg:k:{a%7Db}:w");
    }
}
