//! The authoring JSON Schema (`bins/cli/schema/agent-spec.v1.json`, printed by `phrony schema`) stays
//! in sync with the format: every example document validates, and typical mistakes are rejected.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::path::PathBuf;

use serde_json::Value;
use tests::{example_dirs, examples_dir, workspace_root, yaml_files, yaml_to_json};

fn schema_path() -> PathBuf {
    workspace_root().join("bins/cli/schema/agent-spec.v1.json")
}

fn schema() -> Value {
    let text = std::fs::read_to_string(schema_path()).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft7::new(&schema()).unwrap()
}

/// The schema's error messages for `doc`, empty when it is valid.
fn errors(validator: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    validator
        .iter_errors(doc)
        .map(|err| format!("{}: {err}", err.instance_path()))
        .collect()
}

#[test]
fn schema_is_a_valid_draft_07_schema() {
    let schema = schema();
    if let Err(err) = jsonschema::draft7::meta::validate(&schema) {
        panic!(
            "{} is not a draft-07 schema: {err}",
            schema_path().display()
        );
    }
}

#[test]
fn every_example_document_validates() {
    let validator = validator();
    let mut failures = Vec::new();
    let mut checked = 0;
    // Agent projects only (directories with an agent.yaml): `regent-walkthrough/` holds a
    // mock-gate configuration, not Agent Spec documents.
    for path in example_dirs().iter().flat_map(|dir| yaml_files(dir)) {
        if path.file_name().is_some_and(|name| name == "cases.yaml") {
            continue;
        }
        let doc = yaml_to_json(&path).unwrap();
        checked += 1;
        for error in errors(&validator, &doc) {
            failures.push(format!("{}: {error}", path.display()));
        }
    }
    assert!(checked >= 10, "only {checked} example documents found");
    assert!(
        failures.is_empty(),
        "schema rejects example documents:\n{}",
        failures.join("\n")
    );
}

#[test]
fn scaffolded_agent_points_editors_at_the_schema() {
    let id = schema()["$id"].as_str().unwrap().to_owned();
    let agent = std::fs::read_to_string(examples_dir().join("refund-agent/agent.yaml")).unwrap();
    let first = agent.lines().next().unwrap();
    assert_eq!(first, format!("# yaml-language-server: $schema={id}"));
}

const AGENT: &str = r"
apiVersion: phrony.com/v1
kind: Agent
metadata: {name: a, namespace: n, version: 1.0.0}
secrets:
  openai: {fromEnv: OPENAI_API_KEY}
spec:
  purpose: test
  instructions: {text: hi}
  model: {provider: openai, name: gpt-4o}
  tools:
    - ref: payments.issue-refund
      as: issue_refund
      policies: [{ref: policies/p.yaml}]
output: {format: text}
";

const TOOL: &str = r"
apiVersion: phrony.com/v1
kind: Tool
metadata: {name: issue-refund, namespace: payments, version: 1.0.0}
spec:
  side_effect_class: irreversible_action
  input_schema: {inline: {type: object}}
";

const POLICY: &str = r"
apiVersion: phrony.com/v1
kind: Policy
metadata: {name: p, namespace: n, version: 1.0.0}
spec:
  conditions: {field: amount, op: gt, value: 250}
  decision: {type: require_approval, approvals_required: 2, on_reject: return_to_agent}
";

const BUNDLE: &str = r"
apiVersion: phrony.com/v1
kind: Bundle
metadata: {name: desk, namespace: n, version: 1.0.0}
spec: {root: ./orchestrator.yaml}
";

/// Applies `edit` to a copy of the YAML document `base`.
fn edited<R>(base: &str, edit: impl FnOnce(&mut Value) -> R) -> Value {
    let mut doc: Value = serde_yaml::from_str(base).unwrap();
    edit(&mut doc);
    doc
}

#[test]
fn the_base_documents_of_the_rejection_cases_are_valid() {
    let validator = validator();
    for base in [AGENT, TOOL, POLICY, BUNDLE] {
        let doc: Value = serde_yaml::from_str(base).unwrap();
        assert_eq!(errors(&validator, &doc), Vec::<String>::new(), "{base}");
    }
}

