//! Engine tests on the shipped walkthrough configuration
//! (`policies-examples/regent-walkthrough/`), with a manual clock and an in-memory store.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeZone as _, Utc};
use serde_json::{Value, json};

use crate::admin::ApproverName;
use crate::config::Settings;
use crate::engine::{Caller, Clock, Gate, Resolution, codes};
use crate::keys::SigningKey;
use crate::request::DecisionRequest;
use crate::store::{GateStore, MemoryStore};

const ORG_KEY: &str = "rgnt_ctrl_walkthrough_local";
const AGENT: &str = "agent_refund_bot";

#[derive(Debug)]
struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    fn new() -> Arc<Self> {
        Arc::new(Self(Mutex::new(Utc::now())))
    }
    fn advance(&self, seconds: i64) {
        let mut now = self.0.lock().unwrap();
        *now += chrono::Duration::seconds(seconds);
    }
    fn set(&self, t: DateTime<Utc>) {
        *self.0.lock().unwrap() = t;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

fn walkthrough_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/regent-walkthrough")
}

/// A copy of the walkthrough directory with `edit` applied to gate.yaml.
fn config_dir(edit: impl Fn(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["gate.yaml", "policy.cedar"] {
        let text = std::fs::read_to_string(walkthrough_dir().join(name)).unwrap();
        let text = if name == "gate.yaml" {
            edit(text)
        } else {
            text
        };
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

struct Harness {
    gate: Gate,
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    dir: tempfile::TempDir,
    key_pem: PathBuf,
}

async fn harness_with(edit: impl Fn(String) -> String) -> Harness {
    let dir = config_dir(edit);
    let clock = ManualClock::new();
    let store = Arc::new(MemoryStore::new());
    let key_pem = dir.path().join("gate-key.pem");
    let settings = Settings::load(&dir.path().join("gate.yaml")).unwrap();
    let gate = Gate::open(
        settings,
        SigningKey::load_or_create(&key_pem).unwrap(),
        store.clone(),
        clock.clone(),
    )
    .await
    .unwrap();
    Harness {
        gate,
        clock,
        store,
        dir,
        key_pem,
    }
}

async fn harness() -> Harness {
    harness_with(|s| s).await
}

impl Harness {
    fn caller(&self, key: &str) -> Caller {
        self.gate.authenticate_key(Some(key)).unwrap()
    }

    fn token(&self, sub: &str, role: &str) -> String {
        self.gate
            .oidc()
            .unwrap()
            .mint_test_token(sub, role, Some(sub), self.clock.now().timestamp())
            .unwrap()
    }

    fn rep(&self) -> String {
        self.token("alice@bank", "support_agent")
    }

    fn manager(&self) -> String {
        self.token("bob@bank", "manager")
    }

    /// A walkthrough refund request as the SDK builds it.
    fn refund(
        &self,
        amount: Value,
        status: &str,
        charge: &str,
        original: &str,
        key: Option<&str>,
    ) -> Value {
        let mut context = json!({
            "amount_usd": amount,
            "mandate_id": "mnd_support_refunds",
            "user_token": self.rep(),
            "intent": "refund the duplicate charge",
            "op": "refund.create",
            "account_status": status,
            "refund_to_original": true,
            "customer_id": "cus_1",
            "reference": charge,
            "reference_amount": original,
        });
        if let Some(key) = key {
            context["idempotency_key"] = json!(key);
        }
        json!({
            "agent_id": AGENT, "tool": "payments", "action": "refund.create",
            "resource": format!("charges/{charge}"), "args": {}, "context": context,
        })
    }

    async fn decide_as(&self, key: &str, body: &Value) -> Result<Value, crate::ApiError> {
        let req = DecisionRequest::from_json(&serde_json::to_vec(body).unwrap())?;
        self.gate.decide(&self.caller(key), req, None).await
    }

    async fn decide(&self, body: &Value) -> Value {
        self.decide_as(ORG_KEY, body).await.unwrap()
    }

    async fn complete(&self, decision_id: &str, status: &str) -> Value {
        let body = json!({"status": status, "downstream_ref": "re_1", "error": null});
        self.gate
            .complete(
                &self.caller(ORG_KEY),
                decision_id,
                body.to_string().as_bytes(),
            )
            .await
            .unwrap()
    }

    fn verify_token(&self, token: &str) -> Value {
        let jwks = self.gate.jwks();
        let jwk = &jwks["keys"][0];
        let header = jsonwebtoken::decode_header(token).unwrap();
        assert_eq!(header.kid.as_deref(), jwk["kid"].as_str());
        let key = jsonwebtoken::DecodingKey::from_rsa_components(
            jwk["n"].as_str().unwrap(),
            jwk["e"].as_str().unwrap(),
        )
        .unwrap();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.validate_aud = false;
        validation.validate_exp = false;
        jsonwebtoken::decode::<Value>(token, &key, &validation)
            .unwrap()
            .claims
    }
}

fn approver(name: &str) -> ApproverName {
    ApproverName::parse(name).unwrap()
}

/// The walkthrough's manager, who approves with a manager id_token.
fn bob() -> ApproverName {
    approver("bob@bank")
}

fn code(d: &Value) -> &str {
    d["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn the_five_walkthrough_outcomes() {
    let h = harness().await;

    // $50 · active · to original → allow, with a verifiable scoped token.
    let d = h
        .decide(&h.refund(json!(50), "active", "ch_aaa", "80.00", Some("T1:ch_aaa")))
        .await;
    assert_eq!(d["decision"], "allow", "{d}");
    let claims = h.verify_token(d["token"].as_str().unwrap());
    assert_eq!(claims["aud"], "payments");
    assert_eq!(claims["scope"], "payments:refund.create");
    assert_eq!(claims["decision_id"], d["decision_id"]);
    assert_eq!(claims["amount"], json!(50.0));
    assert_eq!(claims["currency"], "USD");
    assert_eq!(claims["mandate_id"], "mnd_support_refunds");
    assert_eq!(claims["policy_source"], "org");
    assert_eq!(claims["user_role"], "support_agent");
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        60
    );

    // Account under review → escalate → a manager approves → the retry with the same key allows.
    let review = h.refund(json!(40), "review", "ch_bbb", "100.00", Some("T2:ch_bbb"));
    let e = h.decide(&review).await;
    assert_eq!(e["decision"], "escalate", "{e}");
    assert_eq!(code(&e), codes::ESCALATION_REQUIRED);
    assert_eq!(e["escalation"]["approver"], "manager");
    assert_eq!(e["escalation"]["type"], "manual");
    let reference = e["escalation"]["ref"].as_str().unwrap().to_owned();
    // Retrying while pending answers with the same escalation, and no second approval.
    let again = h.decide(&review).await;
    assert_eq!(again["escalation"]["ref"], e["escalation"]["ref"]);
    assert_eq!(again["decision_id"], e["decision_id"]);
    assert_eq!(h.gate.approvals(Some("pending")).await.len(), 1);
    let approved = h
        .gate
        .resolve(
            &reference,
            Resolution::Approve,
            &bob(),
            Some(&h.manager()),
            Some("ok".into()),
        )
        .await
        .unwrap();
    assert_eq!(approved["status"], "approved");
    let allowed = h.decide(&review).await;
    assert_eq!(allowed["decision"], "allow", "{allowed}");
    let pending = h.gate.approvals(None).await;
    assert_eq!(pending[0]["status"], "consumed");

    // Frozen account → deny POLICY_DENIED naming acct-frozen.
    let f = h
        .decide(&h.refund(json!(50), "frozen", "ch_ccc", "80.00", Some("T3")))
        .await;
    assert_eq!(f["decision"], "deny");
    assert_eq!(code(&f), codes::POLICY_DENIED);
    assert!(f["reason"].as_str().unwrap().contains("acct-frozen"), "{f}");

    // $250 → deny MANDATE_LIMIT_EXCEEDED (over the $200 per-transaction cap).
    let big = h
        .decide(&h.refund(json!(250), "active", "ch_ddd", "900.00", Some("T4")))
        .await;
    assert_eq!(code(&big), codes::MANDATE_LIMIT_EXCEEDED, "{big}");
    assert_eq!(big["currency"], "USD");

    // Refund above the original charge → deny EXCEEDS_REFERENCE.
    let over = h
        .decide(&h.refund(json!(90), "active", "ch_eee", "80.00", Some("T5")))
        .await;
    assert_eq!(code(&over), codes::EXCEEDS_REFERENCE, "{over}");
}

#[tokio::test]
async fn a_hard_cap_is_never_sent_to_a_human() {
    // Under review AND over the per-tx cap: denied, not escalated.
    let h = harness().await;
    let d = h
        .decide(&h.refund(json!(250), "review", "ch_1", "900", Some("k")))
        .await;
    assert_eq!(d["decision"], "deny");
    assert_eq!(code(&d), codes::MANDATE_LIMIT_EXCEEDED);
    assert!(h.gate.approvals(None).await.is_empty());
}

#[tokio::test]
async fn missing_and_mistyped_facts_fail_closed() {
    let h = harness().await;
    let mut body = h.refund(json!(50), "frozen", "ch_1", "80", None);
    body["context"]
        .as_object_mut()
        .unwrap()
        .remove("account_status");
    let d = h.decide(&body).await;
    assert_eq!(code(&d), codes::POLICY_DENIED);
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .contains("missing fact `account_status`"),
        "{d}"
    );

    let mut body = h.refund(json!(50), "active", "ch_1", "80", None);
    body["context"]["refund_to_original"] = json!("false");
    let d = h.decide(&body).await;
    assert_eq!(code(&d), codes::POLICY_DENIED);
    assert!(
        d["reason"].as_str().unwrap().contains("must be a bool"),
        "{d}"
    );

    // A mandate-bound tool without an amount fails closed too.
    let mut body = h.refund(json!(50), "active", "ch_1", "80", None);
    body["context"]
        .as_object_mut()
        .unwrap()
        .remove("amount_usd");
    let d = h.decide(&body).await;
    assert_eq!(code(&d), codes::POLICY_DENIED);
    assert!(
        d["reason"].as_str().unwrap().contains("needs amount_usd"),
        "{d}"
    );

    // So does a relational-cap mandate without a reference.
    let mut body = h.refund(json!(50), "active", "ch_1", "80", None);
    body["context"].as_object_mut().unwrap().remove("reference");
    let d = h.decide(&body).await;
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .contains("missing fact `reference`"),
        "{d}"
    );
}

#[tokio::test]
async fn asserted_roles_and_activity_are_overwritten() {
    let h = harness().await;
    // No user token, but the client asserts the role: the permit cannot match.
    let mut body = h.refund(json!(50), "active", "ch_1", "80", None);
    let ctx = body["context"].as_object_mut().unwrap();
    ctx.remove("user_token");
    ctx.insert("user_role".into(), json!("support_agent"));
    let d = h.decide(&body).await;
    assert_eq!(d["decision"], "deny");
    assert!(d["reason"].as_str().unwrap().contains("user_role"), "{d}");

    // A verified intern asserting support_agent is still an intern.
    let mut body = h.refund(json!(50), "active", "ch_1", "80", None);
    body["context"]["user_token"] = json!(h.token("eve@bank", "intern"));
    body["context"]["user_role"] = json!("support_agent");
    body["context"]["agent_active"] = json!(true);
    let d = h.decide(&body).await;
    assert_eq!(code(&d), codes::POLICY_DENIED);
    assert!(d["reason"].as_str().unwrap().contains("no permit"), "{d}");

    // A token from another IdP key does not verify.
    let mut body = h.refund(json!(50), "active", "ch_1", "80", None);
    let foreign = SigningKey::generate().unwrap();
    body["context"]["user_token"] = json!(
        foreign
            .sign(
                "JWT",
                &json!({"iss": "https://idp.bank.example", "aud": "regent-gate", "sub": "x",
                        "role": "support_agent", "exp": 4_000_000_000_u64})
            )
            .unwrap()
    );
    let d = h.decide(&body).await;
    assert_eq!(code(&d), codes::IDENTITY_NOT_RESOLVED, "{d}");
}

#[tokio::test]
async fn idempotent_replays_never_count_twice_and_keys_are_bound_to_one_request() {
    let h = harness().await;
    let body = h.refund(json!(60), "active", "ch_1", "100", Some("T1:ch_1"));
    let first = h.decide(&body).await;
    assert_eq!(first["decision"], "allow");
    // A re-send (a fresh user token and other wording do not change the request).
    let mut resend = body.clone();
    resend["context"]["user_token"] = json!(h.rep());
    resend["context"]["intent"] = json!("retrying");
    let second = h.decide(&resend).await;
    assert_eq!(second["decision"], "allow");
    assert_eq!(second["decision_id"], first["decision_id"]);
    assert_ne!(second["token"], first["token"]);
    // 60 counted once: another 40 fits under the original 100 …
    let more = h
        .decide(&h.refund(json!(40), "active", "ch_1", "100", Some("T2:ch_1")))
        .await;
    assert_eq!(more["decision"], "allow", "{more}");
    // … and now nothing more does.
    let full = h
        .decide(&h.refund(json!(1), "active", "ch_1", "100", Some("T3:ch_1")))
        .await;
    assert_eq!(code(&full), codes::EXCEEDS_REFERENCE);

    // The same key for a different request is refused (HTTP 409), nothing is recorded.
    let events_before = h.store.load().await.unwrap().len();
    let other = h.refund(json!(61), "active", "ch_1", "100", Some("T1:ch_1"));
    let err = h.decide_as(ORG_KEY, &other).await.unwrap_err();
    assert_eq!(err.status, 409);
    assert!(err.detail.contains("different request"), "{}", err.detail);
    assert_eq!(h.store.load().await.unwrap().len(), events_before);
}

#[tokio::test]
async fn the_relational_cap_is_cumulative_and_pinned() {
    let h = harness().await;
    for (i, amount) in [40, 40].into_iter().enumerate() {
        let d = h
            .decide(&h.refund(
                json!(amount),
                "active",
                "ch_9",
                "100.00",
                Some(&format!("k{i}")),
            ))
            .await;
        assert_eq!(d["decision"], "allow", "{d}");
        h.complete(d["decision_id"].as_str().unwrap(), "success")
            .await;
    }
    let d = h
        .decide(&h.refund(json!(30), "active", "ch_9", "100.00", Some("k3")))
        .await;
    assert_eq!(code(&d), codes::EXCEEDS_REFERENCE);
    assert!(d["reason"].as_str().unwrap().contains("110.00"), "{d}");
    // Claiming a bigger original charge later does not reopen the cap.
    let d = h
        .decide(&h.refund(json!(30), "active", "ch_9", "500.00", Some("k4")))
        .await;
    assert_eq!(code(&d), codes::EXCEEDS_REFERENCE);
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .contains("recorded with amount 100.00"),
        "{d}"
    );
    // 20 still fits exactly.
    let d = h
        .decide(&h.refund(json!("20.00"), "active", "ch_9", "100.00", Some("k5")))
        .await;
    assert_eq!(d["decision"], "allow", "{d}");
}

