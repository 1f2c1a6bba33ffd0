//! Inspecting a session (§5.12): its tree (the session and its delegated descendants) with each
//! session's folded output and evidence, and one chronological timeline merging the events of
//! the tree, the tool calls' milestones (dispatched, completed) and the approvals' milestones
//! (created, decided), each with a one-line human summary.
//!
//! The input is a [`SessionTimeline`] (what [`phrony_ledger::Ledger::session_timeline`] reads,
//! or [`store_timeline`] on the [`LedgerStore`]); [`inspect`] is pure. Summaries are built from
//! the ledger's records only: secrets never reach them (they are not in events), and long texts
//! are shortened.
//!
//! ```text
//! tool_call payments.issue-refund@1.0.0 call_id=run_…:0:0
//! policy denied payments.issue-refund: Refund amount exceeds … (payments/refund-hard-limit@1.0.0)
//! approval approved by emad: Customer has a damage claim on file.
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use phrony_ledger::event_types as types;
use phrony_ledger::{
    Approval, ApprovalStatus, CallStatus, Event, EventBody, Session, SessionTimeline,
    TimelineEvent, ToolInvocation, Usage, VoteDecision,
};
use serde_json::Value;

use crate::error::{EngineError, StoreError};
use crate::fold::Fold;
use crate::store::LedgerStore;

/// The longest text (message content, reason, comment) a summary quotes before shortening it.
const SUMMARY_TEXT_CHARS: usize = 160;

/// Everything `InspectSession` shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// The inspected session with its descendants.
    pub session: InspectedSession,
    /// Events, call milestones and approval milestones of the whole tree, oldest first.
    pub timeline: Vec<TimelineEntry>,
}

/// One session of the inspected tree.
#[derive(Debug, Clone, PartialEq)]
pub struct InspectedSession {
    /// The session record.
    pub session: Session,
    /// The output folded from its events (§5.9), whatever its status.
    pub output: SessionOutput,
    /// The evidence snapshot (§5.11), if one was recorded.
    pub evidence: Option<Value>,
    /// Its direct children, oldest first.
    pub children: Vec<InspectedSession>,
}

/// One finished turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSummary {
    /// Turn number (from 1).
    pub turn: u32,
    /// Why the model stopped.
    pub stop_reason: String,
    /// The turn's usage, when recorded.
    pub usage: Option<Usage>,
    /// How long the turn took.
    pub duration_ms: Option<u64>,
}

/// A session's output (§5.9): the last assistant message and the usage so far.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SessionOutput {
    /// The last assistant message (empty when the model said nothing yet).
    pub message: String,
    /// Why the last turn ended.
    pub stop_reason: Option<String>,
    /// The last turn's usage.
    pub turn_usage: Option<Usage>,
    /// Usage summed over the turns.
    pub session_usage: Usage,
    /// The finished turns, in order.
    pub turns: Vec<TurnSummary>,
    /// With `output.format: json`: the accepted output (the final answer parsed as JSON, or
    /// what a human accepted); `None` for free-text output or before it is accepted.
    pub json: Option<Value>,
}

impl std::fmt::Debug for SessionOutput {
    /// The derived form, with `json` only when there is one: the inspect output of sessions
    /// without a JSON output reads as it did before the field existed (`event_fixture.rs`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("SessionOutput");
        d.field("message", &self.message)
            .field("stop_reason", &self.stop_reason)
            .field("turn_usage", &self.turn_usage)
            .field("session_usage", &self.session_usage)
            .field("turns", &self.turns);
        if let Some(json) = &self.json {
            d.field("json", json);
        }
        d.finish()
    }
}

impl SessionOutput {
    fn from_fold(fold: &Fold) -> Self {
        let mut session_usage = Usage::default();
        for u in fold.turns.iter().filter_map(|t| t.turn_usage) {
            session_usage.input_tokens = session_usage.input_tokens.saturating_add(u.input_tokens);
            session_usage.output_tokens =
                session_usage.output_tokens.saturating_add(u.output_tokens);
            session_usage.estimated |= u.estimated;
        }
        let last = fold.turns.last();
        Self {
            message: fold.last_assistant.clone().unwrap_or_default(),
            stop_reason: last.map(|t| t.stop_reason.clone()),
            turn_usage: last.and_then(|t| t.turn_usage).map(Usage::from),
            session_usage,
            turns: fold
                .turns
                .iter()
                .map(|t| TurnSummary {
                    turn: t.turn,
                    stop_reason: t.stop_reason.clone(),
                    usage: t.turn_usage.map(Usage::from),
                    duration_ms: t.turn_duration_ms,
                })
                .collect(),
            json: fold.output_accepted.as_ref().map(|(_, v)| v.clone()),
        }
    }
}

/// Where a timeline entry comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum TimelineItem {
    /// An event of a session's stream (kind = its type).
    Event(Event),
    /// A tool call milestone (kind `invocation_dispatched` or `invocation_completed`).
    Invocation(ToolInvocation),
    /// An approval milestone (kind `approval_created` or `approval_decided`).
    Approval(Approval),
}

/// One entry of the merged timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineEntry {
    /// When it happened.
    pub at: DateTime<Utc>,
    /// Milliseconds since the previous entry (0 for the first).
    pub gap_ms: i64,
    /// The event type, or `invocation_dispatched`, `invocation_completed`, `approval_created`,
    /// `approval_decided`.
    pub kind: String,
    /// One human-readable line.
    pub summary: String,
    /// The session of the tree the entry belongs to.
    pub session_id: String,
    /// Its depth (0 = the root).
    pub depth: u32,
    /// The event's seq in its session's stream (0 for call and approval milestones).
    pub seq: u64,
    /// The record.
    pub item: TimelineItem,
}

impl TimelineItem {
    /// `event`, `invocation` or `approval`.
    #[must_use]
    pub fn source(&self) -> &'static str {
        match self {
            Self::Event(_) => "event",
            Self::Invocation(_) => "invocation",
            Self::Approval(_) => "approval",
        }
    }
}

/// Time spent by a tool call waiting for a worker, running on it, and in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTimings {
    /// From queued (or requested) to dispatched.
    pub queue_delay_ms: Option<i64>,
    /// From dispatched to completed.
    pub execution_ms: Option<i64>,
    /// From requested to completed.
    pub total_ms: Option<i64>,
}

