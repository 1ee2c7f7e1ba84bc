//! Traces through the real binary: a small OTLP collector (the OTLP/gRPC
//! TraceService, in this test) receives a span per call; a call carrying a
//! W3C traceparent becomes a child of the caller's span, in the caller's
//! trace, with the method, status code and verdict; calls without one are not
//! traced at the default sample ratio.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use support::*;

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|a| a.key == "service.name")
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| match a.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    })
}

const RULES: &str = r#"
resources:
  - name: orders
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 1, window: 1h }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_a_traceparent_is_a_span_of_the_callers_trace() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(collector.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);

    let dir = TempDir::new();
    let endpoint = format!("http://{addr}");
    let fg =
        floodgate().args(["--config", path_str(&dir.write("rules.yaml", RULES)), "--otlp-endpoint", &endpoint]).start();
    let mut c = fg.client().await;

    // Not traced: no traceparent, and the default ratio traces no new trace.
    c.acquire(acquire("orders", &[("user", "untraced")], 1)).await.unwrap();
    // Traced: the caller's trace, sampled; then a denial in another one.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    for (trace, user) in [(trace_id, "u1"), ("0af7651916cd43dd8448eb211c80319c", "u1")] {
        let mut req = tonic::Request::new(acquire("orders", &[("user", user)], 1));
        let traceparent = format!("00-{trace}-{parent}-01").parse().unwrap();
        req.metadata_mut().insert("traceparent", traceparent);
        c.acquire(req).await.unwrap();
    }
    // Sampled off by the caller: not traced.
    let mut req = tonic::Request::new(acquire("orders", &[("user", "u9")], 1));
    req.metadata_mut()
        .insert("traceparent", "00-11111111111111111111111111111111-2222222222222222-00".parse().unwrap());
    c.acquire(req).await.unwrap();

    eventually("two spans exported", Duration::from_secs(30), || async {
        (collector.spans.lock().unwrap().len() >= 2).then_some(())
    })
    .await;
    // A little longer, in case an untraced call was exported after all.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let spans = collector.spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 2, "only the two sampled calls: {spans:#?}");
    let (service, span) = spans.iter().find(|(_, s)| hex(&s.trace_id) == trace_id).expect("the caller's trace");
    assert_eq!(service, "floodgate");
    assert_eq!(hex(&span.parent_span_id), parent, "a child of the caller's span");
    assert_eq!(span.name, "floodgate.v1.Floodgate/Acquire");
    assert_eq!(span.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(attribute(span, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(attribute(span, "rpc.method").as_deref(), Some("Acquire"));
    assert_eq!(attribute(span, "rpc.grpc.status_code").as_deref(), Some("0"));
    assert_eq!(attribute(span, "floodgate.verdict").as_deref(), Some("VERDICT_ALLOWED"));
    assert!(span.end_time_unix_nano > span.start_time_unix_nano);
    let (_, denied) = spans.iter().find(|(_, s)| hex(&s.trace_id) != trace_id).unwrap();
    assert_eq!(attribute(denied, "floodgate.verdict").as_deref(), Some("VERDICT_RATE_LIMITED"));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
