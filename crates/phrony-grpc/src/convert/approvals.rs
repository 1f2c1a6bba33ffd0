//! Approvals: `GetApproval`, `ListApprovals`, `WatchApprovals` and `DecideApproval` requests and responses, and the
//! approvals of the `InspectSession` timeline.

use phrony_auth::Attribution;
use phrony_engine::{ApprovalChange, VoteAnswer};
use phrony_ledger::{
    AgentRef, Approval, ApprovalFilter, ApprovalStatus, ApprovalVote, PageRequest,
    ReviewResolution, Vote, VoteDecision,
};
use phrony_proto::runtime::v1 as pb;
use serde_json::Value;
use tonic::Status;
use uuid::Uuid;

use super::sessions::{json_document, page_request};
use super::{int32, json_bytes, optional_timestamp, timestamp};

// ---------------------------------------------------------------------------------------------
// Requests

/// A required approval id, which must be a UUID.
pub(crate) fn approval_id(id: &str) -> Result<Uuid, Status> {
    let id = id.trim();
    if id.is_empty() {
        return Err(Status::invalid_argument("approval_id is required"));
    }
    Uuid::parse_str(id)
        .map_err(|_| Status::invalid_argument(format!("approval_id must be a UUID (got {id:?})")))
}

/// The ledger filter and page of a `ListApprovals` request.
pub(crate) fn approval_filter(
    r: &pb::ListApprovalsRequest,
) -> Result<(ApprovalFilter, PageRequest), Status> {
    let status = match r.status.trim() {
        "" => None,
        s => Some(s.parse::<ApprovalStatus>().map_err(super::ledger_status)?),
    };
    let agent = match (r.agent_namespace.trim(), r.agent_name.trim()) {
        ("", "") => None,
        (ns, name) if !ns.is_empty() && !name.is_empty() => Some(AgentRef::new(ns, name)),
        _ => {
            return Err(Status::invalid_argument(
                "agent_namespace and agent_name must be given together",
            ));
        }
    };
    let filter = ApprovalFilter {
        status,
        session_id: super::optional(r.session_id.trim()).map(str::to_owned),
        agent,
        route: super::optional(r.route.trim()).map(str::to_owned),
    };
    Ok((filter, page_request(r.page_size, &r.page_token)?))
}

/// The ledger filter of a `WatchApprovals` request, validated like `ListApprovals`' (the
/// engine refuses a status other than pending).
pub(crate) fn watch_filter(r: &pb::WatchApprovalsRequest) -> Result<ApprovalFilter, Status> {
    let as_list = pb::ListApprovalsRequest {
        status: r.status.clone(),
        route: r.route.clone(),
        session_id: r.session_id.clone(),
        agent_namespace: r.agent_namespace.clone(),
        agent_name: r.agent_name.clone(),
        page_size: 0,
        page_token: String::new(),
    };
    approval_filter(&as_list).map(|(filter, _)| filter)
}

/// One `WatchApprovals` message.
pub(crate) fn approval_change(change: ApprovalChange) -> pb::ApprovalChange {
    let (kind, approval) = match change {
        ApprovalChange::Opened(a) => (pb::ApprovalChangeKind::Opened, Some(approval(a, false))),
        ApprovalChange::Updated(a) => (pb::ApprovalChangeKind::Updated, Some(approval(a, false))),
        ApprovalChange::Decided(a) => (pb::ApprovalChangeKind::Decided, Some(approval(a, true))),
        ApprovalChange::CurrentEnd => (pb::ApprovalChangeKind::CurrentEnd, None),
    };
    pb::ApprovalChange {
        kind: kind.into(),
        approval,
    }
}

/// The vote a `DecideApprovalRequest` casts, by `actor` (already attributed to the request's
/// principal), restricted to the voter credential's `routes` (empty: any route).
pub(crate) fn vote(
    r: &pb::DecideApprovalRequest,
    actor: Attribution,
    routes: Vec<String>,
) -> Result<Vote, Status> {
    let resolution = resolution(&r.resolution)?;
    let decision = match (pb::ApprovalDecision::try_from(r.decision), resolution) {
        (Ok(pb::ApprovalDecision::Approve), _) => VoteDecision::Approve,
        (Ok(pb::ApprovalDecision::Reject), _) => VoteDecision::Reject,
        (Ok(pb::ApprovalDecision::Unspecified), Some(resolution)) => resolution.decision(),
        _ => {
            return Err(Status::invalid_argument(
                "decision must be APPROVE or REJECT (or unspecified with a resolution)",
            ));
        }
    };
    Ok(Vote {
        actor,
        routes,
        decision,
        comment: r.comment.clone(),
        comprehension_acknowledged: r.comprehension_acknowledged,
        edited_args: edited_args(&r.args)?,
        resolution,
        result: review_result(&r.result)?,
    })
}

