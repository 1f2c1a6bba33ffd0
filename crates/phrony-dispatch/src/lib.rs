//! The Work-stream worker registry and tool dispatch router of the Phrony runtime.
//!
//! Workers connect over the `Runtime.Work` gRPC stream, register the handlers they serve
//! (`tool@version`, each with a concurrency limit) and keep a lease alive with heartbeats.
//! The runtime dispatches each allowed tool call through [`Router::dispatch`]:
//!
//! - **Routing**: exact `tool@version` (a binding without a version dispatches to
//!   `default`); the least-busy live worker with a free slot wins, ties going to the least
//!   recently used; otherwise the call waits in a bounded FIFO queue per key.
//! - **Two deadlines**: `queue_wait` bounds only the wait for a free slot (failing with
//!   [`DispatchFailure::NoHandler`] or [`DispatchFailure::CapacityExhausted`]); the execution
//!   timeout starts when the invoke is sent, and when it passes the worker gets a cancel and
//!   the call fails with [`DispatchFailure::ExecutionTimeout`].
//! - **Leases**: a worker that stops heartbeating is dropped by a reaper and its dispatched
//!   calls resolve as [`DispatchFailure::Indeterminate`], as they do when its stream ends;
//!   the caller routes them by side-effect class.
//! - **Robust protocol**: late, unknown or foreign results never end a worker's stream;
//!   late ones are acknowledged after the [`RouterObserver`] records them. Re-registering a
//!   worker id replaces the old connection, keeps the calls the new `in_flight` lists, and a
//!   stale connection's clean-up never removes the new registration.
//! - **Durability**: a [`DispatchJournal`] records the dispatch before the invoke is sent,
//!   and a result's `WorkResultAck` goes out only when the caller calls [`AckHandle::ack`]
//!   after recording it. Reconnecting workers' `in_flight` calls that are already recorded
//!   ([`CompletedCalls`]) are acknowledged at once.
//! - **Integrity**: an optional [`Allowlist`] (`RUNTIME_TOOL_ALLOWLIST`) restricts which
//!   workers may serve which agent's calls.
//! - **Descriptor pins**: a registration whose non-empty `descriptor_hash` for a `tool@version`
//!   matches none of the pins published agent versions hold for it ([`DescriptorPins`]) is
//!   refused ([`DispatchError::DescriptorRefused`]) and recorded; with
//!   [`RouterConfig::require_descriptor_pins`] so is an empty one. A call whose
//!   [`DispatchCall::descriptor_pin`] is set goes only to workers advertising that hash or
//!   none ([`DispatchFailure::DescriptorMismatch`] when only others serve the key).
//!
//! This crate never sees protobuf: the gRPC layer converts `WorkClientMsg` to [`WorkerHello`]
//! / [`FromWorker`] and [`ToWorker`] to `WorkServerMsg`.
//!
//! ```no_run
//! # async fn demo(router: phrony_dispatch::Router, hello: phrony_dispatch::WorkerHello,
//! #               call: phrony_dispatch::DispatchCall) -> Result<(), Box<dyn std::error::Error>> {
//! // gRPC side: one task per Work stream.
//! let (conn, mut outbox) = router.connect(hello).await?;
//! tokio::spawn(async move {
//!     while let Some(msg) = outbox.recv().await {
//!         // write Ok(msg) to the worker; on Err(status) end the stream with it
//!         # let _ = msg;
//!     }
//! });
//! // ... for each later client message: conn.handle(msg)?; on stream end: drop(conn).
//! # drop(conn);
//!
//! // Runtime side: dispatch, record, then acknowledge.
//! let done = router.dispatch(call).await?;
//! // store done.outcome durably, then:
//! done.ack.ack();
//! # Ok(()) }
//! ```

mod ack;
mod allowlist;
mod config;
mod connection;
mod error;
mod hooks;
mod router;
mod snapshot;
mod state;
mod types;

pub use ack::AckHandle;
pub use allowlist::{Allowlist, AllowlistError, IntegrityKind, IntegrityViolation};
pub use config::{DEFAULT_QUEUE_CAPACITY, RouterConfig};
pub use connection::{Outbox, WorkerConnection};
pub use error::{ConfigError, DispatchError, DispatchFailure, StatusClass, WorkerLost};
pub use hooks::{
    AbandonReason, CompletedCalls, DescriptorPins, DescriptorRefusal, DispatchJournal, HookError,
    LateOutcome, LateReason, LateResult, RouterEvent, RouterObserver,
};
pub use router::{
    Completion, DispatchCall, MAX_HANDLERS, MAX_IN_FLIGHT_REPORTED, MAX_REGISTRATION_NAME_BYTES,
    Router, RouterBuilder,
};
pub use snapshot::{HandlerSnapshot, QueueSnapshot, RouterSnapshot, WorkerSnapshot};
pub use tokio_util::sync::CancellationToken;
pub use types::{
    DEFAULT_VERSION, FromWorker, HandlerAd, Invocation, ToWorker, ToolError, ToolOutcome,
    WorkerHello, WorkerProvenance, handler_key,
};
