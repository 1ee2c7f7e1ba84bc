//! The workers: closed loop (each worker sends as soon as its last call came
//! back) or open loop (`--rps`: call i is due at start + i/rps, and its latency
//! is measured from when it was due, so queueing is never hidden).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use tonic::client::Grpc;
use tonic::transport::Channel;

use super::report::Samples;
use super::wire::{BatchVerdicts, FirstVarint, PermitView, RawCodec};
use floodgate_proto::v1 as pb;

/// Which call, and how to read its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Rpc {
    /// floodgate.v1.Floodgate/Acquire
    Acquire,
    /// floodgate.v1.Floodgate/AcquireBatch
    Batch,
    /// floodgate.v1.Floodgate/Acquire, then ReportOutcome with its permit
    /// (the pair is one call; use a resource with a breaker or concurrency
    /// limit). A denied Acquire is counted by its verdict, not reported.
    Report,
    /// grpc.health.v1.Health/Check
    Health,
    /// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
    Envoy,
}

/// When to stop sending.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    Total(u64),
    After(Duration),
}

/// A run, planned: what to send and how.
pub struct Plan {
    pub rpc: Rpc,
    /// Builds call number `i`.
    pub payload: Box<dyn Fn(u64) -> Bytes + Send + Sync>,
    /// With `Rpc::Report`: the share of calls reported as FAILURE.
    pub failure_ratio: f64,
    pub concurrency: usize,
    pub stop: Stop,
    pub rps: Option<f64>,
    pub timeout: Duration,
}

struct Shared {
    plan: Plan,
    start: Instant,
    issued: AtomicU64,
    done: AtomicU64,
    finished: AtomicBool,
}

/// Up to 8 answer values counted per run, by the number on the wire.
pub type Answers = [u64; 8];

