//! Changes that cross entities, above the modules whose rows they change: a session's end
//! (its pending approvals closed, its open calls cancelled, its running descendants cancelled,
//! its secrets purged), sessions failed because their version was retired or their agent
//! archived, a worker's result that closes the call's pending approval, and a cancelled call
//! whose approval is closed instead. `approvals`, `invocations`, `sessions` and `secrets` never
//! import this module, so their graph stays acyclic
//! (`guard_rails::ledger_and_engine_modules_form_an_acyclic_graph`).

use phrony_auth::Attribution;
use uuid::Uuid;

use crate::Ledger;
use crate::approvals;
use crate::db::{Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{ToolCompleted, ToolLateResult};
use crate::events::{StreamHead, lock_stream};
use crate::invocations::{
    self, CallStatus, RecordedResult, ToolInvocation, ToolOutcome, ToolResult, emit, lock_call,
    outcome_in_doubt, require, require_text,
};
use crate::leases;
use crate::rows::{Session, require_session_head};
use crate::sessions::{self, SessionStatus, StatusChange, StatusChanged, check_change};

// ---------------------------------------------------------------------------------------------
// Sessions.

/// The checks of a requested status change that need no database (actor, error message,
/// output), shared by every write that changes a session's status.
pub(crate) fn check_request(change: &StatusChange) -> Result<()> {
    if change.actor.actor.trim().is_empty() {
        return Err(LedgerError::invalid("actor is required"));
    }
    match (change.to, &change.error) {
        (SessionStatus::Failed, None) => {
            return Err(LedgerError::invalid(
                "a failed session needs an error message",
            ));
        }
        (SessionStatus::Failed, Some(e)) if e.trim().is_empty() => {
            return Err(LedgerError::invalid(
                "a failed session needs an error message",
            ));
        }
        (to, Some(_)) if to != SessionStatus::Failed => {
            return Err(LedgerError::invalid(format!(
                "an error message is only recorded with status failed, not {to}"
            )));
        }
        _ => {}
    }
    if change.output.is_some() && change.to != SessionStatus::Completed {
        return Err(LedgerError::invalid(format!(
            "an output is only recorded with status completed, not {}",
            change.to
        )));
    }
    Ok(())
}

pub(crate) async fn set_status(
    tx: &mut Tx,
    id: &str,
    change: &StatusChange,
) -> Result<StatusChanged> {
    let mut head = lock_stream(tx, id).await?;
    set_status_locked(tx, &mut head, id, change).await
}

/// [`set_status`] on the session's stream, locked by this transaction (`head`). A change that
/// names the status it expects ([`StatusChange::expect_from`], as the engine's always do) reads
/// nothing first: it is recorded from that status and the projection's conditional `UPDATE`
/// refuses it, rolling the transaction back, when the session is not in it. Otherwise the
/// status is read under the lock.
pub(crate) async fn set_status_locked(
    tx: &mut Tx,
    head: &mut StreamHead,
    id: &str,
    change: &StatusChange,
) -> Result<StatusChanged> {
    let from = match change.expect_from {
        Some(expected) if expected.can_change_to(change.to) => expected,
        // No expectation, or one no session could satisfy: the error names the actual status.
        _ => require_session_head(&mut tx.conn(), id).await?.status,
    };
    set_status_from(tx, head, id, from, change).await
}

/// [`set_status_locked`] of a session whose status this transaction read under the stream's
/// lock (or expects: see there) as `from`.
pub(crate) async fn set_status_from(
    tx: &mut Tx,
    head: &mut StreamHead,
    id: &str,
    from: SessionStatus,
    change: &StatusChange,
) -> Result<StatusChanged> {
    check_change(id, from, change)?;
    let mut closed = Closed::default();
    let session = transition(tx, head, id, from, change, &mut closed, true).await?;
    Ok(StatusChanged {
        session,
        from,
        closed_approvals: closed.approvals,
        cancelled_calls: closed.calls,
        cancelled_children: closed.children,
        secrets_purged: closed.secrets_purged,
    })
}

/// What a terminal status change closed ([`StatusChanged`]'s lists), gathered across the
/// cascade to the session's running descendants.
#[derive(Default)]
struct Closed {
    approvals: Vec<Uuid>,
    calls: Vec<String>,
    children: Vec<String>,
    secrets_purged: u64,
}

/// Fails every live session running one of `version_ids` because the version was taken out of
/// use (retired, or its agent archived), inside the lifecycle change's transaction: each
/// session's pending approvals are closed (`cancelled`) and its open calls cancelled with
/// `reason`, so nothing they held is dispatched, then the session fails with `reason`
/// (`actor` recorded). Returns the ids of the sessions it ended.
pub(crate) async fn end_for_versions(
    tx: &mut Tx,
    version_ids: &[Uuid],
    reason: &str,
    actor: &Attribution,
) -> Result<Vec<String>> {
    let mut ended = Vec::new();
    for version_id in version_ids {
        let rows = tx
            .conn()
            .fetch_all(
                "find live sessions of a version",
                "SELECT id FROM sessions WHERE agent_version_id = $1 \
                 AND status NOT IN ('completed', 'failed', 'cancelled') ORDER BY created_at, id",
                args![*version_id],
            )
            .await?;
        let ids = rows
            .iter()
            .map(|r| r.text("id"))
            .collect::<Result<Vec<_>>>()?;
        for id in ids {
            let mut head = lock_stream(tx, &id).await?;
            // A parent ended earlier in this loop may have cancelled it already.
            let status = require_session_head(&mut tx.conn(), &id).await?.status;
            if status.is_terminal() {
                continue;
            }
            approvals::close_pending(tx, &mut head, &id, reason).await?;
            invocations::cancel_open(tx, &mut head, &id, reason).await?;
            let change = StatusChange::failed(reason).by(actor);
            set_status_from(tx, &mut head, &id, status, &change).await?;
            ended.push(id);
        }
    }
    Ok(ended)
}

/// The running child sessions of session `$1` (`sessions`).
const LIVE_CHILDREN: &str =
    "parent_session_id = $1 AND status NOT IN ('completed', 'failed', 'cancelled')";

/// What the end of a session has to close, asked in one statement (most sessions end holding
/// nothing: their approvals decided, their calls done, no children running): whether it has
/// pending approvals, open tool calls and running children, and how many secrets it stores.
/// Each predicate is the one the query that then acts uses.
struct ToClose {
    approvals: bool,
    calls: bool,
    children: bool,
    secrets: u64,
}

/// The open (not terminal) tool calls of session `$1` (`tool_invocations`).
static OPEN_CALLS_OF_SESSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let closed_calls = CallStatus::ALL
        .iter()
        .filter(|s| s.is_terminal())
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    format!("session_id = $1 AND status NOT IN ({closed_calls})")
});

