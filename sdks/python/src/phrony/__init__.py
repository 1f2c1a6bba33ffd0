"""Python SDK for the Phrony agent runtime.

- `Client`: run sessions and wait for them, list and decide approvals, list/inspect/cancel
  sessions — what a backend needs (async).
- `Worker` (`phrony.worker`): serve tool calls on the runtime's `Work` stream.
- The 0.1.0 API, unchanged: `RuntimeClient` (one method per RPC), `Phrony` /
  `PhronyAgent` / `PhronyBundle`, `InteractiveSession`, the reference helpers and types.
"""

from phrony._version import SDK_VERSION
from phrony.agent_ref import AgentRefParseError, format_agent_ref, parse_agent_ref
from phrony.api import (
    Approval,
    ApprovalChange,
    Approvals,
    ApprovalVote,
    Client,
    Decision,
    Session,
    SessionCancelledError,
    SessionDetails,
    SessionFailedError,
    SessionResult,
    Sessions,
    SessionSummary,
    WaitTimeoutError,
)
from phrony.bundle_ref import (
    BundleRefParseError,
    format_bundle_ref,
    parse_bundle_ref,
    parse_bundle_ref_version_required,
)
from phrony.client import (
    DEFAULT_RUNTIME_ADDR,
    PhronyRuntimeError,
    RuntimeClient,
    dial_runtime,
    json_bytes,
    json_bytes_map,
    parse_json_bytes,
    resolve_runtime_addr,
    resolved_secrets_map,
    wrap_rpc_error,
)
from phrony.client.errors import (
    AbortedError,
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    PhronyError,
    ResourceExhaustedError,
    RpcCancelledError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from phrony.gen.phrony.runtime.v1.runtime_pb2 import ApprovalDecision
from phrony.phrony import AgentRunResult, AgentSessionError, Phrony, PhronyAgent, PhronyBundle
from phrony.secrets import MissingSecretError
from phrony.session import InteractiveSession
from phrony.session.types import (
    InteractiveEvent,
    InteractiveSessionAttachOptions,
    InteractiveSessionStartOptions,
    InteractiveToolApprovalOptions,
)
from phrony.types import AgentRef, BundleRef, GetVersionResponse, RunSessionResponse
from phrony.worker import DEFAULT_MAX_CONCURRENCY, ToolError, Worker, handler_key, heartbeat_interval_ms

__version__ = SDK_VERSION

__all__ = [
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_RUNTIME_ADDR",
    "SDK_VERSION",
    "AbortedError",
    "AgentRef",
    "AgentRefParseError",
    "AgentRunResult",
    "AgentSessionError",
    "AlreadyExistsError",
    "Approval",
    "ApprovalChange",
    "ApprovalDecision",
    "ApprovalVote",
    "Approvals",
    "BundleRef",
    "BundleRefParseError",
    "Client",
    "DeadlineExceededError",
    "Decision",
    "FailedPreconditionError",
    "GetVersionResponse",
    "InteractiveEvent",
    "InteractiveSession",
    "InteractiveSessionAttachOptions",
    "InteractiveSessionStartOptions",
    "InteractiveToolApprovalOptions",
    "InternalError",
    "InvalidArgumentError",
    "MissingSecretError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "Phrony",
    "PhronyAgent",
    "PhronyBundle",
    "PhronyError",
    "PhronyRuntimeError",
    "ResourceExhaustedError",
    "RpcCancelledError",
    "RunSessionResponse",
    "RuntimeClient",
    "Session",
    "SessionCancelledError",
    "SessionDetails",
    "SessionFailedError",
    "SessionResult",
    "SessionSummary",
    "Sessions",
    "ToolError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "WaitTimeoutError",
    "Worker",
    "dial_runtime",
    "format_agent_ref",
    "format_bundle_ref",
    "handler_key",
    "heartbeat_interval_ms",
    "json_bytes",
    "json_bytes_map",
    "parse_agent_ref",
    "parse_bundle_ref",
    "parse_bundle_ref_version_required",
    "parse_json_bytes",
    "resolve_runtime_addr",
    "resolved_secrets_map",
    "wrap_rpc_error",
]
