//! The `phrony` binary as a process: outputs, exit codes and files, on the tutorial's project and
//! on broken manifests and bundles written into temporary directories.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::fs;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;
use predicates::str::contains;
use serde_json::Value;
use tempfile::TempDir;

/// The files `phrony init` writes, relative to the project directory.
const SCAFFOLD: [&str; 6] = [
    "agent.yaml",
    "tools/orders.lookup-order.yaml",
    "tools/payments.issue-refund.yaml",
    "policies/refund-approval-boundary.yaml",
    "policies/refund-hard-limit.yaml",
    "worker.py",
];

fn phrony() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_phrony"));
    cmd.env_remove("PHRONY_RUNTIME_ADDR").env("NO_COLOR", "1");
    cmd
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn refund_example() -> PathBuf {
    repo_root().join("policies-examples/refund-agent")
}

fn stdout_of(cmd: &mut Command) -> String {
    let output = cmd.output().unwrap();
    assert!(
        output.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn write(dir: &Path, rel: &str, text: &str) -> PathBuf {
    let path = dir.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, text).unwrap();
    path
}

// ---------------------------------------------------------------------------------------------
// Global behaviour

#[test]
fn version_prints_phrony_version() {
    let expected = format!("phrony version {}\n", env!("CARGO_PKG_VERSION"));
    phrony()
        .arg("--version")
        .assert()
        .success()
        .stdout(expected.clone());
    phrony().arg("-v").assert().success().stdout(expected);
}

#[test]
fn help_documents_the_exit_codes() {
    phrony()
        .arg("--help")
        .assert()
        .success()
        .stdout(contains("Exit codes:"))
        .stdout(contains("2  usage error"));
}

#[test]
fn usage_errors_exit_with_2() {
    phrony().arg("frobnicate").assert().code(2);
    phrony().args(["agents", "validate"]).assert().code(2);
    phrony()
        .args(["policies", "check", "agent.yaml", "--output", "yaml"])
        .assert()
        .code(2);
}

#[test]
fn schema_prints_the_authoring_json_schema() {
    let out = stdout_of(phrony().arg("schema"));
    let printed: Value = serde_json::from_str(&out).unwrap();
    let file = fs::read_to_string(repo_root().join("bins/cli/schema/agent-spec.v1.json")).unwrap();
    assert_eq!(printed, serde_json::from_str::<Value>(&file).unwrap());
    assert_eq!(
        printed["$schema"],
        "http://json-schema.org/draft-07/schema#"
    );
}

// ---------------------------------------------------------------------------------------------
// init

#[test]
fn init_scaffolds_the_tutorial_project_byte_for_byte() {
    let tmp = TempDir::new().unwrap();
    let project = tmp.path().join("refund-agent");
    let out = stdout_of(phrony().arg("init").arg(&project));
    let expected: String = SCAFFOLD
        .iter()
        .map(|rel| format!("created {}\n", project.join(rel).display()))
        .collect();
    assert_eq!(out, expected);
    for rel in SCAFFOLD {
        let written = fs::read(project.join(rel)).unwrap();
        let example = fs::read(refund_example().join(rel)).unwrap();
        assert!(
            written == example,
            "{rel} differs from policies-examples/refund-agent/{rel}"
        );
    }
    let agent = fs::read_to_string(project.join("agent.yaml")).unwrap();
    assert!(
        agent.starts_with("# yaml-language-server: $schema="),
        "{agent}"
    );
}

#[test]
fn init_defaults_to_the_current_directory() {
    let tmp = TempDir::new().unwrap();
    phrony()
        .arg("init")
        .current_dir(tmp.path())
        .assert()
        .success()
        .stdout(contains("created ./agent.yaml\n"));
    assert!(tmp.path().join("policies/refund-hard-limit.yaml").is_file());
}

#[test]
fn a_scaffolded_project_validates_and_dry_runs() {
    let tmp = TempDir::new().unwrap();
    phrony().arg("init").arg(tmp.path()).assert().success();
    let agent = tmp.path().join("agent.yaml");
    phrony()
        .args(["agents", "validate"])
        .arg(&agent)
        .env("OPENAI_API_KEY", "sk-test")
        .assert()
        .success()
        .stdout("valid: support/refund-agent 0.1.0\n")
        .stderr("");
    phrony()
        .args(["policies", "check"])
        .arg(&agent)
        .args([
            "--tool",
            "issue_refund",
            "--args",
            r#"{"order_id":"ORD-1","amount":400}"#,
        ])
        .assert()
        .success()
        .stdout(contains("decision: require_approval"));
}

#[test]
fn a_second_init_refuses_and_changes_nothing() {
    let tmp = TempDir::new().unwrap();
    phrony().arg("init").arg(tmp.path()).assert().success();
    let agent = tmp.path().join("agent.yaml");
    fs::write(&agent, "# my edits\n").unwrap();
    phrony()
        .arg("init")
        .arg(tmp.path())
        .assert()
        .code(1)
        .stdout("")
        .stderr(contains("Error: refusing to overwrite existing files"))
        .stderr(contains("agent.yaml"))
        .stderr(contains("worker.py"));
    assert_eq!(fs::read_to_string(&agent).unwrap(), "# my edits\n");
}

#[test]
fn init_writes_nothing_when_any_file_exists() {
    let tmp = TempDir::new().unwrap();
    write(tmp.path(), "worker.py", "print('mine')\n");
    phrony()
        .arg("init")
        .arg(tmp.path())
        .assert()
        .code(1)
        .stderr(contains("worker.py"))
        .stderr(contains("nothing was written"));
    let left: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec!["worker.py"],
        "init wrote files next to an existing one"
    );
    assert_eq!(
        fs::read_to_string(tmp.path().join("worker.py")).unwrap(),
        "print('mine')\n"
    );
}

#[test]
fn init_removes_what_it_wrote_when_a_later_write_fails() {
    let tmp = TempDir::new().unwrap();
    // A file where init needs the `policies/` directory: agent.yaml and tools/ come first.
    write(tmp.path(), "policies", "not a directory\n");
    phrony()
        .arg("init")
        .arg(tmp.path())
        .assert()
        .code(1)
        .stdout("")
        .stderr(contains("Error: create "))
        .stderr(contains(
            "policies/refund-approval-boundary.yaml: Not a directory",
        ));
    let left: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec!["policies"],
        "init left a half-written project behind"
    );
}

// ---------------------------------------------------------------------------------------------
// agents validate

