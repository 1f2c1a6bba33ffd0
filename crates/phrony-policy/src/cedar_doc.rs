//! Cedar policy documents in a [`PolicySet`](crate::PolicySet): a policy whose effect on a call
//! is computed by Cedar (`PolicyDef::cedar`).
//!
//! The text is parsed with the gate's semantics (`cedar.rs`: `@id` ids, forbid wins, default
//! deny, the `@escalate` convention) plus `@reason("…")` for deny messages, and validated in
//! Cedar's strict mode against a schema generated from the input schemas of the tools in the
//! policy's scope (`PolicyDef::cedar_tools`), so a policy that reads an argument a tool does not
//! have, or compares it with the wrong type, is refused at compile time. Each call becomes one
//! Cedar request (see the crate README, "Cedar policies", for the mapping); a missing or
//! mistyped fact, or any evaluation error, fails closed.
//!
//! `context.history` holds the policy's named history facts (`PolicyDef::cedar_history`): each
//! name a history query, answered like a condition's `history` leaf (the engine reads the facts
//! from the ledger), typed `Long` for `count`, `Bool` for `exists` and `decimal` for `sum`,
//! `max` and `last`. Every named fact is required: one that cannot be answered (no facts on the
//! request, a `same` argument missing, a `last` with no earlier value) denies the call, naming
//! the fact (fail closed).

use std::collections::BTreeMap;

use cedar_policy::{
    Context, Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression, Schema,
};
use serde_json::{Map, Value, json};

use crate::Aggregate;
use crate::cedar::{
    CedarError, CedarVerdict, FactSpec, FactType, Located, Parsed, cedar_decimal, json_kind,
    render_error, uid,
};
use crate::history::{Answer, Side};
use crate::request::Request;

/// The largest Cedar text a policy may carry, in bytes.
pub const MAX_CEDAR_BYTES: usize = 64 * 1024;

/// Entity type of the principal.
const PRINCIPAL: &str = "Principal";
/// Entity type of the resource (the tool).
const TOOL: &str = "Tool";
/// Entity type of the session (`context.session`), whose tags are the session metadata.
const SESSION: &str = "Session";
/// The principal id when the claims carry no `sub`.
const ANONYMOUS: &str = "anonymous";

/// A compiled Cedar document.
#[derive(Debug, Clone)]
pub(crate) struct CedarDoc {
    parsed: Parsed,
    /// The schema the policies were validated against; tests check every request built for
    /// evaluation against it (`conforms`), which evaluation itself skips.
    #[cfg(test)]
    schema: Option<Schema>,
    /// The typed arguments of every tool in scope, by dispatch ref.
    tools: BTreeMap<String, BTreeMap<String, FactSpec>>,
    /// The action and resource of every tool in scope, by dispatch ref (built once).
    uids: BTreeMap<String, ToolUids>,
    /// The principal's and the session's entity types; `None` when no tool is in scope (a
    /// document checked on its own): nothing to evaluate.
    types: Option<EntityTypes>,
}

/// The action and the resource a call of one tool is evaluated as.
#[derive(Debug, Clone)]
struct ToolUids {
    action: EntityUid,
    resource: EntityUid,
}

/// The entity types of a request's principal and session.
#[derive(Debug, Clone)]
struct EntityTypes {
    principal: EntityTypeName,
    session: EntityTypeName,
}

#[cfg(test)]
thread_local! {
    /// Tests only: how many built requests `CedarDoc::conforms` checked on this thread.
    static CONFORMED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The Cedar schema type of a named history fact.
fn history_type(aggregate: Aggregate) -> Value {
    match aggregate {
        Aggregate::Count => json!({"type": "Long"}),
        Aggregate::Exists => json!({"type": "Boolean"}),
        Aggregate::Sum | Aggregate::Max | Aggregate::Last => {
            json!({"type": "Extension", "name": "decimal"})
        }
    }
}

/// The `context.history` record of one request: every named fact, or the first that cannot
/// be answered.
fn history_record(
    req: &Request<'_>,
    history: &[(String, Side)],
) -> Result<RestrictedExpression, String> {
    let mut record = Vec::with_capacity(history.len());
    for (name, side) in history {
        let missing = || {
            format!(
                "missing fact `history.{name}` ({}): no earlier calls answer it for this call",
                side.query
            )
        };
        let value = match side.answer(req).ok_or_else(missing)? {
            Answer::Bool(b) => RestrictedExpression::new_bool(b),
            Answer::Num(x) if side.aggregate() == Aggregate::Count =>
            {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "a count (plus one) is a small whole number"
                )]
                RestrictedExpression::new_long(x as i64)
            }
            Answer::Num(x) => {
                let text = format!("{x:.4}");
                match decimal_expr(&text) {
                    Some(d) if x.abs() < 9.0e14 => d,
                    _ => {
                        return Err(format!(
                            "fact `history.{name}` is {x}, outside Cedar's decimal range"
                        ));
                    }
                }
            }
        };
        record.push((name.clone(), value));
    }
    record_owned(record)
}

/// A compile problem of a Cedar document: what is wrong and, when known, the byte offset in
/// the Cedar text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CedarIssue {
    pub(crate) message: String,
    pub(crate) offset: Option<usize>,
}

impl From<Located> for CedarIssue {
    fn from(l: Located) -> Self {
        let message = match l.error {
            CedarError::Validation { messages } => messages.join("; "),
            other => other.to_string(),
        };
        Self {
            message,
            offset: l.offset,
        }
    }
}

/// The Cedar type of one input-schema property, if it has one: `string` → String, `boolean` →
/// Bool, `integer` → Long, `number` → decimal, an array of strings → Set<String>. Anything else
/// (objects, other arrays, unions) is not passed to Cedar.
fn property_type(schema: &Value) -> Option<FactType> {
    match schema.get("type")?.as_str()? {
        "string" => Some(FactType::String),
        "boolean" => Some(FactType::Bool),
        "integer" => Some(FactType::Long),
        "number" => Some(FactType::Decimal),
        "array" => {
            (schema.get("items")?.get("type")?.as_str()? == "string").then_some(FactType::StringSet)
        }
        _ => None,
    }
}

