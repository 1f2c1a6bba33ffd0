//! Tool descriptor pins: a Tool file's pin is its binding's pin in the compiled snapshot, does
//! not depend on how the YAML is written, and changes with what the model is told.

use phrony_manifest::{PIN_PREFIX, ToolPin, descriptor_pin, tool_descriptor_pin};

use crate::support::Project;

const TOOL: &str = "\
apiVersion: phrony.com/v1
kind: Tool
metadata:
  name: issue-refund
  namespace: payments
  version: 1.0.0
spec:
  description: Issue a refund to the customer's original payment method.
  side_effect_class: irreversible_action
  input_schema:
    inline:
      type: object
      properties:
        order_id:
          type: string
        amount:
          type: number
      required: [order_id, amount]
";

/// The same document: keys reordered, flow style, other whitespace, a comment, a float `1.0`
/// that is the integer 1.
const TOOL_REWRITTEN: &str = "\
# the same tool, written differently
kind: Tool
spec:
  input_schema: {inline: {required: [order_id, amount], properties: {amount: {type: number}, order_id: {type: string}}, type: object}}
  side_effect_class:   irreversible_action
  description: \"Issue a refund to the customer's original payment method.\"
metadata: {version: 1.0.0, namespace: payments, name: issue-refund}
apiVersion: phrony.com/v1
";

const AGENT: &str = "\
apiVersion: phrony.com/v1
kind: Agent
metadata: {name: refunds, namespace: support, version: 0.1.0}
spec:
  purpose: Refunds.
  instructions: {text: Help.}
  model: {provider: openai, name: gpt-4o}
  tools:
    - ref: payments.issue-refund
      as: issue_refund
";

fn pin_of(project: &Project, text: &str) -> ToolPin {
    let path = project.write("tools/payments.issue-refund.yaml", text);
    tool_descriptor_pin(&path).unwrap()
}

#[test]
fn a_tool_files_pin_is_its_bindings_pin_in_the_snapshot() {
    let project = Project::new();
    let file = pin_of(&project, TOOL);
    assert_eq!(
        (file.tool.as_str(), file.version.as_str()),
        ("payments.issue-refund", "1.0.0")
    );
    assert!(file.pin.starts_with(PIN_PREFIX), "{}", file.pin);
    project.write("agent.yaml", AGENT);
    let compiled = project.load("agent.yaml").unwrap().agent;
    assert_eq!(compiled.tool_pins(), vec![file.clone()]);
    // The snapshot carries no pin: it is computed from what it already holds.
    assert!(!String::from_utf8_lossy(&compiled.snapshot_json()).contains(&file.pin));
    // Read back from the published bytes, the same pin.
    let read =
        phrony_manifest::CompiledAgent::from_snapshot_json(&compiled.snapshot_json()).unwrap();
    assert_eq!(read.tool_pins(), vec![file]);
}

#[test]
fn the_pin_does_not_depend_on_yaml_key_order_or_whitespace() {
    let project = Project::new();
    let a = pin_of(&project, TOOL);
    let b = pin_of(&project, TOOL_REWRITTEN);
    assert_eq!(a, b);
}

#[test]
fn the_pin_changes_with_description_schema_or_version() {
    let project = Project::new();
    let base = pin_of(&project, TOOL).pin;
    let changes = [
        TOOL.replace("original payment method.", "original payment method!"),
        TOOL.replace("version: 1.0.0", "version: 1.0.1"),
        TOOL.replace("type: number", "type: integer"),
        TOOL.replace("required: [order_id, amount]", "required: [order_id]"),
    ];
    for changed in changes {
        assert_ne!(pin_of(&project, &changed).pin, base, "{changed}");
    }
}

#[test]
fn a_binding_that_overrides_the_description_has_the_pin_of_what_the_model_sees() {
    let project = Project::new();
    let file = pin_of(&project, TOOL);
    project.write(
        "agent.yaml",
        &AGENT.replace(
            "      as: issue_refund\n",
            "      as: issue_refund\n      description: Refund an order.\n",
        ),
    );
    let compiled = project.load("agent.yaml").unwrap().agent;
    let pins = compiled.tool_pins();
    assert_eq!(pins.len(), 1);
    assert_ne!(pins[0].pin, file.pin);
    let schema = compiled.spec.tools[0]
        .input_schema
        .as_ref()
        .and_then(|s| s.inline.as_ref());
    assert_eq!(
        pins[0].pin,
        descriptor_pin("payments.issue-refund", "1.0.0", "Refund an order.", schema)
    );
}

#[test]
fn a_schema_ref_resolves_from_the_parent_of_tools() {
    let project = Project::new();
    let inline = pin_of(&project, TOOL);
    project.write(
        "schemas/refund.json",
        r#"{"type":"object","properties":{"order_id":{"type":"string"},"amount":{"type":"number"}},"required":["order_id","amount"]}"#,
    );
    let by_ref = TOOL.replace(
        "  input_schema:\n    inline:\n      type: object\n      properties:\n        order_id:\n          type: string\n        amount:\n          type: number\n      required: [order_id, amount]\n",
        "  input_schema:\n    ref: schemas/refund.json\n",
    );
    assert_ne!(by_ref, TOOL);
    assert_eq!(pin_of(&project, &by_ref), inline);
}

#[test]
fn a_file_that_is_not_a_valid_tool_is_refused_with_its_position() {
    let project = Project::new();
    let path = project.write("tools/x.yaml", &TOOL.replace("kind: Tool", "kind: Policy"));
    let err = tool_descriptor_pin(&path).unwrap_err().to_string();
    assert!(err.contains("expected kind Tool"), "{err}");
    let path = project.write(
        "tools/y.yaml",
        &TOOL.replace(
            "side_effect_class: irreversible_action",
            "side_effect_class: maybe",
        ),
    );
    let err = tool_descriptor_pin(&path).unwrap_err().to_string();
    assert!(err.contains("spec.side_effect_class"), "{err}");
    let err = tool_descriptor_pin(project.path("tools/missing.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.yaml"), "{err}");
}
