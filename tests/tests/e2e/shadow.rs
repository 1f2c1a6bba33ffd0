//! `mode: shadow` end to end: the real daemon runs the refund agent (scripted `stub` model) with
//! a shadow policy next to the tutorial's enforced one; the call the shadow policy would have
//! held still runs, and `phrony policies shadow-report` lists it.

use std::time::{Duration, Instant};

use serde_json::json;
use tests::cli::{fails, json, ok, phrony, table};
use tests::daemon::{Backend, Daemon};
use tests::stub::{REFUND_AGENT, publish_and_deploy, stub_daemon, write_refund_agent};
use tests::worker::RefundWorker;

const SHADOW_POLICY: &str = "apiVersion: phrony.com/v1
kind: Policy
metadata:
  name: refund-review-over-50
  namespace: payments
  version: 1.0.0
spec:
  description: Trying out a lower review threshold before enforcing it.
  mode: shadow
  conditions:
    field: amount
    op: gt
    value: 50
  decision:
    type: require_approval
    reason: Refunds over 50 need a second pair of eyes.
";

/// Waits until the session's status is `completed` (failing on another terminal status).
fn wait_completed(daemon: &Daemon, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let inspected = json(&ok(
            phrony(daemon, "ci").args(["sessions", "inspect", id, "--output", "json"])
        ));
        let status = inspected["session"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if status == "completed" {
            return;
        }
        assert!(
            !["failed", "cancelled"].contains(&status.as_str()) && Instant::now() < deadline,
            "session {id} is {status}\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn shadow_report(backend: Backend) {
    let Some(daemon) = stub_daemon(backend) else {
        return;
    };
    let worker = RefundWorker::start(daemon.addr(), "shadow-test-worker");
    let project = tempfile::tempdir().unwrap();
    write_refund_agent(
        project.path(),
        &json!([
            [
                {"type": "tool_call", "name": "issue_refund",
                 "args": {"order_id": "ORD-7", "amount": 120, "currency": "EUR",
                          "reason": "The item arrived damaged."}},
                {"type": "completed", "stop_reason": "tool_use"}
            ],
            [
                {"type": "text_delta", "text": "Refunded."},
                {"type": "completed", "stop_reason": "end_turn"}
            ]
        ]),
    );
    std::fs::write(
        project.path().join("policies/refund-review-over-50.yaml"),
        SHADOW_POLICY,
    )
    .unwrap();
    let manifest = project.path().join("agent.yaml");
    let agent = std::fs::read_to_string(&manifest).unwrap().replace(
        "        - ref: policies/refund-approval-boundary.yaml\n",
        "        - ref: policies/refund-approval-boundary.yaml\n        - ref: policies/refund-review-over-50.yaml\n",
    );
    std::fs::write(&manifest, agent).unwrap();
    publish_and_deploy(&daemon, project.path(), REFUND_AGENT);

    // Nothing recorded yet.
    assert_eq!(
        ok(phrony(&daemon, "ci").args([
            "policies",
            "shadow-report",
            "payments/refund-review-over-50"
        ])),
        "shadow policy payments/refund-review-over-50: no call would have changed\n"
    );

    let started = ok(phrony(&daemon, "emad").args([
        "run",
        REFUND_AGENT,
        "--input",
        "Refund €120 for ORD-7.",
    ]));
    let id = started
        .strip_prefix("session ")
        .and_then(|rest| rest.strip_suffix(" started\n"))
        .unwrap_or_else(|| panic!("unexpected run output: {started:?}"))
        .to_owned();
    wait_completed(&daemon, &id);
    // The call the shadow policy would have held ran, and nobody was asked.
    assert_eq!(worker.invocations().len(), 1, "{}", daemon.logs());
    let approvals = json(&ok(phrony(&daemon, "ci").args([
        "approvals",
        "list",
        "--session-id",
        &id,
        "--output",
        "json",
    ])));
    assert_eq!(approvals["approvals"], json!([]), "{approvals}");

    let report = ok(phrony(&daemon, "ci").args([
        "policies",
        "shadow-report",
        "payments/refund-review-over-50",
        "--since",
        "1h",
    ]));
    let rows = table(&report);
    assert_eq!(
        rows[0],
        ["TIME", "SESSION", "CALL", "TOOL", "DECISION", "POLICY"],
        "{report}"
    );
    assert_eq!(rows.len(), 3, "header, one call, the summary:\n{report}");
    assert_eq!(rows[1][1], id);
    assert_eq!(rows[1][3], "payments.issue-refund");
    assert_eq!(
        rows[1][4..],
        [
            "allow → require_approval",
            "payments/refund-review-over-50@1.0.0"
        ],
        "{report}"
    );
    assert!(
        report.ends_with("1 call would have changed: 0 denied, 1 held for approval\n"),
        "{report}"
    );

    let report = json(&ok(phrony(&daemon, "ci").args([
        "policies",
        "shadow-report",
        "payments/refund-review-over-50",
        "--output",
        "json",
    ])));
    assert_eq!(report["changed"], 1);
    assert_eq!(report["require_approval"], 1);
    let decision = &report["decisions"][0];
    assert_eq!(decision["session_id"], id.as_str());
    assert_eq!(decision["agent"], "support/refund-agent@0.1.0");
    assert_eq!(decision["enforced"], "allow");
    assert_eq!(decision["would_have"], "require_approval");
    assert_eq!(
        decision["reason"],
        "Refunds over 50 need a second pair of eyes."
    );

    // Later than anything recorded; and a bad policy or time is named.
    let later = ok(phrony(&daemon, "ci").args([
        "policies",
        "shadow-report",
        "payments/refund-review-over-50",
        "--since",
        "2999-01-01T00:00:00Z",
    ]));
    assert!(later.contains("no call would have changed"), "{later}");
    let err =
        fails(phrony(&daemon, "ci").args(["policies", "shadow-report", "refund-review-over-50"]));
    assert!(err.contains("must be NS/NAME"), "{err}");
    let err = fails(phrony(&daemon, "ci").args([
        "policies",
        "shadow-report",
        "payments/refund-review-over-50",
        "--since",
        "yesterday",
    ]));
    assert!(err.contains("RFC 3339"), "{err}");
    // The shadow stream is part of the verified log.
    let verified = ok(phrony(&daemon, "ci").args(["audit", "verify"]));
    assert!(verified.starts_with("verified "), "{verified}");
}

#[test]
fn shadow_report_on_sqlite() {
    shadow_report(Backend::Sqlite);
}

#[test]
fn shadow_report_on_postgres() {
    shadow_report(Backend::Postgres);
}
