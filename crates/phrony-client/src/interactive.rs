//! The interactive session stream (`RunSessionInteractive`): start a session and attach to it,
//! or attach to an existing one; send user messages and approval decisions; receive the
//! session's events as plain Rust values ([`SessionEvent`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use phrony_client::Client;
//! use phrony_client::interactive::{Decision, SessionEvent};
//! let client = Client::connect("127.0.0.1:7777").await?;
//! let session = client.attach("run_…", "alice").await?;
//! println!("attached to {}", session.started().session_id);
//! let (sender, mut events) = session.split();
//! while let Some(event) = events.next().await? {
//!     match event {
//!         SessionEvent::TextDelta(text) => print!("{text}"),
//!         SessionEvent::ApprovalRequired(approval) => {
//!             sender
//!                 .decide(Decision::approve().with_comment("looks right"))
//!                 .await?;
//!             println!("approved {}", approval.tool);
//!         }
//!         _ => {}
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! The stream carries the actor (the [`ACTOR_HEADER`](crate::ACTOR_HEADER) metadata) once, when
//! it is opened: every decision sent on it is attributed to that actor. Dropping every
//! [`InteractiveSender`] closes the client side of the stream; the session keeps running
//! (closing an attach stream only detaches).

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use pb::run_session_interactive_client_msg::Body as ClientBody;
use pb::run_session_interactive_server_msg::Body as ServerBody;
use phrony_proto::runtime::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::sessions::unix_ms;
use super::types::optional_timestamp;
use super::{Client, ClientError, REQUEST_TIMEOUT, RunSession, with_required_actor};

/// How many client messages may wait to be sent on the stream.
const OUTBOUND_BUFFER: usize = 16;

/// How long [`InteractiveEvents::next`] waits, after a terminal event, for the runtime to end
/// the stream.
const END_OF_STREAM_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The RPC name used in [`ClientError::InvalidResponse`].
const RPC: &str = "RunSessionInteractive";

/// A decision on an approval, sent on the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The approval decided; `None` decides the one currently pending.
    pub approval_id: Option<String>,
    /// Approve (true) or deny (false).
    pub approve: bool,
    /// The operator's comment (empty for none).
    pub comment: String,
    /// Replacement arguments for an approve (UTF-8 JSON text of an object); `None` keeps the
    /// proposed ones.
    pub args: Option<String>,
    /// The operator acknowledges they understood the call (required when the approval asks
    /// for comprehension).
    pub comprehension_acknowledged: bool,
    /// The resolution of an outcome review (`happened`, `resend` or `fail`); `approve` must
    /// agree (true for happened/resend).
    pub resolution: Option<String>,
}

impl Decision {
    /// Approve the pending approval, without a comment.
    #[must_use]
    pub fn approve() -> Self {
        Self {
            approval_id: None,
            approve: true,
            comment: String::new(),
            args: None,
            comprehension_acknowledged: false,
            resolution: None,
        }
    }

    /// Deny the pending approval, without a comment.
    #[must_use]
    pub fn deny() -> Self {
        Self {
            approve: false,
            ..Self::approve()
        }
    }

    /// This decision about the approval `id` (rather than the pending one).
    #[must_use]
    pub fn for_approval(mut self, id: impl Into<String>) -> Self {
        self.approval_id = Some(id.into());
        self
    }

    /// This decision with a comment.
    #[must_use]
    pub fn with_comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = comment.into();
        self
    }

    /// This decision with replacement arguments (JSON text of an object).
    #[must_use]
    pub fn with_args(mut self, args: impl Into<String>) -> Self {
        self.args = Some(args.into());
        self
    }

    /// The resolution of an outcome review: `happened`, `resend` or `fail` (sets `approve` to
    /// match).
    #[must_use]
    pub fn resolve(resolution: &str) -> Self {
        Self {
            approve: resolution != "fail",
            resolution: Some(resolution.to_owned()),
            ..Self::approve()
        }
    }

    /// This decision with the comprehension acknowledgement set to `acknowledged`.
    #[must_use]
    pub fn with_comprehension(mut self, acknowledged: bool) -> Self {
        self.comprehension_acknowledged = acknowledged;
        self
    }

    fn to_pb(&self) -> pb::RunSessionInteractiveToolApproval {
        pb::RunSessionInteractiveToolApproval {
            approval_id: self.approval_id.clone().unwrap_or_default(),
            approved: self.approve,
            comment: self.comment.clone(),
            args: self.args.clone().unwrap_or_default().into_bytes(),
            comprehension_acknowledged: self.comprehension_acknowledged,
            resolution: self.resolution.clone().unwrap_or_default(),
            result: Vec::new(),
        }
    }
}

