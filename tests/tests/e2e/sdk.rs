//! The Rust SDK (`phrony-sdk`) against the real daemon (scripted `stub` model, SQLite): a
//! typed [`Worker`] and the [`Client`] walk the tutorial's approval; a cancelled session
//! cancels the running handler; a worker whose stream is cut reconnects and serves again; a
//! drained worker finishes its running call first and refuses new ones.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use phrony_sdk::{Call, Client, ToolError, Worker, WorkerState};
use serde::Deserialize;
use serde_json::{Value, json};
use tests::daemon::{Backend, Daemon};
use tests::proxy::LossyProxy;
use tests::stub::{REFUND_AGENT, publish_and_deploy, stub_daemon, write_refund_agent};
use tokio::sync::watch;

/// How long a step may take (a failure guard, not a pace).
const WAIT: Duration = Duration::from_secs(60);

/// The refund tool's arguments, typed.
#[derive(Debug, Clone, Deserialize, PartialEq)]
struct Refund {
    order_id: String,
    amount: f64,
    currency: String,
    reason: String,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A daemon with the refund agent deployed, its model asking for one refund of `amount`.
fn deployed(amount: u32) -> Option<(Daemon, tempfile::TempDir)> {
    let daemon = stub_daemon(Backend::Sqlite)?;
    let project = tempfile::tempdir().unwrap();
    write_refund_agent(
        project.path(),
        &phrony_test_support::stub::one_refund_turns("ORD-1", amount, "damaged"),
    );
    publish_and_deploy(&daemon, project.path(), REFUND_AGENT);
    Some((daemon, project))
}

/// A worker whose handler records the typed arguments and answers once `gate` is open.
fn refund_worker(
    addr: &str,
    id: &str,
    calls: &Arc<Mutex<Vec<Refund>>>,
    gate: &watch::Receiver<bool>,
    cancelled: &Arc<Mutex<Vec<String>>>,
) -> Worker {
    let (calls, gate, cancelled) = (Arc::clone(calls), gate.clone(), Arc::clone(cancelled));
    Worker::builder()
        .runtime_addr(addr)
        .worker_id(id)
        .concurrency(2)
        .tool(
            "payments.issue-refund",
            "1.0.0",
            move |args: Refund, call: Call| {
                calls.lock().unwrap().push(args.clone());
                let (mut gate, cancelled) = (gate.clone(), Arc::clone(&cancelled));
                async move {
                    // Records the cancel the worker delivers, however the handler ends, unless
                    // it is only the call's deadline passing.
                    let watcher = call.clone();
                    tokio::spawn(async move {
                        watcher.cancelled().await;
                        let by_deadline = watcher
                            .deadline
                            .is_some_and(|at| std::time::SystemTime::now() >= at);
                        if !by_deadline {
                            cancelled.lock().unwrap().push(watcher.call_id.clone());
                        }
                    });
                    let _ = gate.wait_for(|open| *open).await;
                    Ok::<_, ToolError>(json!({"refund_id": format!("rf_{}", args.order_id), "amount": args.amount}))
                }
            },
        )
        .build()
        .unwrap()
}

async fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The tutorial's €400 refund through the SDK alone: run, watch the approval appear with the
/// seed's fields, approve it, wait for the answer; the typed handler ran once, after the vote.
#[test]
fn a_typed_worker_and_the_client_walk_the_tutorials_approval() {
    let Some((daemon, _project)) = deployed(400) else {
        return;
    };
    let rt = runtime();
    rt.block_on(async {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(Mutex::new(Vec::new()));
        let (_open, gate) = watch::channel(true);
        let mut worker = refund_worker(daemon.addr(), "sdk-e2e", &calls, &gate, &cancelled).start();
        worker.registered().await.unwrap();

        let client = Client::connect(daemon.addr()).await.unwrap();
        let metadata = BTreeMap::from([("ticket".to_owned(), "T-1042".to_owned())]);
        let session = client
            .run(
                REFUND_AGENT,
                json!("Refund €400 for ORD-1, the item arrived damaged."),
                metadata,
            )
            .await
            .unwrap();

        let approvals = client.approvals();
        let mut pending = std::pin::pin!(approvals.watch());
        let approval = tokio::time::timeout(WAIT, pending.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(approval.session_id, session.id());
        assert_eq!(
            approval.agent_ref.as_deref(),
            Some("support/refund-agent@0.1.0")
        );
        assert_eq!(approval.tool, "payments.issue-refund");
        assert_eq!(
            approval.policy_ref.as_deref(),
            Some("payments/refund-approval-boundary@1.0.0")
        );
        assert_eq!(approval.args["amount"], 400);
        assert!(
            calls.lock().unwrap().is_empty(),
            "the handler ran before the approval"
        );
        let listed = approvals.list(Some("pending")).await.unwrap();
        assert_eq!(
            listed.iter().map(|a| &a.id).collect::<Vec<_>>(),
            [&approval.id]
        );

        let outcome = approvals
            .approve(&approval.id, Some("damaged on arrival"))
            .await
            .unwrap();
        assert_eq!(outcome.status, "approved");
        let decided = approvals.get(&approval.id).await.unwrap();
        assert_eq!(decided.status, "approved");
        assert_eq!(
            decided.decided_by_display().as_deref(),
            Some("sdk (unverified)")
        );
        let listed = client
            .sessions()
            .list(&phrony_sdk::SessionFilter {
                metadata: BTreeMap::from([("ticket".to_owned(), "T-1042".to_owned())]),
                ..phrony_sdk::SessionFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(listed.sessions.len(), 1);
        assert_eq!(listed.sessions[0].id, session.id());
        let result = session.wait_for(WAIT).await.unwrap();
        assert!(result.is_completed(), "{result:?}");
        assert_eq!(result.output.as_deref(), Some("The refund was handled."));
        assert_eq!(
            *calls.lock().unwrap(),
            [Refund {
                order_id: "ORD-1".into(),
                amount: 400.0,
                currency: "EUR".into(),
                reason: "damaged".into()
            }]
        );
        // The audit trail names the worker's result.
        let inspected = client.sessions().inspect(session.id()).await.unwrap();
        assert_eq!(inspected.session.status, "completed");
        assert!(
            inspected
                .timeline
                .iter()
                .any(|e| e.kind == "tool.completed"),
            "{:?}",
            inspected
                .timeline
                .iter()
                .map(|e| &e.kind)
                .collect::<Vec<_>>()
        );
        assert!(cancelled.lock().unwrap().is_empty());
    });
}

/// Cancelling a session whose call is running cancels the handler on the worker; cutting the
/// worker's connection makes it reconnect and serve the next call.
#[test]
fn a_cancel_reaches_the_handler_and_a_cut_stream_reconnects() {
    let Some((daemon, _project)) = deployed(100) else {
        return;
    };
    let rt = runtime();
    rt.block_on(async {
        let proxy = LossyProxy::start(daemon.addr(), u32::MAX / 2);
        let calls = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(Mutex::new(Vec::new()));
        let (open, gate) = watch::channel(false);
        let mut worker = refund_worker(proxy.addr(), "sdk-cut", &calls, &gate, &cancelled).start();
        worker.registered().await.unwrap();
        let client = Client::connect(daemon.addr()).await.unwrap();

        // A €100 refund is allowed: it reaches the handler, which holds it.
        let first = client
            .run(
                REFUND_AGENT,
                json!("Refund €100 for ORD-1."),
                BTreeMap::new(),
            )
            .await
            .unwrap();
        until("the first call at the handler", || {
            (calls.lock().unwrap().len() == 1).then_some(())
        })
        .await;
        first.cancel().await.unwrap();
        let cancelled_id = until("the handler's cancel", || {
            cancelled.lock().unwrap().first().cloned()
        })
        .await;
        assert!(
            cancelled_id.contains(first.id()),
            "{cancelled_id} is not a call of {}",
            first.id()
        );
        assert_eq!(first.wait_for(WAIT).await.unwrap().status, "cancelled");

        // The connection is lost; the worker comes back by itself.
        proxy.cut();
        until("the worker noticing the cut", || {
            (worker.state() == WorkerState::Connecting).then_some(())
        })
        .await;
        until("the worker registered again", || {
            (worker.state() == WorkerState::Serving).then_some(())
        })
        .await;
        open.send_replace(true);
        let second = client
            .run(
                REFUND_AGENT,
                json!("Refund €100 for ORD-1."),
                BTreeMap::new(),
            )
            .await
            .unwrap();
        let result = second.wait_for(WAIT).await.unwrap();
        assert!(result.is_completed(), "{result:?}");
        assert_eq!(calls.lock().unwrap().len(), 2);
    });
}

/// Draining lets the running call finish and be recorded, and the worker then leaves: a later
/// call waits for another worker instead of being taken.
#[test]
fn a_drained_worker_finishes_its_running_call_first() {
    let Some((daemon, _project)) = deployed(100) else {
        return;
    };
    let rt = runtime();
    rt.block_on(async {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(Mutex::new(Vec::new()));
        let (open, gate) = watch::channel(false);
        let mut worker =
            refund_worker(daemon.addr(), "sdk-drain", &calls, &gate, &cancelled).start();
        worker.registered().await.unwrap();
        let client = Client::connect(daemon.addr()).await.unwrap();
        let session = client
            .run(
                REFUND_AGENT,
                json!("Refund €100 for ORD-1."),
                BTreeMap::new(),
            )
            .await
            .unwrap();
        until("the call at the handler", || {
            (calls.lock().unwrap().len() == 1).then_some(())
        })
        .await;

        let drained = tokio::spawn(worker.drain(WAIT));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !drained.is_finished(),
            "the drain did not wait for the running call"
        );
        open.send_replace(true);
        tokio::time::timeout(WAIT, drained).await.unwrap().unwrap();
        let result = session.wait_for(WAIT).await.unwrap();
        assert!(result.is_completed(), "{result:?}");
        assert!(cancelled.lock().unwrap().is_empty());

        // Nobody serves the tool any more: a new call is not taken.
        let later = client
            .run(
                REFUND_AGENT,
                json!("Refund €100 for ORD-1."),
                BTreeMap::new(),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(calls.lock().unwrap().len(), 1);
        later.cancel().await.unwrap();
    });
}

/// A worker configuration that cannot work is refused before it connects, naming the problem.
#[test]
fn a_bad_worker_configuration_is_named() {
    let err = Worker::builder().build().unwrap_err();
    assert!(err.to_string().contains("no tool to serve"), "{err}");
    let handler = |_: Value, _: Call| async { Ok::<_, ToolError>(json!({})) };
    let err = Worker::builder()
        .tool("a.b", "1.0.0", handler)
        .tool("a.b", "1.0.0", handler)
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("a.b@1.0.0 is served twice"),
        "{err}"
    );
}

/// Creates an API token on the daemon's database (`phrony-runtime tokens create`); returns the
/// secret (the last line of stdout).
fn token(daemon: &Daemon, name: &str, args: &[&str]) -> String {
    let out = tests::cli::ok(
        daemon
            .runtime()
            .args(["tokens", "create", "--name", name])
            .args(args),
    );
    out.lines().last().unwrap().to_owned()
}

/// In `required` mode a worker without a credential, or whose token may not serve the tool, is
/// refused for good (it stops instead of retrying); with a worker token for the tool it
/// registers and serves.
#[test]
fn a_worker_needs_a_token_that_may_serve_its_tools() {
    let Some(daemon) = Daemon::start_with_env(
        Backend::Sqlite,
        &[
            ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
            ("RUNTIME_AUTH", "required"),
        ],
    ) else {
        return;
    };
    let allowed = token(
        &daemon,
        "refund-bot",
        &["--role", "worker", "--tool", "payments.issue-refund@1.0.0"],
    );
    let other = token(
        &daemon,
        "lookup-bot",
        &["--role", "worker", "--tool", "orders.*"],
    );
    let rt = runtime();
    rt.block_on(async {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(Mutex::new(Vec::new()));
        let (_open, gate) = watch::channel(true);
        let build = |id: &str| refund_worker(daemon.addr(), id, &calls, &gate, &cancelled);

        let mut anonymous = build("sdk-anon").start();
        let err = tokio::time::timeout(WAIT, anonymous.registered())
            .await
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        assert!(matches!(anonymous.state(), WorkerState::Stopped(Some(_))));

        let mut wrong = Worker::builder()
            .runtime_addr(daemon.addr())
            .worker_id("sdk-wrong")
            .token(&other)
            .tool(
                "payments.issue-refund",
                "1.0.0",
                |_: Value, _: Call| async { Ok::<_, ToolError>(json!({})) },
            )
            .build()
            .unwrap()
            .start();
        let err = tokio::time::timeout(WAIT, wrong.registered())
            .await
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("payments.issue-refund"), "{err}");

        let mut served = Worker::builder()
            .runtime_addr(daemon.addr())
            .worker_id("sdk-token")
            .token(&allowed)
            .tool(
                "payments.issue-refund",
                "1.0.0",
                |_: Value, _: Call| async { Ok::<_, ToolError>(json!({})) },
            )
            .build()
            .unwrap()
            .start();
        tokio::time::timeout(WAIT, served.registered())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(served.state(), WorkerState::Serving);
    });
}
