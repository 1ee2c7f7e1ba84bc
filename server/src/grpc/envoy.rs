//! Envoy's rate limit service v3 (`ShouldRateLimit`), wire-compatible with
//! Envoy, Istio and any RLS client: proto in, `Decider`, proto out. As in
//! Envoy's own service, descriptors are decided independently.

use std::sync::Arc;

use floodgate_proto::envoy::service::ratelimit::v3 as rls;
use rls::rate_limit_response::DescriptorStatus;
use rls::rate_limit_service_server::RateLimitService;
use tonic::{Request, Response, Status};

use super::convert::envoy::{RlsAsk, response};
use crate::decider::Decider;

pub struct EnvoyRls {
    decider: Arc<Decider>,
}

impl EnvoyRls {
    pub fn new(decider: Arc<Decider>) -> Self {
        EnvoyRls { decider }
    }
}

#[tonic::async_trait]
impl RateLimitService for EnvoyRls {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let ask = RlsAsk::try_from(request.get_ref())?;
        let statuses: Vec<DescriptorStatus> = self.decider.acquire_many("descriptors", &ask.requests()).await?;
        Ok(Response::new(response(statuses)))
    }
}
