//! Errors: protocol errors of a Work stream ([`DispatchError`]) and failures of one tool
//! dispatch ([`DispatchFailure`]).

use std::fmt;
use std::time::Duration;

use crate::allowlist::IntegrityViolation;
use crate::types::WorkerProvenance;

/// The gRPC status class a [`DispatchError`] maps to. The gRPC layer turns it into a
/// `tonic::Code` without parsing messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// `InvalidArgument`.
    InvalidArgument,
    /// `FailedPrecondition`.
    FailedPrecondition,
    /// `NotFound`.
    NotFound,
    /// `Aborted`: the stream was taken over or dropped; the worker should reconnect.
    Aborted,
    /// `ResourceExhausted`.
    ResourceExhausted,
    /// `PermissionDenied`: the worker's credential does not allow the registration.
    PermissionDenied,
    /// `Unavailable`: the runtime could not check the registration now; the worker retries.
    Unavailable,
}

/// A Work-stream protocol error: the stream ends with this status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// The register message has an empty `worker_id`.
    #[error("worker_id is required")]
    WorkerIdRequired,
    /// A registration field is past its bound or holds control characters (worker ids, tool
    /// names and versions land in audit events and logs): `field` names it, `problem` says
    /// what is wrong.
    #[error("{field} {problem}")]
    RegistrationFieldInvalid {
        /// `worker_id`, `handlers[i].tool`, `handlers`, … as in the register message.
        field: String,
        /// What is wrong, with the bound.
        problem: String,
    },
    /// The daemon is stopping and accepts no registrations.
    #[error("tool worker registry is shutting down")]
    ShuttingDown,
    /// A handler advertisement has an empty `tool`.
    #[error("handlers[{index}].tool is required")]
    HandlerToolRequired {
        /// Position in `handlers`.
        index: usize,
    },
    /// A handler advertisement has an empty `version`; it could never be routed to.
    #[error(
        "handlers[{index}].version is required for tool \"{tool}\" (advertise \"default\" to serve bindings without a version)"
    )]
    HandlerVersionRequired {
        /// Position in `handlers`.
        index: usize,
        /// The advertised tool.
        tool: String,
    },
    /// Two advertisements share a `tool@version`.
    #[error("handlers[{second}] advertises {key} again (first at handlers[{first}])")]
    DuplicateHandler {
        /// The duplicated key.
        key: String,
        /// The first advertisement.
        first: usize,
        /// The duplicate.
        second: usize,
    },
    /// An `in_flight` entry has an empty call id.
    #[error("in_flight[{index}].call_id is required")]
    InFlightCallIdRequired {
        /// Position in `in_flight`.
        index: usize,
    },
    /// A message other than register came first (`message` names it: heartbeat, result, nack).
    #[error("register before {message}")]
    RegisterFirst {
        /// The message that came too early.
        message: &'static str,
    },
    /// A second register on a registered stream.
    #[error("worker \"{worker_id}\" is already registered on this stream")]
    AlreadyRegistered {
        /// The registered worker.
        worker_id: String,
    },
    /// A message body is missing (`register`, `result`, `nack`).
    #[error("{message} message is required")]
    MessageRequired {
        /// The message kind.
        message: &'static str,
    },
    /// The oneof carries no known message.
    #[error("unknown work client message")]
    UnknownMessage,
    /// A result or nack with an empty call id.
    #[error("{message}.call_id is required")]
    CallIdRequired {
        /// `result` or `nack`.
        message: &'static str,
    },
    /// The same worker id registered on another stream, which replaced this one.
    #[error("worker \"{worker_id}\" registered again on another stream")]
    Superseded {
        /// The worker.
        worker_id: String,
    },
    /// The worker sent no heartbeat within its lease and was dropped.
    #[error("lease of worker \"{worker_id}\" expired: no heartbeat within {lease_ttl_ms}ms")]
    LeaseExpired {
        /// The worker.
        worker_id: String,
        /// The lease.
        lease_ttl_ms: u64,
    },
    /// The worker stopped reading its stream and its outbox filled up.
    #[error("worker \"{worker_id}\" stopped reading its stream ({capacity} messages pending)")]
    OutboxOverflow {
        /// The worker.
        worker_id: String,
        /// The outbox capacity.
        capacity: usize,
    },
    /// A verified worker credential advertised a handler its tool patterns do not allow.
    #[error(
        "worker \"{worker_id}\" may not serve {tool}: credential {credential} does not allow it \
         (its tool patterns: {patterns})"
    )]
    ToolNotPermitted {
        /// The worker.
        worker_id: String,
        /// The handler's `tool@version`.
        tool: String,
        /// The credential, e.g. `"refund-bot" (token)`.
        credential: String,
        /// The credential's tool patterns, comma-separated (`none` when it has none).
        patterns: String,
    },
    /// The worker id is bound to another credential, which registered it first.
    #[error(
        "worker id \"{worker_id}\" is bound to credential {owner}, which registered it first; \
         credential {credential} may not take it over (use another worker id)"
    )]
    WorkerIdBound {
        /// The worker.
        worker_id: String,
        /// The credential that registered the id first.
        owner: String,
        /// The credential that tried to reuse it.
        credential: String,
    },
    /// A handler's `descriptor_hash` matches no pin that published agent versions hold for
    /// its `tool@version`, or it is empty while pins are required. The registration is refused
    /// (the Work protocol cannot refuse one handler and keep the others) and audited.
    #[error(
        "worker \"{worker_id}\" may not serve {key}: {}; expected {}{}",
        if .received.is_empty() {
            "it advertises no descriptor_hash and this runtime requires one \
             (RUNTIME_REQUIRE_DESCRIPTOR_PINS)".to_owned()
        } else {
            format!("its descriptor_hash {:?} matches no pin of a published agent version", .received)
        },
        if .expected.is_empty() { "a descriptor_hash (no published agent version pins it yet)".to_owned() }
        else { format!("one of: {}", .expected.join(", ")) },
        "; `phrony tools pin TOOL.yaml` prints a Tool document's pin, `phrony agents inspect` an \
         agent version's"
    )]
    DescriptorRefused {
        /// The worker.
        worker_id: String,
        /// The handler's `tool@version`.
        key: String,
        /// The advertised `descriptor_hash` (empty when none).
        received: String,
        /// The pins published, non-retired agent versions hold for the key.
        expected: Vec<String>,
    },
    /// The pins of a registration's handlers could not be read (the database is unavailable);
    /// nothing was registered.
    #[error("cannot check the descriptor pins of worker \"{worker_id}\" now: {message}")]
    DescriptorCheckFailed {
        /// The worker.
        worker_id: String,
        /// The lookup's error.
        message: String,
    },
    /// The connection is no longer registered (its stream ended).
    #[error("unknown worker \"{worker_id}\"")]
    UnknownWorker {
        /// The worker.
        worker_id: String,
    },
}

