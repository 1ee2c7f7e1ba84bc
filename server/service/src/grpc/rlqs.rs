//! Envoy's Rate Limit Quota Service (RLQS,
//! `envoy.service.rate_limit_quota.v3`), for Envoy's `rate_limit_quota`
//! filter: each Envoy streams usage reports per bucket, and gets back, per
//! bucket, an assignment it enforces by itself until the next one.
//!
//! An assignment is a lease (see `decider::lease`): a bucket id names the
//! resource (`name`, else the filter's `domain`) and the descriptors (the
//! other entries); each report settles the bucket's previous lease at what
//! Envoy says it allowed and grants the next, sized from its demand (allowed
//! plus denied, per lease time) and the Envoys' shares. The units are taken
//! when granted, so a fleet of Envoys admits no more than the limits hold.
//! Envoy gets them as a token bucket that refills the grant over the lease
//! time (see `envoy_bucket`), or DENY_ALL while nothing is left. A bucket no rule limits is ALLOW_ALL; one whose limits are not marked
//! `lease:` is ALLOW_ALL too, and said in the log (RLQS cannot ask per call).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket, rate_limit_strategy};
use rlqs::rate_limit_quota_response::{BucketAction, bucket_action};
use rlqs::rate_limit_quota_service_server::{RateLimitQuotaService, RateLimitQuotaServiceServer};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use super::convert::envoy::duration;
use super::status::Refusal;
use crate::decider::{Decider, LeaseAsk};
use crate::engine::lease::{Book, Booked, NotLeasable, want_from_demand};

/// Streams open at once.
pub(crate) const MAX_STREAMS: usize = 1024;

pub(crate) struct Rlqs {
    decider: Arc<Decider>,
    streams: Arc<AtomicUsize>,
    next: AtomicU64,
}

impl Rlqs {
    pub fn server(decider: Arc<Decider>, max_message: usize) -> RateLimitQuotaServiceServer<Rlqs> {
        let rlqs = Rlqs { decider, streams: Arc::default(), next: AtomicU64::new(1) };
        RateLimitQuotaServiceServer::new(rlqs).max_decoding_message_size(max_message)
    }
}

/// A stream's buckets: the lease each holds, by bucket id; and a serial
/// that makes each assignment differ from the last (see `answer`).
#[derive(Default)]
struct Buckets {
    book: Book<Vec<(String, String)>>,
    serial: u32,
}

