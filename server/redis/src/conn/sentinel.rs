//! Following the master that Redis Sentinel names.
//!
//! The Sentinels are asked, a few times a second, which node is the master
//! of the watched name (`SENTINEL get-master-addr-by-name`). When the answer
//! changes (a failover promoted a replica), every later call goes to the new
//! master. A promoted replica is another Redis process with its own run id,
//! so the markers every script checks no longer match, and each replica
//! writes back what it knows before a strict limit decides on the new
//! master (see `markers.rs`). That is what keeps a failover to a replica
//! that had not received the last writes from admitting those units again.

use std::sync::Weak;
use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;

use super::{Conn, Credentials};

/// How often the Sentinels are asked for the master. A failover takes
/// Sentinel seconds (`down-after-milliseconds`, then an election); a quarter
/// of a second more to notice it is small beside that, and one small command
/// four times a second costs a Sentinel nothing.
const POLL: Duration = Duration::from_millis(250);

/// A client for one Sentinel. Sentinels keep a password of their own, apart
/// from the master's; a user, if any, is named in the URL (a user name is not
/// a secret). TLS to the Sentinels (`rediss://`) trusts the same CA as TLS to
/// the master.
pub(super) fn client(url: &str, credentials: &Credentials) -> anyhow::Result<redis::Client> {
    let sentinel = Credentials {
        user: None,
        password: credentials.sentinel_password.clone(),
        ca: credentials.ca.clone(),
        sentinel_password: None,
    };
    super::client(url, &sentinel)
}

/// The URL of the master at `host:port`, with the Sentinel's scheme: a
/// deployment whose Sentinels speak TLS has a master that speaks it too.
fn master_url(sentinel: &str, host: &str, port: u16) -> String {
    let scheme = if sentinel.starts_with("rediss://") { "rediss" } else { "redis" };
    if host.contains(':') { format!("{scheme}://[{host}]:{port}") } else { format!("{scheme}://{host}:{port}") }
}

/// The background task that keeps a [`Conn`] pointed at the master.
pub(super) struct Follow {
    pub conn: Weak<Conn>,
    pub sentinels: Vec<String>,
    pub master: String,
    pub credentials: Credentials,
    pub timeout: Duration,
}

impl Follow {
    pub async fn run(self) {
        let mut connections: Vec<Option<MultiplexedConnection>> = vec![None; self.sentinels.len()];
        // The Sentinel that answered last is asked first.
        let mut first = 0;
        let mut current: Option<String> = None;
        let mut complained = false;
        loop {
            let Some(conn) = self.conn.upgrade() else { return };
            let mut answer = None;
            let mut why = Vec::new();
            for step in 0..self.sentinels.len() {
                let i = (first + step) % self.sentinels.len();
                match self.ask(i, &mut connections[i]).await {
                    Ok(Some(address)) => {
                        first = i;
                        answer = Some(address);
                        break;
                    }
                    Ok(None) => {
                        why.push(format!("{}: does not know a master named {:?}", self.sentinels[i], self.master))
                    }
                    Err(e) => {
                        connections[i] = None;
                        // A Sentinel without `requirepass` refuses any
                        // password; one with it refuses a wrong one.
                        let hint = if e.to_string().contains("uthentication") {
                            if self.credentials.sentinel_password.is_some() {
                                " (the Sentinel refused --redis-sentinel-password-file's password: is it the one in requirepass, and does the Sentinel have one?)"
                            } else {
                                " (the Sentinel asks for a password: give --redis-sentinel-password-file)"
                            }
                        } else {
                            ""
                        };
                        why.push(format!("{}: {e}{hint}", super::redact(&self.sentinels[i])));
                    }
                }
            }
            match answer {
                Some(url) if current.as_ref() != Some(&url) => {
                    match super::single(&url, &self.credentials, self.timeout, conn.longest) {
                        Ok(handle) => {
                            match &current {
                                None => {
                                    tracing::info!(master = %self.master, node = %url, "Redis Sentinel names the master")
                                }
                                Some(old) => tracing::warn!(
                                    master = %self.master, from = %old, to = %url,
                                    "Redis Sentinel names a new master (a failover); following it"
                                ),
                            }
                            conn.point_at(url.clone(), handle);
                            current = Some(url);
                            complained = false;
                        }
                        Err(e) => {
                            tracing::warn!(node = %url, error = %e, "the master Redis Sentinel names cannot be used")
                        }
                    }
                }
                Some(_) => complained = false,
                None if !complained => {
                    // Said once until a Sentinel answers again: the loop asks
                    // four times a second.
                    tracing::warn!(master = %self.master, errors = ?why, "no Redis Sentinel names the master; retrying");
                    complained = true;
                }
                None => {}
            }
            drop(conn);
            tokio::time::sleep(POLL).await;
        }
    }

