//! The public, versioned schema of the ledger's session and agent streams: one [`EventBody`]
//! variant per stored event type, serde-tagged by the stored type string.
//!
//! Every writer builds its event from a body ([`EventBody::into_new_event`]) and every reader
//! decodes a stored event with [`Event::body`]; the payload structs below are the stored
//! payloads field for field (same names, same omitted optional fields), so the JSON a hash
//! covers is exactly what earlier builds wrote (the fixture test in `phrony-engine` reads a
//! database recorded before this schema existed). A stored event whose type is not listed
//! here, or whose payload does not have its variant's shape, is a [`LedgerError::BadEvent`].
//!
//! Schema version: [`SCHEMA_VERSION`]. Adding an optional field (omitted when absent) or a new
//! variant keeps the version; renaming or removing a field, or changing its meaning, is a new
//! version with a migration of the stored streams.
//!
//! The gate's audit streams (`gate-<org>`) are not session or agent streams: the gate keeps
//! its own event types.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::error::{LedgerError, Result};
use crate::model::{BundleMemberOrigin, DeploymentAction, Event, NewEvent};
use crate::vocabulary::{
    ApprovalKind, ApprovalStatus, ApprovalTimeout, CallStatus, OnModify, OnReject, OutputAction,
    PolicyVerdict, ReviewResolution, SessionLimits, SessionMode, SessionStatus, SideEffectClass,
    Usage, VoteDecision,
};

/// The version of this schema (see the module docs for what changes it).
pub const SCHEMA_VERSION: u32 = 1;

/// The event types of session and agent streams (§5.10 names, payloads in snake_case).
///
/// The ledger writes the types in [`LEDGER_OWNED`](event_types::LEDGER_OWNED) itself, each
/// together with the projection change it causes; [`crate::Ledger::append_session_event`]
/// refuses them. The session engine records the others.
pub mod event_types {
    /// A session was created (payload: the whole session as created, input included).
    pub const SESSION_STARTED: &str = "session.started";
    /// A non-terminal status change `{from, to, reason?}`.
    pub const SESSION_STATUS_CHANGED: &str = "session.status_changed";
    /// The session completed `{from, to, output?, reason?}`.
    pub const SESSION_COMPLETED: &str = "session.completed";
    /// The session failed `{from, to, message}`.
    pub const SESSION_FAILED: &str = "session.failed";
    /// The session was cancelled `{from, to, reason?}`.
    pub const SESSION_CANCELLED: &str = "session.cancelled";
    /// The claims of the principal the session runs for `{claims}` (written by the engine).
    pub const SESSION_PRINCIPAL: &str = "session.principal";
    /// A user message `{role: "user", content}`.
    pub const MESSAGE_USER: &str = "message.user";
    /// An assistant message segment `{role: "assistant", content, stop_reason?, turn_usage?,
    /// turn_duration_ms?}`.
    pub const MESSAGE_ASSISTANT: &str = "message.assistant";
    /// One model completion (written by the engine before the completion's text and calls).
    pub const MODEL_COMPLETION: &str = "model.completion";
    /// The evidence snapshot (§5.11).
    pub const EVIDENCE_RECORDED: &str = "evidence.recorded";
    /// A task's final answer failed the agent's output check (`output.format: json`), and
    /// what the engine does about it (written by the engine).
    pub const OUTPUT_INVALID: &str = "output.invalid";
    /// A task's final answer passed the output check, or a human accepted it (engine).
    pub const OUTPUT_ACCEPTED: &str = "output.accepted";
    /// The model requested a tool call (ledger row created, status `pending`).
    pub const TOOL_REQUESTED: &str = "tool.requested";
    /// The call waits for a free handler.
    pub const TOOL_QUEUED: &str = "tool.queued";
    /// The call was sent to a worker (with the worker's provenance and the dispatched args).
    pub const TOOL_DISPATCHED: &str = "tool.dispatched";
    /// The call finished: a worker result or a runtime-side failure.
    pub const TOOL_COMPLETED: &str = "tool.completed";
    /// A duplicate or late worker result, recorded without changing the call.
    pub const TOOL_LATE_RESULT: &str = "tool.late_result";
    /// The worker was lost while the call was in flight.
    pub const TOOL_INDETERMINATE: &str = "tool.indeterminate";
    /// A policy denied the call at dispatch time; no worker was invoked.
    pub const TOOL_POLICY_DENIED: &str = "tool.policy_denied";
    /// The call was cancelled (its session ended, or the runtime gave up on it).
    pub const TOOL_CANCELLED: &str = "tool.cancelled";
    /// An approval was opened (payload: the whole approval as opened).
    pub const APPROVAL_REQUIRED: &str = "approval.required";
    /// One approver's vote.
    pub const APPROVAL_VOTE: &str = "approval.vote";
    /// The approval was decided (approved, denied, or cancelled when its session ended).
    pub const APPROVAL_DECIDED: &str = "approval.decided";
    /// The approval timed out and was escalated to a new approval.
    pub const APPROVAL_ESCALATED: &str = "approval.escalated";
    /// A new agent version was published (agent stream).
    pub const AGENT_VERSION_PUBLISHED: &str = "agent.version_published";
    /// A version became the active deployment (agent stream).
    pub const AGENT_DEPLOYED: &str = "agent.deployed";
    /// The active deployment went back to an earlier version (agent stream).
    pub const AGENT_ROLLED_BACK: &str = "agent.rolled_back";
    /// A deploy or rollback was refused because the version would send a secret to an
    /// endpoint no earlier deployment used (agent stream; nothing else changed).
    pub const AGENT_ACTIVATION_REFUSED: &str = "agent.activation_refused";
    /// A version was deprecated (agent stream).
    pub const AGENT_VERSION_DEPRECATED: &str = "agent.version_deprecated";
    /// A version was retired (agent stream).
    pub const AGENT_VERSION_RETIRED: &str = "agent.version_retired";
    /// The agent was archived (agent stream).
    pub const AGENT_ARCHIVED: &str = "agent.archived";
    /// A bundle version (its closure, lock and vendored members) was published (bundle stream).
    pub const BUNDLE_VERSION_PUBLISHED: &str = "bundle.version_published";
    /// A bundle version became the active bundle deployment (bundle stream).
    pub const BUNDLE_DEPLOYED: &str = "bundle.deployed";
    /// The active bundle deployment went back to an earlier version (bundle stream).
    pub const BUNDLE_ROLLED_BACK: &str = "bundle.rolled_back";
    /// A bundle deploy or rollback was refused because a member would send a secret to an
    /// endpoint no earlier deployment of the bundle used (bundle stream; nothing else changed).
    pub const BUNDLE_ACTIVATION_REFUSED: &str = "bundle.activation_refused";
    /// An API token was created (`tokens` stream; never the secret or its hash).
    pub const TOKEN_CREATED: &str = "token.created";
    /// An API token was revoked (`tokens` stream).
    pub const TOKEN_REVOKED: &str = "token.revoked";
    /// The log was sealed with an audit key (`audit` stream).
    pub const AUDIT_KEY_INTRODUCED: &str = "audit.key_introduced";
    /// The daemon served a log that failed its start-up check, by explicit override (`audit`
    /// stream).
    pub const AUDIT_UNVERIFIED_LOG_ALLOWED: &str = "audit.unverified_log_allowed";
    /// A worker's registration was refused because a handler's `descriptor_hash` matched no
    /// pin of a published agent version (or was empty where pins are required) (`workers`
    /// stream).
    pub const WORKER_DESCRIPTOR_REFUSED: &str = "worker.descriptor_refused";
    /// A `mode: shadow` policy would have changed a call's decision (`shadow:<ns>/<name>`
    /// stream; the call went on as enforced).
    pub const POLICY_SHADOW: &str = "policy.shadow";
    /// An operator re-queued a failed webhook delivery (`webhooks` stream).
    pub const WEBHOOK_RETRY_REQUESTED: &str = "webhook.retry_requested";
    /// The pending deliveries of a webhook no longer configured were failed at start-up
    /// (`webhooks` stream).
    pub const WEBHOOK_UNCONFIGURED: &str = "webhook.unconfigured";

