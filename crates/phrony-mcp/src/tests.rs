//! The result mapping and the SSE framing, without a server.

use serde_json::json;

use super::{CallOutcome, McpError, call_outcome, event_end, sse_data};

#[test]
fn is_error_is_the_joined_text_content() {
    let r = json!({"isError": true, "content": [
        {"type": "text", "text": "quota exceeded"},
        {"type": "image", "data": "…", "mimeType": "image/png"},
        {"type": "text", "text": "retry tomorrow"},
    ], "structuredContent": {"ignored": true}});
    assert_eq!(
        call_outcome(&r),
        CallOutcome::ToolError("quota exceeded\nretry tomorrow".into())
    );
}

#[test]
fn structured_content_wins_then_the_content_array_then_an_empty_object() {
    let content = json!([{"type": "text", "text": "42"}]);
    assert_eq!(
        call_outcome(&json!({"content": content, "structuredContent": {"answer": 42}})),
        CallOutcome::Success(json!({"answer": 42}))
    );
    assert_eq!(
        call_outcome(&json!({"content": content, "isError": false})),
        CallOutcome::Success(content.clone())
    );
    assert_eq!(
        call_outcome(&json!({"content": []})),
        CallOutcome::Success(json!({}))
    );
    assert_eq!(call_outcome(&json!({})), CallOutcome::Success(json!({})));
}

#[test]
fn sse_events_are_split_on_blank_lines_and_data_lines_joined() {
    let buf = b"event: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nrest";
    let (end, next) = event_end(buf).unwrap();
    assert_eq!(&buf[next..], b"rest");
    assert_eq!(sse_data(&buf[..end]), "{\"a\":\n1}");
    assert_eq!(event_end(b"data: x\n"), None);
    assert_eq!(event_end(b"data: x\n\n"), Some((7, 9)));
}

#[test]
fn only_a_sent_request_without_an_answer_has_an_unknown_outcome() {
    let server = "http://127.0.0.1:1/mcp".to_owned();
    let http = |status| McpError::Http {
        server: server.clone(),
        method: "tools/call".into(),
        status,
        body: String::new(),
    };
    assert!(http(500).outcome_unknown());
    assert!(http(502).outcome_unknown());
    assert!(!http(401).outcome_unknown());
    assert_eq!(http(401).code(), "mcp_http_error");
    let unreachable = McpError::Unreachable {
        server: server.clone(),
        message: "refused".into(),
    };
    assert!(!unreachable.outcome_unknown());
    assert_eq!(unreachable.code(), "mcp_unavailable");
    let rpc = McpError::Rpc {
        server,
        method: "tools/call".into(),
        code: -32602,
        message: "Unknown tool: x".into(),
    };
    assert!(!rpc.outcome_unknown());
    assert_eq!(rpc.code(), "mcp_rejected");
}
