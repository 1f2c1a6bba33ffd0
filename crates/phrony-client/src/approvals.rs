//! Approvals: held tool calls waiting for a human (`GetApproval`, `ListApprovals`) and the votes
//! that decide them (`DecideApproval`).

use chrono::{DateTime, Utc};
use phrony_proto::runtime::v1 as pb;
use serde_json::Value;

use super::sessions::{json_bytes, json_value};
use super::types::{optional, optional_timestamp, page_size};
use super::{AgentName, Client, ClientError, with_actor};

/// One vote on an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote {
    /// The voter.
    pub decided_by: String,
    /// `approved` or `denied`.
    pub decision: String,
    /// The voter's comment.
    pub comment: Option<String>,
    /// Whether the voter acknowledged understanding the call.
    pub comprehension_acknowledged: bool,
    /// When the vote was cast.
    pub created_at: Option<DateTime<Utc>>,
    /// How the runtime established the voter (`unverified`, `token`, `oidc`, `mtls`); `None`
    /// when not recorded (older votes and servers).
    pub verification: Option<String>,
    /// The principal that relayed the vote, if any.
    pub via: Option<String>,
}

impl Vote {
    /// The voter as a person reads it: `emad (unverified)`, `alice via approvals-ui`, `ops-bot`
    /// ([`display_actor`]).
    #[must_use]
    pub fn voter_display(&self) -> String {
        display_actor(
            &self.decided_by,
            self.verification.as_deref(),
            self.via.as_deref(),
        )
    }
}

/// How a recorded actor reads to a person: the bare name when no verification was recorded
/// (the runtime's own actors, older records and servers), `name (unverified)` when nobody
/// verified it, and `name via relay` when a relay acted for it. An unknown verification reads
/// as unverified (the display never claims more than the record).
#[must_use]
pub fn display_actor(actor: &str, verification: Option<&str>, via: Option<&str>) -> String {
    let Some(verification) = verification.filter(|v| !v.is_empty()) else {
        return actor.to_owned();
    };
    phrony_auth::Attribution {
        actor: actor.to_owned(),
        verification: phrony_auth::Verification::parse(verification)
            .unwrap_or(phrony_auth::Verification::Unverified),
        via: via.filter(|v| !v.is_empty()).map(str::to_owned),
    }
    .to_string()
}

/// A request for a human decision on one held tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct Approval {
    /// The approval id.
    pub id: String,
    /// What it asks: `policy`, or `outcome_review` (the call's outcome is unknown: did it
    /// happen?). Servers that predate kinds send nothing, read as `policy`.
    pub kind: String,
    /// How a decided outcome review was resolved: `happened`, `resend` or `fail`.
    pub resolution: Option<String>,
    /// `pending`, `approved`, `denied`, `escalated` or `cancelled`.
    pub status: String,
    /// The waiting session.
    pub session_id: String,
    /// The held call.
    pub call_id: String,
    /// The agent version the session runs, `namespace/name@version`.
    pub agent_ref: Option<String>,
    /// Its id.
    pub agent_version_id: Option<String>,
    /// The tool's dispatch ref.
    pub tool: String,
    /// The tool version.
    pub version: String,
    /// The proposed arguments.
    pub args: Value,
    /// The arguments approve votes fixed (an approver's edit).
    pub effective_args: Option<Value>,
    /// Who is expected to decide (informational).
    pub route: Option<String>,
    /// Why the call needs approval.
    pub reason: Option<String>,
    /// The deciding policy, `namespace/name@version`.
    pub policy_ref: Option<String>,
    /// The deciding policy's name.
    pub policy_name: Option<String>,
    /// The policy's runtime settings.
    pub policy_runtime: Value,
    /// The authority the call acts under.
    pub authority_ref: Option<String>,
    /// Distinct approve votes needed.
    pub approvals_required: i32,
    /// Approve votes received so far.
    pub approvals_received: i32,
    /// Whether voters must acknowledge they understood the call.
    pub comprehension_required: bool,
    /// What a rejection does: `return_to_agent` or `fail`.
    pub on_reject: Option<String>,
    /// What an approval with edited arguments does.
    pub on_modify: Option<String>,
    /// Hex SHA-256 of the exact call approved.
    pub call_hash: Option<String>,
    /// The approval this one escalates.
    pub parent_approval_id: Option<String>,
    /// When it was opened.
    pub created_at: Option<DateTime<Utc>>,
    /// When it expires.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was decided.
    pub decided_at: Option<DateTime<Utc>>,
    /// Who decided it.
    pub decided_by: Option<String>,
    /// How the runtime established `decided_by` (the deciding voter's verification).
    pub decided_by_verification: Option<String>,
    /// The principal that relayed the deciding vote.
    pub decided_by_via: Option<String>,
    /// The policy opted out of separation of duties (`allow_self_approval: true`).
    pub allow_self_approval: bool,
    /// The deciding comment.
    pub comment: Option<String>,
    /// The votes cast ([`Client::get_approval`] only).
    pub votes: Vec<Vote>,
}