    /// Session-stream types only the ledger writes, each with its projection change.
    pub const LEDGER_OWNED: &[&str] = &[
        SESSION_STARTED,
        SESSION_STATUS_CHANGED,
        SESSION_COMPLETED,
        SESSION_FAILED,
        SESSION_CANCELLED,
        TOOL_REQUESTED,
        TOOL_QUEUED,
        TOOL_DISPATCHED,
        TOOL_COMPLETED,
        TOOL_LATE_RESULT,
        TOOL_INDETERMINATE,
        TOOL_POLICY_DENIED,
        TOOL_CANCELLED,
        APPROVAL_REQUIRED,
        APPROVAL_VOTE,
        APPROVAL_DECIDED,
        APPROVAL_ESCALATED,
        TOKEN_CREATED,
        TOKEN_REVOKED,
        WORKER_DESCRIPTOR_REFUSED,
        POLICY_SHADOW,
        WEBHOOK_RETRY_REQUESTED,
        WEBHOOK_UNCONFIGURED,
    ];
}

use event_types as types;

/// Every event body of the session and agent streams, tagged by its stored type string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "payload")]
pub enum EventBody {
    /// `session.started`: the session as created.
    #[serde(rename = "session.started")]
    SessionStarted(SessionStarted),
    /// `session.status_changed`: a non-terminal status change.
    #[serde(rename = "session.status_changed")]
    SessionStatusChanged(SessionTransition),
    /// `session.completed`.
    #[serde(rename = "session.completed")]
    SessionCompleted(SessionTransition),
    /// `session.failed`.
    #[serde(rename = "session.failed")]
    SessionFailed(SessionTransition),
    /// `session.cancelled`.
    #[serde(rename = "session.cancelled")]
    SessionCancelled(SessionTransition),
    /// `session.principal`: the principal's claims (engine).
    #[serde(rename = "session.principal")]
    SessionPrincipal(SessionPrincipal),
    /// `message.user`.
    #[serde(rename = "message.user")]
    MessageUser(UserMessage),
    /// `message.assistant`: one assistant segment.
    #[serde(rename = "message.assistant")]
    MessageAssistant(AssistantSegment),
    /// `model.completion` (engine).
    #[serde(rename = "model.completion")]
    ModelCompletion(ModelCompletion),
    /// `evidence.recorded`: the evidence snapshot, a JSON object (§5.11).
    #[serde(rename = "evidence.recorded")]
    EvidenceRecorded(Map<String, Value>),
    /// `output.invalid` (engine).
    #[serde(rename = "output.invalid")]
    OutputInvalid(OutputInvalid),
    /// `output.accepted` (engine).
    #[serde(rename = "output.accepted")]
    OutputAccepted(OutputAccepted),
    /// `tool.requested`.
    #[serde(rename = "tool.requested")]
    ToolRequested(ToolRequested),
    /// `tool.queued`.
    #[serde(rename = "tool.queued")]
    ToolQueued(ToolQueued),
    /// `tool.dispatched`.
    #[serde(rename = "tool.dispatched")]
    ToolDispatched(ToolDispatched),
    /// `tool.completed`.
    #[serde(rename = "tool.completed")]
    ToolCompleted(ToolCompleted),
    /// `tool.late_result`.
    #[serde(rename = "tool.late_result")]
    ToolLateResult(ToolLateResult),
    /// `tool.indeterminate`.
    #[serde(rename = "tool.indeterminate")]
    ToolIndeterminate(ToolIndeterminate),
    /// `tool.policy_denied`.
    #[serde(rename = "tool.policy_denied")]
    ToolPolicyDenied(ToolPolicyDenied),
    /// `tool.cancelled`.
    #[serde(rename = "tool.cancelled")]
    ToolCancelled(ToolCancelled),
    /// `approval.required`: the approval as opened.
    #[serde(rename = "approval.required")]
    ApprovalRequired(ApprovalRequired),
    /// `approval.vote`.
    #[serde(rename = "approval.vote")]
    ApprovalVote(ApprovalVoted),
    /// `approval.decided`.
    #[serde(rename = "approval.decided")]
    ApprovalDecided(ApprovalDecided),
    /// `approval.escalated`.
    #[serde(rename = "approval.escalated")]
    ApprovalEscalated(ApprovalEscalated),
    /// `agent.version_published`.
    #[serde(rename = "agent.version_published")]
    AgentVersionPublished(AgentVersionPublished),
    /// `agent.deployed`.
    #[serde(rename = "agent.deployed")]
    AgentDeployed(AgentActivated),
    /// `agent.rolled_back`.
    #[serde(rename = "agent.rolled_back")]
    AgentRolledBack(AgentActivated),
    /// `agent.activation_refused`.
    #[serde(rename = "agent.activation_refused")]
    AgentActivationRefused(AgentActivationRefused),
    /// `agent.version_deprecated`.
    #[serde(rename = "agent.version_deprecated")]
    AgentVersionDeprecated(AgentVersionChanged),
    /// `agent.version_retired`.
    #[serde(rename = "agent.version_retired")]
    AgentVersionRetired(AgentVersionChanged),
    /// `agent.archived`.
    #[serde(rename = "agent.archived")]
    AgentArchived(AgentArchived),
    /// `bundle.version_published` (bundle stream).
    #[serde(rename = "bundle.version_published")]
    BundleVersionPublished(BundleVersionPublished),
    /// `bundle.deployed` (bundle stream).
    #[serde(rename = "bundle.deployed")]
    BundleDeployed(BundleActivated),
    /// `bundle.rolled_back` (bundle stream).
    #[serde(rename = "bundle.rolled_back")]
    BundleRolledBack(BundleActivated),
    /// `bundle.activation_refused` (bundle stream).
    #[serde(rename = "bundle.activation_refused")]
    BundleActivationRefused(BundleActivationRefused),
    /// `token.created` (`tokens` stream).
    #[serde(rename = "token.created")]
    TokenCreated(TokenCreated),
    /// `token.revoked` (`tokens` stream).
    #[serde(rename = "token.revoked")]
    TokenRevoked(TokenRevoked),
    /// `audit.key_introduced` (`audit` stream).
    #[serde(rename = "audit.key_introduced")]
    AuditKeyIntroduced(AuditKeyIntroduced),
    /// `audit.unverified_log_allowed` (`audit` stream).
    #[serde(rename = "audit.unverified_log_allowed")]
    AuditUnverifiedLogAllowed(AuditUnverifiedLogAllowed),
    /// `worker.descriptor_refused`.
    #[serde(rename = "worker.descriptor_refused")]
    WorkerDescriptorRefused(WorkerDescriptorRefused),
    /// `policy.shadow`.
    #[serde(rename = "policy.shadow")]
    PolicyShadow(PolicyShadowed),
    /// `webhook.retry_requested` (`webhooks` stream).
    #[serde(rename = "webhook.retry_requested")]
    WebhookRetryRequested(WebhookRetryRequested),
    /// `webhook.unconfigured` (`webhooks` stream).
    #[serde(rename = "webhook.unconfigured")]
    WebhookUnconfigured(WebhookUnconfigured),
}

