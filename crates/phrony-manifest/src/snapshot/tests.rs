//! One test per rule: a valid snapshot, broken in one place, reports exactly that problem.

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use serde_json::{Value, json};

use crate::CompiledAgent;

/// A valid compiled snapshot: a catalog tool, a pinned delegation, an allow list and a deny.
fn base() -> Value {
    json!({
        "apiVersion": "phrony.com/v1",
        "kind": "Agent",
        "metadata": {
            "name": "refund-agent", "namespace": "support", "version": "0.1.0",
            "annotations": {"phrony.com/policies-compiled": "true"}
        },
        "secrets": {"openai": {"fromEnv": "OPENAI_API_KEY"}},
        "spec": {
            "purpose": "Refunds",
            "instructions": {"text": "Look up the order first."},
            "model": {"provider": "openai", "name": "gpt-4o"},
            "tools": [
                {
                    "ref": "payments.issue-refund", "as": "issue_refund",
                    "input_schema": {"inline": {
                        "type": "object",
                        "properties": {"amount": {"type": "number"}, "currency": {"type": "string"}}
                    }},
                    "version": "1.0.0", "side_effect_class": "non_idempotent_write"
                },
                {
                    "ref": "billing.specialist", "as": "ask_billing",
                    "input_schema": {"inline": {"type": "object"}},
                    "side_effect_class": "non_idempotent_write",
                    "agent": {
                        "namespace": "billing", "name": "specialist", "version": "1.2.0",
                        "child_name": "specialist", "result": "summary"
                    }
                }
            ],
            "policies": [
                {
                    "name": "currency", "scope": "tool:payments.issue-refund",
                    "action": "allow", "allow": ["USD", "EUR"], "allow_field": "currency"
                },
                {
                    "name": "limit", "scope": "tool:payments.issue-refund", "action": "deny",
                    "conditions": {"field": "amount", "op": "gt", "value": 5000}
                }
            ]
        }
    })
}

fn agent(v: Value) -> CompiledAgent {
    serde_json::from_value(v).unwrap()
}

/// The problems of a snapshot, as `<path>: <message>`.
fn problems(v: Value) -> Vec<String> {
    match agent(v).validate() {
        Ok(()) => Vec::new(),
        Err(diags) => diags.errors().map(crate::Diagnostic::summary).collect(),
    }
}

/// Applies `edit` to the base snapshot and returns its problems.
fn with(edit: impl FnOnce(&mut Value)) -> Vec<String> {
    let mut v = base();
    edit(&mut v);
    problems(v)
}

fn policy(v: &mut Value, i: usize) -> &mut Value {
    &mut v["spec"]["policies"][i]
}

fn delegation(v: &mut Value) -> &mut Value {
    &mut v["spec"]["tools"][1]["agent"]
}

#[test]
fn the_base_snapshot_is_valid() {
    assert_eq!(problems(base()), Vec::<String>::new());
}

#[test]
fn problems_have_a_path_and_no_file_position() {
    let err = agent(json!({"kind": "Tool", "apiVersion": "v0", "metadata": {"name": "", "namespace": "", "version": ""},
        "spec": {"purpose": "", "instructions": {}, "model": {"provider": "", "name": ""}}}))
    .validate()
    .unwrap_err();
    let first = err.as_slice().first().unwrap();
    assert!(first.file.as_os_str().is_empty());
    assert_eq!((first.line, first.column), (0, 0));
    assert_eq!(
        first.to_string(),
        "error: apiVersion: must be phrony.com/v1"
    );
    assert_eq!(
        err.errors()
            .map(crate::Diagnostic::summary)
            .collect::<Vec<_>>(),
        [
            "apiVersion: must be phrony.com/v1",
            "kind: must be Agent",
            "metadata.name: is required",
            "metadata.namespace: is required",
            "metadata.version: is required",
            "metadata.annotations.phrony.com/policies-compiled: must be \"true\": a compiled \
             snapshot is marked by the compiler; compile the manifest with phrony",
            "spec.purpose: is required",
            "spec.instructions.text: is required",
            "spec.model.provider: is required",
            "spec.model.name: is required",
        ]
    );
}

// --- Checks that run only on compiled snapshots ----------------------------------------------

