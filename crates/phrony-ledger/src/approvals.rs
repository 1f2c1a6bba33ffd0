//! Durable approvals (§3): opening, votes with quorum and veto, timeouts (deny, allow,
//! escalate) and closing, all as events in the owning session's stream.
//!
//! Deliberate differences from the reference:
//! - deciding an approval that is no longer pending is an error
//!   (`approval X is already <status>`), not a silent success;
//! - a timeout with `default: allow` **approves** the approval, whatever the quorum (the
//!   reference cast one vote, leaving quorum-2 approvals pending forever);
//! - votes carry the approver's edited arguments, and all approve votes of one approval must
//!   approve the same arguments: the first approve vote fixes them (its edit, or the proposed
//!   arguments), and a later approve vote with different edits is refused;
//! - approvals of sessions that end are decided `cancelled`, never left pending;
//! - the approval copies tool, version and arguments from the recorded tool call, and stores
//!   `call_hash`, a hash of the exact call it approves;
//! - an approval has a [`ApprovalKind`]: a `policy` approval asks "may this call run?"; an
//!   `outcome_review` asks "did this call already happen?" (its worker was lost, its lease
//!   expired, or the runtime restarted while a non-idempotent call was in flight). A review is
//!   resolved with a [`ReviewResolution`] (`happened`, `resend`, `fail`), never by a plain
//!   approve: approve without a resolution is refused, reject means `fail` (not re-sent).

use std::collections::HashSet;

use chrono::{DateTime, Duration, Utc};
use phrony_auth::{Attribution, Verification};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::Ledger;
use crate::chain::{canonical_json, format_ts};
use crate::db::{Arg, Conn, Row, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{
    ApprovalDecided, ApprovalEscalated, ApprovalRequired, ApprovalVoted, EventBody, expect_rows,
};
use crate::events::{StreamHead, append, lock_stream};
use crate::invocations::{self, ToolInvocation};
use crate::model::{AgentRef, Event};
use crate::paging::{Page, PageRequest, Where, decode_token, encode_token};
use crate::rows::{self, AgentVersionRef};
use crate::sessions;
use crate::vocabulary::{CallStatus, SessionStatus, error_codes};

/// Escalations beyond this depth are denied (`approval escalation depth exceeded`).
pub const MAX_ESCALATION_DEPTH: u32 = 5;

/// The `decided_by` of decisions made by a timeout.
pub use crate::vocabulary::TIMEOUT_ACTOR;

/// Whether two actor names are the same voter: names that differ only in case (Unicode
/// lowercase) are one person, so `EMAD` cannot add a second vote to `emad`'s. The recorded
/// name keeps the voter's own spelling.
#[must_use]
pub fn same_voter(a: &str, b: &str) -> bool {
    a == b || a.to_lowercase() == b.to_lowercase()
}

/// The refusal of a second vote by `actor`, who already voted as `earlier` (the ledger's
/// wording, for other stores to share).
#[must_use]
pub fn duplicate_vote_message(actor: &str, earlier: &str) -> String {
    if actor == earlier {
        format!("actor {actor:?} already decided on this approval")
    } else {
        format!("actor {actor:?} already decided on this approval (as {earlier:?})")
    }
}

pub use crate::vocabulary::{
    ApprovalKind, ApprovalStatus, ApprovalTimeout, OnModify, OnReject, ReviewResolution,
    TimeoutDefault, VoteDecision, not_resent_message,
};

/// Input of [`Ledger::open_approval`]. Tool, version, arguments and turn come from the recorded
/// tool call; the agent from the session.
#[derive(Debug, Clone, PartialEq)]
pub struct NewApproval {
    /// The approval's id (a random UUID).
    pub id: Uuid,
    /// The session that waits.
    pub session_id: String,
    /// The recorded tool call it gates.
    pub call_id: String,
    /// What it asks (a policy approval or an outcome review).
    pub kind: ApprovalKind,
    /// The deciding policy as `namespace/name@version` (`None` for recovery approvals).
    pub policy_ref: Option<String>,
    /// Why approval is needed (shown to approvers).
    pub reason: String,
    /// Who should decide (`phrony.com/approver_role`); informational.
    pub route: String,
    /// The governance authority boundary.
    pub authority_ref: String,
    /// Distinct approvers needed (at least 1).
    pub approvals_required: u32,
    /// The policy's separation-of-duties opt-out: the session's starter may vote on it
    /// (recorded in the `approval.required` event).
    pub allow_self_approval: bool,
    /// Approvers must acknowledge comprehension (on approve and reject).
    pub comprehension_required: bool,
    /// What a rejection does.
    pub on_reject: OnReject,
    /// What happens to edited arguments.
    pub on_modify: OnModify,
    /// The timeout, if any.
    pub timeout: Option<ApprovalTimeout>,
    /// The policy's `decision.runtime` map, passed through.
    pub policy_runtime: Map<String, Value>,
    /// Who opened it (`policy` for policy decisions, `system` for recovery).
    pub actor: Attribution,
}

/// An approval with its votes.
#[derive(Clone, PartialEq)]
pub struct Approval {
    /// Id.
    pub id: Uuid,
    /// The waiting session.
    pub session_id: String,
    /// The gated tool call.
    pub call_id: String,
    /// The approval this one escalates.
    pub parent_approval_id: Option<Uuid>,
    /// What it asks.
    pub kind: ApprovalKind,
    /// How an outcome review was resolved (`None` for policy approvals and open reviews).
    pub resolution: Option<ReviewResolution>,
    /// Status.
    pub status: ApprovalStatus,
    /// Who should decide.
    pub route: String,
    /// Why.
    pub reason: String,
    /// Dispatch ref of the tool.
    pub tool: String,
    /// Tool version.
    pub tool_version: String,
    /// The proposed arguments (the model's).
    pub args: Value,
    /// The arguments the approve votes fixed (an approver's edit), and after approval the
    /// arguments to dispatch; `None` while no approve vote edited them.
    pub effective_args: Option<Value>,
    /// Hex SHA-256 of the canonical JSON
    /// `{"args", "call_id", "session_id", "tool", "version"}` of the proposed call.
    pub call_hash: String,
    /// The session's agent version.
    pub agent_version_id: Uuid,
    /// Its `namespace/name@version`.
    pub agent: AgentVersionRef,
    /// The deciding policy `namespace/name@version`.
    pub policy_ref: Option<String>,
    /// The policy's runtime map.
    pub policy_runtime: Map<String, Value>,
    /// Authority boundary.
    pub authority_ref: String,
    /// Quorum.
    pub approvals_required: u32,
    /// Approve votes so far.
    pub approvals_received: u32,
    /// The policy's separation-of-duties opt-out (see [`Vote::check`]).
    pub allow_self_approval: bool,
    /// Who started the approval's session, as recorded (`None` for sessions recorded before
    /// attribution existed: they count as unverified).
    pub session_started_by: Option<Attribution>,
    /// Comprehension acknowledgement required.
    pub comprehension_required: bool,
    /// What a rejection does.
    pub on_reject: OnReject,
    /// What happens to edited arguments.
    pub on_modify: OnModify,
    /// The timeout.
    pub timeout: Option<ApprovalTimeout>,
    /// 0 for an original approval, +1 per escalation.
    pub escalation_depth: u32,
    /// When the timeout fires.
    pub expires_at: Option<DateTime<Utc>>,
    /// Who decided (the last voter, `system:timeout`, or `system`).
    pub decided_by: Option<String>,
    /// The deciding comment.
    pub comment: Option<String>,
    /// Opened.
    pub created_at: DateTime<Utc>,
    /// ApprovalDecided.
    pub decided_at: Option<DateTime<Utc>>,
    /// Votes, oldest first.
    pub votes: Vec<ApprovalVote>,
}

/// `Debug` lists every field, except attribution fields that were not recorded (so a dump of a
/// log recorded before attribution existed reads exactly as it did).
impl std::fmt::Debug for Approval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Approval");
        d.field("id", &self.id);
        d.field("session_id", &self.session_id);
        d.field("call_id", &self.call_id);
        d.field("parent_approval_id", &self.parent_approval_id);
        d.field("kind", &self.kind);
        d.field("resolution", &self.resolution);
        d.field("status", &self.status);
        d.field("route", &self.route);
        d.field("reason", &self.reason);
        d.field("tool", &self.tool);
        d.field("tool_version", &self.tool_version);
        d.field("args", &self.args);
        d.field("effective_args", &self.effective_args);
        d.field("call_hash", &self.call_hash);
        d.field("agent_version_id", &self.agent_version_id);
        d.field("agent", &self.agent);
        d.field("policy_ref", &self.policy_ref);
        d.field("policy_runtime", &self.policy_runtime);
        d.field("authority_ref", &self.authority_ref);
        d.field("approvals_required", &self.approvals_required);
        d.field("approvals_received", &self.approvals_received);
        if self.allow_self_approval {
            d.field("allow_self_approval", &self.allow_self_approval);
        }
        if self.session_started_by.is_some() {
            d.field("session_started_by", &self.session_started_by);
        }
        d.field("comprehension_required", &self.comprehension_required);
        d.field("on_reject", &self.on_reject);
        d.field("on_modify", &self.on_modify);
        d.field("timeout", &self.timeout);
        d.field("escalation_depth", &self.escalation_depth);
        d.field("expires_at", &self.expires_at);
        d.field("decided_by", &self.decided_by);
        d.field("comment", &self.comment);
        d.field("created_at", &self.created_at);
        d.field("decided_at", &self.decided_at);
        d.field("votes", &self.votes);
        d.finish()
    }
}

