//! The decision API as JSON over HTTP: `POST /v1/acquire` and the other
//! unary calls of the data plane and Admin, for callers that have an HTTP
//! client and no gRPC stubs.
//!
//! A call here is a gRPC call made inside the server: the JSON body is read
//! into the gRPC request message (the proto3 JSON mapping), encoded, and sent
//! through the same layers and services as a call on the gRPC port, with the
//! caller's `Authorization` header and connection (its mTLS certificate is
//! its origin). So the decisions, the Admin tokens, the size caps and the
//! metrics are those of gRPC; only the encoding differs. The answer is the
//! gRPC response in the same mapping. A gRPC error becomes the HTTP status
//! that Google's API design gives its code, with `{"code", "message"}`.
//!
//! The port is also the console's, which a browser may show. A page of
//! another site must not spend anyone's quota through a visitor's browser,
//! so a call must be `application/json` and, when the browser names where it
//! comes from (`Origin`, `Sec-Fetch-Site`), come from this server itself.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, BytesMut};
use http_body_util::BodyExt;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};
use serde_json::json;
use tower::ServiceExt;

use super::HttpState;
use crate::grpc::rpc::Rpc;
use crate::listen::Peer;
use crate::metrics::code_name;
use tonic::Code;

/// The gRPC port's service with its layers, as the HTTP API calls it.
pub type GrpcService =
    tower::util::BoxCloneSyncService<http::Request<tonic::body::Body>, http::Response<tonic::body::Body>, Infallible>;

/// The data plane's calls, by the name after `/v1/`. Admin's unary calls
/// are under `/v1/admin/`, named by their method in kebab case.
const DATA_PLANE: &[(&str, Rpc)] = &[
    ("acquire", Rpc::Acquire),
    ("acquire-batch", Rpc::AcquireBatch),
    ("report", Rpc::ReportOutcome),
    ("report-batch", Rpc::ReportOutcomeBatch),
    ("charge", Rpc::Charge),
    ("lease", Rpc::Lease),
    ("report-load", Rpc::ReportLoad),
];

/// A JSON body may be this many times the gRPC cap of its call: JSON spells
/// out field names and numbers, so the same request is larger.
const JSON_FACTOR: usize = 2;

/// Decoding a JSON body into a message takes up to this many times the
/// body's bytes (the message's fields, maps and strings, and the encoded
/// request): held from the budget too, so that many large bodies at once
/// are refused rather than decoded together.
const DECODE_FACTOR: usize = 8;

/// What the HTTP API needs: the gRPC service it calls, the messages' types,
/// and a byte budget for the bodies being read and decoded at once.
#[derive(Clone)]
pub struct Api {
    grpc: GrpcService,
    /// Each call's RPC and message types, by its path after `/v1/`.
    routes: Arc<std::collections::HashMap<String, Route>>,
    /// The OpenAPI document, made once from the same descriptors.
    openapi: Arc<serde_json::Value>,
    bodies: Arc<tokio::sync::Semaphore>,
    max_bodies: usize,
    /// The longest a body may take to arrive.
    body_timeout: Duration,
}

impl Api {
    /// `max_bodies`: bytes of request bodies (and of their decoding) held
    /// at once, across calls; `body_timeout`: the longest a body may take
    /// to arrive.
    pub fn new(grpc: GrpcService, max_bodies: usize, body_timeout: Duration) -> anyhow::Result<Api> {
        let pool = DescriptorPool::decode(floodgate_proto::FILE_DESCRIPTOR_SET)?;
        let max_bodies = max_bodies.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        let bodies = Arc::new(tokio::sync::Semaphore::new(max_bodies));
        let mut routes = std::collections::HashMap::new();
        for (name, rpc) in calls() {
            let (input, output) =
                types(&pool, rpc).ok_or_else(|| anyhow::anyhow!("{} is not in the protos", rpc.path()))?;
            routes.insert(name, Route { rpc, input, output });
        }
        let openapi = Arc::new(super::openapi::document(&pool, &calls(), |rpc| types(&pool, rpc)));
        Ok(Api { grpc, routes: Arc::new(routes), openapi, bodies, max_bodies, body_timeout })
    }
}

/// One call of the API.
struct Route {
    rpc: Rpc,
    input: MessageDescriptor,
    output: MessageDescriptor,
}

