//! The `Admin` control plane service: proto in, `Decider`, proto out.

use crate::grpc::convert::IntoWire;
use crate::grpc::status::IntoStatus;
use crate::grpc::status::OrStatus;
use std::sync::Arc;

use floodgate_proto::v1 as pb;
use pb::admin_server::Admin;
use tonic::{Request, Response, Status};

use super::convert::floodgate::{breaker_state_request, level_request, level_response};
use super::convert::overrides;
use crate::access::Caller;
use crate::decider::Decider;

pub struct ControlPlane {
    decider: Arc<Decider>,
}

impl ControlPlane {
    pub fn new(decider: Arc<Decider>) -> Self {
        ControlPlane { decider }
    }
}

/// Who made a call: set by the gate in front of this service.
fn who<T>(request: &Request<T>) -> String {
    request.extensions().get::<Caller>().map_or_else(|| "unknown".into(), |c| c.who.clone())
}

#[tonic::async_trait]
impl Admin for ControlPlane {
    async fn get_rules(
        &self,
        _request: Request<pb::GetRulesRequest>,
    ) -> Result<Response<pb::GetRulesResponse>, Status> {
        Ok(Response::new(self.decider.views().rules().into_wire()))
    }

    async fn apply_rules(
        &self,
        request: Request<pb::ApplyRulesRequest>,
    ) -> Result<Response<pb::ApplyRulesResponse>, Status> {
        let req = request.get_ref();
        if req.validate_only && req.what_if.is_some() {
            return Err(crate::engine::RequestError::ValidateWithWhatIf.into_status());
        }
        if let Some(length) = &req.what_if {
            let length = super::convert::what_if_length(length).or_status()?;
            let started = self.decider.control().start_what_if(&req.yaml, length).await.or_status()?;
            let (who, resources) = (who(&request), started.resources.len());
            tracing::info!(target: "floodgate::audit", who, change = "ApplyRules what_if", resources, seconds = length.as_secs_f64(), "admin change");
            return Ok(Response::new(started.into_wire()));
        }
        let before = self.decider.views().rules().version;
        let applied = self.decider.control().apply_rules(&req.yaml, req.validate_only).await.or_status()?;
        if applied.applied {
            let (who, after, resources) = (who(&request), applied.version, applied.resources.len());
            tracing::info!(target: "floodgate::audit", who, change = "ApplyRules", resources, version_before = before, version_after = after, "admin change");
        }
        Ok(Response::new(applied.into_wire()))
    }

    async fn revert_rules(
        &self,
        request: Request<pb::RevertRulesRequest>,
    ) -> Result<Response<pb::RevertRulesResponse>, Status> {
        let before = self.decider.views().rules().version;
        let reverted = self.decider.control().revert_rules(request.get_ref().to_version).await.or_status()?;
        let (who, after, to, resources) =
            (who(&request), reverted.version, reverted.reverted_to, reverted.resources.len());
        tracing::info!(target: "floodgate::audit", who, change = "RevertRules", reverted_to = to, resources, version_before = before, version_after = after, "admin change");
        Ok(Response::new(reverted.into_wire()))
    }

    async fn get_traffic(
        &self,
        request: Request<pb::GetTrafficRequest>,
    ) -> Result<Response<pb::GetTrafficResponse>, Status> {
        let req = request.get_ref();
        let page = match req.page_token.as_str() {
            "" => 0,
            token => {
                token.parse().map_err(|_| crate::engine::RequestError::BadPage(token.to_string()).into_status())?
            }
        };
        let got = self.decider.views().recorded_traffic(&req.resource, &req.limit, page).await.or_status()?;
        Ok(Response::new(pb::GetTrafficResponse {
            keys_recorded: got.keys as u64,
            calls_not_recorded: got.refused,
            shared: got.shared,
            keys: got
                .page
                .into_iter()
                .map(|(key, days)| pb::KeyTraffic {
                    key,
                    days: days
                        .into_iter()
                        .map(|(day, calls)| pb::DayPeak { day: i64::from(day) * 86_400, calls })
                        .collect(),
                })
                .collect(),
            next_page_token: got.next.map(|p| p.to_string()).unwrap_or_default(),
        }))
    }

