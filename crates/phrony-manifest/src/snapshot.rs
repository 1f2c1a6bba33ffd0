//! Validation of a compiled snapshot (§1.11), as a runtime receiving one must do it.
//!
//! A snapshot arrives without its YAML, its `tools/`, `policies/` or prompt files, so it is checked
//! on its own: the authoring rules that still apply to compiled output (identity, secrets, model,
//! MCP servers, tool bindings, limits, output; shared with [`crate::validate`] so they are written
//! once), the checks the reference runs only on compiled snapshots (compiled policies and
//! delegation targets), and the invariants of our compiler's output (inline prompt and schemas,
//! valid JSON Schemas, policies the engine loads, the compiler's annotations). Problems carry a
//! field path and a message, and no file position.

use std::collections::HashSet;

use crate::diag::{Diagnostics, Report, SnapshotDiags};
use crate::model::common::{blank, is_lenient_semver};
use crate::model::compiled::{
    ANNOTATION_POLICIES_COMPILED, ANNOTATION_STUB_SCRIPT, CompiledAgent, CompiledPolicy, Schema,
    ToolBinding,
};
use crate::policy_bridge::one_line;
use crate::schema::check_schema;
use crate::stub::StubScript;
use crate::validate::{
    MAX_TOOL_TIMEOUT_MS, McpBindingView, McpServerView, ModelView, WireNames, agent_identity,
    delegation_result, envelope, mcp_binding, mcp_servers, metadata, model, negative_limits,
    on_limit, output_enums, secret_def, side_effect_class,
};

impl CompiledAgent {
    /// Validates a compiled snapshot received from elsewhere (a client's Publish, a stored row),
    /// reporting every problem at once.
    ///
    /// It runs the authoring rules that still apply to compiled output (metadata and semver,
    /// secret names, model and provider rules, MCP servers, unique and well-formed tool wire
    /// names, `side_effect_class`, limits and output enums), the checks the reference runs only
    /// on compiled snapshots (compiled policy shape, allow-list scopes, pinned delegation
    /// targets), and the invariants of compiler output: the `phrony.com/policies-compiled`
    /// annotation, no `ref` left for instructions or schemas, inline schemas that are valid JSON
    /// Schemas, and policies that load into the `phrony-policy` engine.
    ///
    /// Every [`Diagnostic`](crate::Diagnostic) has an empty `file` and no position;
    /// [`Diagnostic::summary`](crate::Diagnostic::summary) reads `<path>: <message>`.
    ///
    /// Delegation bindings must be pinned (`agent.version` or `agent.agent_version_id`) unless
    /// late-bound, so a bundle member's snapshot validates only once bundle publish has pinned
    /// its local delegations.
    pub fn validate(&self) -> Result<(), Diagnostics> {
        let mut d = SnapshotDiags::default();
        envelope(&mut d, &self.api_version, &self.kind, "Agent");
        let m = &self.metadata;
        metadata(&mut d, &m.name, &m.namespace, &m.version, true);
        agent_identity(&mut d, &m.name, &m.namespace);
        self.check_annotations(&mut d);

        let secrets: HashSet<&str> = self.secrets.keys().map(String::as_str).collect();
        for (name, def) in &self.secrets {
            secret_def(&mut d, name, Some(&def.from_env));
        }

        let spec = &self.spec;
        if blank(&spec.purpose) {
            d.error("spec.purpose", "is required");
        }
        let instructions = &spec.instructions;
        if !instructions.reference.is_empty() || !instructions.version.is_empty() {
            d.error(
                "spec.instructions",
                "ref and version are resolved by compilation; a compiled snapshot carries the \
                 prompt as text",
            );
        } else if blank(&instructions.text) {
            d.error("spec.instructions.text", "is required");
        }
        let mdl = &spec.model;
        let params = mdl.parameters.as_ref();
        model(
            &ModelView {
                provider: &mdl.provider,
                name: &mdl.name,
                base_url: &mdl.base_url,
                secret: &mdl.secret,
                temperature: params.and_then(|p| p.temperature),
                top_p: params.and_then(|p| p.top_p),
                max_output_tokens: params.map(|p| p.max_output_tokens),
                effort: mdl.reasoning.as_ref().map_or("", |r| r.effort.as_str()),
            },
            &secrets,
            !self.secrets.is_empty(),
            &mut d,
        );

        let servers = mcp_servers(
            spec.mcp_servers.iter().map(|s| McpServerView {
                name: &s.name,
                url: &s.url,
                transport: &s.transport,
                auth: s
                    .auth
                    .as_ref()
                    .map(|a| (a.scheme.as_str(), a.header.as_str(), a.secret.as_str())),
            }),
            &secrets,
            &mut d,
        );
        let mut wire = WireNames::default();
        for (i, tool) in spec.tools.iter().enumerate() {
            check_binding(i, tool, &servers, &mut wire, &mut d);
        }

        self.check_policies(&mut d);
        self.check_authority_boundaries(&mut d);

        if let Some(l) = &spec.limits {
            on_limit(&mut d, &l.on_limit);
            negative_limits(
                &mut d,
                [
                    ("max_tokens_per_run", Some(l.max_tokens_per_run)),
                    ("max_loop_iterations", Some(l.max_loop_iterations)),
                    ("max_wall_clock_seconds", Some(l.max_wall_clock_seconds)),
                    ("max_hitl_wait_minutes", Some(l.max_hitl_wait_minutes)),
                ],
            );
            // 0 means unset (the default depth); an explicit depth is at least 1.
            if l.max_subagent_depth < 0 {
                d.error("spec.limits.max_subagent_depth", "must be >= 1");
            }
        }
        if let Some(o) = &self.output {
            output_enums(&mut d, &o.format, &o.on_invalid);
            if let Some(s) = &o.schema {
                inline_schema(s, "output.schema", &mut d);
            }
        }
        d.finish()
    }