impl Approval {
    /// The arguments an approval of this approval dispatches: the fixed edit, else the proposed.
    #[must_use]
    pub fn args_to_dispatch(&self) -> &Value {
        self.effective_args.as_ref().unwrap_or(&self.args)
    }

    /// Whether the session holding the approval was started by a verified principal (the
    /// separation-of-duties and verified-quorum rules of [`Vote::check`] apply).
    #[must_use]
    pub fn session_is_verified(&self) -> bool {
        self.session_started_by
            .as_ref()
            .is_some_and(|a| a.verification.is_verified())
    }

    /// The vote that decided the approval (the latest vote by `decided_by`); `None` while
    /// pending and for the runtime's decisions (`system:timeout`, `system`).
    #[must_use]
    pub fn deciding_vote(&self) -> Option<&ApprovalVote> {
        let decided_by = self.decided_by.as_deref()?;
        self.votes.iter().rev().find(|v| v.decided_by == decided_by)
    }

    /// `decided_by` as a person reads it: the deciding voter's attribution (`emad
    /// (unverified)`, `alice via approvals-ui`), or the bare name for the runtime's deciders
    /// (`system:timeout`, `system`) and for votes recorded before attribution existed.
    #[must_use]
    pub fn decided_by_display(&self) -> Option<String> {
        let decided_by = self.decided_by.as_deref()?;
        Some(
            self.votes
                .iter()
                .rev()
                .find(|v| v.decided_by == decided_by)
                .map_or_else(|| decided_by.to_owned(), ApprovalVote::voter_display),
        )
    }
}

/// A recorded vote.
#[derive(Clone, PartialEq)]
pub struct ApprovalVote {
    /// The voter.
    pub decided_by: String,
    /// Approve or reject.
    pub decision: VoteDecision,
    /// The voter's comment.
    pub comment: String,
    /// Whether the voter acknowledged comprehension.
    pub comprehension_acknowledged: bool,
    /// Arguments the voter approved instead of the proposed ones.
    pub edited_args: Option<Value>,
    /// When.
    pub created_at: DateTime<Utc>,
    /// How the voter was established (`None`: recorded before attribution existed).
    pub verification: Option<Verification>,
    /// The principal that relayed the vote, if any.
    pub via: Option<String>,
}

/// `Debug` lists every field, except attribution fields that were not recorded (so a dump of a
/// log recorded before attribution existed reads exactly as it did).
impl std::fmt::Debug for ApprovalVote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ApprovalVote");
        d.field("decided_by", &self.decided_by);
        d.field("decision", &self.decision);
        d.field("comment", &self.comment);
        d.field(
            "comprehension_acknowledged",
            &self.comprehension_acknowledged,
        );
        d.field("edited_args", &self.edited_args);
        d.field("created_at", &self.created_at);
        if self.verification.is_some() {
            d.field("verification", &self.verification);
        }
        if self.via.is_some() {
            d.field("via", &self.via);
        }
        d.finish()
    }
}

impl ApprovalVote {
    /// The voter's attribution, when one was recorded.
    #[must_use]
    pub fn attribution(&self) -> Option<Attribution> {
        self.verification.map(|verification| Attribution {
            actor: self.decided_by.clone(),
            verification,
            via: self.via.clone(),
        })
    }

    /// The voter as a person reads it ([`crate::display_actor`]).
    #[must_use]
    pub fn voter_display(&self) -> String {
        crate::model::display_actor(&self.decided_by, self.verification, self.via.as_deref())
    }
}

/// Input of [`Ledger::cast_vote`].
#[derive(Debug, Clone, PartialEq)]
pub struct Vote {
    /// The voter (required; the daemon resolves `PHRONY_ACTOR` fallbacks before), with how
    /// the runtime established it and the relaying principal.
    pub actor: Attribution,
    /// The approval routes the voter's credential is restricted to (empty: any route); a vote
    /// on an approval routed elsewhere is refused ([`Vote::check`]).
    pub routes: Vec<String>,
    /// Approve or reject.
    pub decision: VoteDecision,
    /// Comment (passed to the model on `return_to_agent` rejections by the engine).
    pub comment: String,
    /// The voter acknowledges comprehension.
    pub comprehension_acknowledged: bool,
    /// Approve with these arguments instead (a JSON object); refused on a reject.
    pub edited_args: Option<Value>,
    /// The resolution of an outcome review (required to approve one; refused on a policy
    /// approval). It must agree with `decision` ([`ReviewResolution::decision`]).
    pub resolution: Option<ReviewResolution>,
    /// With [`ReviewResolution::Happened`]: the result to record (any JSON), if the operator
    /// knows it.
    pub result: Option<Value>,
}

impl Vote {
    /// A vote without edits or resolution.
    #[must_use]
    pub fn new(
        actor: impl Into<Attribution>,
        decision: VoteDecision,
        comment: impl Into<String>,
    ) -> Self {
        Self {
            actor: actor.into(),
            routes: Vec::new(),
            decision,
            comment: comment.into(),
            comprehension_acknowledged: false,
            edited_args: None,
            resolution: None,
            result: None,
        }
    }

    /// The vote resolving an outcome review with `resolution`.
    #[must_use]
    pub fn resolve(
        actor: impl Into<Attribution>,
        resolution: ReviewResolution,
        comment: impl Into<String>,
    ) -> Self {
        Self {
            resolution: Some(resolution),
            ..Self::new(actor, resolution.decision(), comment)
        }
    }
}

/// Result of [`Ledger::cast_vote`].
#[derive(Debug, Clone, PartialEq)]
pub struct VoteOutcome {
    /// The approval after the vote (status `pending` until the quorum or a veto).
    pub approval: Approval,
    /// Whether this vote decided it.
    pub decided: bool,
}

/// Result of [`Ledger::expire_approval`].
#[derive(Debug, Clone, PartialEq)]
pub struct TimeoutOutcome {
    /// The expired approval after its decision (`denied`, `approved` or `escalated`).
    pub approval: Approval,
    /// The new pending approval of an escalation.
    pub escalated_to: Option<Approval>,
}

/// Filters of [`Ledger::list_approvals`]; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApprovalFilter {
    /// Status.
    pub status: Option<ApprovalStatus>,
    /// Session.
    pub session_id: Option<String>,
    /// Agent (any version).
    pub agent: Option<AgentRef>,
    /// Route.
    pub route: Option<String>,
}

