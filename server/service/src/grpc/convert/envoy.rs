//! Envoy's RLS v3 <-> domain. The RLS `domain` names the Envoy configuration's
//! domain, else the resource of our rules; each RLS descriptor is decided on
//! its own, at a cost of the descriptor's `hits_addend` when it is set (0:
//! check only), else the request's (0 read as 1). The messages are read and
//! written in place ([`wire`]).

use crate::decider::RlsRequest;
use crate::engine::{RequestError, RlsDescriptor};
use crate::rules::envoy::Unit;

pub mod metadata;
pub mod wire;

pub use wire::{RlsReply, RlsWire, WireDescriptor, WireRequest};

impl<'w, 'a: 'w> TryFrom<&'w WireRequest<'a>> for RlsRequest<'w> {
    type Error = RequestError;

    fn try_from(req: &'w WireRequest<'a>) -> Result<Self, RequestError> {
        if req.domain.is_empty() {
            return Err(RequestError::Empty { field: "domain".into() });
        }
        crate::engine::request::check_batch("descriptors", req.descriptors.len())?;
        let descriptors = req
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| descriptor(d, req.hits_addend).map_err(|e| e.in_batch("descriptors", i)))
            .collect::<Result<_, _>>()?;
        Ok(RlsRequest { domain: req.domain, descriptors })
    }
}

fn descriptor<'w, 'a: 'w>(d: &'w WireDescriptor<'a>, request_hits: u32) -> Result<RlsDescriptor<'w>, RequestError> {
    // As upstream: the descriptor's own hits_addend when set, 0 included
    // (check only); else the request's, at least 1. Hits to give back
    // (`is_negative_hits`) are not honoured: checked, nothing taken.
    let hits = match (d.hits_addend, d.is_negative_hits) {
        (_, true) => 0,
        (Some(h), false) => h,
        (None, false) => u64::from(request_hits.max(1)),
    };
    let limit = match d.limit {
        None => None,
        Some((requests_per_unit, unit)) => {
            let unit = Unit::from_number(unit).ok_or(RequestError::UnknownEnum {
                field: "limit.unit",
                value: unit,
                expected: "SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
            })?;
            Some((requests_per_unit, unit))
        }
    };
    Ok(RlsDescriptor { entries: &d.entries, hits, limit })
}

/// A duration in Envoy's types.
pub fn duration(d: std::time::Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}
