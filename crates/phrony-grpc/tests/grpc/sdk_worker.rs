//! The published Python SDK's `phrony.worker.Worker` against our `Work` stream: the server runs
//! in-process, the worker (`tests/python/workers/refund_worker.py`) runs in the repository's
//! `.venv` (created by `bash .ci/python-venv.sh`), and the test dispatches tool calls through
//! the router the server was given, as the session engine does.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use phrony_dispatch::{
    AbandonReason, DispatchCall, DispatchFailure, Invocation, LateOutcome, LateReason, LateResult,
    Router, RouterConfig, RouterEvent, RouterObserver, ToolError, ToolOutcome,
};
use phrony_ledger::Ledger;
use phrony_runtime::{SecretsKey, ServeConfig};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

const TOOL: &str = "payments.issue-refund";
/// A safety net against hangs (Python start-up included); no assertion depends on timing.
const PATIENCE: Duration = Duration::from_secs(60);

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's interpreter; the test fails (rather than silently passing) without it.
fn python() -> PathBuf {
    let python = workspace().join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: this test runs the published phrony SDK from the repository's venv; \
         create it with `bash .ci/python-venv.sh`",
        python.display()
    );
    python
}

/// Forwards late results to the test, which acknowledges them after "recording" them.
struct LateResults(mpsc::UnboundedSender<LateResult>);

impl RouterObserver for LateResults {
    fn on_event(&self, event: RouterEvent) {
        if let RouterEvent::LateResult(late) = event {
            let _ = self.0.send(late);
        }
    }
}

fn invocation(call_id: &str, tool: &str, version: &str, args: serde_json::Value) -> Invocation {
    Invocation {
        call_id: call_id.into(),
        session_id: "sess_sdk".into(),
        agent_version_id: "av_sdk".into(),
        turn: 3,
        tool: tool.into(),
        version: version.into(),
        args,
        side_effect_class: "non_idempotent_write".into(),
        deadline_unix_ms: 0,
        trace_context: std::collections::BTreeMap::new(),
    }
}

fn call(call_id: &str, args: serde_json::Value) -> DispatchCall {
    DispatchCall::new(
        invocation(call_id, TOOL, "1.0.0", args),
        "support/refund-agent",
        Duration::from_secs(10),
        Some(Duration::from_secs(30)),
    )
}

