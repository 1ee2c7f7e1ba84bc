//! Outcome reports, batched in the background: reporting never blocks or
//! fails the caller's path. A batch leaves when it is full, or at most
//! `interval` after its first report (not after a pause: a steady trickle
//! of reports never holds one back); a report that frees a concurrency slot or
//! decides a half-open probe leaves at once, with whatever is queued. Reports
//! go to the server that issued the permit.

use std::time::Duration;

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

use crate::stats::Stats;

/// Reports waiting before the caller's `report` drops new ones.
const QUEUE: usize = 10_000;

pub(crate) enum Item {
    /// A report, and whether it must leave at once.
    Report(pb::ReportOutcomeRequest, bool),
    Flush(oneshot::Sender<()>),
}

#[derive(Clone)]
pub(crate) struct Reporter {
    tx: mpsc::Sender<Item>,
}

pub(crate) struct Settings {
    pub batch: usize,
    pub interval: Duration,
    pub timeout: Duration,
}

impl Reporter {
    pub(crate) fn spawn(grpc: FloodgateClient<Channel>, settings: Settings, stats: std::sync::Arc<Stats>) -> Reporter {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(grpc, rx, settings, stats));
        Reporter { tx }
    }

    /// Queues a report; when the queue is full it is dropped (and counted).
    pub(crate) fn send(&self, report: pb::ReportOutcomeRequest, urgent: bool) -> bool {
        self.tx.try_send(Item::Report(report, urgent)).is_ok()
    }

    /// Waits until everything queued so far was sent (or given up on).
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Item::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

async fn run(
    mut grpc: FloodgateClient<Channel>,
    mut rx: mpsc::Receiver<Item>,
    s: Settings,
    stats: std::sync::Arc<Stats>,
) {
    let mut batch = Vec::with_capacity(s.batch);
    // When the batch in hand must leave: its first report plus the interval.
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        let item = match due {
            None => rx.recv().await,
            Some(at) => tokio::select! {
                item = rx.recv() => item,
                () = tokio::time::sleep_until(at) => {
                    deliver(&mut grpc, &mut batch, &s, &stats).await;
                    due = None;
                    continue;
                }
            },
        };
        match item {
            None => {
                deliver(&mut grpc, &mut batch, &s, &stats).await;
                return;
            }
            Some(Item::Report(r, urgent)) => {
                if batch.is_empty() {
                    due = Some(tokio::time::Instant::now() + s.interval);
                }
                batch.push(r);
                if urgent || batch.len() >= s.batch {
                    deliver(&mut grpc, &mut batch, &s, &stats).await;
                    due = None;
                }
            }
            Some(Item::Flush(done)) => {
                deliver(&mut grpc, &mut batch, &s, &stats).await;
                due = None;
                let _ = done.send(());
            }
        }
    }
}

/// Sends a batch, trying twice; a batch the server cannot take is dropped
/// (its permits expire on the server, so nothing leaks).
async fn deliver(
    grpc: &mut FloodgateClient<Channel>,
    batch: &mut Vec<pb::ReportOutcomeRequest>,
    s: &Settings,
    stats: &Stats,
) {
    if batch.is_empty() {
        return;
    }
    let reports = std::mem::take(batch);
    let n = reports.len() as u64;
    for attempt in 0..2 {
        let request = pb::ReportOutcomeBatchRequest { reports: reports.clone() };
        match tokio::time::timeout(s.timeout, grpc.report_outcome_batch(request)).await {
            Ok(Ok(r)) => {
                let counted = r.into_inner().responses.iter().filter(|r| r.counted).count() as u64;
                stats.reported(counted, n - counted);
                return;
            }
            Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                tracing::warn!(error = %status.message(), "Floodgate refused a batch of reports");
                break;
            }
            _ if attempt == 0 => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => {}
        }
    }
    stats.dropped(n);
}