type Responses = tokio_stream::wrappers::ReceiverStream<Result<rlqs::RateLimitQuotaResponse, Status>>;

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<tonic::Streaming<rlqs::RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Responses>, Status> {
        if self.streams.fetch_add(1, Ordering::AcqRel) >= MAX_STREAMS {
            self.streams.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::TooManyQuotaStreams { max: MAX_STREAMS }.into());
        }
        let holder = match request.remote_addr() {
            Some(a) => format!("rlqs-{a}-{}", self.next.fetch_add(1, Ordering::Relaxed)),
            None => format!("rlqs-{}", self.next.fetch_add(1, Ordering::Relaxed)),
        };
        let mut reports = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (decider, streams) = (self.decider.clone(), self.streams.clone());
        tokio::spawn(async move {
            let _open = Open(streams);
            let mut buckets = Buckets::default();
            while let Some(report) = reports.next().await {
                let report = match report {
                    Ok(r) => r,
                    Err(e) => {
                        // Too large, undecodable, or the client reset the
                        // stream: it ends with the error, not with OK.
                        tracing::debug!(holder, error = %e, "RLQS stream ended");
                        let _ = tx.send(Err(super::status::stream_error(e))).await;
                        break;
                    }
                };
                tracing::debug!(
                    holder,
                    domain = report.domain,
                    buckets = report.bucket_quota_usages.len(),
                    "RLQS usage report"
                );
                let response = answer(&decider, &holder, &mut buckets, report).await;
                if response.bucket_action.is_empty() {
                    continue;
                }
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
            }
            // The stream ended: what the leases granted stays taken (Envoy
            // may have used it) and each expires on its own.
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// Frees a stream's place when its task ends.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A bucket's id: its (key, value) pairs, sorted.
type Pairs = Vec<(String, String)>;

/// Settles and renews every bucket of one report.
async fn answer(
    decider: &Decider,
    holder: &str,
    buckets: &mut Buckets,
    report: rlqs::RateLimitQuotaUsageReports,
) -> rlqs::RateLimitQuotaResponse {
    // A bucket named twice in one report is one bucket: its usages add up,
    // and it gets one assignment (in the order buckets were first named).
    let mut usages: Vec<(Pairs, u64, u64)> = Vec::new();
    let mut seen: HashMap<Pairs, usize> = HashMap::new();
    for usage in report.bucket_quota_usages {
        let Some(id) = usage.bucket_id else { continue };
        let mut pairs: Vec<(String, String)> = id.bucket.into_iter().collect();
        pairs.sort();
        let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
        match seen.get(&pairs) {
            Some(&i) => {
                usages[i].1 = usages[i].1.saturating_add(allowed);
                usages[i].2 = usages[i].2.saturating_add(denied);
            }
            None => {
                seen.insert(pairs.clone(), usages.len());
                usages.push((pairs, allowed, denied));
            }
        }
    }
    let mut actions = Vec::new();
    for (pairs, allowed, denied) in usages {
        let Some(action) = renew(decider, holder, buckets, &report.domain, &pairs, allowed, denied).await else {
            continue;
        };
        let bucket_id = rlqs::BucketId { bucket: pairs.into_iter().collect() };
        actions.push(BucketAction { bucket_id: Some(bucket_id), bucket_action: Some(action) });
    }
    rlqs::RateLimitQuotaResponse { bucket_action: actions }
}

/// Logs of abandoned buckets, at most one a minute.
static ABANDON_LOG: crate::time::Throttle = crate::time::Throttle::new(60);

/// One bucket's previous lease settled at what Envoy allowed, and its next
/// assignment (abandoned when the stream holds as many buckets as it may);
/// `None` when the bucket is refused (bad input).
async fn renew(
    decider: &Decider,
    holder: &str,
    buckets: &mut Buckets,
    domain: &str,
    pairs: &[(String, String)],
    allowed: u64,
    denied: u64,
) -> Option<bucket_action::BucketAction> {
    let resource = pairs.iter().find(|(k, _)| k == "name").map_or(domain, |(_, v)| v.as_str());
    let descriptors: Vec<(&str, &str)> =
        pairs.iter().filter(|(k, _)| k != "name").map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let Some(last) = buckets.book.lease_of(pairs) else {
        // The stream holds as many buckets as it may: Envoy is told to
        // abandon this one, so that it applies its no_assignment_behavior
        // rather than wait for an answer that never comes.
        metrics::counter!(crate::metrics::RLQS_BUCKETS_ABANDONED).increment(1);
        if ABANDON_LOG.due(decider.now()) {
            tracing::warn!(
                max = Book::<Pairs>::MAX,
                "an RLQS stream holds as many buckets as it may: new buckets are abandoned"
            );
        }
        return Some(bucket_action::BucketAction::AbandonAction(bucket_action::AbandonAction {}));
    };
    let last = last.cloned();
    let now = decider.now();
    let previous = last.as_ref().map(|b| b.id.clone()).unwrap_or_default();
    // Envoy counts in 64 bits; a lease is at most u32::MAX units, and a
    // report counts at most what its lease granted: clamped, not refused
    // (a refusal here would leave the bucket without an answer).
    let cap = u64::from(u32::MAX);
    // The time since this bucket's last report: Envoy's reporting period.
    let period = last.as_ref().map(|b| Duration::from_nanos(now.as_nanos().saturating_sub(b.at.as_nanos())));
    let want = match (&last, period) {
        (Some(b), Some(period)) => want_from_demand(allowed, denied, period, b.ttl).min(cap),
        _ => 0,
    };
    let allowed = allowed.min(cap);
    let ask = LeaseAsk {
        resource,
        descriptors: descriptors.as_slice(),
        want,
        previous: &previous,
        used: allowed,
        holder,
        release: false,
    };
    let leased =
        decider.leasing().lease(&ask).await.inspect_err(|e| tracing::debug!(error = %e, "RLQS bucket refused")).ok()?;
    if let Some(why) = leased.not_leasable {
        if why != NotLeasable::NoRule {
            let resource = resource.escape_debug().to_string();
            tracing::warn!(resource, reason = %why, "RLQS bucket cannot be leased: ALLOW_ALL");
        }
        buckets.book.forget(pairs);
        return Some(blanket(rate_limit_strategy::BlanketRule::AllowAll, Duration::from_secs(60)));
    }
    // Kept with nothing granted too: the next report's demand is then
    // counted from this answer.
    buckets.book.hold(pairs.to_vec(), Booked { id: leased.lease_id.clone(), at: now, ttl: leased.ttl });
    if leased.granted == 0 {
        let ttl = leased.retry_after.clamp(Duration::from_millis(100), leased.ttl);
        return Some(blanket(rate_limit_strategy::BlanketRule::DenyAll, ttl));
    }
    let tokens = u32::try_from(leased.granted).unwrap_or(u32::MAX);
    let bucket = envoy_bucket(tokens, leased.ttl, period.unwrap_or(leased.ttl / 2), buckets.serial);
    buckets.serial = buckets.serial.wrapping_add(1);
    Some(assignment(
        RateLimitStrategy { strategy: Some(rate_limit_strategy::Strategy::TokenBucket(bucket)) },
        leased.ttl,
    ))
}

/// The token bucket Envoy enforces for `tokens` granted for `ttl`, renewed
/// every `period`. Envoy 1.40 keeps a bucket's tokens when a new assignment
/// replaces it and refills at `tokens_per_fill` per `fill_interval`: so it
/// refills the grant over the lease time, and holds at most what the rest of
/// the lease time after one period refills. Between two reports it then admits
/// at most the grant (what it holds, plus a period's refill), at the share's
/// rate. Each assignment differs from the last (by up to a second of the fill
/// interval), for an Envoy that starts a fresh bucket on a new one.
fn envoy_bucket(tokens: u32, ttl: Duration, period: Duration, serial: u32) -> TokenBucket {
    let rest = ttl.saturating_sub(period.min(ttl));
    let held = (u128::from(tokens) * rest.as_nanos() / ttl.as_nanos().max(1)) as u32;
    TokenBucket {
        max_tokens: held.max(1),
        tokens_per_fill: Some(envoy_types::pb::google::protobuf::UInt32Value { value: tokens.max(1) }),
        fill_interval: Some(duration(ttl + Duration::from_millis(u64::from(serial % 1000)))),
    }
}

fn blanket(rule: rate_limit_strategy::BlanketRule, ttl: Duration) -> bucket_action::BucketAction {
    assignment(RateLimitStrategy { strategy: Some(rate_limit_strategy::Strategy::BlanketRule(rule as i32)) }, ttl)
}

fn assignment(strategy: RateLimitStrategy, ttl: Duration) -> bucket_action::BucketAction {
    bucket_action::BucketAction::QuotaAssignmentAction(bucket_action::QuotaAssignmentAction {
        assignment_time_to_live: Some(duration(ttl)),
        rate_limit_strategy: Some(strategy),
    })
}
