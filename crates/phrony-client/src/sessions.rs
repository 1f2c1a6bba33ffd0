//! Sessions: start one (`RunSession`), list them (`ListSessions`), inspect one with its
//! delegation tree and merged timeline (`InspectSession`), cancel or complete it.
//!
//! JSON documents come back as [`serde_json::Value`]s: the session input, tool arguments and
//! results, event payloads. Secrets travel only in [`RunSession::secrets`], whose `Debug` output
//! never shows the values.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use phrony_proto::runtime::v1 as pb;
use serde_json::Value;

use super::approvals::{Approval, approval_from_inspect};
use super::types::{optional, optional_timestamp, page_size, timestamp};
use super::{AgentName, Client, ClientError, with_actor};

/// How a new session behaves once a turn ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SessionMode {
    /// Run to completion: the session is `completed` when its turn ends (the default).
    #[default]
    Task,
    /// A conversation: after each turn the session waits at `awaiting_input` for the next user
    /// message, until it is completed or cancelled.
    Conversation,
}

impl SessionMode {
    /// `task` or `conversation`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Task => "task",
            Self::Conversation => "conversation",
        }
    }

    fn to_pb(self) -> pb::SessionMode {
        match self {
            Self::Task => pb::SessionMode::Task,
            Self::Conversation => pb::SessionMode::Conversation,
        }
    }

    /// `None` when the runtime did not say (a runtime that predates modes).
    fn from_pb(mode: i32) -> Option<Self> {
        match pb::SessionMode::try_from(mode) {
            Ok(pb::SessionMode::Task) => Some(Self::Task),
            Ok(pb::SessionMode::Conversation) => Some(Self::Conversation),
            Ok(pb::SessionMode::Unspecified) | Err(_) => None,
        }
    }
}

impl fmt::Display for SessionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `namespace/name@version`: the agent or bundle version a session runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedName {
    /// The agent or bundle.
    pub name: AgentName,
    /// The version label (a bundle's may be a `sha256:` lock hash).
    pub version: String,
}

impl fmt::Display for VersionedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        if !self.version.is_empty() {
            write!(f, "@{}", self.version)?;
        }
        Ok(())
    }
}

/// What a session runs: an agent, or a bundle (its root member).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RunTarget {
    /// [`RunSession::agent`] names an agent (sent as `agent_ref`).
    #[default]
    Agent,
    /// [`RunSession::agent`] names a bundle (sent as `bundle_ref`); its version may be a
    /// `sha256:` lock hash.
    Bundle,
}

/// What [`Client::run_session`] starts.
#[derive(Clone, PartialEq, Eq)]
pub struct RunSession {
    /// The agent (or, with [`RunTarget::Bundle`], the bundle); its active deployment runs.
    pub agent: AgentName,
    /// Whether `agent` names an agent or a bundle.
    pub target: RunTarget,
    /// When set, the version that must be the active deployment.
    pub version: Option<String>,
    /// The session input (the runtime expects an object or a string; `None` sends `{}`).
    pub input: Option<Value>,
    /// The resolved secret values, by the secret names the manifest declares.
    pub secrets: BTreeMap<String, String>,
    /// Caller-defined labels stored with the session.
    pub metadata: BTreeMap<String, String>,
    /// Task (default) or conversation.
    pub mode: SessionMode,
}

impl RunSession {
    /// A task session of the active deployment of `agent`, without input, secrets or metadata.
    #[must_use]
    pub fn new(agent: AgentName) -> Self {
        Self {
            agent,
            target: RunTarget::Agent,
            version: None,
            input: None,
            secrets: BTreeMap::new(),
            metadata: BTreeMap::new(),
            mode: SessionMode::Task,
        }
    }

    /// A task session of the active deployment of the bundle `bundle`, without input, secrets
    /// or metadata.
    #[must_use]
    pub fn bundle(bundle: AgentName) -> Self {
        Self {
            target: RunTarget::Bundle,
            ..Self::new(bundle)
        }
    }

    pub(super) fn to_pb(&self) -> pb::RunSessionRequest {
        let version = self.version.as_deref().unwrap_or_default();
        let (agent_ref, bundle_ref) = match self.target {
            RunTarget::Agent => (Some(self.agent.to_pb(version)), None),
            RunTarget::Bundle => (None, Some(self.agent.to_bundle_pb(version))),
        };
        pb::RunSessionRequest {
            agent_ref,
            input: self
                .input
                .as_ref()
                .map(|v| v.to_string().into_bytes())
                .unwrap_or_default(),
            resolved_secrets: self
                .secrets
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                .collect(),
            bundle_ref,
            metadata: self.metadata.clone().into_iter().collect(),
            mode: self.mode.to_pb().into(),
        }
    }
}

