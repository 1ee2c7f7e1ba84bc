//! Every builder that takes user input answers bad input with an error, never
//! a panic.

use crate::grpc::FloodgateGrpcLayer;
use crate::http::FloodgateLayer;
use floodgate_proto::v1 as pb;

use crate::{Client, Error};

fn client() -> Client {
    Client::builder().endpoint("http://127.0.0.1:1").watch_breakers(false).build().unwrap()
}

#[test]
fn a_client_without_an_endpoint_or_with_a_bad_one_is_an_error() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _enter = rt.enter();
    assert!(matches!(Client::builder().build(), Err(Error::Endpoint { .. })));
    let err = Client::connect("not a url\u{0}").err().expect("refused");
    assert!(matches!(&err, Error::Endpoint { endpoint, .. } if endpoint == "not a url\u{0}"), "{err}");
}

#[tokio::test]
async fn the_http_layer_refuses_a_bad_header_name() {
    let err = FloodgateLayer::new(client()).descriptor_header("x user\n", "user").err().expect("refused");
    assert_eq!(err.to_string(), "'x user\n' is not a valid header name");
    assert!(FloodgateLayer::new(client()).descriptor_header("x-user-id", "user").is_ok());
}

#[tokio::test]
async fn the_http_layer_can_be_configured_after_it_was_cloned() {
    let layer = FloodgateLayer::new(client()).routes(["/a/:id"]);
    let clone = layer.clone();
    // Used to panic: "configure the layer before cloning it".
    let changed = clone.client_ip("ip").descriptor_header("x-tenant", "tenant").unwrap();
    drop((layer, changed));
}

#[tokio::test]
async fn the_grpc_layer_refuses_a_bad_metadata_key() {
    let err = FloodgateGrpcLayer::new(client()).descriptor_metadata("Bad Key", "tenant").err().expect("refused");
    assert!(matches!(err, Error::InvalidHeader { ref name } if name == "Bad Key"));
    let layer = FloodgateGrpcLayer::new(client()).descriptor_metadata("x-tenant", "tenant").unwrap();
    assert!(layer.clone().descriptor_metadata("x-user", "user").is_ok(), "configurable after a clone");
}

/// A server that answers a batch with one answer too few.
struct ShortBatches;

#[tonic::async_trait]
impl floodgate_proto::v1::floodgate_server::Floodgate for ShortBatches {
    async fn acquire(
        &self,
        _: tonic::Request<pb::AcquireRequest>,
    ) -> Result<tonic::Response<pb::AcquireResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
    async fn acquire_batch(
        &self,
        request: tonic::Request<pb::AcquireBatchRequest>,
    ) -> Result<tonic::Response<pb::AcquireBatchResponse>, tonic::Status> {
        let n = request.get_ref().requests.len().saturating_sub(1);
        let allowed = pb::AcquireResponse { verdict: pb::Verdict::Allowed as i32, ..Default::default() };
        Ok(tonic::Response::new(pb::AcquireBatchResponse { responses: vec![allowed; n] }))
    }
    async fn report_outcome(
        &self,
        _: tonic::Request<pb::ReportOutcomeRequest>,
    ) -> Result<tonic::Response<pb::ReportOutcomeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
    async fn report_outcome_batch(
        &self,
        _: tonic::Request<pb::ReportOutcomeBatchRequest>,
    ) -> Result<tonic::Response<pb::ReportOutcomeBatchResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
    async fn charge(
        &self,
        _: tonic::Request<pb::ChargeRequest>,
    ) -> Result<tonic::Response<pb::ChargeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
    async fn lease(
        &self,
        _: tonic::Request<pb::LeaseRequest>,
    ) -> Result<tonic::Response<pb::LeaseResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
    async fn report_load(
        &self,
        _: tonic::Request<pb::ReportLoadRequest>,
    ) -> Result<tonic::Response<pb::ReportLoadResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
    type WatchStream = tokio_stream::Empty<Result<pb::WatchEvent, tonic::Status>>;
    async fn watch(
        &self,
        _: tonic::Request<pb::WatchRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
}

#[tokio::test]
async fn a_batch_answered_short_is_an_error_not_a_panic() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = floodgate_proto::v1::floodgate_server::FloodgateServer::new(ShortBatches);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    // A request timeout far above the default (25 ms): the first call also
    // connects, and on a machine whose cores are busy that can take longer;
    // the client then fails open and the short answer is never read.
    let c = Client::builder()
        .endpoint(format!("http://{addr}"))
        .watch_breakers(false)
        .request_timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap();
    let asks = [crate::Acquire::new("a"), crate::Acquire::new("b"), crate::Acquire::new("c")];
    let err = c.acquire_batch(&asks).await.expect_err("refused");
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert_eq!(err.to_string(), "the server's answer breaks the protocol: 3 questions in a batch got 2 answers");
}
