//! One compiled policy: validated fields, prepared conditions and allow list, and its verdict on
//! a call.

use std::borrow::Cow;
use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::condition::{self, Compiled, Cond, Ctx};
use crate::def::{PolicyDef, PolicyId};
use crate::error::{CompileErrorKind, Diags};
use crate::path::{Field, Source};
use crate::request::Request;
use crate::slots::PathTable;
use crate::value::{Actual, Scalar};

/// A decision type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `allow`: checks the allow list, if any; otherwise no effect.
    Allow,
    /// `deny` or `block`.
    Deny,
    /// `require_approval`.
    RequireApproval,
    /// `escalate` (decided like `require_approval`).
    Escalate,
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "allow" => Action::Allow,
            "deny" | "block" => Action::Deny,
            "require_approval" => Action::RequireApproval,
            "escalate" => Action::Escalate,
            _ => return None,
        })
    }

    /// The canonical name (`block` reads as `deny`).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::RequireApproval => "require_approval",
            Action::Escalate => "escalate",
        }
    }

    /// `require_approval` or `escalate`.
    pub fn is_approval(self) -> bool {
        matches!(self, Action::RequireApproval | Action::Escalate)
    }
}

/// Whether a policy decides calls or is only evaluated and reported (`mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// The policy decides calls (`enforce`, also when `mode` is absent).
    #[default]
    Enforce,
    /// The policy never decides a call; what it would have changed is reported by
    /// [`PolicySet::shadow`](crate::PolicySet::shadow) (`shadow`).
    Shadow,
}

impl Mode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }

    /// Reads a `mode` value: empty or `enforce`, or `shadow`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "enforce" => Some(Mode::Enforce),
            "shadow" => Some(Mode::Shadow),
            _ => None,
        }
    }
}

/// What happens when an approver rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnReject {
    /// The model receives a tool error and the turn continues (`return_to_agent`, the default).
    #[default]
    ReturnToAgent,
    /// The session fails (`fail`).
    Fail,
}

impl OnReject {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnReject::ReturnToAgent => "return_to_agent",
            OnReject::Fail => "fail",
        }
    }
}

/// What happens when an approver edits the arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnModify {
    /// The edited arguments are dispatched without a policy check (no `on_modify`, the
    /// reference's default).
    #[default]
    Unchecked,
    /// The edited arguments are evaluated again (`revalidate`).
    Revalidate,
}

/// What an approval decides when its timeout fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TimeoutDefault {
    /// Deny (also when `default` is empty).
    #[default]
    Deny,
    /// Cast an approve vote.
    Allow,
    /// Open a new approval one level up.
    Escalate,
}

impl TimeoutDefault {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeoutDefault::Deny => "deny",
            TimeoutDefault::Allow => "allow",
            TimeoutDefault::Escalate => "escalate",
        }
    }
}

/// A validated approval timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timeout {
    /// Minutes until the timeout fires (at least 1).
    pub after_minutes: u32,
    /// What the timeout decides.
    pub default: TimeoutDefault,
}

macro_rules! serialize_as_str {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
serialize_as_str!(Action, Mode, OnReject, TimeoutDefault);

impl Serialize for Timeout {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("after_minutes", &self.after_minutes)?;
        map.serialize_entry("default", &self.default)?;
        map.end()
    }
}

#[derive(Debug, Clone)]
enum Scope {
    Agent,
    Tool(String),
}

#[derive(Debug, Clone)]
struct AllowList {
    values: Vec<Scalar>,
    /// `allow_field` as written, and where it reads.
    field: Option<(String, Source)>,
}

/// A compiled policy. Built by [`PolicySet::compile`](crate::PolicySet::compile).
#[derive(Debug, Clone)]
pub struct Policy {
    id: PolicyId,
    mode: Mode,
    scope_text: String,
    scope: Scope,
    action: Action,
    conditions: Option<Cond>,
    allow: Option<AllowList>,
    reason: Option<String>,
    deny_message: String,
    approvals_required: u32,
    on_reject: OnReject,
    on_modify: OnModify,
    comprehension_required: bool,
    allow_self_approval: bool,
    timeout: Option<Timeout>,
    authority_ref: Option<String>,
    route: Option<String>,
    runtime: Option<Map<String, Value>>,
    /// The compiled Cedar text of a Cedar policy (`cedar`).
    cedar: CedarSlot,
    /// The named history facts of a Cedar policy (`cedar_history`), in name order.
    cedar_history: Vec<(String, crate::history::Side)>,
}

