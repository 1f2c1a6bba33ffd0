//! A session's event stream: the event types, the typed events the session engine records,
//! the dispatcher that applies ledger-owned events to the projections (live and on rebuild),
//! and the reads used by attach (`events_after`) and inspect (`session_timeline`).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::Ledger;
use crate::approvals::{self, Approval};
use crate::db::{Conn, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{AssistantSegment, EventBody, MessageRole, TurnUsage, UserMessage};
use crate::events::{append, lock_session, read_page};
use crate::invocations::{self, ToolInvocation, Usage};
use crate::leases::LeaseClaim;
use crate::model::{Event, NewEvent};
use crate::rows::{self, Session};
use crate::sessions;

use crate::event_body::event_types as types;

/// Whether `event_type` is written only by the ledger (see [`crate::event_types::LEDGER_OWNED`]).
#[must_use]
pub fn is_ledger_owned(event_type: &str) -> bool {
    types::LEDGER_OWNED.contains(&event_type)
}

/// [`Ledger::events_after`]'s read: a page of `$1`'s events with `seq > $2` (at most `$3`), none
/// unless `$1` is a session.
static SESSION_PAGE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM events WHERE stream = $1 AND seq > $2 \
         AND EXISTS (SELECT 1 FROM sessions WHERE id = $1) ORDER BY seq LIMIT $3",
        crate::events::EVENT_COLUMNS
    )
});

/// Locks the stream head of `session_id` for an append, refusing an unknown or ended session.
pub(crate) async fn lock_open_session(
    tx: &mut crate::db::Tx,
    session_id: &str,
) -> Result<crate::events::StreamHead> {
    Ok(lock_open_session_head(tx, session_id).await?.0)
}

/// [`lock_open_session`], also returning what it read of the session.
async fn lock_open_session_head(
    tx: &mut crate::db::Tx,
    session_id: &str,
) -> Result<(crate::events::StreamHead, rows::SessionHead)> {
    let (head, session) = lock_session(tx, session_id).await?;
    if session.status.is_terminal() {
        return Err(LedgerError::precondition(format!(
            "session {session_id} is {} and accepts no further events",
            session.status
        )));
    }
    Ok((head, session))
}

/// An event [`Ledger::open_session`] appends right after `session.started`.
#[derive(Debug, Clone, PartialEq)]
pub enum Opening {
    /// An engine event (a type the ledger does not own, e.g. `session.principal`).
    Engine(NewEvent),
    /// A user message or the evidence snapshot.
    Session(SessionEvent),
}

/// What [`Ledger::record_step`] wrote.
#[derive(Debug, Clone)]
pub struct RecordedStep {
    /// The completion and its assistant message, as stored.
    pub events: Vec<Event>,
    /// The status change, when one was asked for.
    pub status: Option<sessions::StatusChanged>,
    /// The tool calls, as stored (in the order given).
    pub calls: Vec<ToolInvocation>,
}

/// An event the session engine records in a session's stream (the ledger-owned ones are written
/// by the ledger's session, tool-call and approval operations).
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// `message.user` (actor: who sent it).
    UserMessage {
        /// Who sent the message (the client's `PHRONY_ACTOR`, or `user`).
        actor: phrony_auth::Attribution,
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
                if actor.actor.trim().is_empty() {
                    return Err(LedgerError::invalid("user message actor is required"));
                }
                let mut e = EventBody::MessageUser(UserMessage {
                    role: MessageRole::User,
                    content: content.clone(),
                })
                .into_new_event(actor)?;
                e.turn = Some(*turn);
                e
            }
            Self::AssistantMessage(m) => {
                let mut e = EventBody::MessageAssistant(AssistantSegment {
                    role: MessageRole::Assistant,
                    content: m.content.clone(),
                    stop_reason: m.stop_reason.clone(),
                    turn_usage: m.turn_usage.map(TurnUsage::from),
                    turn_duration_ms: m.turn_duration_ms,
                })
                .into_new_event("agent")?;
                e.turn = Some(m.turn);
                e
            }
            Self::Evidence { snapshot } => {
                let Value::Object(snapshot) = snapshot else {
                    return Err(LedgerError::invalid(
                        "evidence snapshot must be a JSON object",
                    ));
                };
                EventBody::EvidenceRecorded(snapshot.clone()).into_new_event("system")?
            }
        };
        Ok(event)
    }
}

// ---------------------------------------------------------------------------------------------
// Projections.

