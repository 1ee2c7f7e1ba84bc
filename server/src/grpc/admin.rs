//! The `Admin` control plane service: proto in, `Decider`, proto out.

use std::sync::Arc;

use floodgate_proto::v1 as pb;
use pb::admin_server::Admin;
use tonic::{Request, Response, Status};

use super::convert::floodgate::{breaker_state_request, level_request};
use crate::decider::Decider;

pub struct ControlPlane {
    decider: Arc<Decider>,
}

impl ControlPlane {
    pub fn new(decider: Arc<Decider>) -> Self {
        ControlPlane { decider }
    }
}

#[tonic::async_trait]
impl Admin for ControlPlane {
    async fn get_rules(
        &self,
        _request: Request<pb::GetRulesRequest>,
    ) -> Result<Response<pb::GetRulesResponse>, Status> {
        Ok(Response::new(self.decider.rules().into()))
    }

    async fn apply_rules(
        &self,
        request: Request<pb::ApplyRulesRequest>,
    ) -> Result<Response<pb::ApplyRulesResponse>, Status> {
        let req = request.get_ref();
        Ok(Response::new(self.decider.apply_rules(&req.yaml, req.validate_only).await?.into()))
    }

    async fn list_breakers(
        &self,
        _request: Request<pb::ListBreakersRequest>,
    ) -> Result<Response<pb::ListBreakersResponse>, Status> {
        let breakers = self.decider.breakers().into_iter().map(Into::into).collect();
        Ok(Response::new(pb::ListBreakersResponse { breakers }))
    }

    async fn get_breaker(&self, request: Request<pb::GetBreakerRequest>) -> Result<Response<pb::BreakerInfo>, Status> {
        Ok(Response::new(self.decider.breaker(&request.get_ref().resource)?.into()))
    }

    async fn set_breaker_state(
        &self,
        request: Request<pb::SetBreakerStateRequest>,
    ) -> Result<Response<pb::BreakerInfo>, Status> {
        let req = request.get_ref();
        let state = breaker_state_request(req.state)?;
        Ok(Response::new(self.decider.set_breaker(&req.resource, state).await?.into()))
    }

    async fn set_degradation_level(
        &self,
        request: Request<pb::SetDegradationLevelRequest>,
    ) -> Result<Response<pb::SetDegradationLevelResponse>, Status> {
        Ok(Response::new(self.decider.set_level(level_request(request.get_ref()))?.into()))
    }

    async fn peek(&self, request: Request<pb::PeekRequest>) -> Result<Response<pb::PeekResponse>, Status> {
        let req = request.get_ref();
        let only = (!req.limit.is_empty()).then_some(req.limit.as_str());
        let response: pb::PeekResponse = self.decider.peek(&req.resource, &req.descriptors, only)?;
        Ok(Response::new(response))
    }
}
