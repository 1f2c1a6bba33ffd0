//! Dispatch failures routed per §2.7 and in-flight calls after a restart (§5.8), in memory:
//! no handler fails the turn unless a trigger policy escalates it, an unknown outcome goes by
//! side-effect class, and a restart re-sends reads and asks a human about irreversible writes.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{Engine, EngineConfig, EngineDeps, ErrorKind, LedgerStore, TRIGGER_KEY};
use phrony_ledger::{ApprovalKind, ApprovalStatus, CallStatus, ReviewResolution, SessionStatus};
use serde_json::json;

fn quick_timeouts() -> EngineConfig {
    EngineConfig {
        exec_timeout: Duration::from_millis(300),
        ..test_config()
    }
}

#[tokio::test]
async fn no_handler_fails_the_turn() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::call("issue_refund", refund("ORD-1", 100.0))],
    )
    .await;
    h.worker.disconnect().await;
    let s = h.start("Refund €100 for ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    assert_eq!(
        done.error.as_deref(),
        Some("no handler registered for tool payments.issue-refund@1.0.0")
    );
    let call = h.store.open_calls(&s.id).await.unwrap();
    assert!(
        call.is_empty(),
        "the call is closed, not left queued (reference defect 16)"
    );
}

#[tokio::test]
async fn an_approved_call_whose_dispatch_fails_is_not_put_to_the_approvers_again() {
    // The default agent's `refund-approval-boundary` (amount > 250 → require_approval) holds
    // for €400 but never reads the dispatch trigger: it decided the call before dispatch. The
    // reference re-applied it to the dispatch failure and asked the approvers who had just
    // approved the refund the same question again; here the failure takes its default route.
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::call("issue_refund", refund("ORD-1", 400.0))],
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.worker.disconnect().await;
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("lead-amy", "customer verified"),
        )
        .await
        .unwrap();
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    assert_eq!(
        done.error.as_deref(),
        Some("no handler registered for tool payments.issue-refund@1.0.0")
    );
    let approvals = h.store.session_approvals(&s.id).await.unwrap();
    assert_eq!(approvals.len(), 1, "asked once: {approvals:?}");
    assert_eq!(approvals[0].status, ApprovalStatus::Approved);
}

#[tokio::test]
async fn a_no_handler_trigger_policy_escalates_to_a_human_and_approval_re_dispatches() {
    let opts = AgentOptions {
        extra_policies: vec![(
            "refund-worker-down.yaml".into(),
            r"apiVersion: phrony.com/v1
kind: Policy
metadata:
  name: refund-worker-down
  namespace: payments
  version: 1.0.0
spec:
  scope: tool:payments.issue-refund
  conditions:
    field: phrony.dispatch.trigger
    op: eq
    value: dispatch:no_handler
  decision:
    type: escalate
    reason: No refund worker is connected.
    runtime:
      phrony.com/approver_role: oncall
"
            .into(),
        )],
        ..AgentOptions::default()
    };
    let h = Harness::memory(
        &opts,
        vec![
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Issued after all."),
        ],
    )
    .await;
    h.worker.disconnect().await;
    let s = h.start("Refund €100 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    assert_eq!(approval.reason, "No refund worker is connected.");
    assert_eq!(approval.route, "oncall");
    assert_eq!(
        approval.policy_ref.as_deref(),
        Some("payments/refund-worker-down@1.0.0")
    );
    assert_eq!(approval.policy_runtime[TRIGGER_KEY], "dispatch:no_handler");
    // A worker comes back; the human approves; the same call is sent again.
    let worker = FakeWorker::connect(&h.router).await;
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("oncall-amy", "worker restarted"),
        )
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let sent = worker.invoked("payments.issue-refund");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].call_id, approval.call_id);
}

#[tokio::test]
async fn an_execution_timeout_on_a_read_is_a_tool_error() {
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::say("The order system is slow."),
        ],
        quick_timeouts(),
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Check ORD-1.").await;
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let (text, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert!(
        text.starts_with("indeterminate: tool orders.lookup-order@1.0.0 did not finish"),
        "{text}"
    );
    assert_eq!(
        h.worker.cancels.lock().unwrap().len(),
        1,
        "the worker is told to stop"
    );
}

