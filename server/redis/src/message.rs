//! Every message replicas send one another over Redis pub/sub, encoded and
//! decoded here and nowhere else. A message is one line of text (load
//! reports: several lines) starting with a one-letter kind:
//!
//! | kind | message | meaning |
//! |---|---|---|
//! | `r` | [`Message::RulesChanged`] | rules were applied through Admin: read them from Redis |
//! | `o` | [`Message::OverridesChanged`] | overrides set at run time changed: read them |
//! | `v` | [`Message::LevelsChanged`] | an operator set a degradation level: read them |
//! | `b <resource>` | [`Message::BreakerChanged`] | a shared breaker changed: read its state |
//! | `l <tag>` + lines | [`Message::Loads`] | load reports taken by the replica `tag` |
//! | `q ...` | [`Message::Report`] | a report of a permit the receiving replica issued |
//! | `a ...` | [`Message::ReportAnswer`] | the issuer's answer to such a report |
//!
//! A message that does not decode (a kind this version does not know, sent
//! by a newer replica, or a malformed one) is refused with the reason; the
//! listener logs it and counts it, and never acts on it.

use std::fmt::Write;
use std::time::Duration;

use floodgate_core::breaker::{Outcome, State};
use floodgate_core::time::Timestamp;
use floodgate_engine::degradation::Load;
use floodgate_engine::report::Reported;
use floodgate_engine::request::{ErrorKind, RequestError, check_permit_id};

/// One message between replicas.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    RulesChanged,
    OverridesChanged,
    LevelsChanged,
    BreakerChanged {
        resource: String,
    },
    /// Load reports another replica took, to be taken as if reported here.
    Loads {
        from: u32,
        reports: Vec<LoadReport>,
    },
    /// A report of a permit the receiving replica issued, passed on by the
    /// replica `from` (which waits for the answer under `request`).
    Report(Forwarded),
    /// The answer to the report passed on under `request`.
    ReportAnswer {
        request: u64,
        answer: ForwardAnswer,
    },
}

/// One instance's load, as a replica took it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadReport {
    pub system: String,
    pub instance: String,
    pub load: Load,
    pub taken_at: Timestamp,
}

/// A report another replica passed on, for a permit this one issued.
#[derive(Clone, Debug, PartialEq)]
pub struct Forwarded {
    pub(crate) from: u32,
    pub(crate) request: u64,
    pub resource: String,
    pub permit_id: String,
    pub outcome: Outcome,
    pub latency: Option<Duration>,
    pub actual_cost: Option<u64>,
    /// Usage reported, by field (names as a rule's usage fields are
    /// written, so that they travel between spaces and commas).
    pub usage: Option<floodgate_engine::request::Usage>,
}

/// What the issuer answered to a report passed on to it.
pub type ForwardAnswer = Result<Reported, RequestError>;

/// Why a message could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("unknown kind {0:?}")]
    UnknownKind(String),
    #[error("malformed {kind} message")]
    Malformed { kind: &'static str },
}

// === impl Message ===

impl Message {
    /// The message as it travels.
    pub fn encode(&self) -> String {
        match self {
            Message::RulesChanged => "r".to_string(),
            Message::OverridesChanged => "o".to_string(),
            Message::LevelsChanged => "v".to_string(),
            Message::BreakerChanged { resource } => format!("b {resource}"),
            Message::Loads { from, reports } => {
                // A line per report: system, instance, cpu, memory, in
                // flight, queueing delay (us) and when it was taken (ns),
                // tab-separated (names hold no control characters).
                let mut text = format!("l {from:08x}");
                for r in reports {
                    let in_flight = r.load.in_flight.map_or("-".to_string(), |n| n.to_string());
                    let queue = r.load.queue_delay.map_or("-".to_string(), |d| d.as_micros().to_string());
                    let (system, instance, at) = (&r.system, &r.instance, r.taken_at.as_nanos());
                    let (cpu, memory) = (r.load.cpu, r.load.memory);
                    let _ = write!(text, "\n{system}\t{instance}\t{cpu}\t{memory}\t{in_flight}\t{queue}\t{at}");
                }
                text
            }
            // Space-separated, the resource last (it may hold spaces).
            Message::Report(f) => {
                let outcome = match f.outcome {
                    Outcome::Success => 1,
                    Outcome::Failure => 2,
                    Outcome::Ignored => 3,
                };
                let latency = f.latency.map_or("-".to_string(), |l| l.as_micros().to_string());
                let mut cost = f.actual_cost.map_or("-".to_string(), |c| c.to_string());
                // Usage rides in the cost's word: `-;input_tokens:12,output_tokens:40`.
                if let Some(u) = &f.usage {
                    let pairs: Vec<String> = u.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                    let _ = write!(cost, ";{}", pairs.join(","));
                }
                let (from, request, id, resource) = (f.from, f.request, &f.permit_id, &f.resource);
                format!("q {from:08x} {request} {id} {outcome} {latency} {cost} {resource}")
            }
            Message::ReportAnswer { request, answer } => match answer {
                Ok(r) => format!(
                    "a {request} {} {} {}",
                    u8::from(r.counted),
                    u8::from(r.settled),
                    r.breaker_state.map_or("-".to_string(), |s| s.number().to_string())
                ),
                Err(RequestError::PermitResourceMismatch { .. }) => format!("a {request} m"),
                // Bad input the issuer found (usage its rule does not name):
                // its message, for the caller, last on the line.
                Err(e) if e.kind() == ErrorKind::BadInput => {
                    format!("a {request} e {}", e.to_string().replace(['\n', '\r'], " "))
                }
                Err(_) => format!("a {request} 0 0 -"),
            },
        }
    }

