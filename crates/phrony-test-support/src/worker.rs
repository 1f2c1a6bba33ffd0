//! A tool worker on the runtime's `Work` stream serving the refund tutorial's
//! `payments.issue-refund@1.0.0`, for end-to-end tests that follow a call to its dispatch.
//!
//! ```no_run
//! use phrony_test_support::worker::RefundWorker;
//! let addr = "127.0.0.1:50051"; // a running daemon
//! let worker = RefundWorker::start(addr, "docs-worker");
//! assert!(worker.invocations().is_empty());
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use serde_json::{Value, json};

/// How long the runtime may take to confirm the registration (a failure guard, not a pace).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);

/// The tool and version the worker serves.
const TOOL: &str = "payments.issue-refund";
const VERSION: &str = "1.0.0";

/// A worker serving `payments.issue-refund@1.0.0` on its own Tokio runtime: it heartbeats at a
/// third of the lease, records the arguments of each invocation and answers
/// `{"refund_id": "rf_<order_id>", "amount": <amount>, "status": "issued"}`.
///
/// Started with [`start_holding`](Self::start_holding), it records each invocation on arrival
/// but holds its result back until [`release`](Self::release): a call that stays in flight
/// (dispatched, executed, no result yet) for as long as the test needs.
///
/// Dropping it closes the stream.
#[derive(Debug)]
pub struct RefundWorker {
    invoked: Arc<Mutex<Vec<Value>>>,
    /// `true` while results are held back.
    holding: tokio::sync::watch::Sender<bool>,
    _runtime: tokio::runtime::Runtime,
}

impl RefundWorker {
    /// Connects to the runtime at `addr` (`host:port`) as `worker_id` (workload identity
    /// `tests/<worker_id>`) and returns once the runtime confirmed the registration.
    ///
    /// # Panics
    /// When the runtime cannot be reached or does not confirm the registration in time.
    #[must_use]
    pub fn start(addr: &str, worker_id: &str) -> Self {
        Self::start_with(addr, worker_id, false)
    }

    /// [`start`](Self::start), holding every result back until [`release`](Self::release).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_holding(addr: &str, worker_id: &str) -> Self {
        Self::start_with(addr, worker_id, true)
    }

    /// Sends the results held back so far, and answers every later invocation at once.
    pub fn release(&self) {
        self.holding.send_replace(false);
    }

    fn start_with(addr: &str, worker_id: &str, hold: bool) -> Self {
        let (holding, held) = tokio::sync::watch::channel(hold);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot build the worker's runtime: {e}"));
        let invoked = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let register = pb::WorkRegister {
            worker_id: worker_id.to_owned(),
            workload_identity: format!("tests/{worker_id}"),
            image_digest: String::new(),
            handlers: vec![pb::WorkHandlerAdvertisement {
                tool: TOOL.into(),
                version: VERSION.into(),
                contract_version: String::new(),
                max_concurrency: 4,
                descriptor_hash: String::new(),
            }],
            in_flight: Vec::new(),
        };
        runtime.spawn(serve(
            format!("http://{addr}"),
            register,
            Arc::clone(&invoked),
            held,
            ready_tx,
        ));
        match ready_rx.recv_timeout(REGISTER_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => panic!("worker {worker_id} at {addr}: {error}"),
            Err(_) => panic!("the runtime at {addr} did not confirm worker {worker_id}"),
        }
        Self {
            invoked,
            holding,
            _runtime: runtime,
        }
    }

    /// The arguments of every invocation so far, in arrival order.
    #[must_use]
    pub fn invocations(&self) -> Vec<Value> {
        self.invoked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The result the worker answers for these arguments.
fn refund(args: &Value) -> Value {
    json!({
        "refund_id": format!("rf_{}", args["order_id"].as_str().unwrap_or("?")),
        "amount": args["amount"],
        "status": "issued",
    })
}

fn message(body: pb::work_client_msg::Body) -> pb::WorkClientMsg {
    pb::WorkClientMsg { body: Some(body) }
}

/// Registers, then serves the stream until it closes. Reports the registration (or why it
/// failed) on `ready`.
async fn serve(
    uri: String,
    register: pb::WorkRegister,
    invoked: Arc<Mutex<Vec<Value>>>,
    held: tokio::sync::watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let channel = match tonic::transport::Endpoint::from_shared(uri) {
        Ok(endpoint) => endpoint.connect().await,
        Err(error) => {
            let _ = ready.send(Err(format!("bad address: {error}")));
            return;
        }
    };
    let channel = match channel {
        Ok(channel) => channel,
        Err(error) => {
            let _ = ready.send(Err(format!("cannot connect: {error}")));
            return;
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::WorkClientMsg>(16);
    if tx
        .send(message(pb::work_client_msg::Body::Register(register)))
        .await
        .is_err()
    {
        return;
    }
    let mut inbound = match RuntimeClient::new(channel)
        .work(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => {
            let _ = ready.send(Err(format!("Work refused: {status}")));
            return;
        }
    };
    while let Ok(Some(msg)) = inbound.message().await {
        match msg.body {
            Some(pb::work_server_msg::Body::Registered(registered)) => {
                let every = Duration::from_millis(
                    u64::try_from(registered.lease_ttl_ms / 3)
                        .unwrap_or(1000)
                        .max(100),
                );
                tokio::spawn(heartbeat(tx.clone(), every));
                let _ = ready.send(Ok(()));
            }
            Some(pb::work_server_msg::Body::Invoke(invoke)) => {
                // Arguments that are not JSON are recorded as null and answered like any other.
                let args: Value = serde_json::from_slice(&invoke.args).unwrap_or(Value::Null);
                let payload = refund(&args);
                invoked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(args);
                let result = pb::WorkToolResult {
                    call_id: invoke.call_id,
                    payload: payload.to_string().into_bytes(),
                    error: None,
                };
                let result = message(pb::work_client_msg::Body::Result(result));
                if *held.borrow() {
                    // Sent once released (or never, when the worker is dropped first).
                    let (tx, mut held) = (tx.clone(), held.clone());
                    tokio::spawn(async move {
                        if held.wait_for(|holding| !*holding).await.is_ok() {
                            let _ = tx.send(result).await;
                        }
                    });
                } else if tx.send(result).await.is_err() {
                    break;
                }
            }
            _ => {}
        }
    }
}

/// Sends a heartbeat `every` interval until the stream closes.
async fn heartbeat(tx: tokio::sync::mpsc::Sender<pb::WorkClientMsg>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let beat = message(pb::work_client_msg::Body::Heartbeat(pb::WorkHeartbeat {}));
        if tx.send(beat).await.is_err() {
            break;
        }
    }
}
