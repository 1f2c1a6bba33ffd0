//! Attaching a client to a session (what `RunSessionInteractive` shows).
//!
//! [`Engine::attach`] gives a client everything it needs to show a session it joins at any
//! point: a [`CatchUp`] (the conversation so far, the text the model is streaming right now,
//! the tool activity of the turn in progress and the state the session is in) and then the
//! session's live updates, with no gap and no duplicate: the catch-up is read up to one event
//! and the [`Subscription`] continues after it.
//!
//! [`SessionView`] turns the session's events (and streamed text) into [`Activity`] items, the
//! client-facing meaning of the log: a tool call, its result, an approval request or decision,
//! a status change, the end of a turn, the end of the session. It keeps the little state that
//! needs (which text was already shown, vote counts, which calls already have a result), so the
//! same view that built the catch-up must then be fed the live updates.
//!
//! Text is shown exactly once even though it arrives two ways: as best-effort
//! [`SessionUpdate::TextDelta`]s while the model streams (each with its offset in the
//! completion's text), and in full in the `message.assistant` event recorded after the
//! completion. The view forwards deltas while they are contiguous, and when the
//! `message.assistant` event arrives it shows whatever part of its text the deltas did not
//! (all of it for a client that missed them), so a slow client gets coalesced text, never a
//! hole.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use phrony_ledger::{
    ApprovalRequired, ApprovalStatus, ApprovalVoted, AssistantSegment, CallStatus, Event,
    EventBody, ModelCompletion, Session, SessionStatus, SessionTransition, ToolCompleted,
    ToolRequested, Usage, VoteDecision, error_codes, event_types as types,
};
use phrony_manifest::CompiledAgent;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::calls::LIMIT_TOOL;
use crate::engine::Engine;
use crate::error::{EngineError, ErrorKind, StoreError};
use crate::fold::{FAILURE_KEY, LIMIT_PREFIX, TRIGGER_KEY, failure_text, rejection_text};
use crate::state::StreamingText;
use crate::subscribe::{SessionUpdate, Subscription};

/// Where an attached client starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachFrom {
    /// Where the session is now: a [`CatchUp`] summarises the past, then live updates.
    Now,
    /// The session's first event: nothing is summarised, every event is delivered as an update
    /// (for the client that just started the session).
    Start,
}

/// A client attached to a session: what to show first, the view to map updates with, and the
/// updates (`None` when the session has already ended and the catch-up says so).
#[derive(Debug)]
pub struct Attachment {
    /// What to show before any update.
    pub catch_up: CatchUp,
    /// Maps the updates (it carries on from the catch-up).
    pub view: SessionView,
    /// The session's updates after the catch-up, until it ends.
    pub updates: Option<Subscription>,
}

/// Where a session is when a client attaches.
#[derive(Debug, Clone, PartialEq)]
pub struct CatchUp {
    /// The session.
    pub session: Session,
    /// The model provider of its agent version (`openai`, `anthropic`, `stub`, …).
    pub model_provider: String,
    /// The model.
    pub model_name: String,
    /// The conversation so far, turn by turn (empty with [`AttachFrom::Start`]).
    pub history: Vec<HistoryEntry>,
    /// The evidence snapshot recorded for the session (§5.11), if any.
    pub evidence: Option<Value>,
    /// When the session ended, if it has.
    pub ended_at: Option<DateTime<Utc>>,
    /// What to show after the session itself, in order: the assistant text of the turn in
    /// progress (one [`Activity::Text`]), the tool calls, results and approval decisions of
    /// that turn, then the state: the pending approvals and an [`Activity::AwaitingInput`]
    /// blocked by `awaiting_approval`, or one blocked by `awaiting_tool`, or the
    /// `awaiting_input` of a parked conversation (with its stats and any limit that blocks
    /// input), or a [`Activity::Status`] for a running turn, or the terminal item of an ended
    /// session.
    pub activities: Vec<Activity>,
}

/// One entry of a session's conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
    /// Why the model ended the turn (assistant entries of finished turns).
    pub stop_reason: Option<String>,
    /// The turn's token usage (assistant entries).
    pub turn_usage: Option<Usage>,
    /// How long the turn took (assistant entries of finished turns).
    pub turn_duration_ms: Option<u64>,
}

/// Token usage at the end of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnStats {
    /// The turn that ended (from 1).
    pub turn: u32,
    /// Its usage.
    pub turn_usage: Usage,
    /// The usage of every completion of the session so far.
    pub session_usage: Usage,
}

