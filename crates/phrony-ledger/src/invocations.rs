//! The tool-call ledger (`tool_invocations`): one row per deterministic call id, driven through
//! the state machine of §4.8 by events in the owning session's stream. A worker's result and a
//! cancellation, which may close the call's approval, are in `cascade` (above `approvals`).

use chrono::{DateTime, SubsecRound, Utc};
use phrony_auth::Attribution;
use serde_json::Value;
use uuid::Uuid;

use crate::Ledger;
use crate::db::{Arg, Conn, Row, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{
    EventBody, ToolCancelled, ToolCompleted, ToolDispatched, ToolIndeterminate, ToolPolicyDenied,
    ToolQueued, ToolRequested, expect_rows,
};
use crate::events::{StreamHead, append, lock_session, lock_stream};
use crate::model::Event;
use crate::rows;

pub use crate::vocabulary::{CallStatus, SideEffectClass, Usage, error_codes};

/// The deterministic id of a tool call:
/// `<session_id>:<agent_version_id>:<turn>:<iteration>:<index>`, where `iteration` counts the
/// model completions inside the turn (from 0) and `index` is the call's position in that
/// completion's tool calls (from 0). Including the iteration fixes the reference's collision
/// (§14.1 item 1), which made a second tool-using completion in one turn reuse the first
/// call's stored result. The same inputs always give the same id, so recovery finds the row.
#[must_use]
pub fn tool_call_id(
    session_id: &str,
    agent_version_id: Uuid,
    turn: u32,
    iteration: u32,
    index: u32,
) -> String {
    format!(
        "{session_id}:{}:{turn}:{iteration}:{index}",
        agent_version_id.hyphenated()
    )
}

/// Input of [`Ledger::record_tool_call`].
#[derive(Debug, Clone, PartialEq)]
pub struct NewToolCall {
    /// The session (must not be terminal).
    pub session_id: String,
    /// The turn (user message) the call belongs to.
    pub turn: u32,
    /// The model completion inside the turn, from 0.
    pub iteration: u32,
    /// Position among that completion's tool calls, from 0.
    pub index: u32,
    /// Dispatch ref, e.g. `payments.issue-refund`.
    pub tool: String,
    /// The tool version (`default` when the binding has none).
    pub version: String,
    /// The name the model used (`as:` of the binding), if different from the tool.
    pub wire_name: Option<String>,
    /// The model's arguments (the proposed arguments).
    pub args: Value,
    /// The binding's side-effect class.
    pub side_effect_class: Option<SideEffectClass>,
    /// Set when the binding delegates to an agent (`spec.agents`): the target the call starts
    /// a child session of (`namespace/name@version`, or the bundle child's name). Recorded in
    /// `tool.requested`, so the audit trail says which agent a delegation ran.
    pub delegation: Option<String>,
}

/// One tool call (`tool_invocations` row).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInvocation {
    /// See [`tool_call_id`].
    pub call_id: String,
    /// The owning session.
    pub session_id: String,
    /// The session's agent version.
    pub agent_version_id: Uuid,
    /// The turn.
    pub turn: u32,
    /// The completion inside the turn.
    pub iteration: u32,
    /// Position among the completion's tool calls.
    pub index: u32,
    /// Dispatch ref.
    pub tool: String,
    /// Tool version.
    pub version: String,
    /// The model-facing name.
    pub wire_name: Option<String>,
    /// The binding's side-effect class.
    pub side_effect_class: Option<SideEffectClass>,
    /// The model's arguments.
    pub proposed_args: Value,
    /// The arguments dispatched (or to be dispatched): the approver's edit when there was one.
    pub args: Value,
    /// Current status.
    pub status: CallStatus,
    /// The worker's result payload.
    pub result: Option<Value>,
    /// Error code of a failed or cancelled call.
    pub error_code: Option<String>,
    /// Error message of a failed, cancelled or indeterminate call.
    pub error_message: Option<String>,
    /// Usage charged to the call (delegated child sessions).
    pub usage: Option<Usage>,
    /// How many times the call was dispatched.
    pub attempt: u32,
    /// The worker of the last dispatch.
    pub worker_id: Option<String>,
    /// Its self-reported workload identity.
    pub worker_identity: Option<String>,
    /// Its self-reported image digest.
    pub image_digest: Option<String>,
    /// The handler's descriptor hash.
    pub descriptor_hash: Option<String>,
    /// The content hash of the session's agent version at dispatch.
    pub manifest_content_hash: Option<String>,
    /// Execution deadline of the last dispatch.
    pub deadline_at: Option<DateTime<Utc>>,
    /// `tool.requested` time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// Last time it was queued.
    pub queued_at: Option<DateTime<Utc>>,
    /// Last dispatch.
    pub dispatched_at: Option<DateTime<Utc>>,
    /// When it reached a terminal status.
    pub completed_at: Option<DateTime<Utc>>,
}

