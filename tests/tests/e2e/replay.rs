//! `phrony policies replay` through the real daemon and CLI: the refund agent (approval boundary
//! €250) decides refunds of €100, €300 and €600 in one session; a candidate raising the boundary
//! to €500 flips exactly the €300 call (approval → allow), named by session and call id, and
//! exits 5; the deployed manifest itself flips nothing and exits 0.

use std::path::Path;

use serde_json::{Value, json};
use tests::cli::{fails, json, ok, run, table};
use tests::daemon::{Backend, Daemon};
use tests::stub::{REFUND_AGENT as AGENT, deployed_refund_agent, write_refund_agent};

use crate::sessions::{pending_approvals, start, wait_for, wait_for_status};

/// The exit code of a replay that found a flip.
const FLIPPED: i32 = 5;

fn refund(amount: u32) -> Value {
    json!({"type": "tool_call", "name": "issue_refund",
           "args": {"order_id": format!("ORD-{amount}"), "amount": amount, "currency": "EUR",
                    "reason": "The item arrived damaged."}})
}

/// One completion asking for three refunds, then a closing message.
fn three_refunds() -> Value {
    json!([
        [refund(100), refund(300), refund(600), {"type": "completed", "stop_reason": "tool_use"}],
        [
            {"type": "text_delta", "text": "The refunds were handled."},
            {"type": "completed", "stop_reason": "end_turn"}
        ]
    ])
}

