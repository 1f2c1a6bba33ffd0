//! `anthropic` against a local server speaking the Messages API streaming wire format.

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::time::Duration;

use futures::StreamExt as _;
use phrony_providers::{
    ApiKey, BuildOptions, Completion, CompletionRequest, ContentBlock, Event, Message,
    ModelProvider, ProviderEnv, ProviderError, ReasoningBlock, RetryPolicy, Role, StopReason,
    ToolSpec, Usage, build,
};
use phrony_test_support::fake_api::{FakeServer, Reply, anthropic_sse};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5";

fn model() -> phrony_manifest::Model {
    phrony_manifest::Model {
        provider: "anthropic".into(),
        name: MODEL.into(),
        ..Default::default()
    }
}

fn provider(server: &FakeServer, retry: RetryPolicy) -> Box<dyn ModelProvider> {
    let origin = server.origin();
    let env = ProviderEnv::from_lookup(|k| (k == "ANTHROPIC_BASE_URL").then(|| origin.clone()));
    let options = BuildOptions {
        retry,
        ..BuildOptions::default()
    };
    build(&model(), Some(ApiKey::new("sk-ant-test-1")), &env, &options)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn fast() -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    }
}

fn request() -> CompletionRequest {
    let mut req = CompletionRequest::for_model(&model()).unwrap();
    req.system = Some("You are a support agent.".into());
    req.messages.push(Message::user_text("Refund order A-7"));
    req
}

fn message_start(input_tokens: u64) -> Value {
    json!({"type": "message_start", "message": {"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message",
        "role": "assistant", "content": [], "model": MODEL, "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": 1}}})
}

fn text_block(index: u64, pieces: &[&str]) -> Vec<Value> {
    let mut v = vec![
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
    ];
    v.extend(pieces.iter().map(|p| {
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}})
    }));
    v.push(json!({"type": "content_block_stop", "index": index}));
    v
}

fn ending(stop_reason: &str, output_tokens: u64) -> Vec<Value> {
    vec![
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": output_tokens}}),
        json!({"type": "message_stop"}),
    ]
}

fn text_reply(text: &str, stop_reason: &str) -> String {
    let mut events = vec![message_start(10)];
    events.extend(text_block(0, &[text]));
    events.extend(ending(stop_reason, 3));
    anthropic_sse(&events)
}

async fn complete(
    p: &dyn ModelProvider,
    req: CompletionRequest,
) -> Result<Completion, ProviderError> {
    Completion::collect(p.stream(req).await?).await
}

#[tokio::test]
async fn streams_text_and_a_tool_use_built_from_json_fragments() {
    let mut events = vec![message_start(472), json!({"type": "ping"})];
    events.extend(text_block(0, &["Okay, let me look ", "that up."]));
    events.extend([
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "lookup_order", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"order_"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "id\": \"A-"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "7\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
    ]);
    events.extend(ending("tool_use", 89));
    let server = FakeServer::start(vec![Reply::sse_in_pieces(&anthropic_sse(&events), 11)]).await;
    let p = provider(&server, fast());
    let mut stream = p.stream(request()).await.unwrap();
    let mut got = Vec::new();
    while let Some(e) = stream.next().await {
        got.push(e.unwrap());
    }
    assert_eq!(
        got,
        vec![
            Event::TextDelta("Okay, let me look ".into()),
            Event::TextDelta("that up.".into()),
            Event::ToolCall {
                id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                name: "lookup_order".into(),
                args: json!({"order_id": "A-7"}),
            },
            Event::Completed {
                stop_reason: StopReason::ToolUse,
                usage: Usage {
                    input_tokens: 472,
                    output_tokens: 89,
                    estimated: false
                },
            },
        ]
    );
}

#[tokio::test]
async fn stop_reasons_are_normalised() {
    let server = FakeServer::start(vec![
        Reply::sse(&text_reply("Done.", "end_turn")),
        Reply::sse(&text_reply("Trunc", "max_tokens")),
        Reply::sse(&text_reply("Stopped", "stop_sequence")),
    ])
    .await;
    let p = provider(&server, fast());
    let reasons: Vec<StopReason> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(complete(p.as_ref(), request()).await.unwrap().stop_reason);
        }
        v
    };
    assert_eq!(
        reasons,
        vec![
            StopReason::EndTurn,
            StopReason::MaxTokens,
            StopReason::Other("stop_sequence".into())
        ]
    );
}

