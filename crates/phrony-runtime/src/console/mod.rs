//! The approvals console: a web page served by the daemon's HTTP listener (`RUNTIME_HTTP_ADDR`)
//! under `/console/`, with its JSON API under `/console/api/` and live updates as server-sent
//! events.
//!
//! The page (`crates/phrony-runtime/console/`) is embedded in the binary with `include_str!`:
//! nothing is fetched from elsewhere, so it works offline. Every console response carries a
//! strict Content-Security-Policy ([`CSP`]: `default-src 'self'`, no inline script or style),
//! `X-Frame-Options: DENY`, `nosniff`, `no-referrer` and `Cache-Control: no-store`. The page
//! renders data with `textContent` only.
//!
//! # One implementation of the rules
//!
//! The console holds no approval rule of its own. Each API call is made **in process through the
//! gRPC service** ([`phrony_grpc::RuntimeService`], the `Runtime` trait's methods: `ListApprovals`,
//! `GetApproval`, `DecideApproval`, `WatchApprovals`, `InspectSession`) with the request's
//! [`Principal`] in its extensions, exactly where the gRPC access edge puts it. So the recorded
//! actor (the verified principal, never a name typed in the page), its verification method,
//! route restrictions, separation of duties, quorum and the edited-argument checks are the
//! service's and the engine's. The permission each call needs is the gRPC edge's table
//! ([`phrony_grpc::auth::permission_for`]).
//!
//! # Who may use it
//!
//! - `required` auth mode: the sign-in form takes an API token (`phrony-runtime tokens create`)
//!   or an OIDC access token. It is verified by the daemon's authenticator (the gRPC edge's) and
//!   must grant `read`. The server keeps it in memory with the console session and
//!   authenticates it again on every API call, so a revoked token or an expired JWT stops
//!   working at once. A `viewer` sees everything and decides nothing (the page hides the buttons,
//!   and the server answers 403); deciding needs `approve` (approver, admin), on the token's
//!   routes.
//! - `local` auth mode: the listener is bound to loopback (checked at start), every request's
//!   `Host` must be a loopback address or `localhost` (no DNS rebinding), and signing in takes no
//!   credential: the console acts as the local operator, recorded unverified under the daemon's
//!   default actor, as a gRPC call without an actor is.
//!
//! A sign-in sets the session cookie [`COOKIE`] (`HttpOnly; SameSite=Strict; Path=/console`), a
//! random 256-bit value kept only as its SHA-256, and returns a CSRF token. Every state-changing
//! call (sign-out, decisions) is a `POST` with a JSON body (`Content-Type: application/json`) and
//! the CSRF token in [`CSRF_HEADER`]; another site cannot send either without a CORS preflight the
//! console never grants, and a request whose `Origin` is not this host is refused. At most
//! [`MAX_SESSIONS`] sessions live at once, each for [`SESSION_TTL`]; sessions live in memory (a
//! restarted daemon signs everyone out). The cookie is not `Secure`: the listener speaks plain
//! HTTP, so outside loopback put it behind a TLS-terminating proxy.
//!
//! # Bounds
//!
//! Sign-in bodies are at most [`MAX_LOGIN_BODY`] bytes, decision bodies [`MAX_DECIDE_BODY`]
//! (413 beyond), comments [`MAX_COMMENT`] characters (400 naming the field).
//!
//! | Route | Purpose |
//! |---|---|
//! | `GET /console/` · `GET /console/assets/{console.js,console.css}` | the page |
//! | `POST /console/api/login` | `{token}` (`required` mode) or `{}` (`local`) → cookie + `{user, verification, roles, can_decide, csrf}` |
//! | `GET /console/api/session` | who is signed in (and the CSRF token) |
//! | `POST /console/api/logout` | end the session (CSRF header) |
//! | `GET /console/api/approvals?status&agent&tool&route&session` | approvals, pending by default |
//! | `GET /console/api/approvals/{id}` | one approval with its votes |
//! | `POST /console/api/approvals/{id}/decide` | `{decision: "approve"\|"reject", comment, args?}` (CSRF header, `approve` permission) |
//! | `GET /console/api/sessions/{id}` | a session and its inspect timeline |
//! | `GET /console/api/events?agent&route&session` | SSE: `opened`, `updated`, `decided`, `current_end` |