/// The client-facing meaning of a session event.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "built once per event and moved straight into a stream message; the variant sizes \
              depend on serde_json features unified across the workspace, and boxing would add \
              an allocation per event for no measured gain"
)]
pub enum Activity {
    /// Assistant text.
    Text(String),
    /// The model called a tool.
    ToolCall(ToolCallActivity),
    /// A tool call's outcome, as the model receives it.
    ToolResult(ToolResultActivity),
    /// A tool call waits for a human decision.
    ApprovalRequired(ApprovalRequest),
    /// A vote on an approval was recorded, or the approval was decided.
    ApprovalDecided(ApprovalDecision),
    /// The session's status changed (non-terminal statuses; the end has its own items).
    Status {
        /// The new status.
        status: SessionStatus,
        /// Why, when recorded (e.g. a limit's message).
        reason: Option<String>,
    },
    /// The session waits for a user message, or cannot take one now (`blocked_reason`).
    AwaitingInput(AwaitingInput),
    /// The session completed.
    Completed(Completion),
    /// The session failed.
    Failed {
        /// Why.
        message: String,
    },
    /// The session was cancelled.
    Cancelled {
        /// When.
        ended_at: DateTime<Utc>,
    },
}

impl Activity {
    /// Whether this item ends the session (nothing follows it).
    #[must_use]
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Completed(_) | Self::Failed { .. } | Self::Cancelled { .. }
        )
    }
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallActivity {
    /// The runtime's call id.
    pub call_id: String,
    /// Dispatch ref.
    pub tool: String,
    /// Tool version.
    pub version: String,
    /// The name the model used, when it differs from the tool.
    pub wire_name: Option<String>,
    /// The model's arguments.
    pub args: Value,
    /// Set for a delegation: the agent it runs (see [`phrony_ledger::NewToolCall::delegation`])
    /// and the child session id ([`crate::child_session_id`]).
    pub delegation: Option<Delegation>,
}

/// The child session a delegation call runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegation {
    /// `namespace/name[@version]`, or the bundle child's name.
    pub target: String,
    /// The child session (`run_` + UUIDv5 of the call id).
    pub child_session_id: String,
}

/// A tool call's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResultActivity {
    /// The call.
    pub call_id: String,
    /// The worker's result payload, on success.
    pub result: Option<Value>,
    /// The error code on failure (the worker's, or `policy_denied`, `approval_denied`,
    /// `cancelled`, `invalid_args`, …).
    pub error_code: Option<String>,
    /// The failure as the model reads it.
    pub error_message: Option<String>,
    /// The policy that denied the call (`namespace/name@version`).
    pub policy_ref: Option<String>,
}

/// An approval a tool call waits for.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// The approval.
    pub approval_id: Uuid,
    /// What it asks: a policy approval, or an outcome review ("did this call happen?").
    pub kind: phrony_ledger::ApprovalKind,
    /// The gated call.
    pub call_id: String,
    /// Dispatch ref.
    pub tool: String,
    /// Tool version.
    pub version: String,
    /// The proposed arguments.
    pub args: Value,
    /// Who should decide.
    pub route: String,
    /// Why.
    pub reason: String,
    /// The authority boundary.
    pub authority_ref: String,
    /// The deciding policy (`namespace/name@version`), if a policy opened it.
    pub policy_ref: Option<String>,
    /// The policy's runtime map.
    pub policy_runtime: Map<String, Value>,
    /// Distinct approvers needed.
    pub approvals_required: u32,
    /// Approve votes so far.
    pub approvals_received: u32,
    /// Approvers must acknowledge comprehension.
    pub comprehension_required: bool,
    /// What a rejection does (`return_to_agent` or `fail`).
    pub on_reject: String,
    /// What edited arguments go through (`revalidate` or `unchecked`).
    pub on_modify: String,
    /// When the approval times out.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A vote on, or the outcome of, an approval.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalDecision {
    /// The approval.
    pub approval_id: Uuid,
    /// The gated call.
    pub call_id: String,
    /// `pending` for a vote that did not decide it yet, else the outcome.
    pub status: ApprovalStatus,
    /// The voter, or who decided (`system:timeout` for a timeout).
    pub decided_by: String,
    /// The comment.
    pub comment: String,
    /// Approve votes so far.
    pub approvals_received: u32,
    /// Distinct approvers needed.
    pub approvals_required: u32,
}

/// The session waits for input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwaitingInput {
    /// Why the model ended the last turn.
    pub stop_reason: Option<String>,
    /// Usage at the end of the last turn.
    pub stats: Option<TurnStats>,
    /// Why input cannot be taken now: `awaiting_approval`, `awaiting_tool`, or a limit's
    /// message.
    pub blocked_reason: Option<String>,
}