/// Where a call is dispatched, for [`Ledger::dispatch_tool_call`]; recorded in the
/// `tool.dispatched` event so a rebuild restores the provenance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dispatch {
    /// The worker's id.
    pub worker_id: String,
    /// Its workload identity.
    pub worker_identity: Option<String>,
    /// Its image digest.
    pub image_digest: Option<String>,
    /// The handler's descriptor hash.
    pub descriptor_hash: Option<String>,
    /// When the runtime will give up on this attempt.
    pub deadline_at: Option<DateTime<Utc>>,
}

/// What a worker returned.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// A result payload.
    Success(Value),
    /// An error (also a worker's nack).
    Error {
        /// Machine-readable code, e.g. `invalid_args`.
        code: String,
        /// Human-readable message.
        message: String,
    },
}

/// A worker's result for [`Ledger::record_tool_result`].
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The worker that reported it.
    pub worker_id: Option<String>,
    /// The outcome.
    pub outcome: ToolOutcome,
    /// Usage to charge to the call.
    pub usage: Option<Usage>,
}

/// Result of [`Ledger::record_tool_result`].
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedResult {
    /// `true` when the result completed the call (`tool.completed`); `false` when it was a
    /// duplicate or late result, recorded as `tool.late_result` without changing the row.
    pub applied: bool,
    /// The call after recording.
    pub invocation: ToolInvocation,
    /// A recovery approval that was pending for this call and is now `cancelled`, because the
    /// outcome it asked a human about is known.
    pub closed_approval: Option<Uuid>,
    /// The session's status change recorded with the result
    /// ([`Ledger::record_tool_result_and_resume`]), when the result closed its last open call.
    pub resumed: Option<crate::sessions::StatusChanged>,
}

// ---------------------------------------------------------------------------------------------
// Event payloads.

// ---------------------------------------------------------------------------------------------
// Reads.

const CALL_COLUMNS: &str = "call_id, session_id, agent_version_id, turn, step, call_index, tool, \
     version, wire_name, side_effect_class, proposed_args, args, status, result, error_code, \
     error_message, usage_input_tokens, usage_output_tokens, usage_estimated, attempt, worker_id, \
     worker_identity, image_digest, descriptor_hash, manifest_content_hash, deadline_at, \
     created_at, updated_at, queued_at, dispatched_at, completed_at";

fn u32_col(row: &Row, column: &str) -> Result<u32> {
    u32::try_from(row.int(column)?)
        .map_err(|_| LedgerError::corrupt(format!("tool_invocations.{column} out of range")))
}

fn call_from_row(row: &Row) -> Result<ToolInvocation> {
    let usage = match (
        row.opt_int("usage_input_tokens")?,
        row.opt_int("usage_output_tokens")?,
    ) {
        (None, None) => None,
        (i, o) => Some(Usage {
            input_tokens: u64::try_from(i.unwrap_or(0)).unwrap_or(0),
            output_tokens: u64::try_from(o.unwrap_or(0)).unwrap_or(0),
            estimated: row.opt_bool("usage_estimated")?.unwrap_or(false),
        }),
    };
    Ok(ToolInvocation {
        call_id: row.text("call_id")?,
        session_id: row.text("session_id")?,
        agent_version_id: row.uuid("agent_version_id")?,
        turn: u32_col(row, "turn")?,
        iteration: u32_col(row, "step")?,
        index: u32_col(row, "call_index")?,
        tool: row.text("tool")?,
        version: row.text("version")?,
        wire_name: row.opt_text("wire_name")?,
        side_effect_class: row
            .opt_text("side_effect_class")?
            .map(|c| SideEffectClass::parse_stored(&c))
            .transpose()?,
        proposed_args: row.json("proposed_args")?,
        args: row.json("args")?,
        status: CallStatus::parse_stored(&row.text("status")?)?,
        result: row.opt_json("result")?,
        error_code: row.opt_text("error_code")?,
        error_message: row.opt_text("error_message")?,
        usage,
        attempt: u32_col(row, "attempt")?,
        worker_id: row.opt_text("worker_id")?,
        worker_identity: row.opt_text("worker_identity")?,
        image_digest: row.opt_text("image_digest")?,
        descriptor_hash: row.opt_text("descriptor_hash")?,
        manifest_content_hash: row.opt_text("manifest_content_hash")?,
        deadline_at: row.opt_ts("deadline_at")?,
        created_at: row.ts("created_at")?,
        updated_at: row.ts("updated_at")?,
        queued_at: row.opt_ts("queued_at")?,
        dispatched_at: row.opt_ts("dispatched_at")?,
        completed_at: row.opt_ts("completed_at")?,
    })
}

