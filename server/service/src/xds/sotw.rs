//! The state-of-the-world ADS stream: every response holds every resource;
//! each is installed whole and ACKed, or NACKed with its errors.

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::{Client, Ended, Held, TYPE_URL};

pub(super) async fn stream(client: &Client, channel: Channel, held: &mut Held) -> Ended {
    let (tx, rx) = mpsc::channel(4);
    // The first request names the node and what is held (empty at first).
    let first = DiscoveryRequest {
        version_info: held.version.clone(),
        node: Some(client.node()),
        type_url: TYPE_URL.into(),
        ..Default::default()
    };
    let _ = tx.send(first).await;
    let mut ads = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(client.config.max_message);
    let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut responses = match client.open(ads.stream_aggregated_resources(client.request(requests))).await {
        Ok(r) => r,
        Err(ended) => return ended,
    };
    let mut progress = false;
    let type_url: fn(&DiscoveryResponse) -> &str = |r| r.type_url.as_str();
    loop {
        client.after_refusals().await;
        let first = client.config.initial_fetch_timeout;
        let response = match super::next(&mut responses, &mut progress, type_url, first).await {
            Ok(r) => r,
            Err(ended) => return ended,
        };
        // Each response is the whole state: of a burst, the last is read
        // (the others' nonces are stale, and need no answer).
        let (burst, ended) = super::ready(&mut responses, type_url, super::BURST);
        let last = burst.into_iter().last().unwrap_or(response);
        if tx.send(answer(client, &last, held).await).await.is_err() {
            return Ended::AfterProgress("the stream closed".into());
        }
        if let Some(ended) = ended {
            return ended;
        }
    }
}

/// The ACK or NACK of one response.
async fn answer(client: &Client, response: &DiscoveryResponse, held: &mut Held) -> DiscoveryRequest {
    let named = response.resources.iter().map(|r| ("", r));
    let result = match super::documents(named) {
        Ok(documents) => client.apply(documents, &response.version_info).await,
        Err(e) => Err(e),
    };
    client.judged(&response.version_info, result.as_ref().err());
    let error_detail = match result {
        Ok(()) => {
            held.version = response.version_info.clone();
            crate::metrics::xds_update(true);
            None
        }
        Err(errors) => {
            crate::metrics::xds_update(false);
            Some(Status {
                code: tonic::Code::InvalidArgument as i32,
                message: super::nack_message(&errors),
                details: vec![],
            })
        }
    };
    DiscoveryRequest {
        // An ACK names the version; a NACK the one still in force.
        version_info: held.version.clone(),
        type_url: TYPE_URL.into(),
        response_nonce: response.nonce.clone(),
        error_detail,
        ..Default::default()
    }
}