/// A completed session.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Why the model ended the last turn.
    pub stop_reason: Option<String>,
    /// The session output (§5.9).
    pub output: Value,
    /// Usage at the end.
    pub stats: Option<TurnStats>,
    /// When it completed.
    pub ended_at: DateTime<Utc>,
}

/// The `input_blocked_reason` while the session waits for a decision.
pub const BLOCKED_AWAITING_APPROVAL: &str = "awaiting_approval";
/// The `input_blocked_reason` while the session waits for a tool.
pub const BLOCKED_AWAITING_TOOL: &str = "awaiting_tool";

#[derive(Debug, Clone, Default)]
struct AssistantTurn {
    text: String,
    stop_reason: Option<String>,
    duration_ms: Option<u64>,
}

/// Text forwarded from the deltas of one completion.
#[derive(Debug, Clone, Copy, Default)]
struct Forwarded {
    /// Bytes of the completion's text shown.
    sent: usize,
    /// A delta was missed: nothing more is forwarded for this completion (its
    /// `message.assistant` event fills in the rest).
    gap: bool,
}

/// Turns a session's events into [`Activity`] items; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct SessionView {
    last_seq: u64,
    status: Option<SessionStatus>,
    ended_at: Option<DateTime<Utc>>,
    terminal: Option<Activity>,
    // Text.
    /// Per completion `(turn, iteration)` not recorded yet (deltas of the next completion can
    /// arrive before the previous one's events).
    forwarded: BTreeMap<(u32, u32), Forwarded>,
    /// The last completion recorded, and how much of its text was already shown.
    closed: Option<((u32, u32), usize)>,
    // Turns.
    current_turn: u32,
    turn_open: bool,
    users: BTreeMap<u32, String>,
    assistant: BTreeMap<u32, AssistantTurn>,
    usage: BTreeMap<u32, Usage>,
    last_finished: Option<u32>,
    blocked: Option<String>,
    // Tools and approvals.
    limit_calls: HashSet<String>,
    resulted: HashSet<String>,
    approvals: HashMap<Uuid, ApprovalRequest>,
    approval_status: HashMap<Uuid, ApprovalStatus>,
    approval_order: Vec<Uuid>,
    failure_approvals: HashMap<Uuid, String>,
    /// Tool and approval activity of the turn in progress.
    replay: Vec<Activity>,
}

/// A stored optional text that is present and not empty.
fn non_empty(text: Option<String>) -> Option<String> {
    text.filter(|s| !s.is_empty())
}

/// The ledger's `BadEvent` for an event the schema cannot read, as an engine error.
fn body_of(event: &Event) -> Result<EventBody, EngineError> {
    Ok(event.body().map_err(StoreError::from)?)
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.input_tokens = total.input_tokens.saturating_add(u.input_tokens);
    total.output_tokens = total.output_tokens.saturating_add(u.output_tokens);
    total.estimated |= u.estimated;
}

impl SessionView {
    /// The seq of the last event applied.
    #[must_use]
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The session's status as of the last event applied.
    #[must_use]
    pub fn status(&self) -> Option<SessionStatus> {
        self.status
    }

    /// Whether the session's terminal event was applied.
    #[must_use]
    pub fn ended(&self) -> bool {
        self.terminal.is_some()
    }

    /// Why input is blocked by a limit, if it is.
    #[must_use]
    pub fn input_blocked(&self) -> Option<&str> {
        self.blocked.as_deref()
    }

    /// The items of one update of a [`Subscription`].
    ///
    /// # Errors
    /// As [`SessionView::apply`], for an event the schema cannot read.
    pub fn update(&mut self, update: &SessionUpdate) -> Result<Vec<Activity>, EngineError> {
        Ok(match update {
            SessionUpdate::Event(event) => self.apply(event)?,
            SessionUpdate::TextDelta {
                turn,
                iteration,
                offset,
                text,
            } => self
                .delta(*turn, *iteration, *offset, text)
                .into_iter()
                .collect(),
        })
    }

    /// The items of a streamed delta: its text, unless it was already shown, belongs to a
    /// completion already recorded, or follows a missed delta.
    pub fn delta(
        &mut self,
        turn: u32,
        iteration: u32,
        offset: usize,
        text: &str,
    ) -> Option<Activity> {
        let key = (turn, iteration);
        if self.closed.is_some_and(|(closed, _)| key <= closed) {
            return None;
        }
        let f = self.forwarded.entry(key).or_default();
        if f.gap {
            return None;
        }
        if offset > f.sent {
            f.gap = true;
            return None;
        }
        let end = offset.saturating_add(text.len());
        if end <= f.sent {
            return None;
        }
        let new = text.get(f.sent - offset..)?;
        f.sent = end;
        Some(Activity::Text(new.to_owned()))
    }

