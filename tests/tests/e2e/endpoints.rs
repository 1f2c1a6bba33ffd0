//! Secrets follow the deployed version's endpoints (issue #12), end to end: the real daemon in
//! `required` mode, the real CLI with a publisher's and a runner's token, and two fake
//! OpenAI-compatible servers A and B that record what they receive. The publisher deploys v1
//! (base_url A) and publishes v2 (base_url B); whatever the runner does — run the active version,
//! name v2, run after a refused deploy of v2 — the operator's `OPENAI_API_KEY` reaches A only,
//! never B. Deploying v2 with `--allow-new-secret-endpoints` is allowed and recorded.
//!
//! The same rule for bundles (issue #17): `phrony bundles deploy`, `bundles rollback` and
//! `agents deploy …@sha256:` of `tests/fixtures/bundles/endpoint-desk`, whose next version has a
//! member send the key to another endpoint: refused (exit 1, the runtime's message naming the
//! member), allowed with `--allow-new-secret-endpoints` (the change printed and recorded), and a
//! rollback to an earlier deployment is no change.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use phrony_test_support::fake_api::{FakeServer, Reply, openai_sse};
use serde_json::{Value, json};
use tests::cli::{fails, json, ok, run};
use tests::daemon::{Backend, Daemon};

const AGENT: &str = "endpoints/chat";
const OPERATOR_KEY: &str = "sk-operator-key-never-for-b";
const WAIT: Duration = Duration::from_secs(60);

/// Creates a token with `role`; returns the secret (the last line of stdout).
fn token(daemon: &Daemon, name: &str, role: &str) -> String {
    let out = ok(daemon
        .runtime()
        .args(["tokens", "create", "--name", name, "--role", role]));
    out.lines().last().unwrap().to_owned()
}

/// The CLI presenting `token`, with the operator's key in its environment.
fn with(daemon: &Daemon, token: &str) -> Command {
    let mut cmd = daemon.phrony();
    cmd.env("PHRONY_TOKEN", token)
        .env("OPENAI_API_KEY", OPERATOR_KEY)
        .env_remove("PHRONY_ACTOR")
        .env_remove("PHRONY_NO_TUI");
    cmd
}

/// `endpoints/chat` at `version`, its key sent to `base_url` (provider `openai-compatible`).
fn write_agent(dir: &Path, version: &str, base_url: &str) -> PathBuf {
    let path = dir.join(format!("agent-{version}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: chat
  namespace: endpoints
  version: {version}
secrets:
  openai:
    fromEnv: OPENAI_API_KEY
spec:
  purpose: Chat.
  instructions:
    text: Answer briefly.
  model:
    provider: openai-compatible
    base_url: {base_url}
    secret: openai
    name: gpt-4o
"
        ),
    )
    .unwrap();
    path
}