#[cfg(feature = "cedar")]
type CedarSlot = Option<std::sync::Arc<crate::cedar_doc::CedarDoc>>;
/// Without the `cedar` feature a policy never has Cedar text (compiling one is an error).
#[cfg(not(feature = "cedar"))]
type CedarSlot = Option<std::convert::Infallible>;

/// `cedar`: the compiled Cedar text, or `None` (problems go to `diags`).
#[cfg(feature = "cedar")]
fn compile_cedar(
    def: &PolicyDef,
    history: &[(String, crate::history::Side)],
    diags: &mut Diags<'_>,
) -> CedarSlot {
    let text = def.cedar.as_ref()?;
    let facts: Vec<(&str, crate::Aggregate)> = history
        .iter()
        .map(|(name, side)| (name.as_str(), side.aggregate()))
        .collect();
    match crate::cedar_doc::CedarDoc::compile(text, &def.cedar_tools, &facts) {
        Ok(doc) => Some(std::sync::Arc::new(doc)),
        Err(issues) => {
            for issue in issues {
                diags.push(
                    "cedar",
                    CompileErrorKind::Cedar {
                        message: issue.message,
                        offset: issue.offset,
                    },
                );
            }
            None
        }
    }
}

#[cfg(not(feature = "cedar"))]
fn compile_cedar(
    def: &PolicyDef,
    _history: &[(String, crate::history::Side)],
    diags: &mut Diags<'_>,
) -> CedarSlot {
    if def.cedar.is_some() {
        diags.push(
            "cedar",
            CompileErrorKind::Cedar {
                message: "Cedar policies need phrony-policy's `cedar` feature".to_owned(),
                offset: None,
            },
        );
    }
    None
}

/// The fields a Cedar policy must not have, and its decision type: only an approval kind (what
/// Cedar's escalate convention asks for), `require_approval` when absent.
fn check_cedar_fields(def: &PolicyDef, diags: &mut Diags<'_>) {
    if def.cedar.is_none() {
        if !def.cedar_history.is_empty() {
            diags.push(
                "cedar_history",
                CompileErrorKind::Cedar {
                    message: "named history facts are read by Cedar text (`cedar`); a policy \
                              with conditions writes `history` leaves in them"
                        .to_owned(),
                    offset: None,
                },
            );
        }
        return;
    }
    let mut no = |path: &str, message: &str| {
        diags.push(
            path.to_owned(),
            CompileErrorKind::Cedar {
                message: message.to_owned(),
                offset: None,
            },
        );
    };
    if def.conditions.is_some() {
        no(
            "conditions",
            "a Cedar policy has no conditions: write them in the Cedar text (cedar and \
             conditions are mutually exclusive)",
        );
    }
    if !def.allow.is_empty() {
        no(
            "allow",
            "a Cedar policy has no allow list: write a permit in the Cedar text",
        );
    }
    if def.allow_field.is_some() {
        no("allow_field", "a Cedar policy has no allow list");
    }
    if !matches!(def.action.as_str(), "" | "require_approval" | "escalate") {
        no(
            "action",
            "a Cedar policy's effect is computed by Cedar; the decision type may only be \
             require_approval or escalate (the approval asked for when Cedar escalates)",
        );
    }
}

/// What one policy says about one call.
#[derive(Debug, Clone)]
pub(crate) enum Verdict<'s> {
    /// Out of scope.
    NotApplicable,
    /// In scope, conditions false.
    NoMatch,
    /// Matched; no objection (an allow policy whose allow list, if any, passed).
    Allow,
    /// Matched; deny with this message (a deny policy, or an allow-list violation).
    Deny(Cow<'s, str>),
    /// Matched; approval required.
    Approval,
}

const HEURISTIC_KEYS: [&str; 6] = ["queue", "target", "value", "name", "id", "currency"];
const NO_VALUE: &str = "tool arguments do not include a value to check against the allow list";

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.trim().is_empty())
}

/// `scope`: `agent` (or empty) or `tool:<ref>`.
fn compile_scope(def: &PolicyDef, diags: &mut Diags<'_>) -> Option<Scope> {
    match def.scope.as_str() {
        "" | "agent" => Some(Scope::Agent),
        s => match s.strip_prefix("tool:") {
            Some(r) if !r.is_empty() && !r.chars().any(char::is_whitespace) => {
                Some(Scope::Tool(r.to_owned()))
            }
            _ => {
                diags.push(
                    "scope",
                    CompileErrorKind::UnknownScope {
                        scope: s.to_owned(),
                    },
                );
                None
            }
        },
    }
}