/// The [`CallTimings`] of a call (a span is `None` until both of its ends happened).
#[must_use]
pub fn call_timings(call: &ToolInvocation) -> CallTimings {
    let ms = |from: DateTime<Utc>, to: DateTime<Utc>| (to - from).num_milliseconds().max(0);
    let waited_from = call.queued_at.unwrap_or(call.created_at);
    CallTimings {
        queue_delay_ms: call.dispatched_at.map(|d| ms(waited_from, d)),
        execution_ms: match (call.dispatched_at, call.completed_at) {
            (Some(d), Some(c)) => Some(ms(d, c)),
            _ => None,
        },
        total_ms: call.completed_at.map(|c| ms(call.created_at, c)),
    }
}

/// Reads a session's [`SessionTimeline`] from any store: the session, its events, the calls its
/// events name, and its approvals. Stores do not list delegated children, so the tree is the
/// session alone; the ledger's own read covers descendants.
///
/// # Errors
/// The store's (`NotFound` for an unknown session).
pub async fn store_timeline(
    store: &LedgerStore,
    session_id: &str,
) -> Result<SessionTimeline, EngineError> {
    let session = store.get_session(session_id).await?;
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = store.events_after(session_id, after, 500).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        events.extend(page);
    }
    let mut seen = HashSet::new();
    let mut invocations = Vec::new();
    for e in &events {
        if let Some(call_id) = &e.call_id
            && e.event_type == types::TOOL_REQUESTED
            && seen.insert(call_id.clone())
        {
            invocations.push(store.get_tool_call(call_id).await?);
        }
    }
    let approvals = store.session_approvals(session_id).await?;
    let depth = session.depth;
    Ok(SessionTimeline {
        events: events
            .into_iter()
            .map(|event| TimelineEvent {
                session_id: session.id.clone(),
                depth,
                event,
            })
            .collect(),
        sessions: vec![session],
        invocations,
        approvals,
    })
}

/// Assembles the [`Inspection`] of `timeline`'s first session (the inspected one).
///
/// # Errors
/// `NotFound` when the timeline holds no session.
pub fn inspect(timeline: SessionTimeline) -> Result<Inspection, EngineError> {
    let SessionTimeline {
        sessions,
        events,
        invocations,
        approvals,
    } = timeline;
    let Some(root_id) = sessions.first().map(|s| s.id.clone()) else {
        return Err(EngineError::not_found("the timeline holds no session"));
    };

    // Per session: fold its events (in seq order) for the output, keep the last evidence.
    let mut per_session: HashMap<&str, Vec<&Event>> = HashMap::new();
    for e in &events {
        per_session
            .entry(e.session_id.as_str())
            .or_default()
            .push(&e.event);
    }
    let mut nodes: HashMap<String, InspectedSession> = HashMap::new();
    for s in &sessions {
        let mut own = per_session.remove(s.id.as_str()).unwrap_or_default();
        own.sort_by_key(|e| e.seq);
        let mut fold = Fold::default();
        let mut evidence = None;
        for e in own {
            fold.apply(e)?;
            if let EventBody::EvidenceRecorded(snapshot) = e.body().map_err(StoreError::from)? {
                evidence = Some(Value::Object(snapshot));
            }
        }
        nodes.insert(
            s.id.clone(),
            InspectedSession {
                session: s.clone(),
                output: SessionOutput::from_fold(&fold),
                evidence,
                children: Vec::new(),
            },
        );
    }
    let session = build_tree(&root_id, &sessions, &mut nodes)
        .ok_or_else(|| EngineError::not_found(format!("session {root_id} not found")))?;

    let depth_of: HashMap<&str, u32> = sessions.iter().map(|s| (s.id.as_str(), s.depth)).collect();
    let depth = |id: &str| depth_of.get(id).copied().unwrap_or(0);
    let calls: HashMap<&str, &ToolInvocation> = invocations
        .iter()
        .map(|c| (c.call_id.as_str(), c))
        .collect();

    let mut entries: Vec<TimelineEntry> = Vec::new();
    for e in &events {
        entries.push(TimelineEntry {
            at: e.event.ts,
            gap_ms: 0,
            kind: e.event.event_type.clone(),
            summary: event_summary(&e.event, &calls, &approvals)?,
            session_id: e.session_id.clone(),
            depth: e.depth,
            seq: e.event.seq,
            item: TimelineItem::Event(e.event.clone()),
        });
    }
    for c in &invocations {
        if let Some(at) = c.dispatched_at {
            entries.push(TimelineEntry {
                at,
                gap_ms: 0,
                kind: "invocation_dispatched".into(),
                summary: dispatched_summary(c),
                session_id: c.session_id.clone(),
                depth: depth(&c.session_id),
                seq: 0,
                item: TimelineItem::Invocation(c.clone()),
            });
        }
        if let Some(at) = c.completed_at {
            entries.push(TimelineEntry {
                at,
                gap_ms: 0,
                kind: "invocation_completed".into(),
                summary: completed_summary(c),
                session_id: c.session_id.clone(),
                depth: depth(&c.session_id),
                seq: 0,
                item: TimelineItem::Invocation(c.clone()),
            });
        }
    }
    for a in &approvals {
        entries.push(TimelineEntry {
            at: a.created_at,
            gap_ms: 0,
            kind: "approval_created".into(),
            summary: approval_created_summary(a),
            session_id: a.session_id.clone(),
            depth: depth(&a.session_id),
            seq: 0,
            item: TimelineItem::Approval(a.clone()),
        });
        if let Some(at) = a.decided_at
            && a.status != ApprovalStatus::Pending
        {
            entries.push(TimelineEntry {
                at,
                gap_ms: 0,
                kind: "approval_decided".into(),
                summary: approval_decided_summary(a),
                session_id: a.session_id.clone(),
                depth: depth(&a.session_id),
                seq: 0,
                item: TimelineItem::Approval(a.clone()),
            });
        }
    }
    // Chronological; at equal times events (by depth, session, seq) come before the milestones
    // they cause (the sort is stable and events were pushed first).
    entries.sort_by_key(|a| a.at);
    let mut previous: Option<DateTime<Utc>> = None;
    for entry in &mut entries {
        entry.gap_ms = previous.map_or(0, |p| (entry.at - p).num_milliseconds().max(0));
        previous = Some(entry.at);
    }
    Ok(Inspection {
        session,
        timeline: entries,
    })
}

fn build_tree(
    id: &str,
    sessions: &[Session],
    nodes: &mut HashMap<String, InspectedSession>,
) -> Option<InspectedSession> {
    let mut node = nodes.remove(id)?;
    let mut children: Vec<&Session> = sessions
        .iter()
        .filter(|s| s.parent_session_id.as_deref() == Some(id))
        .collect();
    children.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    for child in children {
        if let Some(c) = build_tree(&child.id, sessions, nodes) {
            node.children.push(c);
        }
    }
    Some(node)
}