async fn to_close(tx: &mut Tx, session_id: &str) -> Result<ToClose> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT EXISTS (SELECT 1 FROM approvals a WHERE {pending}) AS approvals, \
             EXISTS (SELECT 1 FROM tool_invocations WHERE {open_calls}) AS calls, \
             EXISTS (SELECT 1 FROM sessions WHERE {LIVE_CHILDREN}) AS children, \
             (SELECT COUNT(*) FROM session_secrets WHERE session_id = $1) AS secrets",
            pending = approvals::PENDING_OF_SESSION,
            open_calls = *OPEN_CALLS_OF_SESSION,
        )
    });
    let row = tx
        .conn()
        .fetch_optional("probe what a session's end closes", &SQL, args![session_id])
        .await?
        .ok_or_else(|| LedgerError::corrupt("a probe of aggregates returned no row"))?;
    Ok(ToClose {
        approvals: row.bool("approvals")?,
        calls: row.bool("calls")?,
        children: row.bool("children")?,
        secrets: u64::try_from(row.int("secrets")?).unwrap_or(0),
    })
}

/// Appends and applies one status change of a locked session, from status `from`. A terminal
/// change first closes the session's pending approvals, cancels its open tool calls and
/// cancels its running descendants (each in its own stream), then purges its secrets (in
/// [`apply`]) and releases the lease this replica held on it. Returns the session's row as
/// the change wrote it. `top`: the session asked to change, not a descendant the cascade
/// reached (only its purged secrets are counted).
async fn transition(
    tx: &mut Tx,
    head: &mut StreamHead,
    id: &str,
    from: SessionStatus,
    change: &StatusChange,
    out: &mut Closed,
    top: bool,
) -> Result<Session> {
    if change.to.is_terminal() {
        let why = format!("session {id} ended ({})", change.to);
        let open = to_close(tx, id).await?;
        if open.approvals {
            out.approvals
                .extend(approvals::close_pending(tx, head, id, &why).await?);
        }
        if open.calls {
            out.calls
                .extend(invocations::cancel_open(tx, head, id, &why).await?);
        }
        let children = if open.children {
            tx.conn()
                .fetch_all(
                    "find running children",
                    &format!("SELECT id FROM sessions WHERE {LIVE_CHILDREN} ORDER BY id"),
                    args![id],
                )
                .await?
        } else {
            Vec::new()
        };
        for row in children {
            let child_id = row.text("id")?;
            let mut child_head = lock_stream(tx, &child_id).await?;
            let child = require_session_head(&mut tx.conn(), &child_id)
                .await?
                .status;
            if child.is_terminal() {
                continue;
            }
            let cascade = StatusChange::cancelled()
                .by(change.actor.clone())
                .because(format!("parent session {id} ended ({})", change.to));
            out.children.push(child_id.clone());
            Box::pin(transition(
                tx,
                &mut child_head,
                &child_id,
                child,
                &cascade,
                out,
                false,
            ))
            .await?;
        }
        if top {
            out.secrets_purged = open.secrets;
        }
    }
    let changed = sessions::append_transition(tx, head, id, from, change).await?;
    if change.to.is_terminal() {
        leases::release_with_end(tx, id).await?;
    }
    Ok(changed)
}