/// `action`: required, one of the known actions.
fn compile_action(def: &PolicyDef, diags: &mut Diags<'_>) -> Option<Action> {
    if def.action.is_empty() {
        diags.push("action", CompileErrorKind::MissingAction);
        None
    } else {
        let a = Action::parse(&def.action);
        if a.is_none() {
            diags.push(
                "action",
                CompileErrorKind::UnknownAction {
                    action: def.action.clone(),
                },
            );
        }
        a
    }
}

/// `mode`: `enforce` (the default) or `shadow`.
fn compile_mode(def: &PolicyDef, diags: &mut Diags<'_>) -> Mode {
    Mode::parse(&def.mode).unwrap_or_else(|| {
        diags.push(
            "mode",
            CompileErrorKind::UnknownMode {
                value: def.mode.clone(),
            },
        );
        Mode::Enforce
    })
}

/// `on_reject`: `return_to_agent` (the default) or `fail`.
fn compile_on_reject(def: &PolicyDef, diags: &mut Diags<'_>) -> OnReject {
    match def.on_reject.as_deref().unwrap_or("") {
        "" | "return_to_agent" => OnReject::ReturnToAgent,
        "fail" => OnReject::Fail,
        other => {
            diags.push(
                "on_reject",
                CompileErrorKind::UnknownOnReject {
                    value: other.to_owned(),
                },
            );
            OnReject::ReturnToAgent
        }
    }
}

/// `on_modify`: unchecked (the default) or `revalidate`.
fn compile_on_modify(def: &PolicyDef, diags: &mut Diags<'_>) -> OnModify {
    match def.on_modify.as_deref().unwrap_or("") {
        "" => OnModify::Unchecked,
        "revalidate" => OnModify::Revalidate,
        other => {
            diags.push(
                "on_modify",
                CompileErrorKind::UnknownOnModify {
                    value: other.to_owned(),
                },
            );
            OnModify::Unchecked
        }
    }
}

/// `timeout`: at least one minute, and what happens then (deny, allow or escalate).
fn compile_timeout(def: &PolicyDef, diags: &mut Diags<'_>) -> Option<Timeout> {
    def.timeout.as_ref().and_then(|t| {
        let minutes = u32::try_from(t.after_minutes).ok().filter(|m| *m >= 1);
        if minutes.is_none() {
            diags.push(
                "timeout.after_minutes",
                CompileErrorKind::InvalidTimeoutMinutes {
                    value: t.after_minutes,
                },
            );
        }
        let default = match t.default.as_str() {
            "" | "deny" => Some(TimeoutDefault::Deny),
            "allow" => Some(TimeoutDefault::Allow),
            "escalate" => Some(TimeoutDefault::Escalate),
            other => {
                diags.push(
                    "timeout.default",
                    CompileErrorKind::UnknownTimeoutDefault {
                        value: other.to_owned(),
                    },
                );
                None
            }
        };
        Some(Timeout {
            after_minutes: minutes?,
            default: default?,
        })
    })
}

/// The approver role an approval is routed to: `runtime."phrony.com/approver_role"` (or
/// `runtime.approver_role`), a string.
fn compile_route(def: &PolicyDef, diags: &mut Diags<'_>) -> Option<String> {
    let mut route = None;
    if let Some(runtime) = &def.runtime {
        for key in ["phrony.com/approver_role", "approver_role"] {
            match runtime.get(key) {
                None => continue,
                Some(Value::String(s)) => route = non_empty(Some(s.clone())),
                Some(_) => diags.push(format!("runtime.{key}"), CompileErrorKind::RouteNotString),
            }
            break;
        }
    }
    route
}

