//! The routing routes: the sidecar (`ANY /{tool}/{path}`) and the Cloud Gateway
//! (`ANY /gw/{tool}/{path}`), the "no key in the agent" model of the walkthrough (§1.10–1.11).
//!
//! The agent sends its ordinary provider request here. The gate decides it like a
//! `POST /v1/control/decisions`, and on allow forwards it to the tool's upstream with the
//! vaulted credential injected, returns the provider's response as is, and completes the
//! decision from the provider's status.
//!
//! # Who may call
//! - **Sidecar**: no key and no signature (the SDK sends none; the sidecar holds the control
//!   key). Off unless `routing.sidecar.agents` lists the agents it serves; `X-Agent-Id` must
//!   name one of them (else 403 `IDENTITY_NOT_RESOLVED`). Meant for a loopback or private
//!   listener, like the real sidecar: any local process may use it for those agents, and only
//!   through the decisions of the configured policy and mandates.
//! - **Gateway**: the bearer key and signatures exactly as on the control API (401 otherwise).
//!   The agent is the key's bound agent, else `X-Agent-Id` (the SDK's gateway client sends
//!   none, so use an agent-bound `rgnt_agt_…` key).
//!
//! # The decision request built from a call
//! `tool` from the path; `action` and `context.op` from the tool's `operation_map` (an
//! unmapped method and path is decided as action `unmapped <METHOD> /<path>`, which no catalog
//! exposes: `TOOL_NOT_ALLOWED`); the amount, currency, reference, reference amount and
//! resource from the named body fields, **overriding** anything the agent put in
//! `X-Agent-Facts` under those names (and `op`); the rest of the facts, `X-Agent-Intent`,
//! `X-Agent-User-Token` and the facts' `idempotency_key` as on the control API; `args` binds
//! the method, path, query and body.
//!
//! # Answers
//! | Outcome | Status | Body |
//! |---|---|---|
//! | allow | the provider's | the provider's (with its `content-type`); `x-regent-decision-id` |
//! | deny | 403 (429 for `VELOCITY_EXCEEDED`) | the decision: `{decision, decision_id, code, reason}` |
//! | escalate | 403 | the decision with `code: ESCALATION_REQUIRED` and `escalation` |
//! | upstream unreachable / too large / token endpoint down | 502 (504 on timeout) | `{decision: "deny", code: "INTERNAL_ERROR", reason, decision_id}`; the decision is completed as failed |
//! | retry of an allow already forwarded | the stored provider answer (`x-regent-replayed: true`), or 409 `DUPLICATE_REQUEST` when this process no longer holds it or the outcome is unknown after a restart |
//!
//! Refusals are never 2xx (§1.15), and the published SDK turns them into its typed errors.
//!
//! # Forwarded once
//! An allowed decision is forwarded at most once. A retry with the same idempotency key gets
//! the same `decision_id` from the engine (§1.14); the routing layer then answers with the
//! stored provider response instead of calling the provider again, or, when this process no
//! longer holds it (restarted, or evicted from the bounded store of
//! [`MAX_STORED_OUTCOMES`]), with a 409 `DUPLICATE_REQUEST` refusal. A concurrent retry while
//! the first call is in flight also gets the 409. A decision completed as failed (provider
//! non-2xx, unreachable, timeout) is decided afresh by the engine on retry, so it may be
//! forwarded again: the provider receives the agent's `Idempotency-Key` to de-duplicate a
//! timed-out call it did perform.
//!
//! A gate that stops between forwarding a call and completing its decision (crash, `kill -9`)
//! cannot know whether the provider acted. The decision event records that it was decided on
//! a routing route (`routed: true`), so after the restart an uncompleted routed allow is
//! [`ForwardState::OutcomeUnknown`]: a retry gets a 409 `DUPLICATE_REQUEST` saying so, and the
//! call is forwarded again only after someone with the org key checks with the provider and
//! completes the decision as `failed` (a `success` completion keeps the retry answered).
//!
//! # Headers
//! Stripped before forwarding: `Authorization`, `Proxy-Authorization`, `Cookie`, every
//! `X-Agent-*` header (id, user token, intent, facts, signatures), `Signature`,
//! `Signature-Input`, `Content-Digest`, `Host`, hop-by-hop headers, `Accept-Encoding` (the
//! provider's body is returned with its `content-type` only, so it must not be compressed), and
//! the credential's own header. Injected: the credential, and `Idempotency-Key` when the agent sent one.
//! Credentials never appear in logs, errors, audit events or responses.

pub mod config;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use base64::Engine as _;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Map, Value, json};

use self::config::{Credential, Operation, RoutingSettings, Upstream};
use crate::engine::{Caller, ForwardState, Gate, codes};
use crate::error::ApiError;
use crate::request::DecisionRequest;
use crate::signing::{Assertion, SignedRequest};

