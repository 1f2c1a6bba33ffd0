//! Approval semantics through the engine (in memory): quorum of distinct actors, veto,
//! comprehension, edited arguments (re-validated, re-evaluated with `on_modify: revalidate`),
//! `on_reject: fail`, timeout defaults, the approval-wait budget, and cancellation.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::time::Duration;

use crate::common::*;
use phrony_engine::ErrorKind;
use phrony_ledger::{ApprovalStatus, SessionStatus, Vote};
use serde_json::json;

fn refund_then_say() -> Vec<Step> {
    vec![
        Step::call("issue_refund", refund("ORD-1", 400.0)),
        Step::say("Done."),
    ]
}

#[tokio::test]
async fn quorum_of_two_needs_two_distinct_actors_and_refuses_a_duplicate_vote() {
    let h = Harness::memory(
        &AgentOptions::with_decision("    approvals_required: 2\n"),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    assert_eq!(approval.approvals_required, 2);

    let first = h
        .engine
        .vote(VoteTarget::Approval(approval.id), approve("alice", "ok"))
        .await
        .unwrap();
    assert!(!first.decided);
    assert_eq!(first.approval.status, ApprovalStatus::Pending);
    assert_eq!(first.approval.approvals_received, 1);

    let dup = h
        .engine
        .vote(VoteTarget::Approval(approval.id), approve("alice", "again"))
        .await
        .unwrap_err();
    assert_eq!(dup.kind, ErrorKind::FailedPrecondition);
    assert_eq!(
        dup.message,
        "actor \"alice\" already decided on this approval"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        h.worker.tools().is_empty(),
        "one approval of two dispatches nothing"
    );
    assert_eq!(
        h.store.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );

    let second = h
        .engine
        .vote(VoteTarget::Approval(approval.id), approve("bob", "ok"))
        .await
        .unwrap();
    assert!(second.decided);
    assert_eq!(second.approval.status, ApprovalStatus::Approved);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);

    let late = h
        .engine
        .vote(VoteTarget::Approval(approval.id), approve("carol", "late"))
        .await
        .unwrap_err();
    assert_eq!(late.kind, ErrorKind::FailedPrecondition);
    assert!(
        late.message.contains("is already approved"),
        "{}",
        late.message
    );
}

#[tokio::test]
async fn any_reject_vetoes_a_partly_met_quorum() {
    let h = Harness::memory(
        &AgentOptions::with_decision("    approvals_required: 2\n"),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.engine
        .vote(VoteTarget::Approval(approval.id), approve("alice", "fine"))
        .await
        .unwrap();
    let veto = h
        .engine
        .vote(
            VoteTarget::Approval(approval.id),
            reject("bob", "Not without a damage report."),
        )
        .await
        .unwrap();
    assert!(veto.decided);
    assert_eq!(veto.approval.status, ApprovalStatus::Denied);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert!(h.worker.tools().is_empty());
    let (text, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert!(
        text.ends_with("was rejected by bob: Not without a damage report."),
        "{text}"
    );
}

#[tokio::test]
async fn comprehension_must_be_acknowledged_on_approve_and_reject() {
    let h = Harness::memory(
        &AgentOptions::with_decision("    comprehension_required: true\n"),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    assert!(approval.comprehension_required);
    for vote in [approve("alice", "ok"), reject("alice", "no")] {
        let err = h
            .engine
            .vote(VoteTarget::Approval(approval.id), vote)
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert_eq!(err.message, "comprehension acknowledgement is required");
    }
    let vote = Vote {
        comprehension_acknowledged: true,
        ..approve("alice", "I understand this refunds €400.")
    };
    assert!(
        h.engine
            .vote(VoteTarget::Approval(approval.id), vote)
            .await
            .unwrap()
            .decided
    );
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}

/// An edit the hard limit forbids is refused at vote time, whatever `on_modify` says: nothing
/// is recorded, the approval stays pending, and nothing is dispatched.
async fn an_edit_past_the_hard_limit_is_refused(decision: &str) {
    let h = Harness::memory(&AgentOptions::with_decision(decision), refund_then_say()).await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    let vote = Vote {
        edited_args: Some(refund("ORD-1", 999_999.0)),
        ..approve("mallory", "make it 999999")
    };
    let err = h
        .engine
        .vote(VoteTarget::Approval(approval.id), vote)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::FailedPrecondition);
    assert_eq!(
        err.message,
        "the edited arguments are denied by policy payments/refund-hard-limit@1.0.0: Refund \
         amount exceeds the absolute ceiling for agent-initiated refunds."
    );
    let after = h.store.get_approval(approval.id).await.unwrap();
    assert_eq!(after.status, ApprovalStatus::Pending);
    assert!(after.votes.is_empty(), "a refused edit records no vote");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(h.worker.tools().is_empty(), "the edit never runs");
    // The approver can still approve the proposed call.
    h.engine
        .vote(VoteTarget::Approval(approval.id), approve("alice", "ok"))
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let sent = h.worker.invoked("payments.issue-refund");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].args["amount"], json!(400.0));
}

