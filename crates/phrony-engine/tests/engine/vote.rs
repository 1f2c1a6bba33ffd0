//! `Engine::vote` on the durable ledger (SQLite in a temporary directory): each rule of a vote
//! once, with its one message, the targets (by id, the session's pending approval), and the
//! answer (the approval as decided, the session status the vote led to).
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{
    ApprovalKind, ApprovalStatus, EngineConfig, EngineError, ErrorKind, LedgerStore, ManualClock,
    ReviewResolution, Vote, VoteDecision, VoteTarget,
};
use phrony_ledger::{
    Ledger, LedgerOptions, NewAgentVersion, SecretCipher, SessionMode, SessionStatus,
};
use serde_json::{Value, json};
use uuid::Uuid;

/// A harness on a fresh SQLite ledger (kept alive by the returned directory).
async fn on_ledger(
    opts: &AgentOptions,
    steps: Vec<Step>,
    config: EngineConfig,
) -> (Harness, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
    let options = LedgerOptions {
        acquire_timeout: Duration::from_secs(60),
        ..LedgerOptions::default()
    };
    let ledger = Ledger::connect_with(&url, options).await.unwrap();
    ledger.migrate().await.unwrap();
    let agent = refund_agent(opts);
    let published = ledger
        .publish_agent_version(NewAgentVersion {
            namespace: "support".into(),
            name: "refund-agent".into(),
            version: "0.1.0".into(),
            owner: String::new(),
            labels: Default::default(),
            snapshot_json: String::from_utf8(agent.snapshot_json()).unwrap(),
            content_hash: agent.content_hash(),
            actor: "emad".into(),
        })
        .await
        .unwrap();
    let cipher = SecretCipher::new(&[7u8; 32]);
    let store = Arc::new(LedgerStore::new(ledger, Some(cipher)));
    let clock = Arc::new(ManualClock::starting_now());
    let h = Harness::on_with(
        store,
        clock,
        agent,
        published.version_id,
        Script::new(steps),
        config,
    )
    .await;
    (h, dir)
}

fn by_id(approval_id: Uuid) -> VoteTarget {
    VoteTarget::Approval(approval_id)
}

fn refused(result: Result<phrony_engine::VoteAnswer, EngineError>) -> (ErrorKind, String) {
    let e = result.unwrap_err();
    (e.kind, e.message)
}

/// The `approval.vote` events of a session (a refused vote records none).
async fn votes_recorded(h: &Harness, session_id: &str) -> usize {
    h.event_types(session_id)
        .await
        .iter()
        .filter(|t| *t == "approval.vote")
        .count()
}

