//! A session's event stream: the event types, the typed events the session engine records,
//! the dispatcher that applies ledger-owned events to the projections (live and on rebuild),
//! and the reads used by attach (`events_after`) and inspect (`session_timeline`).

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Ledger;
use crate::approvals::{self, Approval};
use crate::db::Conn;
use crate::error::{LedgerError, Result};
use crate::events::{append, lock_stream, read_page};
use crate::invocations::{self, ToolInvocation, Usage};
use crate::model::{Event, NewEvent};
use crate::sessions::{self, Session};

/// The event types of session streams (§5.10 names, payloads in snake_case).
///
/// The ledger writes the types in [`LEDGER_OWNED`](event_types::LEDGER_OWNED) itself, each together with the projection
/// change it causes; [`Ledger::append_session_event`] refuses them. The session engine records
/// the others through [`Ledger::record_session_event`].
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
    /// A user message `{role: "user", content}`.
    pub const MESSAGE_USER: &str = "message.user";
    /// An assistant message segment `{role: "assistant", content, stop_reason?, turn_usage?,
    /// turn_duration_ms?}`.
    pub const MESSAGE_ASSISTANT: &str = "message.assistant";
    /// The evidence snapshot (§5.11).
    pub const EVIDENCE_RECORDED: &str = "evidence.recorded";
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

    /// Types only the ledger writes, each with its projection change.
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
    ];
}

use event_types as types;

/// Whether `event_type` is written only by the ledger (see [`event_types::LEDGER_OWNED`]).
#[must_use]
pub fn is_ledger_owned(event_type: &str) -> bool {
    types::LEDGER_OWNED.contains(&event_type)
}

/// An event the session engine records in a session's stream (the ledger-owned ones are written
/// by the ledger's session, tool-call and approval operations).
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// `message.user` (actor: who sent it).
    UserMessage {
        /// Who sent the message (the client's `PHRONY_ACTOR`, or `user`).
        actor: String,
        /// The turn the message starts.
        turn: u32,
        /// The message text.
        content: String,
    },
    /// `message.assistant` (actor `agent`).
    AssistantMessage(AssistantMessage),
    /// `evidence.recorded` (actor `system`): the evidence snapshot, a JSON object.
    Evidence {
        /// The snapshot (§5.11).
        snapshot: Value,
    },
}

/// One assistant message segment: the text up to a tool-call boundary, or the turn's final text
/// with its stop reason, usage and duration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AssistantMessage {
    /// The turn.
    pub turn: u32,
    /// The text.
    pub content: String,
    /// Why the model stopped (`end_turn`, `max_tokens`, `tool_use`, …); on the final segment.
    pub stop_reason: Option<String>,
    /// The turn's token usage; on the final segment.
    pub turn_usage: Option<Usage>,
    /// How long the turn took; on the final segment.
    pub turn_duration_ms: Option<u64>,
}

impl SessionEvent {
    /// The event as appended: type, actor, turn and snake_case payload.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty actor or a snapshot that is not a JSON object.
    pub fn to_new_event(&self) -> Result<NewEvent> {
        let event = match self {
            Self::UserMessage {
                actor,
                turn,
                content,
            } => {
                if actor.trim().is_empty() {
                    return Err(LedgerError::invalid("user message actor is required"));
                }
                let mut e = NewEvent::new(
                    types::MESSAGE_USER,
                    actor,
                    json!({"role": "user", "content": content}),
                );
                e.turn = Some(*turn);
                e
            }
            Self::AssistantMessage(m) => {
                let mut payload = serde_json::Map::new();
                payload.insert("role".into(), json!("assistant"));
                payload.insert("content".into(), json!(m.content));
                if let Some(reason) = &m.stop_reason {
                    payload.insert("stop_reason".into(), json!(reason));
                }
                if let Some(u) = &m.turn_usage {
                    payload.insert(
                        "turn_usage".into(),
                        json!({
                            "input_tokens": u.input_tokens,
                            "output_tokens": u.output_tokens,
                            "total_tokens": u.input_tokens.saturating_add(u.output_tokens),
                            "estimated": u.estimated,
                        }),
                    );
                }
                if let Some(ms) = m.turn_duration_ms {
                    payload.insert("turn_duration_ms".into(), json!(ms));
                }
                let mut e =
                    NewEvent::new(types::MESSAGE_ASSISTANT, "agent", Value::Object(payload));
                e.turn = Some(m.turn);
                e
            }
            Self::Evidence { snapshot } => {
                if !snapshot.is_object() {
                    return Err(LedgerError::invalid(
                        "evidence snapshot must be a JSON object",
                    ));
                }
                NewEvent::new(types::EVIDENCE_RECORDED, "system", snapshot.clone())
            }
        };
        Ok(event)
    }
}

// ---------------------------------------------------------------------------------------------
// Payload helpers shared by the session, tool-call and approval modules.

pub(crate) fn to_payload<T: Serialize>(payload: &T) -> Result<Value> {
    serde_json::to_value(payload)
        .map_err(|e| LedgerError::corrupt(format!("cannot encode event payload: {e}")))
}