/// The hash stored as [`Approval::call_hash`].
#[must_use]
pub fn call_hash(session_id: &str, call: &ToolInvocation) -> String {
    let canonical = canonical_json(&json!({
        "session_id": session_id,
        "call_id": call.call_id,
        "tool": call.tool,
        "version": call.version,
        // The arguments the call would run with now (an approver's edit included), not the
        // model's original proposal.
        "args": call.args,
    }));
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

// ---------------------------------------------------------------------------------------------
// Event payloads.

// ---------------------------------------------------------------------------------------------
// Reads.

const APPROVAL_SELECT: &str = "SELECT a.id, a.session_id, a.call_id, a.parent_approval_id, \
     a.status, a.route, a.reason, a.tool, a.tool_version, a.args, a.effective_args, a.call_hash, \
     a.agent_version_id, s.agent_namespace, s.agent_name, s.agent_version, a.policy_ref, \
     a.policy_runtime, a.authority_ref, a.approvals_required, a.approvals_received, \
     a.comprehension_required, a.on_reject, a.on_modify, a.timeout_default, a.timeout_minutes, \
     a.escalate_route, a.escalate_after_minutes, a.escalation_depth, a.expires_at, a.decided_by, \
     a.comment, a.created_at, a.decided_at, a.kind, a.resolution, a.allow_self_approval, \
     s.created_by, s.created_by_verification, s.created_by_via \
     FROM approvals a JOIN sessions s ON s.id = a.session_id";

fn u32_col(row: &Row, column: &str) -> Result<u32> {
    u32::try_from(row.int(column)?)
        .map_err(|_| LedgerError::corrupt(format!("approvals.{column} out of range")))
}

fn opt_u32_col(row: &Row, column: &str) -> Result<Option<u32>> {
    row.opt_int(column)?
        .map(|v| {
            u32::try_from(v)
                .map_err(|_| LedgerError::corrupt(format!("approvals.{column} out of range")))
        })
        .transpose()
}

fn approval_from_row(row: &Row) -> Result<Approval> {
    let timeout = match opt_u32_col(row, "timeout_minutes")? {
        None => None,
        Some(after_minutes) => Some(ApprovalTimeout {
            after_minutes,
            default: TimeoutDefault::parse_stored(
                row.opt_text("timeout_default")?
                    .as_deref()
                    .unwrap_or("deny"),
            )?,
            escalate_to_route: row.opt_text("escalate_route")?,
            escalate_after_minutes: opt_u32_col(row, "escalate_after_minutes")?,
        }),
    };
    let policy_runtime = match row.json("policy_runtime")? {
        Value::Object(map) => map,
        other => {
            return Err(LedgerError::corrupt(format!(
                "approvals.policy_runtime is not an object: {other}"
            )));
        }
    };
    Ok(Approval {
        id: row.uuid("id")?,
        session_id: row.text("session_id")?,
        call_id: row.text("call_id")?,
        parent_approval_id: row.opt_uuid("parent_approval_id")?,
        kind: ApprovalKind::parse_stored(&row.text("kind")?)?,
        resolution: row
            .opt_text("resolution")?
            .as_deref()
            .map(ReviewResolution::parse_stored)
            .transpose()?,
        status: ApprovalStatus::parse_stored(&row.text("status")?)?,
        route: row.text("route")?,
        reason: row.text("reason")?,
        tool: row.text("tool")?,
        tool_version: row.text("tool_version")?,
        args: row.json("args")?,
        effective_args: row.opt_json("effective_args")?,
        call_hash: row.text("call_hash")?,
        agent_version_id: row.uuid("agent_version_id")?,
        agent: AgentVersionRef::new(
            row.text("agent_namespace")?,
            row.text("agent_name")?,
            row.text("agent_version")?,
        ),
        policy_ref: row.opt_text("policy_ref")?,
        policy_runtime,
        authority_ref: row.text("authority_ref")?,
        approvals_required: u32_col(row, "approvals_required")?,
        approvals_received: u32_col(row, "approvals_received")?,
        allow_self_approval: row.bool("allow_self_approval")?,
        session_started_by: rows::attribution_cols(
            row,
            "created_by",
            "created_by_verification",
            "created_by_via",
        )?,
        comprehension_required: row.bool("comprehension_required")?,
        on_reject: OnReject::parse_stored(&row.text("on_reject")?)?,
        on_modify: OnModify::parse_stored(&row.text("on_modify")?)?,
        timeout,
        escalation_depth: u32_col(row, "escalation_depth")?,
        expires_at: row.opt_ts("expires_at")?,
        decided_by: row.opt_text("decided_by")?,
        comment: row.opt_text("comment")?,
        created_at: row.ts("created_at")?,
        decided_at: row.opt_ts("decided_at")?,
        votes: Vec::new(),
    })
}

async fn load_votes(conn: &mut Conn<'_>, approval: &mut Approval) -> Result<()> {
    let rows = conn
        .fetch_all(
            "read approval votes",
            "SELECT decided_by, decision, comment, comprehension_acknowledged, edited_args, \
             created_at, verification, via FROM approval_votes WHERE approval_id = $1 ORDER BY created_at, decided_by",
            args![approval.id],
        )
        .await?;
    approval.votes = rows
        .iter()
        .map(|r| {
            Ok(ApprovalVote {
                decided_by: r.text("decided_by")?,
                decision: VoteDecision::parse_stored(&r.text("decision")?)?,
                comment: r.text("comment")?,
                comprehension_acknowledged: r.bool("comprehension_acknowledged")?,
                edited_args: r.opt_json("edited_args")?,
                created_at: r.ts("created_at")?,
                verification: rows::opt_verification(r, "verification")?,
                via: r.opt_text("via")?,
            })
        })
        .collect::<Result<_>>()?;
    Ok(())
}

fn not_found(id: Uuid) -> LedgerError {
    LedgerError::not_found(format!("approval {id} not found"))
}

pub(crate) async fn find(conn: &mut Conn<'_>, id: Uuid) -> Result<Option<Approval>> {
    let sql = format!("{APPROVAL_SELECT} WHERE a.id = $1");
    let Some(row) = conn
        .fetch_optional("read approval", &sql, args![id])
        .await?
    else {
        return Ok(None);
    };
    let mut approval = approval_from_row(&row)?;
    load_votes(conn, &mut approval).await?;
    Ok(Some(approval))
}

async fn require(conn: &mut Conn<'_>, id: Uuid) -> Result<Approval> {
    find(conn, id).await?.ok_or_else(|| not_found(id))
}

async fn many(
    conn: &mut Conn<'_>,
    context: &'static str,
    sql: &str,
    a: Vec<Arg>,
) -> Result<Vec<Approval>> {
    let rows = conn.fetch_all(context, sql, a).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let mut approval = approval_from_row(row)?;
        load_votes(conn, &mut approval).await?;
        out.push(approval);
    }
    Ok(out)
}

pub(crate) async fn for_session(conn: &mut Conn<'_>, session_id: &str) -> Result<Vec<Approval>> {
    let sql = format!("{APPROVAL_SELECT} WHERE a.session_id = $1 ORDER BY a.created_at, a.id");
    many(conn, "list session approvals", &sql, args![session_id]).await
}

async fn list(
    conn: &mut Conn<'_>,
    filter: &ApprovalFilter,
    page: &PageRequest,
) -> Result<Page<Approval>> {
    let cursor = page
        .token
        .as_deref()
        .map(|t| decode_token("a", t))
        .transpose()?;
    let mut w = Where::default();
    if let Some(status) = filter.status {
        let p = w.bind(Arg::from(status.as_str()));
        w.push(format!("a.status = {p}"));
    }
    if let Some(session) = &filter.session_id {
        let p = w.bind(Arg::from(session.as_str()));
        w.push(format!("a.session_id = {p}"));
    }
    if let Some(agent) = &filter.agent {
        agent.validate()?;
        let ns = w.bind(Arg::from(agent.namespace.as_str()));
        let name = w.bind(Arg::from(agent.name.as_str()));
        w.push(format!(
            "s.agent_namespace = {ns} AND s.agent_name = {name}"
        ));
    }
    if let Some(route) = &filter.route {
        let p = w.bind(Arg::from(route.as_str()));
        w.push(format!("a.route = {p}"));
    }
    if let Some(c) = cursor {
        let id = Uuid::parse_str(&c.id)
            .map_err(|_| LedgerError::invalid("invalid page token for approvals"))?;
        w.after_cursor("a.created_at", "a.id", c.created_at, Arg::from(id));
    }
    let limit = page.limit();
    let l = w.bind(Arg::from(i64::from(limit) + 1));
    let sql = format!(
        "{APPROVAL_SELECT} {} ORDER BY a.created_at DESC, a.id DESC LIMIT {l}",
        w.sql()
    );
    let mut items = many(conn, "list approvals", &sql, w.args).await?;
    let next_token = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items
            .last()
            .map(|a| encode_token("a", &a.created_at, &a.id.hyphenated().to_string()))
    } else {
        None
    };
    Ok(Page { items, next_token })
}

// ---------------------------------------------------------------------------------------------
// Writes.