mod api;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use phrony_auth::{AuthError, Credentials, Permission, Principal, Role, ThrottleKey};
use rand::TryRngCore as _;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::auth::AuthMode;
use crate::http::{Serving, Shared};

/// The Content-Security-Policy of every console response.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The session cookie.
pub const COOKIE: &str = "phrony_console";

/// The header carrying the session's CSRF token on state-changing calls.
pub const CSRF_HEADER: &str = "x-phrony-csrf";

/// The largest sign-in body, in bytes (an OIDC access token fits).
pub const MAX_LOGIN_BODY: usize = 16 * 1024;

/// The largest decision body, in bytes (the comment and any edited arguments).
pub const MAX_DECIDE_BODY: usize = 256 * 1024;

/// The longest comment on a decision, in characters.
pub const MAX_COMMENT: usize = 4000;

/// The most console sessions alive at once.
pub const MAX_SESSIONS: usize = 1024;

/// The most console sessions one principal keeps at once; signing in again past it ends that
/// principal's oldest session, so one credential cannot use up [`MAX_SESSIONS`] and lock the
/// others out.
pub const MAX_SESSIONS_PER_PRINCIPAL: usize = 16;

/// How often a live-updates stream checks that its session and credential still hold (a
/// revoked token, an expired JWT, a sign-out or a lost permission ends it within this).
pub const EVENTS_RECHECK: Duration = Duration::from_secs(5);

/// How long a console session lasts (a token's own expiry ends it sooner).
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

const INDEX_HTML: &str = include_str!("../../console/index.html");
const CONSOLE_JS: &str = include_str!("../../console/console.js");
const CONSOLE_CSS: &str = include_str!("../../console/console.css");

// ---------------------------------------------------------------------------------------------
// Errors

/// A refused or failed console call: its status and a JSON body `{error, message}` naming the
/// problem (never a presented credential).
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", message)
    }

    fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_denied", message)
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
    }

    fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The gRPC service's refusal, with its message, as the HTTP status of the same meaning.
    fn from_status(status: &tonic::Status) -> Self {
        use tonic::Code;
        let (http, code) = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => {
                (StatusCode::BAD_REQUEST, "invalid_argument")
            }
            Code::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Code::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
            Code::FailedPrecondition => (StatusCode::CONFLICT, "failed_precondition"),
            Code::Aborted => (StatusCode::CONFLICT, "aborted"),
            Code::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
            Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Code::Ok
            | Code::Cancelled
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::DataLoss => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        Self::new(http, code, status.message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            axum::Json(json!({"error": self.code, "message": self.message})),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"phrony-console\""),
            );
        }
        response
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions

/// One signed-in console session.
#[derive(Clone)]
struct Session {
    /// The credential authenticated again on every call (`None` in `local` mode).
    bearer: Option<String>,
    /// Who signed in (name and verification), for the per-principal bound.
    owner: String,
    csrf: String,
    expires: Instant,
}

