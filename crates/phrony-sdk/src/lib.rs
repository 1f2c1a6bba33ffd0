//! The Rust SDK of the Phrony runtime, on the typed client `phrony-client`.
//!
//! - [`Worker`]: serves tools on the runtime's `Work` stream. Handlers are async functions of
//!   typed arguments (any `serde` type) and a [`Call`]; the worker bounds concurrency, cancels
//!   a call's handler when the runtime cancels it or its deadline passes, keeps each result
//!   until the runtime acknowledges it durably, reconnects with backoff (re-offering what it
//!   runs or holds), sends a token or TLS client certificate for the runtime's `required`
//!   mode, and drains gracefully.
//! - [`Client`]: runs agents and waits for them ([`Client::run`], [`Session::wait`]), reviews
//!   approvals ([`Client::approvals`]: list, get, approve, reject, watch) and looks at sessions
//!   ([`Client::sessions`]: list, inspect, cancel).
//!
//! ```no_run
//! use phrony_sdk::{Call, ToolError, Worker};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Refund { order_id: String, amount: f64, currency: String }
//!
//! # async fn demo() -> Result<(), phrony_sdk::WorkerError> {
//! Worker::builder()
//!     .runtime_addr("127.0.0.1:7777")
//!     .worker_id("refund-worker")
//!     .tool("payments.issue-refund", "1.0.0", |args: Refund, call: Call| async move {
//!         // `call.call_id` is stable for the call: an idempotency key for the payment API.
//!         Ok::<_, ToolError>(serde_json::json!({
//!             "refund_id": format!("rf_{}", args.order_id),
//!             "amount": args.amount,
//!             "currency": args.currency,
//!             "status": "issued",
//!         }))
//!     })
//!     .build()?
//!     .run_until(tokio::signal::ctrl_c())
//!     .await
//! # }
//! ```
//!
//! Runnable examples: `examples/worker.rs` and `examples/approvals.rs`
//! (`cargo run -p phrony-sdk --example worker`).

mod client;
mod worker;

pub use client::{
    Approvals, Client, ClientOptions, Error, MAX_POLL, Session, SessionResult, Sessions,
};
pub use phrony_client::{
    Approval, ClientError, ClientTls, DecideApproval, Decision, DecisionOutcome, SessionFilter,
    SessionInspection, SessionPage,
};
pub use worker::{
    Call, DEFAULT_CONCURRENCY, DEFAULT_DRAIN_TIMEOUT, MAX_BACKOFF, MIN_BACKOFF, RunningWorker,
    ToolError, Worker, WorkerBuilder, WorkerError, WorkerState,
};
