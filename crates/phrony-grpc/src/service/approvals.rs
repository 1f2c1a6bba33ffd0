//! Approval RPCs (§3.9): read one (with its votes), list them, and vote. Votes go through the
//! session engine, so the session waiting for the approval resumes as soon as it is decided.

use std::time::Duration;

use phrony_engine::{ApprovalStatus, SessionStatus};
use phrony_proto::runtime::v1 as pb;
use tonic::Status;

use super::RuntimeService;
use crate::convert::approvals as conv;
use crate::convert::{engine_status, ledger_status};

/// How long `DecideApproval` waits for the session to act on a decision before answering.
const RESUME_WAIT: Duration = Duration::from_secs(2);

impl RuntimeService {
    pub(super) async fn get_approval_impl(
        &self,
        request: pb::GetApprovalRequest,
    ) -> Result<pb::Approval, Status> {
        let id = conv::approval_id(&request.approval_id)?;
        let approval = self.ledger.get_approval(id).await.map_err(ledger_status)?;
        Ok(conv::approval(approval, true))
    }

    pub(super) async fn list_approvals_impl(
        &self,
        request: pb::ListApprovalsRequest,
    ) -> Result<pb::ListApprovalsResponse, Status> {
        let (filter, page) = conv::approval_filter(&request)?;
        let found = self
            .ledger
            .list_approvals(&filter, &page)
            .await
            .map_err(ledger_status)?;
        super::warn_if_capped(
            "ListApprovals",
            request.page_size,
            found.next_token.as_ref(),
        );
        Ok(conv::list_approvals_response(found))
    }

    pub(super) async fn decide_approval_impl(
        &self,
        request: pb::DecideApprovalRequest,
        actor: String,
    ) -> Result<pb::DecideApprovalResponse, Status> {
        let id = conv::approval_id(&request.approval_id)?;
        let vote = conv::vote(&request, actor)?;
        let engine = self.engine()?;
        let (voter, decision) = (vote.actor.clone(), vote.decision);
        let outcome = engine
            .decide_approval(id, vote)
            .await
            .map_err(engine_status)?;
        let session_id = &outcome.approval.session_id;
        let mut session = engine
            .store()
            .get_session(session_id)
            .await
            .map_err(|e| engine_status(e.into()))?;
        // A decision resumes the session asynchronously: give it a moment to leave
        // `awaiting_approval`, so the answer says what the decision did (`running`, `completed`,
        // …) rather than the instant before. Not when another approval still holds it.
        if outcome.decided && session.status == SessionStatus::AwaitingApproval {
            let others_pending = engine
                .store()
                .session_approvals(session_id)
                .await
                .map_err(|e| engine_status(e.into()))?
                .iter()
                .any(|a| a.status == ApprovalStatus::Pending);
            if !others_pending {
                let resumed = SessionStatus::ALL
                    .iter()
                    .copied()
                    .filter(|s| *s != SessionStatus::AwaitingApproval)
                    .collect::<Vec<_>>();
                if let Ok(found) =
                    tokio::time::timeout(RESUME_WAIT, engine.wait_for(session_id, &resumed)).await
                {
                    session = found.map_err(engine_status)?;
                }
            }
        }
        tracing::info!(
            approval_id = %id, session_id = %session.id, actor = %voter, %decision,
            status = %outcome.approval.status, decided = outcome.decided, "approval vote recorded"
        );
        Ok(conv::decide_response(&outcome.approval, session.status))
    }
}