#[test]
fn validate_the_refund_example() {
    phrony()
        .args(["agents", "validate"])
        .arg(refund_example().join("agent.yaml"))
        .env("OPENAI_API_KEY", "sk-test")
        .assert()
        .success()
        .stdout("valid: support/refund-agent 0.1.0\n")
        .stderr("");
}

#[test]
fn validate_json_names_the_agent_and_the_unset_secrets() {
    let out = stdout_of(
        phrony()
            .args(["agents", "validate", "--output", "json"])
            .arg(refund_example().join("agent.yaml"))
            .env_remove("OPENAI_API_KEY"),
    );
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["valid"], true);
    assert_eq!(
        (&report["namespace"], &report["name"], &report["version"]),
        (&"support".into(), &"refund-agent".into(), &"0.1.0".into())
    );
    assert_eq!(report["content_hash"].as_str().unwrap().len(), 64);
    assert_eq!(
        report["unset_secrets"],
        serde_json::json!([{"name": "openai", "from_env": "OPENAI_API_KEY"}])
    );
}

#[test]
fn validate_warns_about_an_unset_secret_variable_and_succeeds() {
    for env in [None, Some("")] {
        let mut cmd = phrony();
        cmd.args(["agents", "validate"])
            .arg(refund_example().join("agent.yaml"));
        match env {
            None => cmd.env_remove("OPENAI_API_KEY"),
            Some(value) => cmd.env("OPENAI_API_KEY", value),
        };
        cmd.assert()
            .success()
            .stdout("valid: support/refund-agent 0.1.0\n")
            .stderr(
                "warning: secret \"openai\": OPENAI_API_KEY is not set in the local environment\n",
            );
    }
}

fn analysis_fixture(case: &str) -> PathBuf {
    repo_root()
        .join("crates/phrony-manifest/tests/fixtures/analysis")
        .join(case)
        .join("agent.yaml")
}

#[test]
fn validate_prints_policy_analysis_warnings_with_positions_and_succeeds() {
    phrony()
        .args(["agents", "validate"])
        .arg(analysis_fixture("shadowed"))
        .assert()
        .success()
        .stdout("valid: tests/shadowed 0.1.0\n")
        .stderr(contains(
            "shadowed/policies/big-refund.yaml:16:11: warning: spec.decision.type: policy \
             big-refund never decides: every call it matches is denied by freeze at ",
        ))
        .stderr(contains("freeze.yaml:10:11 [never_decides]\n"))
        .stderr(contains(
            "  example call: {\"tool\":\"issue_refund\",\"arguments\":{\"amount\":251,\"currency\":\"EUR\"}}\n",
        ));
}

#[test]
fn validate_deny_warnings_fails_on_analysis_warnings_only() {
    phrony()
        .args(["agents", "validate", "--deny-warnings"])
        .arg(analysis_fixture("unsatisfiable"))
        .assert()
        .failure()
        .stdout("")
        .stderr(contains(
            "range.yaml:9:5: warning: spec.conditions.all: unsatisfiable",
        ))
        .stderr(contains(
            "Error: 3 warnings, and --deny-warnings makes warnings fatal",
        ));
    phrony()
        .args(["agents", "validate", "--deny-warnings"])
        .arg(analysis_fixture("allow-lists-ok"))
        .assert()
        .success()
        .stdout("valid: tests/allow-lists-ok 0.1.0\n")
        .stderr("");
}

#[test]
fn validate_json_lists_the_findings() {
    let out = stdout_of(
        phrony()
            .args(["agents", "validate", "--output", "json"])
            .arg(analysis_fixture("overlapping")),
    );
    let report: Value = serde_json::from_str(&out).unwrap();
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{report}");
    assert_eq!(findings[0]["kind"], "overlapping_approval");
    assert_eq!(
        (&findings[0]["line"], &findings[0]["column"]),
        (&13.into(), &11.into())
    );
    assert_eq!(findings[0]["example"]["arguments"]["amount"], 1001);
}

#[test]
fn policies_check_analyze_lists_findings_in_text_and_json() {
    phrony()
        .args(["policies", "check", "--analyze"])
        .arg(analysis_fixture("schema"))
        .assert()
        .success()
        .stdout(contains(
            "typo.yaml:9:12: warning: spec.conditions.field: condition on `amout` can never \
             match a valid call",
        ))
        .stdout(contains("did you mean `amount`? [unknown_field]\n"))
        .stdout(contains("\n6 policy analysis warnings\n"));
    let out = stdout_of(
        phrony()
            .args(["policies", "check", "--analyze", "--output", "json"])
            .arg(analysis_fixture("schema")),
    );
    let report: Value = serde_json::from_str(&out).unwrap();
    let kinds: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "type_mismatch",
            "type_mismatch",
            "unknown_field",
            "type_mismatch",
            "type_mismatch",
            "unknown_field"
        ]
    );
    // Without --analyze a tool is required; --analyze decides no call.
    phrony()
        .args(["policies", "check"])
        .arg(analysis_fixture("schema"))
        .assert()
        .code(2)
        .stderr(contains("--tool"));
    phrony()
        .args(["policies", "check", "--analyze", "--tool", "issue_refund"])
        .arg(analysis_fixture("schema"))
        .assert()
        .code(2);
}

const BROKEN_AGENT: &str = "\
apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: broken
  namespace: demo
  version: not-a-version
spec:
  purpose: ''
  instructions:
    text: hi
  model:
    provider: openai
    name: gpt-4o
  tools:
    - ref: payments.pay
      as: pay
      side_effect_class: destructive
    - ref: payments.pay
      as: pay_again
";

#[test]
fn validate_reports_every_problem_with_its_position() {
    let tmp = TempDir::new().unwrap();
    let agent = write(tmp.path(), "agent.yaml", BROKEN_AGENT);
    let output = phrony()
        .args(["agents", "validate"])
        .arg(&agent)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    let prefix = format!("{}:", agent.display());
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with(&prefix) && l.contains(": error: "))
        .collect();
    for expected in [
        "metadata.version: must be valid semver",
        "spec.purpose: is required",
        "spec.tools[0].side_effect_class: must be one of read_only, idempotent_write, \
         non_idempotent_write, irreversible_action",
        "spec.tools[1].ref: must be unique",
    ] {
        let line = errors.iter().find(|l| l.ends_with(expected));
        let Some(line) = line else {
            panic!("no diagnostic `{expected}` in:\n{stderr}")
        };
        // file:line:col: error: …
        let position: Vec<&str> = line[prefix.len()..].splitn(3, ':').collect();
        assert!(
            position[0].parse::<usize>().unwrap() > 0 && position[1].parse::<usize>().unwrap() > 0,
            "no line:column in {line}"
        );
    }
    assert_eq!(
        lines.last().copied(),
        Some(&*format!(
            "Error: invalid manifest ({} errors)",
            errors.len()
        ))
    );
}

