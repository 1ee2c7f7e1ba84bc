//! A local cache of OPEN breakers fed by Watch: while a resource's breaker is
//! open, its denials are answered here until its next probe time, without a
//! round trip.

use std::collections::HashMap;
use std::sync::{RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use floodgate_proto::v1 as pb;
use pb::watch_event::Event;

use crate::client::Inner;

#[derive(Default)]
pub(crate) struct OpenBreakers {
    /// Resource -> until when it stays open (`None`: forced open, until told).
    map: RwLock<HashMap<String, Option<Instant>>>,
}

impl OpenBreakers {
    /// `Some(retry_after)` while the resource's breaker is known to be open.
    pub(crate) fn denies(&self, resource: &str) -> Option<Duration> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        match map.get(resource)? {
            None => Some(Duration::ZERO),
            Some(until) => until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()),
        }
    }

    fn set(&self, resource: &str, state: pb::BreakerState, next_probe_at: Option<&prost_types::Timestamp>) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        match state {
            pb::BreakerState::Open => {
                let until = next_probe_at.map(|t| {
                    let at = SystemTime::UNIX_EPOCH + Duration::new(t.seconds.max(0) as u64, t.nanos.max(0) as u32);
                    Instant::now() + at.duration_since(SystemTime::now()).unwrap_or_default()
                });
                map.insert(resource.to_string(), Some(until.unwrap_or_else(Instant::now)));
            }
            pb::BreakerState::ForcedOpen => {
                map.insert(resource.to_string(), None);
            }
            _ => {
                map.remove(resource);
            }
        }
    }

    fn clear(&self) {
        self.map.write().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn apply(&self, event: Event) {
        match event {
            Event::Snapshot(s) => {
                self.clear();
                for b in s.breakers {
                    self.set(&b.resource, b.state(), b.next_probe_at.as_ref());
                }
            }
            Event::Breaker(t) => self.set(&t.resource, t.to(), t.next_probe_at.as_ref()),
            Event::Degradation(_) | Event::Rules(_) => {}
        }
    }
}

/// Follows Watch on the first endpoint that answers, reconnecting with backoff,
/// until the client is dropped. While disconnected the cache is empty.
pub(crate) async fn follow(client: Weak<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(inner) = client.upgrade() else { return };
        let mut grpc = inner.endpoints[0].grpc.clone();
        drop(inner);
        if let Ok(response) = grpc.watch(pb::WatchRequest::default()).await {
            backoff = Duration::from_millis(100);
            let mut stream = response.into_inner();
            while let Ok(Some(e)) = stream.message().await {
                let Some(inner) = client.upgrade() else { return };
                if let Some(event) = e.event {
                    inner.open.apply(event);
                }
            }
        }
        let Some(inner) = client.upgrade() else { return };
        inner.open.clear();
        drop(inner);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
