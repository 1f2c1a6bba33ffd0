//! `openai` and `openai-compatible` against a local server speaking the Chat Completions
//! streaming wire format.

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use phrony_providers::{
    ApiKey, BuildOptions, Completion, CompletionRequest, ContentBlock, Event, Message,
    ModelProvider, ProviderEnv, ProviderError, ReasoningEffort, RetryPolicy, Role, StopReason,
    ToolSpec, Usage, build,
};
use phrony_test_support::fake_api::{FakeServer, Reply, openai_sse};
use serde_json::{Value, json};

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-9xYz", "object": "chat.completion.chunk", "created": 1_726_000_000,
        "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_5f20662549",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        "usage": null
    })
}

fn usage_chunk(prompt: u64, completion: u64) -> Value {
    json!({
        "id": "chatcmpl-9xYz", "object": "chat.completion.chunk", "created": 1_726_000_000,
        "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_5f20662549", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}
    })
}

fn text_stream(pieces: &[&str], prompt: u64, completion: u64) -> String {
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        None,
    )];
    chunks.extend(pieces.iter().map(|p| chunk(json!({"content": p}), None)));
    chunks.push(chunk(json!({}), Some("stop")));
    chunks.push(usage_chunk(prompt, completion));
    openai_sse(&chunks)
}

fn fast_retries() -> BuildOptions {
    BuildOptions {
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            ..RetryPolicy::default()
        },
        ..BuildOptions::default()
    }
}

fn openai_model(name: &str) -> phrony_manifest::Model {
    phrony_manifest::Model {
        provider: "openai".into(),
        name: name.into(),
        ..Default::default()
    }
}

/// Provider `openai` pointed at the fake server through `OPENAI_BASE_URL`.
fn openai_at(server: &FakeServer, options: &BuildOptions) -> Box<dyn ModelProvider> {
    let base = format!("{}/v1", server.origin());
    let env = ProviderEnv::from_lookup(|k| (k == "OPENAI_BASE_URL").then(|| base.clone()));
    build(
        &openai_model("gpt-4o"),
        Some(ApiKey::new("sk-test-123")),
        &env,
        options,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn request(text: &str) -> CompletionRequest {
    let mut req = CompletionRequest::for_model(&openai_model("gpt-4o")).unwrap();
    req.system = Some("You are a support agent.".into());
    req.messages.push(Message::user_text(text));
    req
}

async fn complete(
    p: &dyn ModelProvider,
    req: CompletionRequest,
) -> Result<Completion, ProviderError> {
    Completion::collect(p.stream(req).await?).await
}

#[tokio::test]
async fn streams_text_and_reports_usage() {
    let server = FakeServer::start(vec![Reply::sse(&text_stream(
        &["Hel", "lo", ", world"],
        21,
        4,
    ))])
    .await;
    let p = openai_at(&server, &BuildOptions::default());
    let mut stream = p.stream(request("hi")).await.unwrap();
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        events.push(e.unwrap());
    }
    assert_eq!(
        events,
        vec![
            Event::TextDelta("Hel".into()),
            Event::TextDelta("lo".into()),
            Event::TextDelta(", world".into()),
            Event::Completed {
                stop_reason: StopReason::EndTurn,
                usage: Usage {
                    input_tokens: 21,
                    output_tokens: 4,
                    estimated: false
                },
            },
        ]
    );
    let got = server.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].path, "/v1/chat/completions");
    assert_eq!(got[0].headers["authorization"], "Bearer sk-test-123");
    let body = &got[0].body;
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["max_completion_tokens"], 4096);
    assert!(body.get("max_tokens").is_none());
    assert!(
        body.get("tools").is_none(),
        "no tools key without tools: {body}"
    );
    assert!(
        body.get("response_format").is_none(),
        "no response_format without an output schema: {body}"
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": "hi"}
        ])
    );
}

