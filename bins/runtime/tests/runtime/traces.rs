//! Trace export (`OTEL_EXPORTER_OTLP_ENDPOINT`) on the real binary: the €400 refund session
//! (approval required, approved, dispatched to the Rust refund worker) exported to an
//! in-process OTLP collector as one trace under the client's `traceparent`, with the worker
//! handed the dispatch span's context; and a collector that is down, which loses nothing and
//! delays nothing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use phrony_proto::runtime::v1 as pb;
use phrony_test_support::worker::RefundWorker;

use crate::metrics::{decide_pending, publish_refund_agent, run_refund, wait_for_status};
use crate::support::{Launch, agent_ref, free_port, sqlite_url};

/// The client's trace: W3C `traceparent` version 00, sampled.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN_ID: &str = "00f067aa0ba902b7";

/// The spans (with their resource's `service.name`) a fake OTLP/gRPC collector received.
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
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| attr(&r.attributes, "service.name"))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Serves on a free loopback port; returns its `http://` endpoint.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        format!("http://{addr}")
    }

    fn spans(&self) -> Vec<(String, Span)> {
        self.spans.lock().unwrap().clone()
    }
}

/// An attribute's value as text (strings, integers, booleans, doubles).
fn attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(text)
}

fn text(value: &AnyValue) -> Option<String> {
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn span_attr(span: &Span, key: &str) -> String {
    attr(&span.attributes, key)
        .unwrap_or_else(|| panic!("span {:?} has no {key}: {:?}", span.name, span.attributes))
}

/// The spans named `name`, in start order.
fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    let mut found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    found.sort_by_key(|s| s.start_time_unix_nano);
    found
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(
        found.len(),
        1,
        "expected one {name:?} span, got {}: {:#?}",
        found.len(),
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    found[0]
}

fn parent_of<'a>(spans: &'a [Span], child: &Span) -> &'a Span {
    spans
        .iter()
        .find(|s| s.span_id == child.parent_span_id)
        .unwrap_or_else(|| panic!("the parent of {:?} was not exported", child.name))
}

