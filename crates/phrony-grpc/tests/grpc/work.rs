//! The `Work` stream over real TCP: an in-process server, fake workers speaking the generated
//! client, and tool calls dispatched through the router the server was given.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::time::Duration;

use pb::work_client_msg::Body as Up;
use pb::work_server_msg::Body as Down;
use phrony_dispatch::{
    DispatchCall, DispatchFailure, Invocation, Router, RouterConfig, ToolError, ToolOutcome,
};
use phrony_ledger::Ledger;
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_runtime::{SecretsKey, ServeConfig};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

const TOOL: &str = "payments.issue-refund";
const VERSION: &str = "1.0.0";
/// A safety net against hangs; no assertion depends on timing.
const PATIENCE: Duration = Duration::from_secs(10);

struct Server {
    addr: String,
    router: Router,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Self {
        Self::start_with(RouterConfig::default(), Duration::from_secs(10)).await
    }

    async fn start_with(router: RouterConfig, shutdown_grace: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
        let ledger = Ledger::connect(&url).await.unwrap();
        ledger.migrate().await.unwrap();
        let listener = phrony_runtime::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().to_string();
        let router = Router::new(router).unwrap();
        let mut config = ServeConfig::new(SecretsKey::generate().unwrap());
        config.router = Some(router.clone());
        config.shutdown_grace = shutdown_grace;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            phrony_runtime::serve(listener, ledger, config, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self {
            addr,
            router,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    async fn client(&self) -> RuntimeClient<Channel> {
        RuntimeClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    /// Sends the shutdown signal without waiting for the server to stop.
    fn signal_stop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
    }

    async fn stopped(self) {
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the server did not stop")
            .unwrap();
    }

    /// Waits until the router lists `worker_id` (registration is asynchronous to the test).
    async fn wait_registered(&self, worker_id: &str, present: bool) {
        tokio::time::timeout(PATIENCE, async {
            while self
                .router
                .snapshot()
                .workers
                .iter()
                .any(|w| w.worker_id == worker_id)
                != present
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("worker {worker_id} registered: expected {present}"));
    }
}

/// One Work stream seen from the worker's side.
#[derive(Debug)]
struct FakeWorker {
    up: mpsc::Sender<pb::WorkClientMsg>,
    down: Streaming<pb::WorkServerMsg>,
}

/// Opens a Work stream whose first message is `first`; the RPC's own status when the server
/// refuses it before responding.
async fn open(server: &Server, first: Up) -> Result<FakeWorker, Status> {
    let (up, rx) = mpsc::channel(16);
    up.send(pb::WorkClientMsg { body: Some(first) })
        .await
        .unwrap();
    let down = server
        .client()
        .await
        .work(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok(FakeWorker { up, down })
}

fn register(worker_id: &str) -> Up {
    Up::Register(pb::WorkRegister {
        worker_id: worker_id.into(),
        workload_identity: "tests/work".into(),
        image_digest: "sha256:test".into(),
        handlers: vec![pb::WorkHandlerAdvertisement {
            tool: TOOL.into(),
            version: VERSION.into(),
            contract_version: "1".into(),
            max_concurrency: 2,
            descriptor_hash: "sha256:descriptor".into(),
        }],
        in_flight: Vec::new(),
    })
}

impl FakeWorker {
    /// Registers and reads the `registered` reply.
    async fn registered(server: &Server, worker_id: &str) -> Self {
        let mut worker = open(server, register(worker_id)).await.unwrap();
        match worker.next().await {
            Down::Registered(r) => {
                assert_eq!(r.worker_id, worker_id);
                assert_eq!(r.lease_ttl_ms, 30_000);
            }
            other => panic!("expected registered, got {other:?}"),
        }
        server.wait_registered(worker_id, true).await;
        worker
    }

    async fn send(&self, body: Up) {
        self.up
            .send(pb::WorkClientMsg { body: Some(body) })
            .await
            .unwrap();
    }

    /// The next message; panics if the stream ends or fails.
    async fn next(&mut self) -> Down {
        match self.end_or_next().await {
            Ok(Some(msg)) => msg,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// The next message, `Ok(None)` at a clean end, or the final status.
    async fn end_or_next(&mut self) -> Result<Option<Down>, Status> {
        let msg = tokio::time::timeout(PATIENCE, self.down.message())
            .await
            .expect("no message from the runtime")?;
        Ok(msg.map(|m| m.body.expect("a server message without a body")))
    }

    async fn result(&self, call_id: &str, payload: serde_json::Value) {
        self.send(Up::Result(pb::WorkToolResult {
            call_id: call_id.into(),
            payload: payload.to_string().into_bytes(),
            error: None,
        }))
        .await;
    }

    async fn heartbeat_is_acknowledged(&mut self) {
        self.send(Up::Heartbeat(pb::WorkHeartbeat {})).await;
        assert_eq!(
            self.next().await,
            Down::HeartbeatAck(pb::WorkHeartbeatAck {})
        );
    }
}

fn invocation(call_id: &str) -> Invocation {
    Invocation {
        call_id: call_id.into(),
        session_id: "sess_1".into(),
        agent_version_id: "av_1".into(),
        turn: 1,
        tool: TOOL.into(),
        version: VERSION.into(),
        args: json!({"order_id": "A-100", "amount": 100}),
        side_effect_class: "non_idempotent_write".into(),
        deadline_unix_ms: 0,
        trace_context: std::collections::BTreeMap::new(),
    }
}

fn call(call_id: &str, exec_timeout: Duration) -> DispatchCall {
    DispatchCall::new(
        invocation(call_id),
        "support/refund-agent",
        Duration::from_secs(5),
        Some(exec_timeout),
    )
}

fn assert_status<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, message: &str) {
    let status = result.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (code, message),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_dispatched_call_reaches_the_worker_and_its_result_is_acknowledged_after_the_ack() {
    let server = Server::start().await;
    let mut worker = FakeWorker::registered(&server, "w1").await;
    worker.heartbeat_is_acknowledged().await;

    let router = server.router.clone();
    let dispatch = tokio::spawn(async move {
        router
            .dispatch(call("call-1", Duration::from_secs(30)))
            .await
    });

    let Down::Invoke(invoke) = worker.next().await else {
        panic!("expected an invoke")
    };
    assert_eq!(invoke.call_id, "call-1");
    assert_eq!(invoke.session_id, "sess_1");
    assert_eq!(invoke.agent_version_id, "av_1");
    assert_eq!(invoke.turn, 1);
    assert_eq!(
        (invoke.tool.as_str(), invoke.version.as_str()),
        (TOOL, VERSION)
    );
    assert_eq!(invoke.side_effect_class, "non_idempotent_write");
    let args: serde_json::Value = serde_json::from_slice(&invoke.args).unwrap();
    assert_eq!(args, json!({"order_id": "A-100", "amount": 100}));
    // The router tells the worker when it stops waiting: the execution deadline.
    assert!(invoke.deadline_unix_ms > 0);

    worker
        .result("call-1", json!({"refund_id": "R-1", "status": "issued"}))
        .await;
    let done = tokio::time::timeout(PATIENCE, dispatch)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        done.outcome,
        ToolOutcome::Success(json!({"refund_id": "R-1", "status": "issued"}))
    );
    assert_eq!(done.worker.worker_id, "w1");
    assert_eq!(done.worker.workload_identity, "tests/work");
    assert_eq!(done.worker.descriptor_hash, "sha256:descriptor");

    // No ack before the runtime recorded the result: the next message is the heartbeat's.
    worker.heartbeat_is_acknowledged().await;
    assert!(done.ack.ack());
    assert_eq!(
        worker.next().await,
        Down::ResultAck(pb::WorkResultAck {
            call_id: "call-1".into()
        })
    );

    // A handler error travels as a tool error.
    let router = server.router.clone();
    let dispatch = tokio::spawn(async move {
        router
            .dispatch(call("call-2", Duration::from_secs(30)))
            .await
    });
    let Down::Invoke(invoke) = worker.next().await else {
        panic!("expected an invoke")
    };
    worker
        .send(Up::Result(pb::WorkToolResult {
            call_id: invoke.call_id,
            payload: Vec::new(),
            error: Some(pb::WorkToolError {
                code: "invalid_args".into(),
                message: "amount must be greater than zero".into(),
            }),
        }))
        .await;
    let done = dispatch.await.unwrap().unwrap();
    assert_eq!(
        done.outcome,
        ToolOutcome::Error(ToolError::new(
            "invalid_args",
            "amount must be greater than zero"
        ))
    );
    assert_eq!(
        done.outcome.model_text(),
        "invalid_args: amount must be greater than zero"
    );
    // Error results are recorded and acknowledged like successes.
    assert!(done.ack.ack());
    assert_eq!(
        worker.next().await,
        Down::ResultAck(pb::WorkResultAck {
            call_id: "call-2".into()
        })
    );

    server.stopped_after_signal().await;
}

#[tokio::test]
async fn messages_before_register_are_refused_with_the_reference_statuses() {
    let server = Server::start().await;
    assert_status(
        open(&server, Up::Heartbeat(pb::WorkHeartbeat {})).await,
        Code::FailedPrecondition,
        "register before heartbeat",
    );
    assert_status(
        open(
            &server,
            Up::Result(pb::WorkToolResult {
                call_id: "c".into(),
                ..Default::default()
            }),
        )
        .await,
        Code::FailedPrecondition,
        "register before result",
    );
    assert_status(
        open(
            &server,
            Up::Nack(pb::WorkToolNack {
                call_id: "c".into(),
                ..Default::default()
            }),
        )
        .await,
        Code::FailedPrecondition,
        "register before nack",
    );
    assert_status(
        open(&server, register("")).await,
        Code::InvalidArgument,
        "worker_id is required",
    );
    assert_status(
        open(&server, register("   ")).await,
        Code::InvalidArgument,
        "worker_id is required",
    );

    // A first message with no body at all.
    let (up, rx) = mpsc::channel(1);
    up.send(pb::WorkClientMsg { body: None }).await.unwrap();
    assert_status(
        server.client().await.work(ReceiverStream::new(rx)).await,
        Code::InvalidArgument,
        "register message is required",
    );

    // Advertisements that could never be routed are refused by name.
    let Up::Register(mut bad) = register("w-bad") else {
        unreachable!()
    };
    bad.handlers[0].version = String::new();
    assert_status(
        open(&server, Up::Register(bad)).await,
        Code::InvalidArgument,
        "handlers[0].version is required for tool \"payments.issue-refund\" (advertise \
         \"default\" to serve bindings without a version)",
    );
    assert!(server.router.snapshot().workers.is_empty());

    server.stopped_after_signal().await;
}

#[tokio::test]
async fn protocol_errors_after_register_end_only_that_stream() {
    let server = Server::start().await;

    let mut twice = FakeWorker::registered(&server, "w-twice").await;
    twice.send(register("w-twice")).await;
    assert_status(
        twice.end_or_next().await,
        Code::FailedPrecondition,
        "worker \"w-twice\" is already registered on this stream",
    );
    server.wait_registered("w-twice", false).await;

    let mut empty = FakeWorker::registered(&server, "w-empty").await;
    empty
        .up
        .send(pb::WorkClientMsg { body: None })
        .await
        .unwrap();
    assert_status(
        empty.end_or_next().await,
        Code::InvalidArgument,
        "unknown work client message",
    );

    let mut no_call = FakeWorker::registered(&server, "w-nocall").await;
    no_call.result("", json!({})).await;
    assert_status(
        no_call.end_or_next().await,
        Code::InvalidArgument,
        "result.call_id is required",
    );

    // Registering the same id on a new stream supersedes the old one.
    let mut old = FakeWorker::registered(&server, "w-moved").await;
    let mut new = open(&server, register("w-moved")).await.unwrap();
    assert!(matches!(new.next().await, Down::Registered(_)));
    assert_status(
        old.end_or_next().await,
        Code::Aborted,
        "worker \"w-moved\" registered again on another stream",
    );
    // The old stream's clean-up leaves the new registration alone.
    new.heartbeat_is_acknowledged().await;
    server.wait_registered("w-moved", true).await;

    server.stopped_after_signal().await;
}

#[tokio::test]
async fn a_late_result_after_the_execution_deadline_is_acknowledged_and_the_stream_lives_on() {
    let server = Server::start().await;
    let mut worker = FakeWorker::registered(&server, "w-slow").await;

    let failure = {
        let router = server.router.clone();
        let dispatch = tokio::spawn(async move {
            router
                .dispatch(call("call-slow", Duration::from_millis(200)))
                .await
        });
        let Down::Invoke(invoke) = worker.next().await else {
            panic!("expected an invoke")
        };
        assert_eq!(invoke.call_id, "call-slow");
        // The worker sits on the call; the execution deadline passes and a cancel follows.
        assert_eq!(
            worker.next().await,
            Down::Cancel(pb::WorkToolCancel {
                call_id: "call-slow".into()
            })
        );
        dispatch.await.unwrap().unwrap_err()
    };
    assert!(
        matches!(failure, DispatchFailure::ExecutionTimeout { .. }),
        "{failure:?}"
    );
    assert!(failure.outcome_unknown());

    // The result arrives late: acknowledged (the router has no observer to record it first),
    // and the stream is not torn down.
    worker
        .result("call-slow", json!({"refund_id": "R-late"}))
        .await;
    assert_eq!(
        worker.next().await,
        Down::ResultAck(pb::WorkResultAck {
            call_id: "call-slow".into()
        })
    );
    // So is a result for a call the runtime never heard of.
    worker.result("call-unknown", json!({})).await;
    assert_eq!(
        worker.next().await,
        Down::ResultAck(pb::WorkResultAck {
            call_id: "call-unknown".into()
        })
    );
    worker.heartbeat_is_acknowledged().await;

    // And the worker still serves calls.
    let router = server.router.clone();
    let dispatch = tokio::spawn(async move {
        router
            .dispatch(call("call-next", Duration::from_secs(30)))
            .await
    });
    let Down::Invoke(invoke) = worker.next().await else {
        panic!("expected an invoke")
    };
    worker.result(&invoke.call_id, json!({"ok": true})).await;
    let done = dispatch.await.unwrap().unwrap();
    assert_eq!(done.outcome, ToolOutcome::Success(json!({"ok": true})));
    assert!(done.ack.ack());

    server.stopped_after_signal().await;
}

#[tokio::test]
async fn a_nack_becomes_a_tool_error_and_closing_the_stream_unregisters_the_worker() {
    let server = Server::start().await;
    let mut worker = FakeWorker::registered(&server, "w-nack").await;

    let router = server.router.clone();
    let dispatch = tokio::spawn(async move {
        router
            .dispatch(call("call-nack", Duration::from_secs(30)))
            .await
    });
    let Down::Invoke(invoke) = worker.next().await else {
        panic!("expected an invoke")
    };
    worker
        .send(Up::Nack(pb::WorkToolNack {
            call_id: invoke.call_id,
            code: "unknown_handler".into(),
            message: "no handler registered for payments.issue-refund@1.0.0".into(),
        }))
        .await;
    let done = dispatch.await.unwrap().unwrap();
    assert_eq!(
        done.outcome.model_text(),
        "unknown_handler: no handler registered for payments.issue-refund@1.0.0"
    );
    assert!(!done.ack.is_required(), "a nack is never acknowledged");

    // A call in flight when the worker hangs up becomes indeterminate.
    let router = server.router.clone();
    let dispatch = tokio::spawn(async move {
        router
            .dispatch(call("call-lost", Duration::from_secs(30)))
            .await
    });
    assert!(matches!(worker.next().await, Down::Invoke(_)));
    let FakeWorker { up, mut down } = worker;
    drop(up);
    let failure = dispatch.await.unwrap().unwrap_err();
    assert!(
        matches!(failure, DispatchFailure::Indeterminate { .. }),
        "{failure:?}"
    );
    server.wait_registered("w-nack", false).await;
    // The response side ends cleanly.
    let end = tokio::time::timeout(PATIENCE, down.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");

    server.stopped_after_signal().await;
}

#[tokio::test]
async fn shutdown_lets_a_dispatched_call_finish_then_ends_worker_streams_cleanly() {
    let mut server = Server::start().await;
    let mut worker = FakeWorker::registered(&server, "w-drain").await;
    let router = server.router.clone();
    let dispatch = tokio::spawn(async move {
        router
            .dispatch(call("call-drain", Duration::from_secs(30)))
            .await
    });
    let Down::Invoke(invoke) = worker.next().await else {
        panic!("expected an invoke")
    };

    server.signal_stop();
    tokio::time::timeout(PATIENCE, async {
        while !server.router.snapshot().shutting_down {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the server never shut the router down");
    // New calls are refused while the running one may still finish.
    let refused = tokio::time::timeout(
        PATIENCE,
        server
            .router
            .dispatch(call("call-refused", Duration::from_secs(1))),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(refused, DispatchFailure::ShuttingDown);

    worker
        .result(&invoke.call_id, json!({"refund_id": "R-9"}))
        .await;
    let done = dispatch.await.unwrap().unwrap();
    assert_eq!(
        done.outcome,
        ToolOutcome::Success(json!({"refund_id": "R-9"}))
    );
    assert!(done.ack.ack());
    // The ack queued before the stream closes still reaches the worker, then the stream ends
    // with OK.
    assert_eq!(
        worker.next().await,
        Down::ResultAck(pb::WorkResultAck {
            call_id: "call-drain".into()
        })
    );
    let end = worker.end_or_next().await;
    assert!(matches!(end, Ok(None)), "{end:?}");
    server.stopped().await;
}

impl Server {
    async fn stopped_after_signal(mut self) {
        self.signal_stop();
        self.stopped().await;
    }
}

#[tokio::test]
async fn shutdown_does_not_wait_forever_for_an_unanswered_call() {
    let mut server = Server::start_with(RouterConfig::default(), Duration::from_millis(800)).await;
    let mut worker = FakeWorker::registered(&server, "w-silent").await;
    let router = server.router.clone();
    let dispatch = tokio::spawn(async move {
        router
            .dispatch(call("call-silent", Duration::from_secs(60)))
            .await
    });
    assert!(matches!(worker.next().await, Down::Invoke(_)));

    // The worker never answers: after half the grace period its stream is closed (cleanly)
    // and the call's outcome is unknown.
    server.signal_stop();
    let end = worker.end_or_next().await;
    assert!(matches!(end, Ok(None)), "{end:?}");
    let failure = dispatch.await.unwrap().unwrap_err();
    assert!(
        matches!(failure, DispatchFailure::Indeterminate { .. }),
        "{failure:?}"
    );
    server.stopped().await;
}

#[tokio::test]
async fn a_stream_that_never_registers_is_closed_after_the_lease() {
    let config = RouterConfig {
        lease_ttl: Duration::from_secs(2),
        ..RouterConfig::default()
    };
    let server = Server::start_with(config, Duration::from_secs(10)).await;
    let (_up, rx) = mpsc::channel::<pb::WorkClientMsg>(1);
    assert_status(
        server.client().await.work(ReceiverStream::new(rx)).await,
        Code::DeadlineExceeded,
        "no register message within 2000ms of opening the Work stream",
    );
    server.stopped_after_signal().await;
}
