//! The agent lifecycle end to end: the real `phrony-runtime` on SQLite and on a fresh PostgreSQL
//! database, driven by the real `phrony` CLI, checking what users and scripts read.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tests::cli::{fails, json, ok, run, table};
use tests::daemon::{self, Backend, Daemon};

use crate::tables::redacted;

const AGENT: &str = "lifecycle/triage";
const ACTOR: &str = "ci-alice";

/// A whole-second UTC RFC 3339 timestamp.
fn assert_timestamp(text: &str) {
    assert!(
        text.ends_with('Z') && chrono::DateTime::parse_from_rfc3339(text).is_ok(),
        "not an RFC 3339 UTC timestamp: {text:?}"
    );
    assert!(!text.contains('.'), "second precision expected: {text:?}");
}

/// Writes the agent manifest with this version and purpose.
fn write_agent(dir: &Path, version: &str, purpose: &str) -> PathBuf {
    let path = dir.join("agent.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: triage
  namespace: lifecycle
  version: {version}
  owner: platform-team
spec:
  purpose: {purpose}
  instructions:
    text: Read the ticket and pick a queue.
  model:
    provider: openai
    name: gpt-4o
"
        ),
    )
    .unwrap();
    path
}

/// The CLI pointed at the daemon, acting as [`ACTOR`].
fn phrony(daemon: &Daemon) -> Command {
    tests::cli::phrony(daemon, ACTOR)
}

/// Every column starts at the same offset on every line (the table is aligned).
fn assert_aligned(stdout: &str, header: &[&str]) {
    let lines: Vec<&str> = stdout.lines().collect();
    let starts: Vec<usize> = header
        .iter()
        .map(|h| {
            lines[0]
                .find(h)
                .unwrap_or_else(|| panic!("no {h} in {}", lines[0]))
        })
        .collect();
    assert_eq!(starts[0], 0);
    for line in &lines[1..] {
        for &start in &starts[1..] {
            let before = &line[..start];
            assert!(
                before.ends_with("  ") && !line[start..].starts_with(' '),
                "column at {start} misaligned in:\n{stdout}"
            );
        }
    }
}

