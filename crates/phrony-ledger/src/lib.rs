//! The durable ledger of the Phrony runtime: the only crate that knows SQL.
//!
//! One API, two backends chosen by URL:
//!
//! | URL | Backend |
//! |---|---|
//! | `sqlite://./phrony.db`, `sqlite:///abs/path.db`, `sqlite://x.db?mode=rwc` | embedded SQLite file (missing parent directories are created `0700`, the file `0600`; see below) |
//! | `sqlite::memory:` | in-memory SQLite (one connection; gone on close) |
//! | `postgres://user@host:5432/db` (or `postgresql://`) | PostgreSQL |
//!
//! SQLite runs in WAL mode with `synchronous=FULL` (a commit is on disk when it returns),
//! foreign keys on and a 10 s busy timeout; write transactions start with `BEGIN IMMEDIATE`.
//! The database holds arguments, approvals and comments, so its files are owner-only whatever
//! the umask: a new file is created `0600` before SQLite opens it (its `-wal`/`-shm` files
//! inherit that mode), and existing files readable by others are tightened to `0600` with a
//! warning.
//!
//! ```no_run
//! # async fn demo() -> Result<(), phrony_ledger::LedgerError> {
//! use phrony_ledger::{AgentRef, Ledger, NewAgentVersion};
//! let ledger = Ledger::connect("sqlite://./phrony.db").await?;
//! ledger.migrate().await?;
//! let agent = AgentRef::new("support", "refund-agent");
//! ledger
//!     .publish_agent_version(NewAgentVersion {
//!         namespace: "support".into(),
//!         name: "refund-agent".into(),
//!         version: "0.1.0".into(),
//!         owner: "payments-team".into(),
//!         labels: Default::default(),
//!         snapshot_json: r#"{"kind":"Agent"}"#.into(),
//!         content_hash: "e3b0…".into(),
//!         actor: "alice".into(),
//!     })
//!     .await?;
//! ledger
//!     .deploy(&agent, "0.1.0", &phrony_ledger::Attribution::unverified("alice"))
//!     .await?;
//! let runnable = ledger.runnable_version(&agent, None).await?;
//! # let _ = runnable; Ok(()) }
//! ```
//!
//! # The event log is the source of truth
//!
//! Every change is an event appended to a **stream**: an agent's lifecycle stream is
//! `agent:<namespace>/<name>`; a session's stream is its session id (`run_<uuid>`). Within a
//! stream `seq` is gap-free from 1. Each event stores `prev_hash` (the previous event's hash,
//! 64 zeros for seq 1) and `hash` = hex SHA-256 over the canonical encoding
//! `["phrony.event.v1", stream, seq, type, ts, actor, call_id, turn, payload, prev_hash]`
//! (payload as canonical JSON with sorted keys; `ts` as RFC 3339 UTC with six fractional
//! digits). The payload is stored as exactly those canonical bytes.
//!
//! **Attribution** (migration 0005). An event also records how its actor was established:
//! `actor_verification` (`unverified`, `token`, `oidc`, `mtls` — [`Verification`]) and
//! `actor_via` (the relaying principal, or NULL). The hash of such an event appends both to the
//! array: `[…, prev_hash, actor_verification, actor_via]` (`actor_via` a string or `null`). An
//! event without a verification — written before attribution existed, or by one of the
//! runtime's own actors (`system`, `system:timeout`, `agent`, `policy`, `worker`: the names
//! [`phrony_auth::actor`] reserves, so no client can record one; see [`recorded_verification`])
//! — hashes exactly the ten-element array, so older logs verify unchanged.
//! [`Event::recompute_hash`] applies the same rule; [`Event::attribution`] and
//! [`Event::actor_display`] (`emad (unverified)`, `alice via approvals-ui`, a bare name for the
//! runtime and for older events) read it. The projections copy the event's attribution: the
//! votes ([`ApprovalVote::attribution`]) and the session's starter ([`Session::started_by`]).
//! Every API that records a caller's change takes an [`Attribution`].
//!
//! The `streams` table keeps
//! each stream's head (`last_seq`, `last_hash`), which is locked for every append
//! (`SELECT … FOR UPDATE` on PostgreSQL, the database write lock on SQLite), so concurrent
//! writers — several pools or several runtime replicas — never share or skip a seq.
//! [`Ledger::verify_stream`] recomputes the chain and reports the first edited, deleted,
//! inserted or reordered event, and a truncated tail (via the head). The `events` table also
//! refuses `UPDATE`/`DELETE` with triggers.
//!
//! A state change and its event commit in **one transaction**: each write locks the stream,
//! checks the request against the projections, appends the event and applies it to the
//! projection tables with the same function [`Ledger::rebuild_projections`] replays.
//!
//! Lifecycle events (stream `agent:<ns>/<name>`, actor = who asked; payload keys snake_case):
//!
//! | Type | Payload |
//! |---|---|
//! | `agent.version_published` | `agent_id, namespace, name, owner, labels, version_id, version, content_hash, snapshot_json` |
//! | `agent.deployed`, `agent.rolled_back` | `agent_id, deployment_id, version_id, version, previous_version_id, previous_version`, `secret_endpoints?` (`secret, from_env, endpoint` of every secret the version sends), `secret_endpoint_changes?` (those no earlier deployment sent there: `…, previous`) |
//! | `agent.activation_refused` | `agent_id, version_id, version, action` (`deploy`/`rollback`), `changes` (the secrets it would have sent to new endpoints); changes no projection |
//! | `agent.version_deprecated`, `agent.version_retired` | `agent_id, version_id, version` |
//! | `agent.archived` | `agent_id, deprecated_version_ids, deprecated_versions` |
//!
//! Bundle events (stream `bundle:<ns>/<name>`, actor = who asked; [`Ledger::publish_bundle`],
//! [`Ledger::deploy_bundle`], [`Ledger::rollback_bundle`] and their `_recording` forms,
//! [`Ledger::record_bundle_activation_refused`]):
//!
//! | Type | Payload |
//! |---|---|
//! | `bundle.version_published` | `bundle_id, namespace, name, labels, version_id, version, lock_hash, lock_json, manifest_json, root_member_version_id, members[]` (`child_name, origin, reference, is_root, version_id, namespace, name, version, lock_content_hash, content_hash, snapshot_json?`) |
//! | `bundle.deployed`, `bundle.rolled_back` | `bundle_id, deployment_id, version_id, version, lock_hash, previous_version_id, previous_version, previous_lock_hash`, `secret_endpoints?`, `secret_endpoint_changes?` (as the agent events', each with the `member` that sends it) |
//! | `bundle.activation_refused` | `bundle_id, version_id, version, lock_hash, action` (`deploy`/`rollback`), `changes` (each member's secret it would have sent to a new endpoint); changes no projection |
//!
//! # Sessions, tool calls and approvals
//!
//! A session's stream holds everything that happens to it; the `sessions`, `session_metadata`,
//! `tool_invocations`, `approvals` and `approval_votes` tables are its projections. Payloads
//! are snake_case; every event about a tool call carries `call_id` and the call's `turn`.
//!
//! | Type (actor) | Written by | Payload |
//! |---|---|---|
//! | `session.started` (creator) | [`Ledger::create_session`] | `session_id, agent_version_id, agent_namespace, agent_name, agent_version, mode, input, metadata, parent_session_id?, root_session_id, depth, limits?, status, bundle_version_id?` |
//! | `session.status_changed`, `session.completed`, `session.failed`, `session.cancelled` | [`Ledger::set_session_status`] (also [`Ledger::open_approval`], cascades) | `from, to, reason?, message?` (failed), `output?` (completed) |
//! | `message.user`, `message.assistant`, `evidence.recorded` | [`Ledger::record_session_event`] | [`SessionEvent`] |
//! | `tool.requested` (agent) | [`Ledger::record_tool_call`] | `call_id, agent_version_id, tool, version, wire_name?, args, turn, iteration, index, side_effect_class?, status` |
//! | `tool.queued` | [`Ledger::queue_tool_call`] | `call_id, from` |
//! | `tool.dispatched` | [`Ledger::dispatch_tool_call`] | `call_id, tool, version, args` (as sent)`, attempt, worker_id, worker_identity?, image_digest?, descriptor_hash?, manifest_content_hash?, deadline_at?` |
//! | `tool.completed` (worker / system) | [`Ledger::record_tool_result`], [`Ledger::fail_tool_call`] | `call_id, status, result? \| error_code? error_message?, worker_id?, usage?` |
//! | `tool.late_result` (worker) | [`Ledger::record_tool_result`] | `call_id, status, reason, worker_id?, result? \| error_code? error_message?` |
//! | `tool.indeterminate`, `tool.cancelled`, `tool.policy_denied` (policy) | [`Ledger::mark_tool_call_indeterminate`], [`Ledger::cancel_tool_call`], [`Ledger::deny_tool_call`] | `call_id, reason, …` |
//! | `approval.required` (policy / system) | [`Ledger::open_approval`], escalation | the approval as opened |
//! | `approval.vote` (voter) | [`Ledger::cast_vote`] | `approval_id, call_id, decided_by, decision, comment, comprehension_acknowledged, edited_args?` |
//! | `approval.decided` (system) | votes, [`Ledger::expire_approval`], terminal transitions | `approval_id, call_id, status, approved, decided_by, comment, on_reject, effective_args?` |
//! | `approval.escalated` (system) | [`Ledger::expire_approval`] | `approval_id, call_id, escalated_to, decided_by, comment` |
//!
//! Tool calls have deterministic ids ([`tool_call_id`]:
//! `<session>:<agent_version_id>:<turn>:<iteration>:<index>`) and follow the state machine in
//! [`CallStatus`]; approvals follow §3 of the reference with the fixes listed on
//! [`Ledger::cast_vote`] and [`Ledger::expire_approval`]. A terminal session transition closes
//! pending approvals (`cancelled`), cancels open calls and running child sessions, and deletes
//! the session's secrets, all in its transaction. Secrets are stored sealed ([`SecretCipher`],
//! [`SealedSecret`]) and never appear in events. Lists page with stable opaque cursors
//! ([`PageRequest`], [`Page`]); a request without a page size gets every match up to
//! [`UNSIZED_PAGE_LIMIT`] (10,000), as the unpaged reference did.
//!
//! # Agent lifecycle semantics
//!
//! Messages follow the reference runtime's error catalogue. Deliberate differences (fixes):
//! - re-publishing a version with the **same content hash** succeeds and returns the existing
//!   version (`created = false`, no event); a different hash stays [`LedgerError::AlreadyExists`];
//! - the publish actor is stored (`published_by`) and every change records its actor;
//! - **deprecated versions cannot be deployed or rolled back to** (they could not run anyway);
//! - rollback without `to` refuses a retired or deprecated previous version, like `to` does;
//! - the **active** version cannot be retired or deprecated: deploy or roll back first;
//! - retiring a version, or archiving its agent, **fails its live sessions** in the same
//!   transaction (their pending approvals closed, their open calls cancelled, with the reason
//!   `agent version ns/name@v retired by <actor>` / `agent ns/name archived by <actor>`): a
//!   call that was waiting for approval is never dispatched after the change commits, and an
//!   approval decided concurrently either committed first (its call is then cancelled) or is
//!   refused (`approval X is already cancelled`). The reference let such approvals dispatch.
//!
//! # Errors
//!
//! All fallible calls return [`LedgerError`]; its user-facing variants map one-to-one onto gRPC
//! codes (NotFound, FailedPrecondition, AlreadyExists, InvalidArgument), `Conflict` is
//! retryable, `Unavailable` means the database cannot take the request now: unreachable,
//! restarting, locked by another process past the busy timeout, out of disk
//! ([`LedgerError::is_unavailable`]). Every write that fails so turns [`Ledger::writable`]
//! `false` and the next one that succeeds turns it `true`; [`Ledger::probe_write`] (a committed
//! upsert of the one `health_probe` row, migration 0008, outside the event log) proves the
//! database takes writes, for the health check and the engine's resume task.