impl fmt::Debug for RunSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunSession")
            .field("agent", &self.agent)
            .field("target", &self.target)
            .field("version", &self.version)
            .field("input", &self.input)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .field("metadata", &self.metadata)
            .field("mode", &self.mode)
            .finish()
    }
}

/// A session [`Client::run_session`] started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedSession {
    /// The new session's id (`run_…`).
    pub session_id: String,
    /// The id of the agent version it runs.
    pub agent_version_id: String,
    /// Its status right after creation (normally `running`).
    pub status: String,
}

/// Which sessions [`Client::list_sessions`] returns; every set filter must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// Sessions of this agent…
    pub agent: Option<AgentName>,
    /// …of this version of it.
    pub version: Option<String>,
    /// Exact status, e.g. `awaiting_approval`.
    pub status: Option<String>,
    /// Sessions whose metadata holds every one of these pairs.
    pub metadata: BTreeMap<String, String>,
    /// Also list delegated child sessions.
    pub include_children: bool,
    /// At most this many sessions (`None`: the runtime's default).
    pub limit: Option<u32>,
    /// The `next_page_token` of a previous page with the same filters.
    pub page_token: Option<String>,
}

/// One session in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    /// The session id.
    pub id: String,
    /// `agent` or `bundle`.
    pub kind: String,
    /// The status, e.g. `running`, `awaiting_approval`, `completed`.
    pub status: String,
    /// The agent version it runs.
    pub agent: Option<VersionedName>,
    /// The bundle it was started from.
    pub bundle: Option<VersionedName>,
    /// The id of the agent version it runs.
    pub agent_version_id: String,
    /// The id of the bundle version it was started from.
    pub bundle_version_id: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Its caller-defined labels.
    pub metadata: BTreeMap<String, String>,
    /// Its mode, when the runtime reports one.
    pub mode: Option<SessionMode>,
    /// Who started it, when the runtime reports it.
    pub started_by: Option<Starter>,
}

/// Who started a session, as the runtime recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Starter {
    /// The recorded actor.
    pub actor: String,
    /// How the runtime established it (`unverified`, `token`, `oidc`, `mtls`); `None` when not
    /// recorded (sessions recorded before attribution existed, or older servers).
    pub verification: Option<String>,
    /// The principal that relayed the starter, if any.
    pub via: Option<String>,
}

impl Starter {
    /// `None` for an empty actor (an older server, or a session the runtime started itself
    /// without naming anyone).
    fn from_pb(actor: String, verification: String, via: String) -> Option<Self> {
        if actor.is_empty() {
            return None;
        }
        Some(Self {
            actor,
            verification: optional(verification),
            via: optional(via),
        })
    }
}

/// As a person reads it ([`crate::display_actor`]): `emad`, `emad (unverified)`,
/// `alice via approvals-ui`.
impl std::fmt::Display for Starter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::approvals::display_actor(
            &self.actor,
            self.verification.as_deref(),
            self.via.as_deref(),
        ))
    }
}

impl SessionSummary {
    /// What the session runs: the bundle for bundle sessions, else the agent version.
    #[must_use]
    pub fn target(&self) -> Option<&VersionedName> {
        if self.kind == "bundle" {
            self.bundle.as_ref().or(self.agent.as_ref())
        } else {
            self.agent.as_ref().or(self.bundle.as_ref())
        }
    }

    /// Whether a user message can continue it (it waits at `awaiting_input`).
    #[must_use]
    pub fn resumable(&self) -> bool {
        self.status == "awaiting_input"
    }
}

/// One page of [`Client::list_sessions`], most recently updated first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPage {
    /// The sessions.
    pub sessions: Vec<SessionSummary>,
    /// Pass as [`SessionFilter::page_token`] for the next page; `None` on the last one.
    pub next_page_token: Option<String>,
}

/// Token counts of a turn or a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Input tokens.
    pub input_tokens: i32,
    /// Output tokens.
    pub output_tokens: i32,
    /// Total tokens.
    pub total_tokens: i32,
    /// True when estimated rather than reported by the provider.
    pub estimated: bool,
}

/// One turn of a session's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSummary {
    /// Why the model stopped.
    pub stop_reason: String,
    /// The turn's usage.
    pub usage: Option<TokenUsage>,
    /// How long the turn took.
    pub duration_ms: i64,
}

