//! The ledger's value vocabulary: the statuses, kinds and small records that the projections,
//! the event schema ([`crate::event_body`]) and the public API share. A leaf module: it imports
//! nothing else of the crate but the `str_enum!` helper and the error type.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::names::str_enum;

// ---------------------------------------------------------------------------------------------
// From sessions.

str_enum! {
    /// A session's status (§5.2). `completed`, `failed` and `cancelled` are terminal.
    pub enum SessionStatus ("session status") {
        /// Legacy: created but not started (new sessions start `running`).
        Pending => "pending",
        /// A turn is executing.
        Running => "running",
        /// Parked between turns (conversation mode), or input blocked by a limit.
        AwaitingInput => "awaiting_input",
        /// Waiting for tool results.
        AwaitingTool => "awaiting_tool",
        /// Waiting for a human decision.
        AwaitingApproval => "awaiting_approval",
        /// Finished with an output.
        Completed => "completed",
        /// Ended with an error.
        Failed => "failed",
        /// Cancelled by a user or with its parent.
        Cancelled => "cancelled",
    }
}

impl SessionStatus {
    /// `completed`, `failed` or `cancelled`.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// Whether the ledger accepts a change from `self` to `to`:
    ///
    /// | from | to |
    /// |---|---|
    /// | `pending` | `running`, any terminal |
    /// | `running` | `awaiting_input`, `awaiting_tool`, `awaiting_approval`, any terminal |
    /// | `awaiting_tool` | `running`, `awaiting_approval`, `awaiting_input` (a limit halted the turn), any terminal |
    /// | `awaiting_approval` | `running`, `awaiting_tool`, `awaiting_input` (a limit halted the turn), any terminal |
    /// | `awaiting_input` | `running`, any terminal |
    /// | terminal | nothing |
    ///
    /// A status never changes to itself, and nothing changes back to `pending`.
    #[must_use]
    pub fn can_change_to(self, to: Self) -> bool {
        use SessionStatus as S;
        if self.is_terminal() || self == to || to == S::Pending {
            return false;
        }
        if to.is_terminal() {
            return true;
        }
        match self {
            S::Pending => to == S::Running,
            S::Running => matches!(to, S::AwaitingInput | S::AwaitingTool | S::AwaitingApproval),
            S::AwaitingTool => matches!(to, S::Running | S::AwaitingApproval | S::AwaitingInput),
            S::AwaitingApproval => matches!(to, S::Running | S::AwaitingTool | S::AwaitingInput),
            S::AwaitingInput => to == S::Running,
            S::Completed | S::Failed | S::Cancelled => false,
        }
    }
}

str_enum! {
    /// How a session ends its turns.
    #[derive(Default)]
    pub enum SessionMode ("session mode") {
        /// The session completes when its (first) turn ends; the output is the last assistant
        /// message. The default.
        #[default]
        Task => "task",
        /// The session parks at `awaiting_input` after each turn.
        Conversation => "conversation",
    }
}

str_enum! {
    /// What a limit hit does (`spec.limits.on_limit`).
    #[derive(Default)]
    pub enum OnLimit ("on_limit") {
        /// Stop the turn and block further input.
        #[default]
        Halt => "halt",
        /// Route to an approval (`limit:escalate` policies).
        Escalate => "escalate",
    }
}

str_enum! {
    /// What the engine does with a final answer that fails the agent's output check
    /// (`output.on_invalid`, and the action an `output.invalid` event records).
    pub enum OutputAction ("on_invalid") {
        /// Ask the model again, naming the errors (bounded attempts).
        Retry => "retry",
        /// Ask the model once to correct its answer.
        Repair => "repair",
        /// Ask a human to accept or reject the answer.
        Escalate => "escalate",
        /// Fail the session.
        Fail => "fail",
    }
}

/// The limits in force when a session started (`spec.limits`, §1.15), kept with the session so
/// that recovery enforces the same budget.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionLimits {
    /// Token budget of the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_per_run: Option<u64>,
    /// Completions per turn and turns per session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_loop_iterations: Option<u64>,
    /// Wall-clock budget, approval waits excluded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall_clock_seconds: Option<u64>,
    /// Cumulative approval wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hitl_wait_minutes: Option<u64>,
    /// Delegation nesting cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_subagent_depth: Option<u64>,
    /// What a limit hit does.
    #[serde(default)]
    pub on_limit: OnLimit,
}

