//! `stub-script.json` parsing (§1.7) and its inlining by the compiler.

use phrony_manifest::{ANNOTATION_STUB_SCRIPT, StubEvent, StubScript};
use serde_json::json;

use crate::support::{Project, fixture};

fn parse(name: &str) -> Result<StubScript, String> {
    let text = std::fs::read_to_string(fixture(&format!("stub/{name}"))).unwrap();
    StubScript::parse(&text).map_err(|e| e.to_string())
}

#[test]
fn invalid_scripts_are_refused_with_the_turn_and_event() {
    let cases = [
        ("empty.json", "stub-script.json is empty"),
        (
            "not-json.json",
            "stub-script.json: invalid JSON: EOF while parsing a list at line 1 column 11",
        ),
        ("no-turns.json", "stub script has no turns"),
        ("missing-turns.json", "stub script has no turns"),
        (
            "empty-turn.json",
            "stub script turn 2: a turn needs at least one event",
        ),
        (
            "unknown-type.json",
            "stub script turn 1: event 2: unknown event type \"thinking\"; expected text_delta, \
             tool_call, completed or failed",
        ),
        (
            "tool-call-no-name.json",
            "stub script turn 1: event 1: tool_call needs a name (the tool's wire name)",
        ),
        (
            "tool-call-args.json",
            "stub script turn 1: event 1: tool_call args must be an object",
        ),
        (
            "turn-not-list.json",
            "stub script turn 1: a turn must be a list of events",
        ),
    ];
    for (file, want) in cases {
        assert_eq!(parse(file).unwrap_err(), want, "{file}");
    }
}

#[test]
fn events_are_parsed_with_defaults_and_normalized_stop_reasons() {
    let script = parse("valid.json").unwrap();
    assert_eq!(
        script.turns,
        vec![
            vec![
                StubEvent::ToolCall {
                    name: "pay".into(),
                    args: json!({})
                },
                StubEvent::Completed {
                    stop_reason: "tool_use".into()
                },
            ],
            vec![
                StubEvent::TextDelta {
                    text: "Paid.".into()
                },
                StubEvent::Completed {
                    stop_reason: "max_tokens".into()
                },
            ],
            vec![StubEvent::Failed {
                error: "stub failed".into()
            }],
            vec![
                StubEvent::Completed {
                    stop_reason: "end_turn".into()
                },
                StubEvent::Completed {
                    stop_reason: "end_turn".into()
                },
                StubEvent::Failed {
                    error: "boom".into()
                },
            ],
        ]
    );
    assert_eq!(script.tool_names(), ["pay"]);
}

const STUB_AGENT: &str = "\
apiVersion: phrony.com/v1
kind: Agent
metadata: {name: s, namespace: demo, version: 1.0.0}
spec:
  purpose: Scripted.
  instructions: {text: hi}
  model: {provider: stub, name: scripted}
";

#[test]
fn the_compiler_inlines_the_raw_script_and_refuses_bad_ones() {
    let p = Project::new();
    p.write("agent.yaml", STUB_AGENT);
    let err = p.load("agent.yaml").unwrap_err();
    let d = err.errors().next().unwrap();
    assert_eq!(
        (d.line, d.column, d.path.as_str()),
        (7, 21, "spec.model.provider")
    );
    assert!(
        d.message.starts_with("read stub-script.json: "),
        "{}",
        d.message
    );

    p.write("stub-script.json", "");
    let err = p.load("agent.yaml").unwrap_err();
    assert!(
        err.to_string()
            .ends_with("stub-script.json: stub-script.json is empty"),
        "{err}"
    );

    p.write("stub-script.json", r#"{"turns": [[{"type": "nope"}]]}"#);
    let err = p.load("agent.yaml").unwrap_err();
    assert!(
        err.to_string()
            .contains("stub script turn 1: event 1: unknown event type"),
        "{err}"
    );

    let raw = "{\"turns\": [[{\"type\": \"tool_call\", \"name\": \"ghost\"}]]}\n";
    p.write("stub-script.json", raw);
    let compiled = p.load("agent.yaml").unwrap();
    assert_eq!(
        compiled.agent.metadata.annotations[ANNOTATION_STUB_SCRIPT], raw,
        "raw text, untrimmed"
    );
    let warnings: Vec<_> = compiled
        .warnings
        .iter()
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(
        warnings,
        ["stub-script.json calls tool \"ghost\", which the agent does not bind"]
    );
}
