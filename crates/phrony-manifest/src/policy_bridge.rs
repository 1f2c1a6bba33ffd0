//! The bridge to `phrony-policy`: Policy documents and compiled policies become `PolicyDef`s, and
//! the engine's compile errors are placed back on the Policy document's YAML nodes.

use phrony_policy::{
    AgentCtx, CompileErrorKind, CompileErrors, PolicyDef, PolicySet, Request, SessionCtx,
    TimeoutDef, ToolCtx,
};
use serde_json::Value;

use crate::diag::FileDiags;
use crate::model::common::{blank, is_lenient_semver};
use crate::model::compiled::{CompiledAgent, CompiledPolicy, ToolBinding};
use crate::model::policy::PolicyDoc;
use crate::yaml_pos::Mark;

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// Whether a decision type asks for approvals (`require_approval`, `escalate`).
pub(crate) fn is_approval(action: &str) -> bool {
    action == "require_approval" || action == "escalate"
}

/// The definition of a Policy document as written (its own scope).
pub(crate) fn def_from_doc(doc: &PolicyDoc) -> PolicyDef {
    let spec = &doc.spec;
    let decision = spec.decision.clone().unwrap_or_default();
    PolicyDef {
        name: doc.metadata.name.clone(),
        scope: spec.scope.clone(),
        action: if spec.cedar.is_some() && decision.kind.is_empty() {
            "require_approval".to_owned()
        } else {
            decision.kind.clone()
        },
        allow: spec.allow.clone().unwrap_or_default(),
        conditions: spec.conditions.clone().filter(|c| !c.is_null()),
        authority_ref: opt(&decision.authority_ref),
        approvals_required: decision.approvals_required,
        reason: opt(&decision.reason),
        on_reject: opt(&decision.on_reject),
        on_modify: opt(&decision.on_modify),
        comprehension_required: decision.comprehension_required,
        allow_self_approval: decision.allow_self_approval,
        timeout: decision.timeout.as_ref().map(|t| TimeoutDef {
            after_minutes: t.after_minutes.unwrap_or(0),
            default: t.default.clone(),
        }),
        runtime: (!decision.runtime.is_empty())
            .then(|| decision.runtime.clone().into_iter().collect()),
        namespace: doc.metadata.namespace.clone(),
        version: doc.metadata.version.clone(),
        allow_field: opt(spec.allow_field.trim()),
        mode: spec.mode.clone(),
        cedar: spec.cedar.clone(),
        cedar_history: spec.history.clone(),
        // Checked on its own the document has no tools: its Cedar text is parsed, and
        // validated against the tools' input schemas when an agent attaches it.
        cedar_tools: std::collections::BTreeMap::new(),
    }
}

/// The definition of a compiled policy. A Cedar policy gets the input schemas of the agent's
/// `tools` in its scope (what types `context.args`; a tool without one has no typed arguments).
pub(crate) fn def_from_compiled(p: &CompiledPolicy, tools: &[ToolBinding]) -> PolicyDef {
    let cedar_tools = match &p.cedar {
        None => std::collections::BTreeMap::new(),
        Some(_) => {
            let target = p.scope.strip_prefix("tool:");
            tools
                .iter()
                .filter(|t| target.is_none_or(|r| r == t.reference))
                .map(|t| {
                    let schema = t
                        .input_schema
                        .as_ref()
                        .and_then(|s| s.inline.as_ref())
                        .map_or_else(|| Value::Object(serde_json::Map::new()), |j| j.0.clone());
                    (t.reference.clone(), schema)
                })
                .collect()
        }
    };
    PolicyDef {
        name: p.name.clone(),
        scope: p.scope.clone(),
        action: p.action.clone(),
        allow: p.allow.clone(),
        conditions: p.conditions.as_ref().map(|c| c.0.clone()),
        authority_ref: opt(&p.authority_ref),
        approvals_required: (p.approvals_required != 0).then_some(p.approvals_required),
        reason: opt(&p.reason),
        on_reject: opt(&p.on_reject),
        on_modify: opt(&p.on_modify),
        comprehension_required: p.comprehension_required,
        allow_self_approval: p.allow_self_approval,
        timeout: p.timeout.as_ref().map(|t| TimeoutDef {
            after_minutes: t.after_minutes,
            default: t.default_decision.clone(),
        }),
        runtime: (!p.runtime.is_empty()).then(|| {
            p.runtime
                .iter()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect()
        }),
        namespace: p.namespace.clone(),
        version: p.version.clone(),
        allow_field: opt(&p.allow_field),
        mode: p.mode.clone(),
        cedar: p.cedar.clone(),
        cedar_tools,
        cedar_history: p
            .cedar_history
            .iter()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect(),
    }
}

