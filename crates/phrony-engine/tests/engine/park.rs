//! Parked sessions (`EngineConfig::park_approval_waits`): a task session whose every open call
//! waits for a human holds no driver in memory, and whatever decides its wait — a vote through
//! the engine, an expiry, a decision recorded by another process — resumes it from the event
//! log, exactly once, with the same outcome as a driver that waited.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::time::Duration;

use std::sync::Arc;

use crate::common::*;
use phrony_engine::{Engine, EngineConfig, EngineDeps, SessionHandle};
use phrony_ledger::{ApprovalStatus, Attribution, SessionStatus};

fn refund_then_say() -> Vec<Step> {
    vec![
        Step::call("issue_refund", refund("ORD-1", 400.0)),
        Step::say("Done."),
    ]
}

/// Starts the one-refund session and waits until it is parked on its approval.
async fn parked_refund(h: &Harness) -> (SessionHandle, phrony_ledger::Approval) {
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    parked(h, &s.id).await;
    let approval = h.pending_approval(&s.id).await;
    (s, approval)
}

/// Waits (bounded) until the session has no driver in memory.
async fn parked(h: &Harness, id: &str) {
    for _ in 0..500 {
        if !h.engine.is_driven(id) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("session {id} was never parked");
}

#[tokio::test]
async fn a_waiting_session_is_parked_and_the_deciding_vote_resumes_it() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    parked(&h, &s.id).await;
    assert_eq!(h.engine.driven_sessions(), 0);
    assert_eq!(
        h.store.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval,
        "parking changes nothing stored"
    );

    let approval = h.pending_approval(&s.id).await;
    let answer = h
        .engine
        .vote(VoteTarget::Approval(approval.id), approve("emad", "ok"))
        .await
        .unwrap();
    assert!(answer.decided);
    // Answered by the resumed driver, as a waiting one would have.
    assert_eq!(answer.session_status, SessionStatus::AwaitingTool);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(
        h.worker.tools(),
        ["payments.issue-refund"],
        "sent exactly once"
    );
    assert_eq!(
        h.engine.driven_sessions(),
        0,
        "the ended session left nothing behind"
    );
}

#[tokio::test]
async fn a_parked_sessions_rejection_goes_back_to_the_model() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let (s, approval) = parked_refund(&h).await;
    let answer = h
        .engine
        .vote(VoteTarget::Approval(approval.id), reject("emad", "no"))
        .await
        .unwrap();
    assert_eq!(answer.session_status, SessionStatus::AwaitingTool);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert!(h.worker.tools().is_empty());
    let (text, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert!(text.ends_with("was rejected by emad: no"), "{text}");
}

#[tokio::test]
async fn an_expiry_resumes_a_parked_session() {
    let h = Harness::memory(
        &AgentOptions::with_decision(
            "    timeout:\n      after_minutes: 5\n      default: allow\n",
        ),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    parked(&h, &s.id).await;
    h.clock.advance(Duration::from_secs(6 * 60));
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}

#[tokio::test]
async fn a_decision_recorded_by_another_process_resumes_a_parked_session() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let (s, approval) = parked_refund(&h).await;
    // Straight into the store: this engine is told nothing, its sweep finds it.
    h.store
        .cast_vote(approval.id, approve("emad", "ok"))
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}

#[tokio::test]
async fn cancelling_a_parked_session_closes_its_approval_and_starts_nothing() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let (s, approval) = parked_refund(&h).await;
    let ended = h
        .engine
        .cancel_session(&s.id, &Attribution::unverified("emad"))
        .await
        .unwrap();
    assert_eq!(ended.status, SessionStatus::Cancelled);
    assert_eq!(
        h.store.get_approval(approval.id).await.unwrap().status,
        ApprovalStatus::Cancelled
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!h.engine.is_driven(&s.id));
    assert!(h.worker.tools().is_empty());
    assert_eq!(
        h.script.requests().len(),
        1,
        "the model is not called again"
    );
}

