//! Bounds on what a model may ask for in one response, in memory: a call with no tool name,
//! arguments larger than `max_tool_args_bytes`, and calls beyond `max_tool_calls_per_turn` are
//! tool errors for the model (recorded in the event log), never a session failure and never a
//! dispatch.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use crate::common::*;
use phrony_engine::{DEFAULT_MAX_TOOL_ARGS_BYTES, DEFAULT_MAX_TOOL_CALLS_PER_TURN};
use phrony_ledger::SessionStatus;
use serde_json::json;

/// The `tool.completed` payloads of a session's failed calls, in order: `(code, message)`.
async fn failures(h: &Harness, id: &str) -> Vec<(String, String)> {
    h.events(id)
        .await
        .into_iter()
        .filter(|e| e.event_type == "tool.completed" && e.payload["status"] == "failed")
        .map(|e| {
            let text = |k: &str| e.payload[k].as_str().unwrap_or_default().to_owned();
            (text("error_code"), text("error_message"))
        })
        .collect()
}

#[tokio::test]
async fn a_tool_call_without_a_name_is_a_tool_error_and_the_session_continues() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::calls(&[
                ("", json!({})),
                ("lookup_order", json!({"order_id": "ORD-1"})),
            ]),
            Step::say("Found it."),
        ],
    )
    .await;
    let s = h.start("Look up ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    assert_eq!(h.worker.tools(), ["orders.lookup-order"]);
    let results = tool_results(&h.script.requests()[1]);
    assert_eq!(results.len(), 2, "one result per call the model made");
    assert_eq!(
        results[0],
        (
            "the tool call names no tool; call one of the tools you were given".to_owned(),
            true
        )
    );
    assert!(!results[1].1);
    let failed = failures(&h, &s.id).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, "unknown_tool");
}

#[tokio::test]
async fn arguments_over_the_bound_are_not_dispatched_nor_stored() {
    let huge = "x".repeat(5 * 1024 * 1024);
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", json!({"order_id": huge})),
            Step::say("Too big."),
        ],
    )
    .await;
    let s = h.start("Look up a huge order.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    assert!(h.worker.tools().is_empty(), "nothing reached the worker");
    let (text, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert!(
        text.starts_with("args_too_large: the arguments are 5242895 bytes of JSON; at most"),
        "{text}"
    );
    assert!(
        text.contains(&DEFAULT_MAX_TOOL_ARGS_BYTES.to_string()),
        "{text}"
    );
    let failed = failures(&h, &s.id).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, "args_too_large");
    // The event log keeps the bound: no event carries the 5 MB.
    let (largest, kind) = h
        .events(&s.id)
        .await
        .iter()
        .map(|e| (e.payload.to_string().len(), e.event_type.clone()))
        .max()
        .unwrap();
    assert!(largest < 64 * 1024, "a {kind} event of {largest} bytes");
}

#[tokio::test]
async fn the_arguments_bound_is_configurable() {
    let config = phrony_engine::EngineConfig {
        max_tool_args_bytes: 30,
        ..test_config()
    };
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![
            Step::calls(&[
                ("lookup_order", json!({"order_id": "ORD-1"})),
                (
                    "lookup_order",
                    json!({"order_id": "ORD-1-with-a-long-suffix"}),
                ),
            ]),
            Step::say("One of two."),
        ],
        config,
    )
    .await;
    let s = h.start("Look up two orders.").await;
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["orders.lookup-order"]);
    let results = tool_results(&h.script.requests()[1]);
    assert!(!results[0].1);
    assert!(results[1].1 && results[1].0.contains("at most 30 are allowed"));
}

#[tokio::test]
async fn calls_beyond_the_per_response_bound_each_get_a_tool_error() {
    let calls: Vec<(&str, serde_json::Value)> = (0..300)
        .map(|_| ("lookup_order", json!({"order_id": "ORD-1"})))
        .collect();
    // 64 calls share the worker's 8 slots: each may wait for a slot longer than the harness's
    // short queue wait while the other tests load the machine.
    let config = phrony_engine::EngineConfig {
        queue_wait: std::time::Duration::from_secs(30),
        ..test_config()
    };
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![Step::calls(&calls), Step::say("Looked up a few.")],
        config,
    )
    .await;
    let s = h.start("Look up ORD-1 300 times.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    assert_eq!(
        h.worker.invoked("orders.lookup-order").len(),
        DEFAULT_MAX_TOOL_CALLS_PER_TURN
    );
    let results = tool_results(&h.script.requests()[1]);
    assert_eq!(
        results.len(),
        300,
        "the model gets a result for every call id"
    );
    assert!(
        results[..DEFAULT_MAX_TOOL_CALLS_PER_TURN]
            .iter()
            .all(|r| !r.1)
    );
    let excess = &results[DEFAULT_MAX_TOOL_CALLS_PER_TURN..];
    assert!(excess.iter().all(|r| r.1));
    assert_eq!(
        excess[0].0,
        "too_many_tool_calls: this response requested 300 tool calls; at most 64 run per \
         response, so this one (number 65) was not run; request it again"
    );
    let failed = failures(&h, &s.id).await;
    assert_eq!(failed.len(), 300 - DEFAULT_MAX_TOOL_CALLS_PER_TURN);
    assert!(failed.iter().all(|(code, _)| code == "too_many_tool_calls"));
    assert!(h.store.open_calls(&s.id).await.unwrap().is_empty());
}
