//! Compile errors: every problem of every policy, each with the policy and a path inside it.

use std::fmt;

/// Every problem found while compiling a policy set. Never empty.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct CompileErrors {
    errors: Vec<CompileError>,
}

impl CompileErrors {
    pub(crate) fn new(errors: Vec<CompileError>) -> Self {
        Self { errors }
    }

    /// The problems, in policy order and, within a policy, in field order.
    pub fn errors(&self) -> &[CompileError] {
        &self.errors
    }
}

impl IntoIterator for CompileErrors {
    type Item = CompileError;
    type IntoIter = std::vec::IntoIter<CompileError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}

impl fmt::Display for CompileErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(
            f,
            "{n} invalid polic{}",
            if n == 1 { "y field" } else { "y fields" }
        )?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

/// One problem in one policy.
///
/// `path` is a path inside the policy in compiled `PolicySpec` names, e.g. `conditions.all[1].op`,
/// `action`, `on_reject`, `timeout.default`, `allow[2]`, `allow_field`, `runtime.approver_role`.
/// A manifest front end maps it to its own layout (`action` is `spec.decision.type`, `conditions`
/// is `spec.conditions`, `on_reject` is `spec.decision.on_reject`, and so on).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("policy `{policy}`: {path}: {kind}")]
#[non_exhaustive]
pub struct CompileError {
    /// Name of the policy (possibly empty when the name itself is the problem).
    pub policy: String,
    /// Position of the policy in the input.
    pub index: usize,
    /// Path inside the policy.
    pub path: String,
    /// What is wrong.
    pub kind: CompileErrorKind,
}