#[tokio::test]
async fn holds_are_released_on_failed_completion_and_committed_on_success() {
    let h = harness().await;
    let d = h
        .decide(&h.refund(json!(80), "active", "ch_5", "100", Some("a")))
        .await;
    let id = d["decision_id"].as_str().unwrap().to_owned();
    // While held, another 80 does not fit.
    let blocked = h
        .decide(&h.refund(json!(80), "active", "ch_5", "100", Some("b")))
        .await;
    assert_eq!(code(&blocked), codes::EXCEEDS_REFERENCE);
    let done = h.complete(&id, "failed").await;
    assert_eq!(done["recorded"], true);
    assert_eq!(done["mandate_reconciled"], true);
    let receipt = h.verify_token(done["receipt"].as_str().unwrap());
    assert_eq!(receipt["aud"], "regent-receipt");
    assert_eq!(receipt["status"], "failed");
    // Completing again with the same status answers the same; another status conflicts.
    assert_eq!(h.complete(&id, "failed").await["receipt"], done["receipt"]);
    let err = h
        .gate
        .complete(&h.caller(ORG_KEY), &id, br#"{"status":"success"}"#)
        .await
        .unwrap_err();
    assert_eq!(err.status, 409);
    // Released: the retry fits now, and a retry of the failed key is decided afresh.
    let retry = h
        .decide(&h.refund(json!(80), "active", "ch_5", "100", Some("a")))
        .await;
    assert_eq!(retry["decision"], "allow", "{retry}");
    assert_ne!(retry["decision_id"], d["decision_id"]);
    h.complete(retry["decision_id"].as_str().unwrap(), "success")
        .await;
    let after = h
        .decide(&h.refund(json!(80), "active", "ch_5", "100", Some("c")))
        .await;
    assert_eq!(code(&after), codes::EXCEEDS_REFERENCE);
}

#[tokio::test]
async fn a_restarted_gate_keeps_its_pending_escalation() {
    let h = harness().await;
    let body = h.refund(json!(40), "review", "ch_r", "100", Some("T9"));
    let e = h.decide(&body).await;
    let reference = e["escalation"]["ref"].as_str().unwrap().to_owned();

    // Reopen on the same store and key, as after a crash.
    let settings = Settings::load(&h.dir.path().join("gate.yaml")).unwrap();
    let reopened = Gate::open(
        settings,
        SigningKey::load_or_create(&h.key_pem).unwrap(),
        h.store.clone(),
        h.clock.clone(),
    )
    .await
    .unwrap();
    let pending = reopened.approvals(Some("pending")).await;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["ref"], reference.as_str());
    assert_eq!(pending[0]["on_behalf_of"]["sub"], "alice@bank");
    reopened
        .resolve(
            &reference,
            Resolution::Approve,
            &bob(),
            Some(&h.manager()),
            None,
        )
        .await
        .unwrap();
    let req = DecisionRequest::from_json(&serde_json::to_vec(&body).unwrap()).unwrap();
    let d = reopened
        .decide(
            &reopened.authenticate_key(Some(ORG_KEY)).unwrap(),
            req,
            None,
        )
        .await
        .unwrap();
    assert_eq!(d["decision"], "allow", "{d}");
    assert_eq!(h.store.verify().await.unwrap(), None);
}