#[test]
fn a_policy_name_is_required() {
    assert_eq!(
        with(|v| policy(v, 1)["name"] = json!(" ")),
        ["spec.policies[1].name: is required"]
    );
}

#[test]
fn policy_names_are_unique() {
    assert_eq!(
        with(|v| policy(v, 1)["name"] = json!("currency")),
        ["spec.policies[1].name: must be unique"]
    );
}

#[test]
fn an_allow_list_belongs_to_an_allow_action_only() {
    assert_eq!(
        with(|v| policy(v, 1)["allow"] = json!(["USD"])),
        ["spec.policies[1]: set action or allow, not both"]
    );
}

#[test]
fn a_policy_decides_something() {
    assert_eq!(
        with(|v| {
            let p = policy(v, 1);
            p["action"] = json!("");
            p.as_object_mut().unwrap().remove("conditions");
        }),
        ["spec.policies[1]: must set action, allow, or conditions with a decision"]
    );
}

#[test]
fn conditions_need_an_action_or_allow() {
    assert_eq!(
        with(|v| policy(v, 1)["action"] = json!("")),
        ["spec.policies[1].conditions: conditions require action or allow"]
    );
}

#[test]
fn allow_entries_are_not_empty() {
    assert_eq!(
        with(|v| policy(v, 0)["allow"] = json!(["USD", " "])),
        ["spec.policies[0].allow[1]: must not be empty"]
    );
}

#[test]
fn an_allow_list_has_a_scope() {
    assert_eq!(
        with(|v| policy(v, 0)["scope"] = json!("")),
        ["spec.policies[0].scope: is required when allow is set"]
    );
    assert_eq!(
        with(|v| policy(v, 0)["scope"] = json!("agent")),
        Vec::<String>::new()
    );
}

#[test]
fn an_allow_list_scope_names_a_bound_tool() {
    assert_eq!(
        with(|v| policy(v, 0)["scope"] = json!("tool:payments.charge")),
        ["spec.policies[0].scope: references undeclared tool ref payments.charge"]
    );
    // Other decisions may govern a tool the agent does not bind (they never apply).
    assert_eq!(
        with(|v| policy(v, 1)["scope"] = json!("tool:payments.charge")),
        Vec::<String>::new()
    );
}

#[test]
fn a_delegation_names_its_target() {
    assert_eq!(
        with(|v| {
            delegation(v)["namespace"] = json!("");
            delegation(v)["name"] = json!("");
        }),
        [
            "spec.tools[1].agent.namespace: is required",
            "spec.tools[1].agent.name: is required",
        ]
    );
}

#[test]
fn a_delegation_is_pinned_unless_late_bound() {
    let unpinned = "spec.tools[1].agent: delegation target must be pinned (version or \
                    agent_version_id) unless late_bound is true";
    assert_eq!(
        with(|v| {
            delegation(v).as_object_mut().unwrap().remove("version");
        }),
        [unpinned]
    );
    assert_eq!(
        with(|v| {
            let a = delegation(v).as_object_mut().unwrap();
            a.remove("version");
            a.insert("agent_version_id".into(), json!("0b6f0c5e-1"));
        }),
        Vec::<String>::new()
    );
    assert_eq!(
        with(|v| {
            let a = delegation(v).as_object_mut().unwrap();
            a.remove("version");
            a.insert("late_bound".into(), json!(true));
        }),
        Vec::<String>::new()
    );
}

#[test]
fn a_delegation_version_is_semver() {
    assert_eq!(
        with(|v| delegation(v)["version"] = json!("latest")),
        ["spec.tools[1].agent.version: must be valid semver"]
    );
}

#[test]
fn a_delegation_result_is_summary_or_full() {
    assert_eq!(
        with(|v| delegation(v)["result"] = json!("everything")),
        ["spec.tools[1].agent.result: must be one of summary, full"]
    );
}

// --- Authoring rules that still apply to a snapshot ---------------------------------------------

#[test]
fn metadata_version_is_semver() {
    assert_eq!(
        with(|v| v["metadata"]["version"] = json!("latest")),
        ["metadata.version: must be valid semver"]
    );
}