#[tokio::test]
async fn the_answer_carries_the_session_status_the_vote_led_to() {
    let (h, _db) = on_ledger(
        &AgentOptions::with_decision("    approvals_required: 2\n"),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Issued."),
        ],
        test_config(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let a = h.pending_approval(&s.id).await;

    // Below the quorum: pending, and the session still waits.
    let first = h
        .engine
        .vote(by_id(a.id), approve("alice", "ok"))
        .await
        .unwrap();
    assert!(!first.decided);
    assert_eq!(first.approval.status, ApprovalStatus::Pending);
    assert_eq!(first.approval.approvals_received, 1);
    assert_eq!(first.session_status, SessionStatus::AwaitingApproval);

    // One vote per voter, whatever the spelling.
    assert_eq!(
        refused(h.engine.vote(by_id(a.id), approve("alice", "again")).await),
        (
            ErrorKind::FailedPrecondition,
            "actor \"alice\" already decided on this approval".to_owned()
        )
    );
    assert_eq!(
        refused(h.engine.vote(by_id(a.id), approve("ALICE", "again")).await),
        (
            ErrorKind::FailedPrecondition,
            "actor \"ALICE\" already decided on this approval (as \"alice\")".to_owned()
        )
    );
    // Approve votes must agree on the arguments.
    let other_args = Vote {
        edited_args: Some(refund("ORD-1", 300.0)),
        ..approve("bob", "less")
    };
    assert_eq!(
        refused(h.engine.vote(by_id(a.id), other_args).await),
        (
            ErrorKind::FailedPrecondition,
            format!(
                "approval {} already has approve votes for other arguments; approve those \
                 arguments or reject",
                a.id
            )
        )
    );
    assert_eq!(
        votes_recorded(&h, &s.id).await,
        1,
        "refused votes record nothing"
    );

    // The deciding vote answers with the status the driver resumed the session in, not the
    // instant before (nothing polls: the driver acknowledges the decision it took).
    let second = h
        .engine
        .vote(by_id(a.id), approve("bob", "ok"))
        .await
        .unwrap();
    assert!(second.decided);
    assert_eq!(second.approval.status, ApprovalStatus::Approved);
    assert_eq!(second.approval.approvals_received, 2);
    assert_eq!(second.session_status, SessionStatus::AwaitingTool);

    // A decided approval takes no more votes.
    assert_eq!(
        refused(h.engine.vote(by_id(a.id), approve("carol", "late")).await),
        (
            ErrorKind::FailedPrecondition,
            format!("approval {} is already approved", a.id)
        )
    );
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.invoked("payments.issue-refund").len(), 1);
    assert_eq!(votes_recorded(&h, &s.id).await, 2);

    // An unknown approval.
    let unknown = Uuid::new_v4();
    assert_eq!(
        refused(h.engine.vote(by_id(unknown), approve("alice", "ok")).await),
        (ErrorKind::NotFound, format!("approval {unknown} not found"))
    );
}