#[tokio::test]
async fn rejections_expiry_and_approver_rules() {
    let h = harness().await;
    let body = h.refund(json!(40), "review", "ch_x", "100", Some("R1"));
    let e = h.decide(&body).await;
    let reference = e["escalation"]["ref"].as_str().unwrap().to_owned();
    // The admin key alone is not enough here (require_approver_token).
    let err = h
        .gate
        .resolve(&reference, Resolution::Approve, &bob(), None, None)
        .await
        .unwrap_err();
    assert_eq!(err.status, 403);
    // A rep cannot approve; the requesting user cannot approve their own request.
    let err = h
        .gate
        .resolve(
            &reference,
            Resolution::Approve,
            &approver("carol@bank"),
            Some(&h.token("carol@bank", "support_agent")),
            None,
        )
        .await
        .unwrap_err();
    assert!(err.detail.contains("needs `manager`"), "{}", err.detail);
    let err = h
        .gate
        .resolve(
            &reference,
            Resolution::Approve,
            &approver("alice@bank"),
            Some(&h.token("alice@bank", "manager")),
            None,
        )
        .await
        .unwrap_err();
    assert!(err.detail.contains("cannot approve"), "{}", err.detail);
    h.gate
        .resolve(
            &reference,
            Resolution::Reject,
            &bob(),
            Some(&h.manager()),
            Some("not this one".into()),
        )
        .await
        .unwrap();
    let d = h.decide(&body).await;
    assert_eq!(code(&d), codes::POLICY_DENIED);
    let reason = d["reason"].as_str().unwrap();
    assert!(
        reason.contains("rejected by bob@bank (manager): not this one"),
        "{reason}"
    );
    let err = h
        .gate
        .resolve(
            &reference,
            Resolution::Approve,
            &bob(),
            Some(&h.manager()),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.status, 409);

    // An escalation nobody decides expires.
    let body = h.refund(json!(40), "review", "ch_y", "100", Some("R2"));
    h.decide(&body).await;
    h.clock.advance(86_401);
    let d = h.decide(&body).await;
    assert!(d["reason"].as_str().unwrap().contains("expired"), "{d}");
    assert_eq!(h.gate.approvals(Some("expired")).await.len(), 1);
}

