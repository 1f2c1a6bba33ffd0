//! Approval watchers on the durable ledger (SQLite file and PostgreSQL): the current pending
//! set, then each approval opened, voted on, decided by a vote, timed out and cancelled with
//! its session, with the fallback re-read an hour away, so that each change must come from the
//! engine's change counter; and the bound on open watchers.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use crate::ledger::Db;
use phrony_engine::{
    ApprovalChange, ApprovalWatch, DEFAULT_MAX_APPROVAL_WATCHERS, EngineConfig, ErrorKind,
    LedgerStore, ManualClock,
};
use phrony_ledger::{Approval, ApprovalFilter, ApprovalStatus, SessionStatus};

/// Long enough that a change only arrives in time through the change counter.
const NO_FALLBACK: Duration = Duration::from_secs(3600);

/// How long a test waits for a change before it fails (a hang guard, not a speed target).
const PATIENCE: Duration = Duration::from_secs(30);

fn watch_config() -> EngineConfig {
    EngineConfig {
        approval_watch_interval: NO_FALLBACK,
        ..test_config()
    }
}

/// The refund agent needing two approvers and timing out after 5 minutes (deny) on `db`.
async fn harness(db: &Db, steps: Vec<Step>) -> Harness {
    let clock = Arc::new(ManualClock::starting_now());
    let ledger = db.ledger(&clock).await;
    let agent = refund_agent(&AgentOptions::with_decision(
        "    approvals_required: 2\n    timeout:\n      after_minutes: 5\n      default: deny\n",
    ));
    let version_id = publish(
        &ledger,
        String::from_utf8(agent.snapshot_json()).unwrap(),
        agent.content_hash(),
    )
    .await;
    let store = Arc::new(LedgerStore::new(ledger, Some(cipher())));
    Harness::on_with(
        store,
        clock,
        agent,
        version_id,
        Script::new(steps),
        watch_config(),
    )
    .await
}

async fn next(watch: &mut ApprovalWatch) -> ApprovalChange {
    tokio::time::timeout(PATIENCE, watch.next())
        .await
        .expect("no approval change arrived")
        .unwrap()
}

async fn opened(watch: &mut ApprovalWatch) -> Approval {
    match next(watch).await {
        ApprovalChange::Opened(a) => a,
        other => panic!("expected an opened approval, got {other:?}"),
    }
}

async fn decided(watch: &mut ApprovalWatch) -> Approval {
    match next(watch).await {
        ApprovalChange::Decided(a) => a,
        other => panic!("expected a decided approval, got {other:?}"),
    }
}

/// The model's steps, in the order the test's sessions take them (one script for all): two
/// refunds that wait, their two endings, one whose session is cancelled while it waits, one
/// left waiting.
fn steps() -> Vec<Step> {
    vec![
        Step::call("issue_refund", refund("ORD-0", 400.0)),
        Step::call("issue_refund", refund("ORD-1", 400.0)),
        Step::say("Done."),
        Step::say("Not done."),
        Step::call("issue_refund", refund("ORD-2", 400.0)),
        Step::call("issue_refund", refund("ORD-3", 400.0)),
    ]
}