    /// Asks Sentinel `i` for the master's URL: `None` when it does not know
    /// the name.
    async fn ask(&self, i: usize, slot: &mut Option<MultiplexedConnection>) -> anyhow::Result<Option<String>> {
        let url = &self.sentinels[i];
        if slot.is_none() {
            let client = client(url, &self.credentials)?;
            let connection = tokio::time::timeout(self.timeout * 4, client.get_multiplexed_async_connection())
                .await
                .map_err(|_| anyhow::anyhow!("no connection within {:?}", self.timeout * 4))??;
            *slot = Some(connection);
        }
        let Some(connection) = slot.as_mut() else { unreachable!("the connection was made above") };
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(&self.master);
        let reply: Value = tokio::time::timeout(self.timeout * 4, cmd.query_async(connection))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {:?}", self.timeout * 4))??;
        match reply {
            Value::Nil => Ok(None),
            Value::Array(parts) if parts.len() == 2 => {
                let host: String = redis::from_redis_value(parts[0].clone())?;
                let port: String = redis::from_redis_value(parts[1].clone())?;
                let port: u16 =
                    port.parse().map_err(|_| anyhow::anyhow!("the master's port {port:?} is not a port"))?;
                Ok(Some(master_url(url, &host, port)))
            }
            other => anyhow::bail!("an answer that is not an address: {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::master_url;
    use crate::conn::{Target, redact};

    #[test]
    fn urls_are_checked_and_passwords_never_shown() {
        assert_eq!(redact("redis://user:secret@h:6379/0"), "redis://user:***@h:6379/0");
        assert_eq!(redact("redis://user@h:6379"), "redis://user@h:6379");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        let sentinel = |u: &str| Target::Sentinel { sentinels: vec![u.to_string()], master: "m".into() };
        let err = sentinel("redis://u:secret@127.0.0.1:26379").check().unwrap_err().to_string();
        assert!(err.contains("--redis-sentinel-password-file") && !err.contains("secret"), "{err}");
        let err = sentinel("redis://127.0.0.1:26379/3").check().unwrap_err().to_string();
        assert!(err.contains("a Sentinel has no databases"), "{err}");
        let err = Target::Standalone("http://u:secret@h".into()).check().unwrap_err().to_string();
        assert!(err.starts_with("--redis http://u:***@h: not a redis://"), "{err}");
        assert!(sentinel("redis://127.0.0.1:26379").check().is_ok());
        let shown = sentinel("redis://u:secret@h:1").to_string();
        assert_eq!(shown, "master \"m\" through Sentinels redis://u:***@h:1");
    }

    #[test]
    fn the_master_speaks_tls_when_the_sentinels_do() {
        assert_eq!(master_url("redis://10.0.0.1:26379", "10.0.0.2", 6379), "redis://10.0.0.2:6379");
        assert_eq!(master_url("rediss://s.example:26379", "m.example", 6380), "rediss://m.example:6380");
        assert_eq!(master_url("redis://[::1]:26379", "::1", 6379), "redis://[::1]:6379");
    }
}