#[tokio::test]
async fn revalidate_refuses_an_edit_the_hard_limit_forbids() {
    an_edit_past_the_hard_limit_is_refused("    on_modify: revalidate\n").await;
}

#[tokio::test]
async fn without_revalidate_an_edit_still_meets_the_deny_policies() {
    an_edit_past_the_hard_limit_is_refused("").await;
}

#[tokio::test]
async fn without_revalidate_an_edit_that_needs_approval_opens_no_new_approval() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    let vote = Vote {
        edited_args: Some(refund("ORD-1", 450.0)),
        ..approve("alice", "a little more")
    };
    h.engine
        .vote(VoteTarget::Approval(approval.id), vote)
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let approvals = h.store.session_approvals(&s.id).await.unwrap();
    assert_eq!(
        approvals.len(),
        1,
        "on_modify unchecked opens no second approval"
    );
    let sent = h.worker.invoked("payments.issue-refund");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].args["amount"], json!(450.0));
}

#[tokio::test]
async fn revalidate_opens_a_fresh_approval_when_the_edit_still_needs_one() {
    let h = Harness::memory(
        &AgentOptions::with_decision("    on_modify: revalidate\n"),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let first = h.pending_approval(&s.id).await;
    let vote = Vote {
        edited_args: Some(refund("ORD-1", 300.0)),
        ..approve("alice", "partial refund")
    };
    h.engine
        .vote(VoteTarget::Approval(first.id), vote)
        .await
        .unwrap();
    // A new approval for the same call, about the edited arguments.
    let second = loop {
        let pending: Vec<_> = h
            .store
            .session_approvals(&s.id)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.status == ApprovalStatus::Pending)
            .collect();
        if let Some(a) = pending.into_iter().next() {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_ne!(second.id, first.id);
    assert_eq!(second.call_id, first.call_id);
    assert!(h.worker.tools().is_empty());
    h.engine
        .vote(VoteTarget::Approval(second.id), approve("bob", "ok"))
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let sent = h.worker.invoked("payments.issue-refund");
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].args["amount"],
        json!(300.0),
        "the approved edit is what runs"
    );
}

/// Defence in depth: an edit that reached the store without the vote-time check (e.g. one
/// recorded before it existed) is still checked against the deny policies before dispatch.
#[tokio::test]
async fn a_stored_edit_past_the_hard_limit_is_denied_at_dispatch() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    let vote = Vote {
        edited_args: Some(refund("ORD-1", 999_999.0)),
        ..approve("mallory", "make it 999999")
    };
    // Straight into the store, past the engine's check.
    h.store.cast_vote(approval.id, vote).await.unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert!(h.worker.tools().is_empty(), "the edit never runs");
    let (text, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert_eq!(
        text,
        "Refund amount exceeds the absolute ceiling for agent-initiated refunds."
    );
    let call = h.store.get_tool_call(&approval.call_id).await.unwrap();
    assert_eq!(call.error_code.as_deref(), Some("policy_denied"));
}

#[tokio::test]
async fn edited_arguments_must_still_match_the_schema() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    let vote = Vote {
        edited_args: Some(json!({"order_id": "ORD-1", "amount": "all of it"})),
        ..approve("alice", "ok")
    };
    let err = h
        .engine
        .vote(VoteTarget::Approval(approval.id), vote)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(
        err.message
            .starts_with("the edited arguments do not match the input schema of issue_refund: "),
        "{}",
        err.message
    );
    let after = h.store.get_approval(approval.id).await.unwrap();
    assert_eq!(after.status, ApprovalStatus::Pending);
    assert!(after.votes.is_empty());
    assert!(h.worker.tools().is_empty());
    assert_eq!(
        h.store.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
}

#[tokio::test]
async fn on_reject_fail_fails_the_session() {
    let h = Harness::memory(
        &AgentOptions::with_decision("    on_reject: fail\n"),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            reject("emad", "Fraud suspected."),
        )
        .await
        .unwrap();
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    assert!(
        done.error
            .as_deref()
            .unwrap()
            .ends_with("was rejected by emad: Fraud suspected."),
        "{:?}",
        done.error
    );
    assert!(h.worker.tools().is_empty());
    assert_eq!(
        h.script.requests().len(),
        1,
        "the model is not called again"
    );
}