mod audit;
mod audit_key;
mod chain;
mod checkpoint;
mod db;
mod error;
mod event_body;
mod events;
mod files;
mod group;
mod lifecycle;
mod model;
mod replica;
mod sqlite_raw;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound as _, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::sync::watch;
use uuid::Uuid;

pub use audit::{
    AUDIT_STREAM, AuditProblem, AuditProblemKind, AuditReport, AuditScope, AuditStart,
    audit_event_types,
};
pub use audit_key::AuditKey;
pub use bundles::{
    Bundle, BundleDeployment, BundleMember, BundleRef, BundleVersion, NewBundleMember,
    NewBundleVersion, PublishedBundle, RunnableBundle,
};
pub use chain::{ChainViolation, GENESIS_HASH, ViolationKind, canonical_json};
pub use db::Backend;
pub use error::LedgerError;
pub use group::{GroupCommitStats, MAX_BATCH_AGE, MAX_BATCH_WRITES};
pub use model::{
    Agent, AgentRef, AgentVersion, ArchivedAgent, BundleMemberOrigin, Deployment, DeploymentAction,
    Event, NewAgentVersion, NewEvent, Published, RebuildReport, RetiredVersion, VerifyReport,
    VersionOrigin, VersionStatus, display_actor, is_runtime_actor, recorded_verification,
};
/// Who an event is attributed to, re-exported so that the ledger's users name one type.
pub use phrony_auth::{Attribution, Verification};

pub use approvals::{
    Approval, ApprovalFilter, ApprovalKind, ApprovalStatus, ApprovalTimeout, ApprovalVote,
    MAX_ESCALATION_DEPTH, NewApproval, OnModify, OnReject, ReviewResolution, TIMEOUT_ACTOR,
    TimeoutDefault, TimeoutOutcome, Vote, VoteDecision, VoteOutcome, call_hash,
    duplicate_vote_message, not_resent_message, same_voter, vote_resolution,
};
pub use cipher::{CipherError, KEY_LEN, SecretCipher};
pub use commits::{CommitListener, CommittedAppend, CommittedEvent, HANDED_OVER_PAYLOAD_MAX};
pub use event_body::{
    AgentActivated, AgentActivationRefused, AgentArchived, AgentVersionChanged,
    AgentVersionPublished, ApprovalDecided, ApprovalEscalated, ApprovalRequired, ApprovalVoted,
    AssistantSegment, AuditKeyIntroduced, AuditUnverifiedLogAllowed, BundleActivated,
    BundleActivationRefused, BundleMemberPublished, BundleVersionPublished, CallRefusal,
    CompletionToolCall, EventBody, HiddenTool, MessageRole, ModelCompletion, OutputAccepted,
    OutputInvalid, PolicyShadowed, Reasoning, SCHEMA_VERSION, SealedHead, SecretEndpoint,
    SecretEndpointChange, SecretEndpointRecord, SessionPrincipal, SessionStarted,
    SessionTransition, TokenCreated, TokenRevoked, ToolCancelled, ToolCompleted, ToolDispatched,
    ToolIndeterminate, ToolLateResult, ToolPolicyDenied, ToolQueued, ToolRequested, TurnUsage,
    UserMessage, WebhookRetryRequested, WebhookUnconfigured, WorkerDescriptorRefused, event_types,
};
pub use handoffs::{
    HANDOFF_CHANNEL, MAX_PUBLISHED_HANDLERS, ReplicaListener, SESSION_CHANNEL, Wake,
};
pub use history::{
    HISTORY_PRUNE_MARGIN_SECS, HistoryCounts, HistoryKey, HistoryPruned, HistoryRead,
    HistoryReservation, MAX_HISTORY_READS,
};
pub use inbox::{MAX_INBOX_READ, QueuedUserMessage};
pub use invocations::{
    CallStatus, Dispatch, NewToolCall, RecordedResult, SideEffectClass, ToolInvocation,
    ToolOutcome, ToolResult, Usage, error_codes, tool_call_id,
};
pub use leases::{LeaseClaim, LeaseRenewal, MAX_REPLICA_ID_LEN, SessionLease};
pub use outbox::{NotificationKind, WebhookRoute, notification};
pub use paging::{MAX_PAGE_SIZE, Page, PageRequest, UNSIZED_PAGE_LIMIT};
#[doc(hidden)]
pub use plans::{PreparedPlans, StatementPlan, id_join_statements};
pub use secrets::{NONCE_LEN, SealedSecret};
pub use session_log::{
    AssistantMessage, Opening, RecordedStep, SessionEvent, SessionTimeline, TimelineEvent,
    is_ledger_owned,
};
pub use sessions::{
    AgentVersionRef, MAX_METADATA_PAIRS, NewSession, OnLimit, Session, SessionFilter, SessionKind,
    SessionLimits, SessionMode, SessionStatus, StatusChange, StatusChanged, new_session_id,
};
pub use shadow::{
    MAX_SHADOW_DECISIONS, SHADOW_STREAM_PREFIX, ShadowDecision, ShadowDecisionFilter, shadow_stream,
};
pub use tokens::{ApiToken, NewApiToken, TOKENS_STREAM};
pub use vocabulary::OutputAction;
pub use vocabulary::PolicyVerdict;
pub use webhooks::{
    AttemptOutcome, ClaimedDelivery, DeliveryFilter, DeliveryStatus, MAX_CLAIM, MAX_DELIVERY_LIST,
    MAX_LAST_ERROR_CHARS, UnconfiguredWebhook, WEBHOOK_RETENTION, WEBHOOKS_ACTOR, WEBHOOKS_STREAM,
    WebhookDelivery, unconfigured_reason,
};
pub use workers::WORKERS_STREAM;

use crate::db::{Backend as B, Pool, args};
use crate::error::{Result, SqlxResultExt as _};

/// How often a write that lost a race is retried before [`LedgerError::Conflict`] is returned.
const MAX_WRITE_ATTEMPTS: u32 = 6;

/// Runs `$body` (an expression using `&mut $tx`) in a write transaction, committing on success
/// and retrying the whole transaction when it lost a race with a concurrent writer. With
/// `alone`, the transaction is a group-commit batch of its own on SQLite
/// ([`db::Pool::begin_write_alone`]); with `unfenced`, its appends are not fenced by this
/// replica's session leases (`leases.rs`).
macro_rules! write_tx {
    ($ledger:expr, |$tx:ident| $body:expr) => {
        write_tx!(@run $ledger, begin_write, Some($ledger.replica.clone()), |$tx| $body)
    };
    ($ledger:expr, alone, |$tx:ident| $body:expr) => {
        write_tx!(@run $ledger, begin_write_alone, Some($ledger.replica.clone()), |$tx| $body)
    };
    // Never fenced by this replica's session leases: facts from people (a vote, an expiry),
    // valid whichever replica records them and whoever drives the session.
    ($ledger:expr, unfenced, |$tx:ident| $body:expr) => {
        write_tx!(@run $ledger, begin_write, None, |$tx| $body)
    };
    (@run $ledger:expr, $begin:ident, $replica:expr, |$tx:ident| $body:expr) => {{
        let mut attempt: u32 = 1;
        let outcome = loop {
            let mut $tx = match $ledger
                .pool
                .$begin(
                    &$ledger.clock,
                    $ledger.audit_key.clone(),
                    $ledger.outbox.clone(),
                    $replica,
                )
                .await
            {
                Ok(tx) => tx,
                Err(error) => break Err(error),
            };
            $tx.listen($ledger.listeners.clone());
            let outcome = match $body.await {
                Ok(value) => $tx.commit().await.map(|()| value),
                // A batch that did not commit turns the refusal into the outage.
                Err(error) => $tx.rollback().await.and(Err(error)),
            };
            match outcome {
                Err(error) if error.is_retryable() && attempt < $crate::MAX_WRITE_ATTEMPTS => {
                    tracing::debug!(%error, attempt, "ledger write lost a race; retrying");
                    tokio::time::sleep(::std::time::Duration::from_millis(
                        5 * u64::from(attempt * attempt),
                    ))
                        .await;
                    attempt += 1;
                }
                other => break other,
            }
        };
        $ledger.note_write(outcome.as_ref().err());
        outcome
    }};
}

// Modules that write through `write_tx!` are declared after it (macro_rules! scoping is
// textual).
mod approvals;
mod bundles;
mod cascade;
mod cipher;
mod commits;
mod handoffs;
mod history;
mod inbox;
mod invocations;
mod leases;
mod names;
mod outbox;
mod paging;
mod plans;
mod rows;
mod secrets;
mod session_log;
mod sessions;
mod shadow;
mod space;
mod tokens;
mod vocabulary;
mod webhooks;
mod workers;

/// The checks of a raw append ([`Ledger::append_session_event`]): a usable stream name, a
/// well-formed event, and no ledger-owned type.
fn check_raw_append(stream: &str, event: &NewEvent) -> Result<()> {
    if stream.is_empty() {
        return Err(LedgerError::invalid("session_id is required"));
    }
    if stream.contains(':') || stream.chars().any(char::is_whitespace) {
        return Err(LedgerError::invalid(format!(
            "session id {stream:?} must not contain ':' or whitespace"
        )));
    }
    event.validate()?;
    if session_log::is_ledger_owned(&event.event_type) {
        return Err(LedgerError::invalid(format!(
            "event type {} is written by the ledger's session, tool-call and approval \
             operations and cannot be appended directly",
            event.event_type
        )));
    }
    Ok(())
}

/// How long a pooled PostgreSQL connection may sit idle before it is pinged again when acquired.
const PG_IDLE_PING_AFTER: Duration = Duration::from_secs(1);

/// The options of the ledger's PostgreSQL pools: each connection is pinged when it comes back
/// to the pool; one idle for longer than `PG_IDLE_PING_AFTER` (the server may have closed it)
/// is pinged again before reuse, one just returned is not: a round trip less per pooled read
/// under load.
fn pg_pool_options(o: &LedgerOptions, max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PG_IDLE_PING_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .acquire_timeout(o.acquire_timeout)
}

/// Runs when a SQLite connection goes back to the pool: if its user was cancelled at an unlucky
/// moment (a client that disconnected, a session driver stopped mid-step), a transaction can
/// still be open on it — e.g. a `BEGIN IMMEDIATE` that ran after the caller stopped waiting for
/// it — and would hold the database's write lock until that connection happened to be used
/// again, stalling every writer for the busy timeout. Waits for the connection's queued commands
/// (a queued rollback included), then rolls back whatever is still open. An error closes the
/// connection instead.
async fn roll_back_abandoned_transaction(
    conn: &mut sqlx::SqliteConnection,
) -> std::result::Result<bool, sqlx::Error> {
    use sqlx::TransactionManager as _;
    conn.ping().await?;
    while conn.is_in_transaction() {
        tracing::debug!("rolling back a transaction abandoned by a cancelled caller");
        <sqlx::Sqlite as sqlx::Database>::TransactionManager::rollback(conn).await?;
    }
    Ok(true)
}

/// Tuning knobs for [`Ledger::connect_with`].
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Maximum pooled connections (ignored for `sqlite::memory:`, which uses exactly one).
    pub max_connections: u32,
    /// How long to wait for a connection (and, for PostgreSQL, for the first connect).
    pub acquire_timeout: Duration,
    /// SQLite busy timeout: how long a writer waits for the write lock.
    pub sqlite_busy_timeout: Duration,
    /// How long [`Ledger::probe_write`] waits for the SQLite write lock (its own connection's
    /// busy timeout; default 1 s): short, so that a health check answers quickly while another
    /// process holds the lock.
    pub probe_busy_timeout: Duration,
    /// A SQLite file's free-space reserve: while the filesystem holding the database has
    /// fewer bytes than this available, writes and the write probe fail with
    /// [`LedgerError::Unavailable`] before they begin, and succeed again once space is freed
    /// (default 32 MiB; 0 keeps no reserve, and a full disk then fails whichever write first
    /// needs a new page). Ignored for PostgreSQL and in-memory databases.
    pub sqlite_min_free_bytes: u64,
    /// Where event timestamps and approval expiries come from ([`LedgerClock::system`] unless a
    /// test injects another).
    pub clock: LedgerClock,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            sqlite_busy_timeout: Duration::from_secs(10),
            probe_busy_timeout: Duration::from_secs(1),
            sqlite_min_free_bytes: space::DEFAULT_MIN_FREE_BYTES,
            clock: LedgerClock::system(),
        }
    }
}

