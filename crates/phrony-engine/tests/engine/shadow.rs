//! `mode: shadow` policies in the engine: evaluated on every decided call and recorded
//! (`policy.shadow`) when they would have changed the decision, never enforced.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use crate::common::*;
use phrony_ledger::{PolicyVerdict, SessionStatus, ShadowDecision, ShadowDecisionFilter};

/// A shadow Policy document on the refund tool.
fn shadow_policy(name: &str, body: &str) -> (String, String) {
    (
        format!("{name}.yaml"),
        format!(
            "apiVersion: phrony.com/v1
kind: Policy
metadata:
  name: {name}
  namespace: payments
  version: 2.0.0
spec:
  mode: shadow
  scope: tool:payments.issue-refund
{body}"
        ),
    )
}

async fn recorded(h: &Harness, name: &str) -> Vec<ShadowDecision> {
    h.store
        .ledger()
        .shadow_decisions(&ShadowDecisionFilter {
            namespace: "payments".to_owned(),
            name: name.to_owned(),
            since: None,
            limit: 100,
        })
        .await
        .unwrap()
}

/// Runs one €100 refund (below the enforced approval boundary of €250) to its end and returns
/// the harness, the session id and the call ids the worker received.
async fn run_refund(policies: Vec<(String, String)>) -> (Harness, String, Vec<String>) {
    let opts = AgentOptions {
        extra_policies: policies,
        ..AgentOptions::default()
    };
    let h = Harness::memory(
        &opts,
        vec![
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Refunded."),
        ],
    )
    .await;
    let s = h.start("Refund €100 for ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    let sent = h
        .worker
        .invoked("payments.issue-refund")
        .into_iter()
        .map(|i| i.call_id)
        .collect();
    let id = s.id.clone();
    (h, id, sent)
}

#[tokio::test]
async fn a_shadow_deny_is_recorded_and_the_allowed_call_still_runs() {
    let (h, session, sent) = run_refund(vec![shadow_policy(
        "no-refunds-over-50",
        "  conditions:
    field: amount
    op: gt
    value: 50
  decision:
    type: deny
    reason: Refunds over 50 need a manager.
",
    )])
    .await;
    assert_eq!(sent.len(), 1, "the call ran once");
    let decisions = recorded(&h, "no-refunds-over-50").await;
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    let d = &decisions[0].decision;
    assert_eq!(d.session_id, session);
    assert_eq!(d.call_id, sent[0]);
    assert_eq!(d.tool, "payments.issue-refund");
    assert_eq!(d.agent, "support/refund-agent@0.1.0");
    assert_eq!(d.enforced, PolicyVerdict::Allow);
    assert_eq!(d.enforced_policy, None);
    assert_eq!(d.shadow, PolicyVerdict::Deny);
    assert_eq!(d.policy, "payments/no-refunds-over-50@2.0.0");
    assert_eq!(d.reason.as_deref(), Some("Refunds over 50 need a manager."));
    assert_eq!(d.args_digest.len(), 64);
    // The session's own log has no trace of it: the call was requested, queued, dispatched.
    let types = h.event_types(&session).await;
    assert!(!types.iter().any(|t| t.contains("denied")), "{types:?}");
}

#[tokio::test]
async fn a_shadow_approval_opens_no_approval() {
    let (h, session, sent) = run_refund(vec![shadow_policy(
        "review-over-50",
        "  conditions:
    field: amount
    op: gt
    value: 50
  decision:
    type: require_approval
    approvals_required: 2
",
    )])
    .await;
    assert_eq!(sent.len(), 1);
    assert!(
        h.store
            .session_approvals(&session)
            .await
            .unwrap()
            .is_empty(),
        "a shadow approval holds nothing"
    );
    let decisions = recorded(&h, "review-over-50").await;
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].decision.enforced, PolicyVerdict::Allow);
    assert_eq!(decisions[0].decision.shadow, PolicyVerdict::RequireApproval);
}

#[tokio::test]
async fn a_shadow_policy_that_changes_nothing_records_nothing() {
    let (h, _, sent) = run_refund(vec![
        shadow_policy(
            "euro-only",
            "  allow: [EUR]
  allow_field: currency
  decision:
    type: allow
",
        ),
        shadow_policy(
            "no-huge-refunds",
            "  conditions:
    field: amount
    op: gt
    value: 10000
  decision:
    type: deny
",
        ),
    ])
    .await;
    assert_eq!(sent.len(), 1);
    assert!(recorded(&h, "euro-only").await.is_empty());
    assert!(recorded(&h, "no-huge-refunds").await.is_empty());
}
