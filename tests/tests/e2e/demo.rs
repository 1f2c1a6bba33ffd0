//! `phrony demo` through the real CLI binary: on its embedded runtime with `--no-tui --yes`
//! (the output is an insta snapshot), without a way to decide the approval, and against a
//! running daemon named by `--runtime-addr`.

use std::process::Stdio;

use regex::Regex;
use tests::cli::{fails, ok, run, table};
use tests::daemon::{Backend, phrony};
use tests::stub::stub_daemon;

/// The policy denial's status line. The runtime sends the denied call's result and the next
/// model turn's text on the interactive stream without a fixed order between them, so the
/// snapshot leaves this line out and the tests check it on its own.
const DENIAL: &str = "── denied by policy payments/refund-hard-limit@1.0.0: payments.issue-refund@1.0.0 \
                      was not dispatched: Refund amount exceeds the absolute ceiling for \
                      agent-initiated refunds. ──";

/// The conversation part of the demo's output (up to the audit trail), ids redacted, the
/// denial line left out.
fn conversation(stdout: &str) -> String {
    let session = Regex::new(r"run_[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}").unwrap();
    let id = Regex::new(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}").unwrap();
    let part = stdout.split("The audit trail").next().unwrap();
    let part = session.replace_all(part, "[session]");
    let part = id.replace_all(&part, "[id]");
    part.lines()
        .filter(|line| *line != DENIAL)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks what every successful demo prints: the three scenarios' outcomes and the audit
/// trail that records them.
fn check_the_walk(stdout: &str) {
    assert_eq!(stdout.matches(DENIAL).count(), 1, "{stdout}");
    let (talk, trail) = stdout.split_once("The audit trail").unwrap();
    // The €100 and the approved €400 refund reached the worker; the €14,000 one never did.
    for refund in ["rf_ORD-3", "rf_ORD-1"] {
        assert!(
            talk.contains(&format!("\"refund_id\":\"{refund}\"")),
            "{talk}"
        );
    }
    assert!(!talk.contains("rf_ORD-2"), "{talk}");
    assert!(trail.contains("status:       completed"), "{trail}");
    assert_eq!(
        trail
            .matches("[invocation/invocation_completed] succeeded payments.issue-refund@1.0.0")
            .count(),
        2,
        "{trail}"
    );
    assert!(
        trail.contains("[event/approval.decided] approval approved by ")
            && trail.contains("approved by phrony demo --yes"),
        "{trail}"
    );
    assert!(
        trail.contains("[event/tool.policy_denied] policy denied payments.issue-refund: Refund amount exceeds the absolute ceiling for agent-initiated refunds. (payments/refund-hard-limit@1.0.0)"),
        "{trail}"
    );
    assert!(
        stdout.contains("Do the same with a real model and the Python worker:"),
        "{stdout}"
    );
}

/// `phrony demo --no-tui --yes` on its embedded runtime: the €100 refund is dispatched, the
/// €400 one is held and approved by `--yes`, the €14,000 one is denied by the hard limit; the
/// audit trail and the next steps follow.
#[test]
fn the_demo_walks_the_three_scenarios_on_an_embedded_runtime() {
    let home = tempfile::tempdir().unwrap();
    let stdout = ok(phrony()
        .args(["demo", "--no-tui", "--yes"])
        .env("PHRONY_ACTOR", "emad")
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path())
        .stdin(Stdio::null()));
    check_the_walk(&stdout);
    // Attribution: the operator named by PHRONY_ACTOR started the session and approved.
    assert!(
        stdout.contains("started_by:   emad (unverified)"),
        "{stdout}"
    );
    assert!(
        stdout.starts_with("phrony demo: started a runtime in this process"),
        "{stdout}"
    );
    insta::assert_snapshot!("demo_no_tui_yes", conversation(&stdout));
    // Nothing was left in the user's data directory.
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);
}

/// Without `--yes` and with stdin at its end, nobody can decide the €400 refund: the demo
/// stops there and says how to run it unattended.
#[test]
fn the_demo_without_a_decision_stops_at_the_approval_and_names_yes() {
    let stderr = fails(
        phrony()
            .args(["demo", "--no-tui"])
            .stdin(Stdio::null())
            .stdout(Stdio::null()),
    );
    assert!(stderr.contains("run with --yes"), "{stderr}");
}

/// Piped input is all there from the start, while the €400 approval opens seconds later: the
/// `/approve` line waits for it (it used to arrive first, find no approval pending, and leave
/// the demo stopped at the approval with stdin ended).
#[test]
fn a_piped_approve_decides_the_held_refund() {
    let home = tempfile::tempdir().unwrap();
    let input = home.path().join("operator.txt");
    std::fs::write(&input, "/approve the damage photos check out\n").unwrap();
    let stdout = ok(phrony()
        .args(["demo", "--no-tui"])
        .env("PHRONY_ACTOR", "emad")
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path())
        .stdin(std::fs::File::open(&input).unwrap()));
    let (talk, trail) = stdout.split_once("The audit trail").unwrap();
    assert!(!talk.contains("no approval is pending"), "{talk}");
    assert!(
        talk.contains("── approval approved by emad (1/1): the damage photos check out ──"),
        "{talk}"
    );
    assert!(talk.contains("\"refund_id\":\"rf_ORD-1\""), "{talk}");
    assert!(!talk.contains("rf_ORD-2"), "{talk}");
    assert!(trail.contains("status:       completed"), "{trail}");
}

/// With `--runtime-addr` the demo uses that runtime (which runs the stub model): the session
/// is found there afterwards, completed.
#[test]
fn the_demo_uses_the_runtime_at_runtime_addr() {
    let Some(daemon) = stub_daemon(Backend::Sqlite) else {
        return;
    };
    let out = run(phrony()
        .args(["demo", "--no-tui", "--yes", "--runtime-addr", daemon.addr()])
        .env("PHRONY_ACTOR", "emad")
        .stdin(Stdio::null()));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.starts_with(&format!(
            "phrony demo: using the runtime at {}",
            daemon.addr()
        )),
        "{}",
        out.stdout
    );
    check_the_walk(&out.stdout);
    assert!(
        out.stdout.contains("started_by:   emad (unverified)"),
        "{}",
        out.stdout
    );
    let listed = ok(tests::cli::phrony(&daemon, "emad").args([
        "sessions",
        "ls",
        "--metadata",
        "demo=refund",
    ]));
    let rows = table(&listed);
    assert_eq!(rows.len(), 2, "{listed}");
    assert_eq!(rows[1][3], "completed", "{listed}");
}