/// The input and output types of `rpc` in `pool`.
fn types(pool: &DescriptorPool, rpc: Rpc) -> Option<(MessageDescriptor, MessageDescriptor)> {
    let (service, method) = rpc.path().strip_prefix('/')?.split_once('/')?;
    let method = pool.get_service_by_name(service)?.methods().find(|m| m.name() == method)?;
    Some((method.input(), method.output()))
}

/// Every call the HTTP API serves: its path after `/v1/`, and its RPC.
pub fn calls() -> Vec<(String, Rpc)> {
    let mut calls: Vec<(String, Rpc)> = DATA_PLANE.iter().map(|(name, rpc)| (name.to_string(), *rpc)).collect();
    for rpc in Rpc::ALL {
        if let Some(method) = rpc.label().strip_prefix("Admin/") {
            calls.push((format!("admin/{}", kebab(method)), *rpc));
        }
    }
    calls
}

/// `GetRules` as `get-rules`.
fn kebab(method: &str) -> String {
    let mut out = String::with_capacity(method.len() + 4);
    for (i, c) in method.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// `POST /v1/{call}`.
pub(super) async fn call(State(state): State<HttpState>, req: Request) -> Response {
    let Some(api) = state.api.clone() else {
        return error(StatusCode::NOT_FOUND, Code::NotFound, "the JSON API is not served by this server".into());
    };
    let name = req.uri().path().strip_prefix("/v1/").unwrap_or_default();
    let Some(route) = api.routes.get(name) else {
        let shown: String = name.chars().take(100).flat_map(char::escape_default).collect();
        let known: Vec<String> = calls().into_iter().map(|(n, _)| n).collect();
        let message = format!("no call '/v1/{shown}'; the calls are /v1/ and one of: {}", known.join(", "));
        return error(StatusCode::NOT_FOUND, Code::NotFound, message);
    };
    let (rpc, name) = (route.rpc, name.to_string());
    if let Err((status, why)) = super::site::check_action(&req) {
        let peer = req.extensions().get::<Peer>().and_then(|p| p.addr).map(|a| a.to_string()).unwrap_or_default();
        if let Some(suppressed) = state.access.refusal_logged() {
            let method = rpc.label();
            tracing::warn!(target: "floodgate::audit", peer, method, reason = why.as_str(), suppressed, "JSON call refused");
        }
        return match status {
            StatusCode::FORBIDDEN => refuse(rpc, status, Code::PermissionDenied, why),
            _ => refuse(
                rpc,
                status,
                Code::InvalidArgument,
                "Content-Type: a call must be sent as application/json".into(),
            ),
        };
    }
    let (input, output) = (route.input.clone(), route.output.clone());
    let cap = rpc.cap().saturating_mul(JSON_FACTOR);
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    // A body is held with what decoding it takes: one that needs more than
    // the whole budget could never be decoded, so it is refused as too
    // large rather than told to retry.
    let cap = cap.min(api.max_bodies / (1 + DECODE_FACTOR));
    if declared.is_some_and(|n| n > cap) {
        return too_large(rpc, &name, cap);
    }
    let (parts, body) = req.into_parts();
    let mut held = Held { bodies: api.bodies.clone(), permit: None };
    let body = match read_body(body, cap, &mut held, api.body_timeout).await {
        Ok(body) => body,
        Err(Unread::TooLarge) => return too_large(rpc, &name, cap),
        Err(Unread::Budget) => return budget_spent(rpc, api.max_bodies),
        Err(Unread::Late) => {
            let message = format!("the body did not arrive within {:?}", api.body_timeout);
            return refuse(rpc, StatusCode::REQUEST_TIMEOUT, Code::DeadlineExceeded, message);
        }
        Err(Unread::Broken(e)) => {
            return refuse(rpc, StatusCode::BAD_REQUEST, Code::InvalidArgument, format!("body: {e}"));
        }
    };
    // Decoding takes several times the body's size: that is held too.
    if !held.take(body.len().saturating_mul(DECODE_FACTOR)) {
        return budget_spent(rpc, api.max_bodies);
    }
    let message = match from_json(&input, &body) {
        Ok(message) => message,
        Err(e) => return refuse(rpc, StatusCode::BAD_REQUEST, Code::InvalidArgument, e),
    };
    drop(body);
    let grpc_request = grpc_request(rpc, &parts.headers, parts.extensions.get::<Peer>(), &message.encode_to_vec());
    let Ok(answer) = api.grpc.oneshot(grpc_request).await;
    let (head, body) = answer.into_parts();
    let collected = match body.collect().await {
        Ok(collected) => collected,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, Code::Internal, format!("reading the answer: {e}")),
    };
    let trailers = collected.trailers().cloned();
    let status = trailers
        .as_ref()
        .and_then(tonic::Status::from_header_map)
        .or_else(|| tonic::Status::from_header_map(&head.headers));
    if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
        return grpc_error(&status);
    }
    let bytes = collected.to_bytes();
    let Some(payload) = unframe(&bytes) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, Code::Internal, "the answer is not one gRPC message".into());
    };
    let answer = answer_json(rpc, &output, payload);
    drop(held);
    answer
}