/// Never prints the credential or the CSRF token.
impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .field("owner", &self.owner)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// The console sessions of one listener, keyed by the SHA-256 of their cookie value.
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<[u8; 32], Session>>);

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("open", &self.lock().len())
            .finish()
    }
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open(&self, bearer: Option<String>, owner: String) -> Result<(String, Session), ApiError> {
        let token = random_token()?;
        let session = Session {
            bearer,
            owner,
            csrf: random_token()?,
            expires: Instant::now() + SESSION_TTL,
        };
        let mut sessions = self.lock();
        let now = Instant::now();
        sessions.retain(|_, s| s.expires > now);
        let mut own: Vec<([u8; 32], Instant)> = sessions
            .iter()
            .filter(|(_, s)| s.owner == session.owner)
            .map(|(key, s)| (*key, s.expires))
            .collect();
        if own.len() >= MAX_SESSIONS_PER_PRINCIPAL {
            own.sort_by_key(|(_, expires)| *expires);
            for (key, _) in &own[..=own.len() - MAX_SESSIONS_PER_PRINCIPAL] {
                sessions.remove(key);
            }
        }
        if sessions.len() >= MAX_SESSIONS {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_sessions",
                format!("the console has {MAX_SESSIONS} sessions open; try again later"),
            ));
        }
        sessions.insert(token_key(&token), session.clone());
        Ok((token, session))
    }

    /// The live session of the request's cookie.
    fn get(&self, headers: &HeaderMap) -> Result<(String, Session), ApiError> {
        let token = cookie_token(headers)
            .ok_or_else(|| ApiError::unauthorized("not signed in to the console"))?;
        let key = token_key(&token);
        let mut sessions = self.lock();
        match sessions.get(&key) {
            Some(s) if s.expires > Instant::now() => Ok((token, s.clone())),
            Some(_) => {
                sessions.remove(&key);
                Err(ApiError::unauthorized(
                    "the console session expired; sign in again",
                ))
            }
            None => Err(ApiError::unauthorized("not signed in to the console")),
        }
    }

    fn close(&self, token: &str) {
        self.lock().remove(&token_key(token));
    }
}

fn random_token() -> Result<String, ApiError> {
    let mut bytes = [0_u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| ApiError::internal(format!("drawing a random session value: {e}")))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

fn token_key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

fn session_cookie(token: &str, max_age: u64) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(&format!(
        "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={max_age}"
    ))
    .map_err(|e| ApiError::internal(format!("building the session cookie: {e}")))
}

/// Constant-time equality of two byte strings (the CSRF token).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

// ---------------------------------------------------------------------------------------------
// The caller

/// A signed-in caller: the principal authenticated for this request, and the session's CSRF
/// token.
pub(crate) struct Caller {
    pub(crate) principal: Principal,
    csrf: String,
    /// When the console session ends (a live-updates stream ends then too).
    pub(crate) expires: Instant,
}

impl Caller {
    /// 403 unless the principal holds what the gRPC edge requires for `rpc`.
    pub(crate) fn require_rpc(&self, rpc: &str) -> Result<(), ApiError> {
        let permission = phrony_grpc::auth::permission_for(rpc)
            .ok_or_else(|| ApiError::internal(format!("{rpc} is not an RPC of the service")))?;
        self.principal
            .require(permission)
            .map_err(|denied| ApiError::forbidden(format!("permission denied: {denied}")))
    }

    fn view(&self, mode: AuthMode) -> Value {
        let roles: Vec<&str> = self.principal.roles.iter().map(|r| r.as_str()).collect();
        json!({
            "user": self.principal.name,
            "verification": self.principal.verification.as_str(),
            "roles": roles,
            "routes": self.principal.routes,
            "can_decide": self.principal.permits(Permission::Approve),
            "mode": mode_name(mode),
            "csrf": self.csrf,
        })
    }
}

fn mode_name(mode: AuthMode) -> &'static str {
    match mode {
        AuthMode::Local => "local",
        AuthMode::Required => "required",
    }
}

/// The console's state: the listener's shared state (auth mode, what serves).
#[derive(Clone)]
pub(crate) struct Console(pub(crate) Arc<Shared>);

