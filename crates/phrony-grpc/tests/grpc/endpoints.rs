//! Secrets follow the deployed versions' endpoints (issue #12): Deploy and Rollback over real
//! gRPC on the whole daemon assembly, on SQLite and PostgreSQL. The daemon's provider
//! configuration sets `OPENAI_BASE_URL`, so provider `openai` resolves to that root; no session
//! runs, so nothing is sent anywhere.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::sync::Arc;
use std::time::Duration;

use phrony_engine::DefaultProviderFactory;
use phrony_ledger::{DeploymentAction, EventBody, Ledger, SecretEndpoint};
use phrony_manifest::CompiledAgent;
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_providers::ProviderEnv;
use phrony_runtime::{SecretsKey, ServeConfig};
use phrony_test_support::postgres::PgDatabase;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;

const A: &str = "http://a.example:8080/v1";
const B: &str = "http://b.example:8080/v1";
const PROXY: &str = "http://proxy.internal/v1";

/// An agent `endpoints/chat` at `version` whose key (`OPENAI_API_KEY`) goes to `base_url`
/// (provider `openai-compatible`), or to the daemon's OpenAI root when `base_url` is empty.
fn agent(version: &str, base_url: &str) -> CompiledAgent {
    let dir = tempfile::tempdir().unwrap();
    let model = if base_url.is_empty() {
        "    provider: openai\n".to_owned()
    } else {
        format!("    provider: openai-compatible\n    base_url: {base_url}/\n    secret: openai\n")
    };
    let yaml = format!(
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
{model}    name: gpt-4o
"
    );
    std::fs::write(dir.path().join("agent.yaml"), yaml).unwrap();
    match phrony_manifest::load_agent(dir.path().join("agent.yaml")) {
        Ok(c) => c.agent,
        Err(d) => panic!("the test agent does not compile:\n{d}"),
    }
}

fn agent_ref(version: &str) -> pb::AgentRef {
    pb::AgentRef {
        namespace: "endpoints".into(),
        name: "chat".into(),
        version: version.into(),
    }
}