fn answer(text: &str) -> Reply {
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_726_000_000,
            "model": "gpt-4o", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        })
    };
    Reply::sse(&openai_sse(&[
        chunk(json!({"role": "assistant", "content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
    ]))
}

/// The `Authorization` headers a server received.
fn authorizations(server: &FakeServer) -> Vec<String> {
    server
        .received()
        .iter()
        .map(|r| r.headers.get("authorization").cloned().unwrap_or_default())
        .collect()
}

/// Waits until `server` has received `n` requests.
fn wait_for_requests(server: &FakeServer, n: usize) {
    let start = Instant::now();
    while server.received().len() < n {
        assert!(
            start.elapsed() < WAIT,
            "{n} requests expected, got {:?}",
            server.received()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn secrets_follow_deployed_endpoints(backend: Backend) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let a = rt.block_on(FakeServer::start(vec![
        answer("from A"),
        answer("from A again"),
    ]));
    let b = rt.block_on(FakeServer::start(Vec::new()));
    let (url_a, url_b) = (format!("{}/v1", a.origin()), format!("{}/v1", b.origin()));
    let Some(daemon) = Daemon::start_with_env(backend, &[("RUNTIME_AUTH", "required")]) else {
        return;
    };
    let publisher = token(&daemon, "ci-publisher", "publisher");
    let runner = token(&daemon, "support-runner", "runner");
    let project = tempfile::tempdir().unwrap();
    let v1 = write_agent(project.path(), "1.0.0", &url_a);
    let v2 = write_agent(project.path(), "2.0.0", &format!("{url_b}/"));

    ok(with(&daemon, &publisher)
        .args(["agents", "publish"])
        .arg(&v1));
    let first = ok(with(&daemon, &publisher).args(["agents", "deploy", &format!("{AGENT}@1.0.0")]));
    assert!(
        first.starts_with("deployed endpoints/chat@1.0.0 at "),
        "{first}"
    );
    assert_eq!(
        first.lines().count(),
        1,
        "a first deployment is no change: {first}"
    );

    // diff shows where v2 would send the key, besides the line diff.
    let diff = ok(with(&daemon, &publisher)
        .args(["agents", "diff"])
        .arg(&v2)
        .arg(format!("{AGENT}@1.0.0")));
    assert!(
        diff.lines().any(|l| l
            == format!(
                "secret \"openai\" (OPENAI_API_KEY) would be sent to {url_b} \
                 (published version: {url_a})"
            )),
        "{diff}"
    );

    // Publishing v2 is fine; deploying it is refused (exit 1), naming both endpoints.
    ok(with(&daemon, &publisher)
        .args(["agents", "publish"])
        .arg(&v2));
    let refused =
        fails(with(&daemon, &publisher).args(["agents", "deploy", &format!("{AGENT}@2.0.0")]));
    assert!(
        refused.contains(&format!(
            "secret \"openai\" (OPENAI_API_KEY) is now sent to {url_b} (previous deployments: {url_a})"
        )),
        "{refused}"
    );
    assert!(
        refused.contains("--allow-new-secret-endpoints"),
        "{refused}"
    );
    assert!(
        refused.contains("FailedPrecondition") || refused.contains("failed precondition"),
        "{refused}"
    );

    // The runner cannot pick v2 by name: only the active deployment runs.
    {
        let agent = format!("{AGENT}@2.0.0");
        let out = run(with(&daemon, &runner).args(["run", &agent, "--input", "hi"]));
        assert_eq!(out.code, Some(1), "{out:?}");
        assert!(
            out.stderr.contains("not the active deployment"),
            "{}",
            out.stderr
        );
    }
    // Running the agent uses v1: the key goes to A.
    let started = ok(with(&daemon, &runner).args(["run", AGENT, "--input", "hi"]));
    assert!(started.starts_with("session run_"), "{started}");
    wait_for_requests(&a, 1);
    assert_eq!(authorizations(&a), [format!("Bearer {OPERATOR_KEY}")]);
    assert!(b.received().is_empty(), "B was reached: {:?}", b.received());

    // The publisher allows it knowingly: deployed, the change printed and recorded.
    let allowed = ok(with(&daemon, &publisher).args([
        "agents",
        "deploy",
        &format!("{AGENT}@2.0.0"),
        "--allow-new-secret-endpoints",
    ]));
    assert!(
        allowed.starts_with("deployed endpoints/chat@2.0.0 (previous: 1.0.0) at "),
        "{allowed}"
    );
    assert_eq!(
        allowed.lines().nth(1),
        Some(
            format!(
                "secret \"openai\" (OPENAI_API_KEY) is now sent to {url_b} (previous deployments: {url_a})"
            )
            .as_str()
        ),
        "{allowed}"
    );
    let exported = ok(with(&daemon, &runner).args(["audit", "export"]));
    let deployed: Vec<Value> = exported
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "agent.deployed")
        .collect();
    assert_eq!(deployed.len(), 2, "{exported}");
    assert_eq!(
        deployed[1]["payload"]["secret_endpoint_changes"],
        json!([{"secret": "openai", "from_env": "OPENAI_API_KEY", "endpoint": url_b, "previous": [url_a]}]),
        "{exported}"
    );
    assert_eq!(
        deployed[0]["payload"]["secret_endpoints"],
        json!([{"secret": "openai", "from_env": "OPENAI_API_KEY", "endpoint": url_a}])
    );
    assert!(b.received().is_empty(), "B was reached before v2 ran");

    // Back to v1: deployed before, so no flag is needed and nothing is printed about secrets.
    let back = ok(with(&daemon, &publisher).args(["agents", "rollback", AGENT, "--to", "1.0.0"]));
    assert_eq!(back, "rolled back endpoints/chat to 1.0.0 (was: 2.0.0)\n");
    let history = ok(with(&daemon, &runner).args(["agents", "history", AGENT]));
    assert_eq!(
        history.lines().count(),
        4,
        "a header and three rows: {history}"
    );
    drop(daemon);
    drop(rt);
}

#[test]
fn secrets_follow_deployed_endpoints_on_sqlite() {
    secrets_follow_deployed_endpoints(Backend::Sqlite);
}

#[test]
fn secrets_follow_deployed_endpoints_on_postgres() {
    secrets_follow_deployed_endpoints(Backend::Postgres);
}

const DESK: &str = "endpoints/desk";
/// The endpoint both members of the `endpoint-desk` fixture send `OPENAI_API_KEY` to.
const DESK_A: &str = "http://a.example:8080/v1";

/// The CLI acting as `ci-alice` in `local` mode, with `OPENAI_API_KEY` set (so that `bundles
/// lock` and `publish` warn about nothing). Nothing is ever sent to the fixture's hosts: no
/// session runs.
fn desk_cli(daemon: &Daemon) -> Command {
    let mut cmd = tests::cli::phrony(daemon, "ci-alice");
    cmd.env("OPENAI_API_KEY", "set");
    cmd
}

/// Points `member` of the copied fixture at `to` instead of `from`, bumps the bundle to
/// `version`, locks and publishes it.
fn publish_desk(
    daemon: &Daemon,
    bundle_yaml: &Path,
    edit: Option<(&str, &str, &str)>,
    version: &str,
) {
    if let Some((member, from, to)) = edit {
        let file = bundle_yaml.with_file_name(member);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains(from), "{member}: {text}");
        std::fs::write(&file, text.replace(from, to)).unwrap();
        let bundle = std::fs::read_to_string(bundle_yaml).unwrap();
        let bumped: String = bundle
            .lines()
            .map(|l| {
                if l.starts_with("  version: ") {
                    format!("  version: {version}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(bundle_yaml, bumped).unwrap();
    }
    ok(desk_cli(daemon).args(["bundles", "lock"]).arg(bundle_yaml));
    let published = ok(desk_cli(daemon)
        .args(["bundles", "publish"])
        .arg(bundle_yaml));
    assert!(
        published.starts_with(&format!("{DESK} {version} (sha256:")),
        "{published}"
    );
}

fn bundle_secrets_follow_deployed_endpoints(backend: Backend) {
    let Some(daemon) = Daemon::start(backend) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    let fixture = tests::workspace_root().join("tests/fixtures/bundles/endpoint-desk");
    crate::bundles::copy_dir(&fixture, project.path());
    let desk = project.path().join("bundle.yaml");
    let (b, c) = ("http://b.example:8080/v1", "http://c.example:8080/v1");

    publish_desk(&daemon, &desk, None, "1.0.0");
    let first = ok(desk_cli(&daemon).args(["bundles", "deploy", &format!("{DESK}@1.0.0")]));
    assert_eq!(
        first.lines().count(),
        1,
        "a first deployment is no change: {first}"
    );

    // 1.1.0: the specialist sends the key to B. Deploying it is refused (exit 1), naming the
    // bundle version, the member and both endpoints, and the way forward.
    publish_desk(
        &daemon,
        &desk,
        Some(("specialist.yaml", DESK_A, b)),
        "1.1.0",
    );
    let change = format!(
        "member \"specialist\": secret \"openai\" (OPENAI_API_KEY) is now sent to {b} \
         (previous deployments: {DESK_A})"
    );
    let refused = fails(desk_cli(&daemon).args(["bundles", "deploy", &format!("{DESK}@1.1.0")]));
    assert!(refused.starts_with("Error: deploy: "), "{refused}");
    assert!(
        refused.contains(&format!(
            "bundle {DESK}@1.1.0 sends secrets to endpoints no earlier deployment of bundle \
             {DESK} used: {change}"
        )),
        "{refused}"
    );
    assert!(
        refused.contains("phrony bundles deploy/rollback --allow-new-secret-endpoints"),
        "{refused}"
    );
    assert!(
        refused.contains("FailedPrecondition") || refused.contains("failed precondition"),
        "{refused}"
    );
    let active = ok(desk_cli(&daemon).args(["bundles", "active", DESK]));
    assert!(active.starts_with(&format!("{DESK}@1.0.0 ")), "{active}");

    // Allowed knowingly: deployed, the change printed under the deployment line.
    let allowed = ok(desk_cli(&daemon).args([
        "bundles",
        "deploy",
        &format!("{DESK}@1.1.0"),
        "--allow-new-secret-endpoints",
    ]));
    let lines: Vec<&str> = allowed.lines().collect();
    assert!(
        lines[0].starts_with(&format!("deployed {DESK}@1.1.0 (sha256:")),
        "{allowed}"
    );
    assert_eq!(lines[1..], [change.as_str()], "{allowed}");

    // Back to 1.0.0: deployed before, so no flag is needed and nothing is printed about secrets.
    let back = ok(desk_cli(&daemon).args(["bundles", "rollback", DESK]));
    assert_eq!(back, format!("rolled back {DESK} to 1.0.0 (was: 1.1.0)\n"));

    // 1.2.0 by its lock hash through `agents deploy`: the front desk to C is refused, then
    // allowed (the flag goes with the forwarded bundle deployment); JSON names the member.
    publish_desk(
        &daemon,
        &desk,
        Some(("front-desk.yaml", DESK_A, c)),
        "1.2.0",
    );
    let hash = json(&ok(desk_cli(&daemon).args([
        "bundles",
        "inspect",
        &format!("{DESK}@1.2.0"),
        "--output",
        "json",
    ])))["lock_hash"]
        .as_str()
        .unwrap()
        .to_owned();
    let by_hash = format!("{DESK}@{hash}");
    let refused = fails(desk_cli(&daemon).args(["agents", "deploy", &by_hash]));
    assert!(
        refused.contains(&format!(
            "member \"front-desk\": secret \"openai\" (OPENAI_API_KEY) is now sent to {c}"
        )),
        "{refused}"
    );
    let allowed = json(&ok(desk_cli(&daemon).args([
        "agents",
        "deploy",
        &by_hash,
        "--allow-new-secret-endpoints",
        "--output",
        "json",
    ])));
    assert_eq!(allowed["version"], "1.2.0");
    assert_eq!(
        allowed["secret_endpoint_changes"],
        json!([{
            "member": "front-desk",
            "secret": "openai",
            "from_env": "OPENAI_API_KEY",
            "endpoint": c,
            "previous_endpoints": [DESK_A, b],
        }])
    );

    // The log: every activation records each member's endpoints, the allowed changes, and each
    // refusal who tried what.
    let exported = ok(desk_cli(&daemon).args(["audit", "export"]));
    let events: Vec<Value> = exported
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["stream"] == "bundle:endpoints/desk")
        .collect();
    let of = |kind: &str| -> Vec<&Value> { events.iter().filter(|e| e["type"] == kind).collect() };
    let deployed = of("bundle.deployed");
    assert_eq!(deployed.len(), 3, "{exported}");
    assert_eq!(
        deployed[1]["payload"]["secret_endpoints"],
        json!([
            {"member": "front-desk", "secret": "openai", "from_env": "OPENAI_API_KEY", "endpoint": DESK_A},
            {"member": "specialist", "secret": "openai", "from_env": "OPENAI_API_KEY", "endpoint": b},
        ])
    );
    assert_eq!(
        deployed[1]["payload"]["secret_endpoint_changes"],
        json!([{"member": "specialist", "secret": "openai", "from_env": "OPENAI_API_KEY", "endpoint": b, "previous": [DESK_A]}])
    );
    let rolled_back = of("bundle.rolled_back");
    assert_eq!(rolled_back.len(), 1, "{exported}");
    assert!(
        rolled_back[0]["payload"]
            .get("secret_endpoint_changes")
            .is_none()
    );
    let refusals: Vec<(&str, &str, &str)> = of("bundle.activation_refused")
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap(),
                e["payload"]["version"].as_str().unwrap(),
                e["payload"]["changes"][0]["member"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        refusals,
        [
            ("ci-alice", "1.1.0", "specialist"),
            ("ci-alice", "1.2.0", "front-desk")
        ]
    );
    ok(desk_cli(&daemon).args(["audit", "verify"]));
    drop(daemon);
}

#[test]
fn bundle_secrets_follow_deployed_endpoints_on_sqlite() {
    bundle_secrets_follow_deployed_endpoints(Backend::Sqlite);
}

#[test]
fn bundle_secrets_follow_deployed_endpoints_on_postgres() {
    bundle_secrets_follow_deployed_endpoints(Backend::Postgres);
}
