//! Folding a session's event stream into what the engine needs: the conversation sent to the
//! model, the session output, token usage, turn bookkeeping.
//!
//! The event log is the source of truth: the live driver feeds the fold every event it reads
//! back from the store before each completion, and recovery feeds it the whole stream, so a
//! resumed session sends the model exactly what the live one would have.

use std::collections::{BTreeMap, HashMap};

use phrony_ledger::{
    ApprovalStatus, CallStatus, Event, EventBody, HiddenTool, ModelCompletion, OutputInvalid,
    Reasoning, SessionStatus, ToolCompleted, ToolRequested, TurnUsage,
};
use phrony_providers::{ContentBlock, Message, ReasoningBlock, Role, Usage};
use serde::Serialize;

use crate::error::StoreError;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// Engine-owned event types (the store owns the §5.10 ones).
pub mod engine_events {
    /// One model completion: `{turn, iteration, stop_reason, usage, duration_ms, tool_calls,
    /// reasoning?}` (actor `agent`), recorded before the completion's text and tool calls.
    pub const MODEL_COMPLETION: &str = "model.completion";
    /// The claims of the principal the session runs for: `{claims}` (actor `system`).
    pub const SESSION_PRINCIPAL: &str = "session.principal";
}

/// Error codes the engine records on calls it fails itself.
pub mod codes {
    /// The model called a tool the agent does not have.
    pub const UNKNOWN_TOOL: &str = "unknown_tool";
    /// The arguments do not match the binding's input schema.
    pub const INVALID_ARGS: &str = "invalid_args";
    /// The arguments are larger than the engine dispatches (`max_tool_args_bytes`).
    pub const ARGS_TOO_LARGE: &str = "args_too_large";
    /// The model requested more calls in one response than the engine runs
    /// (`max_tool_calls_per_turn`).
    pub const TOO_MANY_CALLS: &str = "too_many_tool_calls";
    /// The worker may or may not have run the call.
    pub const INDETERMINATE: &str = "indeterminate";
    /// A delegation's child would be deeper than the delegating agent's `max_subagent_depth`.
    pub const SUBAGENT_DEPTH_EXCEEDED: &str = "subagent_depth_exceeded";
    /// A delegation binding names no frozen version and is not late-bound.
    pub const SUBAGENT_UNPINNED: &str = "subagent_unpinned";
    /// A late-bound (or version-pinned) delegation target has no runnable version.
    pub const SUBAGENT_UNRESOLVED: &str = "subagent_unresolved";
    /// A delegation's target version could not be loaded or its child started.
    pub const SUBAGENT_LOAD_FAILED: &str = "subagent_load_failed";
    /// A secret the delegated agent declares is not among the root session's secrets.
    pub const SUBAGENT_MISSING_SECRET: &str = "subagent_missing_secret";
    /// The delegated child session failed.
    pub const SUBAGENT_FAILED: &str = "subagent_failed";
    /// The delegated child session was cancelled (by someone other than its parent).
    pub const SUBAGENT_CANCELLED: &str = "subagent_cancelled";
}

/// Marker in an approval's `policy_runtime` for approvals opened by a dispatch failure: the
/// trigger (`dispatch:no_handler`, `dispatch:indeterminate`, …).
pub const TRIGGER_KEY: &str = "phrony.com/trigger";

/// The failure an approval opened by a dispatch failure is about (in `policy_runtime`).
pub const FAILURE_KEY: &str = "phrony.com/failure";

/// The prefix of limit messages that block further input (`run limit <kind> exceeded …`).
pub const LIMIT_PREFIX: &str = "run limit ";

/// The pseudo tool of limit escalations: a `limit:escalate` approval gates this recorded call
/// (version = the limit kind, arguments = `{limit, used, max}`); the model never sees it.
pub const LIMIT_TOOL: &str = "phrony.limit";

