//! Routing tests: the walkthrough configuration with a `routing` section and the `payments`
//! tool routed to an in-process mock provider on loopback.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt as _;
use secrecy::SecretString;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::{Routing, router_with};
use crate::admin::ApproverName;
use crate::config::Settings;
use crate::engine::{Gate, Resolution, SystemClock};
use crate::keys::SigningKey;
use crate::provider::{Provider, ProviderAuth};
use crate::store::MemoryStore;
use crate::vault::{self, VaultSettings};

const SECRET: &str = "sk_test_vaulted_51HxYzSecret";
const VAULT_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const AGENT: &str = "agent_refund_bot";
const AGENT_KEY: &str = "rgnt_agt_refund_bot_local";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Auth {
    Header,
    OAuth2,
}

struct Env {
    app: axum::Router,
    full: axum::Router,
    routing: Arc<Routing>,
    gate: Arc<Gate>,
    provider: Arc<Provider>,
    store: Arc<MemoryStore>,
    dir: tempfile::TempDir,
}

async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}")
}

fn walkthrough(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../policies-examples/regent-walkthrough")
            .join(name),
    )
    .unwrap()
}

async fn env_with(auth: Auth, upstream_url: Option<&str>, timeout_ms: u64) -> Env {
    env_full(auth, upstream_url, timeout_ms, "").await
}

/// [`env_with`], with `extra` lines added to the `routing:` section (indented two spaces).
async fn env_full(auth: Auth, upstream_url: Option<&str>, timeout_ms: u64, extra: &str) -> Env {
    let provider = Arc::new(Provider::new(match auth {
        Auth::Header => ProviderAuth::Header {
            name: HeaderName::from_static("x-api-key"),
            key: SecretString::from(SECRET),
        },
        Auth::OAuth2 => ProviderAuth::OAuth2 {
            client_id: "gate-client".into(),
            secret: SecretString::from(SECRET),
            token_ttl: 3600,
        },
    }));
    let provider_url = serve(crate::provider::router(provider.clone())).await;
    let base = upstream_url.unwrap_or(&provider_url);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.cedar"), walkthrough("policy.cedar")).unwrap();
    std::fs::write(dir.path().join("vault.key"), VAULT_KEY).unwrap();
    vault::put(
        &VaultSettings {
            file: dir.path().join("vault.json"),
            key_file: Some(dir.path().join("vault.key")),
            key: None,
        },
        "org_bank",
        "payments_api_key",
        &SecretString::from(SECRET),
    )
    .unwrap();
    let credential = match auth {
        Auth::Header => {
            "{kind: static_header, header: X-Api-Key, secret: payments_api_key}".to_owned()
        }
        Auth::OAuth2 => format!(
            "{{kind: oauth2, token_url: \"{provider_url}/oauth/token\", client_id: gate-client, \
             secret: payments_api_key, scope: refunds:write}}"
        ),
    };
    let upstream = format!(
        "    mandate: mnd_support_refunds\n    upstream:\n      base_url: \"{base}\"\n      \
         credential: {credential}\n      operation_map:\n        - {{method: POST, path: \
         /refunds, op: refund.create, amount_field: amount, reference_field: charge, \
         response_id_field: id}}\n"
    );
    let mut yaml =
        walkthrough("gate.yaml").replacen("    mandate: mnd_support_refunds\n", &upstream, 1);
    yaml.push_str(&format!(
        "\nrouting:\n  sidecar: {{agents: [agent_refund_bot]}}\n  gateway: true\n  \
         upstream_timeout_ms: {timeout_ms}\n  max_request_bytes: 4096\n  vault: {{file: \
         vault.json, key_file: vault.key}}\n{extra}"
    ));
    std::fs::write(dir.path().join("gate.yaml"), yaml).unwrap();
    let store = Arc::new(MemoryStore::new());
    let gate = open_gate(dir.path(), &store).await;
    let routing = Arc::new(Routing::new(gate.clone()));
    Env {
        app: router_with(routing.clone()),
        full: crate::router(gate.clone()),
        routing,
        gate,
        provider,
        store,
        dir,
    }
}