/// How many forwarded outcomes are kept to answer retries (oldest evicted first).
pub const MAX_STORED_OUTCOMES: usize = 10_000;
/// The largest `X-Agent-Facts`, `X-Agent-Intent` or `X-Agent-User-Token` value (bytes).
pub const MAX_AGENT_HEADER_BYTES: usize = 16 * 1024;
/// The largest OAuth2 token response read (bytes).
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;
/// Refresh an OAuth2 token this long before it expires (seconds).
const TOKEN_SKEW_SECONDS: u64 = 30;

/// Which family of routes a call came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sidecar,
    Gateway,
}

/// The parts of one routed HTTP request.
#[derive(Debug, Clone, Copy)]
struct Call<'a> {
    kind: Kind,
    tool: &'a str,
    /// The path after the tool, without the leading `/`.
    path: &'a str,
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
}

#[derive(Debug, Clone)]
struct Stored {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: Bytes,
}

#[derive(Debug)]
enum Slot {
    InFlight,
    Done(Stored),
}

#[derive(Debug, Default)]
struct Outcomes {
    slots: HashMap<String, Slot>,
    order: VecDeque<String>,
}

#[derive(Debug)]
struct CachedToken {
    token: SecretString,
    until: Instant,
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The routing layer's state: the gate, the upstream client, the opened vault, the OAuth2
/// token cache and the forwarded outcomes.
pub struct Routing {
    gate: Arc<Gate>,
    client: Result<HttpClient, String>,
    secrets: Result<BTreeMap<String, SecretString>, String>,
    tokens: BTreeMap<String, tokio::sync::Mutex<Option<CachedToken>>>,
    outcomes: StdMutex<Outcomes>,
    token_fetches: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing")
            .field(
                "secrets",
                &self.secrets.as_ref().map(|s| s.keys().collect::<Vec<_>>()),
            )
            .finish_non_exhaustive()
    }
}

