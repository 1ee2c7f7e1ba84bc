//! An xDS control plane written for the tests: tonic serving the Aggregated
//! Discovery Service (state of the world and delta) with
//! `RateLimitConfig` resources, as Envoy Gateway serves them to a rate limit
//! service. It pushes the snapshot it is given to every stream, records what
//! each client answers (ACK or NACK), and can go away and come back on the
//! same port.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// What the control plane serves: a version and the resources by name.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub version: String,
    pub resources: Vec<(String, RateLimitConfig)>,
}

/// What a client sent on a stream, after the first request.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The version it says it holds (SotW), empty for delta.
    pub version: String,
    pub nonce: String,
    /// The NACK's message; `None` for an ACK.
    pub error: Option<String>,
}

/// A stream's first request: node id, version held (SotW), resource
/// versions held (delta).
pub type Hello = (String, String, HashMap<String, String>);

/// What every stream shares.
#[derive(Default)]
struct Shared {
    answers: Mutex<Vec<Answer>>,
    /// First requests: (node id, version held, resource versions held).
    hellos: Mutex<Vec<Hello>>,
}

#[derive(Clone)]
struct Ads {
    snapshot: watch::Receiver<Option<Snapshot>>,
    /// Delta responses written as they are, all at once, to delta streams.
    bursts: watch::Receiver<Vec<DeltaDiscoveryResponse>>,
    shared: Arc<Shared>,
    /// Set when the control plane goes away: every stream ends.
    gone: watch::Receiver<bool>,
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let (mut snapshot, shared, mut gone) = (self.snapshot.clone(), self.shared.clone(), self.gone.clone());
        tokio::spawn(async move {
            let Ok(Some(first)) = requests.message().await else { return };
            let node = first.node.map(|n| n.id).unwrap_or_default();
            shared.hellos.lock().unwrap().push((node, first.version_info, HashMap::new()));
            let mut nonce = 0u64;
            snapshot.mark_changed();
            loop {
                tokio::select! {
                    changed = snapshot.changed() => {
                        if changed.is_err() { return; }
                        let Some(s) = snapshot.borrow_and_update().clone() else { continue };
                        nonce += 1;
                        let resources = s.resources.iter().map(|(_, c)| any(c)).collect();
                        let response = DiscoveryResponse {
                            version_info: s.version.clone(),
                            resources,
                            type_url: TYPE_URL.into(),
                            nonce: nonce.to_string(),
                            ..Default::default()
                        };
                        if tx.send(Ok(response)).await.is_err() { return; }
                    }
                    r = requests.message() => match r {
                        Ok(Some(r)) => shared.answers.lock().unwrap().push(Answer {
                            version: r.version_info,
                            nonce: r.response_nonce,
                            error: r.error_detail.map(|e| e.message),
                        }),
                        _ => return,
                    },
                    _ = async { gone.wait_for(|g| *g).await.is_ok() } => {
                        let _ = tx.send(Err(Status::unavailable("the control plane is going away"))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let (mut snapshot, shared, mut gone) = (self.snapshot.clone(), self.shared.clone(), self.gone.clone());
        let mut bursts = self.bursts.clone();
        bursts.mark_unchanged();
        tokio::spawn(async move {
            let Ok(Some(first)) = requests.message().await else { return };
            let node = first.node.map(|n| n.id).unwrap_or_default();
            // What the client holds: sent again only when it changed.
            let mut sent: HashMap<String, Vec<u8>> = HashMap::new();
            let held = first.initial_resource_versions.clone();
            shared.hellos.lock().unwrap().push((node, String::new(), held));
            let mut nonce = 0u64;
            snapshot.mark_changed();
            loop {
                tokio::select! {
                    changed = snapshot.changed() => {
                        if changed.is_err() { return; }
                        let Some(s) = snapshot.borrow_and_update().clone() else { continue };
                        let now: HashMap<String, Vec<u8>> =
                            s.resources.iter().map(|(n, c)| (n.clone(), c.encode_to_vec())).collect();
                        let resources = s.resources.iter()
                            .filter(|(n, c)| sent.get(n) != Some(&c.encode_to_vec()))
                            .map(|(n, c)| Resource {
                                name: n.clone(),
                                version: s.version.clone(),
                                resource: Some(any(c)),
                                ..Default::default()
                            })
                            .collect();
                        let removed = sent.keys().filter(|n| !now.contains_key(*n)).cloned().collect();
                        sent = now;
                        nonce += 1;
                        let response = DeltaDiscoveryResponse {
                            system_version_info: s.version.clone(),
                            resources,
                            removed_resources: removed,
                            type_url: TYPE_URL.into(),
                            nonce: nonce.to_string(),
                            ..Default::default()
                        };
                        if tx.send(Ok(response)).await.is_err() { return; }
                    }
                    changed = bursts.changed() => {
                        if changed.is_err() { return; }
                        let burst = bursts.borrow_and_update().clone();
                        for response in burst {
                            if tx.send(Ok(response)).await.is_err() { return; }
                        }
                    }
                    r = requests.message() => match r {
                        Ok(Some(r)) => shared.answers.lock().unwrap().push(Answer {
                            version: String::new(),
                            nonce: r.response_nonce,
                            error: r.error_detail.map(|e| e.message),
                        }),
                        _ => return,
                    },
                    _ = async { gone.wait_for(|g| *g).await.is_ok() } => {
                        let _ = tx.send(Err(Status::unavailable("the control plane is going away"))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

fn any(c: &RateLimitConfig) -> Any {
    Any { type_url: TYPE_URL.into(), value: c.encode_to_vec() }
}

/// A running control plane; it goes away when dropped.
pub struct ControlPlane {
    pub addr: SocketAddr,
    snapshot: watch::Sender<Option<Snapshot>>,
    bursts: watch::Sender<Vec<DeltaDiscoveryResponse>>,
    shared: Arc<Shared>,
    gone: watch::Sender<bool>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl ControlPlane {
    /// Serves on a free loopback port, with nothing to push yet.
    pub async fn start() -> ControlPlane {
        Self::start_on("127.0.0.1:0".parse().unwrap(), None).await
    }

    /// Serves on `addr` (where one went away), pushing `snapshot` at once.
    pub async fn start_on(addr: SocketAddr, snapshot: Option<Snapshot>) -> ControlPlane {
        Self::serve(addr, snapshot, None).await
    }

    /// Serves over TLS with `server`'s certificate; with `client_ca`, only
    /// to clients with a certificate it signed (mTLS).
    pub async fn start_tls(server: &super::pki::Pair, client_ca: Option<&str>) -> ControlPlane {
        let mut tls = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&server.cert_pem, &server.key_pem));
        if let Some(ca) = client_ca {
            tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(ca));
        }
        Self::serve("127.0.0.1:0".parse().unwrap(), None, Some(tls)).await
    }

    async fn serve(
        addr: SocketAddr,
        snapshot: Option<Snapshot>,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> ControlPlane {
        let listener = bind(addr).await;
        let addr = listener.local_addr().unwrap();
        let (snapshot_tx, snapshot_rx) = watch::channel(snapshot);
        let (gone_tx, gone_rx) = watch::channel(false);
        let (bursts_tx, bursts_rx) = watch::channel(Vec::new());
        let shared = Arc::new(Shared::default());
        let ads = Ads { snapshot: snapshot_rx, bursts: bursts_rx, shared: shared.clone(), gone: gone_rx.clone() };
        let mut stop = gone_rx;
        let served = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let mut builder = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                builder = builder.tls_config(tls).expect("TLS settings");
            }
            let _ = builder
                .add_service(AggregatedDiscoveryServiceServer::new(ads))
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop.wait_for(|g| *g).await;
                })
                .await;
        });
        ControlPlane { addr, snapshot: snapshot_tx, bursts: bursts_tx, shared, gone: gone_tx, served: Some(served) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Pushes `resources` as `version` to every stream, now and later.
    pub fn push(&self, version: &str, resources: Vec<(String, RateLimitConfig)>) {
        self.snapshot.send_replace(Some(Snapshot { version: version.into(), resources }));
    }

    /// Writes these delta responses, as they are, one after the other at
    /// once, to every delta stream open.
    pub fn burst(&self, responses: Vec<DeltaDiscoveryResponse>) {
        self.bursts.send_replace(responses);
    }

    /// A delta response adding or replacing resources, or (`None`) sending
    /// a heartbeat of one (no content: it stays as held).
    pub fn delta(nonce: &str, resources: Vec<(String, Option<RateLimitConfig>)>) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            resources: resources
                .into_iter()
                .map(|(name, c)| Resource {
                    name,
                    version: nonce.into(),
                    resource: c.as_ref().map(any),
                    ..Default::default()
                })
                .collect(),
            type_url: TYPE_URL.into(),
            nonce: nonce.into(),
            ..Default::default()
        }
    }

    /// Every ACK and NACK received so far.
    pub fn answers(&self) -> Vec<Answer> {
        self.shared.answers.lock().unwrap().clone()
    }

    /// Every stream's first request: (node id, version held, resource versions held).
    pub fn hellos(&self) -> Vec<Hello> {
        self.shared.hellos.lock().unwrap().clone()
    }

    /// Waits until an answer satisfies `f`; returns it.
    pub async fn answer_where(&self, what: &str, f: impl Fn(&Answer) -> bool) -> Answer {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(a) = self.answers().into_iter().find(|a| f(a)) {
                return a;
            }
            assert!(Instant::now() < deadline, "no answer {what}: {:?}", self.answers());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends every stream and stops listening; returns where it was.
    pub async fn go_away(mut self) -> SocketAddr {
        let _ = self.gone.send(true);
        if let Some(served) = self.served.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), served).await;
        }
        self.addr
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.gone.send(true);
    }
}

/// Binds `addr`, retrying while the port is still held by the one before.
async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("binding {addr}: {e}"),
        }
    }
}
