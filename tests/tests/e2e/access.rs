//! `required` auth mode end to end: the real daemon with `RUNTIME_AUTH=required`, tokens made
//! with the real `phrony-runtime tokens create`, and the real `phrony` CLI with `PHRONY_TOKEN`.
//! A publisher publishes, a runner runs, an approver approves; a viewer's publish, a runner's
//! approve and an approver naming someone else are refused (exit 4, one line naming why); a
//! revoked token stops on the next command. Also: `local` mode warns once, and a non-loopback
//! bind without `required` is refused with one line.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::cli::{json, ok, run};
use tests::daemon::{Backend, Daemon, binaries, free_port};
use tests::stub::{REFUND_AGENT as AGENT, write_refund_agent};

const WAIT: Duration = Duration::from_secs(60);

/// Creates a token with `roles`; returns the secret (the last line of stdout).
fn token(daemon: &Daemon, name: &str, roles: &[&str]) -> String {
    let mut cmd = daemon.runtime();
    cmd.args(["tokens", "create", "--name", name]);
    for r in roles {
        cmd.args(["--role", r]);
    }
    let out = ok(&mut cmd);
    let secret = out.lines().last().unwrap().to_owned();
    assert!(secret.starts_with("phr_"), "{out}");
    secret
}

/// The CLI presenting `token` (no actor named).
fn with(daemon: &Daemon, token: &str) -> Command {
    let mut cmd = daemon.phrony();
    cmd.env("PHRONY_TOKEN", token).env_remove("PHRONY_NO_TUI");
    cmd
}

/// Runs a command the runtime must refuse at its access edge: exit 4, one line on stderr.
fn refused(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = run(cmd);
    assert_eq!(
        out.code,
        Some(4),
        "{shown} should be refused:\nstdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1, "one line: {}", out.stderr);
    out.stderr
}

fn refund_turns() -> Value {
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

#[test]
fn required_mode_from_the_cli() {
    let daemon = Daemon::start_with_env(
        Backend::Sqlite,
        &[
            ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
            ("RUNTIME_AUTH", "required"),
        ],
    )
    .unwrap();
    let publisher = token(&daemon, "ci-publisher", &["publisher"]);
    let runner = token(&daemon, "support-runner", &["runner"]);
    let approver = token(&daemon, "finance-approver", &["approver"]);
    let viewer = token(&daemon, "auditor", &["viewer"]);

    // No credential at all.
    let err = refused(daemon.phrony().args(["agents", "ls"]));
    assert!(err.contains("not authenticated"), "{err}");
    assert!(err.contains("PHRONY_TOKEN"), "{err}");

    let project = tempfile::tempdir().unwrap();
    write_refund_agent(project.path(), &refund_turns());
    let manifest = project.path().join("agent.yaml");

    // A viewer cannot publish; the publisher can.
    let err = refused(
        with(&daemon, &viewer)
            .args(["agents", "publish"])
            .arg(&manifest),
    );
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains("lacks the publish permission"), "{err}");
    ok(with(&daemon, &publisher)
        .args(["agents", "publish"])
        .arg(&manifest));
    ok(with(&daemon, &publisher).args(["agents", "deploy", &format!("{AGENT}@0.1.0")]));

    // The runner runs; the session is recorded as started by the token's principal.
    let started = ok(with(&daemon, &runner).args([
        "run",
        AGENT,
        "--input",
        "Refund €400 for ORD-1, the item arrived damaged.",
    ]));
    let session_id = started
        .strip_prefix("session ")
        .and_then(|r| r.strip_suffix(" started\n"))
        .unwrap_or_else(|| panic!("{started}"))
        .to_owned();

    let deadline = Instant::now() + WAIT;
    let approval_id = loop {
        let listed = json(&ok(with(&daemon, &viewer).args([
            "approvals",
            "list",
            "--session-id",
            &session_id,
            "--output",
            "json",
        ])));
        if let Some(a) = listed["approvals"].as_array().and_then(|a| a.first()) {
            break a["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no approval\n{}", daemon.logs());
        std::thread::sleep(Duration::from_millis(100));
    };

    // A runner cannot approve; an approver cannot vote in someone else's name.
    let err = refused(with(&daemon, &runner).args(["approvals", "approve", &approval_id]));
    assert!(err.contains("lacks the approve permission"), "{err}");
    let err = refused(with(&daemon, &approver).env("PHRONY_ACTOR", "ciso").args([
        "approvals",
        "approve",
        &approval_id,
    ]));
    assert!(err.contains("may not act as \"ciso\""), "{err}");

    // The approver approves; the vote is recorded under the token's name.
    let decided = ok(with(&daemon, &approver).args([
        "approvals",
        "approve",
        &approval_id,
        "--comment",
        "within policy",
    ]));
    assert!(decided.starts_with("status: approved\n"), "{decided}");
    let shown = ok(with(&daemon, &viewer).args(["approvals", "show", &approval_id]));
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("vote: finance-approver approved")),
        "{shown}"
    );

    // tokens list shows the tokens, never a secret; a revoked token stops at once.
    let listed = ok(daemon.runtime().args(["tokens", "list"]));
    for name in [
        "ci-publisher",
        "support-runner",
        "finance-approver",
        "auditor",
    ] {
        assert!(listed.contains(name), "{listed}");
    }
    for secret in [&publisher, &runner, &approver, &viewer] {
        assert!(!listed.contains(secret.as_str()), "{listed}");
    }
    ok(daemon
        .runtime()
        .args(["tokens", "revoke", "support-runner"]));
    let err = refused(with(&daemon, &runner).args(["sessions", "ls"]));
    assert!(err.contains("\"support-runner\" was revoked"), "{err}");
}

#[test]
fn local_mode_warns_once_and_other_hosts_need_required() {
    let daemon = Daemon::start(Backend::Sqlite).unwrap();
    ok(daemon.phrony().args(["agents", "ls"]));
    let logs = daemon.logs();
    assert_eq!(
        logs.matches("the runtime is unauthenticated").count(),
        1,
        "{logs}"
    );

    // Bound to every interface without RUNTIME_AUTH=required: refused before serving.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(&binaries().runtime)
        .env("RUNTIME_GRPC_ADDR", format!("0.0.0.0:{}", free_port()))
        .env(
            "RUNTIME_DATABASE_URL",
            format!("sqlite://{}", dir.path().join("x.db").display()),
        )
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path())
        .env_remove("RUNTIME_AUTH")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("set RUNTIME_AUTH=required"), "{stderr}");
    assert!(
        !dir.path().join("x.db").exists(),
        "refused before the database is touched"
    );
}
