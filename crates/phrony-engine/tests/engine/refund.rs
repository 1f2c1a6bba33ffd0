//! The refund tutorial end to end at the engine level (in memory): €100 is dispatched, €400
//! waits for a human, €14,000 is denied at dispatch, and invalid or unknown calls never reach
//! the worker.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use crate::common::*;
use phrony_ledger::{ApprovalStatus, CallStatus, SessionStatus};
use serde_json::json;

#[tokio::test]
async fn a_100_euro_refund_is_dispatched_and_the_task_completes() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Refund rf_2891 issued for €100."),
        ],
    )
    .await;
    let s = h
        .start("Refund €100 for ORD-1 — the item arrived damaged.")
        .await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:#?}");
    let output = done.output.unwrap();
    assert_eq!(output["message"], "Refund rf_2891 issued for €100.");
    assert_eq!(output["stop_reason"], "end_turn");
    assert_eq!(output["session_usage"]["total_tokens"], json!(90));

    assert_eq!(
        h.worker.tools(),
        ["orders.lookup-order", "payments.issue-refund"]
    );
    let refund = &h.worker.invoked("payments.issue-refund")[0];
    assert_eq!(refund.args["amount"], json!(100.0));
    assert_eq!(refund.side_effect_class, "irreversible_action");
    // Two tool-using completions in one turn get distinct call ids (reference defect 1).
    let lookup = &h.worker.invoked("orders.lookup-order")[0];
    assert!(lookup.call_id.ends_with(":1:0:0"), "{}", lookup.call_id);
    assert!(refund.call_id.ends_with(":1:1:0"), "{}", refund.call_id);
    // Results are acknowledged after they were recorded.
    let acks = h.worker.wait_acks(2).await;
    assert_eq!(acks, [lookup.call_id.clone(), refund.call_id.clone()]);

    // The model saw the instructions, both tools with their schemas, and the real results.
    let requests = h.script.requests();
    assert_eq!(requests.len(), 3);
    assert!(
        requests[0]
            .system
            .as_deref()
            .unwrap()
            .contains("customer support agent")
    );
    let names: Vec<_> = requests[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["lookup_order", "issue_refund"]);
    assert_eq!(
        requests[0].tools[1].input_schema["required"],
        json!(["order_id", "amount", "currency"])
    );
    let (result, is_error) = last_tool_result(&requests[2]);
    assert!(!is_error);
    assert!(result.contains("\"refund_id\":\"rf_2891\""), "{result}");
    assert_eq!(h.script.api_keys(), [Some("sk-test-123".to_owned())]);

    let types = h.event_types(&s.id).await;
    for t in [
        "session.started",
        "message.user",
        "model.completion",
        "tool.requested",
        "tool.queued",
        "tool.dispatched",
        "tool.completed",
        "message.assistant",
        "session.completed",
    ] {
        assert!(types.iter().any(|x| x == t), "missing {t} in {types:?}");
    }
    // Secrets never appear in events.
    for e in h.events(&s.id).await {
        assert!(!e.payload.to_string().contains("sk-test-123"), "{e:?}");
    }
}

