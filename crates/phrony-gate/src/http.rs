//! The HTTP surface (axum).
//!
//! | Route | Purpose |
//! |---|---|
//! | `POST /v1/control/decisions` | decide (allow, deny and escalate are all HTTP 200) |
//! | `POST /v1/control/decisions/{id}/complete` | report the outcome, get a `receipt+jwt` |
//! | `GET /v1/control/.well-known/jwks.json` | the token key |
//! | `GET /healthz` | liveness |
//! | `GET /v1/admin/approvals[?status=pending]` | the approvals queue (admin key) |
//! | `POST /v1/admin/approvals/{ref}/approve` · `…/reject` | decide an escalation (admin key; body `{approver, comment?, approver_token?}`; without a printable `approver` name: 400) |
//! | `GET /v1/admin/decisions[?limit=N]` | recent decisions (admin key) |
//! | `GET /v1/admin/audit` | the audit log as JSONL (admin key) |
//! | `GET /v1/admin/mandates` | mandates with their used and held amounts today and this month (admin key, read-only) |
//! | `GET /v1/admin/policy/reveal` · `GET /v1/admin/mandates/{id}/reveal` | commitment reveals for `regent-verify` (admin key) |
//! | `GET /console/` · `/console/assets/…` · `/console/api/…` | the web console (manager login or admin key; see [`crate::console`]) |
//! | `ANY /{tool}/{path}` | sidecar routing (`routing.sidecar`: no key, `X-Agent-Id` of a listed agent): decide, inject the vaulted credential, forward, complete ([`crate::routing`]) |
//! | `ANY /gw/{tool}/{path}` | Cloud Gateway routing (`routing.gateway`: bearer key and signatures as above), same flow |
//! | `POST /license/validate` · `POST /heartbeat` (also as a suffix of any path) | the real sidecar binary's calls, answered as the dev mock does |
//!
//! The routing routes never shadow the ones above (static segments win); a routed refusal is a
//! 4xx envelope `{decision, decision_id, code, reason}` (403; 429 for `VELOCITY_EXCEEDED`).
//!
//! Errors that produce no decision answer `{"detail": …, "code": …}` with a 4xx/5xx status and
//! an `x-request-id` header. The `@authority` of RFC 9421 signatures is the `Host` header.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::admin::ApproverName;
use crate::engine::{Gate, Resolution};
use crate::error::ApiError;
use crate::request::DecisionRequest;
use crate::signing::SignedRequest;

/// The router serving `gate`.
pub fn router(gate: Arc<Gate>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/control/decisions", post(decide))
        .route(
            "/v1/control/decisions/{decision_id}/complete",
            post(complete),
        )
        .route("/v1/control/.well-known/jwks.json", get(jwks))
        .route("/v1/admin/approvals", get(list_approvals))
        .route("/v1/admin/approvals/{reference}/approve", post(approve))
        .route("/v1/admin/approvals/{reference}/reject", post(reject))
        .route("/v1/admin/decisions", get(list_decisions))
        .route("/v1/admin/audit", get(audit))
        .route("/v1/admin/mandates", get(list_mandates))
        .route("/v1/admin/policy/reveal", get(policy_reveal))
        .route("/v1/admin/mandates/{id}/reveal", get(mandate_reveal))
        .fallback(not_found)
        .with_state(Arc::clone(&gate))
        .merge(crate::console::router(Arc::clone(&gate)))
        .merge(crate::routing::router(gate))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(detail = %self.detail, "request failed");
        }
        with_request_id(
            (
                status,
                axum::Json(json!({"detail": self.detail, "code": self.code})),
            )
                .into_response(),
        )
    }
}

fn with_request_id(mut response: Response) -> Response {
    if let Ok(id) = HeaderValue::from_str(&format!("req_{}", uuid::Uuid::new_v4().simple())) {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

fn ok(value: Value) -> Response {
    with_request_id(axum::Json(value).into_response())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
}

fn header_values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect()
}

fn authority(headers: &HeaderMap, uri: &Uri) -> String {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
        .unwrap_or_default()
}

async fn healthz(State(gate): State<Arc<Gate>>) -> Response {
    let mode = if gate.settings().flags.is_some() {
        "flags"
    } else {
        "config"
    };
    ok(json!({"status": "ok", "service": "mock-gate", "mode": mode}))
}

async fn jwks(State(gate): State<Arc<Gate>>) -> Response {
    ok(gate.jwks())
}

async fn decide(
    State(gate): State<Arc<Gate>>,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut caller = gate.authenticate_key(bearer(&headers))?;
    let request = DecisionRequest::from_json(&body)?;
    let host = authority(&headers, &uri);
    let lookup = |name: &str| header_values(&headers, name);
    gate.verify_signature(
        &mut caller,
        &request.agent_id,
        &SignedRequest {
            method: Method::POST.as_str(),
            authority: &host,
            path: uri.path(),
            header: &lookup,
            body: &body,
        },
    )?;
    let idempotency = headers
        .get("idempotency-key")
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::unprocessable("Idempotency-Key is not visible ASCII"))
        })
        .transpose()?;
    let decision = gate.decide(&caller, request, idempotency).await?;
    Ok(ok(decision))
}

