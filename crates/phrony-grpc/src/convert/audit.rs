//! Audit RPCs: the verification scope from a request, reports and exported events to messages.

use chrono::{DateTime, Utc};
use phrony_ledger::{
    AgentRef, AuditProblem, AuditProblemKind, AuditReport, AuditScope, Event, MAX_SHADOW_DECISIONS,
    ShadowDecision, ShadowDecisionFilter,
};
use phrony_proto::runtime::v1 as pb;
use tonic::Status;

/// The scope of a `VerifyAudit` request: a session, an agent (`namespace/name`) or everything.
pub(crate) fn audit_scope(request: &pb::VerifyAuditRequest) -> Result<AuditScope, Status> {
    let session = request.session_id.trim();
    let agent = request.agent.trim();
    match (session.is_empty(), agent.is_empty()) {
        (true, true) => Ok(AuditScope::All),
        (false, true) => Ok(AuditScope::Session(session.to_owned())),
        (true, false) => {
            let Some((namespace, name)) = agent.split_once('/') else {
                return Err(Status::invalid_argument(format!(
                    "agent {agent:?} must be namespace/name"
                )));
            };
            let agent = AgentRef::new(namespace, name);
            agent.validate().map_err(super::ledger_status)?;
            Ok(AuditScope::Agent(agent))
        }
        (false, false) => Err(Status::invalid_argument(
            "give at most one of session_id and agent",
        )),
    }
}

fn kind_name(kind: &AuditProblemKind) -> &'static str {
    match kind {
        AuditProblemKind::Chain(_) => "chain",
        AuditProblemKind::HeadMissing => "head_missing",
        AuditProblemKind::HeadMismatch => "head_mismatch",
        AuditProblemKind::HeadMac => "head_mac",
        AuditProblemKind::StreamDeleted => "stream_deleted",
        AuditProblemKind::StreamSetMismatch { .. } => "stream_set_mismatch",
        AuditProblemKind::StreamSetMac => "stream_set_mac",
        AuditProblemKind::StreamSetMissing => "stream_set_missing",
        AuditProblemKind::Unsealed => "unsealed",
        AuditProblemKind::KeyMismatch { .. } => "key_mismatch",
        AuditProblemKind::TriggerMissing { .. } => "trigger_missing",
        AuditProblemKind::Projection { .. } => "projection",
        _ => "other",
    }
}

fn problem(p: AuditProblem) -> pb::AuditProblem {
    let (table, key, column) = match &p.kind {
        AuditProblemKind::Projection { table, key, column } => (
            table.clone(),
            key.clone(),
            column.clone().unwrap_or_default(),
        ),
        _ => Default::default(),
    };
    pb::AuditProblem {
        kind: kind_name(&p.kind).to_owned(),
        stream: p.stream.unwrap_or_default(),
        seq: p.seq.unwrap_or(0),
        message: p.message,
        table,
        key,
        column,
    }
}

pub(crate) fn verify_audit_response(report: AuditReport) -> pb::VerifyAuditResponse {
    pb::VerifyAuditResponse {
        verified: report.problem.is_none(),
        events: report.events,
        streams: report.streams,
        problem: report.problem.map(problem),
    }
}

/// `ExportAudit.since`: empty, or an RFC 3339 time.
pub(crate) fn since(text: &str) -> Result<Option<DateTime<Utc>>, Status> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| Some(t.to_utc()))
        .map_err(|e| {
            Status::invalid_argument(format!(
                "since {text:?} is not an RFC 3339 time such as 2026-12-01T00:00:00Z: {e}"
            ))
        })
}

/// The ledger filter of a `ListWebhookDeliveries` request.
///
/// # Errors
/// `INVALID_ARGUMENT` naming an unknown status or a limit over 1000.
pub(crate) fn delivery_filter(
    request: &pb::ListWebhookDeliveriesRequest,
) -> Result<phrony_ledger::DeliveryFilter, Status> {
    use phrony_ledger::DeliveryStatus as S;
    let status = match request.status.trim() {
        "" => None,
        "pending" => Some(S::Pending),
        "delivered" => Some(S::Delivered),
        "failed" => Some(S::Failed),
        other => {
            return Err(Status::invalid_argument(format!(
                "status {other:?}: expected pending, delivered or failed"
            )));
        }
    };
    if request.limit > phrony_ledger::MAX_DELIVERY_LIST {
        return Err(Status::invalid_argument(format!(
            "limit {}: at most {}",
            request.limit,
            phrony_ledger::MAX_DELIVERY_LIST
        )));
    }
    Ok(phrony_ledger::DeliveryFilter {
        status,
        webhook: Some(request.webhook.trim().to_owned()).filter(|w| !w.is_empty()),
        limit: request.limit,
    })
}

