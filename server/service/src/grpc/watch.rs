//! Watch: a snapshot first, then every event in order. Each stream reads the
//! broadcast through its own task and a small bounded channel: a subscriber
//! that stops reading fills its channel, its task falls behind the broadcast,
//! loses events, and on waking sends a fresh snapshot (`resync`). Publishers
//! never wait for anyone.

use crate::grpc::convert::{FromDomain, IntoWire};
use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;

use floodgate_proto::v1 as pb;
use pb::watch_event::Event as Kind;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::convert;
use crate::decider::Decider;
use crate::events::Event;

pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

/// Events buffered per subscriber before it counts as slow.
const BUFFER: usize = 64;

/// The stream for one subscriber; `slot` (its place under the cap on Watch
/// streams) is held until the stream ends.
pub fn stream(decider: Arc<Decider>, resources: Vec<String>, slot: OwnedSemaphorePermit) -> EventStream {
    let (tx, rx) = mpsc::channel(BUFFER);
    let mut events = decider.views().subscribe();
    let only: HashSet<String> = resources.into_iter().collect();
    let drained = decider.drained();
    tokio::spawn(async move {
        tokio::pin!(drained);
        let _slot = Open::new(slot);
        let mut seq = 0u64;
        let mut send = |kind: Kind| {
            seq += 1;
            let event = pb::WatchEvent {
                sequence: seq,
                at: Some(convert::timestamp(std::time::SystemTime::now())),
                event: Some(kind),
            };
            let tx = tx.clone();
            async move { tx.send(Ok(event)).await.is_ok() }
        };
        if !send(snapshot(&decider, &only, false)).await {
            return;
        }
        loop {
            let received = tokio::select! {
                received = events.recv() => received,
                // The subscriber went away: end now, not at the next event.
                () = tx.closed() => return,
                // The server is draining: the stream ends (OK) so that the
                // subscriber reconnects to another replica.
                () = &mut drained => return,
            };
            let kind = match received {
                Ok(event) if wanted(&event, &only) => match Option::<Kind>::from_domain(&*event) {
                    Some(kind) => kind,
                    None => continue,
                },
                Ok(_) => continue,
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "a Watch subscriber fell behind: sending a fresh snapshot");
                    snapshot(&decider, &only, true)
                }
                Err(RecvError::Closed) => return,
            };
            if !send(kind).await {
                return;
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

/// A stream's slot under the cap, counted in `floodgate_watch_streams`.
struct Open {
    _slot: OwnedSemaphorePermit,
    gauge: metrics::Gauge,
}

impl Open {
    fn new(slot: OwnedSemaphorePermit) -> Self {
        let gauge = metrics::gauge!(crate::metrics::WATCH_STREAMS);
        gauge.increment(1.0);
        Open { _slot: slot, gauge }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

fn snapshot(decider: &Decider, only: &HashSet<String>, resync: bool) -> Kind {
    let mut s = decider.views().snapshot();
    s.breakers.retain(|(r, _)| only.is_empty() || only.contains(r));
    Kind::Snapshot(pb::Snapshot { resync, ..s.into_wire() })
}

/// Breaker transitions only for the resources asked for; everything else always.
fn wanted(event: &Event, only: &HashSet<String>) -> bool {
    match event {
        Event::Breaker { resource, .. } => only.is_empty() || only.contains(resource),
        Event::Degradation(_) | Event::Rules { .. } | Event::Overrides { .. } => true,
        // The Watch API has no message for it: the console and the logs say it.
        Event::RulesRefused { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_stream::StreamExt;

    use super::*;
    use crate::engine::{Engine, EngineConfig};
    use crate::time::SystemClock;

    fn engine() -> (Arc<Engine>, Arc<Decider>) {
        let e = Engine::new(EngineConfig { max_keys: 1000 }, Arc::new(SystemClock::new()));
        let rules = crate::rules::RuleSet::from_yaml("resources: []", "t").unwrap();
        e.control().install(rules, String::new(), "test".into());
        let e = Arc::new(e);
        (e.clone(), Arc::new(Decider::new(e, None)))
    }

    fn slot() -> OwnedSemaphorePermit {
        Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().unwrap()
    }

    fn rules_event(version: u64) -> Event {
        Event::Rules { version, source: "test".into(), patterns: Vec::new().into() }
    }

    #[tokio::test]
    async fn a_snapshot_first_then_events_in_order() {
        let (engine, decider) = engine();
        let mut stream = stream(decider, Vec::new(), slot());
        let first = stream.next().await.unwrap().unwrap();
        assert!(matches!(first.event, Some(Kind::Snapshot(pb::Snapshot { resync: false, rules_version: 1, .. }))));
        for v in 2..=4 {
            engine.events().publish(rules_event(v));
        }
        for (seq, v) in (2..=4).zip(2..=4) {
            let e = stream.next().await.unwrap().unwrap();
            assert_eq!(e.sequence, seq);
            assert!(matches!(e.event, Some(Kind::Rules(pb::RulesReloaded { version, .. })) if version == v));
        }
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_gets_a_fresh_snapshot() {
        let (engine, decider) = engine();
        let mut stream = stream(decider, Vec::new(), slot());
        stream.next().await.unwrap().unwrap();
        // Nobody reads: the forwarding task fills its buffer and the broadcast
        // runs past it. Publishing never waits.
        let total = crate::decider::EVENTS_KEPT as u64 * 3;
        for v in 0..total {
            engine.events().publish(rules_event(v));
            if v % 256 == 0 {
                tokio::task::yield_now().await;
            }
        }
        let mut resync = None;
        let mut seq = 1;
        while let Ok(Some(e)) = tokio::time::timeout(std::time::Duration::from_millis(500), stream.next()).await {
            let e = e.unwrap();
            seq += 1;
            assert_eq!(e.sequence, seq, "sequence numbers stay consecutive");
            if let Some(Kind::Snapshot(s)) = e.event {
                assert!(s.resync);
                resync = Some(seq);
            }
        }
        assert!(resync.is_some(), "no resync snapshot in {seq} events");
        assert!(seq < total, "events were dropped rather than buffered without bound");
    }
}