    /// Reads a message as it travelled.
    pub fn decode(text: &str) -> Result<Message, Unreadable> {
        let (kind, rest) = text.split_once([' ', '\n']).unwrap_or((text, ""));
        let malformed = |kind| Unreadable::Malformed { kind };
        match kind {
            "r" if rest.is_empty() => Ok(Message::RulesChanged),
            "o" if rest.is_empty() => Ok(Message::OverridesChanged),
            "v" if rest.is_empty() => Ok(Message::LevelsChanged),
            "r" | "o" | "v" => Err(malformed("change")),
            "b" if !rest.is_empty() => Ok(Message::BreakerChanged { resource: rest.to_string() }),
            "b" => Err(malformed("breaker")),
            "l" => loads(rest).ok_or(malformed("loads")),
            "q" => forwarded(rest).map(Message::Report).ok_or(malformed("report")),
            "a" => answer(rest)
                .map(|(request, answer)| Message::ReportAnswer { request, answer })
                .ok_or(malformed("answer")),
            other => Err(Unreadable::UnknownKind(other.chars().take(16).collect())),
        }
    }
}

fn loads(rest: &str) -> Option<Message> {
    let mut lines = rest.lines();
    let from = u32::from_str_radix(lines.next()?, 16).ok()?;
    // A line that does not read is skipped: the others still count.
    let reports = lines.filter_map(load).collect();
    Some(Message::Loads { from, reports })
}

fn load(line: &str) -> Option<LoadReport> {
    let mut f = line.split('\t');
    let (system, instance) = (f.next()?.to_string(), f.next()?.to_string());
    let cpu = f.next()?.parse().ok()?;
    let memory = f.next()?.parse().ok()?;
    let in_flight = match f.next()? {
        "-" => None,
        n => Some(n.parse().ok()?),
    };
    let queue_delay = match f.next()? {
        "-" => None,
        n => Some(Duration::from_micros(n.parse().ok()?)),
    };
    let taken_at = Timestamp::from_nanos(f.next()?.parse().ok()?);
    Some(LoadReport { system, instance, load: Load { cpu, memory, in_flight, queue_delay }, taken_at })
}

fn forwarded(rest: &str) -> Option<Forwarded> {
    let mut parts = rest.splitn(7, ' ');
    let from = u32::from_str_radix(parts.next()?, 16).ok()?;
    let request = parts.next()?.parse().ok()?;
    let permit_id = parts.next()?.to_string();
    check_permit_id(&permit_id).ok()?;
    let outcome = match parts.next()? {
        "1" => Outcome::Success,
        "2" => Outcome::Failure,
        "3" => Outcome::Ignored,
        _ => return None,
    };
    let latency = match parts.next()? {
        "-" => None,
        us => Some(Duration::from_micros(us.parse().ok()?)),
    };
    let word = parts.next()?;
    let (cost, usage) = match word.split_once(';') {
        Some((cost, pairs)) => {
            let mut read = floodgate_engine::request::Usage::new();
            for pair in pairs.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once(':')?;
                read.insert(k.to_string(), v.parse().ok()?);
            }
            (cost, Some(read))
        }
        None => (word, None),
    };
    let actual_cost = match cost {
        "-" => None,
        c => Some(c.parse().ok()?),
    };
    let resource = parts.next().unwrap_or_default().to_string();
    Some(Forwarded { from, request, resource, permit_id, outcome, latency, actual_cost, usage })
}

