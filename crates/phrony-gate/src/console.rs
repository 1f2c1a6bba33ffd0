//! The web console: a small page served by mock-gate under `/console/` (the decisions log,
//! pending escalations a manager approves or rejects with a comment, mandates with their used
//! and held amounts, and an audit export), with its data API under `/console/api/`.
//!
//! The assets (`crates/phrony-gate/console/`) are embedded in the binary: nothing is fetched
//! from elsewhere, and every console response carries a strict Content-Security-Policy
//! ([`CSP`]: `default-src 'self'`, no inline script), `X-Frame-Options: DENY`, `nosniff`,
//! `no-referrer` and `Cache-Control: no-store`. The page renders data with `textContent` only.
//! The console lives under a fixed prefix because the sidecar routes take `/{tool}/{path}`.
//!
//! # Who may use it
//!
//! Nothing is shown without a login (`POST /console/api/login`, JSON only):
//! - a **manager login** from the configuration's `console.managers` (username, Argon2id
//!   password hash made by `mock-gate console hash-password`, role, default `manager`). A
//!   manager approves or rejects as themselves: the audit event records
//!   `approver: {sub: <username>, role, via: "console_login"}`; the login's role must be the
//!   escalation's approver role, and a manager cannot approve a request made on their own
//!   behalf;
//! - the **admin key**, typed into the login form (never embedded in the page). Such a session
//!   names the approver with each decision and follows the admin API's rules (with
//!   `approvals.require_approver_token` it cannot decide).
//!
//! A wrong login answers 401 (the same message and the same Argon2 work for an unknown user);
//! after [`MAX_LOGIN_FAILURES`] failures for one username within [`LOGIN_FAILURE_WINDOW`]
//! further attempts answer 429 until the window passes. A login sets the session cookie
//! [`COOKIE`] (`HttpOnly; SameSite=Strict; Path=/console`), a random 256-bit token kept only
//! as its SHA-256, and returns a CSRF token; every state-changing call (approve, reject,
//! logout) must send it back in the [`CSRF_HEADER`] header, which another site cannot set
//! without a CORS preflight the console never grants, and a request whose `Origin` is not this
//! host is refused. At most [`MAX_SESSIONS`] sessions live at once; each lasts
//! `console.session_ttl_seconds` (default [`DEFAULT_SESSION_TTL`]). Sessions live in memory:
//! a restarted gate signs everyone out. The cookie is not `Secure` because mock-gate serves
//! plain HTTP; keep the console on loopback.
//!
//! # Bounds
//!
//! Login bodies are at most [`MAX_LOGIN_BODY`] bytes (413), decision bodies
//! [`MAX_ACTION_BODY`]; usernames [`MAX_USERNAME`] characters, passwords [`MAX_PASSWORD`],
//! comments [`MAX_COMMENT`] (400 naming the field and the bound).
//!
//! | Route | Purpose |
//! |---|---|
//! | `GET /console/` · `GET /console/assets/{console.js,console.css}` | the page |
//! | `POST /console/api/login` | `{username, password}` or `{admin_key}` → session cookie + `{csrf, user, role, via}` |
//! | `GET /console/api/session` | who is signed in (and the CSRF token) |
//! | `POST /console/api/logout` | end the session (CSRF header) |
//! | `GET /console/api/decisions` · `approvals` · `mandates` | the data of the page |
//! | `POST /console/api/approvals/{ref}/approve` · `…/reject` | `{comment?, approver?}` (CSRF header; `approver` only for admin-key sessions) |
//! | `GET /console/api/audit` | the audit log as a JSONL download |

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher as _, PasswordVerifier as _, SaltString};
use argon2::{Algorithm, Argon2};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::admin::ApproverName;
use crate::engine::{Gate, Resolution, Vouch};
use crate::error::ApiError;
use crate::signing::constant_time_eq;

/// The Content-Security-Policy of every console response.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The session cookie.
pub const COOKIE: &str = "mock_gate_console";

/// The header carrying the session's CSRF token on state-changing calls.
pub const CSRF_HEADER: &str = "x-console-csrf";

/// The largest login body, in bytes.
pub const MAX_LOGIN_BODY: usize = 4 * 1024;

/// The largest approve/reject body, in bytes.
pub const MAX_ACTION_BODY: usize = 16 * 1024;

