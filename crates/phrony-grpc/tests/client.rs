//! The typed client against the real server in-process (SQLite ledger, real TCP): every method,
//! the actor it records, the idempotent re-publish flag, and errors that keep code and message.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::path::Path;
use std::time::Duration;

use phrony_client::{AgentName, Client, ClientError, Code, Health, VersionStatus};
use phrony_ledger::Ledger;
use phrony_manifest::CompiledAgent;
use phrony_runtime::{SecretsKey, ServeConfig};
use tokio::sync::oneshot;

fn compile(dir: &Path, version: &str, purpose: &str) -> CompiledAgent {
    std::fs::write(
        dir.join("agent.yaml"),
        format!(
            "apiVersion: phrony.com/v1\nkind: Agent\nmetadata:\n  name: triage\n  \
             namespace: lifecycle\n  version: {version}\n  owner: platform-team\nspec:\n  \
             purpose: {purpose}\n  instructions:\n    text: Read the ticket and pick a queue.\n  \
             model:\n    provider: openai\n    name: gpt-4o\n"
        ),
    )
    .unwrap();
    phrony_manifest::load_agent(dir.join("agent.yaml"))
        .unwrap_or_else(|d| panic!("fixture does not compile:\n{d}"))
        .agent
}

struct Server {
    addr: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
        let ledger = Ledger::connect(&url).await.unwrap();
        ledger.migrate().await.unwrap();
        let listener = phrony_runtime::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().to_string();
        let mut config = ServeConfig::new(SecretsKey::generate().unwrap());
        config.health_check_interval = Duration::from_millis(50);
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            phrony_runtime::serve(listener, ledger, config, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self {
            addr,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

fn rpc_code(result: Result<impl std::fmt::Debug, ClientError>) -> (Code, String) {
    match result.unwrap_err() {
        ClientError::Rpc { code, message } => (code, message),
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

#[tokio::test]
async fn lifecycle_through_the_typed_client() {
    let server = Server::start().await;
    let client = Client::connect(&server.addr).await.unwrap();
    assert_eq!(client.addr(), server.addr);

    let version = client.get_version().await.unwrap();
    assert_eq!(version.version, env!("CARGO_PKG_VERSION"));
    let mut health = client.health().await.unwrap();
    for _ in 0..100 {
        if health == Health::Serving {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        health = client.health().await.unwrap();
    }
    assert_eq!(health, Health::Serving);

    let dir = tempfile::tempdir().unwrap();
    let agent = AgentName::new("lifecycle", "triage");
    let v1 = compile(dir.path(), "1.0.0", "Route tickets.");

    let published = client.publish(&v1, "alice").await.unwrap();
    assert!(published.created);
    assert_eq!(
        (published.agent.clone(), published.version.as_str()),
        (agent.clone(), "1.0.0")
    );
    assert_eq!(published.content_hash, v1.content_hash());

    let again = client.publish(&v1, "bob").await.unwrap();
    assert!(
        !again.created,
        "identical content is an idempotent re-publish"
    );
    assert_eq!(again.version_id, published.version_id);

    let changed = compile(dir.path(), "1.0.0", "Route tickets, faster.");
    let (code, message) = rpc_code(client.publish(&changed, "alice").await);
    assert_eq!(code, Code::AlreadyExists, "{message}");

    let found = client.get_agent_version(&agent, "1.0.0").await.unwrap();
    assert_eq!(found.published_by.as_deref(), Some("alice"));
    assert_eq!(found.manifest_json.as_bytes(), v1.snapshot_json());
    assert_eq!(found.status(), VersionStatus::Published);

    let deployed = client.deploy(&agent, "1.0.0", "carol").await.unwrap();
    assert_eq!(
        (deployed.version.as_str(), deployed.previous_version),
        ("1.0.0", None)
    );
    let active = client.active_version(&agent).await.unwrap();
    assert_eq!(
        (active.version.as_str(), active.actor.as_str()),
        ("1.0.0", "carol")
    );

    let v2 = compile(dir.path(), "1.1.0", "Route tickets, faster.");
    assert!(client.publish(&v2, "alice").await.unwrap().created);
    let deployed = client.deploy(&agent, "1.1.0", "carol").await.unwrap();
    assert_eq!(deployed.previous_version.as_deref(), Some("1.0.0"));

    let rolled = client.rollback(&agent, None, "dave").await.unwrap();
    assert_eq!(
        (rolled.version.as_str(), rolled.previous_version.as_deref()),
        ("1.0.0", Some("1.1.0"))
    );
    let rolled = client
        .rollback(&agent, Some("1.1.0"), "dave")
        .await
        .unwrap();
    assert_eq!(rolled.version, "1.1.0");

    let history = client.list_deployments(&agent).await.unwrap();
    let rows: Vec<(&str, &str, &str)> = history
        .iter()
        .map(|d| (d.version.as_str(), d.action.as_str(), d.actor.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("1.1.0", "rollback", "dave"),
            ("1.0.0", "rollback", "dave"),
            ("1.1.0", "deploy", "carol"),
            ("1.0.0", "deploy", "carol"),
        ]
    );

    let versions = client.list_agent_versions(&agent).await.unwrap();
    let labels: Vec<&str> = versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(labels, ["1.1.0", "1.0.0"], "newest publish first");

    let deprecated_id = client.deprecate(&agent, "1.0.0", "erin").await.unwrap();
    assert_eq!(deprecated_id, found_id(&versions, "1.0.0"));
    let (code, _) = rpc_code(client.deprecate(&agent, "1.0.0", "erin").await);
    assert_eq!(code, Code::NotFound);
    client.retire(&agent, "1.0.0", "erin").await.unwrap();
    let (code, message) = rpc_code(client.deploy(&agent, "1.0.0", "erin").await);
    assert_eq!(code, Code::FailedPrecondition);
    assert!(
        message.contains("is retired and cannot be deployed"),
        "{message}"
    );
    let statuses: Vec<VersionStatus> = client
        .list_agent_versions(&agent)
        .await
        .unwrap()
        .iter()
        .map(|v| v.status())
        .collect();
    assert_eq!(statuses, [VersionStatus::Published, VersionStatus::Retired]);

    client.archive(&agent, "frank").await.unwrap();
    let listed = client.list_agents(Some("lifecycle")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].agent, agent);
    assert_eq!(listed[0].owner, "platform-team");
    assert!(listed[0].archived_at.is_some());
    assert!(
        client
            .list_agents(Some("elsewhere"))
            .await
            .unwrap()
            .is_empty()
    );
    let v3 = compile(dir.path(), "1.2.0", "Route tickets.");
    let (code, message) = rpc_code(client.publish(&v3, "alice").await);
    assert_eq!(code, Code::FailedPrecondition);
    assert!(
        message.contains("is archived and cannot accept new versions"),
        "{message}"
    );

    let missing = AgentName::new("lifecycle", "nobody");
    let (code, _) = rpc_code(client.active_version(&missing).await);
    assert_eq!(code, Code::NotFound);

    server.stop().await;
    let after = client.get_version().await.unwrap_err();
    assert!(
        after.is_unreachable(),
        "a stopped runtime is unreachable, got {after:?}"
    );
}

fn found_id(versions: &[phrony_client::AgentVersionSummary], label: &str) -> String {
    versions
        .iter()
        .find(|v| v.version == label)
        .unwrap()
        .id
        .clone()
}