#[test]
fn secret_names_and_sources_are_checked() {
    assert_eq!(
        with(|v| {
            v["secrets"]["Bad Name"] = json!({"fromEnv": "X"});
            v["secrets"]["other"] = json!({"fromEnv": "1-NOT-ENV"});
            v["spec"]["model"]["secret"] = json!("openai");
        }),
        [
            "secrets.Bad Name: name must match [a-z][a-z0-9_-]*",
            "secrets.other.fromEnv: must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
        ]
    );
}

#[test]
fn model_rules_apply() {
    assert_eq!(
        with(|v| v["spec"]["model"]["provider"] = json!("skynet")),
        [
            "spec.model.provider: unsupported provider \"skynet\"; must be one of anthropic, \
             openai, openai-compatible, stub",
            "spec.model.secret: is required when secrets is set; omit to use the secret named \
             after spec.model.provider, or set secret to a secrets key",
        ]
    );
    assert_eq!(
        with(|v| {
            v["spec"]["model"]["secret"] = json!("anthropic");
            v["spec"]["model"]["base_url"] = json!("https://example.com/v1");
            v["spec"]["model"]["parameters"] = json!({"temperature": 0.2, "top_p": 0.9});
        }),
        [
            "spec.model.secret: must name a key in secrets",
            "spec.model.base_url: must be empty unless provider is openai-compatible",
            "spec.model.parameters: set temperature or top_p, not both",
        ]
    );
}

#[test]
fn wire_names_are_unique_and_well_formed() {
    assert_eq!(
        with(|v| v["spec"]["tools"][1]["as"] = json!("issue_refund")),
        ["spec.tools[1].as: resolves to a duplicate tool name"]
    );
    assert_eq!(
        with(|v| v["spec"]["tools"][0]["as"] = json!("issue refund")),
        ["spec.tools[0].as: must match [a-zA-Z0-9_-]{1,64}"]
    );
    // Without `as`, the name derived from the ref is what must be unique.
    assert_eq!(
        with(|v| {
            let tools = v["spec"]["tools"].as_array_mut().unwrap();
            tools[0].as_object_mut().unwrap().remove("as");
            tools[1]["as"] = json!("payments_issue-refund");
        }),
        ["spec.tools[1].as: resolves to a duplicate tool name"]
    );
}

#[test]
fn compiled_refs_carry_no_constraint() {
    assert_eq!(
        with(|v| v["spec"]["tools"][0]["ref"] = json!("payments.issue-refund@^1.0")),
        [
            "spec.tools[0].ref: must not carry a version constraint in a compiled snapshot (the \
             compiler pins the Tool document's version in version)",
            "spec.policies[0].scope: references undeclared tool ref payments.issue-refund",
        ]
    );
}

#[test]
fn side_effect_classes_are_an_enum() {
    assert_eq!(
        with(|v| v["spec"]["tools"][0]["side_effect_class"] = json!("dangerous")),
        [
            "spec.tools[0].side_effect_class: must be one of read_only, idempotent_write, \
             non_idempotent_write, irreversible_action"
        ]
    );
    assert_eq!(
        with(|v| v["spec"]["tools"][1]["side_effect_class"] = json!("read_only")),
        ["spec.tools[1].side_effect_class: must be non_idempotent_write for agent-backed tools"]
    );
}

#[test]
fn inline_schemas_are_valid_json_schemas() {
    assert_eq!(
        with(|v| {
            v["spec"]["tools"][0]["input_schema"]["inline"]["properties"]["amount"]["type"] =
                json!("money");
        }),
        [
            "spec.tools[0].input_schema.inline.properties.amount.type: invalid JSON Schema: \
             \"money\" is not valid under any of the schemas listed in the 'anyOf' keyword"
        ]
    );
    assert_eq!(
        with(|v| v["spec"]["tools"][0]["input_schema"] = json!({"inline": {}})),
        ["spec.tools[0].input_schema.inline: must be a non-empty JSON Schema object"]
    );
    assert_eq!(
        with(|v| v["output"] = json!({"format": "json", "schema": {"ref": "schemas/out"}})),
        [
            "output.schema: ref and version are resolved by compilation; a compiled snapshot \
             carries the schema inline"
        ]
    );
}

#[test]
fn instructions_are_inline_text() {
    assert_eq!(
        with(|v| v["spec"]["instructions"] = json!({"ref": "prompts/system.md", "text": "x"})),
        [
            "spec.instructions: ref and version are resolved by compilation; a compiled \
             snapshot carries the prompt as text"
        ]
    );
}