#[tokio::test]
async fn accumulates_two_parallel_tool_calls_split_across_chunks() {
    let chunks = vec![
        chunk(json!({"role": "assistant", "content": null}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_lookup7", "type": "function",
            "function": {"name": "lookup_order", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"ord"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_refund7", "type": "function",
            "function": {"name": "issue_refund", "arguments": "{\"order_id\": \"A-"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "er_id\": \"A-7\"}"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "function": {"arguments": "7\", \"amount\": 100.5, "}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "function": {"arguments": "\"currency\": \"EUR\"}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(80, 42),
    ];
    // Cut the body every 7 bytes so that SSE lines and JSON straddle network reads.
    let server = FakeServer::start(vec![Reply::sse_in_pieces(&openai_sse(&chunks), 7)]).await;
    let p = openai_at(&server, &BuildOptions::default());
    let done = complete(p.as_ref(), request("refund A-7")).await.unwrap();
    assert_eq!(done.text, "");
    assert_eq!(
        done.tool_calls,
        vec![
            (
                "call_lookup7".into(),
                "lookup_order".into(),
                json!({"order_id": "A-7"})
            ),
            (
                "call_refund7".into(),
                "issue_refund".into(),
                json!({"order_id": "A-7", "amount": 100.5, "currency": "EUR"})
            ),
        ]
    );
    assert_eq!(done.stop_reason, StopReason::ToolUse);
    assert_eq!(
        done.usage,
        Usage {
            input_tokens: 80,
            output_tokens: 42,
            estimated: false
        }
    );
}

#[tokio::test]
async fn request_carries_tools_tool_messages_and_parameters() {
    let server = FakeServer::start(vec![Reply::sse(&text_stream(&["Refunded."], 5, 2))]).await;
    let p = openai_at(&server, &BuildOptions::default());
    let mut model = openai_model("gpt-4o");
    model.parameters = Some(phrony_manifest::Parameters {
        temperature: Some(0.25),
        max_output_tokens: 900,
        stop_sequences: vec!["###".into()],
        ..Default::default()
    });
    model.reasoning = Some(phrony_manifest::Reasoning {
        effort: "low".into(),
    });
    let mut req = CompletionRequest::for_model(&model).unwrap();
    assert_eq!(req.reasoning, Some(ReasoningEffort::Low));
    let anthropic_style_id = format!("toolu_{}", "9".repeat(70));
    req.messages = vec![
        Message::user_text("Refund order A-7"),
        Message {
            role: Role::Assistant,
            content: vec![
                ContentBlock::Text {
                    text: "Let me check.".into(),
                },
                ContentBlock::ToolUse {
                    id: "call_lookup7".into(),
                    name: "lookup_order".into(),
                    args: json!({"order_id": "A-7"}),
                },
                ContentBlock::ToolUse {
                    id: anthropic_style_id.clone(),
                    name: "issue_refund".into(),
                    args: json!({"order_id": "A-7", "amount": 100}),
                },
            ],
        },
        Message {
            role: Role::User,
            content: vec![
                ContentBlock::ToolResult {
                    tool_use_id: "call_lookup7".into(),
                    content: "{\"total\":100}".into(),
                    is_error: false,
                },
                ContentBlock::ToolResult {
                    tool_use_id: anthropic_style_id.clone(),
                    content: "denied by policy payments/refund-limits@1.0.0: amount over limit"
                        .into(),
                    is_error: true,
                },
            ],
        },
    ];
    req.tools = vec![ToolSpec {
        name: "issue_refund".into(),
        description: "Refund an order".into(),
        input_schema: json!({"type": "object", "properties": {"order_id": {"type": "string"},
            "amount": {"type": "number"}}, "required": ["order_id", "amount"]}),
    }];
    let done = complete(p.as_ref(), req).await.unwrap();
    assert_eq!(done.text, "Refunded.");

    let mut body = server.received()[0].body.clone();
    // Arguments travel as JSON text; compare them as JSON.
    for call in body["messages"][1]["tool_calls"].as_array_mut().unwrap() {
        let text = call["function"]["arguments"].as_str().unwrap().to_owned();
        call["function"]["arguments"] = serde_json::from_str(&text).unwrap();
    }
    let short = body["messages"][1]["tool_calls"][1]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(short.starts_with("call_") && short.len() == 37, "{short}");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": "Refund order A-7"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"type": "function", "id": "call_lookup7",
                 "function": {"name": "lookup_order", "arguments": {"order_id": "A-7"}}},
                {"type": "function", "id": short,
                 "function": {"name": "issue_refund", "arguments": {"order_id": "A-7", "amount": 100}}}
            ]},
            {"role": "tool", "tool_call_id": "call_lookup7", "content": "{\"total\":100}"},
            {"role": "tool", "tool_call_id": short,
             "content": "denied by policy payments/refund-limits@1.0.0: amount over limit"}
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {"name": "issue_refund", "description": "Refund an order",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                "amount": {"type": "number"}}, "required": ["order_id", "amount"]}}}])
    );
    assert_eq!(body["max_completion_tokens"], 900);
    assert_eq!(body["temperature"], 0.25);
    assert_eq!(body["stop"], json!(["###"]));
    assert_eq!(body["reasoning_effort"], "low");
    assert!(body.get("top_p").is_none());
}