#[tokio::test]
async fn identity_agent_tool_and_mandate_codes() {
    let h = harness().await;
    let mut body = h.refund(json!(10), "active", "ch_1", "80", None);
    body["agent_id"] = json!("agent_unknown");
    assert_eq!(code(&h.decide(&body).await), codes::IDENTITY_NOT_RESOLVED);

    // A key bound to the refund bot is refused for another agent id.
    let mut body = h.refund(json!(10), "active", "ch_1", "80", None);
    body["agent_id"] = json!("agent_suspended_bot");
    let d = h
        .decide_as("rgnt_agt_refund_bot_local", &body)
        .await
        .unwrap();
    assert_eq!(code(&d), codes::IDENTITY_NOT_RESOLVED);
    // With the org key the suspended agent is resolved but not active.
    assert_eq!(code(&h.decide(&body).await), codes::AGENT_NOT_ACTIVE);

    let mut body = h.refund(json!(10), "active", "ch_1", "80", None);
    body["tool"] = json!("wire_transfer");
    assert_eq!(code(&h.decide(&body).await), codes::TOOL_NOT_ALLOWED);
    let mut body = h.refund(json!(10), "active", "ch_1", "80", None);
    body["action"] = json!("refund.delete");
    assert_eq!(code(&h.decide(&body).await), codes::TOOL_NOT_ALLOWED);

    let mut body = h.refund(json!(10), "active", "ch_1", "80", None);
    let ctx = body["context"].as_object_mut().unwrap();
    ctx.remove("amount_usd");
    ctx.insert("amount".into(), json!(10));
    ctx.insert("currency".into(), json!("EUR"));
    let d = h.decide(&body).await;
    assert_eq!(code(&d), codes::MANDATE_NOT_FOUND, "{d}");
    assert_eq!(d["currency"], "EUR");

    // Unknown keys are not decisions.
    assert_eq!(
        h.gate
            .authenticate_key(Some("nope-nope-nope"))
            .unwrap_err()
            .status,
        401
    );
    assert_eq!(h.gate.authenticate_key(None).unwrap_err().status, 401);
}

#[tokio::test]
async fn duplicates_and_velocity() {
    let h = harness_with(|s| {
        s.replace(
            "velocity: {max: 120, window_seconds: 60}",
            "velocity: {max: 4, window_seconds: 60}",
        )
    })
    .await;
    let body = h.refund(json!(10), "active", "ch_d", "80", None);
    assert_eq!(h.decide(&body).await["decision"], "allow");
    let dup = h.decide(&body).await;
    assert_eq!(code(&dup), codes::DUPLICATE_REQUEST, "{dup}");
    h.clock.advance(61);
    assert_eq!(h.decide(&body).await["decision"], "allow");
    // 3 decisions in this window so far (allow, dup-deny at t0 are 61 s old): fill it up.
    assert_eq!(
        h.decide(&h.refund(json!(1), "active", "ch_e", "80", None))
            .await["decision"],
        "allow"
    );
    assert_eq!(
        h.decide(&h.refund(json!(2), "active", "ch_e", "80", None))
            .await["decision"],
        "allow"
    );
    assert_eq!(
        h.decide(&h.refund(json!(3), "active", "ch_e", "80", None))
            .await["decision"],
        "allow"
    );
    let v = h
        .decide(&h.refund(json!(4), "active", "ch_e", "80", None))
        .await;
    assert_eq!(code(&v), codes::VELOCITY_EXCEEDED, "{v}");
}

#[tokio::test]
async fn daily_and_per_entity_caps_use_utc_windows() {
    let h = harness_with(|s| {
        s.replace("daily_limit: \"5000.00\"", "daily_limit: \"300.00\"")
            .replace(
                "per_entity_limit: \"1000.00\"",
                "per_entity_limit: \"250.00\"",
            )
    })
    .await;
    h.clock
        .set(Utc.with_ymd_and_hms(2026, 3, 31, 23, 0, 0).unwrap());
    for (i, charge) in ["c1", "c2"].into_iter().enumerate() {
        let d = h
            .decide(&h.refund(json!(120), "active", charge, "200", Some(&format!("d{i}"))))
            .await;
        assert_eq!(d["decision"], "allow", "{d}");
    }
    // Per customer 240 of 250 used: 20 more is over.
    let d = h
        .decide(&h.refund(json!(20), "active", "c3", "200", Some("d3")))
        .await;
    assert_eq!(code(&d), codes::MANDATE_LIMIT_EXCEEDED);
    assert!(
        d["reason"].as_str().unwrap().contains("per-customer_id"),
        "{d}"
    );
    // Another customer: daily 240 + 70 > 300.
    let mut other = h.refund(json!(70), "active", "c4", "200", Some("d4"));
    other["context"]["customer_id"] = json!("cus_2");
    let d = h.decide(&other).await;
    assert!(d["reason"].as_str().unwrap().contains("daily"), "{d}");
    // Two hours later it is another UTC day and month.
    h.clock.advance(7200);
    let mut next = h.refund(json!(70), "active", "c5", "200", Some("d5"));
    next["context"]["customer_id"] = json!("cus_1");
    assert_eq!(h.decide(&next).await["decision"], "allow");
}

