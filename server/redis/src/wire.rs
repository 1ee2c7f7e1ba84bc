//! What the scripts return, parsed once into types. A reply of the wrong shape
//! is an error (logged and counted by the caller), never a silent default: a
//! script changed under us must not turn into wrong decisions.

use std::time::Duration;

use redis::Value;
use smallvec::SmallVec;

use super::scripts::ScriptName;
use floodgate_core::breaker::State;
use floodgate_core::limiter::Shared;
use floodgate_core::time::Timestamp;

/// A reply that does not have the shape its script promises.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("unexpected reply from the {} script: {what}", script.op())]
pub struct ReplyError {
    pub script: ScriptName,
    pub what: String,
}

/// take.lua: the strict decision over a request's strict limits.
#[derive(Clone, Debug, PartialEq)]
pub struct TakeReply {
    /// Redis's time when it decided (us): when the units were taken.
    pub at_us: i64,
    /// Every strict limit admitted, and each took the cost.
    pub admitted: bool,
    /// One per limit, in the order the keys were sent.
    pub limits: SmallVec<[TakeLimit; 4]>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TakeLimit {
    pub admitted: bool,
    /// What is left, as a decision reports it (never below 0).
    pub remaining: u64,
    /// What Redis has available after the decision: negative when charges
    /// took the bucket beyond its limit.
    pub available: i64,
    pub reset_after: Duration,
    pub retry_after: Duration,
    pub wait: Duration,
}

/// One breaker script's answer: the shared state, and the script's result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerReply {
    pub result: i64,
    pub state: State,
    pub generation: u64,
    /// Redis's clock, in microseconds: when OPEN ends, and now.
    pub open_until_us: i64,
    pub now_us: i64,
    pub openings: u32,
    /// The state changed in this call: announce it.
    pub changed: bool,
}

/// breaker_probe.lua's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    Probe,
    Plain,
    Denied,
}

pub(crate) fn error(script: ScriptName, what: impl Into<String>) -> ReplyError {
    ReplyError { script, what: what.into() }
}

/// A reply as integers (script replies: Lua numbers arrive as integers).
fn integers(script: ScriptName, v: Value) -> Result<Vec<i64>, ReplyError> {
    let Value::Array(items) = v else { return Err(error(script, format!("not an array: {v:?}"))) };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::Int(n) => Ok(n),
            other => Err(error(script, format!("item {i} is not an integer: {other:?}"))),
        })
        .collect()
}

/// A number sent as an integer or as text (Lua floats are sent as text).
fn number(script: ScriptName, i: usize, v: &Value) -> Result<f64, ReplyError> {
    let parsed = match v {
        Value::Int(n) => Some(*n as f64),
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    };
    parsed.filter(|n: &f64| n.is_finite()).ok_or_else(|| error(script, format!("item {i} is not a number: {v:?}")))
}

fn micros(n: i64) -> Duration {
    Duration::from_micros(n.max(0) as u64)
}

/// What a script that pushes or takes answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Answered<T> {
    Done(T),
    /// It ran after its deadline and changed nothing.
    TooLate,
    /// The resource's marker is gone: Redis lost its data; nothing changed.
    Lost,
}

/// `{'late'}` and `{'lost'}`, the answers of a script that did nothing
/// (words: an adjust of one bucket answers `{-2}` for a debt of two).
fn did_nothing<T>(v: &Value) -> Option<Answered<T>> {
    let Value::Array(items) = v else { return None };
    let [item] = &items[..] else { return None };
    let word = match item {
        Value::BulkString(b) => b.as_slice(),
        Value::SimpleString(s) => s.as_bytes(),
        _ => return None,
    };
    match word {
        b"late" => Some(Answered::TooLate),
        b"lost" => Some(Answered::Lost),
        _ => None,
    }
}

impl TakeReply {
    /// Per decision `{admitted, then five numbers per limit}`, for decisions
    /// of `limits[i]` limits each.
    pub fn parse_many(v: Value, limits: &[usize]) -> Result<Answered<Vec<TakeReply>>, ReplyError> {
        if let Some(nothing) = did_nothing(&v) {
            return Ok(nothing);
        }
        Self::decided(v, limits).map(Answered::Done)
    }