// ---------------------------------------------------------------------------------------------
// Summaries.

/// `text` on one line, shortened to [`SUMMARY_TEXT_CHARS`] characters.
fn short(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let one_line = one_line.trim();
    if one_line.chars().count() <= SUMMARY_TEXT_CHARS {
        return one_line.to_owned();
    }
    let mut out: String = one_line.chars().take(SUMMARY_TEXT_CHARS).collect();
    out.push('…');
    out
}

fn with_detail(head: String, detail: &str) -> String {
    if detail.trim().is_empty() {
        head
    } else {
        format!("{head}: {}", short(detail))
    }
}

/// An optional stored text, empty when absent.
fn or_empty(text: Option<&str>) -> &str {
    text.unwrap_or("")
}

fn tool_of(call_id: Option<&str>, calls: &HashMap<&str, &ToolInvocation>) -> (String, String) {
    call_id
        .and_then(|id| calls.get(id))
        .map(|c| (c.tool.clone(), c.version.clone()))
        .unwrap_or_default()
}

fn tool_label(tool: &str, version: &str) -> String {
    match (tool.is_empty(), version.is_empty()) {
        (true, _) => "tool".to_owned(),
        (false, true) => tool.to_owned(),
        (false, false) => format!("{tool}@{version}"),
    }
}

/// ` hidden=refund (payments/deny-viewers@1.0.0), …`: the tools policy hid from a completion.
fn hidden_suffix(hidden: &[phrony_ledger::HiddenTool]) -> String {
    if hidden.is_empty() {
        return String::new();
    }
    let list: Vec<String> = hidden
        .iter()
        .map(|h| format!("{} ({})", h.name, h.policy))
        .collect();
    format!(" hidden={}", list.join(", "))
}

fn usage_suffix(usage: Option<Usage>, duration_ms: Option<u64>) -> String {
    let mut out = String::new();
    if let Some(u) = usage {
        let total = u.input_tokens.saturating_add(u.output_tokens);
        out.push_str(&format!(" tokens={total}"));
    }
    if let Some(ms) = duration_ms {
        out.push_str(&format!(" duration_ms={ms}"));
    }
    out
}

/// Who recorded an event, as a summary names them.
fn actor_label(event: &Event) -> String {
    event.actor_display()
}

/// The event's call, as summaries name it: its id and the tool it calls (the call's own
/// record when the event does not name the tool).
struct CallLabel {
    call_id: String,
    tool: String,
    version: String,
}

impl CallLabel {
    fn new(event: &Event, calls: &HashMap<&str, &ToolInvocation>) -> Self {
        let (tool, version) = tool_of(event.call_id.as_deref(), calls);
        Self {
            call_id: event.call_id.clone().unwrap_or_default(),
            tool,
            version,
        }
    }

    /// `tool@version`, preferring what the event itself records.
    fn label(&self, tool: &str, version: &str) -> String {
        let t = if tool.is_empty() { &self.tool } else { tool };
        let v = if version.is_empty() {
            &self.version
        } else {
            version
        };
        tool_label(t, v)
    }

    /// `tool@version` from the call's record.
    fn recorded(&self) -> String {
        self.label("", "")
    }
}

/// The one-line summary of an event.
///
/// # Errors
/// The ledger's `BadEvent` for an event the schema cannot read.
fn event_summary(
    e: &Event,
    calls: &HashMap<&str, &ToolInvocation>,
    approvals: &[Approval],
) -> Result<String, EngineError> {
    let body = e.body().map_err(StoreError::from)?;
    let call = CallLabel::new(e, calls);
    Ok(match body {
        EventBody::SessionStarted(s) => format!(
            "session started: {}/{}@{} mode={} by {}",
            s.agent_namespace,
            s.agent_name,
            s.agent_version,
            s.mode,
            actor_label(e)
        ),
        EventBody::SessionStatusChanged(t) => with_detail(
            format!("status {} → {}", t.from, t.to),
            or_empty(t.reason.as_deref()),
        ),
        EventBody::SessionCompleted(t) => with_detail(
            format!("session completed by {}", actor_label(e)),
            or_empty(t.reason.as_deref()),
        ),
        EventBody::SessionFailed(t) => {
            with_detail("session failed".to_owned(), or_empty(t.message.as_deref()))
        }
        EventBody::SessionCancelled(t) => with_detail(
            format!("session cancelled by {}", actor_label(e)),
            or_empty(t.reason.as_deref()),
        ),
        EventBody::SessionPrincipal(_) => "principal claims recorded".to_owned(),
        EventBody::MessageUser(m) => format!("user ({}): {}", actor_label(e), short(&m.content)),
        EventBody::MessageAssistant(m) => {
            let head = match m.stop_reason.as_deref() {
                None | Some("") => "assistant".to_owned(),
                Some(reason) => format!("assistant ({reason})"),
            };
            format!(
                "{head}: {}{}",
                short(&m.content),
                usage_suffix(m.turn_usage.map(Usage::from), m.turn_duration_ms)
            )
        }
        EventBody::ModelCompletion(c) => format!(
            "model completion turn={} iteration={} stop={} tool_calls={}{}{}",
            c.turn,
            c.iteration,
            c.stop_reason,
            c.tool_calls.len(),
            hidden_suffix(&c.hidden_tools),
            usage_suffix(Some(c.usage), Some(c.duration_ms))
        ),
        EventBody::OutputInvalid(i) => with_detail(
            format!(
                "output invalid (check {}, on_invalid {}): {}",
                i.attempt,
                i.on_invalid,
                match i.action {
                    phrony_ledger::OutputAction::Retry => "the model is asked again",
                    phrony_ledger::OutputAction::Repair => "the model is asked to repair it",
                    phrony_ledger::OutputAction::Escalate => "a human decides",
                    phrony_ledger::OutputAction::Fail => "the session fails",
                }
            ),
            &short(&i.errors.join("; ")),
        ),
        EventBody::OutputAccepted(a) => match (&a.accepted_by, a.approval_id) {
            (Some(by), Some(id)) => {
                format!(
                    "output accepted by {by} (approval {id}), check {}",
                    a.attempt
                )
            }
            _ => format!("output accepted: valid JSON, check {}", a.attempt),
        },
        EventBody::EvidenceRecorded(snapshot) => {
            // The snapshot (§5.11) is the evidence provider's object, not part of the schema.
            match snapshot.get("owner").and_then(Value::as_str) {
                None | Some("") => "evidence recorded".to_owned(),
                Some(owner) => format!("evidence recorded (owner {owner})"),
            }
        }
        EventBody::ApprovalRequired(_)
        | EventBody::ApprovalVote(_)
        | EventBody::ApprovalDecided(_)
        | EventBody::ApprovalEscalated(_) => approval_summary(e, body, &call, approvals),
        EventBody::AgentVersionPublished(_)
        | EventBody::AgentDeployed(_)
        | EventBody::AgentRolledBack(_)
        | EventBody::AgentActivationRefused(_)
        | EventBody::AgentVersionDeprecated(_)
        | EventBody::AgentVersionRetired(_)
        | EventBody::AgentArchived(_)
        | EventBody::BundleVersionPublished(_)
        | EventBody::BundleDeployed(_)
        | EventBody::BundleRolledBack(_)
        | EventBody::BundleActivationRefused(_) => {
            format!("{} by {}", e.event_type, actor_label(e))
        }
        // Not session events: the tokens and audit streams' own.
        EventBody::TokenCreated(_)
        | EventBody::TokenRevoked(_)
        | EventBody::WebhookRetryRequested(_)
        | EventBody::WebhookUnconfigured(_)
        | EventBody::AuditKeyIntroduced(_)
        | EventBody::AuditUnverifiedLogAllowed(_)
        | EventBody::WorkerDescriptorRefused(_)
        | EventBody::PolicyShadow(_) => {
            format!("{} by {}", e.event_type, actor_label(e))
        }
        EventBody::ToolRequested(_)
        | EventBody::ToolQueued(_)
        | EventBody::ToolDispatched(_)
        | EventBody::ToolCompleted(_)
        | EventBody::ToolLateResult(_)
        | EventBody::ToolIndeterminate(_)
        | EventBody::ToolPolicyDenied(_)
        | EventBody::ToolCancelled(_) => tool_summary(body, &call),
    })
}