// ---------------------------------------------------------------------------------------------
// Tool calls and their approvals.

async fn record_result(
    tx: &mut Tx,
    call_id: &str,
    r: &ToolResult,
    resume: Option<(SessionStatus, &StatusChange)>,
) -> Result<RecordedResult> {
    use CallStatus as C;
    let (mut head, call) = lock_call(tx, call_id).await?;
    let (result, error_code, error_message) = match &r.outcome {
        ToolOutcome::Success(v) => (Some(v.clone()), None, None),
        ToolOutcome::Error { code, message } => (None, Some(code.clone()), Some(message.clone())),
    };
    // Any open call that was sent to a worker at least once: the worker really ran it, so its
    // outcome wins over a pending re-dispatch or a recovery approval. So does the outcome of a
    // call closed without knowing it: cancelled with its session, or resolved "outcome
    // unknown, not re-sent" by an operator.
    let accepts = call.attempt >= 1 && (!call.status.is_terminal() || outcome_in_doubt(&call));
    if !accepts {
        let reason = if call.status.is_terminal() {
            format!("the call is already {}", call.status)
        } else {
            format!("the call was never dispatched (status {})", call.status)
        };
        let payload = ToolLateResult {
            call_id: call.call_id.clone(),
            status: call.status,
            reason,
            worker_id: r.worker_id.clone(),
            result,
            error_code,
            error_message,
        };
        emit(tx, &mut head, &call, "worker", payload).await?;
        return Ok(RecordedResult {
            applied: false,
            invocation: call,
            closed_approval: None,
            resumed: None,
        });
    }
    let status = if result.is_some() {
        C::Succeeded
    } else {
        C::Failed
    };
    let payload = ToolCompleted {
        call_id: call.call_id.clone(),
        status,
        result,
        error_code,
        error_message,
        worker_id: r.worker_id.clone(),
        usage: r.usage,
        resolved_by: None,
    };
    let completed = invocations::transition(tx, &mut head, &call, "worker", payload).await?;
    let (invocation, closed_approval) = if call.status == C::AwaitingApproval {
        let closed = approvals::close_for_call(
            tx,
            &mut head,
            &call.call_id,
            "the tool outcome arrived before a decision",
        )
        .await?;
        (require(&mut tx.conn(), call_id).await?, closed)
    } else {
        (completed, None)
    };
    let resumed = match resume {
        Some((from, change)) => {
            resume_when_idle(tx, &mut head, &call.session_id, from, change).await?
        }
        None => None,
    };
    Ok(RecordedResult {
        applied: true,
        invocation,
        closed_approval,
        resumed,
    })
}

/// `change` on a session in status `from` (the one the change expects) with no open tool call
/// left; nothing otherwise.
async fn resume_when_idle(
    tx: &mut Tx,
    head: &mut StreamHead,
    session_id: &str,
    from: SessionStatus,
    change: &StatusChange,
) -> Result<Option<StatusChanged>> {
    if require_session_head(&mut tx.conn(), session_id)
        .await?
        .status
        != from
    {
        return Ok(None);
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT 1 FROM tool_invocations WHERE {} LIMIT 1",
            *OPEN_CALLS_OF_SESSION
        )
    });
    let open = tx
        .conn()
        .fetch_optional(
            "look for a session's open tool calls",
            &SQL,
            args![session_id],
        )
        .await?;
    if open.is_some() {
        return Ok(None);
    }
    set_status_from(tx, head, session_id, from, change)
        .await
        .map(Some)
}

