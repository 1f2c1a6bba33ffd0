//! Model provider faults, end to end through the engine: the production provider factory talks
//! HTTP to a local fake vendor API that misbehaves on command (refused connections, rate limits,
//! server errors, cut and stalled streams, malformed or unknown tool calls, oversized answers,
//! refusals, a wrong content type). Each fault has one defined session outcome, and the event log
//! never holds half of a model turn: a turn that failed records no `model.completion`, no
//! `tool.requested` and nothing reaches the worker.

use std::sync::Arc;
use std::time::Duration;

use phrony_engine::{DefaultProviderFactory, ManualClock, ProviderFactory};
use phrony_ledger::{Event, SessionStatus};
use phrony_providers::{BuildOptions, ProviderEnv, RetryPolicy};
use phrony_test_support::fake_api::{FakeServer, Reply, anthropic_sse, openai_sse};
use serde_json::{Value, json};

use crate::common::{AgentOptions, Harness, Script, memory_store, refund_agent, test_config};

/// The vendor whose wire format the fake server speaks.
#[derive(Clone, Copy, Debug)]
enum Vendor {
    OpenAi,
    Anthropic,
}

/// Retries fast, a short idle timeout (a stalled stream fails in well under a second).
fn options() -> BuildOptions {
    BuildOptions {
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            ..RetryPolicy::default()
        },
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_millis(400),
        ..BuildOptions::default()
    }
}

/// What one faulty run left behind.
struct Outcome {
    status: SessionStatus,
    error: String,
    events: Vec<Event>,
    /// Request bodies the vendor received, in order.
    requests: Vec<Value>,
    /// Tools the worker was invoked for.
    invoked: Vec<String>,
}

impl Outcome {
    fn types(&self) -> Vec<&str> {
        self.events.iter().map(|e| e.event_type.as_str()).collect()
    }

    fn count(&self, event_type: &str) -> usize {
        self.types().iter().filter(|t| **t == event_type).count()
    }

    /// The tool results (text, is_error) the vendor was sent in its last request.
    fn last_tool_results(&self, vendor: Vendor) -> Vec<(String, bool)> {
        let Some(last) = self.requests.last() else {
            return Vec::new();
        };
        let messages = last["messages"].as_array().cloned().unwrap_or_default();
        match vendor {
            Vendor::OpenAi => messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| (content_text(&m["content"]), false))
                .collect(),
            Vendor::Anthropic => messages
                .iter()
                .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
                .filter(|b| b["type"] == "tool_result")
                .map(|b| {
                    (
                        content_text(&b["content"]),
                        b["is_error"].as_bool().unwrap_or(false),
                    )
                })
                .collect(),
        }
    }

    /// A failed turn left nothing of itself in the log.
    fn assert_nothing_half_recorded(&self) {
        assert_eq!(self.count("model.completion"), 0, "{:?}", self.types());
        assert_eq!(self.count("tool.requested"), 0, "{:?}", self.types());
        assert_eq!(self.count("message.assistant"), 0, "{:?}", self.types());
        assert!(self.invoked.is_empty(), "{:?}", self.invoked);
    }
}

fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        other => other.to_string(),
    }
}

/// Runs the refund agent once against `origin` (the fake vendor API, or any address) speaking
/// `vendor`'s protocol, and waits for it to park or end.
async fn run_at(vendor: Vendor, origin: &str, server: Option<&FakeServer>) -> Outcome {
    let clock = Arc::new(ManualClock::starting_now());
    let mut agent = refund_agent(&AgentOptions::default());
    let env = match vendor {
        Vendor::OpenAi => ProviderEnv {
            openai_base_url: Some(format!("{origin}/v1")),
            ..ProviderEnv::default()
        },
        Vendor::Anthropic => {
            agent.spec.model.provider = "anthropic".to_owned();
            agent.spec.model.name = "claude-sonnet-4-5".to_owned();
            agent.spec.model.secret = "openai".to_owned();
            ProviderEnv {
                anthropic_base_url: Some(origin.to_owned()),
                ..ProviderEnv::default()
            }
        }
    };
    let (store, version_id) = memory_store(&clock, &agent).await;
    let factory: Arc<dyn ProviderFactory> = Arc::new(DefaultProviderFactory {
        env,
        options: options(),
    });
    let h = Harness::on_factory(
        store,
        clock,
        agent,
        version_id,
        Script::new(Vec::new()),
        factory,
        test_config(),
    )
    .await;
    let s = h.start("Refund order A-1001, it arrived broken.").await;
    let end = h
        .wait(
            &s.id,
            &[
                SessionStatus::AwaitingInput,
                SessionStatus::AwaitingApproval,
            ],
        )
        .await;
    let invoked = h
        .worker
        .invocations
        .lock()
        .unwrap()
        .iter()
        .map(|i| i.tool.clone())
        .collect();
    Outcome {
        status: end.status,
        error: end.error.clone().unwrap_or_default(),
        events: h.events(&s.id).await,
        requests: server
            .map(|s| s.received().into_iter().map(|r| r.body).collect())
            .unwrap_or_default(),
        invoked,
    }
}