fn lifecycle(backend: Backend) {
    let Some(daemon) = Daemon::start(backend) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    let dir = project.path();
    let manifest = write_agent(dir, "1.0.0", "Route tickets.");
    let manifest = manifest.to_str().unwrap();

    // status: healthy runtime.
    let status = ok(phrony(&daemon).arg("status"));
    assert!(status.contains("● SERVING"), "{status}");
    assert!(
        status.contains(&format!("Runtime Address  {}", daemon.addr())),
        "{status}"
    );
    assert!(
        status.contains(&format!("CLI Version      {}", env!("CARGO_PKG_VERSION"))),
        "{status}"
    );
    let status = json(&ok(phrony(&daemon).args(["status", "--output", "json"])));
    assert_eq!(status["health"], "serving");
    assert_eq!(status["runtime_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(status["runtime_address"], daemon.addr());
    assert!(status["schema_version"].is_string(), "{status}");

    // publish, then an identical re-publish is an idempotent success.
    assert_eq!(
        ok(phrony(&daemon).args(["agents", "publish", manifest])),
        "lifecycle/triage 1.0.0\n"
    );
    assert_eq!(
        ok(phrony(&daemon).args(["agents", "publish", manifest])),
        "lifecycle/triage 1.0.0 (unchanged, already published)\n"
    );
    let again = json(&ok(
        phrony(&daemon).args(["agents", "publish", manifest, "--output", "json"])
    ));
    assert_eq!(again["created"], false);
    assert_eq!(again["namespace"], "lifecycle");
    assert_eq!(again["version"], "1.0.0");
    assert_eq!(again["content_hash"].as_str().unwrap().len(), 64);

    // Different content under the same version stays refused.
    write_agent(dir, "1.0.0", "Route tickets, differently.");
    let refused = fails(phrony(&daemon).args(["agents", "publish", manifest]));
    assert!(refused.starts_with("Error: publish: "), "{refused}");
    assert!(refused.trim_end().ends_with("(AlreadyExists)"), "{refused}");

    // deploy 1.0.0, then publish and deploy 1.1.0.
    let deployed = ok(phrony(&daemon).args(["agents", "deploy", "lifecycle/triage@1.0.0"]));
    let at = deployed
        .strip_prefix("deployed lifecycle/triage@1.0.0 at ")
        .unwrap_or_else(|| panic!("{deployed}"));
    assert_timestamp(at.trim_end());
    write_agent(dir, "1.1.0", "Route tickets, faster.");
    assert_eq!(
        ok(phrony(&daemon).args(["agents", "publish", manifest])),
        "lifecycle/triage 1.1.0\n"
    );
    let deployed = json(&ok(phrony(&daemon).args([
        "agents",
        "deploy",
        "lifecycle/triage@1.1.0",
        "--output",
        "json",
    ])));
    assert_eq!(deployed["version"], "1.1.0");
    assert_eq!(deployed["previous_version"], "1.0.0");
    assert_timestamp(deployed["deployed_at"].as_str().unwrap());

    // versions: newest publish first, STATUS column.
    let header = ["VERSION", "ID", "CONTENT_HASH", "PUBLISHED_AT", "STATUS"];
    let versions = ok(phrony(&daemon).args(["agents", "versions", AGENT]));
    assert_aligned(&versions, &header);
    insta::assert_snapshot!("agents_versions", redacted(&versions));
    let listed = json(&ok(
        phrony(&daemon).args(["agents", "versions", AGENT, "--output", "json"])
    ));
    let id_of = |label: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["version"] == label)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(listed[0]["published_by"], ACTOR);
    assert_eq!(listed[0]["status"], "published");
    assert_eq!(listed[0]["deprecated_at"], Value::Null);

    // active and inspect.
    let active = ok(phrony(&daemon).args(["agents", "active", AGENT]));
    let rest = active
        .strip_prefix("lifecycle/triage@1.1.0 deployed ")
        .unwrap_or_else(|| panic!("{active}"));
    let (at, by) = rest.trim_end().split_once(" by ").unwrap();
    assert_timestamp(at);
    assert_eq!(by, ACTOR);
    let inspect = ok(phrony(&daemon).args(["agents", "inspect", "lifecycle/triage@1.0.0"]));
    let fields: Vec<(String, String)> = table(&inspect)
        .into_iter()
        .map(|row| (row[0].clone(), row.get(1).cloned().unwrap_or_default()))
        .collect();
    let field = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no {key} in\n{inspect}"))
            .1
            .clone()
    };
    assert_eq!(field("agent:"), "lifecycle/triage@1.0.0");
    assert_eq!(field("status:"), "published");
    assert_eq!(field("published_by:"), ACTOR);
    assert_eq!(field("content_hash:").len(), 64);
    assert_timestamp(&field("published_at:"));
    assert!(!inspect.contains("deprecated_at"), "{inspect}");
    let inspected = json(&ok(phrony(&daemon).args([
        "agents",
        "inspect",
        "lifecycle/triage@1.1.0",
        "--output",
        "json",
    ])));
    assert_eq!(inspected["manifest"]["metadata"]["version"], "1.1.0");
    assert_eq!(
        inspected["manifest"]["spec"]["purpose"],
        "Route tickets, faster."
    );

    // diff: none, then a change in the local file.
    assert_eq!(
        ok(phrony(&daemon).args(["agents", "diff", manifest, "lifecycle/triage@1.1.0"])),
        "No differences. local manifest matches lifecycle/triage@1.1.0\n"
    );
    write_agent(dir, "1.1.0", "Route tickets, fastest.");
    let diff = ok(phrony(&daemon).args(["agents", "diff", manifest, "lifecycle/triage@1.1.0"]));
    assert!(
        diff.starts_with("--- lifecycle/triage@1.1.0 (published)\n+++ "),
        "{diff}"
    );
    assert!(diff.contains("\n@@ -"), "{diff}");
    assert!(
        diff.contains("\n-    \"purpose\": \"Route tickets, faster.\"\n"),
        "{diff}"
    );
    assert!(
        diff.contains("\n+    \"purpose\": \"Route tickets, fastest.\"\n"),
        "{diff}"
    );
    assert!(
        !diff.contains('\x1b'),
        "no colour when stdout is not a terminal"
    );
    let changed_lines = diff
        .lines()
        .filter(|l| {
            (l.starts_with('-') || l.starts_with('+'))
                && !l.starts_with("---")
                && !l.starts_with("+++")
        })
        .count();
    assert_eq!(changed_lines, 2, "{diff}");
    let diffed = json(&ok(phrony(&daemon).args([
        "agents",
        "diff",
        manifest,
        "lifecycle/triage@1.1.0",
        "--output",
        "json",
    ])));
    assert_eq!(diffed["identical"], false);
    assert!(
        diffed["diff"]
            .as_str()
            .unwrap()
            .contains("+    \"purpose\"")
    );

    // rollback to the previous deployment, then forward again with --to (as another actor).
    assert_eq!(
        ok(phrony(&daemon).args(["agents", "rollback", AGENT])),
        "rolled back lifecycle/triage to 1.0.0 (was: 1.1.0)\n"
    );
    assert_eq!(
        ok(phrony(&daemon)
            .env("PHRONY_ACTOR", "ci-bob")
            .args(["agents", "rollback", AGENT, "--to", "1.1.0"])),
        "rolled back lifecycle/triage to 1.1.0 (was: 1.0.0)\n"
    );

    // Without PHRONY_ACTOR the OS user is recorded.
    let mut as_os_user = daemon.phrony();
    as_os_user.env("USER", "os-carol").env_remove("LOGNAME");
    ok(as_os_user.args(["agents", "deploy", "lifecycle/triage@1.1.0"]));

    // history: newest first, with actors and actions.
    let history_header = ["VERSION", "ACTION", "ACTOR", "CREATED_AT"];
    let history = ok(phrony(&daemon).args(["agents", "history", AGENT]));
    assert_aligned(&history, &history_header);
    insta::assert_snapshot!("agents_history", redacted(&history));
    let history = json(&ok(
        phrony(&daemon).args(["agents", "history", AGENT, "--output", "json"])
    ));
    assert_eq!(history.as_array().unwrap().len(), 5);
    assert_timestamp(history[0]["created_at"].as_str().unwrap());

    // deprecate, retire and their refusals.
    assert_eq!(
        ok(phrony(&daemon).args(["agents", "deprecate", "lifecycle/triage@1.0.0"])),
        format!(
            "deprecated lifecycle/triage@1.0.0 (id: {})\n",
            id_of("1.0.0")
        )
    );
    let again = fails(phrony(&daemon).args(["agents", "deprecate", "lifecycle/triage@1.0.0"]));
    assert!(again.starts_with("Error: deprecate: "), "{again}");
    assert!(again.trim_end().ends_with("(NotFound)"), "{again}");
    let retired = json(&ok(phrony(&daemon).args([
        "agents",
        "retire",
        "lifecycle/triage@1.0.0",
        "--output",
        "json",
    ])));
    assert_eq!(retired["version_id"], id_of("1.0.0"));
    assert_eq!(retired["status"], "retired");
    let refused = fails(phrony(&daemon).args(["agents", "deploy", "lifecycle/triage@1.0.0"]));
    assert!(
        refused.contains("is retired and cannot be deployed"),
        "{refused}"
    );
    assert!(
        refused.trim_end().ends_with("(FailedPrecondition)"),
        "{refused}"
    );
    let refused = fails(phrony(&daemon).args(["agents", "rollback", AGENT, "--to", "1.0.0"]));
    assert!(refused.starts_with("Error: rollback: "), "{refused}");
    assert!(refused.contains("retired"), "{refused}");
    let again = fails(phrony(&daemon).args(["agents", "retire", "lifecycle/triage@1.0.0"]));
    assert!(again.trim_end().ends_with("(NotFound)"), "{again}");
    let rows = table(&ok(phrony(&daemon).args(["agents", "versions", AGENT])));
    assert_eq!(
        (rows[2][0].as_str(), rows[2][4].as_str()),
        ("1.0.0", "retired")
    );
    let unknown = fails(phrony(&daemon).args(["agents", "deploy", "lifecycle/triage@9.9.9"]));
    assert!(unknown.trim_end().ends_with("(NotFound)"), "{unknown}");
    assert!(unknown.contains("9.9.9"), "{unknown}");

    // archive: then no new versions.
    assert_eq!(
        ok(phrony(&daemon).args(["agents", "archive", AGENT])),
        "archived agent lifecycle/triage (all versions deprecated)\n"
    );
    let again = fails(phrony(&daemon).args(["agents", "archive", AGENT]));
    assert!(
        again.trim_end().ends_with("(FailedPrecondition)"),
        "{again}"
    );
    write_agent(dir, "1.2.0", "Route tickets.");
    let refused = fails(phrony(&daemon).args(["agents", "publish", manifest]));
    assert!(
        refused.contains("is archived and cannot accept new versions"),
        "{refused}"
    );
    assert!(
        refused.trim_end().ends_with("(FailedPrecondition)"),
        "{refused}"
    );
    let rows = table(&ok(phrony(&daemon).args(["agents", "versions", AGENT])));
    assert_eq!(
        rows[1][4], "deprecated",
        "archiving deprecates every version"
    );

    // ls: archived agents stay listed.
    let ls_header = ["ID", "NAMESPACE", "NAME", "OWNER", "STATUS"];
    let ls = ok(phrony(&daemon).args(["agents", "ls"]));
    assert_aligned(&ls, &ls_header);
    insta::assert_snapshot!("agents_ls_archived", redacted(&ls));
    assert_eq!(
        ok(phrony(&daemon).args(["agents", "ls", "-n", "elsewhere"])),
        "ID  NAMESPACE  NAME  OWNER  STATUS\n"
    );
    let listed = json(&ok(phrony(&daemon).args([
        "agents",
        "ls",
        "--namespace",
        "lifecycle",
        "--output",
        "json",
    ])));
    assert_eq!(listed[0]["name"], "triage");
    assert_eq!(listed[0]["status"], "archived");
    assert_timestamp(listed[0]["archived_at"].as_str().unwrap());
}