/// The longest username, in characters.
pub const MAX_USERNAME: usize = 128;

/// The shortest password `hash-password` accepts, in characters.
pub const MIN_PASSWORD: usize = 8;

/// The longest password, in characters.
pub const MAX_PASSWORD: usize = 1024;

/// The longest comment on a decision, in characters.
pub const MAX_COMMENT: usize = 2000;

/// The most sessions alive at once.
pub const MAX_SESSIONS: usize = 1024;

/// Failed logins for one username within [`LOGIN_FAILURE_WINDOW`] before 429.
pub const MAX_LOGIN_FAILURES: u32 = 5;

/// The window of [`MAX_LOGIN_FAILURES`].
pub const LOGIN_FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// The default session life, in seconds (8 hours).
pub const DEFAULT_SESSION_TTL: u32 = 8 * 3600;

/// The longest session life, in seconds (7 days).
pub const MAX_SESSION_TTL: u32 = 7 * 86_400;

const INDEX_HTML: &str = include_str!("../console/index.html");
const CONSOLE_JS: &str = include_str!("../console/console.js");
const CONSOLE_CSS: &str = include_str!("../console/console.css");

// ---------------------------------------------------------------------------------------------
// Configuration

/// The `console` section of the configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConsoleFile {
    #[serde(default)]
    managers: Vec<ManagerFile>,
    #[serde(default)]
    session_ttl_seconds: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManagerFile {
    username: String,
    password_hash: String,
    #[serde(default = "default_role")]
    role: String,
}

fn default_role() -> String {
    "manager".into()
}

/// The console's settings: manager logins by username, and the session life.
#[derive(Debug, Clone)]
pub struct ConsoleSettings {
    /// Manager logins by username.
    pub managers: BTreeMap<String, ManagerLogin>,
    /// How long a session lasts, in seconds.
    pub session_ttl_seconds: u32,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        Self {
            managers: BTreeMap::new(),
            session_ttl_seconds: DEFAULT_SESSION_TTL,
        }
    }
}

/// One manager login.
#[derive(Clone)]
pub struct ManagerLogin {
    /// The Argon2id password hash (PHC string).
    pub password_hash: String,
    /// The approver role this manager holds (matched against an escalation's approver).
    pub role: String,
}

impl std::fmt::Debug for ManagerLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerLogin")
            .field("password_hash", &"<redacted>")
            .field("role", &self.role)
            .finish()
    }
}

/// Compiles the `console` section; an error names the field and the problem.
pub(crate) fn compile(file: Option<&ConsoleFile>) -> Result<ConsoleSettings, (String, String)> {
    let Some(file) = file else {
        return Ok(ConsoleSettings::default());
    };
    let ttl = file.session_ttl_seconds.unwrap_or(DEFAULT_SESSION_TTL);
    if !(60..=MAX_SESSION_TTL).contains(&ttl) {
        return Err((
            "console.session_ttl_seconds".into(),
            format!("must be within 60..={MAX_SESSION_TTL}, is {ttl}"),
        ));
    }
    let mut managers = BTreeMap::new();
    for (i, m) in file.managers.iter().enumerate() {
        let field = format!("console.managers[{i}]");
        let name = ApproverName::parse(&m.username).map_err(|e| {
            (
                format!("{field}.username"),
                e.detail.replace("`approver`", "it"),
            )
        })?;
        if name.as_str() != m.username {
            return Err((
                format!("{field}.username"),
                "must not start or end with spaces".into(),
            ));
        }
        let role = m.role.trim();
        if role.is_empty() || role != m.role || ApproverName::parse(role).is_err() {
            return Err((
                format!("{field}.role"),
                "must be printable text without surrounding spaces".into(),
            ));
        }
        check_hash(&m.password_hash).map_err(|e| (format!("{field}.password_hash"), e))?;
        let previous = managers.insert(
            m.username.clone(),
            ManagerLogin {
                password_hash: m.password_hash.clone(),
                role: role.to_owned(),
            },
        );
        if previous.is_some() {
            return Err((
                format!("{field}.username"),
                format!("`{}` is listed twice", m.username),
            ));
        }
    }
    Ok(ConsoleSettings {
        managers,
        session_ttl_seconds: ttl,
    })
}