/// Locks the approval's session stream and returns the approval as it is under the lock.
async fn lock_approval(tx: &mut Tx, id: Uuid) -> Result<(StreamHead, Approval)> {
    let session_id = tx
        .conn()
        .fetch_optional(
            "find approval session",
            "SELECT session_id FROM approvals WHERE id = $1",
            args![id],
        )
        .await?
        .ok_or_else(|| not_found(id))?
        .text("session_id")?;
    let head = lock_stream(tx, &session_id).await?;
    let approval = require(&mut tx.conn(), id).await?;
    Ok((head, approval))
}

fn require_pending(approval: &Approval) -> Result<()> {
    if approval.status == ApprovalStatus::Pending {
        Ok(())
    } else {
        Err(LedgerError::precondition(format!(
            "approval {} is already {}",
            approval.id, approval.status
        )))
    }
}

async fn emit(
    tx: &mut Tx,
    head: &mut StreamHead,
    call_id: &str,
    turn: Option<u32>,
    actor: impl Into<Attribution>,
    body: impl Into<EventBody>,
) -> Result<Event> {
    let body = body.into();
    let mut new = body.clone().into_new_event(actor)?;
    new.call_id = Some(call_id.to_owned());
    new.turn = turn;
    let event = append(tx, head, new).await?;
    apply(&mut tx.conn(), &event, &body).await?;
    Ok(event)
}

async fn call_turn(tx: &mut Tx, call_id: &str) -> Result<Option<u32>> {
    Ok(invocations::find(&mut tx.conn(), call_id)
        .await?
        .map(|c| c.turn))
}

fn expiry(now: DateTime<Utc>, minutes: u32) -> DateTime<Utc> {
    now + Duration::minutes(i64::from(minutes))
}

async fn open(tx: &mut Tx, new: &NewApproval) -> Result<Approval> {
    use CallStatus as C;
    let mut head = lock_stream(tx, &new.session_id).await?;
    let session = rows::require_session(&mut tx.conn(), &new.session_id).await?;
    if session.status != SessionStatus::AwaitingApproval
        && !session
            .status
            .can_change_to(SessionStatus::AwaitingApproval)
    {
        return Err(LedgerError::precondition(format!(
            "session {} is {} and cannot wait for an approval",
            session.id, session.status
        )));
    }
    let call = invocations::require(&mut tx.conn(), &new.call_id).await?;
    if call.session_id != session.id {
        return Err(LedgerError::invalid(format!(
            "tool call {} belongs to session {}, not {}",
            call.call_id, call.session_id, session.id
        )));
    }
    if !matches!(call.status, C::Pending | C::Queued | C::Indeterminate) {
        return Err(LedgerError::precondition(format!(
            "tool call {} is {} and cannot wait for an approval",
            call.call_id, call.status
        )));
    }
    if new.kind == ApprovalKind::OutcomeReview && call.attempt < 1 {
        return Err(LedgerError::precondition(format!(
            "tool call {} was never sent to a worker, so its outcome cannot be in doubt",
            call.call_id
        )));
    }
    if find(&mut tx.conn(), new.id).await?.is_some() {
        return Err(LedgerError::AlreadyExists {
            message: format!("approval {} already exists", new.id),
        });
    }
    let payload = ApprovalRequired {
        approval_id: new.id,
        call_id: call.call_id.clone(),
        kind: new.kind,
        tool: call.tool.clone(),
        version: call.version.clone(),
        // A fresh approval after an edited, revalidated call shows and runs the edit.
        args: call.args.clone(),
        call_hash: call_hash(&session.id, &call),
        agent_version_id: session.agent_version_id,
        agent_ref: session.agent.to_string(),
        policy_ref: new.policy_ref.clone(),
        policy_runtime: new.policy_runtime.clone(),
        reason: new.reason.clone(),
        route: new.route.clone(),
        authority_ref: new.authority_ref.clone(),
        approvals_required: new.approvals_required,
        allow_self_approval: new.allow_self_approval,
        comprehension_required: new.comprehension_required,
        on_reject: new.on_reject,
        on_modify: new.on_modify,
        timeout: new.timeout.clone(),
        expires_at: new
            .timeout
            .as_ref()
            .map(|t| expiry(tx.now(), t.after_minutes)),
        escalation_depth: 0,
        parent_approval_id: None,
    };
    emit(
        tx,
        &mut head,
        &call.call_id,
        Some(call.turn),
        &new.actor,
        payload,
    )
    .await?;
    sessions::ensure_awaiting_approval(
        tx,
        &mut head,
        &session,
        format!("approval {} opened", new.id),
    )
    .await?;
    require(&mut tx.conn(), new.id).await
}

#[allow(
    clippy::too_many_arguments,
    reason = "one decision's fields; a struct would only rename them"
)]
async fn decide(
    tx: &mut Tx,
    head: &mut StreamHead,
    approval: &Approval,
    turn: Option<u32>,
    status: ApprovalStatus,
    decided_by: &str,
    comment: &str,
    effective_args: Option<Value>,
    resolution: Option<ReviewResolution>,
) -> Result<()> {
    let payload = ApprovalDecided {
        approval_id: approval.id,
        call_id: approval.call_id.clone(),
        status,
        approved: status == ApprovalStatus::Approved,
        decided_by: decided_by.to_owned(),
        comment: comment.to_owned(),
        on_reject: approval.on_reject,
        effective_args,
        resolution,
    };
    emit(tx, head, &approval.call_id, turn, "system", payload)
        .await
        .map(|_| ())
}

/// The resolution a vote on `approval` records: none for a policy approval; for an outcome
/// review the named one, and `fail` for a reject without one. An approve without a resolution
/// is refused, so a client that knows only approve and reject can never re-send a call whose
/// outcome is in doubt. (Public so that the engine's test store applies the same rule.)
///
/// # Errors
/// `FailedPrecondition`: an approve without resolution on a review; `InvalidArgument`: a
/// resolution on a policy approval or disagreeing with the vote, a result without `happened`,
/// edited arguments on a review.
pub fn vote_resolution(approval: &Approval, v: &Vote) -> Result<Option<ReviewResolution>> {
    use ReviewResolution as R;
    let review = approval.kind == ApprovalKind::OutcomeReview;
    let resolution = match (review, v.resolution) {
        (false, Some(r)) => {
            return Err(LedgerError::invalid(format!(
                "approval {} is a policy approval: the resolution {r:?} applies only to outcome \
                 reviews; approve or reject it",
                approval.id
            )));
        }
        (false, None) => None,
        (true, None) if v.decision == VoteDecision::Reject => Some(R::Fail),
        (true, None) => {
            return Err(LedgerError::precondition(format!(
                "approval {} is an outcome review: the runtime cannot tell whether tool call {} \
                 already took effect, so a plain approve is refused; resolve it with \
                 \"happened\" (record it succeeded), \"resend\" (send it to a worker again) or \
                 \"fail\" (record the outcome as unknown, not re-sent)",
                approval.id, approval.call_id
            )));
        }
        (true, Some(r)) if r.decision() != v.decision => {
            return Err(LedgerError::invalid(format!(
                "the resolution {r:?} is recorded as {}, not {}",
                r.decision(),
                v.decision
            )));
        }
        (true, Some(r)) => Some(r),
    };
    if v.result.is_some() && resolution != Some(R::Happened) {
        return Err(LedgerError::invalid(
            "a result can only accompany the \"happened\" resolution",
        ));
    }
    if review && v.edited_args.is_some() {
        return Err(LedgerError::invalid(
            "an outcome review cannot edit arguments: \"resend\" sends the recorded call",
        ));
    }
    Ok(resolution)
}

impl Vote {
    /// The rules a vote meets on its own, before it meets its approval: a voter, and edited
    /// arguments only on an approve, as a JSON object.
    ///
    /// # Errors
    /// `InvalidArgument`: `actor is required`, `edited args can only accompany an approve
    /// vote`, `edited args must be a JSON object, got <kind>`.
    pub fn check_shape(&self) -> Result<()> {
        if self.actor.actor.trim().is_empty() {
            return Err(LedgerError::invalid("actor is required"));
        }
        if self
            .actor
            .via
            .as_deref()
            .is_some_and(|v| v.trim().is_empty())
        {
            return Err(LedgerError::invalid("via must not be empty when given"));
        }
        if let Some(edited) = &self.edited_args {
            if self.decision == VoteDecision::Reject {
                return Err(LedgerError::invalid(
                    "edited args can only accompany an approve vote",
                ));
            }
            if !edited.is_object() {
                return Err(LedgerError::invalid(format!(
                    "edited args must be a JSON object, got {}",
                    json_kind(edited)
                )));
            }
        }
        Ok(())
    }

