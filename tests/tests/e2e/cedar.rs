//! Cedar policies end to end: the real daemon runs the refund agent (scripted `stub` model)
//! with its policies written in Cedar (`policies-examples/refund-agent-cedar`). In one session
//! a €100 refund is dispatched, a €14,000 one is denied with the Cedar forbid's reason in the
//! ledger's decision event, and a €400 one pauses for the approval of the document's
//! `decision` block; approved, it is dispatched.

use serde_json::{Value, json};
use tests::cli::{json, ok, phrony};
use tests::daemon::Backend;
use tests::stub::{REFUND_AGENT, publish_and_deploy, stub_daemon, write_refund_agent};
use tests::worker::RefundWorker;

use crate::sessions::{pending_approvals, start, wait_for, wait_for_status};

fn refund(order: &str, amount: u32) -> Value {
    json!([
        {"type": "tool_call", "name": "issue_refund",
         "args": {"order_id": order, "amount": amount, "currency": "EUR", "reason": "damaged"}},
        {"type": "completed", "stop_reason": "tool_use"}
    ])
}

fn cedar_refunds(backend: Backend) {
    let Some(daemon) = stub_daemon(backend) else {
        return;
    };
    let worker = RefundWorker::start(daemon.addr(), "cedar-test-worker");
    let project = tempfile::tempdir().unwrap();
    write_refund_agent(
        project.path(),
        &json!([
            refund("ORD-3", 100),
            refund("ORD-2", 14_000),
            refund("ORD-1", 400),
            [
                {"type": "text_delta", "text": "Done."},
                {"type": "completed", "stop_reason": "end_turn"}
            ]
        ]),
    );
    // The tutorial's YAML policy replaced by the Cedar document.
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../policies-examples/refund-agent-cedar/policies/refund-limits.yaml");
    std::fs::copy(&example, project.path().join("policies/refund-limits.yaml")).unwrap();
    let manifest = project.path().join("agent.yaml");
    let agent = std::fs::read_to_string(&manifest).unwrap().replace(
        "policies/refund-approval-boundary.yaml",
        "policies/refund-limits.yaml",
    );
    std::fs::write(&manifest, agent).unwrap();
    publish_and_deploy(&daemon, project.path(), REFUND_AGENT);

    let id = start(phrony(&daemon, "emad").args([
        "run",
        REFUND_AGENT,
        "--input",
        "Three refunds, please.",
    ]));
    let approval = wait_for(&daemon, "the €400 refund's approval", || {
        pending_approvals(&daemon, &id).first().cloned()
    });
    assert_eq!(
        approval["policy"], "payments/refund-limits@1.0.0",
        "{approval}"
    );
    assert_eq!(approval["approvals_required"], 1, "{approval}");
    // Only the €100 refund reached the worker so far.
    let invoked = worker.invocations();
    assert_eq!(invoked.len(), 1, "{invoked:?}");
    assert_eq!(invoked[0]["amount"], 100);

    let inspected =
        ok(phrony(&daemon, "ci").args(["sessions", "inspect", &id, "--output", "json"]));
    let denial = "Refund amount exceeds the absolute ceiling for agent-initiated refunds. \
                  (Cedar: absolute-ceiling)";
    let events: Value = json(&inspected);
    let denied: Vec<&Value> = events["timeline"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter(|e| e["kind"] == "tool.policy_denied")
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(denied.len(), 1, "{inspected}");
    // The ledger's decision event: the Cedar forbid's reason and the Cedar document.
    let payload = &denied[0]["event"]["payload"];
    assert_eq!(payload["reason"], denial, "{payload}");
    assert_eq!(payload["policy_ref"], "payments/refund-limits@1.0.0");

    let approval_id = approval["id"].as_str().unwrap();
    let decided = ok(phrony(&daemon, "finance").args(["approvals", "approve", approval_id]));
    assert!(decided.starts_with("status: approved\n"), "{decided}");
    wait_for_status(&daemon, &id, "completed");
    let amounts: Vec<Value> = worker
        .invocations()
        .iter()
        .map(|args| args["amount"].clone())
        .collect();
    assert_eq!(amounts, [json!(100), json!(400)]);
    let verified = ok(phrony(&daemon, "ci").args(["audit", "verify"]));
    assert!(verified.starts_with("verified "), "{verified}");
}

#[test]
fn cedar_refunds_on_sqlite() {
    cedar_refunds(Backend::Sqlite);
}

#[test]
fn cedar_refunds_on_postgres() {
    cedar_refunds(Backend::Postgres);
}