async fn wait_for<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_published_sdk_worker_serves_dispatched_calls() {
    let python = python();

    // The server, with a router the test keeps.
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::connect(&format!(
        "sqlite://{}",
        dir.path().join("phrony.db").display()
    ))
    .await
    .unwrap();
    ledger.migrate().await.unwrap();
    let listener = phrony_runtime::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().to_string();
    let (late_tx, mut late_rx) = mpsc::unbounded_channel();
    let router = Router::builder(RouterConfig::default())
        .observer(Arc::new(LateResults(late_tx)))
        .build()
        .unwrap();
    let mut config = ServeConfig::new(SecretsKey::generate().unwrap());
    config.router = Some(router.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        phrony_runtime::serve(listener, ledger, config, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });

    // The worker, exactly as an SDK user writes one.
    let mut worker = tokio::process::Command::new(&python)
        .arg(workspace().join("tests/python/workers/refund_worker.py"))
        .arg("sdk-worker-1")
        .env("PHRONY_RUNTIME_ADDR", &addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for("the SDK worker to register", async {
        loop {
            let snapshot = router.snapshot();
            if let Some(w) = snapshot
                .workers
                .iter()
                .find(|w| w.worker_id == "sdk-worker-1")
            {
                break w.clone();
            }
            if let Some(status) = worker.try_wait().unwrap() {
                panic!("the SDK worker exited with {status} before registering");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let registered = router.snapshot().workers;
    assert_eq!(registered.len(), 1);
    let ad = &registered[0];
    assert_eq!(ad.workload_identity, "tests/sdk-worker");
    assert_eq!(ad.image_digest, "sha256:sdk");
    assert_eq!(ad.handlers.len(), 1);
    assert_eq!(
        (
            ad.handlers[0].tool.as_str(),
            ad.handlers[0].version.as_str(),
            ad.handlers[0].max_concurrency,
            ad.handlers[0].descriptor_hash.as_str(),
        ),
        (TOOL, "1.0.0", 2, "sha256:refund-v1")
    );

    // 1. The handler runs and its return value is the payload; the result is acknowledged.
    let done = wait_for(
        "the refund",
        router.dispatch(call("call-ok", json!({"order_id": "ORD-1", "amount": 100}))),
    )
    .await
    .unwrap();
    assert_eq!(
        done.outcome,
        ToolOutcome::Success(json!({
            "refund_id": "rf_ORD-1",
            "order_id": "ORD-1",
            "amount": 100,
            "status": "issued",
            "call_id": "call-ok",
            "session_id": "sess_sdk",
            "turn": 3,
            "side_effect_class": "non_idempotent_write",
        }))
    );
    assert_eq!(done.worker.worker_id, "sdk-worker-1");
    assert_eq!(done.worker.descriptor_hash, "sha256:refund-v1");
    assert!(
        done.ack.ack(),
        "the worker should be connected to take the ack"
    );

    // Two calls at once: the handler's max_concurrency is 2, so B, sent second, runs while A is
    // still running and finishes first. A answers half a second after B on purpose: phrony
    // 0.1.0's `Worker` writes each result from its own task without serialising the writes,
    // and two writes at the same instant collide inside grpcio (TOO_MANY_OPERATIONS): one
    // result and every later heartbeat are lost until the lease expires. That is the SDK's
    // defect, not the runtime's; the runtime's side of it (lease expiry, the lost call handled
    // as indeterminate) is covered by `tests/grpc/work.rs`.
    let timed = |call_id: &'static str, order: &str, amount: u32, delay: f64| {
        let dispatch = router.dispatch(call(
            call_id,
            json!({"order_id": order, "amount": amount, "delay": delay}),
        ));
        async move {
            let done = dispatch.await;
            (done, std::time::Instant::now())
        }
    };
    let ((a, a_at), (b, b_at)) = wait_for("two concurrent refunds", async {
        tokio::join!(timed("call-a", "A", 1, 0.5), timed("call-b", "B", 2, 0.0))
    })
    .await;
    assert!(
        b_at < a_at,
        "B should finish while A still runs (both in flight at once)"
    );
    for (done, order) in [(a.unwrap(), "A"), (b.unwrap(), "B")] {
        let ToolOutcome::Success(payload) = &done.outcome else {
            panic!("{:?}", done.outcome)
        };
        assert_eq!(payload["order_id"], order);
        assert!(done.ack.ack());
    }

    // 2. A ToolError raised by the handler is a tool error with its code and message.
    let done = wait_for(
        "the invalid refund",
        router.dispatch(call(
            "call-invalid",
            json!({"order_id": "ORD-1", "amount": 0}),
        )),
    )
    .await
    .unwrap();
    assert_eq!(
        done.outcome,
        ToolOutcome::Error(ToolError::new(
            "invalid_args",
            "amount must be greater than zero"
        ))
    );
    assert!(done.ack.ack());

    // 3. Any other exception is reported as `internal` with the exception's text.
    let done = wait_for(
        "the failing refund",
        router.dispatch(call("call-explode", json!({"explode": true}))),
    )
    .await
    .unwrap();
    assert_eq!(
        done.outcome,
        ToolOutcome::Error(ToolError::new("internal", "payment provider unreachable"))
    );
    assert!(done.ack.ack());

    // 4. A tool or version nobody serves is never sent to the worker.
    for (call_id, tool, version) in [
        ("call-void", "payments.void-refund", "1.0.0"),
        ("call-pinned", TOOL, "9.9.9"),
    ] {
        let failure = router
            .dispatch(DispatchCall::new(
                invocation(call_id, tool, version, json!({})),
                "support/refund-agent",
                Duration::from_millis(100),
                Some(Duration::from_secs(30)),
            ))
            .await
            .unwrap_err();
        assert_eq!(
            failure.to_string(),
            format!("no handler registered for tool {tool}@{version}")
        );
    }

    // 5. A call that outlives its execution deadline is cancelled; the SDK's late `cancelled`
    //    result is reported for recording and acknowledged without ending the stream.
    let failure = wait_for(
        "the hanging refund to time out",
        router.dispatch(DispatchCall::new(
            invocation("call-hang", TOOL, "1.0.0", json!({"hang": true})),
            "support/refund-agent",
            Duration::from_secs(10),
            Some(Duration::from_millis(300)),
        )),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(failure, DispatchFailure::ExecutionTimeout { .. }),
        "{failure:?}"
    );
    let late = wait_for("the late result", late_rx.recv()).await.unwrap();
    assert_eq!(
        (late.worker_id.as_str(), late.call_id.as_str()),
        ("sdk-worker-1", "call-hang")
    );
    assert_eq!(
        late.outcome,
        LateOutcome::Result(ToolOutcome::Error(ToolError::new(
            "cancelled",
            "invoke cancelled or deadline exceeded"
        )))
    );
    assert_eq!(
        late.reason,
        LateReason::Abandoned(AbandonReason::ExecutionTimeout)
    );
    assert!(late.ack.ack());

    // The stream survived: the worker still serves calls.
    let done = wait_for(
        "a refund after the late result",
        router.dispatch(call(
            "call-after",
            json!({"order_id": "ORD-2", "amount": 5}),
        )),
    )
    .await
    .unwrap();
    assert!(!done.outcome.is_error(), "{:?}", done.outcome);
    assert!(done.ack.ack());

    // 6. Shutting the daemon down ends the stream cleanly: `Worker.connect()` returns and the
    //    process exits 0.
    let _ = stop.send(());
    wait_for("the server to stop", server).await.unwrap();
    let output = wait_for("the SDK worker to exit", worker.wait_with_output())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the SDK worker failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert_eq!(stdout.lines().last(), Some("stream closed"), "{stdout}");
    let invoked: BTreeSet<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("invoked "))
        .collect();
    let want: BTreeSet<&str> = [
        "call-ok",
        "call-a",
        "call-b",
        "call-invalid",
        "call-explode",
        "call-hang",
        "call-after",
    ]
    .into();
    assert_eq!(invoked, want, "stdout:\n{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("invoked ")).count(),
        want.len(),
        "a call was invoked twice:\n{stdout}"
    );
}
