//! The audit RPCs: `VerifyAudit` (chains, sealed heads, triggers, re-folded projections),
//! `ExportAudit` (every event with its hashes) and `ListShadowDecisions` (what a `mode: shadow`
//! policy would have changed).

use phrony_proto::runtime::v1 as pb;

use crate::{Client, ClientError};

/// What `VerifyAudit` covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditScope {
    /// Every stream and projection.
    All,
    /// One session.
    Session(String),
    /// One agent's lifecycle stream, as `namespace/name`.
    Agent(String),
}

/// The first problem the runtime found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditProblem {
    /// `chain`, `head_missing`, `head_mismatch`, `head_mac`, `stream_deleted`,
    /// `stream_set_mismatch`, `stream_set_mac`, `stream_set_missing`, `unsealed`,
    /// `key_mismatch`, `trigger_missing` or `projection`.
    pub kind: String,
    /// The stream, when the problem is in one.
    pub stream: Option<String>,
    /// The first bad seq, when known.
    pub seq: Option<u64>,
    /// One line naming what is wrong.
    pub message: String,
}

/// The answer of `VerifyAudit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditVerification {
    /// Events whose chain recomputed.
    pub events: u64,
    /// Streams checked completely.
    pub streams: u64,
    /// `None` when everything verified.
    pub problem: Option<AuditProblem>,
}

/// One exported event, exactly as stored and hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedEvent {
    /// The stream (a session id, `agent:ns/name`, `audit`).
    pub stream: String,
    /// Its seq in the stream.
    pub seq: u64,
    /// The event type.
    pub event_type: String,
    /// RFC 3339 UTC with six fractional digits.
    pub ts: String,
    /// Who caused it.
    pub actor: String,
    /// The tool call it concerns.
    pub call_id: Option<String>,
    /// The turn.
    pub turn: Option<u32>,
    /// The payload's canonical JSON text.
    pub payload_json: String,
    /// The previous event's hash.
    pub prev_hash: String,
    /// This event's hash.
    pub hash: String,
    /// How the actor was verified, when the event records it (then hashed too).
    pub actor_verification: Option<String>,
    /// The relaying principal, when the event records one.
    pub actor_via: Option<String>,
}

/// One recorded shadow decision: a call a `mode: shadow` policy would have denied or held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowDecision {
    /// When it was recorded (RFC 3339, microseconds).
    pub recorded_at: String,
    /// The session of the call.
    pub session_id: String,
    /// The call.
    pub call_id: String,
    /// The agent, `namespace/name@version`.
    pub agent: String,
    /// The tool's dispatch ref.
    pub tool: String,
    /// The call hash of the call (its arguments included).
    pub args_digest: String,
    /// What the enforced policies decided: `allow`, `deny` or `require_approval`.
    pub enforced: String,
    /// The enforced decision's policy, when one decided.
    pub enforced_policy: Option<String>,
    /// What the shadow policy would have made of it: `deny` or `require_approval`.
    pub shadow: String,
    /// The shadow policy, `namespace/name@version`.
    pub policy: String,
    /// Its deny message or approval reason.
    pub reason: Option<String>,
}

/// The answer of `ListShadowDecisions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowDecisions {
    /// The decisions, oldest first.
    pub decisions: Vec<ShadowDecision>,
    /// Whether more matched than the limit returned.
    pub truncated: bool,
}

/// One webhook delivery (`ListWebhookDeliveries`, `RetryWebhookDelivery`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookDelivery {
    /// The delivery id: the receiver's idempotency id.
    pub id: String,
    /// The webhook.
    pub webhook: String,
    /// `approval.required`, `approval.decided`, `approval.expired`, `approval.escalated` or
    /// `session.failed`.
    pub kind: String,
    /// The event's stream.
    pub stream: String,
    /// The event's sequence number.
    pub seq: u64,
    /// `pending`, `delivered` or `failed`.
    pub status: String,
    /// Attempts made.
    pub attempts: u32,
    /// When the next attempt is due (RFC 3339).
    pub next_attempt_at: String,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When it was delivered (RFC 3339).
    pub delivered_at: Option<String>,
    /// When the event committed (RFC 3339).
    pub created_at: String,
}

impl From<pb::WebhookDelivery> for WebhookDelivery {
    fn from(d: pb::WebhookDelivery) -> Self {
        Self {
            id: d.id,
            webhook: d.webhook,
            kind: d.kind,
            stream: d.stream,
            seq: d.seq,
            status: d.status,
            attempts: d.attempts,
            next_attempt_at: d.next_attempt_at,
            last_error: Some(d.last_error).filter(|e| !e.is_empty()),
            delivered_at: Some(d.delivered_at).filter(|e| !e.is_empty()),
            created_at: d.created_at,
        }
    }
}

/// The events of an `ExportAudit` call, read as they arrive.
#[derive(Debug)]
pub struct AuditExport {
    stream: tonic::Streaming<pb::AuditEvent>,
    client: Client,
}

