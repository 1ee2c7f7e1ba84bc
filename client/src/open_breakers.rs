//! A local cache of OPEN breakers fed by Watch: while a resource's breaker is
//! open, its denials are answered here until its next probe time, without a
//! round trip.

use std::collections::HashMap;
use std::sync::{RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use pb::watch_event::Event;
use tonic::transport::Channel;

/// The longest the cache answers for an open breaker on one event.
const MAX_OPEN: Duration = Duration::from_secs(3600);

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
                // Whatever the server sends (a time far in the future, nanos
                // out of range), the cache never holds a breaker open longer
                // than MAX_OPEN without hearing from it again.
                let until = next_probe_at.and_then(|t| {
                    let since_epoch = Duration::new(t.seconds.max(0) as u64, t.nanos.clamp(0, 999_999_999) as u32);
                    let at = SystemTime::UNIX_EPOCH.checked_add(since_epoch)?;
                    let left = at.duration_since(SystemTime::now()).unwrap_or_default().min(MAX_OPEN);
                    Instant::now().checked_add(left)
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

/// Follows Watch on the first endpoint that answers (in the order given),
/// reconnecting with backoff, until the cache is dropped (with its client).
/// While disconnected the cache is empty.
pub(crate) async fn follow(cache: Weak<OpenBreakers>, endpoints: Vec<FloodgateClient<Channel>>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        for grpc in &endpoints {
            let Ok(response) = grpc.clone().watch(pb::WatchRequest::default()).await else { continue };
            backoff = Duration::from_millis(100);
            let mut stream = response.into_inner();
            while let Ok(Some(e)) = stream.message().await {
                let Some(cache) = cache.upgrade() else { return };
                if let Some(event) = e.event {
                    cache.apply(event);
                }
            }
            let Some(cache) = cache.upgrade() else { return };
            cache.clear();
        }
        if cache.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_next_probe_time_far_in_the_future_is_capped_not_a_panic() {
        let cache = OpenBreakers::default();
        let far = prost_types::Timestamp { seconds: i64::MAX, nanos: i32::MAX };
        cache.set("r", pb::BreakerState::Open, Some(&far));
        let left = cache.denies("r").expect("open");
        assert!(left <= MAX_OPEN && left > MAX_OPEN - Duration::from_secs(5), "{left:?}");
        cache.set("r", pb::BreakerState::Closed, None);
        assert_eq!(cache.denies("r"), None);
    }
}
