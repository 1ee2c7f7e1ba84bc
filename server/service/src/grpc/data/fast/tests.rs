//! The plain unary path against tonic's own on the same requests: the
//! generated `Acquire` (tonic's `Grpc::unary` over prost) and ours must
//! answer every body alike: the same status, the same message.

use std::sync::Arc;

use floodgate_proto::v1 as pb;
use http_body_util::BodyExt;
use pb::floodgate_server::FloodgateServer;
use prost::Message;
use tower::Service;

use crate::decider::Decider;
use crate::engine::{Engine, EngineConfig};
use crate::grpc::data::{DataPlane, DataPlaneService};
use crate::rules::RuleSet;

const RULES: &str = "resources:\n  - name: api\n    limits: [ { name: all, key: [user], algorithm: fixed_window, limit: 1000, window: 1h } ]\n";

fn decider() -> Arc<Decider> {
    let engine = Arc::new(Engine::new(EngineConfig { max_keys: 1000 }, Arc::new(crate::time::SystemClock::new())));
    engine.control().install(RuleSet::from_yaml(RULES, "t").unwrap(), RULES.into(), "t".into());
    Arc::new(Decider::new(engine, None))
}

/// What a client sees: the status (from the headers of a trailers-only
/// answer, else the trailers), its message, and the answer's bytes.
async fn seen(response: http::Response<tonic::body::Body>) -> (i32, String, Vec<u8>) {
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("a body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let status = tonic::Status::from_header_map(&parts.headers)
        .or_else(|| tonic::Status::from_header_map(&trailers))
        .expect("a grpc-status");
    assert_eq!(parts.headers.get("content-type").map(|v| v.as_bytes()), Some(&b"application/grpc"[..]));
    (status.code() as i32, status.message().to_string(), collected.to_bytes().to_vec())
}

fn request(frames: &[&[u8]], encoding: Option<&str>) -> http::Request<tonic::body::Body> {
    let chunks: Vec<Result<http_body::Frame<bytes::Bytes>, tonic::Status>> =
        frames.iter().map(|f| Ok(http_body::Frame::data(bytes::Bytes::copy_from_slice(f)))).collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
    let mut b = http::Request::post("/floodgate.v1.Floodgate/Acquire").header("content-type", "application/grpc");
    if let Some(e) = encoding {
        b = b.header("grpc-encoding", e);
    }
    b.body(tonic::body::Body::new(body)).unwrap()
}

fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend((message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

#[tokio::test]
async fn every_body_is_answered_as_tonic_answers_it() {
    let decider = decider();
    let mut generated = FloodgateServer::new(DataPlane::new(decider.clone(), 1));
    let mut fast = DataPlaneService::new(decider, 1, 1 << 20);
    let ok = pb::AcquireRequest {
        resource: "api".into(),
        descriptors: [("user".into(), "u".into())].into(),
        ..Default::default()
    }
    .encode_to_vec();
    let unknown = pb::AcquireRequest { resource: "unknown".into(), ..Default::default() }.encode_to_vec();
    let bad_priority =
        pb::AcquireRequest { resource: "api".into(), priority: 99, ..Default::default() }.encode_to_vec();
    let whole = framed(0, &unknown);
    // (what, the body's data frames, grpc-encoding)
    type Case<'a> = (&'a str, Vec<Vec<u8>>, Option<&'a str>);
    // A call refused for what follows its message is not handled: `ok`
    // first would take from the bucket the last call compares.
    let cases: Vec<Case<'_>> = vec![
        ("one message", vec![framed(0, &unknown)], None),
        ("in two frames", vec![whole[..3].to_vec(), whole[3..].to_vec()], None),
        ("two messages, the second ignored", vec![[framed(0, &unknown), framed(0, &ok)].concat()], None),
        ("then trailing bytes", vec![[framed(0, &ok), vec![0, 0]].concat()], None),
        ("then a cut message", vec![[framed(0, &ok), framed(0, &ok)[..9].to_vec()].concat()], None),
        ("then an undecodable one", vec![[framed(0, &ok), framed(0, &[0xff, 0xff])].concat()], None),
        ("then a bad flag", vec![[framed(0, &ok), framed(7, &ok)].concat()], None),
        ("then a compressed one", vec![framed(0, &ok), framed(1, &ok)], None),
        ("then bad input", vec![framed(0, &unknown), framed(0, &bad_priority)], None),
        ("an empty message", vec![framed(0, &[])], None),
        ("no message", vec![], None),
        ("a cut header", vec![vec![0, 0, 0]], None),
        ("a cut message", vec![framed(0, &unknown)[..8].to_vec()], None),
        ("compressed, no encoding", vec![framed(1, &unknown)], None),
        ("compressed with gzip", vec![framed(1, &unknown)], Some("gzip")),
        ("a bad flag", vec![framed(7, &unknown)], None),
        ("undecodable", vec![framed(0, &[0xff, 0xff])], None),
        ("bad input", vec![framed(0, &bad_priority)], None),
    ];
    for (what, frames, encoding) in cases {
        let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let theirs = seen(generated.call(request(&frames, encoding)).await.unwrap()).await;
        let ours = seen(fast.call(request(&frames, encoding)).await.unwrap()).await;
        assert_eq!(ours.0, theirs.0, "{what}: the status code ({ours:?} against tonic's {theirs:?})");
        if ours.0 == tonic::Code::Internal as i32 {
            assert_eq!(ours.1, theirs.1, "{what}: the message");
        }
        assert_eq!(ours.2, theirs.2, "{what}: the answer's bytes");
        if ours.0 == tonic::Code::InvalidArgument as i32 {
            assert_eq!(ours.1, theirs.1, "{what}: the message names the field");
        }
    }
    // An admitted call: the same answer (permits and all).
    let theirs = seen(generated.call(request(&[&framed(0, &ok)], None)).await.unwrap()).await;
    let ours = seen(fast.call(request(&[&framed(0, &ok)], None)).await.unwrap()).await;
    let decode = |b: &[u8]| pb::AcquireResponse::decode(&b[5..]).unwrap();
    let (t, o) = (decode(&theirs.2), decode(&ours.2));
    assert_eq!(
        (o.verdict, o.limits.len(), o.limits[0].remaining + 1),
        (t.verdict, t.limits.len(), t.limits[0].remaining)
    );
}
