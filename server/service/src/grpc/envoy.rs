//! Envoy's rate limit service v3 (`ShouldRateLimit`), wire-compatible with
//! Envoy, Istio and any RLS client: proto in, `Decider`, proto out.
//!
//! The service glue is ours: the call is served as plain unary gRPC (see
//! [`unary`](super::unary)) and the messages are read and written in place
//! (see [`wire`](super::convert::envoy::wire)); a message that cannot be
//! decoded is INVALID_ARGUMENT, as on every other service.

use crate::grpc::status::IntoStatus;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::NamedService;

use super::convert::envoy::{RlsReply, RlsWire, metadata};
use crate::decider::{Decider, RlsRequest};

/// The full name of the service, as Envoy calls it.
pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The RLS service as a tower service, ready for tonic's router.
#[derive(Clone)]
pub struct EnvoyRls {
    decider: Arc<Decider>,
}

impl EnvoyRls {
    pub fn new(decider: Arc<Decider>) -> Self {
        EnvoyRls { decider }
    }
}

impl NamedService for EnvoyRls {
    const NAME: &'static str = SERVICE;
}

/// One `ShouldRateLimit` call, its message read in place.
async fn should_rate_limit(decider: Arc<Decider>, message: bytes::Bytes) -> Result<RlsReply, Status> {
    let refused = |e: crate::engine::RequestError| {
        metrics::counter!(crate::metrics::upstream::SHOULD_RATE_LIMIT_ERROR, "err_type" => "service_error")
            .increment(1);
        e.into_status()
    };
    let wire = RlsWire(message);
    let read = wire.read().map_err(super::unary::undecodable)?;
    let ask = RlsRequest::try_from(&read).map_err(refused)?;
    if let Some(why) = decider.rls_waiting(ask.domain) {
        return Err(Status::unavailable(why));
    }
    let answer = decider.should_rate_limit(&ask).await.map_err(refused)?;
    // The echo of the request: decoded again, only when asked for.
    let metadata = match decider.rls_options().dynamic_metadata {
        true => wire.decode().ok().map(|asked| metadata::answer(&asked, &answer.metadata)),
        false => None,
    };
    Ok(RlsReply { answer, metadata })
}

impl tower::Service<http::Request<Body>> for EnvoyRls {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async { Ok(Status::from(super::status::Refusal::NoSuchMethod).into_http()) });
        }
        let decider = self.decider.clone();
        Box::pin(
            async move { Ok(super::unary::serve(req, decodes, |message| should_rate_limit(decider, message)).await) },
        )
    }
}

/// A request message after the first: tonic decodes it, and so do we.
fn decodes(bytes: &[u8]) -> Result<(), prost::DecodeError> {
    <envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest as prost::Message>::decode(bytes).map(drop)
}