#[test]
fn policies_compile_with_the_engine() {
    assert_eq!(
        with(|v| policy(v, 1)["conditions"]["op"] = json!("resembles")),
        [
            "spec.policies[1].conditions.op: unknown operator `resembles`; expected eq (==), \
             neq (!=), gt (>), gte (>=), lt (<), lte (<=), in, not_in, matches, exists, \
             contains, starts_with or ends_with"
        ]
    );
    assert_eq!(
        with(|v| policy(v, 1)["action"] = json!("maybe")),
        [
            "spec.policies[1].action: unknown decision type `maybe`; expected allow, deny, \
             block, require_approval or escalate"
        ]
    );
}

#[test]
fn the_compiled_annotation_is_required() {
    assert_eq!(
        with(|v| v["metadata"]["annotations"] = json!({})),
        [
            "metadata.annotations.phrony.com/policies-compiled: must be \"true\": a compiled \
             snapshot is marked by the compiler; compile the manifest with phrony"
        ]
    );
}

#[test]
fn the_stub_script_travels_with_the_stub_provider_only() {
    let script = r#"{"turns":[[{"type":"completed"}]]}"#;
    let stub = |v: &mut Value| {
        v["spec"]["model"] = json!({"provider": "stub", "name": "scripted"});
        v.as_object_mut().unwrap().remove("secrets");
    };
    assert_eq!(
        with(stub),
        [
            "metadata.annotations.phrony.com/stub-script: is required when provider is stub \
             (the compiler inlines stub-script.json)"
        ]
    );
    assert_eq!(
        with(|v| {
            stub(v);
            v["metadata"]["annotations"]["phrony.com/stub-script"] = json!(script);
        }),
        Vec::<String>::new()
    );
    assert_eq!(
        with(|v| {
            stub(v);
            v["metadata"]["annotations"]["phrony.com/stub-script"] = json!(r#"{"turns":[]}"#);
        }),
        ["metadata.annotations.phrony.com/stub-script: stub script has no turns"]
    );
    assert_eq!(
        with(|v| v["metadata"]["annotations"]["phrony.com/stub-script"] = json!(script)),
        ["metadata.annotations.phrony.com/stub-script: must be empty unless provider is stub"]
    );
}

#[test]
fn authority_boundaries_are_enforced_by_a_policy() {
    let boundary = |v: &mut Value| {
        v["metadata"]["governance"] = json!({"authority_boundaries": ["cfo"]});
    };
    assert_eq!(
        with(boundary),
        [
            "metadata.governance.authority_boundaries: are not enforced: the snapshot has no \
             require_approval policy with scope agent and no conditions, which the compiler \
             adds for them"
        ]
    );
    assert_eq!(
        with(|v| {
            boundary(v);
            v["spec"]["policies"].as_array_mut().unwrap().push(json!({
                "name": "authority-boundary-cfo", "scope": "agent", "action": "require_approval",
                "authority_ref": "cfo", "approvals_required": 1
            }));
        }),
        Vec::<String>::new()
    );
}

#[test]
fn limits_and_output_enums_apply() {
    assert_eq!(
        with(|v| {
            v["spec"]["limits"] =
                json!({"max_tokens_per_run": -1, "max_subagent_depth": -2, "on_limit": "panic"});
            v["output"] = json!({"format": "yaml", "on_invalid": "shrug"});
        }),
        [
            "spec.limits.on_limit: must be one of halt, escalate",
            "spec.limits.max_tokens_per_run: must not be negative (0 or absent means no limit)",
            "spec.limits.max_subagent_depth: must be >= 1",
            "output.format: must be one of text, json",
            "output.on_invalid: must be one of retry, repair, escalate, fail",
        ]
    );
}

#[test]
fn mcp_bindings_name_a_declared_server() {
    assert_eq!(
        with(|v| {
            v["spec"]["tools"][0]["mcp"] = json!({"server": "docs"});
            v["spec"]["tools"][0]
                .as_object_mut()
                .unwrap()
                .remove("version");
        }),
        ["spec.tools[0].mcp.server: references undeclared spec.mcp_servers entry docs"]
    );
}