pub(crate) fn from_payload<T: DeserializeOwned>(event: &Event) -> Result<T> {
    serde_json::from_value(event.payload.clone()).map_err(|e| {
        LedgerError::corrupt(format!(
            "stream {} seq {}: {} payload: {e}",
            event.stream, event.seq, event.event_type
        ))
    })
}

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

/// Applies one event of a session stream to the projections. Events the ledger does not own
/// (messages, evidence, anything the engine adds) change nothing.
pub(crate) async fn apply(conn: &mut Conn<'_>, event: &Event) -> Result<()> {
    let t = event.event_type.as_str();
    if !is_ledger_owned(t) {
        return Ok(());
    }
    if t.starts_with("session.") {
        sessions::apply(conn, event).await
    } else if t.starts_with("tool.") {
        invocations::apply(conn, event).await
    } else {
        approvals::apply(conn, event).await
    }
}

// ---------------------------------------------------------------------------------------------
// Reads.

/// The session, its descendants, and everything that happened in them, for `InspectSession`.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionTimeline {
    /// The inspected session first, then its descendants by depth and creation time.
    pub sessions: Vec<Session>,
    /// Every event of those sessions in chronological order (ties: depth, session id, seq).
    pub events: Vec<TimelineEvent>,
    /// Their tool calls, oldest first.
    pub invocations: Vec<ToolInvocation>,
    /// Their approvals (with votes), oldest first.
    pub approvals: Vec<Approval>,
}

/// One event of a [`SessionTimeline`].
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineEvent {
    /// The session whose stream holds the event.
    pub session_id: String,
    /// That session's delegation depth (0 for a root session).
    pub depth: u32,
    /// The event.
    pub event: Event,
}

impl Ledger {
    /// Appends an engine event (user or assistant message, evidence) to a session's stream.
    ///
    /// # Errors
    /// `NotFound`: `session X not found`; `FailedPrecondition`:
    /// `session X is completed and accepts no further events`; `InvalidArgument` for a malformed
    /// event.
    pub async fn record_session_event(
        &self,
        session_id: &str,
        event: SessionEvent,
    ) -> Result<Event> {
        let new = event.to_new_event()?;
        write_tx!(self, |tx| async {
            let mut head = lock_stream(&mut tx, session_id).await?;
            let session = sessions::require(&mut tx.conn(), session_id).await?;
            if session.status.is_terminal() {
                return Err(LedgerError::precondition(format!(
                    "session {session_id} is {} and accepts no further events",
                    session.status
                )));
            }
            append(&mut tx, &mut head, new.clone()).await
        })
    }

    /// Events of a session with `seq > after_seq`, ascending, at most `limit` (1..=1000): the
    /// catch-up read of attach. Pass the last seq seen to continue.
    ///
    /// # Errors
    /// `NotFound`: `session X not found`.
    pub async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        sessions::require(&mut c, session_id).await?;
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        read_page(&mut c, session_id, after, i64::from(limit.clamp(1, 1000)))
            .await?
            .into_iter()
            .map(crate::chain::StoredEvent::into_event)
            .collect()
    }

    /// The merged timeline of a session and all its descendants (delegated child sessions):
    /// sessions, events, tool calls and approvals with votes.
    ///
    /// # Errors
    /// `NotFound`: `session X not found`.
    pub async fn session_timeline(&self, session_id: &str) -> Result<SessionTimeline> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        let tree = sessions::subtree(&mut c, session_id).await?;
        if tree.is_empty() {
            return Err(sessions::not_found(session_id));
        }
        let depth_of: BTreeMap<&str, u32> = tree.iter().map(|s| (s.id.as_str(), s.depth)).collect();
        let mut events = Vec::new();
        let mut invocation_rows = Vec::new();
        let mut approval_rows = Vec::new();
        for s in &tree {
            let depth = depth_of.get(s.id.as_str()).copied().unwrap_or(0);
            let mut after = 0;
            loop {
                let page = read_page(&mut c, &s.id, after, crate::events::PAGE).await?;
                let Some(last) = page.last() else { break };
                after = last.seq;
                let full = i64::try_from(page.len()).unwrap_or(i64::MAX) == crate::events::PAGE;
                for stored in page {
                    events.push(TimelineEvent {
                        session_id: s.id.clone(),
                        depth,
                        event: stored.into_event()?,
                    });
                }
                if !full {
                    break;
                }
            }
            invocation_rows.extend(invocations::for_session(&mut c, &s.id).await?);
            approval_rows.extend(approvals::for_session(&mut c, &s.id).await?);
        }
        events.sort_by(|a, b| {
            (a.event.ts, a.depth, &a.session_id, a.event.seq).cmp(&(
                b.event.ts,
                b.depth,
                &b.session_id,
                b.event.seq,
            ))
        });
        invocation_rows.sort_by(|a, b| (a.created_at, &a.call_id).cmp(&(b.created_at, &b.call_id)));
        approval_rows.sort_by_key(|a| (a.created_at, a.id));
        Ok(SessionTimeline {
            sessions: tree,
            events,
            invocations: invocation_rows,
            approvals: approval_rows,
        })
    }
}

/// Streams that hold sessions: those whose first event is `session.started`.
pub(crate) const SESSION_STREAMS_SQL: &str = "EXISTS (SELECT 1 FROM events e \
     WHERE e.stream = streams.stream AND e.seq = 1 AND e.type = 'session.started')";