async fn run(vendor: Vendor, replies: Vec<Reply>) -> (Outcome, FakeServer) {
    let server = FakeServer::start(replies).await;
    let outcome = run_at(vendor, &server.origin(), Some(&server)).await;
    (outcome, server)
}

// ---------------------------------------------------------------------------------------------
// The vendors' wire formats.

fn oa_chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_726_000_000,
        "model": "gpt-4o", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    })
}

fn oa_usage() -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_726_000_000,
           "model": "gpt-4o", "choices": [],
           "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}})
}

fn oa_text(text: &str) -> Reply {
    Reply::sse(&openai_sse(&[
        oa_chunk(json!({"role": "assistant", "content": text}), None),
        oa_chunk(json!({}), Some("stop")),
        oa_usage(),
    ]))
}

/// One tool call whose arguments arrive as the raw text `args`.
fn oa_tool_call_chunks(name: &str, args: &str) -> Vec<Value> {
    vec![
        oa_chunk(json!({"role": "assistant", "content": null}), None),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                   "function": {"name": name, "arguments": args}}]}),
            None,
        ),
        oa_chunk(json!({}), Some("tool_calls")),
        oa_usage(),
    ]
}

fn oa_tool_call(name: &str, args: &str) -> Reply {
    Reply::sse(&openai_sse(&oa_tool_call_chunks(name, args)))
}

fn an_start() -> Value {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
           "content": [], "model": "claude-sonnet-4-5", "stop_reason": null, "stop_sequence": null,
           "usage": {"input_tokens": 20, "output_tokens": 1}}})
}

fn an_end(stop_reason: &str) -> Vec<Value> {
    vec![
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": 5}}),
        json!({"type": "message_stop"}),
    ]
}

fn an_text(text: &str) -> Reply {
    let mut events = vec![
        an_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
    ];
    events.extend(an_end("end_turn"));
    Reply::sse(&anthropic_sse(&events))
}

/// The events of one `tool_use` block whose input arrives as the raw text `partial`.
fn an_tool_use_events(name: &str, partial: &str) -> Vec<Value> {
    vec![
        an_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use",
               "id": "toolu_1", "name": name, "input": {}}}),
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "input_json_delta", "partial_json": partial}}),
    ]
}

fn an_tool_use(name: &str, partial: &str) -> Reply {
    let mut events = an_tool_use_events(name, partial);
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.extend(an_end("tool_use"));
    Reply::sse(&anthropic_sse(&events))
}

fn text(vendor: Vendor, text: &str) -> Reply {
    match vendor {
        Vendor::OpenAi => oa_text(text),
        Vendor::Anthropic => an_text(text),
    }
}

fn tool_call(vendor: Vendor, name: &str, args: &str) -> Reply {
    match vendor {
        Vendor::OpenAi => oa_tool_call(name, args),
        Vendor::Anthropic => an_tool_use(name, args),
    }
}

/// A tool call whose stream ends in the middle of its arguments.
fn cut_tool_call(vendor: Vendor) -> Reply {
    match vendor {
        Vendor::OpenAi => {
            let mut chunks = oa_tool_call_chunks("lookup_order", "{\"order_id\": \"A-1");
            chunks.truncate(2);
            let mut body = String::new();
            for c in chunks {
                body.push_str(&format!("data: {c}\n\n"));
            }
            Reply::sse(&body)
        }
        Vendor::Anthropic => Reply::sse(&anthropic_sse(&an_tool_use_events(
            "lookup_order",
            "{\"order_id\": \"A-1",
        ))),
    }
}

