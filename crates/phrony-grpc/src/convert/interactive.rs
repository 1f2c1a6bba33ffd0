//! `RunSessionInteractive`: client messages → requests, and the engine's view of a session
//! ([`phrony_engine::CatchUp`], [`Activity`]) → server messages.

use std::collections::HashMap;

use pb::run_session_interactive_client_msg::Body as ClientBody;
use pb::run_session_interactive_server_msg::Body as ServerBody;
use phrony_engine::{
    Activity, ApprovalRequest, AwaitingInput, CatchUp, HistoryEntry, SessionStatus, TurnStats,
    Vote, VoteDecision,
};
use phrony_proto::runtime::v1 as pb;
use serde_json::Value;
use tonic::Status;
use uuid::Uuid;

use super::approvals::{approval_id, edited_args, policy_name};
use super::{int32, json_bytes, optional_timestamp, token_usage, unix_ms};

/// The message every stream must open with.
pub(crate) const FIRST_MESSAGE_MUST_BE_START: &str = "first message must be start";

/// A client message without a body (or with one this runtime does not know).
pub(crate) const NO_BODY: &str =
    "client message has no body; expected start, user_message or tool_approval";

/// A decoded client message.
#[derive(Debug)]
pub(crate) enum ClientMessage {
    /// `start`: start a session or attach to one.
    Start(pb::RunSessionInteractiveStart),
    /// `user_message`: the text (not checked here; the engine refuses an empty one).
    UserMessage(String),
    /// `tool_approval`.
    Approval(ApprovalDecisionRequest),
}

/// A `tool_approval` message, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApprovalDecisionRequest {
    /// The approval; `None` means the one pending for the session.
    pub approval_id: Option<Uuid>,
    /// The vote (its actor is the stream's).
    pub vote: Vote,
}

/// Decodes one client message. A message without a body (or with one this runtime does not
/// know) is refused.
pub(crate) fn client_message(
    msg: pb::RunSessionInteractiveClientMsg,
) -> Result<ClientMessage, Status> {
    match msg.body {
        Some(ClientBody::Start(start)) => Ok(ClientMessage::Start(start)),
        Some(ClientBody::UserMessage(m)) => Ok(ClientMessage::UserMessage(m.text)),
        Some(ClientBody::ToolApproval(a)) => Ok(ClientMessage::Approval(tool_approval(a)?)),
        None => Err(Status::invalid_argument(NO_BODY)),
    }
}