#[tokio::test]
async fn risk_signals_deny_above_the_threshold() {
    let h = harness_with(|s| {
        format!(
            "{s}\nrisk:\n  deny_above: 0.5\n  signals:\n    - {{id: big-refund, amount_over: \"100\", score: 0.4}}\n    - {{id: vip, fact_equals: {{customer_id: cus_vip}}, score: 0.3}}\n"
        )
    })
    .await;
    let d = h
        .decide(&h.refund(json!(150), "active", "r1", "200", Some("r1")))
        .await;
    assert_eq!(d["decision"], "allow");
    assert_eq!(d["risk_score"], json!(0.4));
    let claims = h.verify_token(d["token"].as_str().unwrap());
    assert_eq!(claims["risk_model"], "mock-gate-risk-1");
    let mut vip = h.refund(json!(150), "active", "r2", "200", Some("r2"));
    vip["context"]["customer_id"] = json!("cus_vip");
    let d = h.decide(&vip).await;
    assert_eq!(code(&d), codes::RISK_THRESHOLD_EXCEEDED, "{d}");
}

#[tokio::test]
async fn flags_mode_checks_hard_caps_before_escalation() {
    use crate::config::FlagRules;
    let rules = FlagRules {
        deny_over: Some(rust_decimal::Decimal::new(200, 0)),
        escalate_over: Some(rust_decimal::Decimal::new(100, 0)),
        deny_tools: ["wire".to_owned()].into_iter().collect(),
        deny_all: false,
    };
    let gate = Gate::open(
        Settings::flags(rules, Some("dev-admin".into())),
        SigningKey::generate().unwrap(),
        Arc::new(MemoryStore::new()),
        ManualClock::new(),
    )
    .await
    .unwrap();
    let caller = gate.authenticate_key(Some("dev")).unwrap();
    let ask = |amount: Value, tool: &str, key: Option<&str>| {
        let mut ctx = json!({"amount_usd": amount});
        if let Some(k) = key {
            ctx["idempotency_key"] = json!(k);
        }
        DecisionRequest::from_json(
            &serde_json::to_vec(&json!({"agent_id": "a", "tool": tool, "action": "x",
                                        "resource": null, "args": {}, "context": ctx}))
            .unwrap(),
        )
        .unwrap()
    };
    let d = gate
        .decide(&caller, ask(json!(1500), "payments", None), None)
        .await
        .unwrap();
    assert_eq!(code(&d), codes::MANDATE_LIMIT_EXCEEDED);
    let d = gate
        .decide(&caller, ask(json!(50), "wire", None), None)
        .await
        .unwrap();
    assert_eq!(code(&d), codes::TOOL_NOT_ALLOWED);
    let e = gate
        .decide(&caller, ask(json!(150), "payments", Some("k")), None)
        .await
        .unwrap();
    assert_eq!(e["decision"], "escalate");
    let a = gate
        .decide(&caller, ask(json!(50), "payments", None), None)
        .await
        .unwrap();
    let b = gate
        .decide(&caller, ask(json!(50), "payments", None), None)
        .await
        .unwrap();
    assert_ne!(
        a["decision_id"], b["decision_id"],
        "decision ids are unique"
    );
    // The admin key approves in flags mode; the retry allows.
    let reference = e["escalation"]["ref"].as_str().unwrap();
    gate.resolve(
        reference,
        Resolution::Approve,
        &approver("ops@local"),
        None,
        None,
    )
    .await
    .unwrap();
    let d = gate
        .decide(&caller, ask(json!(150), "payments", Some("k")), None)
        .await
        .unwrap();
    assert_eq!(d["decision"], "allow");
}

#[tokio::test]
async fn commitments_open_with_their_reveals() {
    let h = harness().await;
    let d = h
        .decide(&h.refund(json!(50), "active", "ch_c", "80", Some("c")))
        .await;
    let claims = h.verify_token(d["token"].as_str().unwrap());
    // Mandate: terms-v3 over the revealed snapshot and salt.
    let reveal = h.gate.mandate_reveal("mnd_support_refunds").unwrap();
    let snapshot = reveal["snapshot"].as_object().unwrap();
    let fields = [
        "mandate_id",
        "version",
        "agent_id",
        "owner_id",
        "currency",
        "settlement_chain",
        "status",
        "per_tx_limit",
        "daily_limit",
        "monthly_limit",
        "per_entity_limit",
        "entity_key",
        "relational_cap",
        "expires_at",
        "agent_may_read_limits",
        "allowed_resources",
    ];
    let render = |v: &Value| match v {
        Value::Null => "none".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    };
    let mut canonical = "terms-v3".to_owned();
    for f in fields {
        canonical.push_str(&format!("|{f}={}", render(&snapshot[f])));
    }
    canonical.push_str(&format!("|salt={}", reveal["salt"].as_str().unwrap()));
    assert_eq!(
        claims["mandate_hash"],
        crate::canonical::sha256_hex(canonical.as_bytes())
    );
    assert!(
        canonical.contains("|per_tx_limit=200.000000|"),
        "{canonical}"
    );
    // Policy: policy-v1 over the text, the profile and the salt.
    let p = h.gate.policy_reveal().unwrap();
    let text = std::fs::read_to_string(walkthrough_dir().join("policy.cedar")).unwrap();
    assert_eq!(p["cedar_text"], text.as_str());
    let profile =
        crate::canonical::sha256_hex(crate::canonical::canonical_json(&p["profile"]).as_bytes());
    let canonical = format!(
        "policy-v1|org_id=org_bank|version=1|text_sha256={}|profile_sha256={profile}|salt={}",
        crate::canonical::sha256_hex(text.as_bytes()),
        p["salt"].as_str().unwrap()
    );
    assert_eq!(
        claims["policy_hash"],
        crate::canonical::sha256_hex(canonical.as_bytes())
    );
}

#[tokio::test]
async fn every_decision_approval_and_completion_is_a_chained_audit_event() {
    let h = harness().await;
    let d = h
        .decide(&h.refund(json!(50), "active", "ch_a", "80", Some("x")))
        .await;
    h.decide(&h.refund(json!(50), "active", "ch_a", "80", Some("x")))
        .await;
    h.complete(d["decision_id"].as_str().unwrap(), "success")
        .await;
    let e = h
        .decide(&h.refund(json!(40), "review", "ch_b", "80", Some("y")))
        .await;
    h.gate
        .resolve(
            e["escalation"]["ref"].as_str().unwrap(),
            Resolution::Approve,
            &bob(),
            Some(&h.manager()),
            None,
        )
        .await
        .unwrap();
    let events = h.gate.audit().await.unwrap();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "gate.decision",
            "gate.decision_replayed",
            "gate.completed",
            "gate.decision",
            "gate.approval_decided"
        ]
    );
    let first = &events[0].payload;
    assert_eq!(first["user"]["sub"], "alice@bank");
    assert_eq!(first["user"]["role"], "support_agent");
    assert_eq!(first["intent"], "refund the duplicate charge");
    assert_eq!(first["amount"], "50");
    assert_eq!(first["facts"]["account_status"], "active");
    assert!(
        first["facts"].get("user_token").is_none(),
        "the raw id_token is not logged"
    );
    assert_eq!(events[4].actor, "bob@bank");
    assert_eq!(h.store.verify().await.unwrap(), None);
    let view = h.gate.decisions(10).await;
    assert_eq!(
        view.last().unwrap()["on_behalf_of"],
        "alice@bank (support_agent)"
    );
}