/// A stream that sends the start of a tool call, then nothing, without ending.
fn stalled_tool_call(vendor: Vendor) -> Reply {
    cut_tool_call(vendor).stalled()
}

fn overloaded(vendor: Vendor) -> Reply {
    match vendor {
        Vendor::OpenAi => Reply::json(
            503,
            r#"{"error": {"message": "The server is overloaded", "type": "server_error"}}"#,
        ),
        Vendor::Anthropic => Reply::json(
            529,
            r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
        ),
    }
}

fn rate_limited(vendor: Vendor) -> Reply {
    match vendor {
        Vendor::OpenAi => Reply::json(
            429,
            r#"{"error": {"message": "Rate limit reached", "type": "requests"}}"#,
        ),
        Vendor::Anthropic => Reply::json(
            429,
            r#"{"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limited"}}"#,
        ),
    }
}

const VENDORS: [Vendor; 2] = [Vendor::OpenAi, Vendor::Anthropic];

// ---------------------------------------------------------------------------------------------
// Transport and HTTP faults: retried within the budget (three retries), then the session fails
// with a message naming the endpoint, and nothing of the turn is recorded.

#[tokio::test]
async fn a_refused_connection_fails_the_session_after_the_retries() {
    for vendor in VENDORS {
        // A port nobody listens on any more.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = run_at(vendor, &format!("http://127.0.0.1:{port}"), None).await;
        assert_eq!(out.status, SessionStatus::Failed, "{vendor:?}");
        assert!(
            out.error.contains("model API request failed") && out.error.contains("4 attempts"),
            "{vendor:?}: {}",
            out.error
        );
        assert!(out.error.contains(&port.to_string()), "{}", out.error);
        out.assert_nothing_half_recorded();
    }
}

#[tokio::test]
async fn rate_limits_with_and_without_retry_after_are_retried_then_the_turn_runs() {
    for vendor in VENDORS {
        let (out, _server) = run(
            vendor,
            vec![
                rate_limited(vendor).header("retry-after", "0"),
                rate_limited(vendor),
                text(vendor, "Sorry, I need the order number."),
            ],
        )
        .await;
        assert_eq!(
            out.status,
            SessionStatus::Completed,
            "{vendor:?}: {}",
            out.error
        );
        assert_eq!(out.requests.len(), 3, "{vendor:?}");
        assert_eq!(out.count("model.completion"), 1, "{:?}", out.types());
    }
}

#[tokio::test]
async fn server_errors_past_the_retry_budget_fail_the_session_clearly() {
    for vendor in VENDORS {
        let (out, _server) = run(vendor, vec![overloaded(vendor); 5]).await;
        assert_eq!(out.status, SessionStatus::Failed, "{vendor:?}");
        assert_eq!(
            out.requests.len(),
            4,
            "{vendor:?}: one attempt and three retries"
        );
        assert!(
            out.error.contains("returned HTTP 5") && out.error.contains("4 attempts"),
            "{vendor:?}: {}",
            out.error
        );
        out.assert_nothing_half_recorded();
    }
}

#[tokio::test]
async fn one_server_error_is_retried_transparently() {
    for vendor in VENDORS {
        let (out, _server) = run(
            vendor,
            vec![overloaded(vendor), text(vendor, "Which order?")],
        )
        .await;
        assert_eq!(
            out.status,
            SessionStatus::Completed,
            "{vendor:?}: {}",
            out.error
        );
        assert_eq!(out.requests.len(), 2);
    }
}

#[tokio::test]
async fn a_wrong_content_type_is_an_invalid_response_not_a_retry_storm() {
    for vendor in VENDORS {
        let (out, _server) = run(
            vendor,
            vec![Reply::raw(200, "text/html", "<html><body>login</body></html>"); 5],
        )
        .await;
        assert_eq!(out.status, SessionStatus::Failed, "{vendor:?}");
        assert!(
            out.error.contains("invalid response") || out.error.contains("content type"),
            "{vendor:?}: {}",
            out.error
        );
        out.assert_nothing_half_recorded();
    }
}

// ---------------------------------------------------------------------------------------------
// Stream faults: a stream cut or stalled in the middle of a tool call never runs the call.

#[tokio::test]
async fn a_stream_cut_mid_tool_call_runs_nothing_and_fails_the_session() {
    for vendor in VENDORS {
        let (out, _server) = run(vendor, vec![cut_tool_call(vendor); 5]).await;
        assert_eq!(out.status, SessionStatus::Failed, "{vendor:?}");
        assert!(!out.error.is_empty());
        out.assert_nothing_half_recorded();
    }
}

