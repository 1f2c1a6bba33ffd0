//! The console's data API: each handler authenticates the caller, checks the permission the
//! gRPC edge requires for the RPC, and calls that RPC of the in-process [`RuntimeService`] with
//! the caller's principal where the edge puts it. The answers are converted to JSON here, once.
//!
//! [`RuntimeService`]: phrony_grpc::RuntimeService

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt as _};
use pb::runtime_server::Runtime as _;
use phrony_auth::Principal;
use phrony_proto::runtime::v1 as pb;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, Console, EVENTS_RECHECK, MAX_COMMENT, MAX_DECIDE_BODY, json_body};

/// Approvals read per `ListApprovals` page, and the most a listing gathers.
const LIST_PAGE: i32 = 200;
const LIST_MAX: usize = 1000;

/// Timeline entries shown on a session's page.
const TIMELINE_PAGE: i32 = 500;

/// `msg` as the gRPC edge hands it to the service: with the caller's principal.
fn request<T>(msg: T, principal: &Principal) -> tonic::Request<T> {
    let mut request = tonic::Request::new(msg);
    request.extensions_mut().insert(principal.clone());
    request
}

/// The filters of the approvals list and the live updates; each is an exact match.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Filters {
    /// `pending` (the default), `approved`, `denied`, … or `any`.
    #[serde(default)]
    status: Option<String>,
    /// `namespace/name`.
    #[serde(default)]
    agent: Option<String>,
    /// The tool's dispatch name (e.g. `payments.issue-refund`).
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    route: Option<String>,
    #[serde(default)]
    session: Option<String>,
}

fn given(value: Option<&String>) -> Option<&str> {
    value.map(|v| v.trim()).filter(|v| !v.is_empty())
}

impl Filters {
    fn parse(query: Result<Query<Self>, QueryRejection>) -> Result<Self, ApiError> {
        query
            .map(|Query(filters)| filters)
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }

    /// `(namespace, name)` of the `agent` filter; empty when not given.
    fn agent(&self) -> Result<(String, String), ApiError> {
        match given(self.agent.as_ref()) {
            None => Ok((String::new(), String::new())),
            Some(agent) => match agent.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    Ok((ns.to_owned(), name.to_owned()))
                }
                _ => Err(ApiError::bad_request(format!(
                    "`agent` must be `namespace/name` (got {agent:?})"
                ))),
            },
        }
    }

    fn list_request(&self, page_token: String) -> Result<pb::ListApprovalsRequest, ApiError> {
        let (agent_namespace, agent_name) = self.agent()?;
        let status = match given(self.status.as_ref()) {
            None => "pending".to_owned(),
            Some("any") => String::new(),
            Some(s) => s.to_owned(),
        };
        Ok(pb::ListApprovalsRequest {
            status,
            route: given(self.route.as_ref()).unwrap_or_default().to_owned(),
            session_id: given(self.session.as_ref()).unwrap_or_default().to_owned(),
            agent_namespace,
            agent_name,
            page_size: LIST_PAGE,
            page_token,
        })
    }
}

/// `GET /console/api/approvals`: the approvals matching the filters (pending by default), at
/// most [`LIST_MAX`]; `truncated` says when there are more.
pub(crate) async fn list_approvals(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<Filters>, QueryRejection>,
) -> Result<Response, ApiError> {
    let filters = Filters::parse(query)?;
    let caller = console.caller(&headers).await?;
    caller.require_rpc("ListApprovals")?;
    let service = &console.serving()?.service;
    let tool = given(filters.tool.as_ref()).map(str::to_owned);
    let mut found = Vec::new();
    let mut page_token = String::new();
    let truncated = loop {
        let page = service
            .list_approvals(request(
                filters.list_request(page_token)?,
                &caller.principal,
            ))
            .await
            .map_err(|s| ApiError::from_status(&s))?
            .into_inner();
        found.extend(
            page.approvals
                .iter()
                .filter(|a| tool.as_deref().is_none_or(|t| a.tool == t))
                .map(approval_json),
        );
        if page.next_page_token.is_empty() {
            break false;
        }
        if found.len() >= LIST_MAX {
            break true;
        }
        page_token = page.next_page_token;
    };
    Ok(axum::Json(json!({"approvals": found, "truncated": truncated})).into_response())
}