struct Server {
    url: String,
    client: RuntimeClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(url: &str) -> Self {
        let ledger = Ledger::connect(url).await.unwrap();
        ledger.migrate().await.unwrap();
        let listener = phrony_runtime::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().to_string();
        let mut config = ServeConfig::new(SecretsKey::from_bytes([7; 32]));
        config.providers = Some(Arc::new(DefaultProviderFactory::new(ProviderEnv {
            openai_base_url: Some(format!("{PROXY}/")),
            ..ProviderEnv::default()
        })));
        config.default_actor = "runtime-default".into();
        config.shutdown_grace = Duration::from_secs(2);
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            phrony_runtime::serve(listener, ledger, config, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let client = RuntimeClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        Self {
            url: url.to_owned(),
            client,
            stop: Some(stop),
            task,
        }
    }

    async fn publish(&mut self, agent: &CompiledAgent) {
        self.client
            .publish(pb::PublishRequest {
                manifest: agent.snapshot_json(),
                actor: "publisher".into(),
            })
            .await
            .unwrap();
    }

    async fn deploy(
        &mut self,
        version: &str,
        allow: bool,
    ) -> Result<pb::DeployResponse, tonic::Status> {
        self.client
            .deploy(pb::DeployRequest {
                agent_ref: Some(agent_ref(version)),
                actor: "publisher".into(),
                allow_new_secret_endpoints: allow,
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn rollback(
        &mut self,
        to: &str,
        allow: bool,
    ) -> Result<pb::RollbackResponse, tonic::Status> {
        self.client
            .rollback(pb::RollbackRequest {
                agent_ref: Some(agent_ref("")),
                to_version: to.into(),
                actor: "publisher".into(),
                allow_new_secret_endpoints: allow,
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn active(&mut self) -> String {
        self.client
            .get_active_version(pb::GetActiveVersionRequest {
                agent_ref: Some(agent_ref("")),
            })
            .await
            .unwrap()
            .into_inner()
            .version
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the server did not stop")
            .unwrap();
    }
}

fn change(secret_endpoint: &str, previous: &[&str]) -> pb::SecretEndpointChange {
    pb::SecretEndpointChange {
        secret: "openai".into(),
        from_env: "OPENAI_API_KEY".into(),
        endpoint: secret_endpoint.into(),
        previous_endpoints: previous.iter().map(|p| (*p).to_owned()).collect(),
        member: String::new(),
    }
}

async fn secrets_follow_deployed_endpoints(url: &str) {
    let mut s = Server::start(url).await;
    for (version, base) in [("1.0.0", A), ("2.0.0", B), ("3.0.0", "")] {
        s.publish(&agent(version, base)).await;
    }

    // The first deployment is not a change.
    let first = s.deploy("1.0.0", false).await.unwrap();
    assert!(first.secret_endpoint_changes.is_empty(), "{first:?}");

    // A version sending the key elsewhere is refused, naming the secret and both endpoints.
    let refused = s.deploy("2.0.0", false).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        refused.message(),
        format!(
            "endpoints/chat@2.0.0 sends secrets to endpoints no earlier deployment of \
             endpoints/chat used: secret \"openai\" (OPENAI_API_KEY) is now sent to {B} \
             (previous deployments: {A}); check that these endpoints are meant to receive them, \
             then repeat with allow_new_secret_endpoints (phrony agents deploy/rollback \
             --allow-new-secret-endpoints)"
        )
    );
    // The daemon's OpenAI root is a destination like any other.
    let refused = s.deploy("3.0.0", false).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains(&format!("is now sent to {PROXY} (")),
        "{refused:?}"
    );
    assert_eq!(
        s.active().await,
        "1.0.0",
        "a refused deploy changes nothing"
    );

    // Allowed explicitly: deployed, and the change is answered.
    let allowed = s.deploy("2.0.0", true).await.unwrap();
    assert_eq!(allowed.previous_version, "1.0.0");
    assert_eq!(allowed.secret_endpoint_changes, [change(B, &[A])]);

    // Back to the previous deployment: both endpoints were deployed before.
    let back = s.rollback("", false).await.unwrap();
    assert_eq!(
        (back.version.as_str(), back.previous_version.as_str()),
        ("1.0.0", "2.0.0")
    );
    assert!(back.secret_endpoint_changes.is_empty());
    let again = s.deploy("2.0.0", false).await.unwrap();
    assert!(
        again.secret_endpoint_changes.is_empty(),
        "B was deployed before"
    );

    // A rollback to a version never deployed is checked like a deploy.
    let refused = s.rollback("3.0.0", false).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains(&format!("previous deployments: {A}, {B}")),
        "{refused:?}"
    );
    let rolled = s.rollback("3.0.0", true).await.unwrap();
    assert_eq!(rolled.secret_endpoint_changes, [change(PROXY, &[A, B])]);
    assert_eq!(s.active().await, "3.0.0");

    // The events record where each activation sends the key, and what was allowed.
    let ledger = Ledger::connect(&s.url).await.unwrap();
    let events: Vec<_> = ledger
        .export_events(None, None, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.stream == "agent:endpoints/chat")
        .filter(|e| e.event_type == "agent.deployed" || e.event_type == "agent.rolled_back")
        .collect();
    let recorded: Vec<(String, Vec<String>, usize)> = events
        .iter()
        .map(|e| {
            let (EventBody::AgentDeployed(a) | EventBody::AgentRolledBack(a)) = e.body().unwrap()
            else {
                panic!("{e:?}");
            };
            let endpoints = a
                .secret_endpoints
                .unwrap()
                .into_iter()
                .map(|SecretEndpoint { endpoint, .. }| endpoint)
                .collect();
            (a.version, endpoints, a.secret_endpoint_changes.len())
        })
        .collect();
    let row = |v: &str, e: &str, n| (v.to_owned(), vec![e.to_owned()], n);
    assert_eq!(
        recorded,
        [
            row("1.0.0", A, 0),
            row("2.0.0", B, 1),
            row("1.0.0", A, 0),
            row("2.0.0", B, 0),
            row("3.0.0", PROXY, 1),
        ]
    );
    assert!(events[1].payload["secret_endpoint_changes"][0]["previous"] == serde_json::json!([A]));

    // Each refusal is recorded: who tried to activate which version, and where the key would
    // have gone.
    let refusals: Vec<(String, String, DeploymentAction, Vec<String>)> = ledger
        .export_events(None, None, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.stream == "agent:endpoints/chat")
        .filter_map(|e| match e.body().unwrap() {
            EventBody::AgentActivationRefused(r) => Some((
                e.actor.clone(),
                r.version,
                r.action,
                r.changes.into_iter().map(|c| c.endpoint).collect(),
            )),
            _ => None,
        })
        .collect();
    let refusal =
        |v: &str, a, e: &str| ("publisher".to_owned(), v.to_owned(), a, vec![e.to_owned()]);
    assert_eq!(
        refusals,
        [
            refusal("2.0.0", DeploymentAction::Deploy, B),
            refusal("3.0.0", DeploymentAction::Deploy, PROXY),
            refusal("3.0.0", DeploymentAction::Rollback, PROXY),
        ]
    );
    assert!(
        ledger
            .verify_stream("agent:endpoints/chat")
            .await
            .unwrap()
            .violation
            .is_none()
    );
    ledger.close().await;
    s.stop().await;
}

#[tokio::test]
async fn secrets_follow_deployed_endpoints_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
    secrets_follow_deployed_endpoints(&url).await;
}

#[tokio::test]
async fn secrets_follow_deployed_endpoints_on_postgres() {
    let Some(pg) = PgDatabase::create().await else {
        return;
    };
    secrets_follow_deployed_endpoints(pg.url()).await;
}