#[tokio::test]
async fn each_rule_of_a_vote_has_one_message_and_a_refused_vote_records_nothing() {
    let (h, _db) = on_ledger(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Not issued."),
        ],
        test_config(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let a = h.pending_approval(&s.id).await;
    let invalid = |message: String| (ErrorKind::InvalidArgument, message);

    assert_eq!(
        refused(h.engine.vote(by_id(a.id), approve(" ", "who?")).await),
        invalid("actor is required".to_owned())
    );
    let args_on_reject = Vote {
        edited_args: Some(refund("ORD-1", 100.0)),
        ..reject("emad", "no")
    };
    assert_eq!(
        refused(h.engine.vote(by_id(a.id), args_on_reject).await),
        invalid("edited args can only accompany an approve vote".to_owned())
    );
    let not_an_object = Vote {
        edited_args: Some(json!([1])),
        ..approve("emad", "ok")
    };
    assert_eq!(
        refused(h.engine.vote(by_id(a.id), not_an_object).await),
        invalid("edited args must be a JSON object, got an array".to_owned())
    );
    assert_eq!(
        refused(
            h.engine
                .vote(
                    by_id(a.id),
                    resolve("emad", ReviewResolution::Happened, "done")
                )
                .await
        ),
        invalid(format!(
            "approval {} is a policy approval: the resolution Happened applies only to outcome \
             reviews; approve or reject it",
            a.id
        ))
    );
    let result_without_happened = Vote {
        result: Some(json!({"refund_id": "rf_1"})),
        ..approve("emad", "ok")
    };
    assert_eq!(
        refused(h.engine.vote(by_id(a.id), result_without_happened).await),
        invalid("a result can only accompany the \"happened\" resolution".to_owned())
    );
    // Edited arguments meet the input schema and every deny policy at vote time.
    let off_schema = Vote {
        edited_args: Some(json!({"order_id": "ORD-1"})),
        ..approve("emad", "ok")
    };
    let (kind, message) = refused(h.engine.vote(by_id(a.id), off_schema).await);
    assert_eq!(kind, ErrorKind::InvalidArgument);
    assert!(
        message.starts_with("the edited arguments do not match the input schema of "),
        "{message}"
    );
    let denied = Vote {
        edited_args: Some(refund("ORD-1", 9000.0)),
        ..approve("mallory", "everything")
    };
    let (kind, message) = refused(h.engine.vote(by_id(a.id), denied).await);
    assert_eq!(kind, ErrorKind::FailedPrecondition);
    assert!(
        message.starts_with(
            "the edited arguments are denied by policy payments/refund-hard-limit@1.0.0"
        ),
        "{message}"
    );

    // Nothing of that was recorded: the approval is as it was opened.
    assert_eq!(votes_recorded(&h, &s.id).await, 0);
    let still = h.pending_approval(&s.id).await;
    assert_eq!(still.id, a.id);
    assert!(still.votes.is_empty());

    // A reject decides at once; the session resumes to hand it to the model.
    let veto = h
        .engine
        .vote(by_id(a.id), reject("emad", "No damage claim on file."))
        .await
        .unwrap();
    assert!(veto.decided);
    assert_eq!(veto.approval.status, ApprovalStatus::Denied);
    assert_eq!(veto.session_status, SessionStatus::AwaitingTool);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert!(h.worker.invoked("payments.issue-refund").is_empty());
}

#[tokio::test]
async fn comprehension_must_be_acknowledged() {
    let (h, _db) = on_ledger(
        &AgentOptions::with_decision("    comprehension_required: true\n"),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Issued."),
        ],
        test_config(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let a = h.pending_approval(&s.id).await;
    assert_eq!(
        refused(h.engine.vote(by_id(a.id), approve("emad", "ok")).await),
        (
            ErrorKind::InvalidArgument,
            "comprehension acknowledgement is required".to_owned()
        )
    );
    let acknowledged = Vote {
        comprehension_acknowledged: true,
        ..approve("emad", "ok")
    };
    let answer = h.engine.vote(by_id(a.id), acknowledged).await.unwrap();
    assert!(answer.decided);
    assert_eq!(answer.session_status, SessionStatus::AwaitingTool);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
}

/// A deciding vote that lands while the driver is parking (unloading after its approval
/// opened), or right after, is answered by the driver that resumes the session — whoever
/// resumes it, the vote or the parking driver's own re-check — never with the stale
/// `awaiting_approval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_racing_the_parking_driver_is_answered_by_the_resumed_driver() {
    let (h, _db) = on_ledger(
        &AgentOptions::default(),
        (0..20)
            .flat_map(|_| {
                [
                    Step::call("issue_refund", refund("ORD-1", 400.0)),
                    Step::say("Issued."),
                ]
            })
            .collect(),
        test_config(),
    )
    .await;
    for round in 0..20u64 {
        let s = h.start("Refund €400 for ORD-1.").await;
        h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
        let a = h.pending_approval(&s.id).await;
        // Some rounds vote at once (the driver is still unloading), others after it parked.
        if round % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(round % 7 * 3)).await;
        }
        let answer = h
            .engine
            .vote(by_id(a.id), approve("emad", "ok"))
            .await
            .unwrap();
        assert!(answer.decided, "round {round}");
        assert_eq!(
            answer.session_status,
            SessionStatus::AwaitingTool,
            "round {round}"
        );
        assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    }
}

