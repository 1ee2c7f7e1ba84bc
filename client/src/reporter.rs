//! Outcome reports, batched in the background: `report` never blocks or fails
//! the caller's path. Reports go to the server that issued the permit.

use std::time::Duration;

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

use crate::stats::Stats;

/// Reports waiting before the caller's `report` drops new ones.
const QUEUE: usize = 10_000;

pub(crate) enum Item {
    Report(pb::ReportOutcomeRequest),
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
    pub(crate) fn send(&self, report: pb::ReportOutcomeRequest) -> bool {
        self.tx.try_send(Item::Report(report)).is_ok()
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
    loop {
        let item = if batch.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout(s.interval, rx.recv()).await {
                Ok(item) => item,
                Err(_) => {
                    deliver(&mut grpc, &mut batch, &s, &stats).await;
                    continue;
                }
            }
        };
        match item {
            None => {
                deliver(&mut grpc, &mut batch, &s, &stats).await;
                return;
            }
            Some(Item::Report(r)) => {
                batch.push(r);
                if batch.len() >= s.batch {
                    deliver(&mut grpc, &mut batch, &s, &stats).await;
                }
            }
            Some(Item::Flush(done)) => {
                deliver(&mut grpc, &mut batch, &s, &stats).await;
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
