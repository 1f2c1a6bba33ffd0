//! A tool worker serving the refund tutorial's `payments.issue-refund@1.0.0`, for end-to-end
//! tests that follow a call to its dispatch. It runs on the SDK's [`phrony_sdk::Worker`], so
//! every end-to-end test and the benchmark exercise the SDK's Work-stream handling.
//!
//! ```no_run
//! use phrony_test_support::worker::RefundWorker;
//! let addr = "127.0.0.1:50051"; // a running daemon
//! let worker = RefundWorker::start(addr, "docs-worker");
//! assert!(worker.invocations().is_empty());
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use phrony_sdk::{Call, ToolError, Worker};
use serde_json::{Value, json};

/// How long the runtime may take to confirm the registration (a failure guard, not a pace).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);

/// The tool and version the worker serves.
const TOOL: &str = "payments.issue-refund";
const VERSION: &str = "1.0.0";

/// Calls the worker runs at once.
const CONCURRENCY: u32 = 4;

/// A worker serving `payments.issue-refund@1.0.0` on its own Tokio runtime (the SDK's
/// [`Worker`], 4 calls at once): it records the arguments of each invocation and answers
/// `{"refund_id": "rf_<order_id>", "amount": <amount>, "status": "issued"}`.
///
/// Started with [`start_holding`](Self::start_holding), it records each invocation on arrival
/// but holds its result back until [`release`](Self::release): a call that stays in flight
/// (dispatched, executed, no result yet) for as long as the test needs.
///
/// Dropping it stops the worker at once (its stream closes).
#[derive(Debug)]
pub struct RefundWorker {
    invoked: Arc<Mutex<Vec<Value>>>,
    /// When each call's invoke arrived, by call id (the benchmark's dispatch and approval
    /// latencies).
    arrived: Arc<Mutex<HashMap<String, Instant>>>,
    /// The trace context each call's invoke carried, by call id (its first arrival).
    trace_contexts: Arc<Mutex<HashMap<String, BTreeMap<String, String>>>>,
    /// Bumped after each arrival is recorded.
    arrivals: tokio::sync::watch::Sender<u64>,
    /// `true` while results are held back.
    holding: tokio::sync::watch::Sender<bool>,
    /// Runs the worker; shutting it down stops the worker (its stream closes).
    runtime: Option<tokio::runtime::Runtime>,
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
        let recorder = Arc::clone(&invoked);
        let arrived = Arc::new(Mutex::new(HashMap::new()));
        let arrivals = Arc::clone(&arrived);
        let trace_contexts = Arc::new(Mutex::new(HashMap::new()));
        let contexts = Arc::clone(&trace_contexts);
        let (arrivals_tx, _) = tokio::sync::watch::channel(0u64);
        let bump = arrivals_tx.clone();
        let worker = Worker::builder()
            .runtime_addr(addr)
            .worker_id(worker_id)
            .workload_identity(format!("tests/{worker_id}"))
            .concurrency(CONCURRENCY)
            .tool(TOOL, VERSION, move |args: Value, call: Call| {
                arrivals
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(call.call_id.clone())
                    .or_insert_with(Instant::now);
                contexts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(call.call_id.clone())
                    .or_insert_with(|| call.trace_context.clone());
                bump.send_modify(|n| *n += 1);
                recorder
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(args.clone());
                let mut held = held.clone();
                async move {
                    // Answered once released (or never, when the worker is dropped first).
                    let _ = held.wait_for(|holding| !*holding).await;
                    Ok::<_, ToolError>(refund(&args))
                }
            })
            .build()
            .unwrap_or_else(|e| panic!("worker {worker_id}: {e}"));
        // Started and awaited on the worker's own runtime, waited for here with a plain
        // channel: the caller may itself be inside an async test.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let mut running = worker.start();
            let registered = running.registered().await.map_err(|e| e.to_string());
            let _ = ready_tx.send(registered);
            // Serves until the runtime shuts down (the worker is dropped with this task).
            std::future::pending::<()>().await;
            drop(running);
        });
        match ready_rx.recv_timeout(REGISTER_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => panic!("worker {worker_id} at {addr}: {error}"),
            Err(_) => panic!("the runtime at {addr} did not confirm worker {worker_id}"),
        }
        Self {
            invoked,
            arrived,
            trace_contexts,
            arrivals: arrivals_tx,
            holding,
            runtime: Some(runtime),
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

impl RefundWorker {
    /// When the invoke of call `call_id` arrived (its first arrival: the handler runs once per
    /// delivery, and a re-delivery keeps the first instant).
    #[must_use]
    pub fn arrived(&self, call_id: &str) -> Option<Instant> {
        self.arrived
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(call_id)
            .copied()
    }

    /// The W3C trace context (`traceparent`, `tracestate`) the invoke of call `call_id` carried
    /// on its first arrival; `None` before it arrived.
    #[must_use]
    pub fn trace_context(&self, call_id: &str) -> Option<BTreeMap<String, String>> {
        self.trace_contexts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(call_id)
            .cloned()
    }

    /// A receiver that changes after every arrival ([`arrived`](Self::arrived) then knows it):
    /// subscribe, check, then wait for a change.
    #[must_use]
    pub fn arrivals(&self) -> tokio::sync::watch::Receiver<u64> {
        self.arrivals.subscribe()
    }
}

impl Drop for RefundWorker {
    fn drop(&mut self) {
        // Without blocking: the worker may be dropped inside an async test.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
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
