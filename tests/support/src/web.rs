//! The tests' one HTTP client, on hyper-util's legacy client: GET, POST or
//! any method, with headers and a body, over HTTP/1.1 or h2c; the answer's
//! status, headers and body, or its body as a stream.
//!
//! Every request goes out on a new connection, closed once the answer is
//! read (no pool): a server the test restarted or killed is never reached
//! through an old connection. Requests run on a runtime of this module's
//! own, so the blocking [`Request::send`] works in a plain `#[test]` and
//! inside a `#[tokio::test]` alike (it blocks that thread, as a socket read
//! would); async code may `.await` [`Request::send_async`] instead.

use std::sync::LazyLock;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How long a request may take, connecting and reading its whole answer
/// included, unless [`Request::timeout`] says otherwise.
pub const TIMEOUT: Duration = Duration::from_secs(30);

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("test-http")
        .enable_all()
        .build()
        .expect("the HTTP client's runtime")
});

type HyperClient = Client<HttpConnector, Full<Bytes>>;

/// One client per (h2c, sets Host) pair, built on first use.
fn client(h2c: bool, set_host: bool) -> HyperClient {
    static CLIENTS: LazyLock<[HyperClient; 4]> = LazyLock::new(|| {
        let build = |h2c: bool, set_host: bool| {
            let _guard = RUNTIME.enter();
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .http2_only(h2c)
                .set_host(set_host)
                .build(connector)
        };
        [build(false, false), build(false, true), build(true, false), build(true, true)]
    });
    CLIENTS[usize::from(h2c) * 2 + usize::from(set_host)].clone()
}

/// A request to build: [`get`], [`post`] or [`Request::new`], then headers
/// and a body, then [`send`](Request::send).
#[derive(Clone, Debug)]
#[must_use = "a request does nothing until sent"]
pub struct Request {
    method: http::Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    h2c: bool,
    set_host: bool,
    timeout: Duration,
}

/// A GET of `url` (`http://host:port/path`, or `host:port/path`).
pub fn get(url: impl AsRef<str>) -> Request {
    Request::new("GET", url)
}

/// A POST of `body` to `url`.
pub fn post(url: impl AsRef<str>, body: impl Into<Vec<u8>>) -> Request {
    Request::new("POST", url).body(body)
}

/// `http://{addr}{path}`: the URL of `path` on a loopback `addr` (host:port).
pub fn url(addr: &str, path: &str) -> String {
    format!("http://{addr}{path}")
}

impl Request {
    /// A request of `method` (GET, POST, DELETE...) to `url`.
    pub fn new(method: &str, url: impl AsRef<str>) -> Request {
        let url = url.as_ref();
        let url = if url.contains("://") { url.to_string() } else { format!("http://{url}") };
        Request {
            method: method.parse().unwrap_or_else(|e| panic!("method {method:?}: {e}")),
            url,
            headers: Vec::new(),
            body: Vec::new(),
            h2c: false,
            set_host: true,
            timeout: TIMEOUT,
        }
    }

    /// Adds a header line; the same name twice sends it twice, in order.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Adds each of `headers`.
    pub fn headers(self, headers: &[(&str, &str)]) -> Request {
        headers.iter().fold(self, |r, (name, value)| r.header(name, value))
    }

    /// `Authorization: Bearer <token>`, when there is a token.
    pub fn bearer(self, token: Option<&str>) -> Request {
        match token {
            Some(token) => self.header("authorization", &format!("Bearer {token}")),
            None => self,
        }
    }

    /// The request's body (`Content-Length` is its length).
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// Sends no `Host` header unless one was added: what a client that
    /// names no host sends (HTTP/1.1 only).
    pub fn without_host(mut self) -> Request {
        self.set_host = false;
        self
    }

    /// Speaks HTTP/2 without TLS (prior knowledge), as gRPC does.
    pub fn h2c(mut self) -> Request {
        self.h2c = true;
        self
    }

    /// How long the whole exchange may take ([`TIMEOUT`] by default).
    pub fn timeout(mut self, limit: Duration) -> Request {
        self.timeout = limit;
        self
    }

    fn build(&self) -> http::Request<Full<Bytes>> {
        let mut req = http::Request::builder().method(self.method.clone()).uri(&self.url);
        if self.h2c {
            req = req.version(http::Version::HTTP_2);
        }
        for (name, value) in &self.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        req.body(Full::new(Bytes::from(self.body.clone())))
            .unwrap_or_else(|e| panic!("{} {}: {e}", self.method, self.url))
    }

    /// The answer's head, its body left to read.
    async fn head(&self) -> Result<http::Response<Incoming>, String> {
        let what = format!("{} {}", self.method, self.url);
        let req = self.build();
        let client = client(self.h2c, self.set_host);
        let answer = tokio::time::timeout(self.timeout, client.request(req))
            .await
            .map_err(|_| format!("{what}: no answer within {:?}", self.timeout))?;
        answer.map_err(|e| {
            let mut text = format!("{what}: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text += &format!(": {s}");
                source = s.source();
            }
            text
        })
    }