/// The pseudo tool of output escalations (`output.on_invalid: escalate`): an approval on this
/// recorded call (version `1`, arguments `{answer, errors}`) asks a human to accept a final
/// answer that failed the output check (approve: the session completes with it) or not
/// (reject: the session fails). The model never sees it.
pub const OUTPUT_TOOL: &str = "phrony.output";

/// One model completion as the engine works with it (stored as
/// [`phrony_ledger::ModelCompletion`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CompletionRecord {
    pub(crate) turn: u32,
    pub(crate) iteration: u32,
    pub(crate) stop_reason: String,
    pub(crate) usage: Usage,
    pub(crate) duration_ms: u64,
    pub(crate) tool_calls: Vec<ToolCallRecord>,
    pub(crate) reasoning: Vec<ReasoningBlock>,
    /// The tools policy hid from this completion's request.
    pub(crate) hidden_tools: Vec<HiddenTool>,
}

impl From<ModelCompletion> for CompletionRecord {
    fn from(m: ModelCompletion) -> Self {
        Self {
            turn: m.turn,
            iteration: m.iteration,
            stop_reason: m.stop_reason,
            usage: Usage {
                input_tokens: m.usage.input_tokens,
                output_tokens: m.usage.output_tokens,
                estimated: m.usage.estimated,
            },
            duration_ms: m.duration_ms,
            tool_calls: m
                .tool_calls
                .into_iter()
                .map(|c| ToolCallRecord {
                    index: c.index,
                    name: c.name,
                    args: c.args,
                    refused: c.refused.map(|r| CallRefusal {
                        code: r.code,
                        message: r.message,
                    }),
                })
                .collect(),
            reasoning: m
                .reasoning
                .into_iter()
                .map(|r| match r {
                    Reasoning::Thinking {
                        thinking,
                        signature,
                    } => ReasoningBlock::Thinking {
                        thinking,
                        signature,
                    },
                    Reasoning::Redacted { data } => ReasoningBlock::Redacted { data },
                })
                .collect(),
            hidden_tools: m.hidden_tools,
        }
    }
}

impl From<&CompletionRecord> for ModelCompletion {
    fn from(r: &CompletionRecord) -> Self {
        Self {
            turn: r.turn,
            iteration: r.iteration,
            stop_reason: r.stop_reason.clone(),
            usage: phrony_ledger::Usage {
                input_tokens: r.usage.input_tokens,
                output_tokens: r.usage.output_tokens,
                estimated: r.usage.estimated,
            },
            duration_ms: r.duration_ms,
            tool_calls: r
                .tool_calls
                .iter()
                .map(|c| phrony_ledger::CompletionToolCall {
                    index: c.index,
                    name: c.name.clone(),
                    args: c.args.clone(),
                    refused: c.refused.as_ref().map(|f| phrony_ledger::CallRefusal {
                        code: f.code.clone(),
                        message: f.message.clone(),
                    }),
                })
                .collect(),
            reasoning: r
                .reasoning
                .iter()
                .map(|b| match b {
                    ReasoningBlock::Thinking {
                        thinking,
                        signature,
                    } => Reasoning::Thinking {
                        thinking: thinking.clone(),
                        signature: signature.clone(),
                    },
                    ReasoningBlock::Redacted { data } => Reasoning::Redacted { data: data.clone() },
                })
                .collect(),
            hidden_tools: r.hidden_tools.clone(),
        }
    }
}

/// One tool call of a completion, as the model produced it (within the engine's bounds: see
/// [`ToolCallRecord::bounded`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCallRecord {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) args: Value,
    /// Why the engine will not run this call (a tool error for the model), if it will not.
    pub(crate) refused: Option<CallRefusal>,
}

/// A model tool call the engine refuses before binding or policy: its tool-error code and
/// message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallRefusal {
    pub(crate) code: String,
    pub(crate) message: String,
}

/// The name recorded for a model tool call that named no tool (the conversation sent back to
/// the model needs one).
pub(crate) const UNNAMED_TOOL: &str = "unnamed_tool";

