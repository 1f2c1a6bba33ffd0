//! Delegation (§4.11) over real TCP, on SQLite and PostgreSQL: a bundle's front desk hands work
//! to its members, each call running as a governed child session. The bundle is
//! `tests/fixtures/delegation`: `ask_refunds` (result `summary`, guarded by a parent policy
//! that denies fraud cases) starts the refund specialist, whose worker tool needs an approval
//! above 250 and which may consult an auditor one level deeper than its
//! `max_subagent_depth: 1` allows; `ask_notes` (result `full`) starts an agent without tools.
//! Every member runs on one rule model that knows them by name.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use phrony_engine::{ProviderFactory, child_session_id};
use phrony_ledger::Ledger;
use phrony_manifest::CompiledAgent;
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_providers::{
    ApiKey, CompletionRequest, Event as ModelEvent, EventStream, ModelProvider, ProviderError,
    ProviderKind, StopReason,
};
use phrony_runtime::SecretsKey;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::bundles::{copy_dir, publish_request};
use crate::sessions::{
    Db, Server, Worker, decide, done, inspect, pending_approvals, tool_results, user_texts,
};

const PATIENCE: Duration = Duration::from_secs(30);
const OPENAI_KEY: &str = "sk-desk-openai";
const CRM_KEY: &str = "crm-desk-token";

// ---------------------------------------------------------------------------------------------
// The model: one set of rules per member, recording what each received.

/// What one model request carried: the agent's name, its first user text and its tool results.
type Seen = (String, String, Vec<(String, bool)>);

#[derive(Debug, Default)]
struct Desk {
    /// Every request, in order.
    seen: Mutex<Vec<Seen>>,
    /// (agent name, API key) of every provider built.
    keys: Mutex<Vec<(String, Option<String>)>>,
}

fn call(name: &str, args: Value) -> Vec<ModelEvent> {
    vec![
        ModelEvent::ToolCall {
            id: "provider_call_0".into(),
            name: name.into(),
            args,
        },
        done(StopReason::ToolUse),
    ]
}

fn say(text: impl Into<String>) -> Vec<ModelEvent> {
    vec![
        ModelEvent::TextDelta(text.into()),
        done(StopReason::EndTurn),
    ]
}

/// `refund <amount>` in `text`.
fn amount(text: &str) -> Option<u64> {
    let rest = text.split_once("refund ")?.1;
    rest.chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

impl Desk {
    fn respond(&self, agent: &str, request: &CompletionRequest) -> Vec<ModelEvent> {
        let first = user_texts(request).into_iter().next().unwrap_or_default();
        let results = tool_results(request);
        self.seen
            .lock()
            .unwrap()
            .push((agent.to_owned(), first.clone(), results.clone()));
        if let Some((content, is_error)) = results.last() {
            let head = if *is_error { "error" } else { "result" };
            return say(format!("{agent} {head}: {content}"));
        }
        match agent {
            "front-desk" if first.contains("escalate") => {
                call("escalate", json!({ "task": first }))
            }
            "front-desk" if first.contains("notes") => {
                call("ask_notes", json!({"task": "What is the status of ORD-1?"}))
            }
            "front-desk" => call("ask_refunds", json!({ "task": first })),
            // The child's first message is its input: the call's arguments as JSON text.
            "refund-specialist" => {
                let task: Value = serde_json::from_str(&first).unwrap_or(Value::Null);
                let task = task["task"].as_str().unwrap_or_default().to_owned();
                if task.contains("audit") {
                    return call("ask_auditor", json!({ "task": task }));
                }
                match amount(&task) {
                    Some(n) => call(
                        "issue_refund",
                        json!({"order_id": "ORD-1", "amount": n, "currency": "EUR"}),
                    ),
                    None => say("Nothing to refund."),
                }
            }
            "order-notes" => say("Payment to ORD-1 is pending settlement."),
            "escalations" => say("Escalation taken by the on-call team."),
            "auditor" => say("The refund looks right."),
            other => say(format!("{other} has no rule")),
        }
    }

    /// The tool results `agent` received in its requests whose first message contains `first`.
    fn results(&self, agent: &str, first: &str) -> Vec<(String, bool)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(a, f, _)| a == agent && f.contains(first))
            .flat_map(|(_, _, r)| r.clone())
            .collect()
    }
}