/// Every type [`EventBody`] knows, for telling an unknown type from a malformed payload.
const KNOWN_TYPES: &[&str] = &[
    types::SESSION_STARTED,
    types::SESSION_STATUS_CHANGED,
    types::SESSION_COMPLETED,
    types::SESSION_FAILED,
    types::SESSION_CANCELLED,
    types::SESSION_PRINCIPAL,
    types::MESSAGE_USER,
    types::MESSAGE_ASSISTANT,
    types::MODEL_COMPLETION,
    types::EVIDENCE_RECORDED,
    types::OUTPUT_INVALID,
    types::OUTPUT_ACCEPTED,
    types::TOOL_REQUESTED,
    types::TOOL_QUEUED,
    types::TOOL_DISPATCHED,
    types::TOOL_COMPLETED,
    types::TOOL_LATE_RESULT,
    types::TOOL_INDETERMINATE,
    types::TOOL_POLICY_DENIED,
    types::TOOL_CANCELLED,
    types::APPROVAL_REQUIRED,
    types::APPROVAL_VOTE,
    types::APPROVAL_DECIDED,
    types::APPROVAL_ESCALATED,
    types::AGENT_VERSION_PUBLISHED,
    types::AGENT_DEPLOYED,
    types::AGENT_ROLLED_BACK,
    types::AGENT_ACTIVATION_REFUSED,
    types::AGENT_VERSION_DEPRECATED,
    types::AGENT_VERSION_RETIRED,
    types::AGENT_ARCHIVED,
    types::BUNDLE_VERSION_PUBLISHED,
    types::BUNDLE_DEPLOYED,
    types::BUNDLE_ROLLED_BACK,
    types::BUNDLE_ACTIVATION_REFUSED,
    types::TOKEN_CREATED,
    types::TOKEN_REVOKED,
    types::AUDIT_KEY_INTRODUCED,
    types::AUDIT_UNVERIFIED_LOG_ALLOWED,
    types::WORKER_DESCRIPTOR_REFUSED,
    types::POLICY_SHADOW,
    types::WEBHOOK_RETRY_REQUESTED,
    types::WEBHOOK_UNCONFIGURED,
];

impl EventBody {
    /// Decodes a stored type and payload.
    ///
    /// # Errors
    /// [`LedgerError::BadEvent`] naming `stream`, `seq` and the type, for a type this schema
    /// does not list or a payload that does not have the type's shape.
    pub fn decode(stream: &str, seq: u64, event_type: &str, payload: &Value) -> Result<Self> {
        let bad = |problem: String| LedgerError::BadEvent {
            stream: stream.to_owned(),
            seq,
            event_type: event_type.to_owned(),
            problem,
        };
        if !KNOWN_TYPES.contains(&event_type) {
            return Err(bad("unknown event type".to_owned()));
        }
        let mut tagged = Map::new();
        tagged.insert("type".into(), Value::String(event_type.to_owned()));
        tagged.insert("payload".into(), payload.clone());
        serde_json::from_value(Value::Object(tagged)).map_err(|e| bad(format!("payload: {e}")))
    }

    /// The stored type string.
    #[must_use]
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::SessionStarted(_) => types::SESSION_STARTED,
            Self::SessionStatusChanged(_) => types::SESSION_STATUS_CHANGED,
            Self::SessionCompleted(_) => types::SESSION_COMPLETED,
            Self::SessionFailed(_) => types::SESSION_FAILED,
            Self::SessionCancelled(_) => types::SESSION_CANCELLED,
            Self::SessionPrincipal(_) => types::SESSION_PRINCIPAL,
            Self::MessageUser(_) => types::MESSAGE_USER,
            Self::MessageAssistant(_) => types::MESSAGE_ASSISTANT,
            Self::ModelCompletion(_) => types::MODEL_COMPLETION,
            Self::EvidenceRecorded(_) => types::EVIDENCE_RECORDED,
            Self::OutputInvalid(_) => types::OUTPUT_INVALID,
            Self::OutputAccepted(_) => types::OUTPUT_ACCEPTED,
            Self::ToolRequested(_) => types::TOOL_REQUESTED,
            Self::ToolQueued(_) => types::TOOL_QUEUED,
            Self::ToolDispatched(_) => types::TOOL_DISPATCHED,
            Self::ToolCompleted(_) => types::TOOL_COMPLETED,
            Self::ToolLateResult(_) => types::TOOL_LATE_RESULT,
            Self::ToolIndeterminate(_) => types::TOOL_INDETERMINATE,
            Self::ToolPolicyDenied(_) => types::TOOL_POLICY_DENIED,
            Self::ToolCancelled(_) => types::TOOL_CANCELLED,
            Self::ApprovalRequired(_) => types::APPROVAL_REQUIRED,
            Self::ApprovalVote(_) => types::APPROVAL_VOTE,
            Self::ApprovalDecided(_) => types::APPROVAL_DECIDED,
            Self::ApprovalEscalated(_) => types::APPROVAL_ESCALATED,
            Self::AgentVersionPublished(_) => types::AGENT_VERSION_PUBLISHED,
            Self::AgentDeployed(_) => types::AGENT_DEPLOYED,
            Self::AgentRolledBack(_) => types::AGENT_ROLLED_BACK,
            Self::AgentActivationRefused(_) => types::AGENT_ACTIVATION_REFUSED,
            Self::AgentVersionDeprecated(_) => types::AGENT_VERSION_DEPRECATED,
            Self::AgentVersionRetired(_) => types::AGENT_VERSION_RETIRED,
            Self::AgentArchived(_) => types::AGENT_ARCHIVED,
            Self::BundleVersionPublished(_) => types::BUNDLE_VERSION_PUBLISHED,
            Self::BundleDeployed(_) => types::BUNDLE_DEPLOYED,
            Self::BundleRolledBack(_) => types::BUNDLE_ROLLED_BACK,
            Self::BundleActivationRefused(_) => types::BUNDLE_ACTIVATION_REFUSED,
            Self::TokenCreated(_) => types::TOKEN_CREATED,
            Self::TokenRevoked(_) => types::TOKEN_REVOKED,
            Self::AuditKeyIntroduced(_) => types::AUDIT_KEY_INTRODUCED,
            Self::AuditUnverifiedLogAllowed(_) => types::AUDIT_UNVERIFIED_LOG_ALLOWED,
            Self::WorkerDescriptorRefused(_) => types::WORKER_DESCRIPTOR_REFUSED,
            Self::PolicyShadow(_) => types::POLICY_SHADOW,
            Self::WebhookRetryRequested(_) => types::WEBHOOK_RETRY_REQUESTED,
            Self::WebhookUnconfigured(_) => types::WEBHOOK_UNCONFIGURED,
        }
    }

    /// The stored payload of this body.
    ///
    /// # Errors
    /// `Corrupt` when the body cannot be encoded (a map with non-string keys; not produced by
    /// the types here).
    pub fn payload(&self) -> Result<Value> {
        let tagged = serde_json::to_value(self)
            .map_err(|e| LedgerError::corrupt(format!("cannot encode event payload: {e}")))?;
        match tagged {
            Value::Object(mut m) => Ok(m.remove("payload").unwrap_or(Value::Null)),
            other => Err(LedgerError::corrupt(format!(
                "event body encoded as {other}, not a tagged object"
            ))),
        }
    }

    /// The event to append: this body's type and payload, by `actor`, with no call id and
    /// no turn (set them on the result).
    ///
    /// # Errors
    /// As [`EventBody::payload`].
    pub fn into_new_event(self, actor: impl Into<phrony_auth::Attribution>) -> Result<NewEvent> {
        Ok(NewEvent::new(self.event_type(), actor, self.payload()?))
    }
}