#[test]
fn the_semver_line_points_at_the_version() {
    let tmp = TempDir::new().unwrap();
    let agent = write(
        tmp.path(),
        "agent.yaml",
        &BROKEN_AGENT.replace("purpose: ''", "purpose: x"),
    );
    phrony()
        .args(["agents", "validate"])
        .arg(&agent)
        .assert()
        .code(1)
        .stderr(contains(format!(
            "{}:6:12: error: metadata.version: must be valid semver",
            agent.display()
        )));
}

fn validate_single(file: &str, text: &str) -> (i32, String) {
    let tmp = TempDir::new().unwrap();
    let path = write(tmp.path(), file, text);
    let out = phrony()
        .args(["agents", "validate"])
        .arg(path)
        .env("OPENAI_API_KEY", "x")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const GOOD_AGENT: &str = "\
apiVersion: phrony.com/v1
kind: Agent
metadata: {name: a, namespace: demo, version: 1.0.0}
spec:
  purpose: test
  instructions: {text: hi}
  model: {provider: openai, name: gpt-4o}
";

#[test]
fn a_single_error_is_the_summary_line() {
    let (code, stderr) =
        validate_single("agent.yaml", &GOOD_AGENT.replace("1.0.0", "not-a-version"));
    assert_eq!(code, 1);
    assert!(
        stderr.ends_with("Error: metadata.version: must be valid semver\n"),
        "{stderr}"
    );
}

#[test]
fn inline_policies_on_an_agent_are_refused() {
    let text = format!(
        "{GOOD_AGENT}  policies:\n    - {{name: inline-deny, scope: agent, action: deny}}\n"
    );
    let (code, stderr) = validate_single("agent.yaml", &text);
    assert_eq!(code, 1);
    assert!(stderr.contains(":8:3: error: spec.policies"), "{stderr}");
    // The summary line keeps the reference CLI's wording, which scripts grep for.
    assert!(
        stderr.ends_with(
            "Error: parse manifest: spec.policies is not supported on the Agent; use kind: \
             Policy documents referenced from default_policies or binding policies\n"
        ),
        "{stderr}"
    );
}

/// The runtime refuses a name with a control character (it keys the agent's audit stream);
/// validate applies the same rule, so it fails here instead of at publish.
#[test]
fn a_name_the_runtime_refuses_fails_validation() {
    let text = GOOD_AGENT.replace("name: a,", "name: \"refund\\aagent\",");
    let tmp = TempDir::new().unwrap();
    let path = write(tmp.path(), "agent.yaml", &text);
    let output = phrony()
        .args(["agents", "validate"])
        .arg(&path)
        .env("OPENAI_API_KEY", "x")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "reported valid");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        stderr,
        format!(
            "{}:3:18: error: metadata.name: must not contain control characters (U+0007 at \
             byte 6)\nError: metadata.name: must not contain control characters (U+0007 at byte \
             6)\n",
            path.display()
        )
    );
}

/// Aliases are refused before they are expanded, by every command that reads a manifest: 1024
/// aliases of a 1024-item anchor are a million nodes from 10 KB (before the fix: reported valid,
/// with an unknown-key warning).
#[test]
fn yaml_aliases_are_refused_quickly_by_every_command() {
    let tmp = TempDir::new().unwrap();
    let items = vec!["lol"; 1024].join(", ");
    let aliases = vec!["*lol"; 1024].join(", ");
    let laughs = format!("x-laughs:\n  lol: &lol [{items}]\n  lols: [{aliases}]\n");
    let agent = write(tmp.path(), "agent.yaml", &format!("{GOOD_AGENT}{laughs}"));
    let bundle = write(
        tmp.path(),
        "bundle.yaml",
        &format!(
            "apiVersion: phrony.com/v1\nkind: Bundle\nmetadata: {{name: b, namespace: demo, \
             version: 1.0.0}}\nspec: {{root: agent.yaml}}\n{laughs}"
        ),
    );
    let expected = |file: &Path, line: usize| {
        format!(
            "{}:{line}:10: error: x-laughs.lols[0]: YAML aliases are not supported (*lol refers \
             to an anchor); write the value out in full",
            file.display()
        )
    };
    let commands: [(Vec<&str>, &Path, usize); 3] = [
        (vec!["agents", "validate"], &agent, 10),
        (vec!["policies", "check", "--tool", "x"], &agent, 10),
        (vec!["bundles", "validate"], &bundle, 7),
    ];
    for (args, file, line) in commands {
        let started = std::time::Instant::now();
        let output = phrony()
            .args(&args)
            .arg(file)
            .env("OPENAI_API_KEY", "x")
            .timeout(std::time::Duration::from_secs(20))
            .output()
            .unwrap();
        let elapsed = started.elapsed();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&expected(file, line)), "{args:?}: {stderr}");
        assert!(
            elapsed < std::time::Duration::from_secs(5),
            "{args:?} took {elapsed:?}"
        );
    }
}

/// A binding without a Tool document has no side-effect class: validate succeeds but says, with
/// the position, that the binding is treated as irreversible_action after a crash.
#[test]
fn a_binding_without_a_tool_document_is_called_irreversible() {
    let text =
        format!("{GOOD_AGENT}  tools:\n    - ref: payments.issue-refund\n      as: issue_refund\n");
    let tmp = TempDir::new().unwrap();
    let path = write(tmp.path(), "agent.yaml", &text);
    let output = phrony()
        .args(["agents", "validate"])
        .arg(&path)
        .env("OPENAI_API_KEY", "x")
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let root = std::path::absolute(tmp.path()).unwrap();
    assert_eq!(
        stderr,
        format!(
            "{}:9:12: warning: spec.tools[0].ref: no Tool document for \"payments.issue-refund\" \
             (looked for {} and in every tools/*.yaml): binding \"issue_refund\" is dispatched as \
             version \"default\" and has no side_effect_class, so it is treated as \
             irreversible_action: after a crash its call waits for an operator's review and is \
             never re-sent automatically; add the Tool document or set side_effect_class on the \
             binding\n",
            path.display(),
            root.join("tools/payments.issue-refund.yaml").display()
        )
    );
}

