//! Envoy's rate limit service v3 (`ShouldRateLimit`), wire-compatible with
//! Envoy, Istio and any RLS client.
//!
//! The RLS `domain` is the resource; each RLS descriptor is one decision whose
//! descriptors are its entries, at a cost of the descriptor's `hits_addend`, else
//! the request's, else 1 (as in Envoy's own service, descriptors are decided
//! independently). The overall code is OVER_LIMIT when any descriptor is.

use std::sync::Arc;

use floodgate_proto::envoy::service::ratelimit::v3 as rls;
use rls::rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit};
use rls::rate_limit_service_server::RateLimitService;
use tonic::{Request, Response, Status};

use super::convert;
use crate::engine::{self, Answer, Engine, LimitReport, Verdict, request};
use crate::replication::Replication;

pub struct EnvoyRls {
    engine: Arc<Engine>,
    replication: Option<Arc<Replication>>,
}

impl EnvoyRls {
    pub fn new(engine: Arc<Engine>, replication: Option<Arc<Replication>>) -> Self {
        EnvoyRls { engine, replication }
    }
}

/// The entries of one descriptor, in Envoy's order.
type Entries<'a> = Vec<(&'a str, &'a str)>;

#[tonic::async_trait]
impl RateLimitService for EnvoyRls {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let req = request.get_ref();
        request::check_name("domain", &req.domain, false)?;
        request::check_batch("descriptors", req.descriptors.len())?;
        let entries: Vec<Entries<'_>> = req
            .descriptors
            .iter()
            .map(|d| d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect())
            .collect();
        let rules = self.engine.rules_full();
        let asks = req
            .descriptors
            .iter()
            .zip(&entries)
            .enumerate()
            .map(|(i, (d, entries))| {
                let hits = d.hits_addend.filter(|&h| h > 0).unwrap_or(u64::from(req.hits_addend));
                let cost = u32::try_from(hits).map_err(|_| {
                    engine::RequestError::CostTooLarge { field: "hits_addend", value: hits }.in_batch("descriptors", i)
                })?;
                Ok(engine::Request { resource: &req.domain, descriptors: entries.as_slice(), cost, dry_run: false })
            })
            .collect::<Result<Vec<_>, engine::RequestError>>()?;
        // Every descriptor is checked before any is decided: a bad request takes nothing.
        let prepared = asks
            .iter()
            .enumerate()
            .map(|(i, ask)| self.engine.prepare(&rules, ask).map_err(|e| e.in_batch("descriptors", i)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut statuses: Vec<DescriptorStatus> = Vec::with_capacity(asks.len());
        match &self.replication {
            Some(replication) => {
                drop(prepared);
                for ask in &asks {
                    statuses.push(status(&replication.acquire(&rules, ask).await?));
                }
            }
            None => {
                let now = self.engine.clock().now();
                statuses.extend(prepared.into_iter().map(|p| status(&self.engine.decide(p, now))));
            }
        }
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        Ok(Response::new(rls::RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..Default::default()
        }))
    }
}

/// One descriptor's status: the limit that denied it, else the one with the
/// least left; no `current_limit` when no limit matched (as Envoy does).
fn status(out: &Answer<'_>) -> DescriptorStatus {
    let ok = out.verdict == Verdict::Allowed;
    let tightest =
        out.limits.iter().find(|r| r.exceeded).or_else(|| out.limits.iter().min_by_key(|r| r.status.remaining));
    DescriptorStatus {
        code: if ok { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: tightest.map(current_limit),
        limit_remaining: tightest.map_or(0, |r| u32::try_from(r.status.remaining).unwrap_or(u32::MAX)),
        duration_until_reset: tightest.and_then(|r| convert::duration(r.status.reset_after)),
        quota: None,
    }
}

/// The limit in Envoy's terms: requests per second, minute, hour or day. A
/// window of exactly one unit reports the limit itself; otherwise the rate over
/// the largest unit that gives a whole number.
fn current_limit(r: &LimitReport<'_>) -> RateLimit {
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