/// An outcome review's resolution: empty for none, else `happened`, `resend` or `fail`.
pub(crate) fn resolution(text: &str) -> Result<Option<ReviewResolution>, Status> {
    match text.trim() {
        "" => Ok(None),
        r => r.parse::<ReviewResolution>().map(Some).map_err(|_| {
            Status::invalid_argument(format!(
                "resolution must be \"happened\", \"resend\" or \"fail\" (got {r:?})"
            ))
        }),
    }
}

/// The result an operator records with `happened`: empty for none, else any UTF-8 JSON.
pub(crate) fn review_result(bytes: &[u8]) -> Result<Option<Value>, Status> {
    json_document("result", bytes)
}

/// Replacement arguments: empty keeps the proposed ones; otherwise UTF-8 JSON (the engine's
/// vote rules want an object, on an approve).
pub(crate) fn edited_args(bytes: &[u8]) -> Result<Option<Value>, Status> {
    json_document("args", bytes)
}

// ---------------------------------------------------------------------------------------------
// Responses

/// The policy's name out of its `namespace/name@version` reference.
pub(crate) fn policy_name(policy_ref: Option<&str>) -> String {
    let Some(r) = policy_ref else {
        return String::new();
    };
    let without_version = r.split_once('@').map_or(r, |(n, _)| n);
    without_version
        .rsplit_once('/')
        .map_or(without_version, |(_, n)| n)
        .to_owned()
}

fn vote_pb(v: &ApprovalVote) -> pb::ApprovalVote {
    pb::ApprovalVote {
        decided_by: v.decided_by.clone(),
        decision: v.decision.to_string(),
        comment: v.comment.clone(),
        comprehension_acknowledged: v.comprehension_acknowledged,
        created_at: timestamp(v.created_at),
        verification: v
            .verification
            .map(|x| x.as_str().to_owned())
            .unwrap_or_default(),
        via: v.via.clone().unwrap_or_default(),
    }
}

/// The deciding voter's verification and relay (empty when not recorded).
fn decider(a: &Approval) -> (String, String) {
    a.deciding_vote().map_or_else(Default::default, |v| {
        (
            v.verification
                .map(|x| x.as_str().to_owned())
                .unwrap_or_default(),
            v.via.clone().unwrap_or_default(),
        )
    })
}

/// An approval on the wire; `with_votes` for GetApproval (ListApprovals leaves them out).
pub(crate) fn approval(a: Approval, with_votes: bool) -> pb::Approval {
    pb::Approval {
        id: a.id.to_string(),
        session_id: a.session_id.clone(),
        call_id: a.call_id.clone(),
        status: a.status.to_string(),
        route: a.route.clone(),
        reason: a.reason.clone(),
        tool: a.tool.clone(),
        version: a.tool_version.clone(),
        args: json_bytes(&a.args),
        authority_ref: a.authority_ref.clone(),
        policy_name: policy_name(a.policy_ref.as_deref()),
        policy_runtime: json_bytes(&Value::Object(a.policy_runtime.clone())),
        approvals_required: int32(a.approvals_required),
        approvals_received: int32(a.approvals_received),
        comprehension_required: a.comprehension_required,
        on_reject: a.on_reject.to_string(),
        on_modify: a.on_modify.to_string(),
        expires_at: optional_timestamp(a.expires_at),
        created_at: timestamp(a.created_at),
        decided_at: optional_timestamp(a.decided_at),
        decided_by: a.decided_by.clone().unwrap_or_default(),
        comment: a.comment.clone().unwrap_or_default(),
        votes: if with_votes {
            a.votes.iter().map(vote_pb).collect()
        } else {
            Vec::new()
        },
        agent_ref: a.agent.to_string(),
        agent_version_id: a.agent_version_id.to_string(),
        policy_ref: a.policy_ref.clone().unwrap_or_default(),
        call_hash: a.call_hash.clone(),
        effective_args: a
            .effective_args
            .as_ref()
            .map(json_bytes)
            .unwrap_or_default(),
        parent_approval_id: a
            .parent_approval_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        kind: a.kind.to_string(),
        resolution: a.resolution.map(|r| r.to_string()).unwrap_or_default(),
        decided_by_verification: decider(&a).0,
        decided_by_via: decider(&a).1,
        allow_self_approval: a.allow_self_approval,
    }
}

pub(crate) fn list_approvals_response(
    page: phrony_ledger::Page<Approval>,
) -> pb::ListApprovalsResponse {
    pb::ListApprovalsResponse {
        approvals: page.items.into_iter().map(|a| approval(a, false)).collect(),
        next_page_token: page.next_token.unwrap_or_default(),
    }
}

