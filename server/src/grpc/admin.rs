//! The `Admin` control plane service.

use std::sync::Arc;

use floodgate_proto::v1 as pb;
use pb::admin_server::Admin;
use tonic::{Request, Response, Status};

use super::convert;
use crate::degradation;
use crate::engine::{Engine, RequestError};
use crate::replication::Replication;
use crate::rules::RuleSet;

pub struct ControlPlane {
    engine: Arc<Engine>,
    replication: Option<Arc<Replication>>,
}

impl ControlPlane {
    pub fn new(engine: Arc<Engine>, replication: Option<Arc<Replication>>) -> Self {
        ControlPlane { engine, replication }
    }
}

fn resource_names(rules: &RuleSet) -> Vec<String> {
    rules.rules().iter().map(|r| r.name.clone()).collect()
}

#[tonic::async_trait]
impl Admin for ControlPlane {
    async fn get_rules(
        &self,
        _request: Request<pb::GetRulesRequest>,
    ) -> Result<Response<pb::GetRulesResponse>, Status> {
        let installed = self.engine.rules();
        Ok(Response::new(pb::GetRulesResponse {
            yaml: installed.yaml.clone(),
            version: installed.version,
            source: installed.source.clone(),
            loaded_at: Some(convert::timestamp(installed.loaded_at)),
            resources: resource_names(&installed.rules),
        }))
    }

    async fn apply_rules(
        &self,
        request: Request<pb::ApplyRulesRequest>,
    ) -> Result<Response<pb::ApplyRulesResponse>, Status> {
        let req = request.into_inner();
        let rules = RuleSet::from_yaml(&req.yaml, "ApplyRules").inspect_err(|_| {
            if !req.validate_only {
                crate::metrics::rule_reload("admin", false, self.engine.rules().version);
            }
        })?;
        let resources = resource_names(&rules);
        if req.validate_only {
            let version = self.engine.rules().version;
            return Ok(Response::new(pb::ApplyRulesResponse { version, resources, applied: false }));
        }
        let version = self.engine.install(rules, req.yaml.clone(), "admin".into());
        crate::metrics::rule_reload("admin", true, version);
        if let Some(replication) = &self.replication {
            replication.share_rules(&req.yaml).await;
        }
        tracing::info!(version, "rules applied through Admin");
        Ok(Response::new(pb::ApplyRulesResponse { version, resources, applied: true }))
    }

    async fn list_breakers(
        &self,
        _request: Request<pb::ListBreakersRequest>,
    ) -> Result<Response<pb::ListBreakersResponse>, Status> {
        let rules = self.engine.rules();
        let breakers = self.engine.breakers(&rules).into_iter().map(|(r, i)| convert::breaker_info(r, i)).collect();
        Ok(Response::new(pb::ListBreakersResponse { breakers }))
    }

    async fn get_breaker(&self, request: Request<pb::GetBreakerRequest>) -> Result<Response<pb::BreakerInfo>, Status> {
        let resource = request.into_inner().resource;
        let info = self.engine.breaker(&self.engine.rules(), &resource)?;
        Ok(Response::new(convert::breaker_info(resource, info)))
    }

    async fn set_breaker_state(
        &self,
        request: Request<pb::SetBreakerStateRequest>,
    ) -> Result<Response<pb::BreakerInfo>, Status> {
        let req = request.into_inner();
        let state = convert::from_breaker_state(req.state).ok_or(RequestError::UnknownEnum {
            field: "state",
            value: req.state,
            expected: "CLOSED, FORCED_OPEN, DISABLED or METRICS_ONLY",
        })?;
        let rules = self.engine.rules_full();
        let mut info = self.engine.set_breaker(&rules, &req.resource, state)?;
        if let Some(replication) = &self.replication {
            replication.force_breaker(&rules, &req.resource, state).await;
            info = self.engine.breaker(&rules, &req.resource)?;
        }
        tracing::info!(resource = req.resource, state = state.name(), "breaker state set through Admin");
        Ok(Response::new(convert::breaker_info(req.resource, info)))
    }

    async fn set_degradation_level(
        &self,
        request: Request<pb::SetDegradationLevelRequest>,
    ) -> Result<Response<pb::SetDegradationLevelResponse>, Status> {
        let req = request.into_inner();
        if !req.automatic && req.level > degradation::MAX_LEVEL {
            return Err(RequestError::BadLevel(req.level).into());
        }
        let level = self.engine.set_degradation((!req.automatic).then_some(req.level));
        Ok(Response::new(pb::SetDegradationLevelResponse {
            level: level.level,
            manual: level.manual,
            automatic_level: level.automatic,
        }))
    }

    async fn peek(&self, request: Request<pb::PeekRequest>) -> Result<Response<pb::PeekResponse>, Status> {
        let req = request.get_ref();
        let rules = self.engine.rules();
        let only = (!req.limit.is_empty()).then_some(req.limit.as_str());
        let out = self.engine.peek(&rules, &req.resource, &req.descriptors, only)?;
        if let Some(name) = only
            && out.limits.is_empty()
        {
            return Err(Status::not_found(format!("limit: resource '{}' has no matched limit '{name}'", req.resource)));
        }
        Ok(Response::new(pb::PeekResponse {
            rule: out.rule.unwrap_or_default().to_string(),
            limits: out
                .limits
                .iter()
                .map(|r| pb::LimitStatus { algorithm: r.limit.algorithm.name().into(), ..convert::limit_status(r) })
                .collect(),
            breaker_state: out.breaker_state.map_or(pb::BreakerState::Unspecified, convert::breaker_state) as i32,
            degradation_level: out.degradation_level,
        }))
    }
}