/// `GET /console/api/approvals/{id}`: one approval with its votes.
pub(crate) async fn get_approval(
    State(console): State<Console>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = console.caller(&headers).await?;
    caller.require_rpc("GetApproval")?;
    let approval = console
        .serving()?
        .service
        .get_approval(request(
            pb::GetApprovalRequest { approval_id: id },
            &caller.principal,
        ))
        .await
        .map_err(|s| ApiError::from_status(&s))?
        .into_inner();
    Ok(axum::Json(approval_json(&approval)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideBody {
    /// `approve` or `reject`.
    decision: String,
    #[serde(default)]
    comment: String,
    /// Replacement arguments (approve only, where the policy's `on_modify` allows).
    #[serde(default)]
    args: Option<Value>,
    #[serde(default)]
    comprehension_acknowledged: bool,
}

/// `POST /console/api/approvals/{id}/decide`: the caller's vote, through `DecideApproval`. The
/// recorded actor is the caller's principal: the request names nobody.
pub(crate) async fn decide(
    State(console): State<Console>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (_, caller) = console.caller_for_change(&headers).await?;
    caller.require_rpc("DecideApproval")?;
    let body: DecideBody = json_body("decision", &headers, &body, MAX_DECIDE_BODY)?;
    let decision = match body.decision.trim() {
        "approve" => pb::ApprovalDecision::Approve,
        "reject" => pb::ApprovalDecision::Reject,
        other => {
            return Err(ApiError::bad_request(format!(
                "`decision` must be \"approve\" or \"reject\" (got {other:?})"
            )));
        }
    };
    let comment = body.comment.trim().to_owned();
    let len = comment.chars().count();
    if len > MAX_COMMENT {
        return Err(ApiError::bad_request(format!(
            "`comment` must have at most {MAX_COMMENT} characters, has {len}"
        )));
    }
    let args = match &body.args {
        None | Some(Value::Null) => Vec::new(),
        Some(args) => serde_json::to_vec(args)
            .map_err(|e| ApiError::bad_request(format!("`args` cannot be encoded: {e}")))?,
    };
    let answer = console
        .serving()?
        .service
        .decide_approval(request(
            pb::DecideApprovalRequest {
                approval_id: id,
                decision: decision.into(),
                comment,
                actor: String::new(),
                args,
                comprehension_acknowledged: body.comprehension_acknowledged,
                ..Default::default()
            },
            &caller.principal,
        ))
        .await
        .map_err(|s| ApiError::from_status(&s))?
        .into_inner();
    Ok(axum::Json(json!({
        "status": answer.status,
        "approvals_received": answer.approvals_received,
        "session_status": answer.session_status,
    }))
    .into_response())
}

/// `GET /console/api/sessions/{id}`: the session and (the first [`TIMELINE_PAGE`] entries of)
/// its inspect timeline.
pub(crate) async fn inspect_session(
    State(console): State<Console>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = console.caller(&headers).await?;
    caller.require_rpc("InspectSession")?;
    let inspected = console
        .serving()?
        .service
        .inspect_session(request(
            pb::InspectSessionRequest {
                session_id: id,
                page_size: TIMELINE_PAGE,
                page_token: String::new(),
            },
            &caller.principal,
        ))
        .await
        .map_err(|s| ApiError::from_status(&s))?
        .into_inner();
    let session = inspected.session.as_ref().map(session_json);
    let timeline: Vec<Value> = inspected.timeline.iter().map(entry_json).collect();
    Ok(axum::Json(json!({
        "session": session,
        "timeline": timeline,
        "more": !inspected.next_page_token.is_empty(),
    }))
    .into_response())
}

/// `GET /console/api/events`: server-sent events from `WatchApprovals` (pending approvals
/// matching the filters): first the current set (`opened` each, then `current_end`), then
/// `opened`, `updated` and `decided` as they happen. A watch the service ends (it fell behind,
/// or the database failed) sends `error` and closes; the browser's `EventSource` reconnects.
/// The stream ends when the console session expires or ends (sign-out), and when its credential
/// no longer verifies or no longer grants `WatchApprovals` (a revoked token, an expired JWT):
/// checked every [`EVENTS_RECHECK`]. A reconnect then needs a live session and a credential that
/// still verifies.
pub(crate) async fn events(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<Filters>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let filters = Filters::parse(query)?;
    let caller = console.caller(&headers).await?;
    caller.require_rpc("WatchApprovals")?;
    let listed = filters.list_request(String::new())?;
    let watch = pb::WatchApprovalsRequest {
        status: String::new(),
        route: listed.route,
        session_id: listed.session_id,
        agent_namespace: listed.agent_namespace,
        agent_name: listed.agent_name,
    };
    let changes = console
        .serving()?
        .service
        .watch_approvals(request(watch, &caller.principal))
        .await
        .map_err(|s| ApiError::from_status(&s))?
        .into_inner();
    let session_end = tokio::time::Instant::from_std(caller.expires);
    let revoked = still_allowed(console.clone(), headers);
    let end = async move {
        tokio::select! {
            () = tokio::time::sleep_until(session_end) => {}
            () = revoked => {}
        }
    };
    let events = changes.take_until(end).map(|change| {
        Ok(match change {
            Ok(change) => {
                let kind = match pb::ApprovalChangeKind::try_from(change.kind) {
                    Ok(pb::ApprovalChangeKind::Opened) => "opened",
                    Ok(pb::ApprovalChangeKind::Updated) => "updated",
                    Ok(pb::ApprovalChangeKind::Decided) => "decided",
                    Ok(pb::ApprovalChangeKind::CurrentEnd) => "current_end",
                    Ok(pb::ApprovalChangeKind::Unspecified) | Err(_) => "unspecified",
                };
                let approval = change.approval.as_ref().map(approval_json);
                Event::default()
                    .event(kind)
                    .data(json!({"approval": approval}).to_string())
            }
            Err(status) => Event::default()
                .event("error")
                .data(json!({"message": status.message()}).to_string()),
        })
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// Resolves once the request's console session or its credential no longer allows
/// `WatchApprovals`, checked every [`EVENTS_RECHECK`]. An unavailable database is not a
/// refusal: the check is tried again at the next tick.
async fn still_allowed(console: Console, headers: HeaderMap) {
    let start = tokio::time::Instant::now() + EVENTS_RECHECK;
    let mut ticks = tokio::time::interval_at(start, EVENTS_RECHECK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let refusal = match console.caller(&headers).await {
            Ok(caller) => match caller.require_rpc("WatchApprovals") {
                Ok(()) => continue,
                Err(refusal) => refusal,
            },
            Err(e) if e.status == axum::http::StatusCode::SERVICE_UNAVAILABLE => continue,
            Err(refusal) => refusal,
        };
        tracing::info!(
            reason = %refusal.message.escape_debug(),
            "console live updates ended: the session or its credential no longer holds"
        );
        return;
    }
}

// ---------------------------------------------------------------------------------------------
// JSON of the service's answers

/// A JSON document carried as bytes: `null` when empty, the text when it does not parse.
fn document(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn vote_json(v: &pb::ApprovalVote) -> Value {
    json!({
        "decided_by": v.decided_by,
        "decision": v.decision,
        "comment": v.comment,
        "verification": v.verification,
        "via": v.via,
        "created_at": v.created_at,
        "comprehension_acknowledged": v.comprehension_acknowledged,
    })
}

fn approval_json(a: &pb::Approval) -> Value {
    json!({
        "id": a.id,
        "session_id": a.session_id,
        "call_id": a.call_id,
        "status": a.status,
        "kind": a.kind,
        "route": a.route,
        "reason": a.reason,
        "tool": a.tool,
        "version": a.version,
        "args": document(&a.args),
        "effective_args": document(&a.effective_args),
        "agent_ref": a.agent_ref,
        "policy_ref": a.policy_ref,
        "policy_name": a.policy_name,
        "policy_runtime": document(&a.policy_runtime),
        "authority_ref": a.authority_ref,
        "approvals_required": a.approvals_required,
        "approvals_received": a.approvals_received,
        "comprehension_required": a.comprehension_required,
        "on_reject": a.on_reject,
        "on_modify": a.on_modify,
        "expires_at": a.expires_at,
        "created_at": a.created_at,
        "decided_at": a.decided_at,
        "decided_by": a.decided_by,
        "decided_by_verification": a.decided_by_verification,
        "decided_by_via": a.decided_by_via,
        "comment": a.comment,
        "votes": a.votes.iter().map(vote_json).collect::<Vec<_>>(),
    })
}

fn session_json(s: &pb::SessionInspect) -> Value {
    let agent = s
        .agent
        .as_ref()
        .map(|a| format!("{}/{}@{}", a.namespace, a.name, a.version));
    json!({
        "id": s.id,
        "status": s.status,
        "agent_ref": agent,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "started_by": s.started_by,
        "started_by_verification": s.started_by_verification,
        "started_by_via": s.started_by_via,
        "output": s.output.as_ref().map(|o| o.message.clone()),
        "error": s.error,
    })
}

fn entry_json(e: &pb::InspectTimelineEntry) -> Value {
    let (actor, approval_id) = match (&e.event, &e.approval) {
        (Some(event), _) => (Some(event.actor.clone()), None),
        (None, Some(approval)) => (None, Some(approval.id.clone())),
        (None, None) => (None, None),
    };
    json!({
        "timestamp": e.timestamp,
        "source": e.source,
        "kind": e.kind,
        "summary": e.summary,
        "session_id": e.session_id,
        "depth": e.depth,
        "actor": actor,
        "approval_id": approval_id,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn filters_name_what_is_wrong() {
        let f = Filters {
            agent: Some("support/refund-agent".into()),
            route: Some(" finance ".into()),
            ..Filters::default()
        };
        let r = f.list_request(String::new()).unwrap();
        assert_eq!(
            (
                r.agent_namespace.as_str(),
                r.agent_name.as_str(),
                r.route.as_str()
            ),
            ("support", "refund-agent", "finance")
        );
        assert_eq!(r.status, "pending", "pending by default");
        let any = Filters {
            status: Some("any".into()),
            ..Filters::default()
        };
        assert_eq!(any.list_request(String::new()).unwrap().status, "");
        for bad in ["refund-agent", "/x", "a/", "a/b/c"] {
            let f = Filters {
                agent: Some(bad.into()),
                ..Filters::default()
            };
            let err = f.list_request(String::new()).unwrap_err();
            assert!(
                err.message.contains("`agent` must be `namespace/name`"),
                "{bad}"
            );
        }
    }

    #[test]
    fn documents_are_json_when_they_parse() {
        assert_eq!(document(b""), Value::Null);
        assert_eq!(document(br#"{"amount": 400}"#), json!({"amount": 400}));
        assert_eq!(document(b"not json"), json!("not json"));
    }
}