/// The refund agent at version `version` with its approval boundary at `boundary` euros.
fn write_candidate(dir: &Path, version: &str, boundary: u32) {
    write_refund_agent(dir, &three_refunds());
    let edit = |rel: &str, from: &str, to: &str| {
        let path = dir.join(rel);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{rel} has no {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    };
    edit(
        "agent.yaml",
        "version: 0.1.0",
        &format!("version: {version}"),
    );
    edit(
        "policies/refund-approval-boundary.yaml",
        "value: 250",
        &format!("value: {boundary}"),
    );
}

/// The session's approvals once `n` are listed, by amount.
fn approvals_of(daemon: &Daemon, session_id: &str, n: usize) -> Vec<Value> {
    wait_for(daemon, &format!("{n} approvals of {session_id}"), || {
        let mut found = pending_approvals(daemon, session_id);
        found.sort_by_key(|a| a["args"]["amount"].as_u64());
        (found.len() == n).then_some(found)
    })
}

fn replay_flips_only_the_call_between_the_boundaries(backend: Backend) {
    let Some((daemon, _worker, project)) =
        deployed_refund_agent(backend, &three_refunds(), "replay-test-worker")
    else {
        return;
    };
    let phrony = |actor: &str| tests::cli::phrony(&daemon, actor);

    let session = start(phrony("emad").args([
        "run",
        AGENT,
        "--input",
        "Refund ORD-100, ORD-300 and ORD-600.",
        "--metadata",
        "ticket=T-9",
    ]));
    let approvals = approvals_of(&daemon, &session, 2);
    let (held_300, held_600) = (&approvals[0], &approvals[1]);
    assert_eq!(held_300["args"]["amount"], 300);
    assert_eq!(held_600["args"]["amount"], 600);
    let call_300 = held_300["call_id"].as_str().unwrap().to_owned();
    ok(phrony("alice").args(["approvals", "approve", held_300["id"].as_str().unwrap()]));
    ok(phrony("alice").args([
        "approvals",
        "reject",
        held_600["id"].as_str().unwrap(),
        "--comment",
        "Too much.",
    ]));
    wait_for_status(&daemon, &session, "completed");

    // The candidate raises the boundary to €500: only the €300 call flips.
    let candidate = tempfile::tempdir().unwrap();
    write_candidate(candidate.path(), "0.2.0", 500);
    let against = candidate.path().join("agent.yaml");
    let replay = |extra: &[&str]| {
        let mut cmd = phrony("ci");
        cmd.args(["policies", "replay", AGENT, "--against"])
            .arg(&against)
            .args(extra);
        run(&mut cmd)
    };
    let out = replay(&[]);
    assert_eq!(out.code, Some(FLIPPED), "{out:?}");
    assert_eq!(
        out.stderr,
        "1 stored decision would flip under support/refund-agent@0.2.0\n"
    );
    let rows = table(&out.stdout);
    assert_eq!(
        rows[0],
        [
            "TIME",
            "SESSION",
            "CALL",
            "TOOL",
            "STORED",
            "CANDIDATE",
            "POLICY_BEFORE",
            "POLICY_AFTER"
        ],
        "{}",
        out.stdout
    );
    assert_eq!(
        rows[1][1..],
        [
            session.as_str(),
            call_300.as_str(),
            "payments.issue-refund@1.0.0",
            "require_approval (approved)",
            "allow",
            "payments/refund-approval-boundary@1.0.0",
            "-"
        ],
        "{}",
        out.stdout
    );
    assert!(rows[2].is_empty(), "one flip only:\n{}", out.stdout);
    assert_eq!(
        rows[3].join("  "),
        "replayed 3 calls of 1 session under support/refund-agent@0.2.0: 1 would flip, 2 unchanged",
    );
    assert_eq!(rows[4], ["require_approval -> allow: 1"]);
    assert_eq!(rows.len(), 5, "{}", out.stdout);

    // The same as JSON, for scripts.
    let out = replay(&["--output", "json"]);
    assert_eq!(out.code, Some(FLIPPED), "{out:?}");
    let report = json(&out.stdout);
    assert_eq!(report["agent"], AGENT);
    assert_eq!(report["candidate"], "support/refund-agent@0.2.0");
    let flips = report["flips"].as_array().unwrap();
    assert_eq!(flips.len(), 1, "{report:#}");
    assert_eq!(flips[0]["session_id"], session.as_str());
    assert_eq!(flips[0]["call_id"], call_300.as_str());
    assert_eq!(
        flips[0]["stored"],
        json!({"decision": "require_approval", "approval": "approved",
               "policy": "payments/refund-approval-boundary@1.0.0"})
    );
    assert_eq!(flips[0]["candidate"], json!({"decision": "allow"}));
    let summary = &report["summary"];
    assert_eq!(summary["sessions"], 1);
    assert_eq!(summary["replayed"], 3);
    assert_eq!(summary["unchanged"], 2);
    assert_eq!(summary["flips"], json!({"require_approval -> allow": 1}));
    assert_eq!(summary["skipped"], json!({}));

    // --limit stops early and says so; --since in the future replays nothing.
    let out = replay(&["--limit", "1", "--output", "json"]);
    assert_eq!(
        out.code,
        Some(0),
        "the €100 call is first and unchanged: {out:?}"
    );
    let report = json(&out.stdout);
    assert_eq!(report["limit_reached"], true);
    assert_eq!(report["summary"]["replayed"], 1);
    let out = replay(&["--since", "2999-01-01T00:00:00Z", "--output", "json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(json(&out.stdout)["summary"]["replayed"], 0);
    let out = replay(&["--since", "1h", "--output", "json"]);
    assert_eq!(out.code, Some(FLIPPED), "{out:?}");

    // The deployed manifest itself flips nothing: exit 0.
    let same = ok(phrony("ci")
        .args(["policies", "replay", AGENT, "--against"])
        .arg(project.path().join("agent.yaml")));
    assert_eq!(
        same,
        "replayed 3 calls of 1 session under support/refund-agent@0.1.0: 0 would flip, 3 unchanged\n"
    );

    // Bad input is named.
    let other = tempfile::tempdir().unwrap();
    write_candidate(other.path(), "0.2.0", 500);
    let manifest = other.path().join("agent.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replacen("name: refund-agent", "name: other-agent", 1),
    )
    .unwrap();
    let err = fails(
        phrony("ci")
            .args(["policies", "replay", AGENT, "--against"])
            .arg(&manifest),
    );
    assert!(
        err.contains("declares support/other-agent, not support/refund-agent"),
        "{err}"
    );
    let err = fails(
        phrony("ci")
            .args([
                "policies",
                "replay",
                AGENT,
                "--since",
                "yesterday",
                "--against",
            ])
            .arg(&against),
    );
    assert!(err.contains("--since \"yesterday\" is neither"), "{err}");
}

#[test]
fn replay_flips_only_the_call_between_the_boundaries_sqlite() {
    replay_flips_only_the_call_between_the_boundaries(Backend::Sqlite);
}

#[test]
fn replay_flips_only_the_call_between_the_boundaries_postgres() {
    replay_flips_only_the_call_between_the_boundaries(Backend::Postgres);
}