/// A session's output, folded from its assistant messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOutput {
    /// The last assistant message.
    pub message: String,
    /// Why the model stopped last.
    pub stop_reason: String,
    /// The last turn's usage.
    pub turn_usage: Option<TokenUsage>,
    /// The usage summed over the session.
    pub session_usage: Option<TokenUsage>,
    /// Every turn.
    pub turns: Vec<TurnSummary>,
    /// With the agent's `output.format: json`: the accepted output. `None` for free-text
    /// output, before the output is accepted, and when the runtime shortened it (then
    /// [`SessionDetail::truncation`]`("output.json")` names the payload to fetch whole), and
    /// when the runtime sent text that does not parse.
    pub json: Option<serde_json::Value>,
}

/// The agent a session runs, with its model and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionAgent {
    /// The agent version.
    pub agent: VersionedName,
    /// The model provider (`openai`, `stub`…).
    pub model_provider: String,
    /// The model name.
    pub model_name: String,
    /// `spec.limits.max_tokens_per_run` (0 = unlimited).
    pub max_tokens_per_run: i32,
    /// `spec.limits.max_wall_clock_seconds` (0 = unlimited).
    pub max_wall_clock_seconds: i32,
}

/// A session and, recursively, its delegated children (`InspectSession`).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionDetail {
    /// The session id.
    pub id: String,
    /// The status.
    pub status: String,
    /// The parent session of a delegated child.
    pub parent_session_id: Option<String>,
    /// 0 for a root session, +1 per delegation level.
    pub depth: i32,
    /// The id of the agent version it runs.
    pub agent_version_id: String,
    /// The id of the bundle version it was started from.
    pub bundle_version_id: Option<String>,
    /// The agent, model and limits.
    pub agent: Option<SessionAgent>,
    /// When it was created.
    pub created_at: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
    /// When it started running.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// The session input.
    pub input: Value,
    /// The output folded so far.
    pub output: Option<SessionOutput>,
    /// The failure message of a failed session.
    pub error: Option<String>,
    /// The evidence snapshot.
    pub descriptive_metadata: Value,
    /// The caller-defined labels.
    pub metadata: BTreeMap<String, String>,
    /// The mode, when reported.
    pub mode: Option<SessionMode>,
    /// Who started it, when the runtime reports it.
    pub started_by: Option<Starter>,
    /// Delegated child sessions.
    pub children: Vec<SessionDetail>,
    /// The fields the runtime shortened (`input`, `output.message`…).
    pub truncated: Vec<TruncatedPayload>,
}

/// Where a payload that inspection shortened is read whole ([`Client::session_payload`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PayloadRef {
    /// The session whose record holds it.
    pub session_id: String,
    /// The event's seq (0: not an event).
    pub seq: u64,
    /// The tool call.
    pub call_id: Option<String>,
    /// The approval.
    pub approval_id: Option<String>,
    /// The record's field (`input`, `payload`, `result`, `effective_args`…).
    pub field: String,
}

impl PayloadRef {
    fn to_pb(&self) -> pb::PayloadRef {
        pb::PayloadRef {
            session_id: self.session_id.clone(),
            seq: i64::try_from(self.seq).unwrap_or(i64::MAX),
            call_id: self.call_id.clone().unwrap_or_default(),
            approval_id: self.approval_id.clone().unwrap_or_default(),
            field: self.field.clone(),
        }
    }
}

/// A payload field the runtime shortened in an inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncatedPayload {
    /// The field, relative to its entry (`event.payload`, `invocation.result`…) or session
    /// (`input`, `output.message`).
    pub field: String,
    /// The length of its whole JSON text, in bytes.
    pub size_bytes: u64,
    /// Where to read it whole.
    pub reference: PayloadRef,
}

impl TruncatedPayload {
    fn from_pb(t: pb::TruncatedPayload) -> Self {
        let r = t.r#ref.unwrap_or_default();
        Self {
            field: t.field,
            size_bytes: u64::try_from(t.size_bytes).unwrap_or(0),
            reference: PayloadRef {
                session_id: r.session_id,
                seq: u64::try_from(r.seq).unwrap_or(0),
                call_id: optional(r.call_id),
                approval_id: optional(r.approval_id),
                field: r.field,
            },
        }
    }
}