/// Bytes taken from the API's budget for one call, given back when it ends.
struct Held {
    bodies: Arc<tokio::sync::Semaphore>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Held {
    /// Takes `n` more bytes, if the budget has them now.
    fn take(&mut self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let Ok(more) = self.bodies.clone().try_acquire_many_owned(u32::try_from(n).unwrap_or(u32::MAX)) else {
            return false;
        };
        match &mut self.permit {
            Some(p) => p.merge(more),
            None => self.permit = Some(more),
        }
        true
    }
}

/// Why a body was not read whole.
enum Unread {
    TooLarge,
    Budget,
    Late,
    Broken(axum::Error),
}

/// Reads a body of at most `cap` bytes within `timeout`, taking each part
/// from the budget as it arrives: a body that has not arrived holds only
/// what did, so slow senders cannot hold the budget with promises.
async fn read_body(body: Body, cap: usize, held: &mut Held, timeout: Duration) -> Result<Vec<u8>, Unread> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.as_mut().frame()).await {
            Err(_) => return Err(Unread::Late),
            Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => return Err(Unread::Broken(e)),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        if out.len() + data.len() > cap {
            return Err(Unread::TooLarge);
        }
        if !held.take(data.len()) {
            return Err(Unread::Budget);
        }
        out.extend_from_slice(&data);
    }
}

fn budget_spent(rpc: Rpc, max: usize) -> Response {
    let message = format!("the JSON API holds {max} bytes of bodies at once, its most; retry");
    refuse(rpc, StatusCode::TOO_MANY_REQUESTS, Code::ResourceExhausted, message)
}

/// An error answered before the gRPC call, counted as the call's would be.
fn refuse(rpc: Rpc, status: StatusCode, code: Code, message: String) -> Response {
    metrics::counter!(crate::metrics::RPC_REQUESTS, "method" => rpc.label(), "code" => code_name(code)).increment(1);
    error(status, code, message)
}

