//! Cedar policies evaluated with gate semantics: `@id` ids, forbid wins, a typed context that
//! fails closed, and an escalate convention.
//!
//! Behind the `cedar` feature; it depends only on `cedar-policy`, `serde_json` and `thiserror`,
//! and does no IO. The mock gate (`phrony-gate`) uses it; the runtime can too.
//!
//! # Semantics
//!
//! - **Policy ids come from `@id("…")`.** The `cedar-policy` library names parsed policies
//!   `policy0…N`; we re-key every policy that carries an `@id` annotation, so reasons read
//!   `acct-frozen`, not `policy1`. A duplicate id is a compile error.
//! - **Typed context, fail closed.** Every action declares the facts (context attributes) its
//!   policies may read, each with a type. The policy set is validated against the schema
//!   generated from those declarations in Cedar's *strict* mode, so a policy that reads an
//!   undeclared fact or compares it with the wrong type is refused at load time. At
//!   evaluation a required fact that is missing, or a fact of the wrong type, makes the
//!   verdict [`CedarVerdict::Invalid`] (the caller denies) instead of silently skipping the
//!   `forbid` that reads it — which is what plain Cedar does. Any evaluation error of any
//!   policy is also [`CedarVerdict::Invalid`]. Facts that are not declared are not passed to
//!   Cedar at all.
//! - **Forbid wins; the default is deny.** A matched `forbid` beats every `permit`; no
//!   matching `permit` is [`CedarVerdict::NoPermit`].
//! - **Escalate convention.** Cedar has no third effect. A `forbid` annotated
//!   `@escalate("<approver role>")` does not deny: when it is the only kind of forbid that
//!   matched *and* a `permit` matched, the verdict is [`CedarVerdict::Escalate`] naming the
//!   approver role. Any other matched `forbid` (a *hard* forbid) denies, and the reason lists
//!   every matched hard forbid. `@escalate` on a `permit` is a compile error.
//!
//! # Request shape
//!
//! principal = `<principal_type>::"<id>"`, action = `Action::"<action>"`, resource =
//! `<resource_type>::"<id>"`; policies are expected to be unscoped or scoped on these types
//! and to put their conditions on `context`.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Decision, Effect, Entities, EntityId, EntityTypeName, EntityUid, Policy,
    PolicyId, PolicySet, Request, Schema, ValidationMode, Validator,
};
use serde_json::{Map, Value, json};

/// The annotation that names a policy.
pub const ID_ANNOTATION: &str = "id";
/// The annotation that turns a `forbid` into an escalation to the named approver role.
pub const ESCALATE_ANNOTATION: &str = "escalate";

/// The type of a fact (a context attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FactType {
    /// A string.
    String,
    /// A boolean.
    Bool,
    /// A 64-bit integer.
    Long,
    /// A Cedar `decimal` (at most four fraction digits); accepted as a JSON number or a
    /// decimal string such as `"50.00"`.
    Decimal,
    /// A set of strings.
    StringSet,
}

impl FactType {
    /// The name used in configuration files and messages.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Bool => "bool",
            Self::Long => "long",
            Self::Decimal => "decimal",
            Self::StringSet => "string_set",
        }
    }

    /// Parses a configuration name (`string`, `bool`, `long`, `decimal`, `string_set`).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "string" => Self::String,
            "bool" | "boolean" => Self::Bool,
            "long" | "int" | "integer" => Self::Long,
            "decimal" => Self::Decimal,
            "string_set" | "set<string>" => Self::StringSet,
            _ => return None,
        })
    }

    pub(crate) fn schema_type(self) -> Value {
        match self {
            Self::String => json!({"type": "String"}),
            Self::Bool => json!({"type": "Boolean"}),
            Self::Long => json!({"type": "Long"}),
            Self::Decimal => json!({"type": "Extension", "name": "decimal"}),
            Self::StringSet => json!({"type": "Set", "element": {"type": "String"}}),
        }
    }
}

/// One declared fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FactSpec {
    /// Its type.
    pub ty: FactType,
    /// Whether it may be absent (policies must then test it with `has`, which strict
    /// validation enforces).
    pub optional: bool,
}