    async fn propose_limit(
        &self,
        request: Request<pb::ProposeLimitRequest>,
    ) -> Result<Response<pb::ProposeLimitResponse>, Status> {
        use crate::decider::ProposeError;
        use floodgate_core::recommend::Settings;
        let req = request.get_ref();
        for (field, value) in [("resource", &req.resource), ("limit", &req.limit)] {
            if value.is_empty() {
                return Err(Status::invalid_argument(format!("{field}: required")));
            }
        }
        let defaults = Settings::default();
        let settings = Settings {
            quantile: req.quantile.unwrap_or(defaults.quantile),
            headroom: req.headroom.unwrap_or(defaults.headroom),
            max_decrease: req.max_decrease.unwrap_or(defaults.max_decrease),
        };
        let proposed = match self.decider.views().propose_limit(&req.resource, &req.limit, settings).await {
            Ok(p) => p,
            Err(ProposeError::Request(e)) => return Err(e.into_status()),
            Err(e @ ProposeError::Invalid(_)) => return Err(Status::invalid_argument(e.to_string())),
            Err(e @ (ProposeError::Empty(_) | ProposeError::Unfit(_))) => {
                return Err(Status::failed_precondition(e.to_string()));
            }
            Err(e @ (ProposeError::Busy | ProposeError::TooLarge(_))) => {
                return Err(Status::resource_exhausted(e.to_string()));
            }
            Err(e @ ProposeError::Mixed) => return Err(Status::unavailable(e.to_string())),
        };
        let made = proposed.made;
        let minute = |m: u64| i64::try_from(m * 60).unwrap_or(i64::MAX);
        Ok(Response::new(pb::ProposeLimitResponse {
            current_per_minute: made.target.per_minute,
            per_minute: made.proposal.per_minute,
            observed_per_minute: made.proposal.observed,
            overrides: made
                .proposal
                .overrides
                .iter()
                .map(|(key, &per_minute)| pb::KeyLimit { key: key.clone(), per_minute })
                .collect(),
            kept: made.written.kept,
            keys: made.proposal.keys as u64,
            recorded_from: minute(made.from),
            recorded_to: minute(made.to),
            replayed_calls: made.replayed.iter().map(|r| r.calls).sum(),
            replayed_denied: made.replayed.iter().map(|r| r.denied).sum(),
            most_denied: made
                .replayed
                .iter()
                .filter(|r| r.denied > 0)
                .take(20)
                .map(|r| pb::KeyReplay { key: r.key.clone(), per_minute: r.limit, calls: r.calls, denied: r.denied })
                .collect(),
            rules_yaml: made.written.text,
            shared: proposed.shared,
            algorithm: match made.target.shape {
                floodgate_core::recommend::Shape::TokenBucket => "token_bucket",
                floodgate_core::recommend::Shape::FixedWindow => "fixed_window",
            }
            .to_string(),
        }))
    }

    async fn list_breakers(
        &self,
        _request: Request<pb::ListBreakersRequest>,
    ) -> Result<Response<pb::ListBreakersResponse>, Status> {
        let breakers = self.decider.views().breakers().into_iter().map(IntoWire::into_wire).collect();
        Ok(Response::new(pb::ListBreakersResponse { breakers }))
    }

    async fn get_breaker(&self, request: Request<pb::GetBreakerRequest>) -> Result<Response<pb::BreakerInfo>, Status> {
        Ok(Response::new(self.decider.views().breaker(&request.get_ref().resource).or_status()?.into_wire()))
    }

    async fn get_concurrency(
        &self,
        request: Request<pb::GetConcurrencyRequest>,
    ) -> Result<Response<pb::ConcurrencyInfo>, Status> {
        Ok(Response::new(super::convert::concurrency::info(
            &self.decider.views().concurrency(&request.get_ref().resource).or_status()?,
        )))
    }

