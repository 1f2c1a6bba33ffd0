from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApprovalDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_DECISION_UNSPECIFIED: _ClassVar[ApprovalDecision]
    APPROVAL_DECISION_APPROVE: _ClassVar[ApprovalDecision]
    APPROVAL_DECISION_REJECT: _ClassVar[ApprovalDecision]

class SessionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_MODE_UNSPECIFIED: _ClassVar[SessionMode]
    SESSION_MODE_TASK: _ClassVar[SessionMode]
    SESSION_MODE_CONVERSATION: _ClassVar[SessionMode]

class ApprovalChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_CHANGE_KIND_UNSPECIFIED: _ClassVar[ApprovalChangeKind]
    APPROVAL_CHANGE_KIND_OPENED: _ClassVar[ApprovalChangeKind]
    APPROVAL_CHANGE_KIND_UPDATED: _ClassVar[ApprovalChangeKind]
    APPROVAL_CHANGE_KIND_DECIDED: _ClassVar[ApprovalChangeKind]
    APPROVAL_CHANGE_KIND_CURRENT_END: _ClassVar[ApprovalChangeKind]
APPROVAL_DECISION_UNSPECIFIED: ApprovalDecision
APPROVAL_DECISION_APPROVE: ApprovalDecision
APPROVAL_DECISION_REJECT: ApprovalDecision
SESSION_MODE_UNSPECIFIED: SessionMode
SESSION_MODE_TASK: SessionMode
SESSION_MODE_CONVERSATION: SessionMode
APPROVAL_CHANGE_KIND_UNSPECIFIED: ApprovalChangeKind
APPROVAL_CHANGE_KIND_OPENED: ApprovalChangeKind
APPROVAL_CHANGE_KIND_UPDATED: ApprovalChangeKind
APPROVAL_CHANGE_KIND_DECIDED: ApprovalChangeKind
APPROVAL_CHANGE_KIND_CURRENT_END: ApprovalChangeKind