/// The ledger's source of the current time: the timestamp of every appended event, a stream's
/// creation time and an approval's expiry. The system clock in production; a test injects a
/// clock it controls (e.g. the engine's manual clock) so that stored times follow it.
#[derive(Clone)]
pub struct LedgerClock(Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>);

impl LedgerClock {
    /// The system clock.
    #[must_use]
    pub fn system() -> Self {
        Self(Arc::new(Utc::now))
    }

    /// A clock that reads `now`.
    pub fn new(now: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    /// The current time at the precision both backends store (microseconds).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        (self.0)().trunc_subsecs(6)
    }
}

impl Default for LedgerClock {
    fn default() -> Self {
        Self::system()
    }
}

impl std::fmt::Debug for LedgerClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LedgerClock")
    }
}

/// A handle to the ledger database. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: Pool,
    /// Seals every appended stream head (`chain_heads`); see [`Ledger::with_audit_key`].
    audit_key: Option<Arc<AuditKey>>,
    /// Where stored times come from.
    clock: LedgerClock,
    /// The URL with any password removed, for messages.
    display_url: String,
    /// Whether the last write (or write probe) went through: see [`Ledger::writable`].
    writable: Arc<watch::Sender<bool>>,
    /// The error of the last write that found the database unavailable.
    last_outage: Arc<std::sync::Mutex<Option<String>>>,
    /// The connection [`Ledger::probe_write`] uses: on a SQLite file its own one-connection
    /// pool with the short probe busy timeout; otherwise the main pool.
    probe: Probe,
    /// The configured webhooks: appends of notifying events write outbox rows for them
    /// (`webhooks.rs`); `None` (the default) writes none. See [`Ledger::with_webhooks`].
    outbox: Option<Arc<outbox::Outbox>>,
    /// This handle's replica identity and the session leases it holds (`leases.rs`), shared by
    /// its clones: appends to a session it holds a lease on are fenced by the lease's epoch.
    replica: Arc<replica::Replica>,
    /// PostgreSQL: the connections history lookups use ([`Ledger::history_facts`]), whose
    /// sessions plan with `plan_cache_mode = force_generic_plan`. The lookup is one statement
    /// of fixed shape per kind of read whose parameters are keys and bounds; left to choose,
    /// PostgreSQL kept re-planning its `UNION ALL` of bucket ranges on every call (a custom
    /// plan each time: ≈ 0.5 ms, three times the round trip). Small and opened lazily; `None`
    /// on SQLite.
    history_pool: Option<sqlx::PgPool>,
    /// Who hears the appends of this handle's (and its clones') committed writes
    /// ([`Ledger::listen_to_commits`]).
    listeners: Arc<commits::Listeners>,
    /// The content hashes of the agent versions this handle's dispatches named (immutable once
    /// stored), shared by its clones.
    version_hashes: Arc<invocations::VersionHashes>,
}

/// How [`Ledger::probe_write`] reaches the database.
#[derive(Debug, Clone)]
struct Probe {
    /// A one-connection SQLite pool with [`LedgerOptions::probe_busy_timeout`]; `None` uses the
    /// main pool (PostgreSQL, in-memory SQLite).
    sqlite: Option<sqlx::SqlitePool>,
    /// Bounds the probe's statements on PostgreSQL (`SET LOCAL statement_timeout`).
    timeout: Duration,
    /// A SQLite file's free-space reserve: the probe fails below it, as writes do.
    floor: Option<space::DiskFloor>,
}

