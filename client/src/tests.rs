//! Every builder that takes user input answers bad input with an error, never
//! a panic.

use crate::grpc::FloodgateGrpcLayer;
use crate::http::FloodgateLayer;
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
