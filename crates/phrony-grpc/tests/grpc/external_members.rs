//! External bundle members (`spec.agents[i].ref: namespace.name@version`) over real TCP, on
//! SQLite and PostgreSQL. The bundle is `tests/fixtures/external-members`: a concierge whose
//! one delegation names the published agent `support.translator@1.0.0`. The lock takes the
//! published version's content hash from the runtime (`GetAgentVersion`, as `phrony bundles
//! lock` does); `PublishBundle` refuses a member it cannot resolve and a lock made against
//! another runtime, and pins the delegation to the published version; a bundle run delegates
//! to a child of exactly that version.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use phrony_engine::{ProviderFactory, child_session_id};
use phrony_ledger::{AgentRef, Ledger};
use phrony_manifest::{Bundle, CompiledAgent, load_bundle};
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_providers::{
    ApiKey, CompletionRequest, ContentBlock, Event as ModelEvent, EventStream, ModelProvider,
    ProviderError, ProviderKind, Role, StopReason, Usage,
};
use phrony_runtime::SecretsKey;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::bundles::publish_request;
use crate::sessions::{Db, Server, inspect};

const PATIENCE: Duration = Duration::from_secs(30);
const TRANSLATOR: &str = "support.translator@1.0.0";

// ---------------------------------------------------------------------------------------------
// The model: the concierge delegates its message to `translate`, then repeats the result; the
// translator answers in French.

fn done(stop_reason: StopReason) -> ModelEvent {
    ModelEvent::Completed {
        stop_reason,
        usage: Usage {
            input_tokens: 5,
            output_tokens: 5,
            estimated: false,
        },
    }
}

#[derive(Debug)]
struct Rules {
    agent: String,
}