// ---------------------------------------------------------------------------------------------
// From invocations.

str_enum! {
    /// A tool call's ledger status (the reference's names plus `cancelled`):
    ///
    /// ```text
    /// pending ─▶ queued ─▶ dispatched ─▶ succeeded | failed
    ///    │         │  ▲        │ └──────▶ indeterminate ─▶ queued (re-dispatch) | failed | awaiting_approval
    ///    │         │  └────────┘ (re-dispatch after a lost lease)
    ///    ├─────────┴─▶ awaiting_approval ─▶ pending (approved, args = effective args) | failed (denied)
    ///    ├─────────┴─▶ failed (policy denied, no handler, invalid args, …)
    ///    └─ any open status ─▶ cancelled (session ended, or the runtime gave up)
    /// ```
    pub enum CallStatus ("tool call status") {
        /// Requested by the model; policy not yet applied.
        Pending => "pending",
        /// Allowed; waiting for a free handler.
        Queued => "queued",
        /// Sent to a worker.
        Dispatched => "dispatched",
        /// The worker returned a result.
        Succeeded => "succeeded",
        /// The worker returned an error, or the runtime or a policy or an approver refused it.
        Failed => "failed",
        /// The worker was lost while the call was in flight; the outcome is unknown.
        Indeterminate => "indeterminate",
        /// Waiting for a human decision.
        AwaitingApproval => "awaiting_approval",
        /// Abandoned: its session ended, or the runtime gave up on it.
        Cancelled => "cancelled",
    }
}

impl CallStatus {
    /// `succeeded`, `failed` or `cancelled`: the row no longer changes.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

str_enum! {
    /// A tool binding's `side_effect_class` (§4.7).
    pub enum SideEffectClass ("side_effect_class") {
        /// No side effects.
        ReadOnly => "read_only",
        /// Repeating the call has no further effect.
        IdempotentWrite => "idempotent_write",
        /// Repeating the call repeats its effect.
        NonIdempotentWrite => "non_idempotent_write",
        /// The effect cannot be undone.
        IrreversibleAction => "irreversible_action",
    }
}

impl SideEffectClass {
    /// Whether a call whose outcome is unknown may be sent again with the same call id
    /// (`read_only`, `idempotent_write`); the others need a human (§4.7).
    #[must_use]
    pub fn safe_to_redispatch(self) -> bool {
        matches!(self, Self::ReadOnly | Self::IdempotentWrite)
    }
}

/// Error codes the ledger itself records on failed and cancelled calls.
pub mod error_codes {
    /// A policy denied the call at dispatch time.
    pub const POLICY_DENIED: &str = "policy_denied";
    /// An approver (or an approval timeout) rejected the call.
    pub const APPROVAL_DENIED: &str = "approval_denied";
    /// The call was cancelled.
    pub const CANCELLED: &str = "cancelled";
    /// The worker was lost while the call was in flight.
    pub const INDETERMINATE: &str = "indeterminate";
    /// An operator resolved an outcome review with `fail`: the call may have taken effect and
    /// was not sent again. A worker result that arrives later is still recorded.
    pub const OUTCOME_UNKNOWN: &str = "outcome_unknown";
    /// The session ended while the call was with a worker (it may have taken effect); a
    /// worker result that arrives later is still recorded as what happened.
    pub const CANCELLED_AFTER_DISPATCH: &str = "cancelled_after_dispatch";
}

/// Token usage (of a turn, or of a delegated child session charged to a tool call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Counted heuristically rather than reported by the provider.
    #[serde(default)]
    pub estimated: bool,
}

// ---------------------------------------------------------------------------------------------
// From approvals.

str_enum! {
    /// An approval's status.
    pub enum ApprovalStatus ("approval status") {
        /// Waiting for votes.
        Pending => "pending",
        /// The quorum approved (or the timeout default allowed it).
        Approved => "approved",
        /// An approver rejected it (a veto), or the timeout default denied it.
        Denied => "denied",
        /// The timeout escalated it to a new approval (`parent_approval_id` of the new one).
        Escalated => "escalated",
        /// Closed without a decision: its session ended, or the call's outcome became known.
        Cancelled => "cancelled",
    }
}

str_enum! {
    /// One approver's decision.
    pub enum VoteDecision ("vote decision") {
        /// Approve (stored as `approved`).
        Approve => "approved",
        /// Reject (stored as `denied`); a single reject decides the approval.
        Reject => "denied",
    }
}

