//! The mock provider of the walkthrough: a small refunds API that only the gate's vaulted
//! credential opens (`mock-gate provider`).
//!
//! | Route | Purpose |
//! |---|---|
//! | `POST /refunds` | `{charge, amount, currency?}` → `{id, object: "refund", charge, amount, status}`; a charge starting `ch_decline` answers 402 `card_declined` |
//! | `GET /refunds` | `{"data": [...]}`: every refund recorded, with the request header *names* it saw |
//! | `POST /oauth/token` | OAuth2 client credentials (HTTP Basic or form `client_id`/`client_secret`), `oauth2` auth only |
//! | `GET /healthz` | liveness |
//!
//! Every route but `/healthz` and `/oauth/token` checks the credential ([`ProviderAuth`]): a
//! missing or wrong one is a 401 `authentication_error`, so a call that reached the provider
//! without going through the gate (the agent never holds the key) is refused. The optional
//! `x-provider-delay-ms` request header (at most 10 000) delays the answer, for timeout tests.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::signing::constant_time_eq;

/// The most refunds and tokens the provider keeps.
pub const MAX_RECORDS: usize = 100_000;
/// The longest delay `x-provider-delay-ms` may ask for.
pub const MAX_DELAY_MS: u64 = 10_000;

/// How the provider authenticates its callers.
pub enum ProviderAuth {
    /// `<name>: <key>`.
    Header {
        /// The header.
        name: HeaderName,
        /// The expected value.
        key: SecretString,
    },
    /// `Authorization: Bearer <key>`.
    Bearer(SecretString),
    /// Bearer tokens it issued at `POST /oauth/token` to this client.
    OAuth2 {
        /// The client id.
        client_id: String,
        /// The client secret.
        secret: SecretString,
        /// Token lifetime (seconds), sent as `expires_in`.
        token_ttl: u64,
    },
}

impl std::fmt::Debug for ProviderAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Header { name, .. } => write!(f, "Header({name})"),
            Self::Bearer(_) => f.write_str("Bearer"),
            Self::OAuth2 { client_id, .. } => write!(f, "OAuth2({client_id})"),
        }
    }
}

/// The provider's state.
#[derive(Debug)]
pub struct Provider {
    auth: ProviderAuth,
    refunds: Mutex<Refunds>,
    tokens: Mutex<VecDeque<SecretString>>,
    tokens_issued: AtomicU64,
    rejected: AtomicU64,
}

/// The recorded refunds, and how many each charge has (its next id, without a scan).
#[derive(Debug, Default)]
struct Refunds {
    list: Vec<Value>,
    per_charge: std::collections::HashMap<String, usize>,
}

impl Provider {
    /// A provider with no refunds yet.
    #[must_use]
    pub fn new(auth: ProviderAuth) -> Self {
        Self {
            auth,
            refunds: Mutex::new(Refunds::default()),
            tokens: Mutex::new(VecDeque::new()),
            tokens_issued: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    /// The refunds recorded so far.
    pub async fn refunds(&self) -> Vec<Value> {
        self.refunds.lock().await.list.clone()
    }

    /// How many OAuth2 tokens were issued.
    #[must_use]
    pub fn tokens_issued(&self) -> u64 {
        self.tokens_issued.load(Ordering::Relaxed)
    }

    /// How many calls were refused 401.
    #[must_use]
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    async fn authorised(&self, headers: &HeaderMap) -> bool {
        let get = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        let bearer = get(&header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        match &self.auth {
            ProviderAuth::Header { name, key } => get(name).is_some_and(|given| {
                constant_time_eq(given.as_bytes(), key.expose_secret().as_bytes())
            }),
            ProviderAuth::Bearer(key) => bearer.is_some_and(|given| {
                constant_time_eq(given.as_bytes(), key.expose_secret().as_bytes())
            }),
            ProviderAuth::OAuth2 { .. } => match bearer {
                None => false,
                Some(given) => self
                    .tokens
                    .lock()
                    .await
                    .iter()
                    .any(|t| constant_time_eq(given.as_bytes(), t.expose_secret().as_bytes())),
            },
        }
    }
}

/// The provider's routes.
pub fn router(provider: Arc<Provider>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok", "service": "mock-provider"})) }),
        )
        .route("/refunds", post(create_refund).get(list_refunds))
        .route("/oauth/token", post(token))
        .with_state(provider)
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"type": kind, "message": message}})),
    )
        .into_response()
}

async fn unauthorised(p: &Provider) -> Response {
    p.rejected.fetch_add(1, Ordering::Relaxed);
    error(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "missing or wrong API key",
    )
}