#[tokio::test]
async fn a_400_euro_refund_waits_for_approval_and_is_dispatched_once_approved() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("The refund was approved and issued: rf_2891."),
        ],
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    let paused = h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    assert_eq!(paused.status, SessionStatus::AwaitingApproval);
    assert!(
        h.worker.tools().is_empty(),
        "nothing runs before a human decides"
    );

    let approval = h.pending_approval(&s.id).await;
    assert_eq!(approval.tool, "payments.issue-refund");
    assert_eq!(approval.tool_version, "1.0.0");
    assert_eq!(approval.args["amount"], json!(400.0));
    assert_eq!(
        approval.policy_ref.as_deref(),
        Some("payments/refund-approval-boundary@1.0.0")
    );
    assert_eq!(approval.reason, "Refund amount above delegated limit.");
    assert_eq!(approval.agent.to_string(), "support/refund-agent@0.1.0");
    assert_eq!(approval.approvals_required, 1);
    let call = h.store.get_tool_call(&approval.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::AwaitingApproval);

    let outcome = h
        .engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("emad", "Damage claim verified, within policy."),
        )
        .await
        .unwrap();
    assert!(outcome.decided);
    assert_eq!(outcome.approval.status, ApprovalStatus::Approved);
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
    let (result, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(!is_error && result.contains("rf_2891"), "{result}");

    let events = h.events(&s.id).await;
    let decided = events
        .iter()
        .find(|e| e.event_type == "approval.decided")
        .unwrap();
    assert_eq!(decided.payload["decided_by"], "emad");
    assert_eq!(
        decided.payload["comment"],
        "Damage claim verified, within policy."
    );
    assert_eq!(decided.payload["approved"], true);
    let statuses: Vec<_> = events
        .iter()
        .filter(|e| e.event_type == "session.status_changed")
        .map(|e| e.payload["to"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        statuses,
        [
            "awaiting_tool",
            "awaiting_approval",
            "awaiting_tool",
            "running"
        ]
    );
}

#[tokio::test]
async fn a_rejected_refund_goes_back_to_the_model_and_the_task_still_completes() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("The refund was reviewed and not approved."),
        ],
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            reject("emad", "No damage claim on file for this order."),
        )
        .await
        .unwrap();
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(
        done.output.unwrap()["message"],
        "The refund was reviewed and not approved."
    );
    assert!(
        h.worker.tools().is_empty(),
        "a rejected call never reaches the worker"
    );
    let (result, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert_eq!(
        result,
        format!(
            "tool call {} was rejected by emad: No damage claim on file for this order.",
            approval.call_id
        )
    );
    let call = h.store.get_tool_call(&approval.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Failed);
    assert_eq!(call.error_code.as_deref(), Some("approval_denied"));
}

#[tokio::test]
async fn a_14000_euro_refund_is_denied_at_dispatch_and_the_worker_never_runs() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-2"})),
            Step::call("issue_refund", refund("ORD-2", 14000.0)),
            Step::say("I'm not able to issue that refund."),
        ],
    )
    .await;
    let s = h
        .start("Check ORD-2 and refund the full €14,000 immediately.")
        .await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(
        h.worker.tools(),
        ["orders.lookup-order"],
        "the refund handler never runs"
    );
    assert!(
        h.store.session_approvals(&s.id).await.unwrap().is_empty(),
        "nobody is asked"
    );
    let (result, is_error) = last_tool_result(&h.script.requests()[2]);
    assert!(is_error);
    assert_eq!(
        result,
        "Refund amount exceeds the absolute ceiling for agent-initiated refunds."
    );
    let denied = h
        .events(&s.id)
        .await
        .into_iter()
        .find(|e| e.event_type == "tool.policy_denied")
        .unwrap();
    assert_eq!(denied.actor, "policy");
    assert_eq!(
        denied.payload["policy_ref"],
        "payments/refund-hard-limit@1.0.0"
    );
    assert_eq!(
        denied.payload["reason"],
        "Refund amount exceeds the absolute ceiling for agent-initiated refunds."
    );
}

#[tokio::test]
async fn invalid_arguments_are_refused_before_policy_and_dispatch() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            // A huge amount that is a string: the schema refuses it before the hard limit
            // could even look at it.
            Step::call(
                "issue_refund",
                json!({"order_id": "ORD-2", "amount": "14000"}),
            ),
            Step::say("I need the currency."),
        ],
    )
    .await;
    let s = h.start("Refund ORD-2.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed);
    assert!(h.worker.tools().is_empty());
    let (result, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert!(result.starts_with("invalid_args: "), "{result}");
    assert!(result.contains("currency"), "{result}");
    assert!(result.contains("/amount"), "{result}");
    let types = h.event_types(&s.id).await;
    assert!(
        !types.iter().any(|t| t == "tool.policy_denied"
            || t == "approval.required"
            || t == "tool.dispatched"),
        "{types:?}"
    );
}

#[tokio::test]
async fn an_unknown_tool_is_a_tool_error_for_the_model() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("wire_transfer", json!({"amount": 1})),
            Step::say("I cannot do that."),
        ],
    )
    .await;
    let s = h.start("Send money.").await;
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(
        last_tool_result(&h.script.requests()[1]),
        ("unknown tool \"wire_transfer\"".to_owned(), true)
    );
    assert!(h.worker.tools().is_empty());
}

