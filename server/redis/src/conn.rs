//! One handle for standalone Redis, Redis behind Sentinels, or Redis
//! Cluster, every call bounded by `--redis-timeout` and timed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod sentinel;

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
    /// A master found through Redis Sentinel: the Sentinels' URLs and the
    /// name of the master they watch. The connection follows the master
    /// the Sentinels name, through every failover.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

impl Target {
    /// Checks every URL before anything is connected or logged: a URL that
    /// does not parse, or that holds a password (it would show in `ps`, in
    /// shell history and in logs), is refused naming its flag; a Sentinel
    /// URL may not name a database (Sentinels have none).
    pub fn check(&self) -> anyhow::Result<()> {
        match self {
            Target::Standalone(url) => check_url(url, "--redis", "--redis-password-file or FLOODGATE_REDIS_PASSWORD"),
            Target::Cluster(nodes) => nodes
                .iter()
                .try_for_each(|u| check_url(u, "--redis-cluster", "--redis-password-file or FLOODGATE_REDIS_PASSWORD")),
            Target::Sentinel { sentinels, .. } => sentinels.iter().try_for_each(|u| {
                check_url(
                    u,
                    "--redis-sentinel",
                    "--redis-sentinel-password-file or FLOODGATE_REDIS_SENTINEL_PASSWORD",
                )?;
                use redis::IntoConnectionInfo;
                let db = u.as_str().into_connection_info().map(|i| i.redis_settings().db()).unwrap_or(0);
                anyhow::ensure!(
                    db == 0,
                    "--redis-sentinel {}: a Sentinel has no databases; leave the path (/{db}) out",
                    redact(u)
                );
                Ok(())
            }),
        }
    }
}

fn check_url(url: &str, flag: &str, password_flags: &str) -> anyhow::Result<()> {
    use redis::IntoConnectionInfo;
    let info = url
        .into_connection_info()
        .map_err(|e| anyhow::anyhow!("{flag} {}: not a redis:// or rediss:// URL ({e})", redact(url)))?;
    anyhow::ensure!(
        info.redis_settings().password().is_none(),
        "{flag}: a password in the URL is refused: use {password_flags}"
    );
    Ok(())
}

/// A URL with any password in it replaced by `***`, for messages and logs.
pub fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else { return url.to_string() };
    let Some(at) = url[start..].find('@').map(|i| start + i) else { return url.to_string() };
    match url[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..start + colon], &url[at..]),
        None => url.to_string(),
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |urls: &[String]| urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        match self {
            Target::Standalone(url) => write!(f, "{}", redact(url)),
            Target::Cluster(nodes) => write!(f, "cluster {}", list(nodes)),
            Target::Sentinel { sentinels, master } => {
                write!(f, "master {master:?} through Sentinels {}", list(sentinels))
            }
        }
    }
}

/// How to log in to Redis: an ACL user and password (read from a file or the
/// environment, never from a URL on the command line), and for `rediss://`
/// the CA to trust when it is not in the system's store.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub user: Option<String>,
    pub password: Option<String>,
    pub ca: Option<Vec<u8>>,
    /// The password of the Sentinels, when they ask for one (Sentinels keep
    /// their own, apart from the master's).
    pub sentinel_password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field("sentinel_password", &self.sentinel_password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// A URL's connection info with the credentials added; a password in the
/// URL itself is refused (it would show in `ps` and shell history).
fn connection_info(url: &str, credentials: &Credentials) -> anyhow::Result<redis::ConnectionInfo> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info()?;
    anyhow::ensure!(
        info.redis_settings().password().is_none(),
        "a password in the Redis URL is refused: use --redis-password-file or FLOODGATE_REDIS_PASSWORD"
    );
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &credentials.user {
        settings = settings.set_username(user);
    }
    if let Some(password) = &credentials.password {
        settings = settings.set_password(password);
    }
    Ok(info.set_redis_settings(settings))
}

/// A client for one node, with the credentials and TLS trust.
pub fn client(url: &str, credentials: &Credentials) -> anyhow::Result<redis::Client> {
    let info = connection_info(url, credentials)?;
    Ok(match &credentials.ca {
        Some(ca) => redis::Client::build_with_tls(info, tls_certificates(ca))?,
        None => redis::Client::open(info)?,
    })
}

/// A connection to one node that reconnects by itself when it drops.
fn single(url: &str, credentials: &Credentials, timeout: Duration, longest: Duration) -> anyhow::Result<Handle> {
    let client = client(url, credentials)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(longest))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(2));
    Ok(Handle::Single(ConnectionManager::new_lazy_with_config(client, config)?))
}

