//! The `Floodgate` data plane service: proto in, `Decider`, proto out.

use crate::grpc::convert::{FromWire, IntoWire};
use crate::grpc::status::OrStatus;
use std::sync::Arc;

use floodgate_proto::v1 as pb;
use pb::floodgate_server::Floodgate;
use tonic::{Request, Response, Status};

use super::status::Refusal;
use super::watch;
use crate::decider::Decider;
use crate::engine::{self, Report};

mod fast;

pub use fast::DataPlaneService;

pub struct DataPlane {
    decider: Arc<Decider>,
    /// Watch streams open at once: each holds a task and a buffer.
    watchers: Arc<tokio::sync::Semaphore>,
    max_watchers: usize,
}

impl DataPlane {
    pub fn new(decider: Arc<Decider>, max_watchers: usize) -> Self {
        DataPlane { decider, watchers: Arc::new(tokio::sync::Semaphore::new(max_watchers)), max_watchers }
    }
}

#[tonic::async_trait]
impl Floodgate for DataPlane {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        let set = self.decider.origin_of(request.extensions().get());
        let r = request.get_ref();
        let overlaid = engine::request::Overlaid { inner: &r.descriptors, set };
        let req = engine::Request::from_wire(r).or_status()?.with(&overlaid);
        let response: pb::AcquireResponse = self.decider.acquire(&req).await.or_status()?;
        crate::traces::record_verdict(response.verdict().as_str_name());
        Ok(Response::new(response))
    }

    async fn acquire_batch(
        &self,
        request: Request<pb::AcquireBatchRequest>,
    ) -> Result<Response<pb::AcquireBatchResponse>, Status> {
        let set = self.decider.origin_of(request.extensions().get());
        let items = &request.get_ref().requests;
        engine::request::check_batch("requests", items.len()).or_status()?;
        let overlaid: Vec<_> = items.iter().map(|r| engine::request::Overlaid { inner: &r.descriptors, set }).collect();
        let reqs = items
            .iter()
            .zip(&overlaid)
            .enumerate()
            .map(|(i, (r, o))| engine::Request::from_wire(r).map(|r| r.with(o)).map_err(|e| e.in_batch("requests", i)))
            .collect::<Result<Vec<_>, _>>()
            .or_status()?;
        let responses = self.decider.acquire_many("requests", &reqs).await.or_status()?;
        Ok(Response::new(pb::AcquireBatchResponse { responses }))
    }

    async fn lease(&self, request: Request<pb::LeaseRequest>) -> Result<Response<pb::LeaseResponse>, Status> {
        // Under mTLS the caller's certificate is its origin here too: a
        // lease is taken from the limits of the origin it proves.
        let set = self.decider.origin_of(request.extensions().get());
        let req = request.get_ref();
        let overlaid = engine::request::Overlaid { inner: &req.descriptors, set };
        let l = self
            .decider
            .leasing()
            .lease(&crate::grpc::convert::floodgate::lease_ask(req, &overlaid))
            .await
            .or_status()?;
        Ok(Response::new(pb::LeaseResponse {
            leasable: l.not_leasable.is_none(),
            reason: l.not_leasable.map(|why| why.to_string()).unwrap_or_default(),
            lease_id: l.lease_id,
            granted: l.granted,
            ttl: crate::grpc::convert::duration(l.ttl),
            retry_after: crate::grpc::convert::duration(l.retry_after),
            returned: l.returned,
            share: l.share,
            holders: u32::try_from(l.holders).unwrap_or(u32::MAX),
            limits: l.limits.iter().map(crate::grpc::convert::floodgate::left).collect(),
            empty_reason: match l.empty {
                Some(crate::engine::lease::Empty::NothingLeft) => "nothing left".into(),
                Some(crate::engine::lease::Empty::ShareUsed) => "share used".into(),
                None => String::new(),
            },
        }))
    }

    async fn report_load(
        &self,
        request: Request<pb::ReportLoadRequest>,
    ) -> Result<Response<pb::ReportLoadResponse>, Status> {
        let req = request.get_ref();
        let answer = crate::grpc::convert::floodgate::load(req)
            .and_then(|load| self.decider.control().report_load(&req.system, &req.instance, load));
        let result = match &answer {
            Ok(_) => "counted",
            Err(e) if e.kind() == engine::ErrorKind::TooMany => "refused_full",
            Err(_) => "invalid",
        };
        metrics::counter!(crate::metrics::LOAD_REPORTS, "result" => result).increment(1);
        let (degradation_level, instances) = answer.or_status()?;
        Ok(Response::new(pb::ReportLoadResponse { degradation_level, instances: instances as u32 }))
    }

    async fn charge(&self, request: Request<pb::ChargeRequest>) -> Result<Response<pb::ChargeResponse>, Status> {
        // Under mTLS the caller's certificate is its origin: a charge is
        // taken from the limits of the origin it proves, not one it names.
        let set = self.decider.origin_of(request.extensions().get());
        let req = request.get_ref();
        let overlaid = engine::request::Overlaid { inner: &req.descriptors, set };
        let response: pb::ChargeResponse = self
            .decider
            .charge(
                &req.resource,
                &overlaid,
                req.cost,
                crate::grpc::convert::floodgate::usage(&req.usage).or_status()?,
                &req.idempotency_key,
            )
            .await
            .or_status()?;
        Ok(Response::new(response))
    }

    async fn report_outcome(
        &self,
        request: Request<pb::ReportOutcomeRequest>,
    ) -> Result<Response<pb::ReportOutcomeResponse>, Status> {
        let report = Report::from_wire(request.get_ref()).or_status()?;
        Ok(Response::new(self.decider.report(&report).await.or_status()?.into_wire()))
    }

    async fn report_outcome_batch(
        &self,
        request: Request<pb::ReportOutcomeBatchRequest>,
    ) -> Result<Response<pb::ReportOutcomeBatchResponse>, Status> {
        let items = &request.get_ref().reports;
        engine::request::check_batch("reports", items.len()).or_status()?;
        // Every item is checked first: a bad batch is refused whole, nothing returned.
        let reports = items
            .iter()
            .enumerate()
            .map(|(i, r)| Report::from_wire(r).map_err(|e| e.in_batch("reports", i)))
            .collect::<Result<Vec<_>, _>>()
            .or_status()?;
        let reported = self.decider.report_many("reports", &reports).await.or_status()?;
        Ok(Response::new(pb::ReportOutcomeBatchResponse {
            responses: reported.into_iter().map(IntoWire::into_wire).collect(),
        }))
    }

    type WatchStream = watch::EventStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let Ok(slot) = self.watchers.clone().try_acquire_owned() else {
            return Err(Refusal::TooManyWatchers { max: self.max_watchers }.into());
        };
        let resources = request.into_inner().resources;
        Ok(Response::new(watch::stream(self.decider.clone(), resources, slot)))
    }
}