    /// The items of one event (none for events at or before the last one applied).
    ///
    /// # Errors
    /// The ledger's `BadEvent` (an `Internal` error) for an event the schema cannot read: the
    /// view never guesses a default for a renamed or missing field.
    pub fn apply(&mut self, event: &Event) -> Result<Vec<Activity>, EngineError> {
        if event.seq <= self.last_seq {
            return Ok(Vec::new());
        }
        let body = body_of(event)?;
        self.last_seq = event.seq;
        let ts = event.ts;
        Ok(match body {
            EventBody::SessionStarted(s) => {
                self.status = Some(s.status);
                Vec::new()
            }
            EventBody::SessionStatusChanged(t) => self.status_changed(t),
            EventBody::SessionCompleted(t) => vec![self.session_completed(t, ts)],
            EventBody::SessionFailed(t) => {
                let message = non_empty(t.message)
                    .or_else(|| non_empty(t.reason))
                    .unwrap_or_else(|| "session failed".to_owned());
                vec![self.end(SessionStatus::Failed, ts, Activity::Failed { message })]
            }
            EventBody::SessionCancelled(_) => vec![self.end(
                SessionStatus::Cancelled,
                ts,
                Activity::Cancelled { ended_at: ts },
            )],
            EventBody::MessageUser(m) => {
                let turn = event.turn.unwrap_or_else(|| {
                    self.users
                        .keys()
                        .next_back()
                        .map_or(1, |t| t.saturating_add(1))
                });
                self.users.insert(turn, m.content);
                Vec::new()
            }
            EventBody::ModelCompletion(record) => {
                self.model_completion(&record);
                Vec::new()
            }
            EventBody::OutputInvalid(invalid) => {
                // The model is asked again: the feedback is the next turn's user message.
                if let Some(feedback) = invalid.feedback {
                    self.users.insert(invalid.turn.saturating_add(1), feedback);
                }
                Vec::new()
            }
            EventBody::MessageAssistant(m) => self.assistant_segment(event.turn, m),
            EventBody::ToolRequested(r) => self.tool_requested(r),
            EventBody::ToolCompleted(c) => self.result(tool_result(c)).into_iter().collect(),
            EventBody::ToolPolicyDenied(d) => self
                .result(ToolResultActivity {
                    call_id: d.call_id,
                    result: None,
                    error_code: Some(error_codes::POLICY_DENIED.to_owned()),
                    error_message: Some(d.reason),
                    policy_ref: non_empty(d.policy_ref),
                })
                .into_iter()
                .collect(),
            EventBody::ToolCancelled(c) => self
                .result(ToolResultActivity {
                    call_id: c.call_id,
                    result: None,
                    error_code: Some(
                        if c.after_dispatch {
                            error_codes::CANCELLED_AFTER_DISPATCH
                        } else {
                            error_codes::CANCELLED
                        }
                        .to_owned(),
                    ),
                    error_message: Some(format!("tool call cancelled: {}", c.reason)),
                    policy_ref: None,
                })
                .into_iter()
                .collect(),
            EventBody::ApprovalRequired(a) => vec![self.approval_required(a)],
            EventBody::ApprovalVote(v) => self.vote(v).into_iter().collect(),
            EventBody::ApprovalDecided(d) => {
                let review = d.resolution.is_some();
                self.decided(
                    Decided {
                        approval_id: d.approval_id,
                        call_id: d.call_id,
                        status: d.status,
                        decided_by: d.decided_by,
                        comment: d.comment,
                    },
                    review,
                )
            }
            EventBody::ApprovalEscalated(e) => self.decided(
                Decided {
                    approval_id: e.approval_id,
                    call_id: e.call_id,
                    status: ApprovalStatus::Escalated,
                    decided_by: e.decided_by,
                    comment: e.comment,
                },
                false,
            ),
            EventBody::SessionPrincipal(_)
            | EventBody::OutputAccepted(_)
            | EventBody::EvidenceRecorded(_)
            | EventBody::ToolQueued(_)
            | EventBody::ToolDispatched(_)
            | EventBody::ToolLateResult(_)
            | EventBody::ToolIndeterminate(_)
            | EventBody::AgentVersionPublished(_)
            | EventBody::AgentDeployed(_)
            | EventBody::AgentRolledBack(_)
            | EventBody::AgentActivationRefused(_)
            | EventBody::AgentVersionDeprecated(_)
            | EventBody::AgentVersionRetired(_)
            | EventBody::AgentArchived(_)
            | EventBody::BundleVersionPublished(_)
            | EventBody::BundleDeployed(_)
            | EventBody::BundleRolledBack(_)
            | EventBody::BundleActivationRefused(_)
            | EventBody::TokenCreated(_)
            | EventBody::TokenRevoked(_)
            | EventBody::WebhookRetryRequested(_)
            | EventBody::WebhookUnconfigured(_)
            | EventBody::AuditKeyIntroduced(_)
            | EventBody::AuditUnverifiedLogAllowed(_)
            | EventBody::WorkerDescriptorRefused(_)
            | EventBody::PolicyShadow(_) => Vec::new(),
        })
    }

