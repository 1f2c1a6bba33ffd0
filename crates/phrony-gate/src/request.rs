//! Parsing and normalising `POST /v1/control/decisions` bodies.

use rust_decimal::Decimal;
use serde_json::{Map, Value, json};

use crate::canonical::{args_hash, canonical_json, sha256_hex};
use crate::error::ApiError;
use crate::money::parse_amount;

/// Context keys that do not change what is being asked, so they are left out of the request
/// fingerprint: re-wording the intent or presenting a fresh user token is the same request.
pub(crate) const NON_SEMANTIC_CONTEXT: &[&str] = &[
    "user_token",
    "idempotency_key",
    "intent",
    "reasoning_summary",
    "task",
    "session_id",
];

/// The longest idempotency key accepted.
pub(crate) const MAX_IDEMPOTENCY_KEY: usize = 255;

/// A decision request as sent by the SDK.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionRequest {
    /// The agent asking.
    pub agent_id: String,
    /// The tool (no `:`).
    pub tool: String,
    /// The action.
    pub action: String,
    /// The resource, if any.
    pub resource: Option<String>,
    /// Arguments, bound by `args_hash`.
    pub args: Value,
    /// The open context map.
    pub context: Map<String, Value>,
}

/// An amount with its currency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Money {
    /// The amount.
    pub amount: Decimal,
    /// Upper-case ISO 4217 code.
    pub currency: String,
}

/// A request with everything the engine derives from its body alone.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub(crate) req: DecisionRequest,
    pub(crate) args_hash: String,
    pub(crate) fingerprint: String,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) money: Option<Money>,
    pub(crate) payee: Option<String>,
    pub(crate) mandate_id: Option<String>,
    pub(crate) reference: Option<String>,
    pub(crate) reference_amount: Option<Decimal>,
    pub(crate) intent: Option<String>,
    pub(crate) user_token: Option<String>,
    /// Decided on a routing route (the gate forwards an allow itself).
    pub(crate) routed: bool,
}

impl DecisionRequest {
    /// Parses a JSON body.
    ///
    /// # Errors
    /// HTTP 422 naming the missing or malformed field.
    pub fn from_json(body: &[u8]) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::unprocessable(format!("the body is not JSON: {e}")))?;
        let Value::Object(mut map) = value else {
            return Err(ApiError::unprocessable("the body must be a JSON object"));
        };
        let text = |map: &mut Map<String, Value>, name: &str| -> Result<String, ApiError> {
            match map.remove(name) {
                Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
                Some(Value::String(_)) => Err(ApiError::unprocessable(format!(
                    "`{name}` must not be empty"
                ))),
                Some(other) => Err(ApiError::unprocessable(format!(
                    "`{name}` must be a string, got `{other}`"
                ))),
                None => Err(ApiError::unprocessable(format!("`{name}` is required"))),
            }
        };
        let agent_id = text(&mut map, "agent_id")?;
        let tool = text(&mut map, "tool")?;
        if tool.contains(':') {
            return Err(ApiError::unprocessable(format!(
                "`tool` must not contain `:` (the token scope is tool:action), got `{tool}`"
            )));
        }
        let action = text(&mut map, "action")?;
        let resource = match map.remove("resource") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                return Err(ApiError::unprocessable(format!(
                    "`resource` must be a string or null, got `{other}`"
                )));
            }
        };
        let args = match map.remove("args") {
            None | Some(Value::Null) => json!({}),
            Some(v @ Value::Object(_)) => v,
            Some(other) => {
                return Err(ApiError::unprocessable(format!(
                    "`args` must be an object, got `{other}`"
                )));
            }
        };
        let context = match map.remove("context") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(c)) => c,
            Some(other) => {
                return Err(ApiError::unprocessable(format!(
                    "`context` must be an object, got `{other}`"
                )));
            }
        };
        Ok(Self {
            agent_id,
            tool,
            action,
            resource,
            args,
            context,
        })
    }
}