#[tokio::test]
async fn rate_limit_is_retried_after_the_requested_delay() {
    let server = FakeServer::start(vec![
        Reply::json(429, r#"{"error":{"message":"Rate limit reached for gpt-4o","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#)
            .header("retry-after-ms", "250"),
        Reply::sse(&text_stream(&["ok"], 3, 1)),
    ])
    .await;
    let p = openai_at(&server, &fast_retries());
    let started = Instant::now();
    let done = complete(p.as_ref(), request("hi")).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "Retry-After not honoured"
    );
    assert_eq!(done.text, "ok");
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn unauthorized_is_not_retried_and_explains_the_key() {
    let server = FakeServer::start(vec![Reply::json(
        401,
        r#"{"error":{"message":"Incorrect API key provided: sk-test***123.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
    )])
    .await;
    let p = openai_at(&server, &fast_retries());
    let err = complete(p.as_ref(), request("hi")).await.unwrap_err();
    let o = server.origin();
    assert_eq!(
        err.to_string(),
        format!(
            "model API request failed (model=gpt-4o) (base_url={o}/v1): {o}/v1/chat/completions returned HTTP 401 Unauthorized: \
             invalid_request_error: Incorrect API key provided: sk-test***123.. Check the API key: the secret named by \
             spec.model.secret (default \"openai\") must hold a valid key with access to this model"
        )
    );
    assert!(!err.retryable());
    assert_eq!(err.http_status(), Some(401));
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn server_errors_give_up_after_three_retries() {
    let server = FakeServer::start(vec![
        Reply::raw(500, "text/plain", "upstream exploded"),
        Reply::raw(502, "text/html", "<html><body>Bad Gateway</body></html>"),
        Reply::raw(503, "text/plain", "try later"),
        Reply::json(500, r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}"#),
        Reply::sse(&text_stream(&["never served"], 1, 1)),
    ])
    .await;
    let p = openai_at(&server, &fast_retries());
    let err = complete(p.as_ref(), request("hi")).await.unwrap_err();
    assert_eq!(server.received().len(), 4);
    let msg = err.to_string();
    assert!(
        msg.ends_with(
            "returned HTTP 500 Internal Server Error: server_error: The server had an error while processing your request.. \
             The provider had a server error (gave up after 4 attempts); retry later"
        ),
        "{msg}"
    );
    assert!(err.retryable());
}

#[tokio::test]
async fn not_found_hints_at_the_model_and_base_url() {
    let server = FakeServer::start(vec![Reply::json(
        404,
        r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","code":"model_not_found"}}"#,
    )])
    .await;
    let p = openai_at(&server, &fast_retries());
    let err = complete(p.as_ref(), request("hi")).await.unwrap_err();
    assert!(
        err.to_string().ends_with(
            "Check spec.model.name (and OPENAI_BASE_URL if set: the API root ending in /v1)"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn malformed_chunks_and_non_streams_are_invalid_responses() {
    let server = FakeServer::start(vec![
        Reply::sse("data: {\"id\": \"chatcmpl-1\", \"choices\": [\n\n"),
        Reply::raw(
            200,
            "text/html",
            "<html><body>Welcome to nginx!</body></html>",
        ),
    ])
    .await;
    let p = openai_at(&server, &fast_retries());
    let o = server.origin();
    let err = complete(p.as_ref(), request("hi")).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "model API returned an invalid response from base_url {o}/v1 (model=gpt-4o): a stream chunk is not a chat completion chunk"
        )),
        "{msg}"
    );
    assert!(msg.ends_with("the endpoint may be wrong (the base URL must be the Chat Completions API root, usually ending in /v1)"));
    let err = complete(p.as_ref(), request("hi")).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::InvalidResponse { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("no chat completion chunks"),
        "{err}"
    );
    assert_eq!(
        server.received().len(),
        2,
        "invalid responses are not retried"
    );
}

#[tokio::test]
async fn a_stream_cut_before_finish_reason_is_an_error() {
    let body = "data: ".to_owned()
        + &chunk(json!({"role": "assistant", "content": "Partial"}), None).to_string()
        + "\n\n";
    let server = FakeServer::start(vec![Reply::sse(&body)]).await;
    let p = openai_at(&server, &fast_retries());
    let mut stream = p.stream(request("hi")).await.unwrap();
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        Event::TextDelta("Partial".into())
    );
    let err = stream.next().await.unwrap().unwrap_err();
    assert!(
        err.to_string().contains("ended before a finish_reason"),
        "{err}"
    );
    assert!(stream.next().await.is_none());
}

#[tokio::test]
async fn an_error_chunk_mid_stream_fails_the_completion() {
    let body = format!(
        "data: {}\n\ndata: {}\n\n",
        chunk(json!({"content": "Hi"}), None),
        json!({"error": {"message": "The server had an error processing your request.", "type": "server_error"}})
    );
    let server = FakeServer::start(vec![Reply::sse(&body)]).await;
    let p = openai_at(&server, &fast_retries());
    let mut stream = p.stream(request("hi")).await.unwrap();
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        Event::TextDelta("Hi".into())
    );
    let err = stream.next().await.unwrap().unwrap_err();
    assert!(
        err.to_string().ends_with(
            "the response stream reported server_error: The server had an error processing your request."
        ),
        "{err}"
    );
    assert_eq!(
        server.received().len(),
        1,
        "no retry once an event was streamed"
    );
}