    fn decided(v: Value, limits: &[usize]) -> Result<Vec<TakeReply>, ReplyError> {
        let script = ScriptName::Take;
        let r = integers(script, v)?;
        let expected: usize = 1 + limits.iter().map(|n| 1 + 5 * n).sum::<usize>();
        if r.len() != expected {
            return Err(error(
                script,
                format!("{} numbers for {} decisions of {limits:?} limits", r.len(), limits.len()),
            ));
        }
        let at_us = r[0];
        let mut at = 1;
        limits
            .iter()
            .map(|&n| {
                let reply = Self::parse_one(at_us, &r[at..at + 1 + 5 * n]);
                at += 1 + 5 * n;
                reply
            })
            .collect()
    }

    fn parse_one(at_us: i64, r: &[i64]) -> Result<TakeReply, ReplyError> {
        let script = ScriptName::Take;
        let flag = |n: i64| match n {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(error(script, format!("{n} is not 0 or 1"))),
        };
        let admitted = flag(r[0])?;
        let limits = r[1..]
            .chunks(5)
            .map(|c| {
                Ok(TakeLimit {
                    admitted: flag(c[0])?,
                    remaining: c[1].max(0) as u64,
                    available: c[1],
                    reset_after: micros(c[2]),
                    retry_after: micros(c[3]),
                    wait: micros(c[4]),
                })
            })
            .collect::<Result<_, ReplyError>>()?;
        Ok(TakeReply { at_us, admitted, limits })
    }
}

/// adjust.lua: Redis's time (us), then per bucket what is available after
/// (negative for a debt).
pub fn parse_adjusted(v: Value, buckets: usize) -> Result<Answered<Adjusted>, ReplyError> {
    if let Some(nothing) = did_nothing(&v) {
        return Ok(nothing);
    }
    let mut r = integers(ScriptName::Adjust, v)?;
    if r.len() != buckets + 1 {
        return Err(error(ScriptName::Adjust, format!("{} numbers for {buckets} buckets and the time", r.len())));
    }
    let at_us = r.remove(0);
    Ok(Answered::Done((at_us, r)))
}

/// What adjust.lua answered: Redis's time (us) and what each bucket has
/// available after.
pub type Adjusted = (i64, Vec<i64>);

/// adjust.lua with a claim: `None` when the key was claimed before (`{'dup'}`:
/// nothing changed), else as [`parse_adjusted`].
pub fn parse_claimed_adjust(v: Value, buckets: usize) -> Result<Answered<Option<Adjusted>>, ReplyError> {
    if let Value::Array(items) = &v
        && let [Value::BulkString(word)] = &items[..]
        && word.as_slice() == b"dup"
    {
        return Ok(Answered::Done(None));
    }
    Ok(match parse_adjusted(v, buckets)? {
        Answered::Done(done) => Answered::Done(Some(done)),
        Answered::TooLate => Answered::TooLate,
        Answered::Lost => Answered::Lost,
    })
}

/// sync.lua: per bucket `{lease, window start us, prev, cur, available}`.
pub fn parse_sync(v: Value, buckets: usize) -> Result<Answered<Vec<Shared>>, ReplyError> {
    if let Some(nothing) = did_nothing(&v) {
        return Ok(nothing);
    }
    shared(v, buckets).map(Answered::Done)
}

fn shared(v: Value, buckets: usize) -> Result<Vec<Shared>, ReplyError> {
    let script = ScriptName::Sync;
    let Value::Array(items) = v else { return Err(error(script, format!("not an array: {v:?}"))) };
    if items.len() != 6 * buckets {
        return Err(error(script, format!("{} values for {buckets} buckets", items.len())));
    }
    items
        .chunks(6)
        .enumerate()
        .map(|(b, c)| {
            let n = |j: usize| number(script, b * 6 + j, &c[j]);
            let whole = |j: usize| n(j).map(|x| x.max(0.0) as u64);
            Ok(Shared {
                lease: n(0)?,
                window_start: Timestamp::from_nanos(whole(1)?.saturating_mul(1000)),
                prev: whole(2)?,
                cur: whole(3)?,
                available: n(4)?,
                seq: whole(5)?,
            })
        })
        .collect()
}

/// heartbeat.lua's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    /// How many replicas are alive, this one included.
    pub live: u32,
    /// Redis's clock, us.
    pub now_us: i64,
    /// The run id of the Redis process that answered: another one means
    /// Redis restarted or failed over, and may have gone back in time.
    pub identity: String,
    /// The live replicas' names.
    pub names: Vec<String>,
    /// The digest of each live replica's rules, in the order of `names`
    /// (empty when a replica did not say).
    pub digests: Vec<String>,
}

