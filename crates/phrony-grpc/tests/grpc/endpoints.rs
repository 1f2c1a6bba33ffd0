//! Secrets follow the deployed versions' endpoints (issues #12 and #17): Deploy and Rollback,
//! DeployBundle and RollbackBundle, over real gRPC on the whole daemon assembly, on SQLite and
//! PostgreSQL. The daemon's provider configuration sets `OPENAI_BASE_URL`, so provider `openai`
//! resolves to that root; no session runs, so nothing is sent anywhere. The bundle is
//! `tests/fixtures/bundles/endpoint-desk` (a front desk and a specialist, both sending
//! `OPENAI_API_KEY` to A), copied and re-locked for each version.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::path::{Path, PathBuf};
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

    async fn publish_bundle(&mut self, bundle_yaml: &Path) -> String {
        self.client
            .publish_bundle(crate::bundles::publish_request(bundle_yaml))
            .await
            .unwrap()
            .into_inner()
            .lock_hash
    }

    async fn deploy_bundle(
        &mut self,
        version: &str,
        allow: bool,
    ) -> Result<pb::DeployBundleResponse, tonic::Status> {
        self.client
            .deploy_bundle(pb::DeployBundleRequest {
                bundle_ref: Some(desk_ref(version)),
                actor: "publisher".into(),
                allow_new_secret_endpoints: allow,
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn rollback_bundle(
        &mut self,
        to: &str,
        allow: bool,
    ) -> Result<pb::RollbackBundleResponse, tonic::Status> {
        self.client
            .rollback_bundle(pb::RollbackBundleRequest {
                bundle_ref: Some(desk_ref("")),
                to_version: to.into(),
                actor: "publisher".into(),
                allow_new_secret_endpoints: allow,
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn active_bundle(&mut self) -> String {
        self.client
            .get_active_bundle(pb::GetActiveBundleRequest {
                bundle_ref: Some(desk_ref("")),
            })
            .await
            .unwrap()
            .into_inner()
            .version
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

const DESK_STREAM: &str = "bundle:endpoints/desk";

fn desk_ref(version: &str) -> pb::BundleRef {
    pb::BundleRef {
        namespace: "endpoints".into(),
        name: "desk".into(),
        version: version.into(),
    }
}

/// A locked copy of the `endpoint-desk` fixture (version 1.0.0, both members at A, as the
/// fixture's `http://a.example:8080/v1` is [`A`]).
fn endpoint_desk() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bundles/endpoint-desk");
    crate::bundles::copy_dir(&fixture, dir.path());
    let bundle_yaml = dir.path().join("bundle.yaml");
    phrony_manifest::lock_bundle(&bundle_yaml).unwrap();
    (dir, bundle_yaml)
}

/// The next bundle version: `member`'s file with `from` replaced by `to`, the bundle's version
/// `from_version` → `to_version`, re-locked.
fn next_version(bundle_yaml: &Path, member: &str, change: (&str, &str), versions: (&str, &str)) {
    let file = bundle_yaml.with_file_name(member);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(change.0), "{member} has no {:?}", change.0);
    std::fs::write(&file, text.replace(change.0, change.1)).unwrap();
    let bundle = std::fs::read_to_string(bundle_yaml).unwrap();
    let (from, to) = (
        format!("version: {}", versions.0),
        format!("version: {}", versions.1),
    );
    assert!(bundle.contains(&from), "{bundle}");
    std::fs::write(bundle_yaml, bundle.replace(&from, &to)).unwrap();
    phrony_manifest::lock_bundle(bundle_yaml).unwrap();
}

fn member_change(member: &str, endpoint: &str, previous: &[&str]) -> pb::SecretEndpointChange {
    pb::SecretEndpointChange {
        member: member.into(),
        ..change(endpoint, previous)
    }
}

/// (member, endpoint) pairs.
type MemberEndpoints<M> = Vec<(M, String)>;

/// Per bundle deploy or rollback event: its version, every (member, endpoint) it records, and
/// how many changes it allowed.
fn bundle_activations(
    events: &[phrony_ledger::Event],
) -> Vec<(String, MemberEndpoints<String>, usize)> {
    events
        .iter()
        .filter_map(|e| match e.body().unwrap() {
            EventBody::BundleDeployed(a) | EventBody::BundleRolledBack(a) => Some(a),
            _ => None,
        })
        .map(|a| {
            let sent = a
                .secret_endpoints
                .unwrap()
                .into_iter()
                .map(|e| (e.member.unwrap(), e.endpoint))
                .collect();
            (a.version, sent, a.secret_endpoint_changes.len())
        })
        .collect()
}

async fn bundle_secrets_follow_deployed_endpoints(url: &str) {
    let mut s = Server::start(url).await;
    let (_dir, desk) = endpoint_desk();
    let to_b = (A, B);
    s.publish_bundle(&desk).await;
    // 1.1.0: the specialist sends the key to B; 1.2.0: the front desk too; 2.0.0: the
    // specialist to the daemon's OpenAI root.
    next_version(&desk, "specialist.yaml", to_b, ("1.0.0", "1.1.0"));
    let v2_hash = s.publish_bundle(&desk).await;
    next_version(&desk, "front-desk.yaml", to_b, ("1.1.0", "1.2.0"));
    s.publish_bundle(&desk).await;
    next_version(
        &desk,
        "specialist.yaml",
        (
            &format!("provider: openai-compatible\n    base_url: {B}\n"),
            "provider: openai\n",
        ),
        ("1.2.0", "2.0.0"),
    );
    s.publish_bundle(&desk).await;

    // The first deployment is not a change.
    let first = s.deploy_bundle("1.0.0", false).await.unwrap();
    assert!(first.secret_endpoint_changes.is_empty(), "{first:?}");

    // A member sending the key elsewhere is refused (named by its lock hash too), naming the
    // bundle version, the member, the secret and both endpoints.
    let refused = s.deploy_bundle(&v2_hash, false).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        refused.message(),
        format!(
            "bundle endpoints/desk@1.1.0 sends secrets to endpoints no earlier deployment of \
             bundle endpoints/desk used: member \"specialist\": secret \"openai\" \
             (OPENAI_API_KEY) is now sent to {B} (previous deployments: {A}); check that these \
             endpoints are meant to receive them, then repeat with allow_new_secret_endpoints \
             (phrony bundles deploy/rollback --allow-new-secret-endpoints)"
        )
    );
    assert_eq!(
        s.active_bundle().await,
        "1.0.0",
        "a refused deploy changes nothing"
    );

    // Allowed explicitly: deployed, and the change is answered with its member.
    let allowed = s.deploy_bundle("1.1.0", true).await.unwrap();
    assert_eq!(allowed.previous_version, "1.0.0");
    assert_eq!(
        allowed.secret_endpoint_changes,
        [member_change("specialist", B, &[A])]
    );

    // Back to 1.0.0, forward to 1.1.0 again: both were deployed before.
    let back = s.rollback_bundle("", false).await.unwrap();
    assert_eq!(
        (back.version.as_str(), back.previous_version.as_str()),
        ("1.0.0", "1.1.0")
    );
    assert!(back.secret_endpoint_changes.is_empty(), "{back:?}");
    let forward = s.rollback_bundle("1.1.0", false).await.unwrap();
    assert!(forward.secret_endpoint_changes.is_empty(), "{forward:?}");
    // The variable's destinations are the union over the members: the front desk may now send
    // it to B, where the specialist's deployment sent it.
    let both = s.deploy_bundle("1.2.0", false).await.unwrap();
    assert!(both.secret_endpoint_changes.is_empty(), "{both:?}");

    // A rollback to a version never deployed is checked like a deploy.
    let refused = s.rollback_bundle("2.0.0", false).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains(&format!(
            "member \"specialist\": secret \"openai\" (OPENAI_API_KEY) is now sent to {PROXY} \
             (previous deployments: {A}, {B})"
        )),
        "{refused:?}"
    );
    assert_eq!(s.active_bundle().await, "1.2.0");
    let rolled = s.rollback_bundle("2.0.0", true).await.unwrap();
    assert_eq!(
        rolled.secret_endpoint_changes,
        [member_change("specialist", PROXY, &[A, B])]
    );

    // The events record where each member sends the key, and what was allowed; each refusal
    // is recorded with who tried, the version, the action and the endpoints.
    let ledger = Ledger::connect(&s.url).await.unwrap();
    let events: Vec<_> = ledger
        .export_events(None, None, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.stream == DESK_STREAM)
        .collect();
    let sent = |front: &str, specialist: &str| {
        vec![
            ("front-desk".to_owned(), front.to_owned()),
            ("specialist".to_owned(), specialist.to_owned()),
        ]
    };
    let row = |v: &str, endpoints, n| (v.to_owned(), endpoints, n);
    assert_eq!(
        bundle_activations(&events),
        [
            row("1.0.0", sent(A, A), 0),
            row("1.1.0", sent(A, B), 1),
            row("1.0.0", sent(A, A), 0),
            row("1.1.0", sent(A, B), 0),
            row("1.2.0", sent(B, B), 0),
            row("2.0.0", sent(B, PROXY), 1),
        ]
    );
    let refusals: Vec<(
        String,
        String,
        DeploymentAction,
        MemberEndpoints<Option<String>>,
    )> = events
        .iter()
        .filter_map(|e| match e.body().unwrap() {
            EventBody::BundleActivationRefused(r) => Some((
                e.actor.clone(),
                r.version,
                r.action,
                r.changes
                    .into_iter()
                    .map(|c| (c.member, c.endpoint))
                    .collect(),
            )),
            _ => None,
        })
        .collect();
    let specialist = |e: &str| vec![(Some("specialist".to_owned()), e.to_owned())];
    assert_eq!(
        refusals,
        [
            (
                "publisher".to_owned(),
                "1.1.0".to_owned(),
                DeploymentAction::Deploy,
                specialist(B)
            ),
            (
                "publisher".to_owned(),
                "2.0.0".to_owned(),
                DeploymentAction::Rollback,
                specialist(PROXY)
            ),
        ]
    );
    assert!(
        ledger
            .verify_stream(DESK_STREAM)
            .await
            .unwrap()
            .violation
            .is_none()
    );
    ledger.close().await;
    s.stop().await;
}

#[tokio::test]
async fn bundle_secrets_follow_deployed_endpoints_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
    bundle_secrets_follow_deployed_endpoints(&url).await;
}

#[tokio::test]
async fn bundle_secrets_follow_deployed_endpoints_on_postgres() {
    let Some(pg) = PgDatabase::create().await else {
        return;
    };
    bundle_secrets_follow_deployed_endpoints(pg.url()).await;
}
