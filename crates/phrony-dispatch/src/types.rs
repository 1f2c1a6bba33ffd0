//! Domain mirrors of the Work-stream messages (`WorkClientMsg` / `WorkServerMsg`).
//!
//! The gRPC layer converts protobuf messages to and from these types; nothing in this crate
//! sees protobuf.

use std::collections::BTreeMap;
use std::fmt;

/// The version a binding without a version dispatches to (and a worker must advertise).
pub const DEFAULT_VERSION: &str = "default";

/// The registry key of a handler: `tool@version`, with an empty version read as
/// [`DEFAULT_VERSION`].
#[must_use]
pub fn handler_key(tool: &str, version: &str) -> String {
    let version = if version.is_empty() {
        DEFAULT_VERSION
    } else {
        version
    };
    format!("{tool}@{version}")
}

/// `WorkRegister`: the first message of a Work stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerHello {
    /// Stable worker id (required). Registering an id again replaces the older connection.
    pub worker_id: String,
    /// Self-asserted workload identity, checked by the integrity allowlist.
    pub workload_identity: String,
    /// Self-asserted image digest, checked by the integrity allowlist.
    pub image_digest: String,
    /// The handlers this worker serves, one per `tool@version`.
    pub handlers: Vec<HandlerAd>,
    /// Call ids the worker is still running or holds an unacknowledged result for.
    pub in_flight: Vec<String>,
}

/// `WorkHandlerAdvertisement`: one handler a worker serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandlerAd {
    /// The tool's dispatch ref, e.g. `payments.issue-refund`.
    pub tool: String,
    /// The exact version string bindings dispatch to (`default` for bindings without one).
    pub version: String,
    /// The contract version the handler implements (checked by the allowlist when required).
    pub contract_version: String,
    /// Concurrent invocations the worker accepts for this handler; 0 means 1.
    pub max_concurrency: u32,
    /// Hash of the tool descriptor the worker implements (recorded for audit).
    pub descriptor_hash: String,
}

impl HandlerAd {
    /// The registry key `tool@version`.
    #[must_use]
    pub fn key(&self) -> String {
        handler_key(&self.tool, &self.version)
    }

    /// The effective concurrency limit (`max_concurrency`, with 0 read as 1).
    #[must_use]
    pub fn effective_max_concurrency(&self) -> u32 {
        self.max_concurrency.max(1)
    }
}

/// A worker message after registration (`heartbeat`, `result`, `nack`).
#[derive(Debug, Clone, PartialEq)]
pub enum FromWorker {
    /// `WorkHeartbeat`: extends the lease.
    Heartbeat,
    /// `WorkToolResult`: the outcome of an invocation.
    Result {
        /// The call the result belongs to.
        call_id: String,
        /// The successful result as UTF-8 JSON bytes (empty means `{}`).
        payload: Vec<u8>,
        /// Set when the handler failed; takes precedence over `payload`.
        error: Option<ToolError>,
    },
    /// `WorkToolNack`: the worker refuses the invocation.
    Nack {
        /// The refused call.
        call_id: String,
        /// Why, e.g. `unknown_handler` or `invalid_args`.
        code: String,
        /// Human-readable detail.
        message: String,
    },
}

/// A runtime message to a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum ToWorker {
    /// `WorkRegistered`: registration accepted; heartbeat well before `lease_ttl_ms` passes.
    Registered {
        /// The registered worker id.
        worker_id: String,
        /// The lease, in milliseconds.
        lease_ttl_ms: i64,
    },
    /// `WorkInvoke`: run a tool call.
    Invoke(Box<Invocation>),
    /// `WorkToolCancel`: stop working on a call.
    Cancel {
        /// The call to stop.
        call_id: String,
    },
    /// `WorkResultAck`: the result was durably recorded; the worker can forget the call.
    ResultAck {
        /// The acknowledged call.
        call_id: String,
    },
    /// `WorkHeartbeatAck`.
    HeartbeatAck,
}

/// `WorkInvoke`: one tool call sent to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// Deterministic call id (the caller derives it; it must be unique per model tool call).
    pub call_id: String,
    /// The calling session.
    pub session_id: String,
    /// The calling agent version.
    pub agent_version_id: String,
    /// The user turn.
    pub turn: i32,
    /// The tool's dispatch ref.
    pub tool: String,
    /// The binding's version; empty is sent as [`DEFAULT_VERSION`].
    pub version: String,
    /// The call's arguments (a JSON object).
    pub args: serde_json::Value,
    /// The binding's side-effect class, e.g. `read_only` or `non_idempotent_write`.
    pub side_effect_class: String,
    /// Wall-clock deadline in Unix milliseconds, 0 for none. On dispatch the router lowers it
    /// to the execution deadline, so the worker learns when the runtime stops waiting.
    pub deadline_unix_ms: i64,
    /// The W3C trace context of the caller's dispatch span (`traceparent`, `tracestate`), sent
    /// to the worker as is; empty when the caller exports no traces.
    pub trace_context: BTreeMap<String, String>,
}

/// A handler error (`WorkToolError`), or a nack turned into a tool error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    /// Machine-readable code, e.g. `invalid_args`.
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

impl ToolError {
    /// Builds a tool error.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// `code: message`, or whichever of the two is present: the text the model sees.
impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code.is_empty(), self.message.is_empty()) {
            (false, false) => write!(f, "{}: {}", self.code, self.message),
            (false, true) => f.write_str(&self.code),
            (true, _) => f.write_str(&self.message),
        }
    }
}

/// What a tool call produced.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// The handler succeeded with this JSON payload (`{}` when the worker sent none).
    Success(serde_json::Value),
    /// The handler failed, or the worker refused the call.
    Error(ToolError),
}

impl ToolOutcome {
    /// The text the model sees: the payload's JSON text, or `code: message`.
    #[must_use]
    pub fn model_text(&self) -> String {
        match self {
            Self::Success(value) => value.to_string(),
            Self::Error(error) => error.to_string(),
        }
    }

    /// Whether the outcome is an error.
    #[must_use]
    pub fn is_error(&self) -> bool {
        matches!(self, Self::Error(_))
    }

    /// Builds the outcome of a `WorkToolResult`: the error when set (an empty one becomes
    /// `internal`), else the payload parsed as JSON (`{}` when empty). A payload that is not
    /// JSON becomes an `invalid_result` error rather than a protocol failure.
    pub(crate) fn from_worker(worker_id: &str, payload: &[u8], error: Option<ToolError>) -> Self {
        if let Some(mut error) = error {
            if error.code.is_empty() && error.message.is_empty() {
                error = ToolError::new("internal", "the worker reported an error without details");
            }
            return Self::Error(error);
        }
        if payload.is_empty() {
            return Self::Success(serde_json::Value::Object(serde_json::Map::new()));
        }
        match serde_json::from_slice(payload) {
            Ok(value) => Self::Success(value),
            Err(err) => Self::Error(ToolError::new(
                "invalid_result",
                format!("worker \"{worker_id}\" returned a result payload that is not JSON: {err}"),
            )),
        }
    }
}

/// Which worker ran (or was running) a call, for the ledger's provenance columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerProvenance {
    /// The worker id.
    pub worker_id: String,
    /// The worker's self-asserted workload identity.
    pub workload_identity: String,
    /// The worker's self-asserted image digest.
    pub image_digest: String,
    /// The handler's descriptor hash.
    pub descriptor_hash: String,
    /// The handler's contract version.
    pub contract_version: String,
}