#[tokio::test]
async fn openai_compatible_uses_base_url_without_a_key_and_estimates_missing_usage() {
    // Ollama-style: no usage, tool call finished with "stop", name and id repeated in each chunk.
    let chunks = vec![
        json!({"id": "chatcmpl-42", "object": "chat.completion.chunk", "created": 1, "model": "llama3.1",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "call_x1", "index": 0, "type": "function",
                   "function": {"name": "lookup_order", "arguments": "{\"order_id\":\"A-7\"}"}}]},
                 "finish_reason": null}]}),
        json!({"id": "chatcmpl-42", "object": "chat.completion.chunk", "created": 1, "model": "llama3.1",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}),
    ];
    let server = FakeServer::start(vec![Reply::sse(&openai_sse(&chunks))]).await;
    let model = phrony_manifest::Model {
        provider: "openai-compatible".into(),
        name: "llama3.1".into(),
        base_url: format!("{}/v1/", server.origin()),
        ..Default::default()
    };
    // OPENAI_BASE_URL must not redirect an openai-compatible agent.
    let env = ProviderEnv::from_lookup(|k| {
        (k == "OPENAI_BASE_URL").then(|| "http://127.0.0.1:9/v1".to_owned())
    });
    let p = build(&model, None, &env, &BuildOptions::default()).unwrap();
    let mut req = CompletionRequest::for_model(&model).unwrap();
    req.messages.push(Message::user_text("abcdefgh")); // 8 characters → 2 tokens
    let done = complete(p.as_ref(), req).await.unwrap();
    assert_eq!(
        done.tool_calls,
        vec![(
            "call_x1".into(),
            "lookup_order".into(),
            json!({"order_id": "A-7"})
        )]
    );
    assert_eq!(done.stop_reason, StopReason::ToolUse);
    // Output: "lookup_order" (12) + "{\"order_id\":\"A-7\"}" (18) = 30 characters → 8 tokens.
    assert_eq!(
        done.usage,
        Usage {
            input_tokens: 2,
            output_tokens: 8,
            estimated: true
        }
    );
    let got = server.received();
    assert_eq!(got[0].path, "/v1/chat/completions");
    assert!(
        !got[0].headers.contains_key("authorization"),
        "keyless compatible endpoint got a key"
    );
}

