//! Last good values by key, for guarded calls that fall back to them.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Mutex;

/// A remembered value and the tick it was last stored or read at.
type Remembered = (u64, Box<dyn Any + Send + Sync>);

/// Last good values by key, for [`Fallback::LastGood`](crate::Fallback::LastGood); bounded.
pub(crate) struct LastGood {
    capacity: usize,
    map: Mutex<HashMap<String, Remembered>>,
    tick: std::sync::atomic::AtomicU64,
}

// === impl LastGood ===

impl LastGood {
    pub(crate) fn new(capacity: usize) -> Self {
        LastGood { capacity, map: Mutex::new(HashMap::new()), tick: Default::default() }
    }

    pub(crate) fn put<T: Clone + Send + Sync + 'static>(&self, key: String, value: &T) {
        let tick = self.tick.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(key, (tick, Box::new(value.clone())));
        if map.len() > self.capacity {
            let mut ticks: Vec<(u64, String)> = map.iter().map(|(k, (t, _))| (*t, k.clone())).collect();
            ticks.sort_unstable();
            for (_, k) in ticks.into_iter().take((self.capacity / 10).max(1)) {
                map.remove(&k);
            }
        }
    }

    pub(crate) fn get<T: Clone + 'static>(&self, key: &str) -> Option<T> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).and_then(|(_, v)| v.downcast_ref::<T>()).cloned()
    }
}
