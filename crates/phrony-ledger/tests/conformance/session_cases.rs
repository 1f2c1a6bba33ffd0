//! Conformance cases for sessions, tool calls, approvals, secrets and their rebuild.

use std::collections::{BTreeMap, BTreeSet};

use chrono::Duration;
use phrony_ledger::{
    AgentRef, AgentVersion, AgentVersionRef, ApprovalFilter, ApprovalKind, ApprovalStatus,
    ApprovalTimeout, Backend, CallStatus, Dispatch, Ledger, LedgerError, NewAgentVersion,
    NewApproval, NewSession, NewToolCall, OnModify, OnReject, PageRequest, ReviewResolution,
    SecretCipher, Session, SessionEvent, SessionFilter, SessionLimits, SessionMode, SessionStatus,
    SideEffectClass, StatusChange, TimeoutDefault, ToolInvocation, ToolOutcome, ToolResult, Usage,
    Vote, VoteDecision, new_session_id, tool_call_id,
};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::harness::TestDb;

// ---------------------------------------------------------------------------------------------
// helpers

const ALL_PROJECTIONS: [&str; 8] = [
    "agents",
    "agent_versions",
    "deployments",
    "sessions",
    "session_metadata",
    "tool_invocations",
    "approvals",
    "approval_votes",
];

#[track_caller]
fn precondition(result: Result<impl std::fmt::Debug, LedgerError>) -> String {
    match result {
        Err(LedgerError::FailedPrecondition { message }) => message,
        other => panic!("expected FailedPrecondition, got {other:?}"),
    }
}