/// One event of a session's event log.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEvent {
    /// The event's id.
    pub id: i64,
    /// The event type, e.g. `session.started`.
    pub event_type: String,
    /// The payload.
    pub payload: Value,
    /// The per-session sequence number.
    pub seq: i32,
    /// The session it belongs to.
    pub session_id: String,
    /// The turn, when the event belongs to one.
    pub turn: i32,
    /// The tool call it is about.
    pub call_id: Option<String>,
    /// Who caused it: `system`, `user`, `agent`, `policy`, `worker`, or a voter's actor id.
    pub actor: String,
    /// How the runtime established `actor` (`unverified`, `token`, `oidc`, `mtls`); `None`
    /// for the runtime's own actors and older records.
    pub actor_verification: Option<String>,
    /// The principal that relayed `actor`, if any.
    pub actor_via: Option<String>,
}

impl SessionEvent {
    /// The actor as a person reads it ([`crate::display_actor`]).
    #[must_use]
    pub fn actor_display(&self) -> String {
        crate::approvals::display_actor(
            &self.actor,
            self.actor_verification.as_deref(),
            self.actor_via.as_deref(),
        )
    }
}

/// One tool invocation from the dispatch ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInvocation {
    /// The call id.
    pub call_id: String,
    /// The tool's dispatch ref.
    pub tool: String,
    /// The tool version.
    pub version: String,
    /// The turn it belongs to.
    pub turn: i32,
    /// The arguments.
    pub args: Value,
    /// The result (`null` until one arrived).
    pub result: Value,
    /// The ledger status.
    pub status: String,
    /// The worker that ran it.
    pub worker_identity: Option<String>,
    /// The attempt number.
    pub attempt: i32,
    /// The error code of a failed call.
    pub error_code: Option<String>,
    /// The error message of a failed call.
    pub error_message: Option<String>,
    /// Time spent waiting for a worker.
    pub queue_delay_ms: i64,
    /// Time spent running on it.
    pub execution_duration_ms: i64,
}

/// What a timeline entry is about.
#[derive(Debug, Clone, PartialEq)]
pub enum TimelineDetail {
    /// An event of the log.
    Event(SessionEvent),
    /// A tool invocation milestone.
    Invocation(ToolInvocation),
    /// An approval milestone.
    Approval(Box<Approval>),
    /// Nothing beyond the summary.
    None,
}

/// One entry of a session tree's merged, chronological timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineEntry {
    /// When it happened.
    pub timestamp: Option<DateTime<Utc>>,
    /// Milliseconds since the previous entry.
    pub gap_ms: i64,
    /// `event`, `invocation` or `approval`.
    pub source: String,
    /// The event type or milestone (`approval_decided`…).
    pub kind: String,
    /// A one-line description.
    pub summary: String,
    /// The session of the tree it belongs to.
    pub session_id: String,
    /// That session's depth (0 = root).
    pub depth: i32,
    /// The event's seq in its session's stream (0 for call and approval milestones).
    pub seq: i32,
    /// The details.
    pub detail: TimelineDetail,
    /// The payload fields of the details the runtime shortened (`event.payload`…).
    pub truncated: Vec<TruncatedPayload>,
}

impl TimelineEntry {
    /// The shortened field `field` (as named in [`TruncatedPayload::field`]), if it was.
    #[must_use]
    pub fn truncation(&self, field: &str) -> Option<&TruncatedPayload> {
        self.truncated.iter().find(|t| t.field == field)
    }
}

impl SessionDetail {
    /// The shortened field `field` (`input`, `output.message`…), if it was.
    #[must_use]
    pub fn truncation(&self, field: &str) -> Option<&TruncatedPayload> {
        self.truncated.iter().find(|t| t.field == field)
    }
}

/// A session tree and its timeline (`InspectSession`).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInspection {
    /// The session and its children.
    pub session: SessionDetail,
    /// Everything that happened in the tree, oldest first.
    pub timeline: Vec<TimelineEntry>,
}

impl Client {
    /// Starts a detached session (`RunSession`); the first turn runs in the background.
    ///
    /// # Errors
    /// `FailedPrecondition` when nothing runnable is deployed (or `version` is not the active
    /// deployment), `InvalidArgument` for bad input or a secret set that differs from the
    /// declared one, `NotFound` for an unknown agent; [`ClientError::InvalidActor`] is never
    /// returned (the actor travels best-effort); any other [`ClientError`].
    pub async fn run_session(
        &self,
        run: &RunSession,
        actor: &str,
    ) -> Result<StartedSession, ClientError> {
        let response = self
            .runtime
            .clone()
            .run_session(with_actor(run.to_pb(), actor))
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok(StartedSession {
            session_id: response.session_id,
            agent_version_id: response.agent_version_id,
            status: response.status,
        })
    }