/// The entity model the policies are compiled against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CedarSpec {
    /// Entity type of principals (e.g. `Agent`).
    pub principal_type: String,
    /// Entity type of resources (e.g. `Tool`).
    pub resource_type: String,
    /// Every action the policies may be asked about, with the facts each one declares.
    pub actions: BTreeMap<String, BTreeMap<String, FactSpec>>,
}

/// A parsed policy set with ids, the escalate convention and `@reason`s applied: what the gate's
/// [`CedarPolicies`] and the runtime's Cedar documents (`cedar_doc.rs`) share.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub(crate) all: PolicySet,
    /// The set decisions are taken on: the same policies with every escalate forbid turned
    /// into a permit (same id, same condition), so that one authorizer call says which hard
    /// forbids matched (a deny), or else which permits and which escalate forbids did.
    decide_on: PolicySet,
    escalate: BTreeMap<String, String>,
    /// `@reason("…")` of the policies that carry one.
    pub(crate) reasons: BTreeMap<String, String>,
    ids: Vec<String>,
}

/// A compile problem and, when Cedar knows it, the byte offset into the policy text it is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Located {
    pub(crate) error: CedarError,
    pub(crate) offset: Option<usize>,
}

/// The annotation that gives a `forbid` its deny message.
pub const REASON_ANNOTATION: &str = "reason";

/// The offset of a Cedar diagnostic's first label.
pub(crate) fn first_offset(d: &dyn miette::Diagnostic) -> Option<usize> {
    d.labels()?.next().map(|l| l.offset())
}

impl Parsed {
    /// Parses `text`, re-keys policies by `@id`, checks the escalate convention. Every parse
    /// error is reported (one [`Located`] each); the other checks stop at the first problem.
    pub(crate) fn parse(text: &str) -> Result<Self, Vec<Located>> {
        let parsed = PolicySet::from_str(text).map_err(|e| {
            e.iter()
                .map(|one| Located {
                    error: CedarError::Parse {
                        message: render_error(one),
                    },
                    offset: first_offset(one),
                })
                .collect::<Vec<_>>()
        })?;
        let single = |error| {
            vec![Located {
                error,
                offset: None,
            }]
        };
        if let Some(t) = parsed.templates().next() {
            return Err(single(CedarError::Template {
                id: t.id().to_string(),
            }));
        }
        let mut all = PolicySet::new();
        let mut decide_on = PolicySet::new();
        let mut escalate = BTreeMap::new();
        let mut reasons = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut policies: Vec<&Policy> = parsed.policies().collect();
        policies.sort_by_key(|p| p.id().to_string());
        for policy in policies {
            let id = policy
                .annotation(ID_ANNOTATION)
                .map_or_else(|| policy.id().to_string(), str::to_owned);
            if id.trim().is_empty() || !seen.insert(id.clone()) {
                return Err(single(CedarError::DuplicateId { id }));
            }
            let rekeyed = policy.new_id(PolicyId::new(&id));
            if let Some(reason) = policy.annotation(REASON_ANNOTATION).map(str::trim)
                && !reason.is_empty()
            {
                reasons.insert(id.clone(), reason.to_owned());
            }
            let approver = policy.annotation(ESCALATE_ANNOTATION).map(str::trim);
            match (approver, policy.effect()) {
                (Some(_), Effect::Permit) => {
                    return Err(single(CedarError::Escalate {
                        id,
                        message: "@escalate applies to forbid policies only".into(),
                    }));
                }
                (Some(""), Effect::Forbid) => {
                    return Err(single(CedarError::Escalate {
                        id,
                        message: "@escalate needs the approver role, e.g. @escalate(\"manager\")"
                            .into(),
                    }));
                }
                (Some(role), Effect::Forbid) => {
                    escalate.insert(id.clone(), role.to_owned());
                    let flipped = as_permit(&rekeyed, &id).map_err(single)?;
                    decide_on.add(flipped).map_err(|e| {
                        single(CedarError::DuplicateId {
                            id: format!("{id} ({})", render_error(&e)),
                        })
                    })?;
                }
                (None, _) => {
                    decide_on.add(rekeyed.clone()).map_err(|e| {
                        single(CedarError::DuplicateId {
                            id: format!("{id} ({})", render_error(&e)),
                        })
                    })?;
                }
            }
            all.add(rekeyed).map_err(|e| {
                single(CedarError::DuplicateId {
                    id: format!("{id} ({})", render_error(&e)),
                })
            })?;
        }
        Ok(Self {
            all,
            decide_on,
            escalate,
            reasons,
            ids: seen.into_iter().collect(),
        })
    }