/// The summary of a tool-call event (`body` is one).
fn tool_summary(body: EventBody, call: &CallLabel) -> String {
    let call_id = &call.call_id;
    match body {
        EventBody::ToolRequested(r) => {
            format!(
                "tool_call {} call_id={call_id}",
                call.label(&r.tool, &r.version)
            )
        }
        EventBody::ToolQueued(_) => format!("tool queued {} call_id={call_id}", call.recorded()),
        EventBody::ToolDispatched(d) => format!(
            "tool dispatched {} to worker {} attempt={} call_id={call_id}",
            call.label(&d.tool, &d.version),
            d.worker_id,
            d.attempt
        ),
        EventBody::ToolCompleted(c) => {
            let code = or_empty(c.error_code.as_deref());
            if code.is_empty() && c.status == CallStatus::Succeeded {
                format!("tool_result {} ok call_id={call_id}", call.recorded())
            } else {
                let head = format!("tool_result {} {}", call.recorded(), c.status);
                let detail = match (code.is_empty(), or_empty(c.error_message.as_deref())) {
                    (true, m) => m.to_owned(),
                    (false, "") => code.to_owned(),
                    (false, m) => format!("{code}: {m}"),
                };
                format!("{} call_id={call_id}", with_detail(head, &detail))
            }
        }
        EventBody::ToolLateResult(l) => with_detail(
            format!("late tool result for {} ignored", call.recorded()),
            &l.reason,
        ),
        EventBody::ToolIndeterminate(i) => with_detail(
            format!(
                "tool outcome indeterminate {} call_id={call_id}",
                call.recorded()
            ),
            &i.reason,
        ),
        EventBody::ToolPolicyDenied(d) => {
            let head = with_detail(format!("policy denied {}", tool_or(&call.tool)), &d.reason);
            match d.policy_ref.as_deref() {
                None | Some("") => head,
                Some(policy) => format!("{head} ({policy})"),
            }
        }
        EventBody::ToolCancelled(c) => with_detail(
            format!("tool call cancelled {} call_id={call_id}", call.recorded()),
            &c.reason,
        ),
        other => other.event_type().to_owned(),
    }
}

/// The summary of an approval event (`body` is one).
/// (`approvals`: the timeline's, which name an `approval.decided` event's decider with its
/// attribution.)
fn approval_summary(
    e: &Event,
    body: EventBody,
    call: &CallLabel,
    approvals: &[Approval],
) -> String {
    match body {
        EventBody::ApprovalRequired(a) => {
            let head = with_detail(
                format!(
                    "approval required for {} route={} quorum={}",
                    call.label(&a.tool, &a.version),
                    a.route,
                    a.approvals_required
                ),
                &a.reason,
            );
            match a.policy_ref.as_deref() {
                None | Some("") => head,
                Some(policy) => format!("{head} ({policy})"),
            }
        }
        EventBody::ApprovalVote(v) => {
            let verb = match v.decision {
                VoteDecision::Approve => "approve",
                VoteDecision::Reject => "reject",
            };
            with_detail(format!("vote {verb} by {}", actor_label(e)), &v.comment)
        }
        EventBody::ApprovalDecided(d) => {
            let by = decider_label(approvals, d.approval_id, &d.decided_by);
            match d.resolution {
                Some(resolution) => with_detail(
                    format!("outcome review resolved {resolution} by {by}"),
                    &d.comment,
                ),
                None => with_detail(format!("approval {} by {by}", d.status), &d.comment),
            }
        }
        EventBody::ApprovalEscalated(x) => with_detail(
            format!(
                "approval escalated to {} by {}",
                x.escalated_to, x.decided_by
            ),
            &x.comment,
        ),
        other => other.event_type().to_owned(),
    }
}

/// The decider of an `approval.decided` event as a person reads it: the attribution of the
/// deciding vote (`emad (unverified)`, `alice via approvals-ui`, `alice`), found among the
/// approval's votes; the bare name for the runtime's deciders (`system:timeout`) and for votes
/// recorded before attribution existed.
fn decider_label(approvals: &[Approval], approval_id: uuid::Uuid, decided_by: &str) -> String {
    approvals
        .iter()
        .find(|a| a.id == approval_id)
        .and_then(|a| a.votes.iter().rev().find(|v| v.decided_by == decided_by))
        .map_or_else(|| decided_by.to_owned(), |v| v.voter_display())
}

fn tool_or(tool: &str) -> &str {
    if tool.is_empty() { "tool" } else { tool }
}

fn dispatched_summary(c: &ToolInvocation) -> String {
    let t = call_timings(c);
    format!(
        "dispatched {} attempt={} worker={}{} call_id={}",
        tool_label(&c.tool, &c.version),
        c.attempt,
        c.worker_id.as_deref().unwrap_or("-"),
        t.queue_delay_ms
            .map(|ms| format!(" queue_delay_ms={ms}"))
            .unwrap_or_default(),
        c.call_id
    )
}