    /// One page of sessions matching `filter`, most recently updated first (`ListSessions`).
    ///
    /// # Errors
    /// `NotFound` for an unknown agent, `InvalidArgument` for a bad page token; any other
    /// [`ClientError`].
    pub async fn list_sessions(&self, filter: &SessionFilter) -> Result<SessionPage, ClientError> {
        let request = pb::ListSessionsRequest {
            agent_ref: filter
                .agent
                .as_ref()
                .map(|a| a.to_pb(filter.version.as_deref().unwrap_or_default())),
            status: filter.status.clone().unwrap_or_default(),
            include_children: filter.include_children,
            bundle_ref: None,
            kind: String::new(),
            metadata: filter.metadata.clone().into_iter().collect(),
            page_size: page_size(filter.limit),
            page_token: filter.page_token.clone().unwrap_or_default(),
        };
        let response = self
            .runtime
            .clone()
            .list_sessions(request)
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok(SessionPage {
            sessions: response
                .sessions
                .into_iter()
                .map(session_summary)
                .collect::<Result<_, _>>()?,
            next_page_token: optional(response.next_page_token),
        })
    }

    /// A session, its delegation tree and its merged timeline (`InspectSession`), every page
    /// of it: the runtime keeps each response under 3 MiB, shortening long payloads (see
    /// [`TruncatedPayload`] and [`Client::session_payload`]).
    ///
    /// # Errors
    /// `NotFound` for an unknown session; any other [`ClientError`].
    pub async fn inspect_session(
        &self,
        session_id: &str,
    ) -> Result<SessionInspection, ClientError> {
        self.inspect_session_paged(session_id, 0).await
    }

    /// [`inspect_session`](Self::inspect_session) asking for at most `page_size` entries per
    /// response (0: as many as fit).
    ///
    /// # Errors
    /// As [`inspect_session`](Self::inspect_session).
    pub async fn inspect_session_paged(
        &self,
        session_id: &str,
        page_size: u32,
    ) -> Result<SessionInspection, ClientError> {
        const RPC: &str = "InspectSession";
        let mut session = None;
        let mut timeline = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = pb::InspectSessionRequest {
                session_id: session_id.to_owned(),
                page_size: page_size.try_into().unwrap_or(i32::MAX),
                page_token: page_token.clone(),
            };
            let response = self
                .runtime
                .clone()
                .inspect_session(request)
                .await
                .map_err(|s| self.status(&s))?
                .into_inner();
            if session.is_none() {
                let tree = response
                    .session
                    .ok_or_else(|| ClientError::invalid_response(RPC, "the session is missing"))?;
                session = Some(session_detail(tree)?);
            }
            if response.timeline.is_empty() && !response.next_page_token.is_empty() {
                return Err(ClientError::invalid_response(
                    RPC,
                    "a page without entries points to a next page",
                ));
            }
            for entry in response.timeline {
                timeline.push(timeline_entry(entry)?);
            }
            if response.next_page_token.is_empty() {
                break;
            }
            page_token = response.next_page_token;
        }
        let session =
            session.ok_or_else(|| ClientError::invalid_response(RPC, "the session is missing"))?;
        Ok(SessionInspection { session, timeline })
    }

    /// A payload that an inspection shortened, whole: its compact JSON text
    /// (`GetSessionPayload`, streamed in chunks).
    ///
    /// # Errors
    /// `NotFound` for an unknown session or record, `InvalidArgument` for an unknown field;
    /// [`ClientError::InvalidResponse`] when the chunks do not add up; any other
    /// [`ClientError`].
    pub async fn session_payload(&self, reference: &PayloadRef) -> Result<Vec<u8>, ClientError> {
        const RPC: &str = "GetSessionPayload";
        let mut stream = self
            .runtime
            .clone()
            .get_session_payload(pb::GetSessionPayloadRequest {
                r#ref: Some(reference.to_pb()),
            })
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        let mut text = Vec::new();
        let mut total = None;
        while let Some(chunk) = stream.message().await.map_err(|s| self.status(&s))? {
            if usize::try_from(chunk.offset).ok() != Some(text.len()) {
                return Err(ClientError::invalid_response(
                    RPC,
                    format!(
                        "a chunk starts at byte {} after {} bytes",
                        chunk.offset,
                        text.len()
                    ),
                ));
            }
            total = Some(chunk.total_bytes);
            text.extend_from_slice(&chunk.data);
        }
        let expected = total.ok_or_else(|| ClientError::invalid_response(RPC, "no chunk"))?;
        if usize::try_from(expected).ok() != Some(text.len()) {
            return Err(ClientError::invalid_response(
                RPC,
                format!("{} of {expected} bytes arrived", text.len()),
            ));
        }
        Ok(text)
    }

    /// Cancels a non-terminal session (`CancelSession`).
    ///
    /// # Errors
    /// `NotFound` for an unknown or already ended session; any other [`ClientError`].
    pub async fn cancel_session(&self, session_id: &str, actor: &str) -> Result<(), ClientError> {
        let request = pb::CancelSessionRequest {
            session_id: session_id.to_owned(),
        };
        self.runtime
            .clone()
            .cancel_session(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?;
        Ok(())
    }

    /// Completes a non-terminal session (`CompleteSession`).
    ///
    /// # Errors
    /// `NotFound` for an unknown or already ended session; any other [`ClientError`].
    pub async fn complete_session(&self, session_id: &str, actor: &str) -> Result<(), ClientError> {
        let request = pb::CompleteSessionRequest {
            session_id: session_id.to_owned(),
        };
        self.runtime
            .clone()
            .complete_session(with_actor(request, actor))
            .await
            .map_err(|s| self.status(&s))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Wire → client values

/// A decoded `google.protobuf.Value` as JSON (`null` when unset).
pub(super) fn json_value(value: Option<prost_types::Value>) -> Value {
    use prost_types::value::Kind;
    let Some(kind) = value.and_then(|v| v.kind) else {
        return Value::Null;
    };
    match kind {
        Kind::NullValue(_) => Value::Null,
        Kind::NumberValue(n) => json_number(n),
        Kind::StringValue(s) => Value::String(s),
        Kind::BoolValue(b) => Value::Bool(b),
        Kind::StructValue(s) => Value::Object(
            s.fields
                .into_iter()
                .map(|(k, v)| (k, json_value(Some(v))))
                .collect(),
        ),
        Kind::ListValue(l) => {
            Value::Array(l.values.into_iter().map(|v| json_value(Some(v))).collect())
        }
    }
}

/// A protobuf number as JSON: integral values stay integers (`400`, not `400.0`).
fn json_number(n: f64) -> Value {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "only taken when the value is integral and within i64's exactly representable range"
    )]
    let as_int = n as i64;
    if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 {
        Value::from(as_int)
    } else {
        serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)
    }
}