/// The gate of `dir`'s configuration and key on `store` (opening it again is a restart).
async fn open_gate(dir: &Path, store: &Arc<MemoryStore>) -> Arc<Gate> {
    let settings = Settings::load(&dir.join("gate.yaml")).unwrap();
    Arc::new(
        Gate::open(
            settings,
            SigningKey::load_or_create(&dir.join("gate-key.pem")).unwrap(),
            store.clone(),
            Arc::new(SystemClock),
        )
        .await
        .unwrap(),
    )
}

async fn env() -> Env {
    env_with(Auth::Header, None, 5000).await
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1:8080");
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_vec())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Answer {
        status,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        text,
    }
}

impl Env {
    fn token(&self, sub: &str, role: &str) -> String {
        self.gate
            .oidc()
            .unwrap()
            .mint_test_token(sub, role, Some(sub), chrono::Utc::now().timestamp())
            .unwrap()
    }

    /// The headers `SidecarSession.call` sends.
    fn agent_headers(
        &self,
        status: &str,
        original: u32,
        key: Option<&str>,
    ) -> Vec<(&'static str, String)> {
        let mut facts = json!({"account_status": status, "refund_to_original": true,
                               "reference_amount": original});
        if let Some(k) = key {
            facts["idempotency_key"] = json!(k);
        }
        vec![
            ("x-agent-id", AGENT.to_owned()),
            (
                "x-agent-user-token",
                self.token("alice@bank", "support_agent"),
            ),
            ("x-agent-intent", "refund the duplicate charge".to_owned()),
            ("x-agent-facts", facts.to_string()),
            ("content-type", "application/json".to_owned()),
        ]
    }

    async fn refund(
        &self,
        charge: &str,
        amount: u32,
        status: &str,
        original: u32,
        key: Option<&str>,
    ) -> Answer {
        let body = json!({"charge": charge, "amount": amount}).to_string();
        send(
            &self.app,
            "POST",
            "/payments/refunds",
            &self.agent_headers(status, original, key),
            body.as_bytes(),
        )
        .await
    }

    async fn audit_text(&self) -> String {
        crate::service::audit_jsonl(&self.gate.audit().await.unwrap()).unwrap()
    }
}