impl DispatchError {
    /// The gRPC status class for this error.
    #[must_use]
    pub fn status(&self) -> StatusClass {
        match self {
            Self::WorkerIdRequired
            | Self::RegistrationFieldInvalid { .. }
            | Self::ShuttingDown
            | Self::HandlerToolRequired { .. }
            | Self::HandlerVersionRequired { .. }
            | Self::DuplicateHandler { .. }
            | Self::InFlightCallIdRequired { .. }
            | Self::MessageRequired { .. }
            | Self::UnknownMessage
            | Self::CallIdRequired { .. } => StatusClass::InvalidArgument,
            Self::RegisterFirst { .. }
            | Self::AlreadyRegistered { .. }
            | Self::DescriptorRefused { .. } => StatusClass::FailedPrecondition,
            Self::DescriptorCheckFailed { .. } => StatusClass::Unavailable,
            Self::UnknownWorker { .. } => StatusClass::NotFound,
            Self::Superseded { .. } | Self::LeaseExpired { .. } => StatusClass::Aborted,
            Self::OutboxOverflow { .. } => StatusClass::ResourceExhausted,
            Self::ToolNotPermitted { .. } | Self::WorkerIdBound { .. } => {
                StatusClass::PermissionDenied
            }
        }
    }
}

/// Why a worker was dropped while it held calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerLost {
    /// Its Work stream ended.
    StreamEnded,
    /// Its lease expired without a heartbeat.
    LeaseExpired,
    /// It registered again without listing the call in `in_flight`.
    Replaced,
    /// It stopped reading its stream.
    Unresponsive,
}

impl WorkerLost {
    /// A stable snake_case name for events and logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StreamEnded => "stream_ended",
            Self::LeaseExpired => "lease_expired",
            Self::Replaced => "replaced",
            Self::Unresponsive => "unresponsive",
        }
    }
}

impl fmt::Display for WorkerLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::StreamEnded => "its Work stream ended",
            Self::LeaseExpired => "its lease expired without a heartbeat",
            Self::Replaced => "it registered again without listing the call as in flight",
            Self::Unresponsive => "it stopped reading its Work stream",
        })
    }
}