impl Ledger {
    /// Connects with [`LedgerOptions::default`]. See [`Ledger::connect_with`].
    ///
    /// # Errors
    /// See [`Ledger::connect_with`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, LedgerOptions::default()).await
    }

    /// Opens a connection pool for `url` (`sqlite:…` or `postgres://…`) and checks that the
    /// database answers. Does not migrate: call [`Ledger::migrate`].
    ///
    /// # Errors
    /// [`LedgerError::Config`] for an unsupported scheme or malformed URL, or when the SQLite
    /// file's directory cannot be created; [`LedgerError::Unavailable`] when the database
    /// cannot be reached.
    pub async fn connect_with(url: &str, options: LedgerOptions) -> Result<Self> {
        let display_url = redact_url(url);
        let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("sqlite") => Self::connect_sqlite(url, display_url, &options).await,
            Some("postgres" | "postgresql") => {
                Self::connect_postgres(url, display_url, &options).await
            }
            Some(other) if !other.is_empty() => Err(LedgerError::Config {
                message: format!(
                    "unsupported database URL scheme {other:?}; use sqlite://… or postgres://…"
                ),
            }),
            _ => Err(LedgerError::Config {
                message: format!(
                    "database URL {display_url:?} has no scheme; use sqlite://… or postgres://…"
                ),
            }),
        }
    }

    async fn connect_sqlite(url: &str, display_url: String, o: &LedgerOptions) -> Result<Self> {
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let mut opts = SqliteConnectOptions::from_str(url).map_err(|e| LedgerError::Config {
            message: format!("invalid SQLite URL {display_url:?}: {e}"),
        })?;
        if !url.contains("mode=") {
            opts = opts.create_if_missing(true);
        }
        opts = opts
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(o.sqlite_busy_timeout)
            // Every write runs in a savepoint of its batch, so SQLite keeps a statement journal
            // for each batch. With the default temp store that journal is a new file in
            // /var/tmp per batch (open, unlink, a write per page, close): syscalls and page-cache
            // work on every commit, and ledger pages (tool arguments) copied outside the
            // database's directory. In memory it is bounded by the pages one batch changes.
            .pragma("temp_store", "memory")
            .disable_statement_logging();
        if !in_memory {
            let creates = !url.contains("mode=") || url.contains("mode=rwc");
            files::prepare_sqlite_file(opts.get_filename(), creates)?;
            // The checkpoint task checkpoints the WAL; a commit does only past this bound.
            opts = opts.pragma("wal_autocheckpoint", checkpoint::AUTOCHECKPOINT_PAGES);
        }
        let floor = if in_memory {
            None
        } else {
            space::DiskFloor::new(opts.get_filename(), o.sqlite_min_free_bytes)
        };
        let pool_options = if in_memory {
            // Every connection would otherwise see its own (or a dropped) in-memory database.
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(o.max_connections.max(1))
        }
        // A connection to a local file cannot break while idle, and each was pinged (and any
        // abandoned transaction rolled back) when it came back: no ping per acquire, which cost
        // a round trip through the connection's worker thread on every pooled read.
        .test_before_acquire(false)
        .after_release(|conn, _| Box::pin(roll_back_abandoned_transaction(conn)));
        // Reads of a file go through direct read-only connections (`sqlite_raw`): a statement
        // through sqlx's pool is a round trip to the connection's worker thread, which profiles
        // showed costing more than the reads themselves.
        // Every text the writer and the readers prepare, for `Ledger::explain_prepared_statements`.
        let prepared = sqlite_raw::PreparedTexts::of_process();
        let readers = if in_memory {
            None
        } else {
            Some(Arc::new(
                sqlite_raw::RawReadPool::new(
                    opts.get_filename(),
                    o.max_connections,
                    o.sqlite_busy_timeout,
                    o.acquire_timeout,
                    prepared.clone(),
                )
                .map_err(|message| LedgerError::Config { message })?,
            ))
        };
        let unavailable = |error| LedgerError::Unavailable {
            context: format!("cannot open SQLite database {display_url}"),
            error,
        };
        // The probe's own connection: the same file and settings, a short busy timeout.
        let probe_pool = (!in_memory).then(|| {
            SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(o.acquire_timeout)
                .after_release(|conn, _| Box::pin(roll_back_abandoned_transaction(conn)))
                .connect_lazy_with(opts.clone().busy_timeout(o.probe_busy_timeout))
        });
        let checkpoints = (!in_memory).then(|| {
            checkpoint::Checkpoints::spawn(opts.clone().busy_timeout(o.probe_busy_timeout))
        });
        let pool = if in_memory {
            pool_options
                .acquire_timeout(o.acquire_timeout)
                .connect_with(opts)
                .await
        } else {
            // Surface the real open error (permissions, not a database) instead of a pool timeout.
            let probe = SqliteConnection::connect_with(&opts)
                .await
                .map_err(unavailable)?;
            probe.close().await.map_err(unavailable)?;
            pool_options
                .acquire_timeout(o.acquire_timeout)
                .connect_with(opts)
                .await
        }
        .map_err(unavailable)?;
        Ok(Self::assemble(
            Pool::Sqlite(
                pool.clone(),
                // The writer keeps its connection (and its prepared statements) while another
                // one is left for the pool's other users; an in-memory database has one only.
                group::GroupWriter::spawn(
                    pool,
                    !in_memory && o.max_connections >= 2,
                    prepared,
                    floor.clone(),
                    checkpoints,
                ),
                readers,
            ),
            o,
            display_url,
            Probe {
                sqlite: probe_pool,
                timeout: o.probe_busy_timeout,
                floor,
            },
        ))
    }

    async fn connect_postgres(url: &str, display_url: String, o: &LedgerOptions) -> Result<Self> {
        let opts = PgConnectOptions::from_str(url)
            .map_err(|e| LedgerError::Config {
                message: format!("invalid PostgreSQL URL {display_url:?}: {e}"),
            })?
            .application_name("phrony-runtime")
            .disable_statement_logging();
        let unavailable = |error| LedgerError::Unavailable {
            context: format!("cannot connect to PostgreSQL at {display_url}"),
            error,
        };
        // One direct connection first: the pool would retry until its timeout and then report
        // only "pool timed out", hiding "connection refused" or "password authentication failed".
        let probe = tokio::time::timeout(o.acquire_timeout, PgConnection::connect_with(&opts))
            .await
            .map_err(|_| unavailable(sqlx::Error::PoolTimedOut))?
            .map_err(unavailable)?;
        probe.close().await.map_err(unavailable)?;
        let history_pool = pg_pool_options(o, (o.max_connections / 4).max(2)).connect_lazy_with(
            opts.clone()
                .options([("plan_cache_mode", "force_generic_plan")]),
        );
        let pool = pg_pool_options(o, o.max_connections.max(1))
            .connect_with(opts)
            .await
            .map_err(unavailable)?;
        let probe = Probe {
            sqlite: None,
            timeout: o.probe_busy_timeout,
            floor: None,
        };
        let mut ledger = Self::assemble(Pool::Postgres(pool), o, display_url, probe);
        ledger.history_pool = Some(history_pool);
        Ok(ledger)
    }

    fn assemble(pool: Pool, o: &LedgerOptions, display_url: String, probe: Probe) -> Self {
        Self {
            pool,
            audit_key: None,
            clock: o.clock.clone(),
            display_url,
            writable: Arc::new(watch::channel(true).0),
            last_outage: Arc::default(),
            probe,
            outbox: None,
            replica: Arc::new(replica::Replica::new(replica::default_replica_id())),
            history_pool: None,
            listeners: Arc::default(),
            version_hashes: Arc::default(),
        }
    }

    /// Which backend this ledger uses.
    #[must_use]
    pub fn backend(&self) -> Backend {
        self.pool.backend()
    }

    /// The database URL without its password.
    #[must_use]
    pub fn display_url(&self) -> &str {
        &self.display_url
    }

    /// Applies the embedded migrations for this backend, then records the number of the last
    /// one as `runtime_meta.schema_version` (derived from the migrations, so a new migration
    /// moves it without anyone remembering to). Idempotent; safe to run from several processes
    /// at once (PostgreSQL takes an advisory lock; SQLite serialises writers).
    ///
    /// # Errors
    /// [`LedgerError::Migration`], e.g. when the database was migrated by a newer build.
    pub async fn migrate(&self) -> Result<()> {
        let migrator = match &self.pool {
            Pool::Sqlite(..) => sqlx::migrate!("migrations/sqlite"),
            Pool::Postgres(_) => sqlx::migrate!("migrations/postgres"),
        };
        // A process migrating beside this one can make each migration fail here once, so one
        // retry per migration (a migration failing for another reason is reported after them,
        // ≈ 50 ms each).
        let attempts = migrator.iter().count() + 1;
        let mut attempt = 1;
        loop {
            let result = match &self.pool {
                Pool::Sqlite(p, ..) => migrator.run(p).await,
                Pool::Postgres(p) => migrator.run(p).await,
            };
            match result {
                Ok(()) => {
                    let latest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
                    return self.record_schema_version(latest).await;
                }
                // SQLite has no migration lock: a process migrating the same file at the same
                // moment makes this run fail on "table exists". Re-running sees its work (and
                // may fail on the next migration that process is applying meanwhile).
                Err(sqlx::migrate::MigrateError::ExecuteMigration(..))
                    if self.backend() == B::Sqlite && attempt < attempts =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(source) => return Err(migration_error(source)),
            }
        }
    }

    /// Upserts `runtime_meta.schema_version` to `version` (the last applied migration), when
    /// it says otherwise: opening an up-to-date database writes nothing, so that it opens (and
    /// is read, e.g. by `audit verify`) while it cannot take writes — below the free-space
    /// reserve, say.
    async fn record_schema_version(&self, version: i64) -> Result<()> {
        let version = version.to_string();
        if self.schema_version().await?.as_deref() == Some(version.as_str()) {
            return Ok(());
        }
        write_tx!(self, |tx| async {
            tx.conn()
                .execute(
                    "record the schema version",
                    "INSERT INTO runtime_meta (key, value) VALUES ('schema_version', $1) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    args![version.as_str()],
                )
                .await
                .map(|_| ())
        })
    }

    /// The schema version (`runtime_meta.schema_version`: the number of the last migration
    /// applied, e.g. `"7"` after `0007_*.sql`), or `None` before the first migration. Shown by
    /// `phrony status`.
    ///
    /// # Errors
    /// [`LedgerError::Unavailable`] / [`LedgerError::Database`] when the query fails.
    pub async fn schema_version(&self) -> Result<Option<String>> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let exists_sql = match self.backend() {
            B::Sqlite => {
                "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = 'runtime_meta'"
            }
            B::Postgres => {
                "SELECT COUNT(*) AS n FROM pg_catalog.pg_tables \
                 WHERE schemaname = current_schema() AND tablename = 'runtime_meta'"
            }
        };
        let exists = c.fetch_optional("check schema", exists_sql, vec![]).await?;
        if exists.map(|r| r.int("n")).transpose()?.unwrap_or(0) == 0 {
            return Ok(None);
        }
        let row = c
            .fetch_optional(
                "read schema version",
                "SELECT value FROM runtime_meta WHERE key = 'schema_version'",
                vec![],
            )
            .await?;
        row.map(|r| r.text("value")).transpose()
    }

    /// Checks that the database answers (for the gRPC health check).
    ///
    /// # Errors
    /// [`LedgerError::Unavailable`] or [`LedgerError::Database`].
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        conn.conn()
            .fetch_optional("ping", "SELECT 1 AS one", vec![])
            .await?;
        Ok(())
    }

    /// Proves that the database takes a durable write now: upserts the `health_probe` row
    /// (migration 0008) in a committed write transaction. On a SQLite file it uses its own
    /// connection whose busy timeout is [`LedgerOptions::probe_busy_timeout`], so it fails
    /// within that time while another process holds the write lock, and fails while the
    /// filesystem has less than [`LedgerOptions::sqlite_min_free_bytes`] available, as writes
    /// do (a one-row upsert alone can succeed on a full disk, in WAL space already allocated);
    /// on PostgreSQL its statements are bounded
    /// by the same time (`statement_timeout`). Success marks the ledger writable, an outage
    /// marks it not writable ([`Ledger::writable`]). Writes no event: the probe is not part of
    /// the audit log.
    ///
    /// # Errors
    /// [`LedgerError::Unavailable`] when the database cannot take the write now;
    /// [`LedgerError::Database`] for other failures (e.g. an unmigrated database).
    ///
    /// On a SQLite file, a probe that finds the write lock busy while this process's own group
    /// commit committed a batch during the probe's wait is not an outage: the lock is held by
    /// our own writer, which is taking writes (under a sustained burst of writes the probe's
    /// connection can wait longer than its busy timeout for a turn). Another process holding
    /// the lock stops those commits too, so it is still detected at once.
    pub async fn probe_write(&self) -> Result<()> {
        let before = self.group_commit_stats();
        let outcome = match self.probe_once().await {
            Err(e)
                if e.is_unavailable()
                    && before.is_some_and(|b| {
                        // Our own writer held the lock (a batch was open before or after the
                        // probe waited, or committed meanwhile): the database takes writes.
                        self.group_commit_stats().is_some_and(|now| {
                            b.holding_write_lock
                                || now.holding_write_lock
                                || now.commits > b.commits
                        })
                    }) =>
            {
                tracing::debug!(error = %e, "write probe busy while our own writes commit");
                Ok(())
            }
            other => other,
        };
        self.note_write(outcome.as_ref().err());
        outcome
    }

    async fn probe_once(&self) -> Result<()> {
        const UPSERT: &str = "INSERT INTO health_probe (id, probed_at, probes) VALUES (1, $1, 1) \
                              ON CONFLICT (id) DO UPDATE \
                              SET probed_at = excluded.probed_at, probes = health_probe.probes + 1";
        let now = chain::format_ts(&self.clock.now());
        if let Some(floor) = &self.probe.floor {
            floor.check("probe write")?;
        }
        match (&self.probe.sqlite, &self.pool) {
            (Some(pool), _) | (None, Pool::Sqlite(pool, ..)) => {
                let mut tx = pool
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err(|e| LedgerError::from_sqlx("probe write: begin", e))?;
                sqlx::query(UPSERT)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| LedgerError::from_sqlx("probe write: upsert", e))?;
                tx.commit()
                    .await
                    .map_err(|e| LedgerError::from_sqlx("probe write: commit", e))
            }
            (None, Pool::Postgres(pool)) => {
                let mut tx = pool
                    .begin()
                    .await
                    .map_err(|e| LedgerError::from_sqlx("probe write: begin", e))?;
                let millis = self.probe.timeout.as_millis().clamp(1, 600_000);
                sqlx::query(&format!("SET LOCAL statement_timeout = {millis}"))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| LedgerError::from_sqlx("probe write: set timeout", e))?;
                sqlx::query(UPSERT)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| LedgerError::from_sqlx("probe write: upsert", e))?;
                tx.commit()
                    .await
                    .map_err(|e| LedgerError::from_sqlx("probe write: commit", e))
            }
        }
    }

    /// Follows whether the database takes writes: `false` from the moment a write (or
    /// [`Ledger::probe_write`]) fails with [`LedgerError::Unavailable`], `true` again after
    /// the next one that succeeds. Starts `true`. Pure bookkeeping (no I/O); shared by clones.
    #[must_use]
    pub fn writable(&self) -> watch::Receiver<bool> {
        self.writable.subscribe()
    }

    /// What the SQLite group-commit writer has committed since this ledger connected:
    /// batches (`COMMIT`s, each one fsync) and the write transactions they carried. `None` on
    /// PostgreSQL, where every write transaction commits on its own. For benchmarks and tests.
    #[must_use]
    pub fn group_commit_stats(&self) -> Option<GroupCommitStats> {
        match &self.pool {
            Pool::Sqlite(_, writer, _) => Some(writer.stats()),
            Pool::Postgres(_) => None,
        }
    }

    /// The current value of [`Ledger::writable`].
    #[must_use]
    pub fn is_writable(&self) -> bool {
        *self.writable.borrow()
    }

    /// The error of the last write that found the database unavailable (what turned
    /// [`Ledger::writable`] to `false`), for logs.
    #[must_use]
    pub fn last_outage(&self) -> Option<String> {
        self.last_outage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records the outcome of a write for [`Ledger::writable`]: an outage marks the store not
    /// writable, a success writable; other errors (a refused request, a lost race) say nothing
    /// about the storage.
    pub(crate) fn note_write(&self, error: Option<&LedgerError>) {
        let writable = match error {
            None => true,
            Some(e) if e.is_unavailable() => {
                *self
                    .last_outage
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.to_string());
                false
            }
            Some(_) => return,
        };
        self.writable.send_if_modified(|w| {
            let changed = *w != writable;
            *w = writable;
            changed
        });
    }

    /// Closes the pool, waiting for checked-out connections to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(history) = &self.history_pool {
            history.close().await;
        }
        if let Some(probe) = &self.probe.sqlite {
            probe.close().await;
        }
    }

    // -----------------------------------------------------------------------------------------
    // Agent lifecycle

    /// Publishes an immutable agent version (creating the agent on first publish). Does not
    /// deploy it.
    ///
    /// # Errors
    /// - `InvalidArgument`: empty fields, or `snapshot_json` is not a JSON object;
    /// - `FailedPrecondition`: `agent ns/name is archived and cannot accept new versions`;
    /// - `AlreadyExists`: the version exists with a different content hash.
    pub async fn publish_agent_version(&self, new: NewAgentVersion) -> Result<Published> {
        new.agent_ref().validate()?;
        require_nonempty("version", &new.version)?;
        require_nonempty("content_hash", &new.content_hash)?;
        require_nonempty("actor", &new.actor.actor)?;
        match serde_json::from_str::<serde_json::Value>(&new.snapshot_json) {
            Ok(serde_json::Value::Object(_)) => {}
            Ok(_) => return Err(LedgerError::invalid("snapshot_json must be a JSON object")),
            Err(e) => {
                return Err(LedgerError::invalid(format!(
                    "snapshot_json is not valid JSON: {e}"
                )));
            }
        }
        write_tx!(self, |tx| lifecycle::publish(&mut tx, &new))
    }

    /// Activates `version` (appends a `deploy` row; re-deploying the active version is allowed).
    ///
    /// # Errors
    /// `NotFound` (`agent ns/name not found`, `no published version "v" for agent ns/name`),
    /// `FailedPrecondition` (archived agent; retired or deprecated version).
    pub async fn deploy(
        &self,
        agent: &AgentRef,
        version: &str,
        actor: &Attribution,
    ) -> Result<Deployment> {
        agent.validate()?;
        require_version(version)?;
        self.deploy_recording(agent, version, actor, None).await
    }

    /// [`Ledger::deploy`], recording where the version sends its secrets (`secrets`, computed
    /// by the caller) in the `agent.deployed` event.
    ///
    /// # Errors
    /// As [`Ledger::deploy`].
    pub async fn deploy_recording(
        &self,
        agent: &AgentRef,
        version: &str,
        actor: &Attribution,
        secrets: Option<&SecretEndpointRecord>,
    ) -> Result<Deployment> {
        agent.validate()?;
        require_version(version)?;
        require_nonempty("actor", &actor.actor)?;
        write_tx!(self, |tx| lifecycle::deploy(
            &mut tx, agent, version, actor, secrets
        ))
    }

    /// Records that a deploy or rollback of `version` was refused because it would send the
    /// secrets in `changes` to endpoints no earlier deployment used (`agent.activation_refused`
    /// on the agent's stream, by `actor`). Nothing else changes.
    ///
    /// # Errors
    /// `NotFound` (agent or version), `InvalidArgument` (empty actor), the database's errors.
    pub async fn record_activation_refused(
        &self,
        agent: &AgentRef,
        version: &str,
        action: DeploymentAction,
        changes: &[SecretEndpointChange],
        actor: &Attribution,
    ) -> Result<()> {
        agent.validate()?;
        require_version(version)?;
        require_nonempty("actor", &actor.actor)?;
        write_tx!(self, |tx| lifecycle::record_activation_refused(
            &mut tx, agent, version, action, changes, actor
        ))
    }

    /// Re-activates `to`, or (when `None`) the newest previously deployed version that differs
    /// from the active one. Records a `rollback` row.
    ///
    /// # Errors
    /// `NotFound` (agent or version), `FailedPrecondition` (archived; no active deployment;
    /// `no previous deployment to roll back to for agent ns/name`; retired or deprecated target).
    pub async fn rollback(
        &self,
        agent: &AgentRef,
        to: Option<&str>,
        actor: &Attribution,
    ) -> Result<Deployment> {
        agent.validate()?;
        if let Some(v) = to {
            require_version(v)?;
        }
        require_nonempty("actor", &actor.actor)?;
        write_tx!(self, |tx| lifecycle::rollback(
            &mut tx, agent, to, actor, None
        ))
    }

    /// [`Ledger::rollback`] to `to`, recording where that version sends its secrets (`secrets`,
    /// computed by the caller) in the `agent.rolled_back` event.
    ///
    /// # Errors
    /// As [`Ledger::rollback`].
    pub async fn rollback_recording(
        &self,
        agent: &AgentRef,
        to: &str,
        actor: &Attribution,
        secrets: &SecretEndpointRecord,
    ) -> Result<Deployment> {
        agent.validate()?;
        require_version(to)?;
        require_nonempty("actor", &actor.actor)?;
        write_tx!(self, |tx| lifecycle::rollback(
            &mut tx,
            agent,
            Some(to),
            actor,
            Some(secrets)
        ))
    }

    /// The active deployment (the newest deploy/rollback row).
    ///
    /// # Errors
    /// `NotFound` for an unknown agent; `FailedPrecondition`: `no active deployment for agent …`.
    pub async fn active_version(&self, agent: &AgentRef) -> Result<Deployment> {
        agent.validate()?;
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let a = lifecycle::require_agent(&mut c, agent).await?;
        lifecycle::active_deployment(&mut c, a.id)
            .await?
            .ok_or_else(|| {
                LedgerError::precondition(format!("no active deployment for agent {agent}"))
            })
    }

    /// Deployment history, newest first.
    ///
    /// # Errors
    /// `NotFound` for an unknown agent.
    pub async fn list_deployments(&self, agent: &AgentRef) -> Result<Vec<Deployment>> {
        agent.validate()?;
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let a = lifecycle::require_agent(&mut c, agent).await?;
        lifecycle::list_deployments(&mut c, a.id).await
    }

    /// One version by label.
    ///
    /// # Errors
    /// `NotFound`: `agent ns/name not found` / `no published version "v" for agent ns/name`.
    pub async fn get_agent_version(&self, agent: &AgentRef, version: &str) -> Result<AgentVersion> {
        agent.validate()?;
        require_version(version)?;
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let a = lifecycle::require_agent(&mut c, agent).await?;
        lifecycle::find_version(&mut c, a.id, version)
            .await?
            .ok_or_else(|| {
                LedgerError::not_found(format!(
                    "no published version {version:?} for agent {agent}"
                ))
            })
    }

    /// One version by id.
    ///
    /// # Errors
    /// `NotFound`: `agent version "id" not found`.
    pub async fn get_agent_version_by_id(&self, id: Uuid) -> Result<AgentVersion> {
        let mut conn = self.pool.acquire().await?;
        rows::find_version_by_id(&mut conn.conn(), id)
            .await?
            .ok_or_else(|| LedgerError::not_found(format!("agent version \"{id}\" not found")))
    }

    /// Agents (archived included), ordered by namespace then name.
    ///
    /// # Errors
    /// Database errors only.
    pub async fn list_agents(&self, namespace: Option<&str>) -> Result<Vec<Agent>> {
        let mut conn = self.pool.acquire().await?;
        lifecycle::list_agents(&mut conn.conn(), namespace.filter(|n| !n.is_empty())).await
    }

    /// One agent.
    ///
    /// # Errors
    /// `NotFound`: `agent ns/name not found`.
    pub async fn get_agent(&self, agent: &AgentRef) -> Result<Agent> {
        agent.validate()?;
        let mut conn = self.pool.acquire().await?;
        lifecycle::require_agent(&mut conn.conn(), agent).await
    }

    /// Published versions, newest publish first; see [`AgentVersion::status`].
    ///
    /// # Errors
    /// `NotFound` for an unknown agent.
    pub async fn list_agent_versions(&self, agent: &AgentRef) -> Result<Vec<AgentVersion>> {
        agent.validate()?;
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let a = lifecycle::require_agent(&mut c, agent).await?;
        lifecycle::list_versions(&mut c, a.id).await
    }

    /// Deprecates a version: it can no longer be deployed, rolled back to or run.
    ///
    /// # Errors
    /// `NotFound` (`no active version "v" for agent …`, also when already deprecated),
    /// `FailedPrecondition` (archived agent; the version is the active deployment).
    pub async fn deprecate_version(
        &self,
        agent: &AgentRef,
        version: &str,
        actor: &Attribution,
    ) -> Result<AgentVersion> {
        agent.validate()?;
        require_version(version)?;
        require_nonempty("actor", &actor.actor)?;
        write_tx!(self, |tx| lifecycle::deprecate(
            &mut tx, agent, version, actor
        ))
    }

    /// Retires a version: it can no longer be deployed, rolled back to or run. Its live
    /// sessions fail in the same transaction (`agent version ns/name@v retired by <actor>`):
    /// their pending approvals are closed (`cancelled`, with that reason) and their open calls
    /// cancelled, so a decision that did not commit before the retire dispatches nothing.
    ///
    /// # Errors
    /// `NotFound` (`no version "v" for agent …`, also when already retired),
    /// `FailedPrecondition` (archived agent; the version is the active deployment).
    pub async fn retire_version(
        &self,
        agent: &AgentRef,
        version: &str,
        actor: &Attribution,
    ) -> Result<RetiredVersion> {
        agent.validate()?;
        require_version(version)?;
        require_nonempty("actor", &actor.actor)?;
        write_tx!(self, |tx| lifecycle::retire_ending_sessions(
            &mut tx, agent, version, actor
        ))
    }

    /// Archives the agent and deprecates all its versions, in one transaction. Archived agents
    /// stay listed but accept no publish, deploy, rollback, deprecate, retire or run. The live
    /// sessions of all its versions fail in the same transaction (`agent ns/name archived by
    /// <actor>`), like [`Ledger::retire_version`]'s.
    ///
    /// # Errors
    /// `NotFound`; `FailedPrecondition`: `agent ns/name is already archived`.
    pub async fn archive_agent(
        &self,
        agent: &AgentRef,
        actor: &Attribution,
    ) -> Result<ArchivedAgent> {
        agent.validate()?;
        require_nonempty("actor", &actor.actor)?;
        write_tx!(self, |tx| lifecycle::archive(&mut tx, agent, actor))
    }

    /// The version a new session runs: the active deployment, which must not be deprecated or
    /// retired, of an agent that is not archived. An explicit `version` must equal the active
    /// one.
    ///
    /// # Errors
    /// `NotFound` (`agent ns/name not found`); `FailedPrecondition`
    /// (`agent ns/name is archived and cannot be run`, `no active deployment for agent ns/name`,
    /// `version "x" is not the active deployment (active: "y")`,
    /// `agent ns/name version "v" is retired|deprecated and cannot be run`).
    pub async fn runnable_version(
        &self,
        agent: &AgentRef,
        version: Option<&str>,
    ) -> Result<AgentVersion> {
        agent.validate()?;
        let mut conn = self.pool.acquire().await?;
        lifecycle::runnable(&mut conn.conn(), agent, version.filter(|v| !v.is_empty())).await
    }

    // -----------------------------------------------------------------------------------------
    // Event log

    /// Appends one event to a stream (a session id, or another non-agent stream such as an
    /// audit stream) and returns it with its seq and hashes. Concurrent appends are serialised.
    /// This is the raw append: it does not check that a session exists. The session engine
    /// uses [`Ledger::record_session_event`]; the ledger-owned types
    /// ([`event_types::LEDGER_OWNED`]) are refused because they must change the projections
    /// in the same transaction.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty or reserved stream name (containing `:`), a malformed
    /// event (type not dotted lower-case, empty actor) or a ledger-owned event type.
    pub async fn append_session_event(&self, session_id: &str, event: NewEvent) -> Result<Event> {
        check_raw_append(session_id, &event)?;
        write_tx!(self, |tx| async {
            let mut head = events::lock_stream(&mut tx, session_id).await?;
            events::append(&mut tx, &mut head, event.clone()).await
        })
    }

    /// Appends `events` to a stream in ONE transaction, in order, chained one after the other,
    /// and returns them as stored: all of them or (on any error) none. The stream head is
    /// advanced and sealed once, the rows go in multi-row `INSERT`s, and a batch that creates
    /// the stream joins the sealed stream set like a first single append. Each event passes
    /// the checks of [`Ledger::append_session_event`]; an empty batch writes nothing.
    ///
    /// # Errors
    /// As [`Ledger::append_session_event`], for the first event that fails a check (nothing is
    /// written then).
    pub async fn append_session_events(
        &self,
        stream: &str,
        batch: Vec<NewEvent>,
    ) -> Result<Vec<Event>> {
        for event in &batch {
            check_raw_append(stream, event)?;
        }
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        write_tx!(self, |tx| async {
            let mut head = events::lock_stream(&mut tx, stream).await?;
            events::append_batch(&mut tx, &mut head, batch.clone()).await
        })
    }

    /// Events of a stream with `seq > after_seq`, ascending, at most `limit` (capped at 1000).
    ///
    /// # Errors
    /// `NotFound`: `event stream X not found`; `Corrupt` for an unreadable row.
    pub async fn list_events(
        &self,
        stream: &str,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        if events::read_head(&mut c, stream).await?.is_none() {
            return Err(LedgerError::not_found(format!(
                "event stream {stream} not found"
            )));
        }
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = i64::from(limit.clamp(1, 1000));
        events::read_page(&mut c, stream, after, limit)
            .await?
            .into_iter()
            .map(chain::StoredEvent::into_event)
            .collect()
    }

    /// Recomputes one stream's hash chain from its first event and checks it against the
    /// stream head. A broken chain is reported in [`VerifyReport::violation`] (naming the first
    /// bad seq), not as an error.
    ///
    /// # Errors
    /// `NotFound`: `event stream X not found`; database errors.
    pub async fn verify_stream(&self, stream: &str) -> Result<VerifyReport> {
        // The head and the events read in one snapshot (appends go on beside it).
        self.pool
            .in_snapshot(db::TempTables::None, async |c| {
                events::verify(c, stream).await
            })
            .await
    }

    /// Verifies every stream, in stream-name order.
    ///
    /// # Errors
    /// Database errors.
    pub async fn verify_all_streams(&self) -> Result<Vec<VerifyReport>> {
        self.pool
            .in_snapshot(db::TempTables::None, async |c| {
                events::verify_every_stream(c).await
            })
            .await
    }

    // -----------------------------------------------------------------------------------------
    // Audit

    /// This ledger with an audit key: from now on every append also seals its stream head
    /// (`chain_heads`, an HMAC of stream, seq and hash under the key) in the same transaction.
    /// The key must be kept outside the database. Call [`Ledger::start_audit`] before serving.
    #[must_use]
    pub fn with_audit_key(mut self, key: AuditKey) -> Self {
        self.audit_key = Some(Arc::new(key));
        self
    }

    fn require_audit_key(&self) -> Result<Arc<AuditKey>> {
        self.audit_key.clone().ok_or_else(|| {
            LedgerError::precondition(
                "no audit key is configured: the stream heads cannot be checked \
                 (set RUNTIME_AUDIT_KEY_FILE)",
            )
        })
    }

    /// The start-up check: the append-only triggers exist and every stream's head is its sealed
    /// head with a MAC that verifies (no re-fold of the projections: see
    /// [`Ledger::verify_audit`]). A log that was never sealed is sealed now, after every chain
    /// is verified, when it is empty or `key_is_new` (the key file was just created), and an
    /// `audit.key_introduced` event in the [`AUDIT_STREAM`] records the heads. Nothing is
    /// written when the check fails. Safe beside other replicas' writes: on PostgreSQL the
    /// check reads one snapshot without a lock, and a seal that is due holds every replica's
    /// appends off and checks again first, so replicas starting at once seal a log once.
    ///
    /// # Errors
    /// `FailedPrecondition` without an audit key; database errors. A failed check is
    /// [`AuditStart::Failed`], not an error.
    pub async fn start_audit(&self, key_is_new: bool) -> Result<AuditStart> {
        let key = self.require_audit_key()?;
        if self.backend() == Backend::Postgres {
            // Other replicas may be writing: the check reads one snapshot and takes no lock.
            // Only a seal that is due (a first start, an upgrade) holds their appends off,
            // and checks again under that lock before it writes (`audit::start`).
            let checked = self
                .pool
                .in_snapshot(db::TempTables::None, async |c| {
                    audit::start_check(c, Backend::Postgres, &key, key_is_new).await
                })
                .await?;
            if let audit::StartCheck::Done(done) = checked {
                return Ok(done);
            }
        }
        // Below SQLite's free-space reserve too: the check seals a few rows at most, and a
        // daemon restarted there must start to report its outage (NOT_SERVING).
        let mut tx = self
            .pool
            .begin_exempt(&self.clock, Some(key.clone()), self.outbox.clone())
            .await?;
        match audit::start(&mut tx, &key, key_is_new).await {
            Ok(AuditStart::Failed(p)) => {
                tx.rollback().await?;
                Ok(AuditStart::Failed(p))
            }
            Ok(other) => {
                tx.commit().await?;
                Ok(other)
            }
            Err(e) => tx.rollback().await.and(Err(e)),
        }
    }

    /// The recovery override for a failed [`Ledger::start_audit`]: records
    /// `audit.unverified_log_allowed` (the problem, who allowed it), restores missing
    /// append-only triggers, and re-seals every stream head with this ledger's key, so the log
    /// as it is now becomes the new sealed state. Returns the override event.
    ///
    /// # Errors
    /// `FailedPrecondition` without an audit key; database errors.
    pub async fn allow_unverified_log(&self, failed: &AuditProblem, actor: &str) -> Result<Event> {
        let key = self.require_audit_key()?;
        require_nonempty("actor", actor)?;
        write_tx!(self, |tx| audit::allow_unverified(
            &mut tx, &key, failed, actor
        ))
    }

    /// Verifies the log for an auditor: (a) every chain in `scope` recomputes (links, hashes,
    /// gap-free seq), stream by stream in pages; (b) each stream's head is its sealed head and
    /// the MAC verifies with the audit key; (c) the append-only triggers exist; (d) the
    /// projections re-folded from the events (with the code [`Ledger::rebuild_projections`]
    /// runs) equal the stored tables, compared in temporary tables inside a transaction that
    /// is rolled back. All four read one snapshot and lock nothing, so writes go on meanwhile
    /// and are no problem: (d) re-folds into temporary shadows of the projections. The report
    /// names the first problem.
    ///
    /// # Errors
    /// `FailedPrecondition` without an audit key; `NotFound` for an unknown session or agent stream;
    /// `Corrupt` when an event cannot be folded; database errors.
    pub async fn verify_audit(&self, scope: AuditScope) -> Result<AuditReport> {
        let key = self.require_audit_key()?;
        match &scope {
            AuditScope::Agent(agent) => agent.validate()?,
            AuditScope::Session(id) if id.is_empty() => {
                return Err(LedgerError::invalid("session id is required"));
            }
            _ => {}
        }
        // One snapshot: a stream created, or an event appended, while the check reads is in
        // all of its reads or in none (no false problem beside live writers), and writers go on.
        let backend = self.backend();
        self.pool
            .in_snapshot(db::TempTables::Written, async |c| {
                audit::verify(c, backend, &key, &scope).await
            })
            .await
    }

    /// Events for export, in (stream, seq) order: those after the cursor `after` (a stream and
    /// seq), optionally only `session`'s stream and only events at or after `since`; at most
    /// `limit` (1..=1000).
    ///
    /// # Errors
    /// `NotFound` for an unknown session; database errors.
    pub async fn export_events(
        &self,
        after: Option<(&str, u64)>,
        since: Option<DateTime<Utc>>,
        session: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Event>> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        if let Some(stream) = session
            && events::read_head(&mut c, stream).await?.is_none()
        {
            return Err(LedgerError::not_found(format!(
                "session {stream} not found"
            )));
        }
        let after = after.map(|(s, q)| (s, i64::try_from(q).unwrap_or(i64::MAX)));
        audit::export_page(
            &mut c,
            after,
            since,
            session,
            i64::from(limit.clamp(1, 1000)),
        )
        .await
    }

    /// Wipes every projection (agents, published agent versions, deployments, sessions and
    /// their metadata, tool calls, approvals, votes) and replays them from the agent and session
    /// streams in one transaction, verifying each chain while replaying. The result equals the
    /// live projections exactly. Session secrets (not events) are kept for live sessions.
    ///
    /// # Errors
    /// `Corrupt` when a stream's chain is broken or an event cannot be applied (nothing is
    /// changed then); database errors.
    pub async fn rebuild_projections(&self) -> Result<RebuildReport> {
        // `rebuild` defers foreign keys for its transaction: a batch of its own.
        write_tx!(self, alone, |tx| async {
            let backend = tx.backend();
            rebuild(&mut tx.conn(), backend, RebuildInto::Tables).await
        })
    }

    // -----------------------------------------------------------------------------------------
    // API tokens

    /// Stores a token (its secret's hash, never the secret) and appends `token.created` to the
    /// [`TOKENS_STREAM`] stream, by `new.created_by`, in one transaction.
    ///
    /// # Errors
    /// - `InvalidArgument`: a name that fails the actor-name rule, a hash that is not 64
    ///   lowercase hex digits, no role, an empty route;
    /// - `AlreadyExists`: a token with that name (ignoring case) exists, revoked or not, or one
    ///   with the same secret hash.
    pub async fn create_api_token(&self, new: NewApiToken) -> Result<ApiToken> {
        new.validate()?;
        // Stored at the precision both backends keep (microseconds), so the returned token
        // equals what a later read returns.
        let new = NewApiToken {
            expires_at: new.expires_at.map(|t| t.trunc_subsecs(6)),
            ..new
        };
        write_tx!(self, |tx| tokens::create(&mut tx, &new))
    }

    /// Every token, oldest first (without hashes).
    ///
    /// # Errors
    /// Database errors; `Corrupt` for a row this build cannot read.
    pub async fn list_api_tokens(&self) -> Result<Vec<ApiToken>> {
        let mut conn = self.pool.acquire().await?;
        tokens::list(&mut conn.conn()).await
    }

    /// Revokes the token named `name` (ignoring case) and appends `token.revoked` by `actor`,
    /// in one transaction. Requests presenting it fail from the next RPC on.
    ///
    /// # Errors
    /// `NotFound` naming `name` when no token has it; `FailedPrecondition` when it is already
    /// revoked (saying when and by whom).
    pub async fn revoke_api_token(&self, name: &str, actor: &str) -> Result<ApiToken> {
        require_nonempty("token name", name)?;
        require_nonempty("actor", actor)?;
        write_tx!(self, |tx| tokens::revoke(&mut tx, name, actor))
    }

    /// The distinct descriptor pins (`phrony_manifest::CompiledAgent::tool_pins`) that
    /// published and vendored agent versions which are not retired hold for `tool@version`,
    /// sorted; empty when none binds it.
    ///
    /// # Errors
    /// Database errors (a stored snapshot this build cannot read is skipped and logged).
    pub async fn descriptor_pins(&self, tool: &str, version: &str) -> Result<Vec<String>> {
        let mut conn = self.pool.acquire().await?;
        workers::descriptor_pins(&mut conn.conn(), tool, version).await
    }

    /// Records a worker registration refused because of a handler's descriptor hash: one
    /// `worker.descriptor_refused` event in the [`WORKERS_STREAM`] stream, by the runtime's
    /// `worker` actor.
    ///
    /// # Errors
    /// `InvalidArgument` without a worker id or tool; database errors.
    pub async fn record_descriptor_refusal(
        &self,
        refusal: WorkerDescriptorRefused,
    ) -> Result<Event> {
        require_nonempty("worker_id", &refusal.worker_id)?;
        require_nonempty("tool", &refusal.tool)?;
        write_tx!(self, |tx| workers::record_refusal(&mut tx, &refusal))
    }

    /// The aggregates of earlier calls a history-aware decision of `call_id` needs, one per
    /// read, in order, answered from the `history_groups`/`history_entries`/`history_buckets`
    /// index (counters for unwindowed counts and sums; for windows, at most 59 second, 59
    /// minute and 23 hour buckets and the day buckets after them plus the entries of one
    /// partial second; `max` and `last`
    /// only when asked, from the amount and time indexes; never a scan of the log). The
    /// call's own entries are left out, so a call decided again after a restart does not count
    /// itself. Each answer carries its group's version for [`Ledger::reserve_history`].
    ///
    /// # Errors
    /// `InvalidArgument` without a call id, with an empty query or scope key, or more than
    /// [`MAX_HISTORY_READS`] reads; database errors.
    pub async fn history_facts(
        &self,
        call_id: &str,
        reads: &[HistoryRead],
    ) -> Result<Vec<HistoryCounts>> {
        history::check_keys(call_id, reads.iter().map(|r| &r.key))?;
        let mut conn = self.history_conn().await?;
        history::facts(&mut conn.conn(), call_id, reads).await
    }

    /// The plan of the statement [`Ledger::history_facts`] runs for these reads, one line per
    /// plan node (PostgreSQL: `EXPLAIN ANALYZE`, with the rows each node read and removed;
    /// SQLite: `EXPLAIN QUERY PLAN`). For tests and diagnosis: the conformance suite bounds
    /// the rows a decision's lookup reads with it.
    ///
    /// # Errors
    /// As [`Ledger::history_facts`].
    #[doc(hidden)]
    pub async fn explain_history_facts(
        &self,
        call_id: &str,
        reads: &[HistoryRead],
    ) -> Result<Vec<String>> {
        history::check_keys(call_id, reads.iter().map(|r| &r.key))?;
        let mut conn = self.history_conn().await?;
        history::explain(&mut conn.conn(), self.backend(), call_id, reads).await
    }

    /// The plan of the statement that reads a session's pending approvals when it ends (one
    /// line per plan node). For tests and diagnosis: the conformance suite checks it reads
    /// them through the session, not through every pending approval.
    ///
    /// # Errors
    /// As [`Ledger::get_session`]'s database errors.
    #[doc(hidden)]
    pub async fn explain_pending_approvals_of_session(
        &self,
        session_id: &str,
    ) -> Result<Vec<String>> {
        let mut conn = self.pool.acquire().await?;
        approvals::explain_pending_of_session(&mut conn.conn(), self.backend(), session_id).await
    }

    /// A connection for history lookups: from [`Ledger::history_pool`] on PostgreSQL.
    async fn history_conn(&self) -> Result<db::PooledConn> {
        match &self.history_pool {
            Some(pool) => Ok(db::PooledConn::Postgres(
                pool.acquire().await.ctx("acquire connection")?,
            )),
            None => self.pool.acquire().await,
        }
    }

    /// Reserves a decided call's contributions to history aggregates, in one transaction:
    /// `Ok(true)` when written (or already held by this call: idempotent per call and query),
    /// `Ok(false)` when a group changed since the decision read it (nothing written; decide
    /// again with fresh facts). The reservations are committed with the call's success event and
    /// released with its failure, denial or cancellation event, in those events' transactions.
    ///
    /// # Errors
    /// `InvalidArgument` without a session or call id, with an empty key, more than
    /// [`MAX_HISTORY_READS`] reservations, or an amount that is not finite or not below 9e12;
    /// database errors.
    pub async fn reserve_history(
        &self,
        session_id: &str,
        call_id: &str,
        reservations: &[HistoryReservation],
    ) -> Result<bool> {
        require_nonempty("session_id", session_id)?;
        history::check_keys(call_id, reservations.iter().map(|r| &r.key))?;
        if reservations.is_empty() {
            return Ok(true);
        }
        write_tx!(self, |tx| history::reserve(
            &mut tx,
            session_id,
            call_id,
            reservations
        ))
    }

    /// Moves a call's reservations to the contributions of arguments an approver edited, in one
    /// transaction: `Ok(true)` when every group is still at the version the re-check read (the
    /// call's reserved entries are released and the new ones written), `Ok(false)` when one
    /// changed (nothing written; check again with fresh facts).
    ///
    /// # Errors
    /// As [`Ledger::reserve_history`].
    pub async fn replace_history(
        &self,
        session_id: &str,
        call_id: &str,
        reservations: &[HistoryReservation],
    ) -> Result<bool> {
        require_nonempty("session_id", session_id)?;
        history::check_keys(call_id, reservations.iter().map(|r| &r.key))?;
        write_tx!(self, |tx| history::replace(
            &mut tx,
            session_id,
            call_id,
            reservations
        ))
    }

    /// Prunes one bounded batch of history state no window can see any more: at most `limit`
    /// committed entries and `limit` time buckets of windowed queries whose window ended more
    /// than [`HISTORY_PRUNE_MARGIN_SECS`] ago (by the ledger's clock), counting among the
    /// entries those a windowed group wrote before migration 0016 (no buckets), once the
    /// group's first bucketed reservation is that far in the past. Reserved entries are never
    /// pruned. Unwindowed entries (all time) never are. Call again while a batch comes back
    /// full.
    ///
    /// # Errors
    /// `InvalidArgument` for a `limit` of 0; database errors.
    pub async fn prune_history(&self, limit: u32) -> Result<HistoryPruned> {
        if limit == 0 {
            return Err(LedgerError::invalid("a prune batch needs a limit above 0"));
        }
        write_tx!(self, |tx| history::prune(&mut tx, i64::from(limit)))
    }

    /// One pruning run: [`Ledger::prune_history`] batches of at most `limit` each, one write
    /// transaction each with a yield between two so other writers go in between, until a
    /// batch finds nothing to do (a short batch is not the end: the entries of pre-0016
    /// groups, the groups marked and the windows recorded have budgets of their own) or
    /// `max_batches` have run, which bounds a run when the backlog is large (the next run goes
    /// on). Returns the totals.
    ///
    /// # Errors
    /// `InvalidArgument` for a `limit` or `max_batches` of 0; database errors (what earlier
    /// batches deleted stays deleted).
    pub async fn prune_history_run(&self, limit: u32, max_batches: u32) -> Result<HistoryPruned> {
        if max_batches == 0 {
            return Err(LedgerError::invalid("a prune run needs at least one batch"));
        }
        let mut total = HistoryPruned::default();
        for n in 0..max_batches {
            if n > 0 {
                tokio::task::yield_now().await;
            }
            let batch = self.prune_history(limit).await?;
            if batch.is_empty() {
                break;
            }
            total.entries += batch.entries;
            total.buckets += batch.buckets;
            total.legacy_groups += batch.legacy_groups;
            total.legacy_windows += batch.legacy_windows;
        }
        Ok(total)
    }

    /// Records what a `mode: shadow` policy would have changed about one call: a
    /// `policy.shadow` event in the policy's stream ([`shadow_stream`]) by the runtime's `policy`
    /// actor, and its index row, in one transaction. Idempotent per call and policy ref: a call
    /// decided again (after a crash) gets `Ok(None)` and nothing is written.
    ///
    /// # Errors
    /// `InvalidArgument` without a session, call, tool or agent, or a policy that is not
    /// `namespace/name@version`; database errors.
    pub async fn record_shadow_decision(&self, shadowed: PolicyShadowed) -> Result<Option<Event>> {
        require_nonempty("session_id", &shadowed.session_id)?;
        require_nonempty("call_id", &shadowed.call_id)?;
        require_nonempty("tool", &shadowed.tool)?;
        require_nonempty("agent", &shadowed.agent)?;
        write_tx!(self, |tx| shadow::record(&mut tx, &shadowed))
    }

    /// The shadow decisions of one policy (every version), oldest first, read through the
    /// `shadow_decisions` index.
    ///
    /// # Errors
    /// `InvalidArgument` without a namespace or name, or a limit outside 1 to
    /// [`MAX_SHADOW_DECISIONS`]; database errors; `Corrupt` for an event this build cannot read.
    pub async fn shadow_decisions(
        &self,
        filter: &ShadowDecisionFilter,
    ) -> Result<Vec<ShadowDecision>> {
        require_nonempty("policy namespace", &filter.namespace)?;
        require_nonempty("policy name", &filter.name)?;
        if filter.limit == 0 || filter.limit > MAX_SHADOW_DECISIONS {
            return Err(LedgerError::invalid(format!(
                "limit must be 1 to {MAX_SHADOW_DECISIONS}, not {}",
                filter.limit
            )));
        }
        let mut conn = self.pool.acquire().await?;
        shadow::list(&mut conn.conn(), filter).await
    }

    /// The token whose secret hashes to `secret_hash`, revoked and expired ones included (the
    /// caller decides what those mean).
    ///
    /// # Errors
    /// Database errors; `Corrupt` for a row this build cannot read.
    pub async fn find_api_token_by_hash(&self, secret_hash: &str) -> Result<Option<ApiToken>> {
        let mut conn = self.pool.acquire().await?;
        tokens::find_by_hash(&mut conn.conn(), secret_hash).await
    }

    /// What the daemon's metrics read at scrape time: the sessions per status (every status
    /// with at least one session, from the `(status, updated_at)` index) and the approvals
    /// waiting for a decision.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn metric_counts(&self) -> Result<MetricCounts> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let mut sessions = Vec::new();
        for row in c
            .fetch_all(
                "count sessions by status",
                "SELECT status, COUNT(*) AS n FROM sessions GROUP BY status ORDER BY status",
                vec![],
            )
            .await?
        {
            let n = u64::try_from(row.int("n")?).unwrap_or(0);
            sessions.push((
                vocabulary::SessionStatus::parse_stored(&row.text("status")?)?,
                n,
            ));
        }
        let pending = c
            .fetch_optional(
                "count pending approvals",
                "SELECT COUNT(*) AS n FROM approvals WHERE status = 'pending'",
                vec![],
            )
            .await?
            .map(|row| row.int("n"))
            .transpose()?
            .unwrap_or(0);
        let webhook_deliveries_pending = if self.outbox.is_some() {
            webhooks::pending_count(&mut c).await?
        } else {
            0
        };
        Ok(MetricCounts {
            sessions_by_status: sessions,
            approvals_pending: u64::try_from(pending).unwrap_or(0),
            webhook_deliveries_pending,
        })
    }

    /// From now on, after each write of this handle or its clones commits, hands `listener`
    /// the events it appended to the streams the listener [wants](CommitListener::wants): see
    /// the [`CommitListener`] contract. Held weakly: dropping the last `Arc` unregisters it.
    pub fn listen_to_commits(&self, listener: &Arc<dyn CommitListener>) {
        self.listeners.add(listener);
    }

    /// Turns webhooks on: from now on, every append of an event that notifies
    /// ([`notification`]) writes one outbox row and one pending delivery per route whose kinds
    /// include it, in the event's transaction. Routes with no kinds receive nothing.
    #[must_use]
    pub fn with_webhooks(mut self, routes: Vec<WebhookRoute>) -> Self {
        self.outbox = Some(Arc::new(outbox::Outbox {
            routes,
            wake: Arc::new(tokio::sync::Notify::new()),
        }));
        self
    }

    /// Notified after a commit that made deliveries due (an outbox row, a re-queued delivery),
    /// by this ledger handle and its clones; `None` when webhooks are off. The sender waits on it
    /// (and on a timer, for other processes' commits).
    #[must_use]
    pub fn webhook_wake(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.outbox.as_ref().map(|o| o.wake.clone())
    }

    /// Claims up to `limit` (1..=[`MAX_CLAIM`]) due pending deliveries of `webhook` for one
    /// attempt each, leased until now + `lease`: until then no other claimer (another replica on
    /// PostgreSQL, which claims with `FOR UPDATE SKIP LOCKED`) takes them. Soonest due first.
    ///
    /// # Errors
    /// Database errors; `Corrupt` for a row this build cannot read.
    pub async fn claim_webhook_deliveries(
        &self,
        webhook: &str,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<ClaimedDelivery>> {
        write_tx!(self, |tx| webhooks::claim(&mut tx, webhook, lease, limit))
    }

    /// Records how a claimed attempt ended. `Ok(false)` when the claim is no longer held (its
    /// lease ran out and it was claimed again): nothing changed.
    ///
    /// # Errors
    /// Database errors.
    pub async fn finish_webhook_delivery(
        &self,
        claim: &ClaimedDelivery,
        outcome: AttemptOutcome,
    ) -> Result<bool> {
        write_tx!(self, |tx| webhooks::finish(&mut tx, claim, &outcome))
    }

    /// An operator re-queues a failed delivery: attempts start again from 0, due now, under the
    /// same delivery id; `webhook.retry_requested` by `actor` is appended to the `webhooks`
    /// stream in the same transaction.
    ///
    /// # Errors
    /// `NotFound`: `webhook delivery X not found`; `FailedPrecondition` when it is not failed;
    /// `InvalidArgument` for an empty actor.
    pub async fn retry_webhook_delivery(
        &self,
        id: Uuid,
        actor: impl Into<phrony_auth::Attribution>,
    ) -> Result<(WebhookDelivery, Event)> {
        let actor = actor.into();
        require_nonempty("actor", &actor.actor)?;
        let configured = self.configured_webhooks();
        write_tx!(self, |tx| webhooks::retry(&mut tx, id, &actor, &configured))
    }

    /// The names of the configured webhooks (none when webhooks are off).
    fn configured_webhooks(&self) -> Vec<String> {
        self.outbox
            .as_ref()
            .map(|o| o.routes.iter().map(|r| r.name.clone()).collect())
            .unwrap_or_default()
    }

    /// At start-up: fails every pending delivery of a webhook that is not configured any more
    /// (the configured ones are this handle's routes, see [`Ledger::with_webhooks`]; none when
    /// webhooks are off), each with the reason [`unconfigured_reason`] as its last error, and
    /// appends one `webhook.unconfigured` event per such webhook to the `webhooks` stream by
    /// [`WEBHOOKS_ACTOR`], in one transaction. Returns what was failed, by webhook name.
    ///
    /// # Errors
    /// Database errors.
    pub async fn fail_unconfigured_webhook_deliveries(&self) -> Result<Vec<UnconfiguredWebhook>> {
        let configured = self.configured_webhooks();
        write_tx!(self, |tx| webhooks::fail_unconfigured(&mut tx, &configured))
    }

    /// One delivery.
    ///
    /// # Errors
    /// `NotFound`: `webhook delivery X not found`.
    pub async fn webhook_delivery(&self, id: Uuid) -> Result<WebhookDelivery> {
        let mut conn = self.pool.acquire().await?;
        webhooks::get(&mut conn.conn(), id).await
    }

    /// Deliveries matching `filter`, newest event first.
    ///
    /// # Errors
    /// Database errors; `Corrupt` for a row this build cannot read.
    pub async fn webhook_deliveries(
        &self,
        filter: &DeliveryFilter,
    ) -> Result<Vec<WebhookDelivery>> {
        let mut conn = self.pool.acquire().await?;
        webhooks::list(&mut conn.conn(), filter).await
    }

    /// Removes deliveries delivered before `before` (the daemon passes now −
    /// [`WEBHOOK_RETENTION`]) and the outbox rows left without a delivery; returns the
    /// deliveries removed. Pending and failed deliveries stay.
    ///
    /// # Errors
    /// Database errors.
    pub async fn prune_webhook_deliveries(&self, before: DateTime<Utc>) -> Result<u64> {
        write_tx!(self, |tx| webhooks::prune(&mut tx, before))
    }
}