impl ToolCallRecord {
    /// The `index`-th call of a response of `total` calls, refused when it names no tool, when
    /// it is beyond the first `max_calls`, or when its arguments exceed `max_args_bytes` (they
    /// are then replaced by `{}`, so they are neither stored nor sent back to the model).
    pub(crate) fn bounded(
        index: u32,
        name: String,
        args: Value,
        total: usize,
        max_calls: usize,
        max_args_bytes: usize,
    ) -> Self {
        let refuse = |code: &str, message: String| {
            Some(CallRefusal {
                code: code.to_owned(),
                message,
            })
        };
        let size = serde_json::to_vec(&args).map_or(usize::MAX, |b| b.len());
        let position = usize::try_from(index).unwrap_or(usize::MAX);
        let (name, refused) = if name.trim().is_empty() {
            (
                UNNAMED_TOOL.to_owned(),
                refuse(
                    codes::UNKNOWN_TOOL,
                    "the tool call names no tool; call one of the tools you were given".to_owned(),
                ),
            )
        } else {
            (name, None)
        };
        let refused = refused.or_else(|| {
            (position >= max_calls).then(|| CallRefusal {
                code: codes::TOO_MANY_CALLS.to_owned(),
                message: format!(
                    "this response requested {total} tool calls; at most {max_calls} run per \
                     response, so this one (number {}) was not run; request it again",
                    position.saturating_add(1)
                ),
            })
        });
        let (args, refused) = match refused {
            None if size > max_args_bytes => (
                json!({}),
                refuse(
                    codes::ARGS_TOO_LARGE,
                    format!(
                        "the arguments are {size} bytes of JSON; at most {max_args_bytes} are \
                         allowed, so the call was not run"
                    ),
                ),
            ),
            r => (args, r),
        };
        Self {
            index,
            name,
            args,
            refused,
        }
    }
}

/// The id a tool call has in the model's conversation: the call id, or `call_` + the first 32
/// hex digits of its SHA-256 when it is longer than 64 characters (vendor limits).
#[must_use]
pub fn wire_call_id(call_id: &str) -> String {
    if call_id.len() <= 64 {
        return call_id.to_owned();
    }
    let digest = hex::encode(Sha256::digest(call_id.as_bytes()));
    format!("call_{}", &digest[..32])
}

/// The text the model sees for a call the runtime failed with `code` and `message`: the
/// message alone for the engine's complete sentences, else `code: message` (the form worker
/// errors take).
pub(crate) fn failure_text(code: &str, message: &str) -> String {
    match (code.is_empty(), message.is_empty()) {
        (_, false) if code == codes::UNKNOWN_TOOL => message.to_owned(),
        (false, false) => format!("{code}: {message}"),
        (false, true) => code.to_owned(),
        (true, _) => message.to_owned(),
    }
}

/// What the model is told about a call an operator confirmed happened (an outcome review
/// resolved `happened`), with the result the operator supplied, if any.
pub(crate) fn confirmed_text(operator: &str, result: &Value) -> String {
    let base = format!(
        "the worker did not report this call's outcome; operator {operator} confirmed that it \
         took effect"
    );
    match result {
        Value::Null => base,
        other => format!("{base}. Result: {other}"),
    }
}

/// What a rejected approval tells the model.
pub(crate) fn rejection_text(call_id: &str, decided_by: &str, comment: &str) -> String {
    if comment.trim().is_empty() {
        format!("tool call {call_id} was rejected by {decided_by}")
    } else {
        format!("tool call {call_id} was rejected by {decided_by}: {comment}")
    }
}

#[derive(Debug, Clone)]
struct OpenAssistant {
    turn: u32,
    iteration: Option<u32>,
    text: String,
    reasoning: Vec<ReasoningBlock>,
    /// `(index, call_id, wire name, args)`.
    calls: Vec<(u32, String, String, Value)>,
}

/// One finished turn, for the session output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TurnRecord {
    pub(crate) turn: u32,
    pub(crate) stop_reason: String,
    pub(crate) turn_usage: Option<TurnUsage>,
    pub(crate) turn_duration_ms: Option<u64>,
}

