//! [`Engine::vote`]: an approver's vote from its target to the session status it led to, the
//! one path every surface (the `DecideApproval` RPC, the interactive stream) votes through.
//!
//! 1. The target is found: an approval by id, or an approval of one session (the named one,
//!    which must be the session's, or its only pending one).
//! 2. The vote is checked once, by the ledger's rule book ([`Vote::check`]: shape, pending,
//!    outcome-review resolution, comprehension, one vote per voter, …), then, for an approve
//!    that edits the arguments, by the engine's own checks (input schema, deny policies, no
//!    edits on a limit escalation).
//! 3. It is recorded (the ledger applies [`Vote::check`] again on the locked approval, so a
//!    concurrent vote cannot slip past it).
//! 4. The answer carries the approval as decided and the session's status: when the vote
//!    decided the approval of a session live here, the status the driver moved the session to
//!    when it took the decision (the driver acknowledges every decision it takes); a *parked*
//!    session (no driver in memory) is resumed by the deciding vote and answers the same way;
//!    otherwise the stored status. Nothing polls.

use phrony_ledger::{Approval, ApprovalStatus, SessionStatus, Vote, VoteDecision, VoteOutcome};
use phrony_manifest::CompiledAgent;
use serde_json::Value;
use uuid::Uuid;

use crate::calls::{CallScope, EditRefusal, LIMIT_TOOL};
use crate::engine::Engine;
use crate::error::EngineError;

/// How long a deciding vote waits for the live driver's acknowledgement. The driver answers
/// as soon as it takes the decision; the bound only keeps an answer from hanging on a driver
/// that is busy elsewhere (past it, the stored session status answers).
const DECISION_ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The approval a vote is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoteTarget {
    /// An approval by id (`DecideApproval`).
    Approval(Uuid),
    /// An approval of one session (the interactive stream): the named one, which must belong
    /// to the session, or with `None` the session's only pending approval.
    InSession {
        /// The session.
        session_id: String,
        /// The approval, if the voter named one.
        approval_id: Option<Uuid>,
    },
}

/// What [`Engine::vote`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct VoteAnswer {
    /// The approval after the vote (status `pending` until the quorum or a veto).
    pub approval: Approval,
    /// Whether this vote decided it.
    pub decided: bool,
    /// The session's status the vote led to: `awaiting_approval` while this or another
    /// approval still holds it, else the status its driver resumed it in (`awaiting_tool`,
    /// `running`, …, or where it went since).
    pub session_status: SessionStatus,
}