/// A JSON body as the gRPC message `input`; an empty body is `{}`. An
/// error names where in the body it is (`descriptors.user`,
/// `requests[2].cost`), and a field given twice in one object, under the
/// same name or under both of its names (`dryRun` and `dry_run`), is an
/// error rather than the last one winning.
fn from_json(input: &MessageDescriptor, body: &[u8]) -> Result<DynamicMessage, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DynamicMessage::new(input.clone()));
    }
    let at = |path: &serde_path_to_error::Path, e: &dyn std::fmt::Display| match path.to_string().as_str() {
        "." | "" | "?" => format!("body: {e}"),
        p => format!("{p}: {e}"),
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut track = serde_path_to_error::Track::new();
    let once = Once(Shape::Message(input.clone()));
    let checked =
        serde::de::DeserializeSeed::deserialize(once, serde_path_to_error::Deserializer::new(&mut de, &mut track));
    if let Err(e) = checked {
        return Err(at(&track.path(), &e));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut track = serde_path_to_error::Track::new();
    let message =
        DynamicMessage::deserialize(input.clone(), serde_path_to_error::Deserializer::new(&mut de, &mut track))
            .map_err(|e| at(&track.path(), &e))?;
    de.end().map_err(|e| format!("body: {e}"))?;
    Ok(message)
}

/// What a JSON value is expected to be, as far as keys given twice go.
#[derive(Clone)]
enum Shape {
    /// Anything: objects must name each key once.
    Any,
    /// A message: each field once, by either of its names.
    Message(MessageDescriptor),
    /// A map field: each key once, each value of this shape.
    Map(Box<Shape>),
    /// A repeated field: each element of this shape.
    List(Box<Shape>),
}

impl Shape {
    fn of_kind(kind: &prost_reflect::Kind) -> Shape {
        match kind {
            // The well-known types have JSON forms of their own.
            prost_reflect::Kind::Message(m) if !m.full_name().starts_with("google.protobuf.") => {
                Shape::Message(m.clone())
            }
            _ => Shape::Any,
        }
    }

    fn of_field(f: &prost_reflect::FieldDescriptor) -> Shape {
        if f.is_map() {
            let prost_reflect::Kind::Message(entry) = f.kind() else { return Shape::Any };
            return Shape::Map(Box::new(Shape::of_kind(&entry.map_entry_value_field().kind())));
        }
        let one = Shape::of_kind(&f.kind());
        if f.is_list() { Shape::List(Box::new(one)) } else { one }
    }
}

/// A JSON value of a [`Shape`] whose objects name each key (or field) once.
struct Once(Shape);

impl<'de> serde::de::DeserializeSeed<'de> for Once {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Once {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let element = match self.0 {
            Shape::List(element) => *element,
            _ => Shape::Any,
        };
        while seq.next_element_seed(Once(element.clone()))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let shown = |k: &str| k.chars().take(100).flat_map(char::escape_default).collect::<String>();
        let mut keys = std::collections::HashSet::new();
        let mut fields: std::collections::HashMap<u32, String> = std::collections::HashMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = match &self.0 {
                Shape::Message(m) => match m.get_field_by_json_name(&key).or_else(|| m.get_field_by_name(&key)) {
                    Some(f) => {
                        if let Some(first) = fields.insert(f.number(), key.clone())
                            && first != key
                        {
                            let message = format!("'{}' is given twice (also as '{}')", shown(&key), shown(&first));
                            return Err(serde::de::Error::custom(message));
                        }
                        Shape::of_field(&f)
                    }
                    // An unknown field: the decoding names it.
                    None => Shape::Any,
                },
                Shape::Map(value) => (**value).clone(),
                _ => Shape::Any,
            };
            if !keys.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("'{}' is given twice", shown(&key))));
            }
            map.next_value_seed(Once(value))?;
        }
        Ok(())
    }
}

/// The gRPC request for `rpc` carrying `message`, with the caller's
/// credentials and trace context, and its connection.
fn grpc_request(
    rpc: Rpc,
    headers: &HeaderMap,
    peer: Option<&Peer>,
    message: &[u8],
) -> http::Request<tonic::body::Body> {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put_slice(message);
    let mut req = http::Request::new(tonic::body::Body::new(http_body_util::Full::new(framed.freeze())));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = http::Uri::from_static(rpc.path());
    *req.version_mut() = http::Version::HTTP_2;
    let out = req.headers_mut();
    out.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    out.insert(header::TE, HeaderValue::from_static("trailers"));
    for name in [header::AUTHORIZATION.as_str(), "traceparent", "tracestate", "grpc-timeout"] {
        if let Some(value) = headers.get(name) {
            out.insert(header::HeaderName::from_static(name), value.clone());
        }
    }
    if let Some(peer) = peer {
        req.extensions_mut().insert(peer.clone());
    }
    req
}

/// The message of a unary gRPC answer, without its 5-byte prefix.
fn unframe(bytes: &[u8]) -> Option<&[u8]> {
    let (head, rest) = bytes.split_at_checked(5)?;
    let len = u32::from_be_bytes(head[1..5].try_into().ok()?) as usize;
    (head[0] == 0 && rest.len() == len).then_some(rest)
}

