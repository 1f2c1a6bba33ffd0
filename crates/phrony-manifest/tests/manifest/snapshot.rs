//! Canonical JSON, content hashes and the stored snapshot form.
//!
//! The hash vectors were computed by this crate after it reproduced, byte for byte, the committed
//! `bundle.lock.json` files of the Go reference runtime's bundle scenarios (checked by hand).

use phrony_manifest::{CompiledAgent, SnapshotError, load_agent, load_bundle};

use crate::support::{Project, fixture};

const REFUND_AGENT_HASH: &str = "72f4ae0b9f2ad05e1c455a0bfb551bb83c121c853c30e99bcbe2bd2ca6de1831";

#[test]
fn the_reference_form_leaves_provenance_out_and_hashes_stably() {
    let agent = load_agent(fixture("refund-agent/agent.yaml"))
        .unwrap()
        .agent;
    let canonical = String::from_utf8(agent.canonical_json()).unwrap();
    assert!(canonical.starts_with(
        r#"{"apiVersion":"phrony.com/v1","kind":"Agent","metadata":{"name":"refund-agent","namespace":"support","version":"0.1.0","annotations":{"phrony.com/policies-compiled":"true"}},"secrets":{"openai":{"fromEnv":"OPENAI_API_KEY"}},"spec":{"purpose":"#
    ));
    assert!(canonical.contains(
        r#"{"name":"refund-hard-limit","scope":"tool:payments.issue-refund","action":"deny","conditions":{"field":"amount","op":"gt","value":5000},"reason":"Refund amount exceeds the absolute ceiling for agent-initiated refunds."}"#
    ));
    assert!(
        !canonical.contains(r#""namespace":"payments""#),
        "provenance is not hashed"
    );
    assert!(canonical.ends_with(r#""output":{"format":"text"}}"#));
    assert_eq!(agent.content_hash(), REFUND_AGENT_HASH);

    let snapshot = String::from_utf8(agent.snapshot_json()).unwrap();
    assert!(snapshot.contains(
        r#""reason":"Refund amount exceeds the absolute ceiling for agent-initiated refunds.","namespace":"payments","version":"1.0.0"}"#
    ));
}

#[test]
fn snapshots_round_trip_byte_for_byte() {
    for path in [
        "refund-agent/agent.yaml",
        "agent-rules/valid.yaml",
        "bundles/desk/specialists/refunds.yaml",
    ] {
        let agent = load_agent(fixture(path));
        let agent = match agent {
            Ok(c) => c.agent,
            // The desk specialist is a bundle member; it compiles standalone too (no spec.agents).
            Err(e) => panic!("{path}: {e}"),
        };
        agent
            .validate()
            .unwrap_or_else(|e| panic!("{path}: the compiled snapshot does not validate:\n{e}"));
        let bytes = agent.snapshot_json();
        let back = CompiledAgent::from_snapshot_json(&bytes).unwrap();
        assert_eq!(back, agent, "{path}");
        assert_eq!(back.snapshot_json(), bytes, "{path}");
        // The reference form reads back too, without provenance.
        let reference = CompiledAgent::from_snapshot_json(&agent.canonical_json()).unwrap();
        assert_eq!(reference.content_hash(), agent.content_hash(), "{path}");
    }
}

#[test]
fn uncompiled_or_unknown_snapshots_are_refused() {
    let agent = load_agent(fixture("refund-agent/agent.yaml"))
        .unwrap()
        .agent;
    let mut uncompiled = agent.clone();
    uncompiled.metadata.annotations.clear();
    let err = CompiledAgent::from_snapshot_json(&uncompiled.snapshot_json()).unwrap_err();
    assert!(matches!(err, SnapshotError::NotCompiled(_)), "{err}");
    let text = String::from_utf8(agent.snapshot_json()).unwrap();
    let extra = text.replacen(r#""purpose":"#, r#""hitl":{},"purpose":"#, 1);
    let err = CompiledAgent::from_snapshot_json(extra.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("unknown field `hitl`"), "{err}");
    assert!(CompiledAgent::from_snapshot_json(b"[]").is_err());
}

#[test]
fn go_escaping_and_float_formatting_are_part_of_the_hash() {
    let p = Project::new();
    p.write(
        "agent.yaml",
        "apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: esc
  namespace: demo
  version: v1
  labels: {z: last, a: first}
spec:
  purpose: Compare <a> & <b>.
  instructions: {text: \"line\\u2028sep\"}
  model:
    provider: openai
    name: gpt-4o
    parameters: {temperature: 1.0, top_p: ~}
    provider_options: {big: 1e21, small: 0.0000001, int: 10, nested: {b: 2, a: 1}}
  tools:
    - ref: x.y
      input_schema: {inline: {type: object, properties: {n: {type: number, maximum: 2.50}}}}
",
    );
    let compiled = p.load("agent.yaml").unwrap();
    let json = String::from_utf8(compiled.agent.canonical_json()).unwrap();
    for want in [
        r#""labels":{"a":"first","z":"last"}"#,
        r#""purpose":"Compare \u003ca\u003e \u0026 \u003cb\u003e.""#,
        r#""text":"line\u2028sep""#,
        r#""parameters":{"temperature":1}"#,
        r#""provider_options":{"big":1e+21,"int":10,"nested":{"a":1,"b":2},"small":1e-7}"#,
        r#""properties":{"n":{"maximum":2.5,"type":"number"}}"#,
    ] {
        assert!(json.contains(want), "{want} not in {json}");
    }
    assert_eq!(
        compiled.agent.content_hash(),
        "c3f7815518b26b5bd680643f7e87c2772c04089753560369ed1f3356a4a6fbe7"
    );
}

#[test]
fn allow_field_changes_the_hash_but_provenance_does_not() {
    let agent = load_agent(fixture("agent-rules/valid.yaml")).unwrap().agent;
    let mut other = agent.clone();
    let usd = other
        .spec
        .policies
        .iter_mut()
        .find(|p| p.name == "usd-only")
        .unwrap();
    usd.version = "9.9.9".into();
    usd.namespace = "elsewhere".into();
    assert_eq!(other.content_hash(), agent.content_hash());
    let usd = other
        .spec
        .policies
        .iter_mut()
        .find(|p| p.name == "usd-only")
        .unwrap();
    usd.allow_field = "payee.currency".into();
    assert_ne!(other.content_hash(), agent.content_hash());
}

#[test]
fn bundle_members_validate_once_bundle_publish_has_pinned_their_delegations() {
    let bundle = load_bundle(fixture("bundles/desk/bundle.yaml")).unwrap();
    let member = |child: &str| {
        let m = bundle
            .members
            .iter()
            .find(|m| m.child_name == child)
            .unwrap();
        m.vendored.as_ref().unwrap().1.clone()
    };
    let specialist = member("refund-specialist");
    specialist.validate().unwrap();

    // The local delegation names its target by path until bundle publish pins it.
    let mut front_desk = member("front-desk");
    let problems: Vec<String> = front_desk
        .validate()
        .unwrap_err()
        .errors()
        .map(phrony_manifest::Diagnostic::summary)
        .collect();
    assert_eq!(
        problems,
        [
            "spec.tools[0].agent.namespace: is required",
            "spec.tools[0].agent.name: is required",
            "spec.tools[0].agent: delegation target must be pinned (version or agent_version_id) \
             unless late_bound is true",
        ]
    );
    let target = front_desk.spec.tools[0].agent.as_mut().unwrap();
    target.namespace.clone_from(&specialist.metadata.namespace);
    target.name.clone_from(&specialist.metadata.name);
    target.agent_version_id = "4a0f3c1e-7d7b-4a53-9d9a-4f3b8a1e2c10".to_owned();
    front_desk.validate().unwrap();
}

/// Publish re-validates the snapshot with the same name rule as the authoring validator and
/// the ledger: a hand-made snapshot with a control character in its name is refused before the
/// ledger sees it.
#[test]
fn snapshots_with_names_the_runtime_refuses_do_not_validate() {
    let agent = load_agent(fixture("refund-agent/agent.yaml"))
        .unwrap()
        .agent;
    let mut bad = agent.clone();
    bad.metadata.name = "refund\u{1b}]0;pwned\u{7}".to_owned();
    bad.metadata.namespace = "a/b".to_owned();
    let bytes = bad.snapshot_json();
    let parsed = CompiledAgent::from_snapshot_json(&bytes).unwrap();
    let problems: Vec<String> = parsed
        .validate()
        .unwrap_err()
        .errors()
        .map(phrony_manifest::Diagnostic::summary)
        .collect();
    assert_eq!(
        problems,
        [
            "metadata.namespace: must not contain '/' ('/' at byte 1)",
            "metadata.name: must not contain control characters (U+001B at byte 6)",
        ]
    );
}

/// Fuzz finding (`snapshot_json`, 10-minute run): the snapshot's canonical form must be a fixed
/// point, or a compiled snapshot's content hash changes the next time it is read and written.
/// Two ways it was not: a float written with trailing zeros (`50.00`) read as a float, was written
/// as `50` and read back as an integer; and an inline schema with unsorted keys read back with
/// its keys in another order.
#[test]
fn a_snapshot_read_and_written_again_is_a_fixed_point() {
    let refund = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus/snapshot_json/refund-ce2b1c6cef0029f5"),
    )
    .unwrap();
    let found = refund
        .replacen(r#""value":5000"#, r#""value":50.00"#, 1)
        .replacen(
            r#""properties":{"#,
            r#""ordel":{"provider":"openai","name":"gpting"},"properties":{"#,
            1,
        );
    assert_ne!(found, refund, "the corpus file changed; update the edits");
    for (what, input) in [
        ("the fuzz finding", found.as_str()),
        ("the corpus", &refund),
    ] {
        let first = CompiledAgent::from_snapshot_json(input.as_bytes()).unwrap();
        let written = first.snapshot_json();
        let second = CompiledAgent::from_snapshot_json(&written).unwrap();
        assert_eq!(second, first, "{what}: the round trip changed the agent");
        assert_eq!(second.snapshot_json(), written, "{what}: not a fixed point");
        assert_eq!(second.content_hash(), first.content_hash(), "{what}");
    }
    // Integral floats and integers are one number, as in the reference runtime (Go reads every
    // JSON number as a float64): `50.00`, `50.0` and `50` hash alike.
    let hash = |value: &str| {
        CompiledAgent::from_snapshot_json(refund.replacen("5000", value, 1).as_bytes())
            .unwrap()
            .content_hash()
    };
    assert_eq!(hash("50.00"), hash("50"));
    assert_eq!(hash("50.0"), hash("50"));
    assert_ne!(hash("50.5"), hash("50"));
}