    async fn set_breaker_state(
        &self,
        request: Request<pb::SetBreakerStateRequest>,
    ) -> Result<Response<pb::BreakerInfo>, Status> {
        let req = request.get_ref();
        let state = breaker_state_request(req.state).or_status()?;
        let version = self.decider.views().rules().version;
        let view = self.decider.control().set_breaker(&req.resource, state).await.or_status()?;
        let (who, resource, to) = (who(&request), req.resource.as_str(), state.name());
        tracing::info!(target: "floodgate::audit", who, change = "SetBreakerState", resource, to, version_before = version, version_after = version, "admin change");
        Ok(Response::new(view.into_wire()))
    }

    async fn set_degradation_level(
        &self,
        request: Request<pb::SetDegradationLevelRequest>,
    ) -> Result<Response<pb::SetDegradationLevelResponse>, Status> {
        let version = self.decider.views().rules().version;
        let (target, level) = level_request(request.get_ref()).or_status()?;
        let levels = self.decider.control().set_level(target, level).await.or_status()?;
        let who = who(&request);
        for l in &levels {
            let (system, to, manual) = (crate::metrics::system_label(&l.system), l.level, l.manual);
            tracing::info!(target: "floodgate::audit", who, change = "SetDegradationLevel", system, to, manual, version_before = version, version_after = version, "admin change");
        }
        Ok(Response::new(level_response(levels)))
    }

    async fn get_what_if(
        &self,
        _request: Request<pb::GetWhatIfRequest>,
    ) -> Result<Response<pb::GetWhatIfResponse>, Status> {
        let report = self.decider.views().what_if().ok_or(crate::engine::RequestError::NoWhatIf).or_status()?;
        Ok(Response::new(report.into_wire()))
    }

    async fn peek(&self, request: Request<pb::PeekRequest>) -> Result<Response<pb::PeekResponse>, Status> {
        let req = request.get_ref();
        let only = (!req.limit.is_empty()).then_some(req.limit.as_str());
        let response: pb::PeekResponse = self.decider.peek(&req.resource, &req.descriptors, only).await.or_status()?;
        Ok(Response::new(response))
    }

    async fn set_overrides(
        &self,
        request: Request<pb::SetOverridesRequest>,
    ) -> Result<Response<pb::SetOverridesResponse>, Status> {
        use crate::engine::RequestError;
        let req = request.get_ref();
        let new = req
            .overrides
            .iter()
            .enumerate()
            .map(|(i, o)| overrides::new_override(o).map_err(|e| e.in_batch("overrides", i)))
            .collect::<Result<Vec<_>, RequestError>>()
            .or_status()?;
        let who = who(&request);
        let before = self.decider.views().rules().version;
        let set = self.decider.control().set_overrides(new, &who).await.or_status()?;
        let ids: Vec<&str> = set.specs.iter().map(|s| s.id.as_str()).collect();
        let (count, ids, after) = (ids.len(), ids.join(","), set.rules_version);
        tracing::info!(target: "floodgate::audit", who, change = "SetOverrides", count, ids, version_before = before, version_after = after, "admin change");
        Ok(Response::new(pb::SetOverridesResponse {
            overrides: set.specs.iter().map(|s| overrides::to_pb(s, None)).collect(),
            rules_version: set.rules_version,
            persisted: set.persisted,
        }))
    }

    async fn list_overrides(
        &self,
        request: Request<pb::ListOverridesRequest>,
    ) -> Result<Response<pb::ListOverridesResponse>, Status> {
        let req = request.get_ref();
        let page = self.decider.views().list_overrides(&req.rule, &req.after, req.limit as usize);
        Ok(Response::new(pb::ListOverridesResponse {
            overrides: page.items.into_iter().map(|(s, problem)| overrides::to_pb(&s, problem)).collect(),
            next_after: page.next_after,
            total: page.total as u64,
        }))
    }

    async fn delete_overrides(
        &self,
        request: Request<pb::DeleteOverridesRequest>,
    ) -> Result<Response<pb::DeleteOverridesResponse>, Status> {
        let ids = request.get_ref().ids.clone();
        let who = who(&request);
        let before = self.decider.views().rules().version;
        let (deleted, after) = self.decider.control().delete_overrides(ids).await.or_status()?;
        let (count, ids) = (deleted.len(), deleted.join(","));
        tracing::info!(target: "floodgate::audit", who, change = "DeleteOverrides", count, ids, version_before = before, version_after = after, "admin change");
        Ok(Response::new(pb::DeleteOverridesResponse { deleted, rules_version: after }))
    }