    /// The ids of every policy, sorted.
    pub(crate) fn ids(&self) -> &[String] {
        &self.ids
    }

    /// Validates the set in strict mode against `schema`: one [`Located`] per problem.
    pub(crate) fn validate(&self, schema: &Schema) -> Result<(), Vec<Located>> {
        let result = Validator::new(schema.clone()).validate(&self.all, ValidationMode::Strict);
        if result.validation_passed() {
            return Ok(());
        }
        Err(result
            .validation_errors()
            .map(|e| Located {
                error: CedarError::Validation {
                    messages: vec![format!("policy `{}`: {e}", e.policy_id())],
                },
                offset: first_offset(e),
            })
            .collect())
    }

    /// Decides one request: forbid wins, default deny, the escalate convention, and any
    /// evaluation error fails closed. One authorizer call on `decide_on`, where escalate
    /// forbids are permits: a deny there is a matched hard forbid; an allow lists the matched
    /// permits and escalate forbids, which escalate when a real permit matched too and are
    /// no permit (default deny) otherwise.
    pub(crate) fn decide(&self, request: &Request, entities: &Entities) -> CedarVerdict {
        let response = Authorizer::new().is_authorized(request, &self.decide_on, entities);
        if let Some(error) = response.diagnostics().errors().next() {
            return CedarVerdict::Invalid {
                problem: format!("policy evaluation failed (fail closed): {error}"),
            };
        }
        let mut reasons: Vec<String> = response
            .diagnostics()
            .reason()
            .map(ToString::to_string)
            .collect();
        reasons.sort();
        if response.decision() != Decision::Allow {
            return if reasons.is_empty() {
                CedarVerdict::NoPermit
            } else {
                CedarVerdict::Deny { forbids: reasons }
            };
        }
        let (escalating, permits): (Vec<String>, Vec<String>) = reasons
            .into_iter()
            .partition(|id| self.escalate.contains_key(id));
        if escalating.is_empty() {
            return CedarVerdict::Allow { permits };
        }
        if permits.is_empty() {
            return CedarVerdict::NoPermit;
        }
        let approver = escalating
            .first()
            .and_then(|id| self.escalate.get(id))
            .cloned()
            .unwrap_or_default();
        CedarVerdict::Escalate {
            policies: escalating,
            approver,
        }
    }
}

/// `policy` (a `forbid`) as a `permit` with the same id, scope, condition and annotations.
fn as_permit(policy: &Policy, id: &str) -> Result<Policy, CedarError> {
    let problem = |message: String| CedarError::Escalate {
        id: id.to_owned(),
        message,
    };
    let mut json = policy
        .to_json()
        .map_err(|e| problem(format!("cannot be read back: {}", render_error(&e))))?;
    if let Some(effect) = json.get_mut("effect") {
        *effect = Value::String("permit".to_owned());
    }
    Policy::from_json(Some(PolicyId::new(id)), json)
        .map_err(|e| problem(format!("cannot be rebuilt: {}", render_error(&e))))
}

/// A compiled policy set.
#[derive(Debug, Clone)]
pub struct CedarPolicies {
    parsed: Parsed,
    schema: Schema,
    spec: CedarSpec,
}

/// What one evaluation decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CedarVerdict {
    /// A permit matched and no forbid did.
    Allow {
        /// The matched permits.
        permits: Vec<String>,
    },
    /// At least one hard forbid matched.
    Deny {
        /// Every matched hard forbid, sorted.
        forbids: Vec<String>,
    },
    /// No permit matched (default deny).
    NoPermit,
    /// A permit matched and only `@escalate` forbids matched.
    Escalate {
        /// The matched escalate forbids, sorted.
        policies: Vec<String>,
        /// The approver role of the first of them.
        approver: String,
    },
    /// The request could not be evaluated safely (missing or mistyped fact, undeclared action,
    /// evaluation error): the caller must deny.
    Invalid {
        /// What is wrong, naming the fact or policy.
        problem: String,
    },
}