fn completed_summary(c: &ToolInvocation) -> String {
    let t = call_timings(c);
    let mut head = format!("{} {}", c.status, tool_label(&c.tool, &c.version));
    if let Some(ms) = t.total_ms {
        head.push_str(&format!(" total_ms={ms}"));
    }
    let detail = match (c.error_code.as_deref(), c.error_message.as_deref()) {
        (Some(code), Some(m)) if !m.is_empty() => format!("{code}: {m}"),
        (Some(code), _) => code.to_owned(),
        (None, Some(m)) => m.to_owned(),
        (None, None) => String::new(),
    };
    format!("{} call_id={}", with_detail(head, &detail), c.call_id)
}

fn approval_created_summary(a: &Approval) -> String {
    let head = with_detail(
        format!(
            "approval {} opened for {} route={} quorum={}",
            a.id,
            tool_label(&a.tool, &a.tool_version),
            a.route,
            a.approvals_required
        ),
        &a.reason,
    );
    match &a.policy_ref {
        Some(p) => format!("{head} ({p})"),
        None => head,
    }
}

fn approval_decided_summary(a: &Approval) -> String {
    let by = a
        .decided_by_display()
        .unwrap_or_else(|| "system".to_owned());
    if let Some(resolution) = a.resolution {
        let head = format!("outcome review resolved {resolution} by {by}");
        return with_detail(head, a.comment.as_deref().unwrap_or(""));
    }
    let mut head = format!("approval {} by {by}", a.status);
    if a.approvals_required > 1 {
        head.push_str(&format!(
            " ({}/{} approvals)",
            a.approvals_received, a.approvals_required
        ));
    }
    if a.status == ApprovalStatus::Approved && a.effective_args.is_some() {
        head.push_str(" with edited arguments");
    }
    with_detail(head, a.comment.as_deref().unwrap_or(""))
}

/// Sessions by id, for callers holding a tree.
#[must_use]
pub fn sessions_by_id(inspection: &Inspection) -> BTreeMap<String, &Session> {
    fn walk<'a>(n: &'a InspectedSession, out: &mut BTreeMap<String, &'a Session>) {
        out.insert(n.session.id.clone(), &n.session);
        for c in &n.children {
            walk(c, out);
        }
    }
    let mut out = BTreeMap::new();
    walk(&inspection.session, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Bounded payloads: what a reader with a size limit sees of a large payload, and the payload
// whole on request.

/// The longest JSON text (in bytes) of one payload field that inspection shows as it is; a
/// longer one is shortened by [`shorten_json`] (and can be read whole with [`payload`]).
pub const INLINE_PAYLOAD_BYTES: usize = 64 * 1024;

/// How many characters of a shortened payload's text are kept before the marker.
const PREVIEW_CHARS: usize = 512;

/// The length in bytes of `value`'s compact JSON text (what [`payload`] returns), without
/// building it.
#[must_use]
pub fn json_text_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Serialising a `Value` into a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// `value` shortened so that its compact JSON text is at most about `limit` bytes, or `None`
/// when it already fits. A JSON object keeps its members, each shortened the same way (so small
/// members such as a `role` or a `status` stay readable); when that is still too long, or for
/// any other value, the result is a string: the start of the text (of the string itself for a
/// JSON string) followed by `… [truncated: N bytes of JSON]`, N being the whole text's length.
#[must_use]
pub fn shorten_json(value: &Value, limit: usize) -> Option<Value> {
    let len = json_text_len(value);
    if len <= limit {
        return None;
    }
    if let Value::Object(members) = value {
        let shortened: serde_json::Map<String, Value> = members
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    shorten_json(v, limit).unwrap_or_else(|| v.clone()),
                )
            })
            .collect();
        let shortened = Value::Object(shortened);
        if json_text_len(&shortened) <= limit {
            return Some(shortened);
        }
    }
    let start: String = match value {
        Value::String(text) => text.chars().take(PREVIEW_CHARS).collect(),
        other => other.to_string().chars().take(PREVIEW_CHARS).collect(),
    };
    Some(Value::String(format!(
        "{start}… [truncated: {len} bytes of JSON]"
    )))
}

/// Which payload of an inspected session [`payload`] returns: a field of the session itself,
/// of one of its events, tool calls or approvals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadRecord {
    /// The session: `input`, `output` (the output message), `error`, `descriptive_metadata`.
    Session,
    /// The event with this seq in the session's stream: `payload`.
    Event(u64),
    /// The tool call: `args`, `result`, `error_message`.
    Call(String),
    /// The approval: `args`, `effective_args`, `policy_runtime`, `reason`, `comment`,
    /// `votes.N.comment`.
    Approval(String),
}

/// A payload of a session tree (see [`payload`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadSelector {
    /// The session whose record holds it (a descendant of the inspected session, or itself).
    pub session_id: String,
    /// The record.
    pub record: PayloadRecord,
    /// The field of the record.
    pub field: String,
}

