//! Session behaviour (in memory): conversation mode and its message queue, the seed's
//! reject-then-approve conversation, limits with accurate statuses, subscriptions, and a
//! restart of the engine over the same store.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{Engine, EngineDeps, ErrorKind, SessionMode, SessionUpdate, StartSession};
use phrony_ledger::{ApprovalStatus, SessionStatus};
use serde_json::json;
use tokio::sync::Notify;

#[tokio::test]
async fn a_conversation_parks_and_processes_queued_messages_in_order() {
    let gate = Arc::new(Notify::new());
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::say("Hello! How can I help?").gated(gate.clone()),
            Step::say("answer 2"),
            Step::say("answer 3"),
            Step::say("answer 4"),
        ],
    )
    .await;
    let s = h.start_conversation("hi").await;
    // While turn 1 runs, three more messages arrive; none may be dropped or reordered.
    for (i, text) in ["second", "third", "fourth"].iter().enumerate() {
        let turn = h
            .engine
            .send_user_message(&s.id, &phrony_ledger::Attribution::unverified("emad"), text)
            .await
            .unwrap();
        assert_eq!(turn, Some(u32::try_from(i).unwrap() + 2));
    }
    gate.notify_one();
    // Wait for the fourth answer, then for the session to park.
    for _ in 0..500 {
        if h.script.requests().len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let parked = h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert_eq!(parked.status, SessionStatus::AwaitingInput);
    let requests = h.script.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(user_texts(&requests[0]), ["hi"]);
    assert_eq!(user_texts(&requests[1]), ["hi", "second"]);
    assert_eq!(
        user_texts(&requests[3]),
        ["hi", "second", "third", "fourth"]
    );
    // The history alternates user and assistant messages in order.
    let roles: Vec<_> = requests[3]
        .messages
        .iter()
        .map(|m| format!("{:?}", m.role))
        .collect();
    assert_eq!(
        roles,
        [
            "User",
            "Assistant",
            "User",
            "Assistant",
            "User",
            "Assistant",
            "User"
        ]
    );

    // Completing the session keeps the last assistant message as the output.
    let done = h
        .engine
        .complete_session(&s.id, &phrony_ledger::Attribution::unverified("emad"))
        .await
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(done.output.unwrap()["message"], "answer 4");
    let err = h
        .engine
        .send_user_message(
            &s.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "more",
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::FailedPrecondition);
}

#[tokio::test]
async fn the_tutorial_conversation_rejects_then_approves() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::say("ORD-1 is a €400 order, delivered and refund-eligible."),
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("The refund was reviewed and not approved."),
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Refund rf_2891 issued."),
        ],
    )
    .await;
    let s = h
        .start_conversation("Can you check order ORD-1 for me?")
        .await;
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert_eq!(h.worker.tools(), ["orders.lookup-order"]);

    h.engine
        .send_user_message(
            &s.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "Refund €400 for ORD-1 — the item arrived damaged.",
        )
        .await
        .unwrap();
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let first = h.pending_approval(&s.id).await;
    h.engine
        .vote(
            VoteTarget::Approval(first.id),
            reject("emad", "No damage claim on file for this order."),
        )
        .await
        .unwrap();
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;

    h.engine
        .send_user_message(
            &s.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "The claim checks out now, please refund.",
        )
        .await
        .unwrap();
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let second = h.pending_approval(&s.id).await;
    assert_ne!(second.call_id, first.call_id);
    assert!(second.call_id.ends_with(":3:0:0"), "{}", second.call_id);
    h.engine
        .vote(
            VoteTarget::Approval(second.id),
            approve("emad", "Damage claim verified, within policy."),
        )
        .await
        .unwrap();
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert_eq!(
        h.worker.tools(),
        ["orders.lookup-order", "payments.issue-refund"]
    );
    let requests = h.script.requests();
    assert!(
        last_tool_result(&requests[3])
            .0
            .contains("was rejected by emad")
    );
    assert!(last_tool_result(&requests[5]).0.contains("rf_2891"));
}

#[tokio::test]
async fn task_sessions_take_no_further_messages_and_empty_messages_are_refused() {
    let gate = Arc::new(Notify::new());
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::say("ok").gated(gate.clone())],
    )
    .await;
    let s = h.start("hi").await;
    let err = h
        .engine
        .send_user_message(
            &s.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "more",
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::FailedPrecondition);
    assert!(err.message.contains("task mode"), "{}", err.message);
    let err = h
        .engine
        .send_user_message(&s.id, &phrony_ledger::Attribution::unverified("emad"), "  ")
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert_eq!(err.message, "user_message.text must be non-empty");
    gate.notify_one();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
}