impl TurnRecord {
    /// The record of the turn `message` finishes; `None` for a segment that does not finish
    /// its turn (no stop reason). As [`Fold::apply`] records a folded `message.assistant`.
    pub(crate) fn finished_by(message: &phrony_ledger::AssistantMessage) -> Option<Self> {
        Some(Self {
            turn: message.turn,
            stop_reason: message.stop_reason.clone()?,
            turn_usage: message.turn_usage.map(TurnUsage::from),
            turn_duration_ms: message.turn_duration_ms,
        })
    }
}

/// The fold of one session's stream. Feed events in `seq` order with [`Fold::apply`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Fold {
    last_seq: u64,
    flushed: Vec<Message>,
    open: Option<OpenAssistant>,
    /// Model-facing outcome per call id: `(content, is_error)`.
    results: HashMap<String, (String, bool)>,
    /// User messages not yet placed, by turn.
    users: BTreeMap<u32, String>,
    /// The last turn whose user message was placed or whose model activity started.
    placed_turn: u32,
    /// Failure approvals: approval id → the failure text.
    failure_approvals: HashMap<String, String>,
    /// Per turn: the next completion iteration.
    next_iteration: HashMap<u32, u32>,
    pub(crate) turns: Vec<TurnRecord>,
    pub(crate) last_assistant: Option<String>,
    pub(crate) completions: u64,
    pub(crate) tokens_used: u64,
    /// Sum of this turn's completion usage, per turn.
    pub(crate) turn_usage: HashMap<u32, Usage>,
    pub(crate) max_user_turn: u32,
    /// Turns that have their user message.
    pub(crate) user_turns: std::collections::BTreeSet<u32>,
    pub(crate) max_started_turn: u32,
    pub(crate) last_finished_turn: u32,
    pub(crate) input_blocked: Option<String>,
    pub(crate) principal: Option<Value>,
    pub(crate) last_completion: Option<CompletionRecord>,
    /// `output.invalid` events so far (the number of failed output checks).
    pub(crate) output_failures: u32,
    /// The latest `output.invalid`.
    pub(crate) output_invalid: Option<OutputInvalid>,
    /// The accepted output (`output.accepted`) and the turn whose answer it is.
    pub(crate) output_accepted: Option<(u32, Value)>,
}

impl Fold {
    /// The seq of the last event applied.
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The next completion iteration of `turn` (0 when none ran yet).
    pub(crate) fn next_iteration(&self, turn: u32) -> u32 {
        self.next_iteration.get(&turn).copied().unwrap_or(0)
    }