async fn timed_out(default: &str) -> (Harness, String) {
    let h = Harness::memory(
        &AgentOptions::with_decision(&format!(
            "    timeout:\n      after_minutes: 5\n      default: {default}\n    runtime:\n      phrony.com/approver_role: support-leads\n      phrony.com/escalate_to_role: finance-leads\n"
        )),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    assert_eq!(approval.route, "support-leads");
    assert!(approval.expires_at.is_some());
    h.clock.advance(Duration::from_secs(4 * 60));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        h.store.get_approval(approval.id).await.unwrap().status,
        ApprovalStatus::Pending
    );
    h.clock.advance(Duration::from_secs(61));
    (h, s.id)
}

#[tokio::test]
async fn a_timeout_with_default_deny_rejects_the_call() {
    let (h, id) = timed_out("deny").await;
    assert_eq!(h.wait_end(&id).await.status, SessionStatus::Completed);
    assert!(h.worker.tools().is_empty());
    let (text, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert!(
        text.ends_with("was rejected by system:timeout: approval timed out"),
        "{text}"
    );
}

#[tokio::test]
async fn a_timeout_with_default_allow_dispatches_the_call() {
    let (h, id) = timed_out("allow").await;
    assert_eq!(h.wait_end(&id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}

#[tokio::test]
async fn a_timeout_with_default_escalate_hands_the_call_to_the_next_route() {
    let (h, id) = timed_out("escalate").await;
    let escalated = loop {
        let all = h.store.session_approvals(&id).await.unwrap();
        if all.len() == 2 {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(escalated[0].status, ApprovalStatus::Escalated);
    let next = &escalated[1];
    assert_eq!(next.status, ApprovalStatus::Pending);
    assert_eq!(next.route, "finance-leads");
    assert_eq!(next.parent_approval_id, Some(escalated[0].id));
    assert_eq!(
        h.store.get_session(&id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
    h.engine
        .vote(VoteTarget::Approval(next.id), approve("fiona", "ok"))
        .await
        .unwrap();
    assert_eq!(h.wait_end(&id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}

#[tokio::test]
async fn the_approval_wait_budget_is_a_real_timer() {
    let h = Harness::memory(
        &AgentOptions::with_limits("    max_hitl_wait_minutes: 10\n"),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.clock.advance(Duration::from_secs(11 * 60));
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    assert_eq!(
        done.error.as_deref(),
        Some("run limit max_hitl_wait_minutes exceeded (on_limit=halt)")
    );
    assert_eq!(
        h.store.get_approval(approval.id).await.unwrap().status,
        ApprovalStatus::Cancelled,
        "the approval of an ended session is closed, never left pending"
    );
    assert!(h.worker.tools().is_empty());
}

#[tokio::test]
async fn cancelling_a_session_closes_its_pending_approval() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    let cancelled = h
        .engine
        .cancel_session(&s.id, &phrony_ledger::Attribution::unverified("emad"))
        .await
        .unwrap();
    assert_eq!(cancelled.status, SessionStatus::Cancelled);
    let closed = h.store.get_approval(approval.id).await.unwrap();
    assert_eq!(closed.status, ApprovalStatus::Cancelled);
    let err = h
        .engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("emad", "too late"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::FailedPrecondition);
    let again = h
        .engine
        .cancel_session(&s.id, &phrony_ledger::Attribution::unverified("emad"))
        .await
        .unwrap_err();
    assert_eq!(again.kind, ErrorKind::NotFound);
    assert_eq!(
        again.message,
        format!("session {} not found or already terminal", s.id)
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(h.worker.tools().is_empty());
    assert_eq!(h.script.requests().len(), 1);
    // Secrets are purged when the session ends.
    assert!(h.store.load_secrets(&s.id).await.unwrap().is_empty());
}

#[tokio::test]
async fn cancelling_sends_a_cancel_to_the_worker_running_the_call() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::call("lookup_order", json!({"order_id": "ORD-1"}))],
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Look up ORD-1.").await;
    for _ in 0..200 {
        if !h.worker.tools().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let call_id = h.worker.invocations.lock().unwrap()[0].call_id.clone();
    h.engine
        .cancel_session(&s.id, &phrony_ledger::Attribution::unverified("emad"))
        .await
        .unwrap();
    for _ in 0..200 {
        if !h.worker.cancels.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        *h.worker.cancels.lock().unwrap(),
        std::slice::from_ref(&call_id)
    );
    let call = h.store.get_tool_call(&call_id).await.unwrap();
    assert_eq!(call.status, phrony_ledger::CallStatus::Cancelled);
}