    /// Every rule of a vote on `approval` (the one rule book: the engine checks a vote with it
    /// before its own checks of edited arguments, and [`Ledger::cast_vote`] again on the
    /// locked approval): [`Vote::check_shape`], the approval still pending, the review
    /// resolution ([`vote_resolution`]), the comprehension acknowledgement, one vote per voter
    /// ([`same_voter`]), who may vote ([`Vote::check_voter`]: the route restriction,
    /// separation of duties, verified votes on verified sessions), and approve votes agreeing
    /// on the arguments. Returns the resolution the vote records.
    ///
    /// # Errors
    /// - `InvalidArgument`: the shape, a resolution that does not fit,
    ///   `comprehension acknowledgement is required`;
    /// - `FailedPrecondition`: `approval X is already <status>`, a plain approve on an outcome
    ///   review, `actor "x" already decided on this approval`, approve votes for other
    ///   arguments;
    /// - `PermissionDenied`: [`Vote::check_voter`]'s.
    pub fn check(&self, approval: &Approval) -> Result<Option<ReviewResolution>> {
        self.check_shape()?;
        require_pending(approval)?;
        let resolution = vote_resolution(approval, self)?;
        if approval.comprehension_required && !self.comprehension_acknowledged {
            return Err(LedgerError::invalid(
                "comprehension acknowledgement is required",
            ));
        }
        if let Some(earlier) = approval
            .votes
            .iter()
            .find(|x| same_voter(&x.decided_by, &self.actor.actor))
        {
            return Err(LedgerError::precondition(duplicate_vote_message(
                &self.actor.actor,
                &earlier.decided_by,
            )));
        }
        self.check_voter(approval)?;
        if self.decision == VoteDecision::Approve
            && approval.approvals_received > 0
            && let Some(edited) = &self.edited_args
            && edited != approval.args_to_dispatch()
        {
            return Err(LedgerError::precondition(format!(
                "approval {} already has approve votes for other arguments; approve those \
                 arguments or reject",
                approval.id
            )));
        }
        Ok(resolution)
    }
}

impl Vote {
    /// Who may vote on `approval` (part of [`Vote::check`], the one rule book):
    ///
    /// 1. **Route restriction.** When the voter's credential lists routes ([`Vote::routes`]
    ///    not empty), the approval's route (the policy's `phrony.com/approver_role`) must be
    ///    one of them; an approval with no route is then refused too.
    /// 2. **Separation of duties.** When the session was started by a verified principal and
    ///    the voter is verified (a relayed voter counts: the relay vouches for it), a voter with
    ///    the starter's name ([`same_voter`]: case-insensitive) is refused, unless the policy
    ///    opted out with `allow_self_approval: true` (recorded in `approval.required`). In
    ///    `local` mode both are unverified and the rule does not apply: the tutorial's one
    ///    person starts and approves.
    /// 3. **A verified session's quorum counts verified principals.** On an approval of a
    ///    session started by a verified principal, an unverified vote is refused: it neither
    ///    counts toward the quorum nor vetoes. Together with one vote per voter
    ///    ([`same_voter`]), `approvals_received` is then the number of distinct verified
    ///    principals who approved. An unverified vote counts as before only when the session
    ///    itself is unverified (`local` mode, or recorded before attribution existed).
    ///
    /// # Errors
    /// `PermissionDenied`, naming the voter, the approval and the rule.
    pub fn check_voter(&self, approval: &Approval) -> Result<()> {
        let voter = &self.actor;
        if !self.routes.is_empty() && !self.routes.iter().any(|r| r == &approval.route) {
            let route = if approval.route.is_empty() {
                "no route".to_owned()
            } else {
                format!("route {:?}", approval.route)
            };
            return Err(LedgerError::denied(format!(
                "{voter} may only vote on approvals routed to {}; approval {} has {route}",
                self.routes.join(", "),
                approval.id
            )));
        }
        let Some(starter) = approval
            .session_started_by
            .as_ref()
            .filter(|s| s.verification.is_verified())
        else {
            return Ok(());
        };
        if !voter.verification.is_verified() {
            return Err(LedgerError::denied(format!(
                "{voter} cannot vote on approval {}: session {} was started by a verified \
                 principal, so its quorum counts verified principals only",
                approval.id, approval.session_id
            )));
        }
        if !approval.allow_self_approval && same_voter(&starter.actor, &voter.actor) {
            return Err(LedgerError::denied(format!(
                "{voter} cannot vote on approval {}: {} started session {} (separation of \
                 duties; a policy may opt out with allow_self_approval: true)",
                approval.id, starter, approval.session_id
            )));
        }
        Ok(())
    }
}

/// How a JSON value's kind reads in a refusal (`an array`, `a string`, …).
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

async fn record_vote(tx: &mut Tx, id: Uuid, v: &Vote) -> Result<VoteOutcome> {
    let (mut head, approval) = lock_approval(tx, id).await?;
    let resolution = v.check(&approval)?;
    let decision = resolution.map_or(v.decision, ReviewResolution::decision);
    let turn = call_turn(tx, &approval.call_id).await?;
    let payload = ApprovalVoted {
        approval_id: approval.id,
        call_id: approval.call_id.clone(),
        decided_by: v.actor.actor.clone(),
        decision,
        comment: v.comment.clone(),
        comprehension_acknowledged: v.comprehension_acknowledged,
        edited_args: v.edited_args.clone(),
        resolution,
        result: v.result.clone(),
    };
    emit(tx, &mut head, &approval.call_id, turn, &v.actor, payload).await?;
    let after = require(&mut tx.conn(), id).await?;
    if let Some(resolution) = resolution {
        resolve_review(tx, &mut head, &after, turn, v, resolution).await?;
        return Ok(VoteOutcome {
            approval: require(&mut tx.conn(), id).await?,
            decided: true,
        });
    }
    let decided = match decision {
        VoteDecision::Reject => {
            decide(
                tx,
                &mut head,
                &after,
                turn,
                ApprovalStatus::Denied,
                &v.actor.actor,
                &v.comment,
                None,
                None,
            )
            .await?;
            true
        }
        VoteDecision::Approve if after.approvals_received >= after.approvals_required => {
            let args = after.args_to_dispatch().clone();
            decide(
                tx,
                &mut head,
                &after,
                turn,
                ApprovalStatus::Approved,
                &v.actor.actor,
                &v.comment,
                Some(args),
                None,
            )
            .await?;
            true
        }
        VoteDecision::Approve => false,
    };
    Ok(VoteOutcome {
        approval: require(&mut tx.conn(), id).await?,
        decided,
    })
}

/// Decides an outcome review (quorum 1) with `resolution`, and for `happened` and `fail`
/// records the call's outcome (`tool.completed`, attributed to the voter) in the same
/// transaction; `resend` returns the call to `pending` for the engine to dispatch.
async fn resolve_review(
    tx: &mut Tx,
    head: &mut StreamHead,
    approval: &Approval,
    turn: Option<u32>,
    v: &Vote,
    resolution: ReviewResolution,
) -> Result<()> {
    let (status, effective_args) = match resolution {
        ReviewResolution::Happened | ReviewResolution::Resend => {
            (ApprovalStatus::Approved, Some(approval.args.clone()))
        }
        ReviewResolution::Fail => (ApprovalStatus::Denied, None),
    };
    decide(
        tx,
        head,
        approval,
        turn,
        status,
        &v.actor.actor,
        &v.comment,
        effective_args,
        Some(resolution),
    )
    .await?;
    match resolution {
        ReviewResolution::Resend => Ok(()),
        ReviewResolution::Happened => {
            invocations::complete_by_review(
                tx,
                head,
                &approval.call_id,
                &v.actor,
                Ok(v.result.clone()),
            )
            .await
        }
        ReviewResolution::Fail => {
            invocations::complete_by_review(
                tx,
                head,
                &approval.call_id,
                &v.actor,
                Err(not_resent_message(&v.actor.actor, &v.comment)),
            )
            .await
        }
    }
}

