//! The data plane as served: `Acquire`, the call every service makes before
//! every call it protects, served as plain unary gRPC (see
//! [`unary`](crate::grpc::unary)) and read in place (see
//! [`convert::acquire`](crate::grpc::convert::acquire)); every other method
//! through the generated server.

use crate::grpc::convert::FromWire;
use crate::grpc::status::OrStatus;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use floodgate_proto::v1 as pb;
use pb::floodgate_server::FloodgateServer;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::NamedService;

use super::DataPlane;
use crate::decider::Decider;
use crate::engine;
use crate::engine::request::Overlaid;
use crate::grpc::convert::acquire::AcquireWire;
use crate::listen::Peer;

const ACQUIRE: &str = "/floodgate.v1.Floodgate/Acquire";

/// `floodgate.v1.Floodgate`, ready for tonic's router.
#[derive(Clone)]
pub struct DataPlaneService {
    generated: FloodgateServer<DataPlane>,
    decider: Arc<Decider>,
}

impl DataPlaneService {
    pub fn new(decider: Arc<Decider>, max_watchers: usize, max_decoding: usize) -> Self {
        let generated =
            FloodgateServer::new(DataPlane::new(decider.clone(), max_watchers)).max_decoding_message_size(max_decoding);
        DataPlaneService { generated, decider }
    }
}

impl NamedService for DataPlaneService {
    const NAME: &'static str = <FloodgateServer<DataPlane> as NamedService>::NAME;
}

/// One `Acquire`, its message read in place.
/// `peer`: who called, when its mTLS identity may set a descriptor.
async fn acquire(decider: Arc<Decider>, message: bytes::Bytes, peer: Option<Peer>) -> Result<Answered, Status> {
    let undecodable = crate::grpc::unary::undecodable;
    let wire = AcquireWire(message);
    let set = decider.origin_of(peer.as_ref());
    let response: pb::AcquireResponse = match wire.read().map_err(undecodable)? {
        Some(r) => {
            let overlaid = Overlaid { inner: r.descriptors.as_slice(), set };
            let req = engine::Request {
                resource: r.resource,
                descriptors: &overlaid,
                cost: r.cost,
                dry_run: r.dry_run,
                settle: r.settle,
                priority: crate::grpc::convert::floodgate::priority(r.priority).or_status()?,
                usage: None,
            };
            decider.acquire(&req).await.or_status()?
        }
        // More distinct descriptors than a decision takes (prost's reading
        // says how many), or usage reported: read by prost.
        None => {
            let r = wire.decode().map_err(undecodable)?;
            let overlaid = Overlaid { inner: &r.descriptors, set };
            decider.acquire(&engine::Request::from_wire(&r).or_status()?.with(&overlaid)).await.or_status()?
        }
    };
    crate::traces::record_verdict(response.verdict().as_str_name());
    Ok(Answered(response))
}

/// An answer, written by prost.
struct Answered(pb::AcquireResponse);

impl crate::grpc::unary::Reply for Answered {
    fn write(&self, buf: &mut bytes::BytesMut) {
        use prost::Message;
        // A BytesMut grows as needed: encoding cannot run out of room.
        let _ = self.0.encode(buf);
    }

    fn size_hint(&self) -> usize {
        prost::Message::encoded_len(&self.0)
    }
}

impl tower::Service<http::Request<Body>> for DataPlaneService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != ACQUIRE {
            return self.generated.call(req);
        }
        let decider = self.decider.clone();
        // The peer only matters with an origin key (Sentinel's rules).
        let peer = decider.origin_key().and_then(|_| req.extensions().get::<Peer>().cloned());
        Box::pin(
            async move { Ok(crate::grpc::unary::serve(req, decodes, |message| acquire(decider, message, peer)).await) },
        )
    }
}

/// A request message after the first: tonic decodes it, and so do we.
fn decodes(bytes: &[u8]) -> Result<(), prost::DecodeError> {
    <pb::AcquireRequest as prost::Message>::decode(bytes).map(drop)
}

#[cfg(test)]
mod tests;