#[tokio::test]
async fn an_outcome_review_is_resolved_never_plainly_approved() {
    let config = EngineConfig {
        exec_timeout: Duration::from_millis(300),
        ..test_config()
    };
    let (h, _db) = on_ledger(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Refund confirmed."),
        ],
        config,
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Refund €100 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let review = h.pending_approval(&s.id).await;
    assert_eq!(review.kind, ApprovalKind::OutcomeReview);

    assert_eq!(
        refused(
            h.engine
                .vote(by_id(review.id), approve("emad", "looks fine"))
                .await
        ),
        (
            ErrorKind::FailedPrecondition,
            format!(
                "approval {} is an outcome review: the runtime cannot tell whether tool call {} \
                 already took effect, so a plain approve is refused; resolve it with \
                 \"happened\" (record it succeeded), \"resend\" (send it to a worker again) or \
                 \"fail\" (record the outcome as unknown, not re-sent)",
                review.id, review.call_id
            )
        )
    );
    let edited_resend = Vote {
        edited_args: Some(refund("ORD-1", 50.0)),
        ..resolve("emad", ReviewResolution::Resend, "smaller")
    };
    assert_eq!(
        refused(h.engine.vote(by_id(review.id), edited_resend).await),
        (
            ErrorKind::InvalidArgument,
            "an outcome review cannot edit arguments: \"resend\" sends the recorded call"
                .to_owned()
        )
    );
    let disagreeing = Vote {
        decision: VoteDecision::Reject,
        ..resolve("emad", ReviewResolution::Happened, "it did")
    };
    assert_eq!(
        refused(h.engine.vote(by_id(review.id), disagreeing).await),
        (
            ErrorKind::InvalidArgument,
            "the resolution Happened is recorded as approved, not denied".to_owned()
        )
    );
    assert_eq!(votes_recorded(&h, &s.id).await, 0);

    let happened = Vote {
        result: Some(json!({"refund_id": "rf_1"})),
        ..resolve("emad", ReviewResolution::Happened, "the PSP shows it")
    };
    let answer = h.engine.vote(by_id(review.id), happened).await.unwrap();
    assert!(answer.decided);
    assert_eq!(answer.approval.status, ApprovalStatus::Approved);
    assert_eq!(answer.approval.resolution, Some(ReviewResolution::Happened));
    assert_eq!(answer.session_status, SessionStatus::AwaitingTool);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(
        h.worker.invoked("payments.issue-refund").len(),
        1,
        "a call that happened is not sent again"
    );
}

#[tokio::test]
async fn a_session_target_finds_its_pending_approval() {
    let (h, _db) = on_ledger(
        &AgentOptions::default(),
        vec![
            Step::calls(&[
                ("issue_refund", refund("ORD-1", 400.0)),
                ("issue_refund", refund("ORD-2", 500.0)),
            ]),
            // The second session's turn comes while the first waits for its approvals.
            Step::call("issue_refund", refund("ORD-3", 600.0)),
            Step::say("Both done."),
        ],
        test_config(),
    )
    .await;
    let s = h.start("Refund ORD-1 and ORD-2.").await;
    let in_session = |approval_id| VoteTarget::InSession {
        session_id: s.id.clone(),
        approval_id,
    };
    let mut pending = Vec::new();
    for _ in 0..500 {
        pending = h
            .store
            .session_approvals(&s.id)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.status == ApprovalStatus::Pending)
            .collect();
        if pending.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pending.len(), 2, "{pending:#?}");
    assert_eq!(
        refused(h.engine.vote(in_session(None), approve("emad", "ok")).await),
        (
            ErrorKind::FailedPrecondition,
            format!(
                "session {} has 2 pending approvals; name one with approval_id",
                s.id
            )
        )
    );

    // Another session's approval is not this session's to decide.
    let other = h.start("Refund ORD-3.").await;
    h.wait(&other.id, &[SessionStatus::AwaitingApproval]).await;
    let foreign = h.pending_approval(&other.id).await;
    assert_eq!(
        refused(
            h.engine
                .vote(in_session(Some(foreign.id)), approve("emad", "ok"))
                .await
        ),
        (
            ErrorKind::InvalidArgument,
            format!(
                "approval {} belongs to another session, not {}",
                foreign.id, s.id
            )
        )
    );

    // Naming one: decided, and the other still holds the session.
    let first = h
        .engine
        .vote(in_session(Some(pending[0].id)), approve("emad", "ok"))
        .await
        .unwrap();
    assert!(first.decided);
    assert_eq!(first.approval.id, pending[0].id);
    assert_eq!(first.session_status, SessionStatus::AwaitingApproval);
    // The only pending one.
    let second = h
        .engine
        .vote(in_session(None), approve("emad", "ok"))
        .await
        .unwrap();
    assert_eq!(second.approval.id, pending[1].id);
    assert!(second.decided);
    assert_ne!(second.session_status, SessionStatus::AwaitingApproval);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(
        refused(h.engine.vote(in_session(None), approve("emad", "ok")).await),
        (
            ErrorKind::FailedPrecondition,
            format!("session {} has no pending approval", s.id)
        )
    );
    h.engine
        .cancel_session(&other.id, &phrony_ledger::Attribution::unverified("emad"))
        .await
        .unwrap();
}