async fn expire(tx: &mut Tx, id: Uuid, at: DateTime<Utc>) -> Result<TimeoutOutcome> {
    let (mut head, approval) = lock_approval(tx, id).await?;
    require_pending(&approval)?;
    let (Some(timeout), Some(expires_at)) = (approval.timeout.clone(), approval.expires_at) else {
        return Err(LedgerError::precondition(format!(
            "approval {id} has no timeout"
        )));
    };
    if expires_at > at {
        return Err(LedgerError::precondition(format!(
            "approval {id} does not expire until {}",
            format_ts(&expires_at)
        )));
    }
    let turn = call_turn(tx, &approval.call_id).await?;
    let mut escalated_to = None;
    match timeout.default {
        TimeoutDefault::Deny => {
            decide(
                tx,
                &mut head,
                &approval,
                turn,
                ApprovalStatus::Denied,
                TIMEOUT_ACTOR,
                "approval timed out",
                None,
                None,
            )
            .await?;
        }
        TimeoutDefault::Allow => {
            let args = approval.args_to_dispatch().clone();
            decide(
                tx,
                &mut head,
                &approval,
                turn,
                ApprovalStatus::Approved,
                TIMEOUT_ACTOR,
                "approval timed out; allowed by the timeout default",
                Some(args),
                None,
            )
            .await?;
        }
        TimeoutDefault::Escalate if approval.escalation_depth >= MAX_ESCALATION_DEPTH => {
            decide(
                tx,
                &mut head,
                &approval,
                turn,
                ApprovalStatus::Denied,
                TIMEOUT_ACTOR,
                "approval escalation depth exceeded",
                None,
                None,
            )
            .await?;
        }
        TimeoutDefault::Escalate => {
            let new_id = Uuid::new_v4();
            let escalated = ApprovalEscalated {
                approval_id: approval.id,
                call_id: approval.call_id.clone(),
                escalated_to: new_id,
                decided_by: TIMEOUT_ACTOR.to_owned(),
                comment: "approval timed out; escalated".to_owned(),
            };
            emit(tx, &mut head, &approval.call_id, turn, "system", escalated).await?;
            let minutes = timeout
                .escalate_after_minutes
                .unwrap_or(timeout.after_minutes);
            let payload = ApprovalRequired {
                approval_id: new_id,
                call_id: approval.call_id.clone(),
                kind: approval.kind,
                tool: approval.tool.clone(),
                version: approval.tool_version.clone(),
                args: approval.args.clone(),
                call_hash: approval.call_hash.clone(),
                agent_version_id: approval.agent_version_id,
                agent_ref: approval.agent.to_string(),
                policy_ref: approval.policy_ref.clone(),
                policy_runtime: approval.policy_runtime.clone(),
                reason: approval.reason.clone(),
                route: timeout
                    .escalate_to_route
                    .clone()
                    .unwrap_or_else(|| approval.route.clone()),
                authority_ref: approval.authority_ref.clone(),
                approvals_required: approval.approvals_required,
                allow_self_approval: approval.allow_self_approval,
                comprehension_required: approval.comprehension_required,
                on_reject: approval.on_reject,
                on_modify: approval.on_modify,
                timeout: Some(timeout.clone()),
                expires_at: Some(expiry(tx.now(), minutes)),
                escalation_depth: approval.escalation_depth.saturating_add(1),
                parent_approval_id: Some(approval.id),
            };
            emit(tx, &mut head, &approval.call_id, turn, "system", payload).await?;
            escalated_to = Some(require(&mut tx.conn(), new_id).await?);
        }
    }
    Ok(TimeoutOutcome {
        approval: require(&mut tx.conn(), id).await?,
        escalated_to,
    })
}

/// The pending approvals of session `$1`, oldest first. Read through the session's index
/// (`approvals_session`): the status is compared as `a.status || ''` so that no planner serves
/// the order from `approvals_status_created` by walking every pending approval of every
/// session and filtering by session (SQLite without statistics did: with 100,000 sessions
/// parked, each session's end read all 100,000 inside the group-commit writer).
/// The pending approvals of session `$1` (`approvals a`): [`pending_of_session_sql`] and the
/// probe of a session's end (`cascade::to_close`) share it. (`|| ''` keeps PostgreSQL on the
/// session index instead of the partial index of pending approvals, see
/// [`explain_pending_of_session`].)
pub(crate) const PENDING_OF_SESSION: &str = "a.session_id = $1 AND a.status || '' = 'pending'";

fn pending_of_session_sql() -> String {
    format!("{APPROVAL_SELECT} WHERE {PENDING_OF_SESSION} ORDER BY a.created_at, a.id")
}

/// The plan of [`pending_of_session_sql`] for `session_id` (SQLite: `EXPLAIN QUERY PLAN`;
/// PostgreSQL: `EXPLAIN`), one line per plan node.
pub(crate) async fn explain_pending_of_session(
    conn: &mut Conn<'_>,
    backend: crate::db::Backend,
    session_id: &str,
) -> Result<Vec<String>> {
    let (prefix, column) = match backend {
        crate::db::Backend::Postgres => ("EXPLAIN (COSTS OFF) ", "QUERY PLAN"),
        crate::db::Backend::Sqlite => ("EXPLAIN QUERY PLAN ", "detail"),
    };
    let sql = format!("{prefix}{}", pending_of_session_sql());
    conn.fetch_all("explain pending approvals", &sql, args![session_id])
        .await?
        .iter()
        .map(|row| row.text(column))
        .collect()
}

/// Root task sessions resting on people alone (see [`Ledger::sessions_resting_on_approvals`]).
/// Its correlations compare ids in "C" (the collation of `sessions.id` and
/// `tool_invocations.call_id`); on PostgreSQL migration 0022's `tool_invocations_session_c` and
/// `approvals_call_c` serve them (conformance `id_joins_are_served_by_indexes`).
pub(crate) const SESSIONS_RESTING_ON_APPROVALS: &str = "SELECT s.id AS id FROM sessions s \
     WHERE s.status = 'awaiting_approval' AND s.mode = 'task' \
     AND s.parent_session_id IS NULL \
     AND EXISTS (SELECT 1 FROM tool_invocations c \
       WHERE c.session_id = s.id AND c.status = 'awaiting_approval') \
     AND NOT EXISTS (SELECT 1 FROM tool_invocations c \
       WHERE c.session_id = s.id \
       AND c.status IN ('pending', 'queued', 'dispatched', 'indeterminate')) \
     AND NOT EXISTS (SELECT 1 FROM tool_invocations c \
       WHERE c.session_id = s.id AND c.status = 'awaiting_approval' \
       AND COALESCE((SELECT a.status FROM approvals a WHERE a.call_id = c.call_id \
         ORDER BY a.created_at DESC, a.id DESC LIMIT 1), '') <> 'pending')";

/// Decides every pending approval of a locked session `cancelled`.
pub(crate) async fn close_pending(
    tx: &mut Tx,
    head: &mut StreamHead,
    session_id: &str,
    comment: &str,
) -> Result<Vec<Uuid>> {
    let pending = many(
        &mut tx.conn(),
        "find pending approvals",
        &pending_of_session_sql(),
        args![session_id],
    )
    .await?;
    let mut ids = Vec::with_capacity(pending.len());
    for approval in pending {
        let turn = call_turn(tx, &approval.call_id).await?;
        decide(
            tx,
            head,
            &approval,
            turn,
            ApprovalStatus::Cancelled,
            "system",
            comment,
            None,
            None,
        )
        .await?;
        ids.push(approval.id);
    }
    Ok(ids)
}

/// Decides the pending approval of a call (there is at most one) `cancelled`.
pub(crate) async fn close_for_call(
    tx: &mut Tx,
    head: &mut StreamHead,
    call_id: &str,
    comment: &str,
) -> Result<Option<Uuid>> {
    let sql = format!("{APPROVAL_SELECT} WHERE a.call_id = $1 AND a.status = 'pending'");
    let pending = many(
        &mut tx.conn(),
        "find pending approval",
        &sql,
        args![call_id],
    )
    .await?;
    let Some(approval) = pending.into_iter().next() else {
        return Ok(None);
    };
    let turn = call_turn(tx, call_id).await?;
    decide(
        tx,
        head,
        &approval,
        turn,
        ApprovalStatus::Cancelled,
        "system",
        comment,
        None,
        None,
    )
    .await?;
    Ok(Some(approval.id))
}

// ---------------------------------------------------------------------------------------------
// Projection writes: a pure function of the event.