/// Sending on a stream whose other end is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the session stream is closed; nothing more can be sent on it")]
pub struct StreamClosed;

/// Token counts of a turn or a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Tokens sent to the model.
    pub input: u64,
    /// Tokens the model produced.
    pub output: u64,
    /// The total (input + output when the runtime did not say).
    pub total: u64,
    /// True when the counts are estimated rather than reported by the provider.
    pub estimated: bool,
}

/// Where a turn stands: its number and token usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// The number of the turn that just ended (1-based; 0 when none has).
    pub turn: u32,
    /// Usage of that turn.
    pub turn_usage: Option<TokenUsage>,
    /// Usage summed over the session so far.
    pub session_usage: Option<TokenUsage>,
}

/// Who wrote a history entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The user (operator or calling system).
    User,
    /// The model.
    Assistant,
    /// A role this client does not know, as sent.
    Other(String),
}

/// One entry of the conversation replayed on start or attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Who wrote it.
    pub role: Role,
    /// The text.
    pub content: String,
    /// For an assistant entry that ended a turn: why the model stopped.
    pub stop_reason: Option<String>,
    /// Token usage of the turn this entry ended.
    pub turn_usage: Option<TokenUsage>,
    /// Wall-clock duration of the turn this entry ended, in milliseconds.
    pub turn_duration_ms: Option<u64>,
}

/// A regulatory framework pack recorded as evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameworkPack {
    /// The pack's id, e.g. `eu-ai-act/v1`.
    pub id: String,
    /// `validated` or `unvalidated`.
    pub validation: String,
    /// The pack's payload (JSON text).
    pub payload: String,
}

/// The governance metadata recorded as evidence for the session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Governance {
    /// The declared risk tier.
    pub risk_tier: Option<String>,
    /// Data classifications.
    pub classifications: Vec<String>,
    /// Authority boundaries.
    pub authority_boundaries: Vec<String>,
    /// Framework packs, sorted by id.
    pub frameworks: Vec<FrameworkPack>,
}

/// The descriptive (governance) metadata of the agent version, recorded for the session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DescriptiveMetadata {
    /// The owner.
    pub owner: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Governance metadata, when declared.
    pub governance: Option<Governance>,
}

/// The first event of a stream: the session and its conversation so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionStarted {
    /// The session id (`run_…`).
    pub session_id: String,
    /// The id of the agent version the session runs.
    pub agent_version_id: String,
    /// The model provider (e.g. `openai`).
    pub model_provider: String,
    /// The model (e.g. `gpt-4o`).
    pub model_name: String,
    /// The conversation so far (empty for a new session).
    pub history: Vec<HistoryEntry>,
    /// The token budget of the session; `None` when unlimited.
    pub max_tokens_per_run: Option<u64>,
    /// The wall-clock budget of the session in seconds; `None` when unlimited.
    pub max_wall_clock_seconds: Option<u64>,
    /// When the session started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the session ended, for a session that already has.
    pub ended_at: Option<DateTime<Utc>>,
    /// The evidence snapshot, when one was recorded.
    pub metadata: Option<DescriptiveMetadata>,
}

/// The model asked for a tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The runtime's id of the call (also used by the ledger and approvals).
    pub call_id: String,
    /// The tool's dispatch ref (e.g. `payments.issue-refund`).
    pub tool: String,
    /// The tool's version.
    pub version: String,
    /// The arguments the model produced (JSON text).
    pub args: String,
    /// When the "tool" is another agent: the delegation.
    pub delegation: Option<Delegation>,
    /// The tool name as the model saw it.
    pub wire_name: Option<String>,
}

/// A tool call that runs another agent as a child session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegation {
    /// The child session's id.
    pub child_session_id: String,
    /// The delegated agent, as `namespace/name@version`.
    pub target: String,
}