#[tokio::test]
async fn a_stored_version_is_parsed_and_compiled_once_per_engine() {
    let h = Harness::memory(&AgentOptions::default(), vec![]).await;
    let hash = h.agent.content_hash();
    let snapshot = String::from_utf8(h.agent.snapshot_json()).unwrap();
    let first = h
        .engine
        .prepare_version(h.version_id, &hash, &snapshot)
        .unwrap();
    assert_eq!(first.agent().content_hash(), hash);
    // Prepared before: the stored text is not parsed again.
    let again = h
        .engine
        .prepare_version(h.version_id, &hash, "not a snapshot")
        .unwrap();
    assert_eq!(again.agent().content_hash(), hash);
    // Another content hash under the id is prepared afresh, and a snapshot that does not
    // load is an internal error naming the version.
    let err = h
        .engine
        .prepare_version(h.version_id, "sha256:other", "not a snapshot")
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Internal);
    assert!(
        err.message.starts_with(&format!(
            "the stored snapshot of agent version {} does not load: ",
            h.version_id
        )),
        "{}",
        err.message
    );
    // Sessions of the version run on what was prepared.
    let s = h.start("Refund €400 for ORD-1.").await;
    assert_eq!(s.agent_version_id, h.version_id);
}

#[tokio::test]
async fn start_checks_secrets_and_input() {
    let h = Harness::memory(&AgentOptions::default(), vec![]).await;
    let mut req = h.start_request(json!("hi"), SessionMode::Task);
    req.secrets.clear();
    let err = h.engine.start_session(req).await.unwrap_err();
    assert_eq!(err.message, "missing resolved secret \"openai\"");
    let mut req = h.start_request(json!("hi"), SessionMode::Task);
    req.secrets
        .push(phrony_engine::PlainSecret::new("github", "x"));
    let err = h.engine.start_session(req).await.unwrap_err();
    assert_eq!(err.message, "unknown resolved secret \"github\"");
    let req = h.start_request(json!([1, 2]), SessionMode::Task);
    let err = h.engine.start_session(req).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert_eq!(err.message, "input must be a JSON object");
    let req = h.start_request(json!({"message": 7}), SessionMode::Task);
    assert_eq!(
        h.engine.start_session(req).await.unwrap_err().message,
        "input.message must be a string"
    );
}

#[tokio::test]
async fn a_token_limit_hit_mid_turn_fails_a_task_without_running_the_tools() {
    let h = Harness::memory(
        &AgentOptions::with_limits("    max_tokens_per_run: 25\n"),
        vec![Step::call("lookup_order", json!({"order_id": "ORD-1"}))],
    )
    .await;
    let s = h.start("Look up ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    assert_eq!(
        done.error.as_deref(),
        Some("run limit max_tokens_per_run exceeded (on_limit=halt)")
    );
    assert!(h.worker.tools().is_empty());
}

#[tokio::test]
async fn a_token_budget_the_results_spend_halts_a_conversation_before_it_runs_again() {
    // The budget covers the first completion and its call, not the next request with the
    // result in it: the session halts from waiting for its tools, never back in `running`
    // (the result could not carry the move back: its check needs the next request).
    let h = Harness::memory(
        &AgentOptions::with_limits("    max_tokens_per_run: 120\n"),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::say("never asked"),
        ],
    )
    .await;
    let s = h.start_conversation("Look up ORD-1.").await;
    let parked = h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert_eq!(parked.status, SessionStatus::AwaitingInput);
    assert_eq!(h.worker.tools(), ["orders.lookup-order"], "the call ran");
    assert_eq!(
        h.script.requests().len(),
        1,
        "the second completion never runs"
    );
    let changes: Vec<_> = h
        .events(&s.id)
        .await
        .into_iter()
        .filter(|e| e.event_type == "session.status_changed")
        .map(|e| (e.payload["to"].clone(), e.payload["reason"].clone()))
        .collect();
    assert_eq!(
        changes,
        [
            (json!("awaiting_tool"), serde_json::Value::Null),
            (
                json!("awaiting_input"),
                json!("run limit max_tokens_per_run exceeded (on_limit=halt)")
            ),
        ]
    );
}