/// Result of [`Ledger::metric_counts`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricCounts {
    /// (session status, sessions), for every status that has sessions.
    pub sessions_by_status: Vec<(vocabulary::SessionStatus, u64)>,
    /// Approvals whose status is `pending`.
    pub approvals_pending: u64,
    /// Webhook deliveries whose status is `pending` (0 when webhooks are off).
    pub webhook_deliveries_pending: u64,
}

/// Where [`rebuild`] writes the projections it folds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RebuildInto {
    /// The projection tables themselves (on PostgreSQL locked `EXCLUSIVE` first).
    Tables,
    /// Temporary tables of the same names the caller created, which both databases resolve
    /// before the real ones (PostgreSQL's `pg_temp` and SQLite's `temp` schema are searched
    /// first), in a snapshot that cannot write a real table (a PostgreSQL transaction made
    /// read-only, a SQLite read-only connection): nothing is locked, and a write that would
    /// reach a real table fails.
    TempShadows,
}

pub(crate) async fn rebuild(
    c: &mut db::Conn<'_>,
    backend: B,
    into: RebuildInto,
) -> Result<RebuildReport> {
    match backend {
        B::Sqlite => {
            c.execute(
                "defer foreign keys",
                "PRAGMA defer_foreign_keys = ON",
                vec![],
            )
            .await?;
        }
        B::Postgres if into == RebuildInto::TempShadows => {}
        B::Postgres => {
            c.execute(
                "lock projections",
                "LOCK TABLE agents, agent_versions, deployments, bundles, bundle_versions, \
                 bundle_members, bundle_deployments, sessions, session_metadata, \
                 tool_invocations, approvals, approval_votes, session_secrets \
                 IN EXCLUSIVE MODE",
                vec![],
            )
            .await?;
            c.execute("defer foreign keys", "SET CONSTRAINTS ALL DEFERRED", vec![])
                .await?;
        }
    }
    for (context, sql) in [
        ("wipe approval votes", "DELETE FROM approval_votes"),
        ("wipe approvals", "DELETE FROM approvals"),
        ("wipe tool calls", "DELETE FROM tool_invocations"),
        ("wipe session metadata", "DELETE FROM session_metadata"),
        ("wipe sessions", "DELETE FROM sessions"),
        ("wipe deployments", "DELETE FROM deployments"),
        ("wipe bundle deployments", "DELETE FROM bundle_deployments"),
        ("wipe bundle members", "DELETE FROM bundle_members"),
        // Published and vendored (bundle member) versions alike: both are replayed.
        ("wipe agent versions", "DELETE FROM agent_versions"),
        ("wipe bundle versions", "DELETE FROM bundle_versions"),
        ("wipe bundles", "DELETE FROM bundles"),
        ("wipe agents", "DELETE FROM agents"),
    ] {
        c.execute(context, sql, vec![]).await?;
    }
    // Agent streams first, then bundle streams, then session streams (streams whose first
    // event is `session.started`); other streams (audit logs) own no projections.
    let sql = format!(
        "SELECT stream, last_seq, last_hash FROM streams \
         WHERE stream LIKE 'agent:%' OR stream LIKE 'bundle:%' OR {} \
         ORDER BY CASE WHEN stream LIKE 'agent:%' THEN 0 \
         WHEN stream LIKE 'bundle:%' THEN 1 ELSE 2 END, stream",
        session_log::SESSION_STREAMS_SQL
    );
    let streams = c.fetch_all("list projection streams", &sql, vec![]).await?;
    let mut report = RebuildReport {
        streams: 0,
        events: 0,
    };
    for row in streams {
        let stream = row.text("stream")?;
        let lifecycle_stream = stream.starts_with("agent:");
        let bundle_stream = stream.starts_with("bundle:");
        let mut verifier = chain::ChainVerifier::new(&stream);
        let mut after = 0;
        loop {
            let page = events::read_page(c, &stream, after, events::PAGE).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            let full = i64::try_from(page.len()).unwrap_or(i64::MAX) == events::PAGE;
            for stored in page {
                verifier
                    .check(&stored)
                    .map_err(|v| LedgerError::corrupt(v.message))?;
                let event = stored.into_event()?;
                if lifecycle_stream {
                    lifecycle::apply(c, &event).await?;
                } else if bundle_stream {
                    bundles::apply(c, &event).await?;
                } else {
                    session_log::apply(c, &event).await?;
                }
                report.events += 1;
            }
            if !full {
                break;
            }
        }
        verifier
            .finish(row.int("last_seq")?, &row.text("last_hash")?)
            .map_err(|v| LedgerError::corrupt(v.message))?;
        report.streams += 1;
    }
    // Secrets are not events: those of sessions that no longer exist or have ended go.
    c.execute(
        "purge orphan secrets",
        "DELETE FROM session_secrets WHERE session_id NOT IN \
         (SELECT id FROM sessions WHERE status NOT IN ('completed', 'failed', 'cancelled'))",
        vec![],
    )
    .await?;
    Ok(report)
}