/// The vault entries the configured upstreams need.
fn needed_secrets(gate: &Gate) -> Vec<&str> {
    let mut names: Vec<&str> = gate
        .settings()
        .tools
        .iter()
        .flat_map(|t| t.values())
        .filter_map(|t| t.upstream.as_ref()?.credential.as_ref())
        .map(Credential::secret_name)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Opens the vault entries the configuration needs: the start-up check of `mock-gate`, so a
/// missing key or secret fails the start instead of every routed call.
///
/// # Errors
/// The vault's error (names and paths only, never values).
pub fn preflight(gate: &Gate) -> Result<(), crate::vault::VaultError> {
    open_secrets(gate).map(|_| ())
}

fn open_secrets(gate: &Gate) -> Result<BTreeMap<String, SecretString>, crate::vault::VaultError> {
    let names = needed_secrets(gate);
    match gate
        .settings()
        .routing
        .as_ref()
        .and_then(|r| r.vault.as_ref())
    {
        Some(vault) if !names.is_empty() => {
            crate::vault::open(vault, &gate.settings().org_id, &names)
        }
        _ => Ok(BTreeMap::new()),
    }
}

/// The upstream client: `https://` with rustls (the system's trust anchors plus
/// `routing.ca_file`), and `http://` where the configuration allowed it. `Err` names why TLS
/// cannot be set up (every routed call is then a 502 saying so).
fn https_client(routing: Option<&RoutingSettings>) -> Result<HttpClient, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::warn!("reading the system's trust anchors: {e}");
    }
    let (_, unparsable) = roots.add_parsable_certificates(native.certs);
    if unparsable > 0 {
        tracing::warn!(unparsable, "system trust anchors skipped");
    }
    if let Some(routing) = routing {
        for cert in &routing.ca_certs {
            roots
                .add(cert.clone())
                .map_err(|e| format!("a certificate of `routing.ca_file` is not usable: {e}"))?;
        }
        if routing.allow_insecure_http {
            tracing::warn!(
                "routing.allow_insecure_http: vaulted credentials may be sent in clear over http://"
            );
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS cannot be set up: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// An error and its sources, `: `-joined (hyper's own message says only "client error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

impl Routing {
    /// The routing state of `gate` (a vault that does not open makes every routed call a
    /// 503 naming the problem; [`preflight`] reports it at start).
    #[must_use]
    pub fn new(gate: Arc<Gate>) -> Self {
        let secrets = open_secrets(&gate).map_err(|e| e.to_string());
        let tokens = gate
            .settings()
            .tools
            .iter()
            .flat_map(|t| t.iter())
            .filter(|(_, t)| {
                matches!(
                    t.upstream.as_ref().and_then(|u| u.credential.as_ref()),
                    Some(Credential::OAuth2 { .. })
                )
            })
            .map(|(name, _)| (name.clone(), tokio::sync::Mutex::new(None)))
            .collect();
        let client = https_client(gate.settings().routing.as_ref());
        Self {
            gate,
            client,
            secrets,
            tokens,
            outcomes: StdMutex::new(Outcomes::default()),
            token_fetches: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many OAuth2 tokens were fetched (each cache miss counts one).
    #[must_use]
    pub fn token_fetches(&self) -> u64 {
        self.token_fetches
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The routing routes of `gate` (merged into [`crate::router`]).
pub fn router(gate: Arc<Gate>) -> Router {
    router_with(Arc::new(Routing::new(gate)))
}

/// The routing routes over an existing [`Routing`] (tests read its counters).
pub fn router_with(routing: Arc<Routing>) -> Router {
    let limit = routing
        .gate
        .settings()
        .routing
        .as_ref()
        .map_or(1024 * 1024, |r| r.max_request_bytes);
    Router::new()
        .route("/license/validate", post(license))
        .route("/heartbeat", post(heartbeat))
        .route("/gw/{tool}/{*path}", any(gateway))
        .route("/gw/{tool}/", any(gateway_root))
        .route("/{tool}/{*path}", any(sidecar))
        .route("/{tool}/", any(sidecar_root))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(routing)
}

async fn license() -> Response {
    axum::Json(json!({"valid": true, "tier": "dev"})).into_response()
}

async fn heartbeat() -> Response {
    axum::Json(json!({"ok": true, "tier": "dev"})).into_response()
}

/// The answer of the dev mock to the real sidecar binary's licence and heartbeat calls,
/// whatever their prefix (the mock matches on the suffix too).
fn sidecar_housekeeping(method: &Method, path: &str) -> Option<Response> {
    if *method != Method::POST {
        return None;
    }
    if path.ends_with("/license/validate") {
        return Some(axum::Json(json!({"valid": true, "tier": "dev"})).into_response());
    }
    if path.ends_with("/heartbeat") {
        return Some(axum::Json(json!({"ok": true, "tier": "dev"})).into_response());
    }
    None
}

async fn sidecar(
    State(r): State<Arc<Routing>>,
    Path((tool, path)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = Call {
        kind: Kind::Sidecar,
        tool: &tool,
        path: &path,
        method: &method,
        uri: &uri,
        headers: &headers,
    };
    handle(&r, call, body).await
}

async fn sidecar_root(
    State(r): State<Arc<Routing>>,
    Path(tool): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = Call {
        kind: Kind::Sidecar,
        tool: &tool,
        path: "",
        method: &method,
        uri: &uri,
        headers: &headers,
    };
    handle(&r, call, body).await
}

async fn gateway(
    State(r): State<Arc<Routing>>,
    Path((tool, path)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = Call {
        kind: Kind::Gateway,
        tool: &tool,
        path: &path,
        method: &method,
        uri: &uri,
        headers: &headers,
    };
    handle(&r, call, body).await
}

async fn gateway_root(
    State(r): State<Arc<Routing>>,
    Path(tool): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = Call {
        kind: Kind::Gateway,
        tool: &tool,
        path: "",
        method: &method,
        uri: &uri,
        headers: &headers,
    };
    handle(&r, call, body).await
}

fn with_request_id(mut response: Response) -> Response {
    if let Ok(id) = HeaderValue::from_str(&format!("req_{}", uuid::Uuid::new_v4().simple())) {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

/// A refusal envelope: the decision itself, with a 4xx status.
fn envelope(status: StatusCode, mut decision: Value) -> Response {
    if let Some(obj) = decision.as_object_mut() {
        obj.remove("token");
        obj.remove("expires_at");
        obj.remove("obligations");
    }
    with_request_id((status, axum::Json(decision)).into_response())
}

/// A refusal that no recorded decision stands behind (identity of the sidecar caller).
fn refusal(status: StatusCode, code: &str, reason: String) -> Response {
    envelope(
        status,
        json!({"decision": "deny", "decision_id": null, "code": code, "reason": reason}),
    )
}

/// The 5xx envelope of an allowed call that could not be performed.
fn upstream_failure(status: StatusCode, decision_id: &str, reason: &str) -> Response {
    envelope(
        status,
        json!({
            "decision": "deny", "decision_id": decision_id, "code": "INTERNAL_ERROR",
            "reason": reason, "detail": reason,
        }),
    )
}

fn header_text(headers: &HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(name) else {
        return Ok(None);
    };
    if v.len() > MAX_AGENT_HEADER_BYTES {
        return Err(ApiError::bad_request(format!(
            "`{name}` has {} bytes; the limit is {MAX_AGENT_HEADER_BYTES}",
            v.len()
        )));
    }
    v.to_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| ApiError::bad_request(format!("`{name}` is not visible ASCII")))
}

fn header_values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect()
}

/// A dotted field of a JSON body.
fn field<'a>(body: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(body, |v, part| v.get(part))
        .filter(|v| !v.is_null())
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The decision request of a routed call.
fn decision_request(
    call: Call<'_>,
    agent: &str,
    body: &[u8],
    operation: Option<&Operation>,
    mandate: Option<&str>,
) -> Result<DecisionRequest, ApiError> {
    let Call {
        tool,
        path,
        method,
        uri,
        headers,
        ..
    } = call;
    let mut context = match header_text(headers, "x-agent-facts")? {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(map)) => map,
            Ok(_) | Err(_) => {
                return Err(ApiError::bad_request(
                    "`X-Agent-Facts` must be a JSON object",
                ));
            }
        },
    };
    if let Some(intent) = header_text(headers, "x-agent-intent")? {
        context.insert("intent".into(), json!(intent));
    }
    if let Some(token) = header_text(headers, "x-agent-user-token")? {
        context.insert("user_token".into(), json!(token));
    }
    // What the call itself says wins over what the agent asserts about it: the operation and
    // the mandate always come from the configuration, the money fields from the body when the
    // operation map names them.
    context.remove("op");
    context.remove("mandate_id");
    if let Some(o) = operation {
        if o.amount_field.is_some() {
            for name in ["amount", "amount_usd", "currency"] {
                context.remove(name);
            }
        }
        if o.reference_field.is_some() {
            context.remove("reference");
        }
        if o.reference_amount_field.is_some() {
            context.remove("reference_amount");
        }
    }
    let parsed: Option<Value> = if body.is_empty() {
        None
    } else {
        serde_json::from_slice(body).ok()
    };
    let needs_body = |what: &str, name: &str| {
        ApiError::unprocessable(format!(
            "the operation_map of `{tool}` takes the {what} from the JSON body field `{name}`, \
             which the request does not have"
        ))
    };
    let mut resource = None;
    let action = match operation {
        None => format!("unmapped {method} /{path}"),
        Some(o) => {
            context.insert("op".into(), json!(o.op));
            if let Some(name) = &o.amount_field {
                let v = parsed
                    .as_ref()
                    .and_then(|b| field(b, name))
                    .ok_or_else(|| needs_body("amount", name))?;
                context.insert("amount".into(), v.clone());
                let currency = match &o.currency_field {
                    Some(c) => parsed
                        .as_ref()
                        .and_then(|b| field(b, c))
                        .and_then(scalar_text)
                        .or_else(|| o.currency.clone()),
                    None => o.currency.clone(),
                };
                context.insert(
                    "currency".into(),
                    json!(currency.unwrap_or_else(|| "USD".into())),
                );
            }
            if let Some(name) = &o.reference_field {
                let v = parsed
                    .as_ref()
                    .and_then(|b| field(b, name))
                    .and_then(scalar_text)
                    .ok_or_else(|| needs_body("reference", name))?;
                context.insert("reference".into(), json!(v));
            }
            if let Some(name) = &o.reference_amount_field {
                let v = parsed
                    .as_ref()
                    .and_then(|b| field(b, name))
                    .ok_or_else(|| needs_body("reference amount", name))?;
                context.insert("reference_amount".into(), v.clone());
            }
            if let Some(name) = &o.resource_field {
                resource = parsed
                    .as_ref()
                    .and_then(|b| field(b, name))
                    .and_then(scalar_text);
            }
            o.action.clone()
        }
    };
    if let Some(m) = mandate {
        context.insert("mandate_id".into(), json!(m));
    }
    let body_arg = match &parsed {
        Some(v) => v.clone(),
        None if body.is_empty() => Value::Null,
        None => json!({"sha256": crate::canonical::sha256_hex(body)}),
    };
    Ok(DecisionRequest {
        agent_id: agent.to_owned(),
        tool: tool.to_owned(),
        action,
        resource,
        args: json!({
            "method": method.as_str(),
            "path": format!("/{path}"),
            "query": uri.query(),
            "body": body_arg,
        }),
        context,
    })
}

/// Who is calling, per route family.
/// Why a caller is not let through: a control-API error, or a refusal envelope.
enum Refused {
    Api(ApiError),
    Envelope(StatusCode, &'static str, String),
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

fn identify(r: &Routing, call: Call<'_>, body: &[u8]) -> Result<(Caller, String), Refused> {
    let Call {
        kind,
        method,
        uri,
        headers,
        ..
    } = call;
    let settings = r.gate.settings();
    let Some(routing) = settings.routing.as_ref() else {
        return Err(ApiError::not_found(format!(
            "no route for {} (this gate has no `routing` section)",
            uri.path()
        ))
        .into());
    };
    let agent_header = header_text(headers, "x-agent-id")?;
    match kind {
        Kind::Sidecar => {
            let Some(agents) = routing.sidecar_agents.as_ref() else {
                return Err(ApiError::not_found(format!(
                    "no route for {} (the sidecar routes are off: `routing.sidecar`)",
                    uri.path()
                ))
                .into());
            };
            let Some(agent) = agent_header else {
                return Err(Refused::Envelope(
                    StatusCode::FORBIDDEN,
                    codes::IDENTITY_NOT_RESOLVED,
                    "the sidecar needs `X-Agent-Id` (SidecarSession(agent_id=…))".into(),
                ));
            };
            if !agents.contains(&agent) {
                return Err(Refused::Envelope(
                    StatusCode::FORBIDDEN,
                    codes::IDENTITY_NOT_RESOLVED,
                    format!("agent `{agent}` is not served by this sidecar"),
                ));
            }
            Ok((
                Caller {
                    api_key: String::new(),
                    bound_agent: Some(agent.clone()),
                    key_label: Some("sidecar".into()),
                    assertion: Assertion::Sidecar,
                },
                agent,
            ))
        }
        Kind::Gateway => {
            if !routing.gateway {
                return Err(ApiError::not_found(format!(
                    "no route for {} (the gateway routes are off: `routing.gateway`)",
                    uri.path()
                ))
                .into());
            }
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    v.strip_prefix("Bearer ")
                        .or_else(|| v.strip_prefix("bearer "))
                });
            let mut caller = r.gate.authenticate_key(bearer)?;
            let Some(agent) = agent_header.or_else(|| caller.bound_agent.clone()) else {
                return Err(ApiError::bad_request(
                    "the gateway needs an agent: use an agent-bound key (rgnt_agt_…) or send \
                     `X-Agent-Id`",
                )
                .into());
            };
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let lookup = |name: &str| header_values(headers, name);
            r.gate.verify_signature(
                &mut caller,
                &agent,
                &SignedRequest {
                    method: method.as_str(),
                    authority: &host,
                    path: uri.path(),
                    header: &lookup,
                    body,
                },
            )?;
            Ok((caller, agent))
        }
    }
}

async fn handle(r: &Routing, call: Call<'_>, body: Bytes) -> Response {
    let Call {
        tool,
        path,
        method,
        uri,
        headers,
        ..
    } = call;
    if let Some(answer) = sidecar_housekeeping(method, uri.path()) {
        return answer;
    }
    let (caller, agent) = match identify(r, call, &body) {
        Ok(v) => v,
        Err(Refused::Api(e)) => return e.into_response(),
        Err(Refused::Envelope(status, code, reason)) => return refusal(status, code, reason),
    };
    let settings = r.gate.settings();
    let tool_settings = settings.tools.as_ref().and_then(|t| t.get(tool));
    let upstream = tool_settings.and_then(|t| t.upstream.as_ref());
    if tool_settings.is_some() && upstream.is_none() {
        return ApiError::not_found(format!(
            "tool `{tool}` has no `upstream`: it cannot be routed"
        ))
        .into_response();
    }
    let operation = upstream.and_then(|u| u.operation(method, path));
    let request = match decision_request(
        call,
        &agent,
        &body,
        operation,
        tool_settings.and_then(|t| t.mandate.as_deref()),
    ) {
        Ok(req) => req,
        Err(e) => return e.into_response(),
    };
    let decision = match r.gate.decide_without_token(&caller, request).await {
        Ok(d) => d,
        Err(e) => return e.into_response(),
    };
    let verdict = decision.get("decision").and_then(Value::as_str);
    let decision_id = decision
        .get("decision_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match verdict {
        Some("allow") => {}
        Some(_) => {
            let status =
                if decision.get("code").and_then(Value::as_str) == Some(codes::VELOCITY_EXCEEDED) {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::FORBIDDEN
                };
            tracing::info!(%tool, %agent, %decision_id, code = ?decision.get("code"), "routed call refused");
            return envelope(status, decision);
        }
        None => {
            return ApiError::internal("the decision has no verdict").into_response();
        }
    }
    // Allowed: an upstream was mapped, or the engine would have refused the unmapped action.
    let (Some(upstream), Some(operation)) = (upstream, operation) else {
        return upstream_failure(
            StatusCode::BAD_GATEWAY,
            &decision_id,
            "allowed, but the call maps to no upstream operation",
        );
    };
    match claim(r, &decision_id, &r.gate).await {
        Claim::Forward => {}
        Claim::Stored(stored) => {
            let mut response = stored_response(&stored, &decision_id);
            response
                .headers_mut()
                .insert("x-regent-replayed", HeaderValue::from_static("true"));
            return response;
        }
        Claim::Refuse(reason) => {
            return refusal_for(StatusCode::CONFLICT, &decision_id, &reason);
        }
    }
    let idempotency = decision_idempotency(headers);
    let outcome = forward(r, call, upstream, body, idempotency).await;
    let (status, error, downstream_ref, response) = match outcome {
        Ok(stored) => {
            let ok = stored.status.is_success();
            let downstream = if ok {
                operation.response_id_field.as_deref().and_then(|f| {
                    serde_json::from_slice::<Value>(&stored.body)
                        .ok()
                        .and_then(|b| field(&b, f).and_then(scalar_text))
                })
            } else {
                None
            };
            let error = (!ok).then(|| format!("the provider answered {}", stored.status.as_u16()));
            let response = stored_response(&stored, &decision_id);
            finish(r, &decision_id, Some(stored));
            (
                if ok { "success" } else { "failed" },
                error,
                downstream,
                response,
            )
        }
        Err((status, reason)) => {
            finish(r, &decision_id, None);
            (
                "failed",
                Some(reason.clone()),
                None,
                upstream_failure(status, &decision_id, &reason),
            )
        }
    };
    let complete = json!({"status": status, "downstream_ref": downstream_ref, "error": error});
    match serde_json::to_vec(&complete) {
        Ok(bytes) => {
            if let Err(e) = r.gate.complete(&caller, &decision_id, &bytes).await {
                tracing::error!(%decision_id, detail = %e.detail, "completing a routed call failed");
            }
        }
        Err(e) => tracing::error!(%decision_id, "encoding a completion: {e}"),
    }
    tracing::info!(%tool, %agent, %decision_id, op = %operation.op, outcome = status, "routed call");
    response
}

fn refusal_for(status: StatusCode, decision_id: &str, reason: &str) -> Response {
    envelope(
        status,
        json!({"decision": "deny", "decision_id": decision_id,
               "code": codes::DUPLICATE_REQUEST, "reason": reason}),
    )
}

fn decision_idempotency(headers: &HeaderMap) -> Option<HeaderValue> {
    let facts = headers.get("x-agent-facts")?.to_str().ok()?;
    let value: Value = serde_json::from_str(facts).ok()?;
    let key = value.get("idempotency_key")?.as_str()?;
    HeaderValue::from_str(key).ok()
}

enum Claim {
    Forward,
    Stored(Stored),
    Refuse(String),
}

/// Claims the right to forward `decision_id` (once), or finds its outcome.
async fn claim(r: &Routing, decision_id: &str, gate: &Gate) -> Claim {
    {
        let Ok(mut outcomes) = r.outcomes.lock() else {
            return Claim::Refuse("the outcome store is unavailable".into());
        };
        match outcomes.slots.get(decision_id) {
            Some(Slot::Done(stored)) => return Claim::Stored(stored.clone()),
            Some(Slot::InFlight) => {
                return Claim::Refuse(format!(
                    "decision {decision_id} is being forwarded by an earlier request with the \
                     same idempotency key; wait for its answer"
                ));
            }
            None => {}
        }
        outcomes
            .slots
            .insert(decision_id.to_owned(), Slot::InFlight);
        outcomes.order.push_back(decision_id.to_owned());
        while outcomes.order.len() > MAX_STORED_OUTCOMES {
            if let Some(old) = outcomes.order.pop_front() {
                outcomes.slots.remove(&old);
            }
        }
    }
    match gate.forward_state(decision_id).await {
        ForwardState::Open => Claim::Forward,
        ForwardState::Completed(_) => {
            // Completed before this process held its outcome: never forward it again.
            finish_keep_refusal(r, decision_id);
            Claim::Refuse(format!(
                "decision {decision_id} was already forwarded and completed; its response is no \
                 longer held by this gate (use a new idempotency key for a new call)"
            ))
        }
        ForwardState::OutcomeUnknown => {
            finish_keep_refusal(r, decision_id);
            tracing::warn!(
                %decision_id,
                "a retry of a routed call the gate may have forwarded before it stopped: refused \
                 until the decision is completed"
            );
            Claim::Refuse(format!(
                "decision {decision_id} may have been forwarded before the gate restarted and its \
                 outcome is unknown, so it is not forwarded again; check with the provider, then \
                 complete the decision with the org key (`failed` lets this retry through, \
                 `success` keeps it answered)"
            ))
        }
        ForwardState::Unknown => {
            finish_keep_refusal(r, decision_id);
            Claim::Refuse(format!("decision {decision_id} is not recorded"))
        }
    }
}

/// Drops the in-flight claim of a decision that must not be forwarded.
fn finish_keep_refusal(r: &Routing, decision_id: &str) {
    if let Ok(mut outcomes) = r.outcomes.lock() {
        outcomes.slots.remove(decision_id);
    }
}

/// Records the outcome of a forwarded decision (`None`: the call failed before an answer; the
/// claim is dropped, and the engine decides a retry afresh since the decision is failed).
fn finish(r: &Routing, decision_id: &str, stored: Option<Stored>) {
    if let Ok(mut outcomes) = r.outcomes.lock() {
        match stored {
            Some(s) => {
                outcomes.slots.insert(decision_id.to_owned(), Slot::Done(s));
            }
            None => {
                outcomes.slots.remove(decision_id);
            }
        }
    }
}

fn stored_response(stored: &Stored, decision_id: &str) -> Response {
    let mut response = (stored.status, stored.body.clone()).into_response();
    if let Some(ct) = &stored.content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, ct.clone());
    }
    if let Ok(id) = HeaderValue::from_str(decision_id) {
        response.headers_mut().insert("x-regent-decision-id", id);
    }
    response
}

/// Whether a caller header is dropped before forwarding.
fn stripped(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("x-agent-")
        || n.starts_with("proxy-")
        || matches!(
            n,
            "authorization"
                | "cookie"
                | "host"
                | "signature"
                | "signature-input"
                | "content-digest"
                | "content-length"
                | "connection"
                | "keep-alive"
                | "te"
                | "trailer"
                | "transfer-encoding"
                | "upgrade"
                | "idempotency-key"
                | "accept-encoding"
                | "x-regent-decision-id"
        )
}

type Failure = (StatusCode, String);

async fn forward(
    r: &Routing,
    call: Call<'_>,
    upstream: &Upstream,
    body: Bytes,
    idempotency: Option<HeaderValue>,
) -> Result<Stored, Failure> {
    let Call {
        tool,
        path,
        method,
        uri,
        headers,
        ..
    } = call;
    let Some(routing) = r.gate.settings().routing.as_ref() else {
        return Err((StatusCode::BAD_GATEWAY, "routing is not configured".into()));
    };
    let mut url = format!("{}/{path}", upstream.base_url);
    if let Some(q) = uri.query() {
        url.push('?');
        url.push_str(q);
    }
    let mut out = HeaderMap::new();
    let credential_header = match &upstream.credential {
        Some(Credential::StaticHeader { header, .. }) => Some(header.clone()),
        _ => None,
    };
    for (name, value) in headers {
        if stripped(name) || credential_header.as_ref() == Some(name) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(key) = idempotency {
        out.insert("idempotency-key", key);
    }
    let deadline = tokio::time::Instant::now() + routing.upstream_timeout;
    if let Some(credential) = &upstream.credential {
        let (name, value) = credential_header_value(r, tool, credential, deadline).await?;
        out.insert(name, value);
    }
    let mut request = Request::builder()
        .method(method.clone())
        .uri(&url)
        .body(Full::new(body))
        .map_err(|e| {
            (
                StatusCode::BAD_GATEWAY,
                format!("the upstream request for `{tool}` cannot be built: {e}"),
            )
        })?;
    *request.headers_mut() = out;
    let max = routing.max_response_bytes;
    let exchange = async {
        let client = r
            .client
            .as_ref()
            .map_err(|e| (StatusCode::BAD_GATEWAY, e.clone()))?;
        let response = client.request(request).await.map_err(|e| {
            (
                StatusCode::BAD_GATEWAY,
                format!("upstream `{tool}` is unreachable: {}", error_chain(&e)),
            )
        })?;
        let (parts, body) = response.into_parts();
        let bytes = Limited::new(body, max)
            .collect()
            .await
            .map_err(|e| {
                let message = if e.is::<http_body_util::LengthLimitError>() {
                    format!("upstream `{tool}` answered more than {max} bytes")
                } else {
                    format!("reading the answer of upstream `{tool}` failed: {e}")
                };
                (StatusCode::BAD_GATEWAY, message)
            })?
            .to_bytes();
        Ok::<_, Failure>(Stored {
            status: parts.status,
            content_type: parts.headers.get(header::CONTENT_TYPE).cloned(),
            body: bytes,
        })
    };
    let stored = tokio::time::timeout_at(deadline, exchange)
        .await
        .map_err(|_| {
            (
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "upstream `{tool}` did not answer within {} ms",
                    routing.upstream_timeout.as_millis()
                ),
            )
        })??;
    if stored.status == StatusCode::UNAUTHORIZED
        && let Some(slot) = r.tokens.get(tool)
    {
        // A token the provider no longer accepts is fetched again next time.
        *slot.lock().await = None;
    }
    Ok(stored)
}

/// The header carrying the credential, per kind.
async fn credential_header_value(
    r: &Routing,
    tool: &str,
    credential: &Credential,
    deadline: tokio::time::Instant,
) -> Result<(HeaderName, HeaderValue), Failure> {
    let secrets = r.secrets.as_ref().map_err(|e| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the credential vault cannot be opened: {e}"),
        )
    })?;
    let secret = secrets.get(credential.secret_name()).ok_or_else(|| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("vault secret `{}` is not loaded", credential.secret_name()),
        )
    })?;
    let sensitive = |text: String| {
        HeaderValue::from_str(&text)
            .map(|mut v| {
                v.set_sensitive(true);
                v
            })
            .map_err(|_| {
                (
                    StatusCode::BAD_GATEWAY,
                    format!("the credential of `{tool}` is not a valid header value"),
                )
            })
    };
    match credential {
        Credential::StaticHeader { header, .. } => Ok((
            header.clone(),
            sensitive(secret.expose_secret().to_owned())?,
        )),
        Credential::Bearer { .. } => Ok((
            header::AUTHORIZATION,
            sensitive(format!("Bearer {}", secret.expose_secret()))?,
        )),
        Credential::OAuth2 {
            token_url,
            client_id,
            scope,
            ..
        } => {
            let token = oauth2_token(
                r,
                tool,
                token_url,
                client_id,
                secret,
                scope.as_deref(),
                deadline,
            )
            .await?;
            Ok((
                header::AUTHORIZATION,
                sensitive(format!("Bearer {}", token.expose_secret()))?,
            ))
        }
    }
}