/// heartbeat.lua: how many replicas are alive, Redis's clock in us, its run
/// id, and the live replicas' names.
pub fn parse_live(v: Value) -> Result<Live, ReplyError> {
    let script = ScriptName::Heartbeat;
    let Value::Array(mut items) = v else { return Err(error(script, "not an array")) };
    let mut texts = items.split_off(items.len().min(2)).into_iter().map(|n| match n {
        Value::BulkString(b) => String::from_utf8(b).map_err(|_| error(script, "a name is not UTF-8")),
        other => Err(error(script, format!("a name is not text: {other:?}"))),
    });
    let r = integers(script, Value::Array(items))?;
    let identity = texts.next().ok_or_else(|| error(script, "no run id"))??;
    let entries = texts.collect::<Result<Vec<String>, ReplyError>>()?;
    let (names, digests) = entries
        .into_iter()
        .map(|e| match e.split_once('\n') {
            Some((name, digest)) => (name.to_string(), digest.to_string()),
            None => (e, String::new()),
        })
        .unzip();
    match r[..] {
        [live, now] if live >= 0 && now > 0 => {
            Ok(Live { live: u32::try_from(live).unwrap_or(u32::MAX), now_us: now, identity, names, digests })
        }
        _ => Err(error(script, format!("not {{live, now, run id, names...}}: {r:?}"))),
    }
}

/// slot.lua: whether the permit holds a slot, else ms until one may be free.
pub fn parse_slot(v: Value) -> Result<Answered<Result<(), Duration>>, ReplyError> {
    if let Some(nothing) = did_nothing(&v) {
        return Ok(nothing);
    }
    let r = integers(ScriptName::Slot, v)?;
    match r[..] {
        [1, _] => Ok(Answered::Done(Ok(()))),
        [0, ms] => Ok(Answered::Done(Err(Duration::from_millis(ms.max(1) as u64)))),
        _ => Err(error(ScriptName::Slot, format!("not {{held, ms}}: {r:?}"))),
    }
}

/// slot_lease.lua: this replica's lease, and the slots the others hold.
pub fn parse_slot_lease(v: Value) -> Result<Answered<(u32, u32)>, ReplyError> {
    if let Some(nothing) = did_nothing(&v) {
        return Ok(nothing);
    }
    let r = integers(ScriptName::SlotLease, v)?;
    let slots = |n: i64| u32::try_from(n).ok();
    match r[..] {
        [lease, others] => match (slots(lease), slots(others)) {
            (Some(lease), Some(others)) => Ok(Answered::Done((lease, others))),
            _ => Err(error(ScriptName::SlotLease, format!("out of range: {r:?}"))),
        },
        _ => Err(error(ScriptName::SlotLease, format!("not {{lease, others}}: {r:?}"))),
    }
}

/// restore.lua: how many buckets were changed, and the marker's token.
pub fn parse_restored(v: Value) -> Result<(u64, String), ReplyError> {
    let script = ScriptName::Restore;
    let Value::Array(items) = v else { return Err(error(script, format!("not an array: {v:?}"))) };
    match &items[..] {
        [Value::Int(n), token] if *n >= 0 => {
            let token = match token {
                Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
                Value::SimpleString(s) => Some(s.clone()),
                Value::Int(n) => Some(n.to_string()),
                _ => None,
            };
            match token.filter(|t| !t.is_empty()) {
                Some(token) => Ok((*n as u64, token)),
                None => Err(error(script, format!("no marker token: {items:?}"))),
            }
        }
        _ => Err(error(script, format!("not {{count, token}}: {items:?}"))),
    }
}

impl BreakerReply {
    /// `{result, state, generation, open until us, openings, now us,
    /// changed}`; `None` for `{'late'}`: it ran past its deadline, changing nothing.
    pub fn parse(script: ScriptName, v: Value) -> Result<Option<BreakerReply>, ReplyError> {
        if matches!(did_nothing::<()>(&v), Some(Answered::TooLate)) {
            return Ok(None);
        }
        let r = integers(script, v)?;
        let &[result, state, generation, open_until_us, openings, now_us, changed] = &r[..] else {
            return Err(error(script, format!("{} numbers, not 7", r.len())));
        };
        let state = State::from_number(state).ok_or_else(|| error(script, format!("unknown breaker state {state}")))?;
        let generation = u64::try_from(generation).map_err(|_| error(script, format!("generation {generation}")))?;
        let changed = match changed {
            0 => false,
            1 => true,
            n => return Err(error(script, format!("changed is {n}"))),
        };
        let openings = u32::try_from(openings.max(0)).unwrap_or(u32::MAX);
        Ok(Some(BreakerReply { result, state, generation, open_until_us, now_us, openings, changed }))
    }