    /// Applies one event (events at or below the last applied seq are ignored).
    ///
    /// # Errors
    /// The ledger's `BadEvent` (as a store error) for an event the schema cannot read: the fold
    /// never guesses a default for a renamed or missing field.
    pub(crate) fn apply(&mut self, event: &Event) -> Result<(), StoreError> {
        if event.seq <= self.last_seq {
            return Ok(());
        }
        let body = event.body()?;
        self.last_seq = event.seq;
        match body {
            EventBody::MessageUser(m) => {
                let turn = event.turn.unwrap_or(self.max_user_turn + 1);
                self.max_user_turn = self.max_user_turn.max(turn);
                self.user_turns.insert(turn);
                self.users.insert(turn, m.content);
            }
            EventBody::ModelCompletion(stored) => self.model_completion(stored),
            EventBody::MessageAssistant(m) => {
                let turn = event.turn.unwrap_or(self.max_started_turn);
                self.start_activity(turn);
                let open = self.open.get_or_insert_with(|| OpenAssistant {
                    turn,
                    iteration: None,
                    text: String::new(),
                    reasoning: Vec::new(),
                    calls: Vec::new(),
                });
                open.text.push_str(&m.content);
                if let Some(stop_reason) = m.stop_reason {
                    self.last_assistant = Some(m.content);
                    self.turns.push(TurnRecord {
                        turn,
                        stop_reason,
                        turn_usage: m.turn_usage,
                        turn_duration_ms: m.turn_duration_ms,
                    });
                    self.last_finished_turn = self.last_finished_turn.max(turn);
                    self.finalize_open();
                }
            }
            EventBody::ToolRequested(r) if r.tool == LIMIT_TOOL || r.tool == OUTPUT_TOOL => {}
            EventBody::OutputInvalid(invalid) => {
                self.output_failures = self.output_failures.saturating_add(1);
                if let Some(feedback) = &invalid.feedback {
                    // The model is asked again: the feedback is the next turn's user message.
                    let turn = invalid.turn.saturating_add(1);
                    self.max_user_turn = self.max_user_turn.max(turn);
                    self.user_turns.insert(turn);
                    self.users.insert(turn, feedback.clone());
                }
                self.output_invalid = Some(invalid);
            }
            EventBody::OutputAccepted(a) => self.output_accepted = Some((a.turn, a.output)),
            EventBody::ToolRequested(r) => self.tool_requested(r),
            EventBody::ToolCompleted(c) => self.tool_completed(c),
            EventBody::ToolPolicyDenied(d) => {
                self.results.insert(d.call_id, (d.reason, true));
            }
            EventBody::ToolCancelled(c) => {
                self.results.insert(
                    c.call_id,
                    (format!("tool call cancelled: {}", c.reason), true),
                );
            }
            EventBody::ApprovalRequired(a) => {
                if a.policy_runtime.get(TRIGGER_KEY).is_some() {
                    let failure = a
                        .policy_runtime
                        .get(FAILURE_KEY)
                        .and_then(Value::as_str)
                        .map_or_else(|| a.reason.clone(), str::to_owned);
                    self.failure_approvals
                        .insert(a.approval_id.to_string(), failure);
                }
            }
            EventBody::ApprovalDecided(d) if d.resolution.is_some() => {
                // An outcome review: `happened` and `fail` are told by the `tool.completed`
                // that follows, `resend` by the worker's new result.
            }
            EventBody::ApprovalDecided(d) => match d.status {
                ApprovalStatus::Denied => {
                    let content = match self.failure_approvals.get(&d.approval_id.to_string()) {
                        Some(failure) => format!("tool dispatch denied after failure: {failure}"),
                        None => rejection_text(&d.call_id, &d.decided_by, &d.comment),
                    };
                    self.results.insert(d.call_id, (content, true));
                }
                ApprovalStatus::Cancelled => {
                    self.results.insert(
                        d.call_id,
                        (format!("tool call cancelled: {}", d.comment), true),
                    );
                }
                ApprovalStatus::Pending | ApprovalStatus::Approved | ApprovalStatus::Escalated => {}
            },
            EventBody::SessionStatusChanged(t) => {
                if let Some(reason) = t.reason
                    && t.to == SessionStatus::AwaitingInput
                    && reason.starts_with(LIMIT_PREFIX)
                {
                    self.input_blocked = Some(reason);
                }
            }
            EventBody::SessionPrincipal(p) => {
                self.principal = Some(p.claims);
            }
            // Nothing the conversation or the output is built from.
            EventBody::SessionStarted(_)
            | EventBody::SessionCompleted(_)
            | EventBody::SessionFailed(_)
            | EventBody::SessionCancelled(_)
            | EventBody::EvidenceRecorded(_)
            | EventBody::ToolQueued(_)
            | EventBody::ToolDispatched(_)
            | EventBody::ToolLateResult(_)
            | EventBody::ToolIndeterminate(_)
            | EventBody::ApprovalVote(_)
            | EventBody::ApprovalEscalated(_)
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
            | EventBody::PolicyShadow(_) => {}
        }
        Ok(())
    }