#[tokio::test]
async fn an_allowed_sidecar_call_is_forwarded_with_the_vaulted_key_and_completed() {
    let e = env().await;
    let mut headers = e.agent_headers("active", 80, Some("T-1:ch_aaa"));
    // The agent's own credentials and signatures never reach the provider.
    headers.push(("authorization", "Bearer agent-own-token".into()));
    headers.push(("cookie", "session=agent".into()));
    headers.push(("x-api-key", "agent-guess".into()));
    headers.push(("signature", "regent=:AAAA:".into()));
    headers.push(("x-trace", "kept".into()));
    headers.push(("accept-encoding", "gzip".into()));
    let a = send(
        &e.app,
        "POST",
        "/payments/refunds?expand=charge",
        &headers,
        br#"{"charge":"ch_aaa","amount":50}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.body["id"], "re_ch_aaa");
    assert_eq!(a.headers["content-type"], "application/json");
    let decision_id = a.headers["x-regent-decision-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let refunds = e.provider.refunds().await;
    assert_eq!(refunds.len(), 1);
    let seen: Vec<&str> = refunds[0]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    for gone in [
        "authorization",
        "cookie",
        "signature",
        "x-agent-id",
        "x-agent-user-token",
        "x-agent-facts",
        "x-agent-intent",
        "accept-encoding",
    ] {
        assert!(
            !seen.contains(&gone),
            "{gone} reached the provider: {seen:?}"
        );
    }
    assert!(
        seen.contains(&"x-api-key") && seen.contains(&"x-trace"),
        "{seen:?}"
    );
    assert_eq!(refunds[0]["idempotency_key"], "T-1:ch_aaa");
    assert_eq!(
        e.provider.rejected(),
        0,
        "the injected key, not the agent's guess, was sent"
    );
    assert_eq!(
        e.gate.completion_status(&decision_id).await,
        Some(crate::state::CompleteStatus::Success)
    );
    let audit = e.audit_text().await;
    assert!(
        audit.contains("re_ch_aaa"),
        "the provider id is the downstream_ref"
    );
    assert!(audit.contains("refund.create"));
    // No key or signature was checked on the sidecar: the record says so, never "bearer".
    let decision = audit_event(&audit, "gate.decision");
    assert_eq!(
        decision["payload"]["assertion_scheme"],
        "sidecar-unauthenticated"
    );
    assert_eq!(decision["payload"]["key_label"], "sidecar");
    assert_eq!(decision["payload"]["routed"], true);
    let receipt = audit_event(&audit, "gate.completed")["payload"]["receipt"]
        .as_str()
        .unwrap()
        .to_owned();
    let claims = jwt_claims(&receipt);
    assert_eq!(claims["assertion_scheme"], "sidecar-unauthenticated");
    assert_eq!(claims["key_custody"], "none");
    assert!(!audit.contains(SECRET), "the credential is never audited");
    assert!(!format!("{:?}", e.routing).contains(SECRET));
}

/// The last audit event of `event_type` in a JSON Lines export.
fn audit_event(audit: &str, event_type: &str) -> Value {
    audit
        .lines()
        .rev()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == event_type)
        .unwrap_or_else(|| panic!("no {event_type} in {audit}"))
}

/// A JWT's claims (its signature is the engine tests' subject).
fn jwt_claims(jwt: &str) -> Value {
    use base64::Engine as _;
    let payload = jwt.split('.').nth(1).unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn refusals_are_4xx_envelopes_and_never_reach_the_provider() {
    let e = env().await;
    let frozen = e.refund("ch_ccc", 50, "frozen", 60, None).await;
    assert_eq!(frozen.status, StatusCode::FORBIDDEN);
    assert_eq!(frozen.body["decision"], "deny");
    assert_eq!(frozen.body["code"], "POLICY_DENIED");
    assert!(
        frozen.body["reason"]
            .as_str()
            .unwrap()
            .contains("acct-frozen")
    );
    assert!(
        frozen.body["decision_id"]
            .as_str()
            .unwrap()
            .starts_with("dec_")
    );
    assert!(frozen.body.get("token").is_none());
    let over = e.refund("ch_ddd", 250, "active", 900, None).await;
    assert_eq!(
        (over.status, over.body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("MANDATE_LIMIT_EXCEEDED"))
    );
    let reference = e.refund("ch_eee", 45, "active", 30, None).await;
    assert_eq!(reference.body["code"], "EXCEEDS_REFERENCE");
    // An unmapped call is no catalog action.
    let unmapped = send(
        &e.app,
        "DELETE",
        "/payments/refunds",
        &e.agent_headers("active", 80, None),
        b"",
    )
    .await;
    assert_eq!(
        (unmapped.status, unmapped.body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("TOOL_NOT_ALLOWED"))
    );
    // An unknown tool is refused by the catalog.
    let unknown = send(
        &e.app,
        "POST",
        "/wire/send",
        &e.agent_headers("active", 80, None),
        b"{}",
    )
    .await;
    assert_eq!(unknown.body["code"], "TOOL_NOT_ALLOWED");
    assert!(e.provider.refunds().await.is_empty());
}

#[tokio::test]
async fn the_body_amount_wins_over_asserted_facts() {
    let e = env().await;
    let mut headers = e.agent_headers("active", 900, None);
    headers[3].1 = json!({"account_status": "active", "refund_to_original": true,
                          "reference_amount": 900, "amount_usd": 1, "amount": 1, "op": "refund.read"})
    .to_string();
    let a = send(
        &e.app,
        "POST",
        "/payments/refunds",
        &headers,
        br#"{"charge":"ch_x","amount":250}"#,
    )
    .await;
    assert_eq!(a.body["code"], "MANDATE_LIMIT_EXCEEDED", "{}", a.text);
    // A body without the mapped amount field is refused, not decided without an amount.
    let a = send(
        &e.app,
        "POST",
        "/payments/refunds",
        &headers,
        br#"{"charge":"ch_x"}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(a.text.contains("`amount`"), "{}", a.text);
}

#[tokio::test]
async fn an_approved_escalation_is_forwarded_once_and_its_retry_replays_the_answer() {
    let e = env().await;
    let first = e
        .refund("ch_bbb", 40, "review", 120, Some("T-2:ch_bbb"))
        .await;
    assert_eq!(first.status, StatusCode::FORBIDDEN);
    assert_eq!(first.body["decision"], "escalate");
    assert_eq!(first.body["code"], "ESCALATION_REQUIRED");
    let reference = first.body["escalation"]["ref"].as_str().unwrap().to_owned();
    // Still pending: the same refusal, nothing forwarded.
    let pending = e
        .refund("ch_bbb", 40, "review", 120, Some("T-2:ch_bbb"))
        .await;
    assert_eq!(pending.body["escalation"]["ref"], reference.as_str());
    e.gate
        .resolve(
            &reference,
            Resolution::Approve,
            &ApproverName::parse("bob@bank").unwrap(),
            Some(&e.token("bob@bank", "manager")),
            Some("reviewed".into()),
        )
        .await
        .unwrap();
    let allowed = e
        .refund("ch_bbb", 40, "review", 120, Some("T-2:ch_bbb"))
        .await;
    assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.text);
    assert_eq!(allowed.body["id"], "re_ch_bbb");
    assert!(allowed.headers.get("x-regent-replayed").is_none());
    let again = e
        .refund("ch_bbb", 40, "review", 120, Some("T-2:ch_bbb"))
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body, allowed.body);
    assert_eq!(again.headers["x-regent-replayed"], "true");
    assert_eq!(
        again.headers["x-regent-decision-id"],
        allowed.headers["x-regent-decision-id"]
    );
    assert_eq!(
        e.provider.refunds().await.len(),
        1,
        "forwarded once, never twice"
    );

    // A gate that no longer holds the answer (a restart) refuses rather than forwarding again.
    let fresh = Arc::new(Routing::new(e.gate.clone()));
    let after_restart = send(
        &router_with(fresh),
        "POST",
        "/payments/refunds",
        &e.agent_headers("review", 120, Some("T-2:ch_bbb")),
        br#"{"charge":"ch_bbb","amount":40}"#,
    )
    .await;
    assert_eq!(after_restart.status, StatusCode::CONFLICT);
    assert_eq!(after_restart.body["code"], "DUPLICATE_REQUEST");
    assert_eq!(e.provider.refunds().await.len(), 1);
}

#[tokio::test]
async fn a_provider_failure_completes_the_decision_as_failed_and_releases_the_hold() {
    let e = env().await;
    let declined = e
        .refund("ch_decline_1", 50, "active", 60, Some("k-decline"))
        .await;
    assert_eq!(
        declined.status,
        StatusCode::PAYMENT_REQUIRED,
        "the provider's answer as is"
    );
    assert_eq!(declined.body["error"]["code"], "card_declined");
    let id = declined.headers["x-regent-decision-id"].to_str().unwrap();
    assert_eq!(
        e.gate.completion_status(id).await,
        Some(crate::state::CompleteStatus::Failed)
    );
    // The released hold leaves the whole original charge refundable.
    let ok = e.refund("ch_decline_1", 60, "active", 60, None).await;
    assert_eq!(
        ok.status,
        StatusCode::PAYMENT_REQUIRED,
        "decided allow again: {}",
        ok.text
    );
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_envelope_and_a_failed_decision() {
    // A port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let e = env_with(Auth::Header, Some(&closed), 5000).await;
    let a = e.refund("ch_aaa", 50, "active", 80, None).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{}", a.text);
    assert_eq!(a.body["decision"], "deny");
    assert_eq!(a.body["code"], "INTERNAL_ERROR");
    let id = a.body["decision_id"].as_str().unwrap();
    assert_eq!(
        e.gate.completion_status(id).await,
        Some(crate::state::CompleteStatus::Failed)
    );
    assert!(!a.text.contains(SECRET));
}

#[tokio::test]
async fn upstream_time_and_request_size_are_bounded() {
    let e = env_with(Auth::Header, None, 300).await;
    let mut headers = e.agent_headers("active", 80, None);
    headers.push(("x-provider-delay-ms", "2000".into()));
    let started = std::time::Instant::now();
    let a = send(
        &e.app,
        "POST",
        "/payments/refunds",
        &headers,
        br#"{"charge":"ch_aaa","amount":50}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT, "{}", a.text);
    assert!(a.body["reason"].as_str().unwrap().contains("300 ms"));
    assert!(started.elapsed() < std::time::Duration::from_millis(1500));
    let big = format!(
        r#"{{"charge":"ch_aaa","amount":50,"pad":"{}"}}"#,
        "x".repeat(5000)
    );
    let a = send(
        &e.app,
        "POST",
        "/payments/refunds",
        &e.agent_headers("active", 80, None),
        big.as_bytes(),
    )
    .await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    let mut headers = e.agent_headers("active", 80, None);
    headers[3].1 = format!(r#"{{"pad":"{}"}}"#, "y".repeat(20_000));
    let a = send(
        &e.app,
        "POST",
        "/payments/refunds",
        &headers,
        br#"{"charge":"ch_aaa","amount":50}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(
        a.text.contains("x-agent-facts") && a.text.contains("16384"),
        "{}",
        a.text
    );
}

#[tokio::test]
async fn oauth2_tokens_are_fetched_once_and_cached() {
    let e = env_with(Auth::OAuth2, None, 5000).await;
    for (i, charge) in ["ch_o1", "ch_o2", "ch_o3"].iter().enumerate() {
        let a = e
            .refund(charge, 10, "active", 100, Some(&format!("o-{i}")))
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    }
    assert_eq!(e.provider.refunds().await.len(), 3);
    assert_eq!(e.provider.tokens_issued(), 1);
    assert_eq!(e.routing.token_fetches(), 1);
    assert_eq!(e.provider.rejected(), 0);
}

#[tokio::test]
async fn the_gateway_checks_the_key_and_the_sidecar_the_agent() {
    let e = env().await;
    let body = br#"{"charge":"ch_aaa","amount":50}"#;
    let mut headers: Vec<(&str, String)> = e
        .agent_headers("active", 80, None)
        .into_iter()
        .filter(|(k, _)| *k != "x-agent-id")
        .collect();
    let a = send(&e.app, "POST", "/gw/payments/refunds", &headers, body).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    headers.push(("authorization", "Bearer rgnt_agt_wrong".into()));
    let a = send(&e.app, "POST", "/gw/payments/refunds", &headers, body).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    headers.pop();
    headers.push(("authorization", format!("Bearer {AGENT_KEY}")));
    let a = send(&e.app, "POST", "/gw/payments/refunds", &headers, body).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.body["id"], "re_ch_aaa");
    let decision = audit_event(&e.audit_text().await, "gate.decision");
    assert_eq!(decision["payload"]["assertion_scheme"], "bearer");
    let seen = e.provider.refunds().await[0]["headers"].to_string();
    assert!(
        !seen.contains("authorization"),
        "the gate key is stripped: {seen}"
    );
    // An HMAC signature that does not match is refused.
    headers.push(("x-agent-signature", "hmac-sha256=00".into()));
    let a = send(&e.app, "POST", "/gw/payments/refunds", &headers, body).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);

    // Sidecar: without X-Agent-Id, or for an agent it does not serve, a 403 envelope.
    headers.retain(|(k, _)| !k.starts_with("authorization") && *k != "x-agent-signature");
    let a = send(&e.app, "POST", "/payments/refunds", &headers, body).await;
    assert_eq!(
        (a.status, a.body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("IDENTITY_NOT_RESOLVED"))
    );
    headers.push(("x-agent-id", "agent_suspended_bot".into()));
    let a = send(&e.app, "POST", "/payments/refunds", &headers, body).await;
    assert_eq!(a.body["code"], "IDENTITY_NOT_RESOLVED");
    assert!(a.text.contains("not served by this sidecar"));
}

#[tokio::test]
async fn routing_does_not_shadow_the_control_api_and_answers_the_sidecar_binary() {
    let e = env().await;
    let a = send(&e.full, "GET", "/healthz", &[], b"").await;
    assert_eq!(a.body["status"], "ok");
    let a = send(&e.full, "POST", "/v1/control/decisions", &[], b"{}").await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(
        a.body.get("decision").is_none(),
        "a control API error, not an envelope"
    );
    let a = send(
        &e.full,
        "GET",
        "/v1/control/.well-known/jwks.json",
        &[],
        b"",
    )
    .await;
    assert!(a.body["keys"].is_array());
    for path in ["/license/validate", "/v1/sidecar/license/validate"] {
        let a = send(&e.full, "POST", path, &[], b"{}").await;
        assert_eq!(a.body, json!({"valid": true, "tier": "dev"}), "{path}");
    }
    for path in ["/heartbeat", "/api/v1/heartbeat"] {
        let a = send(&e.full, "POST", path, &[], b"{}").await;
        assert_eq!(a.body, json!({"ok": true, "tier": "dev"}), "{path}");
    }
    // The full router routes sidecar calls too.
    let a = send(
        &e.full,
        "POST",
        "/payments/refunds",
        &e.agent_headers("active", 80, None),
        br#"{"charge":"ch_aaa","amount":50}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
}

#[tokio::test]
async fn the_provider_refuses_a_missing_or_wrong_key() {
    let e = env().await;
    let url = serve(crate::provider::router(e.provider.clone())).await;
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<axum::body::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    for key in [None, Some("wrong")] {
        let mut req = Request::builder()
            .method("POST")
            .uri(format!("{url}/refunds"))
            .header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        let resp = client
            .request(req.body(r#"{"charge":"ch_a","amount":1}"#.into()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(e.provider.rejected(), 2);
    assert!(e.provider.refunds().await.is_empty());
}

#[tokio::test]
async fn a_routed_decision_mints_no_allow_token() {
    let e = env().await;
    let caller = e.gate.authenticate_key(Some(AGENT_KEY)).unwrap();
    let request = |charge: &str| {
        crate::request::DecisionRequest::from_json(
            json!({"agent_id": AGENT, "tool": "payments", "action": "refund.create",
                   "context": {"amount": 5, "currency": "USD", "mandate_id": "mnd_support_refunds",
                               "user_token": e.token("alice@bank", "support_agent"),
                               "op": "refund.create", "account_status": "active",
                               "refund_to_original": true, "reference": charge,
                               "reference_amount": 50}})
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    };
    let routed = e
        .gate
        .decide_without_token(&caller, request("ch_r1"))
        .await
        .unwrap();
    assert_eq!(routed["decision"], "allow");
    assert!(routed.get("token").is_none(), "{routed}");
    let direct = e
        .gate
        .decide(&caller, request("ch_r2"), None)
        .await
        .unwrap();
    assert_eq!(direct["decision"], "allow");
    assert!(direct["token"].is_string());
}

/// An upstream that takes the first refund and never answers it (the gate is "killed" while
/// waiting), then answers every later one; it counts what it received.
async fn hanging_upstream() -> (
    String,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<tokio::sync::Notify>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(tokio::sync::Notify::new());
    let (h, n) = (hits.clone(), arrived.clone());
    let app = axum::Router::new().route(
        "/refunds",
        axum::routing::post(move || {
            let (h, n) = (h.clone(), n.clone());
            async move {
                let nth = h.fetch_add(1, Ordering::SeqCst);
                n.notify_one();
                if nth == 0 {
                    std::future::pending::<()>().await;
                }
                axum::Json(json!({"id": format!("re_{nth}")}))
            }
        }),
    );
    (serve(app).await, hits, arrived)
}

#[tokio::test]
async fn a_call_forwarded_before_a_restart_is_not_forwarded_again_until_someone_completes_it() {
    use std::sync::atomic::Ordering;
    let (upstream, hits, arrived) = hanging_upstream().await;
    let e = env_with(Auth::Header, Some(&upstream), 60_000).await;
    let headers = e.agent_headers("active", 80, Some("T-7:ch_rst"));
    let body = br#"{"charge":"ch_rst","amount":50}"#.to_vec();
    // The first call reaches the provider; the gate dies before the answer (the task is dropped,
    // so the decision is never completed).
    let first = {
        let (app, headers, body) = (e.app.clone(), headers.clone(), body.clone());
        tokio::spawn(async move { send(&app, "POST", "/payments/refunds", &headers, &body).await })
    };
    arrived.notified().await;
    first.abort();
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // Restart: the same log, a new process.
    let gate = open_gate(e.dir.path(), &e.store).await;
    let app = router_with(Arc::new(Routing::new(gate.clone())));
    let retry = send(&app, "POST", "/payments/refunds", &headers, &body).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{}", retry.text);
    assert_eq!(retry.body["code"], "DUPLICATE_REQUEST");
    assert!(retry.text.contains("outcome is unknown"), "{}", retry.text);
    let decision_id = retry.body["decision_id"].as_str().unwrap().to_owned();
    assert_eq!(
        gate.forward_state(&decision_id).await,
        crate::ForwardState::OutcomeUnknown
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1, "never forwarded twice");

    // Someone holding the org key checks with the provider and settles it (the sidecar's agent
    // holds no key, so it cannot).
    let org = gate
        .authenticate_key(Some("rgnt_ctrl_walkthrough_local"))
        .unwrap();
    gate.complete(
        &org,
        &decision_id,
        br#"{"status":"failed","error":"checked: not refunded"}"#,
    )
    .await
    .unwrap();
    let again = send(&app, "POST", "/payments/refunds", &headers, &body).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert_ne!(
        again.headers["x-regent-decision-id"].to_str().unwrap(),
        decision_id,
        "a fresh decision after the failed one"
    );
}

#[tokio::test]
async fn the_provider_numbers_repeated_refunds_of_a_charge() {
    let e = env().await;
    let app = crate::provider::router(e.provider.clone());
    let headers = [("x-api-key", SECRET.to_owned())];
    let mut ids = Vec::new();
    for charge in ["ch_num", "ch_other", "ch_num", "ch_num"] {
        let body = json!({"charge": charge, "amount": 1}).to_string();
        let a = send(&app, "POST", "/refunds", &headers, body.as_bytes()).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text);
        ids.push(a.body["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        ids,
        ["re_ch_num", "re_ch_other", "re_ch_num_2", "re_ch_num_3"]
    );
    assert_eq!(e.provider.refunds().await.len(), 4);
}

/// A TLS listener for `axum::serve`: each connection is handshaken before it is served (a
/// failed handshake is dropped).
struct TlsListener {
    tcp: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(stream) = self.tls.accept(tcp).await {
                return (stream, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// The mock provider of `provider` behind TLS with a certificate of `ca`: `https://127.0.0.1:…`.
async fn serve_tls(provider: Arc<Provider>, ca: &phrony_test_support::pki::TestCa) -> String {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let pem = ca.server();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from_pem_slice(pem.cert.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).unwrap(),
    )
    .unwrap();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = TlsListener {
        tcp,
        tls: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    let app = crate::provider::router(provider);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("https://127.0.0.1:{}", addr.port())
}

#[tokio::test]
async fn https_upstreams_are_verified_against_the_configured_ca() {
    let ca = phrony_test_support::pki::TestCa::new("provider test CA");
    let provider = Arc::new(Provider::new(ProviderAuth::Header {
        name: HeaderName::from_static("x-api-key"),
        key: SecretString::from(SECRET),
    }));
    let url = serve_tls(provider.clone(), &ca).await;

    // Trusted through `routing.ca_file`: forwarded with the vaulted key, over TLS.
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write(ca_dir.path(), "provider-ca");
    let e = env_full(
        Auth::Header,
        Some(&url),
        5000,
        &format!("  ca_file: \"{}\"\n", ca_file.display()),
    )
    .await;
    let a = e
        .refund("ch_tls", 50, "active", 80, Some("T-1:ch_tls"))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.body["id"], "re_ch_tls");
    assert_eq!(provider.refunds().await.len(), 1);
    assert_eq!(provider.rejected(), 0);

    // Not trusted (no CA file, and not a system root): the handshake fails, nothing is sent,
    // the caller gets a 502 envelope naming the certificate problem, the decision is failed.
    let untrusted = env_with(Auth::Header, Some(&url), 5000).await;
    let a = untrusted
        .refund("ch_tls2", 50, "active", 80, Some("T-2:ch_tls2"))
        .await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{}", a.text);
    assert_eq!(a.body["code"], "INTERNAL_ERROR");
    assert!(
        a.text.to_lowercase().contains("certificate"),
        "the reason names the certificate problem: {}",
        a.text
    );
    let id = a.body["decision_id"].as_str().unwrap();
    assert_eq!(
        untrusted.gate.completion_status(id).await,
        Some(crate::state::CompleteStatus::Failed)
    );
    assert_eq!(
        provider.refunds().await.len(),
        1,
        "nothing reached the provider"
    );
}

#[tokio::test]
async fn a_bad_ca_file_or_a_clear_text_remote_upstream_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let base = walkthrough("gate.yaml");
    let load = |upstream: &str, routing_extra: &str| {
        let upstream = format!(
            "    mandate: mnd_support_refunds\n    upstream:\n      base_url: \"{upstream}\"\n      \
             operation_map:\n        - {{method: POST, path: /refunds, op: refund.create}}\n"
        );
        let mut yaml = base.replacen("    mandate: mnd_support_refunds\n", &upstream, 1);
        yaml.push_str(&format!(
            "\nrouting:\n  sidecar: {{agents: [agent_refund_bot]}}\n{routing_extra}"
        ));
        std::fs::write(dir.path().join("policy.cedar"), walkthrough("policy.cedar")).unwrap();
        std::fs::write(dir.path().join("gate.yaml"), yaml).unwrap();
        Settings::load(&dir.path().join("gate.yaml"))
    };
    let err = load("http://payments.internal:8010", "")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("upstream.base_url") && err.contains("allow_insecure_http"),
        "{err}"
    );
    load(
        "http://payments.internal:8010",
        "  allow_insecure_http: true\n",
    )
    .unwrap();
    load("https://payments.example", "").unwrap();
    std::fs::write(dir.path().join("not-a-ca.pem"), "hello").unwrap();
    let err = load("https://payments.example", "  ca_file: not-a-ca.pem\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("routing.ca_file") && err.contains("not-a-ca.pem"),
        "{err}"
    );
}
