//! Tool visibility (issue #18): a tool that policy denies whatever its arguments in the
//! session's context (principal, session metadata, time, agent) is not offered to the model;
//! the completion records which tools were hidden and by which policy, and a call the model
//! makes to a hidden tool anyway is still decided (denied) and recorded.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{Clock as _, ManualClock, SessionMode};
use phrony_ledger::SessionStatus;
use phrony_providers::{CompletionRequest, Event as ModelEvent, StopReason};
use serde_json::{Value, json};

/// A Policy document named `name` with `scope` and `conditions` (YAML under `conditions:`)
/// that denies.
fn deny_policy(name: &str, scope: &str, conditions: &str) -> (String, String) {
    (
        format!("{name}.yaml"),
        format!(
            "apiVersion: phrony.com/v1\nkind: Policy\nmetadata:\n  name: {name}\n  namespace: ops\n  version: 1.0.0\nspec:\n  scope: {scope}\n  conditions:\n{conditions}  decision:\n    type: deny\n    reason: {name} forbids it.\n"
        ),
    )
}

fn with_policies(policies: Vec<(String, String)>) -> AgentOptions {
    AgentOptions {
        extra_policies: policies,
        ..AgentOptions::default()
    }
}

/// The tool names a request offered the model.
fn offered(request: &CompletionRequest) -> Vec<String> {
    request.tools.iter().map(|t| t.name.clone()).collect()
}

/// The `hidden_tools` of the session's `model.completion` events, in order (`null` when the
/// payload has none: the field is omitted, so such events keep the bytes earlier builds wrote).
async fn hidden_in_completions(h: &Harness, id: &str) -> Vec<Value> {
    h.events(id)
        .await
        .into_iter()
        .filter(|e| e.event_type == "model.completion")
        .map(|e| {
            e.payload
                .get("hidden_tools")
                .cloned()
                .unwrap_or(Value::Null)
        })
        .collect()
}

/// Starts a task as `principal` with `metadata` added to the harness's, and waits for its end.
async fn run_as(h: &Harness, principal: Option<Value>, metadata: &[(&str, &str)]) -> String {
    let mut req = h.start_request(json!("Check ORD-1."), SessionMode::Task);
    req.principal = principal;
    for (k, v) in metadata {
        req.metadata.insert((*k).to_owned(), (*v).to_owned());
    }
    let s = h.engine.start_session(req).await.unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    s.id
}

#[tokio::test]
async fn a_principal_role_deny_hides_the_tool_from_that_principal_only() {
    let opts = with_policies(vec![
        deny_policy(
            "viewers-cannot-refund",
            "tool:payments.issue-refund",
            "    field: phrony.principal.role\n    op: eq\n    value: viewer\n",
        ),
        // Reads an argument too: never hides.
        deny_policy(
            "auditors-small-refunds-only",
            "tool:payments.issue-refund",
            "    all:\n      - field: phrony.principal.role\n        op: eq\n        value: auditor\n      - field: amount\n        op: gt\n        value: 100\n",
        ),
    ]);
    let h = Harness::memory(&opts, vec![Step::say("a"), Step::say("b"), Step::say("c")]).await;
    let viewer = run_as(&h, Some(json!({"role": "viewer"})), &[]).await;
    let ops = run_as(&h, Some(json!({"role": "ops"})), &[]).await;
    let auditor = run_as(&h, Some(json!({"role": "auditor"})), &[]).await;
    let requests = h.script.requests();
    assert_eq!(offered(&requests[0]), ["lookup_order"]);
    // The tutorial's hard limit (amount > 5000) and the auditor's rule read the arguments.
    assert_eq!(offered(&requests[1]), ["lookup_order", "issue_refund"]);
    assert_eq!(offered(&requests[2]), ["lookup_order", "issue_refund"]);
    assert_eq!(
        hidden_in_completions(&h, &viewer).await,
        [json!([{"name": "issue_refund", "policy": "ops/viewers-cannot-refund@1.0.0"}])]
    );
    assert_eq!(hidden_in_completions(&h, &ops).await, [Value::Null]);
    assert_eq!(hidden_in_completions(&h, &auditor).await, [Value::Null]);
    // The operator reads why in the session's inspection.
    let timeline = phrony_engine::store_timeline(&h.store, &viewer)
        .await
        .unwrap();
    let line = format!("{:?}", phrony_engine::inspect(timeline).unwrap());
    assert!(
        line.contains("hidden=issue_refund (ops/viewers-cannot-refund@1.0.0)"),
        "{line}"
    );
}

