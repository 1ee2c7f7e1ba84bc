//! Both ports' listeners: the connection cap, the handshake deadline (a TLS
//! handshake, or the first byte of a plaintext connection), TLS and mTLS, and
//! the idle timeout. Every accepted connection is handed on through a channel,
//! so a slow handshake never holds up the accept loop.
//!
//! A client that opens connections and sends nothing costs one slot for at
//! most the handshake timeout; one that stops talking, its slot for at most the
//! idle timeout; beyond the cap, new connections are closed at once (counted in
//! `floodgate_connections_rejected_total`), and the server keeps serving the
//! ones it has.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

pub mod drain;
mod io;
mod tls;

pub use io::{Peer, ServerIo, Slot, certificate_names};
pub use tls::{Tls, TlsFiles};

/// Bounds on one port's connections; every one is a flag with a safe default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once on the port.
    pub max_connections: usize,
    /// From accept to a finished TLS handshake (or a plaintext first byte).
    pub handshake_timeout: Duration,
    /// A connection with no traffic this long is closed.
    pub idle_timeout: Duration,
    /// HTTP/1: the request head must arrive within this.
    pub header_read_timeout: Duration,
    /// HTTP/2: streams at once per connection (gRPC calls in flight).
    pub max_concurrent_streams: u32,
    /// gRPC: calls in flight at once on the whole port (each holds its
    /// stream's state and headers); more are RESOURCE_EXHAUSTED.
    pub max_streams: usize,
    /// HTTP/2 keepalive pings: how often, and how long to wait for the answer.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// gRPC: bytes of unfinished request messages held at once, for the
    /// whole port and per connection (see `grpc::size`).
    pub unfinished_bytes: usize,
    pub unfinished_bytes_per_connection: usize,
    /// gRPC: a call's request (all but a client stream's) must arrive whole
    /// within this of its headers, or the call ends and frees its stream.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            header_read_timeout: Duration::from_secs(10),
            max_concurrent_streams: 1024,
            max_streams: 20_000,
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            unfinished_bytes: 256 << 20,
            unfinished_bytes_per_connection: 16 << 20,
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// One port: its listener, TLS if any, and its limits.
pub struct Port {
    pub name: &'static str,
    pub listener: TcpListener,
    pub tls: Option<Arc<Tls>>,
    pub limits: Limits,
}

/// Accepts connections until the receiver is dropped; every one that finishes
/// its handshake in time comes out of the channel.
pub fn accept(port: Port) -> mpsc::Receiver<std::io::Result<ServerIo>> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(accept_loop(port, tx));
    rx
}

/// The next connection `accept` handed over, or `None` once `stop` has
/// completed or the port is closed.
pub(crate) async fn next_until(
    incoming: &mut mpsc::Receiver<std::io::Result<ServerIo>>,
    mut stop: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Option<ServerIo> {
    loop {
        tokio::select! {
            io = incoming.recv() => match io {
                Some(Ok(io)) => return Some(io),
                Some(Err(_)) => continue,
                None => return None,
            },
            () = &mut stop => return None,
        }
    }
}

async fn accept_loop(port: Port, tx: mpsc::Sender<std::io::Result<ServerIo>>) {
    let slots = Arc::new(Semaphore::new(port.limits.max_connections.max(1)));
    let open = metrics::gauge!(crate::metrics::CONNECTIONS, "port" => port.name);
    let mut rejected = 0u64;
    loop {
        let (tcp, addr) = tokio::select! {
            accepted = port.listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    tracing::warn!(port = port.name, error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = tx.closed() => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            rejected += 1;
            if rejected.is_power_of_two() {
                tracing::warn!(
                    port = port.name,
                    max = port.limits.max_connections,
                    "connection cap reached: refusing new connections"
                );
            }
            metrics::counter!(crate::metrics::CONNECTIONS_REJECTED, "port" => port.name).increment(1);
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let slot = Slot::new(slot, open.clone());
        let (tls, limits, tx) = (port.tls.clone(), port.limits, tx.clone());
        tokio::spawn(async move {
            let peer = Peer { addr: Some(addr), certs: None, identity: None };
            match tokio::time::timeout(limits.handshake_timeout, handshake(tcp, peer, tls, limits, slot)).await {
                Ok(Ok(io)) => {
                    let _ = tx.send(Ok(io)).await;
                }
                Ok(Err(e)) => tracing::debug!(%addr, error = %e, "handshake failed"),
                Err(_) => tracing::debug!(%addr, "no handshake within the timeout: closed"),
            }
        });
    }
}

async fn handshake(
    tcp: TcpStream,
    mut peer: Peer,
    tls: Option<Arc<Tls>>,
    limits: Limits,
    slot: Slot,
) -> std::io::Result<ServerIo> {
    match tls {
        Some(tls) => {
            let stream = tls.acceptor().accept(tcp).await?;
            let certs =
                stream.get_ref().1.peer_certificates().map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
            peer.certs = certs.map(Arc::new);
            // A certificate with no name is known by its fingerprint: a
            // verified caller never picks its own identity (its origin).
            peer.identity = peer.certs.as_ref().and_then(|c| c.first()).map(|leaf| {
                let name = certificate_names(leaf).into_iter().next().unwrap_or_else(|| fingerprint(leaf));
                Arc::from(name)
            });
            Ok(ServerIo::tls(stream, peer, limits.idle_timeout, slot))
        }
        None => {
            // A connection that never sends a byte never reaches the server.
            // (peek, not readable(): readiness may be reported before any data.)
            let mut first = [0u8; 1];
            if tcp.peek(&mut first).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            Ok(ServerIo::plain(tcp, peer, limits.idle_timeout, slot))
        }
    }
}

/// `sha256:` and the hex SHA-256 of a certificate's DER.
fn fingerprint(der: &rustls::pki_types::CertificateDer<'_>) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