/// The longest rendering of a received value quoted back in a reason.
const MAX_EXCERPT: usize = 64;

/// A received JSON value as compact JSON, cut to [`MAX_EXCERPT`] characters, for quoting it
/// back in a reason or an error.
pub(crate) fn excerpt(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_EXCERPT {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_EXCERPT).collect();
    cut.push('…');
    cut
}

/// What kind of JSON value `value` is, with its article (`a string`, `null`).
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn optional_string(ctx: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match ctx.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::unprocessable(format!(
            "`context.{name}` must be a string, got `{other}`"
        ))),
    }
}

/// Normalises a request: amounts, idempotency key, fingerprint.
///
/// `args_amount_fallback` reads `args.amount` when the context has no amount (the dev mock's
/// behaviour, kept in flags mode). Only a JSON number is read there: `args` is the tool's raw
/// input, where a string such as `"250"` or `"2.50 EUR"` has no meaning the gate knows, so it
/// leaves the request without an amount (and flags mode then fails it closed, naming what it
/// received) rather than guessing.
pub(crate) fn prepare(
    req: DecisionRequest,
    header_key: Option<&str>,
    args_amount_fallback: bool,
) -> Result<Prepared, ApiError> {
    let ctx = &req.context;
    let context_key = optional_string(ctx, "idempotency_key")?;
    let idempotency_key = match (header_key.map(str::trim), context_key.as_deref()) {
        (Some(h), Some(c)) if h != c => {
            return Err(ApiError::unprocessable(format!(
                "the Idempotency-Key header `{h}` and context.idempotency_key `{c}` differ"
            )));
        }
        (Some(h), _) => Some(h.to_owned()),
        (None, c) => c.map(str::to_owned),
    };
    if let Some(key) = &idempotency_key
        && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY)
    {
        return Err(ApiError::unprocessable(format!(
            "an idempotency key must have 1 to {MAX_IDEMPOTENCY_KEY} characters"
        )));
    }

    let field_amount = |name: &str| -> Result<Option<Decimal>, ApiError> {
        match ctx.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => parse_amount(v)
                .map(Some)
                .map_err(|e| ApiError::unprocessable(format!("`context.{name}`: {e}"))),
        }
    };
    let amount_usd = field_amount("amount_usd")?;
    let amount = field_amount("amount")?;
    let currency = optional_string(ctx, "currency")?.map(|c| c.trim().to_ascii_uppercase());
    if let Some(c) = &currency
        && (c.len() != 3 || !c.bytes().all(|b| b.is_ascii_alphabetic()))
    {
        return Err(ApiError::unprocessable(format!(
            "`context.currency` must be an ISO 4217 code, got `{c}`"
        )));
    }
    let money = match (amount, amount_usd) {
        (Some(a), usd) => {
            let currency = currency.clone().unwrap_or_else(|| "USD".into());
            if let Some(usd) = usd
                && currency == "USD"
                && usd != a
            {
                return Err(ApiError::unprocessable(format!(
                    "`context.amount` {a} and `context.amount_usd` {usd} disagree"
                )));
            }
            Some(Money {
                amount: a,
                currency,
            })
        }
        (None, Some(usd)) => {
            if let Some(c) = currency.as_deref().filter(|c| *c != "USD") {
                return Err(ApiError::unprocessable(format!(
                    "`context.amount_usd` was given with currency `{c}`; send `amount` + `currency`"
                )));
            }
            Some(Money {
                amount: usd,
                currency: "USD".into(),
            })
        }
        (None, None) if args_amount_fallback => match req.args.get("amount") {
            Some(v) if v.is_number() => parse_amount(v)
                .map(|a| {
                    Some(Money {
                        amount: a,
                        currency: "USD".into(),
                    })
                })
                .map_err(|e| ApiError::unprocessable(format!("`args.amount`: {e}")))?,
            _ => None,
        },
        (None, None) => None,
    };
    let reference_amount = field_amount("reference_amount")?;
    let reference = optional_string(ctx, "reference")?;
    let payee = optional_string(ctx, "payee")?;
    let mandate_id = optional_string(ctx, "mandate_id")?;
    let intent = optional_string(ctx, "intent")?;
    let user_token = optional_string(ctx, "user_token")?;

    let hash = args_hash(&req.tool, &req.action, req.resource.as_deref(), &req.args);
    let mut semantic = ctx.clone();
    for key in NON_SEMANTIC_CONTEXT {
        semantic.remove(*key);
    }
    // Amounts are compared as numbers, not as spelled (50 == 50.0 == "50.00").
    semantic.remove("amount");
    semantic.remove("amount_usd");
    semantic.remove("currency");
    if let Some(ra) = reference_amount {
        semantic.insert("reference_amount".into(), json!(ra.normalize().to_string()));
    }
    let fingerprint_input = json!({
        "agent_id": req.agent_id,
        "args_hash": hash,
        "money": money.as_ref().map(|m| json!([m.amount.normalize().to_string(), m.currency])),
        "context": semantic,
    });
    let fingerprint = sha256_hex(canonical_json(&fingerprint_input).as_bytes());
    Ok(Prepared {
        req,
        args_hash: hash,
        fingerprint,
        idempotency_key,
        money,
        payee,
        mandate_id,
        reference,
        reference_amount,
        intent,
        user_token,
        routed: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(ctx: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "agent_id": "a", "tool": "payments", "action": "refund.create",
            "resource": null, "args": {}, "context": ctx
        }))
        .unwrap()
    }

    fn prep(ctx: Value) -> Prepared {
        prepare(DecisionRequest::from_json(&body(ctx)).unwrap(), None, false).unwrap()
    }

    #[test]
    fn fingerprint_ignores_wording_and_amount_spelling() {
        let a = prep(json!({"amount_usd": 50, "intent": "refund it", "account_status": "active"}));
        let b = prep(
            json!({"amount_usd": 50.0, "intent": "please refund", "user_token": "t",
                            "account_status": "active"}),
        );
        assert_eq!(a.fingerprint, b.fingerprint);
        let c = prep(json!({"amount_usd": 51, "account_status": "active"}));
        assert_ne!(a.fingerprint, c.fingerprint);
        let d = prep(json!({"amount_usd": 50, "account_status": "frozen"}));
        assert_ne!(a.fingerprint, d.fingerprint);
        assert_eq!(a.money.unwrap().currency, "USD");
    }

    #[test]
    fn bad_bodies_are_refused_with_the_field_named() {
        let err = DecisionRequest::from_json(b"[1]").unwrap_err();
        assert_eq!(err.status, 422);
        let err = DecisionRequest::from_json(br#"{"agent_id":"a","tool":"x:y","action":"b"}"#)
            .unwrap_err();
        assert!(
            err.detail.contains("`tool` must not contain"),
            "{}",
            err.detail
        );
        let err = DecisionRequest::from_json(br#"{"agent_id":"a","action":"b"}"#).unwrap_err();
        assert!(err.detail.contains("`tool` is required"));
        let req = DecisionRequest::from_json(&body(json!({"amount_usd": -5}))).unwrap();
        assert!(
            prepare(req, None, false)
                .unwrap_err()
                .detail
                .contains("negative")
        );
        let req = DecisionRequest::from_json(&body(json!({"idempotency_key": "k1"}))).unwrap();
        assert!(
            prepare(req, Some("k2"), false)
                .unwrap_err()
                .detail
                .contains("differ")
        );
        let req =
            DecisionRequest::from_json(&body(json!({"amount": 5, "currency": "EURO"}))).unwrap();
        assert!(prepare(req, None, false).is_err());
    }

    #[test]
    fn multi_currency_amounts() {
        let p = prep(json!({"amount": "400.00", "currency": "kzt"}));
        assert_eq!(
            p.money,
            Some(Money {
                amount: Decimal::new(400, 0),
                currency: "KZT".into()
            })
        );
    }
}
