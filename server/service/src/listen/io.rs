//! One accepted connection: TCP or TLS, with the peer it came from, its slot
//! under the connection cap, and an idle timeout.
//!
//! The idle timeout is enforced here by the reads: a connection with neither
//! a read nor a write for `idle` fails its next pending read, which ends it
//! (a dead or silent peer). HTTP/2 keepalive pings count as reads here; a
//! connection that only answers pings is closed by the drain's
//! [`Activity`](super::drain::Activity) instead, once it has had no call open
//! for `idle`.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

/// Who is on the other end: inserted into every request's extensions.
#[derive(Clone, Debug, Default)]
pub struct Peer {
    pub addr: Option<SocketAddr>,
    /// The client's certificate chain, when it presented one over mTLS.
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    /// The client certificate's first name (its subject CN, else its first
    /// DNS, URI or email name), read once at the handshake.
    pub identity: Option<Arc<str>>,
}

impl Peer {
    pub(crate) fn is_loopback(&self) -> bool {
        self.addr.is_some_and(|a| a.ip().is_loopback())
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection's place under its port's cap, counted in
/// `floodgate_connections` while it is held.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    open: metrics::Gauge,
}

impl Slot {
    pub fn new(permit: OwnedSemaphorePermit, open: metrics::Gauge) -> Self {
        open.increment(1.0);
        Slot { _permit: permit, open }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.decrement(1.0);
    }
}

pub struct ServerIo {
    stream: Stream,
    peer: Peer,
    idle_for: Duration,
    last_active: Instant,
    idle: Pin<Box<Sleep>>,
    /// Its place under the connection cap, given back when the connection ends.
    _slot: Slot,
}

impl ServerIo {
    pub(super) fn plain(tcp: TcpStream, peer: Peer, idle_for: Duration, slot: Slot) -> Self {
        Self::new(Stream::Plain(tcp), peer, idle_for, slot)
    }

    pub(super) fn tls(
        tls: tokio_rustls::server::TlsStream<TcpStream>,
        peer: Peer,
        idle_for: Duration,
        slot: Slot,
    ) -> Self {
        Self::new(Stream::Tls(Box::new(tls)), peer, idle_for, slot)
    }

    fn new(stream: Stream, peer: Peer, idle_for: Duration, slot: Slot) -> Self {
        let now = Instant::now();
        ServerIo {
            stream,
            peer,
            idle_for,
            last_active: now,
            idle: Box::pin(tokio::time::sleep_until(now + idle_for)),
            _slot: slot,
        }
    }

    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// Whether the connection has been idle too long; re-arms the timer otherwise.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.idle.as_mut().poll(cx).is_pending() {
                return false;
            }
            let deadline = self.last_active + self.idle_for;
            if deadline <= Instant::now() {
                return true;
            }
            self.idle.as_mut().reset(deadline);
        }
    }
}

impl AsyncRead for ServerIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        };
        match polled {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.last_active = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending if this.idle_expired(cx) => {
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "connection idle too long")))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for ServerIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, data),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, data),
        };
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.last_active = Instant::now();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        };
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.last_active = Instant::now();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

impl tonic::transport::server::Connected for ServerIo {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

/// A certificate's names: its subject CN, then its DNS, URI and email SANs.
pub fn certificate_names(der: &rustls::pki_types::CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der.as_ref()) else { return Vec::new() };
    let mut names: Vec<String> =
        cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_string).collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(n) | GeneralName::URI(n) | GeneralName::RFC822Name(n) => names.push(n.to_string()),
                _ => {}
            }
        }
    }
    names
}