#[track_caller]
fn invalid(result: Result<impl std::fmt::Debug, LedgerError>) -> String {
    match result {
        Err(LedgerError::InvalidArgument { message }) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[track_caller]
fn not_found(result: Result<impl std::fmt::Debug, LedgerError>) -> String {
    match result {
        Err(LedgerError::NotFound { message }) => message,
        other => panic!("expected NotFound, got {other:?}"),
    }
}

pub(crate) async fn deploy_agent(ledger: &Ledger, agent: &AgentRef, version: &str) -> AgentVersion {
    ledger
        .publish_agent_version(NewAgentVersion {
            namespace: agent.namespace.clone(),
            name: agent.name.clone(),
            version: version.to_owned(),
            owner: "payments-team".to_owned(),
            labels: BTreeMap::new(),
            snapshot_json: format!(r#"{{"kind":"Agent","version":"{version}"}}"#),
            content_hash: format!("sha256:{agent}-{version}"),
            actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
        })
        .await
        .unwrap();
    ledger
        .deploy(
            agent,
            version,
            &phrony_ledger::Attribution::unverified("alice"),
        )
        .await
        .unwrap();
    ledger.get_agent_version(agent, version).await.unwrap()
}

pub(crate) fn refund_agent() -> AgentRef {
    AgentRef::new("support", "refund-agent")
}

pub(crate) fn new_session(v: &AgentVersion, metadata: &[(&str, &str)]) -> NewSession {
    NewSession {
        id: new_session_id(),
        agent_version_id: v.id,
        agent: AgentVersionRef::new(&v.agent.namespace, &v.agent.name, &v.version),
        input: json!({"message": "refund order ORD-1"}),
        metadata: metadata
            .iter()
            .map(|(k, val)| ((*k).to_owned(), (*val).to_owned()))
            .collect(),
        mode: SessionMode::Task,
        parent_session_id: None,
        limits: None,
        bundle_version_id: None,
        secrets: Vec::new(),
        actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
    }
}

pub(crate) async fn start(ledger: &Ledger, v: &AgentVersion) -> Session {
    ledger.create_session(new_session(v, &[])).await.unwrap()
}

pub(crate) async fn to(ledger: &Ledger, session: &str, status: SessionStatus) {
    ledger
        .set_session_status(session, StatusChange::to(status))
        .await
        .unwrap();
}

pub(crate) fn refund_call(session: &str, iteration: u32, index: u32, amount: i64) -> NewToolCall {
    NewToolCall {
        session_id: session.to_owned(),
        turn: 1,
        iteration,
        index,
        tool: "payments.issue-refund".to_owned(),
        version: "1.0.0".to_owned(),
        wire_name: Some("issue_refund".to_owned()),
        args: json!({"order_id": "ORD-1", "amount": amount}),
        side_effect_class: Some(SideEffectClass::NonIdempotentWrite),
        delegation: None,
    }
}

fn worker() -> Dispatch {
    Dispatch {
        worker_id: "worker-1".to_owned(),
        worker_identity: Some("payments/refunds".to_owned()),
        image_digest: Some("sha256:abc".to_owned()),
        descriptor_hash: Some("sha256:desc".to_owned()),
        deadline_at: None,
    }
}

fn ok(payload: Value) -> ToolResult {
    ToolResult {
        worker_id: Some("worker-1".to_owned()),
        outcome: ToolOutcome::Success(payload),
        usage: None,
    }
}

pub(crate) fn approval_for(session: &str, call_id: &str) -> NewApproval {
    NewApproval {
        allow_self_approval: false,
        id: Uuid::new_v4(),
        session_id: session.to_owned(),
        call_id: call_id.to_owned(),
        policy_ref: Some("payments/refund-approval-boundary@1.0.0".to_owned()),
        reason: "Refunds over 250 need a human".to_owned(),
        route: "refund-approvers".to_owned(),
        authority_ref: "payments-authority".to_owned(),
        approvals_required: 1,
        comprehension_required: false,
        on_reject: OnReject::ReturnToAgent,
        on_modify: OnModify::Unchecked,
        timeout: None,
        policy_runtime: Map::new(),
        actor: phrony_ledger::Attribution::unverified("policy".to_owned()),
        kind: phrony_ledger::ApprovalKind::Policy,
    }
}

pub(crate) fn approve(actor: &str) -> Vote {
    Vote {
        routes: Vec::new(),
        actor: phrony_ledger::Attribution::unverified(actor.to_owned()),
        decision: VoteDecision::Approve,
        comment: format!("ok by {actor}"),
        comprehension_acknowledged: false,
        edited_args: None,
        resolution: None,
        result: None,
    }
}

fn reject(actor: &str, comment: &str) -> Vote {
    Vote {
        routes: Vec::new(),
        actor: phrony_ledger::Attribution::unverified(actor.to_owned()),
        decision: VoteDecision::Reject,
        comment: comment.to_owned(),
        comprehension_acknowledged: false,
        edited_args: None,
        resolution: None,
        result: None,
    }
}

/// A running session in `awaiting_tool` with one recorded call, and an approval opened for it.
pub(crate) async fn pending_approval(
    ledger: &Ledger,
    v: &AgentVersion,
    customize: impl FnOnce(&mut NewApproval),
) -> (Session, ToolInvocation, phrony_ledger::Approval) {
    let s = start(ledger, v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 400))
        .await
        .unwrap();
    let mut new = approval_for(&s.id, &call.call_id);
    customize(&mut new);
    let approval = ledger.open_approval(new).await.unwrap();
    (s, call, approval)
}

async fn types_of(ledger: &Ledger, session: &str) -> Vec<String> {
    ledger
        .events_after(session, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect()
}

async fn snapshot_all(db: &TestDb) -> Vec<Vec<Vec<Option<String>>>> {
    let mut out = Vec::new();
    for t in ALL_PROJECTIONS {
        out.push(db.table_snapshot(t).await);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// sessions

pub(crate) async fn session_lifecycle_records_every_transition(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let mut new = new_session(&v, &[("ticket_id", "T-42")]);
    new.mode = SessionMode::Conversation;
    new.limits = Some(SessionLimits {
        max_tokens_per_run: Some(10_000),
        max_wall_clock_seconds: Some(600),
        ..SessionLimits::default()
    });
    let s = ledger.create_session(new.clone()).await.unwrap();
    assert_eq!(s.status, SessionStatus::Running);
    assert_eq!(s.root_session_id, s.id);
    assert_eq!(s.depth, 0);
    assert_eq!(s.created_by, "alice");
    assert_eq!(s.agent.to_string(), "support/refund-agent@0.1.0");
    assert_eq!(s.mode, SessionMode::Conversation);
    assert_eq!(
        s.metadata.get("ticket_id").map(String::as_str),
        Some("T-42")
    );
    assert_eq!(s.input, new.input);
    assert_eq!(s.limits, new.limits);
    assert_eq!(ledger.get_session(&s.id).await.unwrap(), s);

    // Every status change is one event with from/to, and the projection follows.
    for status in [
        SessionStatus::AwaitingTool,
        SessionStatus::Running,
        SessionStatus::AwaitingInput,
        SessionStatus::Running,
    ] {
        to(ledger, &s.id, status).await;
    }
    let done = ledger
        .set_session_status(
            &s.id,
            StatusChange::completed(Some(json!({"message": "refunded"}))).by("bob"),
        )
        .await
        .unwrap();
    assert_eq!(done.from, SessionStatus::Running);
    assert_eq!(done.session.status, SessionStatus::Completed);
    assert_eq!(done.session.output, Some(json!({"message": "refunded"})));
    assert!(done.session.ended_at.is_some());
    let events = ledger.events_after(&s.id, 0, 100).await.unwrap();
    let seen: Vec<(&str, Value, Value)> = events
        .iter()
        .skip(1)
        .map(|e| {
            (
                e.event_type.as_str(),
                e.payload["from"].clone(),
                e.payload["to"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                "session.status_changed",
                json!("running"),
                json!("awaiting_tool")
            ),
            (
                "session.status_changed",
                json!("awaiting_tool"),
                json!("running")
            ),
            (
                "session.status_changed",
                json!("running"),
                json!("awaiting_input")
            ),
            (
                "session.status_changed",
                json!("awaiting_input"),
                json!("running")
            ),
            ("session.completed", json!("running"), json!("completed")),
        ]
    );
    assert_eq!(events[0].event_type, "session.started");
    assert_eq!(events[0].actor, "alice");
    assert_eq!(events[0].payload["input"], new.input);
    assert_eq!(events[0].payload["metadata"]["ticket_id"], "T-42");
    assert_eq!(events.last().unwrap().actor, "bob");
    // The cursor read continues after a seq.
    assert_eq!(
        ledger.events_after(&s.id, 4, 100).await.unwrap(),
        events[4..].to_vec()
    );

    // Illegal transitions name both statuses and change nothing.
    assert_eq!(
        precondition(
            ledger
                .set_session_status(&s.id, StatusChange::to(SessionStatus::Running))
                .await
        ),
        format!(
            "session {} cannot change status from completed to running",
            s.id
        )
    );
    let other = start(ledger, &v).await;
    to(ledger, &other.id, SessionStatus::AwaitingInput).await;
    assert_eq!(
        precondition(
            ledger
                .set_session_status(&other.id, StatusChange::to(SessionStatus::AwaitingTool))
                .await
        ),
        format!(
            "session {} cannot change status from awaiting_input to awaiting_tool",
            other.id
        )
    );
    assert_eq!(
        precondition(
            ledger
                .set_session_status(&other.id, StatusChange::to(SessionStatus::AwaitingInput))
                .await
        ),
        format!(
            "session {} cannot change status from awaiting_input to awaiting_input",
            other.id
        )
    );
    assert_eq!(
        precondition(
            ledger
                .set_session_status(
                    &other.id,
                    StatusChange::cancelled().from(SessionStatus::Running)
                )
                .await
        ),
        format!("session {} is awaiting_input, not running", other.id)
    );
    invalid(
        ledger
            .set_session_status(&other.id, StatusChange::to(SessionStatus::Failed))
            .await,
    );
    invalid(
        ledger
            .set_session_status(
                &other.id,
                StatusChange {
                    output: Some(json!({})),
                    ..StatusChange::to(SessionStatus::Running)
                },
            )
            .await,
    );
    let failed = ledger
        .set_session_status(
            &other.id,
            StatusChange::failed("run limit max_tokens_per_run exceeded"),
        )
        .await
        .unwrap();
    assert_eq!(
        failed.session.error.as_deref(),
        Some("run limit max_tokens_per_run exceeded")
    );
    let last = ledger.events_after(&other.id, 0, 100).await.unwrap();
    assert_eq!(last.last().unwrap().event_type, "session.failed");
    assert_eq!(
        last.last().unwrap().payload["message"],
        "run limit max_tokens_per_run exceeded"
    );
    assert_eq!(last.len(), 3, "refused changes appended nothing");

    // Engine events go to live sessions only.
    let live = start(ledger, &v).await;
    let e = ledger
        .record_session_event(
            &live.id,
            SessionEvent::UserMessage {
                actor: "carol".into(),
                turn: 1,
                content: "hi".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (e.event_type.as_str(), e.actor.as_str(), e.turn),
        ("message.user", "carol", Some(1))
    );
    assert_eq!(e.payload, json!({"role": "user", "content": "hi"}));
    assert_eq!(
        precondition(
            ledger
                .record_session_event(
                    &s.id,
                    SessionEvent::Evidence {
                        snapshot: json!({"owner": "x"})
                    }
                )
                .await
        ),
        format!(
            "session {} is completed and accepts no further events",
            s.id
        )
    );

    // Creation is validated.
    let mut dup = new_session(&v, &[]);
    dup.id = s.id.clone();
    assert!(matches!(
        ledger.create_session(dup).await,
        Err(LedgerError::AlreadyExists { .. })
    ));
    let mut bad = new_session(&v, &[]);
    bad.id = "session-1".into();
    assert!(invalid(ledger.create_session(bad).await).contains("must be run_<uuid>"));
    let mut bad = new_session(&v, &[]);
    bad.input = json!("refund please");
    assert_eq!(
        invalid(ledger.create_session(bad).await),
        "input must be a JSON object"
    );
    let mut bad = new_session(&v, &[]);
    bad.metadata.insert(String::new(), "x".into());
    invalid(ledger.create_session(bad).await);
    let mut bad = new_session(&v, &[]);
    bad.agent.version = "9.9.9".into();
    assert!(invalid(ledger.create_session(bad).await).contains("does not match agent version"));
    let mut bad = new_session(&v, &[]);
    bad.agent_version_id = Uuid::nil();
    assert_eq!(
        not_found(ledger.create_session(bad).await),
        format!("agent version \"{}\" not found", Uuid::nil())
    );
    assert_eq!(
        not_found(ledger.get_session("run_missing").await),
        "session run_missing not found"
    );
    assert_eq!(
        not_found(ledger.events_after("run_missing", 0, 10).await),
        "session run_missing not found"
    );
    // The catch-up read serves sessions only: a stream that holds events but is no session's
    // (here the agent's lifecycle stream) reads as an unknown session, from any position.
    let agent_stream = refund_agent().stream();
    assert!(
        !ledger
            .list_events(&agent_stream, 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    for after in [0, 1] {
        assert_eq!(
            not_found(ledger.events_after(&agent_stream, after, 10).await),
            format!("session {agent_stream} not found")
        );
    }
}

pub(crate) async fn child_sessions_follow_their_parent(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let parent = start(ledger, &v).await;
    let mut child = new_session(&v, &[]);
    child.parent_session_id = Some(parent.id.clone());
    let child = ledger.create_session(child).await.unwrap();
    assert_eq!(
        (child.root_session_id.as_str(), child.depth),
        (parent.id.as_str(), 1)
    );
    let mut grandchild = new_session(&v, &[]);
    grandchild.parent_session_id = Some(child.id.clone());
    let grandchild = ledger.create_session(grandchild).await.unwrap();
    assert_eq!(
        (grandchild.root_session_id.as_str(), grandchild.depth),
        (parent.id.as_str(), 2)
    );
    let call = ledger
        .record_tool_call(refund_call(&grandchild.id, 0, 0, 10))
        .await
        .unwrap();
    ledger.queue_tool_call(&call.call_id).await.unwrap();

    // The timeline of the parent covers the whole tree; a child's covers its own subtree.
    let timeline = ledger.session_timeline(&parent.id).await.unwrap();
    let ids: Vec<&str> = timeline.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            parent.id.as_str(),
            child.id.as_str(),
            grandchild.id.as_str()
        ]
    );
    assert_eq!(timeline.events.len(), 5);
    assert!(
        timeline
            .events
            .windows(2)
            .all(|w| w[0].event.ts <= w[1].event.ts)
    );
    assert_eq!(timeline.invocations.len(), 1);
    let child_view = ledger.session_timeline(&child.id).await.unwrap();
    assert_eq!(child_view.sessions.len(), 2);
    assert!(child_view.events.iter().all(|e| e.session_id != parent.id));
    assert_eq!(
        not_found(ledger.session_timeline("run_missing").await),
        "session run_missing not found"
    );

    // Cancelling the parent cancels its running descendants and their open calls.
    let changed = ledger
        .set_session_status(&parent.id, StatusChange::cancelled().by("ops"))
        .await
        .unwrap();
    assert_eq!(
        changed.cancelled_children,
        vec![child.id.clone(), grandchild.id.clone()]
    );
    assert_eq!(changed.cancelled_calls, vec![call.call_id.clone()]);
    for id in [&child.id, &grandchild.id] {
        let s = ledger.get_session(id).await.unwrap();
        assert_eq!(s.status, SessionStatus::Cancelled);
        let last = ledger.events_after(id, 0, 100).await.unwrap();
        let last = last.last().unwrap();
        assert_eq!(last.event_type, "session.cancelled");
        assert_eq!(last.actor, "ops");
    }
    let call = ledger.get_tool_call(&call.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Cancelled);
    let mut orphan = new_session(&v, &[]);
    orphan.parent_session_id = Some(parent.id.clone());
    assert!(precondition(ledger.create_session(orphan).await).contains("cannot start child"));
}

/// A status change that names the status it expects reads nothing before it writes (the
/// engine's changes): when the session is not in that status the change is refused with the
/// error a read would have given, and nothing it did before finding out — the event, the
/// cascade to children and open calls — stays written.
pub(crate) async fn a_change_from_a_status_the_session_is_not_in_writes_nothing(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let parent = start(ledger, &v).await;
    let mut child = new_session(&v, &[]);
    child.parent_session_id = Some(parent.id.clone());
    let child = ledger.create_session(child).await.unwrap();
    let call = ledger
        .record_tool_call(refund_call(&parent.id, 0, 0, 10))
        .await
        .unwrap();
    ledger.queue_tool_call(&call.call_id).await.unwrap();
    let before = ledger.events_after(&parent.id, 0, 1000).await.unwrap();

    for (change, expected) in [
        (
            StatusChange::cancelled()
                .by("ops")
                .from(SessionStatus::AwaitingInput),
            "awaiting_input",
        ),
        (
            StatusChange::to(SessionStatus::AwaitingTool).from(SessionStatus::AwaitingInput),
            "awaiting_input",
        ),
        (
            StatusChange::failed("boom").from(SessionStatus::AwaitingTool),
            "awaiting_tool",
        ),
    ] {
        assert_eq!(
            precondition(ledger.set_session_status(&parent.id, change).await),
            format!("session {} is running, not {expected}", parent.id)
        );
    }
    assert_eq!(
        not_found(
            ledger
                .set_session_status(
                    "run_missing",
                    StatusChange::to(SessionStatus::AwaitingTool).from(SessionStatus::Running)
                )
                .await
        ),
        "session run_missing not found"
    );
    assert_eq!(
        not_found(ledger.events_after("run_missing", 0, 10).await),
        "session run_missing not found"
    );
    assert_eq!(
        ledger.events_after(&parent.id, 0, 1000).await.unwrap(),
        before,
        "a refused change appended nothing"
    );
    for id in [&parent.id, &child.id] {
        assert_eq!(
            ledger.get_session(id).await.unwrap().status,
            SessionStatus::Running
        );
    }
    assert_eq!(
        ledger.get_tool_call(&call.call_id).await.unwrap().status,
        CallStatus::Queued
    );
    for r in ledger.verify_all_streams().await.unwrap() {
        assert!(r.is_intact(), "{r:?}");
    }

    // From the status the session is in, the same change applies, recorded from it.
    let changed = ledger
        .set_session_status(
            &parent.id,
            StatusChange::cancelled()
                .by("ops")
                .from(SessionStatus::Running),
        )
        .await
        .unwrap();
    assert_eq!(changed.from, SessionStatus::Running);
    assert_eq!(changed.session.status, SessionStatus::Cancelled);
    assert_eq!(changed.cancelled_children, vec![child.id.clone()]);
    assert_eq!(changed.cancelled_calls, vec![call.call_id.clone()]);
}

pub(crate) async fn list_sessions_filters_and_paginates_stably(db: &TestDb) {
    let ledger = db.migrated().await;
    let refund = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let refund2 = deploy_agent(ledger, &refund_agent(), "0.2.0").await;
    let triage = deploy_agent(ledger, &AgentRef::new("ops", "triage"), "1.0.0").await;
    let mut all = Vec::new();
    for (v, meta) in [
        (&refund, vec![("ticket_id", "T-1"), ("tier", "gold")]),
        (&refund, vec![("ticket_id", "T-2"), ("tier", "gold")]),
        (&refund2, vec![("ticket_id", "T-3"), ("tier", "silver")]),
        (&triage, vec![("ticket_id", "T-1")]),
        (&refund2, vec![]),
        (&triage, vec![("tier", "gold")]),
        (&refund, vec![("ticket_id", "T-7"), ("tier", "gold")]),
    ] {
        all.push(ledger.create_session(new_session(v, &meta)).await.unwrap());
    }
    let mut child = new_session(&refund, &[("ticket_id", "T-1")]);
    child.parent_session_id = Some(all[0].id.clone());
    let child = ledger.create_session(child).await.unwrap();
    to(ledger, &all[1].id, SessionStatus::AwaitingInput).await;
    ledger
        .set_session_status(&all[2].id, StatusChange::cancelled())
        .await
        .unwrap();

    let newest_first = |sessions: &[&Session]| {
        let mut ids: Vec<(chrono::DateTime<chrono::Utc>, String)> = sessions
            .iter()
            .map(|s| (s.created_at, s.id.clone()))
            .collect();
        ids.sort();
        ids.reverse();
        ids.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
    };
    let ids = |page: &phrony_ledger::Page<Session>| {
        page.items.iter().map(|s| s.id.clone()).collect::<Vec<_>>()
    };
    let list = |filter: SessionFilter| async move {
        ledger
            .list_sessions(&filter, &PageRequest::first(100))
            .await
            .unwrap()
    };

    let roots: Vec<&Session> = all.iter().collect();
    assert_eq!(
        ids(&list(SessionFilter::default()).await),
        newest_first(&roots)
    );
    let by_agent = list(SessionFilter {
        agent: Some(refund_agent()),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(
        ids(&by_agent),
        newest_first(&[&all[0], &all[1], &all[2], &all[4], &all[6]]),
        "all versions of the agent, not only the active one"
    );
    let by_version = list(SessionFilter {
        agent: Some(refund_agent()),
        agent_version: Some("0.2.0".into()),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(ids(&by_version), newest_first(&[&all[2], &all[4]]));
    let by_status = list(SessionFilter {
        status: Some(SessionStatus::AwaitingInput),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(ids(&by_status), vec![all[1].id.clone()]);
    let gold_t1 = list(SessionFilter {
        metadata: BTreeMap::from([
            ("ticket_id".into(), "T-1".into()),
            ("tier".into(), "gold".into()),
        ]),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(
        ids(&gold_t1),
        vec![all[0].id.clone()],
        "all pairs must match"
    );
    let t1_with_children = list(SessionFilter {
        metadata: BTreeMap::from([("ticket_id".into(), "T-1".into())]),
        include_children: true,
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(
        ids(&t1_with_children),
        newest_first(&[&all[0], &all[3], &child])
    );
    let children = list(SessionFilter {
        parent_session_id: Some(all[0].id.clone()),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(ids(&children), vec![child.id.clone()]);
    let window = list(SessionFilter {
        created_after: Some(all[2].created_at),
        created_before: Some(all[5].created_at),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(
        ids(&window),
        newest_first(&[&all[2], &all[3], &all[4]]),
        "created_after is inclusive, created_before exclusive"
    );
    invalid(
        ledger
            .list_sessions(
                &SessionFilter {
                    agent_version: Some("0.1.0".into()),
                    ..SessionFilter::default()
                },
                &PageRequest::default(),
            )
            .await,
    );

    // Pages of 3 cover every root exactly once, newest first, and a session created while
    // paging does not shift the later pages.
    let first = ledger
        .list_sessions(&SessionFilter::default(), &PageRequest::first(3))
        .await
        .unwrap();
    assert_eq!(first.items.len(), 3);
    let late = start(ledger, &refund).await;
    let mut seen = ids(&first);
    let mut token = first.next_token.clone();
    while let Some(t) = token {
        let page = ledger
            .list_sessions(&SessionFilter::default(), &PageRequest::after(3, t))
            .await
            .unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(ids(&page));
        token = page.next_token;
    }
    assert_eq!(seen, newest_first(&roots), "no skips, no repeats");
    assert!(!seen.contains(&late.id));
    let exact = ledger
        .list_sessions(&SessionFilter::default(), &PageRequest::first(8))
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 8);
    assert_eq!(exact.next_token, None, "no token after the last page");

    assert!(
        invalid(
            ledger
                .list_sessions(&SessionFilter::default(), &PageRequest::after(3, "bogus"))
                .await
        )
        .contains("invalid page token")
    );
    let approvals_token = {
        // An approvals token is refused by the sessions list.
        let v = &refund;
        for _ in 0..2 {
            pending_approval(ledger, v, |_| {}).await;
        }
        ledger
            .list_approvals(&ApprovalFilter::default(), &PageRequest::first(1))
            .await
            .unwrap()
            .next_token
            .unwrap()
    };
    assert!(
        invalid(
            ledger
                .list_sessions(
                    &SessionFilter::default(),
                    &PageRequest::after(3, approvals_token)
                )
                .await
        )
        .contains("belongs to another list")
    );
}

// ---------------------------------------------------------------------------------------------
// tool calls

/// A call that gets a worker at once is queued and dispatched in one write; one already queued
/// is only dispatched; a refused dispatch writes nothing (not even the queueing).
/// Each dispatch records the content hash of the manifest its call's version was published
/// with (remembered per version after the first read): calls of two versions dispatched in
/// turn, through both dispatch writes, each name their own.
pub(crate) async fn each_dispatch_names_the_manifest_of_its_calls_version(db: &TestDb) {
    let ledger = db.migrated().await;
    let v1 = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let v2 = deploy_agent(ledger, &refund_agent(), "0.2.0").await;
    assert_ne!(v1.content_hash, v2.content_hash);
    for (round, v) in [&v1, &v2, &v1, &v2, &v1].into_iter().enumerate() {
        let s = start(ledger, v).await;
        let call = ledger
            .record_tool_call(refund_call(&s.id, 0, 0, 10))
            .await
            .unwrap();
        let dispatched = if round % 2 == 0 {
            ledger
                .queue_and_dispatch_tool_call(&call.call_id, worker())
                .await
                .unwrap()
        } else {
            ledger.queue_tool_call(&call.call_id).await.unwrap();
            ledger
                .dispatch_tool_call(&call.call_id, worker())
                .await
                .unwrap()
        };
        assert_eq!(
            dispatched.manifest_content_hash.as_deref(),
            Some(v.content_hash.as_str()),
            "round {round}"
        );
        let events = ledger.events_after(&s.id, 0, 100).await.unwrap();
        let event = events
            .iter()
            .find(|e| e.event_type == "tool.dispatched")
            .unwrap();
        assert_eq!(
            event.payload["manifest_content_hash"],
            json!(v.content_hash),
            "round {round}"
        );
    }
}

pub(crate) async fn queue_and_dispatch_is_one_write(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let s = start(ledger, &v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 100))
        .await
        .unwrap();
    // What a write returns is the row as stored (its projection's `RETURNING`, not a second
    // read), here and after each transition below.
    assert_eq!(call, ledger.get_tool_call(&call.call_id).await.unwrap());
    let before = types_of(ledger, &s.id).await;

    // Refused: nothing is written, the call stays pending.
    let empty = Dispatch {
        worker_id: String::new(),
        ..worker()
    };
    assert!(
        invalid(
            ledger
                .queue_and_dispatch_tool_call(&call.call_id, empty)
                .await
        )
        .contains("worker_id"),
    );
    assert_eq!(
        ledger.get_tool_call(&call.call_id).await.unwrap().status,
        CallStatus::Pending
    );
    assert_eq!(types_of(ledger, &s.id).await, before);

    // Pending → queued → dispatched, both events in order.
    let dispatched = ledger
        .queue_and_dispatch_tool_call(&call.call_id, worker())
        .await
        .unwrap();
    assert_eq!(dispatched.status, CallStatus::Dispatched);
    assert_eq!(dispatched.attempt, 1);
    assert!(dispatched.queued_at.is_some());
    assert_eq!(dispatched.worker_id.as_deref(), Some("worker-1"));
    assert_eq!(
        dispatched,
        ledger.get_tool_call(&call.call_id).await.unwrap()
    );
    let after = types_of(ledger, &s.id).await;
    assert_eq!(after[..before.len()], before[..]);
    assert_eq!(after[before.len()..], ["tool.queued", "tool.dispatched"]);

    // An already-queued call is only dispatched (one `tool.queued`, not two).
    let second = ledger
        .record_tool_call(refund_call(&s.id, 1, 0, 100))
        .await
        .unwrap();
    ledger.queue_tool_call(&second.call_id).await.unwrap();
    let before = types_of(ledger, &s.id).await;
    let dispatched = ledger
        .queue_and_dispatch_tool_call(&second.call_id, worker())
        .await
        .unwrap();
    assert_eq!(dispatched.status, CallStatus::Dispatched);
    let after = types_of(ledger, &s.id).await;
    assert_eq!(after[before.len()..], ["tool.dispatched"]);

    // A settled call cannot be dispatched again, and nothing is written.
    let settled = ledger
        .record_tool_result(&call.call_id, ok(json!({"refund_id": "R-1"})))
        .await
        .unwrap();
    assert_eq!(
        settled.invocation,
        ledger.get_tool_call(&call.call_id).await.unwrap()
    );
    let before = types_of(ledger, &s.id).await;
    assert_eq!(
        precondition(
            ledger
                .queue_and_dispatch_tool_call(&call.call_id, worker())
                .await
        ),
        format!(
            "tool call {} cannot go from succeeded to queued",
            call.call_id
        )
    );
    assert_eq!(types_of(ledger, &s.id).await, before);
}

/// `call` recorded, queued and sent to a worker.
async fn dispatched(ledger: &Ledger, call: NewToolCall) -> ToolInvocation {
    let call = ledger.record_tool_call(call).await.unwrap();
    ledger
        .queue_and_dispatch_tool_call(&call.call_id, worker())
        .await
        .unwrap()
}

/// A result recorded (`applied`, or as a late one) that left the session in `status`.
async fn assert_unmoved(
    ledger: &Ledger,
    session: &str,
    recorded: &phrony_ledger::RecordedResult,
    applied: bool,
    status: SessionStatus,
) {
    assert_eq!(recorded.applied, applied, "{recorded:?}");
    assert_eq!(recorded.resumed, None);
    assert_eq!(ledger.get_session(session).await.unwrap().status, status);
}

/// `record_tool_result_and_resume`: the result that closes a session's last open call moves
/// the session in the same transaction (its events follow the result's); any other result —
/// one call still open, a session not in the expected status, a duplicate — changes no status.
pub(crate) async fn the_result_closing_the_last_open_call_resumes_its_session(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let s = start(ledger, &v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let resume = || StatusChange::to(SessionStatus::Running).from(SessionStatus::AwaitingTool);
    let a = dispatched(ledger, refund_call(&s.id, 0, 0, 100)).await;
    let b = dispatched(ledger, refund_call(&s.id, 0, 1, 200)).await;

    // One of two: the result alone.
    let first = ledger
        .record_tool_result_and_resume(&a.call_id, ok(json!({"refund_id": "R-1"})), resume())
        .await
        .unwrap();
    assert_unmoved(ledger, &s.id, &first, true, SessionStatus::AwaitingTool).await;

    // The last: the result and the move back to running, in that order, one transaction.
    let before = ledger.events_after(&s.id, 0, 1000).await.unwrap().len();
    let last = ledger
        .record_tool_result_and_resume(&b.call_id, ok(json!({"refund_id": "R-2"})), resume())
        .await
        .unwrap();
    assert!(last.applied);
    assert_eq!(last.invocation.status, CallStatus::Succeeded);
    let resumed = last.resumed.expect("the last result resumes the session");
    assert_eq!(
        (resumed.from, resumed.session.status),
        (SessionStatus::AwaitingTool, SessionStatus::Running)
    );
    assert_eq!(
        ledger.get_session(&s.id).await.unwrap().status,
        SessionStatus::Running
    );
    let events = ledger.events_after(&s.id, 0, 1000).await.unwrap();
    let added: Vec<&str> = events[before..]
        .iter()
        .map(|e| e.event_type.as_str())
        .collect();
    assert_eq!(added, ["tool.completed", "session.status_changed"]);

    // A duplicate of the last result: recorded late, the session stays where it is.
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let duplicate = ledger
        .record_tool_result_and_resume(&b.call_id, ok(json!({"again": true})), resume())
        .await
        .unwrap();
    assert_unmoved(
        ledger,
        &s.id,
        &duplicate,
        false,
        SessionStatus::AwaitingTool,
    )
    .await;

    // A session not in the expected status (here waiting on a human for another call):
    // the result is recorded, the status is not touched.
    let c = dispatched(ledger, refund_call(&s.id, 1, 0, 300)).await;
    let d = ledger
        .record_tool_call(refund_call(&s.id, 1, 1, 400))
        .await
        .unwrap();
    ledger
        .open_approval(approval_for(&s.id, &d.call_id))
        .await
        .unwrap();
    assert_eq!(
        ledger.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
    let waiting = ledger
        .record_tool_result_and_resume(&c.call_id, ok(json!({})), resume())
        .await
        .unwrap();
    assert_unmoved(
        ledger,
        &s.id,
        &waiting,
        true,
        SessionStatus::AwaitingApproval,
    )
    .await;

    // A change the result may not carry is refused before anything is written.
    let count = ledger.events_after(&s.id, 0, 1000).await.unwrap().len();
    assert_eq!(
        invalid(
            ledger
                .record_tool_result_and_resume(
                    &c.call_id,
                    ok(json!({})),
                    StatusChange::to(SessionStatus::Running),
                )
                .await
        ),
        "a resume after a tool result names the status it expects the session in"
    );
    assert_eq!(
        invalid(
            ledger
                .record_tool_result_and_resume(
                    &c.call_id,
                    ok(json!({})),
                    StatusChange::completed(None).from(SessionStatus::AwaitingTool),
                )
                .await
        ),
        "a tool result cannot move its session from awaiting_tool to completed"
    );
    assert_eq!(
        ledger.events_after(&s.id, 0, 1000).await.unwrap().len(),
        count
    );
}

pub(crate) async fn tool_calls_follow_the_ledger_state_machine(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let s = start(ledger, &v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;

    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 100))
        .await
        .unwrap();
    assert_eq!(call.call_id, format!("{}:{}:1:0:0", s.id, v.id));
    assert_eq!(call.call_id, tool_call_id(&s.id, v.id, 1, 0, 0));
    assert_eq!(call.status, CallStatus::Pending);
    assert_eq!(
        (call.turn, call.iteration, call.index, call.attempt),
        (1, 0, 0, 0)
    );
    assert_eq!(
        call.side_effect_class,
        Some(SideEffectClass::NonIdempotentWrite)
    );
    // Recording the same call again is idempotent; a different call under the same id is not.
    assert_eq!(
        ledger
            .record_tool_call(refund_call(&s.id, 0, 0, 100))
            .await
            .unwrap(),
        call
    );
    assert!(matches!(
        ledger.record_tool_call(refund_call(&s.id, 0, 0, 999)).await,
        Err(LedgerError::AlreadyExists { .. })
    ));
    // A second tool-using completion in the same turn gets its own id (§14.1 item 1).
    let second = ledger
        .record_tool_call(refund_call(&s.id, 1, 0, 100))
        .await
        .unwrap();
    assert_ne!(second.call_id, call.call_id);

    assert_eq!(
        precondition(ledger.dispatch_tool_call(&call.call_id, worker()).await),
        format!(
            "tool call {} cannot go from pending to dispatched",
            call.call_id
        )
    );
    let queued = ledger.queue_tool_call(&call.call_id).await.unwrap();
    assert_eq!(queued.status, CallStatus::Queued);
    assert!(queued.queued_at.is_some());
    let deadline = chrono::Utc::now() + Duration::seconds(30);
    let dispatched = ledger
        .dispatch_tool_call(
            &call.call_id,
            Dispatch {
                deadline_at: Some(deadline),
                ..worker()
            },
        )
        .await
        .unwrap();
    assert_eq!(dispatched.status, CallStatus::Dispatched);
    assert_eq!(dispatched.attempt, 1);
    assert_eq!(dispatched.worker_id.as_deref(), Some("worker-1"));
    assert_eq!(dispatched.image_digest.as_deref(), Some("sha256:abc"));
    assert_eq!(
        dispatched.manifest_content_hash.as_deref(),
        Some(v.content_hash.as_str())
    );
    assert!(dispatched.deadline_at.is_some());

    // The first result completes the call; a duplicate is recorded but changes nothing.
    let first = ledger
        .record_tool_result(
            &call.call_id,
            ToolResult {
                usage: Some(Usage {
                    input_tokens: 7,
                    output_tokens: 3,
                    estimated: true,
                }),
                ..ok(json!({"refund_id": "R-1"}))
            },
        )
        .await
        .unwrap();
    assert!(first.applied);
    assert_eq!(first.invocation.status, CallStatus::Succeeded);
    assert_eq!(first.invocation.result, Some(json!({"refund_id": "R-1"})));
    assert_eq!(
        first.invocation.usage,
        Some(Usage {
            input_tokens: 7,
            output_tokens: 3,
            estimated: true
        })
    );
    let dup = ledger
        .record_tool_result(&call.call_id, ok(json!({"refund_id": "R-2"})))
        .await
        .unwrap();
    assert!(!dup.applied);
    assert_eq!(dup.invocation, first.invocation);
    assert_eq!(
        ledger.get_tool_call(&call.call_id).await.unwrap(),
        first.invocation
    );
    assert_eq!(
        ledger.completed_call(&call.call_id).await.unwrap(),
        Some(first.invocation.clone())
    );
    assert_eq!(ledger.completed_call(&second.call_id).await.unwrap(), None);
    assert_eq!(ledger.completed_call("unknown").await.unwrap(), None);
    assert_eq!(
        precondition(ledger.queue_tool_call(&call.call_id).await),
        format!(
            "tool call {} cannot go from succeeded to queued",
            call.call_id
        )
    );

    // Lost worker: indeterminate, re-queued and re-dispatched with the same id (attempt 2).
    ledger.queue_tool_call(&second.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&second.call_id, worker())
        .await
        .unwrap();
    let lost = ledger
        .mark_tool_call_indeterminate(&second.call_id, "worker worker-1 lease expired")
        .await
        .unwrap();
    assert_eq!(lost.status, CallStatus::Indeterminate);
    ledger.queue_tool_call(&second.call_id).await.unwrap();
    let again = ledger
        .dispatch_tool_call(
            &second.call_id,
            Dispatch {
                worker_id: "worker-2".into(),
                ..worker()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (again.attempt, again.worker_id.as_deref()),
        (2, Some("worker-2"))
    );
    let err = ledger
        .record_tool_result(
            &second.call_id,
            ToolResult {
                worker_id: Some("worker-2".into()),
                outcome: ToolOutcome::Error {
                    code: "invalid_args".into(),
                    message: "amount must be positive".into(),
                },
                usage: None,
            },
        )
        .await
        .unwrap();
    assert!(err.applied);
    assert_eq!(err.invocation.status, CallStatus::Failed);
    assert_eq!(err.invocation.error_code.as_deref(), Some("invalid_args"));

    // Runtime failure, policy denial, cancellation, and a result for a call never dispatched.
    let c3 = ledger
        .record_tool_call(refund_call(&s.id, 1, 1, 5))
        .await
        .unwrap();
    ledger.queue_tool_call(&c3.call_id).await.unwrap();
    let failed = ledger
        .fail_tool_call(&c3.call_id, "no_handler", "no handler registered for tool")
        .await
        .unwrap();
    assert_eq!(failed.status, CallStatus::Failed);
    assert_eq!(failed.error_code.as_deref(), Some("no_handler"));
    let c4 = ledger
        .record_tool_call(refund_call(&s.id, 1, 2, 14_000))
        .await
        .unwrap();
    let denied = ledger
        .deny_tool_call(
            &c4.call_id,
            "Refunds over 5000 are never allowed",
            Some("payments/refund-hard-limit@1.0.0"),
        )
        .await
        .unwrap();
    assert_eq!(denied.status, CallStatus::Failed);
    assert_eq!(denied.error_code.as_deref(), Some("policy_denied"));
    assert_eq!(denied.attempt, 0, "a denied call is never dispatched");
    let c5 = ledger
        .record_tool_call(refund_call(&s.id, 1, 3, 5))
        .await
        .unwrap();
    let never = ledger
        .record_tool_result(&c5.call_id, ok(json!({})))
        .await
        .unwrap();
    assert!(!never.applied);
    assert_eq!(
        ledger.in_flight_calls(&s.id).await.unwrap(),
        vec![ledger.get_tool_call(&c5.call_id).await.unwrap()]
    );
    ledger.queue_tool_call(&c5.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&c5.call_id, worker())
        .await
        .unwrap();
    let cancelled = ledger
        .cancel_tool_call(&c5.call_id, "execution deadline exceeded")
        .await
        .unwrap();
    assert_eq!(cancelled.status, CallStatus::Cancelled);
    assert_eq!(
        cancelled.error_code.as_deref(),
        Some("cancelled_after_dispatch")
    );
    // The worker did run it: a result that arrives after the cancellation is what happened.
    let late = ledger
        .record_tool_result(&c5.call_id, ok(json!({"late": true})))
        .await
        .unwrap();
    assert!(late.applied);
    assert_eq!(late.invocation.status, CallStatus::Succeeded);
    assert_eq!(late.invocation.result, Some(json!({"late": true})));
    assert!(ledger.in_flight_calls(&s.id).await.unwrap().is_empty());
    assert_eq!(
        not_found(ledger.record_tool_result("nope", ok(json!({}))).await),
        "tool call \"nope\" not found"
    );

    // Every step is an event with the call id and turn; late results are in the log too.
    let events = ledger.events_after(&s.id, 0, 1000).await.unwrap();
    let for_c5: Vec<&str> = events
        .iter()
        .filter(|e| e.call_id.as_deref() == Some(c5.call_id.as_str()))
        .map(|e| e.event_type.as_str())
        .collect();
    assert_eq!(
        for_c5,
        vec![
            "tool.requested",
            "tool.late_result",
            "tool.queued",
            "tool.dispatched",
            "tool.cancelled",
            "tool.completed",
        ]
    );
    let dispatched_event = events
        .iter()
        .find(|e| e.event_type == "tool.dispatched")
        .unwrap();
    assert_eq!(dispatched_event.turn, Some(1));
    assert_eq!(
        dispatched_event.payload["worker_identity"],
        "payments/refunds"
    );
    assert_eq!(dispatched_event.payload["args"]["amount"], 100);
    assert!(events.iter().any(|e| e.event_type == "tool.policy_denied"
        && e.payload["policy_ref"] == "payments/refund-hard-limit@1.0.0"));

    // No calls on ended sessions.
    ledger
        .set_session_status(&s.id, StatusChange::completed(None))
        .await
        .unwrap();
    assert!(
        precondition(ledger.record_tool_call(refund_call(&s.id, 2, 0, 1)).await)
            .contains("cannot record tool calls")
    );
}

pub(crate) async fn a_late_result_closes_a_recovery_approval(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let s = start(ledger, &v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 400))
        .await
        .unwrap();
    ledger.queue_tool_call(&call.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&call.call_id, worker())
        .await
        .unwrap();
    ledger
        .mark_tool_call_indeterminate(&call.call_id, "daemon restarted")
        .await
        .unwrap();
    let approval = ledger
        .open_approval(NewApproval {
            policy_ref: None,
            reason: "tool dispatch outcome indeterminate".into(),
            actor: "system".into(),
            ..approval_for(&s.id, &call.call_id)
        })
        .await
        .unwrap();
    assert_eq!(approval.policy_ref, None);
    let recorded = ledger
        .record_tool_result(&call.call_id, ok(json!({"refund_id": "R-9"})))
        .await
        .unwrap();
    assert!(recorded.applied, "the worker did run it: keep the outcome");
    assert_eq!(recorded.invocation.status, CallStatus::Succeeded);
    assert_eq!(recorded.closed_approval, Some(approval.id));
    let closed = ledger.get_approval(approval.id).await.unwrap();
    assert_eq!(closed.status, ApprovalStatus::Cancelled);
    assert_eq!(
        precondition(ledger.cast_vote(approval.id, approve("alice")).await),
        format!("approval {} is already cancelled", approval.id)
    );

    // Approved for re-dispatch, but the first attempt's result arrives first: it wins, and the
    // call is not sent a second time.
    let again = ledger
        .record_tool_call(refund_call(&s.id, 0, 1, 300))
        .await
        .unwrap();
    ledger.queue_tool_call(&again.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&again.call_id, worker())
        .await
        .unwrap();
    ledger
        .mark_tool_call_indeterminate(&again.call_id, "daemon restarted")
        .await
        .unwrap();
    let recovery = ledger
        .open_approval(NewApproval {
            policy_ref: None,
            ..approval_for(&s.id, &again.call_id)
        })
        .await
        .unwrap();
    ledger
        .cast_vote(recovery.id, approve("alice"))
        .await
        .unwrap();
    assert_eq!(
        ledger.get_tool_call(&again.call_id).await.unwrap().status,
        CallStatus::Pending
    );
    let first_attempt = ledger
        .record_tool_result(&again.call_id, ok(json!({"refund_id": "R-10"})))
        .await
        .unwrap();
    assert!(first_attempt.applied);
    assert_eq!(first_attempt.closed_approval, None);
    assert!(precondition(ledger.queue_tool_call(&again.call_id).await).contains("succeeded"));
}

/// A call sent to worker-1 whose outcome became unknown, with an outcome review opened for it.
async fn review_for(
    ledger: &Ledger,
    session: &str,
    iteration: u32,
) -> (ToolInvocation, phrony_ledger::Approval) {
    let call = ledger
        .record_tool_call(refund_call(session, iteration, 0, 400))
        .await
        .unwrap();
    ledger.queue_tool_call(&call.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&call.call_id, worker())
        .await
        .unwrap();
    ledger
        .mark_tool_call_indeterminate(&call.call_id, "worker \"worker-1\" was lost")
        .await
        .unwrap();
    let review = ledger
        .open_approval(NewApproval {
            kind: ApprovalKind::OutcomeReview,
            policy_ref: None,
            reason: "worker worker-1 was lost while payments.issue-refund@1.0.0 was executing"
                .into(),
            route: String::new(),
            actor: "system".into(),
            ..approval_for(session, &call.call_id)
        })
        .await
        .unwrap();
    (call, review)
}

fn resolve(actor: &str, resolution: ReviewResolution, comment: &str) -> Vote {
    Vote::resolve(actor, resolution, comment)
}

pub(crate) async fn outcome_reviews_are_resolved_not_approved(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let s = start(ledger, &v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;

    // A review is its own kind, stored and listed as such; policy approvals stay `policy`.
    let (happened, review) = review_for(ledger, &s.id, 0).await;
    assert_eq!(review.kind, ApprovalKind::OutcomeReview);
    assert_eq!(review.resolution, None);
    let listed = ledger
        .list_approvals(&ApprovalFilter::default(), &PageRequest::default())
        .await
        .unwrap();
    assert_eq!(listed.items[0].kind, ApprovalKind::OutcomeReview);

    // A plain approve (what a client that knows only approve/reject sends) is refused: it
    // would re-send a call that may already have happened.
    let refused = precondition(ledger.cast_vote(review.id, approve("alice")).await);
    assert!(refused.contains("is an outcome review"), "{refused}");
    assert!(refused.contains("\"resend\""), "{refused}");
    // Resolutions must agree with the vote, carry no edits, and a result only with happened.
    let mut wrong = resolve("alice", ReviewResolution::Resend, "");
    wrong.decision = VoteDecision::Reject;
    assert!(invalid(ledger.cast_vote(review.id, wrong).await).contains("recorded as approved"));
    let mut edited = resolve("alice", ReviewResolution::Resend, "");
    edited.edited_args = Some(json!({"amount": 1}));
    assert!(invalid(ledger.cast_vote(review.id, edited).await).contains("cannot edit"));
    let mut with_result = resolve("alice", ReviewResolution::Fail, "");
    with_result.result = Some(json!({}));
    assert!(invalid(ledger.cast_vote(review.id, with_result).await).contains("happened"));
    assert_eq!(
        ledger.get_approval(review.id).await.unwrap().status,
        ApprovalStatus::Pending,
        "refused votes change nothing"
    );

    // happened: the call succeeded with the operator's result, attributed to the operator.
    let mut confirmed = resolve(
        "alice",
        ReviewResolution::Happened,
        "refund R-1 is in the PSP",
    );
    confirmed.result = Some(json!({"refund_id": "R-1"}));
    let outcome = ledger.cast_vote(review.id, confirmed).await.unwrap();
    assert!(outcome.decided);
    assert_eq!(outcome.approval.status, ApprovalStatus::Approved);
    assert_eq!(
        outcome.approval.resolution,
        Some(ReviewResolution::Happened)
    );
    let call = ledger.get_tool_call(&happened.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!(call.result, Some(json!({"refund_id": "R-1"})));
    assert_eq!(call.attempt, 1, "not sent again");
    let events = ledger.events_after(&s.id, 0, 1000).await.unwrap();
    let completed = events
        .iter()
        .rfind(|e| e.event_type == "tool.completed")
        .unwrap();
    assert_eq!(completed.actor, "alice");
    assert_eq!(completed.payload["resolved_by"], "alice");
    let decided = events
        .iter()
        .rfind(|e| e.event_type == "approval.decided")
        .unwrap();
    assert_eq!(decided.payload["resolution"], "happened");
    assert!(decided.seq < completed.seq);

    // A reject without resolution means fail: outcome unknown, not re-sent; never
    // `approval_denied`. A worker result that arrives later is still recorded as the truth.
    let (failed, review) = review_for(ledger, &s.id, 1).await;
    let outcome = ledger
        .cast_vote(review.id, reject("bob", "cannot check the PSP"))
        .await
        .unwrap();
    assert_eq!(outcome.approval.status, ApprovalStatus::Denied);
    assert_eq!(outcome.approval.resolution, Some(ReviewResolution::Fail));
    let call = ledger.get_tool_call(&failed.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Failed);
    assert_eq!(call.error_code.as_deref(), Some("outcome_unknown"));
    assert_eq!(
        call.error_message.as_deref(),
        Some(
            "outcome unknown, not re-sent by bob (the call may have taken effect): cannot \
             check the PSP"
        )
    );
    let late = ledger
        .record_tool_result(&failed.call_id, ok(json!({"refund_id": "R-2"})))
        .await
        .unwrap();
    assert!(late.applied);
    assert_eq!(late.invocation.status, CallStatus::Succeeded);

    // resend: the only way back to dispatch; the call is pending again with its arguments.
    let (resent, review) = review_for(ledger, &s.id, 2).await;
    let outcome = ledger
        .cast_vote(
            review.id,
            resolve("carol", ReviewResolution::Resend, "PSP shows nothing"),
        )
        .await
        .unwrap();
    assert_eq!(outcome.approval.status, ApprovalStatus::Approved);
    assert_eq!(outcome.approval.resolution, Some(ReviewResolution::Resend));
    let call = ledger.get_tool_call(&resent.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Pending);
    ledger.queue_tool_call(&call.call_id).await.unwrap();
    let again = ledger
        .dispatch_tool_call(&call.call_id, worker())
        .await
        .unwrap();
    assert_eq!(again.attempt, 2);

    // A resolution on a policy approval is refused; reviews need a dispatched call, quorum 1
    // and no timeout.
    let (_, _, policy) = pending_approval(ledger, &v, |_| {}).await;
    assert_eq!(policy.kind, ApprovalKind::Policy);
    assert!(
        invalid(
            ledger
                .cast_vote(policy.id, resolve("alice", ReviewResolution::Resend, ""))
                .await
        )
        .contains("is a policy approval")
    );
    let s2 = start(ledger, &v).await;
    to(ledger, &s2.id, SessionStatus::AwaitingTool).await;
    let fresh = ledger
        .record_tool_call(refund_call(&s2.id, 0, 0, 10))
        .await
        .unwrap();
    let review_of = |c: &ToolInvocation| NewApproval {
        kind: ApprovalKind::OutcomeReview,
        policy_ref: None,
        ..approval_for(&s2.id, &c.call_id)
    };
    assert!(
        precondition(ledger.open_approval(review_of(&fresh)).await)
            .contains("never sent to a worker")
    );
    let mut quorum = review_of(&fresh);
    quorum.approvals_required = 2;
    assert!(invalid(ledger.open_approval(quorum).await).contains("exactly one decision"));

    // Kinds and resolutions are rebuilt from the log.
    let before = snapshot_all(db).await;
    ledger.rebuild_projections().await.unwrap();
    assert_eq!(snapshot_all(db).await, before);
}

pub(crate) async fn a_call_cancelled_after_dispatch_keeps_its_late_result(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let s = start(ledger, &v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 400))
        .await
        .unwrap();
    ledger.queue_tool_call(&call.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&call.call_id, worker())
        .await
        .unwrap();
    let never_sent = ledger
        .record_tool_call(refund_call(&s.id, 0, 1, 5))
        .await
        .unwrap();
    ledger
        .set_session_status(&s.id, StatusChange::cancelled().by("alice"))
        .await
        .unwrap();
    let cancelled = ledger.get_tool_call(&call.call_id).await.unwrap();
    assert_eq!(cancelled.status, CallStatus::Cancelled);
    assert_eq!(
        cancelled.error_code.as_deref(),
        Some("cancelled_after_dispatch")
    );
    assert!(
        cancelled
            .error_message
            .as_deref()
            .unwrap()
            .contains("had been sent to worker \"worker-1\" and may have taken effect"),
        "{cancelled:?}"
    );
    let not_sent = ledger.get_tool_call(&never_sent.call_id).await.unwrap();
    assert_eq!(not_sent.error_code.as_deref(), Some("cancelled"));

    let late = ledger
        .record_tool_result(&call.call_id, ok(json!({"refund_id": "R-7"})))
        .await
        .unwrap();
    assert!(late.applied, "the worker issued it: record what happened");
    assert_eq!(late.invocation.status, CallStatus::Succeeded);
    assert_eq!(late.invocation.result, Some(json!({"refund_id": "R-7"})));
    assert_eq!(
        ledger.get_session(&s.id).await.unwrap().status,
        SessionStatus::Cancelled,
        "the session stays cancelled"
    );
    // Once known, the outcome is final; a call never sent does not take results.
    let dup = ledger
        .record_tool_result(&call.call_id, ok(json!({"refund_id": "R-8"})))
        .await
        .unwrap();
    assert!(!dup.applied);
    let stray = ledger
        .record_tool_result(&never_sent.call_id, ok(json!({})))
        .await
        .unwrap();
    assert!(!stray.applied);
}

// ---------------------------------------------------------------------------------------------
// approvals

pub(crate) async fn approval_quorum_counts_distinct_actors_and_keeps_edited_args(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let (s, call, approval) = pending_approval(ledger, &v, |a| a.approvals_required = 2).await;
    assert_eq!(approval.status, ApprovalStatus::Pending);
    assert_eq!(approval.agent.to_string(), "support/refund-agent@0.1.0");
    assert_eq!(
        approval.policy_ref.as_deref(),
        Some("payments/refund-approval-boundary@1.0.0")
    );
    assert_eq!(
        (approval.tool.as_str(), approval.tool_version.as_str()),
        ("payments.issue-refund", "1.0.0")
    );
    assert_eq!(approval.args, json!({"order_id": "ORD-1", "amount": 400}));
    assert_eq!(approval.call_hash, phrony_ledger::call_hash(&s.id, &call));
    assert_eq!(approval.call_hash.len(), 64);
    // Opening moved the call and the session, each with an event.
    assert_eq!(
        ledger.get_tool_call(&call.call_id).await.unwrap().status,
        CallStatus::AwaitingApproval
    );
    assert_eq!(
        ledger.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
    let types = types_of(ledger, &s.id).await;
    assert_eq!(
        types[types.len() - 2..].to_vec(),
        vec!["approval.required", "session.status_changed"]
    );
    // A second approval for the same call is refused while one is pending.
    assert!(
        precondition(
            ledger
                .open_approval(approval_for(&s.id, &call.call_id))
                .await
        )
        .contains("cannot wait for an approval")
    );

    let edited = json!({"order_id": "ORD-1", "amount": 300});
    let first = ledger
        .cast_vote(
            approval.id,
            Vote {
                edited_args: Some(edited.clone()),
                ..approve("alice")
            },
        )
        .await
        .unwrap();
    assert!(!first.decided);
    assert_eq!(first.approval.status, ApprovalStatus::Pending);
    assert_eq!(first.approval.approvals_received, 1);
    assert_eq!(first.approval.effective_args, Some(edited.clone()));
    assert_eq!(
        precondition(ledger.cast_vote(approval.id, approve("alice")).await),
        "actor \"alice\" already decided on this approval"
    );
    assert!(
        precondition(
            ledger
                .cast_vote(
                    approval.id,
                    Vote {
                        edited_args: Some(json!({"order_id": "ORD-1", "amount": 1})),
                        ..approve("bob")
                    }
                )
                .await
        )
        .contains("already has approve votes for other arguments")
    );
    let second = ledger.cast_vote(approval.id, approve("bob")).await.unwrap();
    assert!(second.decided);
    let a = second.approval;
    assert_eq!(a.status, ApprovalStatus::Approved);
    assert_eq!(a.approvals_received, 2);
    assert_eq!(a.decided_by.as_deref(), Some("bob"));
    assert_eq!(a.comment.as_deref(), Some("ok by bob"));
    assert!(a.decided_at.is_some());
    assert_eq!(
        a.args,
        json!({"order_id": "ORD-1", "amount": 400}),
        "proposed kept"
    );
    assert_eq!(a.args_to_dispatch(), &edited);
    let votes: Vec<(&str, VoteDecision, Option<&Value>)> = a
        .votes
        .iter()
        .map(|v| (v.decided_by.as_str(), v.decision, v.edited_args.as_ref()))
        .collect();
    assert_eq!(
        votes,
        vec![
            ("alice", VoteDecision::Approve, Some(&edited)),
            ("bob", VoteDecision::Approve, None),
        ]
    );
    assert_eq!(
        precondition(ledger.cast_vote(approval.id, approve("carol")).await),
        format!("approval {} is already approved", approval.id)
    );

    // The call goes back to pending with the edited args; dispatch records what was sent.
    let c = ledger.get_tool_call(&call.call_id).await.unwrap();
    assert_eq!(c.status, CallStatus::Pending);
    assert_eq!(c.args, edited);
    assert_eq!(c.proposed_args, json!({"order_id": "ORD-1", "amount": 400}));
    ledger.queue_tool_call(&call.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&call.call_id, worker())
        .await
        .unwrap();
    let events = ledger.events_after(&s.id, 0, 1000).await.unwrap();
    let sent = events
        .iter()
        .find(|e| e.event_type == "tool.dispatched")
        .unwrap();
    assert_eq!(sent.payload["args"], edited);
    let vote_events: Vec<(&str, &Value)> = events
        .iter()
        .filter(|e| e.event_type == "approval.vote")
        .map(|e| (e.actor.as_str(), &e.payload["edited_args"]))
        .collect();
    assert_eq!(vote_events, vec![("alice", &edited), ("bob", &Value::Null)]);
    let decided = events
        .iter()
        .find(|e| e.event_type == "approval.decided")
        .unwrap();
    assert_eq!(decided.payload["approved"], true);
    assert_eq!(decided.payload["effective_args"], edited);
    assert_eq!(decided.call_id.as_deref(), Some(call.call_id.as_str()));
    assert_eq!(
        decided.turn,
        Some(1),
        "approval events carry the call's turn"
    );

    assert_eq!(
        not_found(ledger.get_approval(Uuid::nil()).await),
        format!("approval {} not found", Uuid::nil())
    );
    assert_eq!(
        invalid(ledger.cast_vote(approval.id, approve(" ")).await),
        "actor is required"
    );
}

pub(crate) async fn approval_reject_vetoes_and_comprehension_is_required(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let (_, call, approval) = pending_approval(ledger, &v, |a| {
        a.approvals_required = 3;
        a.comprehension_required = true;
        a.on_reject = OnReject::Fail;
    })
    .await;
    assert_eq!(
        invalid(ledger.cast_vote(approval.id, approve("alice")).await),
        "comprehension acknowledgement is required"
    );
    assert_eq!(
        invalid(ledger.cast_vote(approval.id, reject("alice", "no")).await),
        "comprehension acknowledgement is required",
        "rejects need it too"
    );
    assert!(
        invalid(
            ledger
                .cast_vote(
                    approval.id,
                    Vote {
                        edited_args: Some(json!({"amount": 1})),
                        comprehension_acknowledged: true,
                        ..reject("alice", "no")
                    }
                )
                .await
        )
        .contains("only accompany an approve vote")
    );
    assert!(
        invalid(
            ledger
                .cast_vote(
                    approval.id,
                    Vote {
                        edited_args: Some(json!([1])),
                        comprehension_acknowledged: true,
                        ..approve("alice")
                    }
                )
                .await
        )
        .contains("JSON object")
    );
    let first = ledger
        .cast_vote(
            approval.id,
            Vote {
                comprehension_acknowledged: true,
                ..approve("alice")
            },
        )
        .await
        .unwrap();
    assert_eq!(first.approval.status, ApprovalStatus::Pending);
    let veto = ledger
        .cast_vote(
            approval.id,
            Vote {
                comprehension_acknowledged: true,
                ..reject("bob", "customer already refunded")
            },
        )
        .await
        .unwrap();
    assert!(veto.decided);
    assert_eq!(veto.approval.status, ApprovalStatus::Denied);
    assert_eq!(veto.approval.decided_by.as_deref(), Some("bob"));
    assert_eq!(
        veto.approval.comment.as_deref(),
        Some("customer already refunded")
    );
    assert_eq!(veto.approval.on_reject, OnReject::Fail);
    assert_eq!(veto.approval.approvals_received, 1);
    let c = ledger.get_tool_call(&call.call_id).await.unwrap();
    assert_eq!(c.status, CallStatus::Failed);
    assert_eq!(c.error_code.as_deref(), Some("approval_denied"));
    assert_eq!(
        c.error_message.as_deref(),
        Some("customer already refunded")
    );
    assert!(c.completed_at.is_some());
}

pub(crate) async fn approval_timeouts_apply_their_default(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let timeout = |default| ApprovalTimeout {
        after_minutes: 5,
        default,
        escalate_to_route: None,
        escalate_after_minutes: None,
    };
    let (_, deny_call, deny) = pending_approval(ledger, &v, |a| {
        a.timeout = Some(timeout(TimeoutDefault::Deny))
    })
    .await;
    let (_, allow_call, allow) = pending_approval(ledger, &v, |a| {
        a.approvals_required = 2;
        a.timeout = Some(timeout(TimeoutDefault::Allow));
    })
    .await;
    let (_, _, escalate) = pending_approval(ledger, &v, |a| {
        a.timeout = Some(ApprovalTimeout {
            escalate_to_route: Some("finance-leads".into()),
            escalate_after_minutes: Some(30),
            ..timeout(TimeoutDefault::Escalate)
        });
    })
    .await;
    let (_, _, untimed) = pending_approval(ledger, &v, |_| {}).await;

    let opened = deny.created_at;
    let expires = deny.expires_at.unwrap();
    assert!(expires > opened + Duration::minutes(4) && expires <= opened + Duration::minutes(6));
    assert_eq!(
        ledger.next_approval_expiry().await.unwrap(),
        Some(expires),
        "the earliest expiry arms the timer"
    );
    let now = chrono::Utc::now();
    assert!(
        precondition(ledger.expire_approval(deny.id, now).await)
            .starts_with(&format!("approval {} does not expire until ", deny.id))
    );
    assert_eq!(
        precondition(
            ledger
                .expire_approval(untimed.id, now + Duration::days(1))
                .await
        ),
        format!("approval {} has no timeout", untimed.id)
    );
    assert!(ledger.due_approvals(now, 100).await.unwrap().is_empty());
    let later = now + Duration::minutes(6);
    let due: BTreeSet<Uuid> = ledger
        .due_approvals(later, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(due, BTreeSet::from([deny.id, allow.id, escalate.id]));

    // deny
    let denied = ledger.expire_approval(deny.id, later).await.unwrap();
    assert_eq!(denied.approval.status, ApprovalStatus::Denied);
    assert_eq!(
        denied.approval.decided_by.as_deref(),
        Some("system:timeout")
    );
    assert_eq!(
        denied.approval.comment.as_deref(),
        Some("approval timed out")
    );
    assert_eq!(
        ledger
            .get_tool_call(&deny_call.call_id)
            .await
            .unwrap()
            .status,
        CallStatus::Failed
    );
    assert_eq!(
        precondition(ledger.expire_approval(deny.id, later).await),
        format!("approval {} is already denied", deny.id)
    );

    // allow: resolves the approval even with quorum 2 and one vote (§14.1 item 4)
    ledger.cast_vote(allow.id, approve("alice")).await.unwrap();
    let allowed = ledger.expire_approval(allow.id, later).await.unwrap();
    assert_eq!(allowed.approval.status, ApprovalStatus::Approved);
    assert_eq!(
        allowed.approval.decided_by.as_deref(),
        Some("system:timeout")
    );
    assert_eq!(
        allowed.approval.approvals_received, 1,
        "no vote is invented"
    );
    let c = ledger.get_tool_call(&allow_call.call_id).await.unwrap();
    assert_eq!(c.status, CallStatus::Pending);
    assert_eq!(c.args, allow_call.proposed_args);

    // escalate: a new approval one level up, until the depth limit denies it
    let escalated = ledger.expire_approval(escalate.id, later).await.unwrap();
    assert_eq!(escalated.approval.status, ApprovalStatus::Escalated);
    assert_eq!(
        escalated.approval.decided_by.as_deref(),
        Some("system:timeout")
    );
    let next = escalated.escalated_to.unwrap();
    assert_eq!(next.status, ApprovalStatus::Pending);
    assert_eq!(next.parent_approval_id, Some(escalate.id));
    assert_eq!(next.escalation_depth, 1);
    assert_eq!(next.route, "finance-leads");
    assert_eq!(next.call_id, escalate.call_id);
    assert_eq!(next.approvals_received, 0);
    let next_expiry = next.expires_at.unwrap();
    assert!(next_expiry >= next.created_at + Duration::minutes(29));
    assert!(next_expiry <= next.created_at + Duration::minutes(31));
    let mut current = next;
    for depth in 2..=5 {
        let out = ledger
            .expire_approval(current.id, current.expires_at.unwrap())
            .await
            .unwrap();
        current = out.escalated_to.unwrap();
        assert_eq!(current.escalation_depth, depth);
    }
    let last = ledger
        .expire_approval(current.id, current.expires_at.unwrap())
        .await
        .unwrap();
    assert_eq!(last.escalated_to, None);
    assert_eq!(last.approval.status, ApprovalStatus::Denied);
    assert_eq!(
        last.approval.comment.as_deref(),
        Some("approval escalation depth exceeded")
    );
    let chain = ledger
        .list_approvals(
            &ApprovalFilter {
                session_id: Some(escalate.session_id.clone()),
                ..ApprovalFilter::default()
            },
            &PageRequest::first(100),
        )
        .await
        .unwrap();
    assert_eq!(chain.items.len(), 6);
    assert_eq!(
        chain
            .items
            .iter()
            .filter(|a| a.status == ApprovalStatus::Escalated)
            .count(),
        5
    );
}

pub(crate) async fn approvals_close_when_their_session_ends(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let (s, call, approval) = pending_approval(ledger, &v, |_| {}).await;
    let other = ledger
        .record_tool_call(refund_call(&s.id, 0, 1, 50))
        .await
        .unwrap();
    ledger.queue_tool_call(&other.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&other.call_id, worker())
        .await
        .unwrap();

    let changed = ledger
        .set_session_status(&s.id, StatusChange::cancelled().by("ops"))
        .await
        .unwrap();
    assert_eq!(changed.closed_approvals, vec![approval.id]);
    assert_eq!(changed.cancelled_calls, vec![other.call_id.clone()]);
    let closed = ledger.get_approval(approval.id).await.unwrap();
    assert_eq!(closed.status, ApprovalStatus::Cancelled);
    assert_eq!(closed.decided_by.as_deref(), Some("system"));
    assert_eq!(
        closed.comment.as_deref(),
        Some(format!("session {} ended (cancelled)", s.id).as_str())
    );
    for id in [&call.call_id, &other.call_id] {
        assert_eq!(
            ledger.get_tool_call(id).await.unwrap().status,
            CallStatus::Cancelled
        );
    }
    assert_eq!(
        precondition(ledger.cast_vote(approval.id, approve("alice")).await),
        format!("approval {} is already cancelled", approval.id)
    );
    let pending = ledger
        .list_approvals(
            &ApprovalFilter {
                status: Some(ApprovalStatus::Pending),
                ..ApprovalFilter::default()
            },
            &PageRequest::default(),
        )
        .await
        .unwrap();
    assert!(pending.items.is_empty(), "nothing left pending");
    assert!(
        ledger
            .due_approvals(chrono::Utc::now() + Duration::days(9), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let tail = types_of(ledger, &s.id).await;
    assert_eq!(
        tail[tail.len() - 3..].to_vec(),
        vec!["approval.decided", "tool.cancelled", "session.cancelled"]
    );
    // The worker had the call: its late answer is what happened (the session stays ended).
    let late = ledger
        .record_tool_result(&other.call_id, ok(json!({"refund_id": "R-3"})))
        .await
        .unwrap();
    assert!(late.applied);
    assert_eq!(late.invocation.status, CallStatus::Succeeded);
    assert_eq!(
        ledger.get_session(&s.id).await.unwrap().status,
        SessionStatus::Cancelled
    );

    // Completing or failing a session closes its approvals too.
    for change in [
        StatusChange::completed(None),
        StatusChange::failed("tool call denied"),
    ] {
        let (s, _, approval) = pending_approval(ledger, &v, |_| {}).await;
        ledger.set_session_status(&s.id, change).await.unwrap();
        assert_eq!(
            ledger.get_approval(approval.id).await.unwrap().status,
            ApprovalStatus::Cancelled
        );
    }
}

pub(crate) async fn retire_and_archive_end_the_sessions_of_their_versions(db: &TestDb) {
    let ledger = db.migrated().await;
    let agent = refund_agent();
    let v1 = deploy_agent(ledger, &agent, "0.1.0").await;
    // Waiting for a human.
    let (waiting, waiting_call, approval) = pending_approval(ledger, &v1, |_| {}).await;
    // Decided just before the retire: the call is approved but not yet dispatched.
    let (decided, decided_call, decided_approval) = pending_approval(ledger, &v1, |_| {}).await;
    ledger
        .cast_vote(decided_approval.id, approve("alice"))
        .await
        .unwrap();
    assert_eq!(
        ledger
            .get_tool_call(&decided_call.call_id)
            .await
            .unwrap()
            .status,
        CallStatus::Pending
    );
    let finished = start(ledger, &v1).await;
    to(ledger, &finished.id, SessionStatus::Completed).await;
    let v2 = deploy_agent(ledger, &agent, "0.2.0").await;
    let (other, other_call, other_approval) = pending_approval(ledger, &v2, |_| {}).await;

    let retired = ledger
        .retire_version(
            &agent,
            "0.1.0",
            &phrony_ledger::Attribution::unverified("erin"),
        )
        .await
        .unwrap();
    let reason = "agent version support/refund-agent@0.1.0 retired by erin";
    assert_eq!(
        retired.ended_sessions.iter().collect::<BTreeSet<_>>(),
        [&waiting.id, &decided.id]
            .into_iter()
            .collect::<BTreeSet<_>>()
    );
    for id in [&waiting.id, &decided.id] {
        let s = ledger.get_session(id).await.unwrap();
        assert_eq!(s.status, SessionStatus::Failed);
        assert_eq!(s.error.as_deref(), Some(reason));
    }
    let closed = ledger.get_approval(approval.id).await.unwrap();
    assert_eq!(closed.status, ApprovalStatus::Cancelled);
    assert_eq!(closed.comment.as_deref(), Some(reason));
    // Neither the waiting call nor the approved one can be dispatched any more.
    for id in [&waiting_call.call_id, &decided_call.call_id] {
        let call = ledger.get_tool_call(id).await.unwrap();
        assert_eq!(call.status, CallStatus::Cancelled);
        assert_eq!(call.error_message.as_deref(), Some(reason));
        ledger.queue_tool_call(id).await.unwrap_err();
    }
    // A decision arriving after the retire loses.
    assert_eq!(
        precondition(ledger.cast_vote(approval.id, approve("bob")).await),
        format!("approval {} is already cancelled", approval.id)
    );
    assert_eq!(
        ledger.get_session(&finished.id).await.unwrap().status,
        SessionStatus::Completed,
        "an ended session is left alone"
    );
    assert_eq!(
        ledger.get_approval(other_approval.id).await.unwrap().status,
        ApprovalStatus::Pending,
        "other versions' sessions are left alone"
    );
    for id in [&waiting.id, &decided.id] {
        assert!(ledger.verify_stream(id).await.unwrap().violation.is_none());
    }

    let archived = ledger
        .archive_agent(&agent, &phrony_ledger::Attribution::unverified("grace"))
        .await
        .unwrap();
    assert_eq!(archived.ended_sessions, vec![other.id.clone()]);
    let reason = "agent support/refund-agent archived by grace";
    let closed = ledger.get_approval(other_approval.id).await.unwrap();
    assert_eq!(closed.status, ApprovalStatus::Cancelled);
    assert_eq!(closed.comment.as_deref(), Some(reason));
    assert_eq!(
        ledger
            .get_tool_call(&other_call.call_id)
            .await
            .unwrap()
            .status,
        CallStatus::Cancelled
    );
    let s = ledger.get_session(&other.id).await.unwrap();
    assert_eq!(s.status, SessionStatus::Failed);
    assert_eq!(s.error.as_deref(), Some(reason));
    assert!(
        ledger
            .verify_stream(&other.id)
            .await
            .unwrap()
            .violation
            .is_none()
    );
}

pub(crate) async fn approvals_list_filters_and_paginates(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let t = deploy_agent(ledger, &AgentRef::new("ops", "triage"), "1.0.0").await;
    let mut made = Vec::new();
    for (version, route) in [
        (&v, "refund-approvers"),
        (&t, "sre"),
        (&v, "sre"),
        (&v, "refund-approvers"),
    ] {
        let (_, _, a) = pending_approval(ledger, version, |a| a.route = route.into()).await;
        made.push(a);
    }
    ledger
        .cast_vote(made[0].id, approve("alice"))
        .await
        .unwrap();
    let list = |filter: ApprovalFilter| async move {
        ledger
            .list_approvals(&filter, &PageRequest::first(100))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|a| a.id)
            .collect::<Vec<_>>()
    };
    let newest_first = |idx: &[usize]| {
        let mut v: Vec<_> = idx
            .iter()
            .map(|&i| (made[i].created_at, made[i].id))
            .collect();
        v.sort();
        v.reverse();
        v.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
    };
    assert_eq!(
        list(ApprovalFilter::default()).await,
        newest_first(&[0, 1, 2, 3])
    );
    assert_eq!(
        list(ApprovalFilter {
            status: Some(ApprovalStatus::Pending),
            ..ApprovalFilter::default()
        })
        .await,
        newest_first(&[1, 2, 3])
    );
    assert_eq!(
        list(ApprovalFilter {
            agent: Some(AgentRef::new("ops", "triage")),
            ..ApprovalFilter::default()
        })
        .await,
        vec![made[1].id]
    );
    assert_eq!(
        list(ApprovalFilter {
            route: Some("sre".into()),
            agent: Some(refund_agent()),
            ..ApprovalFilter::default()
        })
        .await,
        vec![made[2].id]
    );
    assert_eq!(
        list(ApprovalFilter {
            session_id: Some(made[3].session_id.clone()),
            ..ApprovalFilter::default()
        })
        .await,
        vec![made[3].id]
    );
    // Lists carry votes, agent and policy refs (what `phrony approvals list` shows).
    let page = ledger
        .list_approvals(&ApprovalFilter::default(), &PageRequest::first(100))
        .await
        .unwrap();
    let first = page.items.iter().find(|a| a.id == made[0].id).unwrap();
    assert_eq!(first.votes.len(), 1);
    assert_eq!(first.agent.to_string(), "support/refund-agent@0.1.0");
    // Pages of one, stable.
    let mut seen = Vec::new();
    let mut token = None;
    loop {
        let page = ledger
            .list_approvals(
                &ApprovalFilter::default(),
                &PageRequest {
                    size: 1,
                    token: token.clone(),
                },
            )
            .await
            .unwrap();
        seen.extend(page.items.iter().map(|a| a.id));
        match page.next_token {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(seen, newest_first(&[0, 1, 2, 3]));
}

pub(crate) async fn a_pending_approval_survives_a_restart(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let (s, call, approval) = pending_approval(ledger, &v, |a| {
        a.timeout = Some(ApprovalTimeout {
            after_minutes: 10,
            default: TimeoutDefault::Deny,
            escalate_to_route: None,
            escalate_after_minutes: None,
        });
    })
    .await;
    ledger.close().await;

    let reopened = Ledger::connect(&db.url).await.unwrap();
    reopened.migrate().await.unwrap();
    let again = reopened.get_approval(approval.id).await.unwrap();
    assert_eq!(again, approval, "the approval and its timer are durable");
    let recover: Vec<String> = reopened
        .sessions_needing_recovery()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(recover, vec![s.id.clone()]);
    assert_eq!(
        reopened.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
    assert_eq!(
        reopened.next_approval_expiry().await.unwrap(),
        approval.expires_at
    );
    // What the daemon's metrics read at scrape time.
    let counts = reopened.metric_counts().await.unwrap();
    assert_eq!(counts.approvals_pending, 1);
    assert_eq!(
        counts.sessions_by_status,
        vec![(SessionStatus::AwaitingApproval, 1)]
    );
    let decided = reopened
        .cast_vote(approval.id, approve("alice"))
        .await
        .unwrap();
    assert_eq!(decided.approval.status, ApprovalStatus::Approved);
    assert_eq!(
        reopened.get_tool_call(&call.call_id).await.unwrap().status,
        CallStatus::Pending
    );
    // The engine resumes the session.
    reopened
        .set_session_status(
            &s.id,
            StatusChange::to(SessionStatus::AwaitingTool).from(SessionStatus::AwaitingApproval),
        )
        .await
        .unwrap();
    for r in reopened.verify_all_streams().await.unwrap() {
        assert!(r.is_intact(), "{r:?}");
    }
    let counts = reopened.metric_counts().await.unwrap();
    assert_eq!(counts.approvals_pending, 0);
    assert_eq!(
        counts.sessions_by_status,
        vec![(SessionStatus::AwaitingTool, 1)]
    );
}

// ---------------------------------------------------------------------------------------------
// secrets

pub(crate) async fn secrets_are_sealed_and_purged_on_terminal_transitions(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let cipher = SecretCipher::new(&[42; 32]);
    let mut new = new_session(&v, &[]);
    let plaintext = "sk-live-0123456789";
    new.secrets = vec![
        cipher
            .seal(&new.id, "openai", plaintext.as_bytes())
            .unwrap(),
    ];
    let s = ledger.create_session(new).await.unwrap();
    ledger
        .store_session_secrets(
            &s.id,
            vec![cipher.seal(&s.id, "stripe", b"rk_test_1").unwrap()],
        )
        .await
        .unwrap();
    assert!(matches!(
        ledger
            .store_session_secrets(&s.id, vec![cipher.seal(&s.id, "stripe", b"x").unwrap()])
            .await,
        Err(LedgerError::AlreadyExists { .. })
    ));
    let dup = cipher.seal(&s.id, "a", b"x").unwrap();
    assert!(
        invalid(
            ledger
                .store_session_secrets(&s.id, vec![dup.clone(), dup])
                .await
        )
        .contains("more than once")
    );
    let stored = ledger.load_session_secrets(&s.id).await.unwrap();
    let names: Vec<&str> = stored.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, vec!["openai", "stripe"]);
    use secrecy::ExposeSecret as _;
    assert_eq!(
        cipher.open(&s.id, &stored[0]).unwrap().expose_secret(),
        plaintext.as_bytes()
    );
    // Only ciphertext is stored, and no event mentions the value.
    let raw = db
        .raw_strings("SELECT name FROM session_secrets ORDER BY name")
        .await;
    assert_eq!(raw.len(), 2);
    let log = db.raw_strings("SELECT payload FROM events").await;
    assert!(
        log.iter()
            .flatten()
            .flatten()
            .all(|p| !p.contains(plaintext) && !p.contains("rk_test_1"))
    );

    // A live session's secrets survive a rebuild.
    ledger.rebuild_projections().await.unwrap();
    assert_eq!(ledger.load_session_secrets(&s.id).await.unwrap(), stored);

    let done = ledger
        .set_session_status(&s.id, StatusChange::completed(None))
        .await
        .unwrap();
    assert_eq!(done.secrets_purged, 2);
    assert!(ledger.load_session_secrets(&s.id).await.unwrap().is_empty());
    assert!(
        precondition(
            ledger
                .store_session_secrets(&s.id, vec![cipher.seal(&s.id, "late", b"x").unwrap()])
                .await
        )
        .contains("cannot store secrets")
    );

    // Failed and cancelled sessions purge too.
    for change in [StatusChange::failed("boom"), StatusChange::cancelled()] {
        let mut new = new_session(&v, &[]);
        new.secrets = vec![cipher.seal(&new.id, "openai", b"k").unwrap()];
        let s = ledger.create_session(new).await.unwrap();
        let out = ledger.set_session_status(&s.id, change).await.unwrap();
        assert_eq!(out.secrets_purged, 1);
        assert!(ledger.load_session_secrets(&s.id).await.unwrap().is_empty());
    }

    // Orphans (a terminal session whose purge was lost, e.g. written by an older build) go at
    // start-up; live sessions keep theirs.
    let mut live = new_session(&v, &[]);
    live.secrets = vec![cipher.seal(&live.id, "openai", b"k").unwrap()];
    let live = ledger.create_session(live).await.unwrap();
    let ts = "2025-01-01T00:00:00.000000Z";
    let blob = match db.kind {
        Backend::Sqlite => "X'00'",
        Backend::Postgres => "'\\x00'::bytea",
    };
    let ts_value = match db.kind {
        Backend::Sqlite => format!("'{ts}'"),
        Backend::Postgres => format!("'{ts}'::timestamptz"),
    };
    db.raw_exec(&format!(
        "INSERT INTO session_secrets (session_id, name, key_version, nonce, ciphertext, created_at) \
         VALUES ('{}', 'leftover', 1, {blob}, {blob}, {ts_value})",
        s.id
    ))
    .await;
    assert_eq!(ledger.purge_orphan_secrets().await.unwrap(), 1);
    assert_eq!(
        ledger.load_session_secrets(&live.id).await.unwrap().len(),
        1
    );
    assert_eq!(ledger.purge_orphan_secrets().await.unwrap(), 0);
}

// ---------------------------------------------------------------------------------------------
// rebuild and integrity

/// A history touching every session, tool-call and approval event type.
async fn session_history(ledger: &Ledger) -> Vec<String> {
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let mut ids = Vec::new();

    // Approved with edits after a quorum of two, dispatched, completed with usage.
    let (s1, c1, a1) = pending_approval(ledger, &v, |a| {
        a.approvals_required = 2;
        a.comprehension_required = true;
    })
    .await;
    ledger
        .cast_vote(
            a1.id,
            Vote {
                edited_args: Some(json!({"order_id": "ORD-1", "amount": 250})),
                comprehension_acknowledged: true,
                ..approve("alice")
            },
        )
        .await
        .unwrap();
    ledger
        .cast_vote(
            a1.id,
            Vote {
                comprehension_acknowledged: true,
                ..approve("bob")
            },
        )
        .await
        .unwrap();
    to(ledger, &s1.id, SessionStatus::AwaitingTool).await;
    ledger.queue_tool_call(&c1.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&c1.call_id, worker())
        .await
        .unwrap();
    ledger
        .record_tool_result(
            &c1.call_id,
            ToolResult {
                usage: Some(Usage {
                    input_tokens: 1,
                    output_tokens: 2,
                    estimated: false,
                }),
                ..ok(json!({"refund_id": "R-1", "amount": 250.5}))
            },
        )
        .await
        .unwrap();
    ledger
        .record_tool_result(&c1.call_id, ok(json!({"dup": true})))
        .await
        .unwrap();
    to(ledger, &s1.id, SessionStatus::Running).await;
    ledger
        .record_session_event(
            &s1.id,
            SessionEvent::AssistantMessage(phrony_ledger::AssistantMessage {
                turn: 1,
                content: "Refunded 250".into(),
                stop_reason: Some("end_turn".into()),
                turn_usage: Some(Usage::default()),
                turn_duration_ms: Some(12),
            }),
        )
        .await
        .unwrap();
    ledger
        .set_session_status(
            &s1.id,
            StatusChange::completed(Some(json!({"message": "Refunded 250"}))),
        )
        .await
        .unwrap();
    ids.push(s1.id);

    // Vetoed; escalated; denied call; indeterminate; child cancelled with its parent.
    let (s2, _, a2) = pending_approval(ledger, &v, |a| {
        a.timeout = Some(ApprovalTimeout {
            after_minutes: 1,
            default: TimeoutDefault::Escalate,
            escalate_to_route: Some("leads".into()),
            escalate_after_minutes: None,
        });
        a.policy_runtime = Map::from_iter([("phrony.com/approver_role".to_owned(), json!("ops"))]);
    })
    .await;
    let up = ledger
        .expire_approval(a2.id, a2.expires_at.unwrap())
        .await
        .unwrap()
        .escalated_to
        .unwrap();
    ledger
        .cast_vote(up.id, reject("carol", "too much"))
        .await
        .unwrap();
    to(ledger, &s2.id, SessionStatus::Running).await;
    let mut child = new_session(&v, &[("parent", "s2")]);
    child.parent_session_id = Some(s2.id.clone());
    child.mode = SessionMode::Conversation;
    child.limits = Some(SessionLimits {
        max_loop_iterations: Some(3),
        ..SessionLimits::default()
    });
    let child = ledger.create_session(child).await.unwrap();
    let c = ledger
        .record_tool_call(refund_call(&child.id, 0, 0, 1))
        .await
        .unwrap();
    ledger.queue_tool_call(&c.call_id).await.unwrap();
    ledger
        .dispatch_tool_call(&c.call_id, worker())
        .await
        .unwrap();
    ledger
        .mark_tool_call_indeterminate(&c.call_id, "lease expired")
        .await
        .unwrap();
    let d = ledger
        .record_tool_call(refund_call(&child.id, 0, 1, 14_000))
        .await
        .unwrap();
    ledger
        .deny_tool_call(&d.call_id, "hard limit", Some("payments/hard-limit@1.0.0"))
        .await
        .unwrap();
    ledger
        .set_session_status(&s2.id, StatusChange::cancelled().by("ops"))
        .await
        .unwrap();
    ids.push(s2.id);
    ids.push(child.id);

    // Left open: a pending approval with a timeout and a live session with metadata.
    let (s3, _, _) = pending_approval(ledger, &v, |a| {
        a.timeout = Some(ApprovalTimeout {
            after_minutes: 60,
            default: TimeoutDefault::Allow,
            escalate_to_route: None,
            escalate_after_minutes: None,
        });
    })
    .await;
    ids.push(s3.id);
    let s4 = ledger
        .create_session(new_session(
            &v,
            &[("ticket_id", "T-9"), ("channel", "email")],
        ))
        .await
        .unwrap();
    let failed = ledger
        .record_tool_call(refund_call(&s4.id, 0, 0, 3))
        .await
        .unwrap();
    ledger.queue_tool_call(&failed.call_id).await.unwrap();
    ledger
        .fail_tool_call(
            &failed.call_id,
            "capacity_exhausted",
            "tool handler capacity exhausted",
        )
        .await
        .unwrap();
    ids.push(s4.id);
    ids
}

pub(crate) async fn rebuild_reproduces_session_projections_exactly(db: &TestDb) {
    let ledger = db.migrated().await;
    let sessions = session_history(ledger).await;
    let before = snapshot_all(db).await;
    for (t, rows) in ALL_PROJECTIONS.iter().zip(&before) {
        assert!(!rows.is_empty(), "{t} should have rows");
    }
    // The audit's re-fold (into temporary shadows, in a snapshot that cannot write a real
    // table) folds every event of this history and finds the projections as stored.
    let audited = phrony_ledger::Ledger::connect(&db.url)
        .await
        .unwrap()
        .with_audit_key(phrony_ledger::AuditKey::from_bytes([7; 32]));
    assert!(matches!(
        audited.start_audit(true).await.unwrap(),
        phrony_ledger::AuditStart::Sealed { .. }
    ));
    assert_eq!(
        audited
            .verify_audit(phrony_ledger::AuditScope::All)
            .await
            .unwrap()
            .problem,
        None
    );
    assert_eq!(
        snapshot_all(db).await,
        before,
        "the audit wrote no projection"
    );

    // Over live data: a no-op. From an empty schema: identical.
    let report = ledger.rebuild_projections().await.unwrap();
    assert_eq!(
        report.streams,
        1 + sessions.len() as u64,
        "agent stream + sessions"
    );
    assert_eq!(snapshot_all(db).await, before);
    for t in ALL_PROJECTIONS.iter().rev() {
        if *t == "agents" || *t == "agent_versions" || *t == "deployments" {
            continue;
        }
        db.raw_exec(&format!("DELETE FROM {t}")).await;
    }
    db.raw_exec("DELETE FROM deployments").await;
    db.raw_exec("DELETE FROM agent_versions").await;
    db.raw_exec("DELETE FROM agents").await;
    ledger.rebuild_projections().await.unwrap();
    let after = snapshot_all(db).await;
    for ((t, b), a) in ALL_PROJECTIONS.iter().zip(&before).zip(&after) {
        assert_eq!(a, b, "{t} rebuilt from events");
    }

    // Every session stream verifies, and tampering with one is caught by verify and rebuild.
    for r in ledger.verify_all_streams().await.unwrap() {
        assert!(r.is_intact(), "{r:?}");
    }
    db.disable_append_only_guard().await;
    db.raw_exec(&format!(
        "UPDATE events SET actor = 'mallory' WHERE stream = '{}' AND seq = 5",
        sessions[0]
    ))
    .await;
    let report = ledger.verify_stream(&sessions[0]).await.unwrap();
    assert_eq!(report.violation.map(|v| v.seq), Some(5));
    match ledger.rebuild_projections().await {
        Err(LedgerError::Corrupt { message }) => {
            assert!(
                message.contains(&format!("{} seq 5", sessions[0])),
                "{message}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        snapshot_all(db).await,
        before,
        "a failed rebuild changes nothing"
    );
}

/// Polls `fut` `polls` times (yielding to the runtime and the database in between), then drops
/// it: a caller cancelled at an arbitrary point (a client that disconnects, a session driver
/// stopped mid-step).
async fn drop_after_polls<F: std::future::Future>(fut: F, polls: usize) {
    let mut fut = std::pin::pin!(fut);
    for _ in 0..polls {
        let done =
            std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx).is_ready()))
                .await;
        if done {
            return;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_micros(50)).await;
    }
}

/// A write whose caller goes away part-way (at every point we can reach) never leaves a
/// transaction open or the database locked: the next writes go through at once, and every
/// stream still verifies.
pub(crate) async fn cancelled_writes_never_leave_the_database_locked(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "1.0.0").await;
    let session = start(ledger, &v).await;
    for polls in 0..40 {
        drop_after_polls(
            ledger.record_session_event(
                &session.id,
                SessionEvent::UserMessage {
                    actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
                    turn: 1,
                    content: format!("cut after {polls} polls"),
                },
            ),
            polls,
        )
        .await;
        let next = tokio::time::timeout(
            std::time::Duration::from_secs(3),
            ledger.record_session_event(
                &session.id,
                SessionEvent::UserMessage {
                    actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
                    turn: 1,
                    content: "after the cut".to_owned(),
                },
            ),
        )
        .await;
        match next {
            Ok(result) => {
                result.unwrap();
            }
            Err(_) => panic!(
                "a write cancelled after {polls} polls left the database locked: the next \
                 write waited more than 3 s"
            ),
        }
    }
    ledger.verify_stream(&session.id).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// attribution: who an event is recorded as, separation of duties, verified quorum, routes

fn token(name: &str) -> phrony_ledger::Attribution {
    phrony_ledger::Attribution {
        actor: name.to_owned(),
        verification: phrony_ledger::Verification::Token,
        via: None,
    }
}

fn vote_by(actor: phrony_ledger::Attribution) -> Vote {
    Vote::new(actor, VoteDecision::Approve, "ok")
}

fn denied(result: Result<impl std::fmt::Debug, LedgerError>) -> String {
    match result {
        Err(LedgerError::PermissionDenied { message }) => message,
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

/// A session started by `starter` (in `awaiting_tool`, one recorded call) and an approval for
/// it, customised.
async fn approval_started_by(
    ledger: &Ledger,
    v: &AgentVersion,
    starter: phrony_ledger::Attribution,
    customize: impl FnOnce(&mut NewApproval),
) -> (Session, phrony_ledger::Approval) {
    let mut new = new_session(v, &[]);
    new.actor = starter;
    let s = ledger.create_session(new).await.unwrap();
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 400))
        .await
        .unwrap();
    let mut new = approval_for(&s.id, &call.call_id);
    customize(&mut new);
    let approval = ledger.open_approval(new).await.unwrap();
    (s, approval)
}

/// Events record the attribution: a verified, a relayed and an unverified actor each keep
/// their verification and via (in the event, the session's starter, the vote), the chain
/// verifies and `Event::recompute_hash` agrees; the runtime's own actors record none.
pub(crate) async fn events_record_the_attribution_and_the_chain_covers_it(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "1.0.0").await;
    let (s, approval) = approval_started_by(ledger, &v, token("alice"), |_| {}).await;
    assert_eq!(s.started_by(), Some(token("alice")));
    assert_eq!(s.created_by_display(), "alice");
    let relayed = phrony_ledger::Attribution {
        actor: "bob".into(),
        verification: phrony_ledger::Verification::Token,
        via: Some("approvals-ui".into()),
    };
    let out = ledger
        .cast_vote(approval.id, vote_by(relayed.clone()))
        .await
        .unwrap();
    assert!(out.decided);
    let vote = &out.approval.votes[0];
    assert_eq!(vote.attribution(), Some(relayed.clone()));
    assert_eq!(vote.voter_display(), "bob via approvals-ui");
    assert_eq!(
        out.approval.decided_by_display().as_deref(),
        Some("bob via approvals-ui")
    );
    let events = ledger.events_after(&s.id, 0, 1000).await.unwrap();
    let started = &events[0];
    assert_eq!(started.attribution(), Some(token("alice")));
    let voted = events
        .iter()
        .find(|e| e.event_type == "approval.vote")
        .unwrap();
    assert_eq!(voted.attribution(), Some(relayed));
    assert_eq!(voted.actor_display(), "bob via approvals-ui");
    for e in &events {
        assert_eq!(e.recompute_hash(), e.hash, "{e:?}");
        if phrony_ledger::is_runtime_actor(&e.actor) {
            assert_eq!(e.actor_verification, None, "{e:?}");
            assert_eq!(e.actor_display(), e.actor);
        }
    }
    let report = ledger.verify_stream(&s.id).await.unwrap();
    assert!(report.is_intact(), "{report:?}");

    // Local mode: unverified, marked as such.
    let local = start(ledger, &v).await;
    assert_eq!(local.created_by_display(), "alice (unverified)");
    let events = ledger.events_after(&local.id, 0, 10).await.unwrap();
    assert_eq!(events[0].actor_display(), "alice (unverified)");

    // The attribution survives a rebuild of the projections from the events.
    let before = snapshot_all(db).await;
    ledger.rebuild_projections().await.unwrap();
    assert_eq!(snapshot_all(db).await, before);
}

/// Separation of duties: a verified starter cannot vote on its session's approval (any case),
/// a relay voting for the starter neither; the policy's opt-out lets it and is recorded in
/// `approval.required`; in local mode (everything unverified) the starter votes as before.
pub(crate) async fn separation_of_duties_refuses_a_verified_starter_unless_the_policy_opts_out(
    db: &TestDb,
) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "1.0.0").await;
    let (s, approval) = approval_started_by(ledger, &v, token("alice"), |_| {}).await;
    for voter in [
        token("alice"),
        token("ALICE"),
        phrony_ledger::Attribution {
            via: Some("approvals-ui".into()),
            ..token("Alice")
        },
    ] {
        let message = denied(ledger.cast_vote(approval.id, vote_by(voter)).await);
        assert!(message.contains("separation of duties"), "{message}");
        assert!(message.contains(&s.id), "{message}");
        assert!(message.contains("allow_self_approval"), "{message}");
    }
    let events = types_of(ledger, &s.id).await;
    assert!(!events.iter().any(|t| t == "approval.vote"), "{events:?}");
    // Another verified principal may.
    assert!(
        ledger
            .cast_vote(approval.id, vote_by(token("bob")))
            .await
            .unwrap()
            .decided
    );

    // Opted out: allowed, and the opt-out is in the audit.
    let (s, approval) = approval_started_by(ledger, &v, token("alice"), |a| {
        a.allow_self_approval = true;
    })
    .await;
    assert!(approval.allow_self_approval);
    let out = ledger
        .cast_vote(approval.id, vote_by(token("alice")))
        .await
        .unwrap();
    assert_eq!(out.approval.status, ApprovalStatus::Approved);
    let events = ledger.events_after(&s.id, 0, 1000).await.unwrap();
    let required = events
        .iter()
        .find(|e| e.event_type == "approval.required")
        .unwrap();
    assert_eq!(required.payload["allow_self_approval"], json!(true));

    // Local mode: the tutorial's one person starts and approves.
    let s = start(ledger, &v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 400))
        .await
        .unwrap();
    let approval = ledger
        .open_approval(approval_for(&s.id, &call.call_id))
        .await
        .unwrap();
    let events = ledger.events_after(&s.id, 0, 1000).await.unwrap();
    let required = events
        .iter()
        .find(|e| e.event_type == "approval.required")
        .unwrap();
    assert!(required.payload.get("allow_self_approval").is_none());
    let out = ledger
        .cast_vote(approval.id, approve("alice"))
        .await
        .unwrap();
    assert_eq!(out.approval.status, ApprovalStatus::Approved);
    assert_eq!(
        out.approval.decided_by_display().as_deref(),
        Some("alice (unverified)")
    );
}

/// A quorum counts distinct verified principals: the same principal twice (case variants) is
/// one vote; an unverified vote on a verified session's approval is refused; on an unverified
/// (local) session unverified votes count as before.
pub(crate) async fn a_quorum_counts_distinct_verified_principals(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "1.0.0").await;
    let (_, approval) = approval_started_by(ledger, &v, token("alice"), |a| {
        a.approvals_required = 2;
    })
    .await;
    let out = ledger
        .cast_vote(approval.id, vote_by(token("bob")))
        .await
        .unwrap();
    assert_eq!((out.decided, out.approval.approvals_received), (false, 1));
    let message = precondition(ledger.cast_vote(approval.id, vote_by(token("BOB"))).await);
    assert!(message.contains("already decided"), "{message}");
    let message = denied(ledger.cast_vote(approval.id, approve("carol")).await);
    assert!(message.contains("verified principals only"), "{message}");
    assert!(message.contains("carol (unverified)"), "{message}");
    let after = ledger.get_approval(approval.id).await.unwrap();
    assert_eq!(
        (after.status, after.approvals_received),
        (ApprovalStatus::Pending, 1)
    );
    let out = ledger
        .cast_vote(approval.id, vote_by(token("carol")))
        .await
        .unwrap();
    assert_eq!(out.approval.status, ApprovalStatus::Approved);

    // Local mode: two unverified voters make the quorum, as before.
    let s = start(ledger, &v).await;
    to(ledger, &s.id, SessionStatus::AwaitingTool).await;
    let call = ledger
        .record_tool_call(refund_call(&s.id, 0, 0, 400))
        .await
        .unwrap();
    let mut new = approval_for(&s.id, &call.call_id);
    new.approvals_required = 2;
    let approval = ledger.open_approval(new).await.unwrap();
    assert!(
        !ledger
            .cast_vote(approval.id, approve("dave"))
            .await
            .unwrap()
            .decided
    );
    assert!(
        ledger
            .cast_vote(approval.id, approve("erin"))
            .await
            .unwrap()
            .decided
    );
}

/// An approver restricted to routes votes only on approvals routed there; the refusal names
/// the route. Without a restriction any route is fine.
pub(crate) async fn a_route_restricted_approver_votes_only_on_its_routes(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "1.0.0").await;
    let (_, approval) = approval_started_by(ledger, &v, token("alice"), |a| {
        a.route = "finance".into();
    })
    .await;
    let mut vote = vote_by(token("bob"));
    vote.routes = vec!["legal".into(), "support".into()];
    let message = denied(ledger.cast_vote(approval.id, vote.clone()).await);
    assert!(message.contains("route \"finance\""), "{message}");
    assert!(message.contains("legal, support"), "{message}");
    vote.routes.push("finance".into());
    assert!(ledger.cast_vote(approval.id, vote).await.unwrap().decided);

    let (_, approval) = approval_started_by(ledger, &v, token("alice"), |a| {
        a.route = String::new();
    })
    .await;
    let mut vote = vote_by(token("bob"));
    vote.routes = vec!["finance".into()];
    let message = denied(ledger.cast_vote(approval.id, vote).await);
    assert!(message.contains("no route"), "{message}");
    assert!(
        ledger
            .cast_vote(approval.id, vote_by(token("bob")))
            .await
            .unwrap()
            .decided
    );
}

/// A turn-1 `model.completion` by `agent`, its `iteration` of the turn, that hid `hidden_tools`.
pub(crate) fn completion_event(
    iteration: u32,
    stop_reason: &str,
    hidden_tools: Vec<phrony_ledger::HiddenTool>,
) -> phrony_ledger::NewEvent {
    let body = phrony_ledger::EventBody::ModelCompletion(phrony_ledger::ModelCompletion {
        turn: 1,
        iteration,
        stop_reason: stop_reason.into(),
        usage: Usage {
            input_tokens: 20,
            output_tokens: 10,
            estimated: false,
        },
        duration_ms: 5,
        tool_calls: Vec::new(),
        reasoning: Vec::new(),
        hidden_tools,
    });
    let mut e = body.into_new_event("agent").unwrap();
    e.turn = Some(1);
    e
}

/// `record_completion`: a model completion and its assistant message commit together (both or
/// neither), on live sessions only, and the message is stored exactly as
/// `record_session_event` stores it.
pub(crate) async fn a_completion_and_its_message_commit_together(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let completion = || completion_event(0, "end_turn", Vec::new());
    let message = SessionEvent::AssistantMessage(phrony_ledger::AssistantMessage {
        turn: 1,
        content: "Done.".into(),
        stop_reason: Some("end_turn".into()),
        turn_usage: Some(Usage {
            input_tokens: 20,
            output_tokens: 10,
            estimated: false,
        }),
        turn_duration_ms: Some(5),
    });

    let s = start(ledger, &v).await;
    let before = ledger.events_after(&s.id, 0, 100).await.unwrap().len();
    let written = ledger
        .record_completion(&s.id, completion(), Some(message.clone()))
        .await
        .unwrap();
    assert_eq!(
        written
            .iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["model.completion", "message.assistant"]
    );
    assert_eq!(written[1].seq, written[0].seq + 1);
    let all = ledger.events_after(&s.id, 0, 100).await.unwrap();
    assert_eq!(all.len(), before + 2);

    // The same message through `record_session_event` is stored identically.
    let other = start(ledger, &v).await;
    let single = ledger
        .record_session_event(&other.id, message.clone())
        .await
        .unwrap();
    assert_eq!(single.payload, written[1].payload);
    assert_eq!(single.actor, written[1].actor);
    assert_eq!(single.turn, written[1].turn);

    // A ledger-owned type is refused, and nothing is written.
    let mut owned = completion();
    owned.event_type = "tool.completed".into();
    assert!(matches!(
        ledger
            .record_completion(&s.id, owned, Some(message.clone()))
            .await,
        Err(LedgerError::InvalidArgument { .. })
    ));
    // An ended session takes neither event.
    ledger
        .set_session_status(&s.id, StatusChange::failed("stopped"))
        .await
        .unwrap();
    let ended = ledger.events_after(&s.id, 0, 100).await.unwrap().len();
    assert_eq!(
        precondition(
            ledger
                .record_completion(&s.id, completion(), Some(message))
                .await
        ),
        format!("session {} is failed and accepts no further events", s.id)
    );
    assert_eq!(
        ledger.events_after(&s.id, 0, 100).await.unwrap().len(),
        ended,
        "a refused completion appends nothing"
    );
}

/// Tool visibility: a `model.completion` names the tools policy hid from its request, and reads
/// back typed; one that hid none stores no `hidden_tools` key (the bytes earlier builds wrote),
/// and the chain verifies over both.
pub(crate) async fn a_completion_records_the_tools_policy_hid(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let completion = |hidden_tools| completion_event(0, "end_turn", hidden_tools);
    let hidden = vec![phrony_ledger::HiddenTool {
        name: "issue_refund".into(),
        policy: "ops/viewers-cannot-refund@1.0.0".into(),
    }];
    let s = start(ledger, &v).await;
    ledger
        .record_completion(&s.id, completion(hidden.clone()), None)
        .await
        .unwrap();
    ledger
        .record_completion(&s.id, completion(Vec::new()), None)
        .await
        .unwrap();
    let stored: Vec<phrony_ledger::Event> = ledger
        .events_after(&s.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "model.completion")
        .collect();
    assert_eq!(stored.len(), 2);
    assert_eq!(
        stored[0].payload["hidden_tools"],
        serde_json::json!([{"name": "issue_refund", "policy": "ops/viewers-cannot-refund@1.0.0"}])
    );
    assert!(
        stored[1].payload.get("hidden_tools").is_none(),
        "{}",
        stored[1].payload
    );
    let read = |e: &phrony_ledger::Event| match e.body().unwrap() {
        phrony_ledger::EventBody::ModelCompletion(c) => c.hidden_tools,
        other => panic!("expected a model completion, got {other:?}"),
    };
    assert_eq!(read(&stored[0]), hidden);
    assert!(read(&stored[1]).is_empty());
    assert!(
        ledger
            .verify_stream(&s.id)
            .await
            .unwrap()
            .violation
            .is_none()
    );
}

// ---------------------------------------------------------------------------------------------
// live sessions per agent (RUNTIME_MAX_SESSIONS_PER_AGENT)

#[track_caller]
fn exhausted(result: Result<impl std::fmt::Debug, LedgerError>) -> String {
    match result {
        Err(LedgerError::ResourceExhausted { message }) => message,
        other => panic!("expected ResourceExhausted, got {other:?}"),
    }
}

async fn session_count(ledger: &Ledger) -> usize {
    ledger
        .list_sessions(
            &SessionFilter {
                include_children: true,
                ..SessionFilter::default()
            },
            &PageRequest::default(),
        )
        .await
        .unwrap()
        .items
        .len()
}

/// Every status short of an end counts (running, waiting for input, a tool or an approval; a
/// child session), over every version of the agent; an end frees a slot; another agent has its
/// own count; a refused create writes nothing.
pub(crate) async fn live_sessions_per_agent_are_bounded(db: &TestDb) {
    let ledger = db.migrated().await;
    let agent = refund_agent();
    let v1 = deploy_agent(ledger, &agent, "0.1.0").await;
    let within = |new: NewSession| ledger.create_session_within(new, 3);
    let parked = within(new_session(&v1, &[])).await.unwrap();
    to(ledger, &parked.id, SessionStatus::AwaitingInput).await;
    let approving = within(new_session(&v1, &[])).await.unwrap();
    to(ledger, &approving.id, SessionStatus::AwaitingApproval).await;
    // The next version counts against the same agent.
    let v2 = deploy_agent(ledger, &agent, "0.2.0").await;
    let mut child = new_session(&v2, &[]);
    child.parent_session_id = Some(approving.id.clone());
    let child = within(child).await.unwrap();
    assert_eq!(ledger.live_sessions_of_agent(&agent).await.unwrap(), 3);

    let before = session_count(ledger).await;
    let refused = new_session(&v2, &[]);
    let message = exhausted(within(refused.clone()).await);
    assert_eq!(
        message,
        "agent support/refund-agent has 3 live sessions (created and not yet ended); at most 3 \
         may be live at once, so no session was started"
    );
    assert_eq!(session_count(ledger).await, before, "nothing was created");
    not_found(ledger.get_session(&refused.id).await);
    assert!(
        db.raw_strings(&format!(
            "SELECT stream FROM events WHERE stream = '{}'",
            refused.id
        ))
        .await
        .is_empty(),
        "no event was recorded for the refused session"
    );

    // Another agent has its own count; an unbounded create ignores it.
    let other = deploy_agent(ledger, &AgentRef::new("support", "triage"), "1.0.0").await;
    ledger
        .create_session_within(new_session(&other, &[]), 1)
        .await
        .unwrap();
    exhausted(
        ledger
            .create_session_within(new_session(&other, &[]), 1)
            .await,
    );
    ledger
        .create_session(new_session(&other, &[]))
        .await
        .unwrap();

    // Each end (completed, failed, cancelled) frees one slot, and only one.
    for (session, end) in [
        (&parked.id, StatusChange::completed(None)),
        (&child.id, StatusChange::failed("worker lost")),
        (&approving.id, StatusChange::cancelled()),
    ] {
        ledger.set_session_status(session, end).await.unwrap();
        assert_eq!(ledger.live_sessions_of_agent(&agent).await.unwrap(), 2);
        within(new_session(&v2, &[])).await.unwrap();
        exhausted(within(new_session(&v2, &[])).await);
    }
    assert_eq!(ledger.live_sessions_of_agent(&agent).await.unwrap(), 3);
    for report in ledger.verify_all_streams().await.unwrap() {
        assert!(report.is_intact(), "{report:?}");
    }
}

/// Parallel creates over two connection pools (two "replicas") racing for the last `SLOTS`
/// slots of one agent: exactly `SLOTS` succeed, every other one is `ResourceExhausted`, and
/// the agent ends with exactly the bound live.
pub(crate) async fn concurrent_creates_never_exceed_the_live_session_bound(db: &TestDb) {
    const BOUND: u64 = 7;
    const ALREADY_LIVE: u64 = 2;
    const CREATES: usize = 16;
    let first = db.migrated().await.clone();
    let second = db.another_ledger().await;
    let agent = refund_agent();
    let v = deploy_agent(&first, &agent, "0.1.0").await;
    for _ in 0..ALREADY_LIVE {
        first.create_session(new_session(&v, &[])).await.unwrap();
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(CREATES));
    let mut handles = Vec::new();
    for i in 0..CREATES {
        let ledger = if i % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        let new = new_session(&v, &[]);
        let start = std::sync::Arc::clone(&start);
        handles.push(tokio::spawn(async move {
            start.wait().await;
            ledger.create_session_within(new, BOUND).await
        }));
    }
    let mut created = 0;
    let mut refused = 0;
    for h in handles {
        match h.await.unwrap() {
            Ok(_) => created += 1,
            Err(LedgerError::ResourceExhausted { message }) => {
                assert!(message.contains("at most 7"), "{message}");
                refused += 1;
            }
            Err(other) => panic!("a create failed otherwise: {other:?}"),
        }
    }
    assert_eq!(
        created,
        BOUND - ALREADY_LIVE,
        "exactly the free slots were taken"
    );
    assert_eq!(refused, CREATES as u64 - (BOUND - ALREADY_LIVE));
    assert_eq!(first.live_sessions_of_agent(&agent).await.unwrap(), BOUND);
    assert_eq!(session_count(&first).await as u64, BOUND);
}

/// The bound holds across the line where PostgreSQL creates switch from the shared lock (far
/// from the bound: committed live sessions plus `max_connections` at most the bound) to the
/// exclusive one: more parallel creates than the bound, over two connection pools, twelve at a
/// time, from none live: exactly the bound succeed and the counter equals `COUNT(*)`. On SQLite
/// (no advisory lock) the same holds with every create serialised.
pub(crate) async fn creates_crossing_from_shared_to_exclusive_never_exceed_the_bound(db: &TestDb) {
    let first = db.migrated().await.clone();
    let second = db.another_ledger().await;
    let backends: u64 = match db.kind {
        Backend::Postgres => db.raw_strings("SHOW max_connections").await[0][0]
            .as_deref()
            .unwrap()
            .parse()
            .unwrap(),
        Backend::Sqlite => 100,
    };
    let bound = backends + 6;
    let creates = bound + 10;
    let agent = refund_agent();
    let v = deploy_agent(&first, &agent, "0.1.0").await;
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(12));
    let mut handles = Vec::new();
    for i in 0..creates {
        let ledger = if i % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        let new = new_session(&v, &[]);
        let gate = std::sync::Arc::clone(&gate);
        handles.push(tokio::spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            ledger.create_session_within(new, bound).await
        }));
    }
    let (mut created, mut refused) = (0_u64, 0_u64);
    for h in handles {
        match h.await.unwrap() {
            Ok(_) => created += 1,
            Err(LedgerError::ResourceExhausted { message }) => {
                assert!(message.contains(&format!("at most {bound}")), "{message}");
                refused += 1;
            }
            Err(other) => panic!("a create failed otherwise: {other:?}"),
        }
    }
    assert_eq!((created, refused), (bound, creates - bound));
    assert_eq!(first.live_sessions_of_agent(&agent).await.unwrap(), bound);
    assert_eq!(counted_live_sessions(db, &agent).await, bound);
}

/// On PostgreSQL a create far from the bound takes the agent's create lock shared: it does not
/// wait for another create in flight (here a transaction holding the lock shared, as a create
/// does), while an archive of the agent, which takes it exclusively, waits for that create to
/// commit. The lock's key is part of the schema's contract between replicas of different
/// versions: class 0x70687273 ("phrs") and `hashtext` of `namespace/name`.
pub(crate) async fn creates_far_from_the_bound_share_the_agents_lock(db: &TestDb) {
    use sqlx::{Connection as _, Executor as _};
    let ledger = db.migrated().await;
    let agent = refund_agent();
    let v = deploy_agent(ledger, &agent, "0.1.0").await;
    if db.kind != Backend::Postgres {
        return;
    }
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute(
            "SELECT pg_advisory_xact_lock_shared(1885893235, hashtext('support/refund-agent'))",
        )
        .await
        .unwrap();
    // Far from the bound (no live session, a bound of a million): no wait.
    let created = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        ledger.create_session_within(new_session(&v, &[]), 1_000_000),
    )
    .await
    .expect("a create far from the bound waited for another create")
    .unwrap();
    // Near the bound the create takes the lock exclusively, and so does an archive: both wait.
    let near = {
        let ledger = ledger.clone();
        let new = new_session(&v, &[]);
        tokio::spawn(async move { ledger.create_session_within(new, 2).await })
    };
    let archive = {
        let ledger = ledger.clone();
        let agent = agent.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            ledger
                .archive_agent(&agent, &phrony_ledger::Attribution::unverified("grace"))
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!near.is_finished(), "a create near the bound did not wait");
    assert!(
        !archive.is_finished(),
        "an archive did not wait for a create in flight"
    );
    holder.execute("COMMIT").await.unwrap();
    near.await.unwrap().unwrap();
    archive.await.unwrap().unwrap();
    let ended = ledger.get_session(&created.id).await.unwrap();
    assert!(ended.status.is_terminal(), "{:?}", ended.status);
}

/// `COUNT(*)` of the live sessions of `agent`, straight from `sessions` (what the counter of
/// migration 0020 must always equal).
async fn counted_live_sessions(db: &TestDb, agent: &AgentRef) -> u64 {
    let rows = db
        .raw_strings(&format!(
            "SELECT CAST(COUNT(*) AS TEXT) FROM sessions WHERE agent_namespace = '{}' \
             AND agent_name = '{}' AND status NOT IN ('completed', 'failed', 'cancelled')",
            agent.namespace, agent.name
        ))
        .await;
    rows[0][0].as_deref().unwrap().parse().unwrap()
}

/// For every agent, the live sessions the ledger reports (the counter) equal a `COUNT(*)` over
/// `sessions`; returns them in the order of `agents`.
async fn live_counts_agree(db: &TestDb, agents: &[&AgentRef], step: &str) -> Vec<u64> {
    let mut live = Vec::new();
    for agent in agents {
        let reported = db.ledger.live_sessions_of_agent(agent).await.unwrap();
        let counted = counted_live_sessions(db, agent).await;
        assert_eq!(reported, counted, "{step}: agent {agent}");
        live.push(reported);
    }
    live
}

fn child_of(v: &AgentVersion, parent: &Session) -> NewSession {
    let mut child = new_session(v, &[]);
    child.parent_session_id = Some(parent.id.clone());
    child
}

/// The live-session counter (migration 0020) equals `COUNT(*)` of every agent's live sessions
/// after each way a session starts or ends: top-level and child creates across agents, status
/// changes between live states, completion, failure, cancellation, the cascade of a parent's
/// end to its descendants (of other agents), an archive's and a retire's cascades, a failed
/// create, the projection rebuild's wipe and replay — and, through raw SQL, the changes no
/// ledger path makes (a deleted live row, an ended row made live again, a live row moved to
/// another agent).
pub(crate) async fn the_live_session_counter_equals_the_live_sessions_of_every_agent(db: &TestDb) {
    let ledger = db.migrated().await;
    let refund = refund_agent();
    let triage = AgentRef::new("support", "triage");
    let audit = AgentRef::new("ops", "auditor");
    let billing = AgentRef::new("billing", "invoicer");
    let agents = [&refund, &triage, &audit, &billing];
    let r1 = deploy_agent(ledger, &refund, "0.1.0").await;
    let r2 = deploy_agent(ledger, &refund, "0.2.0").await;
    let t1 = deploy_agent(ledger, &triage, "1.0.0").await;
    let a1 = deploy_agent(ledger, &audit, "1.0.0").await;
    let b1 = deploy_agent(ledger, &billing, "1.0.0").await;
    assert_eq!(live_counts_agree(db, &agents, "empty").await, [0, 0, 0, 0]);

    // Top-level sessions of every agent, children and a grandchild of other agents.
    let mut top = Vec::new();
    for v in [&r1, &r1, &r1, &r1, &r2, &t1, &t1, &a1, &b1, &b1] {
        top.push(start(ledger, v).await);
    }
    let parent = &top[0];
    let triage_child = ledger.create_session(child_of(&t1, parent)).await.unwrap();
    let triage_child2 = ledger.create_session(child_of(&t1, parent)).await.unwrap();
    let audit_child = ledger.create_session(child_of(&a1, parent)).await.unwrap();
    let grandchild = ledger
        .create_session(child_of(&a1, &triage_child))
        .await
        .unwrap();
    // A child of a billing session in the refund agent: the archive of billing ends it.
    let billing_child = ledger.create_session(child_of(&r2, &top[8])).await.unwrap();
    // Bounded creates go through the check; a refused one changes nothing.
    ledger
        .create_session_within(new_session(&t1, &[]), 100)
        .await
        .unwrap();
    exhausted(ledger.create_session_within(new_session(&a1, &[]), 3).await);
    assert_eq!(
        live_counts_agree(db, &agents, "created").await,
        [6, 5, 3, 2]
    );

    // Live → live changes move nothing.
    to(ledger, &top[1].id, SessionStatus::AwaitingApproval).await;
    to(ledger, &top[2].id, SessionStatus::AwaitingInput).await;
    to(ledger, &triage_child2.id, SessionStatus::AwaitingTool).await;
    assert_eq!(
        live_counts_agree(db, &agents, "live changes").await,
        [6, 5, 3, 2]
    );

    // Each end by hand.
    let ends = [
        (&top[1].id, StatusChange::completed(None)),
        (&top[5].id, StatusChange::failed("worker lost")),
        (&top[7].id, StatusChange::cancelled()),
    ];
    for (session, end) in ends {
        ledger.set_session_status(session, end).await.unwrap();
    }
    assert_eq!(live_counts_agree(db, &agents, "ends").await, [5, 4, 2, 2]);

    // A parent's end cancels its live descendants in its transaction (triage_child2 and the
    // grandchild through triage_child).
    ledger
        .set_session_status(&parent.id, StatusChange::completed(None))
        .await
        .unwrap();
    for child in [&triage_child, &triage_child2, &audit_child, &grandchild] {
        assert_eq!(
            ledger.get_session(&child.id).await.unwrap().status,
            SessionStatus::Cancelled
        );
    }
    assert_eq!(
        live_counts_agree(db, &agents, "cascade").await,
        [4, 2, 0, 2]
    );

    // Archiving billing ends its sessions and their children of the refund agent.
    let archived = ledger
        .archive_agent(&billing, &phrony_ledger::Attribution::unverified("grace"))
        .await
        .unwrap();
    assert!(archived.ended_sessions.contains(&top[8].id));
    assert_eq!(
        ledger.get_session(&billing_child.id).await.unwrap().status,
        SessionStatus::Cancelled
    );
    assert_eq!(
        live_counts_agree(db, &agents, "archive").await,
        [3, 2, 0, 0]
    );

    // Retiring refund 0.1.0 ends its live sessions (top[2], top[3]); 0.2.0's stay.
    let retired = ledger
        .retire_version(
            &refund,
            "0.1.0",
            &phrony_ledger::Attribution::unverified("erin"),
        )
        .await
        .unwrap();
    assert_eq!(retired.ended_sessions.len(), 2, "{retired:?}");
    assert_eq!(live_counts_agree(db, &agents, "retire").await, [1, 2, 0, 0]);

    // The rebuild wipes `sessions` and replays it: the counter follows both.
    ledger.rebuild_projections().await.unwrap();
    assert_eq!(
        live_counts_agree(db, &agents, "rebuild").await,
        [1, 2, 0, 0]
    );

    // What no ledger path does, through raw SQL: the triggers still keep the count.
    db.raw_exec(&format!(
        "UPDATE sessions SET agent_namespace = 'ops', agent_name = 'auditor' WHERE id = '{}'",
        top[4].id
    ))
    .await;
    assert_eq!(live_counts_agree(db, &agents, "moved").await, [0, 2, 1, 0]);
    db.raw_exec(&format!(
        "UPDATE sessions SET status = 'running', ended_at = NULL WHERE id = '{}'",
        top[3].id
    ))
    .await;
    assert_eq!(
        live_counts_agree(db, &agents, "revived").await,
        [1, 2, 1, 0]
    );
    db.raw_exec(&format!(
        "UPDATE sessions SET agent_name = 'triage' WHERE id = '{}'",
        top[1].id
    ))
    .await;
    assert_eq!(
        live_counts_agree(db, &agents, "ended row moved").await,
        [1, 2, 1, 0]
    );
    db.raw_exec(&format!("DELETE FROM sessions WHERE id = '{}'", top[6].id))
        .await;
    assert_eq!(
        live_counts_agree(db, &agents, "deleted").await,
        [1, 1, 1, 0]
    );
}

/// The bound is read from the counter of migration 0020, not by counting `sessions`: a
/// counter moved by hand moves what the create sees (and its message), and a negative one is
/// reported as corruption instead of being taken for zero.
pub(crate) async fn the_live_session_bound_reads_the_counter(db: &TestDb) {
    let ledger = db.migrated().await;
    let agent = refund_agent();
    let v = deploy_agent(ledger, &agent, "0.1.0").await;
    start(ledger, &v).await;
    start(ledger, &v).await;
    ledger
        .create_session_within(new_session(&v, &[]), 4)
        .await
        .unwrap();
    db.raw_exec(
        "UPDATE agent_live_sessions SET live = live + 1 \
         WHERE agent_namespace = 'support' AND agent_name = 'refund-agent' \
         AND shard = (SELECT MIN(shard) FROM agent_live_sessions \
         WHERE agent_namespace = 'support' AND agent_name = 'refund-agent')",
    )
    .await;
    assert_eq!(ledger.live_sessions_of_agent(&agent).await.unwrap(), 4);
    assert_eq!(
        exhausted(ledger.create_session_within(new_session(&v, &[]), 4).await),
        "agent support/refund-agent has 4 live sessions (created and not yet ended); at most 4 \
         may be live at once, so no session was started"
    );
    db.raw_exec(
        "UPDATE agent_live_sessions SET live = live - 10 \
         WHERE agent_namespace = 'support' AND agent_name = 'refund-agent' \
         AND shard = (SELECT MIN(shard) FROM agent_live_sessions \
         WHERE agent_namespace = 'support' AND agent_name = 'refund-agent')",
    )
    .await;
    match ledger.live_sessions_of_agent(&agent).await {
        Err(LedgerError::Corrupt { message }) => assert_eq!(
            message,
            "the live-session counter of agent support/refund-agent is -6 \
             (table agent_live_sessions, migration 0020)"
        ),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(matches!(
        ledger
            .create_session_within(new_session(&v, &[]), 100)
            .await,
        Err(LedgerError::Corrupt { .. })
    ));
}

/// Migration 0020 counts the sessions that were live before it: a database migrated to 0019
/// with live and ended sessions of several agents gets a counter equal to `COUNT(*)`, so the
/// bound holds across the upgrade; and the triggers keep it from there.
pub(crate) async fn the_live_session_counter_is_backfilled_by_its_migration(db: &TestDb) {
    db.migrate_up_to(19).await;
    let ledger = &db.ledger;
    let refund = refund_agent();
    let triage = AgentRef::new("support", "triage");
    let ended_only = AgentRef::new("ops", "auditor");
    let agents = [&refund, &triage, &ended_only];
    let r = deploy_agent(ledger, &refund, "0.1.0").await;
    let t = deploy_agent(ledger, &triage, "1.0.0").await;
    let e = deploy_agent(ledger, &ended_only, "1.0.0").await;
    let mut refund_sessions = Vec::new();
    for _ in 0..4 {
        refund_sessions.push(start(ledger, &r).await);
    }
    to(
        ledger,
        &refund_sessions[0].id,
        SessionStatus::AwaitingApproval,
    )
    .await;
    ledger
        .set_session_status(&refund_sessions[1].id, StatusChange::completed(None))
        .await
        .unwrap();
    let triage_child = ledger
        .create_session(child_of(&t, &refund_sessions[2]))
        .await
        .unwrap();
    to(ledger, &triage_child.id, SessionStatus::AwaitingInput).await;
    let gone = start(ledger, &e).await;
    ledger
        .set_session_status(&gone.id, StatusChange::failed("done"))
        .await
        .unwrap();
    assert!(
        db.raw_strings("SELECT CAST(COUNT(*) AS TEXT) FROM _sqlx_migrations WHERE version = 20")
            .await[0][0]
            .as_deref()
            == Some("0"),
        "0020 not applied yet"
    );

    ledger.migrate().await.unwrap();
    assert_eq!(
        live_counts_agree(db, &agents, "backfilled").await,
        [3, 1, 0]
    );
    // The bound counts what was live before the upgrade.
    exhausted(ledger.create_session_within(new_session(&r, &[]), 3).await);
    ledger
        .create_session_within(new_session(&r, &[]), 4)
        .await
        .unwrap();
    ledger
        .set_session_status(&refund_sessions[2].id, StatusChange::cancelled())
        .await
        .unwrap();
    assert_eq!(
        live_counts_agree(db, &agents, "after the upgrade").await,
        [3, 0, 0]
    );
}

/// A create re-checks, in its own transaction, what the caller's `runnable_version` checked
/// before: a retire or an archive that commits in between wins, and its cascade never misses a
/// session that is being created meanwhile.
pub(crate) async fn a_session_never_outlives_the_retire_or_archive_of_its_agent(db: &TestDb) {
    let ledger = db.migrated().await;
    let agent = refund_agent();
    let v1 = deploy_agent(ledger, &agent, "0.1.0").await;
    let v2 = deploy_agent(ledger, &agent, "0.2.0").await;
    ledger
        .retire_version(
            &agent,
            "0.1.0",
            &phrony_ledger::Attribution::unverified("erin"),
        )
        .await
        .unwrap();
    assert_eq!(
        precondition(ledger.create_session(new_session(&v1, &[])).await),
        "agent support/refund-agent version \"0.1.0\" is retired and cannot be run"
    );

    // Creates racing an archive: each either lost (refused) or was ended by the archive.
    let mut creates = Vec::new();
    for _ in 0..16 {
        let ledger = ledger.clone();
        let new = new_session(&v2, &[]);
        creates.push(tokio::spawn(async move {
            ledger.create_session_within(new, 1_000).await
        }));
    }
    let archived = ledger
        .archive_agent(&agent, &phrony_ledger::Attribution::unverified("grace"))
        .await
        .unwrap();
    let mut created = Vec::new();
    for create in creates {
        match create.await.unwrap() {
            Ok(session) => created.push(session.id),
            Err(e) => assert_eq!(
                precondition(Err::<(), _>(e)),
                "agent support/refund-agent is archived and cannot be run"
            ),
        }
    }
    for id in &created {
        let s = ledger.get_session(id).await.unwrap();
        assert_eq!(
            s.status,
            SessionStatus::Failed,
            "session {id} outlived the archive"
        );
        assert!(archived.ended_sessions.contains(id), "{id}");
    }
    assert_eq!(
        precondition(ledger.create_session(new_session(&v2, &[])).await),
        "agent support/refund-agent is archived and cannot be run"
    );
}

/// The engine's sweep of parked sessions: the sessions still waiting that had an approval
/// decided since a time, read through the partial index of migration 0010 — what was decided,
/// not a scan of everything that still waits.
pub(crate) async fn decided_waits_are_found_by_decision_time(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let (_waiting, _, _) = pending_approval(ledger, &v, |_| {}).await;
    let (decided, _, approval) = pending_approval(ledger, &v, |_| {}).await;
    let since = chrono::Utc::now() - Duration::seconds(5);
    let found = |since| async move {
        ledger
            .sessions_with_waits_decided_since(since, 100)
            .await
            .unwrap()
    };
    assert!(found(since).await.is_empty(), "nothing decided yet");
    ledger
        .cast_vote(approval.id, approve("alice"))
        .await
        .unwrap();
    assert_eq!(found(since).await, vec![decided.id.clone()]);
    assert!(
        found(chrono::Utc::now() + Duration::seconds(60))
            .await
            .is_empty(),
        "decided before the window"
    );
    // Once the session moved on it is no longer waiting.
    to(ledger, &decided.id, SessionStatus::AwaitingTool).await;
    assert!(found(since).await.is_empty());

    // The ledger's query, as `Ledger::sessions_with_waits_decided_since` sends it.
    let query = "SELECT DISTINCT a.session_id FROM approvals a \
                 WHERE a.decided_at IS NOT NULL AND a.decided_at >= '2026-01-01' \
                 AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = a.session_id \
                 AND s.status = 'awaiting_approval')";
    let plan = db.explain_without_seqscan(query, &[]).await;
    assert!(
        plan.iter().any(|line| line.contains("approvals_decided")),
        "{plan:?}"
    );
}

pub(crate) async fn a_session_opens_with_its_first_events_in_one_transaction(db: &TestDb) {
    use phrony_ledger::{EventBody, Opening, SessionPrincipal};
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let alice = phrony_ledger::Attribution::unverified("alice".to_owned());
    let principal = || {
        let mut claims = Map::new();
        claims.insert("sub".into(), json!("alice"));
        Opening::Engine(
            EventBody::SessionPrincipal(SessionPrincipal {
                claims: Value::Object(claims),
            })
            .into_new_event("system")
            .unwrap(),
        )
    };
    let user = Opening::Session(SessionEvent::UserMessage {
        actor: alice.clone(),
        turn: 1,
        content: "Refund order ORD-1.".to_owned(),
    });
    let evidence = Opening::Session(SessionEvent::Evidence {
        snapshot: json!({"policies": []}),
    });
    let new = new_session(&v, &[]);
    let id = new.id.clone();
    let session = ledger
        .open_session(new, Some(10), vec![principal(), user.clone(), evidence])
        .await
        .unwrap();
    assert_eq!(session.status, SessionStatus::Running);
    let events = ledger.list_events(&id, 0, 100).await.unwrap();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "session.started",
            "session.principal",
            "message.user",
            "evidence.recorded"
        ]
    );
    assert_eq!(events[2].turn, Some(1));
    assert_eq!(events[2].actor, "alice");
    assert!(ledger.verify_stream(&id).await.unwrap().violation.is_none());

    // An opening event the ledger refuses (a ledger-owned type appended raw) refuses the
    // whole start: no session, no stream, no events.
    let forged = Opening::Engine(
        EventBody::SessionStatusChanged(phrony_ledger::SessionTransition {
            from: SessionStatus::Running,
            to: SessionStatus::Completed,
            reason: None,
            message: None,
            output: None,
        })
        .into_new_event("system")
        .unwrap(),
    );
    let refused = new_session(&v, &[]);
    let refused_id = refused.id.clone();
    let message = invalid(ledger.open_session(refused, None, vec![user, forged]).await);
    assert!(message.contains("session.status_changed"), "{message}");
    not_found(ledger.get_session(&refused_id).await);
    assert!(
        ledger
            .list_events(&refused_id, 0, 10)
            .await
            .map_or(true, |e| e.is_empty()),
        "a refused start wrote events"
    );

    // The bound applies as in create_session_within: with one live session and a bound of
    // one, the start is refused and writes nothing either.
    let bounded = new_session(&v, &[]);
    let bounded_id = bounded.id.clone();
    assert!(matches!(
        ledger.open_session(bounded, Some(1), Vec::new()).await,
        Err(LedgerError::ResourceExhausted { .. })
    ));
    not_found(ledger.get_session(&bounded_id).await);
}

/// `record_step`: a completion, the session's move to `awaiting_tool` and the calls it
/// requested commit together, in that order, as the separate operations would have written
/// them; any failing part writes nothing at all.
pub(crate) async fn a_model_step_commits_its_completion_status_and_calls_together(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let completion = |iteration: u32| completion_event(iteration, "tool_use", Vec::new());
    let s = start(ledger, &v).await;
    let step = ledger
        .record_step(
            &s.id,
            completion(0),
            None,
            Some(StatusChange::to(SessionStatus::AwaitingTool).from(SessionStatus::Running)),
            vec![refund_call(&s.id, 0, 0, 100), refund_call(&s.id, 0, 1, 50)],
        )
        .await
        .unwrap();
    assert_eq!(step.events.len(), 1);
    let changed = step.status.expect("the status change");
    assert_eq!(changed.from, SessionStatus::Running);
    assert_eq!(changed.session.status, SessionStatus::AwaitingTool);
    assert_eq!(step.calls.len(), 2);
    assert!(step.calls.iter().all(|c| c.status == CallStatus::Pending));
    assert_eq!(
        step.calls[0].call_id,
        tool_call_id(&s.id, v.id, 1, 0, 0),
        "the calls' ids are the ones record_tool_call gives"
    );
    let types: Vec<String> = ledger
        .events_after(&s.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_eq!(
        types,
        [
            "session.started",
            "model.completion",
            "session.status_changed",
            "tool.requested",
            "tool.requested"
        ]
    );
    // Recording the same calls again (a driver that restarted) returns the same rows.
    let again = ledger
        .record_tool_call(refund_call(&s.id, 0, 1, 50))
        .await
        .unwrap();
    assert_eq!(again.call_id, step.calls[1].call_id);

    // A call that conflicts with a recorded one (same id, other arguments) fails the step
    // inside its transaction: neither the completion, nor the status change, nor the first
    // call is written.
    let other = start(ledger, &v).await;
    ledger
        .record_tool_call(refund_call(&other.id, 1, 0, 100))
        .await
        .unwrap();
    let before = ledger.events_after(&other.id, 0, 100).await.unwrap();
    let conflict = ledger
        .record_step(
            &other.id,
            completion(1),
            None,
            Some(StatusChange::to(SessionStatus::AwaitingTool).from(SessionStatus::Running)),
            vec![
                refund_call(&other.id, 1, 1, 10),
                refund_call(&other.id, 1, 0, 999),
            ],
        )
        .await;
    assert!(
        matches!(conflict, Err(LedgerError::AlreadyExists { .. })),
        "{conflict:?}"
    );
    assert_eq!(
        ledger.events_after(&other.id, 0, 100).await.unwrap(),
        before
    );
    assert_eq!(
        ledger.get_session(&other.id).await.unwrap().status,
        SessionStatus::Running
    );
    not_found(
        ledger
            .get_tool_call(&tool_call_id(&other.id, v.id, 1, 1, 1))
            .await,
    );

    // A status change the session cannot make refuses the whole step too.
    let refused = ledger
        .record_step(
            &other.id,
            completion(1),
            None,
            Some(StatusChange::to(SessionStatus::AwaitingTool).from(SessionStatus::AwaitingInput)),
            vec![refund_call(&other.id, 1, 1, 10)],
        )
        .await;
    precondition(refused);
    assert_eq!(
        ledger.events_after(&other.id, 0, 100).await.unwrap(),
        before
    );
}

/// `sessions_resting_on_approvals`: the root task sessions a restart may leave unloaded are
/// exactly those whose every open call waits on a pending approval.
pub(crate) async fn sessions_resting_on_approvals_are_found_in_one_query(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let (resting, _, _) = pending_approval(ledger, &v, |_| {}).await;
    // A second call of the session still to be decided: the driver has work to do.
    let (busy, _, _) = pending_approval(ledger, &v, |_| {}).await;
    ledger
        .record_tool_call(refund_call(&busy.id, 0, 1, 50))
        .await
        .unwrap();
    // Approved: the call goes back to pending, to be dispatched.
    let (approved, _, approval) = pending_approval(ledger, &v, |_| {}).await;
    ledger
        .cast_vote(approval.id, approve("alice"))
        .await
        .unwrap();
    // Running, no calls.
    let running = start(ledger, &v).await;
    let found = ledger.sessions_resting_on_approvals().await.unwrap();
    assert!(found.contains(&resting.id), "{found:?}");
    for other in [&busy.id, &approved.id, &running.id] {
        assert!(!found.contains(other), "{other} listed: {found:?}");
    }
    assert_eq!(found.len(), 1, "{found:?}");
    // Cancelled: it ends, and its approval is closed.
    ledger
        .set_session_status(&resting.id, StatusChange::to(SessionStatus::Cancelled))
        .await
        .unwrap();
    assert!(
        ledger
            .sessions_resting_on_approvals()
            .await
            .unwrap()
            .is_empty()
    );
}

/// `record_tool_calls`: the calls of one completion are recorded in one transaction, all or
/// none, idempotently.
pub(crate) async fn the_calls_of_a_completion_are_recorded_together(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let s = start(ledger, &v).await;
    let calls = ledger
        .record_tool_calls(vec![
            refund_call(&s.id, 0, 0, 100),
            refund_call(&s.id, 0, 1, 50),
        ])
        .await
        .unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].call_id, tool_call_id(&s.id, v.id, 1, 0, 1));
    // The same calls again: the same rows, nothing new in the log.
    let before = ledger.events_after(&s.id, 0, 100).await.unwrap();
    let again = ledger
        .record_tool_calls(vec![
            refund_call(&s.id, 0, 0, 100),
            refund_call(&s.id, 0, 1, 50),
        ])
        .await
        .unwrap();
    assert_eq!(again, calls);
    assert_eq!(ledger.events_after(&s.id, 0, 100).await.unwrap(), before);
    // A conflicting second call refuses the first too.
    let refused = ledger
        .record_tool_calls(vec![
            refund_call(&s.id, 1, 0, 10),
            refund_call(&s.id, 0, 1, 999),
        ])
        .await;
    assert!(
        matches!(refused, Err(LedgerError::AlreadyExists { .. })),
        "{refused:?}"
    );
    assert_eq!(ledger.events_after(&s.id, 0, 100).await.unwrap(), before);
    not_found(
        ledger
            .get_tool_call(&tool_call_id(&s.id, v.id, 1, 1, 0))
            .await,
    );
}

/// `sessions_needing_recovery_after`: recovery reads the sessions left page by page, oldest
/// first, each once, without the ended ones.
pub(crate) async fn sessions_to_recover_are_read_page_by_page(db: &TestDb) {
    let ledger = db.migrated().await;
    let v = deploy_agent(ledger, &refund_agent(), "0.1.0").await;
    let mut live = Vec::new();
    for i in 0..7 {
        let s = start(ledger, &v).await;
        if i == 3 {
            to(ledger, &s.id, SessionStatus::Cancelled).await;
        } else {
            live.push(s.id);
        }
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = ledger
            .sessions_needing_recovery_after(after.take(), 2)
            .await
            .unwrap();
        assert!(page.len() <= 2);
        after = page.last().map(|s| (s.created_at, s.id.clone()));
        let done = page.len() < 2;
        seen.extend(page.into_iter().map(|s| s.id));
        if done {
            break;
        }
    }
    let mut expected = ledger.sessions_needing_recovery().await.unwrap();
    expected.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let expected: Vec<String> = expected.into_iter().map(|s| s.id).collect();
    assert_eq!(seen, expected, "oldest first, each once");
    let mut sorted = seen.clone();
    sorted.sort();
    live.sort();
    assert_eq!(sorted, live, "every live session, no ended one");
}

/// A session's end reads its own pending approvals through the session's index, never by
/// walking every pending approval of every session (SQLite, without statistics, served the
/// statement's order from `approvals_status_created` and filtered by session: with 100,000
/// sessions parked, each session's end read 100,000 approvals inside the group-commit writer).
pub(crate) async fn a_session_end_reads_only_its_own_pending_approvals(db: &TestDb) {
    let ledger = db.migrated().await;
    let plan = ledger
        .explain_pending_approvals_of_session("run_00000000-0000-4000-8000-000000000000")
        .await
        .unwrap();
    assert!(
        plan.iter()
            .all(|line| !line.contains("approvals_status_created")),
        "{plan:#?}"
    );
    if db.kind == phrony_ledger::Backend::Sqlite {
        assert!(
            plan.iter()
                .any(|line| line.contains("approvals_session (session_id=?")),
            "{plan:#?}"
        );
    }
}

/// A write to a session that does not exist — no stream at all, or a stream without a session
/// row (a raw append's) — is `NotFound` naming the session, and writes nothing: the session's
/// stream lock and its status are read in one statement, and a missing row of either is the
/// same answer.
pub(crate) async fn writes_to_a_missing_session_are_not_found_and_write_nothing(db: &TestDb) {
    let ledger = db.migrated().await;
    let raw = phrony_ledger::NewEvent::new("message.user", "user", json!({"content": "raw"}));
    ledger.append_session_event("run_raw", raw).await.unwrap();
    let cipher = SecretCipher::new(&[42; 32]);
    for id in ["run_missing", "run_raw"] {
        let expected = format!("session {id} not found");
        let event = SessionEvent::UserMessage {
            actor: "carol".into(),
            turn: 1,
            content: "hi".into(),
        };
        for result in [
            ledger.record_session_event(id, event).await.map(|_| ()),
            ledger
                .store_session_secrets(id, vec![cipher.seal(id, "a", b"x").unwrap()])
                .await
                .map(|_| ()),
        ] {
            match result {
                Err(LedgerError::NotFound { message }) => assert_eq!(message, expected),
                other => panic!("expected NotFound {expected:?}, got {other:?}"),
            }
        }
    }
    assert_eq!(ledger.list_events("run_raw", 0, 10).await.unwrap().len(), 1);
    // No stream was created for the missing session.
    assert!(matches!(
        ledger.list_events("run_missing", 0, 10).await,
        Err(LedgerError::NotFound { .. })
    ));
    let secrets = db
        .raw_strings("SELECT session_id FROM session_secrets WHERE session_id LIKE 'run_%'")
        .await;
    assert!(secrets.is_empty(), "{secrets:?}");
}