    fn status_changed(&mut self, t: SessionTransition) -> Vec<Activity> {
        let to = t.to;
        let reason = non_empty(t.reason);
        self.status = Some(to);
        if to == SessionStatus::AwaitingInput
            && let Some(r) = reason.as_ref().filter(|r| r.starts_with(LIMIT_PREFIX))
        {
            self.blocked = Some(r.clone());
        }
        let mut out = vec![Activity::Status { status: to, reason }];
        if to == SessionStatus::AwaitingInput {
            out.push(Activity::AwaitingInput(self.awaiting_input()));
        }
        out
    }

    fn session_completed(&mut self, t: SessionTransition, ts: DateTime<Utc>) -> Activity {
        let output = t.output.unwrap_or(Value::Null);
        // The session output (§5.9) is the engine's own object, not part of the event schema.
        let stop_reason = output
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| self.last_stop_reason());
        let completion = Activity::Completed(Completion {
            stop_reason,
            output,
            stats: self.stats(),
            ended_at: ts,
        });
        self.end(SessionStatus::Completed, ts, completion)
    }

    fn model_completion(&mut self, record: &ModelCompletion) {
        self.start_turn(record.turn);
        add_usage(self.usage.entry(record.turn).or_default(), &record.usage);
        let key = (record.turn, record.iteration);
        let sent = self.forwarded.remove(&key).map_or(0, |f| f.sent);
        self.forwarded.retain(|k, _| *k > key);
        self.closed = Some((key, sent));
    }

    fn assistant_segment(&mut self, turn: Option<u32>, m: AssistantSegment) -> Vec<Activity> {
        let mut out = Vec::new();
        let turn = turn.unwrap_or(self.current_turn.max(1));
        self.start_turn(turn);
        let content = m.content;
        let shown = match &mut self.closed {
            Some(((t, _), sent)) if *t == turn => std::mem::take(sent),
            _ => 0,
        };
        if let Some(rest) = content.get(shown.min(content.len())..)
            && !rest.is_empty()
        {
            out.push(Activity::Text(rest.to_owned()));
        }
        let entry = self.assistant.entry(turn).or_default();
        // One turn can take several completions (text, tool calls, more text): keep their
        // texts apart in the history.
        if !entry.text.is_empty() && !content.is_empty() {
            entry.text.push_str("\n\n");
        }
        entry.text.push_str(&content);
        if let Some(stop_reason) = non_empty(m.stop_reason) {
            entry.stop_reason = Some(stop_reason);
            entry.duration_ms = m.turn_duration_ms;
            self.last_finished = Some(self.last_finished.map_or(turn, |t| t.max(turn)));
            if turn == self.current_turn {
                self.turn_open = false;
                self.replay.clear();
            }
        }
        out
    }

    fn tool_requested(&mut self, r: ToolRequested) -> Vec<Activity> {
        if r.tool == LIMIT_TOOL || r.tool == crate::fold::OUTPUT_TOOL {
            // Pseudo calls (limit and output escalations) are no model calls.
            self.limit_calls.insert(r.call_id);
            return Vec::new();
        }
        self.start_turn(r.turn);
        let delegation = r.delegation.map(|target| Delegation {
            target,
            child_session_id: crate::child_session_id(&r.call_id),
        });
        let call = Activity::ToolCall(ToolCallActivity {
            call_id: r.call_id,
            tool: r.tool,
            version: r.version,
            wire_name: non_empty(r.wire_name),
            args: r.args,
            delegation,
        });
        vec![self.replayed(call)]
    }

    fn approval_required(&mut self, a: ApprovalRequired) -> Activity {
        let request = approval_request(a);
        let runtime = &request.policy_runtime;
        if runtime.contains_key(TRIGGER_KEY) {
            // The failure the trigger reports is the policy's own runtime map entry.
            let failure = match runtime.get(FAILURE_KEY) {
                Some(Value::String(failure)) => failure.clone(),
                _ => request.reason.clone(),
            };
            self.failure_approvals.insert(request.approval_id, failure);
        }
        self.approval_status
            .insert(request.approval_id, ApprovalStatus::Pending);
        self.approval_order.push(request.approval_id);
        self.approvals.insert(request.approval_id, request.clone());
        self.replayed(Activity::ApprovalRequired(request))
    }

    fn vote(&mut self, v: ApprovalVoted) -> Option<Activity> {
        let request = self.approvals.get_mut(&v.approval_id)?;
        if v.decision != VoteDecision::Approve {
            // A reject decides the approval: its `approval.decided` follows.
            return None;
        }
        request.approvals_received = request.approvals_received.saturating_add(1);
        if request.approvals_received >= request.approvals_required {
            return None;
        }
        let decision = ApprovalDecision {
            approval_id: v.approval_id,
            call_id: request.call_id.clone(),
            status: ApprovalStatus::Pending,
            decided_by: v.decided_by,
            comment: v.comment,
            approvals_received: request.approvals_received,
            approvals_required: request.approvals_required,
        };
        Some(self.replayed(Activity::ApprovalDecided(decision)))
    }

    /// An approval's decision or escalation; `review` for an outcome review's (its
    /// `happened`/`fail` outcome is the `tool.completed` that follows, a `resend` the worker's
    /// new result).
    fn decided(&mut self, d: Decided, review: bool) -> Vec<Activity> {
        let Decided {
            approval_id: id,
            call_id,
            status,
            decided_by,
            comment,
        } = d;
        self.approval_status.insert(id, status);
        let (received, required) = self
            .approvals
            .get(&id)
            .map_or((0, 0), |a| (a.approvals_received, a.approvals_required));
        let mut out = vec![self.replayed(Activity::ApprovalDecided(ApprovalDecision {
            approval_id: id,
            call_id: call_id.clone(),
            status,
            decided_by: decided_by.clone(),
            comment: comment.clone(),
            approvals_received: received,
            approvals_required: required,
        }))];
        let outcome = match status {
            _ if review => None,
            ApprovalStatus::Denied => Some((
                error_codes::APPROVAL_DENIED,
                match self.failure_approvals.get(&id) {
                    Some(failure) => format!("tool dispatch denied after failure: {failure}"),
                    None => rejection_text(&call_id, &decided_by, &comment),
                },
            )),
            ApprovalStatus::Cancelled => Some((
                error_codes::CANCELLED,
                format!("tool call cancelled: {comment}"),
            )),
            _ => None,
        };
        if let Some((code, message)) = outcome {
            out.extend(self.result(ToolResultActivity {
                call_id,
                result: None,
                error_code: Some(code.to_owned()),
                error_message: Some(message),
                policy_ref: None,
            }));
        }
        out
    }
    /// A call's outcome, once per call (limit escalations are not model calls).
    fn result(&mut self, activity: ToolResultActivity) -> Option<Activity> {
        if self.limit_calls.contains(&activity.call_id)
            || !self.resulted.insert(activity.call_id.clone())
        {
            return None;
        }
        Some(self.replayed(Activity::ToolResult(activity)))
    }

    /// Keeps tool and approval activity of the turn in progress for a later catch-up.
    fn replayed(&mut self, activity: Activity) -> Activity {
        if self.turn_open {
            self.replay.push(activity.clone());
        }
        activity
    }

    fn start_turn(&mut self, turn: u32) {
        if turn > self.current_turn {
            self.current_turn = turn;
            self.turn_open = true;
            self.replay.clear();
        }
    }

    fn end(&mut self, status: SessionStatus, ts: DateTime<Utc>, activity: Activity) -> Activity {
        self.status = Some(status);
        self.ended_at = Some(ts);
        self.turn_open = false;
        self.terminal = Some(activity.clone());
        activity
    }

    fn last_stop_reason(&self) -> Option<String> {
        self.last_finished
            .and_then(|t| self.assistant.get(&t))
            .and_then(|a| a.stop_reason.clone())
    }

    fn stats(&self) -> Option<TurnStats> {
        let turn = self.last_finished?;
        let mut session_usage = Usage::default();
        for u in self.usage.values() {
            add_usage(&mut session_usage, u);
        }
        Some(TurnStats {
            turn,
            turn_usage: self.usage.get(&turn).copied().unwrap_or_default(),
            session_usage,
        })
    }

    /// An `awaiting_input` as of now: the last turn's stop reason and stats, and the limit
    /// that blocks input, if any.
    #[must_use]
    pub fn awaiting_input(&self) -> AwaitingInput {
        self.awaiting_input_with(None)
    }

    fn awaiting_input_with(&self, blocked: Option<&str>) -> AwaitingInput {
        AwaitingInput {
            stop_reason: self.last_stop_reason(),
            stats: self.stats(),
            blocked_reason: blocked.map(str::to_owned).or_else(|| self.blocked.clone()),
        }
    }

    /// The pending approvals, oldest first.
    fn pending(&self) -> Vec<ApprovalRequest> {
        self.approval_order
            .iter()
            .filter(|id| self.approval_status.get(id) == Some(&ApprovalStatus::Pending))
            .filter_map(|id| self.approvals.get(id).cloned())
            .collect()
    }

    /// Whether the turn in progress is still running (its text is not history yet).
    fn in_turn(&self) -> bool {
        self.turn_open
            && matches!(
                self.status,
                Some(
                    SessionStatus::Running
                        | SessionStatus::AwaitingTool
                        | SessionStatus::AwaitingApproval
                )
            )
    }

    fn history(&self) -> Vec<HistoryEntry> {
        let in_turn = self.in_turn().then_some(self.current_turn);
        let turns: std::collections::BTreeSet<u32> = self
            .users
            .keys()
            .chain(self.assistant.keys())
            .copied()
            .collect();
        let mut out = Vec::new();
        for turn in turns {
            if let Some(content) = self.users.get(&turn) {
                out.push(HistoryEntry {
                    role: "user".to_owned(),
                    content: content.clone(),
                    stop_reason: None,
                    turn_usage: None,
                    turn_duration_ms: None,
                });
            }
            if Some(turn) == in_turn {
                continue;
            }
            if let Some(a) = self.assistant.get(&turn) {
                out.push(HistoryEntry {
                    role: "assistant".to_owned(),
                    content: a.text.clone(),
                    stop_reason: a.stop_reason.clone(),
                    turn_usage: self.usage.get(&turn).copied(),
                    turn_duration_ms: a.duration_ms,
                });
            }
        }
        out
    }

    /// The catch-up items (see [`CatchUp::activities`]); `streaming` is the live session's
    /// current completion text, shown if that completion is not recorded yet.
    fn catch_up(&mut self, streaming: Option<StreamingText>) -> Vec<Activity> {
        let mut out = Vec::new();
        if let Some(terminal) = &self.terminal {
            out.push(terminal.clone());
            return out;
        }
        // The first completion of a turn is streaming: nothing of the turn is recorded yet.
        let streaming = streaming.filter(|s| {
            !s.text.is_empty()
                && self
                    .closed
                    .is_none_or(|(closed, _)| (s.turn, s.iteration) > closed)
        });
        if let Some(s) = &streaming
            && matches!(
                self.status,
                Some(SessionStatus::Running | SessionStatus::AwaitingTool)
            )
        {
            self.start_turn(s.turn);
        }
        if self.in_turn() {
            let mut text = self
                .assistant
                .get(&self.current_turn)
                .map(|a| a.text.clone())
                .unwrap_or_default();
            if let Some(s) = streaming
                && s.turn == self.current_turn
            {
                text.push_str(&s.text);
                self.forwarded.insert(
                    (s.turn, s.iteration),
                    Forwarded {
                        sent: s.text.len(),
                        gap: false,
                    },
                );
            }
            if !text.is_empty() {
                out.push(Activity::Text(text));
            }
        }
        let pending = self.pending();
        out.extend(
            self.replay
                .iter()
                // A pending approval is shown once, with its votes so far, in the state below.
                .filter(|a| {
                    let id = match a {
                        Activity::ApprovalRequired(r) => r.approval_id,
                        Activity::ApprovalDecided(d) => d.approval_id,
                        _ => return true,
                    };
                    !pending.iter().any(|p| p.approval_id == id)
                })
                .cloned(),
        );
        let status = self.status.unwrap_or(SessionStatus::Running);
        out.push(Activity::Status {
            status,
            reason: (status == SessionStatus::AwaitingInput)
                .then(|| self.blocked.clone())
                .flatten(),
        });
        match status {
            SessionStatus::AwaitingApproval => {
                out.extend(pending.into_iter().map(Activity::ApprovalRequired));
                out.push(Activity::AwaitingInput(
                    self.awaiting_input_with(Some(BLOCKED_AWAITING_APPROVAL)),
                ));
            }
            SessionStatus::AwaitingTool => out.push(Activity::AwaitingInput(
                self.awaiting_input_with(Some(BLOCKED_AWAITING_TOOL)),
            )),
            SessionStatus::AwaitingInput => {
                out.push(Activity::AwaitingInput(self.awaiting_input()));
            }
            _ => {}
        }
        out
    }
}

