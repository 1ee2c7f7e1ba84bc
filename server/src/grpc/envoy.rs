//! Envoy's rate limit service v3 (`ShouldRateLimit`), wire-compatible with
//! Envoy, Istio and any RLS client: proto in, `Decider`, proto out.
//!
//! The messages are the `envoy-types` crate's; the service glue is ours, so
//! that it decodes with Floodgate's codec (a message that cannot be decoded
//! is INVALID_ARGUMENT, as on every other service) and answers in the
//! connection's task, like the generated services.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use floodgate_proto::codec::Codec;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, StdError};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use super::convert::envoy::{RlsAsk, response};
use crate::decider::Decider;

/// The full name of the service, as Envoy calls it.
pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The RLS service as a tower service, ready for tonic's router.
#[derive(Clone)]
pub struct EnvoyRls {
    decider: Arc<Decider>,
    max_decoding: usize,
}

impl EnvoyRls {
    pub fn new(decider: Arc<Decider>, max_decoding: usize) -> Self {
        EnvoyRls { decider, max_decoding }
    }
}

impl NamedService for EnvoyRls {
    const NAME: &'static str = SERVICE;
}

/// One `ShouldRateLimit` call.
struct ShouldRateLimit(Arc<Decider>);

impl UnaryService<rls::RateLimitRequest> for ShouldRateLimit {
    type Response = rls::RateLimitResponse;
    type Future = BoxFuture<Response<rls::RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<rls::RateLimitRequest>) -> Self::Future {
        let decider = self.0.clone();
        Box::pin(async move {
            let refused = |e: crate::engine::RequestError| {
                metrics::counter!(crate::metrics::upstream::SHOULD_RATE_LIMIT_ERROR, "err_type" => "service_error")
                    .increment(1);
                Status::from(e)
            };
            let ask = RlsAsk::try_from(request.get_ref()).map_err(refused)?;
            let answer = decider.should_rate_limit(&ask.ask()).await.map_err(refused)?;
            let dynamic_metadata = decider.rls_options().dynamic_metadata;
            Ok(Response::new(response(answer, request.get_ref(), dynamic_metadata)))
        })
    }
}

impl<B> tower::Service<http::Request<B>> for EnvoyRls
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async { Ok(Status::from(super::status::Refusal::NoSuchMethod).into_http()) });
        }
        let method = ShouldRateLimit(self.decider.clone());
        let max = self.max_decoding;
        Box::pin(async move {
            let mut grpc = Grpc::new(Codec::<rls::RateLimitResponse, rls::RateLimitRequest>::default())
                .apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(method, req).await)
        })
    }
}