#[derive(Debug)]
struct DeskProvider {
    agent: String,
    desk: Arc<Desk>,
}

#[async_trait::async_trait]
impl ModelProvider for DeskProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Stub
    }

    async fn stream(&self, request: CompletionRequest) -> Result<EventStream, ProviderError> {
        let events = self.desk.respond(&self.agent, &request);
        Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed())
    }
}

#[derive(Debug)]
struct DeskFactory(Arc<Desk>);

impl ProviderFactory for DeskFactory {
    fn build(
        &self,
        agent: &CompiledAgent,
        api_key: Option<ApiKey>,
        _completions_done: usize,
    ) -> Result<Box<dyn ModelProvider>, ProviderError> {
        self.0.keys.lock().unwrap().push((
            agent.metadata.name.clone(),
            api_key.map(|k| k.expose().to_owned()),
        ));
        Ok(Box::new(DeskProvider {
            agent: agent.metadata.name.clone(),
            desk: Arc::clone(&self.0),
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// The bundle.

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/delegation")
}

/// Locks a copy of the fixture and publishes and deploys it, as `phrony bundles publish` and
/// `deploy` would.
async fn publish_and_deploy(client: &mut RuntimeClient<Channel>) {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture(), dir.path());
    let path = dir.path().join("bundle.yaml");
    phrony_manifest::lock_bundle(&path).unwrap();
    let request = publish_request(&path);
    client.publish_bundle(request).await.unwrap();
    client
        .deploy_bundle(pb::DeployBundleRequest {
            bundle_ref: Some(bundle_ref()),
            actor: "release-bot".into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

fn bundle_ref() -> pb::BundleRef {
    pb::BundleRef {
        namespace: "support".into(),
        name: "delegation-desk".into(),
        version: "1.0.0".into(),
    }
}

async fn run(client: &mut RuntimeClient<Channel>, message: &str) -> String {
    client
        .run_session(pb::RunSessionRequest {
            bundle_ref: Some(bundle_ref()),
            input: serde_json::to_vec(&json!({ "message": message })).unwrap(),
            resolved_secrets: [
                ("openai".to_owned(), OPENAI_KEY.as_bytes().to_vec()),
                ("crm".to_owned(), CRM_KEY.as_bytes().to_vec()),
            ]
            .into(),
            mode: pb::SessionMode::Task as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id
}

/// Waits (bounded) until the session is in one of `statuses`.
async fn wait_for(
    client: &mut RuntimeClient<Channel>,
    id: &str,
    statuses: &[&str],
) -> pb::SessionInspect {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let s = inspect(client, id).await.session.unwrap();
            if statuses.contains(&s.status.as_str()) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("session {id} never reached {statuses:?}"))
}

/// Waits for the pending approval of session `id`.
async fn pending_approval(client: &mut RuntimeClient<Channel>, id: &str) -> pb::Approval {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let approvals = pending_approvals(client, id).await;
            if let Some(a) = approvals.into_iter().next() {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no pending approval for {id}"))
}

/// The delegation calls a session made (`tool.requested` events with a `delegation`).
async fn delegation_calls(ledger: &Ledger, id: &str) -> Vec<Value> {
    ledger
        .list_events(id, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "tool.requested" && e.payload.get("delegation").is_some())
        .map(|e| e.payload)
        .collect()
}

async fn completed_payloads(ledger: &Ledger, id: &str) -> Vec<Value> {
    ledger
        .list_events(id, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "tool.completed")
        .map(|e| e.payload)
        .collect()
}

fn children(s: &pb::SessionInspect) -> Vec<(String, String, i32, String)> {
    s.children
        .iter()
        .map(|c| {
            (
                c.id.clone(),
                c.parent_session_id.clone(),
                c.depth,
                c.agent.as_ref().map(|a| a.name.clone()).unwrap_or_default(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The scenario.

async fn scenario(db: Db) {
    let desk = Arc::new(Desk::default());
    let factory = Arc::new(DeskFactory(Arc::clone(&desk)));
    let key = SecretsKey::generate().unwrap();
    let start = |desk_factory: Arc<DeskFactory>| {
        let key = SecretsKey::from_bytes(*key.as_bytes());
        let db = &db;
        async move {
            Server::start_with(db, &key, Arc::default(), move |c| {
                c.providers = Some(desk_factory);
            })
            .await
        }
    };
    let server = start(Arc::clone(&factory)).await;
    let mut client = server.client().await;
    let ledger = Ledger::connect(&db.url).await.unwrap();
    publish_and_deploy(&mut client).await;
    let worker = Worker::connect(&server).await;

    // 1. A refund within the specialist's limit: the child runs its own tool and its summary
    //    returns to the parent, which completes.
    let root = run(&mut client, "refund 100 please").await;
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let calls = delegation_calls(&ledger, &root).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["delegation"], "support/refund-specialist");
    let child_id = child_session_id(calls[0]["call_id"].as_str().unwrap());
    let tree = inspect(&mut client, &root).await.session.unwrap();
    assert_eq!(
        children(&tree),
        [(
            child_id.clone(),
            root.clone(),
            1,
            "refund-specialist".to_owned()
        )]
    );
    assert_eq!(tree.children[0].status, "completed");
    let results = desk.results("front-desk", "refund 100");
    assert_eq!(results.len(), 1);
    assert!(!results[0].1, "{results:?}");
    let summary: Value = serde_json::from_str(&results[0].0).unwrap();
    let output = summary["output"].as_str().unwrap();
    assert!(
        output.starts_with("refund-specialist result: ") && output.contains("rf_2891"),
        "{summary}"
    );
    assert_eq!(worker_refunds(&worker), [100]);
    // The child's usage (two completions of 20 + 10 tokens) is charged to the parent's call,
    // and the call names the child as the party that answered.
    let completed = completed_payloads(&ledger, &root).await;
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0]["worker_id"], child_id);
    assert_eq!(completed[0]["usage"]["input_tokens"], 40);
    assert_eq!(completed[0]["usage"]["output_tokens"], 20);
    // The child was given the one secret its manifest declares: its model key is the CRM
    // token, never the front desk's OpenAI key.
    let keys = desk.keys.lock().unwrap().clone();
    assert!(keys.contains(&("refund-specialist".into(), Some(CRM_KEY.into()))));
    assert!(keys.contains(&("front-desk".into(), Some(OPENAI_KEY.into()))));

    // 2. A refund above 250: the approval inside the child holds the child; the parent waits,
    //    not failed; approving the child's call finishes both.
    let root = run(&mut client, "refund 400 please").await;
    let child_id = child_session_id(
        delegation_wait(&ledger, &root).await["call_id"]
            .as_str()
            .unwrap(),
    );
    let approval = pending_approval(&mut client, &child_id).await;
    assert_eq!(approval.session_id, child_id);
    let parent = inspect(&mut client, &root).await.session.unwrap();
    assert_eq!(parent.status, "awaiting_tool");
    // The child holds only its own secret.
    let held: Vec<String> = ledger
        .load_session_secrets(&child_id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(held, ["crm"]);
    client
        .decide_approval(decide(&approval.id, true, "carol", "ok"))
        .await
        .unwrap();
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    assert_eq!(
        inspect(&mut client, &child_id)
            .await
            .session
            .unwrap()
            .status,
        "completed"
    );
    assert_eq!(worker_refunds(&worker), [100, 400]);

    // 3. The parent's policies govern the delegation call itself: a fraud case is denied and
    //    no child session is started.
    let root = run(&mut client, "fraud case, refund 50").await;
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let call_id = delegation_wait(&ledger, &root).await["call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let results = desk.results("front-desk", "fraud case");
    assert_eq!(results.len(), 1);
    assert!(results[0].1, "{results:?}");
    assert!(
        results[0].0.contains("Fraud cases go to the fraud team"),
        "{results:?}"
    );
    assert!(
        client
            .inspect_session(pb::InspectSessionRequest {
                session_id: child_session_id(&call_id),
                ..Default::default()
            })
            .await
            .is_err()
    );
    assert_eq!(worker_refunds(&worker), [100, 400]);

    // 4. Depth: the specialist (max_subagent_depth 1, on_limit: escalate) may start the
    //    auditor at depth 2 only when a human raises its limit. Rejected: its call gets the
    //    tool error and the specialist still answers.
    let root = run(&mut client, "audit refund 10").await;
    let specialist = child_session_id(
        delegation_wait(&ledger, &root).await["call_id"]
            .as_str()
            .unwrap(),
    );
    let escalation = pending_approval(&mut client, &specialist).await;
    assert_eq!(escalation.tool, phrony_engine::LIMIT_TOOL);
    client
        .decide_approval(decide(&escalation.id, false, "carol", "no auditing today"))
        .await
        .unwrap();
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let results = desk.results("refund-specialist", "audit refund 10");
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].1);
    assert!(
        results[0]
            .0
            .contains("delegation depth 2 exceeds max_subagent_depth 1"),
        "{results:?}"
    );
    let tree = tree_of(&mut client, &root).await;
    assert_eq!(tree.children.len(), 1);
    assert!(tree.children[0].children.is_empty());
    //    Approved: the auditor runs as a grandchild (depth 2) and its answer reaches the
    //    specialist, whose answer reaches the front desk.
    let root = run(&mut client, "audit refund 20").await;
    let specialist = child_session_id(
        delegation_wait(&ledger, &root).await["call_id"]
            .as_str()
            .unwrap(),
    );
    let escalation = pending_approval(&mut client, &specialist).await;
    client
        .decide_approval(decide(&escalation.id, true, "carol", "audit it"))
        .await
        .unwrap();
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let tree = tree_of(&mut client, &root).await;
    let grandchildren = &tree.children[0].children;
    assert_eq!(grandchildren.len(), 1, "{tree:?}");
    assert_eq!(grandchildren[0].depth, 2);
    assert_eq!(grandchildren[0].agent.as_ref().unwrap().name, "auditor");
    assert_eq!(
        desk.results("refund-specialist", "audit refund 20"),
        [(
            json!({"output": "The refund looks right."}).to_string(),
            false
        )]
    );

    // 5. `result: full` returns the child's whole output; a child without tools works.
    let root = run(&mut client, "notes for ORD-1").await;
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let results = desk.results("front-desk", "notes for ORD-1");
    assert_eq!(results.len(), 1);
    let full: Value = serde_json::from_str(&results[0].0).unwrap();
    assert_eq!(full["message"], "Payment to ORD-1 is pending settlement.");
    assert_eq!(full["session_usage"]["total_tokens"], 30);
    assert_eq!(full["turns"].as_array().unwrap().len(), 1);

    // 6. Cancelling the parent cancels its child and closes the child's approval; the refund
    //    never reaches the worker.
    let root = run(&mut client, "refund 900 please").await;
    let child_id = child_session_id(
        delegation_wait(&ledger, &root).await["call_id"]
            .as_str()
            .unwrap(),
    );
    let approval = pending_approval(&mut client, &child_id).await;
    client
        .cancel_session(pb::CancelSessionRequest {
            session_id: root.clone(),
        })
        .await
        .unwrap();
    let child = wait_for(&mut client, &child_id, &["cancelled"]).await;
    assert_eq!(child.status, "cancelled");
    let closed = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(closed.status, "cancelled");
    assert_eq!(worker_refunds(&worker), [100, 400]);

    // 8. A late-bound delegation runs whatever version of the published agent is deployed
    //    when the call is made: none yet is a tool error, then the deployed one runs.
    let root = run(&mut client, "escalate: customer is angry").await;
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let results = desk.results("front-desk", "escalate: customer is angry");
    assert_eq!(results.len(), 1);
    assert!(results[0].1, "{results:?}");
    assert!(
        results[0]
            .0
            .contains("support/escalations could not be resolved"),
        "{results:?}"
    );
    assert!(tree_of(&mut client, &root).await.children.is_empty());
    let escalations = phrony_manifest::load_agent(fixture().join("escalations/agent.yaml"))
        .unwrap()
        .agent;
    crate::sessions::publish_and_deploy(&mut client, &escalations).await;
    let root = run(&mut client, "escalate: customer is still angry").await;
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    assert_eq!(
        desk.results("front-desk", "escalate: customer is still angry"),
        [(
            json!({"output": "Escalation taken by the on-call team."}).to_string(),
            false
        )]
    );
    let tree = tree_of(&mut client, &root).await;
    assert_eq!(children(&tree)[0].3, "escalations");

    // 7. A restart while the child waits for its approval: the same child is resumed (not a
    //    second one started, not an outcome review of the delegation), and approving it
    //    finishes both.
    let root = run(&mut client, "refund 500 please").await;
    let child_id = child_session_id(
        delegation_wait(&ledger, &root).await["call_id"]
            .as_str()
            .unwrap(),
    );
    pending_approval(&mut client, &child_id).await;
    drop(worker);
    server.stop().await;
    let server = start(Arc::clone(&factory)).await;
    let mut client = server.client().await;
    let _worker = Worker::connect(&server).await;
    let approval = pending_approval(&mut client, &child_id).await;
    client
        .decide_approval(decide(&approval.id, true, "carol", "after the restart"))
        .await
        .unwrap();
    let done = wait_for(&mut client, &root, &["completed", "failed"]).await;
    assert_eq!(done.status, "completed", "{}", done.error);
    let tree = inspect(&mut client, &root).await.session.unwrap();
    assert_eq!(children(&tree).len(), 1);
    assert_eq!(tree.children[0].id, child_id);
    assert_eq!(tree.children[0].status, "completed");
    let approvals = client
        .list_approvals(pb::ListApprovalsRequest {
            session_id: root.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert!(
        approvals.is_empty(),
        "the parent asked a human: {approvals:?}"
    );
    server.stop().await;
}

async fn tree_of(client: &mut RuntimeClient<Channel>, id: &str) -> pb::SessionInspect {
    inspect(client, id).await.session.unwrap()
}

fn worker_refunds(worker: &Worker) -> Vec<u64> {
    worker
        .refunds()
        .iter()
        .map(|a| a["amount"].as_u64().unwrap())
        .collect()
}

/// Waits for the session's first delegation call to be recorded.
async fn delegation_wait(ledger: &Ledger, id: &str) -> Value {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(c) = delegation_calls(ledger, id).await.into_iter().next() {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("session {id} made no delegation call"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delegation_on_sqlite() {
    scenario(Db::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delegation_on_postgres() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    scenario(db).await;
}

#[test]
fn child_ids_are_the_references() {
    // The reference derives `run_` + UUIDv5(namespace b3f2a1c0-…, call id); the same call id
    // must name the same child in both runtimes.
    let id = child_session_id("call_1");
    assert!(id.starts_with("run_"));
    assert_eq!(id, child_session_id("call_1"));
    assert_ne!(id, child_session_id("call_2"));
    let uuid = uuid::Uuid::parse_str(id.trim_start_matches("run_")).unwrap();
    assert_eq!(uuid.get_version_num(), 5);
}