#[test]
fn a_missing_policy_ref_is_an_error() {
    let text = format!("{GOOD_AGENT}  default_policies: [demo.nonexistent-policy]\n");
    let (code, stderr) = validate_single("agent.yaml", &text);
    assert_eq!(code, 1);
    assert!(stderr.contains("demo.nonexistent-policy"), "{stderr}");
}

#[test]
fn a_bundle_is_sent_to_bundles_validate() {
    let (code, stderr) = validate_single("bundle.yaml", BUNDLE);
    assert_eq!(code, 1);
    assert!(
        stderr.ends_with("Error: bundle manifest: use phrony bundles validate instead\n"),
        "{stderr}"
    );
}

#[test]
fn a_missing_manifest_is_an_error() {
    phrony()
        .args(["agents", "validate", "/nonexistent/agent.yaml"])
        .assert()
        .code(1)
        .stderr(contains("/nonexistent/agent.yaml"))
        .stderr(contains("Error: "));
}

// ---------------------------------------------------------------------------------------------
// policies replay (through a daemon: tests/tests/e2e/replay.rs)

/// The candidate is checked before the runtime is asked anything: a broken manifest gets every
/// diagnostic as `agents validate` prints them and exit 1, with no daemon running.
#[test]
fn replay_reports_a_broken_candidate_before_connecting() {
    let tmp = TempDir::new().unwrap();
    let text = GOOD_AGENT
        .replace("1.0.0", "not-a-version")
        .replace("purpose: test", "purpose: ''");
    let path = write(tmp.path(), "agent.yaml", &text);
    let out = phrony()
        .args(["policies", "replay", "demo/a", "--against"])
        .arg(&path)
        .args(["--runtime-addr", "127.0.0.1:1"])
        .env("OPENAI_API_KEY", "x")
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    let file = path.display().to_string();
    let diagnostics: Vec<&str> = stderr.lines().filter(|l| l.starts_with(&file)).collect();
    assert_eq!(diagnostics.len(), 2, "{stderr}");
    assert!(
        stderr.ends_with("Error: invalid manifest (2 errors)\n"),
        "{stderr}"
    );
    assert!(!stderr.contains("cannot reach"), "{stderr}");
}

#[test]
fn replay_refuses_bad_arguments_with_their_name() {
    phrony()
        .args(["policies", "replay", "demo/a"])
        .assert()
        .code(2)
        .stderr(contains("--against"));
    phrony()
        .args([
            "policies",
            "replay",
            "demo/a@1.0.0",
            "--against",
            "agent.yaml",
        ])
        .assert()
        .code(1)
        .stderr(contains("must not include @version"));
    phrony()
        .args([
            "policies",
            "replay",
            "demo/a",
            "--against",
            "agent.yaml",
            "--limit",
            "0",
        ])
        .assert()
        .code(2);
}

// ---------------------------------------------------------------------------------------------
// policies check

fn check(amount: u32, output: &str) -> Command {
    let mut cmd = phrony();
    cmd.args(["policies", "check"])
        .arg(refund_example().join("agent.yaml"))
        .args(["--tool", "issue_refund", "--output", output])
        .arg("--args")
        .arg(format!(
            r#"{{"order_id": "ORD-1", "amount": {amount}, "currency": "EUR"}}"#
        ));
    cmd
}

#[test]
fn check_refund_100_is_allowed() {
    check(100, "text").assert().success().stdout(
        "tool: issue_refund (payments.issue-refund@1.0.0, irreversible_action)\n\
         decision: allow\n\
         applied:\n\
         \x20 payments/refund-approval-boundary@1.0.0  require_approval  no match\n\
         \x20 payments/refund-hard-limit@1.0.0         deny              no match\n",
    );
}

#[test]
fn check_refund_400_requires_one_approval() {
    check(400, "text").assert().success().stdout(
        "tool: issue_refund (payments.issue-refund@1.0.0, irreversible_action)\n\
         decision: require_approval\n\
         policy: payments/refund-approval-boundary@1.0.0\n\
         reason: Refund amount above delegated limit.\n\
         approvals_required: 1\n\
         on_reject: return_to_agent\n\
         applied:\n\
         \x20 payments/refund-approval-boundary@1.0.0  require_approval  matched (deciding)\n\
         \x20 payments/refund-hard-limit@1.0.0         deny              no match\n",
    );
}

#[test]
fn check_refund_14000_is_denied_by_the_hard_limit() {
    check(14000, "text").assert().success().stdout(
        "tool: issue_refund (payments.issue-refund@1.0.0, irreversible_action)\n\
         decision: deny\n\
         policy: payments/refund-hard-limit@1.0.0\n\
         reason: Refund amount exceeds the absolute ceiling for agent-initiated refunds.\n\
         applied:\n\
         \x20 payments/refund-approval-boundary@1.0.0  require_approval  matched\n\
         \x20 payments/refund-hard-limit@1.0.0         deny              matched (deciding)\n",
    );
}

fn check_json(amount: u32) -> Value {
    serde_json::from_str(&stdout_of(&mut check(amount, "json"))).unwrap()
}

#[test]
fn check_json_output_for_scripts() {
    let allow = check_json(100);
    assert_eq!(allow["decision"], "allow");
    assert!(allow.get("policy").is_none(), "{allow}");
    assert_eq!(allow["applied"].as_array().unwrap().len(), 2);

    let approval = check_json(400);
    assert_eq!(approval["decision"], "require_approval");
    assert_eq!(
        approval["policy"],
        "payments/refund-approval-boundary@1.0.0"
    );
    assert_eq!(approval["reason"], "Refund amount above delegated limit.");
    assert_eq!(approval["approvals_required"], 1);
    assert_eq!(approval["on_reject"], "return_to_agent");
    assert_eq!(approval["agent"], "support/refund-agent@0.1.0");
    assert_eq!(approval["tool"]["ref"], "payments.issue-refund");

    let deny = check_json(14000);
    assert_eq!(deny["decision"], "deny");
    assert_eq!(deny["policy"], "payments/refund-hard-limit@1.0.0");
    let applied = deny["applied"].as_array().unwrap();
    let deciding: Vec<&Value> = applied.iter().filter(|p| p["deciding"] == true).collect();
    assert_eq!(deciding.len(), 1);
    assert_eq!(deciding[0]["policy"], "payments/refund-hard-limit@1.0.0");
    assert!(applied.iter().all(|p| p["matched"] == true));
}