/// An Argon2id PHC string (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`).
fn check_hash(hash: &str) -> Result<(), String> {
    let parsed = PasswordHash::new(hash).map_err(|e| {
        format!("is not a PHC password hash ({e}); make one with `mock-gate console hash-password`")
    })?;
    if parsed.algorithm != Algorithm::Argon2id.ident() {
        return Err(format!(
            "uses `{}`; only argon2id is accepted (`mock-gate console hash-password`)",
            parsed.algorithm
        ));
    }
    if parsed.hash.is_none() {
        return Err("has no hash part".into());
    }
    Ok(())
}

/// Errors making a password hash.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The password is too short or too long.
    #[error("the password must have {MIN_PASSWORD} to {MAX_PASSWORD} characters, has {len}")]
    PasswordLength {
        /// Its length in characters.
        len: usize,
    },
    /// The system RNG or the hasher failed.
    #[error("hashing the password: {0}")]
    Hash(String),
}

/// Hashes a manager password for `console.managers[].password_hash`: Argon2id with the
/// default parameters and a random 16-byte salt, as a PHC string.
///
/// # Errors
/// [`ConsoleError::PasswordLength`] outside [`MIN_PASSWORD`]..=[`MAX_PASSWORD`] characters,
/// [`ConsoleError::Hash`] when the RNG or the hasher fails.
pub fn hash_password(password: &str) -> Result<String, ConsoleError> {
    let len = password.chars().count();
    if !(MIN_PASSWORD..=MAX_PASSWORD).contains(&len) {
        return Err(ConsoleError::PasswordLength { len });
    }
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| ConsoleError::Hash(e.to_string()))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| ConsoleError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| ConsoleError::Hash(e.to_string()))
}

/// Whether `password` matches the PHC `hash` (false for a malformed hash).
fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| {
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// A hash of a random password, verified against for unknown usernames so that they cost the
/// same work as a wrong password.
fn decoy_hash() -> &'static str {
    static DECOY: OnceLock<String> = OnceLock::new();
    DECOY.get_or_init(|| {
        let mut random = [0u8; 24];
        let password = match getrandom::fill(&mut random) {
            Ok(()) => URL_SAFE_NO_PAD.encode(random),
            Err(_) => "decoy-password-never-matched".to_owned(),
        };
        hash_password(&password).unwrap_or_default()
    })
}

// ---------------------------------------------------------------------------------------------
// Sessions

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Manager,
    AdminKey,
}

impl Via {
    /// `via` in the audit's `gate.console_login`.
    fn audit_name(self) -> &'static str {
        match self {
            Self::Manager => "manager",
            Self::AdminKey => "admin_key",
        }
    }
}

#[derive(Debug, Clone)]
struct Session {
    user: String,
    role: Option<String>,
    via: Via,
    csrf: String,
    expires: Instant,
}

impl Session {
    fn view(&self) -> Value {
        json!({
            "user": self.user,
            "role": self.role,
            "via": match self.via { Via::Manager => "console_login", Via::AdminKey => "admin_key" },
            "csrf": self.csrf,
        })
    }
}

#[derive(Debug)]
struct Console {
    gate: Arc<Gate>,
    /// SHA-256 of the cookie token → session.
    sessions: Mutex<HashMap<[u8; 32], Session>>,
    /// Username → (failures, start of the window).
    failures: Mutex<HashMap<String, (u32, Instant)>>,
}

type Shared = Arc<Console>;

fn random_token() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::internal(format!("generating a session token: {e}")))?;
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