fn answer(rest: &str) -> Option<(u64, ForwardAnswer)> {
    let mut parts = rest.split(' ');
    let request = parts.next()?.parse().ok()?;
    let counted = parts.next()?;
    if counted == "m" {
        return Some((request, Err(RequestError::PermitResourceMismatch { resource: String::new() })));
    }
    if counted == "e" {
        let message = rest.splitn(3, ' ').nth(2).unwrap_or_default().to_string();
        return Some((request, Err(RequestError::Issuer(message))));
    }
    let settled = parts.next()? == "1";
    let breaker_state = parts.next()?.parse().ok().and_then(State::from_number);
    Some((request, Ok(Reported { counted: counted == "1", breaker_state, settled })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_engine::guards::PermitId;

    fn round_trip(m: Message) {
        let text = m.encode();
        assert_eq!(Message::decode(&text), Ok(m), "{text:?}");
    }

    #[test]
    fn every_message_reads_back_as_sent() {
        round_trip(Message::RulesChanged);
        round_trip(Message::OverridesChanged);
        round_trip(Message::LevelsChanged);
        round_trip(Message::BreakerChanged { resource: "GET /a b".into() });
        let load = Load { cpu: 0.5, memory: 0.25, in_flight: Some(3), queue_delay: Some(Duration::from_micros(1500)) };
        let report = |system: &str| LoadReport {
            system: system.into(),
            instance: "i-1".into(),
            load,
            taken_at: Timestamp::from_nanos(7),
        };
        round_trip(Message::Loads { from: 0xc0ffee, reports: vec![report("db"), report("")] });
        let id = PermitId::random().to_string();
        let f = Forwarded {
            from: 0xc0ffee,
            request: 7,
            resource: "a resource with spaces".into(),
            permit_id: id,
            outcome: Outcome::Failure,
            latency: Some(Duration::from_micros(1500)),
            actual_cost: None,
            usage: None,
        };
        round_trip(Message::Report(f.clone()));
        let usage = [("input_tokens".to_string(), 12), ("output_tokens".to_string(), 4_000_000_000)];
        round_trip(Message::Report(Forwarded { usage: Some(usage.into_iter().collect()), ..f.clone() }));
        round_trip(Message::Report(Forwarded { usage: Some(Default::default()), ..f.clone() }));
        round_trip(Message::Report(Forwarded { resource: "a;b:1 c".into(), ..f }));
        let counted = Ok(Reported { counted: true, breaker_state: Some(State::Open), settled: false });
        round_trip(Message::ReportAnswer { request: 9, answer: counted });
        round_trip(Message::ReportAnswer {
            request: 9,
            answer: Ok(Reported { counted: false, breaker_state: None, settled: true }),
        });
        let refused =
            RequestError::Issuer("usage: 'x y' is not a usage field of rule 'chat' (its usage fields: a)".into());
        round_trip(Message::ReportAnswer { request: 9, answer: Err(refused) });
    }

    #[test]
    fn an_issuer_refusing_another_resource_reads_back_as_a_mismatch() {
        let refused = Err(RequestError::PermitResourceMismatch { resource: "x".into() });
        let text = Message::ReportAnswer { request: 3, answer: refused }.encode();
        assert_eq!(text, "a 3 m");
        let read = Message::decode(&text);
        assert!(matches!(
            read,
            Ok(Message::ReportAnswer { request: 3, answer: Err(RequestError::PermitResourceMismatch { .. }) })
        ));
    }

    #[test]
    fn what_does_not_read_is_refused_with_its_reason() {
        assert_eq!(Message::decode("z"), Err(Unreadable::UnknownKind("z".into())));
        assert_eq!(Message::decode("x something"), Err(Unreadable::UnknownKind("x".into())));
        assert_eq!(Message::decode("r extra"), Err(Unreadable::Malformed { kind: "change" }));
        assert_eq!(Message::decode("b"), Err(Unreadable::Malformed { kind: "breaker" }));
        assert_eq!(Message::decode("a x 1 1 -"), Err(Unreadable::Malformed { kind: "answer" }));
        let id = PermitId::random().to_string();
        assert_eq!(
            Message::decode(&format!("q 00c0ffee 7 {id} 4 - - r")),
            Err(Unreadable::Malformed { kind: "report" })
        );
        assert_eq!(Message::decode("q 00c0ffee 7 not-an-id 1 - - r"), Err(Unreadable::Malformed { kind: "report" }));
        assert_eq!(Message::decode(""), Err(Unreadable::UnknownKind(String::new())));
    }

    #[test]
    fn a_load_line_reads_back_as_written() {
        let r = load("payments\tpod 7 (east)\t0.5\t0.25\t12\t1500\t1700000000123456789").unwrap();
        let (s, i, at) = (r.system.as_str(), r.instance.as_str(), r.taken_at);
        assert_eq!((s, i, at), ("payments", "pod 7 (east)", Timestamp::from_nanos(1_700_000_000_123_456_789)));
        assert_eq!(
            r.load,
            Load { cpu: 0.5, memory: 0.25, in_flight: Some(12), queue_delay: Some(Duration::from_micros(1500)) }
        );
        let l = load("p\ti\t1\t0\t-\t-\t5").unwrap().load;
        assert_eq!((l.in_flight, l.queue_delay), (None, None));
        assert!(load("p\ti\tx\t0\t-\t-\t5").is_none());
        assert!(load("p\ti\t1\t0\t-\t-").is_none(), "no time");
        assert!(load("p\ti\t1").is_none());
    }
}