/// A `tool_approval`, checked; the vote's actor is left empty for the stream to fill in.
fn tool_approval(
    a: pb::RunSessionInteractiveToolApproval,
) -> Result<ApprovalDecisionRequest, Status> {
    let id = match a.approval_id.trim() {
        "" => None,
        id => Some(approval_id(id)?),
    };
    let decision = if a.approved {
        VoteDecision::Approve
    } else {
        VoteDecision::Reject
    };
    let resolution = super::approvals::resolution(&a.resolution)
        .map_err(|s| Status::invalid_argument(format!("tool_approval.{}", s.message())))?;
    let result = super::approvals::review_result(&a.result)
        .map_err(|s| Status::invalid_argument(format!("tool_approval.{}", s.message())))?;
    let edited_args = edited_args(&a.args)
        .map_err(|s| Status::invalid_argument(format!("tool_approval.{}", s.message())))?;
    Ok(ApprovalDecisionRequest {
        approval_id: id,
        vote: Vote {
            // Both filled in by the stream: its attribution and its principal's routes.
            actor: String::new().into(),
            routes: Vec::new(),
            decision,
            comment: a.comment,
            comprehension_acknowledged: a.comprehension_acknowledged,
            edited_args,
            resolution,
            result,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Server messages

fn msg(body: ServerBody) -> pb::RunSessionInteractiveServerMsg {
    pb::RunSessionInteractiveServerMsg { body: Some(body) }
}

fn stats(s: &TurnStats) -> pb::InteractiveSessionStats {
    pb::InteractiveSessionStats {
        turn: int32(s.turn),
        turn_usage: Some(token_usage(&s.turn_usage)),
        session_usage: Some(token_usage(&s.session_usage)),
    }
}

fn history_entry(e: &HistoryEntry) -> pb::InteractiveConversationMessage {
    pb::InteractiveConversationMessage {
        role: e.role.clone(),
        content: e.content.clone(),
        stop_reason: e.stop_reason.clone().unwrap_or_default(),
        turn_usage: e.turn_usage.as_ref().map(token_usage),
        turn_duration_ms: e
            .turn_duration_ms
            .map_or(0, |ms| i64::try_from(ms).unwrap_or(i64::MAX)),
    }
}

/// The first server message: the session, its model, limits, conversation so far and evidence.
pub(crate) fn session_started(c: &CatchUp) -> pb::RunSessionInteractiveServerMsg {
    let limits = c.session.limits.clone().unwrap_or_default();
    msg(ServerBody::SessionStarted(
        pb::RunSessionInteractiveSessionStarted {
            session_id: c.session.id.clone(),
            agent_version_id: c.session.agent_version_id.hyphenated().to_string(),
            model_provider: c.model_provider.clone(),
            model_name: c.model_name.clone(),
            history: c.history.iter().map(history_entry).collect(),
            max_tokens_per_run: limits.max_tokens_per_run.map_or(0, int32),
            max_wall_clock_seconds: limits.max_wall_clock_seconds.map_or(0, int32),
            session_started_at_unix_ms: unix_ms(c.session.created_at),
            session_ended_at_unix_ms: c.ended_at.map_or(0, unix_ms),
            descriptive_metadata: c.evidence.as_ref().map(evidence),
        },
    ))
}

/// A status report: `status` with `reason` (also used to report a refused client message,
/// with the session's current status).
pub(crate) fn status(
    status: SessionStatus,
    reason: Option<String>,
) -> pb::RunSessionInteractiveServerMsg {
    msg(ServerBody::Status(pb::RunSessionInteractiveStatus {
        status: status.as_str().to_owned(),
        reason: reason.unwrap_or_default(),
    }))
}

fn awaiting_input(w: &AwaitingInput) -> pb::RunSessionInteractiveAwaitingInput {
    pb::RunSessionInteractiveAwaitingInput {
        stop_reason: w.stop_reason.clone().unwrap_or_default(),
        stats: w.stats.as_ref().map(stats),
        input_blocked_reason: w.blocked_reason.clone().unwrap_or_default(),
    }
}

/// `awaiting_input`.
pub(crate) fn awaiting_input_msg(w: &AwaitingInput) -> pb::RunSessionInteractiveServerMsg {
    msg(ServerBody::AwaitingInput(awaiting_input(w)))
}

fn approval_required(r: &ApprovalRequest) -> pb::RunSessionInteractiveApprovalRequired {
    pb::RunSessionInteractiveApprovalRequired {
        approval_id: r.approval_id.hyphenated().to_string(),
        call_id: r.call_id.clone(),
        tool: r.tool.clone(),
        version: r.version.clone(),
        args: json_bytes(&r.args),
        route: r.route.clone(),
        reason: r.reason.clone(),
        authority_ref: r.authority_ref.clone(),
        policy_name: policy_name(r.policy_ref.as_deref()),
        policy_runtime: json_bytes(&Value::Object(r.policy_runtime.clone())),
        approvals_required: int32(r.approvals_required),
        approvals_received: int32(r.approvals_received),
        comprehension_required: r.comprehension_required,
        expires_at: optional_timestamp(r.expires_at),
        policy_ref: r.policy_ref.clone().unwrap_or_default(),
        on_reject: r.on_reject.clone(),
        on_modify: r.on_modify.clone(),
        kind: r.kind.to_string(),
    }
}

/// One item of the session's view as a server message.
pub(crate) fn activity(a: &Activity) -> pb::RunSessionInteractiveServerMsg {
    match a {
        Activity::Text(delta) => msg(ServerBody::TextDelta(pb::RunSessionInteractiveTextDelta {
            delta: delta.clone(),
        })),
        Activity::ToolCall(c) => msg(ServerBody::ToolCall(pb::RunSessionInteractiveToolCall {
            call_id: c.call_id.clone(),
            tool: c.tool.clone(),
            version: c.version.clone(),
            args: json_bytes(&c.args),
            agent_delegation: c.delegation.is_some(),
            child_session_id: c
                .delegation
                .as_ref()
                .map(|d| d.child_session_id.clone())
                .unwrap_or_default(),
            delegation_target: c
                .delegation
                .as_ref()
                .map(|d| d.target.clone())
                .unwrap_or_default(),
            wire_name: c.wire_name.clone().unwrap_or_default(),
        })),
        Activity::ToolResult(r) => msg(ServerBody::ToolResult(
            pb::RunSessionInteractiveToolResult {
                call_id: r.call_id.clone(),
                payload: r.result.as_ref().map(json_bytes).unwrap_or_default(),
                error_message: r.error_message.clone().unwrap_or_default(),
                error_code: r.error_code.clone().unwrap_or_default(),
                policy_ref: r.policy_ref.clone().unwrap_or_default(),
            },
        )),
        Activity::ApprovalRequired(r) => msg(ServerBody::ApprovalRequired(approval_required(r))),
        Activity::ApprovalDecided(d) => msg(ServerBody::ApprovalDecided(
            pb::RunSessionInteractiveApprovalDecided {
                approval_id: d.approval_id.hyphenated().to_string(),
                call_id: d.call_id.clone(),
                status: d.status.as_str().to_owned(),
                decided_by: d.decided_by.clone(),
                comment: d.comment.clone(),
                approvals_received: int32(d.approvals_received),
                approvals_required: int32(d.approvals_required),
            },
        )),
        Activity::Status { status: s, reason } => status(*s, reason.clone()),
        Activity::AwaitingInput(w) => awaiting_input_msg(w),
        Activity::Completed(c) => msg(ServerBody::Completed(pb::RunSessionInteractiveCompleted {
            stop_reason: c.stop_reason.clone().unwrap_or_default(),
            output: json_bytes(&c.output),
            stats: c.stats.as_ref().map(stats),
            session_ended_at_unix_ms: unix_ms(c.ended_at),
        })),
        Activity::Failed { message } => msg(ServerBody::Failed(pb::RunSessionInteractiveFailed {
            message: message.clone(),
        })),
        Activity::Cancelled { ended_at } => {
            msg(ServerBody::Cancelled(pb::RunSessionInteractiveCancelled {
                session_ended_at_unix_ms: unix_ms(*ended_at),
            }))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Evidence (§5.11)

/// The roles `eu-ai-act/v1` accepts.
const EU_AI_ACT_ROLES: &[&str] = &[
    "provider",
    "deployer",
    "importer",
    "distributor",
    "product_manufacturer",
    "authorized_representative",
];

/// `validated` when the pack is known and its payload passes the pack's check.
fn framework_validation(id: &str, payload: &Value) -> &'static str {
    let valid = match id {
        "eu-ai-act/v1" => {
            payload
                .get("role")
                .and_then(Value::as_str)
                .is_some_and(|r| EU_AI_ACT_ROLES.contains(&r))
                && payload
                    .get("annex_iii_category")
                    .is_none_or(|c| c.is_string() || c.is_null())
        }
        _ => false,
    };
    if valid { "validated" } else { "unvalidated" }
}

fn string_map(v: Option<&Value>) -> HashMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The recorded evidence snapshot as `DescriptiveMetadataEvidence` (framework packs sorted by
/// id, each validated or not).
pub(crate) fn evidence(snapshot: &Value) -> pb::DescriptiveMetadataEvidence {
    let text = |key: &str| {
        snapshot
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let governance = snapshot
        .get("governance")
        .filter(|g| g.is_object())
        .map(|g| {
            let mut frameworks: Vec<pb::FrameworkPackEvidence> = g
                .get("frameworks")
                .and_then(Value::as_object)
                .map(|packs| {
                    packs
                        .iter()
                        .map(|(id, payload)| pb::FrameworkPackEvidence {
                            id: id.clone(),
                            validation: framework_validation(id, payload).to_owned(),
                            payload: json_bytes(payload),
                        })
                        .collect()
                })
                .unwrap_or_default();
            frameworks.sort_by(|a, b| a.id.cmp(&b.id));
            pb::GovernanceMetadataEvidence {
                risk_tier: g
                    .get("risk_tier")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                classifications: strings(g.get("classifications")),
                authority_boundaries: strings(g.get("authority_boundaries")),
                frameworks,
            }
        });
    pb::DescriptiveMetadataEvidence {
        owner: text("owner"),
        labels: string_map(snapshot.get("labels")),
        annotations: string_map(snapshot.get("annotations")),
        governance,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tonic::Code;

    fn approval_msg(a: pb::RunSessionInteractiveToolApproval) -> Result<ClientMessage, Status> {
        client_message(pb::RunSessionInteractiveClientMsg {
            body: Some(ClientBody::ToolApproval(a)),
        })
    }

    #[test]
    fn tool_approvals_are_checked() {
        let ok = approval_msg(pb::RunSessionInteractiveToolApproval {
            approval_id: String::new(),
            approved: true,
            comment: "fine".into(),
            args: br#"{"amount": 300}"#.to_vec(),
            comprehension_acknowledged: true,
            ..Default::default()
        })
        .unwrap();
        let ClientMessage::Approval(a) = ok else {
            panic!("{ok:?}")
        };
        assert_eq!(a.approval_id, None);
        assert_eq!(a.vote.decision, VoteDecision::Approve);
        assert_eq!(a.vote.edited_args, Some(json!({"amount": 300})));
        assert!(a.vote.comprehension_acknowledged);

        let bad_id = approval_msg(pb::RunSessionInteractiveToolApproval {
            approval_id: "nope".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(bad_id.code(), Code::InvalidArgument);
        assert!(bad_id.message().contains("UUID"), "{}", bad_id.message());

        let not_json = approval_msg(pb::RunSessionInteractiveToolApproval {
            approved: true,
            args: b"[1".to_vec(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(not_json.code(), Code::InvalidArgument);
        assert!(
            not_json
                .message()
                .starts_with("tool_approval.args must be valid JSON"),
            "{}",
            not_json.message()
        );
        // Arguments that are no object, or come with a rejection, are refused by the engine's
        // vote rules (one message for every surface; the engine's tests/vote.rs), and the stream
        // reports that refusal (tests/interactive.rs).
        let args_on_reject = approval_msg(pb::RunSessionInteractiveToolApproval {
            approved: false,
            args: br#"{"amount": 1}"#.to_vec(),
            ..Default::default()
        })
        .unwrap();
        let ClientMessage::Approval(a) = args_on_reject else {
            panic!("{args_on_reject:?}")
        };
        assert_eq!(a.vote.decision, VoteDecision::Reject);
        assert_eq!(a.vote.edited_args, Some(json!({"amount": 1})));

        // An outcome review's resolution and result travel on the stream too.
        let resolved = approval_msg(pb::RunSessionInteractiveToolApproval {
            approved: true,
            resolution: "happened".into(),
            result: br#"{"refund_id": "rf_1"}"#.to_vec(),
            ..Default::default()
        })
        .unwrap();
        let ClientMessage::Approval(a) = resolved else {
            panic!("{resolved:?}")
        };
        assert_eq!(
            a.vote.resolution,
            Some(phrony_ledger::ReviewResolution::Happened)
        );
        assert_eq!(a.vote.result, Some(json!({"refund_id": "rf_1"})));
        let unknown = approval_msg(pb::RunSessionInteractiveToolApproval {
            resolution: "maybe".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            unknown.message(),
            "tool_approval.resolution must be \"happened\", \"resend\" or \"fail\" (got \"maybe\")"
        );

        let empty = client_message(pb::RunSessionInteractiveClientMsg { body: None }).unwrap_err();
        assert_eq!(empty.code(), Code::InvalidArgument);
    }

    #[test]
    fn evidence_validates_known_framework_packs() {
        let snapshot = json!({
            "owner": "support-team",
            "labels": {"team": "support"},
            "governance": {
                "risk_tier": "high",
                "classifications": ["pii"],
                "frameworks": {
                    "zz-internal/v2": {"anything": true},
                    "eu-ai-act/v1": {"role": "deployer", "annex_iii_category": "5b"}
                }
            }
        });
        let e = evidence(&snapshot);
        assert_eq!(e.owner, "support-team");
        assert_eq!(e.labels["team"], "support");
        let g = e.governance.unwrap();
        assert_eq!(g.risk_tier, "high");
        assert_eq!(g.classifications, ["pii"]);
        let packs: Vec<_> = g
            .frameworks
            .iter()
            .map(|f| (f.id.as_str(), f.validation.as_str()))
            .collect();
        assert_eq!(
            packs,
            [
                ("eu-ai-act/v1", "validated"),
                ("zz-internal/v2", "unvalidated")
            ]
        );
        let wrong_role = json!({"governance": {"frameworks": {"eu-ai-act/v1": {"role": "user"}}}});
        assert_eq!(
            evidence(&wrong_role).governance.unwrap().frameworks[0].validation,
            "unvalidated"
        );
    }
}