/// `From<payload> for EventBody` for the payloads that belong to exactly one variant.
macro_rules! one_variant {
    ($($payload:ident => $variant:ident),+ $(,)?) => {
        $(impl From<$payload> for EventBody {
            fn from(p: $payload) -> Self {
                Self::$variant(p)
            }
        })+
    };
}

one_variant! {
    SessionStarted => SessionStarted,
    SessionPrincipal => SessionPrincipal,
    UserMessage => MessageUser,
    AssistantSegment => MessageAssistant,
    ModelCompletion => ModelCompletion,
    OutputInvalid => OutputInvalid,
    OutputAccepted => OutputAccepted,
    ToolRequested => ToolRequested,
    ToolQueued => ToolQueued,
    ToolDispatched => ToolDispatched,
    ToolCompleted => ToolCompleted,
    ToolLateResult => ToolLateResult,
    ToolIndeterminate => ToolIndeterminate,
    ToolPolicyDenied => ToolPolicyDenied,
    ToolCancelled => ToolCancelled,
    ApprovalRequired => ApprovalRequired,
    ApprovalVoted => ApprovalVote,
    ApprovalDecided => ApprovalDecided,
    ApprovalEscalated => ApprovalEscalated,
    AgentVersionPublished => AgentVersionPublished,
    AgentArchived => AgentArchived,
    AgentActivationRefused => AgentActivationRefused,
    BundleVersionPublished => BundleVersionPublished,
    BundleActivationRefused => BundleActivationRefused,
    TokenCreated => TokenCreated,
    TokenRevoked => TokenRevoked,
    AuditKeyIntroduced => AuditKeyIntroduced,
    AuditUnverifiedLogAllowed => AuditUnverifiedLogAllowed,
    WorkerDescriptorRefused => WorkerDescriptorRefused,
    PolicyShadowed => PolicyShadow,
    WebhookRetryRequested => WebhookRetryRequested,
    WebhookUnconfigured => WebhookUnconfigured,
}

/// Checks the row count an event's projection change expected.
pub(crate) fn expect_rows(rows: u64, expected: u64, event: &Event) -> Result<()> {
    if rows == expected {
        Ok(())
    } else {
        Err(LedgerError::corrupt(format!(
            "stream {} seq {}: {} matched {rows} projection rows instead of {expected}",
            event.stream, event.seq, event.event_type
        )))
    }
}

impl Event {
    /// This event's typed body.
    ///
    /// # Errors
    /// [`LedgerError::BadEvent`] for an unknown type or a payload of the wrong shape.
    pub fn body(&self) -> Result<EventBody> {
        EventBody::decode(&self.stream, self.seq, &self.event_type, &self.payload)
    }
}

// ---------------------------------------------------------------------------------------------
// Session events.

/// `session.started`: everything the session row is created from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionStarted {
    /// The session id (the stream).
    pub session_id: String,
    /// The agent version it runs.
    pub agent_version_id: Uuid,
    /// The agent's namespace.
    pub agent_namespace: String,
    /// The agent's name.
    pub agent_name: String,
    /// The version label.
    pub agent_version: String,
    /// Task or conversation.
    pub mode: SessionMode,
    /// The input as given.
    pub input: Value,
    /// Session metadata.
    pub metadata: BTreeMap<String, String>,
    /// The delegating parent session, for a child session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<String>,
    /// The root of the delegation tree (itself for a root session).
    pub root_session_id: String,
    /// Delegation depth (0 for a root session).
    pub depth: u32,
    /// Run limits, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<SessionLimits>,
    /// The initial status.
    pub status: SessionStatus,
    /// The bundle version a bundle's root session runs; omitted for agent sessions (so events
    /// of earlier builds, and their hashes, are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_version_id: Option<Uuid>,
}

/// A session status change (`session.status_changed`, `.completed`, `.failed`, `.cancelled`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionTransition {
    /// The status before.
    pub from: SessionStatus,
    /// The status after.
    pub to: SessionStatus,
    /// Why, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The failure message (`session.failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The output (`session.completed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

/// `session.principal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionPrincipal {
    /// The principal's claims (a JSON object; policies see them).
    pub claims: Value,
}

/// `output.invalid`: the final answer of `turn` is not JSON, or does not match the output
/// schema (attempt `attempt`, counting from 1 over the session); `action` is what the engine
/// does next under `on_invalid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputInvalid {
    /// The turn whose final answer was checked.
    pub turn: u32,
    /// Which check of the session this was (1 for the first answer).
    pub attempt: u32,
    /// What is wrong: `not JSON: …`, or one line per schema violation (`/path: message`).
    pub errors: Vec<String>,
    /// The agent's `output.on_invalid` (`fail` when unset).
    pub on_invalid: OutputAction,
    /// What the engine does: `retry`/`repair` (the model is asked again in turn `turn + 1`,
    /// with `feedback` as the user message), `escalate` (an approval on the pseudo tool
    /// `phrony.output`), `fail` (the session fails; also when the retries are spent).
    pub action: OutputAction,
    /// The message sent to the model (`retry`, `repair`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
}

/// `output.accepted`: the session's output, the final answer of `turn` parsed as JSON (or the
/// answer as a JSON string when a human accepted one that is not JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputAccepted {
    /// The turn whose final answer this is.
    pub turn: u32,
    /// Which check of the session accepted it.
    pub attempt: u32,
    /// The output.
    pub output: Value,
    /// The approval through which a human accepted an answer that failed the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<Uuid>,
    /// Who accepted it (with `approval_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_by: Option<String>,
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageRole {
    /// `user`.
    User,
    /// `assistant`.
    Assistant,
}

/// `message.user`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMessage {
    /// Always [`MessageRole::User`].
    pub role: MessageRole,
    /// The text.
    pub content: String,
}

/// A turn's usage as recorded on its final assistant segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnUsage {
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Their sum.
    #[serde(default)]
    pub total_tokens: u64,
    /// Counted heuristically.
    #[serde(default)]
    pub estimated: bool,
}

impl From<Usage> for TurnUsage {
    fn from(u: Usage) -> Self {
        Self {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            total_tokens: u.input_tokens.saturating_add(u.output_tokens),
            estimated: u.estimated,
        }
    }
}

impl From<TurnUsage> for Usage {
    fn from(u: TurnUsage) -> Self {
        Self {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            estimated: u.estimated,
        }
    }
}