/// A JSON document sent as UTF-8 bytes (`null` when empty).
pub(super) fn json_bytes(
    rpc: &'static str,
    field: &str,
    bytes: &[u8],
) -> Result<Value, ClientError> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ClientError::invalid_response(rpc, format!("{field} is not JSON: {e}")))
}

fn versioned(namespace: String, name: String, version: String) -> Option<VersionedName> {
    (!namespace.is_empty() || !name.is_empty()).then(|| VersionedName {
        name: AgentName::new(namespace, name),
        version,
    })
}

fn session_summary(s: pb::SessionSummary) -> Result<SessionSummary, ClientError> {
    const RPC: &str = "ListSessions";
    Ok(SessionSummary {
        created_at: timestamp(RPC, "created_at", &s.created_at)?,
        updated_at: timestamp(RPC, "updated_at", &s.updated_at)?,
        agent: s
            .agent_ref
            .and_then(|r| versioned(r.namespace, r.name, r.version)),
        bundle: s
            .bundle_ref
            .and_then(|r| versioned(r.namespace, r.name, r.version)),
        kind: if s.kind.is_empty() {
            "agent".to_owned()
        } else {
            s.kind
        },
        id: s.id,
        status: s.status,
        agent_version_id: s.agent_version_id,
        bundle_version_id: optional(s.bundle_version_id),
        metadata: s.metadata.into_iter().collect(),
        mode: SessionMode::from_pb(s.mode),
        started_by: Starter::from_pb(s.started_by, s.started_by_verification, s.started_by_via),
    })
}

fn usage(u: Option<pb::TokenUsage>) -> Option<TokenUsage> {
    u.map(|u| TokenUsage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        total_tokens: u.total_tokens,
        estimated: u.estimated,
    })
}

/// Unix milliseconds; 0 (or less) means unset.
pub(super) fn unix_ms(ms: i64) -> Option<DateTime<Utc>> {
    (ms > 0)
        .then(|| DateTime::from_timestamp_millis(ms))
        .flatten()
}