    /// A completion opens its assistant message and counts its usage.
    fn model_completion(&mut self, stored: ModelCompletion) {
        let record = CompletionRecord::from(stored);
        self.start_activity(record.turn);
        if self
            .open
            .as_ref()
            .is_some_and(|o| o.turn != record.turn || o.iteration != Some(record.iteration))
        {
            self.finalize_open();
        }
        self.open = Some(OpenAssistant {
            turn: record.turn,
            iteration: Some(record.iteration),
            text: String::new(),
            reasoning: record.reasoning.clone(),
            calls: Vec::new(),
        });
        self.completions += 1;
        self.tokens_used = self.tokens_used.saturating_add(record.usage.total());
        let u = self.turn_usage.entry(record.turn).or_default();
        u.input_tokens = u.input_tokens.saturating_add(record.usage.input_tokens);
        u.output_tokens = u.output_tokens.saturating_add(record.usage.output_tokens);
        u.estimated |= record.usage.estimated;
        let next = self.next_iteration.entry(record.turn).or_default();
        *next = (*next).max(record.iteration + 1);
        self.last_completion = Some(record);
    }

    /// A model call joins the assistant message of its completion.
    fn tool_requested(&mut self, r: ToolRequested) {
        let turn = r.turn;
        let iteration = Some(r.iteration);
        self.start_activity(turn);
        let same = self
            .open
            .as_ref()
            .is_some_and(|o| o.turn == turn && (o.iteration.is_none() || o.iteration == iteration));
        if !same {
            self.finalize_open();
            self.open = Some(OpenAssistant {
                turn,
                iteration,
                text: String::new(),
                reasoning: Vec::new(),
                calls: Vec::new(),
            });
        }
        if let Some(open) = self.open.as_mut() {
            if open.iteration.is_none() {
                open.iteration = iteration;
            }
            let name = r.wire_name.unwrap_or(r.tool);
            open.calls.push((r.index, r.call_id, name, r.args));
        }
    }

    /// A call's outcome, as the model receives it.
    fn tool_completed(&mut self, c: ToolCompleted) {
        // A delegated child's usage is charged to the parent (`max_tokens_per_run`).
        if let Some(u) = &c.usage {
            self.tokens_used = self
                .tokens_used
                .saturating_add(u.input_tokens.saturating_add(u.output_tokens));
        }
        let outcome = if c.status == CallStatus::Succeeded {
            let result = c.result.unwrap_or(Value::Null);
            let content = match (c.resolved_by.as_deref(), result) {
                (Some(by), result) => confirmed_text(by, &result),
                (None, Value::Null) => "{}".to_owned(),
                (None, other) => other.to_string(),
            };
            (content, false)
        } else {
            (
                failure_text(
                    c.error_code.as_deref().unwrap_or_default(),
                    c.error_message.as_deref().unwrap_or_default(),
                ),
                true,
            )
        };
        self.results.insert(c.call_id, outcome);
    }

    /// Places the user messages of every turn up to `turn` before `turn`'s model activity.
    fn start_activity(&mut self, turn: u32) {
        self.max_started_turn = self.max_started_turn.max(turn);
        if turn > self.placed_turn {
            self.finalize_open();
            self.place_users(turn);
        }
    }

    fn place_users(&mut self, up_to: u32) {
        let later = self.users.split_off(&(up_to + 1));
        let placed = std::mem::replace(&mut self.users, later);
        for (_, text) in placed {
            self.flushed.push(Message::user_text(text));
        }
        self.placed_turn = self.placed_turn.max(up_to);
    }

    fn finalize_open(&mut self) {
        if let Some(open) = self.open.take() {
            let (assistant, results) = self.render(&open);
            if let Some(m) = assistant {
                self.flushed.push(m);
            }
            if let Some(m) = results {
                self.flushed.push(m);
            }
        }
    }

