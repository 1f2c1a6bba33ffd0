//! [`SessionStore`]: the durable operations the engine needs, nothing more.
//!
//! The domain types are the ledger's (`phrony_ledger::{Session, ToolInvocation, Approval, …}`);
//! the trait is the engine's, so the driver can run on [`crate::MemoryStore`] in unit tests and
//! on [`crate::LedgerStore`] (SQLite or PostgreSQL) in production. Every implementation must keep
//! the ledger's semantics: each operation is one atomic step appending its events to the
//! session's hash-chained stream, the state machines of sessions, tool calls and approvals, the
//! voting rules (distinct actors, any reject vetoes, comprehension, one set of approved
//! arguments) and the terminal cascade (pending approvals closed, open calls cancelled, secrets
//! purged).

use std::collections::HashSet;
use std::fmt;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use phrony_ledger::{
    Approval, Dispatch, Event, NewApproval, NewEvent, NewSession, NewToolCall, RecordedResult,
    Session, SessionEvent, StatusChange, StatusChanged, TimeoutOutcome, ToolInvocation, ToolResult,
    Vote, VoteOutcome,
};
use secrecy::SecretSlice;
use uuid::Uuid;

use crate::error::StoreResult;

/// A resolved secret in plaintext, on its way into (or out of) a store. The store seals it at
/// rest; it never appears in events.
pub struct PlainSecret {
    /// The secret's name (`secrets.<name>` of the manifest).
    pub name: String,
    /// The value.
    pub value: SecretSlice<u8>,
}

impl fmt::Debug for PlainSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlainSecret")
            .field("name", &self.name)
            .field("value", &"***")
            .finish()
    }
}

impl PlainSecret {
    /// A secret named `name` with `value`.
    pub fn new(name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            value: SecretSlice::from(value.into()),
        }
    }
}

/// A published agent version as the engine loads it for recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAgentVersion {
    /// The compiled snapshot JSON, exactly as published.
    pub snapshot_json: String,
    /// Its content hash.
    pub content_hash: String,
}

/// The durable operations of the session engine. See the module docs for the contract.
#[async_trait]
pub trait SessionStore: Send + Sync + fmt::Debug + 'static {
    /// Creates a session (status `running`, event `session.started`) and stores its secrets
    /// sealed, in one step. `new.secrets` is ignored: plaintext secrets come in `secrets`.
    async fn create_session(
        &self,
        new: NewSession,
        secrets: Vec<PlainSecret>,
    ) -> StoreResult<Session>;

    /// One session.
    async fn get_session(&self, session_id: &str) -> StoreResult<Session>;

    /// Changes a session's status (a terminal change cascades; see the module docs).
    async fn set_status(
        &self,
        session_id: &str,
        change: StatusChange,
    ) -> StoreResult<StatusChanged>;

    /// Appends a user or assistant message or the evidence snapshot to a live session.
    async fn record_session_event(
        &self,
        session_id: &str,
        event: SessionEvent,
    ) -> StoreResult<Event>;

    /// Appends an engine event of a type the store does not own (e.g. `model.completion`).
    async fn append_engine_event(&self, session_id: &str, event: NewEvent) -> StoreResult<Event>;

    /// Events with `seq > after_seq`, ascending, at most `limit`.
    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> StoreResult<Vec<Event>>;

    /// The session's secrets in plaintext (empty once it has ended).
    async fn load_secrets(&self, session_id: &str) -> StoreResult<Vec<PlainSecret>>;

    /// The agent version a session runs.
    async fn agent_version(&self, agent_version_id: Uuid) -> StoreResult<StoredAgentVersion>;

    /// Every non-terminal session, oldest first (what recovery reconciles).
    async fn sessions_needing_recovery(&self) -> StoreResult<Vec<Session>>;

    /// Records a model tool call (`pending`); idempotent for the same call.
    async fn record_tool_call(&self, new: NewToolCall) -> StoreResult<ToolInvocation>;

    /// `pending | dispatched | indeterminate → queued`.
    async fn queue_tool_call(&self, call_id: &str) -> StoreResult<ToolInvocation>;

    /// `queued → dispatched`, before the invoke is sent.
    async fn dispatch_tool_call(
        &self,
        call_id: &str,
        dispatch: Dispatch,
    ) -> StoreResult<ToolInvocation>;

    /// Records a worker's result (late and duplicate results are recorded without effect).
    async fn record_tool_result(
        &self,
        call_id: &str,
        result: ToolResult,
    ) -> StoreResult<RecordedResult>;

    /// Fails an open call on the runtime's side.
    async fn fail_tool_call(
        &self,
        call_id: &str,
        code: &str,
        message: &str,
    ) -> StoreResult<ToolInvocation>;

    /// A policy denied the call (`tool.policy_denied`).
    async fn deny_tool_call(
        &self,
        call_id: &str,
        reason: &str,
        policy_ref: Option<&str>,
    ) -> StoreResult<ToolInvocation>;

    /// `dispatched → indeterminate`.
    async fn mark_tool_call_indeterminate(
        &self,
        call_id: &str,
        reason: &str,
    ) -> StoreResult<ToolInvocation>;

    /// Cancels an open call (a pending approval for it is closed).
    async fn cancel_tool_call(&self, call_id: &str, reason: &str) -> StoreResult<ToolInvocation>;

    /// One call.
    async fn get_tool_call(&self, call_id: &str) -> StoreResult<ToolInvocation>;

    /// A session's open (non-terminal) calls, oldest first.
    async fn open_calls(&self, session_id: &str) -> StoreResult<Vec<ToolInvocation>>;

    /// The subset of `call_ids` whose outcome is recorded (terminal calls).
    async fn completed_calls(&self, call_ids: &[String]) -> StoreResult<HashSet<String>>;

    /// Opens an approval; the call and the session go to `awaiting_approval` in the same step.
    async fn open_approval(&self, new: NewApproval) -> StoreResult<Approval>;

    /// Records a vote and decides the approval when the quorum or a veto is reached.
    async fn cast_vote(&self, approval_id: Uuid, vote: Vote) -> StoreResult<VoteOutcome>;

    /// Applies an expired approval's timeout default as of `now`.
    async fn expire_approval(
        &self,
        approval_id: Uuid,
        now: DateTime<Utc>,
    ) -> StoreResult<TimeoutOutcome>;

    /// One approval with its votes.
    async fn get_approval(&self, approval_id: Uuid) -> StoreResult<Approval>;

    /// Every approval of a session (with votes), oldest first.
    async fn session_approvals(&self, session_id: &str) -> StoreResult<Vec<Approval>>;

    /// Pending approvals whose expiry is at or before `now`, soonest first.
    async fn due_approvals(&self, now: DateTime<Utc>, limit: u32) -> StoreResult<Vec<Approval>>;

    /// The earliest expiry among pending approvals.
    async fn next_approval_expiry(&self) -> StoreResult<Option<DateTime<Utc>>>;
}