    /// The compiler's marker, and the stub script exactly when the provider is `stub`.
    fn check_annotations(&self, d: &mut SnapshotDiags) {
        let annotations = &self.metadata.annotations;
        if annotations
            .get(ANNOTATION_POLICIES_COMPILED)
            .map(String::as_str)
            != Some("true")
        {
            d.error(
                &format!("metadata.annotations.{ANNOTATION_POLICIES_COMPILED}"),
                "must be \"true\": a compiled snapshot is marked by the compiler; compile the \
                 manifest with phrony",
            );
        }
        let at = format!("metadata.annotations.{ANNOTATION_STUB_SCRIPT}");
        match (
            self.spec.model.provider == "stub",
            annotations.get(ANNOTATION_STUB_SCRIPT),
        ) {
            (true, None) => d.error(
                &at,
                "is required when provider is stub (the compiler inlines stub-script.json)",
            ),
            (true, Some(text)) => {
                if let Err(e) = StubScript::parse(text) {
                    d.error(&at, e.to_string());
                }
            }
            (false, Some(_)) => d.error(&at, "must be empty unless provider is stub"),
            (false, None) => {}
        }
    }

    /// The reference's compiled-only policy checks, then the policy engine for everything else
    /// (decision types, conditions, regexes, timeouts…), without reporting a problem twice.
    fn check_policies(&self, d: &mut SnapshotDiags) {
        let tool_refs: HashSet<&str> = self
            .spec
            .tools
            .iter()
            .map(|t| t.reference.as_str())
            .collect();
        let mut names = HashSet::new();
        for (i, p) in self.spec.policies.iter().enumerate() {
            let base = format!("spec.policies[{i}]");
            if blank(&p.name) {
                d.error(&format!("{base}.name"), "is required");
            } else if !names.insert(p.name.as_str()) {
                d.error(&format!("{base}.name"), "must be unique");
            }
            check_policy_shape(p, &base, &tool_refs, d);
        }
        if let Err(errors) = self.policy_set() {
            for e in errors {
                let p = self.spec.policies.get(e.index);
                if p.is_some_and(|p| reported_by_shape(p, &e.kind)) {
                    continue;
                }
                let at = match e.path.as_str() {
                    "" => format!("spec.policies[{}]", e.index),
                    path => format!("spec.policies[{}].{path}", e.index),
                };
                d.error(&at, one_line(&e.kind.to_string()));
            }
        }
    }

    /// Authority boundaries are enforced: each compiles to an agent-wide approval policy (merged
    /// into one when there are several), so a snapshot that declares boundaries carries one.
    fn check_authority_boundaries(&self, d: &mut SnapshotDiags) {
        let Some(g) = &self.metadata.governance else {
            return;
        };
        let mut any = false;
        for (j, boundary) in g.authority_boundaries.iter().enumerate() {
            if blank(boundary) {
                d.error(
                    &format!("metadata.governance.authority_boundaries[{j}]"),
                    "must not be empty",
                );
            } else {
                any = true;
            }
        }
        let enforced = self.spec.policies.iter().any(|p| {
            p.scope == "agent" && p.action == "require_approval" && p.conditions.is_none()
        });
        if any && !enforced {
            d.error(
                "metadata.governance.authority_boundaries",
                "are not enforced: the snapshot has no require_approval policy with scope agent \
                 and no conditions, which the compiler adds for them",
            );
        }
    }
}