/// The payload `selector` names in `inspection`, whole (a text field as a JSON string).
///
/// # Errors
/// `NotFound` when the session, event, call or approval is not in the inspection;
/// `InvalidArgument` when the record has no such field (the message lists the fields).
pub fn payload(inspection: &Inspection, selector: &PayloadSelector) -> Result<Value, EngineError> {
    let sid = selector.session_id.as_str();
    let field = selector.field.as_str();
    let unknown = |what: &str, fields: &str| {
        EngineError::invalid(format!(
            "{what} has no payload field {field:?}; expected one of {fields}"
        ))
    };
    let text = |t: &str| Value::String(t.to_owned());
    match &selector.record {
        PayloadRecord::Session => {
            let node = find_session(&inspection.session, sid)
                .ok_or_else(|| EngineError::not_found(format!("session {sid} not found")))?;
            match field {
                "input" => Ok(node.session.input.clone()),
                "output" => Ok(text(&node.output.message)),
                "output_json" => Ok(node.output.json.clone().unwrap_or(Value::Null)),
                "error" => Ok(node.session.error.as_deref().map_or(Value::Null, text)),
                "descriptive_metadata" => Ok(node.evidence.clone().unwrap_or(Value::Null)),
                _ => Err(unknown(
                    "a session",
                    "input, output, output_json, error, descriptive_metadata",
                )),
            }
        }
        PayloadRecord::Event(seq) => {
            let event = inspection
                .timeline
                .iter()
                .find_map(|e| match &e.item {
                    TimelineItem::Event(ev) if e.session_id == sid && ev.seq == *seq => Some(ev),
                    _ => None,
                })
                .ok_or_else(|| {
                    EngineError::not_found(format!("session {sid} has no event with seq {seq}"))
                })?;
            match field {
                "payload" => Ok(event.payload.clone()),
                _ => Err(unknown("an event", "payload")),
            }
        }
        PayloadRecord::Call(call_id) => {
            let call = inspection
                .timeline
                .iter()
                .find_map(|e| match &e.item {
                    TimelineItem::Invocation(c) if c.session_id == sid && &c.call_id == call_id => {
                        Some(c)
                    }
                    _ => None,
                })
                .ok_or_else(|| {
                    EngineError::not_found(format!(
                        "session {sid} has no dispatched or completed tool call {call_id}"
                    ))
                })?;
            match field {
                "args" => Ok(call.args.clone()),
                "result" => Ok(call.result.clone().unwrap_or(Value::Null)),
                "error_message" => Ok(call.error_message.as_deref().map_or(Value::Null, text)),
                _ => Err(unknown("a tool call", "args, result, error_message")),
            }
        }
        PayloadRecord::Approval(approval_id) => {
            let approval = inspection
                .timeline
                .iter()
                .find_map(|e| match &e.item {
                    TimelineItem::Approval(a)
                        if a.session_id == sid && a.id.to_string() == *approval_id =>
                    {
                        Some(a)
                    }
                    _ => None,
                })
                .ok_or_else(|| {
                    EngineError::not_found(format!("session {sid} has no approval {approval_id}"))
                })?;
            let fields = "args, effective_args, policy_runtime, reason, comment, votes.N.comment";
            match field {
                "args" => Ok(approval.args.clone()),
                "effective_args" => Ok(approval.effective_args.clone().unwrap_or(Value::Null)),
                "policy_runtime" => Ok(Value::Object(approval.policy_runtime.clone())),
                "reason" => Ok(text(&approval.reason)),
                "comment" => Ok(approval.comment.as_deref().map_or(Value::Null, text)),
                other => {
                    let vote = other
                        .strip_prefix("votes.")
                        .and_then(|rest| rest.strip_suffix(".comment"))
                        .and_then(|n| n.parse::<usize>().ok())
                        .ok_or_else(|| unknown("an approval", fields))?;
                    approval
                        .votes
                        .get(vote)
                        .map(|v| text(&v.comment))
                        .ok_or_else(|| {
                            EngineError::not_found(format!(
                                "approval {approval_id} has {} votes; there is no vote {vote}",
                                approval.votes.len()
                            ))
                        })
                }
            }
        }
    }
}