impl Engine {
    /// Records an approver's vote on `target` and answers with the approval and the session
    /// status it led to (see the module docs). When the vote decides the approval (quorum
    /// reached, or a reject), the waiting session resumes: it dispatches the (possibly edited)
    /// call, or hands the rejection to the model, or fails (`on_reject: fail`).
    ///
    /// An approve vote that edits the arguments is checked whatever the policy's
    /// `on_modify`: the edit must match the tool's input schema and pass every deny policy
    /// (and allow-list) of the session's agent version. A refused vote records nothing.
    ///
    /// # Errors
    /// - `NotFound`: `approval X not found`, an unknown session;
    /// - `InvalidArgument`: [`Vote::check`]'s (`actor is required`, `edited args can only
    ///   accompany an approve vote`, `edited args must be a JSON object, got …`,
    ///   `comprehension acknowledgement is required`, a resolution that does not fit, edited
    ///   arguments on an outcome review), `the edited arguments do not match the input schema
    ///   of <tool>: …`, edited arguments on a limit escalation, an approval of another session;
    /// - `FailedPrecondition`: [`Vote::check`]'s (`approval X is already <status>`, a plain
    ///   approve on an outcome review, `actor "x" already decided on this approval`, approve
    ///   votes for other arguments), `the edited arguments are denied by policy <ref>: …`, a
    ///   session with no pending approval or several.
    pub async fn vote(&self, target: VoteTarget, vote: Vote) -> Result<VoteAnswer, EngineError> {
        let approval = self.vote_target(target).await?;
        vote.check(&approval)
            .map_err(crate::error::StoreError::from)?;
        if vote.decision == VoteDecision::Approve
            && let Some(edited) = &vote.edited_args
        {
            self.check_edited_vote(&approval, edited).await?;
        }
        let session_id = approval.session_id.clone();
        // Expected before the vote is recorded, so no driver can take the decision unseen:
        // the live one, or the next one if the session is parked or parking right now.
        let taken = self.inner.expect_decision(&session_id, approval.id);
        let VoteOutcome { approval, decided } =
            match self.inner.store.cast_vote(approval.id, vote).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    drop(taken);
                    self.inner
                        .withdraw_expectations(&session_id, approval.id, false);
                    return Err(e.into());
                }
            };
        // Driven by another replica (or nobody): it re-reads now.
        crate::lease::announce(&self.inner, &session_id);
        // Looked up after the vote is recorded: a driver unloading before that point hands the
        // expectation to the next driver and re-checks the approvals after unloading (it then
        // sees this vote and resumes); one that unloaded before finds nobody live here.
        let driven = match self.inner.live(&session_id) {
            Some(live) => {
                live.bump_approvals();
                live.notify_changed();
                true
            }
            // A parked session is resumed by the decision; the resumed driver takes it (and
            // answers this vote) like a live one. The vote is recorded whatever happens now:
            // a failed resume is not this vote's error (the unpark sweep tries again; a
            // session it failed reads as failed below).
            None if decided => self.unpark(&session_id).await.unwrap_or_else(|e| {
                tracing::warn!(%session_id, error = %e, "the decided session could not be resumed");
                false
            }),
            None => false,
        };
        let acknowledged = if decided {
            if !driven {
                // Nothing resumed (suspended, ended): nobody will answer an expectation
                // still waiting.
                self.inner
                    .withdraw_expectations(&session_id, approval.id, true);
            }
            tokio::time::timeout(DECISION_ACK_WAIT, taken)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            drop(taken);
            self.inner
                .withdraw_expectations(&session_id, approval.id, false);
            None
        };
        let session_status = match acknowledged {
            Some(status) => status,
            // Not decided yet, not live here, or the driver stopped before taking it: the
            // stored status is what the vote led to.
            None => self.inner.store.get_session(&session_id).await?.status,
        };
        Ok(VoteAnswer {
            approval,
            decided,
            session_status,
        })
    }

    /// The approval a vote is for.
    async fn vote_target(&self, target: VoteTarget) -> Result<Approval, EngineError> {
        let store = &self.inner.store;
        match target {
            VoteTarget::Approval(id) => Ok(store.get_approval(id).await?),
            VoteTarget::InSession {
                session_id,
                approval_id: Some(id),
            } => {
                let approval = store.get_approval(id).await?;
                if approval.session_id == session_id {
                    Ok(approval)
                } else {
                    Err(EngineError::invalid(format!(
                        "approval {id} belongs to another session, not {session_id}"
                    )))
                }
            }
            VoteTarget::InSession {
                session_id,
                approval_id: None,
            } => {
                let mut pending: Vec<Approval> = store
                    .session_approvals(&session_id)
                    .await?
                    .into_iter()
                    .filter(|a| a.status == ApprovalStatus::Pending)
                    .collect();
                match pending.len() {
                    1 => Ok(pending.remove(0)),
                    0 => Err(EngineError::precondition(format!(
                        "session {session_id} has no pending approval"
                    ))),
                    several => Err(EngineError::precondition(format!(
                        "session {session_id} has {several} pending approvals; name one with \
                         approval_id"
                    ))),
                }
            }
        }
    }

    /// Checks arguments an approver wants to approve instead of the proposed ones against the
    /// input schema and the deny policies of the session's agent version (see
    /// [`Engine::vote`]).
    async fn check_edited_vote(
        &self,
        approval: &Approval,
        edited: &Value,
    ) -> Result<(), EngineError> {
        let store = &self.inner.store;
        if approval.tool == LIMIT_TOOL {
            return Err(EngineError::invalid(format!(
                "approval {} raises a run limit and takes no edited arguments",
                approval.id
            )));
        }
        if approval.tool == crate::fold::OUTPUT_TOOL {
            return Err(EngineError::invalid(format!(
                "approval {} accepts or rejects a final answer and takes no edited arguments",
                approval.id
            )));
        }
        let session = store.get_session(&approval.session_id).await?;
        let call = store.get_tool_call(&approval.call_id).await?;
        let (agent, setup) = self
            .prepared_version(session.agent_version_id)
            .await?
            .parts();
        let agent: &CompiledAgent = &agent;
        let wire = call.wire_name.clone().unwrap_or_else(|| call.tool.clone());
        let Some(binding) = setup.binding(&wire) else {
            return Err(EngineError::precondition(format!(
                "approval {} is for tool {wire:?}, which the agent version does not have",
                approval.id
            )));
        };
        let principal = self.inner.fold(&session.id).await?.principal;
        let metadata = phrony_manifest::session_metadata(&session.metadata);
        let scope = CallScope {
            agent,
            session_id: &session.id,
            metadata: &metadata,
            principal: principal.as_ref(),
            now: self.inner.clock.now().timestamp(),
        };
        // History-aware policies see the facts of the edited call (this call's own reservation
        // left out); the reservation moves to the edited arguments when the call goes on.
        let asker = crate::calls::history::Asker {
            session_id: &session.id,
            agent: agent.agent_ctx(),
            now: self.inner.clock.now(),
        };
        let prepared = crate::calls::history::read_history(
            store,
            &setup.policies,
            asker,
            &call.call_id,
            binding.tool_ctx(&wire),
            edited,
        )
        .await?;
        let facts = prepared.as_ref().map(|p| &p.facts);
        match setup.check_edit(&scope, binding, &wire, edited, facts) {
            Ok(_) => Ok(()),
            Err(EditRefusal::Schema(message)) => Err(EngineError::invalid(format!(
                "the edited arguments do not match the input schema of {wire}: {message}"
            ))),
            Err(EditRefusal::Denied { policy, message }) => Err(EngineError::precondition(
                format!("the edited arguments are denied by policy {policy}: {message}"),
            )),
        }
    }
}