    /// What breaker_probe.lua decided.
    pub fn grant(&self) -> Result<Grant, ReplyError> {
        match self.result {
            1 => Ok(Grant::Probe),
            2 => Ok(Grant::Plain),
            0 => Ok(Grant::Denied),
            n => Err(error(ScriptName::BreakerProbe, format!("result {n}"))),
        }
    }

    /// How long OPEN still lasts, by Redis's clock.
    pub fn open_for(&self) -> Duration {
        micros(self.open_until_us.saturating_sub(self.now_us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(w: &str) -> Value {
        Value::Array(vec![Value::BulkString(w.as_bytes().to_vec())])
    }

    #[test]
    fn an_adjust_of_one_bucket_in_debt_is_an_answer_not_a_loss() {
        // A debt of 2 on one bucket: before, {-2} read as "Redis lost the
        // resource", so the replica restored a stale figure and adjusted
        // again (Redis counted 693 of a window of 400).
        assert_eq!(parse_adjusted(ints(&[7, -2]), 1), Ok(Answered::Done((7, vec![-2]))));
        assert_eq!(parse_adjusted(ints(&[7, -1]), 1), Ok(Answered::Done((7, vec![-1]))));
        assert!(parse_adjusted(ints(&[-1]), 1).is_err(), "the time is missing");
        assert_eq!(parse_adjusted(word("lost"), 1), Ok(Answered::Lost));
        assert_eq!(parse_adjusted(word("late"), 1), Ok(Answered::TooLate));
    }

    fn ints(v: &[i64]) -> Value {
        Value::Array(v.iter().map(|&n| Value::Int(n)).collect())
    }

    #[test]
    fn a_take_reply_has_five_numbers_per_limit_of_each_decision() {
        let Answered::Done(r) =
            TakeReply::parse_many(ints(&[99, 1, 1, 4, 1000, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0, 0, 5, 7]), &[1, 2]).unwrap()
        else {
            panic!("decided")
        };
        assert!(r[0].admitted && !r[1].admitted);
        assert_eq!((r[0].at_us, r[1].at_us), (99, 99), "Redis's time, once for every decision");
        assert_eq!(r[0].limits[0].remaining, 4);
        assert_eq!(r[0].limits[0].reset_after, Duration::from_millis(1));
        assert_eq!(r[1].limits.len(), 2);
        assert_eq!(r[1].limits[1].retry_after, Duration::from_micros(5));
        let e = TakeReply::parse_many(ints(&[9, 1, 1, 4]), &[1]).unwrap_err();
        assert_eq!(e.to_string(), "unexpected reply from the take script: 4 numbers for 1 decisions of [1] limits");
        assert!(TakeReply::parse_many(ints(&[9, 2, 1, 4, 0, 0, 0]), &[1]).is_err(), "2 is not a flag");
        assert!(TakeReply::parse_many(Value::Nil, &[1]).is_err());
        assert_eq!(TakeReply::parse_many(word("late"), &[1]), Ok(Answered::TooLate));
        assert_eq!(TakeReply::parse_many(word("lost"), &[3]), Ok(Answered::Lost));
    }

    #[test]
    fn an_unknown_breaker_state_is_an_error_not_closed() {
        let ok = BreakerReply::parse(ScriptName::BreakerProbe, ints(&[1, 3, 7, 0, 2, 10, 1])).unwrap().unwrap();
        assert_eq!(
            (ok.state, ok.generation, ok.grant().unwrap(), ok.changed),
            (State::HalfOpen, 7, Grant::Probe, true)
        );
        let e = BreakerReply::parse(ScriptName::BreakerSync, ints(&[0, 9, 7, 0, 2, 10, 0])).unwrap_err();
        assert_eq!(e.to_string(), "unexpected reply from the breaker_sync script: unknown breaker state 9");
        assert!(BreakerReply::parse(ScriptName::BreakerSync, ints(&[0, 1, 7])).is_err());
        let odd = BreakerReply::parse(ScriptName::BreakerProbe, ints(&[5, 1, 7, 0, 0, 0, 0])).unwrap().unwrap();
        assert!(odd.grant().is_err());
        assert_eq!(BreakerReply::parse(ScriptName::BreakerProbe, word("late")), Ok(None), "past its deadline");
    }

    #[test]
    fn sync_replies_read_text_and_integers_and_refuse_short_ones() {
        let v = Value::Array(vec![
            Value::BulkString(b"2.5".to_vec()),
            Value::Int(1_000_000),
            Value::Int(3),
            Value::Int(4),
            Value::BulkString(b"7".to_vec()),
            Value::Int(1_700_000_000_000_001),
        ]);
        let s = parse_sync(v.clone(), 1).unwrap();
        let want = Shared {
            lease: 2.5,
            window_start: Timestamp::from_secs(1),
            prev: 3,
            cur: 4,
            available: 7.0,
            seq: 1_700_000_000_000_001,
        };
        assert_eq!(s, Answered::Done(vec![want]));
        assert!(parse_sync(v, 2).is_err());
        let bad = Value::Array(vec![Value::Nil; 6]);
        assert!(parse_sync(bad, 1).is_err());
        assert_eq!(parse_sync(word("lost"), 1), Ok(Answered::Lost));
        let reply = Value::Array(vec![
            Value::Int(3),
            Value::Int(1_700_000_000_000_000),
            Value::BulkString(b"abc".to_vec()),
            Value::BulkString(b"id#1\n0123abcd".to_vec()),
            Value::BulkString(b"id#2\n".to_vec()),
        ]);
        let live = Live {
            live: 3,
            now_us: 1_700_000_000_000_000,
            identity: "abc".into(),
            names: vec!["id#1".into(), "id#2".into()],
            digests: vec!["0123abcd".into(), String::new()],
        };
        assert_eq!(parse_live(reply), Ok(live));
        assert!(parse_live(ints(&[3, 1_700_000_000_000_000])).is_err(), "a reply without a run id is refused");
        assert!(parse_live(Value::Int(3)).is_err());
    }
}

/// adaptive.lua's answer to a push.
#[derive(Clone, Debug, PartialEq)]
pub enum AdaptiveReply {
    /// The fleet's window is over and this replica closes it: the state it
    /// starts from (empty: none), at `version`.
    Close { version: u64, state: String, window: floodgate_core::adaptive::Window },
    /// The window goes on: the state in force, and the window it came from.
    Open { version: u64, state: String, last: Option<floodgate_core::adaptive::Window> },
}

/// A window as adaptive.lua keeps the last one: five numbers.
pub fn window_text(w: &floodgate_core::adaptive::Window) -> String {
    format!("{} {} {} {} {}", w.samples, w.rtt_sum_us, w.min_rtt_us, w.max_in_flight, w.drops)
}

fn window_of(parts: &[u64]) -> Option<floodgate_core::adaptive::Window> {
    let &[samples, rtt_sum_us, min_rtt_us, peak, drops] = parts else { return None };
    let max_in_flight = u32::try_from(peak).ok()?;
    Some(floodgate_core::adaptive::Window { samples, rtt_sum_us, min_rtt_us, max_in_flight, drops })
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

pub fn parse_adaptive_push(v: Value) -> Result<AdaptiveReply, ReplyError> {
    let script = ScriptName::Adaptive;
    let Value::Array(items) = v else { return Err(error(script, format!("not an array: {v:?}"))) };
    let texts: Option<Vec<String>> = items.iter().map(text).collect();
    let bad = || error(script, format!("unexpected: {items:?}"));
    let texts = texts.ok_or_else(bad)?;
    let version = texts.get(1).and_then(|v| v.parse::<u64>().ok()).ok_or_else(bad)?;
    let state = texts.get(2).cloned().ok_or_else(bad)?;
    let numbers = |s: &[String]| s.iter().map(|n| n.parse::<u64>().ok()).collect::<Option<Vec<u64>>>();
    match texts.first().map(String::as_str) {
        Some("1") if texts.len() == 8 => {
            let window = numbers(&texts[3..]).as_deref().and_then(window_of).ok_or_else(bad)?;
            Ok(AdaptiveReply::Close { version, state, window })
        }
        Some("0") if texts.len() == 4 => {
            let parts: Vec<String> = texts[3].split(' ').map(str::to_string).collect();
            let last = numbers(&parts).as_deref().and_then(window_of);
            Ok(AdaptiveReply::Open { version, state, last })
        }
        _ => Err(bad()),
    }
}

/// adaptive.lua's answer to a publish: the new version, if it was stored.
pub fn parse_adaptive_publish(v: Value) -> Result<Option<u64>, ReplyError> {
    let script = ScriptName::Adaptive;
    let Value::Array(items) = v else { return Err(error(script, format!("not an array: {v:?}"))) };
    let texts: Option<Vec<String>> = items.iter().map(text).collect();
    match texts.as_deref() {
        Some([stored, version]) => {
            let version = version.parse::<u64>().map_err(|_| error(script, format!("bad version: {items:?}")))?;
            Ok((stored == "1").then_some(version))
        }
        _ => Err(error(script, format!("unexpected: {items:?}"))),
    }
}
