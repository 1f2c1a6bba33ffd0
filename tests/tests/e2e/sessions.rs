//! Sessions and approvals end to end: the real `phrony-runtime` (scripted `stub` model) and a
//! tool worker on the `Work` stream, driven by the real `phrony` CLI: `run`, `sessions ls |
//! inspect | cancel | complete`, `approvals list | show | approve | reject`, secrets from
//! `--env-file`, and the errors users see for bad arguments.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::cli::{fails, json, ok, run, table};
use tests::daemon::{Backend, Daemon};
use tests::proxy::LossyProxy;
use tests::stub::{
    REFUND_AGENT as AGENT, deployed_refund_agent, publish_and_deploy, stub_daemon,
    write_stub_script,
};

use crate::tables::redacted;

/// How long a session may take to reach a state (a failure guard, not a pace).
const WAIT: Duration = Duration::from_secs(60);

const SECRET_AGENT: &str = "support/secret-agent";
/// The variable the secret agent's secret is read from.
const SECRET_VAR: &str = "PHRONY_TEST_CRM_TOKEN";

// ---------------------------------------------------------------------------------------------
// Running commands

/// The CLI pointed at the daemon, acting as `actor`, without the secret agent's variable.
fn phrony(daemon: &Daemon, actor: &str) -> Command {
    let mut cmd = tests::cli::phrony(daemon, actor);
    cmd.env_remove(SECRET_VAR);
    cmd
}

/// Polls `probe` until it returns a value (the CLI has no subscription command); panics with
/// `what` and the daemon's log after [`WAIT`].
pub(crate) fn wait_for<T>(daemon: &Daemon, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The session's status, from `sessions inspect --output json`.
fn session_status(daemon: &Daemon, id: &str) -> String {
    let inspected = json(&ok(
        phrony(daemon, "ci").args(["sessions", "inspect", id, "--output", "json"])
    ));
    inspected["session"]["status"].as_str().unwrap().to_owned()
}

pub(crate) fn wait_for_status(daemon: &Daemon, id: &str, want: &str) {
    wait_for(daemon, &format!("session {id} to be {want}"), || {
        let status = session_status(daemon, id);
        assert!(
            status == want || !["completed", "failed", "cancelled"].contains(&status.as_str()),
            "session {id} ended {status}, expected {want}\n{}",
            daemon.logs()
        );
        (status == want).then_some(())
    });
}

/// The pending approvals of a session, as `approvals list --session-id ID --output json` lists
/// them.
pub(crate) fn pending_approvals(daemon: &Daemon, session_id: &str) -> Vec<Value> {
    let listed = json(&ok(phrony(daemon, "ci").args([
        "approvals",
        "list",
        "--session-id",
        session_id,
        "--output",
        "json",
    ])));
    listed["approvals"].as_array().unwrap().clone()
}

/// The pending approval of a session, once it is listed (as JSON).
fn wait_for_approval(daemon: &Daemon, session_id: &str) -> Value {
    wait_for(daemon, &format!("an approval of {session_id}"), || {
        pending_approvals(daemon, session_id).first().cloned()
    })
}

/// `phrony run …` that must print `session <id> started`; returns the id.
pub(crate) fn start(cmd: &mut Command) -> String {
    let stdout = ok(cmd);
    let id = stdout
        .strip_prefix("session ")
        .and_then(|rest| rest.strip_suffix(" started\n"))
        .unwrap_or_else(|| panic!("unexpected run output: {stdout:?}"));
    assert!(id.starts_with("run_"), "{id}");
    id.to_owned()
}

// ---------------------------------------------------------------------------------------------
// The agents

/// Writes an agent without tools that declares one secret and answers once.
fn write_secret_agent(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("agent.yaml"),
        format!(
            "apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: secret-agent
  namespace: support
  version: 0.1.0
secrets:
  crm:
    fromEnv: {SECRET_VAR}
spec:
  purpose: Answer with the CRM at hand.
  instructions:
    text: Answer briefly.
  model:
    provider: stub
    name: scripted
    secret: crm
"
        ),
    )
    .unwrap();
    write_stub_script(
        dir,
        &json!([[
            {"type": "text_delta", "text": "Done."},
            {"type": "completed", "stop_reason": "end_turn"}
        ]]),
    );
}