#[tokio::test]
async fn two_held_calls_park_together_and_each_vote_moves_the_session_on() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::calls(&[
                ("issue_refund", refund("ORD-1", 400.0)),
                ("issue_refund", refund("ORD-2", 500.0)),
            ]),
            Step::say("Done."),
        ],
    )
    .await;
    let s = h.start("Refund ORD-1 and ORD-2.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let pending = loop {
        let all: Vec<_> = h
            .store
            .session_approvals(&s.id)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.status == ApprovalStatus::Pending)
            .collect();
        if all.len() == 2 {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    parked(&h, &s.id).await;
    let first = h
        .engine
        .vote(VoteTarget::Approval(pending[0].id), approve("emad", "ok"))
        .await
        .unwrap();
    assert_eq!(first.session_status, SessionStatus::AwaitingApproval);
    // The approved call runs while the other waits; then the session parks again.
    for _ in 0..500 {
        if h.worker.tools().len() == 1 && !h.engine.is_driven(&s.id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.worker.tools().len(), 1);
    parked(&h, &s.id).await;
    let second = h
        .engine
        .vote(VoteTarget::Approval(pending[1].id), approve("emad", "ok"))
        .await
        .unwrap();
    assert_eq!(second.session_status, SessionStatus::AwaitingTool);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools().len(), 2, "each call sent exactly once");
}

#[tokio::test]
async fn with_parking_off_the_driver_waits_in_memory() {
    let config = EngineConfig {
        park_approval_waits: false,
        ..test_config()
    };
    let h = Harness::memory_with(&AgentOptions::default(), refund_then_say(), config).await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.engine.is_driven(&s.id));
    let approval = h.pending_approval(&s.id).await;
    let answer = h
        .engine
        .vote(VoteTarget::Approval(approval.id), approve("emad", "ok"))
        .await
        .unwrap();
    assert_eq!(answer.session_status, SessionStatus::AwaitingTool);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
}

#[tokio::test]
async fn a_budgeted_wait_or_a_conversation_is_not_parked() {
    let h = Harness::memory(
        &AgentOptions::with_limits("    max_hitl_wait_minutes: 30\n"),
        refund_then_say(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        h.engine.is_driven(&s.id),
        "the budget is timed by the driver"
    );

    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let c = h.start_conversation("Refund €400 for ORD-1.").await;
    h.wait(&c.id, &[SessionStatus::AwaitingApproval]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.engine.is_driven(&c.id), "a conversation keeps its driver");
}

/// A new engine on `h`'s store and router (the daemon restarted), recovering.
async fn restarted(h: &Harness, steps: Vec<Step>) -> (Engine, phrony_engine::RecoveryReport) {
    h.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let engine = Engine::new(EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: Arc::new(ScriptedFactory(Script::new(steps))),
        clock: h.clock.clone(),
        config: test_config(),
    });
    let report = engine.recover().await.unwrap();
    (engine, report)
}

#[tokio::test]
async fn a_restart_leaves_a_parked_session_unloaded_and_a_vote_still_resumes_it() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let (s, approval) = parked_refund(&h).await;
    let (engine, report) = restarted(&h, vec![Step::say("Done.")]).await;
    assert_eq!(report.parked, std::slice::from_ref(&s.id));
    assert!(report.resumed.is_empty(), "{report:?}");
    assert!(!engine.is_driven(&s.id));

    let answer = engine
        .vote(VoteTarget::Approval(approval.id), approve("emad", "ok"))
        .await
        .unwrap();
    assert!(answer.decided);
    assert_eq!(answer.session_status, SessionStatus::AwaitingTool);
    for _ in 0..500 {
        if h.store.get_session(&s.id).await.unwrap().status == SessionStatus::Completed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        h.store.get_session(&s.id).await.unwrap().status,
        SessionStatus::Completed
    );
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}

#[tokio::test]
async fn a_restart_resumes_a_waiting_session_whose_wait_was_decided_meanwhile() {
    let h = Harness::memory(&AgentOptions::default(), refund_then_say()).await;
    let (s, approval) = parked_refund(&h).await;
    h.engine.shutdown();
    // Decided while no daemon ran (another process, an operator's tool).
    h.store
        .cast_vote(approval.id, approve("emad", "ok"))
        .await
        .unwrap();
    let (engine, report) = restarted(&h, vec![Step::say("Done.")]).await;
    assert_eq!(report.resumed, std::slice::from_ref(&s.id));
    assert!(report.parked.is_empty());
    for _ in 0..500 {
        if !engine.is_driven(&s.id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        h.store.get_session(&s.id).await.unwrap().status,
        SessionStatus::Completed
    );
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);
}
