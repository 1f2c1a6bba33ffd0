//! The calls a session's timeline records and the decision the runtime took on each, read from
//! its events (`tool.requested`, then the first of `tool.policy_denied`, `approval.required`,
//! `tool.queued`/`tool.dispatched` or an `invalid_args` failure).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use phrony_client::{TimelineDetail, TimelineEntry};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a call was (or would be) decided: the engine's outcomes before anything runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// Dispatched without a human.
    Allow,
    /// Held for a human decision.
    RequireApproval,
    /// Denied by a policy.
    Deny,
    /// Refused before any policy: the arguments broke the tool's `input_schema`.
    InvalidArgs,
}

impl Kind {
    /// The name printed and sent in JSON.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::RequireApproval => "require_approval",
            Self::Deny => "deny",
            Self::InvalidArgs => "invalid_args",
        }
    }
}

/// A decision: its kind, the deciding policy (`namespace/name@version`) and, for an approval,
/// what people decided (`approved`, `denied`, …; `None` while pending).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Decided {
    /// The outcome.
    pub(crate) decision: Kind,
    /// The deciding policy, when one decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) policy: Option<String>,
    /// The approval's status, for a stored `require_approval`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) approval: Option<String>,
}

impl Decided {
    fn new(decision: Kind, policy: Option<String>) -> Self {
        Self {
            decision,
            policy,
            approval: None,
        }
    }
}

/// One call of a session as the runtime recorded it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredCall {
    /// The call id.
    pub(crate) call_id: String,
    /// The tool's dispatch ref (`payments.issue-refund`).
    pub(crate) tool: String,
    /// The tool version.
    pub(crate) version: String,
    /// The name the model called it by (the binding's wire name).
    pub(crate) wire: String,
    /// The arguments the model sent (what the policies decided on).
    pub(crate) args: Value,
    /// When it was decided (`None` while undecided).
    pub(crate) decided_at: Option<DateTime<Utc>>,
    /// The decision (`None`: never decided, e.g. cancelled before).
    pub(crate) decision: Option<Decided>,
}

/// What the call's events carry, as far as a replay reads them.
#[derive(Deserialize)]
struct Requested {
    call_id: String,
    tool: String,
    version: String,
    #[serde(default)]
    wire_name: Option<String>,
    #[serde(default)]
    args: Value,
}

#[derive(Deserialize)]
struct CallOnly {
    call_id: String,
}

#[derive(Deserialize)]
struct Denied {
    call_id: String,
    #[serde(default)]
    policy_ref: Option<String>,
}

#[derive(Deserialize)]
struct ApprovalOpened {
    approval_id: String,
    call_id: String,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    policy_ref: Option<String>,
    #[serde(default)]
    parent_approval_id: Option<String>,
}

#[derive(Deserialize)]
struct ApprovalClosed {
    approval_id: String,
    #[serde(default)]
    status: Option<String>,
}

#[derive(Deserialize)]
struct Completed {
    call_id: String,
    #[serde(default)]
    error_code: Option<String>,
}

#[derive(Deserialize)]
struct Principal {
    claims: Value,
}

/// The error code of a call refused for arguments that break the input schema.
const INVALID_ARGS: &str = "invalid_args";