fn session_detail(s: pb::SessionInspect) -> Result<SessionDetail, ClientError> {
    const RPC: &str = "InspectSession";
    Ok(SessionDetail {
        created_at: optional_timestamp(RPC, "created_at", &s.created_at)?,
        updated_at: optional_timestamp(RPC, "updated_at", &s.updated_at)?,
        started_at: unix_ms(s.session_started_at_unix_ms),
        ended_at: unix_ms(s.session_ended_at_unix_ms),
        agent: s.agent.map(|a| SessionAgent {
            agent: VersionedName {
                name: AgentName::new(a.namespace, a.name),
                version: a.version,
            },
            model_provider: a.model_provider,
            model_name: a.model_name,
            max_tokens_per_run: a.max_tokens_per_run,
            max_wall_clock_seconds: a.max_wall_clock_seconds,
        }),
        output: s.output.map(|o| SessionOutput {
            json: (!o.json.is_empty())
                .then(|| serde_json::from_str(&o.json).ok())
                .flatten(),
            message: o.message,
            stop_reason: o.stop_reason,
            turn_usage: usage(o.turn_usage),
            session_usage: usage(o.session_usage),
            turns: o
                .turns
                .into_iter()
                .map(|t| TurnSummary {
                    stop_reason: t.stop_reason,
                    usage: usage(t.turn_usage),
                    duration_ms: t.turn_duration_ms,
                })
                .collect(),
        }),
        input: json_value(s.input),
        descriptive_metadata: json_value(s.descriptive_metadata),
        children: s
            .children
            .into_iter()
            .map(session_detail)
            .collect::<Result<_, _>>()?,
        id: s.id,
        status: s.status,
        parent_session_id: optional(s.parent_session_id),
        depth: s.depth,
        agent_version_id: s.agent_version_id,
        bundle_version_id: optional(s.bundle_version_id),
        error: optional(s.error),
        metadata: s.metadata.into_iter().collect(),
        mode: SessionMode::from_pb(s.mode),
        started_by: Starter::from_pb(s.started_by, s.started_by_verification, s.started_by_via),
        truncated: s
            .truncated
            .into_iter()
            .map(TruncatedPayload::from_pb)
            .collect(),
    })
}