#[async_trait::async_trait]
impl ModelProvider for Rules {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Stub
    }

    async fn stream(&self, request: CompletionRequest) -> Result<EventStream, ProviderError> {
        let first = request
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .flat_map(|m| m.content.iter())
            .find_map(|b| match b {
                ContentBlock::Text { text } => Some(text.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let result = request
            .messages
            .iter()
            .flat_map(|m| m.content.iter())
            .find_map(|b| match b {
                ContentBlock::ToolResult { content, .. } => Some(content.clone()),
                _ => None,
            });
        let events = match (self.agent.as_str(), result) {
            ("concierge", Some(result)) => vec![
                ModelEvent::TextDelta(format!("concierge: {result}")),
                done(StopReason::EndTurn),
            ],
            ("concierge", None) => vec![
                ModelEvent::ToolCall {
                    id: "provider_call_0".into(),
                    name: "translate".into(),
                    args: json!({ "task": first }),
                },
                done(StopReason::ToolUse),
            ],
            (other, _) => vec![
                ModelEvent::TextDelta(format!("{other}: bonjour")),
                done(StopReason::EndTurn),
            ],
        };
        Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed())
    }
}

#[derive(Debug)]
struct RulesFactory;

impl ProviderFactory for RulesFactory {
    fn build(
        &self,
        agent: &CompiledAgent,
        _api_key: Option<ApiKey>,
        _completions_done: usize,
    ) -> Result<Box<dyn ModelProvider>, ProviderError> {
        Ok(Box::new(Rules {
            agent: agent.metadata.name.clone(),
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// The bundle.

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/external-members")
}

/// A copy of the fixture (locks are written beside the bundle).
fn copy_fixture(to: &Path) -> PathBuf {
    for rel in ["bundle.yaml", "concierge.yaml", "translator/agent.yaml"] {
        let target = to.join(rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(fixture().join(rel), &target).unwrap();
    }
    to.join("bundle.yaml")
}

/// What the runtime says of each external member's version, as `phrony bundles lock` asks it:
/// the content hash, or the refusal's message.
async fn resolve_through(
    client: &mut RuntimeClient<Channel>,
    bundle: &Bundle,
) -> HashMap<String, Result<String, String>> {
    let mut out = HashMap::new();
    for (namespace, name, version) in bundle.members.iter().filter_map(|m| m.external.clone()) {
        let found = client
            .get_agent_version(pb::GetAgentVersionRequest {
                agent_ref: Some(pb::AgentRef {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    version: version.clone(),
                }),
            })
            .await
            .map(|r| r.into_inner().content_hash)
            .map_err(|s| s.message().to_owned());
        out.insert(format!("{namespace}.{name}@{version}"), found);
    }
    out
}

/// Locks the bundle at `path` with content hashes from `hashes` (by `ns.name@version`).
fn lock_with(
    path: &Path,
    hashes: &HashMap<String, Result<String, String>>,
) -> Result<(), Vec<String>> {
    let bundle = load_bundle(path).unwrap();
    phrony_manifest::lock_loaded_bundle(bundle, &mut |ns, name, version| {
        hashes
            .get(&format!("{ns}.{name}@{version}"))
            .cloned()
            .unwrap_or_else(|| Err("not asked".to_owned()))
    })
    .map(|_| ())
    .map_err(|d| d.errors().map(|e| e.message.clone()).collect())
}

fn bundle_ref() -> pb::BundleRef {
    pb::BundleRef {
        namespace: "support".into(),
        name: "external-desk".into(),
        version: String::new(),
    }
}

/// Starts a task session of the bundle with `message`; returns its id.
async fn run(client: &mut RuntimeClient<Channel>, message: &str) -> String {
    client
        .run_session(pb::RunSessionRequest {
            bundle_ref: Some(bundle_ref()),
            input: serde_json::to_vec(&json!({ "message": message })).unwrap(),
            resolved_secrets: [("openai".to_owned(), b"sk-test".to_vec())].into(),
            mode: pb::SessionMode::Task as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id
}

async fn wait_for(client: &mut RuntimeClient<Channel>, id: &str) -> pb::SessionInspect {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let s = inspect(client, id).await.session.unwrap();
            if ["completed", "failed"].contains(&s.status.as_str()) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("session {id} never finished"))
}

async fn scenario(db: Db) {
    let key = SecretsKey::generate().unwrap();
    let server = Server::start_with(&db, &key, Arc::default(), |c| {
        c.providers = Some(Arc::new(RulesFactory));
    })
    .await;
    let mut client = server.client().await;
    let ledger = Ledger::connect(&db.url).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = copy_fixture(dir.path());

    // 1. Before the translator is published, the lock cannot resolve it, and says why.
    let bundle = load_bundle(&path).unwrap();
    let hashes = resolve_through(&mut client, &bundle).await;
    let refused = lock_with(&path, &hashes).unwrap_err();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].starts_with(
            "bundle has external member \"translator\" (support.translator@1.0.0): agent \
             support/translator not found"
        ),
        "{refused:?}"
    );
    // A lock written by hand (or against another runtime) does not get the bundle published:
    // the member is refused by name, with the reason.
    let forged = HashMap::from([(TRANSLATOR.to_owned(), Ok("sha256:elsewhere".to_owned()))]);
    lock_with(&path, &forged).unwrap();
    let status = client
        .publish_bundle(publish_request(&path))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "external member \"translator\" (members[1]): \"support.translator@1.0.0\" cannot be \
         used: agent support/translator not found"
    );

    // 2. Publish and deploy the translator on its own; the forged lock is now drift.
    let translator = phrony_manifest::load_agent(dir.path().join("translator/agent.yaml"))
        .unwrap()
        .agent;
    crate::sessions::publish_and_deploy(&mut client, &translator).await;
    let published = ledger
        .get_agent_version(&AgentRef::new("support", "translator"), "1.0.0")
        .await
        .unwrap();
    let status = client
        .publish_bundle(publish_request(&path))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains(
            "members[1] content_hash drift: the lock records \"sha256:elsewhere\" for external \
             member \"support.translator@1.0.0\""
        ) && status
            .message()
            .contains("the lock was made against another runtime"),
        "{}",
        status.message()
    );

    // 3. Lock through the runtime, publish, deploy.
    let hashes = resolve_through(&mut client, &bundle).await;
    lock_with(&path, &hashes).unwrap();
    let lock: Value =
        serde_json::from_slice(&std::fs::read(path.with_file_name("bundle.lock.json")).unwrap())
            .unwrap();
    assert_eq!(
        lock["members"][1],
        json!({
            "child_name": "translator",
            "origin": "external",
            "content_hash": published.content_hash,
            "ref": TRANSLATOR,
            "namespace": "support",
            "name": "translator",
            "version": "1.0.0",
        })
    );
    let versions_before = ledger
        .list_agent_versions(&AgentRef::new("support", "translator"))
        .await
        .unwrap()
        .len();
    client.publish_bundle(publish_request(&path)).await.unwrap();
    assert_eq!(
        ledger
            .list_agent_versions(&AgentRef::new("support", "translator"))
            .await
            .unwrap()
            .len(),
        versions_before,
        "an external member is not copied"
    );
    client
        .deploy_bundle(pb::DeployBundleRequest {
            bundle_ref: Some(pb::BundleRef {
                version: "1.0.0".into(),
                ..bundle_ref()
            }),
            actor: "release-bot".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let stored = client
        .get_bundle_version(pb::GetBundleVersionRequest {
            bundle_ref: Some(bundle_ref()),
        })
        .await
        .unwrap()
        .into_inner();
    let members: Vec<(String, String, String)> = stored
        .members
        .iter()
        .map(|m| {
            (
                m.child_name.clone(),
                m.origin.clone(),
                m.member_version_id.clone(),
            )
        })
        .collect();
    assert!(
        members.contains(&(
            "translator".to_owned(),
            "external".to_owned(),
            published.id.to_string()
        )),
        "{members:?}"
    );

    // 4. Run the bundle: the delegation runs a child of the published version.
    let root = run(&mut client, "translate hello").await;
    let done = wait_for(&mut client, &root).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let calls: Vec<Value> = ledger
        .list_events(&root, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "tool.requested" && e.payload.get("delegation").is_some())
        .map(|e| e.payload)
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["delegation"], "support/translator@1.0.0");
    let child_id = child_session_id(calls[0]["call_id"].as_str().unwrap());
    let child = ledger.get_session(&child_id).await.unwrap();
    assert_eq!(child.agent_version_id, published.id);
    let child_view = wait_for(&mut client, &child_id).await;
    assert_eq!(child_view.status, "completed", "{}", child_view.error);

    // 5. The published version is retired (after 1.1.0 replaced it as the agent's active
    //    deployment): the bundle stays frozen on 1.0.0, and its delegation starts no new child
    //    (a tool error for the model), as a run of the agent would be refused.
    let mut next = translator.clone();
    next.metadata.version = "1.1.0".into();
    crate::sessions::publish_and_deploy(&mut client, &next).await;
    client
        .retire_agent_version(pb::RetireAgentVersionRequest {
            agent_ref: Some(pb::AgentRef {
                namespace: "support".into(),
                name: "translator".into(),
                version: "1.0.0".into(),
            }),
        })
        .await
        .unwrap();
    let root = run(&mut client, "translate goodbye").await;
    let done = wait_for(&mut client, &root).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let failed: Vec<Value> = ledger
        .list_events(&root, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "tool.completed")
        .map(|e| e.payload)
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["error_code"], "subagent_unresolved");
    assert!(
        failed[0]["error_message"]
            .as_str()
            .unwrap()
            .contains("agent support/translator version \"1.0.0\" was retired"),
        "{failed:?}"
    );
    assert!(
        inspect(&mut client, &root)
            .await
            .session
            .unwrap()
            .children
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn external_member_on_sqlite() {
    scenario(Db::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn external_member_on_postgres() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    scenario(db).await;
}