impl Policy {
    /// Validates and compiles one definition; problems go to `diags`.
    pub(crate) fn compile(def: PolicyDef, diags: &mut Diags<'_>) -> Option<Policy> {
        let before = diags.list.len();
        if def.name.trim().is_empty() {
            diags.push("name", CompileErrorKind::MissingName);
        }

        let scope = compile_scope(&def, diags);

        check_cedar_fields(&def, diags);
        let action = if def.cedar.is_some() {
            Some(match def.action.as_str() {
                "escalate" => Action::Escalate,
                _ => Action::RequireApproval,
            })
        } else {
            compile_action(&def, diags)
        };

        let mut values = Vec::with_capacity(def.allow.len());
        for (i, entry) in def.allow.iter().enumerate() {
            if entry.trim().is_empty() {
                diags.push(format!("allow[{i}]"), CompileErrorKind::EmptyAllowEntry);
            } else {
                values.push(Scalar::from_str(entry));
            }
        }
        if def.allow_self_approval
            && let Some(a) = action
            && !a.is_approval()
        {
            diags.push(
                "allow_self_approval",
                CompileErrorKind::SelfApprovalOnOtherAction {
                    action: def.action.clone(),
                },
            );
        }
        if !def.allow.is_empty()
            && let Some(a) = action
            && a != Action::Allow
        {
            diags.push(
                "allow",
                CompileErrorKind::AllowOnOtherAction {
                    action: def.action.clone(),
                },
            );
        }

        let scope_tool = match &scope {
            Some(Scope::Tool(r)) => Some(r.as_str()),
            _ => None,
        };
        let conditions = condition::compile(def.conditions.as_ref(), scope_tool, diags);
        let cedar_history = crate::history::compile_named(&def.cedar_history, scope_tool, diags);
        let cedar = compile_cedar(&def, &cedar_history, diags);

        let approvals_required = match def.approvals_required {
            None => 1,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .unwrap_or_else(|| {
                    diags.push(
                        "approvals_required",
                        CompileErrorKind::InvalidApprovals { value: n },
                    );
                    1
                }),
        };

        let mode = compile_mode(&def, diags);

        let on_reject = compile_on_reject(&def, diags);

        let on_modify = compile_on_modify(&def, diags);

        let timeout = compile_timeout(&def, diags);

        let route = compile_route(&def, diags);

        let allow_field = non_empty(def.allow_field.clone()).and_then(|field| {
            if def.allow.is_empty() {
                diags.push("allow_field", CompileErrorKind::AllowFieldWithoutAllow);
                return None;
            }
            match Field::parse(field.trim(), "allow_field", diags)? {
                Field::Value(source) if source.has_any_step() => {
                    diags.push("allow_field", CompileErrorKind::AllowFieldAny);
                    None
                }
                Field::Value(source) => Some((field.trim().to_owned(), source)),
                Field::Trigger | Field::Outcome => {
                    diags.push(
                        "allow_field",
                        CompileErrorKind::BadPath {
                            field: field.clone(),
                            reason: "the dispatch trigger has no allow list".to_owned(),
                        },
                    );
                    None
                }
            }
        });

        if action.is_some()
            && def.cedar.is_none()
            && def.scope.is_empty()
            && def.allow.is_empty()
            && matches!(conditions, Compiled::None)
        {
            diags.push("scope", CompileErrorKind::NoTarget);
        }

        if diags.list.len() != before {
            return None;
        }
        let (Some(scope), Some(action)) = (scope, action) else {
            return None;
        };
        let conditions = match conditions {
            Compiled::Tree(c) => Some(c),
            Compiled::None => None,
            Compiled::Invalid => return None,
        };
        let reason = non_empty(def.reason);
        let deny_message = reason
            .clone()
            .unwrap_or_else(|| format!("tool call blocked by policy {}", def.name));
        Some(Policy {
            id: PolicyId {
                namespace: def.namespace,
                name: def.name,
                version: def.version,
            },
            mode,
            scope_text: def.scope,
            scope,
            action,
            conditions,
            allow: (!values.is_empty()).then_some(AllowList {
                values,
                field: allow_field,
            }),
            reason,
            deny_message,
            approvals_required,
            on_reject,
            on_modify,
            comprehension_required: def.comprehension_required,
            allow_self_approval: def.allow_self_approval,
            timeout,
            authority_ref: non_empty(def.authority_ref),
            route,
            runtime: def.runtime,
            cedar,
            cedar_history,
        })
    }

    /// The policy's identity (`namespace/name@version`).
    pub fn id(&self) -> &PolicyId {
        &self.id
    }

    /// The policy name.
    pub fn name(&self) -> &str {
        &self.id.name
    }

    /// Whether the policy decides calls or is only evaluated and reported.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the policy is a shadow policy (`mode: shadow`).
    pub fn is_shadow(&self) -> bool {
        self.mode == Mode::Shadow
    }