#[test]
fn check_accepts_the_logical_id_and_reads_are_ungoverned() {
    phrony()
        .args(["policies", "check"])
        .arg(refund_example().join("agent.yaml"))
        .args([
            "--tool",
            "payments.issue-refund",
            "--args",
            r#"{"amount": 14000}"#,
        ])
        .assert()
        .success()
        .stdout(contains("decision: deny"));
    phrony()
        .args(["policies", "check"])
        .arg(refund_example().join("agent.yaml"))
        .args([
            "--tool",
            "lookup_order",
            "--args",
            r#"{"order_id": "ORD-2", "amount": 14000}"#,
        ])
        .assert()
        .success()
        .stdout(contains("decision: allow\napplied: none"));
}

#[test]
fn check_says_when_a_tool_is_hidden_from_the_model_in_the_context() {
    let change = refund_example()
        .with_file_name("change-management")
        .join("agent.yaml");
    let check = |context: &str, output: &str| {
        let out = phrony()
            .args(["policies", "check"])
            .arg(&change)
            .args([
                "--tool",
                "restart_service",
                "--args",
                r#"{"service": "search-api"}"#,
            ])
            .args(["--context", context, "--output", output])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let developer = r#"{"principal": {"role": "developer"}, "now": "2025-03-12T10:00:00Z"}"#;
    let text = check(developer, "text");
    assert!(
        text.contains(
            "hidden: infra/operators-only@1.0.0 denies every call of this tool in this context, \
             whatever the arguments; the model is not offered it\n"
        ),
        "{text}"
    );
    let report: Value = serde_json::from_str(&check(developer, "json")).unwrap();
    assert_eq!(report["hidden_by"], "infra/operators-only@1.0.0");
    // An operator is offered the tool; a deny that reads the arguments hides nothing.
    let oncall = r#"{"principal": {"role": "oncall"}, "now": "2025-03-12T10:00:00Z"}"#;
    assert!(!check(oncall, "text").contains("hidden:"));
    let report: Value = serde_json::from_str(&check(oncall, "json")).unwrap();
    assert!(report.get("hidden_by").is_none(), "{report}");
    phrony()
        .args(["policies", "check"])
        .arg(refund_example().join("agent.yaml"))
        .args(["--tool", "issue_refund", "--args", r#"{"amount": 14000}"#])
        .assert()
        .success()
        .stdout(contains("decision: deny"))
        .stdout(contains("hidden:").not());
}

#[test]
fn check_decides_a_bundles_delegation_and_its_members_calls() {
    let desk = refund_example()
        .with_file_name("refund-desk")
        .join("bundle.yaml");
    // The root's policy on the delegation call itself.
    phrony()
        .args(["policies", "check"])
        .arg(&desk)
        .args([
            "--tool",
            "ask_refunds",
            "--args",
            r#"{"task": "fraud on ORD-9"}"#,
        ])
        .assert()
        .success()
        .stdout(contains(
            "decision: deny\npolicy: support/fraud-goes-to-the-fraud-team@1.0.0\n",
        ));
    // A member's own calls, by its name.
    phrony()
        .args(["policies", "check"])
        .arg(&desk)
        .args(["--member", "refund-specialist", "--tool", "issue_refund"])
        .args([
            "--args",
            r#"{"order_id": "ORD-1", "amount": 400, "currency": "EUR"}"#,
        ])
        .assert()
        .success()
        .stdout(contains(
            "decision: require_approval\npolicy: payments/refund-approval-boundary@1.0.0\n",
        ));
    phrony()
        .args(["policies", "check"])
        .arg(&desk)
        .args(["--member", "nobody", "--tool", "x"])
        .assert()
        .code(1)
        .stderr(contains(
            "has no local member \"nobody\" (members: front-desk, refund-specialist)",
        ));
    // --member is for bundles only.
    phrony()
        .args(["policies", "check"])
        .arg(refund_example().join("agent.yaml"))
        .args(["--member", "refund-specialist", "--tool", "issue_refund"])
        .assert()
        .code(1)
        .stderr(contains("is not a Bundle"));
}

#[test]
fn check_warns_when_the_arguments_break_the_input_schema() {
    let mut cmd = phrony();
    cmd.args(["policies", "check"])
        .arg(refund_example().join("agent.yaml"))
        .args(["--tool", "issue_refund", "--output", "json"])
        .args(["--args", r#"{"order_id": "ORD-1", "amount": "400"}"#]);
    let output = cmd.output().unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    let warning = "warning: --args do not match the input_schema of issue_refund: ";
    assert!(
        stderr.contains(&format!("{warning}\"currency\" is a required property")),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("{warning}/amount: ")), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["decision"], "require_approval",
        "a numeric string still compares as a number"
    );
    assert_eq!(report["args_errors"].as_array().unwrap().len(), 2);
    assert!(check_json(400).get("args_errors").is_none());
}

#[test]
fn check_reads_the_context() {
    let manifest = repo_root().join("policies-examples/change-management/agent.yaml");
    let run = |context: &str| {
        let mut cmd = phrony();
        cmd.args(["policies", "check"])
            .arg(&manifest)
            .args([
                "--tool",
                "restart_service",
                "--args",
                r#"{"service": "search-api"}"#,
            ])
            .args(["--context", context, "--output", "json"])
            .env("OPENAI_API_KEY", "x");
        serde_json::from_str::<Value>(&stdout_of(&mut cmd)).unwrap()
    };
    let weekday = r#"{"principal": {"role": "sre"}, "session": {"id": "s1", "metadata": {"environment": "production"}}, "now": "2025-03-12T10:00:00Z"}"#;
    assert_eq!(run(weekday)["decision"], "allow");
    let saturday = weekday.replace("2025-03-12T10:00:00Z", "2025-03-15T11:00:00+00:00");
    assert_eq!(run(&saturday)["policy"], "infra/weekend-freeze@1.2.0");
    let unix = weekday.replace("\"2025-03-12T10:00:00Z\"", "1742036400");
    assert_eq!(run(&unix)["policy"], "infra/weekend-freeze@1.2.0");
    assert_eq!(
        run(r#"{"now": 1741773600}"#)["policy"],
        "infra/operators-only@1.0.0"
    );
}

#[test]
fn check_rejects_bad_input_clearly() {
    let manifest = refund_example().join("agent.yaml");
    let run = |args: &[&str]| {
        let mut cmd = phrony();
        cmd.args(["policies", "check"]).arg(&manifest).args(args);
        cmd.assert().code(1).stdout("")
    };
    run(&["--tool", "refund", "--args", "{}"]).stderr(contains(
        "unknown tool \"refund\"; the tools of support/refund-agent are: \
         lookup_order (orders.lookup-order), issue_refund (payments.issue-refund)",
    ));
    run(&["--tool", "issue_refund", "--args", "{amount: 1}"])
        .stderr(contains("Error: --args is not valid JSON"));
    run(&["--tool", "issue_refund", "--args", "[1]"]).stderr(contains(
        "Error: --args must be a JSON object, got an array",
    ));
    run(&[
        "--tool",
        "issue_refund",
        "--context",
        r#"{"now": "yesterday"}"#,
    ])
    .stderr(contains("not an RFC 3339 timestamp"));
    run(&["--tool", "issue_refund", "--context", r#"{"user": {}}"#])
        .stderr(contains("unknown field `user`"));
    run(&[
        "--tool",
        "issue_refund",
        "--context",
        r#"{"principal": "alice"}"#,
    ])
    .stderr(contains("principal must be a JSON object, got a string"));
}

// ---------------------------------------------------------------------------------------------
// bundles

const BUNDLE: &str = "\
apiVersion: phrony.com/v1
kind: Bundle
metadata: {name: support-desk, namespace: support, version: 1.0.0}
spec:
  root: ./orchestrator.yaml
";

const ORCHESTRATOR: &str = "\
apiVersion: phrony.com/v1
kind: Agent
metadata: {name: desk-orchestrator, namespace: support, version: 1.0.0}
secrets:
  openai: {fromEnv: OPENAI_API_KEY}
spec:
  purpose: Route customer requests to the right specialist.
  instructions: {text: Delegate refund questions to the refunds specialist.}
  model: {provider: openai, name: gpt-4o}
  agents:
    - ref: ./specialists/refunds.yaml
      as: ask_refunds
      description: Ask the refunds specialist.
";

const SPECIALIST: &str = "\
apiVersion: phrony.com/v1
kind: Agent
metadata: {name: refunds-specialist, namespace: support, version: 1.0.0}
secrets:
  openai: {fromEnv: OPENAI_API_KEY}
spec:
  purpose: Answer refund questions.
  instructions: {text: You know the refund policy.}
  model: {provider: openai, name: gpt-4o}
";

fn bundle_fixture() -> TempDir {
    let tmp = TempDir::new().unwrap();
    write(tmp.path(), "bundle.yaml", BUNDLE);
    write(tmp.path(), "orchestrator.yaml", ORCHESTRATOR);
    write(tmp.path(), "specialists/refunds.yaml", SPECIALIST);
    tmp
}

fn bundles(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = phrony();
    cmd.arg("bundles")
        .args(args)
        .arg(dir.join("bundle.yaml"))
        .env("OPENAI_API_KEY", "x");
    cmd
}

/// `sha256:` and 64 hex digits.
fn lock_hash(line: &str, prefix: &str) -> String {
    let hash = line
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{line:?} lacks {prefix:?}"));
    let hex = hash.strip_prefix("sha256:").unwrap();
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{hash}"
    );
    hash.to_owned()
}

#[test]
fn bundles_lock_writes_a_compact_lock_and_validate_accepts_it() {
    let tmp = bundle_fixture();
    let out = stdout_of(&mut bundles(tmp.path(), &["lock"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let hash = lock_hash(lines[0], "locked: support/support-desk ");
    assert_eq!(lines[1], "members: 2 (root: desk-orchestrator)");

    let text = fs::read_to_string(tmp.path().join("bundle.lock.json")).unwrap();
    assert!(
        !text.contains('\n') && !text.contains(": "),
        "lock is not compact: {text}"
    );
    let lock: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(lock["version"], hash);
    assert_eq!(lock["root_child_name"], "desk-orchestrator");
    let members = lock["members"].as_array().unwrap();
    let names: Vec<&str> = members
        .iter()
        .map(|m| m["child_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["desk-orchestrator", "refunds-specialist"]);
    assert!(members.iter().all(|m| m["origin"] == "vendored"));
    assert_eq!(members[1]["ref"], "./specialists/refunds.yaml");

    for args in [&["validate"][..], &["validate", "--require-lock"]] {
        bundles(tmp.path(), args)
            .assert()
            .success()
            .stdout(format!(
                "valid: support/support-desk {hash}\nmembers: 2 (root: desk-orchestrator)\n"
            ))
            .stderr("");
    }
    // Locking again is deterministic.
    let again = stdout_of(&mut bundles(tmp.path(), &["lock"]));
    assert_eq!(again, out);

    let locked: Value = serde_json::from_str(&stdout_of(&mut bundles(
        tmp.path(),
        &["lock", "--output", "json"],
    )))
    .unwrap();
    let validated: Value = serde_json::from_str(&stdout_of(&mut bundles(
        tmp.path(),
        &["validate", "--output", "json"],
    )))
    .unwrap();
    for report in [&locked, &validated] {
        assert_eq!(report["lock_hash"], hash);
        assert_eq!(report["namespace"], "support");
        assert_eq!(report["name"], "support-desk");
        assert_eq!(report["members"], 2);
        assert_eq!(report["root"], "desk-orchestrator");
    }
    assert_eq!(validated["locked"], true);
}

#[test]
fn bundles_lock_connects_only_for_external_members_and_says_why_it_cannot() {
    // Nothing listens on port 9. A closure without external members never connects.
    let tmp = bundle_fixture();
    bundles(tmp.path(), &["lock"])
        .env("PHRONY_RUNTIME_ADDR", "127.0.0.1:9")
        .assert()
        .success();
    let lock_before = fs::read(tmp.path().join("bundle.lock.json")).unwrap();

    // With an external member, the lock needs its published content hash from the runtime.
    write(
        tmp.path(),
        "orchestrator.yaml",
        &format!(
            "{ORCHESTRATOR}    - ref: billing.invoicer@2.1.0\n      description: Ask billing.\n"
        ),
    );
    let out = bundles(tmp.path(), &["lock"])
        .env("PHRONY_RUNTIME_ADDR", "127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with(
            "Error: bundle has external members (billing.invoicer@2.1.0): locking them needs the \
             content hash of each published version from the runtime at 127.0.0.1:9: cannot \
             reach the phrony runtime at 127.0.0.1:9"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("--runtime-addr"), "{stderr}");
    // Nothing was written.
    assert_eq!(
        fs::read(tmp.path().join("bundle.lock.json")).unwrap(),
        lock_before
    );
    // validate compares without a runtime: the committed lock no longer matches the closure.
    bundles(tmp.path(), &["validate"])
        .assert()
        .code(1)
        .stderr(contains("member count drift"));
}

#[test]
fn bundles_validate_detects_drift_after_a_member_changes() {
    let tmp = bundle_fixture();
    let first = stdout_of(&mut bundles(tmp.path(), &["lock"]));
    let lock_before = fs::read(tmp.path().join("bundle.lock.json")).unwrap();
    write(
        tmp.path(),
        "specialists/refunds.yaml",
        &SPECIALIST.replace(
            "Answer refund questions.",
            "Answer refund and return questions.",
        ),
    );
    bundles(tmp.path(), &["validate"])
        .assert()
        .code(1)
        .stdout("")
        .stderr(contains(
            "bundle.lock.json drift: members[1] content_hash drift",
        ))
        .stderr(contains("run phrony bundles lock"));
    // Validation never rewrites the lock.
    assert_eq!(
        fs::read(tmp.path().join("bundle.lock.json")).unwrap(),
        lock_before
    );

    let second = stdout_of(&mut bundles(tmp.path(), &["lock"]));
    assert_ne!(
        first.lines().next(),
        second.lines().next(),
        "the lock hash did not change"
    );
    bundles(tmp.path(), &["validate", "--require-lock"])
        .assert()
        .success();
}

#[test]
fn bundles_publish_refuses_a_missing_or_drifted_lock_before_connecting() {
    // Nothing listens on port 9: a refusal that reached the network would say so instead.
    let tmp = bundle_fixture();
    bundles(tmp.path(), &["publish"])
        .env("PHRONY_RUNTIME_ADDR", "127.0.0.1:9")
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::ends_with(
            "Error: no committed lock; run phrony bundles lock\n",
        ));
    bundles(tmp.path(), &["lock"]).assert().success();
    write(
        tmp.path(),
        "specialists/refunds.yaml",
        &SPECIALIST.replace("Answer refund questions.", "Answer refund questions fast."),
    );
    bundles(tmp.path(), &["publish"])
        .env("PHRONY_RUNTIME_ADDR", "127.0.0.1:9")
        .assert()
        .code(1)
        .stdout("")
        .stderr(contains("bundle.lock.json drift: "))
        .stderr(contains("run phrony bundles lock"))
        .stderr(contains("cannot reach").not());
}

#[test]
fn bundles_validate_require_lock_needs_a_committed_lock() {
    let tmp = bundle_fixture();
    bundles(tmp.path(), &["validate", "--require-lock"])
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::ends_with(
            "Error: no committed lock; run phrony bundles lock\n",
        ));
    bundles(tmp.path(), &["validate"])
        .assert()
        .success()
        .stdout(contains("valid: support/support-desk sha256:"))
        .stderr(contains(
            "warning: no committed lock; run phrony bundles lock",
        ));
    assert!(!tmp.path().join("bundle.lock.json").exists());
}

#[test]
fn bundles_warn_about_unset_secret_variables() {
    let tmp = bundle_fixture();
    bundles(tmp.path(), &["lock"]).assert().success();
    bundles(tmp.path(), &["validate"])
        .env_remove("OPENAI_API_KEY")
        .assert()
        .success()
        .stderr("warning: secret \"openai\": OPENAI_API_KEY is not set in the local environment\n");
}

#[test]
fn bundles_lock_refuses_a_secret_conflict_and_writes_nothing() {
    let tmp = bundle_fixture();
    write(
        tmp.path(),
        "specialists/refunds.yaml",
        &SPECIALIST.replace("fromEnv: OPENAI_API_KEY", "fromEnv: OPENAI_API_KEY_DEV"),
    );
    bundles(tmp.path(), &["lock"])
        .assert()
        .code(1)
        .stderr(contains(
            "secret \"openai\": member \"desk-orchestrator\" uses OPENAI_API_KEY, member \
             \"refunds-specialist\" uses OPENAI_API_KEY_DEV",
        ));
    assert!(!tmp.path().join("bundle.lock.json").exists());
}

#[test]
fn an_invalid_member_fails_the_lock() {
    let tmp = bundle_fixture();
    write(
        tmp.path(),
        "specialists/refunds.yaml",
        &SPECIALIST.replace("1.0.0", "one"),
    );
    bundles(tmp.path(), &["lock"])
        .assert()
        .code(1)
        .stderr(contains("refunds.yaml:"))
        .stderr(contains("metadata.version: must be valid semver"));
    assert!(!tmp.path().join("bundle.lock.json").exists());
}

// ---------------------------------------------------------------------------------------------
// completions and man pages

#[test]
fn completions_are_generated_for_each_shell_from_the_command_tree() {
    let bash = stdout_of(phrony().args(["completions", "bash"]));
    assert!(bash.contains("_phrony()"), "{bash}");
    for command in ["bundles", "approvals", "sessions", "completions"] {
        assert!(bash.contains(command), "bash completion lacks {command}");
    }
    let zsh = stdout_of(phrony().args(["completions", "zsh"]));
    assert!(zsh.starts_with("#compdef phrony"), "{zsh}");
    let fish = stdout_of(phrony().args(["completions", "fish"]));
    assert!(fish.contains("complete -c phrony"), "{fish}");
    phrony()
        .args(["completions", "tcsh"])
        .assert()
        .code(2)
        .stderr(contains("invalid value 'tcsh'"));
}

#[test]
fn man_pages_cover_every_command_with_the_global_flags() {
    let page = stdout_of(phrony().arg("man"));
    assert!(page.contains(".TH phrony 1"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let written = stdout_of(phrony().arg("man").arg("--dir").arg(dir.path()));
    assert!(written.starts_with("wrote "), "{written}");
    let deploy = std::fs::read_to_string(dir.path().join("phrony-bundles-deploy.1")).unwrap();
    let title = format!(
        ".TH phrony-bundles-deploy 1  \"phrony {}\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(deploy.contains(&title), "{deploy}");
    assert!(deploy.contains("phrony bundles deploy"), "{deploy}");
    assert!(deploy.contains("runtime\\-addr"), "{deploy}");
    for page in [
        "phrony.1",
        "phrony-agents-publish.1",
        "phrony-approvals-approve.1",
    ] {
        assert!(dir.path().join(page).is_file(), "no {page}");
    }
}

// ---------------------------------------------------------------------------------------------
// tools pin

#[test]
fn tools_pin_prints_the_pin_a_worker_advertises_for_each_tool_document() {
    let tools = refund_example().join("tools");
    let refund = tools.join("payments.issue-refund.yaml");
    let lookup = tools.join("orders.lookup-order.yaml");
    let out = stdout_of(phrony().args(["tools", "pin"]).arg(&refund).arg(&lookup));
    // The pins of the compiled agent's bindings (neither overrides its Tool document).
    let agent = phrony_manifest::load_agent(refund_example().join("agent.yaml"))
        .unwrap()
        .agent;
    let pin = |tool: &str| {
        agent
            .tool_pins()
            .into_iter()
            .find(|p| p.tool == tool)
            .unwrap()
            .pin
    };
    assert_eq!(
        out,
        format!(
            "payments.issue-refund@1.0.0 {}\norders.lookup-order@1.0.0 {}\n",
            pin("payments.issue-refund"),
            pin("orders.lookup-order")
        )
    );
    let json: Value = serde_json::from_str(&stdout_of(
        phrony()
            .args(["tools", "pin", "--output", "json"])
            .arg(&refund),
    ))
    .unwrap();
    assert_eq!(json[0]["tool"], "payments.issue-refund");
    assert_eq!(json[0]["version"], "1.0.0");
    assert_eq!(json[0]["pin"], pin("payments.issue-refund").as_str());

    // Not a Tool document: exit 1 with the diagnostic.
    phrony()
        .args(["tools", "pin"])
        .arg(refund_example().join("agent.yaml"))
        .assert()
        .code(1)
        .stderr(contains("expected kind Tool"));
}

// ---------------------------------------------------------------------------------------------
// mode: shadow

#[test]
fn validate_and_check_show_shadow_policies_and_what_they_would_change() {
    let tmp = TempDir::new().unwrap();
    phrony().arg("init").arg(tmp.path()).assert().success();
    fs::write(
        tmp.path().join("policies/refund-review-over-50.yaml"),
        "apiVersion: phrony.com/v1
kind: Policy
metadata: {name: refund-review-over-50, namespace: payments, version: 1.0.0}
spec:
  mode: shadow
  conditions: {field: amount, op: gt, value: 50}
  decision: {type: deny, reason: Try a lower limit first.}
",
    )
    .unwrap();
    let agent = tmp.path().join("agent.yaml");
    let text = fs::read_to_string(&agent).unwrap();
    let anchor = "        - ref: policies/refund-hard-limit.yaml\n";
    assert!(text.contains(anchor), "{text}");
    fs::write(
        &agent,
        text.replace(
            anchor,
            &format!("{anchor}        - ref: policies/refund-review-over-50.yaml\n"),
        ),
    )
    .unwrap();
    phrony()
        .args(["agents", "validate"])
        .arg(&agent)
        .env("OPENAI_API_KEY", "sk-test")
        .assert()
        .success()
        .stdout(
            "valid: support/refund-agent 0.1.0\n\
             shadow: payments/refund-review-over-50@1.0.0 (evaluated and recorded on every call, \
             never enforced)\n",
        );
    let check = |amount: u32, output: &str| {
        let mut cmd = phrony();
        cmd.args(["policies", "check"])
            .arg(&agent)
            .args(["--tool", "issue_refund", "--output", output, "--args"])
            .arg(format!(r#"{{"order_id":"ORD-1","amount":{amount}}}"#));
        cmd
    };
    // Allowed; the shadow policy would have denied. It is not among the applied policies.
    let text = stdout_of(&mut check(100, "text"));
    assert!(text.starts_with("tool: issue_refund"), "{text}");
    assert!(text.contains("decision: allow\n"), "{text}");
    assert!(!text.contains("refund-review-over-50@1.0.0  "), "{text}");
    assert!(
        text.ends_with(
            "shadow policies (never enforced): payments/refund-review-over-50@1.0.0\n\
             shadow: would have deny by payments/refund-review-over-50@1.0.0 (Try a lower limit first.)\n"
        ),
        "{text}"
    );
    let json: Value = serde_json::from_str(&stdout_of(&mut check(100, "json"))).unwrap();
    assert_eq!(json["decision"], "allow");
    assert_eq!(json["shadow"]["would_have"]["decision"], "deny");
    assert_eq!(
        json["shadow"]["policy"],
        "payments/refund-review-over-50@1.0.0"
    );
    // Below the shadow threshold nothing would change.
    let text = stdout_of(&mut check(20, "text"));
    assert!(
        text.ends_with("shadow: would have changed nothing\n"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&stdout_of(&mut check(20, "json"))).unwrap();
    assert!(json.get("shadow").is_none(), "{json}");
}

#[test]
fn policies_check_reads_earlier_calls_from_history() {
    let agent = repo_root().join("policies-examples/payout-verification/agent.yaml");
    let tmp = TempDir::new().unwrap();
    let payout = r#"{"payee_iban":"DE89370400440532013000","amount":500,"currency":"EUR"}"#;
    // No earlier calls: the payout is denied.
    phrony()
        .args(["policies", "check"])
        .arg(&agent)
        .args(["--tool", "send_payout", "--args", payout])
        .assert()
        .success()
        .stdout(contains("decision: deny"));
    let history = write(
        tmp.path(),
        "calls.json",
        r#"[{"tool": "verify_payee", "args": {"payee_iban": "DE89370400440532013000"}, "result": {"verified": true}}]"#,
    );
    phrony()
        .args(["policies", "check"])
        .arg(&agent)
        .args(["--tool", "send_payout", "--args", payout, "--history"])
        .arg(&history)
        .assert()
        .success()
        .stdout(contains("decision: allow"));
    // A verification still in flight does not count.
    let reserved = write(
        tmp.path(),
        "reserved.json",
        r#"[{"tool": "verify_payee", "args": {"payee_iban": "DE89370400440532013000"}, "outcome": "reserved"}]"#,
    );
    phrony()
        .args(["policies", "check"])
        .arg(&agent)
        .args(["--tool", "send_payout", "--args", payout, "--history"])
        .arg(&reserved)
        .assert()
        .success()
        .stdout(contains("decision: deny"));
    // Bad input is named.
    let bad = write(tmp.path(), "bad.json", r#"{"tool": "verify_payee"}"#);
    phrony()
        .args(["policies", "check"])
        .arg(&agent)
        .args(["--tool", "send_payout", "--args", payout, "--history"])
        .arg(&bad)
        .assert()
        .code(1)
        .stderr(contains("expected a JSON list"));
    let unknown = write(tmp.path(), "unknown.json", r#"[{"tool": "nope"}]"#);
    phrony()
        .args(["policies", "check"])
        .arg(&agent)
        .args(["--tool", "send_payout", "--args", payout, "--history"])
        .arg(&unknown)
        .assert()
        .code(1)
        .stderr(contains("--history: call 0"));
}