#[tokio::test]
async fn an_agent_wide_metadata_deny_hides_every_tool_and_the_model_gets_none() {
    let opts = with_policies(vec![deny_policy(
        "no-tools-in-sandbox",
        "agent",
        "    field: phrony.session.metadata.env\n    op: eq\n    value: sandbox\n",
    )]);
    let h = Harness::memory(&opts, vec![Step::say("a"), Step::say("b")]).await;
    let sandbox = run_as(&h, None, &[("env", "sandbox")]).await;
    let prod = run_as(&h, None, &[("env", "prod")]).await;
    let requests = h.script.requests();
    assert!(requests[0].tools.is_empty(), "{:?}", offered(&requests[0]));
    assert_eq!(offered(&requests[1]), ["lookup_order", "issue_refund"]);
    assert_eq!(
        hidden_in_completions(&h, &sandbox).await,
        [json!([
            {"name": "lookup_order", "policy": "ops/no-tools-in-sandbox@1.0.0"},
            {"name": "issue_refund", "policy": "ops/no-tools-in-sandbox@1.0.0"}
        ])]
    );
    assert_eq!(hidden_in_completions(&h, &prod).await, [Value::Null]);
}

#[tokio::test]
async fn a_time_condition_is_checked_again_for_every_completion() {
    let clock = Arc::new(ManualClock::starting_now());
    let closes_at = clock.now().timestamp() + 3_600;
    let agent = refund_agent(&with_policies(vec![deny_policy(
        "refunds-close",
        "tool:payments.issue-refund",
        &format!("    field: phrony.time.unix\n    op: gte\n    value: {closes_at}\n"),
    )]));
    let (store, version_id) = memory_store(&clock, &agent).await;
    let later = Arc::clone(&clock);
    let script = Script::new(vec![
        // The first completion looks the order up; meanwhile two hours pass.
        Step::from_fn(move |_| {
            later.advance(Duration::from_secs(2 * 3_600));
            vec![
                ModelEvent::ToolCall {
                    id: "provider_call_0".to_owned(),
                    name: "lookup_order".to_owned(),
                    args: json!({"order_id": "ORD-1"}),
                },
                completed(StopReason::ToolUse, 10),
            ]
        }),
        Step::say("ORD-1 is a €400 order."),
    ]);
    let h = Harness::on(store, clock, agent, version_id, script).await;
    let id = run_as(&h, None, &[]).await;
    let requests = h.script.requests();
    assert_eq!(offered(&requests[0]), ["lookup_order", "issue_refund"]);
    assert_eq!(offered(&requests[1]), ["lookup_order"]);
    assert_eq!(
        hidden_in_completions(&h, &id).await,
        [
            Value::Null,
            json!([{"name": "issue_refund", "policy": "ops/refunds-close@1.0.0"}])
        ]
    );
}

#[tokio::test]
async fn a_hidden_tool_the_model_calls_anyway_is_denied_and_recorded() {
    let opts = with_policies(vec![deny_policy(
        "viewers-cannot-refund",
        "tool:payments.issue-refund",
        "    field: phrony.principal.role\n    op: eq\n    value: viewer\n",
    )]);
    let h = Harness::memory(
        &opts,
        vec![
            Step::call("issue_refund", refund("ORD-1", 10.0)),
            Step::say("I cannot refund that."),
        ],
    )
    .await;
    let id = run_as(&h, Some(json!({"role": "viewer"})), &[]).await;
    let requests = h.script.requests();
    assert_eq!(offered(&requests[0]), ["lookup_order"]);
    assert_eq!(offered(&requests[1]), ["lookup_order"]);
    assert!(h.worker.tools().is_empty(), "the hidden tool never ran");
    assert_eq!(
        last_tool_result(&requests[1]),
        ("viewers-cannot-refund forbids it.".to_owned(), true)
    );
    let denied = h
        .events(&id)
        .await
        .into_iter()
        .find(|e| e.event_type == "tool.policy_denied")
        .unwrap();
    assert_eq!(
        denied.payload["policy_ref"],
        "ops/viewers-cannot-refund@1.0.0"
    );
}
