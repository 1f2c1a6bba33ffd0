//! The policy analysis ([`phrony_manifest::Finding`]), driven by the agent projects under
//! `tests/fixtures/analysis/`: each holds an `expected.txt` with every finding, one
//! `file:line:column kind path: message` line each (file relative to the project, the project's
//! directory written `<dir>` in messages), followed by an indented `example: <json>` line when
//! the finding has an example call. An empty `expected.txt` asserts that there is no finding.
//! Every agent of `policies-examples/` must produce no finding (no false positives).

use std::path::{Path, PathBuf};

use phrony_manifest::{Finding, load_agent};

use crate::support::fixture;

fn render(f: &Finding, dir: &Path) -> String {
    let d = &f.diagnostic;
    let file = d.file.strip_prefix(dir).unwrap_or(&d.file).display();
    let message = d.message.replace(&dir.display().to_string(), "<dir>");
    let mut line = format!(
        "{file}:{}:{} {} {}: {message}",
        d.line, d.column, f.kind, d.path
    );
    if let Some(example) = &f.example {
        line.push_str(&format!("\n  example: {example}"));
    }
    line
}

fn findings_of(agent: &Path) -> Vec<Finding> {
    match load_agent(agent) {
        Ok(compiled) => compiled.findings,
        Err(diags) => panic!("{} does not compile:\n{diags}", agent.display()),
    }
}

#[test]
fn every_fixture_reports_exactly_its_expected_findings() {
    let root = fixture("analysis");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("agent.yaml").is_file())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 6,
        "fixtures missing under {}",
        root.display()
    );
    let mut failures = Vec::new();
    for dir in &cases {
        let compiled = load_agent(dir.join("agent.yaml")).unwrap();
        assert!(
            compiled.warnings.is_empty(),
            "{}: fixture has load warnings: {:?}",
            dir.display(),
            compiled.warnings
        );
        let dir = dir.canonicalize().unwrap();
        let actual: Vec<String> = compiled.findings.iter().map(|f| render(f, &dir)).collect();
        let actual = actual.join("\n");
        let expected = std::fs::read_to_string(dir.join("expected.txt")).unwrap_or_default();
        if actual.trim() != expected.trim() {
            failures.push(format!(
                "{}:\n--- expected\n{}\n--- actual\n{actual}\n",
                dir.display(),
                expected.trim()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn findings_are_warnings_with_positions() {
    let findings = findings_of(&fixture("analysis/schema/agent.yaml"));
    assert!(!findings.is_empty());
    for f in &findings {
        assert!(!f.diagnostic.is_error(), "{f}");
        assert!(f.diagnostic.line > 0 && f.diagnostic.column > 0, "{f}");
        let json = f.to_json();
        assert_eq!(json["kind"], f.kind.as_str());
        assert_eq!(json["line"], f.diagnostic.line);
    }
}

#[test]
fn the_policy_examples_have_no_findings() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples");
    let mut agents = Vec::new();
    for entry in std::fs::read_dir(&examples).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("bundle.yaml").is_file() {
            // A bundle's root delegates (it compiles only in its bundle); its members stand alone.
            for member in std::fs::read_dir(dir.join("specialists")).unwrap() {
                let path = member.unwrap().path();
                if path.extension().is_some_and(|e| e == "yaml") {
                    agents.push(path);
                }
            }
        } else if dir.join("agent.yaml").is_file() {
            agents.push(dir.join("agent.yaml"));
        }
    }
    assert!(agents.len() >= 6, "examples missing: {agents:?}");
    for agent in agents {
        let findings = findings_of(&agent);
        assert!(
            findings.is_empty(),
            "{}: unexpected findings:\n{}",
            agent.display(),
            findings
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