/// What a tool call produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// The tool succeeded with this result (JSON text).
    Succeeded {
        /// The result.
        payload: String,
    },
    /// The call failed, was denied by policy or rejected by an approver.
    Failed {
        /// The error's code (`policy_denied`, `invalid_args`, `approval_rejected`, a worker's
        /// code…), when the runtime sent one.
        code: Option<String>,
        /// The error the model sees.
        message: String,
        /// The policy that denied the call (`namespace/name@version`), for a policy denial.
        policy_ref: Option<String>,
    },
}

impl ToolOutcome {
    /// True for a call a policy denied at dispatch.
    #[must_use]
    pub fn is_policy_denial(&self) -> bool {
        matches!(self, Self::Failed { code: Some(code), .. } if code == "policy_denied")
    }
}

/// The outcome of a tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    /// The call.
    pub call_id: String,
    /// What it produced.
    pub outcome: ToolOutcome,
}

/// A tool call that policy holds until a human decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequired {
    /// The approval's id.
    pub approval_id: String,
    /// `policy`, or `outcome_review`: the call's outcome is unknown and the question is "did
    /// it happen?" (resolve with [`Decision::resolve`]).
    pub kind: String,
    /// The held call.
    pub call_id: String,
    /// The tool's dispatch ref.
    pub tool: String,
    /// The tool's version.
    pub version: String,
    /// The proposed arguments (JSON text).
    pub args: String,
    /// The approval route (who should decide).
    pub route: Option<String>,
    /// Why the call needs approval (the policy's reason).
    pub reason: Option<String>,
    /// The authority the approval is decided under.
    pub authority_ref: Option<String>,
    /// The deciding policy's name.
    pub policy_name: Option<String>,
    /// The deciding policy as `namespace/name@version`.
    pub policy_ref: Option<String>,
    /// The deciding policy's runtime settings (JSON text).
    pub policy_runtime: Option<String>,
    /// How many approvals are needed.
    pub approvals_required: u32,
    /// How many were given so far.
    pub approvals_received: u32,
    /// Approvers must acknowledge they understood the call.
    pub comprehension_required: bool,
    /// When the approval times out; `None` when it does not.
    pub expires_at: Option<DateTime<Utc>>,
    /// What a rejection does (`return_to_agent` or `fail`).
    pub on_reject: Option<String>,
    /// What edited arguments go through (`revalidate` or `unchecked`).
    pub on_modify: Option<String>,
}

/// How an approval stands after a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalStatus {
    /// A vote was recorded; the quorum is not reached yet.
    Pending,
    /// Approved: the call is dispatched.
    Approved,
    /// Denied: the call is not dispatched.
    Denied,
    /// Escalated (e.g. on timeout) to another approval.
    Escalated,
    /// Cancelled (e.g. the session ended).
    Cancelled,
    /// A status this client does not know, as sent.
    Other(String),
}

impl ApprovalStatus {
    fn parse(status: &str) -> Self {
        match status {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "denied" | "rejected" => Self::Denied,
            "escalated" => Self::Escalated,
            "cancelled" => Self::Cancelled,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The status as the runtime spells it.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Escalated => "escalated",
            Self::Cancelled => "cancelled",
            Self::Other(other) => other,
        }
    }
}

impl fmt::Display for ApprovalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An approval of the session was decided (on this or any other stream, by the CLI, the API
/// or a timeout), or received a vote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalDecided {
    /// The approval.
    pub approval_id: String,
    /// The call it held.
    pub call_id: String,
    /// Where it stands now.
    pub status: ApprovalStatus,
    /// Who decided (an actor id, or `system:timeout`).
    pub decided_by: String,
    /// The decider's comment.
    pub comment: Option<String>,
    /// Approvals given so far.
    pub approvals_received: u32,
    /// Approvals needed.
    pub approvals_required: u32,
}

/// The session's status changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChanged {
    /// The new status (`running`, `awaiting_tool`, `awaiting_approval`, `awaiting_input`,
    /// `completed`, `failed`, `cancelled`).
    pub status: String,
    /// Why, when known (e.g. a limit's message).
    pub reason: Option<String>,
}

/// The turn ended: the session waits for the next user message, or input is blocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwaitingInput {
    /// Why the model stopped.
    pub stop_reason: Option<String>,
    /// The turn number and token usage.
    pub stats: SessionStats,
    /// Why the session cannot take user input right now: `awaiting_tool`,
    /// `awaiting_approval`, or a run limit's error text. `None` when it can.
    pub input_blocked_reason: Option<String>,
}