/// Maps a path inside a compiled policy (`conditions.all[1].op`, `action`, `timeout.default`)
/// to the Policy document's layout (`spec.conditions.all[1].op`, `spec.decision.type`, …).
pub(crate) fn doc_path(path: &str) -> String {
    let (head, rest) = match path.find(['.', '[']) {
        Some(i) => (&path[..i], &path[i..]),
        None => (path, ""),
    };
    match head {
        "name" => format!("metadata.name{rest}"),
        "action" => format!("spec.decision.type{rest}"),
        "scope" | "allow" | "allow_field" | "conditions" | "mode" | "cedar" => {
            format!("spec.{head}{rest}")
        }
        "cedar_history" => format!("spec.history{rest}"),
        "" => "spec".to_owned(),
        other => format!("spec.decision.{other}{rest}"),
    }
}

/// Collapses a multi-line engine message (regex errors draw a caret diagram) onto one line.
pub(crate) fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Validates a Policy document: envelope, identity, and everything the policy engine checks
/// (decision type, scope, conditions, operators, regexes, on_reject, on_modify, timeout, allow
/// list). Returns whether it is valid.
pub(crate) fn validate_policy_doc(doc: &PolicyDoc, src: &str, d: &mut FileDiags<'_>) -> bool {
    let mut ok = true;
    let mut err = |d: &mut FileDiags<'_>, path: &str, msg: String| {
        ok = false;
        d.error(path, msg);
    };
    if doc.api_version != crate::model::common::API_VERSION {
        err(
            d,
            "apiVersion",
            format!("must be {}", crate::model::common::API_VERSION),
        );
    }
    if doc.kind != "Policy" {
        err(d, "kind", "must be Policy".to_owned());
    }
    let md = &doc.metadata;
    if blank(&md.name) {
        err(d, "metadata.name", "is required".to_owned());
    }
    if blank(&md.namespace) {
        err(d, "metadata.namespace", "is required".to_owned());
    }
    if blank(&md.version) {
        d.warning(
            "metadata.version",
            "is not set; approvals and audit name policies as namespace/name@version",
        );
    } else if !is_lenient_semver(&md.version) {
        err(d, "metadata.version", "must be valid semver".to_owned());
    }
    if doc.spec.allow.as_ref().is_some_and(Vec::is_empty) {
        err(
            d,
            "spec.allow",
            "must not be empty; remove it or list the allowed values".to_owned(),
        );
    }
    let mut cedar_failed = false;
    if doc.spec.decision.is_none() && doc.spec.cedar.is_none() {
        err(d, "spec.decision", "is required".to_owned());
    } else if let Err(errors) = PolicySet::compile([def_from_doc(doc)]) {
        for e in errors {
            // The name is checked above with the reference's message.
            if e.path == "name" && blank(&md.name) {
                continue;
            }
            if let CompileErrorKind::Cedar {
                message,
                offset: Some(offset),
            } = &e.kind
                && e.path == "cedar"
            {
                cedar_failed = true;
                cedar_error(
                    src,
                    doc.spec.cedar.as_deref().unwrap_or(""),
                    *offset,
                    message,
                    d,
                );
                continue;
            }
            err(d, &doc_path(&e.path), one_line(&e.kind.to_string()));
        }
    }
    ok && !cedar_failed
}

/// Reports a problem of a Cedar text at its position in the YAML file: inside a literal block
/// scalar (`cedar: |`) the Cedar byte `offset` is mapped to its line and column in the file;
/// for any other style the problem is placed on `spec.cedar`.
pub(crate) fn cedar_error(
    src: &str,
    cedar: &str,
    offset: usize,
    message: &str,
    d: &mut FileDiags<'_>,
) {
    let mark = d.mark("spec.cedar");
    let message = one_line(message);
    match cedar_position(src, mark, cedar, offset) {
        Some((line, column)) => d.error_at(line, column, "spec.cedar", message),
        None => d.error("spec.cedar", message),
    }
}