pub(crate) async fn apply(conn: &mut Conn<'_>, event: &Event, body: &EventBody) -> Result<()> {
    let ts = event.ts;
    match body {
        EventBody::ApprovalRequired(p) => apply_required(conn, event, p).await,
        EventBody::ApprovalVote(p) => apply_vote(conn, event, p).await,
        EventBody::ApprovalDecided(p) => apply_decided(conn, event, p).await,
        EventBody::ApprovalEscalated(p) => {
            let rows = conn
                .execute(
                    "project approval escalation",
                    "UPDATE approvals SET status = 'escalated', decided_by = $2, comment = $3, \
                     decided_at = $4 WHERE id = $1 AND status = 'pending'",
                    args![p.approval_id, p.decided_by.as_str(), p.comment.as_str(), ts],
                )
                .await?;
            expect_rows(rows, 1, event)
        }
        other => Err(LedgerError::corrupt(format!(
            "stream {} seq {}: {} is not an approval event",
            event.stream,
            event.seq,
            other.event_type()
        ))),
    }
}

/// `approval.required`: the approval row, and its call awaits it.
async fn apply_required(conn: &mut Conn<'_>, event: &Event, p: &ApprovalRequired) -> Result<()> {
    let ts = event.ts;
    let timeout = p.timeout.as_ref();
    let rows = conn
        .execute(
            "project approval",
            "INSERT INTO approvals (id, session_id, call_id, parent_approval_id, status, \
             route, reason, tool, tool_version, args, call_hash, agent_version_id, \
             agent_ref, policy_ref, policy_runtime, authority_ref, approvals_required, \
             approvals_received, comprehension_required, on_reject, on_modify, \
             timeout_default, escalation_depth, expires_at, created_at, timeout_minutes, \
             escalate_route, escalate_after_minutes, kind, allow_self_approval) \
             VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $8, $9, $10, $11, $12, $13, \
             $14, $15, $16, 0, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28)",
            vec![
                Arg::from(p.approval_id),
                Arg::from(event.stream.as_str()),
                Arg::from(p.call_id.as_str()),
                Arg::from(p.parent_approval_id),
                Arg::from(p.route.as_str()),
                Arg::from(p.reason.as_str()),
                Arg::from(p.tool.as_str()),
                Arg::from(p.version.as_str()),
                Arg::Json(p.args.clone()),
                Arg::from(p.call_hash.as_str()),
                Arg::from(p.agent_version_id),
                Arg::from(p.agent_ref.as_str()),
                Arg::from(p.policy_ref.clone()),
                Arg::Json(Value::Object(p.policy_runtime.clone())),
                Arg::from(p.authority_ref.as_str()),
                Arg::from(i64::from(p.approvals_required)),
                Arg::from(p.comprehension_required),
                Arg::from(p.on_reject.as_str()),
                Arg::from(p.on_modify.as_str()),
                Arg::from(timeout.map(|t| t.default.as_str())),
                Arg::from(i64::from(p.escalation_depth)),
                Arg::from(p.expires_at),
                Arg::from(ts),
                Arg::from(timeout.map(|t| i64::from(t.after_minutes))),
                Arg::from(timeout.and_then(|t| t.escalate_to_route.clone())),
                Arg::from(timeout.and_then(|t| t.escalate_after_minutes.map(i64::from))),
                Arg::from(p.kind.as_str()),
                Arg::from(p.allow_self_approval),
            ],
        )
        .await?;
    expect_rows(rows, 1, event)?;
    let rows = conn
        .execute(
            "project call awaiting approval",
            "UPDATE tool_invocations SET status = 'awaiting_approval', updated_at = $2 \
             WHERE call_id = $1",
            args![p.call_id.as_str(), ts],
        )
        .await?;
    expect_rows(rows, 1, event)
}

/// `approval.vote`: the vote row, and an approve vote counts.
async fn apply_vote(conn: &mut Conn<'_>, event: &Event, p: &ApprovalVoted) -> Result<()> {
    let ts = event.ts;
    conn.execute(
        "project vote",
        "INSERT INTO approval_votes (approval_id, decided_by, decision, comment, \
         comprehension_acknowledged, edited_args, created_at, verification, via) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        vec![
            Arg::from(p.approval_id),
            Arg::from(p.decided_by.as_str()),
            Arg::from(p.decision.as_str()),
            Arg::from(p.comment.as_str()),
            Arg::from(p.comprehension_acknowledged),
            Arg::OptJson(p.edited_args.clone()),
            Arg::from(ts),
            // The voter's attribution is the vote event's (one source of truth for the
            // re-fold).
            Arg::from(event.actor_verification.map(Verification::as_str)),
            Arg::from(event.actor_via.clone()),
        ],
    )
    .await?;
    if p.decision == VoteDecision::Approve {
        let rows = conn
            .execute(
                "project approve vote",
                "UPDATE approvals SET approvals_received = approvals_received + 1, \
                 effective_args = COALESCE(effective_args, $2) WHERE id = $1",
                vec![
                    Arg::from(p.approval_id),
                    Arg::OptJson(p.edited_args.clone()),
                ],
            )
            .await?;
        expect_rows(rows, 1, event)?;
    }
    Ok(())
}

