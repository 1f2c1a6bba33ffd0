//! Storage outages on a real SQLite file: another connection (as another process would) holds
//! the database's write lock past the busy timeout. A session never fails for it: a write the
//! driver cannot make suspends the session, which the engine resumes by the recovery path once
//! the database takes writes again; a worker result that arrives meanwhile is held until it is
//! recorded. Nothing runs twice.

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use phrony_engine::{LedgerStore, ManualClock};
use phrony_ledger::{CallStatus, Ledger, LedgerOptions, SessionStatus};
use serde_json::json;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Executor as _};
use tokio::sync::Notify;

use crate::common::*;

/// A store on a SQLite file whose writers give up on the lock after 200 ms (the probe after
/// 100 ms), with `agent` published.
async fn file_store(
    dir: &tempfile::TempDir,
    clock: &Arc<ManualClock>,
    agent: &phrony_manifest::CompiledAgent,
) -> (Arc<LedgerStore>, uuid::Uuid, String) {
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let ledger = Ledger::connect_with(
        &url,
        LedgerOptions {
            sqlite_busy_timeout: Duration::from_millis(200),
            probe_busy_timeout: Duration::from_millis(100),
            ..ledger_options(clock)
        },
    )
    .await
    .unwrap();
    ledger.migrate().await.unwrap();
    let version_id = publish(
        &ledger,
        String::from_utf8(agent.snapshot_json()).unwrap(),
        agent.content_hash(),
    )
    .await;
    (
        Arc::new(LedgerStore::new(ledger, Some(cipher()))),
        version_id,
        url,
    )
}

/// Another connection holding the write lock (`BEGIN EXCLUSIVE`) until [`Lock::release`].
struct Lock(sqlx::SqliteConnection);

impl Lock {
    async fn take(url: &str) -> Self {
        let mut conn = SqliteConnectOptions::from_str(url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        conn.execute("BEGIN EXCLUSIVE").await.unwrap();
        Self(conn)
    }

    async fn release(mut self) {
        self.0.execute("COMMIT").await.unwrap();
    }
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The model's completion cannot be recorded: the driver stops, the session is suspended (not
/// failed), and once the lock is gone the engine resumes it through `recover`: the turn's model
/// call runs again (nothing of it was recorded) and the session completes; each tool ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_write_fails_is_suspended_and_resumed_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::starting_now());
    let agent = refund_agent(&AgentOptions::default());
    let (store, version_id, url) = file_store(&dir, &clock, &agent).await;
    let gate = Arc::new(Notify::new());
    let script = Script::new(vec![
        Step::call("lookup_order", json!({"order_id": "ORD-1"})).gated(Arc::clone(&gate)),
        // The same completion asked again after the resume.
        Step::call("lookup_order", json!({"order_id": "ORD-1"})),
        Step::call("issue_refund", refund("ORD-1", 100.0)),
        Step::say("Refund rf_2891 issued for €100."),
    ]);
    let h = Harness::on(Arc::clone(&store), clock, agent, version_id, script).await;
    let s = h.start("Refund €100 for ORD-1.").await;
    until("the model is asked", async || {
        h.script.requests().len() == 1
    })
    .await;

    let lock = Lock::take(&url).await;
    gate.notify_one();
    until("the driver's write failed", async || {
        !store.ledger().is_writable()
    })
    .await;
    // The driver stopped without failing the session.
    until("the session is suspended", async || {
        h.engine.suspended_sessions() == [s.id.clone()]
    })
    .await;
    assert_eq!(
        store.get_session(&s.id).await.unwrap().status,
        SessionStatus::Running
    );
    assert!(h.worker.tools().is_empty(), "nothing was dispatched");

    lock.release().await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:#?}");
    assert_eq!(
        done.output.unwrap()["message"],
        "Refund rf_2891 issued for €100."
    );
    assert_eq!(
        h.script.requests().len(),
        4,
        "the lost completion was asked again"
    );
    assert_eq!(
        h.worker.tools(),
        ["orders.lookup-order", "payments.issue-refund"],
        "each tool ran once"
    );
    let types = h.event_types(&s.id).await;
    assert!(!types.iter().any(|t| t == "session.failed"), "{types:?}");
    assert!(store.ledger().is_writable());
    assert!(h.engine.suspended_sessions().is_empty());
}

/// The worker's result arrives while the lock is held: it is not lost and not acknowledged
/// until it is recorded, once; the irreversible refund that follows runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_result_that_arrives_during_an_outage_is_recorded_once_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::starting_now());
    let agent = refund_agent(&AgentOptions::default());
    let (store, version_id, url) = file_store(&dir, &clock, &agent).await;
    let script = Script::new(vec![
        Step::call("lookup_order", json!({"order_id": "ORD-1"})),
        Step::call("issue_refund", refund("ORD-1", 100.0)),
        Step::say("Refund rf_2891 issued for €100."),
    ]);
    let h = Harness::on(Arc::clone(&store), clock, agent, version_id, script).await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Refund €100 for ORD-1.").await;
    until("the lookup is with the worker", async || {
        h.worker.invoked("orders.lookup-order").len() == 1
    })
    .await;
    let held = h.worker.invoked("orders.lookup-order")[0].clone();

