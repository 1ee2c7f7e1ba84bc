//! One handle for standalone Redis or Redis Cluster, every call bounded by
//! `--redis-timeout` and timed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Standalone(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

#[derive(Clone)]
pub enum Handle {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Why a call did not come back with an answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("not connected to Redis yet")]
    NotConnected,
    #[error("no answer from Redis within {0:?}")]
    Timeout(Duration),
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
}

pub struct Conn {
    handle: ArcSwapOption<Handle>,
    timeout: Duration,
}

impl ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Handle::Single(c) => c.req_packed_command(cmd),
            Handle::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        p: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Handle::Single(c) => c.req_packed_commands(p, offset, count),
            Handle::Cluster(c) => c.req_packed_commands(p, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Handle::Single(c) => c.get_db(),
            Handle::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Connects in the background: the server starts whether or not Redis is
    /// there, and the connection is made (and remade) when it is.
    pub fn open(target: &Target, timeout: Duration) -> anyhow::Result<Arc<Conn>> {
        let conn = Arc::new(Conn { handle: ArcSwapOption::empty(), timeout });
        match target {
            Target::Standalone(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_secs(2));
                let manager = ConnectionManager::new_lazy_with_config(client, config)?;
                conn.handle.store(Some(Arc::new(Handle::Single(manager))));
            }
            Target::Cluster(nodes) => {
                let client = redis::cluster::ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .build()?;
                let weak = Arc::downgrade(&conn);
                tokio::spawn(async move {
                    let mut backoff = Duration::from_millis(100);
                    loop {
                        match client.get_async_connection().await {
                            Ok(c) => {
                                if let Some(conn) = weak.upgrade() {
                                    conn.handle.store(Some(Arc::new(Handle::Cluster(c))));
                                }
                                return;
                            }
                            Err(e) => tracing::warn!(error = %e, "connecting to the Redis Cluster; retrying"),
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                });
            }
        }
        Ok(conn)
    }

    /// Runs one exchange with Redis, bounded by the timeout.
    pub async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, CallError>
    where
        F: FnOnce(Handle) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let handle = self.handle.load_full().ok_or(CallError::NotConnected)?;
        let start = Instant::now();
        let result = tokio::time::timeout(self.timeout, f((*handle).clone())).await;
        metrics::histogram!(crate::metrics::REDIS_RTT, "op" => what).record(start.elapsed().as_secs_f64());
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(CallError::Redis(e)),
            Err(_) => Err(CallError::Timeout(self.timeout)),
        }
    }
}

/// A resource's hash tag: everything of one resource lands in one slot.
/// `}` would end the tag early, so it is escaped.
pub fn tag(resource: &str) -> String {
    resource.replace('%', "%25").replace('}', "%7D")
}