fn verified(name: &str) -> phrony_ledger::Attribution {
    phrony_ledger::Attribution {
        actor: name.to_owned(),
        verification: phrony_ledger::Verification::Token,
        via: None,
    }
}

fn vote_as(actor: phrony_ledger::Attribution) -> Vote {
    Vote {
        actor,
        ..approve("unused", "ok")
    }
}

/// Separation of duties through `Engine::vote` (the one rule book): a verified principal that
/// started the session cannot approve its call (PERMISSION_DENIED, nothing recorded); another
/// verified principal can; the route restriction names the route; inspect prints the
/// attribution.
#[tokio::test]
async fn a_verified_starter_cannot_approve_its_own_session_and_routes_restrict_approvers() {
    let (h, _db) = on_ledger(
        &AgentOptions::with_decision("    approvals_required: 2\n    runtime:\n      phrony.com/approver_role: support-lead\n"),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Issued."),
        ],
        test_config(),
    )
    .await;
    let mut start = h.start_request(json!("Refund €400 for ORD-1."), SessionMode::Task);
    start.actor = verified("emad");
    let s = h.engine.start_session(start).await.unwrap();
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let a = h.pending_approval(&s.id).await;
    assert!(!a.allow_self_approval);

    let (kind, message) = refused(h.engine.vote(by_id(a.id), vote_as(verified("EMAD"))).await);
    assert_eq!(kind, ErrorKind::PermissionDenied);
    assert!(message.contains("separation of duties"), "{message}");
    let (kind, message) = refused(h.engine.vote(by_id(a.id), approve("zoe", "ok")).await);
    assert_eq!(kind, ErrorKind::PermissionDenied);
    assert!(message.contains("zoe (unverified)"), "{message}");
    let mut routed = vote_as(verified("alice"));
    routed.routes = vec!["legal".into()];
    let (kind, message) = refused(h.engine.vote(by_id(a.id), routed).await);
    assert_eq!(kind, ErrorKind::PermissionDenied);
    assert_eq!(a.route, "support-lead");
    assert!(message.contains("route \"support-lead\""), "{message}");
    assert!(message.contains("routed to legal"), "{message}");
    assert_eq!(
        votes_recorded(&h, &s.id).await,
        0,
        "refused votes record nothing"
    );

    let relayed = phrony_ledger::Attribution {
        via: Some("approvals-ui".into()),
        ..verified("alice")
    };
    assert!(
        !h.engine
            .vote(by_id(a.id), vote_as(relayed))
            .await
            .unwrap()
            .decided
    );
    let second = h
        .engine
        .vote(by_id(a.id), vote_as(verified("bob")))
        .await
        .unwrap();
    assert!(second.decided);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);

    let inspection = phrony_engine::inspect(
        phrony_engine::store_timeline(&h.store, &s.id)
            .await
            .unwrap(),
    )
    .unwrap();
    let summaries: Vec<&str> = inspection
        .timeline
        .iter()
        .map(|e| e.summary.as_str())
        .collect();
    assert!(
        summaries
            .iter()
            .any(|s| s.starts_with("session started: ") && s.ends_with(" by emad")),
        "{summaries:#?}"
    );
    assert!(
        summaries.contains(&"vote approve by alice via approvals-ui: ok"),
        "{summaries:#?}"
    );
    assert!(
        summaries.contains(&"vote approve by bob: ok"),
        "{summaries:#?}"
    );
}