/// The 1-based file line and column of byte `offset` of a literal block scalar's text whose
/// node is at `mark` (the `|` indicator, or the first content line). `None` for other scalar
/// styles.
fn cedar_position(src: &str, mark: Mark, cedar: &str, offset: usize) -> Option<(usize, usize)> {
    let lines: Vec<&str> = src.lines().collect();
    let is_literal = |line: &str| {
        let code = line.split(" #").next().unwrap_or(line).trim_end();
        code.ends_with('|') || code.ends_with("|-") || code.ends_with("|+")
    };
    let at = lines.get(mark.line.checked_sub(1)?)?;
    let indicator: String = at.chars().skip(mark.column.saturating_sub(1)).collect();
    // The 0-based index of the first content line.
    let first = if indicator.trim_start().starts_with('|') {
        mark.line
    } else if is_literal(lines.get(mark.line.checked_sub(2)?)?) {
        mark.line - 1
    } else {
        return None;
    };
    let indent = lines
        .iter()
        .skip(first)
        .find(|l| !l.trim().is_empty())
        .map_or(0, |l| l.chars().take_while(|c| *c == ' ').count());
    let before = cedar.get(..offset.min(cedar.len()))?;
    let line = before.matches('\n').count();
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count());
    Some((first + 1 + line, indent + column + 1))
}

impl CompiledAgent {
    /// The policy engine for this agent: its compiled policies in evaluation order.
    pub fn policy_set(&self) -> Result<PolicySet, CompileErrors> {
        PolicySet::compile(
            self.spec
                .policies
                .iter()
                .map(|p| def_from_compiled(p, &self.spec.tools)),
        )
    }

    /// The agent as policies see it (`phrony.agent.*`): its namespace, name and version.
    #[must_use]
    pub fn agent_ctx(&self) -> AgentCtx<'_> {
        AgentCtx {
            namespace: &self.metadata.namespace,
            name: &self.metadata.name,
            version: &self.metadata.version,
        }
    }
}

impl ToolBinding {
    /// The tool as policies see it (`phrony.tool.*`): its dispatch ref and version, side-effect
    /// class, and `wire_name` (from [`ToolBinding::wire_name`], which the caller keeps alive).
    #[must_use]
    pub fn tool_ctx<'a>(&'a self, wire_name: &'a str) -> ToolCtx<'a> {
        ToolCtx {
            r#ref: &self.reference,
            version: self.dispatch_version(),
            side_effect_class: &self.side_effect_class,
            name: wire_name,
        }
    }
}

/// What policies see of one call besides the tool and its arguments: the agent, the session (id
/// and metadata), the principal's claims, and the decision time (Unix seconds).
///
/// [`CallScope::request`] is the one construction of a call's policy [`Request`]: the runtime
/// decides every tool call with it, and `phrony policies replay` re-decides stored calls with
/// it, so a replay sees exactly the fields the runtime saw.
#[derive(Debug, Clone, Copy)]
pub struct CallScope<'a> {
    /// The agent whose policies decide (`phrony.agent.*`).
    pub agent: &'a CompiledAgent,
    /// The session's id (`phrony.session.id`).
    pub session_id: &'a str,
    /// The session's metadata (`phrony.session.metadata.*`), see [`session_metadata`].
    pub metadata: &'a Value,
    /// The claims of the principal the session runs for (`phrony.principal.*`), if any.
    pub principal: Option<&'a Value>,
    /// When the call is decided, Unix seconds (`phrony.now`).
    pub now: i64,
}

impl CallScope<'_> {
    /// The policy request of a call of `binding` (called `wire` by the model) with `args`.
    #[must_use]
    pub fn request<'a>(
        &'a self,
        binding: &'a ToolBinding,
        wire: &'a str,
        args: &'a Value,
    ) -> Request<'a> {
        let mut req = Request::new(binding.tool_ctx(wire), args)
            .with_agent(self.agent.agent_ctx())
            .with_session(SessionCtx {
                id: self.session_id,
                metadata: Some(self.metadata),
            })
            .at(self.now);
        if let Some(claims) = self.principal {
            req = req.with_principal(claims);
        }
        req
    }
}

/// A session's metadata as policies see it: a JSON object of its string pairs.
#[must_use]
pub fn session_metadata<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::doc_path;

    #[test]
    fn engine_paths_map_to_document_paths() {
        assert_eq!(
            doc_path("conditions.all[1].op"),
            "spec.conditions.all[1].op"
        );
        assert_eq!(doc_path("action"), "spec.decision.type");
        assert_eq!(doc_path("timeout.default"), "spec.decision.timeout.default");
        assert_eq!(doc_path("allow[2]"), "spec.allow[2]");
        assert_eq!(doc_path("on_reject"), "spec.decision.on_reject");
        assert_eq!(
            doc_path("runtime.approver_role"),
            "spec.decision.runtime.approver_role"
        );
        assert_eq!(doc_path("scope"), "spec.scope");
        assert_eq!(doc_path("mode"), "spec.mode");
        assert_eq!(doc_path("name"), "metadata.name");
    }
}