impl Console {
    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u32, Instant)>> {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The session of the request's cookie: 401 without a live one.
    fn session(&self, headers: &HeaderMap) -> Result<(String, Session), ApiError> {
        let token = cookie_token(headers)
            .ok_or_else(|| ApiError::unauthorized("not signed in to the console"))?;
        let key = token_key(&token);
        let mut sessions = self.lock_sessions();
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

    /// The session of a state-changing request: the CSRF header must match and an `Origin`,
    /// when sent, must be this host.
    fn session_for_change(&self, headers: &HeaderMap) -> Result<(String, Session), ApiError> {
        check_origin(headers)?;
        let (token, session) = self.session(headers)?;
        let given = headers
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), session.csrf.as_bytes()) {
            return Err(ApiError::forbidden(format!(
                "missing or wrong `{CSRF_HEADER}` header (the session's CSRF token)"
            )));
        }
        Ok((token, session))
    }

    fn open_session(
        &self,
        user: String,
        role: Option<String>,
        via: Via,
    ) -> Result<(String, Session), ApiError> {
        let token = random_token()?;
        let session = Session {
            user,
            role,
            via,
            csrf: random_token()?,
            expires: Instant::now()
                + Duration::from_secs(u64::from(self.gate.settings().console.session_ttl_seconds)),
        };
        let mut sessions = self.lock_sessions();
        let now = Instant::now();
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS {
            return Err(ApiError {
                status: 503,
                code: "TOO_MANY_SESSIONS",
                detail: format!("the console has {MAX_SESSIONS} sessions open; try again later"),
            });
        }
        sessions.insert(token_key(&token), session.clone());
        Ok((token, session))
    }

    /// 429 while `username` has [`MAX_LOGIN_FAILURES`] recent failures.
    fn check_throttle(&self, username: &str) -> Result<(), ApiError> {
        let failures = self.lock_failures();
        if let Some((count, since)) = failures.get(username)
            && *count >= MAX_LOGIN_FAILURES
            && since.elapsed() < LOGIN_FAILURE_WINDOW
        {
            return Err(ApiError {
                status: 429,
                code: "TOO_MANY_ATTEMPTS",
                detail: format!(
                    "{MAX_LOGIN_FAILURES} failed logins for this user within {} s; wait and try again",
                    LOGIN_FAILURE_WINDOW.as_secs()
                ),
            });
        }
        Ok(())
    }

    fn record_failure(&self, username: &str) {
        let mut failures = self.lock_failures();
        if failures.len() > 10_000 {
            failures.retain(|_, (_, since)| since.elapsed() < LOGIN_FAILURE_WINDOW);
        }
        let entry = failures
            .entry(username.to_owned())
            .or_insert((0, Instant::now()));
        if entry.1.elapsed() >= LOGIN_FAILURE_WINDOW {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
    }
}

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
        (Some(o), Some(h)) if o == h => Ok(()),
        _ => Err(ApiError::forbidden(
            "cross-origin request refused: the Origin is not this console",
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// The router

/// The console's routes (`/console`, `/console/`, `/console/assets/…`, `/console/api/…`).
pub(crate) fn router(gate: Arc<Gate>) -> Router {
    let console = Arc::new(Console {
        gate,
        sessions: Mutex::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
    });
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
        .route("/console/api/decisions", get(decisions))
        .route("/console/api/approvals", get(approvals))
        .route("/console/api/approvals/{reference}/approve", post(approve))
        .route("/console/api/approvals/{reference}/reject", post(reject))
        .route("/console/api/mandates", get(mandates))
        .route("/console/api/audit", get(audit))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(console)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
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

fn too_large(what: &str, max: usize, len: usize) -> ApiError {
    ApiError {
        status: 413,
        code: "PAYLOAD_TOO_LARGE",
        detail: format!("the {what} body must be at most {max} bytes, has {len}"),
    }
}

/// A JSON body of at most `max` bytes with a JSON content type (a cross-site form cannot send
/// one without a preflight).
fn json_body<T: for<'de> Deserialize<'de>>(
    what: &str,
    headers: &HeaderMap,
    body: &Bytes,
    max: usize,
) -> Result<T, ApiError> {
    if body.len() > max {
        return Err(too_large(what, max, body.len()));
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
        return Err(ApiError {
            status: 415,
            code: "UNSUPPORTED_MEDIA_TYPE",
            detail: format!("the {what} body must be sent as `Content-Type: application/json`"),
        });
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::unprocessable(format!("the {what} body is not valid: {e}")))
}

fn bounded(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    let len = value.chars().count();
    if len > max {
        return Err(ApiError::bad_request(format!(
            "`{field}` must have at most {max} characters, has {len}"
        )));
    }
    Ok(())
}

fn session_cookie(token: &str, max_age: u32) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(&format!(
        "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={max_age}"
    ))
    .map_err(|e| ApiError::internal(format!("building the session cookie: {e}")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    admin_key: Option<String>,
}

const WRONG_LOGIN: &str = "wrong username or password";

async fn login(
    State(console): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_origin(&headers)?;
    let body: LoginBody = json_body("login", &headers, &body, MAX_LOGIN_BODY)?;
    let (user, role, via) = match body {
        LoginBody {
            admin_key: Some(key),
            username: None,
            password: None,
        } => {
            bounded("admin_key", &key, crate::admin::MAX_ADMIN_KEY)?;
            console.check_throttle("\u{0}admin")?;
            let expected = console.gate.settings().admin_key.as_deref();
            if !expected.is_some_and(|e| constant_time_eq(key.trim().as_bytes(), e.as_bytes())) {
                console.record_failure("\u{0}admin");
                audit_refusal(&console, "admin", "admin_key").await;
                return Err(ApiError::unauthorized("wrong admin key"));
            }
            ("admin".to_owned(), None, Via::AdminKey)
        }
        LoginBody {
            admin_key: None,
            username: Some(username),
            password: Some(password),
        } => {
            bounded("username", &username, MAX_USERNAME)?;
            bounded("password", &password, MAX_PASSWORD)?;
            console.check_throttle(&username)?;
            let login = console
                .gate
                .settings()
                .console
                .managers
                .get(&username)
                .cloned();
            let hash = login
                .as_ref()
                .map_or_else(|| decoy_hash().to_owned(), |l| l.password_hash.clone());
            let matches = tokio::task::spawn_blocking(move || verify_password(&password, &hash))
                .await
                .map_err(|e| ApiError::internal(format!("checking the password: {e}")))?;
            match login {
                Some(login) if matches => (username, Some(login.role), Via::Manager),
                known => {
                    console.record_failure(&username);
                    tracing::warn!(username = %username.escape_debug(), "console login refused");
                    // Only a configured manager's refusals are audited: a guessed username
                    // must not grow the log (the throttle bounds a known one's).
                    if known.is_some() {
                        audit_refusal(&console, &username, "manager").await;
                    }
                    return Err(ApiError::unauthorized(WRONG_LOGIN));
                }
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "send either `username` and `password`, or `admin_key`",
            ));
        }
    };
    // Recorded before the session exists: a sign-in the audit log cannot hold does not happen.
    console
        .gate
        .record_console_login(&user, via.audit_name(), role.as_deref(), true)
        .await?;
    let (token, session) = console.open_session(user, role, via)?;
    tracing::info!(user = %session.user.escape_debug(), via = ?session.via, "console login");
    let ttl = console.gate.settings().console.session_ttl_seconds;
    let mut response = axum::Json(session.view()).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&token, ttl)?);
    Ok(response)
}

/// Audits a refused sign-in; a store failure is logged, and the refusal stands.
async fn audit_refusal(console: &Console, user: &str, via: &str) {
    if let Err(e) = console
        .gate
        .record_console_login(user, via, None, false)
        .await
    {
        tracing::error!(detail = %e.detail, "auditing a refused console login failed");
    }
}

async fn logout(State(console): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let (token, _) = console.session_for_change(&headers)?;
    console.lock_sessions().remove(&token_key(&token));
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie("", 0)?);
    Ok(response)
}