    let lock = Lock::take(&url).await;
    h.worker.set_behaviour(Behaviour::Answer);
    h.worker.release(held.clone());
    until("recording the result failed", async || {
        !store.ledger().is_writable()
    })
    .await;
    assert!(
        h.worker.acks.lock().unwrap().is_empty(),
        "an unrecorded result is not acknowledged"
    );
    assert_eq!(
        store.get_tool_call(&held.call_id).await.unwrap().status,
        CallStatus::Dispatched
    );

    lock.release().await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:#?}");
    assert_eq!(
        h.worker.tools(),
        ["orders.lookup-order", "payments.issue-refund"],
        "each tool ran once"
    );
    let events = h.events(&s.id).await;
    let completed_lookup = events
        .iter()
        .filter(|e| e.event_type == "tool.completed" && e.call_id.as_deref() == Some(&held.call_id))
        .count();
    assert_eq!(completed_lookup, 1, "the outcome is recorded once");
    let acks = h.worker.wait_acks(2).await;
    assert_eq!(acks[0], held.call_id);
    assert!(!events.iter().any(|e| e.event_type == "session.failed"));
}

/// An approval timeout that falls due while the database cannot write is postponed — not
/// lost, not retried in a loop, and the session is not failed — and applies once when the lock
/// is gone: the call is rejected by the timeout's default and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_timeout_due_during_an_outage_applies_once_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::starting_now());
    let agent = refund_agent(&AgentOptions::with_decision(
        "    timeout:\n      after_minutes: 5\n      default: deny\n",
    ));
    let (store, version_id, url) = file_store(&dir, &clock, &agent).await;
    let script = Script::new(vec![
        Step::call("issue_refund", refund("ORD-1", 400.0)),
        Step::say("The refund needs a human; none answered in time."),
    ]);
    let h = Harness::on(
        Arc::clone(&store),
        Arc::clone(&clock),
        agent,
        version_id,
        script,
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;

    let lock = Lock::take(&url).await;
    clock.advance(Duration::from_secs(6 * 60));
    until("the timeout could not be recorded", async || {
        !store.ledger().is_writable()
    })
    .await;
    assert_eq!(
        store.get_approval(approval.id).await.unwrap().status,
        phrony_ledger::ApprovalStatus::Pending
    );
    assert_eq!(
        store.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );

    lock.release().await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:#?}");
    assert!(h.worker.tools().is_empty(), "the refund never ran");
    let (text, is_error) = last_tool_result(&h.script.requests()[1]);
    assert!(is_error);
    assert!(text.contains("system:timeout"), "{text}");
    let decided = h
        .events(&s.id)
        .await
        .into_iter()
        .filter(|e| e.event_type == "approval.decided")
        .count();
    assert_eq!(decided, 1, "the timeout applied once");
}