/// Errors compiling a policy set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CedarError {
    /// The text does not parse.
    #[error("Cedar policies do not parse: {message}")]
    Parse {
        /// The parser's message.
        message: String,
    },
    /// Two policies carry the same id.
    #[error("two Cedar policies have the id `{id}`")]
    DuplicateId {
        /// The id.
        id: String,
    },
    /// A policy template was given (only static policies are supported).
    #[error("Cedar policy templates are not supported (policy `{id}`)")]
    Template {
        /// The template id.
        id: String,
    },
    /// `@escalate` used wrongly.
    #[error("policy `{id}`: {message}")]
    Escalate {
        /// The policy.
        id: String,
        /// What is wrong.
        message: String,
    },
    /// The generated schema is invalid (bad type or action names).
    #[error("Cedar schema: {message}")]
    Schema {
        /// The schema error.
        message: String,
    },
    /// The policies do not validate against the declared facts.
    #[error("Cedar policies do not validate against the declared facts: {}", messages.join("; "))]
    Validation {
        /// One message per validation error.
        messages: Vec<String>,
    },
}

impl CedarPolicies {
    /// Parses `text`, re-keys policies by `@id`, checks the escalate convention and validates
    /// the set in strict mode against the schema generated from `spec`.
    ///
    /// # Errors
    /// [`CedarError`] naming the offending policy, id or validation problem.
    pub fn compile(text: &str, spec: &CedarSpec) -> Result<Self, CedarError> {
        let parsed = Parsed::parse(text).map_err(first_error)?;
        let schema =
            Schema::from_json_value(schema_json(spec)).map_err(|e| CedarError::Schema {
                message: render_error(&e),
            })?;
        parsed.validate(&schema).map_err(first_error)?;
        Ok(Self {
            parsed,
            schema,
            spec: spec.clone(),
        })
    }

    /// The ids of every policy, sorted.
    #[must_use]
    pub fn ids(&self) -> &[String] {
        self.parsed.ids()
    }

    /// The declared facts of `action`, if the action is declared.
    #[must_use]
    pub fn facts(&self, action: &str) -> Option<&BTreeMap<String, FactSpec>> {
        self.spec.actions.get(action)
    }

    /// Evaluates one request. `context` may hold any keys; only the declared facts of the
    /// action reach Cedar, and each of them is type-checked first.
    #[must_use]
    pub fn evaluate(
        &self,
        principal: &str,
        action: &str,
        resource: &str,
        context: &Map<String, Value>,
    ) -> CedarVerdict {
        match self.request(principal, action, resource, context) {
            Ok(request) => self.decide(&request),
            Err(problem) => CedarVerdict::Invalid { problem },
        }
    }

    fn request(
        &self,
        principal: &str,
        action: &str,
        resource: &str,
        context: &Map<String, Value>,
    ) -> Result<Request, String> {
        let Some(facts) = self.spec.actions.get(action) else {
            return Err(format!(
                "action `{action}` is not declared in the policy schema"
            ));
        };
        let mut typed = Map::new();
        for (name, spec) in facts {
            match context.get(name) {
                None | Some(Value::Null) if spec.optional => {}
                None | Some(Value::Null) => {
                    return Err(format!(
                        "missing fact `{name}` ({}) required by the policies of `{action}`",
                        spec.ty.name()
                    ));
                }
                Some(value) => {
                    typed.insert(name.clone(), typed_value(name, spec.ty, value)?);
                }
            }
        }
        let action_uid = uid("Action", action)?;
        let cedar_context =
            Context::from_json_value(Value::Object(typed), Some((&self.schema, &action_uid)))
                .map_err(|e| {
                    format!(
                        "context does not match the declared facts: {}",
                        render_error(&e)
                    )
                })?;
        Request::new(
            uid(&self.spec.principal_type, principal)?,
            action_uid,
            uid(&self.spec.resource_type, resource)?,
            cedar_context,
            Some(&self.schema),
        )
        .map_err(|e| {
            format!(
                "request does not match the policy schema: {}",
                render_error(&e)
            )
        })
    }

