//! The refund tutorial's two policies, shared by the `decisions` and `cedar` benches (each
//! includes this file with `#[path]`).

use phrony_policy::{PolicyDef, PolicySet};
use serde_json::json;

/// `refund-approval-boundary` (approval above 250) and `refund-hard-limit` (deny above 5000),
/// both scoped to `tool:payments.issue-refund`.
pub(crate) fn policies() -> PolicySet {
    let defs: Vec<PolicyDef> = serde_json::from_value(json!([
        {"namespace": "payments", "name": "refund-approval-boundary", "version": "1.0.0",
         "scope": "tool:payments.issue-refund", "action": "require_approval",
         "conditions": {"field": "amount", "op": "gt", "value": 250},
         "approvals_required": 1, "reason": "Refund amount above delegated limit.",
         "on_reject": "return_to_agent"},
        {"namespace": "payments", "name": "refund-hard-limit", "version": "1.0.0",
         "scope": "tool:payments.issue-refund", "action": "deny",
         "conditions": {"field": "amount", "op": "gt", "value": 5000},
         "reason": "Refund amount exceeds the absolute ceiling for agent-initiated refunds."}
    ]))
    .expect("refund policies");
    PolicySet::compile(defs).expect("refund policies compile")
}
