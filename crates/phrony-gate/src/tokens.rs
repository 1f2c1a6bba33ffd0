//! Allow tokens, receipts and the mandate/policy commitments they carry (§1.7–§1.8).

use serde_json::{Map, Value, json};

use crate::canonical::{canonical_json, sha256_hex};
use crate::config::{Mandate, Settings};
use crate::keys::SigningKey;
use crate::money::claim_number;

/// The issuer of every token.
pub const ISSUER: &str = "regent-control";
/// The audience of receipts.
pub const RECEIPT_AUDIENCE: &str = "regent-receipt";
/// Lifetime of allow tokens.
pub const TOKEN_TTL_SECONDS: i64 = 60;
/// Lifetime of receipts (ten years, like the issuer's vectors).
pub const RECEIPT_TTL_SECONDS: i64 = 315_360_000;

/// A commitment and the reveal that opens it.
#[derive(Debug, Clone, PartialEq)]
pub struct Commitment {
    /// `policy_source` (`org` or `legacy`); empty for mandates.
    pub source: &'static str,
    /// `policy_version` / `mandate_version`.
    pub version: u32,
    /// The hash.
    pub hash: String,
    /// What `regent-verify --policy` / `--mandate` takes to check it.
    pub reveal: Value,
}

/// The policy commitment: `policy-v1` for an org Cedar policy, plain SHA-256 of the rules text
/// (`legacy`) in flags mode, `None` when no policy is configured.
#[must_use]
pub fn policy_commitment(settings: &Settings, key: &SigningKey) -> Option<Commitment> {
    if let Some(policy) = &settings.policy {
        let salt = key.derive_salt(&format!("policy|{}|{}", settings.org_id, policy.version));
        let profile = policy.profile.to_json();
        let profile_sha = sha256_hex(canonical_json(&profile).as_bytes());
        let canonical = format!(
            "policy-v1|org_id={}|version={}|text_sha256={}|profile_sha256={}|salt={}",
            settings.org_id,
            policy.version,
            sha256_hex(policy.text.as_bytes()),
            profile_sha,
            salt
        );
        return Some(Commitment {
            source: "org",
            version: policy.version,
            hash: sha256_hex(canonical.as_bytes()),
            reveal: json!({
                "org_id": settings.org_id,
                "version": policy.version,
                "cedar_text": policy.text,
                "profile": profile,
                "salt": salt,
            }),
        });
    }
    settings.flags.as_ref().map(|rules| {
        let text = rules.canonical_text();
        Commitment {
            source: "legacy",
            version: 0,
            hash: sha256_hex(text.as_bytes()),
            reveal: json!({"cedar_text": text}),
        }
    })
}

fn render(value: &Value) -> String {
    match value {
        Value::Null => "none".into(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(render).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// The `terms-v3` mandate commitment.
#[must_use]
pub fn mandate_commitment(mandate: &Mandate, key: &SigningKey) -> Commitment {
    let limit =
        |d: Option<rust_decimal::Decimal>| d.map_or(Value::Null, |d| json!(format!("{d:.6}")));
    let fields: [(&str, Value); 16] = [
        ("mandate_id", json!(mandate.id)),
        ("version", json!(mandate.version)),
        ("agent_id", json!(mandate.agent)),
        ("owner_id", json!(mandate.owner)),
        ("currency", json!(mandate.currency)),
        ("settlement_chain", Value::Null),
        ("status", json!(mandate.status)),
        ("per_tx_limit", limit(mandate.per_tx_limit)),
        ("daily_limit", limit(mandate.daily_limit)),
        ("monthly_limit", limit(mandate.monthly_limit)),
        ("per_entity_limit", limit(mandate.per_entity_limit)),
        ("entity_key", json!(mandate.entity_key)),
        ("relational_cap", json!(mandate.relational_cap)),
        (
            "expires_at",
            json!(mandate.expires_at.map(|t| t.to_rfc3339())),
        ),
        ("agent_may_read_limits", json!(false)),
        ("allowed_resources", json!(mandate.allowed_resources)),
    ];
    let salt = key.derive_salt(&format!("mandate|{}|{}", mandate.id, mandate.version));
    let mut canonical = String::from("terms-v3");
    let mut snapshot = Map::new();
    for (name, value) in fields {
        canonical.push_str(&format!("|{name}={}", render(&value)));
        snapshot.insert(name.to_owned(), value);
    }
    canonical.push_str(&format!("|salt={salt}"));
    Commitment {
        source: "",
        version: mandate.version,
        hash: sha256_hex(canonical.as_bytes()),
        reveal: json!({"snapshot": snapshot, "salt": salt, "canon": "terms-v3"}),
    }
}

/// Adds `iat`, `exp` and a fresh `jti` to stored allow claims and signs them.
///
/// # Errors
/// A message when signing fails.
pub fn mint_allow(key: &SigningKey, base: &Value, now_unix: i64) -> Result<(String, i64), String> {
    let mut claims = base.clone();
    let exp = now_unix + TOKEN_TTL_SECONDS;
    claims["iat"] = json!(now_unix);
    claims["exp"] = json!(exp);
    claims["jti"] = json!(uuid::Uuid::new_v4().simple().to_string());
    key.sign("JWT", &claims)
        .map(|t| (t, exp))
        .map_err(|e| e.to_string())
}

/// The claims of a receipt for an allow decision completed with `status`.
#[must_use]
pub fn receipt_claims(
    allow_claims: &Value,
    tool: &str,
    action: &str,
    status: &str,
    downstream_ref: Option<&str>,
    now_unix: i64,
) -> Value {
    let mut claims = json!({
        "iss": ISSUER,
        "aud": RECEIPT_AUDIENCE,
        "jti": format!("rcp_{}", uuid::Uuid::new_v4().simple()),
        "iat": now_unix,
        "exp": now_unix + RECEIPT_TTL_SECONDS,
        "status": status,
        "tool": tool,
        "action": action,
        "settlement_mismatch": false,
        "settlement_source": "agent",
    });
    for name in [
        "sub",
        "decision_id",
        "args_hash",
        "amount",
        "currency",
        "payee",
        "mandate_id",
        "mandate_version",
        "mandate_hash",
        "policy_version",
        "policy_hash",
        "policy_source",
        "risk_model",
        "environment",
        "assertion_scheme",
        "assertion_kid",
        "key_custody",
        "user_sub",
        "user_role",
    ] {
        if let Some(v) = allow_claims.get(name) {
            claims[name] = v.clone();
        }
    }
    if let Some(r) = downstream_ref {
        claims["downstream_ref"] = json!(r);
    }
    claims
}

/// Inserts `amount` as a JSON number claim.
pub(crate) fn set_amount(claims: &mut Value, amount: rust_decimal::Decimal) {
    claims["amount"] = claim_number(amount);
}