/// [`Approval::kind`] of an outcome review.
pub const OUTCOME_REVIEW: &str = "outcome_review";

impl Approval {
    /// Whether this is an outcome review ("did this call already happen?"), which is resolved
    /// with `happened`, `resend` or `fail` rather than approved.
    #[must_use]
    pub fn is_outcome_review(&self) -> bool {
        self.kind == OUTCOME_REVIEW
    }

    /// [`Approval::decided_by`] as a person reads it ([`display_actor`]).
    #[must_use]
    pub fn decided_by_display(&self) -> Option<String> {
        self.decided_by.as_deref().map(|by| {
            display_actor(
                by,
                self.decided_by_verification.as_deref(),
                self.decided_by_via.as_deref(),
            )
        })
    }
}

/// Which approvals [`Client::list_approvals`] returns; every set filter is an exact match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApprovalFilter {
    /// Status, e.g. `pending`.
    pub status: Option<String>,
    /// Route.
    pub route: Option<String>,
    /// Session.
    pub session_id: Option<String>,
    /// Agent.
    pub agent: Option<AgentName>,
    /// At most this many (`None`: the runtime's default).
    pub limit: Option<u32>,
    /// The `next_page_token` of a previous page with the same filters.
    pub page_token: Option<String>,
}

/// One page of [`Client::list_approvals`], newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalPage {
    /// The approvals (without votes).
    pub approvals: Vec<Approval>,
    /// Pass as [`ApprovalFilter::page_token`] for the next page; `None` on the last one.
    pub next_page_token: Option<String>,
}

/// A reviewer's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Vote to approve.
    Approve,
    /// Vote to reject (a single reject denies the approval).
    Reject,
}

/// One vote for [`Client::decide_approval`].
#[derive(Debug, Clone, PartialEq)]
pub struct DecideApproval {
    /// The approval.
    pub approval_id: String,
    /// Approve or reject.
    pub decision: Decision,
    /// The voter's comment.
    pub comment: Option<String>,
    /// Replacement arguments for an approve.
    pub args: Option<Value>,
    /// The voter acknowledges understanding the call.
    pub comprehension_acknowledged: bool,
    /// The resolution of an outcome review: `happened`, `resend` or `fail` (`decision` must
    /// agree: approve for happened/resend, reject for fail).
    pub resolution: Option<String>,
    /// With `happened`: the call's result as the operator knows it.
    pub result: Option<Value>,
}

/// What a vote did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionOutcome {
    /// The approval's status after the vote: `pending`, `approved` or `denied`.
    pub status: String,
    /// Approve votes received so far.
    pub approvals_received: i32,
    /// The session's status after the decision was applied.
    pub session_status: String,
}

/// What happened in one [`ApprovalWatch`] change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalChangeKind {
    /// A pending approval: in the current set (before [`ApprovalChangeKind::CurrentEnd`]) or
    /// newly opened.
    Opened,
    /// A pending approval changed without being decided (a vote of a quorum).
    Updated,
    /// The approval left the pending set; its status says how.
    Decided,
    /// Every approval pending when the watch started has been sent.
    CurrentEnd,
}

impl ApprovalChangeKind {
    /// `opened`, `updated`, `decided` or `current_end`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Opened => "opened",
            Self::Updated => "updated",
            Self::Decided => "decided",
            Self::CurrentEnd => "current_end",
        }
    }
}

/// One change of [`Client::watch_approvals`].
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalChange {
    /// What happened.
    pub kind: ApprovalChangeKind,
    /// The approval (with its votes when decided); `None` for
    /// [`ApprovalChangeKind::CurrentEnd`].
    pub approval: Option<Approval>,
}