/// `message.assistant`: the text up to a tool-call boundary, or the turn's final text with
/// its stop reason, usage and duration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantSegment {
    /// Always [`MessageRole::Assistant`].
    pub role: MessageRole,
    /// The text.
    pub content: String,
    /// Why the model stopped; on the final segment of a turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The turn's usage; on the final segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_usage: Option<TurnUsage>,
    /// How long the turn took; on the final segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_duration_ms: Option<u64>,
}

/// `model.completion`: one model completion, recorded before its text and tool calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCompletion {
    /// The turn.
    pub turn: u32,
    /// The completion's position in the turn (from 0).
    pub iteration: u32,
    /// Why the model stopped.
    pub stop_reason: String,
    /// Its token usage.
    pub usage: Usage,
    /// How long it took.
    pub duration_ms: u64,
    /// The tool calls it made, as the model produced them (within the engine's bounds).
    #[serde(default)]
    pub tool_calls: Vec<CompletionToolCall>,
    /// Reasoning blocks to replay verbatim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasoning: Vec<Reasoning>,
    /// The agent's tools left out of this completion's request because policy denies every call
    /// of them in the session's context at that moment (tool visibility); omitted when none was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden_tools: Vec<HiddenTool>,
}

/// A tool the model was not offered in a [`ModelCompletion`], and the policy that hid it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HiddenTool {
    /// The wire name the model would have called it by.
    pub name: String,
    /// The policy that denies every call of it in the session's context (`namespace/name@version`).
    pub policy: String,
}

/// One tool call of a [`ModelCompletion`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionToolCall {
    /// Its position in the completion.
    pub index: u32,
    /// The wire name the model called.
    pub name: String,
    /// The arguments (`{}` when they were refused as too large).
    pub args: Value,
    /// Why the engine will not run it, if it will not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<CallRefusal>,
}

/// A model tool call the engine refuses before binding or policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRefusal {
    /// The tool-error code.
    pub code: String,
    /// The message to the model.
    pub message: String,
}

/// An opaque reasoning block from extended thinking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reasoning {
    /// Visible thinking with its signature.
    Thinking {
        /// The thinking text.
        thinking: String,
        /// The vendor's signature.
        signature: String,
    },
    /// Thinking the vendor encrypted.
    Redacted {
        /// Opaque payload.
        data: String,
    },
}

// ---------------------------------------------------------------------------------------------
// Tool-call events.

/// `tool.requested`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolRequested {
    /// The call id.
    pub call_id: String,
    /// The agent version.
    pub agent_version_id: Uuid,
    /// `namespace.name` of the tool.
    pub tool: String,
    /// The tool version.
    pub version: String,
    /// The name the model called it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_name: Option<String>,
    /// The requested arguments.
    pub args: Value,
    /// The turn.
    pub turn: u32,
    /// The completion within the turn.
    pub iteration: u32,
    /// The call's position in the completion.
    pub index: u32,
    /// The tool's side-effect class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effect_class: Option<SideEffectClass>,
    /// The initial status.
    pub status: CallStatus,
    /// The agent a delegation call runs as a child session (see
    /// [`crate::NewToolCall::delegation`]); absent for other calls and in earlier events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation: Option<String>,
}

/// `tool.queued`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolQueued {
    /// The call id.
    pub call_id: String,
    /// The status before.
    pub from: CallStatus,
}

/// `tool.dispatched`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDispatched {
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The tool version.
    pub version: String,
    /// The arguments actually sent to the worker.
    pub args: Value,
    /// The attempt (from 1).
    pub attempt: u32,
    /// The worker.
    pub worker_id: String,
    /// The worker's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_identity: Option<String>,
    /// The worker's image digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The handler's descriptor hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor_hash: Option<String>,
    /// The tool manifest's content hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_content_hash: Option<String>,
    /// The execution deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<DateTime<Utc>>,
}

/// `tool.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCompleted {
    /// The call id.
    pub call_id: String,
    /// `succeeded` or `failed`.
    pub status: CallStatus,
    /// The result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// The error message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// The worker that reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// Usage charged to the call (a delegated child session's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The operator who recorded this outcome by resolving an outcome review (`happened` or
    /// `fail`); absent for outcomes a worker or the runtime reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_by: Option<String>,
}

/// `tool.late_result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolLateResult {
    /// The call id.
    pub call_id: String,
    /// The call's status when the result arrived.
    pub status: CallStatus,
    /// Why it was not applied.
    pub reason: String,
    /// The worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// The late result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The late error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// The late error message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

/// `tool.indeterminate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolIndeterminate {
    /// The call id.
    pub call_id: String,
    /// What happened.
    pub reason: String,
    /// The worker that was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
}

/// `tool.policy_denied`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolPolicyDenied {
    /// The call id.
    pub call_id: String,
    /// The policy's reason.
    pub reason: String,
    /// The denying policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_ref: Option<String>,
}

/// `tool.cancelled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCancelled {
    /// The call id.
    pub call_id: String,
    /// The status before.
    pub from: CallStatus,
    /// Why.
    pub reason: String,
    /// The call had been sent to a worker, so it may have run (`cancelled_after_dispatch`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_dispatch: bool,
}

// ---------------------------------------------------------------------------------------------
// Approval events.

/// `approval.required`: the approval as opened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequired {
    /// The approval id.
    pub approval_id: Uuid,
    /// The call it is about.
    pub call_id: String,
    /// Policy approval or outcome review (omitted for `policy`).
    #[serde(default, skip_serializing_if = "ApprovalKind::is_policy")]
    pub kind: ApprovalKind,
    /// The tool.
    pub tool: String,
    /// The tool version.
    pub version: String,
    /// The proposed arguments.
    pub args: Value,
    /// Hash of the exact call approved.
    pub call_hash: String,
    /// The agent version.
    pub agent_version_id: Uuid,
    /// `namespace/name@version`.
    pub agent_ref: String,
    /// The policy that asked, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_ref: Option<String>,
    /// The policy's runtime keys.
    pub policy_runtime: Map<String, Value>,
    /// Why approval is needed.
    pub reason: String,
    /// Who is asked.
    pub route: String,
    /// The authority.
    pub authority_ref: String,
    /// The quorum.
    pub approvals_required: u32,
    /// The policy's explicit separation-of-duties opt-out (`allow_self_approval: true`): the
    /// session's starter may vote on it. Omitted when false (the default, and every approval
    /// recorded before the field existed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_self_approval: bool,
    /// Approvers must acknowledge comprehension.
    pub comprehension_required: bool,
    /// What a reject does.
    pub on_reject: OnReject,
    /// What an edit does.
    pub on_modify: OnModify,
    /// The timeout, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<ApprovalTimeout>,
    /// When it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// Escalation depth (0 for the first).
    pub escalation_depth: u32,
    /// The approval this one escalates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_approval_id: Option<Uuid>,
}

/// `approval.vote`: one approver's vote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalVoted {
    /// The approval.
    pub approval_id: Uuid,
    /// Its call.
    pub call_id: String,
    /// The voter.
    pub decided_by: String,
    /// Approve or reject.
    pub decision: VoteDecision,
    /// The voter's comment.
    pub comment: String,
    /// The voter acknowledged comprehension.
    pub comprehension_acknowledged: bool,
    /// The voter's edited arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_args: Option<Value>,
    /// An outcome review's resolution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<ReviewResolution>,
    /// The result an operator supplied with `happened`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// `approval.decided`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecided {
    /// The approval.
    pub approval_id: Uuid,
    /// Its call.
    pub call_id: String,
    /// `approved`, `denied` or `cancelled`.
    pub status: ApprovalStatus,
    /// Whether the call may run.
    pub approved: bool,
    /// Who decided.
    pub decided_by: String,
    /// Their comment.
    pub comment: String,
    /// What a reject does.
    pub on_reject: OnReject,
    /// The arguments to dispatch (approved only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_args: Option<Value>,
    /// How an outcome review was resolved. With `happened` and `fail` the call's outcome is
    /// the `tool.completed` event that follows in the same transaction, not this event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<ReviewResolution>,
}

