//! The input model: policy definitions as the manifest compiler emits them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

/// One policy definition, in the shape of a compiled `PolicySpec` of the agent snapshot.
///
/// The serde names are those of the compiled snapshot (`name, scope, action, allow, conditions,
/// authority_ref, approvals_required, reason, on_reject, on_modify, comprehension_required, timeout,
/// runtime`) plus four additions of this project: `namespace` and `version` (the identity of the
/// Policy document the definition came from), `allow_field` (the argument an allow list checks)
/// and `mode` (`enforce` or `shadow`).
///
/// Unknown keys are rejected when deserializing: a typo must not silently disable a policy.
/// Nothing is validated here; [`PolicySet::compile`](crate::PolicySet::compile) does that and
/// reports every problem at once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDef {
    /// Policy name, unique within a set (`metadata.name` of the Policy document).
    #[serde(default)]
    pub name: String,
    /// `""` or `agent` (every tool), or `tool:<namespace.name>` (one tool, exact dispatch ref).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    /// Decision type: `allow`, `deny`, `block` (alias of deny), `require_approval` or `escalate`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub action: String,
    /// Allow list (only with action `allow`), compared case-insensitively.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Condition tree; absent, `null` or `{}` matches every call in scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Value>,
    /// Governance authority boundary, copied onto approvals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority_ref: Option<String>,
    /// Approval quorum; absent means 1, an explicit value must be at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals_required: Option<i64>,
    /// Deny message or approval reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `return_to_agent` (default) or `fail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_reject: Option<String>,
    /// `revalidate`, or absent (approver-edited arguments are dispatched unchecked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_modify: Option<String>,
    /// Approvers must acknowledge comprehension.
    #[serde(default, skip_serializing_if = "is_false")]
    pub comprehension_required: bool,
    /// The explicit separation-of-duties opt-out: the principal who started the session may
    /// vote on its approvals (only with an approval decision).
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_self_approval: bool,
    /// Approval timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<TimeoutDef>,
    /// Free-form map passed through to approvals (`phrony.com/approver_role` gives the route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Map<String, Value>>,
    /// Namespace of the Policy document (addition; part of [`PolicyId`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Version of the Policy document (addition; part of [`PolicyId`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Field path the allow list checks (addition). Without it the reference heuristic picks one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_field: Option<String>,
    /// `enforce` (also when empty, the default) or `shadow` (addition): a shadow policy is
    /// evaluated and reported by [`PolicySet::shadow`](crate::PolicySet::shadow) but never
    /// decides a call. Serialized only when set, so definitions without it keep their bytes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// Cedar policies (addition): when set, the policy's effect on a call is computed by Cedar
    /// (see the crate README, "Cedar policies"); `conditions`, `allow` and `allow_field` must
    /// then be absent, and `action` is the approval kind used when Cedar escalates. Needs the
    /// `cedar` feature. Serialized only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cedar: Option<String>,
    /// The tools a Cedar policy may be asked about (addition): dispatch ref → the tool's input
    /// schema (JSON Schema), which types `context.args`. A runtime fills it from the agent's
    /// bindings in the policy's scope; empty, the Cedar text is only parsed and a call is
    /// denied (fail closed). Serialized only when non-empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cedar_tools: BTreeMap<String, Value>,
    /// The history facts a Cedar policy reads (addition): name → a history query (the map a
    /// condition's `history` leaf takes: `calls`, `in`, `same`, `within`, `aggregate`, `of`,
    /// `include_current`), given to Cedar as `context.history.<name>`: a `Long` for `count`, a
    /// `Bool` for `exists`, a `decimal` for `sum`, `max` and `last`. A fact that cannot be
    /// answered denies the call (fail closed). Only with `cedar`. Serialized only when
    /// non-empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cedar_history: BTreeMap<String, Value>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Approval timeout of a policy (`decision.timeout`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutDef {
    /// Minutes after which the approval times out; at least 1.
    #[serde(default)]
    pub after_minutes: i64,
    /// `deny` (also when empty), `allow` or `escalate`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub default: String,
}

impl PolicyDef {
    /// The identity of this definition.
    pub fn id(&self) -> PolicyId {
        PolicyId {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            version: self.version.clone(),
        }
    }
}

/// Identity of a policy: the Policy document's `namespace/name@version`.
///
/// Displays (and serializes) as `namespace/name@version`, e.g.
/// `payments/refund-approval-boundary@1.0.0`; parts that are unknown are left out, so a policy
/// known only by name displays as just its name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId {
    /// Namespace of the Policy document (may be empty).
    pub namespace: String,
    /// Policy name.
    pub name: String,
    /// Version of the Policy document (may be empty).
    pub version: String,
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_ref(f, &self.namespace, &self.name, &self.version)
    }
}

impl Serialize for PolicyId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Writes `namespace/name@version`, leaving out empty parts (shared by policy and agent refs).
pub(crate) fn write_ref(
    out: &mut impl fmt::Write,
    namespace: &str,
    name: &str,
    version: &str,
) -> fmt::Result {
    if !namespace.is_empty() {
        out.write_str(namespace)?;
        out.write_char('/')?;
    }
    out.write_str(name)?;
    if !version.is_empty() {
        out.write_char('@')?;
        out.write_str(version)?;
    }
    Ok(())
}