#[tokio::test]
async fn an_execution_timeout_on_an_irreversible_write_asks_a_human() {
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Refund confirmed."),
        ],
        quick_timeouts(),
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Refund €100 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    assert_eq!(approval.kind, ApprovalKind::OutcomeReview);
    assert!(
        approval.reason.starts_with(
            "tool payments.issue-refund@1.0.0 did not finish within 300ms on worker \
             \"refund-worker-1\""
        ),
        "{}",
        approval.reason
    );
    assert!(
        approval.reason.ends_with(
            "The runtime cannot tell whether payments.issue-refund@1.0.0 took effect: did it \
             happen?"
        ),
        "{}",
        approval.reason
    );
    assert_eq!(approval.policy_ref, None);
    assert_eq!(approval.approvals_required, 1);
    assert_eq!(
        approval.policy_runtime[TRIGGER_KEY],
        "dispatch:indeterminate"
    );
    let call = h.store.get_tool_call(&approval.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::AwaitingApproval);
    // A plain approve is refused: it does not say whether the refund happened.
    let refused = h
        .engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("emad", "looks fine"),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::FailedPrecondition);
    assert!(refused.to_string().contains("outcome review"), "{refused}");
    assert_eq!(h.worker.invoked("payments.issue-refund").len(), 1);
    // The operator checked the payment provider: not refunded; send it again, explicitly.
    h.worker.set_behaviour(Behaviour::Answer);
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            resolve(
                "emad",
                ReviewResolution::Resend,
                "not issued upstream; retry",
            ),
        )
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let sent = h.worker.invoked("payments.issue-refund");
    assert_eq!(sent.len(), 2, "sent, timed out, approved, sent again");
    assert_eq!(sent[0].call_id, sent[1].call_id);
    let call = h.store.get_tool_call(&approval.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!(call.attempt, 2);
}

/// Starts a session whose call is stuck at a worker, then "restarts": a new engine on the same
/// store recovers it.
async fn restart_with_call_in_flight(
    tool_call: Step,
    after: Step,
) -> (Harness, Engine, Arc<Script>, String) {
    let h = Harness::memory(&AgentOptions::default(), vec![tool_call]).await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Go.").await;
    for _ in 0..300 {
        if !h.worker.tools().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let open = h.store.open_calls(&s.id).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(
        open[0].status,
        CallStatus::Dispatched,
        "in flight when the daemon stopped"
    );
    h.worker.set_behaviour(Behaviour::Answer);
    let script = Script::new(vec![after]);
    let engine = Engine::new(EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: Arc::new(ScriptedFactory(script.clone())),
        clock: h.clock.clone(),
        config: test_config(),
    });
    engine.recover().await.unwrap();
    (h, engine, script, s.id)
}

#[tokio::test]
async fn after_a_restart_an_unanswered_read_is_sent_again_with_the_same_call_id() {
    let (h, engine, script, id) = restart_with_call_in_flight(
        Step::call("lookup_order", json!({"order_id": "ORD-1"})),
        Step::say("ORD-1 is a €400 order."),
    )
    .await;
    let done = tokio::time::timeout(Duration::from_secs(10), engine.wait_for(&id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    let sent = h.worker.invoked("orders.lookup-order");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].call_id, sent[1].call_id);
    assert!(
        last_tool_result(&script.requests()[0])
            .0
            .contains("\"total\":400")
    );
}