impl Console {
    fn serving(&self) -> Result<&Serving, ApiError> {
        self.0.serving.get().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the runtime is starting (waiting for the database or recovering sessions)",
            )
        })
    }

    /// Authenticates `bearer` as the gRPC edge does.
    async fn authenticate(&self, bearer: Option<&str>) -> Result<Principal, ApiError> {
        let serving = self.serving()?;
        let credentials = Credentials {
            bearer,
            peer_subject: None,
        };
        match serving.authenticator.authenticate(credentials).await {
            Ok(principal) => Ok(principal),
            Err(error @ AuthError::Unavailable { .. }) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                error.to_string(),
            )),
            Err(error) => Err(ApiError::unauthorized(format!(
                "{error}; sign in to the console again"
            ))),
        }
    }

    /// The signed-in caller of a read.
    pub(crate) async fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let (_, session) = self.0.console.get(headers)?;
        let principal = self.authenticate(session.bearer.as_deref()).await?;
        Ok(Caller {
            principal,
            csrf: session.csrf,
            expires: session.expires,
        })
    }

    /// The signed-in caller of a change: same origin, and the session's CSRF token in
    /// [`CSRF_HEADER`].
    pub(crate) async fn caller_for_change(
        &self,
        headers: &HeaderMap,
    ) -> Result<(String, Caller), ApiError> {
        check_origin(headers)?;
        let (token, session) = self.0.console.get(headers)?;
        let given = headers
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !same_secret(given.as_bytes(), session.csrf.as_bytes()) {
            return Err(ApiError::forbidden(format!(
                "missing or wrong `{CSRF_HEADER}` header (the console session's CSRF token)"
            )));
        }
        let principal = self.authenticate(session.bearer.as_deref()).await?;
        Ok((
            token,
            Caller {
                principal,
                csrf: session.csrf,
                expires: session.expires,
            },
        ))
    }
}

/// A request whose `Origin` (when sent) is not this host is refused.
fn check_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    match (origin_host, host) {
        (Some(o), Some(h)) if o.eq_ignore_ascii_case(h) => Ok(()),
        _ => Err(ApiError::forbidden(
            "cross-origin request refused: the Origin is not this console",
        )),
    }
}

/// Whether a `Host` header names this machine: `localhost` or a loopback address, with or
/// without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or(rest, |(ip, _)| ip)
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

// ---------------------------------------------------------------------------------------------
// Bodies

/// A JSON body of at most `max` bytes sent as `application/json` (a cross-site form cannot send
/// one without a preflight).
pub(crate) fn json_body<T: for<'de> Deserialize<'de>>(
    what: &str,
    headers: &HeaderMap,
    body: &Bytes,
    max: usize,
) -> Result<T, ApiError> {
    if body.len() > max {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the {what} body must be at most {max} bytes, has {}",
                body.len()
            ),
        ));
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("the {what} body must be sent as `Content-Type: application/json`"),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the {what} body is not valid: {e}")))
}

// ---------------------------------------------------------------------------------------------
// The router

/// The console's routes, on the listener's shared state.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let console = Console(shared);
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route(
            "/console/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/console/assets/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", CONSOLE_JS) }),
        )
        .route(
            "/console/assets/console.css",
            get(|| async { asset("text/css; charset=utf-8", CONSOLE_CSS) }),
        )
        .route("/console/api/login", post(login))
        .route("/console/api/logout", post(logout))
        .route("/console/api/session", get(session))
        .route("/console/api/approvals", get(api::list_approvals))
        .route("/console/api/approvals/{id}", get(api::get_approval))
        .route("/console/api/approvals/{id}/decide", post(api::decide))
        .route("/console/api/sessions/{id}", get(api::inspect_session))
        .route("/console/api/events", get(api::events))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            local_hosts_only,
        ))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(console)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// In `local` mode a request must name this machine in its `Host`: a web page whose name
/// was rebound to 127.0.0.1 is refused.
async fn local_hosts_only(
    State(console): State<Console>,
    request: Request,
    next: Next,
) -> Response {
    if console.0.mode == AuthMode::Local {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !is_loopback_host(host) {
            return ApiError::forbidden(
                "in local auth mode the console answers only requests addressed to localhost or \
                 a loopback address",
            )
            .into_response();
        }
    }
    next.run(request).await
}

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    #[serde(default)]
    token: Option<String>,
}

/// The sign-in throttle's keys of a request: the peer's address (when known) and the presented
/// credential, named by a digest of it (the console signs in with bearer credentials, so the
/// credential is the account: one replayed from many addresses is limited as one).
fn throttle_keys(peer: Option<SocketAddr>, bearer: Option<&str>) -> Vec<ThrottleKey> {
    let mut keys = Vec::new();
    if let Some(peer) = peer {
        keys.push(ThrottleKey::Client(peer.ip().to_canonical()));
    }
    if let Some(bearer) = bearer {
        let digest = Sha256::digest(bearer.as_bytes());
        keys.push(ThrottleKey::Account(format!(
            "credential sha256:{}",
            hex::encode(&digest[..8])
        )));
    }
    keys
}