fn tls_certificates(ca: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates { client_tls: None, root_cert: Some(ca.to_vec()) }
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

/// The longest a call waits while Redis is slow but alive, in timeouts.
const SLOW_WAITS: u32 = 20;

pub struct Conn {
    handle: ArcSwapOption<Handle>,
    /// The URL of the node that pub/sub listens on: the standalone Redis,
    /// the first seed of a cluster, or the master the Sentinels name now.
    node: ArcSwapOption<String>,
    /// The longest wait for one answer: `--redis-timeout` times [`SLOW_WAITS`].
    longest: Duration,
    /// When Redis last answered anything, in microseconds since `base`.
    last_answer: AtomicU64,
    base: Instant,
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
    pub fn open(target: &Target, credentials: &Credentials, timeout: Duration) -> anyhow::Result<Arc<Conn>> {
        let conn = Arc::new(Conn {
            handle: ArcSwapOption::empty(),
            node: ArcSwapOption::empty(),
            longest: timeout * SLOW_WAITS,
            last_answer: AtomicU64::new(0),
            base: Instant::now(),
        });
        // The connection's own response timeout is the longest wait;
        // `call_within` decides sooner whether Redis is dead or only slow.
        let longest = conn.longest;
        match target {
            Target::Standalone(url) => {
                conn.handle.store(Some(Arc::new(single(url, credentials, timeout, longest)?)));
                conn.node.store(Some(Arc::new(url.clone())));
            }
            Target::Sentinel { sentinels, master } => {
                // Every URL is checked now, so that a mistake stops the
                // server at start rather than in the background.
                for url in sentinels {
                    sentinel::client(url, credentials)?;
                }
                let follow = sentinel::Follow {
                    conn: Arc::downgrade(&conn),
                    sentinels: sentinels.clone(),
                    master: master.clone(),
                    credentials: credentials.clone(),
                    timeout,
                };
                tokio::spawn(follow.run());
            }
            Target::Cluster(nodes) => {
                conn.node.store(nodes.first().map(|n| Arc::new(n.clone())));
                let infos = nodes.iter().map(|n| connection_info(n, credentials)).collect::<Result<Vec<_>, _>>()?;
                let mut builder =
                    redis::cluster::ClusterClient::builder(infos).connection_timeout(timeout).response_timeout(longest);
                if let Some(user) = &credentials.user {
                    builder = builder.username(user);
                }
                if let Some(password) = &credentials.password {
                    builder = builder.password(password);
                }
                if let Some(ca) = &credentials.ca {
                    builder = builder.certs(tls_certificates(ca));
                }
                let client = builder.build()?;
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

    /// Runs one exchange with Redis, bounded by `timeout` (`--redis-timeout`
    /// for decisions; longer for an operator's change).
    ///
    /// A slow Redis is not a dead one: when no answer came within the
    /// timeout but Redis answered other calls meanwhile, the call goes on
    /// waiting, a timeout at a time, up to twenty. Only a timeout in which
    /// Redis answered nothing at all (it is dead, stopped or unreachable)
    /// ends the call. The connection itself never waits longer than
    /// [`Conn::longest`].
    pub async fn call_within<T, F, Fut>(&self, what: &'static str, timeout: Duration, f: F) -> Result<T, CallError>
    where
        F: FnOnce(Handle) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let handle = self.handle.load_full().ok_or(CallError::NotConnected)?;
        let start = Instant::now();
        let mut call = std::pin::pin!(f((*handle).clone()));
        let mut waits = 0;
        let result = loop {
            let step = self.now_us();
            match tokio::time::timeout(timeout, &mut call).await {
                Ok(r) => break r.map_err(CallError::Redis),
                Err(_) => {
                    waits += 1;
                    let answered_meanwhile = self.last_answer.load(Ordering::Acquire) > step;
                    if !answered_meanwhile || waits >= SLOW_WAITS {
                        break Err(CallError::Timeout(start.elapsed()));
                    }
                }
            }
        };
        if result.is_ok() {
            self.last_answer.fetch_max(self.now_us(), Ordering::AcqRel);
        }
        metrics::histogram!(floodgate_engine::metrics::REDIS_RTT, "op" => what).record(start.elapsed().as_secs_f64());
        result
    }

    /// The longest any call may wait for its answer.
    pub fn longest(&self) -> Duration {
        self.longest
    }

    /// The URL of the node to subscribe to for pub/sub, once it is known.
    pub fn pubsub_node(&self) -> Option<String> {
        self.node.load_full().map(|n| (*n).clone())
    }

    /// Points every later call at another node (the master the Sentinels
    /// name after a failover). Calls already sent finish on the old one.
    fn point_at(&self, url: String, handle: Handle) {
        self.handle.store(Some(Arc::new(handle)));
        self.node.store(Some(Arc::new(url)));
    }

    fn now_us(&self) -> u64 {
        self.base.elapsed().as_micros() as u64
    }
}

/// A resource's hash tag: everything of one resource lands in one slot.
/// `}` would end the tag early, so it is escaped.
pub fn tag(resource: &str) -> String {
    resource.replace('%', "%25").replace('}', "%7D")
}
