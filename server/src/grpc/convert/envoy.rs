//! Envoy's RLS v3 <-> domain. The RLS `domain` is the resource; each RLS
//! descriptor is one decision whose descriptors are its entries, at a cost of
//! the descriptor's `hits_addend`, else the request's, else 1.

use floodgate_proto::envoy::service::ratelimit::v3 as rls;
use rls::rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit};

use super::duration;
use crate::engine::request::{check_batch, check_name};
use crate::engine::{Answer, LimitReport, Request, RequestError, Verdict};

/// The entries of one descriptor, in Envoy's order.
pub type Entries<'a> = Vec<(&'a str, &'a str)>;

/// An RLS request, checked: its descriptors' entries and costs.
pub struct RlsAsk<'a> {
    pub domain: &'a str,
    entries: Vec<Entries<'a>>,
    costs: Vec<u32>,
}

impl<'a> TryFrom<&'a rls::RateLimitRequest> for RlsAsk<'a> {
    type Error = RequestError;

    fn try_from(req: &'a rls::RateLimitRequest) -> Result<Self, RequestError> {
        check_name("domain", &req.domain, false)?;
        check_batch("descriptors", req.descriptors.len())?;
        let entries = req
            .descriptors
            .iter()
            .map(|d| d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect())
            .collect();
        let costs = req
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let hits = d.hits_addend.filter(|&h| h > 0).unwrap_or(u64::from(req.hits_addend));
                u32::try_from(hits).map_err(|_| {
                    RequestError::CostTooLarge { field: "hits_addend", value: hits }.in_batch("descriptors", i)
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(RlsAsk { domain: &req.domain, entries, costs })
    }
}

impl RlsAsk<'_> {
    /// One decision per descriptor.
    pub fn requests(&self) -> Vec<Request<'_, [(&str, &str)]>> {
        self.entries
            .iter()
            .zip(&self.costs)
            .map(|(entries, &cost)| Request {
                resource: self.domain,
                descriptors: entries.as_slice(),
                cost,
                dry_run: false,
            })
            .collect()
    }
}

/// The overall answer: OVER_LIMIT when any descriptor is.
pub fn response(statuses: Vec<DescriptorStatus>) -> rls::RateLimitResponse {
    let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
    rls::RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        ..Default::default()
    }
}

/// One descriptor's status: the limit that denied it, else the one with the
/// least left; no `current_limit` when no limit matched (as Envoy does).
impl From<Answer<'_>> for DescriptorStatus {
    fn from(out: Answer<'_>) -> Self {
        let ok = out.verdict == Verdict::Allowed;
        let tightest =
            out.limits.iter().find(|r| r.exceeded).or_else(|| out.limits.iter().min_by_key(|r| r.status.remaining));
        DescriptorStatus {
            code: if ok { Code::Ok } else { Code::OverLimit } as i32,
            current_limit: tightest.map(RateLimit::from),
            limit_remaining: tightest.map_or(0, |r| u32::try_from(r.status.remaining).unwrap_or(u32::MAX)),
            duration_until_reset: tightest.and_then(|r| duration(r.status.reset_after)),
            quota: None,
        }
    }
}

/// The limit in Envoy's terms: requests per second, minute, hour or day. A
/// window of exactly one unit reports the limit itself; otherwise the rate over
/// the largest unit that gives a whole number.
impl From<&LimitReport<'_>> for RateLimit {
    fn from(r: &LimitReport<'_>) -> Self {
        let (limit, window) = (r.status.limit, r.limit.algorithm.window().as_secs_f64());
        let units = [(Unit::Day, 86_400.0), (Unit::Hour, 3_600.0), (Unit::Minute, 60.0), (Unit::Second, 1.0)];
        let (unit, per_unit) = units
            .iter()
            .find(|(_, secs)| *secs == window)
            .map(|&(u, _)| (u, limit as f64))
            .or_else(|| units.iter().rev().map(|&(u, secs)| (u, limit as f64 * secs / window)).find(|&(_, n)| n >= 1.0))
            .unwrap_or((Unit::Day, limit as f64 * 86_400.0 / window));
        RateLimit {
            name: r.limit.name.clone(),
            requests_per_unit: per_unit.round().clamp(0.0, u32::MAX as f64) as u32,
            unit: unit as i32,
        }
    }
}