/// Applies one event of a session stream to the projections (live and on rebuild).
///
/// # Errors
/// [`LedgerError::BadEvent`] for an event the schema cannot read; `Corrupt` for one that does
/// not fit the projections (or an agent-lifecycle event in a session stream).
pub(crate) async fn apply(conn: &mut Conn<'_>, event: &Event) -> Result<()> {
    let body = event.body()?;
    let body = &body;
    match body {
        EventBody::SessionStarted(_)
        | EventBody::SessionStatusChanged(_)
        | EventBody::SessionCompleted(_)
        | EventBody::SessionFailed(_)
        | EventBody::SessionCancelled(_) => sessions::apply(conn, event, body).await,
        EventBody::ToolRequested(_)
        | EventBody::ToolQueued(_)
        | EventBody::ToolDispatched(_)
        | EventBody::ToolCompleted(_)
        | EventBody::ToolLateResult(_)
        | EventBody::ToolIndeterminate(_)
        | EventBody::ToolPolicyDenied(_)
        | EventBody::ToolCancelled(_) => invocations::apply(conn, event, body).await,
        EventBody::ApprovalRequired(_)
        | EventBody::ApprovalVote(_)
        | EventBody::ApprovalDecided(_)
        | EventBody::ApprovalEscalated(_) => approvals::apply(conn, event, body).await,
        // Engine events: the stream is their only record.
        EventBody::SessionPrincipal(_)
        | EventBody::MessageUser(_)
        | EventBody::MessageAssistant(_)
        | EventBody::ModelCompletion(_)
        | EventBody::OutputInvalid(_)
        | EventBody::OutputAccepted(_)
        | EventBody::EvidenceRecorded(_) => Ok(()),
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
        | EventBody::BundleActivationRefused(_)
        | EventBody::TokenCreated(_)
        | EventBody::TokenRevoked(_)
        | EventBody::WebhookRetryRequested(_)
        | EventBody::WebhookUnconfigured(_)
        | EventBody::AuditKeyIntroduced(_)
        | EventBody::AuditUnverifiedLogAllowed(_)
        | EventBody::WorkerDescriptorRefused(_)
        | EventBody::PolicyShadow(_) => Err(LedgerError::corrupt(format!(
            "stream {} seq {}: event {} does not belong in a session stream",
            event.stream, event.seq, event.event_type
        ))),
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
            let mut head = lock_open_session(&mut tx, session_id).await?;
            append(&mut tx, &mut head, new.clone()).await
        })
    }

    /// Creates a session as [`Ledger::create_session_within`] does (no bound when
    /// `max_live_per_agent` is `None`) and appends its `opening` events right after
    /// `session.started`, in order, in the SAME transaction: the session exists with all of
    /// them or not at all. A session cannot be left started without its first user message (or
    /// its principal, or its evidence snapshot) by a crash, and starting one costs one durable
    /// commit instead of one per event.
    ///
    /// # Errors
    /// Those of [`Ledger::create_session_within`]; an opening event that
    /// [`Ledger::append_session_event`] (engine events) or [`Ledger::record_session_event`]
    /// (session events) would refuse, for the first such event. Nothing is written then.
    pub async fn open_session(
        &self,
        new: sessions::NewSession,
        max_live_per_agent: Option<u64>,
        opening: Vec<Opening>,
    ) -> Result<Session> {
        let (session, _) = self.open(new, max_live_per_agent, opening, None).await?;
        Ok(session)
    }

    /// [`Ledger::open_session`] for a replica that drives the new session itself, with session
    /// leases (issue #20): its lease is acquired for this replica until now + `lease_ttl` in
    /// the transaction that creates the session — as [`Ledger::acquire_session_lease`] would
    /// right after it, without a transaction of its own. The claim is `Granted` (epoch 1) for
    /// a new session; this replica's appends to it are fenced by it from the commit on.
    ///
    /// # Errors
    /// Those of [`Ledger::open_session`]; `InvalidArgument` for a zero TTL.
    pub async fn open_session_leased(
        &self,
        new: sessions::NewSession,
        max_live_per_agent: Option<u64>,
        opening: Vec<Opening>,
        lease_ttl: std::time::Duration,
    ) -> Result<(Session, LeaseClaim)> {
        let (session, claim) = self
            .open(new, max_live_per_agent, opening, Some(lease_ttl))
            .await?;
        let claim = claim.ok_or_else(|| {
            LedgerError::corrupt("a session created with its lease came without a claim")
        })?;
        Ok((session, claim))
    }

    async fn open(
        &self,
        new: sessions::NewSession,
        max_live_per_agent: Option<u64>,
        opening: Vec<Opening>,
        lease_ttl: Option<std::time::Duration>,
    ) -> Result<(Session, Option<LeaseClaim>)> {
        new.validate()?;
        let lease_ttl = lease_ttl.map(crate::leases::ttl_of).transpose()?;
        let mut events = Vec::with_capacity(opening.len());
        for event in opening {
            events.push(match event {
                Opening::Engine(event) => {
                    crate::check_raw_append(&new.id, &event)?;
                    event
                }
                Opening::Session(event) => event.to_new_event()?,
            });
        }
        let owner = self.replica.id().to_owned();
        // In flight until held: a renewal beside it must not free the row it writes.
        let _acquiring = lease_ttl.map(|_| self.replica.acquiring(&new.id));
        let (session, claim) = write_tx!(self, |tx| async {
            let session = sessions::create(&mut tx, &new, max_live_per_agent, &events).await?;
            let claim = match lease_ttl {
                Some(ttl) => {
                    Some(crate::leases::acquire(&mut tx, &owner, &new.id, ttl, false).await?)
                }
                None => None,
            };
            Ok::<_, LedgerError>((session, claim))
        })?;
        if let Some(LeaseClaim::Granted(lease)) = &claim {
            self.replica
                .hold(&new.id, i64::try_from(lease.epoch).unwrap_or(i64::MAX));
        }
        Ok((session, claim))
    }

    /// Appends a model completion (an engine event such as `model.completion`, which the ledger
    /// does not own) and the assistant message it produced in one transaction: either both are
    /// in the stream or neither is, so a crash between them cannot leave a recorded completion
    /// without its text (recovery would have to ask the model again). `assistant` is `None`
    /// for a completion with tool calls and no text.
    ///
    /// # Errors
    /// As [`Self::record_session_event`]; `InvalidArgument` when `completion` is malformed or
    /// of a ledger-owned type.
    pub async fn record_completion(
        &self,
        session_id: &str,
        completion: NewEvent,
        assistant: Option<SessionEvent>,
    ) -> Result<Vec<Event>> {
        Ok(self
            .record_step(session_id, completion, assistant, None, Vec::new())
            .await?
            .events)
    }

    /// [`Self::record_completion`], then in the SAME transaction the session's status change
    /// `next` (e.g. `running → awaiting_tool`) and the tool calls the completion requested
    /// (`tool.requested`, as [`Self::record_tool_call`] records them, idempotently): one
    /// durable commit for a model step instead of one per event, and no state in which the
    /// completion is recorded but its calls are not.
    ///
    /// # Errors
    /// As [`Self::record_completion`], [`Self::set_session_status`] and
    /// [`Self::record_tool_call`]; nothing is written when any part fails.
    pub async fn record_step(
        &self,
        session_id: &str,
        completion: NewEvent,
        assistant: Option<SessionEvent>,
        next: Option<sessions::StatusChange>,
        calls: Vec<invocations::NewToolCall>,
    ) -> Result<RecordedStep> {
        completion.validate()?;
        if is_ledger_owned(&completion.event_type) {
            return Err(LedgerError::invalid(format!(
                "event type {} is written by the ledger and cannot be recorded as a completion",
                completion.event_type
            )));
        }
        if let Some(change) = &next {
            crate::cascade::check_request(change)?;
        }
        for call in &calls {
            invocations::require_text("tool", &call.tool)?;
            invocations::require_text("tool version", &call.version)?;
            if call.session_id != session_id {
                return Err(LedgerError::invalid(format!(
                    "tool call of session {} recorded with a completion of session {session_id}",
                    call.session_id
                )));
            }
        }
        let mut batch = vec![completion];
        if let Some(message) = &assistant {
            batch.push(message.to_new_event()?);
        }
        // The stream is locked and the session read once for the whole step.
        write_tx!(self, |tx| async {
            let (mut head, mut session) = lock_open_session_head(&mut tx, session_id).await?;
            let events = crate::events::append_batch(&mut tx, &mut head, batch.clone()).await?;
            let status = match &next {
                Some(change) => {
                    let changed = crate::cascade::set_status_from(
                        &mut tx,
                        &mut head,
                        session_id,
                        session.status,
                        change,
                    )
                    .await?;
                    session.status = changed.session.status;
                    Some(changed)
                }
                None => None,
            };
            let mut recorded = Vec::with_capacity(calls.len());
            for call in &calls {
                recorded.push(invocations::record_locked(&mut tx, &mut head, session, call).await?);
            }
            Ok(RecordedStep {
                events,
                status,
                calls: recorded,
            })
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
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        // One statement when there are events to return (the common case: every driver,
        // subscriber and attach catches up after each commit): the page, read only if the
        // session exists. An empty page reads the session to tell "no new events" from
        // "no such session" (an unknown id, or a stream that is not a session's).
        let page = c
            .fetch_all(
                "read a session's events",
                &SESSION_PAGE_SQL,
                args![session_id, after, i64::from(limit.clamp(1, 1000))],
            )
            .await?;
        if page.is_empty() {
            rows::require_session_head(&mut c, session_id).await?;
        }
        page.iter()
            .map(|row| crate::events::stored_from_row(row)?.into_event())
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
        let tree = rows::session_subtree(&mut c, session_id).await?;
        if tree.is_empty() {
            return Err(rows::session_not_found(session_id));
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