#[tokio::test]
async fn a_stalled_stream_times_out_and_runs_nothing() {
    for vendor in VENDORS {
        let (out, _server) = run(vendor, vec![stalled_tool_call(vendor); 5]).await;
        assert_eq!(out.status, SessionStatus::Failed, "{vendor:?}");
        assert!(
            out.error.contains("idle")
                || out.error.contains("timed out")
                || out.error.contains("timeout"),
            "{vendor:?}: {}",
            out.error
        );
        out.assert_nothing_half_recorded();
    }
}

// ---------------------------------------------------------------------------------------------
// Bad tool calls: the model is told what was wrong (a tool error), the worker never sees them,
// and the session goes on.

#[tokio::test]
async fn malformed_tool_arguments_are_a_tool_error_to_the_model() {
    for vendor in VENDORS {
        let (out, _server) = run(
            vendor,
            vec![
                tool_call(vendor, "lookup_order", "{\"order_id\": \"A-1001\""),
                text(vendor, "Let me try again later."),
            ],
        )
        .await;
        assert_eq!(
            out.status,
            SessionStatus::Completed,
            "{vendor:?}: {}",
            out.error
        );
        assert!(out.invoked.is_empty(), "{:?}", out.invoked);
        let results = out.last_tool_results(vendor);
        assert_eq!(results.len(), 1, "{vendor:?}: {results:?}");
        assert!(
            results[0].0.contains("the arguments are not valid JSON"),
            "{results:?}"
        );
        assert_eq!(out.count("tool.requested"), 1, "{:?}", out.types());
    }
}

#[tokio::test]
async fn an_unknown_or_empty_tool_name_is_a_tool_error_to_the_model() {
    for vendor in VENDORS {
        for (name, told) in [
            ("drop_database", "unknown tool \"drop_database\""),
            ("", "the tool call names no tool"),
        ] {
            let (out, _server) = run(
                vendor,
                vec![
                    tool_call(vendor, name, "{}"),
                    text(vendor, "I cannot do that."),
                ],
            )
            .await;
            assert_eq!(
                out.status,
                SessionStatus::Completed,
                "{vendor:?} {name:?}: {}",
                out.error
            );
            assert!(out.invoked.is_empty(), "{:?}", out.invoked);
            let results = out.last_tool_results(vendor);
            assert_eq!(results.len(), 1, "{vendor:?} {name:?}: {results:?}");
            assert!(results[0].0.contains(told), "{results:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Answers.

#[tokio::test]
async fn a_refusal_is_the_answer_and_the_session_ends_normally() {
    let refusal = Reply::sse(&openai_sse(&[
        oa_chunk(
            json!({"role": "assistant", "content": null, "refusal": "I can't help with that."}),
            None,
        ),
        oa_chunk(json!({}), Some("stop")),
        oa_usage(),
    ]));
    let (out, _server) = run(Vendor::OpenAi, vec![refusal]).await;
    assert_eq!(out.status, SessionStatus::Completed, "{}", out.error);
    let said: String = out
        .events
        .iter()
        .filter(|e| e.event_type == "message.assistant")
        .map(|e| e.payload.to_string())
        .collect();
    assert!(said.contains("I can't help with that."), "{said}");
}

/// An answer one byte over the bound, streamed in 64 KiB deltas as a vendor would.
fn huge_text(vendor: Vendor) -> Reply {
    let piece = "x".repeat(64 * 1024);
    let pieces = phrony_providers::MAX_COMPLETION_BYTES / piece.len() + 1;
    match vendor {
        Vendor::OpenAi => {
            let mut chunks = vec![oa_chunk(json!({"role": "assistant", "content": ""}), None)];
            chunks.extend((0..pieces).map(|_| oa_chunk(json!({"content": piece}), None)));
            chunks.push(oa_chunk(json!({}), Some("stop")));
            Reply::sse(&openai_sse(&chunks))
        }
        Vendor::Anthropic => {
            let mut events = vec![
                an_start(),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ];
            events.extend((0..pieces).map(|_| {
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": piece}})
            }));
            events.push(json!({"type": "content_block_stop", "index": 0}));
            events.extend(an_end("end_turn"));
            Reply::sse(&anthropic_sse(&events))
        }
    }
}

/// Tool arguments one byte over the bound, streamed in 64 KiB pieces (the providers hold them
/// until the call is complete, so the bound must count what they buffer).
fn huge_tool_call(vendor: Vendor) -> Reply {
    let piece = "y".repeat(64 * 1024);
    let pieces = phrony_providers::MAX_COMPLETION_BYTES / piece.len() + 1;
    match vendor {
        Vendor::OpenAi => {
            let mut chunks = vec![oa_chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                       "function": {"name": "lookup_order", "arguments": "{\"order_id\": \""}}]}),
                None,
            )];
            chunks.extend((0..pieces).map(|_| {
                oa_chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    None,
                )
            }));
            chunks.push(oa_chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"}"}}]}),
                None,
            ));
            chunks.push(oa_chunk(json!({}), Some("tool_calls")));
            Reply::sse(&openai_sse(&chunks))
        }
        Vendor::Anthropic => {
            let mut events = an_tool_use_events("lookup_order", "{\"order_id\": \"");
            events.extend((0..pieces).map(|_| {
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "input_json_delta", "partial_json": piece}})
            }));
            events.push(json!({"type": "content_block_delta", "index": 0,
                               "delta": {"type": "input_json_delta", "partial_json": "\"}"}}));
            events.push(json!({"type": "content_block_stop", "index": 0}));
            events.extend(an_end("tool_use"));
            Reply::sse(&anthropic_sse(&events))
        }
    }
}