#[tokio::test]
async fn request_has_system_tools_tool_results_thinking_and_headers() {
    let server = FakeServer::start(vec![Reply::sse(&text_reply("Refunded.", "end_turn"))]).await;
    let p = provider(&server, fast());
    let mut m = model();
    m.reasoning = Some(phrony_manifest::Reasoning {
        effort: "medium".into(),
    });
    let mut req = CompletionRequest::for_model(&m).unwrap();
    req.system = Some("You are a support agent.".into());
    req.messages = vec![
        Message::user_text("Refund order A-7"),
        Message {
            role: Role::Assistant,
            content: vec![
                ContentBlock::Reasoning(ReasoningBlock::Thinking {
                    thinking: "Need the order first.".into(),
                    signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3h".into(),
                }),
                ContentBlock::Text {
                    text: "Checking.".into(),
                },
                ContentBlock::ToolUse {
                    id: "toolu_01A".into(),
                    name: "lookup_order".into(),
                    args: json!({"order_id": "A-7"}),
                },
            ],
        },
        Message {
            role: Role::User,
            content: vec![
                ContentBlock::Text {
                    text: "Also, hurry.".into(),
                },
                ContentBlock::ToolResult {
                    tool_use_id: "toolu_01A".into(),
                    content: "worker unavailable".into(),
                    is_error: true,
                },
            ],
        },
    ];
    req.tools = vec![ToolSpec {
        name: "lookup_order".into(),
        description: "Find an order".into(),
        input_schema: json!({"type": "object", "properties": {"order_id": {"type": "string"}}}),
    }];
    complete(p.as_ref(), req).await.unwrap();

    let got = server.received();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.path, "/v1/messages");
    assert_eq!(r.headers["x-api-key"], "sk-ant-test-1");
    assert_eq!(r.headers["anthropic-version"], "2023-06-01");
    assert_eq!(r.headers["content-type"], "application/json");
    assert!(!r.headers.contains_key("authorization"));
    assert_eq!(
        r.body,
        json!({
            "model": MODEL,
            "system": "You are a support agent.",
            "stream": true,
            "max_tokens": 8192 + 4096,
            "thinking": {"type": "enabled", "budget_tokens": 8192},
            "tools": [{"name": "lookup_order", "description": "Find an order",
                       "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Refund order A-7"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Need the order first.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_01A", "name": "lookup_order", "input": {"order_id": "A-7"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "worker unavailable", "is_error": true},
                    {"type": "text", "text": "Also, hurry."}
                ]}
            ]
        })
    );
}

#[tokio::test]
async fn thinking_blocks_are_streamed_as_reasoning() {
    let events = vec![
        message_start(50),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "The order "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "is small."}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3p"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Approved."}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 30}}),
        json!({"type": "message_stop"}),
    ];
    let server = FakeServer::start(vec![Reply::sse(&anthropic_sse(&events))]).await;
    let done = complete(provider(&server, fast()).as_ref(), request())
        .await
        .unwrap();
    assert_eq!(
        done.reasoning,
        vec![
            ReasoningBlock::Thinking {
                thinking: "The order is small.".into(),
                signature: "EqQBCgIYAhIM".into()
            },
            ReasoningBlock::Redacted {
                data: "EmwKAhgBEgy3va3p".into()
            },
        ]
    );
    assert_eq!(done.text, "Approved.");
    assert_eq!(
        done.usage,
        Usage {
            input_tokens: 50,
            output_tokens: 30,
            estimated: false
        }
    );
}

#[tokio::test]
async fn an_error_event_after_output_fails_without_retry() {
    let mut events = vec![message_start(10)];
    events.push(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
    events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}));
    events.push(
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    );
    let server = FakeServer::start(vec![Reply::sse(&anthropic_sse(&events))]).await;
    let p = provider(&server, fast());
    let mut stream = p.stream(request()).await.unwrap();
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        Event::TextDelta("Hel".into())
    );
    let err = stream.next().await.unwrap().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "model API request failed (model={MODEL}) (base_url={}): the response stream reported overloaded_error: Overloaded",
            server.origin()
        )
    );
    assert!(stream.next().await.is_none());
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn overload_before_any_output_is_retried() {
    let overloaded = anthropic_sse(&[
        message_start(10),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let server = FakeServer::start(vec![
        Reply::json(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        Reply::sse(&overloaded),
        Reply::sse(&text_reply("Finally.", "end_turn")),
    ])
    .await;
    let done = complete(provider(&server, fast()).as_ref(), request())
        .await
        .unwrap();
    assert_eq!(done.text, "Finally.");
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn http_errors_carry_the_vendor_message_and_a_hint() {
    let server = FakeServer::start(vec![
        Reply::json(401, r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#),
        Reply::json(404, r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}"#),
    ])
    .await;
    let p = provider(&server, fast());
    let o = server.origin();
    let err = complete(p.as_ref(), request()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "model API request failed (model={MODEL}) (base_url={o}): {o}/v1/messages returned HTTP 401 Unauthorized: \
             authentication_error: invalid x-api-key. Check the API key: the secret named by spec.model.secret \
             (default \"anthropic\") must hold a valid key with access to this model"
        )
    );
    let err = complete(p.as_ref(), request()).await.unwrap_err();
    assert!(
        err.to_string().ends_with(
            "returned HTTP 404 Not Found: not_found_error: model: claude-9. Check spec.model.name (and ANTHROPIC_BASE_URL if set: the API root without /v1)"
        ),
        "{err}"
    );
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn a_stream_without_message_stop_is_an_invalid_response() {
    let mut events = vec![message_start(10)];
    events.extend(text_block(0, &["cut"]));
    let server = FakeServer::start(vec![
        Reply::sse(&anthropic_sse(&events)),
        Reply::sse("event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\n\n"),
    ])
    .await;
    let p = provider(&server, fast());
    let done = complete(p.as_ref(), request()).await;
    let err = done.unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "model API returned an invalid response from base_url {} (model={MODEL}): the stream ended before message_stop",
            server.origin()
        )),
        "{err}"
    );
    let err = complete(p.as_ref(), request()).await.unwrap_err();
    assert!(
        err.to_string().contains("carries data that is not JSON"),
        "{err}"
    );
}