    fn decide(&self, request: &Request) -> CedarVerdict {
        self.parsed.decide(request, &Entities::empty())
    }
}

pub(crate) fn uid(type_name: &str, id: &str) -> Result<EntityUid, String> {
    let ty = EntityTypeName::from_str(type_name)
        .map_err(|e| format!("invalid entity type `{type_name}`: {}", render_error(&e)))?;
    Ok(EntityUid::from_type_name_and_id(ty, EntityId::new(id)))
}

pub(crate) fn typed_value(name: &str, ty: FactType, value: &Value) -> Result<Value, String> {
    let mistyped = || {
        format!(
            "fact `{name}` must be a {}, got {} `{value}`",
            ty.name(),
            json_kind(value)
        )
    };
    match ty {
        FactType::String if value.is_string() => Ok(value.clone()),
        FactType::Bool if value.is_boolean() => Ok(value.clone()),
        FactType::Long if value.is_i64() => Ok(value.clone()),
        FactType::Decimal => {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(mistyped()),
            };
            let decimal = cedar_decimal(&text).ok_or_else(mistyped)?;
            Ok(json!({"__extn": {"fn": "decimal", "arg": decimal}}))
        }
        FactType::StringSet => match value {
            Value::Array(items) if items.iter().all(Value::is_string) => Ok(value.clone()),
            _ => Err(mistyped()),
        },
        _ => Err(mistyped()),
    }
}

/// Normalises a decimal literal to Cedar's `decimal` form (`-?digits.digits{1,4}`).
pub(crate) fn cedar_decimal(text: &str) -> Option<String> {
    let (sign, body) = match text.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", text),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, "0"));
    let frac = frac.trim_end_matches('0');
    let frac = if frac.is_empty() { "0" } else { frac };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(int) && digits(frac) && frac.len() <= 4).then(|| format!("{sign}{int}.{frac}"))
}

pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn schema_json(spec: &CedarSpec) -> Value {
    let mut entity_types = Map::new();
    entity_types.insert(spec.principal_type.clone(), json!({}));
    entity_types.insert(spec.resource_type.clone(), json!({}));
    let mut actions = Map::new();
    for (action, facts) in &spec.actions {
        let mut attributes = Map::new();
        for (name, fact) in facts {
            let mut ty = fact.ty.schema_type();
            if let Value::Object(map) = &mut ty {
                map.insert("required".into(), Value::Bool(!fact.optional));
            }
            attributes.insert(name.clone(), ty);
        }
        actions.insert(
            action.clone(),
            json!({"appliesTo": {
                "principalTypes": [spec.principal_type],
                "resourceTypes": [spec.resource_type],
                "context": {"type": "Record", "attributes": attributes},
            }}),
        );
    }
    json!({"": {"entityTypes": entity_types, "actions": actions}})
}

/// One [`CedarError`] from a list of located problems: every validation message together,
/// else the first problem (the gate's [`CedarPolicies::compile`] reports one error).
fn first_error(list: Vec<Located>) -> CedarError {
    if list
        .iter()
        .all(|l| matches!(l.error, CedarError::Validation { .. }))
        && !list.is_empty()
    {
        let messages = list
            .into_iter()
            .flat_map(|l| match l.error {
                CedarError::Validation { messages } => messages,
                _ => Vec::new(),
            })
            .collect();
        return CedarError::Validation { messages };
    }
    list.into_iter().next().map_or_else(
        || CedarError::Parse {
            message: "the policies could not be compiled".into(),
        },
        |l| l.error,
    )
}

