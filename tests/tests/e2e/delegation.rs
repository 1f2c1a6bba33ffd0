//! Delegation end to end: the real `phrony-runtime` (scripted `stub` model), the real `phrony`
//! CLI and a real worker process (the soak's journaling worker), through the reference's bundle
//! scenarios — a payment handed to a specialist whose transfer waits for a human inside the
//! child session (J4), a delegation to an agent without tools (J5), the root's secret reaching
//! the child (J6) — with the daemon killed with SIGKILL while the child waits.
//!
//! The bundle is `tests/fixtures/bundles/payment-desk`: an orchestrator that calls `pay` (the
//! payment specialist, whose `transfer_funds` above 1000 needs one approval) and then
//! `payment_status` (an agent without tools, `result: full`).

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::cli::{json, ok};
use tests::daemon::{Backend, Daemon};
use tests::soak::worker::{JournalEntry, read_journal};
use tests::stub::stub_daemon;

use crate::bundles::copy_dir;

const BUNDLE: &str = "finance/payment-desk";
const ACTOR: &str = "ci-alice";
const SECRET_VAR: &str = "PHRONY_TEST_PAYDESK_TOKEN";
/// How long a step may take (a failure guard, not a pace).
const WAIT: Duration = Duration::from_secs(60);

fn phrony(daemon: &Daemon) -> Command {
    let mut cmd = tests::cli::phrony(daemon, ACTOR);
    cmd.env(SECRET_VAR, "paydesk-token-never-shown");
    cmd
}

/// The soak worker serving `payments.transfer-funds@1.0.0` (among others), journaling every
/// execution to `journal`; it reconnects by itself after a daemon restart.
struct Worker(Child);

impl Worker {
    fn start(daemon: &Daemon, journal: &Path) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_soak"))
            .args(["worker", "--addr", daemon.addr(), "--journal"])
            .arg(journal)
            .args(["--work-ms", "10"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Self(child)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn inspect(daemon: &Daemon, id: &str) -> Value {
    json(&ok(
        phrony(daemon).args(["sessions", "inspect", id, "--output", "json"])
    ))
}

fn wait_status(daemon: &Daemon, id: &str, wanted: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let inspected = inspect(daemon, id);
        let status = inspected["session"]["status"].as_str().unwrap().to_owned();
        if status == wanted {
            return inspected;
        }
        assert!(
            !["completed", "failed", "cancelled"].contains(&status.as_str()),
            "session {id} ended {status} while waiting for {wanted}: {inspected}\n{}",
            daemon.logs()
        );
        assert!(
            Instant::now() < deadline,
            "session {id} never reached {wanted}\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The pending approvals (id, session id).
fn pending(daemon: &Daemon) -> Vec<(String, String)> {
    let listed = json(&ok(phrony(daemon).args([
        "approvals",
        "list",
        "--status",
        "pending",
        "--output",
        "json",
    ])));
    listed["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["id"].as_str().unwrap().to_owned(),
                a["session_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn transfers(journal: &Path) -> Vec<Value> {
    read_journal(journal)
        .unwrap()
        .into_iter()
        .map(|e| match e {
            JournalEntry::Exec { tool, args, .. } => (tool, args),
        })
        .filter(|(tool, _)| tool == "payments.transfer-funds")
        .map(|(_, args)| args)
        .collect()
}

fn scenario(backend: Backend) {
    let Some(mut daemon) = stub_daemon(backend) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    let fixture: PathBuf = tests::workspace_root().join("tests/fixtures/bundles/payment-desk");
    copy_dir(&fixture, project.path());
    let bundle = project.path().join("bundle.yaml");
    ok(phrony(&daemon).args(["bundles", "publish"]).arg(&bundle));
    ok(phrony(&daemon).args(["bundles", "deploy", &format!("{BUNDLE}@1.0.0")]));
    let journal = project.path().join("worker.jsonl");
    let worker = Worker::start(&daemon, &journal);

    let started = ok(phrony(&daemon).args(["bundles", "run", BUNDLE, "--input", "Pay Acme Corp"]));
    let root = started
        .strip_prefix("session ")
        .and_then(|s| s.strip_suffix(" started (status: running)\n"))
        .unwrap_or_else(|| panic!("unexpected run output: {started:?}"))
        .to_owned();

    // The specialist's transfer of 1500 waits for a human inside the child session; the
    // orchestrator waits for its call (not failed, not asking anyone itself).
    let deadline = Instant::now() + WAIT;
    let (approval, child) = loop {
        if let Some(found) = pending(&daemon).into_iter().next() {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no pending approval\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(child, root);
    let tree = wait_status(&daemon, &root, "awaiting_tool");
    let children = tree["session"]["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{tree}");
    assert_eq!(children[0]["id"], child.as_str());
    assert_eq!(children[0]["depth"], 1);
    assert_eq!(children[0]["status"], "awaiting_approval");
    assert!(transfers(&journal).is_empty());

    // SIGKILL mid-child; the restarted daemon resumes the same child, which still waits.
    daemon.kill9();
    daemon.restart();
    assert_eq!(pending(&daemon), [(approval.clone(), child.clone())]);
    let decided = ok(phrony(&daemon).args([
        "approvals",
        "approve",
        &approval,
        "--comment",
        "invoice checked",
    ]));
    assert!(decided.starts_with("status: approved\n"), "{decided}");

    // The transfer runs once; the child completes; the orchestrator gets its summary, asks
    // the status agent (no tools, full output) and completes.
    let done = wait_status(&daemon, &root, "completed");
    let transfers = transfers(&journal);
    assert_eq!(transfers.len(), 1, "{transfers:?}");
    assert_eq!(transfers[0]["amount"], 1500);
    let children = done["session"]["children"].as_array().unwrap();
    assert_eq!(children.len(), 2, "{done}");
    assert_eq!(children[0]["id"], child.as_str());
    assert!(
        children.iter().all(|c| c["status"] == "completed"),
        "{done}"
    );
    let shown = done.to_string();
    assert!(!shown.contains("paydesk-token-never-shown"), "{shown}");
    let results: Vec<Value> = done["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["event"]["type"] == "tool.completed" && e["event"]["session_id"] == root.as_str()
        })
        .map(|e| e["event"]["payload"].clone())
        .collect();
    assert_eq!(results.len(), 2, "{done}");
    assert_eq!(
        results[0]["result"],
        serde_json::json!({"output": "Payment processed successfully."})
    );
    assert_eq!(
        results[1]["result"]["message"],
        "The payment to Acme Corp is pending settlement."
    );
    assert_eq!(
        done["session"]["output"]["message"],
        "Acme Corp has been paid; settlement is pending."
    );
    drop(worker);
}

#[test]
fn a_child_waiting_for_a_human_survives_sigkill_on_sqlite() {
    scenario(Backend::Sqlite);
}

#[test]
fn a_child_waiting_for_a_human_survives_sigkill_on_postgres() {
    scenario(Backend::Postgres);
}