async fn delay(headers: &HeaderMap) {
    if let Some(ms) = headers
        .get("x-provider-delay-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        tokio::time::sleep(std::time::Duration::from_millis(ms.min(MAX_DELAY_MS))).await;
    }
}

async fn create_refund(
    State(p): State<Arc<Provider>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    delay(&headers).await;
    if !p.authorised(&headers).await {
        return unauthorised(&p).await;
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the body must be a JSON object",
        );
    };
    let Some(charge) = body.get("charge").and_then(Value::as_str) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "`charge` (a string) is required",
        );
    };
    let Some(amount) = body
        .get("amount")
        .filter(|a| a.is_number() || a.is_string())
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "`amount` is required",
        );
    };
    if charge.starts_with("ch_decline") {
        return (
            StatusCode::PAYMENT_REQUIRED,
            axum::Json(
                json!({"error": {"type": "card_error", "code": "card_declined",
                                        "message": "the card was declined"}}),
            ),
        )
            .into_response();
    }
    let mut refunds = p.refunds.lock().await;
    if refunds.list.len() >= MAX_RECORDS {
        return error(
            StatusCode::INSUFFICIENT_STORAGE,
            "api_error",
            "the mock provider is full",
        );
    }
    let earlier = refunds.per_charge.get(charge).copied().unwrap_or(0);
    let id = if earlier == 0 {
        format!("re_{charge}")
    } else {
        format!("re_{charge}_{}", earlier + 1)
    };
    let mut names: Vec<String> = headers.keys().map(|k| k.as_str().to_owned()).collect();
    names.sort();
    names.dedup();
    let refund = json!({
        "id": id,
        "object": "refund",
        "charge": charge,
        "amount": amount,
        "currency": body.get("currency").cloned().unwrap_or_else(|| json!("usd")),
        "status": "succeeded",
        "idempotency_key": headers.get("idempotency-key").and_then(|v| v.to_str().ok()),
        "headers": names,
    });
    refunds.list.push(refund.clone());
    *refunds.per_charge.entry(charge.to_owned()).or_default() += 1;
    drop(refunds);
    let mut answer = refund;
    if let Some(obj) = answer.as_object_mut() {
        obj.remove("headers");
    }
    axum::Json(answer).into_response()
}

async fn list_refunds(State(p): State<Arc<Provider>>, headers: HeaderMap) -> Response {
    if !p.authorised(&headers).await {
        return unauthorised(&p).await;
    }
    axum::Json(json!({"object": "list", "data": p.refunds().await})).into_response()
}

/// The client id and secret of a token request: HTTP Basic, else the form fields.
fn client_credentials(headers: &HeaderMap, body: &[u8]) -> Option<(String, String)> {
    if let Some(basic) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic.trim())
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (id, secret) = text.split_once(':')?;
        return Some((id.to_owned(), secret.to_owned()));
    }
    let form = std::str::from_utf8(body).ok()?;
    let mut id = None;
    let mut secret = None;
    for pair in form.split('&') {
        match pair.split_once('=') {
            Some(("client_id", v)) => id = Some(v.to_owned()),
            Some(("client_secret", v)) => secret = Some(v.to_owned()),
            _ => {}
        }
    }
    Some((id?, secret?))
}

async fn token(State(p): State<Arc<Provider>>, headers: HeaderMap, body: Bytes) -> Response {
    let ProviderAuth::OAuth2 {
        client_id,
        secret,
        token_ttl,
    } = &p.auth
    else {
        return error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "this provider does not issue tokens",
        );
    };
    let form = std::str::from_utf8(&body).unwrap_or_default();
    if !form
        .split('&')
        .any(|kv| kv == "grant_type=client_credentials")
    {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "unsupported_grant_type"})),
        )
            .into_response();
    }
    let ok = client_credentials(&headers, &body).is_some_and(|(id, given)| {
        id == *client_id && constant_time_eq(given.as_bytes(), secret.expose_secret().as_bytes())
    });
    if !ok {
        p.rejected.fetch_add(1, Ordering::Relaxed);
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "invalid_client"})),
        )
            .into_response();
    }
    let token = format!("tok_{}", uuid::Uuid::new_v4().simple());
    {
        let mut tokens = p.tokens.lock().await;
        if tokens.len() >= MAX_RECORDS {
            tokens.pop_front();
        }
        tokens.push_back(SecretString::from(token.clone()));
    }
    p.tokens_issued.fetch_add(1, Ordering::Relaxed);
    axum::Json(json!({"access_token": token, "token_type": "Bearer", "expires_in": token_ttl}))
        .into_response()
}
