//! [`EngineConfig`]: the engine's tunables.

use std::time::Duration;

/// Settings of an [`crate::Engine`]. `Default` gives the production values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// How long a tool call may wait for a free worker slot (`RUNTIME_DISPATCH_QUEUE_WAIT`,
    /// default 10 s). It bounds only the wait, never the execution.
    pub queue_wait: Duration,
    /// How long a worker may run a call once invoked, when the tool binding sets no timeout
    /// (default 300 s). When it passes the worker gets a cancel and the outcome is handled as
    /// indeterminate by side-effect class.
    pub exec_timeout: Duration,
    /// Updates buffered per subscriber (default 256). A subscriber that falls behind is fed
    /// from the store again: it never loses events.
    pub subscription_buffer: usize,
    /// How often subscriptions, approval waits and the approval timer re-read the store when
    /// nothing told them to (a safety net for changes made by another process; default 2 s).
    pub poll_interval: Duration,
    /// After a restart, how long a call that was sent to a worker waits for the worker to
    /// reconnect and report before it is handled as indeterminate (`RUNTIME_RECOVERY_GRACE`,
    /// default 30 s, the worker lease).
    pub recovery_grace: Duration,
    /// The largest tool-call arguments (compact JSON bytes) the engine dispatches
    /// (`RUNTIME_MAX_TOOL_ARGS_BYTES`, default [`DEFAULT_MAX_TOOL_ARGS_BYTES`]). A larger call is
    /// not recorded with its arguments nor sent: the model gets a tool error.
    pub max_tool_args_bytes: usize,
    /// The most tool calls one model response may request (`RUNTIME_MAX_TOOL_CALLS_PER_TURN`,
    /// default [`DEFAULT_MAX_TOOL_CALLS_PER_TURN`]). The calls beyond it are not run: each gets
    /// a tool error, so the model still receives one result per call it made.
    pub max_tool_calls_per_turn: usize,
    /// The most user messages that may wait in one conversation, recorded but their turn not
    /// started yet (`RUNTIME_MAX_QUEUED_USER_MESSAGES`, default
    /// [`DEFAULT_MAX_QUEUED_USER_MESSAGES`]). One more is refused (`ResourceExhausted`) and
    /// not recorded.
    pub max_queued_user_messages: usize,
    /// The most live sessions (created, not yet ended) one agent may have, over all its
    /// versions (`RUNTIME_MAX_SESSIONS_PER_AGENT`, default [`DEFAULT_MAX_SESSIONS_PER_AGENT`];
    /// `None`: unlimited). A start past it is refused (`ResourceExhausted`) and creates
    /// nothing.
    pub max_sessions_per_agent: Option<u64>,
    /// The most approval watchers ([`crate::Engine::watch_approvals`]) open at once (default
    /// [`DEFAULT_MAX_APPROVAL_WATCHERS`]). One more is refused (`ResourceExhausted`).
    pub max_approval_watchers: usize,
    /// How often an approval watcher re-reads the pending set when no approval changed in this
    /// process (a safety net for changes another runtime process made on the same database;
    /// default 2 s).
    pub approval_watch_interval: Duration,
    /// Whether a task-mode session whose every open call waits for a human is *parked*: its
    /// driver and everything it holds in memory are dropped, and it is resumed from the event
    /// log (the recovery path) when one of its approvals is decided, expires or is cancelled
    /// (`RUNTIME_PARK_APPROVAL_WAITS`, default `true`). Sessions with a
    /// `max_hitl_wait_minutes` budget, and conversations, keep their driver while they wait.
    pub park_approval_waits: bool,
    /// Session leases (several runtime replicas on one database, issue #20): with a TTL, a
    /// driver acquires its session's lease before it drives (and stops at once when another
    /// replica holds it), the engine renews every lease it holds in one statement every TTL/3,
    /// stops the drivers of leases it lost, releases a lease when its driver parks or ends,
    /// and takes over (through the recovery path) the sessions whose lease expired, every
    /// TTL/2, jittered. `None` (the default): no leases, one process per database.
    pub session_lease_ttl: Option<Duration>,
}

/// 256 concurrent approval watchers: each re-reads the pending set when an approval changes,
/// so the bound caps the reads one change causes.
pub const DEFAULT_MAX_APPROVAL_WATCHERS: usize = 256;

/// 1 MiB: a quarter of the 4 MiB gRPC message limit of the published SDK worker (grpcio's
/// default), so an invoke always reaches the worker, and far above what a tool needs.
pub const DEFAULT_MAX_TOOL_ARGS_BYTES: usize = 1 << 20;

/// 64: far more parallel calls than models make in practice, and a quarter of the router's
/// default per-tool queue (256), so one response cannot fill a tool's queue by itself.
pub const DEFAULT_MAX_TOOL_CALLS_PER_TURN: usize = 64;

/// 32: a person typing ahead of a slow turn, or a client sending a few messages at once, stays
/// far below it; each waiting message is a whole model turn still to run (up to the 4 MiB
/// message bound each), so a client that sends faster than the agent answers is told so
/// instead of building an ever longer backlog.
pub const DEFAULT_MAX_QUEUED_USER_MESSAGES: usize = 32;

/// 10,000: far above what one agent runs at once in practice, and a tenth of the 100,000 parked
/// sessions the runtime is sized for, so one agent (or a runaway client starting sessions in a
/// loop) cannot take the whole runtime's capacity.
pub const DEFAULT_MAX_SESSIONS_PER_AGENT: u64 = 10_000;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            queue_wait: Duration::from_secs(10),
            exec_timeout: Duration::from_secs(300),
            subscription_buffer: 256,
            poll_interval: Duration::from_secs(2),
            recovery_grace: Duration::from_secs(30),
            max_tool_args_bytes: DEFAULT_MAX_TOOL_ARGS_BYTES,
            max_tool_calls_per_turn: DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            max_queued_user_messages: DEFAULT_MAX_QUEUED_USER_MESSAGES,
            max_sessions_per_agent: Some(DEFAULT_MAX_SESSIONS_PER_AGENT),
            max_approval_watchers: DEFAULT_MAX_APPROVAL_WATCHERS,
            approval_watch_interval: Duration::from_secs(2),
            park_approval_waits: true,
            session_lease_ttl: None,
        }
    }
}