/// The changes of a `WatchApprovals` call, read as they arrive.
#[derive(Debug)]
pub struct ApprovalWatch {
    stream: tonic::Streaming<pb::ApprovalChange>,
    client: Client,
}

impl ApprovalWatch {
    /// The next change, or `None` when the runtime ended the watch.
    ///
    /// # Errors
    /// Any [`ClientError`] the stream ends with (`ResourceExhausted` for a watcher that did not
    /// read), or a change the client cannot read.
    pub async fn next(&mut self) -> Result<Option<ApprovalChange>, ClientError> {
        let Some(message) = self
            .stream
            .message()
            .await
            .map_err(|s| self.client.status(&s))?
        else {
            return Ok(None);
        };
        let kind = match pb::ApprovalChangeKind::try_from(message.kind) {
            Ok(pb::ApprovalChangeKind::Opened) => ApprovalChangeKind::Opened,
            Ok(pb::ApprovalChangeKind::Updated) => ApprovalChangeKind::Updated,
            Ok(pb::ApprovalChangeKind::Decided) => ApprovalChangeKind::Decided,
            Ok(pb::ApprovalChangeKind::CurrentEnd) => ApprovalChangeKind::CurrentEnd,
            _ => {
                return Err(ClientError::InvalidResponse {
                    rpc: "WatchApprovals",
                    reason: format!("unknown change kind {}", message.kind),
                });
            }
        };
        let approval = match message.approval {
            Some(a) => Some(approval("WatchApprovals", a)?),
            None if kind == ApprovalChangeKind::CurrentEnd => None,
            None => {
                return Err(ClientError::InvalidResponse {
                    rpc: "WatchApprovals",
                    reason: format!("a {} change without its approval", kind.as_str()),
                });
            }
        };
        Ok(Some(ApprovalChange { kind, approval }))
    }
}

impl Client {
    /// Watches the pending approvals matching `filter` (`WatchApprovals`; `limit` and
    /// `page_token` are ignored, `status` must be unset or `pending`): each one pending now,
    /// then [`ApprovalChangeKind::CurrentEnd`], then the changes as they happen.
    ///
    /// # Errors
    /// `InvalidArgument` for bad filters, `ResourceExhausted` when the runtime has too many
    /// watchers; any other [`ClientError`].
    pub async fn watch_approvals(
        &self,
        filter: &ApprovalFilter,
    ) -> Result<ApprovalWatch, ClientError> {
        let agent = filter.agent.as_ref();
        let request = pb::WatchApprovalsRequest {
            status: filter.status.clone().unwrap_or_default(),
            route: filter.route.clone().unwrap_or_default(),
            session_id: filter.session_id.clone().unwrap_or_default(),
            agent_namespace: agent.map(|a| a.namespace.clone()).unwrap_or_default(),
            agent_name: agent.map(|a| a.name.clone()).unwrap_or_default(),
        };
        let stream = self
            .runtime
            .clone()
            .watch_approvals(request)
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok(ApprovalWatch {
            stream,
            client: self.clone(),
        })
    }

    /// One approval with its votes (`GetApproval`).
    ///
    /// # Errors
    /// `NotFound` for an unknown approval; any other [`ClientError`].
    pub async fn get_approval(&self, approval_id: &str) -> Result<Approval, ClientError> {
        let request = pb::GetApprovalRequest {
            approval_id: approval_id.to_owned(),
        };
        let response = self
            .runtime
            .clone()
            .get_approval(request)
            .await
            .map_err(|s| self.status(&s))?;
        approval("GetApproval", response.into_inner())
    }

    /// One page of approvals matching `filter`, newest first (`ListApprovals`).
    ///
    /// # Errors
    /// `InvalidArgument` for a bad page token; any other [`ClientError`].
    pub async fn list_approvals(
        &self,
        filter: &ApprovalFilter,
    ) -> Result<ApprovalPage, ClientError> {
        let request = pb::ListApprovalsRequest {
            status: filter.status.clone().unwrap_or_default(),
            route: filter.route.clone().unwrap_or_default(),
            session_id: filter.session_id.clone().unwrap_or_default(),
            agent_namespace: filter
                .agent
                .as_ref()
                .map(|a| a.namespace.clone())
                .unwrap_or_default(),
            agent_name: filter
                .agent
                .as_ref()
                .map(|a| a.name.clone())
                .unwrap_or_default(),
            page_size: page_size(filter.limit),
            page_token: filter.page_token.clone().unwrap_or_default(),
        };
        let response = self
            .runtime
            .clone()
            .list_approvals(request)
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok(ApprovalPage {
            approvals: response
                .approvals
                .into_iter()
                .map(|a| approval("ListApprovals", a))
                .collect::<Result<_, _>>()?,
            next_page_token: optional(response.next_page_token),
        })
    }