impl AuditExport {
    /// The next event, or `None` at the end.
    ///
    /// # Errors
    /// Any [`ClientError`] the stream ends with.
    pub async fn next(&mut self) -> Result<Option<ExportedEvent>, ClientError> {
        let message = self
            .stream
            .message()
            .await
            .map_err(|s| self.client.status(&s))?;
        Ok(message.map(|e| ExportedEvent {
            stream: e.stream,
            seq: e.seq,
            event_type: e.r#type,
            ts: e.ts,
            actor: e.actor,
            call_id: Some(e.call_id).filter(|c| !c.is_empty()),
            turn: e.turn,
            payload_json: e.payload_json,
            prev_hash: e.prev_hash,
            hash: e.hash,
            actor_verification: e.actor_verification,
            actor_via: e.actor_via,
        }))
    }
}

impl Client {
    /// Webhook deliveries (`ListWebhookDeliveries`), newest event first: only `status`
    /// (`pending`, `delivered`, `failed`) and `webhook` when given, at most `limit` (0: 100).
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown status or a limit over 1000; any other [`ClientError`].
    pub async fn list_webhook_deliveries(
        &self,
        status: Option<&str>,
        webhook: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WebhookDelivery>, ClientError> {
        let request = pb::ListWebhookDeliveriesRequest {
            status: status.unwrap_or_default().to_owned(),
            webhook: webhook.unwrap_or_default().to_owned(),
            limit,
        };
        let response = self
            .runtime
            .clone()
            .list_webhook_deliveries(request)
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok(response.deliveries.into_iter().map(Into::into).collect())
    }

    /// Re-queues a failed delivery (`RetryWebhookDelivery`), recorded as `actor` (empty: the
    /// caller's credential).
    ///
    /// # Errors
    /// `NotFound`, `FailedPrecondition` (not failed), `PermissionDenied` (needs the `operate`
    /// permission: the admin role); any other [`ClientError`].
    pub async fn retry_webhook_delivery(
        &self,
        delivery_id: &str,
        actor: &str,
    ) -> Result<WebhookDelivery, ClientError> {
        let response = self
            .runtime
            .clone()
            .retry_webhook_delivery(pb::RetryWebhookDeliveryRequest {
                delivery_id: delivery_id.to_owned(),
                actor: actor.to_owned(),
            })
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        response
            .delivery
            .map(Into::into)
            .ok_or_else(|| ClientError::invalid_response("RetryWebhookDelivery", "no delivery"))
    }

    /// Verifies the runtime's event log (`VerifyAudit`).
    ///
    /// # Errors
    /// `NotFound` for an unknown session or agent; `FailedPrecondition` when the runtime has
    /// no audit key; any other [`ClientError`].
    pub async fn verify_audit(&self, scope: &AuditScope) -> Result<AuditVerification, ClientError> {
        let mut request = pb::VerifyAuditRequest::default();
        match scope {
            AuditScope::All => {}
            AuditScope::Session(id) => request.session_id.clone_from(id),
            AuditScope::Agent(agent) => request.agent.clone_from(agent),
        }
        let response = self
            .runtime
            .clone()
            .verify_audit(request)
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok(AuditVerification {
            events: response.events,
            streams: response.streams,
            problem: response
                .problem
                .filter(|_| !response.verified)
                .map(|p| AuditProblem {
                    kind: p.kind,
                    stream: Some(p.stream).filter(|s| !s.is_empty()),
                    seq: Some(p.seq).filter(|s| *s > 0),
                    message: p.message,
                }),
        })
    }

    /// What the shadow policy `namespace/name` (every version) would have changed
    /// (`ListShadowDecisions`): decisions recorded at or after `since` (RFC 3339), oldest
    /// first, at most `limit` (0: the runtime's default of 100).
    ///
    /// # Errors
    /// `InvalidArgument` for a policy that is not `namespace/name`, a bad `since` or a limit
    /// over 999; any other [`ClientError`].
    pub async fn list_shadow_decisions(
        &self,
        policy: &str,
        since: Option<&str>,
        limit: u32,
    ) -> Result<ShadowDecisions, ClientError> {
        let request = pb::ListShadowDecisionsRequest {
            policy: policy.to_owned(),
            since: since.unwrap_or_default().to_owned(),
            limit,
        };
        let response = self
            .runtime
            .clone()
            .list_shadow_decisions(request)
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        let optional = |s: String| Some(s).filter(|s| !s.is_empty());
        Ok(ShadowDecisions {
            decisions: response
                .decisions
                .into_iter()
                .map(|d| ShadowDecision {
                    recorded_at: d.recorded_at,
                    session_id: d.session_id,
                    call_id: d.call_id,
                    agent: d.agent,
                    tool: d.tool,
                    args_digest: d.args_digest,
                    enforced: d.enforced,
                    enforced_policy: optional(d.enforced_policy),
                    shadow: d.shadow,
                    policy: d.policy,
                    reason: optional(d.reason),
                })
                .collect(),
            truncated: response.truncated,
        })
    }

    /// Exports the events with their hashes (`ExportAudit`): those at or after `since`
    /// (RFC 3339), of one session or all.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad `since`; `NotFound` for an unknown session; any other
    /// [`ClientError`].
    pub async fn export_audit(
        &self,
        since: Option<&str>,
        session_id: Option<&str>,
    ) -> Result<AuditExport, ClientError> {
        let request = pb::ExportAuditRequest {
            since: since.unwrap_or_default().to_owned(),
            session_id: session_id.unwrap_or_default().to_owned(),
        };
        let stream = self
            .runtime
            .clone()
            .export_audit(request)
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok(AuditExport {
            stream,
            client: self.clone(),
        })
    }
}