// Several threads: the in-process collector must keep receiving the daemon's exports while
// this test's thread blocks on the daemon's exit (`terminate` waits synchronously). On one
// thread the collector starved there and the last batches (the resumed session's span) were
// lost whenever they had not arrived before: a flake under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_governed_session_is_one_trace_under_the_clients_traceparent() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let mut daemon = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        // To see the driver park (a debug line).
        .env("RUNTIME_LOG", "info,phrony_engine::driver=debug")
        .start()
        .await;
    let mut client = daemon.client().await;
    // 400 EUR: over the approval boundary.
    publish_refund_agent(&mut client, home.path(), "refund-agent", 400, None).await;
    let worker = RefundWorker::start(&daemon.addr, "trace-worker");
    let mut request = tonic::Request::new(pb::RunSessionRequest {
        agent_ref: Some(agent_ref("")),
        input: br#"{"message": "Refund 400 EUR for ORD-1, the item arrived damaged."}"#.to_vec(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CLIENT_SPAN_ID}-01")
            .parse()
            .unwrap(),
    );
    let session_id = client
        .run_session(request)
        .await
        .unwrap()
        .into_inner()
        .session_id;
    wait_for_status(&mut client, &session_id, "awaiting_approval", None).await;
    let parking = Instant::now();
    while !daemon.stderr().contains("session parked until a decision") {
        assert!(
            parking.elapsed() < Duration::from_secs(30),
            "the session did not park: {}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let approval = client
        .list_approvals(pb::ListApprovalsRequest {
            session_id: session_id.clone(),
            status: "pending".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .approvals
        .remove(0);
    decide_pending(
        &mut client,
        &session_id,
        pb::ApprovalDecision::Approve,
        "ok",
    )
    .await;
    wait_for_status(&mut client, &session_id, "completed", None).await;
    assert_eq!(worker.invocations().len(), 1);
    let context = worker
        .trace_context(&approval.call_id)
        .unwrap_or_else(|| panic!("the worker saw no call {}", approval.call_id));
    // Its stream would hold the daemon's graceful stop.
    crate::support::stop_worker(worker).await;
    drop(client);
    // The last spans are flushed on the way out.
    assert!(daemon.terminate().await.success(), "{}", daemon.stderr());
    let stderr = daemon.stderr();
    assert!(
        stderr.contains(&format!("trace export on: OTLP/gRPC to {endpoint}")),
        "{stderr}"
    );
    // The engine's spans stay out of the log lines.
    assert!(!stderr.contains("phrony.session{"), "{stderr}");

    let exported = collector.spans();
    assert!(
        exported
            .iter()
            .all(|(service, _)| service == "phrony-runtime"),
        "service.name: {:?}",
        exported.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );
    // Nothing the caller or the model said, and no argument, is in an attribute.
    for (_, span) in &exported {
        for kv in &span.attributes {
            let value = kv.value.as_ref().and_then(text).unwrap_or_default();
            for secret in ["ORD-1", "damaged", "Refund 400", "400 EUR"] {
                assert!(
                    !value.contains(secret),
                    "span {:?} attribute {} = {value:?} quotes {secret:?}",
                    span.name,
                    kv.key
                );
            }
        }
    }
    let trace_id = hex::decode(TRACE_ID).unwrap();
    let spans: Vec<Span> = exported
        .into_iter()
        .map(|(_, s)| s)
        .filter(|s| s.trace_id == trace_id)
        .collect();

    // RunSession's server span is the child of the client's span.
    let rpc = spans
        .iter()
        .find(|s| {
            s.name == "rpc"
                && attr(&s.attributes, "method").as_deref()
                    == Some("/phrony.runtime.v1.Runtime/RunSession")
        })
        .unwrap_or_else(|| panic!("no RunSession span in the client's trace: {spans:#?}"));
    assert_eq!(hex::encode(&rpc.parent_span_id), CLIENT_SPAN_ID);

    // The session ran twice: until it parked for the approval, then from the decision on
    // (the second run continues the first's trace).
    let sessions = named(&spans, "phrony.session");
    assert_eq!(
        sessions.len(),
        2,
        "{:#?}\n{}",
        spans
            .iter()
            .map(|s| (&s.name, &s.attributes))
            .collect::<Vec<_>>(),
        stderr
    );
    let (first, second) = (sessions[0], sessions[1]);
    assert_eq!(first.parent_span_id, rpc.span_id);
    assert_eq!(second.parent_span_id, first.span_id);
    for session in [first, second] {
        assert_eq!(span_attr(session, "phrony.session.id"), session_id);
        assert_eq!(span_attr(session, "phrony.agent"), "support/refund-agent");
        assert_eq!(span_attr(session, "phrony.agent.version"), "0.1.0");
    }
    assert_eq!(span_attr(first, "phrony.session.outcome"), "parked");
    assert_eq!(span_attr(second, "phrony.session.outcome"), "ended");

    // Turn → model call with the GenAI attributes and token counts.
    let turns = named(&spans, "phrony.turn");
    assert!(turns.iter().all(|t| span_attr(t, "phrony.turn") == "1"));
    let chats = named(&spans, "chat scripted");
    assert_eq!(chats.len(), 2, "one completion before the call, one after");
    for chat in &chats {
        assert_eq!(parent_of(&spans, chat).name, "phrony.turn");
        assert_eq!(span_attr(chat, "gen_ai.operation.name"), "chat");
        assert_eq!(span_attr(chat, "gen_ai.provider.name"), "stub");
        assert_eq!(span_attr(chat, "gen_ai.system"), "stub");
        assert_eq!(span_attr(chat, "gen_ai.request.model"), "scripted");
        let input: u64 = span_attr(chat, "gen_ai.usage.input_tokens")
            .parse()
            .unwrap();
        assert!(input > 0, "input tokens {input}");
        span_attr(chat, "gen_ai.usage.output_tokens")
            .parse::<u64>()
            .unwrap();
    }
    assert_eq!(
        span_attr(chats[0], "gen_ai.response.finish_reasons"),
        "tool_use"
    );

    // The policy decision, with the deciding policy's ref.
    let decision = one(&spans, "phrony.policy.decision");
    assert_eq!(parent_of(&spans, decision).parent_span_id, first.span_id);
    assert_eq!(span_attr(decision, "phrony.decision"), "require_approval");
    assert_eq!(
        span_attr(decision, "phrony.policy"),
        "payments/refund-approval-boundary@1.0.0"
    );
    assert_eq!(
        span_attr(decision, "phrony.tool"),
        "payments.issue-refund@1.0.0"
    );
    let call_id = span_attr(decision, "phrony.call.id");
    assert_eq!(call_id, approval.call_id);

    // The approval wait ended when the session parked.
    let wait = one(&spans, "phrony.approval.wait");
    assert_eq!(span_attr(wait, "phrony.approval.id"), approval.id);
    assert_eq!(span_attr(wait, "phrony.call.id"), call_id);
    assert_eq!(span_attr(wait, "phrony.approval.outcome"), "parked");

    // The dispatch, in the resumed run.
    let dispatch = one(&spans, "phrony.dispatch");
    assert_eq!(parent_of(&spans, dispatch).parent_span_id, second.span_id);
    assert_eq!(
        span_attr(dispatch, "phrony.tool"),
        "payments.issue-refund@1.0.0"
    );
    assert_eq!(span_attr(dispatch, "phrony.call.id"), call_id);
    assert_eq!(span_attr(dispatch, "phrony.worker.id"), "trace-worker");
    assert_eq!(span_attr(dispatch, "phrony.dispatch.outcome"), "success");
    assert_eq!(span_attr(dispatch, "phrony.dispatch.attempts"), "1");
    span_attr(dispatch, "phrony.dispatch.queue_wait_ms")
        .parse::<u64>()
        .unwrap();
    span_attr(dispatch, "phrony.dispatch.execution_ms")
        .parse::<u64>()
        .unwrap();

    // The worker was handed the dispatch span's context.
    assert_eq!(
        context.get("traceparent").map(String::as_str),
        Some(format!("00-{TRACE_ID}-{}-01", hex::encode(&dispatch.span_id)).as_str()),
        "{context:?}"
    );
}

#[tokio::test]
async fn a_collector_that_is_down_loses_and_delays_nothing() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    // Nothing listens there.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let mut daemon = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .start()
        .await;
    let mut client = daemon.client().await;
    // 40 EUR: allowed at once.
    publish_refund_agent(&mut client, home.path(), "refund-agent", 40, None).await;
    let worker = RefundWorker::start(&daemon.addr, "down-worker");
    let mut ids = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let id = run_refund(&mut client, "refund-agent", "Refund 40 EUR for ORD-1.").await;
        wait_for_status(&mut client, &id, "completed", None).await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a session took {:?}",
            started.elapsed()
        );
        ids.push(id);
    }
    assert_eq!(worker.invocations().len(), 3, "every call ran once");
    let sessions = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    for id in &ids {
        assert!(
            sessions
                .iter()
                .any(|s| &s.id == id && s.status == "completed"),
            "{id} not completed: {sessions:?}"
        );
    }
    crate::support::stop_worker(worker).await;
    // An open client connection would hold the graceful stop for its grace period.
    drop(client);
    assert!(daemon.terminate().await.success(), "{}", daemon.stderr());
    let exited = chrono::Utc::now();
    // After the server stopped, the last flush gives up within `telemetry::FLUSH_TIMEOUT` (3 s).
    let stderr = daemon.stderr();
    let stopped = stderr
        .lines()
        .find(|l| l.ends_with("INFO stopped"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("no stop line: {stderr}"));
    let flushing = exited.signed_duration_since(stopped);
    assert!(
        flushing < chrono::Duration::milliseconds(4500),
        "the daemon exited {flushing} after its server stopped: {stderr}"
    );
    assert!(
        daemon
            .stderr()
            .contains(&format!("trace export on: OTLP/gRPC to {endpoint}")),
        "{}",
        daemon.stderr()
    );
}

#[tokio::test]
async fn without_otel_variables_nothing_is_exported_and_bad_ones_stop_the_start() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let mut daemon = Launch::new(home.path(), Some(&url)).start().await;
    assert!(daemon.terminate().await.success(), "{}", daemon.stderr());
    assert!(
        daemon.stderr().contains("trace export off"),
        "{}",
        daemon.stderr()
    );

    let (status, stderr) = Launch::new(home.path(), Some(&url))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .run(&[]);
    assert!(!status.success());
    assert!(
        stderr.contains(
            "phrony-runtime: error: invalid OTEL_EXPORTER_OTLP_PROTOCOL=\"http/protobuf\""
        ),
        "{stderr}"
    );
}