#[test]
fn typical_mistakes_are_rejected() {
    use serde_json::json;
    let cases: Vec<(&str, Value)> = vec![
        (
            "wrong apiVersion",
            edited(AGENT, |d| d["apiVersion"] = json!("phrony.com/v2")),
        ),
        (
            "unknown kind",
            edited(AGENT, |d| d["kind"] = json!("Connection")),
        ),
        (
            "agent without metadata.version",
            edited(AGENT, |d| remove(&mut d["metadata"], "version")),
        ),
        (
            "version is not semver",
            edited(AGENT, |d| d["metadata"]["version"] = json!("latest")),
        ),
        (
            "inline spec.policies",
            edited(AGENT, |d| d["spec"]["policies"] = json!([{"name": "x"}])),
        ),
        (
            "spec.hitl",
            edited(AGENT, |d| d["spec"]["hitl"] = json!({"required": true})),
        ),
        (
            "version on a binding",
            edited(AGENT, |d| d["spec"]["tools"][0]["version"] = json!("1")),
        ),
        (
            "bad wire name",
            edited(AGENT, |d| {
                d["spec"]["tools"][0]["as"] = json!("issue refund")
            }),
        ),
        (
            "bad side_effect_class",
            edited(AGENT, |d| {
                d["spec"]["tools"][0]["side_effect_class"] = json!("destructive")
            }),
        ),
        (
            "instructions with text and ref",
            edited(AGENT, |d| {
                d["spec"]["instructions"]["ref"] = json!("prompts/system.md")
            }),
        ),
        (
            "absolute ref",
            edited(AGENT, |d| {
                d["spec"]["instructions"] = json!({"ref": "/etc/x"})
            }),
        ),
        (
            "escaping ref",
            edited(AGENT, |d| {
                d["spec"]["instructions"] = json!({"ref": "../x.md"})
            }),
        ),
        (
            "unsupported provider",
            edited(AGENT, |d| d["spec"]["model"]["provider"] = json!("gemini")),
        ),
        (
            "base_url without openai-compatible",
            edited(AGENT, |d| {
                d["spec"]["model"]["base_url"] = json!("https://x.example/v1")
            }),
        ),
        (
            "openai-compatible without base_url",
            edited(AGENT, |d| {
                d["spec"]["model"]["provider"] = json!("openai-compatible")
            }),
        ),
        (
            "temperature and top_p",
            edited(AGENT, |d| {
                d["spec"]["model"]["parameters"] = json!({"temperature": 0.2, "top_p": 0.9});
            }),
        ),
        (
            "secret with a value",
            edited(AGENT, |d| d["secrets"]["openai"]["value"] = json!("sk-1")),
        ),
        (
            "bad secret name",
            edited(AGENT, |d| d["secrets"]["OpenAI"] = json!({"fromEnv": "K"})),
        ),
        (
            "bad output format",
            edited(AGENT, |d| d["output"]["format"] = json!("xml")),
        ),
        (
            "max_subagent_depth 0",
            edited(AGENT, |d| {
                d["spec"]["limits"] = json!({"max_subagent_depth": 0})
            }),
        ),
        (
            "binding timeout in words",
            edited(AGENT, |d| {
                d["spec"]["tools"][0]["timeout"] = json!("30 seconds")
            }),
        ),
        (
            "tool timeout of 0",
            edited(TOOL, |d| d["spec"]["timeout"] = json!(0)),
        ),
        (
            "tool typo",
            edited(TOOL, |d| d["spec"]["side_efect_class"] = json!("read_only")),
        ),
        (
            "schema with ref and inline",
            edited(TOOL, |d| d["spec"]["input_schema"]["ref"] = json!("s")),
        ),
        (
            "policy typo condition:",
            edited(POLICY, |d| {
                let conditions = remove(&mut d["spec"], "conditions");
                d["spec"]["condition"] = conditions;
            }),
        ),
        (
            "unknown decision type",
            edited(POLICY, |d| d["spec"]["decision"]["type"] = json!("maybe")),
        ),
        (
            "unknown on_reject",
            edited(POLICY, |d| {
                d["spec"]["decision"]["on_reject"] = json!("retry")
            }),
        ),
        (
            "unknown on_modify",
            edited(POLICY, |d| {
                d["spec"]["decision"]["on_modify"] = json!("ignore")
            }),
        ),
        (
            "unknown timeout default",
            edited(POLICY, |d| {
                d["spec"]["decision"]["timeout"] = json!({"after_minutes": 5, "default": "retry"});
            }),
        ),
        (
            "quorum 0",
            edited(POLICY, |d| {
                d["spec"]["decision"]["approvals_required"] = json!(0)
            }),
        ),
        (
            "unknown op",
            edited(POLICY, |d| d["spec"]["conditions"]["op"] = json!("between")),
        ),
        (
            "in with a scalar",
            edited(POLICY, |d| {
                d["spec"]["conditions"] = json!({"field": "c", "op": "in", "value": "EUR"})
            }),
        ),
        (
            "in with an empty list",
            edited(POLICY, |d| {
                d["spec"]["conditions"] = json!({"field": "c", "op": "in", "value": []})
            }),
        ),
        (
            "starts_with a blank",
            edited(POLICY, |d| {
                d["spec"]["conditions"] = json!({"field": "c", "op": "starts_with", "value": " "})
            }),
        ),
        (
            "exists with a string",
            edited(POLICY, |d| {
                d["spec"]["conditions"] = json!({"field": "c", "op": "exists", "value": "yes"})
            }),
        ),
        (
            "eq with an object",
            edited(POLICY, |d| {
                d["spec"]["conditions"] = json!({"field": "c", "op": "eq", "value": {"a": 1}})
            }),
        ),
        (
            "gt without value",
            edited(POLICY, |d| {
                d["spec"]["conditions"] = json!({"field": "amount", "op": "gt"})
            }),
        ),
        (
            "leaf without field",
            edited(POLICY, |d| {
                d["spec"]["conditions"] = json!({"op": "gt", "value": 1})
            }),
        ),
        (
            "all with a leaf key",
            edited(POLICY, |d| {
                d["spec"]["conditions"] = json!({"all": [], "field": "x"})
            }),
        ),
        (
            "decision without scope, conditions or allow",
            edited(POLICY, |d| {
                d["spec"] = json!({"decision": {"type": "deny"}})
            }),
        ),
        (
            "bad scope",
            edited(POLICY, |d| d["spec"]["scope"] = json!("tools:payments.x")),
        ),
        (
            "allow list with a deny decision",
            edited(POLICY, |d| d["spec"]["allow"] = json!(["EUR"])),
        ),
        (
            "policy without decision",
            edited(POLICY, |d| remove(&mut d["spec"], "decision")),
        ),
        (
            "bundle with absolute root",
            edited(BUNDLE, |d| d["spec"]["root"] = json!("/x.yaml")),
        ),
        (
            "bundle without root",
            edited(BUNDLE, |d| d["spec"] = json!({})),
        ),
    ];
    let validator = validator();
    let accepted: Vec<&str> = cases
        .iter()
        .filter(|(_, doc)| validator.is_valid(doc))
        .map(|(name, _)| *name)
        .collect();
    assert!(
        accepted.is_empty(),
        "the schema accepts invalid documents: {accepted:?}"
    );
}

/// Removes `key` from the object `doc`, returning its value.
fn remove(doc: &mut Value, key: &str) -> Value {
    doc.as_object_mut().and_then(|map| map.remove(key)).unwrap()
}

/// The schema accepts the `timeout` spellings the manifest validator accepts.
#[test]
fn tool_timeouts_in_the_validators_spellings_are_valid() {
    use serde_json::json;
    let validator = validator();
    for value in [
        json!("30s"),
        json!("1m30s"),
        json!("500ms"),
        json!("2h"),
        json!(45),
    ] {
        let binding = edited(AGENT, |d| d["spec"]["tools"][0]["timeout"] = value.clone());
        assert_eq!(
            errors(&validator, &binding),
            Vec::<String>::new(),
            "{value}"
        );
        let tool = edited(TOOL, |d| d["spec"]["timeout"] = value.clone());
        assert_eq!(errors(&validator, &tool), Vec::<String>::new(), "{value}");
    }
}