/// Local mode (every actor unverified): the person who started the session approves it, as in
/// the tutorial, and inspect marks both as unverified.
#[tokio::test]
async fn in_local_mode_the_starter_approves_and_inspect_marks_it_unverified() {
    let (h, _db) = on_ledger(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Issued."),
        ],
        test_config(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let a = h.pending_approval(&s.id).await;
    let answer = h
        .engine
        .vote(by_id(a.id), approve("emad", "ok"))
        .await
        .unwrap();
    assert!(answer.decided);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let inspection = phrony_engine::inspect(
        phrony_engine::store_timeline(&h.store, &s.id)
            .await
            .unwrap(),
    )
    .unwrap();
    let summaries: Vec<&str> = inspection
        .timeline
        .iter()
        .map(|e| e.summary.as_str())
        .collect();
    assert!(
        summaries
            .iter()
            .any(|s| s.starts_with("session started: ") && s.ends_with(" by emad (unverified)")),
        "{summaries:#?}"
    );
    assert!(
        summaries.contains(&"vote approve by emad (unverified): ok"),
        "{summaries:#?}"
    );
    assert!(
        summaries
            .iter()
            .any(|s| s.starts_with("approval approved by emad (unverified)")),
        "{summaries:#?}"
    );
}

/// A history cap on `issue_refund`: the refunds of one order in a session, this one included,
/// never exceed 500.
const ORDER_CAP: &str = r"apiVersion: phrony.com/v1
kind: Policy

metadata:
  name: refunds-within-500-per-order
  namespace: payments
  version: 1.0.0

spec:
  scope: tool:payments.issue-refund
  conditions:
    history:
      calls: issue_refund
      same: [order_id]
      aggregate: sum
      of: amount
    op: gt
    value: 500
  decision:
    type: deny
    reason: The refunds of this order would exceed 500.
";

#[tokio::test]
async fn edited_arguments_are_checked_with_history_and_move_the_reservation() {
    let opts = AgentOptions {
        extra_policies: vec![("order-cap.yaml".into(), ORDER_CAP.into())],
        ..AgentOptions::default()
    };
    let (h, _db) = on_ledger(
        &opts,
        vec![
            // 400: above the approval boundary, within the cap; reserved while it waits.
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            // 200 more fits the cap only if the first refund counts as edited (300), not 400.
            Step::call("issue_refund", refund("ORD-1", 200.0)),
            Step::say("Issued."),
        ],
        test_config(),
    )
    .await;
    let s = h.start("Refund ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let a = h.pending_approval(&s.id).await;

    // An edit beyond the cap is refused at the vote, by the history policy with its facts.
    let too_much = Vote {
        edited_args: Some(refund("ORD-1", 501.0)),
        ..approve("alice", "more")
    };
    let (kind, message) = refused(h.engine.vote(by_id(a.id), too_much).await);
    assert_eq!(kind, ErrorKind::FailedPrecondition);
    assert!(
        message.contains("refunds-within-500-per-order") && message.contains("exceed 500"),
        "{message}"
    );
    // Within the cap: accepted (the call's own reservation of 400 is not counted), and the
    // reservation moves to 300.
    let edited = Vote {
        edited_args: Some(refund("ORD-1", 300.0)),
        ..approve("alice", "less")
    };
    assert!(h.engine.vote(by_id(a.id), edited).await.unwrap().decided);
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let amounts: Vec<Value> = h
        .worker
        .invoked("payments.issue-refund")
        .iter()
        .map(|inv| inv.args["amount"].clone())
        .collect();
    assert_eq!(amounts, [json!(300.0), json!(200.0)]);
}