/// `approval.escalated`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalEscalated {
    /// The approval that timed out.
    pub approval_id: Uuid,
    /// Its call.
    pub call_id: String,
    /// The new approval.
    pub escalated_to: Uuid,
    /// Who decided (the timeout actor).
    pub decided_by: String,
    /// The comment.
    pub comment: String,
}

// ---------------------------------------------------------------------------------------------
// Agent lifecycle events (stream `agent:<namespace>/<name>`).

/// `agent.version_published`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentVersionPublished {
    /// The agent (created on first publish).
    pub agent_id: Uuid,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its owner.
    pub owner: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The new version.
    pub version_id: Uuid,
    /// Its label.
    pub version: String,
    /// The snapshot's content hash.
    pub content_hash: String,
    /// The snapshot text, byte for byte (it is what the content hash covers).
    pub snapshot_json: String,
}

/// `agent.deployed` and `agent.rolled_back`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentActivated {
    /// The agent.
    pub agent_id: Uuid,
    /// The new deployment.
    pub deployment_id: Uuid,
    /// The version now active.
    pub version_id: Uuid,
    /// Its label.
    pub version: String,
    /// The version active before, if any.
    pub previous_version_id: Option<Uuid>,
    /// Its label.
    pub previous_version: Option<String>,
    /// Where the activated version sends each of its secrets, computed by the server under its
    /// provider configuration at the time; `None` in events of builds before it was recorded
    /// (so they serialise, and hash, as they were written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_endpoints: Option<Vec<SecretEndpoint>>,
    /// The secrets this activation sends to an endpoint no earlier deployment of the agent used.
    /// Non-empty only when the deployer allowed it explicitly (`allow_new_secret_endpoints`);
    /// the server refuses such an activation otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_endpoint_changes: Vec<SecretEndpointChange>,
}

/// `agent.activation_refused`: a deploy or rollback the server refused because the version
/// would send secrets to endpoints no earlier deployment of the agent used, and the caller did
/// not allow it. Who tried is the event's actor; nothing else changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentActivationRefused {
    /// The agent.
    pub agent_id: Uuid,
    /// The version that was to be activated.
    pub version_id: Uuid,
    /// Its label.
    pub version: String,
    /// `deploy` or `rollback`.
    pub action: DeploymentAction,
    /// Each secret and the new endpoint it would have been sent to.
    pub changes: Vec<SecretEndpointChange>,
}

/// One secret of a deployed version and the endpoint its value is sent to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SecretEndpoint {
    /// The bundle member (its child name) that sends it; `None` for an agent's own deployment
    /// (and absent from its events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// `secrets.<name>`.
    pub secret: String,
    /// The environment variable the client reads its value from.
    pub from_env: String,
    /// The API root or server URL.
    pub endpoint: String,
}

/// What a deploy or rollback records about secrets ([`AgentActivated::secret_endpoints`] and
/// [`AgentActivated::secret_endpoint_changes`], or the same fields of [`BundleActivated`]); the
/// server computes it, the ledger stores it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretEndpointRecord {
    /// Where the activated version sends each secret.
    pub endpoints: Vec<SecretEndpoint>,
    /// The endpoints no earlier deployment used, allowed by the deployer.
    pub changes: Vec<SecretEndpointChange>,
}

/// A secret sent to an endpoint no earlier deployment of the agent (or bundle) sent it to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SecretEndpointChange {
    /// The bundle member (its child name) that sends it; `None` for an agent's own deployment
    /// (and absent from its events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// `secrets.<name>`.
    pub secret: String,
    /// The environment variable the client reads its value from.
    pub from_env: String,
    /// The new endpoint.
    pub endpoint: String,
    /// The endpoints earlier deployments sent this variable's value to (empty: none did).
    pub previous: Vec<String>,
}

/// `agent.version_deprecated` and `agent.version_retired`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentVersionChanged {
    /// The agent.
    pub agent_id: Uuid,
    /// The version.
    pub version_id: Uuid,
    /// Its label.
    pub version: String,
}

/// `agent.archived`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentArchived {
    /// The agent.
    pub agent_id: Uuid,
    /// The versions this archive deprecated.
    pub deprecated_version_ids: Vec<Uuid>,
    /// Their labels.
    pub deprecated_versions: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Bundle events (stream `bundle:<namespace>/<name>`).

/// `bundle.version_published`: everything the bundle projections are rebuilt from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleVersionPublished {
    /// The bundle (created on first publish).
    pub bundle_id: Uuid,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels (overwritten by every new version).
    pub labels: BTreeMap<String, String>,
    /// The new bundle version.
    pub version_id: Uuid,
    /// Its semver (`metadata.version`).
    pub version: String,
    /// The lock hash (`sha256:…`).
    pub lock_hash: String,
    /// The lock (`bundle.lock.json`) text, byte for byte.
    pub lock_json: String,
    /// The Bundle document as published, byte for byte.
    pub manifest_json: String,
    /// The root member's agent version.
    pub root_member_version_id: Uuid,
    /// Every member of the closure.
    pub members: Vec<BundleMemberPublished>,
}

/// One member of a [`BundleVersionPublished`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleMemberPublished {
    /// The member's name in the bundle (its `metadata.name`).
    pub child_name: String,
    /// Vendored or external.
    pub origin: BundleMemberOrigin,
    /// The ref recorded in the lock.
    pub reference: String,
    /// Whether it is the bundle's root.
    pub is_root: bool,
    /// Its agent version (for a vendored member: the version this event creates).
    pub version_id: Uuid,
    /// Its `metadata.namespace`.
    pub namespace: String,
    /// Its `metadata.name`.
    pub name: String,
    /// Its `metadata.version`.
    pub version: String,
    /// The content hash the lock recorded for it.
    pub lock_content_hash: String,
    /// The stored snapshot's content hash.
    pub content_hash: String,
    /// The stored snapshot (delegations pinned), byte for byte; vendored members only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_json: Option<String>,
}

/// `bundle.deployed` and `bundle.rolled_back`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleActivated {
    /// The bundle.
    pub bundle_id: Uuid,
    /// The new deployment.
    pub deployment_id: Uuid,
    /// The bundle version now active.
    pub version_id: Uuid,
    /// Its semver.
    pub version: String,
    /// Its lock hash.
    pub lock_hash: String,
    /// The bundle version active before, if any.
    pub previous_version_id: Option<Uuid>,
    /// Its semver.
    pub previous_version: Option<String>,
    /// Its lock hash.
    pub previous_lock_hash: Option<String>,
    /// Where the activated version's members send each of their secrets (each with its
    /// [`SecretEndpoint::member`]), computed by the server under its provider configuration at
    /// the time; `None` in events of builds before it was recorded (so they serialise, and
    /// hash, as they were written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_endpoints: Option<Vec<SecretEndpoint>>,
    /// The secrets this activation sends to an endpoint no earlier deployment of the bundle
    /// used. Non-empty only when the deployer allowed it explicitly
    /// (`allow_new_secret_endpoints`); the server refuses such an activation otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_endpoint_changes: Vec<SecretEndpointChange>,
}