/// The answer as JSON, every field shown (a field at its default too, so a
/// client need not know proto3's defaults), with an Acquire's rate limit
/// headers.
fn answer_json(rpc: Rpc, output: &MessageDescriptor, payload: &[u8]) -> Response {
    let message = match DynamicMessage::decode(output.clone(), payload) {
        Ok(message) => message,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, Code::Internal, format!("decoding the answer: {e}")),
    };
    let options = SerializeOptions::new().skip_default_fields(false);
    let mut text = Vec::with_capacity(payload.len() * 2 + 64);
    let mut ser = serde_json::Serializer::new(&mut text);
    if let Err(e) = message.serialize_with_options(&mut ser, &options) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, Code::Internal, format!("encoding the answer: {e}"));
    }
    let mut response = (StatusCode::OK, Body::from(text)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if rpc == Rpc::Acquire
        && let Ok(mut acquired) = floodgate_proto::v1::AcquireResponse::decode(payload)
    {
        // The fields the client crate's HTTP layer sets, from the same
        // code. A shadow limit is reported, never enforced: it is not one
        // of the caller's limits.
        acquired.limits.retain(|l| !l.shadow);
        floodgate_client::http::rate_limit_headers(&floodgate_client::Decision::from_answer(acquired), headers);
    }
    response
}

fn too_large(rpc: Rpc, name: &str, cap: usize) -> Response {
    let message = format!(
        "the body is over {cap} bytes, the most that /v1/{name} takes (twice the gRPC call's cap, and a ninth of \
         --max-unfinished-request-bytes at most)"
    );
    refuse(rpc, StatusCode::PAYLOAD_TOO_LARGE, Code::ResourceExhausted, message)
}

/// A gRPC error as HTTP, by the mapping of Google's API design guide.
fn grpc_error(status: &tonic::Status) -> Response {
    use tonic::Code::*;
    let http = match status.code() {
        Ok => StatusCode::OK,
        Cancelled => StatusCode::from_u16(499).expect("valid"),
        InvalidArgument | FailedPrecondition | OutOfRange => StatusCode::BAD_REQUEST,
        DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        NotFound => StatusCode::NOT_FOUND,
        AlreadyExists | Aborted => StatusCode::CONFLICT,
        PermissionDenied => StatusCode::FORBIDDEN,
        Unauthenticated => StatusCode::UNAUTHORIZED,
        ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Unknown | Internal | DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(http, status.code(), status.message().to_string())
}

/// `{"code": CODE, "message": message}` with `status`, the code written as
/// gRPC writes it (`INVALID_ARGUMENT`).
fn error(status: StatusCode, code: Code, message: String) -> Response {
    super::reply::json_response(status, json!({ "code": code_name(code), "message": message }))
}

/// `GET /v1/openapi.json`: the API described from the protos.
pub(super) async fn openapi(State(state): State<HttpState>) -> Response {
    let Some(api) = state.api.as_ref() else {
        return error(StatusCode::NOT_FOUND, Code::NotFound, "the JSON API is not served by this server".into());
    };
    super::reply::json_response(StatusCode::OK, (*api.openapi).clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_named_in_kebab_case_and_each_names_one_rpc() {
        let calls = calls();
        assert!(calls.iter().any(|(n, r)| n == "admin/get-rules" && *r == Rpc::GetRules));
        assert!(calls.iter().any(|(n, r)| n == "admin/set-degradation-level" && *r == Rpc::SetDegradationLevel));
        assert!(calls.iter().any(|(n, r)| n == "acquire" && *r == Rpc::Acquire));
        let mut names: Vec<_> = calls.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), calls.len(), "a name is served once");
        assert!(!calls.iter().any(|(_, r)| *r == Rpc::Watch), "a stream is not a JSON call");
    }

    #[test]
    fn every_call_has_types_in_the_protos() {
        let grpc = tower::util::BoxCloneSyncService::new(tower::service_fn(|_req| async {
            Ok::<_, Infallible>(http::Response::new(tonic::body::Body::empty()))
        }));
        let api = Api::new(grpc, 1 << 20, Duration::from_secs(1)).unwrap();
        for (name, rpc) in calls() {
            assert!(api.routes.get(&name).is_some_and(|r| r.rpc == rpc), "{name}");
        }
    }

    #[test]
    fn a_message_is_unframed_only_when_whole() {
        assert_eq!(unframe(&[0, 0, 0, 0, 2, 7, 8]), Some(&[7u8, 8][..]));
        assert_eq!(unframe(&[0, 0, 0, 0, 3, 7, 8]), None);
        assert_eq!(unframe(&[1, 0, 0, 0, 2, 7, 8]), None, "compressed");
        assert_eq!(unframe(&[0, 0]), None);
    }
}