/// Why one tool dispatch did not produce a worker outcome.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DispatchFailure {
    /// No live worker advertises the key (after waiting `queue_wait`).
    #[error("no handler registered for tool {key}")]
    NoHandler {
        /// `tool@version`.
        key: String,
    },
    /// Workers advertise the key but none had a free slot within `queue_wait`, or the queue
    /// was full.
    #[error("tool handler capacity exhausted for {key}{}", if *.queue_full { " (dispatch queue full)" } else { "" })]
    CapacityExhausted {
        /// `tool@version`.
        key: String,
        /// The per-key queue was full, so the call did not wait at all.
        queue_full: bool,
    },
    /// The worker did not answer within the execution timeout; a cancel was sent. The worker
    /// may have acted, so route this like an indeterminate outcome.
    #[error("tool {key} did not finish within {timeout:?} on worker \"{}\"; a cancel was sent", .worker.worker_id)]
    ExecutionTimeout {
        /// `tool@version`.
        key: String,
        /// The worker that was running the call.
        worker: Box<WorkerProvenance>,
        /// The execution timeout that passed.
        timeout: Duration,
    },
    /// The worker running the call was lost; the call may or may not have taken effect.
    #[error("outcome of tool {key} is unknown: worker \"{}\" was lost because {reason}", .worker.worker_id)]
    Indeterminate {
        /// `tool@version`.
        key: String,
        /// The worker that was running the call.
        worker: Box<WorkerProvenance>,
        /// Why it was lost.
        reason: WorkerLost,
    },
    /// The caller's cancellation token fired. When `worker` is set the invoke had been sent
    /// and a cancel followed it.
    #[error("tool call {key} was cancelled")]
    Cancelled {
        /// `tool@version`.
        key: String,
        /// The worker that had been invoked, if any.
        worker: Option<Box<WorkerProvenance>>,
    },
    /// The integrity allowlist refused every worker advertising the key.
    #[error("tool dispatch integrity violation ({}) for {key}: {}", .violation.kind, .violation.detail)]
    IntegrityViolation {
        /// `tool@version`.
        key: String,
        /// What was violated.
        violation: IntegrityViolation,
    },
    /// Workers advertise the key, but none with the descriptor pin of the calling agent
    /// version (after waiting `queue_wait`): it was published with another descriptor.
    #[error(
        "no worker serving {key} advertises the descriptor this agent version was published \
         with (pin {pin}; a worker advertises {advertised})"
    )]
    DescriptorMismatch {
        /// `tool@version`.
        key: String,
        /// The calling agent version's pin.
        pin: String,
        /// A `descriptor_hash` a worker advertises instead.
        advertised: String,
    },
    /// The caller's journal refused to record the dispatch; nothing was sent.
    #[error("could not record the dispatch of {key}: {message}")]
    JournalFailed {
        /// `tool@version`.
        key: String,
        /// The journal's error.
        message: String,
    },
    /// The registry is shutting down.
    #[error("tool worker registry is shutting down")]
    ShuttingDown,
    /// The call id is already queued or running.
    #[error("call \"{call_id}\" is already being dispatched")]
    AlreadyInFlight {
        /// The duplicate call id.
        call_id: String,
    },
}

impl DispatchFailure {
    /// The ledger `error_code` for this failure (integrity violations use their kind).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoHandler { .. } => "no_handler",
            Self::CapacityExhausted { .. } => "capacity_exhausted",
            Self::ExecutionTimeout { .. } => "execution_timeout",
            Self::Indeterminate { .. } => "indeterminate",
            Self::Cancelled { .. } => "cancelled",
            Self::IntegrityViolation { violation, .. } => violation.kind.as_str(),
            Self::DescriptorMismatch { .. } => "descriptor_mismatch",
            Self::JournalFailed { .. } | Self::ShuttingDown | Self::AlreadyInFlight { .. } => {
                "dispatch_error"
            }
        }
    }

    /// Whether the worker may have acted on the call: the outcome must be handled by the
    /// binding's side-effect class (tool error, or a human approval for writes).
    #[must_use]
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::ExecutionTimeout { .. } | Self::Indeterminate { .. } => true,
            Self::Cancelled { worker, .. } => worker.is_some(),
            _ => false,
        }
    }

    /// The worker that had been invoked, when there was one.
    #[must_use]
    pub fn worker(&self) -> Option<&WorkerProvenance> {
        match self {
            Self::ExecutionTimeout { worker, .. } | Self::Indeterminate { worker, .. } => {
                Some(worker)
            }
            Self::Cancelled { worker, .. } => worker.as_deref(),
            _ => None,
        }
    }
}

/// An invalid [`crate::RouterConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The lease is too short for SDK workers, which heartbeat every `max(ttl/2, 1s)`.
    #[error("lease_ttl must be at least 2s (workers heartbeat every max(ttl/2, 1s)); got {0:?}")]
    LeaseTooShort(Duration),
    /// The per-key queue must hold at least one call.
    #[error("queue_capacity must be at least 1")]
    ZeroQueueCapacity,
    /// The per-worker outbox must hold the registration plus some traffic.
    #[error("outbox_capacity must be at least 16; got {0}")]
    OutboxTooSmall(usize),
}