str_enum! {
    /// What an approval asks.
    #[derive(Default)]
    pub enum ApprovalKind ("approval kind") {
        /// A policy requires a human before the call runs (approve runs it).
        #[default]
        Policy => "policy",
        /// The call was sent to a worker and its outcome is unknown: did it happen? Resolved
        /// with a [`ReviewResolution`]; quorum 1, no timeout.
        OutcomeReview => "outcome_review",
    }
}

impl ApprovalKind {
    /// `true` for [`ApprovalKind::Policy`] (serde's `skip_serializing_if`: a policy approval's
    /// event is byte-identical to the ones written before kinds existed).
    #[must_use]
    pub fn is_policy(&self) -> bool {
        *self == Self::Policy
    }
}

str_enum! {
    /// How an outcome review was resolved.
    pub enum ReviewResolution ("review resolution") {
        /// The operator confirms the call took effect: it is recorded `succeeded` with the
        /// result the operator supplies (or none), attributed to the operator.
        Happened => "happened",
        /// The operator confirms it did not happen: the call is sent to a worker again. The
        /// only way a review re-sends a call.
        Resend => "resend",
        /// Not re-sent, outcome unknown: the call is recorded `failed` with code
        /// `outcome_unknown` (it may have taken effect).
        Fail => "fail",
    }
}

impl ReviewResolution {
    /// The vote decision a resolution is recorded as (`happened`/`resend` approve, `fail`
    /// rejects).
    #[must_use]
    pub fn decision(self) -> VoteDecision {
        match self {
            Self::Happened | Self::Resend => VoteDecision::Approve,
            Self::Fail => VoteDecision::Reject,
        }
    }
}

/// The message of a review resolved `fail`: `outcome unknown, not re-sent by <actor>`.
#[must_use]
pub fn not_resent_message(actor: &str, comment: &str) -> String {
    let base = format!("outcome unknown, not re-sent by {actor} (the call may have taken effect)");
    if comment.trim().is_empty() {
        base
    } else {
        format!("{base}: {comment}")
    }
}

str_enum! {
    /// What a rejection does (`decision.on_reject`).
    #[derive(Default)]
    pub enum OnReject ("on_reject") {
        /// The model receives the rejection as the tool outcome and the turn continues.
        #[default]
        ReturnToAgent => "return_to_agent",
        /// The session fails.
        Fail => "fail",
    }
}

str_enum! {
    /// What happens to arguments edited by an approver (`decision.on_modify`).
    #[derive(Default)]
    pub enum OnModify ("on_modify") {
        /// Dispatched without a policy check (no `on_modify`).
        #[default]
        Unchecked => "unchecked",
        /// Evaluated against the policies again before dispatch.
        Revalidate => "revalidate",
    }
}

str_enum! {
    /// What an approval's timeout decides (`decision.timeout.default`).
    pub enum TimeoutDefault ("timeout default") {
        /// Deny (`system:timeout`, `approval timed out`).
        Deny => "deny",
        /// Approve, whatever the quorum.
        Allow => "allow",
        /// Open a new approval one level up.
        Escalate => "escalate",
    }
}

/// An approval's timeout (`decision.timeout` plus the escalation keys of `decision.runtime`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalTimeout {
    /// Minutes after opening at which the approval expires (at least 1).
    pub after_minutes: u32,
    /// What expiry decides.
    pub default: TimeoutDefault,
    /// Route of the escalated approval (`phrony.com/escalate_to_role`); the same route if
    /// `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_to_route: Option<String>,
    /// Expiry of the escalated approval (`phrony.com/escalate_after_minutes`);
    /// `after_minutes` if `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_after_minutes: Option<u32>,
}

// ---------------------------------------------------------------------------------------------
// From shadow decisions.

str_enum! {
    /// A policy decision's kind, as a shadow decision records it (`policy.shadow`).
    pub enum PolicyVerdict ("policy decision") {
        /// The call runs.
        Allow => "allow",
        /// The call is denied.
        Deny => "deny",
        /// The call waits for a human.
        RequireApproval => "require_approval",
    }
}

/// The `decided_by` of decisions made by a timeout (`approvals::TIMEOUT_ACTOR`).
pub const TIMEOUT_ACTOR: &str = "system:timeout";