/// One delivery on the wire.
pub(crate) fn webhook_delivery(d: phrony_ledger::WebhookDelivery) -> pb::WebhookDelivery {
    let ts =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    pb::WebhookDelivery {
        id: d.id.to_string(),
        webhook: d.webhook,
        kind: d.kind.as_str().to_owned(),
        stream: d.stream,
        seq: d.seq,
        status: d.status.as_str().to_owned(),
        attempts: d.attempts,
        next_attempt_at: ts(d.next_attempt_at),
        last_error: d.last_error.unwrap_or_default(),
        delivered_at: d.delivered_at.map(ts).unwrap_or_default(),
        created_at: ts(d.created_at),
    }
}

/// The default number of shadow decisions a `ListShadowDecisions` without a limit returns.
const DEFAULT_SHADOW_LIMIT: u32 = 100;

/// The ledger filter of a `ListShadowDecisions` request: `policy` is `namespace/name`, `since`
/// empty or RFC 3339, `limit` 0 (the default, 100) or 1 to one less than the ledger's maximum
/// (the service asks for one more, to know whether the answer is complete).
pub(crate) fn shadow_filter(
    request: &pb::ListShadowDecisionsRequest,
) -> Result<ShadowDecisionFilter, Status> {
    let policy = request.policy.trim();
    let (namespace, name) = match policy.split_once('/') {
        Some((namespace, name))
            if !namespace.trim().is_empty()
                && !name.trim().is_empty()
                && !name.contains(['/', '@']) =>
        {
            (namespace.trim(), name.trim())
        }
        _ => {
            return Err(Status::invalid_argument(format!(
                "policy {policy:?} must be namespace/name (every version is listed)"
            )));
        }
    };
    let limit = match request.limit {
        0 => DEFAULT_SHADOW_LIMIT,
        n if n < MAX_SHADOW_DECISIONS => n,
        n => {
            return Err(Status::invalid_argument(format!(
                "limit {n} is too large; ask for at most {}",
                MAX_SHADOW_DECISIONS - 1
            )));
        }
    };
    Ok(ShadowDecisionFilter {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        since: since(&request.since)?,
        limit,
    })
}

pub(crate) fn shadow_decision(d: ShadowDecision) -> pb::ShadowDecision {
    let s = d.decision;
    pb::ShadowDecision {
        recorded_at: d
            .recorded_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        session_id: s.session_id,
        call_id: s.call_id,
        agent: s.agent,
        tool: s.tool,
        args_digest: s.args_digest,
        enforced: s.enforced.as_str().to_owned(),
        enforced_policy: s.enforced_policy.unwrap_or_default(),
        shadow: s.shadow.as_str().to_owned(),
        policy: s.policy,
        reason: s.reason.unwrap_or_default(),
        seq: d.seq,
    }
}

pub(crate) fn audit_event(e: Event) -> pb::AuditEvent {
    pb::AuditEvent {
        ts: e.ts.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        payload_json: phrony_ledger::canonical_json(&e.payload),
        stream: e.stream,
        seq: e.seq,
        r#type: e.event_type,
        actor: e.actor,
        call_id: e.call_id.unwrap_or_default(),
        turn: e.turn,
        prev_hash: e.prev_hash,
        hash: e.hash,
        actor_verification: e.actor_verification.map(|v| v.as_str().to_owned()),
        actor_via: e.actor_via,
    }
}

#[cfg(test)]
mod tests {
    use phrony_proto::runtime::v1 as pb;
    use tonic::Code;

    use super::shadow_filter;

    fn request(policy: &str, since: &str, limit: u32) -> pb::ListShadowDecisionsRequest {
        pb::ListShadowDecisionsRequest {
            policy: policy.to_owned(),
            since: since.to_owned(),
            limit,
        }
    }

    #[test]
    fn a_shadow_request_names_one_policy_a_time_and_a_bounded_limit() {
        let filter = shadow_filter(&request(" payments/no-gold ", "", 0)).unwrap();
        assert_eq!(
            (
                filter.namespace.as_str(),
                filter.name.as_str(),
                filter.since,
                filter.limit
            ),
            ("payments", "no-gold", None, 100)
        );
        let filter =
            shadow_filter(&request("payments/no-gold", "2026-12-01T00:00:00Z", 999)).unwrap();
        assert_eq!(filter.limit, 999);
        assert!(filter.since.is_some());
        for (bad, says) in [
            (request("no-gold", "", 0), "must be namespace/name"),
            (
                request("payments/no-gold@1.0.0", "", 0),
                "must be namespace/name",
            ),
            (request("/no-gold", "", 0), "must be namespace/name"),
            (request("payments/no-gold", "", 1000), "ask for at most 999"),
            (request("payments/no-gold", "yesterday", 0), "RFC 3339"),
        ] {
            let status = shadow_filter(&bad).unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument);
            assert!(
                status.message().contains(says),
                "{bad:?}: {}",
                status.message()
            );
        }
    }
}
