//! Tool argument validation against a binding's `input_schema`.

use phrony_manifest::{ArgError, ToolArgsValidator, ToolBinding, load_agent};
use serde_json::json;

use crate::support::fixture;

fn refund_binding(wire: &str) -> ToolBinding {
    let agent = load_agent(fixture("refund-agent/agent.yaml"))
        .unwrap()
        .agent;
    agent.tool_by_wire_name(wire).unwrap().clone()
}

#[test]
fn arguments_are_checked_against_the_binding_schema() {
    let v = ToolArgsValidator::for_binding(&refund_binding("issue_refund")).unwrap();
    assert_eq!(
        v.validate(&json!({"order_id": "ORD-1", "amount": 400, "currency": "EUR"})),
        Ok(())
    );
    let errors = v
        .validate(&json!({"order_id": 7, "amount": "400"}))
        .unwrap_err();
    let mut got: Vec<String> = errors.iter().map(ToString::to_string).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "\"currency\" is a required property",
            "/amount: \"400\" is not of type \"number\"",
            "/order_id: 7 is not of type \"string\"",
        ]
    );
    assert!(errors.contains(&ArgError {
        path: "/amount".into(),
        message: "\"400\" is not of type \"number\"".into()
    }));
}

#[test]
fn bindings_without_a_schema_accept_any_object() {
    let binding = ToolBinding {
        reference: "x.y".into(),
        ..ToolBinding::default()
    };
    let v = ToolArgsValidator::for_binding(&binding).unwrap();
    assert_eq!(v.validate(&json!({"anything": [1, 2]})), Ok(()));
    assert_eq!(
        v.validate(&json!([1])).unwrap_err()[0].message,
        "[1] is not of type \"object\""
    );
}

#[test]
fn invalid_schemas_are_refused() {
    let err = ToolArgsValidator::new(&json!({"type": "objekt"})).unwrap_err();
    assert!(err.starts_with("type: invalid JSON Schema: "), "{err}");
    let err =
        ToolArgsValidator::new(&json!({"$ref": "https://example.com/remote.json"})).unwrap_err();
    assert!(err.contains("https://example.com/remote.json"), "{err}");
    assert!(ToolArgsValidator::new(&json!(["not", "an", "object"])).is_err());
}
