"""Events of an interactive session (dicts with a `type` key) and its option types."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from phrony.types import AgentRefLike, BundleRefLike


class InteractiveSessionStartOptions(TypedDict, total=False):
    input: Any
    resolved_secrets: dict[str, str]
    agent_ref: AgentRefLike
    bundle_ref: BundleRefLike


class InteractiveSessionAttachOptions(TypedDict):
    session_id: str


class InteractiveToolApprovalOptions(TypedDict):
    approval_id: str
    approved: bool
    comment: str
    args: Any


class SessionStartedEvent(TypedDict):
    type: Literal["session_started"]
    session_id: str
    agent_version_id: str
    model_provider: str
    model_name: str
    history: list[dict[str, Any]]
    max_tokens_per_run: int
    max_wall_clock_seconds: int
    session_started_at_unix_ms: int
    session_ended_at_unix_ms: int


class TextDeltaEvent(TypedDict):
    type: Literal["text_delta"]
    delta: str


class AwaitingInputEvent(TypedDict):
    type: Literal["awaiting_input"]
    stop_reason: str
    stats: Any
    input_blocked_reason: str


class CompletedEvent(TypedDict):
    type: Literal["completed"]
    stop_reason: str
    output: Any
    stats: Any
    session_ended_at_unix_ms: int


class FailedEvent(TypedDict):
    type: Literal["failed"]
    message: str


class CancelledEvent(TypedDict):
    type: Literal["cancelled"]
    session_ended_at_unix_ms: int


class ToolCallEvent(TypedDict):
    type: Literal["tool_call"]
    call_id: str
    tool: str
    version: str
    args: Any


class ToolResultEvent(TypedDict):
    type: Literal["tool_result"]
    call_id: str
    payload: Any
    error_message: str


class ApprovalRequiredEvent(TypedDict):
    type: Literal["approval_required"]
    approval_id: str
    call_id: str
    tool: str
    version: str
    route: str
    reason: str
    authority_ref: str
    policy_name: str
    args: Any
    policy_runtime: Any
    approvals_required: int
    approvals_received: int
    comprehension_required: bool
    expires_at: str


class ApprovalDecidedEvent(TypedDict):
    """0.2.0: an approval of the session was decided (on this stream or elsewhere)."""

    type: Literal["approval_decided"]
    approval_id: str
    call_id: str
    status: str
    decided_by: str
    comment: str
    approvals_received: int
    approvals_required: int


class StatusEvent(TypedDict):
    """0.2.0: the session's status changed (e.g. `awaiting_approval`)."""

    type: Literal["status"]
    status: str
    reason: str


class StreamEndEvent(TypedDict):
    type: Literal["stream_end"]


InteractiveEvent = (
    SessionStartedEvent
    | TextDeltaEvent
    | AwaitingInputEvent
    | CompletedEvent
    | FailedEvent
    | CancelledEvent
    | ToolCallEvent
    | ToolResultEvent
    | ApprovalRequiredEvent
    | ApprovalDecidedEvent
    | StatusEvent
    | StreamEndEvent
)