#[tokio::test]
async fn a_limit_hit_in_a_conversation_parks_it_with_input_blocked() {
    let h = Harness::memory(
        &AgentOptions::with_limits("    max_loop_iterations: 2\n"),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::call("lookup_order", json!({"order_id": "ORD-2"})),
            Step::call("lookup_order", json!({"order_id": "ORD-3"})),
        ],
    )
    .await;
    let s = h.start_conversation("Look up everything.").await;
    let parked = h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert_eq!(
        parked.status,
        SessionStatus::AwaitingInput,
        "not left running (reference defect 12)"
    );
    assert_eq!(
        h.script.requests().len(),
        2,
        "the third completion never runs"
    );
    assert_eq!(h.worker.tools().len(), 2);
    let err = h
        .engine
        .send_user_message(
            &s.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "go on",
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::FailedPrecondition);
    assert!(
        err.message
            .ends_with("run limit max_loop_iterations exceeded (on_limit=halt)"),
        "{}",
        err.message
    );
    let changes: Vec<_> = h
        .events(&s.id)
        .await
        .into_iter()
        .filter(|e| e.event_type == "session.status_changed")
        .collect();
    // The first result moved the session back to running with it; the second did not, since
    // the loop budget stops the next completion: the session halts from waiting for its tools.
    let path: Vec<_> = changes
        .iter()
        .map(|e| e.payload["to"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        path,
        [
            "awaiting_tool",
            "running",
            "awaiting_tool",
            "awaiting_input"
        ]
    );
    let changed = changes.last().unwrap();
    assert_eq!(changed.payload["from"], "awaiting_tool");
    assert_eq!(
        changed.payload["reason"],
        "run limit max_loop_iterations exceeded (on_limit=halt)"
    );
    // The operator can still complete it.
    assert_eq!(
        h.engine
            .complete_session(&s.id, &phrony_ledger::Attribution::unverified("emad"))
            .await
            .unwrap()
            .status,
        SessionStatus::Completed
    );
}

#[tokio::test]
async fn the_wall_clock_excludes_approval_waits_and_fails_the_session_when_spent() {
    let h = Harness::memory(
        &AgentOptions::with_limits("    max_wall_clock_seconds: 60\n"),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("done").gated(Arc::new(Notify::new())),
        ],
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    // Ten minutes waiting for a human do not count.
    h.clock.advance(Duration::from_secs(600));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        h.store.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
    let approval = h.pending_approval(&s.id).await;
    h.engine
        .vote(VoteTarget::Approval(approval.id), approve("emad", "ok"))
        .await
        .unwrap();
    // The next completion hangs; 61 s of running time spend the budget.
    for _ in 0..200 {
        if h.script.requests().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.clock.advance(Duration::from_secs(61));
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    assert_eq!(
        done.error.as_deref(),
        Some("run limit max_wall_clock_seconds exceeded (on_limit=halt)")
    );
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}

/// A session that looks an order up and answers, started, and a subscription from its start.
async fn lookup_then_answer_followed() -> (
    Harness,
    phrony_engine::SessionHandle,
    phrony_engine::Subscription,
) {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::say("ORD-1 is refund-eligible."),
        ],
    )
    .await;
    let s = h.start("Check ORD-1.").await;
    let sub = h.engine.subscribe(&s.id, 0).await.unwrap();
    (h, s, sub)
}

#[tokio::test]
async fn a_subscription_delivers_every_event_in_order_and_ends_with_the_session() {
    let (h, s, mut sub) = lookup_then_answer_followed().await;
    let mut seqs = Vec::new();
    let mut deltas = String::new();
    let mut last_type = String::new();
    while let Some(update) = tokio::time::timeout(Duration::from_secs(10), sub.recv())
        .await
        .unwrap()
    {
        match update {
            SessionUpdate::Event(e) => {
                seqs.push(e.seq);
                last_type = e.event_type;
            }
            SessionUpdate::TextDelta { text, .. } => deltas.push_str(&text),
        }
    }
    assert_eq!(last_type, "session.completed");
    let expected: Vec<u64> = (1..=u64::try_from(seqs.len()).unwrap()).collect();
    assert_eq!(seqs, expected, "gap-free, in order, from the start");
    assert_eq!(h.events(&s.id).await.len(), seqs.len());
    // Deltas are best-effort; when seen they are the streamed text.
    assert!(
        deltas.is_empty() || deltas == "ORD-1 is refund-eligible.",
        "{deltas}"
    );
    // A late subscriber replays from the store and ends at once.
    let mut late = h.engine.subscribe(&s.id, 3).await.unwrap();
    let mut n = 0;
    while let Some(SessionUpdate::Event(e)) = late.recv().await {
        assert_eq!(e.seq, 4 + n);
        n += 1;
    }
    assert_eq!(n, u64::try_from(seqs.len()).unwrap() - 3);
}