    async fn get_top_keys(
        &self,
        request: Request<pb::GetTopKeysRequest>,
    ) -> Result<Response<pb::GetTopKeysResponse>, Status> {
        let req = request.get_ref();
        let n = if req.count == 0 { 10 } else { req.count as usize };
        if !req.rule.is_empty() && !self.decider.views().has_rule(&req.rule) {
            return Err(crate::engine::RequestError::NoSuchRule(req.rule.clone()).into_status());
        }
        let key = |(key, count, error): (String, u64, u64)| pb::TopKey { key, count, error };
        let limits = self
            .decider
            .views()
            .top_keys(&req.rule, n)
            .into_iter()
            .map(|t| pb::LimitTopKeys {
                rule: t.rule,
                limit: t.limit,
                denied: t.denied.into_iter().map(key).collect(),
                admitted: t.admitted.into_iter().map(key).collect(),
            })
            .collect();
        let window = std::time::Duration::from_secs(crate::hitters::EPOCH_SECS * crate::hitters::EPOCHS as u64);
        Ok(Response::new(pb::GetTopKeysResponse {
            limits,
            window: super::convert::duration(window),
            admitted_sample: crate::hitters::ADMITTED_SAMPLE,
        }))
    }

    async fn get_decisions(
        &self,
        request: Request<pb::GetDecisionsRequest>,
    ) -> Result<Response<pb::GetDecisionsResponse>, Status> {
        let req = request.into_inner();
        let log = self.decider.decisions();
        let query = crate::decider::decisions::DecisionQuery {
            resource: req.resource,
            descriptors: req.descriptors.into_iter().collect(),
            denied_only: req.denied_only,
            count: req.count as usize,
        };
        let (read, more) = log.read(&query);
        Ok(Response::new(pb::GetDecisionsResponse {
            decisions: read.iter().map(IntoWire::into_wire).collect(),
            share: log.share(),
            capacity: u32::try_from(log.capacity()).unwrap_or(u32::MAX),
            kept: log.kept(),
            more,
        }))
    }

    async fn set_decision_log(
        &self,
        request: Request<pb::SetDecisionLogRequest>,
    ) -> Result<Response<pb::SetDecisionLogResponse>, Status> {
        let share = request.get_ref().share;
        let before = self.decider.decisions().set_share(share).map_err(|e| {
            crate::engine::RequestError::OutOfRange { field: "share", message: e.to_string() }.into_status()
        })?;
        let who = who(&request);
        tracing::info!(target: "floodgate::audit", who, change = "SetDecisionLog", share_before = before, share, "admin change");
        Ok(Response::new(pb::SetDecisionLogResponse { share_before: before, share }))
    }

    async fn adjust_balance(
        &self,
        request: Request<pb::AdjustBalanceRequest>,
    ) -> Result<Response<pb::AdjustBalanceResponse>, Status> {
        let req = request.get_ref();
        // Checked before anything changes: a change the audit log could not
        // explain is not made.
        crate::engine::request::check_name("limit", &req.limit, false).or_status()?;
        crate::engine::request::check_name("reason", &req.reason, false).or_status()?;
        let (balance, max_balance) =
            self.decider.adjust_balance(&req.resource, &req.descriptors, &req.limit, req.amount).await.or_status()?;
        let descriptors = crate::engine::request::sorted_pairs_text(&req.descriptors);
        let who = who(&request);
        tracing::info!(
            target: "floodgate::audit",
            who,
            change = "AdjustBalance",
            resource = req.resource,
            descriptors,
            limit = req.limit,
            amount = req.amount,
            reason = req.reason,
            balance_after = balance,
            "admin change"
        );
        Ok(Response::new(pb::AdjustBalanceResponse { balance, max_balance }))
    }
}