async fn cancel(tx: &mut Tx, call_id: &str, reason: &str) -> Result<ToolInvocation> {
    let (mut head, call) = lock_call(tx, call_id).await?;
    if call.status.is_terminal() {
        return Err(LedgerError::precondition(format!(
            "tool call {} cannot go from {} to cancelled",
            call.call_id, call.status
        )));
    }
    if approvals::close_for_call(tx, &mut head, call_id, reason)
        .await?
        .is_none()
    {
        invocations::cancel_locked(tx, &mut head, &call, reason).await?;
    }
    require(&mut tx.conn(), call_id).await
}

// ---------------------------------------------------------------------------------------------
// Public API.

impl Ledger {
    /// Changes a session's status, appending one event: `session.status_changed`, or
    /// `session.completed` / `session.failed` / `session.cancelled` for terminal statuses. A
    /// terminal change also, in the same transaction: decides the session's pending approvals
    /// as `cancelled`, cancels its open tool calls, cancels its running descendant sessions and
    /// deletes its secrets. See [`SessionStatus::can_change_to`] for the allowed changes.
    ///
    /// # Errors
    /// - `NotFound`: `session X not found`;
    /// - `FailedPrecondition`: `session X cannot change status from A to B`, or
    ///   `session X is A, not B` when [`StatusChange::expect_from`] does not hold;
    /// - `InvalidArgument`: `failed` without an error message, an error on another status, an
    ///   output on a status other than `completed`, an empty actor.
    pub async fn set_session_status(
        &self,
        id: &str,
        change: StatusChange,
    ) -> Result<StatusChanged> {
        check_request(&change)?;
        write_tx!(self, |tx| set_status(&mut tx, id, &change))
    }

    /// Records a worker's result, idempotently. A result for a call that was dispatched at
    /// least once and is still open (`dispatched`, `indeterminate`, or waiting to be sent again:
    /// re-`queued`, `pending`, or `awaiting_approval` for a recovery approval, which is then
    /// closed as `cancelled`) completes it (`tool.completed`): the worker ran it, so a
    /// re-dispatch would run it twice.
    /// Any other result — a duplicate, a late result for a cancelled call, a result for a call
    /// never dispatched — is recorded as `tool.late_result` and changes nothing; either way the
    /// worker can be acknowledged.
    ///
    /// # Errors
    /// `NotFound`: `tool call "X" not found`.
    pub async fn record_tool_result(
        &self,
        call_id: &str,
        result: ToolResult,
    ) -> Result<RecordedResult> {
        if let ToolOutcome::Error { code, .. } = &result.outcome {
            require_text("error code", code)?;
        }
        write_tx!(self, |tx| record_result(&mut tx, call_id, &result, None))
    }

    /// [`Self::record_tool_result`], and in the same transaction, when the result completed
    /// the last open call of its session and the session is in the status `resume` expects
    /// ([`StatusChange::from`], required): the change `resume` — the engine's move from
    /// `awaiting_tool` back to `running` to ask the model again, one durable commit sooner.
    /// Otherwise the result alone is recorded; [`RecordedResult::resumed`] tells which.
    ///
    /// # Errors
    /// As [`Self::record_tool_result`]; `InvalidArgument` for a change that names no status
    /// to expect, or a terminal one (a session ends through [`Self::set_session_status`]).
    pub async fn record_tool_result_and_resume(
        &self,
        call_id: &str,
        result: ToolResult,
        resume: StatusChange,
    ) -> Result<RecordedResult> {
        if let ToolOutcome::Error { code, .. } = &result.outcome {
            require_text("error code", code)?;
        }
        check_request(&resume)?;
        let Some(from) = resume.expect_from else {
            return Err(LedgerError::invalid(
                "a resume after a tool result names the status it expects the session in",
            ));
        };
        if resume.to.is_terminal() || !from.can_change_to(resume.to) {
            return Err(LedgerError::invalid(format!(
                "a tool result cannot move its session from {from} to {}",
                resume.to
            )));
        }
        write_tx!(self, |tx| record_result(
            &mut tx,
            call_id,
            &result,
            Some((from, &resume))
        ))
    }

    /// Cancels an open call (`tool.cancelled`, code `cancelled`); a pending approval for it is
    /// decided `cancelled` instead. A result arriving later is recorded as `tool.late_result`.
    ///
    /// # Errors
    /// `NotFound`; `FailedPrecondition` for a terminal call.
    pub async fn cancel_tool_call(&self, call_id: &str, reason: &str) -> Result<ToolInvocation> {
        require_text("reason", reason)?;
        write_tx!(self, |tx| cancel(&mut tx, call_id, reason))
    }
}
