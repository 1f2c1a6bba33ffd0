//! A storage outage on the real daemon: another process (Python's `sqlite3`) holds the SQLite
//! file's write lock past the daemon's busy timeout (`RUNTIME_SQLITE_BUSY_TIMEOUT=500ms`) while
//! a session waits on an approval. Health turns NOT_SERVING by itself, RPCs that must write
//! answer UNAVAILABLE naming the database, nothing fails; when the lock is released health is
//! SERVING again by itself, the approval goes through, the worker runs the refund once, the
//! session completes and the audit verifies.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use crate::support::{Launch, agent_ref, sqlite_url};
use pb::runtime_client::RuntimeClient;
use phrony_proto::runtime::v1 as pb;
use phrony_test_support::stub::{one_refund_turns, write_refund_agent};
use phrony_test_support::worker::RefundWorker;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// A Python process holding `BEGIN EXCLUSIVE` on the database until [`Locker::release`].
pub(crate) struct Locker {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Locker {
    pub(crate) fn hold(db: &Path) -> Self {
        let script = "import sqlite3, sys\n\
                      c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n\
                      c.execute('BEGIN EXCLUSIVE')\n\
                      print('locked', flush=True)\n\
                      sys.stdin.readline()\n\
                      c.execute('COMMIT')\n";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the lock holder");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(
            line.trim(),
            "locked",
            "the lock holder did not take the lock"
        );
        Self { child, stdin }
    }

    pub(crate) fn release(mut self) {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(b"\n").unwrap();
        drop(stdin);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the lock holder failed: {status}");
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn session_status(client: &mut RuntimeClient<Channel>, id: &str) -> String {
    let sessions = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    sessions
        .into_iter()
        .find(|s| s.id == id)
        .map(|s| s.status)
        .unwrap_or_default()
}

async fn pending_approval(client: &mut RuntimeClient<Channel>, session_id: &str) -> String {
    for _ in 0..300 {
        let approvals = client
            .list_approvals(pb::ListApprovalsRequest {
                session_id: session_id.into(),
                status: "pending".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .approvals;
        if let Some(a) = approvals.first() {
            return a.id.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no pending approval for {session_id}");
}

fn approve(approval_id: &str) -> pb::DecideApprovalRequest {
    pb::DecideApprovalRequest {
        approval_id: approval_id.into(),
        decision: pb::ApprovalDecision::Approve.into(),
        comment: "ok".into(),
        actor: "emad".into(),
        ..Default::default()
    }
}

fn run_request() -> pb::RunSessionRequest {
    pb::RunSessionRequest {
        agent_ref: Some(agent_ref("")),
        input: br#"{"message": "Refund 400 EUR for ORD-1, the item arrived damaged."}"#.to_vec(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_sqlite_lock_held_by_another_process_turns_health_not_serving_and_nothing_is_lost() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let db_file = home.path().join("ledger.db");
    let daemon = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("RUNTIME_SQLITE_BUSY_TIMEOUT", "500ms")
        .start()
        .await;
    let mut daemon = daemon;
    let mut client = daemon.client().await;
    let project = home.path().join("agent");
    write_refund_agent(
        &project,
        &one_refund_turns("ORD-1", 400, "The item arrived damaged."),
    );
    let snapshot = phrony_manifest::load_agent(project.join("agent.yaml"))
        .unwrap_or_else(|d| panic!("the refund agent does not compile:\n{d}"))
        .agent
        .snapshot_json();
    client
        .publish(pb::PublishRequest {
            manifest: snapshot,
            actor: "alice".into(),
        })
        .await
        .unwrap();
    client
        .deploy(pb::DeployRequest {
            agent_ref: Some(agent_ref("0.1.0")),
            actor: "alice".into(),
            allow_new_secret_endpoints: false,
        })
        .await
        .unwrap();
    let worker = RefundWorker::start(&daemon.addr, "outage-worker");

    let session_id = client
        .run_session(run_request())
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let approval_id = pending_approval(&mut client, &session_id).await;

    // Another process takes the write lock and keeps it.
    let lock = Locker::hold(&db_file);
    daemon.wait_for_health(ServingStatus::NotServing).await;
    let log = daemon.logged("health is NOT_SERVING").await;
    assert!(log.contains("health is NOT_SERVING"), "{log}");
    assert!(
        log.contains("database is locked"),
        "the cause is named:\n{log}"
    );

    // Writes answer UNAVAILABLE, naming the database; reads still work.
    let vote = client
        .decide_approval(approve(&approval_id))
        .await
        .unwrap_err();
    assert_eq!(vote.code(), Code::Unavailable, "{vote:?}");
    assert!(vote.message().contains("database"), "{vote:?}");
    let run = client.run_session(run_request()).await.unwrap_err();
    assert_eq!(run.code(), Code::Unavailable, "{run:?}");
    assert!(run.message().contains("database"), "{run:?}");
    assert_eq!(
        session_status(&mut client, &session_id).await,
        "awaiting_approval",
        "the outage failed nothing"
    );

    lock.release();
    daemon.wait_for_health(ServingStatus::Serving).await;
    assert!(
        daemon.stderr().contains("health is SERVING"),
        "{}",
        daemon.stderr()
    );

    client.decide_approval(approve(&approval_id)).await.unwrap();
    let mut status = String::new();
    for _ in 0..300 {
        status = session_status(&mut client, &session_id).await;
        if status == "completed" || status == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "completed", "{}", daemon.stderr());
    let refunds = worker.invocations();
    assert_eq!(refunds.len(), 1, "the refund ran once: {refunds:?}");
    assert_eq!(refunds[0]["order_id"], "ORD-1");

    let audit = client
        .verify_audit(pb::VerifyAuditRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(audit.verified, "{audit:?}");
    crate::support::stop_worker(worker).await;
}