fn migration_error(source: sqlx::migrate::MigrateError) -> LedgerError {
    use sqlx::migrate::MigrateError as M;
    let message = match &source {
        M::VersionMissing(v) => format!(
            "the database has schema migration {v}, which this build does not know: it was \
             migrated by a newer phrony-runtime; upgrade this binary"
        ),
        M::VersionMismatch(v) => format!(
            "schema migration {v} differs from the one applied to this database; \
             the binary and the database come from incompatible builds"
        ),
        other => format!("database migration failed: {other}"),
    };
    LedgerError::Migration { message, source }
}

fn require_nonempty(what: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(LedgerError::invalid(format!("{what} is required")));
    }
    Ok(())
}

fn require_version(version: &str) -> Result<()> {
    if version.is_empty() {
        return Err(LedgerError::invalid(
            "agent_ref requires namespace, name, and version",
        ));
    }
    Ok(())
}

/// Removes the password from a URL for messages and logs.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    /// A migrated ledger on a SQLite file in `dir`.
    async fn sqlite_ledger(dir: &tempfile::TempDir) -> super::Ledger {
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let ledger = super::Ledger::connect(&url).await.unwrap();
        ledger.migrate().await.unwrap();
        assert_eq!(ledger.backend(), super::Backend::Sqlite);
        ledger
    }

    /// A batch's statement journal (every write runs in a savepoint) is kept in memory: with
    /// SQLite's default it was a new file in the system's temp directory per batch, holding
    /// copies of ledger pages outside the database's directory and costing an open, an unlink
    /// and a write per page on every commit.
    #[tokio::test]
    async fn the_writers_statement_journals_stay_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = sqlite_ledger(&dir).await;
        let super::Pool::Sqlite(_, writer, _) = &ledger.pool else {
            unreachable!("sqlite_ledger opens SQLite");
        };
        let lease = writer.begin(false).await.unwrap();
        let outcome = lease
            .slot()
            .run("test", "PRAGMA temp_store", &[], None)
            .unwrap();
        // 2 = MEMORY (0 = the build's default, a file here; 1 = FILE).
        assert_eq!(
            outcome.rows[0].get("temp_store"),
            Ok(&crate::sqlite_raw::RawValue::Integer(2))
        );
        lease.roll_back().await.unwrap();
    }

    /// On SQLite a write inserts its events and advances each stream head it appended to once,
    /// when it commits: a lock of the stream later in the write chains on the write's own
    /// appends, the `streams` row is written once (a model step's three appends, one head
    /// write), and a write rolled back leaves neither its events nor a head.
    #[tokio::test]
    async fn a_write_inserts_its_events_and_advances_each_head_once_when_it_commits() {
        use crate::events::{append, append_batch, lock_stream};
        let dir = tempfile::tempdir().unwrap();
        let ledger = sqlite_ledger(&dir).await;
        let super::Pool::Sqlite(_, writer, _) = &ledger.pool else {
            unreachable!("sqlite_ledger opens SQLite");
        };
        let lease = writer.begin(false).await.unwrap();
        for ddl in [
            "CREATE TABLE head_writes (stream TEXT NOT NULL, seq INTEGER NOT NULL)",
            "CREATE TRIGGER record_head_writes AFTER UPDATE OF last_seq ON streams \
             BEGIN INSERT INTO head_writes (stream, seq) VALUES (new.stream, new.last_seq); END",
        ] {
            lease.slot().run("test", ddl, &[], None).unwrap();
        }
        lease.release().await.unwrap();
        let note = |text: &str| {
            crate::NewEvent::new(
                "message.user",
                "user",
                serde_json::json!({"role": "user", "content": text}),
            )
        };
        let head_writes = async || {
            let mut conn = ledger.pool.acquire().await.unwrap();
            conn.conn()
                .fetch_all(
                    "test",
                    "SELECT stream, seq FROM head_writes ORDER BY rowid",
                    vec![],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.text("stream").unwrap(), r.int("seq").unwrap()))
                .collect::<Vec<_>>()
        };
        let begin = async || {
            ledger
                .pool
                .begin_write(&ledger.clock, None, None, None)
                .await
                .unwrap()
        };

        let mut tx = begin().await;
        let mut head = lock_stream(&mut tx, "s").await.unwrap();
        append(&mut tx, &mut head, note("one")).await.unwrap();
        let mut again = lock_stream(&mut tx, "s").await.unwrap();
        assert_eq!(
            (again.last_seq, &again.last_hash),
            (head.last_seq, &head.last_hash),
            "a lock later in the write chains on its own append"
        );
        append_batch(&mut tx, &mut again, vec![note("two"), note("three")])
            .await
            .unwrap();
        let mut other = lock_stream(&mut tx, "t").await.unwrap();
        append(&mut tx, &mut other, note("elsewhere"))
            .await
            .unwrap();
        let unwritten = tx
            .conn()
            .fetch_all(
                "test",
                "SELECT (SELECT COUNT(*) FROM events) AS n, \
                 (SELECT SUM(last_seq) FROM streams) AS heads",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(
            (
                unwritten[0].int("n").unwrap(),
                unwritten[0].int("heads").unwrap()
            ),
            (0, 0),
            "the write's events and heads are written when it commits, all at once"
        );
        tx.commit().await.unwrap();
        assert_eq!(
            head_writes().await,
            [("s".to_owned(), 3), ("t".to_owned(), 1)],
            "one head write per stream and write, at its last append"
        );

        let mut tx = begin().await;
        let mut head = lock_stream(&mut tx, "s").await.unwrap();
        assert_eq!(head.last_seq, 3);
        append(&mut tx, &mut head, note("rolled back"))
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(
            head_writes().await.len(),
            2,
            "a rolled-back write wrote no head"
        );
        let report = ledger.verify_stream("s").await.unwrap();
        assert_eq!((report.head_seq, report.events_checked), (3, 3));
        assert!(report.violation.is_none(), "{report:?}");
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://./phrony.db"), "sqlite://./phrony.db");
    }
}