impl Rpc {
    pub fn path(self) -> PathAndQuery {
        PathAndQuery::from_static(match self {
            Rpc::Acquire => "/floodgate.v1.Floodgate/Acquire",
            Rpc::Batch => "/floodgate.v1.Floodgate/AcquireBatch",
            Rpc::Report => "/floodgate.v1.Floodgate/ReportOutcome",
            Rpc::Health => "/grpc.health.v1.Health/Check",
            Rpc::Envoy => "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        })
    }

    /// The name of answer value `n`.
    pub fn answer_name(self, n: usize) -> String {
        let names: &[&str] = match self {
            Rpc::Acquire | Rpc::Batch => {
                &["VERDICT_UNSPECIFIED", "ALLOWED", "RATE_LIMITED", "CIRCUIT_OPEN", "CONCURRENCY_LIMITED", "SHED"]
            }
            // Counted or not when reported; by the Acquire's verdict when denied.
            Rpc::Report => &["NOT_COUNTED", "COUNTED", "RATE_LIMITED", "CIRCUIT_OPEN", "CONCURRENCY_LIMITED", "SHED"],
            Rpc::Health => &["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"],
            Rpc::Envoy => &["UNKNOWN", "OK", "OVER_LIMIT"],
        };
        names.get(n).map_or_else(|| format!("VALUE_{n}"), |s| s.to_string())
    }

    /// Call number `i`; the answers it carried are added to `answers`.
    async fn call(
        self,
        grpc: &mut Grpc<Channel>,
        payload: Bytes,
        failed: bool,
        answers: &mut Answers,
    ) -> Result<(), tonic::Status> {
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let request = tonic::Request::new(payload);
        if self == Rpc::Batch {
            let r = grpc.unary(request, self.path(), RawCodec::<BatchVerdicts>::default()).await?;
            for v in r.into_inner().responses {
                answers[(v.value as usize).min(7)] += 1;
            }
        } else if self == Rpc::Report {
            let acquire = PathAndQuery::from_static("/floodgate.v1.Floodgate/Acquire");
            let permit = grpc.unary(request, acquire, RawCodec::<PermitView>::default()).await?.into_inner();
            // Denied (an open breaker, a full concurrency limit): nothing to
            // report, and counted as what it is.
            if (2..=5).contains(&permit.verdict) {
                answers[permit.verdict as usize] += 1;
                return Ok(());
            }
            if permit.permit_id.is_empty() {
                return Err(tonic::Status::failed_precondition(
                    "no permit: --rpc report needs a resource with a breaker or a concurrency limit, and an admitted call",
                ));
            }
            let report = pb::ReportOutcomeRequest {
                permit_id: permit.permit_id,
                outcome: if failed { pb::Outcome::Failure } else { pb::Outcome::Success } as i32,
                ..Default::default()
            };
            grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let request = tonic::Request::new(Bytes::from(prost::Message::encode_to_vec(&report)));
            let r = grpc.unary(request, self.path(), RawCodec::<FirstVarint>::default()).await?;
            answers[(r.into_inner().value as usize).min(7)] += 1;
        } else {
            let r = grpc.unary(request, self.path(), RawCodec::<FirstVarint>::default()).await?;
            answers[(r.into_inner().value as usize).min(7)] += 1;
        }
        Ok(())
    }
}

/// Runs the plan over `channels` (workers share them round-robin); returns
/// what was measured and the wall time from the first call to the last answer.
pub async fn run(channels: Vec<Channel>, plan: Plan, progress: bool) -> (Samples, Duration) {
    let shared = Arc::new(Shared {
        plan,
        start: Instant::now(),
        issued: AtomicU64::new(0),
        done: AtomicU64::new(0),
        finished: AtomicBool::new(false),
    });
    let reporter = progress.then(|| tokio::spawn(report_progress(shared.clone())));
    let workers: Vec<_> = (0..shared.plan.concurrency.max(1))
        .map(|w| tokio::spawn(worker(shared.clone(), channels[w % channels.len()].clone())))
        .collect();
    let mut samples = Samples::default();
    let mut answers: Answers = [0; 8];
    for w in workers {
        let (s, a) = w.await.expect("a bench worker panicked");
        samples.merge(s);
        answers.iter_mut().zip(a).for_each(|(t, n)| *t += n);
    }
    let took = shared.start.elapsed();
    shared.finished.store(true, Ordering::Release);
    if let Some(r) = reporter {
        let _ = r.await;
    }
    let rpc = shared.plan.rpc;
    samples.verdicts =
        answers.iter().enumerate().filter(|&(_, &n)| n > 0).map(|(i, &n)| (rpc.answer_name(i), n)).collect();
    (samples, took)
}

async fn worker(shared: Arc<Shared>, channel: Channel) -> (Samples, Answers) {
    let plan = &shared.plan;
    let mut grpc = Grpc::new(channel);
    let mut samples = Samples::default();
    let mut answers: Answers = [0; 8];
    let mut codes = [0u64; 17];
    loop {
        let i = shared.issued.fetch_add(1, Ordering::Relaxed);
        let due = match plan.rps {
            Some(rps) => shared.start + Duration::from_secs_f64(i as f64 / rps),
            None => Instant::now(),
        };
        let stop = match plan.stop {
            Stop::Total(n) => i >= n,
            Stop::After(d) => due.duration_since(shared.start) >= d,
        };
        if stop {
            break;
        }
        if plan.rps.is_some() {
            tokio::time::sleep_until(due.into()).await;
        }
        let payload = (plan.payload)(i);
        // Failures spread evenly: call i fails when i * ratio passes a whole number.
        let r = plan.failure_ratio;
        let failed = ((i + 1) as f64 * r).floor() > (i as f64 * r).floor();
        let call = plan.rpc.call(&mut grpc, payload, failed, &mut answers);
        let result = tokio::time::timeout(plan.timeout, call).await;
        samples.latencies.push(due.elapsed().as_nanos() as u64);
        match result {
            Ok(Ok(())) => codes[0] += 1,
            Ok(Err(status)) => {
                codes[status.code() as usize] += 1;
                *samples.errors.entry(format!("{:?}: {}", status.code(), status.message())).or_default() += 1;
            }
            Err(_) => {
                codes[tonic::Code::DeadlineExceeded as usize] += 1;
                *samples.errors.entry("DeadlineExceeded: no answer within --timeout".into()).or_default() += 1;
            }
        }
        shared.done.fetch_add(1, Ordering::Relaxed);
    }
    samples.codes = codes
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n > 0)
        .map(|(c, &n)| (code_name(tonic::Code::from(c as i32)), n))
        .collect();
    (samples, answers)
}

/// ghz's names: "OK", then tonic's ("Unavailable", "DeadlineExceeded"...).
fn code_name(code: tonic::Code) -> String {
    match code {
        tonic::Code::Ok => "OK".into(),
        other => format!("{other:?}"),
    }
}

async fn report_progress(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let mut last = 0;
    while !shared.finished.load(Ordering::Acquire) {
        tick.tick().await;
        let done = shared.done.load(Ordering::Relaxed);
        let secs = shared.start.elapsed().as_secs();
        eprintln!("  {secs:>4}s  {done:>10} calls  {:>9}/s", done - last);
        last = done;
    }
}