    async fn exchange(self) -> Result<Response, String> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let answer = self.head().await?;
        let (parts, body) = answer.into_parts();
        let body = tokio::time::timeout_at(deadline, body.collect())
            .await
            .map_err(|_| format!("{} {}: body not read within {:?}", self.method, self.url, self.timeout))?
            .map_err(|e| format!("{} {}: reading the body: {e}", self.method, self.url))?
            .to_bytes();
        Ok(Response::new(parts, body.to_vec()))
    }

    /// Sends it and reads the whole answer; `Err` (saying why) when the
    /// server could not be reached or did not answer in time.
    pub fn try_send(self) -> Result<Response, String> {
        block_on(self.exchange())
    }

    /// Sends it and reads the whole answer; panics when there is none.
    pub fn send(self) -> Response {
        self.try_send().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`send`](Request::send), for async code.
    pub async fn send_async(self) -> Response {
        let handle = RUNTIME.spawn(self.exchange());
        handle.await.expect("the request's task").unwrap_or_else(|e| panic!("{e}"))
    }

    /// Sends it and returns once the answer's head is in; its body is read
    /// as it comes, by [`Stream`], until the stream is dropped (which
    /// closes the connection).
    pub fn open(self) -> Stream {
        let (head_tx, head_rx) = mpsc::channel();
        let (chunks_tx, chunks) = mpsc::channel();
        let task = RUNTIME.spawn(async move {
            let answer = match self.head().await {
                Ok(answer) => answer,
                Err(e) => {
                    let _ = head_tx.send(Err(e));
                    return;
                }
            };
            let (parts, mut body) = answer.into_parts();
            let _ = head_tx.send(Ok(parts));
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { break };
                if let Ok(data) = frame.into_data()
                    && chunks_tx.send(data.to_vec()).is_err()
                {
                    break;
                }
            }
            // The sender drops here: the body ended (or broke).
        });
        let parts = head_rx.recv().expect("the stream's task").unwrap_or_else(|e| panic!("{e}"));
        let head = Response::new(parts, Vec::new());
        Stream { status: head.status, headers: head.headers, chunks, task }
    }
}

/// Runs `fut` on the client's runtime and waits for it on this thread.
fn block_on<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    RUNTIME.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().expect("the HTTP client's task")
}

/// A whole answer: status, headers (names lower-cased, in order) and body.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    fn new(parts: http::response::Parts, body: Vec<u8>) -> Response {
        let headers = parts
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        Response { status: parts.status.as_u16(), headers, body }
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The head as text, one `name: value` line per header (lower-case
    /// names), for assertions and messages.
    pub fn head(&self) -> String {
        self.headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect()
    }

    /// The body as text (UTF-8; panics otherwise).
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap_or_else(|e| panic!("a body that is not UTF-8: {e}"))
    }

    /// The body as JSON (panics, quoting it, otherwise).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// An answer whose body is still coming ([`Request::open`]); dropping it
/// closes the connection.
pub struct Stream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunks: mpsc::Receiver<Vec<u8>>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The body's next piece: `Ok(None)` once the server ended it, `Err`
    /// when nothing came within `limit`.
    pub fn next(&self, limit: Duration) -> Result<Option<Vec<u8>>, mpsc::RecvTimeoutError> {
        match self.chunks.recv_timeout(limit) {
            Ok(chunk) => Ok(Some(chunk)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads until the server ends the body: how long that took, or `None`
    /// if it was still open after `limit`.
    pub fn ends_within(self, limit: Duration) -> Option<Duration> {
        let start = std::time::Instant::now();
        loop {
            let left = limit.checked_sub(start.elapsed())?;
            match self.chunks.recv_timeout(left) {
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Some(start.elapsed()),
                Err(mpsc::RecvTimeoutError::Timeout) => return None,
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Dropping the body tells hyper to close the connection.
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on a free loopback port answering every request, HTTP/1.1
    /// or h2c, with its version, method, headers and body.
    fn echo() -> String {
        let listener = RUNTIME.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        RUNTIME.spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|req: http::Request<Incoming>| async move {
                        let head = format!(
                            "{:?} {} {:?}",
                            req.version(),
                            req.method(),
                            req.headers().get_all("x-twice").iter().collect::<Vec<_>>()
                        );
                        let host = req.headers().get("host").map(|h| h.to_str().unwrap().to_string());
                        let body = req.into_body().collect().await?.to_bytes();
                        let text = format!("{head} host={host:?} body={}", String::from_utf8_lossy(&body));
                        Ok::<_, hyper::Error>(
                            http::Response::builder().header("x-echo", "1").body(Full::new(Bytes::from(text))).unwrap(),
                        )
                    });
                    let io = hyper_util::rt::TokioIo::new(tcp);
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        addr
    }

    #[test]
    fn http1_and_h2c_with_headers_bodies_and_no_host() {
        let addr = echo();
        let answer = post(url(&addr, "/x"), "hello").header("x-twice", "a").header("x-twice", "b").send();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("X-Echo"), Some("1"));
        let text = answer.text();
        assert!(text.starts_with(r#"HTTP/1.1 POST ["a", "b"]"#), "{text}");
        assert!(text.ends_with(&format!(r#"host=Some("{addr}") body=hello"#)), "{text}");
        let text = get(url(&addr, "/")).without_host().send().text();
        assert!(text.contains("host=None"), "{text}");
        let text = get(url(&addr, "/")).h2c().send().text();
        assert!(text.starts_with("HTTP/2.0 GET"), "{text}");
        let text = RUNTIME.block_on(async { tokio::spawn(get(url(&addr, "/")).send_async()).await.unwrap().text() });
        assert!(text.starts_with("HTTP/1.1 GET"), "{text}");
    }

    #[test]
    fn a_stream_is_read_as_it_comes_and_a_dead_port_is_an_error() {
        let addr = echo();
        let stream = get(url(&addr, "/")).open();
        assert_eq!(stream.status, 200);
        assert!(stream.ends_within(Duration::from_secs(5)).is_some());
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert!(get(url(&free.to_string(), "/")).try_send().is_err());
    }
}