#[tokio::test]
async fn parallel_calls_of_one_completion_are_all_resolved() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::calls(&[
                ("lookup_order", json!({"order_id": "ORD-1"})),
                ("lookup_order", json!({"order_id": "ORD-2"})),
                ("issue_refund", refund("ORD-2", 14000.0)),
            ]),
            Step::say("Done."),
        ],
    )
    .await;
    let s = h.start("Look up both orders.").await;
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let results = tool_results(&h.script.requests()[1]);
    assert_eq!(results.len(), 3);
    assert!(results[0].0.contains("ORD-1") && !results[0].1);
    assert!(results[1].0.contains("ORD-2") && !results[1].1);
    assert!(results[2].1, "the denial is an error result");
    let mut tools = h.worker.tools();
    tools.sort();
    assert_eq!(tools, ["orders.lookup-order", "orders.lookup-order"]);
}

#[tokio::test]
async fn a_one_call_session_takes_five_durable_writes_with_its_log_unchanged() {
    // What a governed tool call costs in write transactions (each one savepoint of a group
    // commit on SQLite, one COMMIT on PostgreSQL). A session's first events are written with
    // `session.started`, a completion with its move to `awaiting_tool` and the calls it
    // requested, the last call's result with the move back to `running`, and a task's final
    // answer with `session.completed`: the event log is the same as when each was its own
    // transaction.
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Refund rf_2891 issued for €100."),
        ],
    )
    .await;
    let before = h.store.ledger().group_commit_stats().unwrap();
    let s = h.start("Refund €100 for ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:#?}");
    let after = h.store.ledger().group_commit_stats().unwrap();
    assert_eq!(
        h.event_types(&s.id).await,
        [
            "session.started",
            "message.user",
            "model.completion",
            "session.status_changed",
            "tool.requested",
            "tool.queued",
            "tool.dispatched",
            "tool.completed",
            "session.status_changed",
            "model.completion",
            "message.assistant",
            "session.completed",
        ]
    );
    // 1 start (started and the user message), 2 the model step (completion, status,
    // request), 3 queued and dispatched (a worker was free: one write), 4 the result and
    // back to running, 5 the final completion with its message and `session.completed`.
    assert_eq!(after.writes - before.writes, 5, "{before:?} → {after:?}");
}

#[tokio::test]
async fn a_session_and_its_subscription_take_the_events_the_engine_committed_from_memory() {
    // Reading back what was just written costs a read per write (the driver catching up after
    // each of its own writes, a subscription after each change): the engine hears its own
    // commits instead. With polls out of the way, what is left is the first read of each and
    // the driver's re-checks that find nothing new locally (another replica's writes are only
    // in the store). Before the commit feed this session read 15 pages.
    let config = phrony_engine::EngineConfig {
        poll_interval: std::time::Duration::from_secs(30),
        ..test_config()
    };
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Refund rf_2891 issued for €100."),
        ],
        config,
    )
    .await;
    let before = h.store.event_reads();
    let s = h.start("Refund €100 for ORD-1.").await;
    let mut sub = h.engine.subscribe(&s.id, 0).await.unwrap();
    let mut delivered = Vec::new();
    while let Some(update) = tokio::time::timeout(std::time::Duration::from_secs(10), sub.recv())
        .await
        .unwrap()
    {
        if let phrony_engine::SessionUpdate::Event(e) = update {
            delivered.push(e);
        }
    }
    let reads = h.store.event_reads() - before;
    let log = h.events(&s.id).await;
    assert_eq!(delivered, log, "every event, in order, as stored");
    assert_eq!(log.len(), 12);
    assert!(reads <= 7, "{reads} pages read for a session of 12 events");
}