async fn a_watcher_sees_every_approval_change(db: Db) {
    let h = harness(&db, steps()).await;
    let first = h.start("Refund €400 for ORD-0.").await;
    h.wait(&first.id, &[SessionStatus::AwaitingApproval]).await;
    let first_approval = h.pending_approval(&first.id).await;

    let mut watch = h.engine.watch_approvals(ApprovalFilter::default()).unwrap();
    // The current set, then its end.
    assert_eq!(opened(&mut watch).await.id, first_approval.id);
    assert_eq!(next(&mut watch).await, ApprovalChange::CurrentEnd);

    // A session opens an approval.
    let second = h.start("Refund €400 for ORD-1.").await;
    let second_approval = opened(&mut watch).await;
    assert_eq!(second_approval.session_id, second.id);
    assert_eq!(second_approval.status, ApprovalStatus::Pending);

    // One vote of two: updated, still pending; the second decides it.
    h.engine
        .vote(
            VoteTarget::Approval(first_approval.id),
            approve("alice", "ok"),
        )
        .await
        .unwrap();
    match next(&mut watch).await {
        ApprovalChange::Updated(a) => {
            assert_eq!(a.id, first_approval.id);
            assert_eq!(a.approvals_received, 1);
        }
        other => panic!("expected an updated approval, got {other:?}"),
    }
    h.engine
        .vote(
            VoteTarget::Approval(first_approval.id),
            approve("bob", "ok"),
        )
        .await
        .unwrap();
    let done = decided(&mut watch).await;
    assert_eq!(
        (done.id, done.status),
        (first_approval.id, ApprovalStatus::Approved)
    );
    assert_eq!(done.votes.len(), 2, "a decided approval carries its votes");
    assert_eq!(h.wait_end(&first.id).await.status, SessionStatus::Completed);

    // The timer decides the second one (default deny).
    h.clock.advance(Duration::from_secs(6 * 60));
    let expired = decided(&mut watch).await;
    assert_eq!(
        (expired.id, expired.status),
        (second_approval.id, ApprovalStatus::Denied)
    );
    assert_eq!(expired.decided_by.as_deref(), Some("system:timeout"));
    assert_eq!(
        h.wait_end(&second.id).await.status,
        SessionStatus::Completed
    );

    // Cancelling a session closes its approval.
    let third = h.start("Refund €400 for ORD-2.").await;
    let third_approval = opened(&mut watch).await;
    assert_eq!(third_approval.session_id, third.id);
    h.engine
        .cancel_session(
            &third.id,
            &phrony_ledger::Attribution::unverified("emad".to_owned()),
        )
        .await
        .unwrap();
    let cancelled = decided(&mut watch).await;
    assert_eq!(
        (cancelled.id, cancelled.status),
        (third_approval.id, ApprovalStatus::Cancelled)
    );

    // A watch started now sees only what is pending now, filtered by session.
    let fourth = h.start("Refund €400 for ORD-3.").await;
    assert_eq!(opened(&mut watch).await.session_id, fourth.id);
    let mut other = h
        .engine
        .watch_approvals(ApprovalFilter {
            session_id: Some(first.id.clone()),
            ..ApprovalFilter::default()
        })
        .unwrap();
    assert_eq!(next(&mut other).await, ApprovalChange::CurrentEnd);
}

macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(crate::ledger::Db::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if let Some(db) = crate::ledger::Db::postgres().await {
                        super::$case(db).await;
                    }
                }
            )*
        }
    };
}

on_both_backends!(a_watcher_sees_every_approval_change);

#[tokio::test]
async fn at_most_256_watchers_are_open_and_a_closed_one_frees_its_slot() {
    let h = Harness::memory(&AgentOptions::default(), Vec::new()).await;
    let mut open: Vec<ApprovalWatch> = (0..DEFAULT_MAX_APPROVAL_WATCHERS)
        .map(|_| h.engine.watch_approvals(ApprovalFilter::default()).unwrap())
        .collect();
    assert_eq!(DEFAULT_MAX_APPROVAL_WATCHERS, 256);
    let refused = h
        .engine
        .watch_approvals(ApprovalFilter::default())
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::ResourceExhausted);
    assert_eq!(
        refused.message,
        "too many approval watchers: at most 256 may be open at once"
    );
    open.pop();
    let mut again = h.engine.watch_approvals(ApprovalFilter::default()).unwrap();
    assert_eq!(next(&mut again).await, ApprovalChange::CurrentEnd);
}

#[tokio::test]
async fn a_watch_of_decided_approvals_is_refused() {
    let h = Harness::memory(&AgentOptions::default(), Vec::new()).await;
    let refused = h
        .engine
        .watch_approvals(ApprovalFilter {
            status: Some(ApprovalStatus::Approved),
            ..ApprovalFilter::default()
        })
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::InvalidArgument);
    assert_eq!(
        refused.message,
        "a watch follows pending approvals: status must be empty or \"pending\""
    );
}

/// An escalating timeout decides the approval and opens the next one in one ledger step, with
/// no session status change after it: only the timer's own bump reports it.
#[tokio::test]
async fn an_escalating_timeout_shows_the_escalation_and_the_next_approval() {
    let h = Harness::memory_with(
        &AgentOptions::with_decision(
            "    timeout:\n      after_minutes: 5\n      default: escalate\n    runtime:\n      \
             phrony.com/approver_role: support-leads\n      phrony.com/escalate_to_role: finance-leads\n",
        ),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Done."),
        ],
        watch_config(),
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let mut watch = h.engine.watch_approvals(ApprovalFilter::default()).unwrap();
    let first = opened(&mut watch).await;
    assert_eq!(first.route, "support-leads");
    assert_eq!(next(&mut watch).await, ApprovalChange::CurrentEnd);

    h.clock.advance(Duration::from_secs(6 * 60));
    let next_level = opened(&mut watch).await;
    assert_eq!(next_level.route, "finance-leads");
    assert_eq!(next_level.parent_approval_id, Some(first.id));
    let escalated = decided(&mut watch).await;
    assert_eq!(
        (escalated.id, escalated.status),
        (first.id, ApprovalStatus::Escalated)
    );
}
