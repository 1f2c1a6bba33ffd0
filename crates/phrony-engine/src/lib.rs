//! The session engine of the Phrony runtime: it runs governed agent sessions.
//!
//! A session is a conversation between a model and the tools its agent version binds. The
//! engine drives it turn by turn (§5 of the runtime reference): it streams a completion, and for
//! every tool call the model makes it
//!
//! 1. maps the wire name to the binding (an unknown name is a tool error to the model),
//! 2. validates the arguments against the binding's `input_schema` (`invalid_args` to the
//!    model, nothing dispatched),
//! 3. evaluates the agent's policies with the call and its context (agent, session metadata,
//!    principal, time): a **deny** goes back to the model as the tool outcome and the worker is
//!    never invoked; **require_approval** opens a durable approval and pauses the session in
//!    `awaiting_approval` until the quorum approves (the call is dispatched, with the approver's
//!    edited arguments re-validated and, with `on_modify: revalidate`, re-evaluated) or someone
//!    rejects it (`on_reject: fail` fails the session, otherwise the model is told who rejected
//!    it and why); timeouts apply their default from a timer that lives in the store;
//! 4. dispatches allowed calls through the [`phrony_dispatch::Router`] (the queue wait bounds
//!    only the wait for a worker; execution has its own deadline), records the result durably
//!    and only then acknowledges it to the worker; failures are routed per §2.7 (trigger
//!    policies escalate to a human; an unknown outcome goes by side-effect class; no handler
//!    fails the turn),
//!
//! and loops until the model ends its turn. A **task** session then completes with the last
//! assistant message as output; a **conversation** parks in `awaiting_input` until
//! [`Engine::send_user_message`]. Limits (tokens, loop iterations, wall clock without approval
//! waits, approval-wait budget as a real timer) halt with accurate statuses.
//!
//! Every step is an event in the session's hash-chained stream ([`LedgerStore`], the ledger: the engine's tests run on it too), and the
//! driver reads that stream back before each step: after a restart [`Engine::recover`] resumes
//! exactly where the log says the session is (pending approvals stay paused and resume when
//! decided; calls that were in flight are re-sent or escalated by side-effect class).
//!
//! [`Engine::attach`] gives a client joining a session at any point a [`CatchUp`] (the
//! conversation so far, the text being streamed, the turn's tool activity, the current state)
//! and then its live updates with no gap and no duplicate; [`SessionView`] turns events into
//! client-facing [`Activity`] items (what `RunSessionInteractive` sends).
//!
//! [`inspect()`] assembles what `InspectSession` shows from a session's records: the session tree
//! with each session's folded output and evidence, and one timeline merging events, tool-call
//! milestones and approval milestones with one-line summaries.
//!
//! ```no_run
//! # async fn demo(stored: phrony_engine::StoredAgentVersion, version_id: uuid::Uuid,
//! #               ledger: phrony_ledger::Ledger, router: phrony_dispatch::Router)
//! #               -> Result<(), phrony_engine::EngineError> {
//! use std::sync::Arc;
//! use phrony_engine::*;
//!
//! let store = Arc::new(LedgerStore::new(ledger, None));
//! let engine = Engine::new(EngineDeps {
//!     store,
//!     router: Some(router),
//!     providers: Arc::new(DefaultProviderFactory::default()),
//!     clock: Arc::new(SystemClock),
//!     config: EngineConfig::default(),
//! });
//! engine.recover().await?;
//! // Parsed and compiled once per version: later starts of it reuse this.
//! let agent = engine.prepare_version(version_id, &stored.content_hash, &stored.snapshot_json)?;
//! let session = engine
//!     .start_session(StartSession {
//!         session_id: None,
//!         agent_version_id: version_id,
//!         agent,
//!         input: serde_json::json!("Refund €400 for ORD-1"),
//!         metadata: [("ticket_id".to_owned(), "T-1".to_owned())].into(),
//!         mode: SessionMode::Task,
//!         principal: None,
//!         secrets: vec![PlainSecret::new("openai", "sk-…")],
//!         actor: "emad".into(),
//!         bundle: None,
//!     })
//!     .await?;
//! let done = engine.wait_for(&session.id, &[]).await?; // until it ends
//! println!("{:?} {:?}", done.status, done.output);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod approval_watch;
mod attach;
mod calls;
mod clock;
mod config;
mod delegate;
mod driver;
mod endpoints;
mod engine;
mod error;
mod fold;
mod hooks;
mod inbox;
mod inspect;
mod lease;
mod mcp_clients;
mod output;
mod provider;
pub mod refusals;
mod resume;
mod setup;
mod state;
mod store;
mod subscribe;
mod timer;
mod trace;
mod vote;

pub use approval_watch::{ApprovalChange, ApprovalWatch, MAX_WATCHED_APPROVALS};
pub use attach::{
    Activity, ApprovalDecision, ApprovalRequest, AttachFrom, Attachment, AwaitingInput,
    BLOCKED_AWAITING_APPROVAL, BLOCKED_AWAITING_TOOL, CatchUp, Completion, Delegation,
    HistoryEntry, SessionView, ToolCallActivity, ToolResultActivity, TurnStats,
};
pub use calls::LIMIT_TOOL;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{
    DEFAULT_MAX_APPROVAL_WATCHERS, DEFAULT_MAX_QUEUED_USER_MESSAGES,
    DEFAULT_MAX_SESSIONS_PER_AGENT, DEFAULT_MAX_TOOL_ARGS_BYTES, DEFAULT_MAX_TOOL_CALLS_PER_TURN,
    EngineConfig,
};
pub use delegate::{DEFAULT_MAX_SUBAGENT_DEPTH, child_session_id};
pub use endpoints::{
    Activated, ActivatedBundle, Activation, ActivationError, activate, activate_bundle,
    describe_change,
};
pub use engine::{BundleStart, Engine, EngineDeps, RecoveryReport, SessionHandle, StartSession};
pub use error::{EngineError, ErrorKind, StoreError, StoreResult};
pub use fold::OUTPUT_TOOL;
pub use fold::{FAILURE_KEY, LIMIT_PREFIX, TRIGGER_KEY, codes, engine_events, wire_call_id};
pub use hooks::RouterHooks;
pub use inspect::{
    CallTimings, INLINE_PAYLOAD_BYTES, InspectedSession, Inspection, PayloadRecord,
    PayloadSelector, SessionOutput, TimelineEntry, TimelineItem, TurnSummary, call_timings,
    inspect, json_text_len, payload, sessions_by_id, shorten_json, store_timeline,
};
pub use provider::{DefaultProviderFactory, ProviderFactory, api_key_secret_name};
pub use setup::PreparedAgent;
pub use store::{LedgerStore, PlainSecret, StoredAgentVersion};
pub use subscribe::{SessionUpdate, Subscription};
pub use trace::TARGET as TRACE_TARGET;
pub use vote::{VoteAnswer, VoteTarget};

/// The ledger's domain types the engine's API speaks.
pub use phrony_ledger::{
    Approval, ApprovalKind, ApprovalStatus, Event, ReviewResolution, Session, SessionMode,
    SessionStatus, SessionTimeline, Usage, Vote, VoteDecision, VoteOutcome,
};
