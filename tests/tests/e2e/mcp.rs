//! An MCP-backed tool end to end: the real `phrony-runtime` (scripted `stub` model) and the real
//! `phrony` CLI, the tool served by the fake Streamable-HTTP MCP server on 127.0.0.1. The
//! secret the CLI resolves from the environment reaches the server as the bearer token and
//! nothing the runtime records, prints or logs.

use std::path::Path;
use std::time::{Duration, Instant};

use phrony_test_support::fake_mcp::{FakeMcp, FakeTool};
use serde_json::{Value, json};
use tests::cli::{json, ok};
use tests::daemon::Backend;
use tests::stub::{publish_and_deploy, stub_daemon, write_stub_script};

const AGENT: &str = "research/mcp-agent";
const TOKEN_VAR: &str = "PHRONY_TEST_MCP_TOKEN";
const TOKEN: &str = "mcp-tok-7c1e5a";

fn write_agent(dir: &Path, url: &str) {
    std::fs::write(
        dir.join("agent.yaml"),
        format!(
            "apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: mcp-agent
  namespace: research
  version: 0.1.0
secrets:
  stub_key:
    fromEnv: PHRONY_TEST_STUB_KEY
  search_token:
    fromEnv: {TOKEN_VAR}
spec:
  purpose: Answer with the search server.
  instructions:
    text: Search, then answer.
  model:
    provider: stub
    name: scripted
    secret: stub_key
  mcp_servers:
    - name: search
      url: {url}
      auth: {{scheme: bearer, secret: search_token}}
  tools:
    - ref: search.web
      as: web_search
      side_effect_class: read_only
      input_schema:
        inline: {{type: object, properties: {{q: {{type: string}}}}, required: [q]}}
      mcp: {{server: search}}
"
        ),
    )
    .unwrap();
    write_stub_script(
        dir,
        &json!([
            [
                {"type": "tool_call", "name": "web_search", "args": {"q": "phrony mcp"}},
                {"type": "completed", "stop_reason": "tool_use"}
            ],
            [
                {"type": "text_delta", "text": "Found it."},
                {"type": "completed", "stop_reason": "end_turn"}
            ]
        ]),
    );
}

#[test]
fn an_mcp_tool_runs_through_the_daemon_and_its_token_is_never_recorded() {
    let Some(daemon) = stub_daemon(Backend::Sqlite) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(FakeMcp::start(vec![FakeTool::echo("web_search")]));
    server.require_header("authorization", &format!("Bearer {TOKEN}"));
    let project = tempfile::tempdir().unwrap();
    write_agent(project.path(), &server.url());
    publish_and_deploy(&daemon, project.path(), AGENT);
    let started = ok(tests::cli::phrony(&daemon, "ci")
        .env(TOKEN_VAR, TOKEN)
        .env("PHRONY_TEST_STUB_KEY", "unused")
        .args(["run", AGENT, "--input", "Search for phrony mcp."]));
    let id = started
        .strip_prefix("session ")
        .and_then(|r| r.strip_suffix(" started\n"))
        .unwrap_or_else(|| panic!("unexpected run output: {started:?}"))
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let inspected: Value = loop {
        let inspected = json(&ok(tests::cli::phrony(&daemon, "ci")
            .args(["sessions", "inspect", &id, "--output", "json"])));
        let status = inspected["session"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if ["completed", "failed", "cancelled"].contains(&status.as_str()) {
            break inspected;
        }
        assert!(
            Instant::now() < deadline,
            "session {id} is still {status}\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        inspected["session"]["status"],
        "completed",
        "{inspected:#}\n{}",
        daemon.logs()
    );
    let calls = server.requests_of("tools/call");
    assert_eq!(calls.len(), 1, "{:?}", server.requests());
    assert_eq!(calls[0].params["name"], "web_search");
    assert_eq!(calls[0].params["arguments"], json!({"q": "phrony mcp"}));
    assert_eq!(
        calls[0].header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let text = inspected.to_string();
    assert!(
        text.contains("mcp:search"),
        "the server is the call's provenance: {inspected:#}"
    );
    assert!(text.contains("phrony mcp"), "{inspected:#}");
    let plain = ok(tests::cli::phrony(&daemon, "ci").args(["sessions", "inspect", &id]));
    for (what, seen) in [
        ("inspect JSON", text),
        ("inspect", plain),
        ("daemon log", daemon.logs()),
    ] {
        assert!(!seen.contains(TOKEN), "the token is in the {what}:\n{seen}");
    }
    drop(server);
}

/// `phrony agents validate --mcp` against the fake server: a bound tool the server does not
/// list is an error and a schema that differs a warning, each at the binding's position; a
/// matching agent is valid. No daemon is involved.
#[test]
fn validate_mcp_checks_the_bindings_against_the_servers_tools() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(FakeMcp::start(vec![FakeTool::echo("web_search").schema(
        json!({
            "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]
        }),
    )]));
    server.require_header("authorization", &format!("Bearer {TOKEN}"));
    let project = tempfile::tempdir().unwrap();
    write_agent(project.path(), &server.url());
    let manifest = project.path().join("agent.yaml");
    let validate = || {
        let mut cmd = tests::daemon::phrony();
        cmd.env(TOKEN_VAR, TOKEN)
            .env("PHRONY_TEST_STUB_KEY", "unused")
            .args(["agents", "validate", "--mcp"])
            .arg(&manifest);
        cmd
    };
    let out = ok(&mut validate());
    assert_eq!(
        out,
        "valid: research/mcp-agent 0.1.0 (1 MCP bindings checked against their servers)\n"
    );
    // The server renames its tool and loosens its schema.
    server.set_tools(vec![FakeTool::echo("search_web"), FakeTool::echo("fetch")]);
    let err = tests::cli::fails(&mut validate());
    let file = manifest.display();
    assert!(
        err.contains(&format!(
            "{file}:30:7: error: spec.tools[0].mcp: MCP server `search` has no tool `web_search` \
             (it lists: fetch, search_web)"
        )),
        "{err}"
    );
    server.set_tools(vec![FakeTool::echo("web_search")]);
    let out = tests::cli::run(&mut validate());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "{file}:28:7: warning: spec.tools[0].input_schema: differs from the inputSchema MCP \
             server `search` lists for `web_search`: {{\"type\":\"object\"}}"
        )),
        "{}",
        out.stderr
    );
    // Without the secret the server cannot be checked: said at the server's auth.
    let mut cmd = tests::daemon::phrony();
    cmd.env("PHRONY_TEST_STUB_KEY", "unused")
        .env_remove(TOKEN_VAR)
        .args(["agents", "validate", "--mcp"])
        .arg(&manifest);
    let err = tests::cli::fails(&mut cmd);
    assert!(
        err.contains(&format!(
            "set {TOKEN_VAR} (secret `search_token`) to check this server"
        )),
        "{err}"
    );
}