/// The refund agent's script: one refund of 400 (held for approval), then a closing message.
pub(crate) fn refund_turns() -> Value {
    json!([
        [
            {"type": "tool_call", "name": "issue_refund",
             "args": {"order_id": "ORD-1", "amount": 400, "currency": "EUR",
                      "reason": "The item arrived damaged."}},
            {"type": "completed", "stop_reason": "tool_use"}
        ],
        [
            {"type": "text_delta", "text": "The refund request was handled."},
            {"type": "completed", "stop_reason": "end_turn"}
        ]
    ])
}

// ---------------------------------------------------------------------------------------------
// The tests

/// Approve and reject from the CLI: run detached, see the approval, decide it as `emad`, and
/// find the decision with its actor in the session's timeline.
fn approvals_from_the_cli(backend: Backend) {
    let Some((daemon, worker, _project)) =
        deployed_refund_agent(backend, &refund_turns(), "sessions-test-worker")
    else {
        return;
    };

    // run, detached.
    let approved_id = start(phrony(&daemon, "emad").args([
        "run",
        AGENT,
        "--input",
        "Refund €400 for ORD-1, the item arrived damaged.",
        "--metadata",
        "ticket=T-1",
    ]));

    // sessions ls shows it.
    let listed = ok(phrony(&daemon, "emad").args(["sessions", "ls"]));
    let rows = table(&listed);
    assert_eq!(
        rows[0],
        [
            "ID",
            "KIND",
            "TARGET",
            "STATUS",
            "UPDATED_AT",
            "RESUMABLE",
            "STARTED_BY"
        ],
        "{listed}"
    );
    let row = rows
        .iter()
        .find(|r| r[0] == approved_id)
        .unwrap_or_else(|| panic!("{approved_id} not listed:\n{listed}"));
    assert_eq!(row[1], "agent");
    assert_eq!(row[2], "support/refund-agent@0.1.0");
    assert_eq!(row[5], "no");
    // `local` mode: nobody verified the starter, and the table says so.
    assert_eq!(row[6], "emad (unverified)", "{listed}");

    // The approval appears, pending.
    let approval = wait_for_approval(&daemon, &approved_id);
    let approval_id = approval["id"].as_str().unwrap().to_owned();
    assert_eq!(approval["status"], "pending");
    assert_eq!(approval["tool"], "payments.issue-refund");
    assert_eq!(approval["args"]["amount"], 400);
    wait_for_status(&daemon, &approved_id, "awaiting_approval");

    let list = ok(phrony(&daemon, "emad").args(["approvals", "list"]));
    assert!(list.contains(&approval_id), "{list}");
    insta::assert_snapshot!("approvals_list_pending", redacted(&list));

    // approvals show: key: value lines and the arguments as JSON.
    let shown = ok(phrony(&daemon, "emad").args(["approvals", "show", &approval_id]));
    for line in [
        "id:".to_owned(),
        "status:                  pending".to_owned(),
        format!("session_id:              {approved_id}"),
        "agent:                   support/refund-agent@0.1.0".to_owned(),
        "tool:                    payments.issue-refund@1.0.0".to_owned(),
        "reason:                  Refund amount above delegated limit.".to_owned(),
        "policy:                  payments/refund-approval-boundary@1.0.0".to_owned(),
        "approvals:               0/1".to_owned(),
        "on_reject:               return_to_agent".to_owned(),
        "args:".to_owned(),
        "    \"amount\": 400,".to_owned(),
    ] {
        assert!(
            shown.lines().any(|l| l.starts_with(&line)),
            "no {line:?} in:\n{shown}"
        );
    }
    assert!(!shown.contains("vote:"), "{shown}");
    assert!(
        worker.invocations().is_empty(),
        "dispatched before approval"
    );

    // approve, as emad, with a comment.
    let decided = ok(phrony(&daemon, "emad").args([
        "approvals",
        "approve",
        &approval_id,
        "--comment",
        "Damage claim verified, within policy.",
    ]));
    let lines: Vec<&str> = decided.lines().collect();
    assert_eq!(lines[0], "status: approved", "{decided}");
    assert_eq!(lines[1], "approvals_received: 1", "{decided}");
    assert!(lines[2].starts_with("session_status: "), "{decided}");
    assert_eq!(lines.len(), 3, "{decided}");

    // The call runs and the (task) session completes.
    wait_for_status(&daemon, &approved_id, "completed");
    let invocations = worker.invocations();
    assert_eq!(invocations.len(), 1, "{invocations:?}");
    assert_eq!(invocations[0]["amount"], 400);

    // show now carries the vote; the approval left the pending list.
    let shown = ok(phrony(&daemon, "ci").args(["approvals", "show", &approval_id]));
    assert!(
        shown.contains("status:                  approved\n"),
        "{shown}"
    );
    assert!(
        shown.lines().any(|l| l.starts_with("vote: emad approved")
            && l.ends_with(": \"Damage claim verified, within policy.\"")),
        "{shown}"
    );
    let pending = json(&ok(phrony(&daemon, "ci").args([
        "approvals",
        "list",
        "--output",
        "json",
    ])));
    assert!(
        pending["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["id"] != approval_id.as_str()),
        "{pending}"
    );
    let approved = json(&ok(phrony(&daemon, "ci").args([
        "approvals",
        "list",
        "--status",
        "approved",
        "--agent",
        AGENT,
        "--output",
        "json",
    ])));
    assert_eq!(approved["approvals"][0]["id"], approval_id.as_str());

    // sessions inspect shows the decision with its actor.
    let inspected = ok(phrony(&daemon, "ci").args(["sessions", "inspect", &approved_id]));
    assert!(
        inspected.starts_with(&format!("=== Session {approved_id} ===\nstatus:")),
        "{inspected}"
    );
    assert!(inspected.contains("\nTimeline:\n"), "{inspected}");
    assert!(inspected.contains("agent:"), "{inspected}");
    assert!(
        inspected.contains("support/refund-agent@0.1.0"),
        "{inspected}"
    );
    assert!(
        inspected
            .lines()
            .any(|l| l.contains("approval") && l.contains(" +") && l.contains("ms [")),
        "no approval entry in the timeline:\n{inspected}"
    );
    assert!(
        inspected.lines().any(|l| l.contains("emad")),
        "the approver is not in the timeline:\n{inspected}"
    );
    // The header names the unverified starter; the `approval.decided` event and the
    // milestone name the decider with its attribution, as the vote does.
    assert!(
        inspected.lines().any(|l| l
            .split_whitespace()
            .eq(["started_by:", "emad", "(unverified)"])),
        "{inspected}"
    );
    let decided: Vec<&str> = inspected
        .lines()
        .filter(|l| {
            l.contains("[event/approval.decided]") || l.contains("[approval/approval_decided]")
        })
        .collect();
    assert_eq!(decided.len(), 2, "{inspected}");
    for line in decided {
        assert!(
            line.contains("approval approved by emad (unverified)"),
            "{line}"
        );
    }
    let inspected = json(&ok(phrony(&daemon, "ci").args([
        "sessions",
        "inspect",
        &approved_id,
        "--output",
        "json",
    ])));
    assert_eq!(inspected["session"]["status"], "completed");
    assert_eq!(inspected["session"]["metadata"]["ticket"], "T-1");
    let by_emad = inspected["timeline"].as_array().unwrap().iter().any(|e| {
        e["event"]["actor"] == "emad"
            || e["approval"]["decided_by"] == "emad"
            || e["approval"]["votes"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v["decided_by"] == "emad"))
    });
    assert!(by_emad, "no decision by emad in {inspected:#}");

    // reject path: the call never reaches the worker and the agent carries on.
    let rejected_id = start(phrony(&daemon, "emad").args([
        "run",
        AGENT,
        "--input",
        r#"{"message": "Refund €400 for ORD-1"}"#,
        "--metadata",
        "ticket=T-2",
    ]));
    let approval = wait_for_approval(&daemon, &rejected_id);
    let rejected_approval = approval["id"].as_str().unwrap().to_owned();
    let decided = ok(phrony(&daemon, "emad").args([
        "approvals",
        "reject",
        &rejected_approval,
        "--comment",
        "No damage claim on file for this order.",
    ]));
    assert!(
        decided.starts_with("status: denied\napprovals_received: 0\nsession_status: "),
        "{decided}"
    );
    wait_for_status(&daemon, &rejected_id, "completed");
    assert_eq!(
        worker.invocations().len(),
        1,
        "a rejected call was dispatched"
    );
    let shown = json(&ok(phrony(&daemon, "ci").args([
        "approvals",
        "show",
        &rejected_approval,
        "--output",
        "json",
    ])));
    assert_eq!(shown["status"], "denied");
    assert_eq!(shown["votes"][0]["decided_by"], "emad");
    assert_eq!(shown["votes"][0]["decision"], "denied");
    assert_eq!(
        shown["votes"][0]["comment"],
        "No damage claim on file for this order."
    );

    // --metadata filters; --status filters; JSON parses.
    let only = |pair: &str| -> Vec<String> {
        let listed = json(&ok(phrony(&daemon, "ci").args([
            "sessions",
            "ls",
            "--metadata",
            pair,
            "--output",
            "json",
        ])));
        listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(only("ticket=T-1"), [approved_id.as_str()]);
    assert_eq!(only("ticket=T-2"), [rejected_id.as_str()]);
    assert!(only("ticket=T-3").is_empty());
    let completed =
        ok(phrony(&daemon, "ci").args(["sessions", "ls", AGENT, "--status", "completed"]));
    assert_eq!(table(&completed).len(), 3, "{completed}");
    let limited =
        json(&ok(phrony(&daemon, "ci").args([
            "sessions", "ls", "--limit", "1", "--output", "json",
        ])));
    assert_eq!(
        limited["sessions"].as_array().unwrap().len(),
        1,
        "{limited}"
    );

    // cancel and complete.
    let cancelled_id = start(phrony(&daemon, "emad").args(["run", AGENT]));
    assert_eq!(
        ok(phrony(&daemon, "emad").args(["sessions", "cancel", &cancelled_id])),
        format!("cancelled {cancelled_id}\n")
    );
    assert_eq!(session_status(&daemon, &cancelled_id), "cancelled");
    let again = fails(phrony(&daemon, "emad").args(["sessions", "cancel", &cancelled_id]));
    assert!(again.starts_with("Error: cancel: "), "{again}");
    let conversation = json(&ok(phrony(&daemon, "emad").args([
        "run",
        AGENT,
        "--conversation",
        "--output",
        "json",
    ])));
    let conversation_id = conversation["session_id"].as_str().unwrap().to_owned();
    assert_eq!(conversation["status"], "running", "{conversation}");
    // Without input, a conversation waits for its first message: it is resumable.
    wait_for_status(&daemon, &conversation_id, "awaiting_input");
    let listed = ok(phrony(&daemon, "ci").args(["sessions", "ls", "--status", "awaiting_input"]));
    let rows = table(&listed);
    assert_eq!(rows.len(), 2, "{listed}");
    assert_eq!(rows[1][0], conversation_id);
    assert_eq!(rows[1][5], "yes", "{listed}");
    assert_eq!(
        ok(phrony(&daemon, "emad").args(["sessions", "complete", &conversation_id])),
        format!("completed {conversation_id}\n")
    );
    assert_eq!(session_status(&daemon, &conversation_id), "completed");

    // Unknown ids and agents read as the runtime's NotFound.
    let unknown = fails(phrony(&daemon, "ci").args(["sessions", "inspect", "run_nope"]));
    assert!(unknown.starts_with("Error: inspect: "), "{unknown}");
    let unknown = fails(phrony(&daemon, "ci").args(["run", "support/nobody"]));
    assert!(
        unknown.starts_with("Error: run: ") && unknown.contains("(NotFound)"),
        "{unknown}"
    );
}

#[test]
fn approvals_from_the_cli_sqlite() {
    approvals_from_the_cli(Backend::Sqlite);
}

#[test]
fn approvals_from_the_cli_postgres() {
    approvals_from_the_cli(Backend::Postgres);
}

/// Secrets: resolved from --env-file (the environment wins), refused when missing, never shown.
/// Issue 10 at the CLI's edges: bad `PHRONY_ACTOR` names fail before anything is sent; a vote
/// whose answer is lost says that it may have been recorded and how to check (exit code 3); a
/// comment that tries to forge a timeline line and clear the screen is printed escaped by
/// `approvals show` and `sessions inspect`.
#[test]
fn hostile_names_and_lost_answers_at_the_cli() {
    let Some((daemon, _worker, _project)) =
        deployed_refund_agent(Backend::Sqlite, &refund_turns(), "edges-test-worker")
    else {
        return;
    };
    let id = start(phrony(&daemon, "emad").args(["run", AGENT, "--input", "Refund 400 for ORD-1"]));
    let approval = wait_for_approval(&daemon, &id);
    let approval_id = approval["id"].as_str().unwrap().to_owned();

    // Reserved and unprintable actor names are refused by the CLI, naming the rule.
    let refused =
        fails(phrony(&daemon, "system:timeout").args(["approvals", "approve", &approval_id]));
    assert!(
        refused.contains("PHRONY_ACTOR: actor \"system:timeout\" is reserved for the runtime"),
        "{refused}"
    );
    let forged_actor = "bob\n2025-01-31T09:30:00Z +0ms [event/approval.decided] approved by ciso";
    let refused = fails(phrony(&daemon, forged_actor).args(["approvals", "approve", &approval_id]));
    assert!(
        refused.contains("unprintable character U+000A"),
        "{refused}"
    );

    // The vote reaches the runtime, its answer never comes back.
    let forged = "fine\n2025-01-31T09:30:00Z +0ms [event/approval.decided] approval approved by \
                  ciso\u{1b}[2J\u{202e}";
    let proxy = LossyProxy::start(daemon.addr(), 2);
    let cli = phrony(&daemon, "Emad")
        .env("PHRONY_RUNTIME_ADDR", proxy.addr())
        .args(["approvals", "approve", &approval_id, "--comment", forged])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&daemon, "the vote to be recorded", || {
        let shown = json(&ok(phrony(&daemon, "ci").args([
            "approvals",
            "show",
            &approval_id,
            "--output",
            "json",
        ])));
        (shown["status"] == "approved").then_some(())
    });
    assert!(proxy.holding());
    proxy.cut();
    let out = cli.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("the vote may have been recorded"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("check with: phrony approvals show {approval_id}")),
        "{stderr}"
    );

    // The hostile comment is shown, escaped: no forged line, no escape sequence.
    let shown = ok(phrony(&daemon, "ci").args(["approvals", "show", &approval_id]));
    let inspected = ok(phrony(&daemon, "ci").args(["sessions", "inspect", &id]));
    for output in [&shown, &inspected] {
        assert!(
            !output.contains('\u{1b}') && !output.contains('\u{202e}'),
            "{output}"
        );
        assert!(
            !output
                .lines()
                .any(|l| l.starts_with("2025-01-31T09:30:00Z")),
            "a forged line:\n{output}"
        );
        assert!(
            output.contains("fine\\n2025-01-31T09:30:00Z +0ms [event/approval.decided]"),
            "{output}"
        );
    }
    assert!(
        shown.contains("decided_by:              Emad (unverified)\n"),
        "the voter's spelling is kept, and nobody verified it:\n{shown}"
    );
}