/// `approval.decided`: the decision, and the call it releases, fails or cancels.
async fn apply_decided(conn: &mut Conn<'_>, event: &Event, p: &ApprovalDecided) -> Result<()> {
    let ts = event.ts;
    let rows = conn
        .execute(
            "project approval decision",
            "UPDATE approvals SET status = $2, decided_by = $3, comment = $4, \
             decided_at = $5, effective_args = COALESCE($6, effective_args), \
             resolution = $7 WHERE id = $1 AND status = 'pending'",
            vec![
                Arg::from(p.approval_id),
                Arg::from(p.status.as_str()),
                Arg::from(p.decided_by.as_str()),
                Arg::from(p.comment.as_str()),
                Arg::from(ts),
                Arg::OptJson(p.effective_args.clone()),
                Arg::from(p.resolution.map(|r| r.as_str())),
            ],
        )
        .await?;
    expect_rows(rows, 1, event)?;
    if matches!(
        p.resolution,
        Some(ReviewResolution::Happened | ReviewResolution::Fail)
    ) {
        // The call's outcome is the `tool.completed` event that follows.
        return Ok(());
    }
    let message = if p.comment.is_empty() {
        "tool call denied".to_owned()
    } else {
        p.comment.clone()
    };
    // The call waits for this approval unless its outcome arrived first.
    let (sql, a) = match p.status {
        ApprovalStatus::Approved => (
            "UPDATE tool_invocations SET status = 'pending', args = $2, updated_at = $3 \
             WHERE call_id = $1 AND status = 'awaiting_approval'",
            vec![
                Arg::from(p.call_id.as_str()),
                Arg::Json(p.effective_args.clone().unwrap_or(Value::Null)),
                Arg::from(ts),
            ],
        ),
        ApprovalStatus::Denied => (
            "UPDATE tool_invocations SET status = 'failed', error_code = $2, \
             error_message = $3, completed_at = $4, updated_at = $4 \
             WHERE call_id = $1 AND status = 'awaiting_approval'",
            args![
                p.call_id.as_str(),
                error_codes::APPROVAL_DENIED,
                message,
                ts
            ],
        ),
        ApprovalStatus::Cancelled => (
            "UPDATE tool_invocations SET status = 'cancelled', error_code = $2, \
             error_message = $3, completed_at = $4, updated_at = $4 \
             WHERE call_id = $1 AND status = 'awaiting_approval'",
            args![p.call_id.as_str(), error_codes::CANCELLED, message, ts],
        ),
        other => {
            return Err(LedgerError::corrupt(format!(
                "stream {} seq {}: approval.decided with status {other}",
                event.stream, event.seq
            )));
        }
    };
    if p.status == ApprovalStatus::Approved && p.effective_args.is_none() {
        return Err(LedgerError::corrupt(format!(
            "stream {} seq {}: approval.decided approved without effective_args",
            event.stream, event.seq
        )));
    }
    conn.execute("project approval outcome on call", sql, a)
        .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Public API.

impl NewApproval {
    fn validate(&self) -> Result<()> {
        if self.approvals_required < 1 {
            return Err(LedgerError::invalid(
                "approvals_required must be at least 1",
            ));
        }
        if self.actor.actor.trim().is_empty() {
            return Err(LedgerError::invalid("actor is required"));
        }
        if self
            .policy_ref
            .as_deref()
            .is_some_and(|p| p.trim().is_empty())
        {
            return Err(LedgerError::invalid(
                "policy_ref must not be empty when given",
            ));
        }
        if self.kind == ApprovalKind::OutcomeReview
            && (self.approvals_required != 1 || self.timeout.is_some())
        {
            return Err(LedgerError::invalid(
                "an outcome review takes exactly one decision and has no timeout",
            ));
        }
        if let Some(t) = &self.timeout {
            if t.after_minutes < 1 {
                return Err(LedgerError::invalid(
                    "timeout after_minutes must be at least 1",
                ));
            }
            if t.escalate_after_minutes == Some(0) {
                return Err(LedgerError::invalid(
                    "timeout escalate_after_minutes must be at least 1",
                ));
            }
        }
        Ok(())
    }
}

impl Ledger {
    /// Opens an approval for a recorded tool call (`approval.required`): the call goes to
    /// `awaiting_approval` and the session to `awaiting_approval` (with its own
    /// `session.status_changed` event) in the same transaction. The expiry is the open time
    /// plus the timeout's minutes; it is stored, so timers survive restarts (see
    /// [`Ledger::due_approvals`]).
    ///
    /// # Errors
    /// - `NotFound`: session or tool call;
    /// - `FailedPrecondition`: a session that cannot wait (terminal, `awaiting_input`), a call
    ///   that is not `pending`, `queued` or `indeterminate` (e.g. already awaiting approval);
    /// - `AlreadyExists`: the id exists; `InvalidArgument`: quorum 0, empty actor, bad timeout,
    ///   a call of another session.
    pub async fn open_approval(&self, new: NewApproval) -> Result<Approval> {
        new.validate()?;
        write_tx!(self, |tx| open(&mut tx, &new))
    }

    /// Records one approver's vote (§3.4) and decides the approval when it can. On an outcome
    /// review the vote must name a [`ReviewResolution`] (a reject without one is `fail`; an
    /// approve without one is refused, see [`vote_resolution`]) and decides it at once: `happened`
    /// records the call `succeeded` (with the vote's result) and `fail` records it `failed`
    /// (`outcome_unknown`), both attributed to the voter in the same transaction; `resend`
    /// returns it to `pending`. On a policy approval: any reject
    /// denies it (a veto); approve votes from distinct actors reaching the quorum approve it
    /// with the fixed arguments. Each step is an event (`approval.vote`, then
    /// `approval.decided`); deciding moves the call to `pending` (approved, with the effective
    /// arguments) or `failed` (denied). Resuming the session is the engine's job.
    ///
    /// # Errors
    /// - `NotFound`: `approval X not found`;
    /// - `FailedPrecondition`: `approval X is already <status>`,
    ///   `actor "x" already decided on this approval`, approve votes for other arguments;
    /// - `InvalidArgument`: `comprehension acknowledgement is required`, an empty actor, edited
    ///   arguments on a reject or not a JSON object.
    ///
    /// Every rule is [`Vote::check`], applied to the locked approval.
    pub async fn cast_vote(&self, approval_id: Uuid, vote: Vote) -> Result<VoteOutcome> {
        vote.check_shape()?;
        write_tx!(self, unfenced, |tx| record_vote(
            &mut tx,
            approval_id,
            &vote
        ))
    }

    /// Applies an expired approval's timeout default as of `now`: `deny` denies it
    /// (`system:timeout`, `approval timed out`); `allow` approves it whatever the quorum;
    /// `escalate` marks it `escalated` and opens a new pending approval for the same call
    /// (route `escalate_to_route` or the same, expiry `escalate_after_minutes` or
    /// `after_minutes`, depth + 1, votes start afresh), or denies it with
    /// `approval escalation depth exceeded` at depth [`MAX_ESCALATION_DEPTH`].
    ///
    /// # Errors
    /// `NotFound`; `FailedPrecondition`: `approval X is already <status>`,
    /// `approval X has no timeout`, `approval X does not expire until <time>`.
    pub async fn expire_approval(
        &self,
        approval_id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<TimeoutOutcome> {
        write_tx!(self, unfenced, |tx| expire(&mut tx, approval_id, now))
    }

    /// One approval with its votes.
    ///
    /// # Errors
    /// `NotFound`: `approval X not found`.
    pub async fn get_approval(&self, approval_id: Uuid) -> Result<Approval> {
        let mut conn = self.pool.acquire().await?;
        require(&mut conn.conn(), approval_id).await
    }

    /// Approvals matching `filter` (with votes), newest first, one stable page at a time.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or foreign page token or an invalid agent.
    pub async fn list_approvals(
        &self,
        filter: &ApprovalFilter,
        page: &PageRequest,
    ) -> Result<Page<Approval>> {
        let mut conn = self.pool.acquire().await?;
        list(&mut conn.conn(), filter, page).await
    }

    /// Pending approvals whose expiry is at or before `now`, soonest first (at most `limit`,
    /// 1..=1000): the durable timer's work list.
    ///
    /// # Errors
    /// Database errors.
    pub async fn due_approvals(&self, now: DateTime<Utc>, limit: u32) -> Result<Vec<Approval>> {
        let mut conn = self.pool.acquire().await?;
        let sql = format!(
            "{APPROVAL_SELECT} WHERE a.status = 'pending' AND a.expires_at IS NOT NULL \
             AND a.expires_at <= $1 ORDER BY a.expires_at, a.id LIMIT $2"
        );
        many(
            &mut conn.conn(),
            "list due approvals",
            &sql,
            args![now, i64::from(limit.clamp(1, 1000))],
        )
        .await
    }

    /// Sessions `awaiting_approval` with an approval decided (approved, denied, expired,
    /// cancelled or escalated) at or after `since` — by this process or another one on the same
    /// database. The engine resumes those whose driver it unloaded while they waited (live
    /// sessions act on their own). Reads the partial index `approvals_decided` (migration 0010):
    /// the cost follows the decisions since `since`, not the sessions still waiting. At most
    /// `limit` (1..=10,000), any order.
    ///
    /// # Errors
    /// Database errors.
    pub async fn sessions_with_waits_decided_since(
        &self,
        since: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<String>> {
        let mut conn = self.pool.acquire().await?;
        let rows = conn
            .conn()
            .fetch_all(
                "list sessions whose approval wait was decided",
                // Driven from the approvals (the decided ones are few), the session's status
                // checked per row by its key: a join would let the planner scan every waiting
                // session instead.
                "SELECT DISTINCT a.session_id AS session_id FROM approvals a \
                 WHERE a.decided_at IS NOT NULL AND a.decided_at >= $1 \
                 AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = a.session_id \
                 AND s.status = 'awaiting_approval') LIMIT $2",
                args![since, i64::from(limit.clamp(1, 10_000))],
            )
            .await?;
        rows.iter().map(|r| r.text("session_id")).collect()
    }

    /// Root task sessions in `awaiting_approval` that rest on people alone: at least one open
    /// call, every open call `awaiting_approval`, and each of those calls' latest approval
    /// (in the order approvals were opened) still `pending`. One query for all of them, so a
    /// restart with many sessions waiting for people does not read each one; the engine
    /// leaves these unloaded (parked) and checks the rest of what parking needs (the
    /// session's limits) on the rows it already has.
    ///
    /// # Errors
    /// Database errors.
    pub async fn sessions_resting_on_approvals(&self) -> Result<HashSet<String>> {
        let mut conn = self.pool.acquire().await?;
        let rows = conn
            .conn()
            .fetch_all(
                "list sessions resting on pending approvals",
                SESSIONS_RESTING_ON_APPROVALS,
                vec![],
            )
            .await?;
        rows.iter().map(|r| r.text("id")).collect()
    }

    /// The earliest expiry among pending approvals, to arm the timer.
    ///
    /// # Errors
    /// Database errors.
    pub async fn next_approval_expiry(&self) -> Result<Option<DateTime<Utc>>> {
        let mut conn = self.pool.acquire().await?;
        conn.conn()
            .fetch_optional(
                "read next approval expiry",
                "SELECT expires_at FROM approvals WHERE status = 'pending' \
                 AND expires_at IS NOT NULL ORDER BY expires_at LIMIT 1",
                vec![],
            )
            .await?
            .map(|r| r.ts("expires_at"))
            .transpose()
    }
}
