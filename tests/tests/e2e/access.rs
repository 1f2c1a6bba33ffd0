//! `required` auth mode end to end: the real daemon with `RUNTIME_AUTH=required`, tokens made
//! with the real `phrony-runtime tokens create`, and the real `phrony` CLI with `PHRONY_TOKEN`.
//! A publisher publishes, a runner runs, an approver approves; a viewer's publish, a runner's
//! approve and an approver naming someone else are refused (exit 4, one line naming why); a
//! revoked token stops on the next command. Who may vote on a held call: the starter not on its
//! own session (separation of duties) unless the policy opts out (`allow_self_approval`, in the
//! audit), a route-restricted approver only on its route. Also: `local` mode warns once, and a
//! non-loopback bind without `required` is refused with one line.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::cli::{json, ok, run};
use tests::daemon::{Backend, Daemon, binaries, free_port};
use tests::stub::{REFUND_AGENT as AGENT, write_refund_agent};

use crate::tables::redacted;

const WAIT: Duration = Duration::from_secs(60);

/// Creates a token with `roles`; returns the secret (the last line of stdout).
fn token(daemon: &Daemon, name: &str, roles: &[&str]) -> String {
    routed_token(daemon, name, roles, &[])
}

/// [`token`] restricted to the approval `routes` (`tokens create --route R`).
fn routed_token(daemon: &Daemon, name: &str, roles: &[&str], routes: &[&str]) -> String {
    let mut cmd = daemon.runtime();
    cmd.args(["tokens", "create", "--name", name]);
    for r in roles {
        cmd.args(["--role", r]);
    }
    for r in routes {
        cmd.args(["--route", r]);
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

// ---------------------------------------------------------------------------------------------
// Who may vote on a held call. One scenario (a required-mode daemon, the refund agent with an
// approval boundary from `data/access/`, one session held on its approval), one test per rule.

/// A required-mode daemon with the refund agent published and deployed (by a publisher token),
/// and a viewer token to look with.
struct Scenario {
    daemon: Daemon,
    viewer: String,
    _project: tempfile::TempDir,
}

impl Scenario {
    /// `policy`: a file of `tests/tests/e2e/data/access/` replacing the tutorial's
    /// `refund-approval-boundary`; `None` keeps the tutorial's. `None` as for [`Daemon::start`].
    fn start(backend: Backend, policy: Option<&str>) -> Option<Self> {
        let daemon = Daemon::start_with_env(
            backend,
            &[
                ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
                ("RUNTIME_AUTH", "required"),
            ],
        )?;
        let project = tempfile::tempdir().unwrap();
        write_refund_agent(project.path(), &refund_turns());
        if let Some(policy) = policy {
            let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/e2e/data/access")
                .join(policy);
            std::fs::copy(
                &data,
                project
                    .path()
                    .join("policies/refund-approval-boundary.yaml"),
            )
            .unwrap_or_else(|e| panic!("copy {}: {e}", data.display()));
        }
        let publisher = token(&daemon, "ci-publisher", &["publisher"]);
        ok(with(&daemon, &publisher)
            .args(["agents", "publish"])
            .arg(project.path().join("agent.yaml")));
        ok(with(&daemon, &publisher).args(["agents", "deploy", &format!("{AGENT}@0.1.0")]));
        let viewer = token(&daemon, "auditor", &["viewer"]);
        Some(Self {
            daemon,
            viewer,
            _project: project,
        })
    }

    /// Starts a session as `runner` and waits for its call to be held: `(session, approval)`.
    fn held_call(&self, runner: &str) -> (String, String) {
        let started = ok(with(&self.daemon, runner).args([
            "run",
            AGENT,
            "--input",
            "Refund €400 for ORD-1, the item arrived damaged.",
        ]));
        let session = started
            .strip_prefix("session ")
            .and_then(|r| r.strip_suffix(" started\n"))
            .unwrap_or_else(|| panic!("{started}"))
            .to_owned();
        let deadline = Instant::now() + WAIT;
        loop {
            let listed = self.viewer_json(&["approvals", "list", "--session-id", &session]);
            if let Some(a) = listed["approvals"].as_array().and_then(|a| a.first()) {
                return (session, a["id"].as_str().unwrap().to_owned());
            }
            assert!(
                Instant::now() < deadline,
                "no approval\n{}",
                self.daemon.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `session` is in `status`.
    fn wait_for_status(&self, session: &str, status: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let inspected = self.viewer_json(&["sessions", "inspect", session]);
            if inspected["session"]["status"] == status {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{session} never reached {status}: {}\n{}",
                inspected["session"]["status"],
                self.daemon.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `args --output json` as the viewer.
    fn viewer_json(&self, args: &[&str]) -> Value {
        json(&ok(with(&self.daemon, &self.viewer)
            .args(args)
            .args(["--output", "json"])))
    }
}

/// Separation of duties: the runner who started the session cannot approve its held call even
/// with the approver role (exit 4, one line naming the rule); another approver can. The
/// starter is shown verified (no marker) by `sessions ls` and `sessions inspect`.
fn a_starter_cannot_approve_its_own_held_call(backend: Backend) {
    let Some(s) = Scenario::start(backend, None) else {
        return;
    };
    let lead = token(&s.daemon, "support-lead", &["runner", "approver"]);
    let other = token(&s.daemon, "finance-approver", &["approver"]);
    let (session, approval) = s.held_call(&lead);

    let err = refused(with(&s.daemon, &lead).args(["approvals", "approve", &approval]));
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains("separation of duties"), "{err}");
    assert!(err.contains("support-lead started session"), "{err}");
    // The refused vote changed nothing.
    let shown = s.viewer_json(&["approvals", "show", &approval]);
    assert_eq!(shown["status"], "pending", "{shown}");
    assert_eq!(shown["votes"], json!([]), "{shown}");

    // Who started it, verified: the bare name in the table.
    s.wait_for_status(&session, "awaiting_approval");
    let listed = ok(with(&s.daemon, &s.viewer).args(["sessions", "ls"]));
    insta::assert_snapshot!("sessions_ls_verified_starter", redacted(&listed));

    let decided = ok(with(&s.daemon, &other).args(["approvals", "approve", &approval]));
    assert!(decided.starts_with("status: approved\n"), "{decided}");
    let shown = s.viewer_json(&["approvals", "show", &approval]);
    assert_eq!(shown["decided_by"], "finance-approver", "{shown}");
    assert_eq!(shown["decided_by_verification"], "token", "{shown}");
    assert_eq!(shown["decided_by_via"], Value::Null, "{shown}");
    assert_eq!(shown["decided_by_display"], "finance-approver", "{shown}");
    assert_eq!(shown["votes"][0]["verification"], "token", "{shown}");
    assert_eq!(shown["allow_self_approval"], false, "{shown}");

    // And in the inspect header; the decision names the decider as the vote does.
    let inspected = ok(with(&s.daemon, &s.viewer).args(["sessions", "inspect", &session]));
    assert!(
        inspected
            .lines()
            .any(|l| l.split_whitespace().eq(["started_by:", "support-lead"])),
        "{inspected}"
    );
    assert!(
        inspected.contains("approval approved by finance-approver"),
        "{inspected}"
    );
    let listed = s.viewer_json(&["sessions", "ls"]);
    assert_eq!(
        listed["sessions"][0]["started_by"],
        json!({"actor": "support-lead", "verification": "token", "via": null,
               "display": "support-lead"}),
        "{listed}"
    );
    let inspected = s.viewer_json(&["sessions", "inspect", &session]);
    assert_eq!(
        inspected["session"]["started_by"],
        listed["sessions"][0]["started_by"]
    );
}

#[test]
fn a_starter_cannot_approve_its_own_held_call_sqlite() {
    a_starter_cannot_approve_its_own_held_call(Backend::Sqlite);
}

#[test]
fn a_starter_cannot_approve_its_own_held_call_postgres() {
    a_starter_cannot_approve_its_own_held_call(Backend::Postgres);
}

/// A route-restricted approver (`tokens create --route`) cannot vote on an approval the policy
/// routes elsewhere (`phrony.com/approver_role`), and can on its own route.
fn route_restricted_approvers_vote_only_on_their_route(backend: Backend) {
    let Some(s) = Scenario::start(backend, Some("refund-approval-routed.yaml")) else {
        return;
    };
    let runner = token(&s.daemon, "support-runner", &["runner"]);
    let legal = routed_token(&s.daemon, "legal-approver", &["approver"], &["legal"]);
    let finance = routed_token(&s.daemon, "finance-approver", &["approver"], &["finance"]);
    let (_, approval) = s.held_call(&runner);
    assert_eq!(
        s.viewer_json(&["approvals", "show", &approval])["route"],
        "finance"
    );

    let err = refused(with(&s.daemon, &legal).args(["approvals", "approve", &approval]));
    assert!(err.contains("permission denied"), "{err}");
    assert!(
        err.contains("legal-approver may only vote on approvals routed to legal"),
        "{err}"
    );
    assert!(err.contains("route \"finance\""), "{err}");
    let err = refused(with(&s.daemon, &legal).args(["approvals", "reject", &approval]));
    assert!(
        err.contains("routed to legal"),
        "a reject is a vote too: {err}"
    );

    let decided = ok(with(&s.daemon, &finance).args(["approvals", "approve", &approval]));
    assert!(decided.starts_with("status: approved\n"), "{decided}");
    let shown = s.viewer_json(&["approvals", "show", &approval]);
    assert_eq!(shown["decided_by"], "finance-approver", "{shown}");
    assert_eq!(shown["votes"].as_array().map(Vec::len), Some(1), "{shown}");
}

#[test]
fn route_restricted_approvers_vote_only_on_their_route_sqlite() {
    route_restricted_approvers_vote_only_on_their_route(Backend::Sqlite);
}

#[test]
fn route_restricted_approvers_vote_only_on_their_route_postgres() {
    route_restricted_approvers_vote_only_on_their_route(Backend::Postgres);
}

/// `spec.decision.allow_self_approval: true` lets the starter approve its own held call; the
/// opt-out is in the audit: the `approval.required` event records it, `approvals show` and
/// `sessions inspect` show it.
fn a_policy_may_let_the_starter_approve(backend: Backend) {
    let Some(s) = Scenario::start(backend, Some("refund-approval-self.yaml")) else {
        return;
    };
    let lead = token(&s.daemon, "support-lead", &["runner", "approver"]);
    let (session, approval) = s.held_call(&lead);

    let shown = ok(with(&s.daemon, &s.viewer).args(["approvals", "show", &approval]));
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().eq(["allow_self_approval:", "true"])),
        "{shown}"
    );
    let decided = ok(with(&s.daemon, &lead).args(["approvals", "approve", &approval]));
    assert!(decided.starts_with("status: approved\n"), "{decided}");

    let inspected = s.viewer_json(&["sessions", "inspect", &session]);
    let timeline = inspected["timeline"].as_array().unwrap();
    let event = |kind: &str| {
        timeline
            .iter()
            .find(|e| e["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {inspected}"))
    };
    let required = event("approval.required");
    assert_eq!(
        required["event"]["payload"]["allow_self_approval"], true,
        "{required}"
    );
    let vote = event("approval.vote");
    assert_eq!(vote["event"]["actor"], "support-lead", "{vote}");
    assert_eq!(vote["event"]["actor_verification"], "token", "{vote}");
    let decided = event("approval_decided");
    assert_eq!(
        decided["approval"]["allow_self_approval"], true,
        "{decided}"
    );
    assert_eq!(
        decided["approval"]["decided_by"], "support-lead",
        "{decided}"
    );
    assert_eq!(
        inspected["session"]["started_by"]["actor"], "support-lead",
        "{inspected}"
    );
}

#[test]
fn a_policy_may_let_the_starter_approve_sqlite() {
    a_policy_may_let_the_starter_approve(Backend::Sqlite);
}

#[test]
fn a_policy_may_let_the_starter_approve_postgres() {
    a_policy_may_let_the_starter_approve(Backend::Postgres);
}