class ListWebhookDeliveriesRequest(_message.Message):
    __slots__ = ("status", "webhook", "limit")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    status: str
    webhook: str
    limit: int
    def __init__(self, status: _Optional[str] = ..., webhook: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class WebhookDelivery(_message.Message):
    __slots__ = ("id", "webhook", "kind", "stream", "seq", "status", "attempts", "next_attempt_at", "last_error", "delivered_at", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    webhook: str
    kind: str
    stream: str
    seq: int
    status: str
    attempts: int
    next_attempt_at: str
    last_error: str
    delivered_at: str
    created_at: str
    def __init__(self, id: _Optional[str] = ..., webhook: _Optional[str] = ..., kind: _Optional[str] = ..., stream: _Optional[str] = ..., seq: _Optional[int] = ..., status: _Optional[str] = ..., attempts: _Optional[int] = ..., next_attempt_at: _Optional[str] = ..., last_error: _Optional[str] = ..., delivered_at: _Optional[str] = ..., created_at: _Optional[str] = ...) -> None: ...

class ListWebhookDeliveriesResponse(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[WebhookDelivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[WebhookDelivery, _Mapping]]] = ...) -> None: ...

class RetryWebhookDeliveryRequest(_message.Message):
    __slots__ = ("delivery_id", "actor")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    actor: str
    def __init__(self, delivery_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class RetryWebhookDeliveryResponse(_message.Message):
    __slots__ = ("delivery",)
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    delivery: WebhookDelivery
    def __init__(self, delivery: _Optional[_Union[WebhookDelivery, _Mapping]] = ...) -> None: ...

class ListShadowDecisionsRequest(_message.Message):
    __slots__ = ("policy", "since", "limit")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    policy: str
    since: str
    limit: int
    def __init__(self, policy: _Optional[str] = ..., since: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ShadowDecision(_message.Message):
    __slots__ = ("recorded_at", "session_id", "call_id", "agent", "tool", "args_digest", "enforced", "enforced_policy", "shadow", "policy", "reason", "seq")
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ENFORCED_FIELD_NUMBER: _ClassVar[int]
    ENFORCED_POLICY_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    recorded_at: str
    session_id: str
    call_id: str
    agent: str
    tool: str
    args_digest: str
    enforced: str
    enforced_policy: str
    shadow: str
    policy: str
    reason: str
    seq: int
    def __init__(self, recorded_at: _Optional[str] = ..., session_id: _Optional[str] = ..., call_id: _Optional[str] = ..., agent: _Optional[str] = ..., tool: _Optional[str] = ..., args_digest: _Optional[str] = ..., enforced: _Optional[str] = ..., enforced_policy: _Optional[str] = ..., shadow: _Optional[str] = ..., policy: _Optional[str] = ..., reason: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class ListShadowDecisionsResponse(_message.Message):
    __slots__ = ("decisions", "truncated")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[ShadowDecision]
    truncated: bool
    def __init__(self, decisions: _Optional[_Iterable[_Union[ShadowDecision, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class VerifyAuditRequest(_message.Message):
    __slots__ = ("session_id", "agent")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    agent: str
    def __init__(self, session_id: _Optional[str] = ..., agent: _Optional[str] = ...) -> None: ...

class VerifyAuditResponse(_message.Message):
    __slots__ = ("verified", "events", "streams", "problem")
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    verified: bool
    events: int
    streams: int
    problem: AuditProblem
    def __init__(self, verified: _Optional[bool] = ..., events: _Optional[int] = ..., streams: _Optional[int] = ..., problem: _Optional[_Union[AuditProblem, _Mapping]] = ...) -> None: ...

class AuditProblem(_message.Message):
    __slots__ = ("kind", "stream", "seq", "message", "table", "key", "column")
    KIND_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    kind: str
    stream: str
    seq: int
    message: str
    table: str
    key: str
    column: str
    def __init__(self, kind: _Optional[str] = ..., stream: _Optional[str] = ..., seq: _Optional[int] = ..., message: _Optional[str] = ..., table: _Optional[str] = ..., key: _Optional[str] = ..., column: _Optional[str] = ...) -> None: ...

class ExportAuditRequest(_message.Message):
    __slots__ = ("since", "session_id")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    since: str
    session_id: str
    def __init__(self, since: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("stream", "seq", "type", "ts", "actor", "call_id", "turn", "payload_json", "prev_hash", "hash", "actor_verification", "actor_via")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    ACTOR_VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_VIA_FIELD_NUMBER: _ClassVar[int]
    stream: str
    seq: int
    type: str
    ts: str
    actor: str
    call_id: str
    turn: int
    payload_json: str
    prev_hash: str
    hash: str
    actor_verification: str
    actor_via: str
    def __init__(self, stream: _Optional[str] = ..., seq: _Optional[int] = ..., type: _Optional[str] = ..., ts: _Optional[str] = ..., actor: _Optional[str] = ..., call_id: _Optional[str] = ..., turn: _Optional[int] = ..., payload_json: _Optional[str] = ..., prev_hash: _Optional[str] = ..., hash: _Optional[str] = ..., actor_verification: _Optional[str] = ..., actor_via: _Optional[str] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetVersionResponse(_message.Message):
    __slots__ = ("version", "schema_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    schema_version: str
    def __init__(self, version: _Optional[str] = ..., schema_version: _Optional[str] = ...) -> None: ...

class AgentRef(_message.Message):
    __slots__ = ("namespace", "name", "version")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    version: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class BundleRef(_message.Message):
    __slots__ = ("namespace", "name", "version")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    version: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class RunSessionRequest(_message.Message):
    __slots__ = ("agent_ref", "input", "resolved_secrets", "bundle_ref", "metadata", "mode")
    class ResolvedSecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_SECRETS_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    input: bytes
    resolved_secrets: _containers.ScalarMap[str, bytes]
    bundle_ref: BundleRef
    metadata: _containers.ScalarMap[str, str]
    mode: SessionMode
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ..., input: _Optional[bytes] = ..., resolved_secrets: _Optional[_Mapping[str, bytes]] = ..., bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., mode: _Optional[_Union[SessionMode, str]] = ...) -> None: ...

class RunSessionResponse(_message.Message):
    __slots__ = ("session_id", "agent_version_id", "status")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    agent_version_id: str
    status: str
    def __init__(self, session_id: _Optional[str] = ..., agent_version_id: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class RunSessionInteractiveClientMsg(_message.Message):
    __slots__ = ("start", "user_message", "tool_approval")
    START_FIELD_NUMBER: _ClassVar[int]
    USER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    start: RunSessionInteractiveStart
    user_message: RunSessionInteractiveUserMessage
    tool_approval: RunSessionInteractiveToolApproval
    def __init__(self, start: _Optional[_Union[RunSessionInteractiveStart, _Mapping]] = ..., user_message: _Optional[_Union[RunSessionInteractiveUserMessage, _Mapping]] = ..., tool_approval: _Optional[_Union[RunSessionInteractiveToolApproval, _Mapping]] = ...) -> None: ...

class RunSessionInteractiveStart(_message.Message):
    __slots__ = ("agent_ref", "input", "session_id", "resolved_secrets", "bundle_ref", "mode", "metadata")
    class ResolvedSecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_SECRETS_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    input: bytes
    session_id: str
    resolved_secrets: _containers.ScalarMap[str, bytes]
    bundle_ref: BundleRef
    mode: SessionMode
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ..., input: _Optional[bytes] = ..., session_id: _Optional[str] = ..., resolved_secrets: _Optional[_Mapping[str, bytes]] = ..., bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ..., mode: _Optional[_Union[SessionMode, str]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RunSessionInteractiveUserMessage(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class RunSessionInteractiveServerMsg(_message.Message):
    __slots__ = ("session_started", "text_delta", "awaiting_input", "completed", "failed", "tool_call", "tool_result", "approval_required", "cancelled", "approval_decided", "status")
    SESSION_STARTED_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    AWAITING_INPUT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_DECIDED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    session_started: RunSessionInteractiveSessionStarted
    text_delta: RunSessionInteractiveTextDelta
    awaiting_input: RunSessionInteractiveAwaitingInput
    completed: RunSessionInteractiveCompleted
    failed: RunSessionInteractiveFailed
    tool_call: RunSessionInteractiveToolCall
    tool_result: RunSessionInteractiveToolResult
    approval_required: RunSessionInteractiveApprovalRequired
    cancelled: RunSessionInteractiveCancelled
    approval_decided: RunSessionInteractiveApprovalDecided
    status: RunSessionInteractiveStatus
    def __init__(self, session_started: _Optional[_Union[RunSessionInteractiveSessionStarted, _Mapping]] = ..., text_delta: _Optional[_Union[RunSessionInteractiveTextDelta, _Mapping]] = ..., awaiting_input: _Optional[_Union[RunSessionInteractiveAwaitingInput, _Mapping]] = ..., completed: _Optional[_Union[RunSessionInteractiveCompleted, _Mapping]] = ..., failed: _Optional[_Union[RunSessionInteractiveFailed, _Mapping]] = ..., tool_call: _Optional[_Union[RunSessionInteractiveToolCall, _Mapping]] = ..., tool_result: _Optional[_Union[RunSessionInteractiveToolResult, _Mapping]] = ..., approval_required: _Optional[_Union[RunSessionInteractiveApprovalRequired, _Mapping]] = ..., cancelled: _Optional[_Union[RunSessionInteractiveCancelled, _Mapping]] = ..., approval_decided: _Optional[_Union[RunSessionInteractiveApprovalDecided, _Mapping]] = ..., status: _Optional[_Union[RunSessionInteractiveStatus, _Mapping]] = ...) -> None: ...

class RunSessionInteractiveApprovalDecided(_message.Message):
    __slots__ = ("approval_id", "call_id", "status", "decided_by", "comment", "approvals_received", "approvals_required")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    call_id: str
    status: str
    decided_by: str
    comment: str
    approvals_received: int
    approvals_required: int
    def __init__(self, approval_id: _Optional[str] = ..., call_id: _Optional[str] = ..., status: _Optional[str] = ..., decided_by: _Optional[str] = ..., comment: _Optional[str] = ..., approvals_received: _Optional[int] = ..., approvals_required: _Optional[int] = ...) -> None: ...

class RunSessionInteractiveStatus(_message.Message):
    __slots__ = ("status", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: str
    reason: str
    def __init__(self, status: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class InteractiveConversationMessage(_message.Message):
    __slots__ = ("role", "content", "stop_reason", "turn_usage", "turn_duration_ms")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TURN_USAGE_FIELD_NUMBER: _ClassVar[int]
    TURN_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    stop_reason: str
    turn_usage: TokenUsage
    turn_duration_ms: int
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., stop_reason: _Optional[str] = ..., turn_usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., turn_duration_ms: _Optional[int] = ...) -> None: ...

class RunSessionInteractiveSessionStarted(_message.Message):
    __slots__ = ("session_id", "agent_version_id", "model_provider", "model_name", "history", "max_tokens_per_run", "max_wall_clock_seconds", "session_started_at_unix_ms", "session_ended_at_unix_ms", "descriptive_metadata")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_WALL_CLOCK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ENDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTIVE_METADATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    agent_version_id: str
    model_provider: str
    model_name: str
    history: _containers.RepeatedCompositeFieldContainer[InteractiveConversationMessage]
    max_tokens_per_run: int
    max_wall_clock_seconds: int
    session_started_at_unix_ms: int
    session_ended_at_unix_ms: int
    descriptive_metadata: DescriptiveMetadataEvidence
    def __init__(self, session_id: _Optional[str] = ..., agent_version_id: _Optional[str] = ..., model_provider: _Optional[str] = ..., model_name: _Optional[str] = ..., history: _Optional[_Iterable[_Union[InteractiveConversationMessage, _Mapping]]] = ..., max_tokens_per_run: _Optional[int] = ..., max_wall_clock_seconds: _Optional[int] = ..., session_started_at_unix_ms: _Optional[int] = ..., session_ended_at_unix_ms: _Optional[int] = ..., descriptive_metadata: _Optional[_Union[DescriptiveMetadataEvidence, _Mapping]] = ...) -> None: ...

class DescriptiveMetadataEvidence(_message.Message):
    __slots__ = ("owner", "labels", "annotations", "governance")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    GOVERNANCE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    governance: GovernanceMetadataEvidence
    def __init__(self, owner: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., governance: _Optional[_Union[GovernanceMetadataEvidence, _Mapping]] = ...) -> None: ...

class GovernanceMetadataEvidence(_message.Message):
    __slots__ = ("risk_tier", "classifications", "authority_boundaries", "frameworks")
    RISK_TIER_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    AUTHORITY_BOUNDARIES_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORKS_FIELD_NUMBER: _ClassVar[int]
    risk_tier: str
    classifications: _containers.RepeatedScalarFieldContainer[str]
    authority_boundaries: _containers.RepeatedScalarFieldContainer[str]
    frameworks: _containers.RepeatedCompositeFieldContainer[FrameworkPackEvidence]
    def __init__(self, risk_tier: _Optional[str] = ..., classifications: _Optional[_Iterable[str]] = ..., authority_boundaries: _Optional[_Iterable[str]] = ..., frameworks: _Optional[_Iterable[_Union[FrameworkPackEvidence, _Mapping]]] = ...) -> None: ...

class FrameworkPackEvidence(_message.Message):
    __slots__ = ("id", "validation", "payload")
    ID_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    id: str
    validation: str
    payload: bytes
    def __init__(self, id: _Optional[str] = ..., validation: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class RunSessionInteractiveTextDelta(_message.Message):
    __slots__ = ("delta",)
    DELTA_FIELD_NUMBER: _ClassVar[int]
    delta: str
    def __init__(self, delta: _Optional[str] = ...) -> None: ...

class TokenUsage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "total_tokens", "estimated")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    total_tokens: int
    estimated: bool
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., estimated: _Optional[bool] = ...) -> None: ...

class InteractiveSessionStats(_message.Message):
    __slots__ = ("turn", "turn_usage", "session_usage")
    TURN_FIELD_NUMBER: _ClassVar[int]
    TURN_USAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_USAGE_FIELD_NUMBER: _ClassVar[int]
    turn: int
    turn_usage: TokenUsage
    session_usage: TokenUsage
    def __init__(self, turn: _Optional[int] = ..., turn_usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., session_usage: _Optional[_Union[TokenUsage, _Mapping]] = ...) -> None: ...

class RunSessionInteractiveAwaitingInput(_message.Message):
    __slots__ = ("stop_reason", "stats", "input_blocked_reason")
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    INPUT_BLOCKED_REASON_FIELD_NUMBER: _ClassVar[int]
    stop_reason: str
    stats: InteractiveSessionStats
    input_blocked_reason: str
    def __init__(self, stop_reason: _Optional[str] = ..., stats: _Optional[_Union[InteractiveSessionStats, _Mapping]] = ..., input_blocked_reason: _Optional[str] = ...) -> None: ...

class RunSessionInteractiveCompleted(_message.Message):
    __slots__ = ("stop_reason", "output", "stats", "session_ended_at_unix_ms")
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ENDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    stop_reason: str
    output: bytes
    stats: InteractiveSessionStats
    session_ended_at_unix_ms: int
    def __init__(self, stop_reason: _Optional[str] = ..., output: _Optional[bytes] = ..., stats: _Optional[_Union[InteractiveSessionStats, _Mapping]] = ..., session_ended_at_unix_ms: _Optional[int] = ...) -> None: ...

class RunSessionInteractiveFailed(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class RunSessionInteractiveCancelled(_message.Message):
    __slots__ = ("session_ended_at_unix_ms",)
    SESSION_ENDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    session_ended_at_unix_ms: int
    def __init__(self, session_ended_at_unix_ms: _Optional[int] = ...) -> None: ...

class RunSessionInteractiveToolCall(_message.Message):
    __slots__ = ("call_id", "tool", "version", "args", "agent_delegation", "child_session_id", "delegation_target", "wire_name")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    AGENT_DELEGATION_FIELD_NUMBER: _ClassVar[int]
    CHILD_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DELEGATION_TARGET_FIELD_NUMBER: _ClassVar[int]
    WIRE_NAME_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    tool: str
    version: str
    args: bytes
    agent_delegation: bool
    child_session_id: str
    delegation_target: str
    wire_name: str
    def __init__(self, call_id: _Optional[str] = ..., tool: _Optional[str] = ..., version: _Optional[str] = ..., args: _Optional[bytes] = ..., agent_delegation: _Optional[bool] = ..., child_session_id: _Optional[str] = ..., delegation_target: _Optional[str] = ..., wire_name: _Optional[str] = ...) -> None: ...

class RunSessionInteractiveToolResult(_message.Message):
    __slots__ = ("call_id", "payload", "error_message", "error_code", "policy_ref")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    POLICY_REF_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    payload: bytes
    error_message: str
    error_code: str
    policy_ref: str
    def __init__(self, call_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., error_message: _Optional[str] = ..., error_code: _Optional[str] = ..., policy_ref: _Optional[str] = ...) -> None: ...

class RunSessionInteractiveApprovalRequired(_message.Message):
    __slots__ = ("approval_id", "call_id", "tool", "version", "args", "route", "reason", "authority_ref", "policy_name", "policy_runtime", "approvals_required", "approvals_received", "comprehension_required", "expires_at", "policy_ref", "on_reject", "on_modify", "kind")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AUTHORITY_REF_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    COMPREHENSION_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    POLICY_REF_FIELD_NUMBER: _ClassVar[int]
    ON_REJECT_FIELD_NUMBER: _ClassVar[int]
    ON_MODIFY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    call_id: str
    tool: str
    version: str
    args: bytes
    route: str
    reason: str
    authority_ref: str
    policy_name: str
    policy_runtime: bytes
    approvals_required: int
    approvals_received: int
    comprehension_required: bool
    expires_at: str
    policy_ref: str
    on_reject: str
    on_modify: str
    kind: str
    def __init__(self, approval_id: _Optional[str] = ..., call_id: _Optional[str] = ..., tool: _Optional[str] = ..., version: _Optional[str] = ..., args: _Optional[bytes] = ..., route: _Optional[str] = ..., reason: _Optional[str] = ..., authority_ref: _Optional[str] = ..., policy_name: _Optional[str] = ..., policy_runtime: _Optional[bytes] = ..., approvals_required: _Optional[int] = ..., approvals_received: _Optional[int] = ..., comprehension_required: _Optional[bool] = ..., expires_at: _Optional[str] = ..., policy_ref: _Optional[str] = ..., on_reject: _Optional[str] = ..., on_modify: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class RunSessionInteractiveToolApproval(_message.Message):
    __slots__ = ("approval_id", "approved", "comment", "args", "comprehension_acknowledged", "resolution", "result")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    COMPREHENSION_ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    approved: bool
    comment: str
    args: bytes
    comprehension_acknowledged: bool
    resolution: str
    result: bytes
    def __init__(self, approval_id: _Optional[str] = ..., approved: _Optional[bool] = ..., comment: _Optional[str] = ..., args: _Optional[bytes] = ..., comprehension_acknowledged: _Optional[bool] = ..., resolution: _Optional[str] = ..., result: _Optional[bytes] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("manifest", "actor")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    manifest: bytes
    actor: str
    def __init__(self, manifest: _Optional[bytes] = ..., actor: _Optional[str] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("agent_id", "version_id", "content_hash", "namespace", "name", "version", "created")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    version_id: str
    content_hash: str
    namespace: str
    name: str
    version: str
    created: bool
    def __init__(self, agent_id: _Optional[str] = ..., version_id: _Optional[str] = ..., content_hash: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class BundleMemberPackage(_message.Message):
    __slots__ = ("child_name", "origin", "authoring_ref", "resolved_manifest", "is_root", "member_version_id")
    CHILD_NAME_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    AUTHORING_REF_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_MANIFEST_FIELD_NUMBER: _ClassVar[int]
    IS_ROOT_FIELD_NUMBER: _ClassVar[int]
    MEMBER_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    child_name: str
    origin: str
    authoring_ref: str
    resolved_manifest: bytes
    is_root: bool
    member_version_id: str
    def __init__(self, child_name: _Optional[str] = ..., origin: _Optional[str] = ..., authoring_ref: _Optional[str] = ..., resolved_manifest: _Optional[bytes] = ..., is_root: _Optional[bool] = ..., member_version_id: _Optional[str] = ...) -> None: ...

class PublishBundleRequest(_message.Message):
    __slots__ = ("bundle_manifest", "members", "actor", "committed_lock")
    BUNDLE_MANIFEST_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LOCK_FIELD_NUMBER: _ClassVar[int]
    bundle_manifest: bytes
    members: _containers.RepeatedCompositeFieldContainer[BundleMemberPackage]
    actor: str
    committed_lock: bytes
    def __init__(self, bundle_manifest: _Optional[bytes] = ..., members: _Optional[_Iterable[_Union[BundleMemberPackage, _Mapping]]] = ..., actor: _Optional[str] = ..., committed_lock: _Optional[bytes] = ...) -> None: ...

class PublishBundleResponse(_message.Message):
    __slots__ = ("bundle_id", "bundle_version_id", "lock_hash", "namespace", "name", "lock", "version")
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    bundle_id: str
    bundle_version_id: str
    lock_hash: str
    namespace: str
    name: str
    lock: bytes
    version: str
    def __init__(self, bundle_id: _Optional[str] = ..., bundle_version_id: _Optional[str] = ..., lock_hash: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., lock: _Optional[bytes] = ..., version: _Optional[str] = ...) -> None: ...

class DeployRequest(_message.Message):
    __slots__ = ("agent_ref", "actor", "allow_new_secret_endpoints")
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ALLOW_NEW_SECRET_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    actor: str
    allow_new_secret_endpoints: bool
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ..., actor: _Optional[str] = ..., allow_new_secret_endpoints: _Optional[bool] = ...) -> None: ...

class DeployResponse(_message.Message):
    __slots__ = ("namespace", "name", "version", "previous_version", "deployed_at", "secret_endpoint_changes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYED_AT_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENDPOINT_CHANGES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    version: str
    previous_version: str
    deployed_at: str
    secret_endpoint_changes: _containers.RepeatedCompositeFieldContainer[SecretEndpointChange]
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., previous_version: _Optional[str] = ..., deployed_at: _Optional[str] = ..., secret_endpoint_changes: _Optional[_Iterable[_Union[SecretEndpointChange, _Mapping]]] = ...) -> None: ...

class SecretEndpointChange(_message.Message):
    __slots__ = ("secret", "from_env", "endpoint", "previous_endpoints", "member")
    SECRET_FIELD_NUMBER: _ClassVar[int]
    FROM_ENV_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    secret: str
    from_env: str
    endpoint: str
    previous_endpoints: _containers.RepeatedScalarFieldContainer[str]
    member: str
    def __init__(self, secret: _Optional[str] = ..., from_env: _Optional[str] = ..., endpoint: _Optional[str] = ..., previous_endpoints: _Optional[_Iterable[str]] = ..., member: _Optional[str] = ...) -> None: ...

class DeployBundleRequest(_message.Message):
    __slots__ = ("bundle_ref", "actor", "allow_new_secret_endpoints")
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ALLOW_NEW_SECRET_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    bundle_ref: BundleRef
    actor: str
    allow_new_secret_endpoints: bool
    def __init__(self, bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ..., actor: _Optional[str] = ..., allow_new_secret_endpoints: _Optional[bool] = ...) -> None: ...

class DeployBundleResponse(_message.Message):
    __slots__ = ("namespace", "name", "version", "previous_version", "deployed_at", "lock_hash", "previous_lock_hash", "secret_endpoint_changes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYED_AT_FIELD_NUMBER: _ClassVar[int]
    LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENDPOINT_CHANGES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    version: str
    previous_version: str
    deployed_at: str
    lock_hash: str
    previous_lock_hash: str
    secret_endpoint_changes: _containers.RepeatedCompositeFieldContainer[SecretEndpointChange]
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., previous_version: _Optional[str] = ..., deployed_at: _Optional[str] = ..., lock_hash: _Optional[str] = ..., previous_lock_hash: _Optional[str] = ..., secret_endpoint_changes: _Optional[_Iterable[_Union[SecretEndpointChange, _Mapping]]] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("agent_ref", "to_version", "actor", "allow_new_secret_endpoints")
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ALLOW_NEW_SECRET_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    to_version: str
    actor: str
    allow_new_secret_endpoints: bool
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ..., to_version: _Optional[str] = ..., actor: _Optional[str] = ..., allow_new_secret_endpoints: _Optional[bool] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("version", "previous_version", "secret_endpoint_changes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENDPOINT_CHANGES_FIELD_NUMBER: _ClassVar[int]
    version: str
    previous_version: str
    secret_endpoint_changes: _containers.RepeatedCompositeFieldContainer[SecretEndpointChange]
    def __init__(self, version: _Optional[str] = ..., previous_version: _Optional[str] = ..., secret_endpoint_changes: _Optional[_Iterable[_Union[SecretEndpointChange, _Mapping]]] = ...) -> None: ...

class GetActiveVersionRequest(_message.Message):
    __slots__ = ("agent_ref",)
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ...) -> None: ...

class GetActiveVersionResponse(_message.Message):
    __slots__ = ("version", "deployed_at", "actor")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    version: str
    deployed_at: str
    actor: str
    def __init__(self, version: _Optional[str] = ..., deployed_at: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class GetActiveBundleRequest(_message.Message):
    __slots__ = ("bundle_ref",)
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    bundle_ref: BundleRef
    def __init__(self, bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ...) -> None: ...

class GetActiveBundleResponse(_message.Message):
    __slots__ = ("version", "deployed_at", "actor", "lock_hash")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    version: str
    deployed_at: str
    actor: str
    lock_hash: str
    def __init__(self, version: _Optional[str] = ..., deployed_at: _Optional[str] = ..., actor: _Optional[str] = ..., lock_hash: _Optional[str] = ...) -> None: ...

class GetBundleSecretRequirementsRequest(_message.Message):
    __slots__ = ("bundle_ref",)
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    bundle_ref: BundleRef
    def __init__(self, bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ...) -> None: ...

class GetBundleSecretRequirementsResponse(_message.Message):
    __slots__ = ("secrets",)
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SecretRequirement
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SecretRequirement, _Mapping]] = ...) -> None: ...
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    secrets: _containers.MessageMap[str, SecretRequirement]
    def __init__(self, secrets: _Optional[_Mapping[str, SecretRequirement]] = ...) -> None: ...

class SecretRequirement(_message.Message):
    __slots__ = ("from_env", "declared_by")
    FROM_ENV_FIELD_NUMBER: _ClassVar[int]
    DECLARED_BY_FIELD_NUMBER: _ClassVar[int]
    from_env: str
    declared_by: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, from_env: _Optional[str] = ..., declared_by: _Optional[_Iterable[str]] = ...) -> None: ...

class ListBundlesRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class BundleSummary(_message.Message):
    __slots__ = ("id", "namespace", "name", "owner")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    name: str
    owner: str
    def __init__(self, id: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class ListBundlesResponse(_message.Message):
    __slots__ = ("bundles",)
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    bundles: _containers.RepeatedCompositeFieldContainer[BundleSummary]
    def __init__(self, bundles: _Optional[_Iterable[_Union[BundleSummary, _Mapping]]] = ...) -> None: ...

class ListBundleVersionsRequest(_message.Message):
    __slots__ = ("bundle_ref",)
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    bundle_ref: BundleRef
    def __init__(self, bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ...) -> None: ...

class BundleVersionSummary(_message.Message):
    __slots__ = ("id", "version", "published_at", "lock_hash", "published_by")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: str
    published_at: str
    lock_hash: str
    published_by: str
    def __init__(self, id: _Optional[str] = ..., version: _Optional[str] = ..., published_at: _Optional[str] = ..., lock_hash: _Optional[str] = ..., published_by: _Optional[str] = ...) -> None: ...

class ListBundleVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[BundleVersionSummary]
    def __init__(self, versions: _Optional[_Iterable[_Union[BundleVersionSummary, _Mapping]]] = ...) -> None: ...

class ListBundleDeploymentsRequest(_message.Message):
    __slots__ = ("bundle_ref",)
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    bundle_ref: BundleRef
    def __init__(self, bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ...) -> None: ...

class ListBundleDeploymentsResponse(_message.Message):
    __slots__ = ("deployments",)
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    deployments: _containers.RepeatedCompositeFieldContainer[DeploymentEntry]
    def __init__(self, deployments: _Optional[_Iterable[_Union[DeploymentEntry, _Mapping]]] = ...) -> None: ...

class RollbackBundleRequest(_message.Message):
    __slots__ = ("bundle_ref", "to_version", "actor", "allow_new_secret_endpoints")
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ALLOW_NEW_SECRET_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    bundle_ref: BundleRef
    to_version: str
    actor: str
    allow_new_secret_endpoints: bool
    def __init__(self, bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ..., to_version: _Optional[str] = ..., actor: _Optional[str] = ..., allow_new_secret_endpoints: _Optional[bool] = ...) -> None: ...

class RollbackBundleResponse(_message.Message):
    __slots__ = ("version", "previous_version", "lock_hash", "previous_lock_hash", "deployed_at", "secret_endpoint_changes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    DEPLOYED_AT_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENDPOINT_CHANGES_FIELD_NUMBER: _ClassVar[int]
    version: str
    previous_version: str
    lock_hash: str
    previous_lock_hash: str
    deployed_at: str
    secret_endpoint_changes: _containers.RepeatedCompositeFieldContainer[SecretEndpointChange]
    def __init__(self, version: _Optional[str] = ..., previous_version: _Optional[str] = ..., lock_hash: _Optional[str] = ..., previous_lock_hash: _Optional[str] = ..., deployed_at: _Optional[str] = ..., secret_endpoint_changes: _Optional[_Iterable[_Union[SecretEndpointChange, _Mapping]]] = ...) -> None: ...

class GetBundleVersionRequest(_message.Message):
    __slots__ = ("bundle_ref",)
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    bundle_ref: BundleRef
    def __init__(self, bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ...) -> None: ...

class BundleMemberInfo(_message.Message):
    __slots__ = ("child_name", "origin", "ref", "member_version_id", "is_root", "namespace", "name", "version", "content_hash")
    CHILD_NAME_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    MEMBER_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    IS_ROOT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    child_name: str
    origin: str
    ref: str
    member_version_id: str
    is_root: bool
    namespace: str
    name: str
    version: str
    content_hash: str
    def __init__(self, child_name: _Optional[str] = ..., origin: _Optional[str] = ..., ref: _Optional[str] = ..., member_version_id: _Optional[str] = ..., is_root: _Optional[bool] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., content_hash: _Optional[str] = ...) -> None: ...

class GetBundleVersionResponse(_message.Message):
    __slots__ = ("bundle_version_id", "namespace", "name", "version", "lock_hash", "lock", "bundle_manifest", "members", "published_at", "published_by", "active")
    BUNDLE_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_MANIFEST_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_BY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    bundle_version_id: str
    namespace: str
    name: str
    version: str
    lock_hash: str
    lock: bytes
    bundle_manifest: bytes
    members: _containers.RepeatedCompositeFieldContainer[BundleMemberInfo]
    published_at: str
    published_by: str
    active: bool
    def __init__(self, bundle_version_id: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., lock_hash: _Optional[str] = ..., lock: _Optional[bytes] = ..., bundle_manifest: _Optional[bytes] = ..., members: _Optional[_Iterable[_Union[BundleMemberInfo, _Mapping]]] = ..., published_at: _Optional[str] = ..., published_by: _Optional[str] = ..., active: _Optional[bool] = ...) -> None: ...

class ListDeploymentsRequest(_message.Message):
    __slots__ = ("agent_ref",)
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ...) -> None: ...

class DeploymentEntry(_message.Message):
    __slots__ = ("version", "action", "actor", "created_at", "lock_hash")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    version: str
    action: str
    actor: str
    created_at: str
    lock_hash: str
    def __init__(self, version: _Optional[str] = ..., action: _Optional[str] = ..., actor: _Optional[str] = ..., created_at: _Optional[str] = ..., lock_hash: _Optional[str] = ...) -> None: ...

class ListDeploymentsResponse(_message.Message):
    __slots__ = ("deployments",)
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    deployments: _containers.RepeatedCompositeFieldContainer[DeploymentEntry]
    def __init__(self, deployments: _Optional[_Iterable[_Union[DeploymentEntry, _Mapping]]] = ...) -> None: ...

class GetAgentVersionRequest(_message.Message):
    __slots__ = ("agent_ref",)
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ...) -> None: ...

class GetAgentVersionResponse(_message.Message):
    __slots__ = ("manifest", "content_hash", "version", "published_at", "deprecated_at", "retired_at", "published_by")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    DEPRECATED_AT_FIELD_NUMBER: _ClassVar[int]
    RETIRED_AT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_BY_FIELD_NUMBER: _ClassVar[int]
    manifest: bytes
    content_hash: str
    version: str
    published_at: str
    deprecated_at: str
    retired_at: str
    published_by: str
    def __init__(self, manifest: _Optional[bytes] = ..., content_hash: _Optional[str] = ..., version: _Optional[str] = ..., published_at: _Optional[str] = ..., deprecated_at: _Optional[str] = ..., retired_at: _Optional[str] = ..., published_by: _Optional[str] = ...) -> None: ...

class RetireAgentVersionRequest(_message.Message):
    __slots__ = ("agent_ref",)
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ...) -> None: ...

class RetireAgentVersionResponse(_message.Message):
    __slots__ = ("version_id",)
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    version_id: str
    def __init__(self, version_id: _Optional[str] = ...) -> None: ...

class CancelSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CancelSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CompleteSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CompleteSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAgentsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class AgentSummary(_message.Message):
    __slots__ = ("id", "namespace", "name", "owner", "archived_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    name: str
    owner: str
    archived_at: str
    def __init__(self, id: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., archived_at: _Optional[str] = ...) -> None: ...

class ListAgentsResponse(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentSummary]
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentSummary, _Mapping]]] = ...) -> None: ...

class ListAgentVersionsRequest(_message.Message):
    __slots__ = ("agent_ref",)
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ...) -> None: ...

class AgentVersionSummary(_message.Message):
    __slots__ = ("id", "version", "content_hash", "deployed_at", "deprecated_at", "retired_at", "published_by")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    DEPLOYED_AT_FIELD_NUMBER: _ClassVar[int]
    DEPRECATED_AT_FIELD_NUMBER: _ClassVar[int]
    RETIRED_AT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: str
    content_hash: str
    deployed_at: str
    deprecated_at: str
    retired_at: str
    published_by: str
    def __init__(self, id: _Optional[str] = ..., version: _Optional[str] = ..., content_hash: _Optional[str] = ..., deployed_at: _Optional[str] = ..., deprecated_at: _Optional[str] = ..., retired_at: _Optional[str] = ..., published_by: _Optional[str] = ...) -> None: ...

class ListAgentVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[AgentVersionSummary]
    def __init__(self, versions: _Optional[_Iterable[_Union[AgentVersionSummary, _Mapping]]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("agent_ref", "status", "include_children", "bundle_ref", "kind", "metadata", "page_size", "page_token")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    status: str
    include_children: bool
    bundle_ref: BundleRef
    kind: str
    metadata: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ..., status: _Optional[str] = ..., include_children: _Optional[bool] = ..., bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ..., kind: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class SessionSummary(_message.Message):
    __slots__ = ("id", "agent_version_id", "status", "created_at", "updated_at", "kind", "bundle_version_id", "agent_ref", "bundle_ref", "metadata", "mode", "started_by", "started_by_verification", "started_by_via")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_REF_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_VIA_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent_version_id: str
    status: str
    created_at: str
    updated_at: str
    kind: str
    bundle_version_id: str
    agent_ref: AgentRef
    bundle_ref: BundleRef
    metadata: _containers.ScalarMap[str, str]
    mode: SessionMode
    started_by: str
    started_by_verification: str
    started_by_via: str
    def __init__(self, id: _Optional[str] = ..., agent_version_id: _Optional[str] = ..., status: _Optional[str] = ..., created_at: _Optional[str] = ..., updated_at: _Optional[str] = ..., kind: _Optional[str] = ..., bundle_version_id: _Optional[str] = ..., agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ..., bundle_ref: _Optional[_Union[BundleRef, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., mode: _Optional[_Union[SessionMode, str]] = ..., started_by: _Optional[str] = ..., started_by_verification: _Optional[str] = ..., started_by_via: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionSummary]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class InspectSessionRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class PayloadRef(_message.Message):
    __slots__ = ("session_id", "seq", "call_id", "approval_id", "field")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    call_id: str
    approval_id: str
    field: str
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., call_id: _Optional[str] = ..., approval_id: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class TruncatedPayload(_message.Message):
    __slots__ = ("field", "size_bytes", "ref")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    field: str
    size_bytes: int
    ref: PayloadRef
    def __init__(self, field: _Optional[str] = ..., size_bytes: _Optional[int] = ..., ref: _Optional[_Union[PayloadRef, _Mapping]] = ...) -> None: ...

class GetSessionPayloadRequest(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: PayloadRef
    def __init__(self, ref: _Optional[_Union[PayloadRef, _Mapping]] = ...) -> None: ...

class SessionPayloadChunk(_message.Message):
    __slots__ = ("data", "offset", "total_bytes")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    total_bytes: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class SessionTurnInspect(_message.Message):
    __slots__ = ("stop_reason", "turn_usage", "turn_duration_ms")
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TURN_USAGE_FIELD_NUMBER: _ClassVar[int]
    TURN_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    stop_reason: str
    turn_usage: TokenUsage
    turn_duration_ms: int
    def __init__(self, stop_reason: _Optional[str] = ..., turn_usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., turn_duration_ms: _Optional[int] = ...) -> None: ...

class SessionOutputInspect(_message.Message):
    __slots__ = ("message", "stop_reason", "turn_usage", "session_usage", "turns", "json")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TURN_USAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_USAGE_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    message: str
    stop_reason: str
    turn_usage: TokenUsage
    session_usage: TokenUsage
    turns: _containers.RepeatedCompositeFieldContainer[SessionTurnInspect]
    json: str
    def __init__(self, message: _Optional[str] = ..., stop_reason: _Optional[str] = ..., turn_usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., session_usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., turns: _Optional[_Iterable[_Union[SessionTurnInspect, _Mapping]]] = ..., json: _Optional[str] = ...) -> None: ...

class SessionAgentContext(_message.Message):
    __slots__ = ("namespace", "name", "version", "model_provider", "model_name", "max_tokens_per_run", "max_wall_clock_seconds")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_WALL_CLOCK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    version: str
    model_provider: str
    model_name: str
    max_tokens_per_run: int
    max_wall_clock_seconds: int
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., model_provider: _Optional[str] = ..., model_name: _Optional[str] = ..., max_tokens_per_run: _Optional[int] = ..., max_wall_clock_seconds: _Optional[int] = ...) -> None: ...

class SessionEventEntry(_message.Message):
    __slots__ = ("id", "type", "payload", "created_at", "seq", "ts_unix_ms", "session_id", "turn", "call_id", "child_session_id", "actor", "actor_verification", "actor_via")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CHILD_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTOR_VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_VIA_FIELD_NUMBER: _ClassVar[int]
    id: int
    type: str
    payload: _struct_pb2.Value
    created_at: str
    seq: int
    ts_unix_ms: int
    session_id: str
    turn: int
    call_id: str
    child_session_id: str
    actor: str
    actor_verification: str
    actor_via: str
    def __init__(self, id: _Optional[int] = ..., type: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., created_at: _Optional[str] = ..., seq: _Optional[int] = ..., ts_unix_ms: _Optional[int] = ..., session_id: _Optional[str] = ..., turn: _Optional[int] = ..., call_id: _Optional[str] = ..., child_session_id: _Optional[str] = ..., actor: _Optional[str] = ..., actor_verification: _Optional[str] = ..., actor_via: _Optional[str] = ...) -> None: ...

class ToolInvocationEntry(_message.Message):
    __slots__ = ("call_id", "agent_version_id", "turn", "tool", "version", "args", "result", "status", "worker_identity", "image_digest", "descriptor_hash", "manifest_content_hash", "attempt", "error_code", "error_message", "usage", "created_at", "updated_at", "dispatched_at", "completed_at", "queue_delay_ms", "execution_duration_ms", "total_duration_ms")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_HASH_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    agent_version_id: str
    turn: int
    tool: str
    version: str
    args: _struct_pb2.Value
    result: _struct_pb2.Value
    status: str
    worker_identity: str
    image_digest: str
    descriptor_hash: str
    manifest_content_hash: str
    attempt: int
    error_code: str
    error_message: str
    usage: TokenUsage
    created_at: str
    updated_at: str
    dispatched_at: str
    completed_at: str
    queue_delay_ms: int
    execution_duration_ms: int
    total_duration_ms: int
    def __init__(self, call_id: _Optional[str] = ..., agent_version_id: _Optional[str] = ..., turn: _Optional[int] = ..., tool: _Optional[str] = ..., version: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., status: _Optional[str] = ..., worker_identity: _Optional[str] = ..., image_digest: _Optional[str] = ..., descriptor_hash: _Optional[str] = ..., manifest_content_hash: _Optional[str] = ..., attempt: _Optional[int] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., created_at: _Optional[str] = ..., updated_at: _Optional[str] = ..., dispatched_at: _Optional[str] = ..., completed_at: _Optional[str] = ..., queue_delay_ms: _Optional[int] = ..., execution_duration_ms: _Optional[int] = ..., total_duration_ms: _Optional[int] = ...) -> None: ...

class InspectApproval(_message.Message):
    __slots__ = ("id", "session_id", "call_id", "status", "route", "reason", "tool", "version", "args", "authority_ref", "policy_name", "policy_runtime", "approvals_required", "approvals_received", "comprehension_required", "on_reject", "on_modify", "expires_at", "created_at", "decided_at", "decided_by", "comment", "votes", "agent_ref", "agent_version_id", "policy_ref", "call_hash", "effective_args", "parent_approval_id", "kind", "resolution", "decided_by_verification", "decided_by_via", "allow_self_approval")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    AUTHORITY_REF_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    COMPREHENSION_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    ON_REJECT_FIELD_NUMBER: _ClassVar[int]
    ON_MODIFY_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_REF_FIELD_NUMBER: _ClassVar[int]
    CALL_HASH_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_ARGS_FIELD_NUMBER: _ClassVar[int]
    PARENT_APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_VIA_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SELF_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    call_id: str
    status: str
    route: str
    reason: str
    tool: str
    version: str
    args: _struct_pb2.Value
    authority_ref: str
    policy_name: str
    policy_runtime: _struct_pb2.Value
    approvals_required: int
    approvals_received: int
    comprehension_required: bool
    on_reject: str
    on_modify: str
    expires_at: str
    created_at: str
    decided_at: str
    decided_by: str
    comment: str
    votes: _containers.RepeatedCompositeFieldContainer[ApprovalVote]
    agent_ref: str
    agent_version_id: str
    policy_ref: str
    call_hash: str
    effective_args: _struct_pb2.Value
    parent_approval_id: str
    kind: str
    resolution: str
    decided_by_verification: str
    decided_by_via: str
    allow_self_approval: bool
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., call_id: _Optional[str] = ..., status: _Optional[str] = ..., route: _Optional[str] = ..., reason: _Optional[str] = ..., tool: _Optional[str] = ..., version: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., authority_ref: _Optional[str] = ..., policy_name: _Optional[str] = ..., policy_runtime: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., approvals_required: _Optional[int] = ..., approvals_received: _Optional[int] = ..., comprehension_required: _Optional[bool] = ..., on_reject: _Optional[str] = ..., on_modify: _Optional[str] = ..., expires_at: _Optional[str] = ..., created_at: _Optional[str] = ..., decided_at: _Optional[str] = ..., decided_by: _Optional[str] = ..., comment: _Optional[str] = ..., votes: _Optional[_Iterable[_Union[ApprovalVote, _Mapping]]] = ..., agent_ref: _Optional[str] = ..., agent_version_id: _Optional[str] = ..., policy_ref: _Optional[str] = ..., call_hash: _Optional[str] = ..., effective_args: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., parent_approval_id: _Optional[str] = ..., kind: _Optional[str] = ..., resolution: _Optional[str] = ..., decided_by_verification: _Optional[str] = ..., decided_by_via: _Optional[str] = ..., allow_self_approval: _Optional[bool] = ...) -> None: ...

class InspectTimelineEntry(_message.Message):
    __slots__ = ("timestamp", "gap_ms", "source", "kind", "summary", "event", "invocation", "approval", "session_id", "depth", "seq", "ts_unix_ms", "truncated")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    GAP_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    INVOCATION_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    timestamp: str
    gap_ms: int
    source: str
    kind: str
    summary: str
    event: SessionEventEntry
    invocation: ToolInvocationEntry
    approval: InspectApproval
    session_id: str
    depth: int
    seq: int
    ts_unix_ms: int
    truncated: _containers.RepeatedCompositeFieldContainer[TruncatedPayload]
    def __init__(self, timestamp: _Optional[str] = ..., gap_ms: _Optional[int] = ..., source: _Optional[str] = ..., kind: _Optional[str] = ..., summary: _Optional[str] = ..., event: _Optional[_Union[SessionEventEntry, _Mapping]] = ..., invocation: _Optional[_Union[ToolInvocationEntry, _Mapping]] = ..., approval: _Optional[_Union[InspectApproval, _Mapping]] = ..., session_id: _Optional[str] = ..., depth: _Optional[int] = ..., seq: _Optional[int] = ..., ts_unix_ms: _Optional[int] = ..., truncated: _Optional[_Iterable[_Union[TruncatedPayload, _Mapping]]] = ...) -> None: ...

class SessionInspect(_message.Message):
    __slots__ = ("id", "agent_version_id", "status", "parent_session_id", "depth", "bundle_version_id", "created_at", "updated_at", "input", "output", "error", "agent", "descriptive_metadata", "session_started_at_unix_ms", "session_ended_at_unix_ms", "children", "metadata", "mode", "truncated", "started_by", "started_by_verification", "started_by_via")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTIVE_METADATA_FIELD_NUMBER: _ClassVar[int]
    SESSION_STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ENDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_VIA_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent_version_id: str
    status: str
    parent_session_id: str
    depth: int
    bundle_version_id: str
    created_at: str
    updated_at: str
    input: _struct_pb2.Value
    output: SessionOutputInspect
    error: str
    agent: SessionAgentContext
    descriptive_metadata: _struct_pb2.Value
    session_started_at_unix_ms: int
    session_ended_at_unix_ms: int
    children: _containers.RepeatedCompositeFieldContainer[SessionInspect]
    metadata: _containers.ScalarMap[str, str]
    mode: SessionMode
    truncated: _containers.RepeatedCompositeFieldContainer[TruncatedPayload]
    started_by: str
    started_by_verification: str
    started_by_via: str
    def __init__(self, id: _Optional[str] = ..., agent_version_id: _Optional[str] = ..., status: _Optional[str] = ..., parent_session_id: _Optional[str] = ..., depth: _Optional[int] = ..., bundle_version_id: _Optional[str] = ..., created_at: _Optional[str] = ..., updated_at: _Optional[str] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., output: _Optional[_Union[SessionOutputInspect, _Mapping]] = ..., error: _Optional[str] = ..., agent: _Optional[_Union[SessionAgentContext, _Mapping]] = ..., descriptive_metadata: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., session_started_at_unix_ms: _Optional[int] = ..., session_ended_at_unix_ms: _Optional[int] = ..., children: _Optional[_Iterable[_Union[SessionInspect, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., mode: _Optional[_Union[SessionMode, str]] = ..., truncated: _Optional[_Iterable[_Union[TruncatedPayload, _Mapping]]] = ..., started_by: _Optional[str] = ..., started_by_verification: _Optional[str] = ..., started_by_via: _Optional[str] = ...) -> None: ...

class InspectSessionResponse(_message.Message):
    __slots__ = ("session", "timeline", "next_page_token")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TIMELINE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session: SessionInspect
    timeline: _containers.RepeatedCompositeFieldContainer[InspectTimelineEntry]
    next_page_token: str
    def __init__(self, session: _Optional[_Union[SessionInspect, _Mapping]] = ..., timeline: _Optional[_Iterable[_Union[InspectTimelineEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ApprovalVote(_message.Message):
    __slots__ = ("decided_by", "decision", "comment", "comprehension_acknowledged", "created_at", "verification", "via")
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    COMPREHENSION_ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    decided_by: str
    decision: str
    comment: str
    comprehension_acknowledged: bool
    created_at: str
    verification: str
    via: str
    def __init__(self, decided_by: _Optional[str] = ..., decision: _Optional[str] = ..., comment: _Optional[str] = ..., comprehension_acknowledged: _Optional[bool] = ..., created_at: _Optional[str] = ..., verification: _Optional[str] = ..., via: _Optional[str] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("id", "session_id", "call_id", "status", "route", "reason", "tool", "version", "args", "authority_ref", "policy_name", "policy_runtime", "approvals_required", "approvals_received", "comprehension_required", "on_reject", "on_modify", "expires_at", "created_at", "decided_at", "decided_by", "comment", "votes", "agent_ref", "agent_version_id", "policy_ref", "call_hash", "effective_args", "parent_approval_id", "kind", "resolution", "decided_by_verification", "decided_by_via", "allow_self_approval")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    AUTHORITY_REF_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    COMPREHENSION_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    ON_REJECT_FIELD_NUMBER: _ClassVar[int]
    ON_MODIFY_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_REF_FIELD_NUMBER: _ClassVar[int]
    CALL_HASH_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_ARGS_FIELD_NUMBER: _ClassVar[int]
    PARENT_APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_VIA_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SELF_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    call_id: str
    status: str
    route: str
    reason: str
    tool: str
    version: str
    args: bytes
    authority_ref: str
    policy_name: str
    policy_runtime: bytes
    approvals_required: int
    approvals_received: int
    comprehension_required: bool
    on_reject: str
    on_modify: str
    expires_at: str
    created_at: str
    decided_at: str
    decided_by: str
    comment: str
    votes: _containers.RepeatedCompositeFieldContainer[ApprovalVote]
    agent_ref: str
    agent_version_id: str
    policy_ref: str
    call_hash: str
    effective_args: bytes
    parent_approval_id: str
    kind: str
    resolution: str
    decided_by_verification: str
    decided_by_via: str
    allow_self_approval: bool
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., call_id: _Optional[str] = ..., status: _Optional[str] = ..., route: _Optional[str] = ..., reason: _Optional[str] = ..., tool: _Optional[str] = ..., version: _Optional[str] = ..., args: _Optional[bytes] = ..., authority_ref: _Optional[str] = ..., policy_name: _Optional[str] = ..., policy_runtime: _Optional[bytes] = ..., approvals_required: _Optional[int] = ..., approvals_received: _Optional[int] = ..., comprehension_required: _Optional[bool] = ..., on_reject: _Optional[str] = ..., on_modify: _Optional[str] = ..., expires_at: _Optional[str] = ..., created_at: _Optional[str] = ..., decided_at: _Optional[str] = ..., decided_by: _Optional[str] = ..., comment: _Optional[str] = ..., votes: _Optional[_Iterable[_Union[ApprovalVote, _Mapping]]] = ..., agent_ref: _Optional[str] = ..., agent_version_id: _Optional[str] = ..., policy_ref: _Optional[str] = ..., call_hash: _Optional[str] = ..., effective_args: _Optional[bytes] = ..., parent_approval_id: _Optional[str] = ..., kind: _Optional[str] = ..., resolution: _Optional[str] = ..., decided_by_verification: _Optional[str] = ..., decided_by_via: _Optional[str] = ..., allow_self_approval: _Optional[bool] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("approval_id",)
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    def __init__(self, approval_id: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("status", "route", "session_id", "agent_namespace", "agent_name", "page_size", "page_token")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    status: str
    route: str
    session_id: str
    agent_namespace: str
    agent_name: str
    page_size: int
    page_token: str
    def __init__(self, status: _Optional[str] = ..., route: _Optional[str] = ..., session_id: _Optional[str] = ..., agent_namespace: _Optional[str] = ..., agent_name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchApprovalsRequest(_message.Message):
    __slots__ = ("status", "route", "session_id", "agent_namespace", "agent_name")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    status: str
    route: str
    session_id: str
    agent_namespace: str
    agent_name: str
    def __init__(self, status: _Optional[str] = ..., route: _Optional[str] = ..., session_id: _Optional[str] = ..., agent_namespace: _Optional[str] = ..., agent_name: _Optional[str] = ...) -> None: ...

class ApprovalChange(_message.Message):
    __slots__ = ("kind", "approval")
    KIND_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    kind: ApprovalChangeKind
    approval: Approval
    def __init__(self, kind: _Optional[_Union[ApprovalChangeKind, str]] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "decision", "comment", "args", "comprehension_acknowledged", "actor", "resolution", "result")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    COMPREHENSION_ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    decision: ApprovalDecision
    comment: str
    args: bytes
    comprehension_acknowledged: bool
    actor: str
    resolution: str
    result: bytes
    def __init__(self, approval_id: _Optional[str] = ..., decision: _Optional[_Union[ApprovalDecision, str]] = ..., comment: _Optional[str] = ..., args: _Optional[bytes] = ..., comprehension_acknowledged: _Optional[bool] = ..., actor: _Optional[str] = ..., resolution: _Optional[str] = ..., result: _Optional[bytes] = ...) -> None: ...

class DecideApprovalResponse(_message.Message):
    __slots__ = ("status", "approvals_received", "session_status")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    SESSION_STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    approvals_received: int
    session_status: str
    def __init__(self, status: _Optional[str] = ..., approvals_received: _Optional[int] = ..., session_status: _Optional[str] = ...) -> None: ...

class DeprecateAgentVersionRequest(_message.Message):
    __slots__ = ("agent_ref",)
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ...) -> None: ...

class DeprecateAgentVersionResponse(_message.Message):
    __slots__ = ("version_id",)
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    version_id: str
    def __init__(self, version_id: _Optional[str] = ...) -> None: ...

class ArchiveAgentRequest(_message.Message):
    __slots__ = ("agent_ref",)
    AGENT_REF_FIELD_NUMBER: _ClassVar[int]
    agent_ref: AgentRef
    def __init__(self, agent_ref: _Optional[_Union[AgentRef, _Mapping]] = ...) -> None: ...

class ArchiveAgentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkClientMsg(_message.Message):
    __slots__ = ("register", "heartbeat", "result", "nack")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    register: WorkRegister
    heartbeat: WorkHeartbeat
    result: WorkToolResult
    nack: WorkToolNack
    def __init__(self, register: _Optional[_Union[WorkRegister, _Mapping]] = ..., heartbeat: _Optional[_Union[WorkHeartbeat, _Mapping]] = ..., result: _Optional[_Union[WorkToolResult, _Mapping]] = ..., nack: _Optional[_Union[WorkToolNack, _Mapping]] = ...) -> None: ...

class WorkServerMsg(_message.Message):
    __slots__ = ("registered", "invoke", "cancel", "result_ack", "heartbeat_ack")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    INVOKE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    RESULT_ACK_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    registered: WorkRegistered
    invoke: WorkInvoke
    cancel: WorkToolCancel
    result_ack: WorkResultAck
    heartbeat_ack: WorkHeartbeatAck
    def __init__(self, registered: _Optional[_Union[WorkRegistered, _Mapping]] = ..., invoke: _Optional[_Union[WorkInvoke, _Mapping]] = ..., cancel: _Optional[_Union[WorkToolCancel, _Mapping]] = ..., result_ack: _Optional[_Union[WorkResultAck, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[WorkHeartbeatAck, _Mapping]] = ...) -> None: ...

class WorkHandlerAdvertisement(_message.Message):
    __slots__ = ("tool", "version", "contract_version", "max_concurrency", "descriptor_hash")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_HASH_FIELD_NUMBER: _ClassVar[int]
    tool: str
    version: str
    contract_version: str
    max_concurrency: int
    descriptor_hash: str
    def __init__(self, tool: _Optional[str] = ..., version: _Optional[str] = ..., contract_version: _Optional[str] = ..., max_concurrency: _Optional[int] = ..., descriptor_hash: _Optional[str] = ...) -> None: ...

class WorkInFlightCall(_message.Message):
    __slots__ = ("call_id",)
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    def __init__(self, call_id: _Optional[str] = ...) -> None: ...

class WorkRegister(_message.Message):
    __slots__ = ("worker_id", "workload_identity", "image_digest", "handlers", "in_flight")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    HANDLERS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    workload_identity: str
    image_digest: str
    handlers: _containers.RepeatedCompositeFieldContainer[WorkHandlerAdvertisement]
    in_flight: _containers.RepeatedCompositeFieldContainer[WorkInFlightCall]
    def __init__(self, worker_id: _Optional[str] = ..., workload_identity: _Optional[str] = ..., image_digest: _Optional[str] = ..., handlers: _Optional[_Iterable[_Union[WorkHandlerAdvertisement, _Mapping]]] = ..., in_flight: _Optional[_Iterable[_Union[WorkInFlightCall, _Mapping]]] = ...) -> None: ...

class WorkRegistered(_message.Message):
    __slots__ = ("worker_id", "lease_ttl_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_ttl_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., lease_ttl_ms: _Optional[int] = ...) -> None: ...

class WorkHeartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkHeartbeatAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkInvoke(_message.Message):
    __slots__ = ("call_id", "session_id", "agent_version_id", "turn", "tool", "version", "args", "side_effect_class", "deadline_unix_ms", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    SIDE_EFFECT_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    session_id: str
    agent_version_id: str
    turn: int
    tool: str
    version: str
    args: bytes
    side_effect_class: str
    deadline_unix_ms: int
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, call_id: _Optional[str] = ..., session_id: _Optional[str] = ..., agent_version_id: _Optional[str] = ..., turn: _Optional[int] = ..., tool: _Optional[str] = ..., version: _Optional[str] = ..., args: _Optional[bytes] = ..., side_effect_class: _Optional[str] = ..., deadline_unix_ms: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WorkToolCancel(_message.Message):
    __slots__ = ("call_id",)
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    def __init__(self, call_id: _Optional[str] = ...) -> None: ...

class WorkToolResult(_message.Message):
    __slots__ = ("call_id", "payload", "error")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    payload: bytes
    error: WorkToolError
    def __init__(self, call_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., error: _Optional[_Union[WorkToolError, _Mapping]] = ...) -> None: ...

class WorkToolNack(_message.Message):
    __slots__ = ("call_id", "code", "message")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    code: str
    message: str
    def __init__(self, call_id: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class WorkToolError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class WorkResultAck(_message.Message):
    __slots__ = ("call_id",)
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    def __init__(self, call_id: _Optional[str] = ...) -> None: ...
