//! Envoy's RLS v3 <-> domain. The RLS `domain` names the Envoy configuration's
//! domain, else the resource of our rules; each RLS descriptor is decided on
//! its own, at a cost of the descriptor's `hits_addend` when it is set (0:
//! check only), else the request's (0 read as 1).

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3 as common;
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use rls::rate_limit_response::{Code, DescriptorStatus, RateLimit};

use crate::decider::{RlsAnswer, RlsRequest, RlsStatus};
use crate::engine::request::check_name;
use crate::engine::{RequestError, RlsDescriptor};
use crate::rules::envoy::Unit;

mod metadata;

/// An RLS request, checked.
pub struct RlsAsk<'a> {
    domain: &'a str,
    descriptors: smallvec::SmallVec<[RlsDescriptor<'a>; 2]>,
}

impl<'a> TryFrom<&'a rls::RateLimitRequest> for RlsAsk<'a> {
    type Error = RequestError;

    fn try_from(req: &'a rls::RateLimitRequest) -> Result<Self, RequestError> {
        check_name("domain", &req.domain, false)?;
        crate::engine::request::check_batch("descriptors", req.descriptors.len())?;
        let descriptors = req
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| descriptor(d, req.hits_addend).map_err(|e| e.in_batch("descriptors", i)))
            .collect::<Result<_, _>>()?;
        Ok(RlsAsk { domain: &req.domain, descriptors })
    }
}

fn descriptor(d: &common::RateLimitDescriptor, request_hits: u32) -> Result<RlsDescriptor<'_>, RequestError> {
    // As upstream: the descriptor's own hits_addend when set, 0 included
    // (check only); else the request's, at least 1. Hits to give back
    // (`is_negative_hits`) are not honoured: checked, nothing taken.
    let hits = match (&d.hits_addend, d.is_negative_hits) {
        (_, true) => 0,
        (Some(h), false) => h.value,
        (None, false) => u64::from(request_hits.max(1)),
    };
    let limit = match &d.limit {
        None => None,
        Some(o) => {
            let unit = Unit::from_number(o.unit).ok_or(RequestError::UnknownEnum {
                field: "limit.unit",
                value: o.unit,
                expected: "SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
            })?;
            Some((o.requests_per_unit, unit))
        }
    };
    Ok(RlsDescriptor { entries: d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect(), hits, limit })
}

impl<'a> RlsAsk<'a> {
    pub fn ask(self) -> RlsRequest<'a> {
        RlsRequest { domain: self.domain, descriptors: self.descriptors }
    }
}

/// The answer on the wire; `asked` is the request, echoed in the dynamic
/// metadata when the answer carries any.
pub fn response(answer: RlsAnswer, asked: &rls::RateLimitRequest, dynamic_metadata: bool) -> rls::RateLimitResponse {
    let dynamic_metadata = dynamic_metadata.then(|| metadata::answer(asked, &answer.metadata));
    rls::RateLimitResponse {
        dynamic_metadata,
        overall_code: if answer.over { Code::OverLimit } else { Code::Ok } as i32,
        statuses: answer.statuses.into_iter().map(DescriptorStatus::from).collect(),
        response_headers_to_add: answer
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue { key: key.into(), value, ..Default::default() })
            .collect(),
        ..Default::default()
    }
}

impl From<RlsStatus> for DescriptorStatus {
    fn from(s: RlsStatus) -> Self {
        DescriptorStatus {
            code: if s.over { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: s.limit.map(|l| RateLimit {
                name: l.name,
                requests_per_unit: l.requests_per_unit,
                unit: l.unit as i32,
            }),
            limit_remaining: s.remaining,
            duration_until_reset: s.reset.map(duration),
            quota: None,
        }
    }
}

/// A duration in Envoy's types.
pub fn duration(d: std::time::Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}