fn find_session<'a>(node: &'a InspectedSession, id: &str) -> Option<&'a InspectedSession> {
    if node.session.id == id {
        return Some(node);
    }
    node.children.iter().find_map(|c| find_session(c, id))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a panic is a failed assertion")]

    use std::sync::Arc;
    use std::time::Duration;

    use phrony_ledger::{
        AgentVersionRef, AssistantMessage, Dispatch, NewApproval, NewSession, NewToolCall,
        OnModify, OnReject, SessionEvent, SessionMode, StatusChange, ToolOutcome, ToolResult,
        Usage, Vote, VoteDecision, new_session_id,
    };
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::clock::{Clock as _, ManualClock};
    use crate::store::PlainSecret;

    const SECRET: &str = "sk-inspect-never-shown";

    /// The ledger in memory (its times follow `clock`) with the refund agent published.
    async fn ledger_store(clock: &Arc<ManualClock>) -> (LedgerStore, Uuid) {
        let clock = Arc::clone(clock);
        let options = phrony_ledger::LedgerOptions {
            clock: phrony_ledger::LedgerClock::new(move || clock.now()),
            ..phrony_ledger::LedgerOptions::default()
        };
        let ledger = phrony_ledger::Ledger::connect_with("sqlite::memory:", options)
            .await
            .unwrap();
        ledger.migrate().await.unwrap();
        let published = ledger
            .publish_agent_version(phrony_ledger::NewAgentVersion {
                namespace: "support".into(),
                name: "refund-agent".into(),
                version: "0.1.0".into(),
                owner: String::new(),
                labels: Default::default(),
                snapshot_json: "{}".into(),
                content_hash: "hash".into(),
                actor: "alice".into(),
            })
            .await
            .unwrap();
        let cipher = phrony_ledger::SecretCipher::new(&[7u8; 32]);
        (LedgerStore::new(ledger, Some(cipher)), published.version_id)
    }

    fn call(session_id: &str, index: u32, amount: u32) -> NewToolCall {
        NewToolCall {
            session_id: session_id.to_owned(),
            turn: 1,
            iteration: 0,
            index,
            tool: "payments.issue-refund".into(),
            version: "1.0.0".into(),
            wire_name: Some("issue_refund".into()),
            args: json!({"order_id": "ORD-1", "amount": amount, "currency": "EUR"}),
            side_effect_class: None,
            delegation: None,
        }
    }

    /// A session with a denied call, an approved (by emad, with a comment) and dispatched call,
    /// and a final answer, on a store whose clock moves 1 s between steps.
    async fn recorded_session() -> (LedgerStore, String) {
        recorded_session_with(None, json!({"refund_id": "rf_1"})).await
    }

    /// [`recorded_session`] with the approver's edited arguments and the worker's result.
    async fn recorded_session_with(
        edited_args: Option<Value>,
        result: Value,
    ) -> (LedgerStore, String) {
        let clock = Arc::new(ManualClock::starting_now());
        let (store, version_id) = ledger_store(&clock).await;
        let id = new_session_id();
        let tick = || clock.advance(Duration::from_secs(1));
        store
            .create_session(
                NewSession {
                    id: id.clone(),
                    agent_version_id: version_id,
                    agent: AgentVersionRef::new("support", "refund-agent", "0.1.0"),
                    input: json!({"message": "Refund ORD-1"}),
                    metadata: [("ticket".to_owned(), "T-1".to_owned())].into(),
                    mode: SessionMode::Task,
                    parent_session_id: None,
                    limits: None,
                    bundle_version_id: None,
                    secrets: Vec::new(),
                    actor: "alice".into(),
                },
                vec![PlainSecret::new("openai", SECRET)],
            )
            .await
            .unwrap();
        tick();
        store
            .record_session_event(
                &id,
                SessionEvent::UserMessage {
                    actor: "alice".into(),
                    turn: 1,
                    content: "Refund ORD-1".into(),
                },
            )
            .await
            .unwrap();
        tick();
        let denied = store.record_tool_call(call(&id, 0, 14_000)).await.unwrap();
        store
            .deny_tool_call(
                &denied.call_id,
                "Refund amount exceeds the absolute ceiling.",
                Some("payments/refund-hard-limit@1.0.0"),
            )
            .await
            .unwrap();
        tick();
        let held = store.record_tool_call(call(&id, 1, 400)).await.unwrap();
        let approval_id = Uuid::new_v4();
        store
            .open_approval(NewApproval {
                allow_self_approval: false,
                id: approval_id,
                session_id: id.clone(),
                call_id: held.call_id.clone(),
                policy_ref: Some("payments/refund-approval-boundary@1.0.0".into()),
                reason: "Refund amount above delegated limit.".into(),
                route: "support-lead".into(),
                authority_ref: String::new(),
                approvals_required: 1,
                comprehension_required: false,
                on_reject: OnReject::ReturnToAgent,
                on_modify: OnModify::Unchecked,
                timeout: None,
                policy_runtime: serde_json::Map::new(),
                actor: "policy".into(),
                kind: phrony_ledger::ApprovalKind::Policy,
            })
            .await
            .unwrap();
        tick();
        store
            .cast_vote(
                approval_id,
                Vote {
                    routes: Vec::new(),
                    actor: "emad".into(),
                    decision: VoteDecision::Approve,
                    comment: "Damage claim on file.".into(),
                    comprehension_acknowledged: false,
                    edited_args,
                    resolution: None,
                    result: None,
                },
            )
            .await
            .unwrap();
        tick();
        store.queue_tool_call(&held.call_id).await.unwrap();
        tick();
        store
            .dispatch_tool_call(
                &held.call_id,
                Dispatch {
                    worker_id: "w1".into(),
                    ..Dispatch::default()
                },
            )
            .await
            .unwrap();
        tick();
        store
            .record_tool_result(
                &held.call_id,
                ToolResult {
                    worker_id: Some("w1".into()),
                    outcome: ToolOutcome::Success(result),
                    usage: None,
                },
            )
            .await
            .unwrap();
        tick();
        store
            .record_session_event(
                &id,
                SessionEvent::AssistantMessage(AssistantMessage {
                    turn: 1,
                    content: "Refund rf_1 issued.".into(),
                    stop_reason: Some("end_turn".into()),
                    turn_usage: Some(Usage {
                        input_tokens: 30,
                        output_tokens: 12,
                        estimated: false,
                    }),
                    turn_duration_ms: Some(900),
                }),
            )
            .await
            .unwrap();
        tick();
        store
            .set_status(&id, StatusChange::completed(None).by("alice"))
            .await
            .unwrap();
        (store, id)
    }

    #[tokio::test]
    async fn the_timeline_tells_what_happened_in_order() {
        let (store, id) = recorded_session().await;
        let inspection = inspect(store_timeline(&store, &id).await.unwrap()).unwrap();
        let summaries: Vec<&str> = inspection
            .timeline
            .iter()
            .map(|e| e.summary.as_str())
            .collect();
        let position = |needle: &str| {
            summaries
                .iter()
                .position(|s| s.contains(needle))
                .unwrap_or_else(|| panic!("no entry contains {needle:?} in {summaries:#?}"))
        };
        let requested = position("tool_call payments.issue-refund@1.0.0 call_id=");
        let denied = position(
            "policy denied payments.issue-refund: Refund amount exceeds the absolute ceiling. \
             (payments/refund-hard-limit@1.0.0)",
        );
        let required = position("(payments/refund-approval-boundary@1.0.0)");
        let decided = position("approval approved by emad (unverified): Damage claim on file.");
        let dispatched = position("tool dispatched payments.issue-refund@1.0.0 to worker w1");
        let answered =
            position("assistant (end_turn): Refund rf_1 issued. tokens=42 duration_ms=900");
        assert!(requested < denied && denied < required && required < decided);
        assert!(
            decided < dispatched && dispatched < answered,
            "{summaries:#?}"
        );

        // Milestones sit next to the events that caused them.
        let kinds: Vec<&str> = inspection
            .timeline
            .iter()
            .map(|e| e.kind.as_str())
            .collect();
        for k in [
            "approval_created",
            "approval_decided",
            "invocation_dispatched",
            "invocation_completed",
        ] {
            assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
        }
        // Chronological, with gaps measured from the previous entry.
        for pair in inspection.timeline.windows(2) {
            assert!(pair[0].at <= pair[1].at);
            assert_eq!(pair[1].gap_ms, (pair[1].at - pair[0].at).num_milliseconds());
        }
        assert_eq!(inspection.timeline[0].gap_ms, 0);
        assert_eq!(inspection.timeline[0].kind, types::SESSION_STARTED);
        assert!(
            inspection.timeline[0]
                .summary
                .starts_with("session started: support/refund-agent@0.1.0")
        );
    }

    #[tokio::test]
    async fn the_tree_carries_the_folded_output() {
        let (store, id) = recorded_session().await;
        let inspection = inspect(store_timeline(&store, &id).await.unwrap()).unwrap();
        let node = &inspection.session;
        assert_eq!(node.session.id, id);
        assert!(node.children.is_empty());
        assert_eq!(node.output.message, "Refund rf_1 issued.");
        assert_eq!(node.output.stop_reason.as_deref(), Some("end_turn"));
        let usage = node.output.session_usage;
        assert_eq!(usage.input_tokens + usage.output_tokens, 42);
        assert_eq!(node.output.turns.len(), 1);
        assert_eq!(node.output.turns[0].duration_ms, Some(900));
        let calls: Vec<&ToolInvocation> = inspection
            .timeline
            .iter()
            .filter(|e| e.kind == "invocation_completed")
            .filter_map(|e| match &e.item {
                TimelineItem::Invocation(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 2, "the denied call and the dispatched one");
        assert_eq!(
            call_timings(calls[0]).queue_delay_ms,
            None,
            "never dispatched"
        );
        let c = calls[1];
        assert_eq!(c.status, CallStatus::Succeeded);
        let t = call_timings(c);
        assert_eq!(t.queue_delay_ms, Some(1000));
        assert_eq!(t.execution_ms, Some(1000));
        assert!(t.total_ms.unwrap() >= 2000);
    }

    #[tokio::test]
    async fn secrets_never_appear() {
        let (store, id) = recorded_session().await;
        let inspection = inspect(store_timeline(&store, &id).await.unwrap()).unwrap();
        let dump = format!("{inspection:?}");
        assert!(!dump.contains(SECRET));
    }

    #[test]
    fn long_texts_are_shortened_to_one_line() {
        let long = format!("line one\nline two {}", "x".repeat(500));
        let out = short(&long);
        assert!(!out.contains('\n'));
        assert_eq!(out.chars().count(), SUMMARY_TEXT_CHARS + 1);
        assert!(out.ends_with('…'));
        assert_eq!(short("  ok  "), "ok");
    }

    #[tokio::test]
    async fn an_approval_decided_with_edited_arguments_says_so() {
        let edited = json!({"order_id": "ORD-1", "amount": 300, "currency": "EUR"});
        let (store, id) = recorded_session_with(Some(edited.clone()), json!({})).await;
        let inspection = inspect(store_timeline(&store, &id).await.unwrap()).unwrap();
        let decided = inspection
            .timeline
            .iter()
            .find(|e| e.kind == "approval_decided")
            .unwrap();
        assert_eq!(
            decided.summary,
            "approval approved by emad (unverified) with edited arguments: Damage claim on file."
        );
        let TimelineItem::Approval(a) = &decided.item else {
            panic!("not an approval: {decided:?}")
        };
        assert_eq!(a.args["amount"], 400, "the proposed arguments stay");
        assert_eq!(a.effective_args.as_ref(), Some(&edited));
        // The `approval.decided` event names the decider as the milestone does, with its
        // attribution (not the bare name).
        let (store, id) = recorded_session().await;
        let inspection = inspect(store_timeline(&store, &id).await.unwrap()).unwrap();
        let event = inspection
            .timeline
            .iter()
            .find(|e| e.kind == types::APPROVAL_DECIDED);
        assert_eq!(
            event.map(|e| e.summary.as_str()),
            Some("approval approved by emad (unverified): Damage claim on file."),
            "{:#?}",
            inspection.timeline
        );
    }

    #[test]
    fn large_payloads_are_shortened_keeping_small_members() {
        let big = "x".repeat(3_000_000);
        let value = json!({"role": "user", "content": big, "n": 1});
        assert_eq!(json_text_len(&value), value.to_string().len());
        let short = shorten_json(&value, INLINE_PAYLOAD_BYTES).unwrap();
        assert!(json_text_len(&short) <= INLINE_PAYLOAD_BYTES, "{short}");
        assert_eq!(short["role"], "user");
        assert_eq!(short["n"], 1);
        let content = short["content"].as_str().unwrap();
        assert!(content.starts_with("xxxx"), "{content}");
        assert!(
            content.ends_with("… [truncated: 3000002 bytes of JSON]"),
            "{content}"
        );
        // An array (or any non-object) becomes one marker string with the start of its text.
        let list = Value::Array(vec![json!("y".repeat(1000)); 100]);
        let Some(Value::String(marker)) = shorten_json(&list, 4096) else {
            panic!("not shortened to a string")
        };
        assert!(marker.starts_with("[\"yyy"), "{marker}");
        assert!(marker.ends_with(&format!(
            "… [truncated: {} bytes of JSON]",
            list.to_string().len()
        )));
        // An object of many medium members is shortened as a whole.
        let wide: serde_json::Map<String, Value> = (0..100)
            .map(|i| (format!("k{i}"), json!("z".repeat(1000))))
            .collect();
        let Some(Value::String(_)) = shorten_json(&Value::Object(wide), 4096) else {
            panic!("a wide object stays too long member by member")
        };
        // Small payloads are left alone.
        assert_eq!(shorten_json(&json!({"a": 1}), INLINE_PAYLOAD_BYTES), None);
    }

    #[tokio::test]
    async fn payloads_are_found_whole_by_record_and_field() {
        let result = json!({"refund_id": "rf_1", "memo": "m".repeat(3_000_000)});
        let (store, id) = recorded_session_with(None, result.clone()).await;
        let inspection = inspect(store_timeline(&store, &id).await.unwrap()).unwrap();
        let select = |record: PayloadRecord, field: &str| PayloadSelector {
            session_id: id.clone(),
            record,
            field: field.to_owned(),
        };
        let call_id = inspection
            .timeline
            .iter()
            .find_map(|e| match &e.item {
                TimelineItem::Invocation(c) if c.result.is_some() => Some(c.call_id.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            payload(
                &inspection,
                &select(PayloadRecord::Call(call_id.clone()), "result")
            )
            .unwrap(),
            result
        );
        assert_eq!(
            payload(&inspection, &select(PayloadRecord::Session, "input")).unwrap(),
            json!({"message": "Refund ORD-1"})
        );
        assert_eq!(
            payload(&inspection, &select(PayloadRecord::Session, "output")).unwrap(),
            json!("Refund rf_1 issued.")
        );
        let completed = inspection
            .timeline
            .iter()
            .find(|e| e.kind == types::TOOL_COMPLETED && e.item.source() == "event")
            .unwrap();
        let TimelineItem::Event(event) = &completed.item else {
            unreachable!()
        };
        assert_eq!(
            payload(
                &inspection,
                &select(PayloadRecord::Event(completed.seq), "payload")
            )
            .unwrap(),
            event.payload
        );
        let approval_id = inspection
            .timeline
            .iter()
            .find_map(|e| match &e.item {
                TimelineItem::Approval(a) => Some(a.id.to_string()),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            payload(
                &inspection,
                &select(
                    PayloadRecord::Approval(approval_id.clone()),
                    "votes.0.comment"
                )
            )
            .unwrap(),
            json!("Damage claim on file.")
        );
        // Unknown records and fields say what is wrong.
        let err = payload(&inspection, &select(PayloadRecord::Event(999), "payload")).unwrap_err();
        assert_eq!(err.kind, crate::ErrorKind::NotFound);
        assert!(err.message.contains("no event with seq 999"), "{err}");
        let err = payload(&inspection, &select(PayloadRecord::Call(call_id), "nope")).unwrap_err();
        assert_eq!(err.kind, crate::ErrorKind::InvalidArgument);
        assert!(err.message.contains("args, result, error_message"), "{err}");
        let err = payload(
            &inspection,
            &select(PayloadRecord::Approval(approval_id), "votes.3.comment"),
        )
        .unwrap_err();
        assert_eq!(err.kind, crate::ErrorKind::NotFound);
        let mut other = select(PayloadRecord::Session, "input");
        other.session_id = "run_other".into();
        assert_eq!(
            payload(&inspection, &other).unwrap_err().kind,
            crate::ErrorKind::NotFound
        );
    }

    #[test]
    fn an_empty_timeline_is_not_found() {
        let err = inspect(SessionTimeline {
            sessions: Vec::new(),
            events: Vec::new(),
            invocations: Vec::new(),
            approvals: Vec::new(),
        })
        .unwrap_err();
        assert_eq!(err.kind, crate::ErrorKind::NotFound);
    }
}