    /// The assistant message of `open` and, when it called tools, the user message with their
    /// results (a call with no recorded outcome gets an error result, so the conversation stays
    /// well formed).
    fn render(&self, open: &OpenAssistant) -> (Option<Message>, Option<Message>) {
        let mut content: Vec<ContentBlock> = open
            .reasoning
            .iter()
            .cloned()
            .map(ContentBlock::Reasoning)
            .collect();
        if !open.text.is_empty() {
            content.push(ContentBlock::Text {
                text: open.text.clone(),
            });
        }
        let mut calls = open.calls.clone();
        calls.sort_by_key(|c| c.0);
        for (_, call_id, name, args) in &calls {
            content.push(ContentBlock::ToolUse {
                id: wire_call_id(call_id),
                name: name.clone(),
                args: args.clone(),
            });
        }
        let assistant = (!content.is_empty()).then_some(Message {
            role: Role::Assistant,
            content,
        });
        let results = (!calls.is_empty()).then(|| Message {
            role: Role::User,
            content: calls
                .iter()
                .map(|(_, call_id, _, _)| {
                    let (text, is_error) =
                        self.results.get(call_id).cloned().unwrap_or_else(|| {
                            (format!("tool call {call_id} has no recorded outcome"), true)
                        });
                    ContentBlock::ToolResult {
                        tool_use_id: wire_call_id(call_id),
                        content: text,
                        is_error,
                    }
                })
                .collect(),
        });
        (assistant, results)
    }

    /// The tool calls of `turn`'s latest completion when some of them have no outcome yet:
    /// `(iteration, calls)`.
    pub(crate) fn unresolved_calls(
        &self,
        turn: u32,
        session_id: &str,
        agent_version_id: uuid::Uuid,
    ) -> Option<(u32, Vec<ToolCallRecord>)> {
        let rec = self.last_completion.as_ref()?;
        if rec.turn != turn || rec.tool_calls.is_empty() {
            return None;
        }
        let open = rec.tool_calls.iter().any(|c| {
            let id = phrony_ledger::tool_call_id(
                session_id,
                agent_version_id,
                turn,
                rec.iteration,
                c.index,
            );
            !self.results.contains_key(&id)
        });
        open.then(|| (rec.iteration, rec.tool_calls.clone()))
    }

    /// The conversation to send for a completion of `turn`.
    pub(crate) fn messages(&self, turn: u32) -> Vec<Message> {
        let mut out = self.flushed.clone();
        if let Some(open) = &self.open {
            let (assistant, results) = self.render(open);
            out.extend(assistant);
            out.extend(results);
        }
        for (t, text) in &self.users {
            if *t <= turn {
                out.push(Message::user_text(text.clone()));
            }
        }
        out
    }

    /// The session output (§5.9): `{message, stop_reason, turn_usage, session_usage, turns}`.
    pub(crate) fn output(&self) -> Value {
        self.output_of(&self.turns, self.last_assistant.as_deref())
    }

    /// The output [`Fold::output`] returns once the final segment of a turn, `last` (with its
    /// turn record) and `message` (its text), is folded: a task's last completion is recorded
    /// in the transaction that completes the session, before the fold has seen it.
    pub(crate) fn output_after(&self, last: TurnRecord, message: &str) -> Value {
        let mut turns = self.turns.clone();
        turns.push(last);
        self.output_of(&turns, Some(message))
    }

    fn output_of(&self, turns: &[TurnRecord], message: Option<&str>) -> Value {
        let mut session = (0u64, 0u64, false);
        for u in turns.iter().filter_map(|t| t.turn_usage) {
            session.0 += u.input_tokens;
            session.1 += u.output_tokens;
            session.2 |= u.estimated;
        }
        let last = turns.last();
        let mut output = json!({
            "message": message.unwrap_or_default(),
            "stop_reason": last.map(|t| t.stop_reason.clone()),
            "turn_usage": last.and_then(|t| t.turn_usage),
            "session_usage": {
                "input_tokens": session.0,
                "output_tokens": session.1,
                "total_tokens": session.0 + session.1,
                "estimated": session.2,
            },
            "turns": turns,
        });
        // `output.format: json`: the accepted JSON output (absent for text output, whose
        // output is unchanged).
        if let (Some((_, json)), Value::Object(map)) = (&self.output_accepted, &mut output) {
            map.insert("json".to_owned(), json.clone());
        }
        output
    }
}