/// The typed arguments of a tool from its input schema (top-level properties; the `required`
/// ones are required facts, the others optional).
pub(crate) fn arg_facts(input_schema: &Value) -> BTreeMap<String, FactSpec> {
    let required: Vec<&str> = input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .filter_map(|(name, prop)| {
                    let ty = property_type(prop)?;
                    Some((
                        name.clone(),
                        FactSpec {
                            ty,
                            optional: !required.contains(&name.as_str()),
                        },
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn string_record(names: &[&str]) -> Value {
    let attributes: Map<String, Value> = names
        .iter()
        .map(|n| ((*n).to_owned(), json!({"type": "String"})))
        .collect();
    json!({"type": "Record", "attributes": attributes})
}

fn schema_json(
    tools: &BTreeMap<String, BTreeMap<String, FactSpec>>,
    history: &[(&str, Aggregate)],
) -> Value {
    let history: Map<String, Value> = history
        .iter()
        .map(|(name, aggregate)| ((*name).to_owned(), history_type(*aggregate)))
        .collect();
    let mut actions = Map::new();
    for (tool, facts) in tools {
        let mut args = Map::new();
        for (name, fact) in facts {
            let mut ty = fact.ty.schema_type();
            if let Value::Object(map) = &mut ty {
                map.insert("required".into(), Value::Bool(!fact.optional));
            }
            args.insert(name.clone(), ty);
        }
        let mut principal = string_record(&["id"]);
        if let Value::Object(map) = &mut principal {
            map.insert("required".into(), Value::Bool(false));
            if let Some(Value::Object(attrs)) = map.get_mut("attributes") {
                attrs.insert(
                    "roles".into(),
                    json!({"type": "Set", "element": {"type": "String"}}),
                );
            }
        }
        actions.insert(
            tool.clone(),
            json!({"appliesTo": {
                "principalTypes": [PRINCIPAL],
                "resourceTypes": [TOOL],
                "context": {"type": "Record", "attributes": {
                    "args": {"type": "Record", "attributes": args},
                    "tool": string_record(&["ref", "version", "side_effect_class", "name"]),
                    "agent": string_record(&["namespace", "name", "version"]),
                    "principal": principal,
                    "session": {"type": "Entity", "name": SESSION},
                    "time": {"type": "Long", "required": false},
                    "history": {"type": "Record", "attributes": history},
                }},
            }}),
        );
    }
    json!({"": {
        "entityTypes": {
            "Principal": {"tags": {"type": "String"}},
            "Session": {"tags": {"type": "String"}},
            "Tool": {},
        },
        "actions": actions,
    }})
}

impl CedarDoc {
    /// Parses and validates `text` against the tools in scope (`tools`: dispatch ref → input
    /// schema). With no tool, only parses and checks the annotations.
    pub(crate) fn compile(
        text: &str,
        tools: &BTreeMap<String, Value>,
        history: &[(&str, Aggregate)],
    ) -> Result<Self, Vec<CedarIssue>> {
        if text.len() > MAX_CEDAR_BYTES {
            return Err(vec![CedarIssue {
                message: format!(
                    "the Cedar text is {} bytes; at most {MAX_CEDAR_BYTES} are allowed",
                    text.len()
                ),
                offset: None,
            }]);
        }
        if text.trim().is_empty() {
            return Err(vec![CedarIssue {
                message: "the Cedar text is empty; write at least one permit".into(),
                offset: None,
            }]);
        }
        let parsed = Parsed::parse(text)
            .map_err(|l| l.into_iter().map(CedarIssue::from).collect::<Vec<_>>())?;
        let tools: BTreeMap<String, BTreeMap<String, FactSpec>> = tools
            .iter()
            .map(|(tool, schema)| (tool.clone(), arg_facts(schema)))
            .collect();
        let schema = if tools.is_empty() {
            None
        } else {
            let schema = Schema::from_json_value(schema_json(&tools, history)).map_err(|e| {
                vec![CedarIssue {
                    message: format!("Cedar schema of the tools in scope: {}", render_error(&e)),
                    offset: None,
                }]
            })?;
            parsed
                .validate(&schema)
                .map_err(|l| l.into_iter().map(CedarIssue::from).collect::<Vec<_>>())?;
            Some(schema)
        };
        let located = |message: String| {
            vec![CedarIssue {
                message,
                offset: None,
            }]
        };
        let uids = tools
            .keys()
            .map(|tool| {
                Ok((
                    tool.clone(),
                    ToolUids {
                        action: uid("Action", tool).map_err(located)?,
                        resource: uid(TOOL, tool).map_err(located)?,
                    },
                ))
            })
            .collect::<Result<BTreeMap<_, _>, Vec<CedarIssue>>>()?;
        let types = match schema {
            None => None,
            Some(_) => Some(EntityTypes {
                principal: uid(PRINCIPAL, ANONYMOUS)
                    .map_err(located)?
                    .type_name()
                    .clone(),
                session: uid(SESSION, ANONYMOUS)
                    .map_err(located)?
                    .type_name()
                    .clone(),
            }),
        };
        Ok(Self {
            parsed,
            #[cfg(test)]
            schema: schema.clone(),
            tools,
            uids,
            types,
        })
    }

    /// The `@id`s of the Cedar policies, sorted.
    pub(crate) fn ids(&self) -> &[String] {
        self.parsed.ids()
    }

    /// The `@reason` of a Cedar policy.
    pub(crate) fn reason(&self, id: &str) -> Option<&str> {
        self.parsed.reasons.get(id).map(String::as_str)
    }

    /// The tools in scope no `permit` can apply to (by its principal, action and resource
    /// scopes; the principal is a `Principal::"<sub>"` and the resource a `Tool::"<ref>"`, both
    /// in no other entity, so a principal scope on another entity type never matches): every
    /// call of theirs is denied. (A permit whose condition can never hold is not detected.)
    pub(crate) fn tools_without_permit(&self) -> Vec<&str> {
        use cedar_policy::{ActionConstraint, Effect, PrincipalConstraint, ResourceConstraint};
        let Ok(principal_type) = uid(PRINCIPAL, ANONYMOUS).map(|u| u.type_name().clone()) else {
            return Vec::new();
        };
        let permits: Vec<(ActionConstraint, ResourceConstraint)> = self
            .parsed
            .all
            .policies()
            .filter(|p| p.effect() == Effect::Permit)
            .filter(|p| match p.principal_constraint() {
                PrincipalConstraint::Any => true,
                PrincipalConstraint::Eq(e) | PrincipalConstraint::In(e) => {
                    *e.type_name() == principal_type
                }
                PrincipalConstraint::Is(t) => t == principal_type,
                PrincipalConstraint::IsIn(t, e) => {
                    t == principal_type && *e.type_name() == principal_type
                }
            })
            .map(|p| (p.action_constraint(), p.resource_constraint()))
            .collect();
        self.tools
            .keys()
            .filter(|tool| {
                let (Ok(action), Ok(resource)) = (uid("Action", tool), uid(TOOL, tool)) else {
                    return true;
                };
                !permits.iter().any(|(a, r)| {
                    let action_fits = match a {
                        ActionConstraint::Any => true,
                        ActionConstraint::Eq(a) => *a == action,
                        ActionConstraint::In(list) => list.contains(&action),
                    };
                    let resource_fits = match r {
                        ResourceConstraint::Any => true,
                        ResourceConstraint::Eq(e) | ResourceConstraint::In(e) => *e == resource,
                        ResourceConstraint::Is(t) => *t == *resource.type_name(),
                        ResourceConstraint::IsIn(t, e) => {
                            *t == *resource.type_name() && *e == resource
                        }
                    };
                    action_fits && resource_fits
                })
            })
            .map(String::as_str)
            .collect()
    }

    /// Decides one call, with the policy's named history facts.
    pub(crate) fn evaluate(&self, req: &Request<'_>, history: &[(String, Side)]) -> CedarVerdict {
        match self.request(req, history) {
            Ok((request, entities)) => {
                #[cfg(test)]
                self.conforms(&request, &entities);
                self.parsed.decide(&request, &entities)
            }
            Err(problem) => CedarVerdict::Invalid { problem },
        }
    }

    /// Tests only: the request and entities built for evaluation (without Cedar's schema
    /// check) pass that check, i.e. what is typed by construction is typed as the schema says.
    #[cfg(test)]
    #[allow(clippy::expect_used, reason = "a test assertion")]
    fn conforms(&self, request: &cedar_policy::Request, entities: &Entities) {
        let schema = self.schema.as_ref().expect("evaluated with tools in scope");
        let (Some(p), Some(a), Some(r), Some(c)) = (
            request.principal(),
            request.action(),
            request.resource(),
            request.context(),
        ) else {
            panic!("a concrete request: {request:?}");
        };
        cedar_policy::Request::new(p.clone(), a.clone(), r.clone(), c.clone(), Some(schema))
            .expect("the built request conforms to the schema");
        Entities::from_entities(entities.iter().cloned(), Some(schema))
            .expect("the built entities conform to the schema");
        CONFORMED.with(|n| n.set(n.get() + 1));
    }

    fn request(
        &self,
        req: &Request<'_>,
        history: &[(String, Side)],
    ) -> Result<(cedar_policy::Request, Entities), String> {
        let tool = req.tool.r#ref;
        let (Some(entry), Some(types)) = (self.uids.get(tool), &self.types) else {
            return Err(format!(
                "tool `{tool}` is not in the scope the Cedar policies were compiled for"
            ));
        };
        let context = self.context(req, history)?;
        let mut principal_id = ANONYMOUS;
        let mut claim_tags = Vec::new();
        let mut principal = None;
        if let Some(claims) = req.principal {
            let Some(claims) = claims.as_object() else {
                return Err("the principal's claims must be a JSON object".to_owned());
            };
            if let Some(sub) = claims.get("sub") {
                principal_id = sub.as_str().ok_or_else(|| {
                    format!(
                        "fact `principal.id` (claim `sub`) must be a string, got {}",
                        json_kind(sub)
                    )
                })?;
            }
            let roles = roles(claims)?;
            principal = Some(record([
                (
                    "id",
                    RestrictedExpression::new_string(principal_id.to_owned()),
                ),
                (
                    "roles",
                    RestrictedExpression::new_set(
                        roles.into_iter().map(RestrictedExpression::new_string),
                    ),
                ),
            ])?);
            claim_tags = tags(claims);
        }
        let session = req.session.unwrap_or_default();
        let metadata_tags = session
            .metadata
            .and_then(Value::as_object)
            .map(tags)
            .unwrap_or_default();
        let principal_uid =
            EntityUid::from_type_name_and_id(types.principal.clone(), EntityId::new(principal_id));
        let session_uid =
            EntityUid::from_type_name_and_id(types.session.clone(), EntityId::new(session.id));
        let mut pairs = context;
        if let Some(principal) = principal {
            pairs.push(("principal".to_owned(), principal));
        }
        pairs.push((
            "session".to_owned(),
            RestrictedExpression::new_entity_uid(session_uid.clone()),
        ));
        let entity = |uid: EntityUid, tags: Vec<(String, RestrictedExpression)>| {
            Entity::new_with_tags(uid, [], [], tags).map_err(|e| {
                format!(
                    "principal or session does not fit the schema: {}",
                    render_error(&e)
                )
            })
        };
        let entities = Entities::from_entities(
            [
                entity(principal_uid.clone(), claim_tags)?,
                entity(session_uid, metadata_tags)?,
            ],
            None,
        )
        .map_err(|e| {
            format!(
                "principal or session does not fit the schema: {}",
                render_error(&e)
            )
        })?;
        // Every value above is typed by the schema's declaration (the arguments by their input
        // schema, `arg_value`; the history facts by aggregate; the rest are strings, a Long and
        // a set of strings), so the request is built without Cedar's per-call schema check
        // (`built_requests_conform_to_the_schema` checks that they would pass it); the
        // policies were validated against the schema in strict mode when compiled.
        let context = Context::from_pairs(pairs).map_err(|e| {
            format!(
                "the call does not match the tool's declared facts: {}",
                render_error(&e)
            )
        })?;
        let request = cedar_policy::Request::new(
            principal_uid,
            entry.action.clone(),
            entry.resource.clone(),
            context,
            None,
        )
        .map_err(|e| {
            format!(
                "the call does not match the Cedar schema: {}",
                render_error(&e)
            )
        })?;
        Ok((request, entities))
    }

    /// The context of one call without `principal` and `session`: `args` (the tool's declared
    /// arguments, typed), `tool`, `agent`, `history` and `time`.
    fn context(
        &self,
        req: &Request<'_>,
        history: &[(String, Side)],
    ) -> Result<Vec<(String, RestrictedExpression)>, String> {
        let tool = req.tool.r#ref;
        let Some(facts) = self.tools.get(tool) else {
            return Err(format!(
                "tool `{tool}` is not in the scope the Cedar policies were compiled for"
            ));
        };
        let empty = Map::new();
        let args_in = req.args.as_object().unwrap_or(&empty);
        let mut args = Vec::with_capacity(facts.len());
        for (name, spec) in facts {
            match args_in.get(name) {
                None | Some(Value::Null) if spec.optional => {}
                None | Some(Value::Null) => {
                    return Err(format!(
                        "missing fact `args.{name}` ({}) required by the input schema of `{tool}`",
                        spec.ty.name()
                    ));
                }
                Some(value) => args.push((name.clone(), arg_value(name, spec.ty, value)?)),
            }
        }
        let agent = req.agent.unwrap_or_default();
        let string = |s: &str| RestrictedExpression::new_string(s.to_owned());
        let mut pairs = vec![
            ("args".to_owned(), record_owned(args)?),
            (
                "tool".to_owned(),
                record([
                    ("ref", string(tool)),
                    ("version", string(req.tool.version)),
                    ("side_effect_class", string(req.tool.side_effect_class)),
                    ("name", string(req.tool.name)),
                ])?,
            ),
            (
                "agent".to_owned(),
                record([
                    ("namespace", string(agent.namespace)),
                    ("name", string(agent.name)),
                    ("version", string(agent.version)),
                ])?,
            ),
            ("history".to_owned(), history_record(req, history)?),
        ];
        if let Some(time) = req.now_unix {
            pairs.push(("time".to_owned(), RestrictedExpression::new_long(time)));
        }
        Ok(pairs)
    }
}

/// A Cedar record from fields with static names.
fn record<const N: usize>(
    fields: [(&str, RestrictedExpression); N],
) -> Result<RestrictedExpression, String> {
    record_owned(fields.into_iter().map(|(k, v)| (k.to_owned(), v)))
}

/// A Cedar record (a duplicate name, impossible here, is an error rather than a panic).
fn record_owned(
    fields: impl IntoIterator<Item = (String, RestrictedExpression)>,
) -> Result<RestrictedExpression, String> {
    RestrictedExpression::new_record(fields)
        .map_err(|e| format!("a Cedar record could not be built: {}", render_error(&e)))
}

/// A Cedar `decimal` from its normalised text (`cedar_decimal`), if it is within Cedar's range
/// (a signed 64-bit count of ten-thousandths).
fn decimal_expr(text: &str) -> Option<RestrictedExpression> {
    let normal = cedar_decimal(text)?;
    let (int, frac) = normal.split_once('.')?;
    let (negative, int) = match int.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, int),
    };
    let scaled = int
        .parse::<i128>()
        .ok()?
        .checked_mul(10_000)?
        .checked_add(format!("{frac:0<4}").parse::<i128>().ok()?)?;
    let fits = if negative {
        -scaled >= i128::from(i64::MIN)
    } else {
        scaled <= i128::from(i64::MAX)
    };
    fits.then(|| RestrictedExpression::new_decimal(normal))
}

/// An argument's Cedar value: like the gate's facts, and a number or integer sent as text is
/// read as the number it spells (the condition language compares `"14000"` as 14000 too). A
/// decimal outside Cedar's range is mistyped.
fn arg_value(name: &str, ty: FactType, value: &Value) -> Result<RestrictedExpression, String> {
    let mistyped = || {
        format!(
            "fact `args.{name}` must be a {}, got {} `{value}`",
            ty.name(),
            json_kind(value)
        )
    };
    match (ty, value) {
        (FactType::String, Value::String(s)) => Ok(RestrictedExpression::new_string(s.clone())),
        (FactType::Bool, Value::Bool(b)) => Ok(RestrictedExpression::new_bool(*b)),
        (FactType::Long, Value::Number(n)) => n
            .as_i64()
            .map(RestrictedExpression::new_long)
            .ok_or_else(mistyped),
        (FactType::Long, Value::String(s)) => s
            .trim()
            .parse::<i64>()
            .map(RestrictedExpression::new_long)
            .map_err(|_| mistyped()),
        (FactType::Decimal, Value::String(s)) => decimal_expr(s.trim()).ok_or_else(mistyped),
        (FactType::Decimal, Value::Number(n)) => decimal_expr(&n.to_string()).ok_or_else(mistyped),
        (FactType::StringSet, Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(|s| RestrictedExpression::new_string(s.to_owned()))
            })
            .collect::<Option<Vec<_>>>()
            .map(RestrictedExpression::new_set)
            .ok_or_else(mistyped),
        _ => Err(mistyped()),
    }
}

/// The principal's verified roles: the `roles` claim (an array of strings) and the `role`
/// claim (a string).
fn roles(claims: &Map<String, Value>) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    match claims.get("roles") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                let Some(role) = item.as_str() else {
                    return Err(format!(
                        "fact `principal.roles` (claim `roles`) must hold strings, got {}",
                        json_kind(item)
                    ));
                };
                out.push(role.to_owned());
            }
        }
        Some(other) => {
            return Err(format!(
                "fact `principal.roles` (claim `roles`) must be an array of strings, got {}",
                json_kind(other)
            ));
        }
    }
    match claims.get("role") {
        None | Some(Value::Null) => {}
        Some(Value::String(role)) => out.push(role.clone()),
        Some(other) => {
            return Err(format!(
                "fact `principal.roles` (claim `role`) must be a string, got {}",
                json_kind(other)
            ));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Entity tags from a JSON object: strings as they are, numbers and booleans as their JSON
/// text; arrays, objects and null are left out.
fn tags(map: &Map<String, Value>) -> Vec<(String, RestrictedExpression)> {
    map.iter()
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k.clone(), RestrictedExpression::new_string(s.clone()))),
            Value::Number(_) | Value::Bool(_) => {
                Some((k.clone(), RestrictedExpression::new_string(v.to_string())))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{
        AgentCtx, CompileErrorKind, DecisionKind, PolicyDef, PolicySet, Request, SessionCtx,
        ToolCtx,
    };

    use super::*;

    const REFUND: &str = "payments.issue-refund";

    /// The refund-agent policies in Cedar (policies-examples/refund-agent-cedar).
    const REFUND_CEDAR: &str = r#"
@id("delegated-refunds")
permit (principal, action == Action::"payments.issue-refund", resource);

@id("above-delegated-limit")
@escalate("finance")
forbid (principal, action, resource)
when { context.args.amount.greaterThan(decimal("250.0")) };

@id("absolute-ceiling")
@reason("Refund amount exceeds the absolute ceiling for agent-initiated refunds.")
forbid (principal, action, resource)
when { context.args.amount.greaterThan(decimal("5000.0")) };
"#;

    fn refund_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "amount": {"type": "number"},
                "currency": {"type": "string"},
                "reason": {"type": "string"},
            },
            "required": ["order_id", "amount", "currency"],
        })
    }

    fn cedar_def(name: &str, text: &str) -> PolicyDef {
        PolicyDef {
            name: name.into(),
            namespace: "payments".into(),
            version: "1.0.0".into(),
            scope: format!("tool:{REFUND}"),
            approvals_required: Some(2),
            reason: Some("Refund amount above delegated limit.".into()),
            cedar: Some(text.into()),
            cedar_tools: BTreeMap::from([(REFUND.to_owned(), refund_schema())]),
            ..PolicyDef::default()
        }
    }

    fn set(defs: Vec<PolicyDef>) -> PolicySet {
        PolicySet::compile(defs).expect("compiles")
    }

    fn decide(set: &PolicySet, args: &Value) -> (DecisionKind, Option<String>, Option<u32>) {
        let req = Request::new(ToolCtx::new(REFUND), args).at(1_700_000_000);
        let d = set.evaluate(&req);
        let quorum = match &d {
            crate::Decision::RequireApproval { policy } => Some(policy.approvals_required()),
            _ => None,
        };
        (d.kind(), d.reason().map(str::to_owned), quorum)
    }

    /// The refund-cumulative policies in Cedar (policies-examples/refund-cumulative-cedar).
    const CUMULATIVE_CEDAR: &str = r#"
