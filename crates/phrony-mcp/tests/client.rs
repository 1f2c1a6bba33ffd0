//! The client against the fake Streamable-HTTP server on 127.0.0.1.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use phrony_mcp::{CLIENT_NAME, CallOutcome, Client, Endpoint, McpError};
use phrony_test_support::fake_mcp::{Answer, FakeMcp, FakeTool, Fault};
use serde_json::json;

#[tokio::test]
async fn initialize_then_call_carries_the_session_and_the_auth_header() {
    let server = FakeMcp::start(vec![FakeTool::echo("web_search")]).await;
    server.require_header("x-api-key", "k-123");
    let endpoint = Endpoint::new(&server.url())
        .unwrap()
        .header("X-Api-Key", "k-123")
        .unwrap();
    assert!(!format!("{endpoint:?}").contains("k-123"), "{endpoint:?}");
    let client = Client::connect(endpoint).await.unwrap();
    let out = client
        .call_tool("web_search", &json!({"q": "rust"}))
        .await
        .unwrap();
    assert_eq!(
        out,
        CallOutcome::Success(json!({"tool": "web_search", "arguments": {"q": "rust"}}))
    );
    let methods: Vec<_> = server.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(
        methods,
        ["initialize", "notifications/initialized", "tools/call"]
    );
    let init = &server.requests_of("initialize")[0];
    assert_eq!(init.params["clientInfo"]["name"], CLIENT_NAME);
    let call = &server.requests_of("tools/call")[0];
    assert_eq!(call.header("mcp-session-id"), Some("session-1"));
    assert_eq!(call.header("mcp-protocol-version"), Some("2025-06-18"));
    assert_eq!(call.header("x-api-key"), Some("k-123"));
}

#[tokio::test]
async fn a_missing_credential_is_an_http_refusal_not_an_unknown_outcome() {
    let server = FakeMcp::start(vec![FakeTool::echo("web_search")]).await;
    server.require_header("authorization", "Bearer right");
    let endpoint = Endpoint::new(&server.url())
        .unwrap()
        .bearer("wrong")
        .unwrap();
    let err = Client::connect(endpoint).await.unwrap_err();
    assert!(matches!(err, McpError::Http { status: 401, .. }), "{err}");
    assert!(!err.outcome_unknown());
    assert!(!err.to_string().contains("wrong"), "{err}");
}

#[tokio::test]
async fn answers_on_an_event_stream_are_read_past_notifications() {
    let server = FakeMcp::start(vec![
        FakeTool::echo("a").answering(Answer::IsError(vec!["no such city".into()])),
    ])
    .await;
    server.use_sse(true);
    let client = Client::connect(Endpoint::new(&server.url()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        client.call_tool("a", &json!({})).await.unwrap(),
        CallOutcome::ToolError("no such city".into())
    );
}

#[tokio::test]
async fn tools_list_follows_every_page() {
    let tools: Vec<_> = (0..5).map(|i| FakeTool::echo(&format!("t{i}"))).collect();
    let server = FakeMcp::start(tools).await;
    let client = Client::connect(Endpoint::new(&server.url()).unwrap())
        .await
        .unwrap();
    let listed = client.list_tools().await.unwrap();
    let names: Vec<_> = listed.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["t0", "t1", "t2", "t3", "t4"]);
    assert_eq!(listed[0].input_schema, json!({"type": "object"}));
    assert_eq!(server.requests_of("tools/list").len(), 3);
}

#[tokio::test]
async fn failures_after_sending_have_an_unknown_outcome_and_refusals_do_not() {
    let server = FakeMcp::start(vec![FakeTool::echo("a")]).await;
    let client = Client::connect(Endpoint::new(&server.url()).unwrap())
        .await
        .unwrap();
    server.set_fault(Some(Fault::Status500));
    let err = client.call_tool("a", &json!({})).await.unwrap_err();
    assert!(err.outcome_unknown(), "{err}");
    assert!(
        err.to_string().contains("HTTP 500: upstream exploded"),
        "{err}"
    );
    server.set_fault(Some(Fault::DropConnection));
    let err = client.call_tool("a", &json!({})).await.unwrap_err();
    assert!(err.outcome_unknown(), "{err}");
    server.set_fault(None);
    let err = client.call_tool("nope", &json!({})).await.unwrap_err();
    assert!(!err.outcome_unknown(), "{err}");
    assert_eq!(err.code(), "mcp_rejected");
}

#[tokio::test]
async fn an_unreachable_server_sent_nothing() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    drop(listener);
    let err = Client::connect(Endpoint::new(&url).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, McpError::Unreachable { .. }), "{err}");
    assert!(!err.outcome_unknown());
}

#[test]
fn plain_http_is_refused_off_loopback() {
    assert!(Endpoint::new("http://10.0.0.7/mcp").is_err());
    assert!(Endpoint::new("https://u:p@mcp.example.com/mcp").is_err());
    assert!(Endpoint::new("http://[::1]:9/mcp").is_ok());
    assert!(Endpoint::new("https://mcp.example.com/mcp").is_ok());
}

#[tokio::test]
async fn a_forgotten_session_is_reported_as_expired_not_as_an_unknown_outcome() {
    let server = FakeMcp::start(vec![FakeTool::echo("a")]).await;
    let client = Client::connect(Endpoint::new(&server.url()).unwrap())
        .await
        .unwrap();
    server.expire_sessions();
    let err = client.call_tool("a", &json!({})).await.unwrap_err();
    assert!(matches!(err, McpError::SessionExpired { .. }), "{err}");
    assert!(!err.outcome_unknown());
}

#[tokio::test]
async fn a_secret_the_server_echoes_back_is_redacted_from_the_error() {
    let server = FakeMcp::start(vec![FakeTool::echo("a")]).await;
    let client = Client::connect(
        Endpoint::new(&server.url())
            .unwrap()
            .bearer("tok-echoed-42")
            .unwrap(),
    )
    .await
    .unwrap();
    server.set_fault(Some(Fault::Status500EchoingAuth));
    let err = client.call_tool("a", &json!({})).await.unwrap_err();
    let text = err.to_string();
    assert!(!text.contains("tok-echoed-42"), "{text}");
    assert!(text.contains("authorization: Bearer [redacted]"), "{text}");
}

#[tokio::test]
async fn an_answer_past_the_bound_is_refused_as_too_large_on_json_and_on_sse() {
    let huge = "x".repeat(phrony_mcp::MAX_RESPONSE_BYTES + 1);
    let server = FakeMcp::start(vec![FakeTool::echo("a").answering(Answer::Text(huge))]).await;
    let client = Client::connect(Endpoint::new(&server.url()).unwrap())
        .await
        .unwrap();
    for sse in [false, true] {
        server.use_sse(sse);
        let err = client.call_tool("a", &json!({})).await.unwrap_err();
        assert!(matches!(err, McpError::TooLarge { .. }), "sse={sse}: {err}");
        assert!(!err.outcome_unknown(), "the tool ran and answered");
        assert_eq!(err.code(), "mcp_result_too_large");
    }
}
