//! Approval RPCs (§3.9): read one (with its votes), list them, and vote. A vote is
//! [`phrony_engine::Engine::vote`]: the engine checks and records it, resumes the waiting
//! session, and answers with the session status the vote led to.

use phrony_auth::Attribution;
use phrony_engine::VoteTarget;
use phrony_proto::runtime::v1 as pb;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;
use tonic::codegen::BoxStream;

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

    /// Starts a watch (the filters checked, a watcher slot taken) and forwards its changes
    /// through a buffer of `watch_buffer` changes. A client that leaves the buffer full for
    /// `watch_grace` is ended with `RESOURCE_EXHAUSTED` (the changes still buffered are dropped:
    /// it watches again and gets the current set); a store error ends the stream with its
    /// status.
    pub(super) fn watch_approvals_impl(
        &self,
        request: &pb::WatchApprovalsRequest,
    ) -> Result<BoxStream<pb::ApprovalChange>, Status> {
        let filter = conv::watch_filter(request)?;
        let mut watch = self
            .engine()?
            .watch_approvals(filter)
            .map_err(engine_status)?;
        let (buffer, grace) = (self.watch_buffer, self.watch_grace);
        let (tx, rx) = mpsc::channel::<Result<pb::ApprovalChange, Status>>(buffer);
        let (overflow_tx, overflow_rx) = oneshot::channel::<Status>();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = tx.closed() => return,
                    next = watch.next() => next,
                };
                let item = next.map(conv::approval_change).map_err(engine_status);
                let last = item.is_err();
                match tx.try_send(item) {
                    Ok(()) => {}
                    Err(TrySendError::Closed(_)) => return,
                    // Full: the client gets `grace` to make room before it is ended.
                    Err(TrySendError::Full(item)) => {
                        match tokio::time::timeout(grace, tx.send(item)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => return,
                            Err(_) => {
                                tracing::info!(
                                    buffer,
                                    "an approval watcher does not read its changes: ended"
                                );
                                // The receiver is gone if the client left at the same time.
                                let _ = overflow_tx.send(Status::resource_exhausted(format!(
                                    "the approval watch fell more than {buffer} changes behind \
                                     for {grace:?} and was ended; watch again to get the \
                                     current set"
                                )));
                                return;
                            }
                        }
                    }
                }
                if last {
                    return;
                }
            }
        });
        // The overflow status goes first, ahead of the changes still buffered, and ends it.
        let stream = futures::stream::unfold(
            (rx, Tail::Watching(overflow_rx)),
            |(mut rx, tail)| async move {
                match tail {
                    Tail::Ended => None,
                    Tail::Draining => rx.recv().await.map(|item| (item, (rx, Tail::Draining))),
                    Tail::Watching(mut overflow) => tokio::select! {
                        biased;
                        status = &mut overflow => match status {
                            Ok(status) => Some((Err(status), (rx, Tail::Ended))),
                            // Ended without overflowing: what is buffered is all there is.
                            Err(_) => rx.recv().await.map(|item| (item, (rx, Tail::Draining))),
                        },
                        item = rx.recv() => item.map(|item| (item, (rx, Tail::Watching(overflow)))),
                    },
                }
            },
        );
        Ok(Box::pin(stream))
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

/// Where a `WatchApprovals` response stream is.
enum Tail {
    /// Forwarding changes; the receiver yields the status that ends a client that fell behind.
    Watching(oneshot::Receiver<Status>),
    /// The watch ended on its own: the buffered changes, then the end.
    Draining,
    /// Ended (after the overflow status).
    Ended,
}
