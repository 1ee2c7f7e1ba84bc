//! The incremental (delta) ADS stream: a response adds, replaces or removes
//! resources by name; the whole set after it is validated and installed, or
//! the response is NACKed and the set held stays as it was.

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::{Client, Ended, Held, TYPE_URL};

pub(super) async fn stream(client: &Client, channel: Channel, held: &mut Held) -> Ended {
    let (tx, rx) = mpsc::channel(4);
    // A wildcard subscription; after a reconnection, what is held already.
    let first = DeltaDiscoveryRequest {
        node: Some(client.node()),
        type_url: TYPE_URL.into(),
        initial_resource_versions: held.resources.iter().map(|(n, (v, _))| (n.clone(), v.clone())).collect(),
        ..Default::default()
    };
    let _ = tx.send(first).await;
    let mut ads = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(client.config.max_message);
    let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut responses = match client.open(ads.delta_aggregated_resources(client.request(requests))).await {
        Ok(r) => r,
        Err(ended) => return ended,
    };
    let mut progress = false;
    let type_url: fn(&DeltaDiscoveryResponse) -> &str = |r| r.type_url.as_str();
    loop {
        client.after_refusals().await;
        let first = client.config.initial_fetch_timeout;
        let response = match super::next(&mut responses, &mut progress, type_url, first).await {
            Ok(r) => r,
            Err(ended) => return ended,
        };
        let (burst, ended) = super::ready(&mut responses, type_url, super::BURST);
        let burst: Vec<DeltaDiscoveryResponse> = std::iter::once(response).chain(burst).collect();
        for request in answers(client, &burst, held).await {
            if tx.send(request).await.is_err() {
                return Ended::AfterProgress("the stream closed".into());
            }
        }
        if let Some(ended) = ended {
            return ended;
        }
    }
}

/// The ACKs or NACKs of a burst of responses. Their changes are applied in
/// order and the resulting set validated once (a control plane that sends a
/// resource per response costs one validation, not one per resource); if
/// that fails, each is answered on its own, so that the good ones still
/// take effect and the bad one is NACKed.
async fn answers(client: &Client, burst: &[DeltaDiscoveryResponse], held: &mut Held) -> Vec<DeltaDiscoveryRequest> {
    if let [one] = burst {
        return vec![answer(client, one, held).await];
    }
    let mut next = Ok(held.resources.clone());
    for response in burst {
        next = next.and_then(|set| updated(response, &set));
    }
    if let Ok(next) = next {
        let documents = next.values().map(|(_, d)| d.clone()).collect();
        let last = burst.last().expect("a burst is not empty");
        let version = version(last, &next);
        if client.apply(documents, &version).await.is_ok() {
            client.judged(&version, None);
            held.resources = next;
            return burst
                .iter()
                .map(|r| {
                    crate::metrics::xds_update(true);
                    DeltaDiscoveryRequest {
                        type_url: TYPE_URL.into(),
                        response_nonce: r.nonce.clone(),
                        ..Default::default()
                    }
                })
                .collect();
        }
    }
    let mut out = Vec::with_capacity(burst.len());
    for response in burst {
        out.push(answer(client, response, held).await);
    }
    out
}

/// The ACK or NACK of one response.
async fn answer(client: &Client, response: &DeltaDiscoveryResponse, held: &mut Held) -> DeltaDiscoveryRequest {
    let result = match updated(response, &held.resources) {
        Ok(next) => {
            let documents = next.values().map(|(_, d)| d.clone()).collect();
            let version = version(response, &next);
            client.apply(documents, &version).await.map(|()| next)
        }
        Err(e) => Err(e),
    };
    client.judged(&response.system_version_info, result.as_ref().err());
    let error_detail = match result {
        Ok(next) => {
            held.resources = next;
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
    DeltaDiscoveryRequest {
        type_url: TYPE_URL.into(),
        response_nonce: response.nonce.clone(),
        error_detail,
        ..Default::default()
    }
}

type Set = std::collections::BTreeMap<String, (String, crate::rules::envoy::Document)>;

/// The set held with the response applied: its resources added or
/// replaced, its removals removed.
fn updated(response: &DeltaDiscoveryResponse, held: &Set) -> Result<Set, String> {
    let mut next = held.clone();
    for r in &response.resources {
        let Some(any) = &r.resource else {
            // A heartbeat of a resource with a TTL: it stays as held.
            if next.contains_key(&r.name) {
                continue;
            }
            return Err(format!("resource '{}': no content, and none is held by that name", r.name));
        };
        let mut documents = super::documents(std::iter::once((r.name.as_str(), any)))?;
        next.insert(r.name.clone(), (r.version.clone(), documents.remove(0)));
    }
    for name in &response.removed_resources {
        next.remove(name);
    }
    Ok(next)
}

/// The version shown: the control plane's system version, else each
/// resource's, by name.
fn version(response: &DeltaDiscoveryResponse, set: &Set) -> String {
    if !response.system_version_info.is_empty() {
        return response.system_version_info.clone();
    }
    set.iter().map(|(n, (v, _))| format!("{n}={v}")).collect::<Vec<_>>().join(",")
}