/// `bundle.activation_refused`: a bundle deploy or rollback the server refused because a
/// member of the version would send secrets to endpoints no earlier deployment of the bundle
/// used, and the caller did not allow it. Who tried is the event's actor; nothing else changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleActivationRefused {
    /// The bundle.
    pub bundle_id: Uuid,
    /// The bundle version that was to be activated.
    pub version_id: Uuid,
    /// Its semver.
    pub version: String,
    /// Its lock hash.
    pub lock_hash: String,
    /// `deploy` or `rollback`.
    pub action: DeploymentAction,
    /// Each member's secret and the new endpoint it would have been sent to.
    pub changes: Vec<SecretEndpointChange>,
}

// ---------------------------------------------------------------------------------------------
// Token events (`tokens` stream). Neither carries the secret or its hash.

/// `token.created`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCreated {
    /// The token's name (the principal its requests are recorded as).
    pub name: String,
    /// Its roles.
    pub roles: Vec<String>,
    /// Its approval routes (empty: every route).
    pub routes: Vec<String>,
    /// Its tool patterns (`tool@version`).
    pub tools: Vec<String>,
    /// When it expires, if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

/// `token.revoked`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRevoked {
    /// The token's name.
    pub name: String,
}

// ---------------------------------------------------------------------------------------------
// Worker events (`workers` stream).

/// `worker.descriptor_refused`: a worker's registration was refused because of one handler's
/// `descriptor_hash` (the first refused handler; nothing of the registration was kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerDescriptorRefused {
    /// The worker id it registered with.
    pub worker_id: String,
    /// Its workload identity (for a verified worker, the credential's name).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workload_identity: String,
    /// Its self-asserted image digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    /// The verified credential that registered (e.g. `"refund-bot" (token)`); absent when
    /// nobody was verified (`local` mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_credential: Option<String>,
    /// The handler's tool.
    pub tool: String,
    /// The handler's version.
    pub version: String,
    /// The `descriptor_hash` it advertised (empty when none).
    pub received_hash: String,
    /// The pins published, non-retired agent versions hold for `tool@version` (empty when
    /// none, i.e. refused only because pins are required).
    pub expected_pins: Vec<String>,
    /// Identical refusals (same verified credential, tool, version and received hash) since
    /// the previous event for them that got no event of their own (the runtime writes one
    /// per minute per registration).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeated: u64,
    /// Refusals of any registration that got no event because the runtime's budget of
    /// refusal events was spent, since the previous event carrying such a count.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unrecorded_refusals: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// ---------------------------------------------------------------------------------------------
// Shadow decisions (`shadow:<namespace>/<name>` streams).

/// `webhook.retry_requested` (`webhooks` stream): an operator re-queued a failed webhook
/// delivery; the event's actor is who did it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookRetryRequested {
    /// The delivery re-queued (its id is the receiver's idempotency id).
    pub delivery_id: Uuid,
    /// The webhook it goes to.
    pub webhook: String,
    /// The notification kind (`approval.required`, …).
    pub kind: String,
    /// The stream of the event it notifies about.
    pub stream: String,
    /// That event's sequence number.
    pub seq: u64,
    /// The attempts made before the operator re-queued it.
    pub attempts: u64,
}

/// `webhook.unconfigured` (`webhooks` stream): at start-up, the pending deliveries of a webhook
/// the webhooks file no longer names were failed (they could never be sent); the event's actor
/// is the runtime (`system:webhooks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookUnconfigured {
    /// The webhook no longer configured.
    pub webhook: String,
    /// How many pending deliveries were failed.
    pub deliveries: u64,
    /// The reason recorded as each delivery's last error.
    pub reason: String,
}

/// `policy.shadow`: a `mode: shadow` policy would have changed the decision on one call; the call
/// went on as the enforced policies decided. The event's `call_id` column names the call too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyShadowed {
    /// The session of the call.
    pub session_id: String,
    /// The call.
    pub call_id: String,
    /// The agent whose policies decided, `namespace/name@version`.
    pub agent: String,
    /// The tool called (its dispatch ref).
    pub tool: String,
    /// `call_hash` of the call (session, call id, tool, version, arguments): the arguments are
    /// in the session's own log; this names exactly which ones were decided.
    pub args_digest: String,
    /// What the enforced policies decided.
    pub enforced: PolicyVerdict,
    /// The enforced decision's policy, `namespace/name@version` (absent for the default allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforced_policy: Option<String>,
    /// What the set would have decided with its shadow policies enforced.
    pub shadow: PolicyVerdict,
    /// The shadow policy responsible, `namespace/name@version`.
    pub policy: String,
    /// The shadow decision's deny message or approval reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Audit events (`audit` stream), written by the ledger with the audit key.

/// `audit.key_introduced`: the log was sealed with the key `key_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditKeyIntroduced {
    /// The key's non-secret id (`AuditKey::key_id`).
    pub key_id: String,
    /// Why it was sealed (first start with the key, or a re-seal after an override).
    pub reason: String,
    /// Streams sealed.
    pub streams: u64,
    /// Events in them.
    pub events: u64,
    /// Hex SHA-256 over `stream\nseq\nhash\n` of every sealed head, in stream order.
    pub heads_digest: String,
    /// The first heads sealed (at most 1000; the digest covers all).
    pub heads: Vec<SealedHead>,
    /// Whether `heads` lists every sealed head.
    pub heads_listed_all: bool,
    /// Sealed heads dropped because their stream no longer existed.
    pub dropped_heads: u64,
    /// Whether the stream set (`stream_set`: count and digest of the streams, MACed) was
    /// sealed too; absent (`false`) in events of builds before migration 0007.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream_set_sealed: bool,
    /// The number of shards the stream set was sealed in (`stream_set_shards`); absent (`0`)
    /// in events of builds before migration 0024, which sealed it in one row (`stream_set`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stream_set_shards: u64,
}

/// One head listed in [`AuditKeyIntroduced::heads`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedHead {
    /// The stream.
    pub stream: String,
    /// Its last seq.
    pub seq: i64,
    /// Its last event's hash.
    pub hash: String,
}