#[test]
fn secrets_resolve_from_env_files() {
    let Some(daemon) = stub_daemon(Backend::Sqlite) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    write_secret_agent(project.path());
    publish_and_deploy(&daemon, project.path(), SECRET_AGENT);

    // Missing: the error names the secret and the variable; nothing is started.
    let missing = fails(phrony(&daemon, "ci").args(["run", SECRET_AGENT]));
    assert_eq!(
        missing,
        format!(
            "Error: secret \"crm\": environment variable {SECRET_VAR} is not set; set {SECRET_VAR} \
             (or pass an --env-file defining it) and retry run\n"
        )
    );
    let sessions = json(&ok(
        phrony(&daemon, "ci").args(["sessions", "ls", "--output", "json"])
    ));
    assert_eq!(sessions["sessions"], json!([]));

    // From an env file (a later file overrides an earlier one).
    let base = project.path().join("base.env");
    let local = project.path().join("local.env");
    std::fs::write(&base, format!("# base\n{SECRET_VAR}=stale-value\n")).unwrap();
    std::fs::write(
        &local,
        format!("export {SECRET_VAR}=\"crm-secret-value\"\n"),
    )
    .unwrap();
    let out = run(phrony(&daemon, "ci").args([
        "run",
        SECRET_AGENT,
        "-e",
        base.to_str().unwrap(),
        "--env-file",
        local.to_str().unwrap(),
    ]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(!out.stdout.contains("secret-value") && !out.stderr.contains("secret-value"));
    let id = out
        .stdout
        .strip_prefix("session ")
        .and_then(|s| s.strip_suffix(" started\n"))
        .unwrap()
        .to_owned();
    wait_for_status(&daemon, &id, "completed");
    let inspected =
        ok(phrony(&daemon, "ci").args(["sessions", "inspect", &id, "--output", "json"]));
    assert!(!inspected.contains("crm-secret-value"), "{inspected}");

    // From the environment, which wins over a file that lacks nothing.
    let id = start(
        phrony(&daemon, "ci")
            .env(SECRET_VAR, "from-the-environment")
            .args(["run", SECRET_AGENT, "-e", base.to_str().unwrap()]),
    );
    wait_for_status(&daemon, &id, "completed");

    // Empty counts as unset; an unreadable env file is an error.
    let empty = fails(
        phrony(&daemon, "ci")
            .env(SECRET_VAR, "")
            .args(["run", SECRET_AGENT]),
    );
    assert!(
        empty.contains(&format!("environment variable {SECRET_VAR} is not set")),
        "{empty}"
    );
    let nofile = project.path().join("missing.env");
    let unreadable =
        fails(phrony(&daemon, "ci").args(["run", SECRET_AGENT, "-e", nofile.to_str().unwrap()]));
    assert!(
        unreadable.starts_with(&format!("Error: read env file {}", nofile.display())),
        "{unreadable}"
    );
}

/// Bad arguments are refused before anything is sent, with exit code 1 (2 for usage errors).
#[test]
fn bad_arguments_are_refused_with_clear_errors() {
    let Some(daemon) = stub_daemon(Backend::Sqlite) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "run".into(),
                AGENT.into(),
                "--input".into(),
                r#"{"message": "#.into(),
            ],
            "Error: --input looks like JSON but does not parse: ",
        ),
        (
            vec![
                "run".into(),
                AGENT.into(),
                "--input".into(),
                "[1, 2]".into(),
            ],
            "Error: --input must be a JSON object or text, got a JSON array",
        ),
        (
            vec![
                "run".into(),
                AGENT.into(),
                "--metadata".into(),
                "ticket".into(),
            ],
            "Error: --metadata \"ticket\" must be key=value",
        ),
        (
            vec!["run".into(), "refund-agent".into()],
            "Error: agent must be namespace/name, got \"refund-agent\"",
        ),
        (
            vec![
                "sessions".into(),
                "ls".into(),
                "--metadata".into(),
                "=x".into(),
            ],
            "Error: --metadata \"=x\" has an empty key",
        ),
        (
            vec![
                "approvals".into(),
                "list".into(),
                "--agent".into(),
                "a/b@1.0.0".into(),
            ],
            "Error: agent reference must not include @version here",
        ),
    ];
    for (args, want) in cases {
        let stderr = fails(phrony(&daemon, "ci").args(&args));
        assert!(stderr.starts_with(want), "{args:?}: {stderr}");
    }
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"amount\": ").unwrap();
    let stderr = fails(phrony(&daemon, "ci").args([
        "approvals",
        "approve",
        "00000000-0000-0000-0000-000000000000",
        "--args",
        bad.to_str().unwrap(),
    ]));
    assert!(
        stderr.starts_with(&format!(
            "Error: --args file {} is not valid JSON: ",
            bad.display()
        )),
        "{stderr}"
    );
    let list = dir.path().join("list.json");
    std::fs::write(&list, "[1]").unwrap();
    let stderr = fails(phrony(&daemon, "ci").args([
        "approvals",
        "approve",
        "x",
        "--args",
        list.to_str().unwrap(),
    ]));
    assert!(stderr.contains("must hold a JSON object"), "{stderr}");
    // A usage error (unknown flag, missing argument) exits 2.
    let usage = run(phrony(&daemon, "ci").args(["sessions", "inspect"]));
    assert_eq!(usage.code, Some(2), "{}", usage.stderr);
    let usage = run(phrony(&daemon, "ci").args(["approvals", "reject", "x", "--args", "f.json"]));
    assert_eq!(usage.code, Some(2), "{}", usage.stderr);
}