pub(crate) fn decide_response(answer: &VoteAnswer) -> pb::DecideApprovalResponse {
    pb::DecideApprovalResponse {
        status: answer.approval.status.to_string(),
        approvals_received: int32(answer.approval.approvals_received),
        session_status: answer.session_status.to_string(),
    }
}

/// An approval of the InspectSession timeline, with its votes.
/// An approval of an inspected timeline, its payload fields shortened by `bound`.
pub(crate) fn inspect_approval(
    a: &Approval,
    bound: &mut super::sessions::Shortener,
) -> pb::InspectApproval {
    pb::InspectApproval {
        id: a.id.to_string(),
        session_id: a.session_id.clone(),
        call_id: a.call_id.clone(),
        status: a.status.to_string(),
        route: a.route.clone(),
        reason: bound.text("reason", "reason", &a.reason),
        tool: a.tool.clone(),
        version: a.tool_version.clone(),
        args: Some(bound.value("args", "args", &a.args)),
        authority_ref: a.authority_ref.clone(),
        policy_name: policy_name(a.policy_ref.as_deref()),
        policy_runtime: Some(bound.value(
            "policy_runtime",
            "policy_runtime",
            &Value::Object(a.policy_runtime.clone()),
        )),
        approvals_required: int32(a.approvals_required),
        approvals_received: int32(a.approvals_received),
        comprehension_required: a.comprehension_required,
        on_reject: a.on_reject.to_string(),
        on_modify: a.on_modify.to_string(),
        expires_at: optional_timestamp(a.expires_at),
        created_at: timestamp(a.created_at),
        decided_at: optional_timestamp(a.decided_at),
        decided_by: a.decided_by.clone().unwrap_or_default(),
        comment: a
            .comment
            .as_deref()
            .map(|c| bound.text("comment", "comment", c))
            .unwrap_or_default(),
        votes: a
            .votes
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let field = format!("votes.{i}.comment");
                pb::ApprovalVote {
                    comment: bound.text(&field, &field, &v.comment),
                    ..vote_pb(v)
                }
            })
            .collect(),
        agent_ref: a.agent.to_string(),
        agent_version_id: a.agent_version_id.to_string(),
        policy_ref: a.policy_ref.clone().unwrap_or_default(),
        call_hash: a.call_hash.clone(),
        effective_args: a
            .effective_args
            .as_ref()
            .map(|v| bound.value("effective_args", "effective_args", v)),
        parent_approval_id: a
            .parent_approval_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        kind: a.kind.to_string(),
        resolution: a.resolution.map(|r| r.to_string()).unwrap_or_default(),
        decided_by_verification: decider(a).0,
        decided_by_via: decider(a).1,
        allow_self_approval: a.allow_self_approval,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn approval_ids_must_be_uuids() {
        let err = approval_id("nope").unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("approval_id must be a UUID"));
        assert_eq!(
            approval_id("").unwrap_err().message(),
            "approval_id is required"
        );
        let id = Uuid::new_v4();
        assert_eq!(approval_id(&id.to_string()).unwrap(), id);
    }

    #[test]
    fn decisions_and_args_are_checked() {
        let mut r = pb::DecideApprovalRequest::default();
        let err = vote(&r, "emad".into(), Vec::new()).unwrap_err();
        assert_eq!(
            err.message(),
            "decision must be APPROVE or REJECT (or unspecified with a resolution)"
        );
        r.decision = pb::ApprovalDecision::Approve as i32;
        r.args = b"{\"amount\": 300".to_vec();
        let err = vote(&r, "emad".into(), Vec::new()).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        r.args = b"{\"amount\": 300}".to_vec();
        let v = vote(&r, "emad".into(), Vec::new()).unwrap();
        assert_eq!(v.edited_args, Some(serde_json::json!({"amount": 300})));
        // Arguments that are no object, or come with a reject, are the engine's to refuse
        // (`Engine::vote`, one rule and one message for every surface).
        r.args = b"[1]".to_vec();
        assert_eq!(
            vote(&r, "emad".into(), Vec::new()).unwrap().edited_args,
            Some(serde_json::json!([1]))
        );
        r.args.clear();
        r.decision = pb::ApprovalDecision::Reject as i32;
        assert_eq!(
            vote(&r, "emad".into(), Vec::new()).unwrap().decision,
            VoteDecision::Reject
        );
    }

    #[test]
    fn policy_names_come_from_refs() {
        assert_eq!(
            policy_name(Some("payments/refund-hard-limit@1.0.0")),
            "refund-hard-limit"
        );
        assert_eq!(policy_name(None), "");
    }
}