#[tokio::test]
async fn compatible_endpoint_errors_point_at_spec_fields() {
    let server = FakeServer::start(vec![Reply::raw(401, "text/plain", "unauthorized")]).await;
    let model = phrony_manifest::Model {
        provider: "openai-compatible".into(),
        name: "mixtral".into(),
        base_url: format!("{}/v1", server.origin()),
        ..Default::default()
    };
    let p = build(
        &model,
        Some(ApiKey::new("k")),
        &ProviderEnv::default(),
        &fast_retries(),
    )
    .unwrap();
    let req = {
        let mut r = CompletionRequest::for_model(&model).unwrap();
        r.messages.push(Message::user_text("x"));
        r
    };
    let err = complete(p.as_ref(), req).await.unwrap_err();
    assert!(
        err.to_string().ends_with(
            "returned HTTP 401 Unauthorized: unauthorized. Check spec.model.secret: the endpoint rejected the API key (or needs one)"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn unreachable_endpoint_is_a_connection_error_after_retries() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base = format!("http://127.0.0.1:{port}/v1");
    let env = ProviderEnv::from_lookup(|k| (k == "OPENAI_BASE_URL").then(|| base.clone()));
    let p = build(
        &openai_model("gpt-4o"),
        Some(ApiKey::new("k")),
        &env,
        &fast_retries(),
    )
    .unwrap();
    let err = complete(p.as_ref(), request("hi")).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Connection { attempts: 4, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("Connection refused"), "{msg}");
    assert_eq!(msg.matches("/chat/completions").count(), 1, "{msg}");
    assert!(
        msg.starts_with(&format!(
            "model API request failed (model=gpt-4o) (base_url={base}): {base}/chat/completions: "
        )),
        "{msg}"
    );
    assert!(
        msg.ends_with(
            "Check that the base URL is reachable from the runtime (gave up after 4 attempts)"
        ),
        "{msg}"
    );
}

/// An agent's `output.schema` with `strict: true` reaches OpenAI as structured output:
/// `response_format: {type: json_schema, json_schema: {name, schema, strict: true}}`.
#[tokio::test]
async fn a_response_schema_is_sent_as_a_strict_json_schema_response_format() {
    let server = FakeServer::start(vec![Reply::sse(&text_stream(&["{\"ok\":true}"], 9, 3))]).await;
    let p = openai_at(&server, &BuildOptions::default());
    let schema = json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": false
    });
    let mut req = request("Answer in JSON.");
    req.response_schema = Some(phrony_providers::ResponseSchema {
        name: "refund-agent".into(),
        schema: schema.clone(),
        strict: true,
    });
    let done = complete(p.as_ref(), req).await.unwrap();
    assert_eq!(done.text, "{\"ok\":true}");
    let body = &server.received()[0].body;
    assert_eq!(
        body["response_format"],
        json!({
            "type": "json_schema",
            "json_schema": {"name": "refund-agent", "schema": schema, "strict": true}
        })
    );
}