fn not_found(call_id: &str) -> LedgerError {
    LedgerError::not_found(format!("tool call {call_id:?} not found"))
}

pub(crate) async fn find(conn: &mut Conn<'_>, call_id: &str) -> Result<Option<ToolInvocation>> {
    let sql = format!("SELECT {CALL_COLUMNS} FROM tool_invocations WHERE call_id = $1");
    conn.fetch_optional("read tool call", &sql, args![call_id])
        .await?
        .map(|row| call_from_row(&row))
        .transpose()
}

pub(crate) async fn require(conn: &mut Conn<'_>, call_id: &str) -> Result<ToolInvocation> {
    find(conn, call_id).await?.ok_or_else(|| not_found(call_id))
}

pub(crate) async fn for_session(
    conn: &mut Conn<'_>,
    session_id: &str,
) -> Result<Vec<ToolInvocation>> {
    let sql = format!(
        "SELECT {CALL_COLUMNS} FROM tool_invocations WHERE session_id = $1 \
         ORDER BY created_at, call_id"
    );
    conn.fetch_all("list tool calls", &sql, args![session_id])
        .await?
        .iter()
        .map(call_from_row)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Writes.

/// Locks the stream of the call's session (named by the call id's first part, see
/// [`tool_call_id`]) and returns the call as it is under the lock.
pub(crate) async fn lock_call(tx: &mut Tx, call_id: &str) -> Result<(StreamHead, ToolInvocation)> {
    let session_id = call_id
        .split_once(':')
        .map(|(session, _)| session)
        .filter(|session| !session.is_empty())
        .ok_or_else(|| not_found(call_id))?;
    let head = lock_stream(tx, session_id).await?;
    let call = require(&mut tx.conn(), call_id).await?;
    if call.session_id != session_id {
        return Err(LedgerError::corrupt(format!(
            "tool call {call_id} is stored under session {}",
            call.session_id
        )));
    }
    Ok((head, call))
}

fn check_from(call: &ToolInvocation, to: CallStatus, allowed: &[CallStatus]) -> Result<()> {
    if allowed.contains(&call.status) {
        Ok(())
    } else {
        Err(LedgerError::precondition(format!(
            "tool call {} cannot go from {} to {to}",
            call.call_id, call.status
        )))
    }
}

pub(crate) async fn emit(
    tx: &mut Tx,
    head: &mut StreamHead,
    call: &ToolInvocation,
    actor: impl Into<Attribution>,
    body: impl Into<EventBody>,
) -> Result<Option<ToolInvocation>> {
    let body = body.into();
    let mut new = body.clone().into_new_event(actor)?;
    new.call_id = Some(call.call_id.clone());
    new.turn = Some(call.turn);
    let event = append(tx, head, new).await?;
    project(&mut tx.conn(), &event, &body).await
}

/// [`emit`] of an event that changes the call row: the row as it left it.
pub(crate) async fn transition(
    tx: &mut Tx,
    head: &mut StreamHead,
    call: &ToolInvocation,
    actor: impl Into<Attribution>,
    body: impl Into<EventBody>,
) -> Result<ToolInvocation> {
    emit(tx, head, call, actor, body)
        .await?
        .ok_or_else(|| LedgerError::corrupt(format!("tool call {} has no row", call.call_id)))
}

pub(crate) async fn record(tx: &mut Tx, new: &NewToolCall) -> Result<ToolInvocation> {
    let (mut head, session) = lock_session(tx, &new.session_id).await?;
    record_locked(tx, &mut head, session, new).await
}

/// [`record`] on the locked stream of the session, as `session` (read under that lock).
pub(crate) async fn record_locked(
    tx: &mut Tx,
    head: &mut StreamHead,
    session: rows::SessionHead,
    new: &NewToolCall,
) -> Result<ToolInvocation> {
    if session.status.is_terminal() {
        return Err(LedgerError::precondition(format!(
            "session {} is {} and cannot record tool calls",
            new.session_id, session.status
        )));
    }
    let call_id = tool_call_id(
        &new.session_id,
        session.agent_version_id,
        new.turn,
        new.iteration,
        new.index,
    );
    if let Some(existing) = find(&mut tx.conn(), &call_id).await? {
        let same = existing.tool == new.tool
            && existing.version == new.version
            && existing.wire_name == new.wire_name
            && existing.proposed_args == new.args
            && existing.side_effect_class == new.side_effect_class;
        if same {
            return Ok(existing);
        }
        return Err(LedgerError::AlreadyExists {
            message: format!(
                "tool call {call_id} was already recorded with a different tool or arguments"
            ),
        });
    }
    let payload = ToolRequested {
        call_id: call_id.clone(),
        agent_version_id: session.agent_version_id,
        tool: new.tool.clone(),
        version: new.version.clone(),
        wire_name: new.wire_name.clone(),
        args: new.args.clone(),
        turn: new.turn,
        iteration: new.iteration,
        index: new.index,
        side_effect_class: new.side_effect_class,
        status: CallStatus::Pending,
        delegation: new.delegation.clone(),
    };
    let body = EventBody::ToolRequested(payload);
    let mut event = body.clone().into_new_event("agent")?;
    event.call_id = Some(call_id.clone());
    event.turn = Some(new.turn);
    let event = append(tx, head, event).await?;
    project(&mut tx.conn(), &event, &body)
        .await?
        .ok_or_else(|| not_found(&call_id))
}

async fn queue(tx: &mut Tx, call_id: &str) -> Result<ToolInvocation> {
    let (mut head, call) = lock_call(tx, call_id).await?;
    queue_locked(tx, &mut head, &call).await
}

async fn queue_locked(
    tx: &mut Tx,
    head: &mut StreamHead,
    call: &ToolInvocation,
) -> Result<ToolInvocation> {
    use CallStatus as C;
    check_from(
        call,
        C::Queued,
        &[C::Pending, C::Dispatched, C::Indeterminate],
    )?;
    let payload = ToolQueued {
        call_id: call.call_id.clone(),
        from: call.status,
    };
    transition(tx, head, call, "system", payload).await
}

/// The content hash of each agent version a dispatch recorded (`tool.dispatched` names the
/// manifest the call ran under). A stored version's content hash never changes, so each
/// version is read once per process, not once per dispatch. At most [`VERSION_HASHES`]
/// versions are kept; the map is emptied when it is full.
#[derive(Debug, Default)]
pub(crate) struct VersionHashes(std::sync::Mutex<std::collections::HashMap<Uuid, String>>);

/// How many agent versions' content hashes [`VersionHashes`] keeps.
const VERSION_HASHES: usize = 1024;

impl VersionHashes {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Uuid, String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The content hash of agent version `id`: remembered, or read in `tx` (`None`: no such
    /// version; not remembered).
    async fn get(&self, tx: &mut Tx, id: Uuid) -> Result<Option<String>> {
        if let Some(hash) = self.map().get(&id) {
            return Ok(Some(hash.clone()));
        }
        let hash = tx
            .conn()
            .fetch_optional(
                "read manifest content hash",
                "SELECT content_hash FROM agent_versions WHERE id = $1",
                args![id],
            )
            .await?
            .map(|r| r.text("content_hash"))
            .transpose()?;
        if let Some(hash) = &hash {
            let mut map = self.map();
            if map.len() >= VERSION_HASHES {
                map.clear();
            }
            map.insert(id, hash.clone());
        }
        Ok(hash)
    }
}

async fn dispatch_call(
    tx: &mut Tx,
    call_id: &str,
    d: &Dispatch,
    hashes: &VersionHashes,
) -> Result<ToolInvocation> {
    let (mut head, call) = lock_call(tx, call_id).await?;
    dispatch_locked(tx, &mut head, &call, d, hashes).await
}

async fn dispatch_locked(
    tx: &mut Tx,
    head: &mut StreamHead,
    call: &ToolInvocation,
    d: &Dispatch,
    hashes: &VersionHashes,
) -> Result<ToolInvocation> {
    check_from(call, CallStatus::Dispatched, &[CallStatus::Queued])?;
    let manifest_content_hash = hashes.get(tx, call.agent_version_id).await?;
    let payload = ToolDispatched {
        call_id: call.call_id.clone(),
        tool: call.tool.clone(),
        version: call.version.clone(),
        args: call.args.clone(),
        attempt: call.attempt.saturating_add(1),
        worker_id: d.worker_id.clone(),
        worker_identity: d.worker_identity.clone(),
        image_digest: d.image_digest.clone(),
        descriptor_hash: d.descriptor_hash.clone(),
        manifest_content_hash,
        deadline_at: d.deadline_at.map(|t| t.trunc_subsecs(6)),
    };
    transition(tx, head, call, "system", payload).await
}

/// A terminal call whose recorded outcome says the runtime does not know what happened.
pub(crate) fn outcome_in_doubt(call: &ToolInvocation) -> bool {
    match call.status {
        CallStatus::Cancelled => true,
        CallStatus::Failed => call.error_code.as_deref() == Some(error_codes::OUTCOME_UNKNOWN),
        _ => false,
    }
}

/// Records the outcome an operator gave an outcome review (the call is `awaiting_approval`,
/// its review just decided): `Ok(result)` = it happened, `Err(message)` = outcome unknown,
/// not re-sent (`failed`, [`error_codes::OUTCOME_UNKNOWN`]).
pub(crate) async fn complete_by_review(
    tx: &mut Tx,
    head: &mut StreamHead,
    call_id: &str,
    actor: &Attribution,
    outcome: std::result::Result<Option<Value>, String>,
) -> Result<()> {
    let call = require(&mut tx.conn(), call_id).await?;
    if call.status != CallStatus::AwaitingApproval {
        return Err(LedgerError::precondition(format!(
            "tool call {} is {} and no longer waits for its review",
            call.call_id, call.status
        )));
    }
    let payload = match outcome {
        Ok(result) => ToolCompleted {
            call_id: call.call_id.clone(),
            status: CallStatus::Succeeded,
            result: Some(result.unwrap_or(Value::Null)),
            error_code: None,
            error_message: None,
            worker_id: None,
            usage: None,
            resolved_by: Some(actor.actor.clone()),
        },
        Err(message) => ToolCompleted {
            call_id: call.call_id.clone(),
            status: CallStatus::Failed,
            result: None,
            error_code: Some(error_codes::OUTCOME_UNKNOWN.to_owned()),
            error_message: Some(message),
            worker_id: None,
            usage: None,
            resolved_by: Some(actor.actor.clone()),
        },
    };
    emit(tx, head, &call, actor, payload).await.map(|_| ())
}

async fn fail(tx: &mut Tx, call_id: &str, code: &str, message: &str) -> Result<ToolInvocation> {
    use CallStatus as C;
    let (mut head, call) = lock_call(tx, call_id).await?;
    check_from(
        &call,
        C::Failed,
        &[C::Pending, C::Queued, C::Dispatched, C::Indeterminate],
    )?;
    let payload = ToolCompleted {
        call_id: call.call_id.clone(),
        status: C::Failed,
        result: None,
        error_code: Some(code.to_owned()),
        error_message: Some(message.to_owned()),
        worker_id: None,
        usage: None,
        resolved_by: None,
    };
    transition(tx, &mut head, &call, "system", payload).await
}

async fn deny(
    tx: &mut Tx,
    call_id: &str,
    reason: &str,
    policy_ref: Option<&str>,
) -> Result<ToolInvocation> {
    use CallStatus as C;
    let (mut head, call) = lock_call(tx, call_id).await?;
    check_from(&call, C::Failed, &[C::Pending, C::Queued])?;
    let payload = ToolPolicyDenied {
        call_id: call.call_id.clone(),
        reason: reason.to_owned(),
        policy_ref: policy_ref.map(str::to_owned),
    };
    transition(tx, &mut head, &call, "policy", payload).await
}

async fn indeterminate(tx: &mut Tx, call_id: &str, reason: &str) -> Result<ToolInvocation> {
    let (mut head, call) = lock_call(tx, call_id).await?;
    check_from(&call, CallStatus::Indeterminate, &[CallStatus::Dispatched])?;
    let payload = ToolIndeterminate {
        call_id: call.call_id.clone(),
        reason: reason.to_owned(),
        worker_id: call.worker_id.clone(),
    };
    transition(tx, &mut head, &call, "system", payload).await
}

pub(crate) async fn cancel_locked(
    tx: &mut Tx,
    head: &mut StreamHead,
    call: &ToolInvocation,
    reason: &str,
) -> Result<()> {
    let after_dispatch = matches!(
        call.status,
        CallStatus::Dispatched | CallStatus::Indeterminate
    );
    let reason = match (&call.worker_id, after_dispatch) {
        (Some(worker), true) => format!(
            "{reason}; the call had been sent to worker {worker:?} and may have taken effect"
        ),
        _ => reason.to_owned(),
    };
    let payload = ToolCancelled {
        call_id: call.call_id.clone(),
        from: call.status,
        reason,
        after_dispatch,
    };
    emit(tx, head, call, "system", payload).await.map(|_| ())
}

/// Cancels every open call of a locked session (its approvals are closed first).
pub(crate) async fn cancel_open(
    tx: &mut Tx,
    head: &mut StreamHead,
    session_id: &str,
    reason: &str,
) -> Result<Vec<String>> {
    let open: Vec<ToolInvocation> = for_session(&mut tx.conn(), session_id)
        .await?
        .into_iter()
        .filter(|c| !c.status.is_terminal())
        .collect();
    let mut ids = Vec::with_capacity(open.len());
    for call in open {
        cancel_locked(tx, head, &call, reason).await?;
        ids.push(call.call_id);
    }
    Ok(ids)
}

// ---------------------------------------------------------------------------------------------
// Projection writes: a pure function of the event.

pub(crate) async fn apply(conn: &mut Conn<'_>, event: &Event, body: &EventBody) -> Result<()> {
    project(conn, event, body).await.map(drop)
}

/// Runs `sql` (an `UPDATE`/`INSERT` of one call row) returning the row as written: `None` when
/// it matched none.
async fn write_row(
    conn: &mut Conn<'_>,
    context: &'static str,
    sql: &str,
    args: Vec<Arg>,
) -> Result<Option<ToolInvocation>> {
    let sql = format!("{sql} RETURNING {CALL_COLUMNS}");
    conn.fetch_optional(context, &sql, args)
        .await?
        .map(|row| call_from_row(&row))
        .transpose()
}

/// [`apply`], returning the call row as the event left it (`None` for an event that changes
/// no row: `tool.late_result`), so a transition need not read back what it wrote.
async fn project(
    conn: &mut Conn<'_>,
    event: &Event,
    body: &EventBody,
) -> Result<Option<ToolInvocation>> {
    // History reservations settle with the call's outcome, in the outcome's transaction.
    match body {
        EventBody::ToolCompleted(p) if p.status == CallStatus::Succeeded => {
            crate::history::settle(conn, &p.call_id, Some(p.result.as_ref())).await?;
        }
        EventBody::ToolCompleted(ToolCompleted { call_id, .. })
        | EventBody::ToolPolicyDenied(ToolPolicyDenied { call_id, .. })
        | EventBody::ToolCancelled(ToolCancelled { call_id, .. }) => {
            crate::history::settle(conn, call_id, None).await?;
        }
        _ => {}
    }
    let ts = event.ts;
    let row =
        match body {
            EventBody::ToolRequested(p) => apply_requested(conn, event, p).await?,
            EventBody::ToolQueued(p) => write_row(
                conn,
                "project tool call queued",
                "UPDATE tool_invocations SET status = 'queued', queued_at = $2, updated_at = $2 \
                 WHERE call_id = $1",
                args![p.call_id.as_str(), ts],
            )
            .await?,
            EventBody::ToolDispatched(p) => write_row(
                conn,
                "project tool call dispatched",
                "UPDATE tool_invocations SET status = 'dispatched', attempt = $2, worker_id = $3, \
                 worker_identity = $4, image_digest = $5, descriptor_hash = $6, \
                 manifest_content_hash = $7, deadline_at = $8, dispatched_at = $9, \
                 updated_at = $9 WHERE call_id = $1",
                args![
                    p.call_id.as_str(),
                    i64::from(p.attempt),
                    p.worker_id.as_str(),
                    p.worker_identity.clone(),
                    p.image_digest.clone(),
                    p.descriptor_hash.clone(),
                    p.manifest_content_hash.clone(),
                    p.deadline_at,
                    ts
                ],
            )
            .await?,
            EventBody::ToolCompleted(p) => apply_completed(conn, event, p).await?,
            EventBody::ToolLateResult(_) => {
                return Ok(None);
            }
            EventBody::ToolIndeterminate(p) => {
                write_row(
                    conn,
                    "project tool call indeterminate",
                    "UPDATE tool_invocations SET status = 'indeterminate', error_code = $2, \
                 error_message = $3, updated_at = $4 WHERE call_id = $1",
                    args![
                        p.call_id.as_str(),
                        error_codes::INDETERMINATE,
                        p.reason.as_str(),
                        ts
                    ],
                )
                .await?
            }
            EventBody::ToolPolicyDenied(p) => {
                write_row(
                    conn,
                    "project tool call denied",
                    "UPDATE tool_invocations SET status = 'failed', error_code = $2, \
                 error_message = $3, completed_at = $4, updated_at = $4 WHERE call_id = $1",
                    args![
                        p.call_id.as_str(),
                        error_codes::POLICY_DENIED,
                        p.reason.as_str(),
                        ts
                    ],
                )
                .await?
            }
            EventBody::ToolCancelled(p) => {
                write_row(
                    conn,
                    "project tool call cancelled",
                    "UPDATE tool_invocations SET status = 'cancelled', error_code = $2, \
                 error_message = $3, completed_at = $4, updated_at = $4 WHERE call_id = $1",
                    args![
                        p.call_id.as_str(),
                        if p.after_dispatch {
                            error_codes::CANCELLED_AFTER_DISPATCH
                        } else {
                            error_codes::CANCELLED
                        },
                        p.reason.as_str(),
                        ts
                    ],
                )
                .await?
            }
            other => {
                return Err(LedgerError::corrupt(format!(
                    "stream {} seq {}: {} is not a tool event",
                    event.stream,
                    event.seq,
                    other.event_type()
                )));
            }
        };
    expect_rows(u64::from(row.is_some()), 1, event)?;
    Ok(row)
}

/// `tool.requested`: the call row, as written.
async fn apply_requested(
    conn: &mut Conn<'_>,
    event: &Event,
    p: &ToolRequested,
) -> Result<Option<ToolInvocation>> {
    let ts = event.ts;
    write_row(
        conn,
        "project tool call",
        "INSERT INTO tool_invocations (call_id, session_id, agent_version_id, turn, step, \
         call_index, tool, version, wire_name, side_effect_class, proposed_args, args, \
         status, attempt, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $12, 0, $13, $13)",
        vec![
            Arg::from(p.call_id.as_str()),
            Arg::from(event.stream.as_str()),
            Arg::from(p.agent_version_id),
            Arg::from(i64::from(p.turn)),
            Arg::from(i64::from(p.iteration)),
            Arg::from(i64::from(p.index)),
            Arg::from(p.tool.as_str()),
            Arg::from(p.version.as_str()),
            Arg::from(p.wire_name.clone()),
            Arg::from(p.side_effect_class.map(|c| c.as_str())),
            Arg::Json(p.args.clone()),
            Arg::from(p.status.as_str()),
            Arg::from(ts),
        ],
    )
    .await
}

/// `tool.completed`: the outcome on the call row, as written.
async fn apply_completed(
    conn: &mut Conn<'_>,
    event: &Event,
    p: &ToolCompleted,
) -> Result<Option<ToolInvocation>> {
    let ts = event.ts;
    if !matches!(p.status, CallStatus::Succeeded | CallStatus::Failed) {
        return Err(LedgerError::corrupt(format!(
            "stream {} seq {}: tool.completed with status {}",
            event.stream, event.seq, p.status
        )));
    }
    let usage = p.usage.unwrap_or_default();
    let has_usage = p.usage.is_some();
    write_row(
        conn,
        "project tool call completed",
        "UPDATE tool_invocations SET status = $2, result = $3, error_code = $4, \
         error_message = $5, usage_input_tokens = $6, usage_output_tokens = $7, \
         usage_estimated = $8, completed_at = $9, updated_at = $9 WHERE call_id = $1",
        vec![
            Arg::from(p.call_id.as_str()),
            Arg::from(p.status.as_str()),
            Arg::OptJson(p.result.clone()),
            Arg::from(p.error_code.clone()),
            Arg::from(p.error_message.clone()),
            Arg::from(has_usage.then(|| saturating_i64(usage.input_tokens))),
            Arg::from(has_usage.then(|| saturating_i64(usage.output_tokens))),
            Arg::from(has_usage.then_some(usage.estimated)),
            Arg::from(ts),
        ],
    )
    .await
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------------------------
// Public API.

pub(crate) fn require_text(what: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(LedgerError::invalid(format!("{what} is required")));
    }
    Ok(())
}

impl Ledger {
    /// Records a tool call the model requested (`tool.requested`, status `pending`) and returns
    /// it with its deterministic [`tool_call_id`]. Recording the same call again (same turn,
    /// iteration and index, same tool and arguments) returns the existing row unchanged, so
    /// recovery can replay a turn safely.
    ///
    /// # Errors
    /// `NotFound` (session); `FailedPrecondition` (terminal session); `AlreadyExists` (the id
    /// was recorded with a different tool or arguments); `InvalidArgument` (empty tool or
    /// version).
    pub async fn record_tool_call(&self, new: NewToolCall) -> Result<ToolInvocation> {
        require_text("tool", &new.tool)?;
        require_text("tool version", &new.version)?;
        write_tx!(self, |tx| record(&mut tx, &new))
    }

    /// [`Self::record_tool_call`] for several calls in ONE transaction, in order: the calls of
    /// one completion are recorded all together or not at all, so a session can never rest
    /// with some of them recorded and the others known only to its event log.
    ///
    /// # Errors
    /// As [`Self::record_tool_call`], for the first call that fails; nothing is written then.
    pub async fn record_tool_calls(&self, calls: Vec<NewToolCall>) -> Result<Vec<ToolInvocation>> {
        for call in &calls {
            require_text("tool", &call.tool)?;
            require_text("tool version", &call.version)?;
        }
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        write_tx!(self, |tx| async {
            let mut recorded = Vec::with_capacity(calls.len());
            for call in &calls {
                recorded.push(record(&mut tx, call).await?);
            }
            Ok(recorded)
        })
    }

    /// `pending | dispatched | indeterminate → queued` (`tool.queued`): the call waits for a
    /// free handler (again, for a re-dispatch with the same call id).
    ///
    /// # Errors
    /// `NotFound`; `FailedPrecondition`: `tool call X cannot go from A to queued`.
    pub async fn queue_tool_call(&self, call_id: &str) -> Result<ToolInvocation> {
        write_tx!(self, |tx| queue(&mut tx, call_id))
    }

    /// `queued → dispatched` (`tool.dispatched`), recorded before the invoke is sent: increments
    /// the attempt and records the worker's provenance, the agent version's content hash and the
    /// arguments actually sent (the approver's edit, if any).
    ///
    /// # Errors
    /// `NotFound`; `FailedPrecondition`: `tool call X cannot go from A to dispatched`;
    /// `InvalidArgument`: empty worker id.
    pub async fn dispatch_tool_call(
        &self,
        call_id: &str,
        dispatch: Dispatch,
    ) -> Result<ToolInvocation> {
        require_text("worker_id", &dispatch.worker_id)?;
        write_tx!(self, |tx| dispatch_call(
            &mut tx,
            call_id,
            &dispatch,
            &self.version_hashes
        ))
    }

    /// [`Ledger::queue_tool_call`] then [`Ledger::dispatch_tool_call`] in one transaction
    /// (`tool.queued`, then `tool.dispatched`): a call that gets a worker at once is queued and
    /// dispatched in one durable write. A call already `queued` is only dispatched.
    ///
    /// # Errors
    /// As the two of them: `NotFound`; `FailedPrecondition` (a call that is neither
    /// `pending`, `queued`, `dispatched` nor `indeterminate`); `InvalidArgument`: empty worker
    /// id. Nothing is written on an error.
    pub async fn queue_and_dispatch_tool_call(
        &self,
        call_id: &str,
        dispatch: Dispatch,
    ) -> Result<ToolInvocation> {
        require_text("worker_id", &dispatch.worker_id)?;
        write_tx!(self, |tx| async {
            let (mut head, mut call) = lock_call(&mut tx, call_id).await?;
            if call.status != CallStatus::Queued {
                call = queue_locked(&mut tx, &mut head, &call).await?;
            }
            dispatch_locked(&mut tx, &mut head, &call, &dispatch, &self.version_hashes).await
        })
    }

    /// Fails an open call on the runtime's side (no handler, capacity exhausted, invalid
    /// arguments, deadline, a read-only call left indeterminate…): `tool.completed` with
    /// `status: failed`. Allowed from `pending`, `queued`, `dispatched`, `indeterminate`.
    ///
    /// # Errors
    /// `NotFound`; `FailedPrecondition`; `InvalidArgument`: empty code.
    pub async fn fail_tool_call(
        &self,
        call_id: &str,
        code: &str,
        message: &str,
    ) -> Result<ToolInvocation> {
        require_text("error code", code)?;
        write_tx!(self, |tx| fail(&mut tx, call_id, code, message))
    }

    /// A policy denied the call at dispatch time (`tool.policy_denied`, actor `policy`): the
    /// call fails with code `policy_denied` and the reason; no worker is invoked. Allowed from
    /// `pending` and `queued`.
    ///
    /// # Errors
    /// `NotFound`; `FailedPrecondition`; `InvalidArgument`: empty reason.
    pub async fn deny_tool_call(
        &self,
        call_id: &str,
        reason: &str,
        policy_ref: Option<&str>,
    ) -> Result<ToolInvocation> {
        require_text("reason", reason)?;
        write_tx!(self, |tx| deny(&mut tx, call_id, reason, policy_ref))
    }

    /// `dispatched → indeterminate` (`tool.indeterminate`): the worker was lost mid-call.
    ///
    /// # Errors
    /// `NotFound`; `FailedPrecondition`.
    pub async fn mark_tool_call_indeterminate(
        &self,
        call_id: &str,
        reason: &str,
    ) -> Result<ToolInvocation> {
        require_text("reason", reason)?;
        write_tx!(self, |tx| indeterminate(&mut tx, call_id, reason))
    }

    /// One call.
    ///
    /// # Errors
    /// `NotFound`: `tool call "X" not found`.
    pub async fn get_tool_call(&self, call_id: &str) -> Result<ToolInvocation> {
        let mut conn = self.pool.acquire().await?;
        require(&mut conn.conn(), call_id).await
    }

    /// The call if it exists and is terminal (`succeeded`, `failed`, `cancelled`): the router
    /// acknowledges a worker's in-flight call id at once when this returns `Some`, and dispatch
    /// returns the stored outcome instead of invoking again.
    ///
    /// # Errors
    /// Database errors.
    pub async fn completed_call(&self, call_id: &str) -> Result<Option<ToolInvocation>> {
        let mut conn = self.pool.acquire().await?;
        Ok(find(&mut conn.conn(), call_id)
            .await?
            .filter(|c| c.status.is_terminal()))
    }

    /// A session's open calls (every status but `succeeded`, `failed`, `cancelled`), oldest
    /// first: what recovery re-drives.
    ///
    /// # Errors
    /// `NotFound`: `session X not found`.
    pub async fn in_flight_calls(&self, session_id: &str) -> Result<Vec<ToolInvocation>> {
        let mut conn = self.pool.acquire().await?;
        let mut c = conn.conn();
        rows::require_session_head(&mut c, session_id).await?;
        Ok(for_session(&mut c, session_id)
            .await?
            .into_iter()
            .filter(|call| !call.status.is_terminal())
            .collect())
    }
}