/// The session completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// Why the model stopped last.
    pub stop_reason: Option<String>,
    /// The session's output (JSON text).
    pub output: String,
    /// The last turn's number and the usage.
    pub stats: SessionStats,
    /// When the session ended.
    pub ended_at: Option<DateTime<Utc>>,
}

/// One event of an interactive session, in the order the runtime sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// The first event: the session and its conversation so far.
    Started(SessionStarted),
    /// A chunk of assistant text as the model streams it.
    TextDelta(String),
    /// The model asked for a tool call.
    ToolCall(ToolCall),
    /// A tool call's outcome.
    ToolResult(ToolResult),
    /// A tool call is held until a human decides.
    ApprovalRequired(ApprovalRequired),
    /// An approval was decided or received a vote.
    ApprovalDecided(ApprovalDecided),
    /// The session's status changed.
    Status(StatusChanged),
    /// The turn ended; the session waits for input (or input is blocked).
    AwaitingInput(AwaitingInput),
    /// Terminal: the session completed.
    Completed(Completed),
    /// Terminal: the session failed.
    Failed {
        /// Why.
        message: String,
    },
    /// Terminal: the session was cancelled.
    Cancelled {
        /// When it ended.
        ended_at: Option<DateTime<Utc>>,
    },
}

impl SessionEvent {
    /// True for the events after which the session runs no more (completed, failed,
    /// cancelled).
    #[must_use]
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Completed(_) | Self::Failed { .. } | Self::Cancelled { .. }
        )
    }
}

/// An open interactive stream, right after the runtime confirmed the session.
#[derive(Debug)]
pub struct InteractiveSession {
    started: SessionStarted,
    sender: InteractiveSender,
    events: InteractiveEvents,
}

impl InteractiveSession {
    /// The session and its conversation so far (the stream's first event).
    #[must_use]
    pub fn started(&self) -> &SessionStarted {
        &self.started
    }

    /// The sending half and the receiving half, to use from different tasks.
    #[must_use]
    pub fn split(self) -> (InteractiveSender, InteractiveEvents) {
        (self.sender, self.events)
    }
}

/// The sending half of an interactive stream. Cheap to clone; dropping every clone closes the
/// client side of the stream (the session keeps running).
#[derive(Debug, Clone)]
pub struct InteractiveSender {
    outbound: mpsc::Sender<pb::RunSessionInteractiveClientMsg>,
}

impl InteractiveSender {
    async fn send(&self, body: ClientBody) -> Result<(), StreamClosed> {
        self.outbound
            .send(pb::RunSessionInteractiveClientMsg { body: Some(body) })
            .await
            .map_err(|_| StreamClosed)
    }

    /// Sends a user message for the session's next turn. A message sent while a turn runs is
    /// queued by the runtime and runs after it, in order.
    ///
    /// # Errors
    /// [`StreamClosed`] when the stream has ended.
    pub async fn send_user_message(&self, text: &str) -> Result<(), StreamClosed> {
        self.send(ClientBody::UserMessage(
            pb::RunSessionInteractiveUserMessage {
                text: text.to_owned(),
            },
        ))
        .await
    }

    /// Sends a decision on an approval of the session, attributed to the stream's actor.
    ///
    /// # Errors
    /// [`StreamClosed`] when the stream has ended.
    pub async fn decide(&self, decision: Decision) -> Result<(), StreamClosed> {
        self.send(ClientBody::ToolApproval(decision.to_pb())).await
    }
}

/// The receiving half of an interactive stream.
#[derive(Debug)]
pub struct InteractiveEvents {
    inbound: tonic::Streaming<pb::RunSessionInteractiveServerMsg>,
    addr: String,
}

impl InteractiveEvents {
    /// The next event; `Ok(None)` when the runtime ended the stream.
    ///
    /// # Errors
    /// [`ClientError::Rpc`] when the runtime ended the stream with an error status,
    /// [`ClientError::Unreachable`] when the connection broke, and
    /// [`ClientError::InvalidResponse`] for a message this client cannot read.
    pub async fn next(&mut self) -> Result<Option<SessionEvent>, ClientError> {
        match self.inbound.message().await {
            Ok(Some(message)) => {
                let event = server_event(message)?;
                if event.is_terminal() {
                    self.read_to_end().await;
                }
                Ok(Some(event))
            }
            Ok(None) => Ok(None),
            Err(status) => Err(ClientError::from_status(
                &status,
                &self.addr,
                REQUEST_TIMEOUT,
            )),
        }
    }
}