/// A subscriber sees the text a completion streams only after the events committed before that
/// completion began: the answer's deltas come after the tool result it answers. (The result and
/// the move back to `running` commit together, and the next completion may stream before the
/// subscription's task runs: it must take the committed events first, whatever is ready.)
#[tokio::test]
async fn a_subscriber_sees_the_tool_result_before_the_text_streamed_after_it() {
    for round in 0..30 {
        let (_h, _s, mut sub) = lookup_then_answer_followed().await;
        let mut seen = Vec::new();
        while let Some(update) = tokio::time::timeout(Duration::from_secs(10), sub.recv())
            .await
            .unwrap()
        {
            match update {
                SessionUpdate::Event(e) => seen.push(e.event_type),
                SessionUpdate::TextDelta { .. } => seen.push("(text)".to_owned()),
            }
        }
        if let Some(text) = seen.iter().position(|t| t == "(text)") {
            let result = seen.iter().position(|t| t == "tool.completed");
            assert!(
                result.is_some_and(|r| r < text),
                "round {round}: streamed text before the tool result: {seen:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_restarted_engine_resumes_a_session_waiting_for_approval() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::call("issue_refund", refund("ORD-1", 400.0))],
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;

    // A new engine over the same store (the daemon restarted); the model continues.
    let script = Script::new(vec![Step::say("Refund rf_2891 issued.")]);
    let engine = Engine::new(EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: Arc::new(ScriptedFactory(script.clone())),
        clock: h.clock.clone(),
        config: test_config(),
    });
    let report = engine.recover().await.unwrap();
    assert_eq!(report.parked, std::slice::from_ref(&s.id), "{report:?}");
    assert_eq!(
        h.store.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
    engine
        .vote(VoteTarget::Approval(approval.id), approve("emad", "ok"))
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), engine.wait_for(&s.id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(done.output.unwrap()["message"], "Refund rf_2891 issued.");
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
    assert_eq!(
        script.api_keys(),
        [Some("sk-test-123".to_owned())],
        "the key comes back from the store"
    );
    // The resumed model saw the whole conversation, the approved call's result included.
    let request = &script.requests()[0];
    assert_eq!(user_texts(request)[0], "Refund €400 for ORD-1.");
    assert!(last_tool_result(request).0.contains("rf_2891"));
    assert_eq!(
        h.store.get_approval(approval.id).await.unwrap().status,
        ApprovalStatus::Approved
    );
}

#[tokio::test]
async fn principal_claims_and_metadata_reach_the_policies() {
    let opts = AgentOptions {
        extra_policies: vec![(
            "interns-cannot-refund.yaml".into(),
            r"apiVersion: phrony.com/v1
kind: Policy
metadata:
  name: interns-cannot-refund
  namespace: payments
  version: 2.1.0
spec:
  scope: tool:payments.issue-refund
  conditions:
    all:
      - field: phrony.principal.role
        op: eq
        value: intern
      - field: phrony.session.metadata.ticket_id
        op: exists
  decision:
    type: deny
    reason: Interns cannot issue refunds.
"
            .into(),
        )],
        ..AgentOptions::default()
    };
    let h = Harness::memory(
        &opts,
        vec![
            Step::call("issue_refund", refund("ORD-1", 10.0)),
            Step::say("no"),
        ],
    )
    .await;
    let mut req: StartSession = h.start_request(json!("Refund €10."), SessionMode::Task);
    req.principal = Some(json!({"role": "intern"}));
    let s = h.engine.start_session(req).await.unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert!(h.worker.tools().is_empty());
    assert_eq!(
        last_tool_result(&h.script.requests()[1]).0,
        "Interns cannot issue refunds."
    );
    let denied = h
        .events(&s.id)
        .await
        .into_iter()
        .find(|e| e.event_type == "tool.policy_denied")
        .unwrap();
    assert_eq!(
        denied.payload["policy_ref"],
        "payments/interns-cannot-refund@2.1.0"
    );
}

fn escalating(limits: &str) -> AgentOptions {
    AgentOptions {
        limits: Some(limits.to_owned()),
        extra_policies: vec![(
            "budget-escalation.yaml".into(),
            r"apiVersion: phrony.com/v1
kind: Policy
metadata:
  name: budget-escalation
  namespace: ops
  version: 1.0.0
spec:
  scope: agent
  conditions:
    field: phrony.dispatch.trigger
    op: eq
    value: limit:escalate
  decision:
    type: escalate
    reason: The run needs more budget.
    runtime:
      phrony.com/approver_role: ops
"
            .into(),
        )],
        ..AgentOptions::default()
    }
}

#[tokio::test]
async fn an_escalated_limit_is_a_durable_approval_that_raises_the_budget() {
    let h = Harness::memory(
        &escalating("    max_loop_iterations: 1\n    on_limit: escalate\n"),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::say("ORD-1 is a €400 order."),
        ],
    )
    .await;
    let s = h.start("Check ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    assert_eq!(approval.tool, phrony_engine::LIMIT_TOOL);
    assert_eq!(approval.tool_version, "max_loop_iterations");
    assert_eq!(
        approval.args,
        json!({"limit": "max_loop_iterations", "used": 1, "max": 1})
    );
    assert_eq!(approval.reason, "The run needs more budget.");
    assert_eq!(approval.route, "ops");
    assert_eq!(
        approval.policy_ref.as_deref(),
        Some("ops/budget-escalation@1.0.0")
    );
    assert_eq!(
        approval.policy_runtime[phrony_engine::TRIGGER_KEY],
        "limit:escalate"
    );
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("ops-olga", "one more step"),
        )
        .await
        .unwrap();
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(done.output.unwrap()["message"], "ORD-1 is a €400 order.");
    // The model never sees the pseudo call.
    let results = tool_results(&h.script.requests()[1]);
    assert_eq!(results.len(), 1);
    assert!(results[0].0.contains("ORD-1"));
}

#[tokio::test]
async fn a_rejected_limit_escalation_halts() {
    let h = Harness::memory(
        &escalating("    max_loop_iterations: 1\n    on_limit: escalate\n"),
        vec![Step::call("lookup_order", json!({"order_id": "ORD-1"}))],
    )
    .await;
    let s = h.start("Check ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            reject("ops-olga", "enough"),
        )
        .await
        .unwrap();
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    assert_eq!(
        done.error.as_deref(),
        Some("run limit max_loop_iterations exceeded (on_limit=escalate)")
    );
    assert_eq!(h.script.requests().len(), 1);
}

#[tokio::test]
async fn escalate_without_a_matching_policy_halts() {
    let h = Harness::memory(
        &AgentOptions::with_limits("    max_loop_iterations: 1\n    on_limit: escalate\n"),
        vec![Step::call("lookup_order", json!({"order_id": "ORD-1"}))],
    )
    .await;
    let s = h.start("Check ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    assert_eq!(
        done.error.as_deref(),
        Some("run limit max_loop_iterations exceeded (on_limit=escalate)")
    );
    assert!(h.store.session_approvals(&s.id).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_stub_provider_resumes_its_script_after_a_restart() {
    let script = r#"{"turns": [
      [{"type": "tool_call", "name": "issue_refund",
        "args": {"order_id": "ORD-1", "amount": 400, "currency": "EUR"}},
       {"type": "completed", "stop_reason": "tool_calls"}],
      [{"type": "text_delta", "text": "Refund rf_2891 issued."},
       {"type": "completed", "stop_reason": "stop"}]
    ]}"#;
    let opts = AgentOptions {
        stub_script: Some(script.to_owned()),
        ..AgentOptions::default()
    };
    let stub = || {
        Arc::new(phrony_engine::DefaultProviderFactory {
            env: phrony_providers::ProviderEnv {
                stub_enabled: true,
                ..Default::default()
            },
            options: phrony_providers::BuildOptions::default(),
        })
    };
    let h = Harness::memory(&opts, vec![]).await;
    let engine = Engine::new(EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: stub(),
        clock: h.clock.clone(),
        config: test_config(),
    });
    let mut req = h.start_request(json!("Refund €400 for ORD-1."), SessionMode::Task);
    req.secrets.clear();
    let s = engine.start_session(req).await.unwrap();
    let paused = tokio::time::timeout(
        Duration::from_secs(10),
        engine.wait_for(&s.id, &[SessionStatus::AwaitingApproval]),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(paused.status, SessionStatus::AwaitingApproval);
    engine.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let restarted = Engine::new(EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: stub(),
        clock: h.clock.clone(),
        config: test_config(),
    });
    restarted.recover().await.unwrap();
    let approval = h.pending_approval(&s.id).await;
    restarted
        .vote(VoteTarget::Approval(approval.id), approve("emad", "ok"))
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), restarted.wait_for(&s.id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    assert_eq!(done.output.unwrap()["message"], "Refund rf_2891 issued.");
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}
