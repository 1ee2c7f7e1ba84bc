//! The `Floodgate` data plane service.

use std::pin::Pin;
use std::sync::Arc;

use floodgate_proto::v1 as pb;
use pb::floodgate_server::Floodgate;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::convert;
use crate::engine::{self, Engine, request};

pub struct DataPlane {
    engine: Arc<Engine>,
}

impl DataPlane {
    pub fn new(engine: Arc<Engine>) -> Self {
        DataPlane { engine }
    }

    fn decide(
        &self,
        rules: &engine::Installed,
        r: &pb::AcquireRequest,
    ) -> Result<pb::AcquireResponse, engine::RequestError> {
        let out = self.engine.acquire(rules, &ask(r))?;
        Ok(convert::acquire_response(&out))
    }
}

fn ask(r: &pb::AcquireRequest) -> engine::Request<'_, std::collections::HashMap<String, String>> {
    engine::Request { resource: &r.resource, descriptors: &r.descriptors, cost: r.cost, dry_run: r.dry_run }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Floodgate for DataPlane {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        let rules = self.engine.rules();
        Ok(Response::new(self.decide(&rules, request.get_ref())?))
    }

    async fn acquire_batch(
        &self,
        request: Request<pb::AcquireBatchRequest>,
    ) -> Result<Response<pb::AcquireBatchResponse>, Status> {
        let items = &request.get_ref().requests;
        request::check_batch("requests", items.len())?;
        let rules = self.engine.rules();
        // Prepare every item first: a bad batch is refused whole, nothing taken.
        let prepared = items
            .iter()
            .enumerate()
            .map(|(i, r)| self.engine.prepare(&rules, &ask(r)).map_err(|e| e.in_batch("requests", i)))
            .collect::<Result<Vec<_>, _>>()?;
        let now = self.engine.clock().now();
        let responses = prepared.into_iter().map(|p| convert::acquire_response(&self.engine.decide(p, now))).collect();
        Ok(Response::new(pb::AcquireBatchResponse { responses }))
    }

    async fn report_outcome(
        &self,
        _request: Request<pb::ReportOutcomeRequest>,
    ) -> Result<Response<pb::ReportOutcomeResponse>, Status> {
        Err(Status::unimplemented("ReportOutcome arrives with circuit breakers"))
    }

    async fn report_outcome_batch(
        &self,
        _request: Request<pb::ReportOutcomeBatchRequest>,
    ) -> Result<Response<pb::ReportOutcomeBatchResponse>, Status> {
        Err(Status::unimplemented("ReportOutcomeBatch arrives with circuit breakers"))
    }

    type WatchStream = EventStream;

    async fn watch(&self, _request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("Watch arrives with circuit breakers"))
    }
}