/// One compiled binding: ref, wire name, class, schema, and its MCP or delegation target.
fn check_binding(
    i: usize,
    t: &ToolBinding,
    servers: &HashSet<&str>,
    wire: &mut WireNames,
    d: &mut SnapshotDiags,
) {
    let base = format!("spec.tools[{i}]");
    if !t.wire_name.is_empty() {
        wire.check(d, t.wire_name.clone(), true, &base);
    } else if !blank(&t.reference) {
        wire.check(d, t.wire_name(), false, &base);
    }
    if blank(&t.reference) {
        d.error(&format!("{base}.ref"), "is required");
    } else if t.agent.is_none() && t.reference.contains('@') {
        d.error(
            &format!("{base}.ref"),
            "must not carry a version constraint in a compiled snapshot (the compiler pins \
                 the Tool document's version in version)",
        );
    }
    side_effect_class(d, &base, &t.side_effect_class);
    if t.timeout_ms > MAX_TOOL_TIMEOUT_MS {
        d.error(
            &format!("{base}.timeout_ms"),
            format!(
                "must be at most {MAX_TOOL_TIMEOUT_MS} (24h); 0 or absent is the runtime's default"
            ),
        );
    }
    if t.agent.is_some() && t.timeout_ms > 0 {
        d.error(
            &format!("{base}.timeout_ms"),
            "is not supported on agent-backed tools (a delegation is a session, not a worker call)",
        );
    }
    if !t.version.is_empty() && !is_lenient_semver(&t.version) {
        d.error(&format!("{base}.version"), "must be valid semver");
    }
    if let Some(s) = &t.input_schema {
        inline_schema(s, &format!("{base}.input_schema"), d);
    }
    if let Some(mcp) = &t.mcp {
        mcp_binding(
            d,
            &base,
            &McpBindingView {
                reference: &t.reference,
                server: &mcp.server,
                has_input_schema: t.input_schema.is_some(),
                side_effect_class: &t.side_effect_class,
            },
            servers,
        );
    }
    let Some(a) = &t.agent else {
        return;
    };
    if t.mcp.is_some() {
        d.error(
            &base,
            "set mcp or agent, not both: a tool is served by an MCP server or by an agent",
        );
    }
    if t.side_effect_class != "non_idempotent_write" {
        d.error(
            &format!("{base}.side_effect_class"),
            "must be non_idempotent_write for agent-backed tools",
        );
    }
    let at = format!("{base}.agent");
    if blank(&a.namespace) {
        d.error(&format!("{at}.namespace"), "is required");
    }
    if blank(&a.name) {
        d.error(&format!("{at}.name"), "is required");
    }
    if !a.late_bound && blank(&a.version) && blank(&a.agent_version_id) {
        d.error(
            &at,
            "delegation target must be pinned (version or agent_version_id) unless late_bound is \
             true",
        );
    }
    if !a.version.is_empty() && !is_lenient_semver(&a.version) {
        d.error(&format!("{at}.version"), "must be valid semver");
    }
    delegation_result(d, &format!("{at}.result"), &a.result);
}

/// The reference's compiled-only rules on one policy's shape.
fn check_policy_shape(
    p: &CompiledPolicy,
    base: &str,
    tool_refs: &HashSet<&str>,
    d: &mut SnapshotDiags,
) {
    let has_action = !p.action.is_empty();
    let has_allow = !p.allow.is_empty();
    if has_allow && has_action && p.action != "allow" {
        d.error(base, "set action or allow, not both");
    }
    if !has_action && !has_allow {
        if p.conditions.is_some() {
            d.error(
                &format!("{base}.conditions"),
                "conditions require action or allow",
            );
        } else {
            d.error(
                base,
                "must set action, allow, or conditions with a decision",
            );
        }
    }
    for (j, entry) in p.allow.iter().enumerate() {
        if blank(entry) {
            d.error(&format!("{base}.allow[{j}]"), "must not be empty");
        }
    }
    if has_allow {
        if blank(&p.scope) {
            d.error(&format!("{base}.scope"), "is required when allow is set");
        } else if let Some(target) = p.scope.strip_prefix("tool:")
            && !tool_refs.contains(target)
        {
            d.error(
                &format!("{base}.scope"),
                format!("references undeclared tool ref {target}"),
            );
        }
    }
}

/// Whether the policy engine's `kind` repeats a problem [`check_policy_shape`] or the name
/// checks already reported for `p`.
fn reported_by_shape(p: &CompiledPolicy, kind: &phrony_policy::CompileErrorKind) -> bool {
    use phrony_policy::CompileErrorKind as K;
    match kind {
        K::MissingName | K::DuplicateName { .. } | K::EmptyAllowEntry => true,
        K::AllowOnOtherAction { .. } => !p.action.is_empty() && p.action != "allow",
        K::MissingAction => p.allow.is_empty(),
        _ => false,
    }
}

/// A compiled schema: inline (refs are resolved by compilation), a non-empty object, and a valid
/// JSON Schema.
fn inline_schema(s: &Schema, at: &str, d: &mut SnapshotDiags) {
    if !s.reference.is_empty() || !s.version.is_empty() {
        d.error(
            at,
            "ref and version are resolved by compilation; a compiled snapshot carries the schema \
             inline",
        );
        return;
    }
    let inline_at = format!("{at}.inline");
    match &s.inline {
        None => d.error(at, "must set inline"),
        Some(v) if v.0.as_object().is_none_or(serde_json::Map::is_empty) => {
            d.error(&inline_at, "must be a non-empty JSON Schema object");
        }
        Some(v) => {
            if let Err(p) = check_schema(&v.0) {
                let path = if p.path.is_empty() {
                    inline_at
                } else {
                    format!("{inline_at}.{}", p.path)
                };
                d.error(&path, p.message);
            }
        }
    }
}

#[cfg(test)]
mod tests;