mod http {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ed25519_dalek::SigningKey as EdKey;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    use super::*;
    use crate::signing::{derive_agent_secret, tests::sdk_sign};

    async fn send(
        app: &axum::Router,
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> (StatusCode, Vec<u8>) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1:8009");
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = app
            .clone()
            .oneshot(req.body(Body::from(body.to_vec())).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        (
            status,
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
    }

    fn bearer(key: &str) -> (String, String) {
        ("authorization".into(), format!("Bearer {key}"))
    }

    #[tokio::test]
    async fn routes_statuses_and_signatures() {
        let agent_key = EdKey::from_bytes(&[42u8; 32]);
        let public = URL_SAFE_NO_PAD.encode(agent_key.verifying_key().as_bytes());
        let h = harness_with(|s| {
            s.replace("ed25519_keys: []", &format!("ed25519_keys: [\"{public}\"]"))
        })
        .await;
        let gate = Arc::new(h.gate);
        let app = crate::router(gate.clone());
        let rep = gate
            .oidc()
            .unwrap()
            .mint_test_token("alice@bank", "support_agent", None, Utc::now().timestamp())
            .unwrap();
        let body = serde_json::to_vec(&json!({
            "agent_id": AGENT, "tool": "payments", "action": "refund.create", "resource": null,
            "args": {}, "context": {"amount_usd": 50, "user_token": rep, "op": "refund.create",
            "account_status": "frozen", "refund_to_original": true, "customer_id": "c",
            "reference": "ch", "reference_amount": 80}
        }))
        .unwrap();

        let (status, _) = send(&app, "GET", "/healthz", &[], b"").await;
        assert_eq!(status, StatusCode::OK);
        let (status, jwks) = send(&app, "GET", "/v1/control/.well-known/jwks.json", &[], b"").await;
        assert_eq!(status, StatusCode::OK);
        let jwks: Value = serde_json::from_slice(&jwks).unwrap();
        assert_eq!(jwks["keys"][0]["alg"], "RS256");
        assert_eq!(jwks["keys"][0]["use"], "sig");

        // No key: 401 with a detail the SDK shows.
        let (status, out) = send(&app, "POST", "/v1/control/decisions", &[], &body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(String::from_utf8_lossy(&out).contains("detail"));
        // A deny is a decision: HTTP 200.
        let (status, out) = send(
            &app,
            "POST",
            "/v1/control/decisions",
            &[bearer(ORG_KEY)],
            &body,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let d: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(d["code"], "POLICY_DENIED");
        // A malformed body: 422.
        let (status, _) = send(
            &app,
            "POST",
            "/v1/control/decisions",
            &[bearer(ORG_KEY)],
            b"{",
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

        // HMAC: right and wrong.
        let secret = derive_agent_secret(ORG_KEY, AGENT);
        let mac = crate::canonical::hmac_sha256_hex(secret.as_bytes(), &body);
        let signed = [
            bearer(ORG_KEY),
            ("x-agent-signature".into(), format!("hmac-sha256={mac}")),
        ];
        let (status, _) = send(&app, "POST", "/v1/control/decisions", &signed, &body).await;
        assert_eq!(status, StatusCode::OK);
        let forged = [
            bearer(ORG_KEY),
            (
                "x-agent-signature".into(),
                format!("hmac-sha256={}", "0".repeat(64)),
            ),
        ];
        let (status, _) = send(&app, "POST", "/v1/control/decisions", &forged, &body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);

        // RFC 9421 with the registered key; the same headers again (an SDK retry) are fine.
        let mut headers = sdk_sign(
            &agent_key,
            "POST",
            "127.0.0.1:8009",
            "/v1/control/decisions",
            &body,
            Utc::now().timestamp(),
        );
        headers.push(bearer(ORG_KEY));
        for _ in 0..2 {
            let (status, out) = send(&app, "POST", "/v1/control/decisions", &headers, &body).await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
        }
        // Signed for another host: refused.
        let mut other = sdk_sign(
            &agent_key,
            "POST",
            "evil.example",
            "/v1/control/decisions",
            &body,
            Utc::now().timestamp(),
        );
        other.push(bearer(ORG_KEY));
        let (status, _) = send(&app, "POST", "/v1/control/decisions", &other, &body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);

        // Admin routes need the admin key.
        let (status, _) = send(&app, "GET", "/v1/admin/approvals", &[bearer(ORG_KEY)], b"").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let admin = [bearer("rgnt_admin_walkthrough_local")];
        let (status, out) = send(&app, "GET", "/v1/admin/audit", &admin, b"").await;
        assert_eq!(status, StatusCode::OK);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        for line in text.lines() {
            let event: Value = serde_json::from_str(line).unwrap();
            assert_eq!(event["type"], "gate.decision");
            assert_eq!(event["hash"].as_str().unwrap().len(), 64);
        }
        let (status, _) = send(
            &app,
            "POST",
            "/v1/control/decisions/dec_nope/complete",
            &[bearer(ORG_KEY)],
            b"{}",
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _) = send(&app, "GET", "/nowhere", &[], b"").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn an_admin_decision_without_a_printable_approver_is_a_400() {
        let h = harness_with(|s| {
            s.replace(
                "require_approver_token: true",
                "require_approver_token: false",
            )
        })
        .await;
        let e = h
            .decide(&h.refund(json!(40), "review", "ch_h", "100", Some("H1")))
            .await;
        let reference = e["escalation"]["ref"].as_str().unwrap().to_owned();
        let gate = Arc::new(h.gate);
        let app = crate::router(gate.clone());
        let admin = [bearer("rgnt_admin_walkthrough_local")];
        let path = format!("/v1/admin/approvals/{reference}/approve");
        for body in [
            String::new(),
            json!({"comment": "ok"}).to_string(),
            json!({"approver": null}).to_string(),
            json!({"approver": 7}).to_string(),
            json!({"approver": ""}).to_string(),
            json!({"approver": "ops\u{1b}]0;x\u{7}"}).to_string(),
            json!({"approver": "x".repeat(129)}).to_string(),
        ] {
            let (status, out) = send(&app, "POST", &path, &admin, body.as_bytes()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            let detail: Value = serde_json::from_slice(&out).unwrap();
            assert!(
                detail["detail"].as_str().unwrap().contains("`approver`"),
                "{detail}"
            );
        }
        // Nothing was decided.
        assert_eq!(gate.approvals(Some("pending")).await.len(), 1);
        let (status, out) = send(
            &app,
            "POST",
            &path,
            &admin,
            json!({"approver": "ops@local"}).to_string().as_bytes(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
        let view: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(view["status"], "approved");
        assert_eq!(view["decided_by"]["name"], "ops@local");
    }
}

#[tokio::test]
async fn observe_mode_records_the_refusal_but_never_blocks() {
    let h = harness_with(|s| s.replace("observe_mode: false", "observe_mode: true")).await;
    let d = h
        .decide(&h.refund(json!(50), "frozen", "ch_o", "80", Some("o")))
        .await;
    assert_eq!(d["decision"], "allow", "{d}");
    let view = h.gate.decisions(1).await;
    assert_eq!(view[0]["observed_code"], "POLICY_DENIED");
    assert!(
        view[0]["observed_reason"]
            .as_str()
            .unwrap()
            .contains("acct-frozen")
    );
    // The profile is part of the policy commitment.
    assert_eq!(
        h.gate.policy_reveal().unwrap()["profile"]["observe_mode"],
        true
    );
}

#[tokio::test]
async fn an_optional_sub_budget_counts_the_entity_sent_and_skips_a_request_without_one() {
    // The shipped walkthrough mandate: per-customer sub-budget with `entity_optional: true`.
    let h = harness_with(|s| {
        s.replace(
            "per_entity_limit: \"1000.00\"",
            "per_entity_limit: \"100.00\"",
        )
    })
    .await;
    let without_customer = |amount: i64, charge: &str, key: &str| {
        let mut body = h.refund(json!(amount), "active", charge, "200", Some(key));
        body["context"]
            .as_object_mut()
            .unwrap()
            .remove("customer_id");
        body
    };
    // No customer fact: the sub-budget is skipped, the other caps still apply.
    let d = h.decide(&without_customer(60, "o1", "o1")).await;
    assert_eq!(d["decision"], "allow", "{d}");
    let big = h.decide(&without_customer(250, "o2", "o2")).await;
    assert_eq!(code(&big), codes::MANDATE_LIMIT_EXCEEDED, "{big}");
    // With the fact, it counts per customer: 60 + 60 is over the 100 sub-budget.
    let d = h
        .decide(&h.refund(json!(60), "active", "o3", "200", Some("o3")))
        .await;
    assert_eq!(d["decision"], "allow", "{d}");
    let d = h
        .decide(&h.refund(json!(60), "active", "o4", "200", Some("o4")))
        .await;
    assert_eq!(code(&d), codes::MANDATE_LIMIT_EXCEEDED, "{d}");
    assert!(
        d["reason"].as_str().unwrap().contains("per-customer_id"),
        "{d}"
    );
    // The skipped request held nothing against a customer; the counted one did.
    let events = h.gate.audit().await.unwrap();
    assert_eq!(events[0].payload["hold"]["entity"], Value::Null);
    assert_eq!(events[2].payload["hold"]["entity"], "cus_1");
    // A fact that is sent but cannot be counted is refused, optional or not.
    for bad in [json!(42), json!(""), json!("  "), json!(null)] {
        let mut body = h.refund(json!(5), "active", "o5", "200", None);
        body["context"]["customer_id"] = bad.clone();
        let d = h.decide(&body).await;
        assert_eq!(code(&d), codes::POLICY_DENIED, "{bad}: {d}");
        assert!(
            d["reason"]
                .as_str()
                .unwrap()
                .contains("fact `customer_id` must be a non-empty string"),
            "{d}"
        );
    }

    // Without `entity_optional` the same sub-budget is mandatory: fail closed.
    let strict =
        harness_with(|s| s.replace("entity_optional: true", "entity_optional: false")).await;
    let mut body = strict.refund(json!(50), "active", "s1", "80", Some("s1"));
    body["context"]
        .as_object_mut()
        .unwrap()
        .remove("customer_id");
    let d = strict.decide(&body).await;
    assert_eq!(code(&d), codes::POLICY_DENIED, "{d}");
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .contains("missing fact `customer_id`"),
        "{d}"
    );
    let dropped = harness_with(|s| {
        let kept: Vec<&str> = s
            .lines()
            .filter(|l| !l.contains("entity_optional"))
            .collect();
        kept.join("\n")
    })
    .await;
    let mut body = dropped.refund(json!(50), "active", "s1", "80", Some("s1"));
    body["context"]
        .as_object_mut()
        .unwrap()
        .remove("customer_id");
    let d = dropped.decide(&body).await;
    assert_eq!(
        code(&d),
        codes::POLICY_DENIED,
        "the default is mandatory: {d}"
    );

    // `entity_optional` needs a sub-budget to be optional about.
    let dir = config_dir(|s| {
        s.replace("    per_entity_limit: \"1000.00\"", "")
            .replace("    entity_key: customer_id", "")
    });
    let err = Settings::load(&dir.path().join("gate.yaml")).unwrap_err();
    assert!(
        err.to_string()
            .contains("mandates.mnd_support_refunds.entity_optional"),
        "{err}"
    );
}

#[tokio::test]
async fn flags_mode_fails_closed_on_an_amount_it_cannot_read() {
    use crate::config::FlagRules;
    let open = |rules: FlagRules| async move {
        Gate::open(
            Settings::flags(rules, Some("rgnt_admin_test_key".into())),
            SigningKey::generate().unwrap(),
            Arc::new(MemoryStore::new()),
            ManualClock::new(),
        )
        .await
        .unwrap()
    };
    let ask = |args: Value, ctx: Value| {
        DecisionRequest::from_json(
            &serde_json::to_vec(&json!({"agent_id": "a", "tool": "payments", "action": "x",
                                        "resource": null, "args": args, "context": ctx}))
            .unwrap(),
        )
        .unwrap()
    };
    let gate = open(FlagRules {
        deny_over: Some(rust_decimal::Decimal::new(200, 0)),
        ..FlagRules::default()
    })
    .await;
    let caller = gate.authenticate_key(Some("dev")).unwrap();
    for (args, shown) in [
        (
            json!({"amount": "250"}),
            "`args.amount` is \"250\" (a string)",
        ),
        (
            json!({"amount": "50"}),
            "`args.amount` is \"50\" (a string)",
        ),
        (json!({"amount": null}), "`args.amount` is null (null)"),
        (json!({"amount": {"value": 5}}), "(an object)"),
        (json!({}), "the request has no amount"),
    ] {
        let d = gate
            .decide(&caller, ask(args, json!({})), None)
            .await
            .unwrap();
        assert_eq!(d["decision"], "deny", "{d}");
        assert_eq!(code(&d), codes::POLICY_DENIED);
        let reason = d["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("fail closed: --deny-over 200.00"),
            "{reason}"
        );
        assert!(reason.contains(shown), "{reason}");
    }
    let long = "9".repeat(500);
    let d = gate
        .decide(&caller, ask(json!({ "amount": long }), json!({})), None)
        .await
        .unwrap();
    assert!(d["reason"].as_str().unwrap().len() < 400, "{d}");
    // Numbers are decided as before.
    let d = gate
        .decide(&caller, ask(json!({"amount": 50}), json!({})), None)
        .await
        .unwrap();
    assert_eq!(d["decision"], "allow");
    let d = gate
        .decide(&caller, ask(json!({"amount": 250}), json!({})), None)
        .await
        .unwrap();
    assert_eq!(code(&d), codes::MANDATE_LIMIT_EXCEEDED);
    // --escalate-over alone is an amount rule too.
    let gate = open(FlagRules {
        escalate_over: Some(rust_decimal::Decimal::new(100, 0)),
        ..FlagRules::default()
    })
    .await;
    let d = gate
        .decide(&caller, ask(json!({"amount": "500"}), json!({})), None)
        .await
        .unwrap();
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .starts_with("fail closed: --escalate-over 100.00"),
        "{d}"
    );
    // Without an amount rule nothing needs an amount (the dev mock's drop-in).
    let gate = open(FlagRules::default()).await;
    let d = gate
        .decide(&caller, ask(json!({}), json!({})), None)
        .await
        .unwrap();
    assert_eq!(d["decision"], "allow", "{d}");
}

#[tokio::test]
async fn admin_decisions_record_the_approver_they_name() {
    let h = harness().await;
    let e = h
        .decide(&h.refund(json!(40), "review", "ch_n", "100", Some("N1")))
        .await;
    let reference = e["escalation"]["ref"].as_str().unwrap().to_owned();
    // With a token, the name is the token's subject (or e-mail), not someone else.
    let err = h
        .gate
        .resolve(
            &reference,
            Resolution::Approve,
            &approver("carol@bank"),
            Some(&h.manager()),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.status, 403);
    assert!(
        err.detail
            .contains("not the approver token's subject `bob@bank`"),
        "{}",
        err.detail
    );
    assert!(h.gate.approvals(Some("pending")).await.len() == 1);
    h.gate
        .resolve(
            &reference,
            Resolution::Approve,
            &bob(),
            Some(&h.manager()),
            Some("reviewed".into()),
        )
        .await
        .unwrap();
    let events = h.gate.audit().await.unwrap();
    let decided = events.last().unwrap();
    assert_eq!(decided.event_type, "gate.approval_decided");
    assert_eq!(decided.actor, "bob@bank");
    assert_eq!(decided.payload["approver"]["name"], "bob@bank");
    assert_eq!(decided.payload["approver"]["via"], "id_token");
    assert_eq!(decided.payload["approver"]["role"], "manager");
    let listed = h.gate.approvals(None).await;
    assert_eq!(listed[0]["decided_by"]["name"], "bob@bank");

    // Without a required token the admin key vouches for the name, which is recorded; the
    // requesting user cannot approve their own request under their own name.
    let h = harness_with(|s| {
        s.replace(
            "require_approver_token: true",
            "require_approver_token: false",
        )
    })
    .await;
    let e = h
        .decide(&h.refund(json!(40), "review", "ch_m", "100", Some("M1")))
        .await;
    let reference = e["escalation"]["ref"].as_str().unwrap().to_owned();
    let err = h
        .gate
        .resolve(
            &reference,
            Resolution::Approve,
            &approver("alice@bank"),
            None,
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.status, 403);
    assert!(err.detail.contains("cannot approve"), "{}", err.detail);
    h.gate
        .resolve(
            &reference,
            Resolution::Reject,
            &approver("Dana Ops"),
            None,
            Some("no".into()),
        )
        .await
        .unwrap();
    let events = h.gate.audit().await.unwrap();
    let decided = events.last().unwrap();
    assert_eq!(decided.actor, "Dana Ops");
    assert_eq!(decided.payload["approver"]["name"], "Dana Ops");
    assert_eq!(decided.payload["approver"]["via"], "admin_key");
    let d = h
        .decide(&h.refund(json!(40), "review", "ch_m", "100", Some("M1")))
        .await;
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .contains("rejected by Dana Ops: no"),
        "{d}"
    );
    // An approval recorded before decisions named their approver still replays.
    let old = json!({"ref": "esc_old", "at": "2026-01-01T00:00:00Z", "outcome": "approved",
                     "approver": {"sub": "admin", "role": null, "email": null, "via": "admin_key"},
                     "comment": null});
    let parsed: crate::state::ApprovalEvent = serde_json::from_value(old).unwrap();
    assert_eq!(parsed.approver.name, None);
}

/// The configuration file is read through the bounded, alias-free YAML reader: an alias (here a
/// merge of the walkthrough's agent settings, which serde_yaml would expand) is refused with its
/// position instead of being expanded.
#[test]
fn config_aliases_are_refused_with_their_position() {
    let dir = config_dir(|text| {
        text.replace("  agent_refund_bot:\n", "  agent_refund_bot: &bot\n")
            .replace(
                "  agent_suspended_bot:\n    status: suspended\n    tools: [payments]\n",
                "  agent_suspended_bot: *bot\n",
            )
    });
    let path = dir.path().join("gate.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("*bot"), "the edit did not apply");
    let line = text.lines().position(|l| l.contains("*bot")).unwrap() + 1;
    let err = Settings::load(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: line {line} column 24: YAML aliases are not supported (*bot refers to an \
             anchor); write the value out in full",
            path.display()
        )
    );
}

mod console_tests;
mod group_commit_tests;