#[test]
fn lifecycle_on_sqlite() {
    lifecycle(Backend::Sqlite);
}

#[test]
fn lifecycle_on_postgres() {
    lifecycle(Backend::Postgres);
}

/// `agents inspect` shows one `pin:` line per tool a worker serves, the pin `phrony tools pin`
/// prints for the Tool document (the refund example's bindings override neither description
/// nor schema); JSON lists them as `tool_pins`.
#[test]
fn inspect_shows_the_pins_tools_pin_prints() {
    let Some(daemon) = Daemon::start(Backend::Sqlite) else {
        return;
    };
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies-examples/refund-agent");
    ok(phrony(&daemon)
        .args(["agents", "publish"])
        .arg(example.join("agent.yaml"))
        .env("OPENAI_API_KEY", "sk-test"));
    let printed = ok(phrony(&daemon)
        .args(["tools", "pin"])
        .arg(example.join("tools/orders.lookup-order.yaml"))
        .arg(example.join("tools/payments.issue-refund.yaml")));
    let expected: Vec<String> = printed.lines().map(str::to_owned).collect();
    assert_eq!(expected.len(), 2, "{printed}");
    let inspect = ok(phrony(&daemon).args(["agents", "inspect", "support/refund-agent@0.1.0"]));
    let pins: Vec<String> = table(&inspect)
        .into_iter()
        .filter(|row| row[0] == "pin:")
        .map(|row| row[1].clone())
        .collect();
    assert_eq!(pins, expected, "{inspect}");
    let inspected = json(&ok(phrony(&daemon).args([
        "agents",
        "inspect",
        "support/refund-agent@0.1.0",
        "--output",
        "json",
    ])));
    let listed: Vec<String> = inspected["tool_pins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}@{} {}",
                p["tool"].as_str().unwrap(),
                p["version"].as_str().unwrap(),
                p["pin"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(listed, expected);
}

#[test]
fn unreachable_runtime_says_where_and_how_to_start_it() {
    let addr = format!("127.0.0.1:{}", daemon::free_port());
    let expected = format!(
        "Error: cannot reach the phrony runtime at {addr} (connection refused)\n  \
         start it with: phrony-runtime  (or set --runtime-addr / PHRONY_RUNTIME_ADDR)\n"
    );
    let by_flag = fails(daemon::phrony().args(["--runtime-addr", &addr, "agents", "ls"]));
    assert_eq!(by_flag, expected);
    let by_env = fails(
        daemon::phrony()
            .env("PHRONY_RUNTIME_ADDR", &addr)
            .args(["agents", "active", AGENT]),
    );
    assert_eq!(by_env, expected);

    // A malformed agent reference is reported before any connection is tried.
    for (args, message) in [
        (
            vec!["agents", "active", "triage"],
            r#"agent must be namespace/name, got "triage""#,
        ),
        (
            vec!["agents", "deploy", AGENT],
            r#"agent reference must include @version, got "lifecycle/triage""#,
        ),
        (
            vec!["agents", "inspect", "lifecycle/triage@"],
            r#"agent version must not be empty after @ in "lifecycle/triage@""#,
        ),
    ] {
        let stderr = fails(
            daemon::phrony()
                .env("PHRONY_RUNTIME_ADDR", &addr)
                .args(&args),
        );
        assert_eq!(stderr, format!("Error: {message}\n"), "{args:?}");
    }

    // status still reports what it knows, then fails.
    let out = run(daemon::phrony().args(["--runtime-addr", &addr, "status"]));
    assert_eq!(out.code, Some(1));
    assert!(out.stdout.contains("? UNKNOWN"), "{}", out.stdout);
    assert!(
        out.stdout.contains(&format!("Runtime Address  {addr}")),
        "{}",
        out.stdout
    );
    assert_eq!(out.stderr, expected);
    let out = run(daemon::phrony().args(["--runtime-addr", &addr, "status", "--output", "json"]));
    assert_eq!(out.code, Some(1));
    let status = json(&out.stdout);
    assert_eq!(status["health"], "unreachable");
    assert_eq!(status["runtime_version"], Value::Null);
}
