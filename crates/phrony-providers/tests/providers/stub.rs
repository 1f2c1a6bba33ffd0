//! The scripted `stub` provider, with scripts read from fixture files.

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use phrony_providers::{
    BuildOptions, Completion, CompletionRequest, Event, Message, ModelProvider, ProviderEnv,
    ProviderError, StopReason, Usage, build,
};
use serde_json::json;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn model() -> phrony_manifest::Model {
    phrony_manifest::Model {
        provider: "stub".into(),
        name: "scripted".into(),
        ..Default::default()
    }
}

fn enabled() -> ProviderEnv {
    ProviderEnv::from_lookup(|k| (k == "RUNTIME_ENABLE_STUB_PROVIDER").then(|| "true".to_owned()))
}

fn stub(script: &str, position: usize) -> Result<Box<dyn ModelProvider>, ProviderError> {
    let options = BuildOptions {
        stub_script: Some(fixture(script)),
        stub_position: position,
        ..BuildOptions::default()
    };
    build(&model(), None, &enabled(), &options)
}

fn request(text: &str) -> CompletionRequest {
    let mut req = CompletionRequest::for_model(&model()).unwrap();
    req.messages.push(Message::user_text(text));
    req
}

async fn complete(p: &dyn ModelProvider, text: &str) -> Result<Completion, ProviderError> {
    Completion::collect(p.stream(request(text)).await?).await
}

#[tokio::test]
async fn plays_one_turn_per_completion_then_reports_exhaustion() {
    let p = stub("refund-script.json", 0).unwrap();
    // 16 characters of input → 4 estimated tokens.
    let first = complete(p.as_ref(), "refund order A-7").await.unwrap();
    assert_eq!(first.text, "Let me issue that refund.");
    assert_eq!(
        first.tool_calls,
        vec![
            (
                "stub_call_1_1".into(),
                "issue_refund".into(),
                json!({"order_id": "A-7", "amount": 100, "currency": "EUR"})
            ),
            (
                "stub_call_1_2".into(),
                "lookup_order".into(),
                json!({"order_id": "A-7"})
            ),
        ]
    );
    assert_eq!(
        first.stop_reason,
        StopReason::ToolUse,
        "vendor spelling tool_calls is normalised"
    );
    assert!(first.usage.estimated);
    assert_eq!(first.usage.input_tokens, 4);

    let second = complete(p.as_ref(), "refund order A-7").await.unwrap();
    assert_eq!(second.text, "Refund issued.");
    assert_eq!(second.stop_reason, StopReason::EndTurn);
    // "Refund issued." is 14 characters → 4 tokens.
    assert_eq!(
        second.usage,
        Usage {
            input_tokens: 4,
            output_tokens: 4,
            estimated: true
        }
    );

    let err = complete(p.as_ref(), "again").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "unexpected completion call 3 (script has 2 turns)"
    );
    let err = complete(p.as_ref(), "again").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "unexpected completion call 4 (script has 2 turns)"
    );
}

#[tokio::test]
async fn scripted_failures_end_the_stream_with_their_message() {
    let p = stub("failing-script.json", 0).unwrap();
    let mut stream = p.stream(request("x")).await.unwrap();
    use futures::StreamExt as _;
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        Event::TextDelta("Thinking".into())
    );
    let err = stream.next().await.unwrap().unwrap_err();
    assert_eq!(err.to_string(), "model overloaded (scripted)");
    assert!(!err.retryable());
    assert!(stream.next().await.is_none());

    let err = complete(p.as_ref(), "x").await.unwrap_err();
    assert_eq!(err.to_string(), "stub failed");

    // A turn without `completed` ends as tool_use when it called tools.
    let third = complete(p.as_ref(), "x").await.unwrap();
    assert_eq!(
        third.tool_calls,
        vec![("stub_call_3_1".into(), "lookup_order".into(), json!({}))]
    );
    assert_eq!(third.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn position_resumes_a_script() {
    let p = stub("refund-script.json", 1).unwrap();
    assert_eq!(
        complete(p.as_ref(), "x").await.unwrap().text,
        "Refund issued."
    );
    assert_eq!(
        complete(p.as_ref(), "x").await.unwrap_err().to_string(),
        "unexpected completion call 3 (script has 2 turns)"
    );
}

#[test]
fn invalid_or_missing_scripts_and_the_disabled_flag_fail_at_build() {
    let err = stub("bad-script.json", 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "stub script turn 2: event 1: unknown event type \"shout\"; expected text_delta, tool_call, completed or failed"
    );
    let err = build(&model(), None, &enabled(), &BuildOptions::default()).unwrap_err();
    assert!(err.to_string().contains("phrony.com/stub-script"), "{err}");
    let options = BuildOptions {
        stub_script: Some(fixture("refund-script.json")),
        ..BuildOptions::default()
    };
    let off = ProviderEnv::from_lookup(|k| {
        (k == "RUNTIME_ENABLE_STUB_PROVIDER").then(|| "no".to_owned())
    });
    assert_eq!(
        build(&model(), None, &off, &options)
            .unwrap_err()
            .to_string(),
        "stub provider is not enabled (set RUNTIME_ENABLE_STUB_PROVIDER=true)"
    );
}