    /// The scope as written (`""`, `agent` or `tool:<ref>`).
    pub fn scope(&self) -> &str {
        &self.scope_text
    }

    /// The decision type.
    pub fn action(&self) -> Action {
        self.action
    }

    /// Whether the policy's effect is computed by Cedar (`cedar`).
    pub fn is_cedar(&self) -> bool {
        self.cedar.is_some()
    }

    /// The `@id`s of a Cedar policy's Cedar policies, sorted (empty for other policies).
    pub fn cedar_ids(&self) -> &[String] {
        #[cfg(feature = "cedar")]
        if let Some(doc) = &self.cedar {
            return doc.ids();
        }
        &[]
    }

    /// The tools in a Cedar policy's scope that no Cedar `permit` applies to (by action and
    /// resource scope): every call of theirs is denied. Empty for other policies.
    pub fn cedar_tools_without_permit(&self) -> Vec<&str> {
        #[cfg(feature = "cedar")]
        if let Some(doc) = &self.cedar {
            return doc.tools_without_permit();
        }
        Vec::new()
    }

    /// What Cedar said about a call, for explanations: `None` for other policies and calls out
    /// of scope.
    pub(crate) fn cedar_detail(&self, req: &Request<'_>) -> Option<String> {
        #[cfg(feature = "cedar")]
        if let Some(doc) = &self.cedar
            && self.applies_to(req.tool.r#ref)
        {
            use crate::cedar::CedarVerdict;
            let list = |ids: &[String]| ids.join(", ");
            return Some(match doc.evaluate(req, &self.cedar_history) {
                CedarVerdict::Allow { permits } => format!("permit ({})", list(&permits)),
                CedarVerdict::Deny { forbids } => format!("forbid ({})", list(&forbids)),
                CedarVerdict::NoPermit => "no permit matched (default deny)".to_owned(),
                CedarVerdict::Escalate { policies, approver } => {
                    format!("escalate ({}) to {approver}", list(&policies))
                }
                CedarVerdict::Invalid { problem } => format!("cannot decide: {problem}"),
            });
        }
        #[cfg(not(feature = "cedar"))]
        let _ = req;
        None
    }

    /// A Cedar policy's verdict: forbid (or no permit, or a call Cedar cannot decide) denies,
    /// the escalate convention asks for this policy's approval, permit allows.
    #[cfg(feature = "cedar")]
    fn cedar_verdict(&self, doc: &crate::cedar_doc::CedarDoc, req: &Request<'_>) -> Verdict<'_> {
        use crate::cedar::CedarVerdict;
        match doc.evaluate(req, &self.cedar_history) {
            CedarVerdict::Allow { .. } => Verdict::Allow,
            CedarVerdict::Escalate { .. } => Verdict::Approval,
            CedarVerdict::Deny { forbids } => {
                let reason = forbids.iter().find_map(|id| doc.reason(id)).map_or_else(
                    || format!("tool call blocked by policy {}", self.id.name),
                    ToOwned::to_owned,
                );
                Verdict::Deny(Cow::Owned(format!(
                    "{reason} (Cedar: {})",
                    forbids.join(", ")
                )))
            }
            CedarVerdict::NoPermit => Verdict::Deny(Cow::Owned(format!(
                "no Cedar policy of {} permits this call (default deny)",
                self.id.name
            ))),
            CedarVerdict::Invalid { problem } => Verdict::Deny(Cow::Owned(format!(
                "policy {} cannot decide the call, denied (fail closed): {problem}",
                self.id.name
            ))),
        }
    }

    /// Whether the policy has conditions.
    pub fn has_conditions(&self) -> bool {
        self.conditions.is_some()
    }

    /// Whether the policy is a dispatch-failure trigger policy: its conditions read the trigger
    /// (`phrony.dispatch.trigger` or `dispatch.outcome`). Only these can route a dispatch
    /// failure to a human ([`crate::PolicySet::evaluate_failure`]).
    pub fn reads_trigger(&self) -> bool {
        self.conditions.as_ref().is_some_and(Cond::reads_trigger)
    }

    /// The field the allow list checks (`allow_field`), if one was set.
    pub fn allow_field(&self) -> Option<&str> {
        self.allow
            .as_ref()
            .and_then(|a| a.field.as_ref())
            .map(|(f, _)| f.as_str())
    }

    /// The deny message or approval reason, if one was given.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// The message of a denial by this policy: the reason, or `tool call blocked by policy <name>`.
    pub fn deny_message(&self) -> &str {
        &self.deny_message
    }

    /// Approval quorum (at least 1).
    pub fn approvals_required(&self) -> u32 {
        self.approvals_required
    }

    /// What a rejection does.
    pub fn on_reject(&self) -> OnReject {
        self.on_reject
    }

    /// What approver-edited arguments go through.
    pub fn on_modify(&self) -> OnModify {
        self.on_modify
    }

    /// Whether approvers must acknowledge comprehension.
    pub fn comprehension_required(&self) -> bool {
        self.comprehension_required
    }

    /// Whether the policy opts out of separation of duties (`allow_self_approval: true`): the
    /// principal who started the session may vote on the approval.
    pub fn allow_self_approval(&self) -> bool {
        self.allow_self_approval
    }

    /// The approval timeout.
    pub fn timeout(&self) -> Option<Timeout> {
        self.timeout
    }

    /// The governance authority boundary.
    pub fn authority_ref(&self) -> Option<&str> {
        self.authority_ref.as_deref()
    }

    /// The approval route: `runtime["phrony.com/approver_role"]`, else `runtime["approver_role"]`.
    pub fn route(&self) -> Option<&str> {
        self.route.as_deref()
    }

    /// The free-form runtime map, passed through to approvals.
    pub fn runtime(&self) -> Option<&Map<String, Value>> {
        self.runtime.as_ref()
    }

    /// Whether the policy's scope covers a tool (by dispatch ref).
    pub fn applies_to(&self, tool_ref: &str) -> bool {
        match &self.scope {
            Scope::Agent => true,
            Scope::Tool(r) => r == tool_ref,
        }
    }

    /// The tool ref of a `tool:<ref>` scope; `None` for an agent-wide policy. The set's scope
    /// index groups policies by it.
    pub(crate) fn scope_tool(&self) -> Option<&str> {
        match &self.scope {
            Scope::Agent => None,
            Scope::Tool(r) => Some(r),
        }
    }

    /// Gives the history leaves the indices of their queries in `table`; `false` when the set
    /// would hold more than [`MAX_HISTORY_QUERIES`](crate::MAX_HISTORY_QUERIES) queries.
    pub(crate) fn intern_history(&mut self, table: &mut Vec<crate::HistoryQuery>) -> bool {
        self.cedar_history
            .iter_mut()
            .all(|(_, side)| crate::history::intern(side, table))
            && self
                .conditions
                .as_mut()
                .is_none_or(|c| c.intern_history(table))
    }

    /// Whether the policy reads history: its conditions have a `history` leaf, or it is a
    /// Cedar policy with named history facts.
    pub fn reads_history(&self) -> bool {
        !self.cedar_history.is_empty() || self.conditions.as_ref().is_some_and(Cond::reads_history)
    }

    /// Gives the condition leaves their path slots (see `slots.rs`).
    pub(crate) fn intern_paths(&mut self, table: &mut PathTable) {
        if let Some(conditions) = &mut self.conditions {
            conditions.intern(table);
        }
    }

    /// The slot and values of an equality the conditions cannot hold without (see
    /// `Cond::gate`); `None` when there is none (or no conditions).
    pub(crate) fn gate(&self) -> Option<(u32, &[Scalar])> {
        self.conditions.as_ref()?.gate()
    }

    /// The slot and values of every equality leaf on a whole slot (see `Cond::keyed_values`).
    pub(crate) fn keyed_values<'p>(&'p self, f: &mut impl FnMut(u32, &'p [Scalar])) {
        if let Some(conditions) = &self.conditions {
            conditions.keyed_values(f);
        }
    }

    /// Gives the equality leaves the ids of their values in the set's key tables.
    pub(crate) fn assign_keys(&mut self, gates: &crate::gate::Gates) {
        if let Some(conditions) = &mut self.conditions {
            conditions.assign_keys(gates);
        }
    }

    /// The slot and pattern of every `matches` leaf a slot's regex filter answers for.
    pub(crate) fn slotted_patterns<'p>(&'p self, f: &mut impl FnMut(u32, &'p str)) {
        if let Some(conditions) = &self.conditions {
            conditions.slotted_patterns(f);
        }
    }

    pub(crate) fn matches(&self, ctx: &Ctx<'_, '_>) -> bool {
        self.conditions.as_ref().is_none_or(|c| c.eval(ctx))
    }

    /// This policy's verdict on a call.
    pub(crate) fn verdict(&self, ctx: &Ctx<'_, '_>) -> Verdict<'_> {
        if !self.applies_to(ctx.req.tool.r#ref) {
            return Verdict::NotApplicable;
        }
        self.verdict_in_scope(ctx)
    }

    /// This policy's verdict on a call its scope is already known to cover (the set's scope
    /// index only visits those).
    pub(crate) fn verdict_in_scope(&self, ctx: &Ctx<'_, '_>) -> Verdict<'_> {
        #[cfg(feature = "cedar")]
        if let Some(doc) = &self.cedar {
            return self.cedar_verdict(doc, ctx.req);
        }
        if !self.matches(ctx) {
            return Verdict::NoMatch;
        }
        match self.action {
            Action::Deny => Verdict::Deny(Cow::Borrowed(&self.deny_message)),
            Action::RequireApproval | Action::Escalate => Verdict::Approval,
            Action::Allow => match &self.allow {
                Some(list) => match self.check_allow(list, ctx.req) {
                    None => Verdict::Allow,
                    Some(message) => Verdict::Deny(Cow::Owned(message)),
                },
                None => Verdict::Allow,
            },
        }
    }

