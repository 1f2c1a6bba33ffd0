//! Scripted session events for the attach tests.

use chrono::{DateTime, TimeZone as _, Utc};
use phrony_client::interactive::{
    ApprovalDecided, ApprovalRequired, ApprovalStatus, AwaitingInput, Completed, HistoryEntry,
    Role, SessionEvent, SessionStarted, SessionStats, StatusChanged, TokenUsage, ToolCall,
    ToolOutcome, ToolResult,
};

use super::view::View;

pub(crate) const SESSION: &str = "run_6f1c2a9e-0b7d-4c55-9a61-3e2f8d7c1b20";

/// The tests' "now": 2026-01-01T10:00:00Z.
pub(crate) fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 0).unwrap()
}

fn usage(total: u64) -> TokenUsage {
    TokenUsage {
        input: total / 2,
        output: total - total / 2,
        total,
        estimated: false,
    }
}

/// A session started 30 s before [`now`], 20 000 tokens and 600 s budgets, no history.
pub(crate) fn started() -> SessionStarted {
    SessionStarted {
        session_id: SESSION.into(),
        agent_version_id: "0b4e6c1d-aaaa-bbbb-cccc-000000000001".into(),
        model_provider: "stub".into(),
        model_name: "scripted".into(),
        history: Vec::new(),
        max_tokens_per_run: Some(20_000),
        max_wall_clock_seconds: Some(600),
        started_at: Some(now() - chrono::Duration::seconds(30)),
        ended_at: None,
        metadata: None,
    }
}

pub(crate) fn started_with_history() -> SessionEvent {
    let mut started = started();
    started.history = vec![
        HistoryEntry {
            role: Role::User,
            content: "Can you check order ORD-1?".into(),
            stop_reason: None,
            turn_usage: None,
            turn_duration_ms: None,
        },
        HistoryEntry {
            role: Role::Assistant,
            content: "ORD-1 is a €400 order, delivered.".into(),
            stop_reason: Some("end_turn".into()),
            turn_usage: Some(usage(120)),
            turn_duration_ms: Some(1500),
        },
    ];
    SessionEvent::Started(started)
}

/// A view of [`started`] with agent `support/refund-agent@0.1.0`.
pub(crate) fn started_view() -> View {
    let mut view = View::new(Some("support/refund-agent@0.1.0".into()));
    view.apply(SessionEvent::Started(started()), now());
    view
}

pub(crate) fn delta(text: &str) -> SessionEvent {
    SessionEvent::TextDelta(text.into())
}

pub(crate) fn tool_call(call_id: &str, tool: &str, args: &str) -> SessionEvent {
    SessionEvent::ToolCall(ToolCall {
        call_id: call_id.into(),
        tool: tool.into(),
        version: "1.0.0".into(),
        args: args.into(),
        delegation: None,
        wire_name: None,
    })
}

pub(crate) fn tool_ok(call_id: &str, payload: &str) -> SessionEvent {
    SessionEvent::ToolResult(ToolResult {
        call_id: call_id.into(),
        outcome: ToolOutcome::Succeeded {
            payload: payload.into(),
        },
    })
}

pub(crate) fn tool_failed(call_id: &str, code: &str, message: &str) -> SessionEvent {
    SessionEvent::ToolResult(ToolResult {
        call_id: call_id.into(),
        outcome: ToolOutcome::Failed {
            code: Some(code.into()),
            message: message.into(),
            policy_ref: None,
        },
    })
}

pub(crate) fn policy_denied(call_id: &str) -> SessionEvent {
    SessionEvent::ToolResult(ToolResult {
        call_id: call_id.into(),
        outcome: ToolOutcome::Failed {
            code: Some("policy_denied".into()),
            message: "refunds over 10000 are never agent-initiated".into(),
            policy_ref: Some("payments/refund-hard-limit@1.0.0".into()),
        },
    })
}

/// The €400 refund held by `payments/refund-approval-boundary@1.0.0`, expiring 15 min after
/// [`now`].
pub(crate) fn approval(comprehension_required: bool) -> SessionEvent {
    SessionEvent::ApprovalRequired(ApprovalRequired {
        approval_id: "apr_1".into(),
        kind: "policy".into(),
        call_id: "c9".into(),
        tool: "payments.issue-refund".into(),
        version: "1.0.0".into(),
        args: r#"{"amount":400,"order_id":"ORD-1"}"#.into(),
        route: Some("support-leads".into()),
        reason: Some("refunds over 250 need a human".into()),
        authority_ref: None,
        policy_name: Some("refund-approval-boundary".into()),
        policy_ref: Some("payments/refund-approval-boundary@1.0.0".into()),
        policy_runtime: None,
        approvals_required: 1,
        approvals_received: 0,
        comprehension_required,
        expires_at: Some(now() + chrono::Duration::minutes(15)),
        on_reject: Some("return_to_agent".into()),
        on_modify: Some("revalidate".into()),
    })
}

/// An outcome review of `c9` (its worker was lost).
pub(crate) fn review() -> SessionEvent {
    let SessionEvent::ApprovalRequired(a) = approval(false) else {
        unreachable!("approval() is an ApprovalRequired")
    };
    SessionEvent::ApprovalRequired(ApprovalRequired {
        kind: "outcome_review".into(),
        route: None,
        reason: Some(
            "worker \"w-1\" was lost. The runtime cannot tell whether \
             payments.issue-refund@1.0.0 took effect: did it happen?"
                .into(),
        ),
        policy_name: None,
        policy_ref: None,
        expires_at: None,
        ..a
    })
}

pub(crate) fn decided(status: &str, received: u32) -> SessionEvent {
    SessionEvent::ApprovalDecided(ApprovalDecided {
        approval_id: "apr_1".into(),
        call_id: "c9".into(),
        status: match status {
            "pending" => ApprovalStatus::Pending,
            "approved" => ApprovalStatus::Approved,
            "denied" => ApprovalStatus::Denied,
            other => ApprovalStatus::Other(other.into()),
        },
        decided_by: "emad".into(),
        comment: Some("Damage claim verified".into()),
        approvals_received: received,
        approvals_required: 1,
    })
}

/// The turn `turn` ended (100 tokens); `tokens` used by the session so far.
pub(crate) fn ready(turn: u32, tokens: u64) -> SessionEvent {
    SessionEvent::AwaitingInput(AwaitingInput {
        stop_reason: Some("end_turn".into()),
        stats: SessionStats {
            turn,
            turn_usage: Some(usage(100)),
            session_usage: Some(usage(tokens)),
        },
        input_blocked_reason: None,
    })
}

pub(crate) fn limit(reason: &str) -> SessionEvent {
    SessionEvent::AwaitingInput(AwaitingInput {
        stop_reason: None,
        stats: SessionStats {
            turn: 3,
            turn_usage: None,
            session_usage: Some(usage(20_400)),
        },
        input_blocked_reason: Some(reason.into()),
    })
}

pub(crate) fn status(status: &str) -> SessionEvent {
    SessionEvent::Status(StatusChanged {
        status: status.into(),
        reason: None,
    })
}

pub(crate) fn completed() -> SessionEvent {
    SessionEvent::Completed(Completed {
        stop_reason: Some("end_turn".into()),
        output: r#"{"message":"done"}"#.into(),
        stats: SessionStats::default(),
        ended_at: None,
    })
}