/// An OAuth2 client-credentials token, from the cache while it is fresh.
async fn oauth2_token(
    r: &Routing,
    tool: &str,
    token_url: &str,
    client_id: &str,
    secret: &SecretString,
    scope: Option<&str>,
    deadline: tokio::time::Instant,
) -> Result<SecretString, Failure> {
    let Some(slot) = r.tokens.get(tool) else {
        return Err((
            StatusCode::BAD_GATEWAY,
            format!("no token cache for `{tool}`"),
        ));
    };
    // One fetch at a time per tool: concurrent calls wait for it and share the token.
    let mut cached = slot.lock().await;
    if let Some(c) = cached.as_ref()
        && Instant::now() < c.until
    {
        return Ok(c.token.clone());
    }
    r.token_fetches
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let fail = |m: String| (StatusCode::BAD_GATEWAY, m);
    let basic = base64::engine::general_purpose::STANDARD
        .encode(format!("{client_id}:{}", secret.expose_secret()));
    let mut authorization = HeaderValue::from_str(&format!("Basic {basic}")).map_err(|_| {
        fail(format!(
            "the client secret of `{tool}` is not a header value"
        ))
    })?;
    authorization.set_sensitive(true);
    let mut form = "grant_type=client_credentials".to_owned();
    if let Some(s) = scope {
        form.push_str("&scope=");
        form.push_str(&s.replace(' ', "+").replace('/', "%2F").replace(':', "%3A"));
    }
    let request = Request::builder()
        .method(Method::POST)
        .uri(token_url)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, "application/json")
        .header(header::AUTHORIZATION, authorization)
        .body(Full::new(Bytes::from(form)))
        .map_err(|e| {
            fail(format!(
                "the token request of `{tool}` cannot be built: {e}"
            ))
        })?;
    let exchange = async {
        let client = r.client.as_ref().map_err(|e| fail(e.clone()))?;
        let response = client.request(request).await.map_err(|e| {
            fail(format!(
                "the token endpoint of `{tool}` is unreachable: {}",
                error_chain(&e)
            ))
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_TOKEN_RESPONSE)
            .collect()
            .await
            .map_err(|_| {
                fail(format!(
                    "the token answer of `{tool}` is unreadable or too large"
                ))
            })?
            .to_bytes();
        // The body is not quoted back: a token endpoint may echo what it was sent.
        if !status.is_success() {
            return Err(fail(format!(
                "the token endpoint of `{tool}` answered {}",
                status.as_u16()
            )));
        }
        let parsed: Value = serde_json::from_slice(&body)
            .map_err(|_| fail(format!("the token answer of `{tool}` is not JSON")))?;
        let token = parsed
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| fail(format!("the token answer of `{tool}` has no access_token")))?;
        let lifetime = parsed
            .get("expires_in")
            .and_then(Value::as_u64)
            .unwrap_or(300);
        Ok::<_, Failure>((SecretString::from(token.to_owned()), lifetime))
    };
    let (token, lifetime) = tokio::time::timeout_at(deadline, exchange)
        .await
        .map_err(|_| {
            (
                StatusCode::GATEWAY_TIMEOUT,
                format!("the token endpoint of `{tool}` did not answer in time"),
            )
        })??;
    let fresh_for = lifetime.saturating_sub(TOKEN_SKEW_SECONDS.min(lifetime / 2));
    *cached = Some(CachedToken {
        token: token.clone(),
        until: Instant::now() + std::time::Duration::from_secs(fresh_for),
    });
    Ok(token)
}

#[cfg(test)]
mod tests;
