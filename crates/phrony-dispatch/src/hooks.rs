//! Hooks the runtime plugs into the router: an observer of notable events, a lookup of
//! durably completed calls, and a journal written before each invoke.

use std::collections::HashSet;
use std::fmt;

use async_trait::async_trait;

use crate::ack::AckHandle;
use crate::error::WorkerLost;
use crate::types::{Invocation, ToolError, ToolOutcome, WorkerProvenance};

/// An error returned by a hook (a database failure, typically).
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Receives the router's notable events. Called synchronously, outside the router's lock,
/// on the task that caused the event: implementations must not block (send to a channel).
pub trait RouterObserver: Send + Sync + 'static {
    /// One event.
    fn on_event(&self, event: RouterEvent);
}

/// A notable router event.
#[derive(Debug)]
pub enum RouterEvent {
    /// A worker registered.
    WorkerRegistered {
        /// The worker.
        worker_id: String,
        /// It replaced an earlier connection with the same id.
        replaced: bool,
        /// Calls of the earlier connection listed in `in_flight` and kept.
        reattached: Vec<String>,
        /// `in_flight` calls the [`CompletedCalls`] lookup reported done, acknowledged at once.
        acknowledged: Vec<String>,
    },
    /// A worker was dropped; `indeterminate` lists its in-flight calls resolved as
    /// [`crate::DispatchFailure::Indeterminate`].
    WorkerRemoved {
        /// The worker.
        worker_id: String,
        /// Why.
        reason: WorkerLost,
        /// Calls that became indeterminate.
        indeterminate: Vec<String>,
    },
    /// A result or nack arrived for a call nobody waits for any more. Record it, then
    /// [`AckHandle::ack`] it (without an observer the router acknowledges at once).
    LateResult(LateResult),
    /// A worker answered a call another worker owns; the answer was ignored.
    ForeignResult {
        /// The sender.
        worker_id: String,
        /// The call.
        call_id: String,
        /// The worker that owns the call.
        owner: String,
    },
}

/// A result nobody waits for.
#[derive(Debug)]
pub struct LateResult {
    /// The worker that sent it.
    pub worker_id: String,
    /// The call.
    pub call_id: String,
    /// What the worker reported.
    pub outcome: LateOutcome,
    /// Why nobody waits for it.
    pub reason: LateReason,
    /// Sends `WorkResultAck` once the result is recorded.
    pub ack: AckHandle,
}

/// The content of a late answer.
#[derive(Debug, Clone, PartialEq)]
pub enum LateOutcome {
    /// A `WorkToolResult`.
    Result(ToolOutcome),
    /// A `WorkToolNack`.
    Nack(ToolError),
}

/// Why a result is late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateReason {
    /// The call was abandoned (its slot was still held).
    Abandoned(AbandonReason),
    /// The router does not know the call: it was resolved as indeterminate, its abandon grace
    /// passed, it predates a restart, or it never existed.
    Unknown,
}

/// Why a dispatched call was abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbandonReason {
    /// The execution timeout passed.
    ExecutionTimeout,
    /// The caller's cancellation token fired.
    Cancelled,
    /// The caller dropped the dispatch future.
    CallerGone,
}

impl fmt::Display for AbandonReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ExecutionTimeout => "execution_timeout",
            Self::Cancelled => "cancelled",
            Self::CallerGone => "caller_gone",
        })
    }
}

/// Tells which call ids already have a durably recorded result, so a reconnecting worker's
/// `in_flight` list can be acknowledged at once.
#[async_trait]
pub trait CompletedCalls: Send + Sync + 'static {
    /// The subset of `call_ids` whose result is recorded.
    async fn completed(&self, call_ids: &[String]) -> Result<HashSet<String>, HookError>;
}

/// Records a dispatch before the invoke is sent, so a crash after the send is never mistaken
/// for a call that was not sent.
#[async_trait]
pub trait DispatchJournal: Send + Sync + 'static {
    /// No handler slot is free: `invocation` (attempt number `attempt`, from 1) is about to
    /// wait in its tool's queue. Called before the wait, so a journal can record that the call
    /// is queued; a call that gets a slot at once is never announced here (a journal records
    /// its queueing with the dispatch, in one write). An error fails the dispatch; nothing is
    /// sent. The default records nothing.
    async fn queued(&self, _invocation: &Invocation, _attempt: u32) -> Result<(), HookError> {
        Ok(())
    }

    /// A handler slot on `worker` is reserved for `invocation` (attempt number `attempt`,
    /// from 1). An error releases the slot and fails the dispatch; nothing is sent.
    async fn dispatching(
        &self,
        invocation: &Invocation,
        worker: &WorkerProvenance,
        attempt: u32,
    ) -> Result<(), HookError>;
}

/// Where a registering worker's descriptor hashes are checked against the pins of published
/// agent versions, and where a refusal is recorded.
#[async_trait]
pub trait DescriptorPins: Send + Sync + 'static {
    /// The pins the published, non-retired agent versions hold for `tool@version` (empty when
    /// none binds it).
    async fn expected(&self, tool: &str, version: &str) -> Result<Vec<String>, HookError>;

    /// Records a refused advertisement durably; called before the worker is told.
    async fn refused(&self, refusal: &DescriptorRefusal) -> Result<(), HookError>;
}

/// A handler advertisement refused because of its `descriptor_hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRefusal {
    /// The worker.
    pub worker_id: String,
    /// Its workload identity (the verified principal's name for a verified worker).
    pub workload_identity: String,
    /// Its self-asserted image digest.
    pub image_digest: String,
    /// The verified credential that registered, e.g. `"refund-bot" (token)`; `None` when
    /// nobody was verified (`local` mode).
    pub credential: Option<String>,
    /// The handler's tool.
    pub tool: String,
    /// The handler's version.
    pub version: String,
    /// The advertised `descriptor_hash` (empty when none was sent).
    pub received: String,
    /// The pins published agent versions hold for `tool@version`.
    pub expected: Vec<String>,
}