/// What an approval decision or escalation says, for the view.
struct Decided {
    approval_id: Uuid,
    call_id: String,
    status: ApprovalStatus,
    decided_by: String,
    comment: String,
}

/// A finished call's outcome, as the model receives it.
fn tool_result(c: ToolCompleted) -> ToolResultActivity {
    if c.status == CallStatus::Succeeded {
        ToolResultActivity {
            call_id: c.call_id,
            result: Some(c.result.unwrap_or(Value::Null)),
            error_code: None,
            error_message: None,
            policy_ref: None,
        }
    } else {
        let code = c.error_code.unwrap_or_default();
        let message = c.error_message.unwrap_or_default();
        ToolResultActivity {
            call_id: c.call_id,
            result: None,
            error_message: Some(failure_text(&code, &message)),
            error_code: Some(code).filter(|c| !c.is_empty()),
            policy_ref: None,
        }
    }
}

fn approval_request(a: ApprovalRequired) -> ApprovalRequest {
    ApprovalRequest {
        approval_id: a.approval_id,
        kind: a.kind,
        call_id: a.call_id,
        tool: a.tool,
        version: a.version,
        args: a.args,
        route: a.route,
        reason: a.reason,
        authority_ref: a.authority_ref,
        policy_ref: non_empty(a.policy_ref),
        policy_runtime: a.policy_runtime,
        approvals_required: a.approvals_required.max(1),
        approvals_received: 0,
        comprehension_required: a.comprehension_required,
        on_reject: a.on_reject.as_str().to_owned(),
        on_modify: a.on_modify.as_str().to_owned(),
        expires_at: a.expires_at,
    }
}