/// What is wrong with a policy field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileErrorKind {
    /// The policy has no name.
    #[error("a policy needs a name")]
    MissingName,
    /// Another policy has the same name.
    #[error("duplicate policy name; the policy at index {first_index} has the same name")]
    DuplicateName {
        /// Index of the first policy with this name.
        first_index: usize,
    },
    /// No decision type.
    #[error("a decision type is required: allow, deny, block, require_approval or escalate")]
    MissingAction,
    /// Unknown decision type.
    #[error(
        "unknown decision type `{action}`; expected allow, deny, block, require_approval or escalate"
    )]
    UnknownAction {
        /// The value given.
        action: String,
    },
    /// A scope form other than empty, `agent` or `tool:<ref>`.
    #[error("unknown scope `{scope}`; expected `agent`, `tool:<namespace.name>` or no scope")]
    UnknownScope {
        /// The value given.
        scope: String,
    },
    /// The policy has a decision but nothing that says when it applies.
    #[error(
        "the policy has a decision but no scope, conditions or allow list; the reference runtime \
         silently drops such a policy, so say what it governs: `scope: agent` for every tool call, \
         `scope: tool:<namespace.name>` for one tool, or conditions"
    )]
    NoTarget,
    /// A problem of a policy's Cedar text (`cedar`), or a field a Cedar policy must not have.
    #[error("{message}")]
    Cedar {
        /// What is wrong, naming the Cedar policy (`@id`) where it is known.
        message: String,
        /// Byte offset into the Cedar text, when Cedar reports one.
        offset: Option<usize>,
    },
    /// Unknown `mode`.
    #[error("unknown mode `{value}`; expected enforce or shadow")]
    UnknownMode {
        /// The value given.
        value: String,
    },
    /// Unknown `on_reject`.
    #[error("unknown on_reject `{value}`; expected return_to_agent or fail")]
    UnknownOnReject {
        /// The value given.
        value: String,
    },
    /// Unknown `on_modify`.
    #[error(
        "unknown on_modify `{value}`; expected revalidate (or leave it out to dispatch \
         approver-edited arguments unchecked)"
    )]
    UnknownOnModify {
        /// The value given.
        value: String,
    },
    /// Unknown `timeout.default`.
    #[error("unknown timeout default `{value}`; expected deny, allow or escalate")]
    UnknownTimeoutDefault {
        /// The value given.
        value: String,
    },
    /// `timeout.after_minutes` below 1.
    #[error("timeout after_minutes must be at least 1, got {value}")]
    InvalidTimeoutMinutes {
        /// The value given.
        value: i64,
    },
    /// `approvals_required` out of range.
    #[error(
        "approvals_required must be between 1 and {max}, got {value} (leave it out for the \
         default of 1)",
        max = u32::MAX
    )]
    InvalidApprovals {
        /// The value given.
        value: i64,
    },
    /// An approval route that is not a string.
    #[error("the approver role must be a string")]
    RouteNotString,
    /// `allow_self_approval` on a policy whose decision asks no approval.
    #[error(
        "allow_self_approval only applies to decision types require_approval and escalate, \
         not `{action}`"
    )]
    SelfApprovalOnOtherAction {
        /// The decision type given.
        action: String,
    },
    /// An allow list on a policy whose decision is not `allow`.
    #[error("an allow list only applies to decision type allow, not `{action}`")]
    AllowOnOtherAction {
        /// The decision type given.
        action: String,
    },
    /// `allow_field` without an allow list.
    #[error("allow_field needs a non-empty allow list")]
    AllowFieldWithoutAllow,
    /// `allow_field` with an `[any]` step.
    #[error("allow_field cannot use `[any]`: every value must be listed; use `[all]`")]
    AllowFieldAny,
    /// An empty allow-list entry.
    #[error("allow list entries must not be empty")]
    EmptyAllowEntry,
    /// A condition node that is not a map.
    #[error("a condition node must be a map with one of all, any, not or field, found {found}")]
    NodeNotMap {
        /// JSON type found.
        found: &'static str,
    },
    /// A condition node with none of all/any/not/field.
    #[error("a condition node needs one of all, any, not or field")]
    EmptyNode,
    /// A condition node with several of all/any/not/field.
    #[error("a condition node must have exactly one of all, any, not or field, found {}", keys.join(", "))]
    AmbiguousNode {
        /// The keys found.
        keys: Vec<String>,
    },
    /// A `history` leaf (or `value_from`) that is malformed: unknown aggregate, `of` missing for
    /// `sum`, `max` or `last`, an unparseable or too long `within`, an unknown scope…
    #[error("{reason}")]
    BadHistory {
        /// What is wrong, naming the key.
        reason: String,
    },
    /// An unknown key in a condition node.
    #[error("unknown key `{key}` in a condition node; expected {expected}")]
    UnknownKey {
        /// The key.
        key: String,
        /// What the node accepts.
        expected: &'static str,
    },
    /// A condition tree nested too deeply.
    #[error("condition nodes are nested more than {limit} levels deep")]
    TooDeep {
        /// The maximum depth.
        limit: usize,
    },
    /// `all`/`any` that is not a list.
    #[error("`{key}` must be a list of condition nodes")]
    NotAList {
        /// `all` or `any`.
        key: &'static str,
    },
    /// `any: []`.
    #[error("an empty `any` never matches and would silently disable the policy")]
    EmptyAny,
    /// `field` that is not a non-empty string.
    #[error("field must be a non-empty string path")]
    FieldNotString,
    /// A field path that does not parse.
    #[error("invalid field path `{field}`: {reason}")]
    BadPath {
        /// The path.
        field: String,
        /// Why.
        reason: String,
    },
    /// A `phrony.*` field the engine does not provide.
    #[error(
        "unknown context field `{field}`; known: phrony.tool.{{ref,version,side_effect_class,name}}, \
         phrony.agent.{{ref,namespace,name,version}}, phrony.session.id, \
         phrony.session.metadata.<key>, phrony.principal.<claim>, \
         phrony.time.{{unix,hour,weekday}}, phrony.dispatch.trigger"
    )]
    UnknownContextField {
        /// The field.
        field: String,
    },
    /// `op` that is not a string.
    #[error("op must be a string")]
    OpNotString,
    /// Unknown operator.
    #[error(
        "unknown operator `{op}`; expected eq (==), neq (!=), gt (>), gte (>=), lt (<), lte (<=), \
         in, not_in, matches, exists, contains, starts_with or ends_with"
    )]
    UnknownOp {
        /// The operator given.
        op: String,
    },
    /// An operator without a value.
    #[error("operator `{op}` needs a value")]
    MissingValue {
        /// The operator.
        op: String,
    },
    /// A list or map where a scalar is needed.
    #[error(
        "operator `{op}` compares against a string, number, boolean or null, not a list or map{hint}",
        hint = list_hint(.op)
    )]
    ValueNotScalar {
        /// The operator.
        op: String,
    },
    /// `in`/`not_in` without a list.
    #[error("operator `{op}` needs a list value")]
    ValueNotList {
        /// The operator.
        op: String,
    },
    /// `in: []` or `not_in: []`.
    #[error("operator `{op}` needs a non-empty list")]
    EmptyList {
        /// The operator.
        op: String,
    },
    /// A non-numeric value for a numeric comparison.
    #[error("operator `{op}` compares numbers, but the value {value} is not a number")]
    ValueNotNumeric {
        /// The operator.
        op: String,
        /// The value given, as JSON.
        value: String,
    },
    /// A non-string value where a string is needed.
    #[error("operator `{op}` needs a string value")]
    ValueNotString {
        /// The operator.
        op: String,
    },
    /// An empty needle for `contains`/`starts_with`/`ends_with`.
    #[error("operator `{op}` with an empty value matches every string")]
    EmptyNeedle {
        /// The operator.
        op: String,
    },
    /// `exists` with a non-boolean value.
    #[error("operator `exists` needs true or false")]
    ValueNotBool,
    /// An invalid regular expression.
    #[error("invalid regular expression `{pattern}`: {error}")]
    InvalidRegex {
        /// The pattern.
        pattern: String,
        /// The regex engine's message.
        error: String,
    },
    /// An operator other than eq/neq on a trigger field.
    #[error("`{field}` supports only eq and neq, not `{op}`")]
    TriggerOp {
        /// The field.
        field: String,
        /// The operator.
        op: String,
    },
    /// A trigger value that names no trigger.
    #[error(
        "unknown dispatch trigger `{value}`; expected dispatch:no_handler, \
         dispatch:capacity_exhausted, dispatch:lease_expired, dispatch:indeterminate or limit:escalate"
    )]
    UnknownTrigger {
        /// The value given.
        value: String,
    },
}

fn list_hint(op: &str) -> &'static str {
    if op == "eq" || op == "==" {
        " (use `in` for a list)"
    } else if op == "neq" || op == "!=" {
        " (use `not_in` for a list)"
    } else {
        ""
    }
}

/// Collects the errors of one policy.
pub(crate) struct Diags<'a> {
    policy: &'a str,
    index: usize,
    pub(crate) list: Vec<CompileError>,
}

impl<'a> Diags<'a> {
    pub(crate) fn new(policy: &'a str, index: usize) -> Self {
        Self {
            policy,
            index,
            list: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, path: impl Into<String>, kind: CompileErrorKind) {
        self.list.push(CompileError {
            policy: self.policy.to_owned(),
            index: self.index,
            path: path.into(),
            kind,
        });
    }
}

/// The JSON type name of a value, for messages.
pub(crate) fn type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a map",
    }
}