async fn complete(
    State(gate): State<Arc<Gate>>,
    Path(decision_id): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut caller = gate.authenticate_key(bearer(&headers))?;
    let agent = gate
        .decision_agent(&decision_id)
        .await
        .ok_or_else(|| ApiError::not_found(format!("decision `{decision_id}` not found")))?;
    let host = authority(&headers, &uri);
    let lookup = |name: &str| header_values(&headers, name);
    gate.verify_signature(
        &mut caller,
        &agent,
        &SignedRequest {
            method: Method::POST.as_str(),
            authority: &host,
            path: uri.path(),
            header: &lookup,
            body: &body,
        },
    )?;
    Ok(ok(gate.complete(&caller, &decision_id, &body).await?))
}

fn admin(gate: &Gate, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = gate.settings().admin_key.as_deref() else {
        return Err(ApiError::forbidden("this gate has no admin key"));
    };
    match bearer(headers) {
        Some(given)
            if crate::signing::constant_time_eq(given.trim().as_bytes(), expected.as_bytes()) =>
        {
            Ok(())
        }
        Some(_) => Err(ApiError::unauthorized("wrong admin key")),
        None => Err(ApiError::unauthorized(
            "missing `Authorization: Bearer <admin key>`",
        )),
    }
}

#[derive(Debug, Deserialize)]
struct StatusFilter {
    status: Option<String>,
    limit: Option<usize>,
}

async fn list_approvals(
    State(gate): State<Arc<Gate>>,
    headers: HeaderMap,
    Query(filter): Query<StatusFilter>,
) -> Result<Response, ApiError> {
    admin(&gate, &headers)?;
    let list = gate.approvals(filter.status.as_deref()).await;
    Ok(ok(json!({"approvals": list})))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    /// The person deciding (required; checked by [`ApproverName::parse`]).
    #[serde(default)]
    approver: Option<Value>,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    approver_token: Option<String>,
}

/// The approver name of an admin decision: a 400 naming the field when it is missing or not a
/// printable string.
fn approver_name(value: Option<&Value>) -> Result<ApproverName, ApiError> {
    match value {
        None | Some(Value::Null) => Err(ApiError::bad_request(
            "`approver` is required: name the person approving or rejecting (it is recorded \
             in the audit log)",
        )),
        Some(Value::String(name)) => ApproverName::parse(name),
        Some(other) => Err(ApiError::bad_request(format!(
            "`approver` must be a string, got {}",
            crate::request::json_kind(other)
        ))),
    }
}

async fn resolve(
    gate: &Gate,
    headers: &HeaderMap,
    reference: &str,
    body: &Bytes,
    resolution: Resolution,
) -> Result<Response, ApiError> {
    admin(gate, headers)?;
    let body: ResolveBody = if body.is_empty() {
        ResolveBody::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::unprocessable(format!("the body is not a valid request: {e}")))?
    };
    let name = approver_name(body.approver.as_ref())?;
    let view = gate
        .resolve(
            reference,
            resolution,
            &name,
            body.approver_token.as_deref(),
            body.comment,
        )
        .await?;
    Ok(ok(view))
}

async fn approve(
    State(gate): State<Arc<Gate>>,
    Path(reference): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    resolve(&gate, &headers, &reference, &body, Resolution::Approve).await
}

async fn reject(
    State(gate): State<Arc<Gate>>,
    Path(reference): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    resolve(&gate, &headers, &reference, &body, Resolution::Reject).await
}

async fn list_decisions(
    State(gate): State<Arc<Gate>>,
    headers: HeaderMap,
    Query(filter): Query<StatusFilter>,
) -> Result<Response, ApiError> {
    admin(&gate, &headers)?;
    let list = gate
        .decisions(filter.limit.unwrap_or(100).min(10_000))
        .await;
    Ok(ok(json!({"decisions": list})))
}

async fn audit(State(gate): State<Arc<Gate>>, headers: HeaderMap) -> Result<Response, ApiError> {
    admin(&gate, &headers)?;
    let events = gate.audit().await?;
    let body = crate::service::audit_jsonl(&events)
        .map_err(|e| ApiError::internal(format!("encoding an audit event: {e}")))?;
    Ok(with_request_id(
        ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response(),
    ))
}

async fn list_mandates(
    State(gate): State<Arc<Gate>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&gate, &headers)?;
    Ok(ok(json!({"mandates": gate.mandates().await})))
}

async fn policy_reveal(
    State(gate): State<Arc<Gate>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&gate, &headers)?;
    gate.policy_reveal()
        .cloned()
        .map(ok)
        .ok_or_else(|| ApiError::not_found("this gate has no policy commitment"))
}

async fn mandate_reveal(
    State(gate): State<Arc<Gate>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&gate, &headers)?;
    gate.mandate_reveal(&id)
        .cloned()
        .map(ok)
        .ok_or_else(|| ApiError::not_found(format!("mandate `{id}` not found")))
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}