/// The calls of `session_id` and the principal's claims the session ran for, from its timeline
/// (entries of delegated child sessions are left out: they are another agent's calls).
///
/// # Errors
/// An event whose payload does not have the shape its type says, naming it.
pub(crate) fn read_calls(
    session_id: &str,
    timeline: &[TimelineEntry],
) -> anyhow::Result<(Vec<StoredCall>, Option<Value>)> {
    let mut calls: Vec<StoredCall> = Vec::new();
    let mut by_call: HashMap<String, usize> = HashMap::new();
    let mut by_approval: HashMap<String, usize> = HashMap::new();
    let mut principal = None;
    for entry in timeline {
        let TimelineDetail::Event(event) = &entry.detail else {
            continue;
        };
        if event.session_id != session_id {
            continue;
        }
        let payload = &event.payload;
        let shape = |err: serde_json::Error| {
            anyhow::anyhow!(
                "session {session_id}: event {} ({}) has an unexpected payload: {err}",
                event.seq,
                event.event_type
            )
        };
        let mut decide = |call_id: &str, decided: Decided| -> Option<usize> {
            let index = *by_call.get(call_id)?;
            let call = &mut calls[index];
            if call.decision.is_some() {
                return None;
            }
            call.decision = Some(decided);
            call.decided_at = entry.timestamp;
            Some(index)
        };
        match event.event_type.as_str() {
            "session.principal" => {
                let p: Principal = serde_json::from_value(payload.clone()).map_err(shape)?;
                principal = Some(p.claims);
            }
            "tool.requested" => {
                let r: Requested = serde_json::from_value(payload.clone()).map_err(shape)?;
                by_call.insert(r.call_id.clone(), calls.len());
                calls.push(StoredCall {
                    wire: r.wire_name.unwrap_or_else(|| r.tool.clone()),
                    call_id: r.call_id,
                    tool: r.tool,
                    version: r.version,
                    args: r.args,
                    decided_at: None,
                    decision: None,
                });
            }
            "tool.policy_denied" => {
                let d: Denied = serde_json::from_value(payload.clone()).map_err(shape)?;
                decide(&d.call_id, Decided::new(Kind::Deny, d.policy_ref));
            }
            "approval.required" => {
                let a: ApprovalOpened = serde_json::from_value(payload.clone()).map_err(shape)?;
                let policy_approval = a.kind.as_deref().is_none_or(|k| k == "policy");
                if policy_approval && a.parent_approval_id.is_none() {
                    let decided = Decided::new(Kind::RequireApproval, a.policy_ref);
                    if let Some(index) = decide(&a.call_id, decided) {
                        by_approval.insert(a.approval_id, index);
                    }
                }
            }
            "approval.decided" | "approval.escalated" => {
                let a: ApprovalClosed = serde_json::from_value(payload.clone()).map_err(shape)?;
                if let Some(&index) = by_approval.get(&a.approval_id)
                    && let Some(decided) = &mut calls[index].decision
                {
                    let status = match event.event_type.as_str() {
                        "approval.escalated" => "escalated".to_owned(),
                        _ => a.status.unwrap_or_else(|| "decided".to_owned()),
                    };
                    decided.approval = Some(status);
                }
            }
            "tool.queued" | "tool.dispatched" => {
                let c: CallOnly = serde_json::from_value(payload.clone()).map_err(shape)?;
                decide(&c.call_id, Decided::new(Kind::Allow, None));
            }
            "tool.completed" => {
                let c: Completed = serde_json::from_value(payload.clone()).map_err(shape)?;
                if c.error_code.as_deref() == Some(INVALID_ARGS) {
                    decide(&c.call_id, Decided::new(Kind::InvalidArgs, None));
                }
            }
            _ => {}
        }
    }
    Ok((calls, principal))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use phrony_client::SessionEvent;
    use serde_json::json;

    use super::*;

    fn event(session: &str, seq: i32, event_type: &str, payload: Value) -> TimelineEntry {
        TimelineEntry {
            timestamp: DateTime::from_timestamp(1_700_000_000 + i64::from(seq), 0),
            gap_ms: 0,
            source: "event".into(),
            kind: event_type.into(),
            summary: String::new(),
            session_id: session.into(),
            depth: 0,
            seq,
            detail: TimelineDetail::Event(SessionEvent {
                id: i64::from(seq),
                event_type: event_type.into(),
                payload,
                seq,
                session_id: session.into(),
                turn: 1,
                call_id: None,
                actor: "system".into(),
                actor_verification: None,
                actor_via: None,
            }),
            truncated: Vec::new(),
        }
    }

    fn requested(seq: i32, call: &str, amount: u32) -> TimelineEntry {
        event(
            "run_1",
            seq,
            "tool.requested",
            json!({"call_id": call, "tool": "payments.issue-refund", "version": "1.0.0",
                   "wire_name": "issue_refund", "args": {"amount": amount}}),
        )
    }

    #[test]
    fn each_call_gets_its_first_decision_and_the_approval_outcome() {
        let timeline = vec![
            event(
                "run_1",
                1,
                "session.principal",
                json!({"claims": {"sub": "u1"}}),
            ),
            requested(2, "c1", 100),
            requested(3, "c2", 300),
            requested(4, "c3", 9000),
            requested(5, "c4", 0),
            requested(6, "c5", 1),
            event(
                "run_1",
                7,
                "tool.queued",
                json!({"call_id": "c1", "from": "pending"}),
            ),
            event("run_1", 8, "tool.dispatched", json!({"call_id": "c1"})),
            event(
                "run_1",
                9,
                "approval.required",
                json!({"approval_id": "a1", "call_id": "c2", "policy_ref": "p/boundary@1.0.0"}),
            ),
            event(
                "run_1",
                10,
                "tool.policy_denied",
                json!({"call_id": "c3", "reason": "no", "policy_ref": "p/limit@1.0.0"}),
            ),
            event(
                "run_1",
                11,
                "tool.completed",
                json!({"call_id": "c4", "status": "failed", "error_code": "invalid_args"}),
            ),
            event(
                "run_1",
                12,
                "approval.decided",
                json!({"approval_id": "a1", "call_id": "c2", "status": "approved"}),
            ),
            // The approved call is queued afterwards: still an approval, not an allow.
            event(
                "run_1",
                13,
                "tool.queued",
                json!({"call_id": "c2", "from": "awaiting_approval"}),
            ),
            // A child session's call is another agent's.
            event(
                "run_child",
                1,
                "tool.requested",
                json!({"call_id": "x", "tool": "t", "version": "1", "args": {}}),
            ),
        ];
        let (calls, principal) = read_calls("run_1", &timeline).unwrap();
        assert_eq!(principal, Some(json!({"sub": "u1"})));
        let decided: Vec<(&str, Option<&Decided>)> = calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.decision.as_ref()))
            .collect();
        assert_eq!(
            decided,
            vec![
                ("c1", Some(&Decided::new(Kind::Allow, None))),
                (
                    "c2",
                    Some(&Decided {
                        decision: Kind::RequireApproval,
                        policy: Some("p/boundary@1.0.0".into()),
                        approval: Some("approved".into()),
                    })
                ),
                (
                    "c3",
                    Some(&Decided::new(Kind::Deny, Some("p/limit@1.0.0".into())))
                ),
                ("c4", Some(&Decided::new(Kind::InvalidArgs, None))),
                ("c5", None),
            ]
        );
        assert_eq!(calls[0].wire, "issue_refund");
        assert_eq!(
            calls[1].decided_at,
            DateTime::from_timestamp(1_700_000_009, 0)
        );
        assert_eq!(calls[4].decided_at, None);
    }

    #[test]
    fn an_outcome_review_or_an_escalation_is_not_the_calls_decision() {
        let timeline = vec![
            requested(1, "c1", 100),
            event("run_1", 2, "tool.dispatched", json!({"call_id": "c1"})),
            event(
                "run_1",
                3,
                "approval.required",
                json!({"approval_id": "r1", "call_id": "c1", "kind": "outcome_review"}),
            ),
            requested(4, "c2", 100),
            event(
                "run_1",
                5,
                "approval.required",
                json!({"approval_id": "e1", "call_id": "c2", "policy_ref": "p/x@1",
                       "parent_approval_id": "a0"}),
            ),
        ];
        let (calls, _) = read_calls("run_1", &timeline).unwrap();
        assert_eq!(calls[0].decision, Some(Decided::new(Kind::Allow, None)));
        assert_eq!(calls[1].decision, None);
    }

    #[test]
    fn a_malformed_payload_is_an_error_naming_the_event() {
        let timeline = vec![event("run_1", 4, "tool.requested", json!({"call_id": 7}))];
        let err = read_calls("run_1", &timeline).unwrap_err().to_string();
        assert!(
            err.starts_with("session run_1: event 4 (tool.requested) has an unexpected payload"),
            "{err}"
        );
    }
}
