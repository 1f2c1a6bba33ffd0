//! `VerifyAudit` and `ExportAudit`: the ledger's audit verification and event export;
//! `ListShadowDecisions`: what a shadow policy would have changed; `ListWebhookDeliveries` and
//! `RetryWebhookDelivery`: the webhook outbox's deliveries.

use phrony_proto::runtime::v1 as pb;
use tonic::Status;
use tonic::codegen::BoxStream;

use super::RuntimeService;
use crate::convert::audit as conv;
use crate::convert::ledger_status;

/// Events read from the ledger per page of `ExportAudit`.
const EXPORT_PAGE: u32 = 500;

impl RuntimeService {
    pub(super) async fn verify_audit_impl(
        &self,
        request: pb::VerifyAuditRequest,
    ) -> Result<pb::VerifyAuditResponse, Status> {
        let scope = conv::audit_scope(&request)?;
        let report = self
            .ledger
            .verify_audit(scope)
            .await
            .map_err(ledger_status)?;
        Ok(conv::verify_audit_response(report))
    }

    /// One shadow policy's recorded decisions, oldest first, with `truncated` when more match.
    pub(super) async fn list_shadow_decisions_impl(
        &self,
        request: pb::ListShadowDecisionsRequest,
    ) -> Result<pb::ListShadowDecisionsResponse, Status> {
        let mut filter = conv::shadow_filter(&request)?;
        let limit = filter.limit;
        // One more than asked tells whether the answer is complete.
        filter.limit += 1;
        let mut decisions = self
            .ledger
            .shadow_decisions(&filter)
            .await
            .map_err(ledger_status)?;
        let truncated = decisions.len() > limit as usize;
        decisions.truncate(limit as usize);
        Ok(pb::ListShadowDecisionsResponse {
            decisions: decisions.into_iter().map(conv::shadow_decision).collect(),
            truncated,
        })
    }

    /// Webhook deliveries, newest event first.
    pub(super) async fn list_webhook_deliveries_impl(
        &self,
        request: pb::ListWebhookDeliveriesRequest,
    ) -> Result<pb::ListWebhookDeliveriesResponse, Status> {
        let filter = conv::delivery_filter(&request)?;
        let deliveries = self
            .ledger
            .webhook_deliveries(&filter)
            .await
            .map_err(ledger_status)?;
        Ok(pb::ListWebhookDeliveriesResponse {
            deliveries: deliveries.into_iter().map(conv::webhook_delivery).collect(),
        })
    }

    /// Re-queues a failed delivery, recorded as the caller's `webhook.retry_requested`.
    pub(super) async fn retry_webhook_delivery_impl(
        &self,
        request: pb::RetryWebhookDeliveryRequest,
        actor: phrony_auth::Attribution,
    ) -> Result<pb::RetryWebhookDeliveryResponse, Status> {
        let id = uuid::Uuid::parse_str(request.delivery_id.trim()).map_err(|_| {
            Status::invalid_argument(format!(
                "delivery_id {:?} is not a delivery id (a UUID)",
                request.delivery_id
            ))
        })?;
        let (delivery, _) = self
            .ledger
            .retry_webhook_delivery(id, actor)
            .await
            .map_err(ledger_status)?;
        Ok(pb::RetryWebhookDeliveryResponse {
            delivery: Some(conv::webhook_delivery(delivery)),
        })
    }

    /// Checks the request and the session, then streams the events page by page.
    pub(super) async fn export_audit_impl(
        &self,
        request: pb::ExportAuditRequest,
    ) -> Result<BoxStream<pb::AuditEvent>, Status> {
        let since = conv::since(&request.since)?;
        let session = crate::convert::optional(&request.session_id).map(str::to_owned);
        let ledger = self.ledger.clone();
        // The first page answers NotFound for an unknown session before the stream starts.
        let first = ledger
            .export_events(None, since, session.as_deref(), EXPORT_PAGE)
            .await
            .map_err(ledger_status)?;
        let state = (ledger, since, session, Some(first));
        let pages = futures::stream::unfold(state, |(ledger, since, session, page)| async move {
            let page = page?;
            let full = page.len() == EXPORT_PAGE as usize;
            let next = match page.last() {
                Some(last) if full => Some(
                    ledger
                        .export_events(
                            Some((last.stream.as_str(), last.seq)),
                            since,
                            session.as_deref(),
                            EXPORT_PAGE,
                        )
                        .await
                        .map_err(ledger_status),
                ),
                _ => None,
            };
            let (items, next_page): (Vec<Result<pb::AuditEvent, Status>>, _) = match next {
                Some(Ok(next)) => (
                    page.into_iter().map(|e| Ok(conv::audit_event(e))).collect(),
                    Some(next),
                ),
                Some(Err(status)) => {
                    let mut items: Vec<_> =
                        page.into_iter().map(|e| Ok(conv::audit_event(e))).collect();
                    items.push(Err(status));
                    (items, None)
                }
                None => (
                    page.into_iter().map(|e| Ok(conv::audit_event(e))).collect(),
                    None,
                ),
            };
            Some((
                futures::stream::iter(items),
                (ledger, since, session, next_page),
            ))
        });
        use futures::StreamExt as _;
        Ok(Box::pin(pages.flatten()))
    }
}