impl InteractiveEvents {
    /// After the terminal event the runtime ends the stream: read that end (its status
    /// trailers, normally in the same packet) so that dropping the stream right after the
    /// terminal event does not cancel a stream the runtime was ending. Each such cancel makes
    /// the runtime's closing frames arrive for a stream the connection may have forgotten,
    /// which HTTP/2 counts as a protocol error against the connection; on a busy connection
    /// (many sessions at once) that count reaches the HTTP/2 library's limit and the
    /// connection is closed under every request in flight. Bounded by [`END_OF_STREAM_WAIT`]
    /// for a runtime that keeps the stream open.
    async fn read_to_end(&mut self) {
        let drain = async { while let Ok(Some(_)) = self.inbound.message().await {} };
        let _ = tokio::time::timeout(END_OF_STREAM_WAIT, drain).await;
    }
}

impl Client {
    /// Starts a new session on an interactive stream and attaches to it
    /// (`RunSessionInteractive` with `start{agent_ref}`); `actor` is recorded as the author of
    /// every decision sent on the stream. An interactive session is normally a
    /// [`SessionMode::Conversation`](super::SessionMode::Conversation) (set `run.mode`): a task
    /// session completes when its first turn ends.
    ///
    /// # Errors
    /// [`ClientError::InvalidActor`] for an actor that cannot travel in a header; the
    /// runtime's refusal (`NotFound`, `FailedPrecondition`, `InvalidArgument`…); any other
    /// [`ClientError`].
    pub async fn start_interactive(
        &self,
        run: &RunSession,
        actor: &str,
    ) -> Result<InteractiveSession, ClientError> {
        // The same start as `RunSession`, on the stream.
        let request = run.to_pb();
        let start = pb::RunSessionInteractiveStart {
            agent_ref: request.agent_ref,
            input: request.input,
            session_id: String::new(),
            resolved_secrets: request.resolved_secrets,
            bundle_ref: request.bundle_ref,
            mode: request.mode,
            metadata: request.metadata,
        };
        self.open_interactive(start, actor).await
    }

    /// Attaches to the existing session `session_id` (`RunSessionInteractive` with
    /// `start{session_id}`); `actor` is recorded as the author of every decision sent on the
    /// stream.
    ///
    /// # Errors
    /// [`ClientError::InvalidActor`]; `NotFound` for an unknown session; any other
    /// [`ClientError`].
    pub async fn attach(
        &self,
        session_id: &str,
        actor: &str,
    ) -> Result<InteractiveSession, ClientError> {
        let start = pb::RunSessionInteractiveStart {
            session_id: session_id.to_owned(),
            ..Default::default()
        };
        self.open_interactive(start, actor).await
    }