/// 429 with `Retry-After` (whole seconds, rounded up).
fn throttled(wait: Duration) -> Response {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_attempts",
        format!("too many failed sign-ins; try again in {seconds} s"),
    )
    .into_response();
    if let Ok(value) = HeaderValue::from_str(&seconds.max(1).to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

async fn login(
    State(console): State<Console>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_origin(&headers)?;
    let body: LoginBody = json_body("sign-in", &headers, &body, MAX_LOGIN_BODY)?;
    if console.0.mode == AuthMode::Local {
        return sign_in(&console, body).await;
    }
    let peer = peer.map(|Extension(ConnectInfo(addr))| addr);
    let keys = throttle_keys(
        peer,
        body.token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty()),
    );
    let throttle = &console.0.login_throttle;
    if let Err(wait) = throttle.check(&keys, Instant::now()) {
        tracing::info!(
            client = ?peer.map(|p| p.ip()),
            retry_after_s = wait.as_secs(),
            "console sign-in refused: too many failed sign-ins"
        );
        return Ok(throttled(wait));
    }
    let signed = sign_in(&console, body).await;
    match &signed {
        Ok(_) => throttle.succeed(&keys),
        // A refused credential (401) or one without the read permission (403) counts; a
        // malformed request or an unavailable database does not.
        Err(e) if matches!(e.status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
            for lockout in throttle.fail(&keys, Instant::now()) {
                tracing::warn!(
                    key = %lockout.key,
                    failures = lockout.failures,
                    locked_for_s = lockout.duration.as_secs(),
                    "console sign-ins throttled after repeated failures"
                );
            }
        }
        Err(_) => {}
    }
    signed
}

/// Verifies the sign-in body's credential and opens a console session.
async fn sign_in(console: &Console, body: LoginBody) -> Result<Response, ApiError> {
    let token = body
        .token
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    let bearer = match (console.0.mode, token) {
        (AuthMode::Required, None) => {
            return Err(ApiError::bad_request(
                "`token` is required: an API token (`phrony-runtime tokens create`) or an OIDC \
                 access token",
            ));
        }
        (AuthMode::Required, Some(token)) => Some(token),
        (AuthMode::Local, None) => None,
        (AuthMode::Local, Some(_)) => {
            return Err(ApiError::bad_request(
                "this runtime runs in local auth mode: sign in without a token",
            ));
        }
    };
    let principal = console.authenticate(bearer.as_deref()).await?;
    if !principal.permits(Permission::Read) {
        return Err(ApiError::forbidden(format!(
            "{:?} cannot use the console: it needs the read permission (roles viewer, approver, \
             admin, …)",
            principal.name
        )));
    }
    let owner = format!("{} ({})", principal.name, principal.verification.as_str());
    let (cookie, session) = console.0.console.open(bearer, owner)?;
    tracing::info!(
        user = %principal.name.escape_debug(),
        verification = principal.verification.as_str(),
        admin = principal.roles.contains(&Role::Admin),
        "console sign-in"
    );
    let caller = Caller {
        principal,
        csrf: session.csrf,
        expires: session.expires,
    };
    let mut response = axum::Json(caller.view(console.0.mode)).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie(&cookie, SESSION_TTL.as_secs())?,
    );
    Ok(response)
}

async fn logout(State(console): State<Console>, headers: HeaderMap) -> Result<Response, ApiError> {
    let (token, _) = console.caller_for_change(&headers).await?;
    console.0.console.close(&token);
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie("", 0)?);
    Ok(response)
}