fn timeline_entry(e: pb::InspectTimelineEntry) -> Result<TimelineEntry, ClientError> {
    const RPC: &str = "InspectSession";
    let detail = if let Some(event) = e.event {
        TimelineDetail::Event(SessionEvent {
            id: event.id,
            event_type: event.r#type,
            payload: json_value(event.payload),
            seq: event.seq,
            session_id: event.session_id,
            turn: event.turn,
            call_id: optional(event.call_id),
            actor: event.actor,
            actor_verification: optional(event.actor_verification),
            actor_via: optional(event.actor_via),
        })
    } else if let Some(i) = e.invocation {
        TimelineDetail::Invocation(ToolInvocation {
            call_id: i.call_id,
            tool: i.tool,
            version: i.version,
            turn: i.turn,
            args: json_value(i.args),
            result: json_value(i.result),
            status: i.status,
            worker_identity: optional(i.worker_identity),
            attempt: i.attempt,
            error_code: optional(i.error_code),
            error_message: optional(i.error_message),
            queue_delay_ms: i.queue_delay_ms,
            execution_duration_ms: i.execution_duration_ms,
        })
    } else if let Some(a) = e.approval {
        TimelineDetail::Approval(Box::new(approval_from_inspect(a)?))
    } else {
        TimelineDetail::None
    };
    let timestamp = match optional_timestamp(RPC, "timeline timestamp", &e.timestamp)? {
        Some(t) => Some(t),
        None => unix_ms(e.ts_unix_ms),
    };
    Ok(TimelineEntry {
        timestamp,
        gap_ms: e.gap_ms,
        source: e.source,
        kind: e.kind,
        summary: e.summary,
        session_id: e.session_id,
        depth: e.depth,
        seq: e.seq,
        detail,
        truncated: e
            .truncated
            .into_iter()
            .map(TruncatedPayload::from_pb)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use prost_types::value::Kind;
    use serde_json::json;

    use super::*;

    fn pv(kind: Kind) -> prost_types::Value {
        prost_types::Value { kind: Some(kind) }
    }

    #[test]
    fn protobuf_values_decode_to_json_keeping_integers() {
        let value = pv(Kind::StructValue(prost_types::Struct {
            fields: [
                ("amount".to_owned(), pv(Kind::NumberValue(400.0))),
                ("rate".to_owned(), pv(Kind::NumberValue(0.5))),
                ("ok".to_owned(), pv(Kind::BoolValue(true))),
                (
                    "tags".to_owned(),
                    pv(Kind::ListValue(prost_types::ListValue {
                        values: vec![pv(Kind::StringValue("a".into())), pv(Kind::NullValue(0))],
                    })),
                ),
            ]
            .into_iter()
            .collect(),
        }));
        assert_eq!(
            json_value(Some(value)),
            json!({"amount": 400, "rate": 0.5, "ok": true, "tags": ["a", null]})
        );
        assert_eq!(json_value(None), Value::Null);
    }

    #[test]
    fn run_requests_carry_input_secrets_metadata_and_mode() {
        let mut run = RunSession::new(AgentName::new("support", "refund-agent"));
        run.input = Some(json!("refund ORD-1"));
        run.secrets.insert("openai".into(), "sk-secret".into());
        run.metadata.insert("ticket".into(), "T-1".into());
        run.mode = SessionMode::Conversation;
        let request = run.to_pb();
        assert_eq!(request.input, br#""refund ORD-1""#);
        assert_eq!(request.resolved_secrets["openai"], b"sk-secret");
        assert_eq!(request.metadata["ticket"], "T-1");
        assert_eq!(request.mode, i32::from(pb::SessionMode::Conversation));
        assert_eq!(request.agent_ref.unwrap().version, "");
        // No input means the runtime's `{}`.
        assert!(
            RunSession::new(AgentName::new("a", "b"))
                .to_pb()
                .input
                .is_empty()
        );
    }

    #[test]
    fn a_bundle_run_sends_a_bundle_ref_and_no_agent_ref() {
        let mut run = RunSession::bundle(AgentName::new("support", "desk"));
        run.version = Some("sha256:ab".into());
        let request = run.to_pb();
        assert_eq!(request.agent_ref, None);
        let bundle = request.bundle_ref.unwrap();
        assert_eq!(
            (bundle.namespace.as_str(), bundle.name.as_str()),
            ("support", "desk")
        );
        assert_eq!(bundle.version, "sha256:ab");
        assert!(format!("{run:?}").contains("Bundle"));
    }

    #[test]
    fn debug_output_never_shows_secret_values() {
        let mut run = RunSession::new(AgentName::new("a", "b"));
        run.secrets.insert("openai".into(), "sk-very-secret".into());
        let shown = format!("{run:?}");
        assert!(shown.contains("openai"), "{shown}");
        assert!(!shown.contains("sk-very-secret"), "{shown}");
    }

    #[test]
    fn summaries_name_their_target_and_resumability() {
        let summary = session_summary(pb::SessionSummary {
            id: "run_1".into(),
            agent_version_id: "v1".into(),
            status: "awaiting_input".into(),
            created_at: "2025-01-31T09:30:00Z".into(),
            updated_at: "2025-01-31T09:31:00Z".into(),
            kind: String::new(),
            bundle_version_id: String::new(),
            agent_ref: Some(pb::AgentRef {
                namespace: "support".into(),
                name: "refund-agent".into(),
                version: "0.1.0".into(),
            }),
            bundle_ref: None,
            metadata: [("ticket".to_owned(), "T-1".to_owned())]
                .into_iter()
                .collect(),
            mode: pb::SessionMode::Conversation.into(),
            started_by: "alice".into(),
            started_by_verification: "token".into(),
            started_by_via: "approvals-ui".into(),
        })
        .unwrap();
        assert_eq!(
            summary.started_by.as_ref().map(ToString::to_string),
            Some("alice via approvals-ui".to_owned())
        );
        assert_eq!(summary.kind, "agent");
        assert_eq!(
            summary.target().unwrap().to_string(),
            "support/refund-agent@0.1.0"
        );
        assert!(summary.resumable());
        assert_eq!(summary.mode, Some(SessionMode::Conversation));
        assert_eq!(summary.bundle_version_id, None);
    }

    #[test]
    fn a_malformed_session_timestamp_is_an_invalid_response() {
        let err = session_summary(pb::SessionSummary {
            updated_at: "soon".into(),
            created_at: "2025-01-31T09:30:00Z".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("updated_at \"soon\""), "{err}");
    }

    #[test]
    fn a_starter_reads_as_its_attribution_and_an_older_server_names_none() {
        let starter = |actor: &str, verification: &str, via: &str| {
            Starter::from_pb(actor.into(), verification.into(), via.into()).map(|s| s.to_string())
        };
        assert_eq!(
            starter("emad", "unverified", ""),
            Some("emad (unverified)".into())
        );
        assert_eq!(starter("alice", "oidc", ""), Some("alice".into()));
        assert_eq!(
            starter("alice", "token", "approvals-ui"),
            Some("alice via approvals-ui".into())
        );
        // Recorded before attribution existed: the bare name.
        assert_eq!(starter("ci", "", ""), Some("ci".into()));
        // An older server sends nothing.
        assert_eq!(starter("", "", ""), None);
    }
}