    async fn open_interactive(
        &self,
        start: pb::RunSessionInteractiveStart,
        actor: &str,
    ) -> Result<InteractiveSession, ClientError> {
        let (outbound, receiver) = mpsc::channel(OUTBOUND_BUFFER);
        let request = with_required_actor(ReceiverStream::new(receiver), actor)?;
        // The channel is empty and ours: the start always fits.
        outbound
            .try_send(pb::RunSessionInteractiveClientMsg {
                body: Some(ClientBody::Start(start)),
            })
            .map_err(|e| invalid(format!("cannot queue the start message: {e}")))?;
        let response = self
            .runtime
            .clone()
            .run_session_interactive(request)
            .await
            .map_err(|s| self.status(&s))?;
        let mut events = InteractiveEvents {
            inbound: response.into_inner(),
            addr: self.addr.clone(),
        };
        let started = match events.next().await? {
            Some(SessionEvent::Started(started)) => started,
            Some(other) => {
                return Err(invalid(format!(
                    "the first message is not session_started but {other:?}"
                )));
            }
            None => return Err(invalid("the stream ended before session_started")),
        };
        Ok(InteractiveSession {
            started,
            sender: InteractiveSender { outbound },
            events,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// protobuf -> domain

fn invalid(reason: impl fmt::Display) -> ClientError {
    ClientError::invalid_response(RPC, reason)
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn non_empty(value: String) -> Option<String> {
    if value.trim().is_empty() {
        None
    } else {
        Some(value)
    }
}

fn count(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

fn limit(value: i32) -> Option<u64> {
    u64::try_from(value).ok().filter(|&v| v > 0)
}

fn usage(usage: Option<pb::TokenUsage>) -> Option<TokenUsage> {
    usage.map(|u| {
        let input = u64::try_from(u.input_tokens).unwrap_or(0);
        let output = u64::try_from(u.output_tokens).unwrap_or(0);
        let total = u64::try_from(u.total_tokens)
            .ok()
            .filter(|&t| t > 0)
            .unwrap_or(input + output);
        TokenUsage {
            input,
            output,
            total,
            estimated: u.estimated,
        }
    })
}

fn stats(stats: Option<pb::InteractiveSessionStats>) -> SessionStats {
    stats.map_or_else(SessionStats::default, |s| SessionStats {
        turn: count(s.turn),
        turn_usage: usage(s.turn_usage),
        session_usage: usage(s.session_usage),
    })
}

fn history_entry(entry: pb::InteractiveConversationMessage) -> HistoryEntry {
    HistoryEntry {
        role: match entry.role.as_str() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => Role::Other(entry.role),
        },
        content: entry.content,
        stop_reason: non_empty(entry.stop_reason),
        turn_usage: usage(entry.turn_usage),
        turn_duration_ms: u64::try_from(entry.turn_duration_ms)
            .ok()
            .filter(|&d| d > 0),
    }
}

fn metadata(m: pb::DescriptiveMetadataEvidence) -> DescriptiveMetadata {
    DescriptiveMetadata {
        owner: non_empty(m.owner),
        labels: m.labels.into_iter().collect(),
        annotations: m.annotations.into_iter().collect(),
        governance: m.governance.map(|g| Governance {
            risk_tier: non_empty(g.risk_tier),
            classifications: g.classifications,
            authority_boundaries: g.authority_boundaries,
            frameworks: g
                .frameworks
                .into_iter()
                .map(|f| FrameworkPack {
                    id: f.id,
                    validation: f.validation,
                    payload: text(f.payload),
                })
                .collect(),
        }),
    }
}

/// Converts one server message into a [`SessionEvent`].
fn server_event(message: pb::RunSessionInteractiveServerMsg) -> Result<SessionEvent, ClientError> {
    let body = message
        .body
        .ok_or_else(|| invalid("a server message without a body"))?;
    Ok(match body {
        ServerBody::SessionStarted(s) => SessionEvent::Started(SessionStarted {
            session_id: s.session_id,
            agent_version_id: s.agent_version_id,
            model_provider: s.model_provider,
            model_name: s.model_name,
            history: s.history.into_iter().map(history_entry).collect(),
            max_tokens_per_run: limit(s.max_tokens_per_run),
            max_wall_clock_seconds: limit(s.max_wall_clock_seconds),
            started_at: unix_ms(s.session_started_at_unix_ms),
            ended_at: unix_ms(s.session_ended_at_unix_ms),
            metadata: s.descriptive_metadata.map(metadata),
        }),
        ServerBody::TextDelta(d) => SessionEvent::TextDelta(d.delta),
        ServerBody::ToolCall(c) => SessionEvent::ToolCall(ToolCall {
            call_id: c.call_id,
            tool: c.tool,
            version: c.version,
            args: text(c.args),
            delegation: c.agent_delegation.then_some(Delegation {
                child_session_id: c.child_session_id,
                target: c.delegation_target,
            }),
            wire_name: non_empty(c.wire_name),
        }),
        ServerBody::ToolResult(r) => {
            let outcome = if r.error_message.is_empty() && r.error_code.is_empty() {
                ToolOutcome::Succeeded {
                    payload: text(r.payload),
                }
            } else {
                ToolOutcome::Failed {
                    code: non_empty(r.error_code),
                    message: r.error_message,
                    policy_ref: non_empty(r.policy_ref),
                }
            };
            SessionEvent::ToolResult(ToolResult {
                call_id: r.call_id,
                outcome,
            })
        }
        ServerBody::ApprovalRequired(a) => SessionEvent::ApprovalRequired(ApprovalRequired {
            expires_at: optional_timestamp(RPC, "approval_required.expires_at", &a.expires_at)?,
            approval_id: a.approval_id,
            kind: if a.kind.is_empty() {
                "policy".to_owned()
            } else {
                a.kind
            },
            call_id: a.call_id,
            tool: a.tool,
            version: a.version,
            args: text(a.args),
            route: non_empty(a.route),
            reason: non_empty(a.reason),
            authority_ref: non_empty(a.authority_ref),
            policy_name: non_empty(a.policy_name),
            policy_ref: non_empty(a.policy_ref),
            policy_runtime: non_empty(text(a.policy_runtime)),
            approvals_required: count(a.approvals_required),
            approvals_received: count(a.approvals_received),
            comprehension_required: a.comprehension_required,
            on_reject: non_empty(a.on_reject),
            on_modify: non_empty(a.on_modify),
        }),
        ServerBody::ApprovalDecided(d) => SessionEvent::ApprovalDecided(ApprovalDecided {
            approval_id: d.approval_id,
            call_id: d.call_id,
            status: ApprovalStatus::parse(&d.status),
            decided_by: d.decided_by,
            comment: non_empty(d.comment),
            approvals_received: count(d.approvals_received),
            approvals_required: count(d.approvals_required),
        }),
        ServerBody::Status(s) => SessionEvent::Status(StatusChanged {
            status: s.status,
            reason: non_empty(s.reason),
        }),
        ServerBody::AwaitingInput(a) => SessionEvent::AwaitingInput(AwaitingInput {
            stop_reason: non_empty(a.stop_reason),
            stats: stats(a.stats),
            input_blocked_reason: non_empty(a.input_blocked_reason),
        }),
        ServerBody::Completed(c) => SessionEvent::Completed(Completed {
            stop_reason: non_empty(c.stop_reason),
            output: text(c.output),
            stats: stats(c.stats),
            ended_at: unix_ms(c.session_ended_at_unix_ms),
        }),
        ServerBody::Failed(f) => SessionEvent::Failed { message: f.message },
        ServerBody::Cancelled(c) => SessionEvent::Cancelled {
            ended_at: unix_ms(c.session_ended_at_unix_ms),
        },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn msg(body: ServerBody) -> pb::RunSessionInteractiveServerMsg {
        pb::RunSessionInteractiveServerMsg { body: Some(body) }
    }

    #[test]
    fn decisions_carry_comment_args_and_comprehension() {
        let pb = Decision::approve()
            .with_comment("claim verified")
            .with_args(r#"{"amount":300}"#)
            .with_comprehension(true)
            .to_pb();
        assert!(pb.approved);
        assert_eq!(pb.approval_id, "");
        assert_eq!(pb.comment, "claim verified");
        assert_eq!(pb.args, br#"{"amount":300}"#);
        assert!(pb.comprehension_acknowledged);
        let pb = Decision::deny().for_approval("apr_1").to_pb();
        assert!(!pb.approved);
        assert_eq!(pb.approval_id, "apr_1");
        assert!(
            pb.args.is_empty(),
            "a deny without edit keeps the args empty"
        );
    }

    #[test]
    fn policy_denials_keep_the_policy_and_code() {
        let event = server_event(msg(ServerBody::ToolResult(
            pb::RunSessionInteractiveToolResult {
                call_id: "c1".into(),
                payload: Vec::new(),
                error_message: "refunds over 10000 are denied".into(),
                error_code: "policy_denied".into(),
                policy_ref: "payments/refund-hard-limit@1.0.0".into(),
            },
        )))
        .unwrap();
        let SessionEvent::ToolResult(result) = event else {
            panic!("{event:?}")
        };
        assert!(result.outcome.is_policy_denial());
        assert_eq!(
            result.outcome,
            ToolOutcome::Failed {
                code: Some("policy_denied".into()),
                message: "refunds over 10000 are denied".into(),
                policy_ref: Some("payments/refund-hard-limit@1.0.0".into()),
            }
        );
        let ok = server_event(msg(ServerBody::ToolResult(
            pb::RunSessionInteractiveToolResult {
                call_id: "c2".into(),
                payload: br#"{"refund_id":"rf_1"}"#.to_vec(),
                ..Default::default()
            },
        )))
        .unwrap();
        assert_eq!(
            ok,
            SessionEvent::ToolResult(ToolResult {
                call_id: "c2".into(),
                outcome: ToolOutcome::Succeeded {
                    payload: r#"{"refund_id":"rf_1"}"#.into()
                }
            })
        );
    }

    #[test]
    fn approvals_parse_expiry_and_phrony_additions() {
        let event = server_event(msg(ServerBody::ApprovalRequired(
            pb::RunSessionInteractiveApprovalRequired {
                approval_id: "apr_1".into(),
                call_id: "c1".into(),
                tool: "payments.issue-refund".into(),
                version: "1.0.0".into(),
                args: br#"{"amount":400}"#.to_vec(),
                reason: "refunds over 250 need a human".into(),
                approvals_required: 2,
                approvals_received: 1,
                comprehension_required: true,
                expires_at: "2026-01-02T03:04:05Z".into(),
                policy_ref: "payments/refund-approval-boundary@1.0.0".into(),
                on_reject: "return_to_agent".into(),
                on_modify: "revalidate".into(),
                ..Default::default()
            },
        )))
        .unwrap();
        let SessionEvent::ApprovalRequired(a) = event else {
            panic!("{event:?}")
        };
        assert_eq!(a.args, r#"{"amount":400}"#);
        assert_eq!((a.approvals_received, a.approvals_required), (1, 2));
        assert_eq!(
            a.expires_at.unwrap().to_rfc3339(),
            "2026-01-02T03:04:05+00:00"
        );
        assert_eq!(
            a.policy_ref.as_deref(),
            Some("payments/refund-approval-boundary@1.0.0")
        );
        assert_eq!(a.on_reject.as_deref(), Some("return_to_agent"));
        assert_eq!(a.route, None, "empty strings are unset");

        let bad = server_event(msg(ServerBody::ApprovalRequired(
            pb::RunSessionInteractiveApprovalRequired {
                expires_at: "tomorrow".into(),
                ..Default::default()
            },
        )))
        .unwrap_err();
        assert!(bad.to_string().contains("\"tomorrow\""), "{bad}");
    }

    #[test]
    fn started_limits_zero_mean_unlimited_and_usage_totals_fill_in() {
        let event = server_event(msg(ServerBody::SessionStarted(
            pb::RunSessionInteractiveSessionStarted {
                session_id: "run_1".into(),
                max_tokens_per_run: 0,
                max_wall_clock_seconds: 600,
                session_started_at_unix_ms: 1_700_000_000_000,
                history: vec![pb::InteractiveConversationMessage {
                    role: "assistant".into(),
                    content: "hi".into(),
                    stop_reason: "end_turn".into(),
                    turn_usage: Some(pb::TokenUsage {
                        input_tokens: 10,
                        output_tokens: 5,
                        total_tokens: 0,
                        estimated: true,
                    }),
                    turn_duration_ms: 12,
                }],
                ..Default::default()
            },
        )))
        .unwrap();
        let SessionEvent::Started(s) = event else {
            panic!("{event:?}")
        };
        assert_eq!(s.max_tokens_per_run, None);
        assert_eq!(s.max_wall_clock_seconds, Some(600));
        assert_eq!(s.started_at.unwrap().timestamp(), 1_700_000_000);
        assert_eq!(s.ended_at, None);
        assert_eq!(s.history[0].role, Role::Assistant);
        assert_eq!(s.history[0].turn_usage.unwrap().total, 15);
    }

    #[test]
    fn decided_and_status_messages_convert() {
        let event = server_event(msg(ServerBody::ApprovalDecided(
            pb::RunSessionInteractiveApprovalDecided {
                approval_id: "apr_1".into(),
                call_id: "c1".into(),
                status: "approved".into(),
                decided_by: "emad".into(),
                comment: "ok".into(),
                approvals_received: 1,
                approvals_required: 1,
            },
        )))
        .unwrap();
        assert!(matches!(
            event,
            SessionEvent::ApprovalDecided(ApprovalDecided {
                status: ApprovalStatus::Approved,
                ..
            })
        ));
        let status = server_event(msg(ServerBody::Status(pb::RunSessionInteractiveStatus {
            status: "awaiting_tool".into(),
            reason: String::new(),
        })))
        .unwrap();
        assert_eq!(
            status,
            SessionEvent::Status(StatusChanged {
                status: "awaiting_tool".into(),
                reason: None
            })
        );
        assert!(
            server_event(pb::RunSessionInteractiveServerMsg { body: None }).is_err(),
            "an empty body is a malformed response"
        );
        assert!(
            server_event(msg(ServerBody::Failed(pb::RunSessionInteractiveFailed {
                message: "x".into()
            })))
            .unwrap()
            .is_terminal()
        );
    }
}