async fn session(State(console): State<Console>, headers: HeaderMap) -> Result<Response, ApiError> {
    let caller = console.caller(&headers).await.map_err(|mut e| {
        if e.status == StatusCode::UNAUTHORIZED {
            // The page needs the mode to show the token form or sign in as the local operator.
            e.message = format!("{} (auth mode: {})", e.message, mode_name(console.0.mode));
        }
        e
    })?;
    Ok(axum::Json(caller.view(console.0.mode)).into_response())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn cookie(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={token}")).unwrap(),
        );
        headers
    }

    #[test]
    fn sessions_expire_are_bounded_and_keep_only_a_hash() {
        let sessions = Sessions::default();
        let (token, _) = sessions
            .open(Some("phr_x".into()), "emad (token)".into())
            .unwrap();
        assert!(sessions.lock().contains_key(&token_key(&token)));
        assert!(
            !sessions
                .lock()
                .keys()
                .any(|k| k.as_slice() == token.as_bytes()),
            "the cookie value itself is not kept"
        );
        let (_, found) = sessions.get(&cookie(&token)).unwrap();
        assert_eq!(found.bearer.as_deref(), Some("phr_x"));
        sessions.lock().get_mut(&token_key(&token)).unwrap().expires =
            Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
        let err = sessions.get(&cookie(&token)).unwrap_err();
        assert_eq!(err.status, StatusCode::UNAUTHORIZED);
        assert!(err.message.contains("expired"), "{}", err.message);
        assert!(sessions.lock().is_empty(), "the expired session is dropped");
        for i in 0..MAX_SESSIONS {
            sessions.open(None, format!("user-{i} (token)")).unwrap();
        }
        let full = sessions.open(None, "latecomer (token)".into()).unwrap_err();
        assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(full.message.contains(&MAX_SESSIONS.to_string()));
    }

    #[test]
    fn one_principal_signing_in_again_and_again_ends_its_own_oldest_session_only() {
        let sessions = Sessions::default();
        let (other, _) = sessions.open(None, "alice (token)".into()).unwrap();
        let (first, _) = sessions.open(None, "mallory (token)".into()).unwrap();
        let mut latest = Vec::new();
        for _ in 0..2 * MAX_SESSIONS_PER_PRINCIPAL {
            std::thread::sleep(Duration::from_millis(1));
            latest.push(sessions.open(None, "mallory (token)".into()).unwrap().0);
        }
        let own = sessions
            .lock()
            .values()
            .filter(|s| s.owner == "mallory (token)")
            .count();
        assert_eq!(own, MAX_SESSIONS_PER_PRINCIPAL);
        assert_eq!(
            sessions.get(&cookie(&first)).unwrap_err().status,
            StatusCode::UNAUTHORIZED,
            "the oldest session of that principal ended"
        );
        for token in &latest[latest.len() - MAX_SESSIONS_PER_PRINCIPAL..] {
            assert!(sessions.get(&cookie(token)).is_ok(), "the newest are kept");
        }
        assert!(
            sessions.get(&cookie(&other)).is_ok(),
            "another principal's session stays"
        );
    }

    #[test]
    fn origins_must_match_the_host_and_local_hosts_are_loopback() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(
            check_origin(&headers).is_ok(),
            "no Origin: a same-origin GET or a tool"
        );
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(check_origin(&headers).is_ok());
        for bad in ["http://127.0.0.1:8081", "null", "https://evil.example"] {
            headers.insert(header::ORIGIN, HeaderValue::from_static(bad));
            assert_eq!(
                check_origin(&headers).unwrap_err().status,
                StatusCode::FORBIDDEN,
                "{bad}"
            );
        }
        for good in [
            "127.0.0.1:8080",
            "localhost:1",
            "LOCALHOST",
            "[::1]:9",
            "127.1.2.3",
        ] {
            assert!(is_loopback_host(good), "{good}");
        }
        for bad in [
            "evil.example:8080",
            "10.0.0.1:80",
            "",
            "[::2]:9",
            "localhost.evil",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
    }

    #[test]
    fn service_refusals_keep_their_meaning_over_http() {
        let e = ApiError::from_status(&tonic::Status::invalid_argument("the edited arguments"));
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, "invalid_argument")
        );
        assert_eq!(e.message, "the edited arguments");
        let e = ApiError::from_status(&tonic::Status::permission_denied("no"));
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        let e = ApiError::from_status(&tonic::Status::failed_precondition("decided"));
        assert_eq!(e.status, StatusCode::CONFLICT);
        let e = ApiError::from_status(&tonic::Status::not_found("none"));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
    }
}