async fn session(State(console): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let (_, session) = console.session(&headers)?;
    Ok(axum::Json(session.view()).into_response())
}

async fn decisions(
    State(console): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    console.session(&headers)?;
    let list = console.gate.decisions(500).await;
    Ok(axum::Json(json!({"decisions": list})).into_response())
}

async fn approvals(
    State(console): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    console.session(&headers)?;
    let list = console.gate.approvals(None).await;
    Ok(axum::Json(json!({"approvals": list})).into_response())
}

async fn mandates(State(console): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    console.session(&headers)?;
    let list = console.gate.mandates().await;
    Ok(axum::Json(json!({"mandates": list})).into_response())
}

async fn audit(State(console): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    console.session(&headers)?;
    let events = console.gate.audit().await?;
    let body = crate::service::audit_jsonl(&events)
        .map_err(|e| ApiError::internal(format!("encoding an audit event: {e}")))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"mock-gate-audit.jsonl\"",
            ),
        ],
        body,
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideBody {
    #[serde(default)]
    comment: Option<String>,
    /// Admin-key sessions only: who decides.
    #[serde(default)]
    approver: Option<String>,
}

async fn decide(
    console: &Console,
    headers: &HeaderMap,
    reference: &str,
    body: &Bytes,
    resolution: Resolution,
) -> Result<Response, ApiError> {
    let (_, session) = console.session_for_change(headers)?;
    let body: DecideBody = if body.is_empty() {
        DecideBody::default()
    } else {
        json_body("decision", headers, body, MAX_ACTION_BODY)?
    };
    let comment = body
        .comment
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    if let Some(c) = &comment {
        bounded("comment", c, MAX_COMMENT)?;
    }
    let view = match (session.via, session.role.as_deref()) {
        (Via::Manager, Some(role)) => {
            if body.approver.is_some() {
                return Err(ApiError::bad_request(
                    "`approver` is the signed-in manager; do not send it",
                ));
            }
            let name = ApproverName::parse(&session.user)?;
            console
                .gate
                .resolve_vouched(
                    reference,
                    resolution,
                    &name,
                    Vouch::Manager { role },
                    comment,
                )
                .await?
        }
        _ => {
            let name = ApproverName::parse(body.approver.as_deref().unwrap_or_default())?;
            console
                .gate
                .resolve_vouched(reference, resolution, &name, Vouch::AdminKey, comment)
                .await?
        }
    };
    Ok(axum::Json(view).into_response())
}