#[tokio::test]
async fn after_a_restart_an_unanswered_irreversible_write_waits_for_a_human() {
    let (h, engine, script, id) = restart_with_call_in_flight(
        Step::call("issue_refund", refund("ORD-1", 100.0)),
        Step::say("Refund confirmed."),
    )
    .await;
    let paused = tokio::time::timeout(
        Duration::from_secs(10),
        engine.wait_for(&id, &[SessionStatus::AwaitingApproval]),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(paused.status, SessionStatus::AwaitingApproval);
    assert_eq!(
        h.worker.invoked("payments.issue-refund").len(),
        1,
        "not sent twice on its own"
    );
    let approval = h.pending_approval(&id).await;
    assert_eq!(approval.kind, ApprovalKind::OutcomeReview);
    assert!(
        approval.reason.starts_with(
            "the runtime restarted while the call was with worker \"refund-worker-1\""
        ),
        "{}",
        approval.reason
    );
    // A reject (what an approve/reject client sends) means: not re-sent, outcome unknown.
    engine
        .vote(
            VoteTarget::Approval(approval.id),
            reject("emad", "cannot reach the PSP"),
        )
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), engine.wait_for(&id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(h.worker.invoked("payments.issue-refund").len(), 1);
    let decided = h.store.get_approval(approval.id).await.unwrap();
    assert_eq!(decided.status, ApprovalStatus::Denied);
    assert_eq!(decided.resolution, Some(ReviewResolution::Fail));
    let call = h.store.get_tool_call(&approval.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Failed);
    assert_eq!(call.error_code.as_deref(), Some("outcome_unknown"));
    // The model is told the truth: it may have happened; it was not denied.
    let (text, is_error) = last_tool_result(&script.requests()[0]);
    assert!(is_error);
    assert_eq!(
        text,
        "outcome_unknown: outcome unknown, not re-sent by emad (the call may have taken \
         effect): cannot reach the PSP"
    );
}

#[tokio::test]
async fn an_operator_confirming_a_lost_refund_records_it_succeeded_without_a_resend() {
    let (h, engine, script, id) = restart_with_call_in_flight(
        Step::call("issue_refund", refund("ORD-1", 100.0)),
        Step::say("Refund confirmed."),
    )
    .await;
    tokio::time::timeout(
        Duration::from_secs(10),
        engine.wait_for(&id, &[SessionStatus::AwaitingApproval]),
    )
    .await
    .unwrap()
    .unwrap();
    let approval = h.pending_approval(&id).await;
    let mut vote = resolve("emad", ReviewResolution::Happened, "rf_77 is in the PSP");
    vote.result = Some(json!({"refund_id": "rf_77"}));
    engine
        .vote(VoteTarget::Approval(approval.id), vote)
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), engine.wait_for(&id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(
        h.worker.invoked("payments.issue-refund").len(),
        1,
        "never re-sent"
    );
    let call = h.store.get_tool_call(&approval.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!(call.result, Some(json!({"refund_id": "rf_77"})));
    let (text, is_error) = last_tool_result(&script.requests()[0]);
    assert!(!is_error);
    assert_eq!(
        text,
        "the worker did not report this call's outcome; operator emad confirmed that it took \
         effect. Result: {\"refund_id\":\"rf_77\"}"
    );
}

#[tokio::test]
async fn a_binding_without_a_side_effect_class_is_reviewed_not_re_sent_after_a_restart() {
    // A binding whose Tool document was missing has no class in the snapshot.
    let clock = Arc::new(phrony_engine::ManualClock::starting_now());
    let agent = refund_agent(&AgentOptions::default());
    let snapshot = String::from_utf8(agent.snapshot_json()).unwrap();
    let classless = snapshot.replace(
        "\"side_effect_class\":\"irreversible_action\"",
        "\"side_effect_class\":\"\"",
    );
    assert_ne!(classless, snapshot);
    let classless_agent =
        phrony_manifest::CompiledAgent::from_snapshot_json(classless.as_bytes()).unwrap();
    let ledger = memory_ledger(&clock).await;
    let version_id = publish(&ledger, classless, agent.content_hash()).await;
    let store = Arc::new(LedgerStore::new(ledger, Some(cipher())));
    let h = Harness::on(
        store,
        clock,
        classless_agent,
        version_id,
        Script::new(vec![Step::call("issue_refund", refund("ORD-1", 100.0))]),
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Go.").await;
    for _ in 0..300 {
        if !h.worker.tools().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.worker.set_behaviour(Behaviour::Answer);
    let engine = Engine::new(EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: Arc::new(ScriptedFactory(Script::new(vec![Step::say("ok")]))),
        clock: h.clock.clone(),
        config: test_config(),
    });
    engine.recover().await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        engine.wait_for(&s.id, &[SessionStatus::AwaitingApproval]),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        h.pending_approval(&s.id).await.kind,
        ApprovalKind::OutcomeReview
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        h.worker.invoked("payments.issue-refund").len(),
        1,
        "an unknown class is treated as irreversible: never re-sent on its own"
    );
}

#[tokio::test]
async fn a_result_after_the_session_was_cancelled_is_recorded_as_what_happened() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::call("issue_refund", refund("ORD-1", 100.0))],
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Refund €100 for ORD-1.").await;
    for _ in 0..300 {
        if !h.worker.tools().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let call_id = h.worker.invocations.lock().unwrap()[0].call_id.clone();
    h.engine
        .cancel_session(&s.id, &phrony_ledger::Attribution::unverified("alice"))
        .await
        .unwrap();
    assert_eq!(
        h.worker.wait_cancels(1).await,
        std::slice::from_ref(&call_id)
    );
    let cancelled = h.store.get_tool_call(&call_id).await.unwrap();
    assert_eq!(cancelled.status, CallStatus::Cancelled);
    assert_eq!(
        cancelled.error_code.as_deref(),
        Some("cancelled_after_dispatch")
    );
    // The worker had already issued the refund; its answer arrives after the cancellation.
    let held = h.worker.invocations.lock().unwrap()[0].clone();
    h.worker.release(held);
    let mut call = h.store.get_tool_call(&call_id).await.unwrap();
    for _ in 0..300 {
        if call.status != CallStatus::Cancelled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        call = h.store.get_tool_call(&call_id).await.unwrap();
    }
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!(call.result.unwrap()["refund_id"], "rf_2891");
    assert_eq!(
        h.store.get_session(&s.id).await.unwrap().status,
        SessionStatus::Cancelled
    );
}

#[tokio::test]
async fn a_worker_reporting_after_a_restart_resolves_the_call_without_a_resend() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::call("lookup_order", json!({"order_id": "ORD-1"}))],
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Check ORD-1.").await;
    for _ in 0..300 {
        if !h.worker.tools().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let call_id = h.worker.invocations.lock().unwrap()[0].call_id.clone();
    h.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The worker finishes the call late: the router records it through the engine's hooks
    // and acknowledges it.
    let late = FakeWorker::connect(&h.router).await;
    let script = Script::new(vec![Step::say("ORD-1 is a €400 order.")]);
    let engine = Engine::new(EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: Arc::new(ScriptedFactory(script.clone())),
        clock: h.clock.clone(),
        config: EngineConfig {
            recovery_grace: Duration::from_secs(5),
            ..test_config()
        },
    });
    engine.recover().await.unwrap();
    h.router
        .connect(phrony_dispatch::WorkerHello {
            worker_id: "late-worker".into(),
            ..Default::default()
        })
        .await
        .map(|(conn, _outbox)| {
            conn.handle(phrony_dispatch::FromWorker::Result {
                call_id: call_id.clone(),
                payload: serde_json::to_vec(&json!({"order_id": "ORD-1", "total": 400.0})).unwrap(),
                error: None,
            })
            .unwrap();
        })
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), engine.wait_for(&s.id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    assert!(late.tools().is_empty(), "not sent again");
    let call = h.store.get_tool_call(&call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!(call.attempt, 1);
}

/// A binding's `timeout` overrides the daemon's execution deadline for that tool: with a 10 s
/// default, a `lookup_order` bound with `timeout: 300ms` is cut after 300 ms, and its worker told
/// to stop.
#[tokio::test]
async fn a_binding_timeout_shorter_than_the_default_cuts_a_slow_call() {
    let opts = AgentOptions {
        lookup_timeout: Some("300ms".into()),
        ..AgentOptions::default()
    };
    let h = Harness::memory_with(
        &opts,
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::say("The order system is slow."),
        ],
        test_config(),
    )
    .await;
    assert_eq!(h.agent.spec.tools[0].timeout_ms, 300);
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Check ORD-1.").await;
    let ended = tokio::time::timeout(Duration::from_secs(5), h.wait_end(&s.id))
        .await
        .expect("the binding's 300ms deadline, not the default 10s, ends the call");
    assert_eq!(ended.status, SessionStatus::Completed);
    let (text, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert!(
        text.starts_with("indeterminate: tool orders.lookup-order@1.0.0 did not finish"),
        "{text}"
    );
    assert_eq!(
        h.worker.wait_cancels(1).await.len(),
        1,
        "the worker is told to stop"
    );
}