#[tokio::test]
async fn huge_tool_arguments_are_refused_before_the_call_exists() {
    for vendor in VENDORS {
        let (out, _server) = run(vendor, vec![huge_tool_call(vendor); 5]).await;
        assert_eq!(out.status, SessionStatus::Failed, "{vendor:?}");
        assert!(
            out.error
                .contains("model answer is larger than 4194304 bytes"),
            "{vendor:?}: {}",
            &out.error[..out.error.len().min(300)]
        );
        out.assert_nothing_half_recorded();
    }
}

#[tokio::test]
async fn a_huge_answer_is_refused_within_the_bound_and_nothing_is_recorded() {
    for vendor in VENDORS {
        let (out, _server) = run(vendor, vec![huge_text(vendor); 5]).await;
        assert_eq!(out.status, SessionStatus::Failed, "{vendor:?}");
        assert!(
            out.error
                .contains("model answer is larger than 4194304 bytes"),
            "{vendor:?}: {}",
            &out.error[..out.error.len().min(300)]
        );
        out.assert_nothing_half_recorded();
    }
}

/// `output.strict: true` reaches the vendor through the production factory: the OpenAI request
/// carries the agent's output schema as a strict `json_schema` response format, and the answer
/// it returns becomes the session's JSON output.
#[tokio::test]
async fn a_strict_output_schema_reaches_openai_as_its_response_format() {
    let server = FakeServer::start(vec![oa_text(r#"{"refund_id": "rf_1"}"#)]).await;
    let clock = Arc::new(ManualClock::starting_now());
    let agent = refund_agent(&AgentOptions {
        output: Some(
            "  format: json\n  strict: true\n  schema:\n    inline:\n      type: object\n      properties:\n        refund_id: {type: string}\n      required: [refund_id]\n      additionalProperties: false\n"
                .to_owned(),
        ),
        ..AgentOptions::default()
    });
    let (store, version_id) = memory_store(&clock, &agent).await;
    let factory: Arc<dyn ProviderFactory> = Arc::new(DefaultProviderFactory {
        env: ProviderEnv {
            openai_base_url: Some(format!("{}/v1", server.origin())),
            ..ProviderEnv::default()
        },
        options: options(),
    });
    let h = Harness::on_factory(
        store,
        clock,
        agent,
        version_id,
        Script::new(Vec::new()),
        factory,
        test_config(),
    )
    .await;
    let s = h.start("Refund order A-1001.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    assert_eq!(done.output.unwrap()["json"], json!({"refund_id": "rf_1"}));
    let body = &server.received()[0].body;
    assert_eq!(
        body["response_format"],
        json!({
            "type": "json_schema",
            "json_schema": {
                "name": "refund-agent",
                "strict": true,
                "schema": {
                    "type": "object",
                    "properties": {"refund_id": {"type": "string"}},
                    "required": ["refund_id"],
                    "additionalProperties": false
                }
            }
        })
    );
}