/// How many times each limit (by kind) was raised by an approved `limit:escalate` approval
/// among `approvals` (a session's).
pub(crate) fn limit_grants(
    approvals: &[phrony_ledger::Approval],
) -> std::collections::HashMap<String, u64> {
    let mut grants = std::collections::HashMap::new();
    for a in approvals {
        if a.tool == LIMIT_TOOL && a.status == phrony_ledger::ApprovalStatus::Approved {
            *grants.entry(a.tool_version.clone()).or_insert(0) += 1;
        }
    }
    grants
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_call_ids_map_to_stable_wire_ids() {
        let long =
            "run_6b1f4a52-2a55-4d3c-9d36-0c1e6f1c9a10:5b0e7c3e-7c1a-4f57-9f0e-3e6f7b4f8a21:1:0:0";
        let id = wire_call_id(long);
        assert!(id.starts_with("call_") && id.len() == 37, "{id}");
        assert_eq!(id, wire_call_id(long));
        assert_eq!(wire_call_id("short"), "short");
    }

    #[test]
    fn failure_texts_read_like_the_reference() {
        assert_eq!(
            failure_text("invalid_args", "/amount: \"x\" is not of type \"number\""),
            "invalid_args: /amount: \"x\" is not of type \"number\""
        );
        assert_eq!(
            failure_text("unknown_tool", "unknown tool \"x\""),
            "unknown tool \"x\""
        );
        assert_eq!(failure_text("", "boom"), "boom");
        assert_eq!(
            rejection_text("c1", "emad", "No damage claim on file for this order."),
            "tool call c1 was rejected by emad: No damage claim on file for this order."
        );
    }

    /// The stored form of `new` at `seq` (what the fold reads back).
    fn stored(seq: u64, new: phrony_ledger::NewEvent) -> Event {
        Event {
            stream: "s".to_owned(),
            seq,
            event_type: new.event_type,
            ts: chrono::Utc::now(),
            actor: new.actor.actor,
            actor_verification: None,
            actor_via: None,
            call_id: new.call_id,
            turn: new.turn,
            payload: new.payload,
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    fn usage(input_tokens: u64, output_tokens: u64) -> phrony_ledger::Usage {
        phrony_ledger::Usage {
            input_tokens,
            output_tokens,
            estimated: false,
        }
    }

    #[test]
    fn the_output_recorded_with_a_final_answer_is_the_one_folding_it_gives() {
        let answer = |turn: u32, content: &str, tokens: u64| phrony_ledger::AssistantMessage {
            turn,
            content: content.to_owned(),
            stop_reason: Some("end_turn".to_owned()),
            turn_usage: Some(usage(tokens, tokens / 2)),
            turn_duration_ms: Some(7),
        };
        let mut fold = Fold::default();
        let mut seq = 0;
        let mut apply = |fold: &mut Fold, message: &phrony_ledger::AssistantMessage| {
            seq += 1;
            let event = phrony_ledger::SessionEvent::AssistantMessage(message.clone())
                .to_new_event()
                .unwrap();
            fold.apply(&stored(seq, event)).unwrap();
        };
        // An earlier turn already folded, then the final one.
        apply(&mut fold, &answer(1, "first", 40));
        let last = answer(2, "ORD-1 totals 400 EUR.", 60);
        let record = TurnRecord::finished_by(&last).unwrap();
        let predicted = fold.output_after(record, &last.content);
        apply(&mut fold, &last);
        assert_eq!(predicted, fold.output());
        assert_eq!(predicted["message"], "ORD-1 totals 400 EUR.");
        assert_eq!(
            predicted["session_usage"]["total_tokens"],
            40 + 20 + 60 + 30
        );
        assert_eq!(predicted["turns"].as_array().map(Vec::len), Some(2));
        // A segment that does not end its turn has no record.
        let segment = phrony_ledger::AssistantMessage {
            stop_reason: None,
            ..answer(3, "looking…", 1)
        };
        assert_eq!(TurnRecord::finished_by(&segment), None);
    }
}
