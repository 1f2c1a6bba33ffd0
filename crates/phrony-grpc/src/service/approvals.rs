//! Approval RPCs (§3.9): read one (with its votes), list them, and vote. A vote is
//! [`phrony_engine::Engine::vote`]: the engine checks and records it, resumes the waiting
//! session, and answers with the session status the vote led to.

use phrony_auth::Attribution;
use phrony_engine::VoteTarget;
use phrony_proto::runtime::v1 as pb;
use tonic::Status;

use super::RuntimeService;
use crate::convert::approvals as conv;
use crate::convert::{engine_status, ledger_status};

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
        actor: Attribution,
        routes: Vec<String>,
    ) -> Result<pb::DecideApprovalResponse, Status> {
        let id = conv::approval_id(&request.approval_id)?;
        let vote = conv::vote(&request, actor, routes)?;
        let (voter, decision) = (vote.actor.clone(), vote.decision);
        let answer = self
            .engine()?
            .vote(VoteTarget::Approval(id), vote)
            .await
            .map_err(engine_status)?;
        tracing::info!(
            approval_id = %id, session_id = %answer.approval.session_id, actor = %voter,
            %decision, status = %answer.approval.status, decided = answer.decided,
            session_status = %answer.session_status, "approval vote recorded"
        );
        Ok(conv::decide_response(&answer))
    }
}