@id("within-order-total")
@reason("The refunds of this order would exceed its total.")
forbid (principal, action, resource)
when { context.history.refunded.greaterThan(context.history.order_total) };

@id("per-customer-per-day")
forbid (principal, action, resource) when { context.history.refunds_today > 3 };

@id("refunds")
permit (principal, action, resource);
"#;

    fn cumulative_def() -> PolicyDef {
        let q = |v: Value| v;
        PolicyDef {
            cedar_history: BTreeMap::from([
                (
                    "refunded".to_owned(),
                    q(
                        json!({"calls": "issue_refund", "same": ["order_id"], "aggregate": "sum", "of": "amount"}),
                    ),
                ),
                (
                    "order_total".to_owned(),
                    q(
                        json!({"calls": "lookup_order", "same": ["order_id"], "aggregate": "last", "of": "result.total"}),
                    ),
                ),
                (
                    "refunds_today".to_owned(),
                    q(
                        json!({"calls": "issue_refund", "in": "everyone", "within": "24h", "aggregate": "count"}),
                    ),
                ),
            ]),
            ..cedar_def("refunds-cumulative", CUMULATIVE_CEDAR)
        }
    }

    #[test]
    fn history_facts_reach_cedar_typed_and_fail_closed() {
        let s = set(vec![cumulative_def()]);
        // Three distinct queries, interned into the set for the engine to answer.
        assert_eq!(s.history_queries().len(), 3);
        assert!(s.reads_history_for(REFUND));
        let args = json!({"order_id": "O-1", "amount": 40, "currency": "EUR"});
        let tool = ToolCtx {
            name: "issue_refund",
            ..ToolCtx::new(REFUND)
        };
        let decide = |facts: Option<&crate::HistoryFacts>| {
            let mut req = Request::new(tool, &args).at(1_700_000_000);
            if let Some(f) = facts {
                req = req.with_history(f);
            }
            let d = s.evaluate(&req);
            (d.kind(), d.reason().map(str::to_owned))
        };
        let facts = |refunded: f64, total: Option<f64>, today: u64| {
            let mut f = crate::HistoryFacts::new(3);
            for (i, q) in s.history_queries().iter().enumerate() {
                let fact = match (q.aggregate(), q.calls()) {
                    (Aggregate::Last, _) => crate::HistoryFact {
                        committed: 1,
                        last: total,
                        ..crate::HistoryFact::default()
                    },
                    (Aggregate::Sum, _) => crate::HistoryFact {
                        count: 1,
                        sum: refunded,
                        ..crate::HistoryFact::default()
                    },
                    _ => crate::HistoryFact {
                        count: today,
                        ..crate::HistoryFact::default()
                    },
                };
                f.set(i, fact);
            }
            f
        };
        // 60 earlier + 40 now = the total exactly: allowed; a cent more is forbidden.
        assert_eq!(
            decide(Some(&facts(60.0, Some(100.0), 0))).0,
            DecisionKind::Allow
        );
        let (kind, reason) = decide(Some(&facts(60.01, Some(100.0), 0)));
        assert_eq!(kind, DecisionKind::Deny);
        assert!(reason.unwrap().contains("exceed its total"));
        // The count includes this call: 3 earlier make 4.
        assert_eq!(
            decide(Some(&facts(0.0, Some(100.0), 2))).0,
            DecisionKind::Allow
        );
        assert_eq!(
            decide(Some(&facts(0.0, Some(100.0), 3))).0,
            DecisionKind::Deny
        );
        // No earlier lookup (no `last`), or no facts at all: denied, naming the fact.
        for missing in [Some(&facts(0.0, None, 0)), None] {
            let (kind, reason) = decide(missing);
            assert_eq!(kind, DecisionKind::Deny);
            let reason = reason.unwrap();
            assert!(
                reason.contains("fail closed") && reason.contains("history."),
                "{reason}"
            );
        }
    }

    #[test]
    fn history_facts_are_validated_with_the_cedar_text() {
        // A fact used with the wrong type is refused by strict validation.
        let mut def = cumulative_def();
        def.cedar = Some(
            r#"permit (principal, action, resource) when { context.history.refunds_today.greaterThan(decimal("1.0")) };"#
                .into(),
        );
        let err = PolicySet::compile(vec![def]).unwrap_err();
        assert!(err.to_string().contains("cedar"), "{err}");
        // An undeclared fact too.
        let mut def = cumulative_def();
        def.cedar =
            Some("permit (principal, action, resource) when { context.history.nope > 1 };".into());
        assert!(PolicySet::compile(vec![def]).is_err());
        // A name Cedar cannot read, a bad query, and facts without Cedar text.
        let mut def = cumulative_def();
        def.cedar_history.insert(
            "not-an-ident".into(),
            json!({"calls": "x", "aggregate": "count"}),
        );
        def.cedar_history
            .insert("bad".into(), json!({"calls": "x", "aggregate": "median"}));
        let err = PolicySet::compile(vec![def]).unwrap_err().to_string();
        assert!(
            err.contains("not-an-ident") && err.contains("median"),
            "{err}"
        );
        let def = PolicyDef {
            cedar: None,
            action: "deny".into(),
            ..cumulative_def()
        };
        let err = PolicySet::compile(vec![def]).unwrap_err().to_string();
        assert!(err.contains("cedar_history"), "{err}");
    }

    #[test]
    fn refund_policies_decide_like_the_yaml_ones() {
        let s = set(vec![cedar_def("refund-cedar", REFUND_CEDAR)]);
        for amount in [json!(100), json!(250), json!("250.00")] {
            let args = json!({"order_id": "O-1", "amount": amount, "currency": "EUR"});
            assert_eq!(decide(&s, &args).0, DecisionKind::Allow, "{amount}");
        }
        for amount in [json!(400), json!(5000), json!(250.01)] {
            let args = json!({"order_id": "O-1", "amount": amount, "currency": "EUR"});
            let (kind, reason, quorum) = decide(&s, &args);
            assert_eq!(kind, DecisionKind::RequireApproval, "{amount}");
            assert_eq!(quorum, Some(2));
            assert_eq!(
                reason.as_deref(),
                Some("Refund amount above delegated limit.")
            );
        }
        for amount in [json!(14000), json!("14000")] {
            let args = json!({"order_id": "O-1", "amount": amount, "currency": "EUR"});
            let (kind, reason, _) = decide(&s, &args);
            assert_eq!(kind, DecisionKind::Deny);
            assert_eq!(
                reason.as_deref(),
                Some(
                    "Refund amount exceeds the absolute ceiling for agent-initiated refunds. \
                     (Cedar: absolute-ceiling)"
                )
            );
        }
    }

    #[test]
    fn missing_or_mistyped_facts_fail_closed_naming_the_fact() {
        let s = set(vec![cedar_def("refund-cedar", REFUND_CEDAR)]);
        let (kind, reason, _) = decide(&s, &json!({"order_id": "O-1", "currency": "EUR"}));
        assert_eq!(kind, DecisionKind::Deny);
        let reason = reason.unwrap_or_default();
        assert!(
            reason.contains("fail closed") && reason.contains("`args.amount`"),
            "{reason}"
        );
        let (kind, reason, _) = decide(
            &s,
            &json!({"order_id": "O-1", "amount": "a lot", "currency": "EUR"}),
        );
        assert_eq!(kind, DecisionKind::Deny);
        assert!(
            reason
                .unwrap_or_default()
                .contains("`args.amount` must be a decimal")
        );
        let (kind, reason, _) = decide(
            &s,
            &json!({"order_id": "O-1", "amount": true, "currency": "EUR"}),
        );
        assert_eq!(kind, DecisionKind::Deny);
        assert!(reason.unwrap_or_default().contains("args.amount"));
    }

    #[test]
    fn decimals_outside_cedars_range_fail_closed_naming_the_fact() {
        let s = set(vec![cedar_def("refund-cedar", REFUND_CEDAR)]);
        // Cedar's decimal is a signed 64-bit count of ten-thousandths: ±922337203685477.5807.
        for amount in [
            json!("922337203685477.5808"),
            json!("-922337203685477.5809"),
            json!(1.0e15),
            json!("100000000000000000000"),
        ] {
            let (kind, reason, _) = decide(
                &s,
                &json!({"order_id": "O-1", "amount": amount, "currency": "EUR"}),
            );
            assert_eq!(kind, DecisionKind::Deny, "{amount}");
            let reason = reason.unwrap_or_default();
            assert!(
                reason.contains("fail closed")
                    && reason.contains("`args.amount` must be a decimal"),
                "{amount}: {reason}"
            );
        }
        // The ends of the range are decimals: the absolute ceiling denies them, the lowest
        // is a (negative) refund within the delegated limit.
        let (kind, reason, _) = decide(
            &s,
            &json!({"order_id": "O-1", "amount": "922337203685477.5807", "currency": "EUR"}),
        );
        assert_eq!(kind, DecisionKind::Deny);
        assert!(reason.unwrap_or_default().contains("absolute-ceiling"));
        let (kind, _, _) = decide(
            &s,
            &json!({"order_id": "O-1", "amount": "-922337203685477.5808", "currency": "EUR"}),
        );
        assert_eq!(kind, DecisionKind::Allow);
    }

    #[test]
    fn built_requests_conform_to_the_schema() {
        // Every type an argument can have, required and optional, read by the policies.
        let schema = json!({
            "type": "object",
            "required": ["s", "n", "i", "b", "tags"],
            "properties": {
                "s": {"type": "string"}, "n": {"type": "number"}, "i": {"type": "integer"},
                "b": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
                "opt": {"type": "string"}, "ignored": {"type": "object"},
            },
        });
        let text = r#"
@id("all") permit (principal, action, resource)
when { context.args.s == "x" && context.args.n.greaterThan(decimal("1.5"))
       && context.args.i > 2 && context.args.b && context.args.tags.contains("t")
       && context.tool.name == "probe" && context.agent.name == "a" };

@id("opt") @reason("opt") forbid (principal, action, resource)
when { context.args has opt && context.args.opt == "no" };

@id("claims") forbid (principal, action, resource)
when { context has principal && context.principal.roles.contains("banned")
       && principal.hasTag("n") && principal.getTag("n") == "7"
       && context.session.hasTag("flag") && context.session.getTag("flag") == "true" };
"#;
        let def = PolicyDef {
            name: "probe".into(),
            namespace: "ns".into(),
            version: "1.0.0".into(),
            scope: "tool:probe.tool".into(),
            cedar: Some(text.into()),
            cedar_tools: BTreeMap::from([("probe.tool".to_owned(), schema)]),
            ..PolicyDef::default()
        };
        let s = set(vec![def]);
        let tool = ToolCtx {
            name: "probe",
            ..ToolCtx::new("probe.tool")
        };
        let agent = AgentCtx {
            namespace: "n",
            name: "a",
            version: "1",
        };
        let full = json!({"s": "x", "n": 2.25, "i": "3", "b": true, "tags": ["t", "u"],
                          "opt": "yes", "ignored": {"a": 1}});
        let minimal = json!({"s": "x", "n": "1.6", "i": 3, "b": true, "tags": ["t"]});
        let opt_no = json!({"s": "x", "n": 2, "i": 3, "b": true, "tags": ["t"], "opt": "no"});
        let claims = json!({"sub": "u", "roles": ["banned"], "role": "x", "n": 7,
                            "nested": {"a": 1}});
        let meta = json!({"flag": true, "list": [1]});
        let before = CONFORMED.with(std::cell::Cell::get);
        let mut evaluated = 0;
        let mut decide = |args: &Value, claims: Option<&Value>, meta: Option<&Value>, at| {
            let mut req = Request::new(tool, args).with_agent(agent);
            if let Some(c) = claims {
                req = req.with_principal(c);
            }
            if let Some(m) = meta {
                req = req.with_session(SessionCtx {
                    id: "s-1",
                    metadata: Some(m),
                });
            }
            if let Some(at) = at {
                req = req.at(at);
            }
            evaluated += 1;
            s.evaluate(&req).kind()
        };
        assert_eq!(decide(&full, None, None, Some(1)), DecisionKind::Allow);
        assert_eq!(decide(&minimal, None, None, None), DecisionKind::Allow);
        assert_eq!(decide(&opt_no, None, None, Some(1)), DecisionKind::Deny);
        assert_eq!(
            decide(&full, Some(&claims), Some(&meta), Some(1)),
            DecisionKind::Deny
        );
        assert_eq!(
            decide(&full, Some(&claims), Some(&json!({})), Some(1)),
            DecisionKind::Allow
        );
        assert_eq!(
            decide(&minimal, Some(&json!({})), Some(&meta), Some(1)),
            DecisionKind::Allow
        );
        // Every one of them was built without Cedar's schema check and passed it.
        assert_eq!(CONFORMED.with(std::cell::Cell::get) - before, evaluated);
    }

    #[test]
    fn no_permit_denies_and_a_tool_outside_the_compiled_scope_fails_closed() {
        let text = r#"@id("only-small") permit (principal, action, resource)
            when { context.args.amount.lessThan(decimal("10.0")) };"#;
        let s = set(vec![cedar_def("small", text)]);
        let (kind, reason, _) = decide(
            &s,
            &json!({"order_id": "O", "amount": 50, "currency": "EUR"}),
        );
        assert_eq!(kind, DecisionKind::Deny);
        assert!(reason.unwrap_or_default().contains("default deny"));
        // Agent-wide but compiled for one tool only: another tool is denied.
        let mut def = cedar_def("wide", text);
        def.scope = String::new();
        let s = set(vec![def]);
        let args = json!({});
        let d = s.evaluate(&Request::new(ToolCtx::new("orders.lookup"), &args).at(1));
        assert_eq!(d.kind(), DecisionKind::Deny);
        assert!(d.reason().unwrap_or_default().contains("not in the scope"));
    }

    #[test]
    fn deny_wins_over_approval_over_allow_across_cedar_and_condition_policies() {
        let yaml_deny = PolicyDef {
            name: "eur-only".into(),
            scope: format!("tool:{REFUND}"),
            action: "deny".into(),
            reason: Some("EUR only".into()),
            conditions: Some(json!({"field": "currency", "op": "neq", "value": "EUR"})),
            ..PolicyDef::default()
        };
        let yaml_approval = PolicyDef {
            name: "two-eyes".into(),
            scope: format!("tool:{REFUND}"),
            action: "require_approval".into(),
            approvals_required: Some(3),
            conditions: Some(json!({"field": "amount", "op": "gt", "value": 50})),
            ..PolicyDef::default()
        };
        let s = set(vec![
            cedar_def("refund-cedar", REFUND_CEDAR),
            yaml_deny,
            yaml_approval,
        ]);
        // Cedar escalates, YAML denies: deny.
        let (kind, reason, _) = decide(
            &s,
            &json!({"order_id": "O", "amount": 400, "currency": "USD"}),
        );
        assert_eq!(
            (kind, reason.as_deref()),
            (DecisionKind::Deny, Some("EUR only"))
        );
        // Cedar permits, YAML asks 3: approval with the stricter quorum.
        let (kind, _, quorum) = decide(
            &s,
            &json!({"order_id": "O", "amount": 100, "currency": "EUR"}),
        );
        assert_eq!((kind, quorum), (DecisionKind::RequireApproval, Some(3)));
        // Both ask: the stricter quorum wins.
        let (_, _, quorum) = decide(
            &s,
            &json!({"order_id": "O", "amount": 400, "currency": "EUR"}),
        );
        assert_eq!(quorum, Some(3));
        // Cedar forbids, YAML asks: deny.
        let (kind, _, _) = decide(
            &s,
            &json!({"order_id": "O", "amount": 9000, "currency": "EUR"}),
        );
        assert_eq!(kind, DecisionKind::Deny);
    }

    #[test]
    fn a_shadow_cedar_document_reports_and_never_decides() {
        let mut def = cedar_def("refund-cedar", REFUND_CEDAR);
        def.mode = "shadow".into();
        let s = set(vec![def]);
        let args = json!({"order_id": "O", "amount": 14000, "currency": "EUR"});
        let req = Request::new(ToolCtx::new(REFUND), &args).at(1);
        let enforced = s.evaluate(&req);
        assert_eq!(enforced.kind(), DecisionKind::Allow);
        let outcome = s
            .shadow(&req, enforced.kind())
            .expect("the shadow policy would deny");
        assert_eq!(outcome.shadow.kind(), DecisionKind::Deny);
        assert_eq!(outcome.policy.name(), "refund-cedar");
    }

    #[test]
    fn principal_roles_claims_metadata_agent_and_time_reach_cedar() {
        let text = r#"
@id("staff") permit (principal, action, resource)
when { context has principal && context.principal.roles.contains("support") };

@id("web-needs-eu") forbid (principal, action, resource)
when { context.session.hasTag("channel") && context.session.getTag("channel") == "web"
       && !(principal.hasTag("region") && principal.getTag("region") == "eu") };

@id("night") @reason("No refunds at night.") forbid (principal, action, resource)
unless { context has time && context.time >= 1000 };

@id("other-agent") forbid (principal, action, resource)
when { context.agent.name != "refund-agent" || context.tool.ref != "payments.issue-refund" };

@id("bob") forbid (principal == Principal::"bob", action, resource);
"#;
        let s = set(vec![cedar_def("ctx", text)]);
        let args = json!({"order_id": "O", "amount": 1, "currency": "EUR"});
        let agent = AgentCtx {
            namespace: "support",
            name: "refund-agent",
            version: "1.0.0",
        };
        let decide = |claims: Option<&Value>, meta: &Value, now: i64| {
            let mut req = Request::new(ToolCtx::new(REFUND), &args)
                .with_agent(agent)
                .with_session(SessionCtx {
                    id: "s-1",
                    metadata: Some(meta),
                })
                .at(now);
            if let Some(c) = claims {
                req = req.with_principal(c);
            }
            let d = s.evaluate(&req);
            (d.kind(), d.reason().map(str::to_owned))
        };
        let support = json!({"sub": "alice", "roles": ["support"], "region": "us"});
        let web = json!({"channel": "web"});
        assert_eq!(
            decide(Some(&support), &json!({}), 5000).0,
            DecisionKind::Allow
        );
        assert_eq!(decide(None, &json!({}), 5000).0, DecisionKind::Deny);
        let single = json!({"sub": "alice", "role": "support"});
        assert_eq!(
            decide(Some(&single), &json!({}), 5000).0,
            DecisionKind::Allow
        );
        let (kind, reason) = decide(Some(&support), &web, 5000);
        assert_eq!(kind, DecisionKind::Deny);
        assert!(reason.unwrap_or_default().contains("web-needs-eu"));
        let eu = json!({"sub": "alice", "roles": ["support"], "region": "eu"});
        assert_eq!(decide(Some(&eu), &web, 5000).0, DecisionKind::Allow);
        let (_, reason) = decide(Some(&support), &json!({}), 10);
        assert_eq!(
            reason.as_deref(),
            Some("No refunds at night. (Cedar: night)")
        );
        // `time` is optional (the runtime always sets it): strict validation makes a policy
        // test `context has time` first, and this one fails closed without it.
        let no_time = Request::new(ToolCtx::new(REFUND), &args)
            .with_agent(agent)
            .with_principal(&support);
        assert_eq!(s.evaluate(&no_time).kind(), DecisionKind::Deny);
        let unguarded =
            "@id(\"t\") forbid (principal, action, resource) when { context.time < 1 };";
        assert!(PolicySet::compile([cedar_def("t", unguarded)]).is_err());
        let bob = json!({"sub": "bob", "roles": ["support"]});
        assert_eq!(decide(Some(&bob), &json!({}), 5000).0, DecisionKind::Deny);
        let bad = json!({"sub": "alice", "roles": "support"});
        let (kind, reason) = decide(Some(&bad), &json!({}), 5000);
        assert_eq!(kind, DecisionKind::Deny);
        assert!(reason.unwrap_or_default().contains("principal.roles"));
    }

    fn cedar_errors(def: PolicyDef) -> Vec<(String, CompileErrorKind)> {
        PolicySet::compile([def])
            .expect_err("must not compile")
            .into_iter()
            .map(|e| (e.path, e.kind))
            .collect()
    }

    #[test]
    fn compile_errors_name_the_problem_with_offsets() {
        let text =
            "@id(\"p\") permit (principal, action, resource)\nwhen { context.args.amout == 1 };";
        let errors = cedar_errors(cedar_def("typo", text));
        let [(path, CompileErrorKind::Cedar { message, offset })] = errors.as_slice() else {
            panic!("{errors:?}")
        };
        assert_eq!(path, "cedar");
        assert!(
            message.contains("policy `p`") && message.contains("amout"),
            "{message}"
        );
        let at = offset.expect("validation errors have a position");
        assert!(
            text[at..].starts_with("context.args.amout") || text[at..].contains("amout"),
            "{}",
            &text[at..]
        );

        // Two parse errors, both reported, each with its offset.
        let text = "permit (principal, action, resource) when { ( };\nforbid (principal, action resource);";
        let errors = cedar_errors(cedar_def("broken", text));
        assert!(errors.len() >= 2, "{errors:?}");
        assert!(errors.iter().all(|(p, k)| p == "cedar"
            && matches!(
                k,
                CompileErrorKind::Cedar {
                    offset: Some(_),
                    ..
                }
            )));

        // Fields a Cedar policy must not have.
        let mut def = cedar_def("mixed", REFUND_CEDAR);
        def.conditions = Some(json!({"field": "amount", "op": "gt", "value": 1}));
        def.action = "deny".into();
        let paths: Vec<String> = cedar_errors(def).into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, ["conditions", "action"]);

        // Bounded size.
        let big = format!(
            "permit (principal, action, resource);{}",
            " ".repeat(MAX_CEDAR_BYTES)
        );
        let errors = cedar_errors(cedar_def("big", &big));
        assert!(
            matches!(&errors[0].1, CompileErrorKind::Cedar { message, .. } if message.contains("at most"))
        );

        // Escalate on a permit.
        let errors = cedar_errors(cedar_def(
            "esc",
            "@id(\"p\") @escalate(\"x\") permit (principal, action, resource);",
        ));
        assert!(
            matches!(&errors[0].1, CompileErrorKind::Cedar { message, .. } if message.contains("@escalate"))
        );
    }

    #[test]
    fn explanations_name_the_deciding_cedar_policies() {
        let s = set(vec![cedar_def("refund-cedar", REFUND_CEDAR)]);
        let args = json!({"order_id": "O", "amount": 400, "currency": "EUR"});
        let req = Request::new(ToolCtx::new(REFUND), &args).at(1);
        let explanation = s.explain(&req);
        assert_eq!(
            explanation.policies[0].cedar.as_deref(),
            Some("escalate (above-delegated-limit) to finance")
        );
        let text = explanation.to_string();
        assert!(text.contains("payments/refund-cedar@1.0.0 (cedar): matched -> require_approval [cedar: escalate (above-delegated-limit) to finance] [deciding]"), "{text}");
        let json = serde_json::to_value(&explanation).unwrap_or_default();
        assert_eq!(
            json["policies"][0]["cedar"],
            "escalate (above-delegated-limit) to finance"
        );
    }

    #[test]
    fn tools_without_a_permit_are_found() {
        // Agent-wide, a forbid reading `amount` must say which tool it is about: strict
        // validation refuses it for a tool without that argument.
        let mut def = cedar_def("refund-cedar", REFUND_CEDAR);
        def.scope = String::new();
        def.cedar_tools
            .insert("orders.lookup".into(), json!({"type": "object"}));
        let errors = cedar_errors(def.clone());
        assert!(
            matches!(&errors[0].1, CompileErrorKind::Cedar { message, .. }
                if message.contains("`args.amount`") && message.contains("orders.lookup")),
            "{errors:?}"
        );
        let scoped = REFUND_CEDAR.replace(
            "forbid (principal, action, resource)",
            "forbid (principal, action == Action::\"payments.issue-refund\", resource)",
        );
        def.cedar = Some(scoped);
        let s = set(vec![def]);
        assert_eq!(
            s.policies()[0].cedar_tools_without_permit(),
            ["orders.lookup"]
        );
        assert_eq!(
            s.policies()[0].cedar_ids(),
            [
                "above-delegated-limit",
                "absolute-ceiling",
                "delegated-refunds"
            ]
        );
        // The resource scope counts too: a permit on any action but one tool resource.
        let by_resource = r#"
@id("refunds-only")
permit (principal, action, resource == Tool::"payments.issue-refund");
"#;
        let mut def = cedar_def("refund-cedar", by_resource);
        def.scope = String::new();
        def.cedar_tools
            .insert("orders.lookup".into(), json!({"type": "object"}));
        let s = set(vec![def.clone()]);
        assert_eq!(
            s.policies()[0].cedar_tools_without_permit(),
            ["orders.lookup"]
        );
        // The principal scope counts too: the principal is a `Principal` in no other entity.
        def.cedar =
            Some(r#"@id("vip") permit (principal in Session::"vip", action, resource);"#.into());
        assert_eq!(
            set(vec![def.clone()]).policies()[0]
                .cedar_tools_without_permit()
                .len(),
            2
        );
        def.cedar = Some(
            r#"@id("alice") permit (principal == Principal::"alice", action, resource);"#.into(),
        );
        assert!(
            set(vec![def.clone()]).policies()[0]
                .cedar_tools_without_permit()
                .is_empty()
        );
        def.cedar = Some(r#"@id("tools") permit (principal, action, resource is Tool);"#.into());
        assert!(
            set(vec![def]).policies()[0]
                .cedar_tools_without_permit()
                .is_empty()
        );
    }
}