impl Engine {
    /// Attaches a client to a session: what to show first and the live updates after it (see
    /// the [`Attachment`] docs). With [`AttachFrom::Now`] the catch-up summarises the session
    /// as of the last event read and the updates start right after that event; with
    /// [`AttachFrom::Start`] every event of the session is an update.
    ///
    /// # Errors
    /// `NotFound` for an unknown session; store errors; `Internal` when the session's agent
    /// version no longer loads.
    pub async fn attach(
        &self,
        session_id: &str,
        from: AttachFrom,
    ) -> Result<Attachment, EngineError> {
        let inner = &self.inner;
        let session = inner.store.get_session(session_id).await?;
        let stored = inner.store.agent_version(session.agent_version_id).await?;
        let agent =
            CompiledAgent::from_snapshot_json(stored.snapshot_json.as_bytes()).map_err(|e| {
                EngineError::new(
                    ErrorKind::Internal,
                    format!(
                        "the agent version {} of session {session_id} does not load: {e}",
                        session.agent_version_id
                    ),
                )
            })?;
        let mut view = SessionView::default();
        let mut evidence = None;
        let mut read = |view: &mut SessionView, page: &[Event]| -> Result<(), EngineError> {
            for event in page {
                if event.event_type == types::EVIDENCE_RECORDED
                    && let EventBody::EvidenceRecorded(snapshot) = body_of(event)?
                {
                    evidence = Some(Value::Object(snapshot));
                }
                if from == AttachFrom::Now {
                    view.apply(event)?;
                }
            }
            Ok(())
        };
        let mut last = 0;
        loop {
            let page = inner.store.events_after(session_id, last, 500).await?;
            let Some(end) = page.last() else { break };
            last = end.seq;
            read(&mut view, &page)?;
            if from == AttachFrom::Start {
                // Only the evidence is needed; it is recorded when the session starts.
                break;
            }
        }
        // Subscribed before the streamed text is read, so no delta falls in between (the view
        // skips the ones the text already holds, and the events it applies below).
        let mut updates = (!view.ended()).then(|| {
            Subscription::start(
                std::sync::Arc::clone(inner),
                session_id.to_owned(),
                view.last_seq(),
            )
        });
        let (history, activities) = match from {
            AttachFrom::Now => {
                // The streamed text is of the completion after the last event read only if no
                // event was recorded since: a completion that ended meanwhile (and the next
                // one streaming) would otherwise show its text after the later one's.
                let streaming = loop {
                    let streaming = inner.live(session_id).map(|l| l.streaming_text());
                    let newer = inner
                        .store
                        .events_after(session_id, view.last_seq(), 500)
                        .await?;
                    if newer.is_empty() {
                        break streaming;
                    }
                    read(&mut view, &newer)?;
                };
                if view.ended() {
                    // It ended meanwhile: the catch-up carries the terminal item.
                    updates = None;
                }
                (view.history(), view.catch_up(streaming))
            }
            AttachFrom::Start => (Vec::new(), Vec::new()),
        };
        let ended_at = view.ended_at.or(session.ended_at);
        Ok(Attachment {
            catch_up: CatchUp {
                model_provider: agent.spec.model.provider.clone(),
                model_name: agent.spec.model.name.clone(),
                history,
                evidence,
                ended_at,
                activities,
                session,
            },
            view,
            updates,
        })
    }
}

#[cfg(test)]
#[path = "attach_tests.rs"]
mod tests;
