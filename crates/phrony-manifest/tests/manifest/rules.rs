//! One fixture per validation rule: agents (§1.11, §1.12 and our stricter rules), Tool documents
//! and Policy documents.

use phrony_manifest::load_agent;

use crate::support::{
    MINIMAL_AGENT, Project, all_diags, assert_matches_expectations, fixture, validated,
    yaml_fixtures,
};

/// Every `agent-rules/*.yaml` is an agent sharing that directory's `tools/`, `policies/`,
/// `prompts/` and `schemas/`.
#[test]
fn agent_rule_fixtures() {
    let dir = fixture("agent-rules");
    for file in yaml_fixtures(&dir) {
        let result = validated(load_agent(&file));
        assert_matches_expectations(&file, &dir, &all_diags(&result));
    }
}

/// Runs a document fixture inside a project with a minimal agent: `subdir` is `tools` or
/// `policies`. Every document of those directories is validated, attached or not.
fn check_document_fixtures(subdir: &str, fixtures: &str) {
    for file in yaml_fixtures(&fixture(fixtures)) {
        let project = Project::new();
        project.write("agent.yaml", MINIMAL_AGENT);
        let name = file.file_name().unwrap().to_str().unwrap();
        let copy = project.copy(&file, &format!("{subdir}/{name}"));
        let dir = project.dir.path().canonicalize().unwrap();
        let result = project.load("agent.yaml");
        // Diagnostics name the copy; compare them with the copy's expectations.
        let diags: Vec<_> = all_diags(&result)
            .into_iter()
            .map(|mut d| {
                if d.file.canonicalize().ok() == copy.canonicalize().ok() {
                    d.file = copy.clone();
                }
                d
            })
            .collect();
        assert_matches_expectations(&copy, &dir, &diags);
        let has_errors = diags.iter().any(|d| d.is_error());
        assert_eq!(
            result.is_err(),
            has_errors,
            "{name}: result and diagnostics disagree"
        );
    }
}

#[test]
fn policy_rule_fixtures() {
    check_document_fixtures("policies", "policy-rules");
}

#[test]
fn tool_rule_fixtures() {
    check_document_fixtures("tools", "tool-rules");
}

#[test]
fn duplicate_tool_and_policy_ids_are_errors() {
    let p = Project::new();
    p.write("agent.yaml", MINIMAL_AGENT);
    let tool = "apiVersion: phrony.com/v1\nkind: Tool\nmetadata: {name: t, namespace: x, version: 1.0.0}\n";
    p.write("tools/a.yaml", tool);
    p.write("tools/b.yml", tool);
    let policy = "apiVersion: phrony.com/v1\nkind: Policy\nmetadata: {name: p, namespace: x, version: 1.0.0}\nspec: {scope: agent, decision: {type: deny}}\n";
    p.write("policies/a.yaml", policy);
    p.write("policies/b.yaml", policy);
    p.write("policies/notes.txt", "not a document");
    let err = p.load("agent.yaml").unwrap_err();
    let lines: Vec<String> = err
        .errors()
        .map(|d| {
            format!(
                "{}:{}:{} {}: {}",
                d.file.file_name().unwrap().to_str().unwrap(),
                d.line,
                d.column,
                d.path,
                d.message.split(" (also").next().unwrap()
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            "b.yml:3:18 metadata.name: duplicate tool logical id x.t",
            "b.yaml:3:18 metadata.name: duplicate policy logical id x.p",
        ]
    );
}

#[test]
fn diagnostics_display_like_a_compiler() {
    let file = fixture("agent-rules/envelope.yaml");
    let err = load_agent(&file).unwrap_err();
    let text = err.to_string();
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "{}:1:13: error: apiVersion: must be phrony.com/v1",
            file.display()
        )
    );
    assert_eq!(text.lines().count(), err.as_slice().len());
    // A file that cannot be read has no position.
    let missing = fixture("agent-rules/does-not-exist.yaml");
    let err = load_agent(&missing).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("{}: error: cannot read file: ", missing.display())),
        "{err}"
    );
}
