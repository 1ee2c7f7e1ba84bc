//! The `Floodgate` data plane service.

use std::sync::Arc;
use std::time::Duration;

use floodgate_proto::v1 as pb;
use pb::floodgate_server::Floodgate;
use tonic::{Request, Response, Status};

use super::{convert, watch};
use crate::breaker::Outcome;
use crate::engine::{self, Engine, RequestError, request};
use crate::replication::Replication;

pub struct DataPlane {
    engine: Arc<Engine>,
    replication: Option<Arc<Replication>>,
}

impl DataPlane {
    pub fn new(engine: Arc<Engine>, replication: Option<Arc<Replication>>) -> Self {
        DataPlane { engine, replication }
    }

    fn decide(
        &self,
        rules: &engine::Installed,
        r: &pb::AcquireRequest,
    ) -> Result<pb::AcquireResponse, engine::RequestError> {
        let out = self.engine.acquire(rules, &ask(r))?;
        Ok(convert::acquire_response(out))
    }
}

fn ask(r: &pb::AcquireRequest) -> engine::Request<'_, std::collections::HashMap<String, String>> {
    engine::Request { resource: &r.resource, descriptors: &r.descriptors, cost: r.cost, dry_run: r.dry_run }
}

/// A ReportOutcome request, checked.
struct Report<'a> {
    resource: &'a str,
    permit_id: &'a str,
    outcome: Outcome,
    latency: Option<Duration>,
}

impl<'a> TryFrom<&'a pb::ReportOutcomeRequest> for Report<'a> {
    type Error = RequestError;

    fn try_from(r: &'a pb::ReportOutcomeRequest) -> Result<Self, RequestError> {
        request::check_permit_id(&r.permit_id)?;
        if !r.resource.is_empty() {
            request::check_name("resource", &r.resource, false)?;
        }
        let outcome = convert::from_outcome(r.outcome).ok_or(RequestError::UnknownEnum {
            field: "outcome",
            value: r.outcome,
            expected: "SUCCESS, FAILURE or IGNORED",
        })?;
        let latency = match &r.latency {
            Some(d) => Some(convert::from_duration(d).ok_or(RequestError::NegativeDuration { field: "latency" })?),
            None => None,
        };
        Ok(Report { resource: &r.resource, permit_id: &r.permit_id, outcome, latency })
    }
}

impl DataPlane {
    fn report(&self, rules: &engine::Installed, r: &Report<'_>) -> Result<pb::ReportOutcomeResponse, RequestError> {
        let reported = self.engine.report(rules, r.resource, r.permit_id, r.outcome, r.latency)?;
        Ok(pb::ReportOutcomeResponse {
            counted: reported.counted,
            breaker_state: reported.breaker_state.map_or(pb::BreakerState::Unspecified, convert::breaker_state) as i32,
        })
    }
}

#[tonic::async_trait]
impl Floodgate for DataPlane {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        if let Some(replication) = &self.replication {
            let rules = self.engine.rules_full();
            let answer = replication.acquire(&rules, &ask(request.get_ref())).await?;
            return Ok(Response::new(convert::acquire_response(answer)));
        }
        let rules = self.engine.rules();
        Ok(Response::new(self.decide(&rules, request.get_ref())?))
    }

    async fn acquire_batch(
        &self,
        request: Request<pb::AcquireBatchRequest>,
    ) -> Result<Response<pb::AcquireBatchResponse>, Status> {
        let items = &request.get_ref().requests;
        request::check_batch("requests", items.len())?;
        if let Some(replication) = &self.replication {
            let rules = self.engine.rules_full();
            for (i, r) in items.iter().enumerate() {
                self.engine.prepare(&rules, &ask(r)).map_err(|e| e.in_batch("requests", i))?;
            }
            let mut responses = Vec::with_capacity(items.len());
            for (i, r) in items.iter().enumerate() {
                let answer = replication.acquire(&rules, &ask(r)).await.map_err(|e| e.in_batch("requests", i))?;
                responses.push(convert::acquire_response(answer));
            }
            return Ok(Response::new(pb::AcquireBatchResponse { responses }));
        }
        let rules = self.engine.rules();
        // Prepare every item first: a bad batch is refused whole, nothing taken.
        let prepared = items
            .iter()
            .enumerate()
            .map(|(i, r)| self.engine.prepare(&rules, &ask(r)).map_err(|e| e.in_batch("requests", i)))
            .collect::<Result<Vec<_>, _>>()?;
        let now = self.engine.clock().now();
        let responses = prepared.into_iter().map(|p| convert::acquire_response(self.engine.decide(p, now))).collect();
        Ok(Response::new(pb::AcquireBatchResponse { responses }))
    }

    async fn report_outcome(
        &self,
        request: Request<pb::ReportOutcomeRequest>,
    ) -> Result<Response<pb::ReportOutcomeResponse>, Status> {
        let report = Report::try_from(request.get_ref())?;
        let rules = self.engine.rules_full();
        let response = self.report(&rules, &report)?;
        if let Some(replication) = &self.replication {
            replication.after_report(&rules).await;
        }
        Ok(Response::new(response))
    }

    async fn report_outcome_batch(
        &self,
        request: Request<pb::ReportOutcomeBatchRequest>,
    ) -> Result<Response<pb::ReportOutcomeBatchResponse>, Status> {
        let items = &request.get_ref().reports;
        request::check_batch("reports", items.len())?;
        // Check every item first: a bad batch is refused whole, nothing returned.
        let reports = items
            .iter()
            .enumerate()
            .map(|(i, r)| Report::try_from(r).map_err(|e| e.in_batch("reports", i)))
            .collect::<Result<Vec<_>, _>>()?;
        let rules = self.engine.rules_full();
        let mut responses = Vec::with_capacity(reports.len());
        for (i, report) in reports.iter().enumerate() {
            responses.push(self.report(&rules, report).map_err(|e| e.in_batch("reports", i))?);
        }
        if let Some(replication) = &self.replication {
            replication.after_report(&rules).await;
        }
        Ok(Response::new(pb::ReportOutcomeBatchResponse { responses }))
    }

    type WatchStream = watch::EventStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let resources = request.into_inner().resources;
        Ok(Response::new(watch::stream(self.engine.clone(), resources)))
    }
}