    /// Whether this policy, in scope of the call, denies it whatever its arguments: its
    /// conditions (if any) read only the call's context and hold in `ctx`, and it is a deny, or
    /// an allow whose allow list checks a context field (`allow_field: phrony.…`) that the
    /// context fails. Anything that reads the arguments (a condition on an argument path, an
    /// allow list on arguments) answers `false`.
    pub(crate) fn denies_whatever_the_args(&self, ctx: &Ctx<'_, '_>) -> bool {
        if self.is_cedar() {
            // Cedar reads the arguments through its own context: never hides a tool.
            return false;
        }
        if self.conditions.as_ref().is_some_and(Cond::reads_args) || !self.matches(ctx) {
            return false;
        }
        match (self.action, &self.allow) {
            (Action::Deny, _) => true,
            (Action::Allow, Some(list)) => {
                list.field
                    .as_ref()
                    .is_some_and(|(_, source)| !source.reads_args())
                    && self.check_allow(list, ctx.req).is_some()
            }
            (Action::Allow, None) | (Action::RequireApproval | Action::Escalate, _) => false,
        }
    }

    /// Checks the allow list; `Some(message)` on a violation.
    fn check_allow(&self, list: &AllowList, req: &Request<'_>) -> Option<String> {
        let listed = |a: Actual<'_>| crate::ops::listed(&list.values, a);
        let Some((field, source)) = &list.field else {
            let candidate = req.args.as_object().and_then(|m| {
                let scalar = |v: &&Value| v.is_string() || v.is_number();
                HEURISTIC_KEYS
                    .iter()
                    .find_map(|k| m.get(*k).filter(scalar))
                    .or_else(|| {
                        m.iter()
                            .filter(|(_, v)| scalar(v))
                            .min_by(|a, b| a.0.cmp(b.0))
                            .map(|(_, v)| v)
                    })
            });
            return match candidate {
                None => Some(NO_VALUE.to_owned()),
                Some(v) if listed(Actual::Json(v)) => None,
                Some(v) => Some(self.not_allowed(Actual::Json(v))),
            };
        };
        let mut violation = None;
        let ok = source.resolve(req, &mut |a: Option<Actual<'_>>| match a {
            Some(
                a @ (Actual::Str(_)
                | Actual::Num(_)
                | Actual::Json(Value::String(_) | Value::Number(_) | Value::Bool(_))),
            ) => {
                if listed(a) {
                    return true;
                }
                violation.get_or_insert_with(|| self.not_allowed(a));
                false
            }
            _ => {
                violation.get_or_insert_with(|| self.no_value_at(field));
                false
            }
        });
        if ok {
            return None;
        }
        // `[all]` over an empty array fails without visiting a value.
        Some(violation.unwrap_or_else(|| self.no_value_at(field)))
    }

    fn no_value_at(&self, field: &str) -> String {
        format!(
            "no value at `{field}` to check against the allow list of policy {}",
            self.id.name
        )
    }

    fn not_allowed(&self, value: Actual<'_>) -> String {
        format!("value {value} is not allowed by policy {}", self.id.name)
    }
}