    /// Records `actor`'s vote on a pending approval (`DecideApproval`).
    ///
    /// # Errors
    /// `NotFound` for an unknown approval, `InvalidArgument` when comprehension must be
    /// acknowledged or the arguments are refused, `FailedPrecondition` when the actor already
    /// voted; any other [`ClientError`].
    pub async fn decide_approval(
        &self,
        vote: &DecideApproval,
        actor: &str,
    ) -> Result<DecisionOutcome, ClientError> {
        let request = pb::DecideApprovalRequest {
            approval_id: vote.approval_id.clone(),
            decision: match vote.decision {
                Decision::Approve => pb::ApprovalDecision::Approve,
                Decision::Reject => pb::ApprovalDecision::Reject,
            }
            .into(),
            comment: vote.comment.clone().unwrap_or_default(),
            args: vote
                .args
                .as_ref()
                .map(|v| v.to_string().into_bytes())
                .unwrap_or_default(),
            comprehension_acknowledged: vote.comprehension_acknowledged,
            actor: actor.to_owned(),
            resolution: vote.resolution.clone().unwrap_or_default(),
            result: vote
                .result
                .as_ref()
                .map(|v| v.to_string().into_bytes())
                .unwrap_or_default(),
        };
        let response = self
            .runtime
            .clone()
            .decide_approval(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok(DecisionOutcome {
            status: response.status,
            approvals_received: response.approvals_received,
            session_status: response.session_status,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Wire → client values

fn votes(rpc: &'static str, votes: Vec<pb::ApprovalVote>) -> Result<Vec<Vote>, ClientError> {
    votes
        .into_iter()
        .map(|v| {
            Ok(Vote {
                created_at: optional_timestamp(rpc, "vote created_at", &v.created_at)?,
                decided_by: v.decided_by,
                decision: v.decision,
                comment: optional(v.comment),
                comprehension_acknowledged: v.comprehension_acknowledged,
                verification: optional(v.verification),
                via: optional(v.via),
            })
        })
        .collect()
}

/// The fields `pb::Approval` and `pb::InspectApproval` share, converted the same way; only the
/// JSON fields differ (UTF-8 bytes vs `google.protobuf.Value`), so the caller decodes those.
macro_rules! approval_from {
    (
        $rpc:expr, $prefix:literal, $a:ident,
        args: $args:expr, effective_args: $effective:expr, policy_runtime: $runtime:expr $(,)?
    ) => {
        Approval {
            args: $args,
            effective_args: $effective,
            policy_runtime: $runtime,
            created_at: optional_timestamp($rpc, concat!($prefix, "created_at"), &$a.created_at)?,
            expires_at: optional_timestamp($rpc, concat!($prefix, "expires_at"), &$a.expires_at)?,
            decided_at: optional_timestamp($rpc, concat!($prefix, "decided_at"), &$a.decided_at)?,
            votes: votes($rpc, $a.votes)?,
            id: $a.id,
            kind: if $a.kind.is_empty() {
                "policy".to_owned()
            } else {
                $a.kind
            },
            resolution: optional($a.resolution),
            status: $a.status,
            session_id: $a.session_id,
            call_id: $a.call_id,
            agent_ref: optional($a.agent_ref),
            agent_version_id: optional($a.agent_version_id),
            tool: $a.tool,
            version: $a.version,
            route: optional($a.route),
            reason: optional($a.reason),
            policy_ref: optional($a.policy_ref),
            policy_name: optional($a.policy_name),
            authority_ref: optional($a.authority_ref),
            approvals_required: $a.approvals_required,
            approvals_received: $a.approvals_received,
            comprehension_required: $a.comprehension_required,
            on_reject: optional($a.on_reject),
            on_modify: optional($a.on_modify),
            call_hash: optional($a.call_hash),
            parent_approval_id: optional($a.parent_approval_id),
            decided_by: optional($a.decided_by),
            decided_by_verification: optional($a.decided_by_verification),
            decided_by_via: optional($a.decided_by_via),
            allow_self_approval: $a.allow_self_approval,
            comment: optional($a.comment),
        }
    };
}

pub(super) fn approval(rpc: &'static str, a: pb::Approval) -> Result<Approval, ClientError> {
    Ok(approval_from!(rpc, "", a,
        args: json_bytes(rpc, "args", &a.args)?,
        effective_args: match json_bytes(rpc, "effective_args", &a.effective_args)? {
            Value::Null => None,
            v => Some(v),
        },
        policy_runtime: json_bytes(rpc, "policy_runtime", &a.policy_runtime)?,
    ))
}

/// The approval of an `InspectSession` timeline entry (JSON fields already decoded).
pub(super) fn approval_from_inspect(a: pb::InspectApproval) -> Result<Approval, ClientError> {
    Ok(approval_from!("InspectSession", "approval ", a,
        args: json_value(a.args),
        effective_args: a.effective_args.map(|v| json_value(Some(v))),
        policy_runtime: json_value(a.policy_runtime),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use serde_json::json;

    use super::*;

    #[test]
    fn approvals_decode_json_fields_and_unset_strings() {
        let a = approval(
            "GetApproval",
            pb::Approval {
                id: "ap-1".into(),
                status: "approved".into(),
                args: br#"{"order_id":"ORD-1","amount":400}"#.to_vec(),
                effective_args: Vec::new(),
                policy_ref: "payments/refund-approval-boundary@1.0.0".into(),
                agent_ref: "support/refund-agent@0.1.0".into(),
                approvals_required: 1,
                approvals_received: 1,
                votes: vec![pb::ApprovalVote {
                    decided_by: "emad".into(),
                    decision: "approved".into(),
                    comment: "ok".into(),
                    comprehension_acknowledged: false,
                    created_at: "2025-01-31T09:30:00Z".into(),
                    verification: "token".into(),
                    via: "approvals-ui".into(),
                }],
                decided_by: "emad".into(),
                decided_by_verification: "unverified".into(),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(a.votes[0].voter_display(), "emad via approvals-ui");
        assert_eq!(a.decided_by.as_deref(), Some("emad"));
        assert_eq!(a.decided_by_display().as_deref(), Some("emad (unverified)"));
        assert_eq!(display_actor("system", None, None), "system");
        assert_eq!(display_actor("emad", Some(""), None), "emad");
        assert_eq!(
            display_actor("emad", Some("bogus"), None),
            "emad (unverified)"
        );
        assert_eq!(a.args, json!({"order_id": "ORD-1", "amount": 400}));
        assert_eq!(a.effective_args, None);
        assert_eq!(a.route, None);
        assert_eq!(a.policy_runtime, Value::Null);
        assert_eq!(a.votes[0].decided_by, "emad");
        assert_eq!(a.votes[0].comment.as_deref(), Some("ok"));
        assert_eq!(
            a.policy_ref.as_deref(),
            Some("payments/refund-approval-boundary@1.0.0")
        );
    }

    #[test]
    fn inspect_approvals_decode_values_and_name_their_fields() {
        use prost_types::value::Kind;
        let a = approval_from_inspect(pb::InspectApproval {
            id: "ap-1".into(),
            args: Some(prost_types::Value {
                kind: Some(Kind::NumberValue(400.0)),
            }),
            route: "finance".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(a.args, json!(400));
        assert_eq!(a.effective_args, None);
        assert_eq!(a.policy_runtime, Value::Null);
        assert_eq!(a.route.as_deref(), Some("finance"));
        assert_eq!(a.reason, None);
        let err = approval_from_inspect(pb::InspectApproval {
            decided_at: "later".into(),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("unexpected InspectSession response"),
            "{err}"
        );
        assert!(err.contains("approval decided_at \"later\""), "{err}");
    }

    #[test]
    fn arguments_that_are_not_json_are_an_invalid_response() {
        let err = approval(
            "ListApprovals",
            pb::Approval {
                args: b"{oops".to_vec(),
                ..Default::default()
            },
        )
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("unexpected ListApprovals response"),
            "{shown}"
        );
        assert!(shown.contains("args is not JSON"), "{shown}");
    }
}