/// `audit.unverified_log_allowed`: the daemon served a log that failed its start-up check.
/// `stream` and `seq` are stored as `null` when the problem named none (as first written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditUnverifiedLogAllowed {
    /// The problem, as the start-up check named it.
    pub problem: String,
    /// Its kind (`AuditProblemKind`, debug form).
    pub kind: String,
    /// The stream it was in.
    pub stream: Option<String>,
    /// The first bad seq.
    pub seq: Option<u64>,
    /// Who allowed it.
    pub allowed_by: String,
    /// Whether missing append-only triggers were restored.
    pub triggers_restored: bool,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn output_checks_are_typed_events_that_round_trip() {
        let invalid = EventBody::OutputInvalid(OutputInvalid {
            turn: 1,
            attempt: 1,
            errors: vec!["/: \"status\" is a required property".into()],
            on_invalid: OutputAction::Retry,
            action: OutputAction::Retry,
            feedback: Some("Answer again.".into()),
        });
        let payload = invalid.payload().unwrap();
        assert_eq!(payload["on_invalid"], "retry");
        assert_eq!(payload["action"], "retry");
        assert_eq!(
            EventBody::decode("s", 4, "output.invalid", &payload).unwrap(),
            invalid
        );
        let accepted = EventBody::OutputAccepted(OutputAccepted {
            turn: 2,
            attempt: 2,
            output: json!({"status": "issued"}),
            approval_id: None,
            accepted_by: None,
        });
        let payload = accepted.payload().unwrap();
        assert_eq!(
            payload,
            json!({"turn": 2, "attempt": 2, "output": {"status": "issued"}}),
            "no approval fields unless a human accepted it"
        );
        assert_eq!(
            EventBody::decode("s", 5, "output.accepted", &payload).unwrap(),
            accepted
        );
        let wrong =
            json!({"turn": 1, "attempt": 1, "errors": [], "on_invalid": "shrug", "action": "fail"});
        assert!(matches!(
            EventBody::decode("s", 6, "output.invalid", &wrong),
            Err(LedgerError::BadEvent { .. })
        ));
    }

    #[test]
    fn every_known_type_round_trips_its_payload() {
        let body = EventBody::ToolCancelled(ToolCancelled {
            call_id: "c".into(),
            from: CallStatus::Pending,
            reason: "session ended".into(),
            after_dispatch: false,
        });
        let payload = body.payload().unwrap();
        assert_eq!(
            payload,
            json!({"call_id": "c", "from": "pending", "reason": "session ended"}),
            "a false after_dispatch is omitted, as before"
        );
        let back = EventBody::decode("s", 3, "tool.cancelled", &payload).unwrap();
        assert_eq!(back, body);
        assert_eq!(back.event_type(), "tool.cancelled");
        for t in KNOWN_TYPES {
            let err = EventBody::decode("s", 1, t, &json!("not an object")).unwrap_err();
            assert!(matches!(err, LedgerError::BadEvent { .. }), "{t}: {err}");
        }
    }

    #[test]
    fn an_unknown_type_is_an_error_naming_stream_seq_and_type() {
        let err = EventBody::decode("sess-1", 7, "tool.teleported", &json!({})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ledger data is corrupt: stream sess-1 seq 7: event type tool.teleported: unknown \
             event type"
        );
    }

    #[test]
    fn a_payload_of_the_wrong_shape_is_an_error_naming_the_field() {
        let err = EventBody::decode(
            "sess-1",
            4,
            "message.user",
            &json!({"role": "user", "text": "renamed"}),
        )
        .unwrap_err();
        let LedgerError::BadEvent {
            stream,
            seq,
            event_type,
            problem,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!((stream.as_str(), *seq), ("sess-1", 4));
        assert_eq!(event_type, "message.user");
        assert!(problem.contains("missing field `content`"), "{problem}");
        let err = EventBody::decode(
            "sess-1",
            5,
            "approval.vote",
            &json!({"approval_id": "not-a-uuid"}),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("seq 5: event type approval.vote: payload")
        );
    }

    #[test]
    fn the_assistant_segment_omits_what_it_lacks() {
        let body = EventBody::MessageAssistant(AssistantSegment {
            role: MessageRole::Assistant,
            content: "hi".into(),
            stop_reason: None,
            turn_usage: None,
            turn_duration_ms: None,
        });
        assert_eq!(
            body.payload().unwrap(),
            json!({"role": "assistant", "content": "hi"})
        );
    }

    #[test]
    fn a_deploy_event_of_an_earlier_build_keeps_its_payload_and_a_new_one_records_the_endpoints() {
        let old = json!({
            "agent_id": "00000000-0000-0000-0000-000000000001",
            "deployment_id": "00000000-0000-0000-0000-000000000002",
            "version_id": "00000000-0000-0000-0000-000000000003",
            "version": "1.0.0",
            "previous_version_id": null,
            "previous_version": null
        });
        let body = EventBody::decode("agent:n/a", 2, "agent.deployed", &old).unwrap();
        assert_eq!(body.payload().unwrap(), old, "re-encodes byte for byte");
        let EventBody::AgentDeployed(mut activated) = body else {
            panic!("decoded as {body:?}");
        };
        activated.secret_endpoints = Some(vec![SecretEndpoint {
            member: None,
            secret: "openai".into(),
            from_env: "OPENAI_API_KEY".into(),
            endpoint: "http://b.example/v1".into(),
        }]);
        activated.secret_endpoint_changes = vec![SecretEndpointChange {
            member: None,
            secret: "openai".into(),
            from_env: "OPENAI_API_KEY".into(),
            endpoint: "http://b.example/v1".into(),
            previous: vec!["http://a.example/v1".into()],
        }];
        let body = EventBody::AgentRolledBack(activated);
        let payload = body.payload().unwrap();
        assert_eq!(
            payload["secret_endpoint_changes"][0]["previous"],
            json!(["http://a.example/v1"])
        );
        assert_eq!(
            EventBody::decode("agent:n/a", 3, "agent.rolled_back", &payload).unwrap(),
            body
        );
        assert!(
            payload["secret_endpoints"][0].get("member").is_none(),
            "an agent's endpoints name no member: {payload}"
        );
    }

    #[test]
    fn a_bundle_event_of_an_earlier_build_keeps_its_payload_and_a_new_one_names_the_members() {
        let earlier = json!({
            "bundle_id": "00000000-0000-0000-0000-00000000000b",
            "deployment_id": "00000000-0000-0000-0000-00000000000d",
            "version_id": "00000000-0000-0000-0000-00000000000e",
            "version": "1.0.0",
            "lock_hash": "sha256:01",
            "previous_version_id": null,
            "previous_version": null,
            "previous_lock_hash": null
        });
        let decoded = EventBody::decode("bundle:n/b", 2, "bundle.rolled_back", &earlier).unwrap();
        assert_eq!(
            decoded.payload().unwrap(),
            earlier,
            "hashes as it was written"
        );
        let EventBody::BundleRolledBack(mut activation) = decoded else {
            panic!("decoded as {decoded:?}");
        };
        assert_eq!(activation.secret_endpoints, None);
        let sent = |endpoint: &str| SecretEndpoint {
            member: Some("front-desk".into()),
            secret: "openai".into(),
            from_env: "OPENAI_API_KEY".into(),
            endpoint: endpoint.into(),
        };
        activation.secret_endpoints = Some(vec![sent("http://b.example/v1")]);
        let refused = EventBody::BundleActivationRefused(BundleActivationRefused {
            bundle_id: activation.bundle_id,
            version_id: activation.version_id,
            version: activation.version.clone(),
            lock_hash: activation.lock_hash.clone(),
            action: DeploymentAction::Deploy,
            changes: vec![SecretEndpointChange {
                member: Some("front-desk".into()),
                secret: "openai".into(),
                from_env: "OPENAI_API_KEY".into(),
                endpoint: "http://b.example/v1".into(),
                previous: vec!["http://a.example/v1".into()],
            }],
        });
        for (seq, body) in [(3, EventBody::BundleDeployed(activation)), (4, refused)] {
            let payload = body.payload().unwrap();
            let member = payload
                .get("secret_endpoints")
                .or_else(|| payload.get("changes"))
                .map(|list| list[0]["member"].clone());
            assert_eq!(member, Some(json!("front-desk")), "{payload}");
            assert_eq!(
                EventBody::decode("bundle:n/b", seq, body.event_type(), &payload).unwrap(),
                body
            );
        }
    }
}