/// Cedar errors print a short headline; the detail lives in their `source()` chain.
pub(crate) fn render_error(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const WALKTHROUGH: &str = r#"
// A support_agent may refund on an active account, to the original card.
permit (principal, action, resource)
when { context.agent_active == true && context.user_role == "support_agent" };

@id("acct-frozen")
forbid (principal, action, resource)
when { context.op == "refund.create" && context.account_status == "frozen" };

@id("to-original")
forbid (principal, action, resource)
when { context.op == "refund.create" && context.refund_to_original == false };

@id("escalate-review")
@escalate("manager")
forbid (principal, action, resource)
when { context.op == "refund.create" && context.account_status == "review" };
"#;

    fn spec() -> CedarSpec {
        let fact = |ty| FactSpec {
            ty,
            optional: false,
        };
        let facts = BTreeMap::from([
            ("agent_active".to_owned(), fact(FactType::Bool)),
            ("user_role".to_owned(), fact(FactType::String)),
            ("op".to_owned(), fact(FactType::String)),
            ("account_status".to_owned(), fact(FactType::String)),
            ("refund_to_original".to_owned(), fact(FactType::Bool)),
        ]);
        CedarSpec {
            principal_type: "Agent".into(),
            resource_type: "Tool".into(),
            actions: BTreeMap::from([("refund.create".to_owned(), facts)]),
        }
    }

    fn ctx(status: &str, to_original: Value) -> Map<String, Value> {
        let Value::Object(map) = json!({
            "agent_active": true, "user_role": "support_agent", "op": "refund.create",
            "account_status": status, "refund_to_original": to_original,
            "amount_usd": 50.5, "intent": "refund"
        }) else {
            unreachable!()
        };
        map
    }

    fn eval(p: &CedarPolicies, c: &Map<String, Value>) -> CedarVerdict {
        p.evaluate("agent_refund_bot", "refund.create", "payments", c)
    }

    #[test]
    fn walkthrough_outcomes() {
        let p = CedarPolicies::compile(WALKTHROUGH, &spec()).unwrap();
        assert_eq!(
            p.ids(),
            ["acct-frozen", "escalate-review", "policy0", "to-original"]
        );
        assert_eq!(
            eval(&p, &ctx("active", json!(true))),
            CedarVerdict::Allow {
                permits: vec!["policy0".into()]
            }
        );
        assert_eq!(
            eval(&p, &ctx("frozen", json!(true))),
            CedarVerdict::Deny {
                forbids: vec!["acct-frozen".into()]
            }
        );
        assert_eq!(
            eval(&p, &ctx("review", json!(true))),
            CedarVerdict::Escalate {
                policies: vec!["escalate-review".into()],
                approver: "manager".into()
            }
        );
        // A hard forbid beats an escalate forbid, and every hard forbid is named.
        assert_eq!(
            eval(&p, &ctx("frozen", json!(false))),
            CedarVerdict::Deny {
                forbids: vec!["acct-frozen".into(), "to-original".into()]
            }
        );
        assert_eq!(
            eval(&p, &ctx("review", json!(false))),
            CedarVerdict::Deny {
                forbids: vec!["to-original".into()]
            }
        );
    }

    #[test]
    fn no_permit_is_default_deny_even_when_only_an_escalate_forbid_matched() {
        let p = CedarPolicies::compile(WALKTHROUGH, &spec()).unwrap();
        let mut c = ctx("active", json!(true));
        c.insert("user_role".into(), json!("intern"));
        assert_eq!(eval(&p, &c), CedarVerdict::NoPermit);
        c.insert("account_status".into(), json!("review"));
        assert_eq!(eval(&p, &c), CedarVerdict::NoPermit);
    }

    #[test]
    fn missing_and_mistyped_facts_fail_closed() {
        let p = CedarPolicies::compile(WALKTHROUGH, &spec()).unwrap();
        let mut c = ctx("frozen", json!(true));
        c.remove("account_status");
        let CedarVerdict::Invalid { problem } = eval(&p, &c) else {
            panic!("missing fact must not evaluate")
        };
        assert!(
            problem.contains("missing fact `account_status`"),
            "{problem}"
        );

        let c = ctx("active", json!("false"));
        let CedarVerdict::Invalid { problem } = eval(&p, &c) else {
            panic!("mistyped fact must not evaluate")
        };
        assert!(
            problem.contains("fact `refund_to_original` must be a bool, got string"),
            "{problem}"
        );

        let mut c = ctx("active", json!(true));
        c.insert("account_status".into(), Value::Null);
        assert!(matches!(eval(&p, &c), CedarVerdict::Invalid { .. }));
    }

    #[test]
    fn undeclared_action_fails_closed() {
        let p = CedarPolicies::compile(WALKTHROUGH, &spec()).unwrap();
        let c = ctx("active", json!(true));
        let verdict = p.evaluate("a", "charge.create", "payments", &c);
        assert!(
            matches!(verdict, CedarVerdict::Invalid { problem } if problem.contains("charge.create"))
        );
    }

    #[test]
    fn compile_errors_name_the_problem() {
        let dup = "@id(\"x\") permit(principal, action, resource);\n@id(\"x\") forbid(principal, action, resource);";
        assert_eq!(
            CedarPolicies::compile(dup, &spec()).unwrap_err(),
            CedarError::DuplicateId { id: "x".into() }
        );
        let esc_permit = "@id(\"p\") @escalate(\"manager\") permit(principal, action, resource);";
        assert!(matches!(
            CedarPolicies::compile(esc_permit, &spec()).unwrap_err(),
            CedarError::Escalate { id, .. } if id == "p"
        ));
        let undeclared =
            "@id(\"u\") forbid(principal, action, resource) when { context.colour == \"red\" };";
        let err = CedarPolicies::compile(undeclared, &spec()).unwrap_err();
        assert!(
            matches!(&err, CedarError::Validation { messages } if messages[0].contains("policy `u`")),
            "{err}"
        );
        let wrong_type = "@id(\"w\") forbid(principal, action, resource) when { context.refund_to_original == \"false\" };";
        assert!(matches!(
            CedarPolicies::compile(wrong_type, &spec()).unwrap_err(),
            CedarError::Validation { .. }
        ));
        assert!(matches!(
            CedarPolicies::compile("permit(", &spec()).unwrap_err(),
            CedarError::Parse { .. }
        ));
    }

    #[test]
    fn decimal_and_optional_facts() {
        let mut s = spec();
        let facts = s.actions.get_mut("refund.create").unwrap();
        facts.insert(
            "amount".into(),
            FactSpec {
                ty: FactType::Decimal,
                optional: false,
            },
        );
        facts.insert(
            "channel".into(),
            FactSpec {
                ty: FactType::String,
                optional: true,
            },
        );
        let text = r#"
            permit (principal, action, resource) when { context.agent_active };
            @id("big") forbid (principal, action, resource)
            when { context.amount.greaterThan(decimal("100.00")) };
            @id("web") forbid (principal, action, resource)
            when { context has channel && context.channel == "web" };
        "#;
        let p = CedarPolicies::compile(text, &s).unwrap();
        let mut c = ctx("active", json!(true));
        c.insert("amount".into(), json!("150.00"));
        assert_eq!(
            eval(&p, &c),
            CedarVerdict::Deny {
                forbids: vec!["big".into()]
            }
        );
        c.insert("amount".into(), json!(99.5));
        assert!(matches!(eval(&p, &c), CedarVerdict::Allow { .. }));
        c.insert("channel".into(), json!("web"));
        assert_eq!(
            eval(&p, &c),
            CedarVerdict::Deny {
                forbids: vec!["web".into()]
            }
        );
        c.insert("amount".into(), json!("1.23456"));
        assert!(matches!(eval(&p, &c), CedarVerdict::Invalid { .. }));
        // Strict validation refuses reading an optional fact without `has`.
        let unguarded =
            "@id(\"x\") forbid (principal, action, resource) when { context.channel == \"web\" };";
        assert!(CedarPolicies::compile(unguarded, &s).is_err());
    }

    #[test]
    fn cedar_decimal_normalisation() {
        assert_eq!(cedar_decimal("50").as_deref(), Some("50.0"));
        assert_eq!(cedar_decimal("50.00").as_deref(), Some("50.0"));
        assert_eq!(cedar_decimal("-0.125").as_deref(), Some("-0.125"));
        assert_eq!(cedar_decimal("1.23456"), None);
        assert_eq!(cedar_decimal("1e3"), None);
        assert_eq!(cedar_decimal(""), None);
    }
}