async fn approve(
    State(console): State<Shared>,
    Path(reference): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    decide(&console, &headers, &reference, &body, Resolution::Approve).await
}

async fn reject(
    State(console): State<Shared>,
    Path(reference): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    decide(&console, &headers, &reference, &body, Resolution::Reject).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{FlagRules, Settings};
    use crate::engine::SystemClock;
    use crate::keys::SigningKey;
    use crate::store::MemoryStore;

    async fn console() -> Console {
        let settings = Settings::flags(FlagRules::default(), Some("rgnt_admin_unit_test".into()));
        let gate = Gate::open(
            settings,
            SigningKey::generate().unwrap(),
            Arc::new(MemoryStore::new()),
            Arc::new(SystemClock),
        )
        .await
        .unwrap();
        Console {
            gate: Arc::new(gate),
            sessions: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn cookie(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={token}")).unwrap(),
        );
        headers
    }

    #[tokio::test]
    async fn sessions_expire_and_are_bounded() {
        let console = console().await;
        let (token, _) = console
            .open_session("admin".into(), None, Via::AdminKey)
            .unwrap();
        assert_eq!(console.session(&cookie(&token)).unwrap().1.user, "admin");
        // Only the SHA-256 of the token is kept.
        assert!(console.lock_sessions().contains_key(&token_key(&token)));
        console
            .lock_sessions()
            .get_mut(&token_key(&token))
            .unwrap()
            .expires = Instant::now() - Duration::from_secs(1);
        let err = console.session(&cookie(&token)).unwrap_err();
        assert_eq!(err.status, 401);
        assert!(err.detail.contains("expired"), "{}", err.detail);
        assert!(
            console.lock_sessions().is_empty(),
            "the expired session is dropped"
        );

        for _ in 0..MAX_SESSIONS {
            console
                .open_session("admin".into(), None, Via::AdminKey)
                .unwrap();
        }
        let full = console
            .open_session("admin".into(), None, Via::AdminKey)
            .unwrap_err();
        assert_eq!(full.status, 503);
        assert!(full.detail.contains(&MAX_SESSIONS.to_string()));
    }

    #[test]
    fn the_cookie_is_found_among_others_and_origins_must_match_the_host() {
        assert_eq!(cookie_token(&cookie("abc")).as_deref(), Some("abc"));
        assert_eq!(cookie_token(&HeaderMap::new()), None);
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8009"));
        assert!(
            check_origin(&headers).is_ok(),
            "no Origin: same-origin GET or a tool"
        );
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8009"),
        );
        assert!(check_origin(&headers).is_ok());
        for bad in ["http://127.0.0.1:8010", "null", "https://evil.example"] {
            headers.insert(header::ORIGIN, HeaderValue::from_static(bad));
            assert_eq!(check_origin(&headers).unwrap_err().status, 403, "{bad}");
        }
    }
}
