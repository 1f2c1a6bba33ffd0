//! The session and approval RPCs over real TCP: an in-process server on a SQLite file (and
//! PostgreSQL for the restart test), the refund example of `policies-examples/refund-agent`
//! (100 allowed, 400 needs approval, 14000 denied), a rule-following model injected through
//! `ServeConfig::providers`, and a tool worker connected through the `Work` stream.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use pb::work_client_msg::Body as Up;
use pb::work_server_msg::Body as Down;
use phrony_engine::ProviderFactory;
use phrony_ledger::Ledger;
use phrony_manifest::CompiledAgent;
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_providers::{
    ApiKey, CompletionRequest, ContentBlock, Event as ModelEvent, EventStream, ModelProvider,
    ProviderError, ProviderKind, Role, StopReason, Usage,
};
use phrony_runtime::{SecretsKey, ServeConfig};
use phrony_test_support::postgres::PgDatabase;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// A safety net against hangs; no assertion depends on timing.
const PATIENCE: Duration = Duration::from_secs(20);
const API_KEY: &str = "sk-test-never-shown";

// ---------------------------------------------------------------------------------------------
// The model: follows simple rules, so concurrent sessions and resumed ones behave the same.

/// "Refund <amount>" → calls `issue_refund` once; after the tool outcome it reports it and ends
/// the turn. Anything else is echoed. Records every request.
#[derive(Debug, Default)]
pub(crate) struct RuleModel {
    requests: Mutex<Vec<CompletionRequest>>,
}

pub(crate) fn user_texts(r: &CompletionRequest) -> Vec<String> {
    r.messages
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

pub(crate) fn tool_results(r: &CompletionRequest) -> Vec<(String, bool)> {
    r.messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            ContentBlock::ToolResult {
                content, is_error, ..
            } => Some((content.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

fn refund_amount(text: &str) -> Option<f64> {
    let lower = text.to_lowercase();
    let rest = lower.split_once("refund ")?.1;
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number.parse().ok()
}

pub(crate) fn done(stop_reason: StopReason) -> ModelEvent {
    ModelEvent::Completed {
        stop_reason,
        usage: Usage {
            input_tokens: 20,
            output_tokens: 10,
            estimated: false,
        },
    }
}

impl RuleModel {
    fn respond(&self, request: &CompletionRequest) -> Vec<ModelEvent> {
        self.requests.lock().unwrap().push(request.clone());
        let first = user_texts(request).into_iter().next().unwrap_or_default();
        match tool_results(request).pop() {
            Some((content, is_error)) => {
                let head = if is_error {
                    "refund not issued"
                } else {
                    "refund issued"
                };
                vec![
                    ModelEvent::TextDelta(format!("{head}: {content}")),
                    done(StopReason::EndTurn),
                ]
            }
            None => match refund_amount(&first) {
                Some(amount) => vec![
                    ModelEvent::ToolCall {
                        id: "provider_call_0".into(),
                        name: "issue_refund".into(),
                        args: json!({"order_id": "ORD-1", "amount": amount, "currency": "EUR"}),
                    },
                    done(StopReason::ToolUse),
                ],
                // `answer: <text>` is answered with the text as it is.
                None => vec![
                    ModelEvent::TextDelta(match first.strip_prefix("answer: ") {
                        Some(answer) => answer.to_owned(),
                        None => format!("echo: {first}"),
                    }),
                    done(StopReason::EndTurn),
                ],
            },
        }
    }

    /// The tool results the model received in sessions whose first message was `first`.
    fn results_for(&self, first: &str) -> Vec<(String, bool)> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| user_texts(r).first().map(String::as_str) == Some(first))
            .flat_map(tool_results)
            .collect()
    }
}

#[derive(Debug)]
struct RuleProvider(Arc<RuleModel>);

#[async_trait::async_trait]
impl ModelProvider for RuleProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Stub
    }

    async fn stream(&self, request: CompletionRequest) -> Result<EventStream, ProviderError> {
        let events = self.0.respond(&request);
        Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed())
    }
}

#[derive(Debug)]
struct RuleFactory {
    model: Arc<RuleModel>,
    keys: Mutex<Vec<Option<String>>>,
}

impl ProviderFactory for RuleFactory {
    fn build(
        &self,
        _agent: &CompiledAgent,
        api_key: Option<ApiKey>,
        _completions_done: usize,
    ) -> Result<Box<dyn ModelProvider>, ProviderError> {
        self.keys
            .lock()
            .unwrap()
            .push(api_key.map(|k| k.expose().to_owned()));
        Ok(Box::new(RuleProvider(Arc::clone(&self.model))))
    }
}

// ---------------------------------------------------------------------------------------------
// The server and its database.

/// Where the ledger lives; a PostgreSQL database is dropped with it.
pub(crate) struct Db {
    pub(crate) url: String,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<PgDatabase>,
}

impl Db {
    pub(crate) fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
        Self {
            url,
            _dir: Some(dir),
            _pg: None,
        }
    }

    /// A fresh PostgreSQL database (see [`PgDatabase::create`]), or `None` when
    /// `PHRONY_TEST_SKIP_POSTGRES=1` and the server is unreachable.
    pub(crate) async fn postgres() -> Option<Self> {
        let pg = PgDatabase::create().await?;
        Some(Self {
            url: pg.url().to_owned(),
            _dir: None,
            _pg: Some(pg),
        })
    }
}

pub(crate) struct Server {
    pub(crate) addr: String,
    model: Arc<RuleModel>,
    factory: Arc<RuleFactory>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub(crate) async fn start(db: &Db, key: &SecretsKey, model: Arc<RuleModel>) -> Self {
        Self::start_with(db, key, model, |_| {}).await
    }

    /// [`Self::start`], with `tweak` applied to the server's settings.
    pub(crate) async fn start_with(
        db: &Db,
        key: &SecretsKey,
        model: Arc<RuleModel>,
        tweak: impl FnOnce(&mut ServeConfig),
    ) -> Self {
        let ledger = Ledger::connect(&db.url).await.unwrap();
        ledger.migrate().await.unwrap();
        let listener = phrony_runtime::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().to_string();
        let factory = Arc::new(RuleFactory {
            model: Arc::clone(&model),
            keys: Mutex::new(Vec::new()),
        });
        let mut config = ServeConfig::new(SecretsKey::from_bytes(*key.as_bytes()));
        config.providers = Some(factory.clone());
        config.default_actor = "runtime-default".into();
        config.shutdown_grace = Duration::from_secs(2);
        tweak(&mut config);
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
            model,
            factory,
            stop: Some(stop),
            task,
        }
    }

    pub(crate) async fn client(&self) -> RuntimeClient<Channel> {
        RuntimeClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the server did not stop")
            .unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// The worker, on the Work stream like the SDK's.

pub(crate) struct Worker {
    invocations: Arc<Mutex<Vec<pb::WorkInvoke>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn handler(tool: &str) -> pb::WorkHandlerAdvertisement {
    pb::WorkHandlerAdvertisement {
        tool: tool.into(),
        version: "1.0.0".into(),
        contract_version: String::new(),
        max_concurrency: 4,
        descriptor_hash: String::new(),
    }
}

impl Worker {
    pub(crate) async fn connect(server: &Server) -> Self {
        Self::connect_with(server, true, 0).await
    }

    /// A worker that takes refunds but never answers them (killed mid-call when dropped).
    async fn connect_holding(server: &Server) -> Self {
        Self::connect_with(server, false, 0).await
    }

    /// A worker whose results carry a `memo` of `padding` bytes (none when 0).
    async fn connect_padded(server: &Server, padding: usize) -> Self {
        Self::connect_with(server, true, padding).await
    }

    async fn connect_with(server: &Server, answer_refunds: bool, padding: usize) -> Self {
        let (up, rx) = mpsc::channel(16);
        let msg = |body| pb::WorkClientMsg { body: Some(body) };
        up.send(msg(Up::Register(pb::WorkRegister {
            worker_id: "refund-worker".into(),
            workload_identity: "tests/sessions".into(),
            image_digest: String::new(),
            handlers: vec![
                handler("orders.lookup-order"),
                handler("payments.issue-refund"),
            ],
            in_flight: Vec::new(),
        })))
        .await
        .unwrap();
        let mut down = server
            .client()
            .await
            .work(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first = tokio::time::timeout(PATIENCE, down.message())
            .await
            .unwrap()
            .unwrap()
            .and_then(|m| m.body);
        assert!(
            matches!(first, Some(Down::Registered(_))),
            "expected registered, got {first:?}"
        );
        let invocations = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&invocations);
        let task = tokio::spawn(async move {
            let mut heartbeat = tokio::time::interval(Duration::from_secs(5));
            loop {
                let next = tokio::select! {
                    m = down.message() => m,
                    _ = heartbeat.tick() => {
                        let _ = up.send(msg(Up::Heartbeat(pb::WorkHeartbeat {}))).await;
                        continue;
                    }
                };
                let Ok(Some(m)) = next else { break };
                if let Some(Down::Invoke(inv)) = m.body {
                    seen.lock().unwrap().push(inv.clone());
                    if !answer_refunds && inv.tool == "payments.issue-refund" {
                        continue;
                    }
                    let args: Value = serde_json::from_slice(&inv.args).unwrap();
                    let mut payload = json!({
                        "refund_id": "rf_2891",
                        "amount": args["amount"],
                        "status": "issued",
                    });
                    if padding > 0 {
                        payload["memo"] = json!("m".repeat(padding));
                    }
                    let _ = up
                        .send(msg(Up::Result(pb::WorkToolResult {
                            call_id: inv.call_id,
                            payload: payload.to_string().into_bytes(),
                            error: None,
                        })))
                        .await;
                }
            }
        });
        Self { invocations, task }
    }

    pub(crate) fn refunds(&self) -> Vec<Value> {
        self.invocations
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.tool == "payments.issue-refund")
            .map(|i| serde_json::from_slice(&i.args).unwrap())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The agent.

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/refund-agent")
}

/// The refund example, optionally renamed and with the approval boundary's quorum changed.
pub(crate) fn refund_agent(name: &str, quorum: u32) -> CompiledAgent {
    refund_agent_with_output(name, quorum, "  format: text\n")
}

/// [`refund_agent`] with `output` as its `output` section's lines.
pub(crate) fn refund_agent_with_output(name: &str, quorum: u32, output: &str) -> CompiledAgent {
    let dir = tempfile::tempdir().unwrap();
    let src = example_dir();
    for sub in ["tools", "policies"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for entry in std::fs::read_dir(src.join(sub)).unwrap() {
            let entry = entry.unwrap();
            let text = std::fs::read_to_string(entry.path()).unwrap();
            let text = text.replace(
                "approvals_required: 1",
                &format!("approvals_required: {quorum}"),
            );
            std::fs::write(dir.path().join(sub).join(entry.file_name()), text).unwrap();
        }
    }
    let agent = std::fs::read_to_string(src.join("agent.yaml"))
        .unwrap()
        .replace("name: refund-agent", &format!("name: {name}"))
        .replace("output:\n  format: text\n", &format!("output:\n{output}"));
    std::fs::write(dir.path().join("agent.yaml"), agent).unwrap();
    match phrony_manifest::load_agent(dir.path().join("agent.yaml")) {
        Ok(c) => c.agent,
        Err(d) => panic!("the refund example does not compile:\n{d}"),
    }
}

fn agent_ref(name: &str) -> pb::AgentRef {
    pb::AgentRef {
        namespace: "support".into(),
        name: name.into(),
        version: String::new(),
    }
}

pub(crate) async fn publish_and_deploy(client: &mut RuntimeClient<Channel>, agent: &CompiledAgent) {
    client
        .publish(pb::PublishRequest {
            manifest: agent.snapshot_json(),
            actor: "alice".into(),
        })
        .await
        .unwrap();
    client
        .deploy(pb::DeployRequest {
            agent_ref: Some(pb::AgentRef {
                version: agent.metadata.version.clone(),
                ..agent_ref(&agent.metadata.name)
            }),
            actor: "alice".into(),
            allow_new_secret_endpoints: false,
        })
        .await
        .unwrap();
}

fn run_request(name: &str, input: &str) -> pb::RunSessionRequest {
    pb::RunSessionRequest {
        agent_ref: Some(agent_ref(name)),
        input: serde_json::to_vec(&json!({ "message": input })).unwrap(),
        resolved_secrets: [("openai".to_owned(), API_KEY.as_bytes().to_vec())].into(),
        bundle_ref: None,
        metadata: HashMap::new(),
        mode: pb::SessionMode::Unspecified as i32,
    }
}

pub(crate) async fn run(client: &mut RuntimeClient<Channel>, name: &str, input: &str) -> String {
    let started = client
        .run_session(run_request(name, input))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.status, "running");
    assert!(started.session_id.starts_with("run_"));
    started.session_id
}

pub(crate) async fn inspect(
    client: &mut RuntimeClient<Channel>,
    id: &str,
) -> pb::InspectSessionResponse {
    client
        .inspect_session(pb::InspectSessionRequest {
            session_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// Waits (polling the API, bounded by [`PATIENCE`]) until the session reaches `status`.
pub(crate) async fn wait_status(
    client: &mut RuntimeClient<Channel>,
    id: &str,
    status: &str,
) -> pb::SessionInspect {
    let found = tokio::time::timeout(PATIENCE, async {
        loop {
            let s = inspect(client, id).await.session.unwrap();
            if s.status == status {
                return s;
            }
            assert!(
                !matches!(s.status.as_str(), "completed" | "failed" | "cancelled"),
                "session {id} ended {} ({}) while waiting for {status}",
                s.status,
                s.error
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("session {id} never reached {status}"))
}

pub(crate) async fn pending_approvals(
    client: &mut RuntimeClient<Channel>,
    id: &str,
) -> Vec<pb::Approval> {
    client
        .list_approvals(pb::ListApprovalsRequest {
            status: "pending".into(),
            session_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .approvals
}

pub(crate) fn decide(
    id: &str,
    approve: bool,
    actor: &str,
    comment: &str,
) -> pb::DecideApprovalRequest {
    pb::DecideApprovalRequest {
        approval_id: id.into(),
        decision: if approve {
            pb::ApprovalDecision::Approve
        } else {
            pb::ApprovalDecision::Reject
        } as i32,
        comment: comment.into(),
        args: Vec::new(),
        comprehension_acknowledged: false,
        actor: actor.into(),
        resolution: String::new(),
        result: Vec::new(),
    }
}

/// A DecideApproval naming only a resolution (the decision left unspecified).
fn resolve(
    id: &str,
    resolution: &str,
    actor: &str,
    result: Option<Value>,
) -> pb::DecideApprovalRequest {
    pb::DecideApprovalRequest {
        decision: pb::ApprovalDecision::Unspecified as i32,
        resolution: resolution.into(),
        result: result
            .map(|r| r.to_string().into_bytes())
            .unwrap_or_default(),
        ..decide(id, true, actor, &format!("{resolution} by {actor}"))
    }
}

fn output_message(s: &pb::SessionInspect) -> String {
    s.output
        .as_ref()
        .map(|o| o.message.clone())
        .unwrap_or_default()
}

pub(crate) fn assert_code<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: Code,
    contains: &str,
) {
    let status = result.unwrap_err();
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(contains),
        "{:?} does not contain {contains:?}",
        status.message()
    );
}

struct World {
    _db: Db,
    server: Server,
    worker: Worker,
    client: RuntimeClient<Channel>,
}

async fn world() -> World {
    let db = Db::sqlite();
    let server = Server::start(&db, &SecretsKey::generate().unwrap(), Arc::default()).await;
    let worker = Worker::connect(&server).await;
    let mut client = server.client().await;
    publish_and_deploy(&mut client, &refund_agent("refund-agent", 1)).await;
    World {
        _db: db,
        server,
        worker,
        client,
    }
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[tokio::test]
async fn an_allowed_refund_completes_with_the_models_last_message() {
    let mut w = world().await;
    let id = run(&mut w.client, "refund-agent", "Refund 100 for ORD-1").await;
    let done = wait_status(&mut w.client, &id, "completed").await;
    assert_eq!(
        w.worker.refunds(),
        [json!({"order_id": "ORD-1", "amount": 100.0, "currency": "EUR"})]
    );
    assert!(
        output_message(&done).starts_with("refund issued: "),
        "{done:?}"
    );
    assert_eq!(done.agent.as_ref().unwrap().model_provider, "openai");
    // The model was built with the resolved key, which no read shows.
    assert_eq!(
        w.server
            .factory
            .keys
            .lock()
            .unwrap()
            .first()
            .cloned()
            .flatten()
            .as_deref(),
        Some(API_KEY)
    );
    let dump = format!("{:?}", inspect(&mut w.client, &id).await);
    assert!(!dump.contains(API_KEY));
}

#[tokio::test]
async fn a_rejected_refund_returns_the_comment_to_the_model_and_an_approved_one_runs() {
    let mut w = world().await;
    let first = "Refund 400 for ORD-1";
    let id = run(&mut w.client, "refund-agent", first).await;
    wait_status(&mut w.client, &id, "awaiting_approval").await;
    let pending = pending_approvals(&mut w.client, &id).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    let a = &pending[0];
    assert_eq!(a.tool, "payments.issue-refund");
    assert_eq!(a.version, "1.0.0");
    let args: Value = serde_json::from_slice(&a.args).unwrap();
    assert_eq!(args["amount"], json!(400.0));
    assert_eq!(a.agent_ref, "support/refund-agent@0.1.0");
    assert_eq!(a.policy_ref, "payments/refund-approval-boundary@1.0.0");
    assert_eq!(a.policy_name, "refund-approval-boundary");
    assert_eq!(a.reason, "Refund amount above delegated limit.");
    assert_eq!(a.call_hash.len(), 64);
    assert!(a.votes.is_empty(), "ListApprovals omits votes");

    let decided = w
        .client
        .decide_approval(decide(&a.id, false, "emad", "No damage claim on file."))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.status, "denied");
    let done = wait_status(&mut w.client, &id, "completed").await;
    assert!(w.worker.refunds().is_empty(), "a rejected call never runs");
    let results = w.server.model.results_for(first);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].1, "the rejection is an error outcome");
    assert!(
        results[0]
            .0
            .contains("rejected by emad: No damage claim on file."),
        "{results:?}"
    );
    assert!(output_message(&done).starts_with("refund not issued: "));

    // GetApproval shows the vote.
    let got = w
        .client
        .get_approval(pb::GetApprovalRequest {
            approval_id: a.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.status, "denied");
    assert_eq!(got.decided_by, "emad");
    assert_eq!(got.votes.len(), 1);
    assert_eq!(got.votes[0].decision, "denied");
    assert_eq!(got.votes[0].comment, "No damage claim on file.");

    // The timeline tells the story with who decided, why, and which policy.
    let timeline = inspect(&mut w.client, &id).await.timeline;
    let summaries: Vec<&str> = timeline.iter().map(|e| e.summary.as_str()).collect();
    assert!(
        summaries
            .iter()
            .any(|s| s.starts_with("tool_call payments.issue-refund@1.0.0 call_id=run_")),
        "{summaries:#?}"
    );
    assert!(
        summaries
            .iter()
            .any(|s| s.contains("(payments/refund-approval-boundary@1.0.0)")),
        "{summaries:#?}"
    );
    assert!(
        // The `approval.decided` event names the decider as people read it (`local` mode:
        // unverified), as the `approval_decided` milestone does.
        summaries.contains(&"approval denied by emad (unverified): No damage claim on file."),
        "{summaries:#?}"
    );
    let decided_entry = timeline
        .iter()
        .find(|e| e.kind == "approval_decided")
        .unwrap();
    assert_eq!(decided_entry.source, "approval");
    assert_eq!(decided_entry.approval.as_ref().unwrap().votes.len(), 1);

    // A second run, approved (actor from the header this time): the worker runs the refund.
    let id2 = run(&mut w.client, "refund-agent", "Refund 400 for ORD-1 again").await;
    wait_status(&mut w.client, &id2, "awaiting_approval").await;
    let a2 = pending_approvals(&mut w.client, &id2).await.remove(0);
    let mut request = Request::new(decide(&a2.id, true, "", "Damage claim verified."));
    request
        .metadata_mut()
        .insert("phrony-actor", "lina".parse().unwrap());
    let decided = w
        .client
        .decide_approval(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.status, "approved");
    assert_eq!(decided.approvals_received, 1);
    let done = wait_status(&mut w.client, &id2, "completed").await;
    assert_eq!(w.worker.refunds().len(), 1);
    assert!(output_message(&done).starts_with("refund issued: "));
    let got = w
        .client
        .get_approval(pb::GetApprovalRequest {
            approval_id: a2.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.decided_by, "lina");

    // Deciding again is refused.
    assert_code(
        w.client
            .decide_approval(decide(&a2.id, true, "omar", ""))
            .await,
        Code::FailedPrecondition,
        "already approved",
    );
}

#[tokio::test]
async fn a_denied_refund_never_reaches_the_worker() {
    let mut w = world().await;
    let first = "Refund 14000 for ORD-2";
    let id = run(&mut w.client, "refund-agent", first).await;
    let done = wait_status(&mut w.client, &id, "completed").await;
    assert!(w.worker.refunds().is_empty());
    let results = w.server.model.results_for(first);
    assert!(results[0].1);
    assert!(
        results[0]
            .0
            .contains("Refund amount exceeds the absolute ceiling"),
        "{results:?}"
    );
    assert!(output_message(&done).starts_with("refund not issued: "));
    let timeline = inspect(&mut w.client, &id).await.timeline;
    assert!(
        timeline.iter().any(|e| e.summary
            == "policy denied payments.issue-refund: Refund amount exceeds the absolute ceiling \
                for agent-initiated refunds. (payments/refund-hard-limit@1.0.0)"),
        "{:#?}",
        timeline.iter().map(|e| &e.summary).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_quorum_needs_distinct_approvers() {
    let mut w = world().await;
    publish_and_deploy(&mut w.client, &refund_agent("refund-agent-quorum", 2)).await;
    let id = run(&mut w.client, "refund-agent-quorum", "Refund 400 for ORD-1").await;
    wait_status(&mut w.client, &id, "awaiting_approval").await;
    let a = pending_approvals(&mut w.client, &id).await.remove(0);
    assert_eq!(a.approvals_required, 2);
    let first = w
        .client
        .decide_approval(decide(&a.id, true, "emad", "ok"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (first.status.as_str(), first.approvals_received),
        ("pending", 1)
    );
    assert_eq!(first.session_status, "awaiting_approval");
    assert_code(
        w.client
            .decide_approval(decide(&a.id, true, "emad", "again"))
            .await,
        Code::FailedPrecondition,
        "actor \"emad\" already decided on this approval",
    );
    // Names that differ only in case are one voter: no second vote, whatever the spelling.
    for twin in ["EMAD", "Emad"] {
        assert_code(
            w.client
                .decide_approval(decide(&a.id, true, twin, "me again"))
                .await,
            Code::FailedPrecondition,
            &format!("actor \"{twin}\" already decided on this approval (as \"emad\")"),
        );
    }
    assert!(w.worker.refunds().is_empty());
    let second = w
        .client
        .decide_approval(decide(&a.id, true, "lina", "ok"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (second.status.as_str(), second.approvals_received),
        ("approved", 2)
    );
    // The deciding vote answers with what the decision did, not the instant before it.
    assert_ne!(second.session_status, "awaiting_approval");
    wait_status(&mut w.client, &id, "completed").await;
    assert_eq!(w.worker.refunds().len(), 1);
}

#[tokio::test]
async fn cancel_closes_pending_approvals_and_ended_sessions_refuse_changes() {
    let mut w = world().await;
    let id = run(&mut w.client, "refund-agent", "Refund 400 for ORD-1").await;
    wait_status(&mut w.client, &id, "awaiting_approval").await;
    let a = pending_approvals(&mut w.client, &id).await.remove(0);
    let mut cancel = Request::new(pb::CancelSessionRequest {
        session_id: id.clone(),
    });
    cancel
        .metadata_mut()
        .insert("phrony-actor", "omar".parse().unwrap());
    w.client.cancel_session(cancel).await.unwrap();
    let s = inspect(&mut w.client, &id).await;
    assert_eq!(s.session.as_ref().unwrap().status, "cancelled");
    assert!(
        s.timeline
            .iter()
            .any(|e| e.summary.starts_with("session cancelled by omar")),
        "{:#?}",
        s.timeline.iter().map(|e| &e.summary).collect::<Vec<_>>()
    );
    let got = w
        .client
        .get_approval(pb::GetApprovalRequest {
            approval_id: a.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.status, "cancelled");
    assert!(pending_approvals(&mut w.client, &id).await.is_empty());
    assert_code(
        w.client
            .decide_approval(decide(&a.id, true, "emad", ""))
            .await,
        Code::FailedPrecondition,
        &format!("approval {} is already cancelled", a.id),
    );
    assert_code(
        w.client
            .cancel_session(pb::CancelSessionRequest {
                session_id: id.clone(),
            })
            .await,
        Code::FailedPrecondition,
        &format!("session {id} is already cancelled and cannot be cancelled"),
    );
    assert_code(
        w.client
            .complete_session(pb::CompleteSessionRequest {
                session_id: id.clone(),
            })
            .await,
        Code::FailedPrecondition,
        &format!("session {id} is already cancelled and cannot be completed"),
    );
    let unknown = "run_00000000-0000-4000-8000-000000000000";
    assert_code(
        w.client
            .cancel_session(pb::CancelSessionRequest {
                session_id: unknown.into(),
            })
            .await,
        Code::NotFound,
        &format!("session {unknown} not found"),
    );
    assert_code(
        w.client
            .complete_session(pb::CompleteSessionRequest {
                session_id: unknown.into(),
            })
            .await,
        Code::NotFound,
        &format!("session {unknown} not found"),
    );
}

/// The refund example published as another version.
fn refund_agent_version(version: &str) -> CompiledAgent {
    let dir = tempfile::tempdir().unwrap();
    let src = example_dir();
    for sub in ["tools", "policies"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for entry in std::fs::read_dir(src.join(sub)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(sub).join(entry.file_name())).unwrap();
        }
    }
    let text = std::fs::read_to_string(src.join("agent.yaml"))
        .unwrap()
        .replace("version: 0.1.0", &format!("version: {version}"));
    std::fs::write(dir.path().join("agent.yaml"), text).unwrap();
    let agent = match phrony_manifest::load_agent(dir.path().join("agent.yaml")) {
        Ok(c) => c.agent,
        Err(d) => panic!("the refund example does not compile:\n{d}"),
    };
    assert_eq!(agent.metadata.version, version);
    agent
}

fn as_actor<T>(message: T, actor: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("phrony-actor", actor.parse().unwrap());
    request
}

async fn approval(client: &mut RuntimeClient<Channel>, id: &str) -> pb::Approval {
    client
        .get_approval(pb::GetApprovalRequest {
            approval_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn retire_and_archive_close_pending_approvals_and_nothing_they_held_runs() {
    let mut w = world().await;
    let old = run(&mut w.client, "refund-agent", "Refund 400 for ORD-1").await;
    wait_status(&mut w.client, &old, "awaiting_approval").await;
    let held = pending_approvals(&mut w.client, &old).await.remove(0);

    // A newer version takes over; the old one is retired while its session waits.
    publish_and_deploy(&mut w.client, &refund_agent_version("0.2.0")).await;
    let current = run(&mut w.client, "refund-agent", "Refund 400 for ORD-1").await;
    wait_status(&mut w.client, &current, "awaiting_approval").await;
    let retire = pb::RetireAgentVersionRequest {
        agent_ref: Some(pb::AgentRef {
            version: "0.1.0".into(),
            ..agent_ref("refund-agent")
        }),
    };
    w.client
        .retire_agent_version(as_actor(retire, "erin"))
        .await
        .unwrap();
    let reason = "agent version support/refund-agent@0.1.0 retired by erin";
    let s = inspect(&mut w.client, &old).await.session.unwrap();
    assert_eq!((s.status.as_str(), s.error.as_str()), ("failed", reason));
    let closed = approval(&mut w.client, &held.id).await;
    assert_eq!(
        (closed.status.as_str(), closed.comment.as_str()),
        ("cancelled", reason)
    );
    assert_code(
        w.client
            .decide_approval(decide(&held.id, true, "emad", "ok"))
            .await,
        Code::FailedPrecondition,
        &format!("approval {} is already cancelled", held.id),
    );
    assert_eq!(
        inspect(&mut w.client, &current)
            .await
            .session
            .unwrap()
            .status,
        "awaiting_approval",
        "the active version's session is left alone"
    );

    // Archiving the agent ends the sessions of every version.
    let held = pending_approvals(&mut w.client, &current).await.remove(0);
    let archive = pb::ArchiveAgentRequest {
        agent_ref: Some(agent_ref("refund-agent")),
    };
    w.client
        .archive_agent(as_actor(archive, "erin"))
        .await
        .unwrap();
    let reason = "agent support/refund-agent archived by erin";
    let s = inspect(&mut w.client, &current).await.session.unwrap();
    assert_eq!((s.status.as_str(), s.error.as_str()), ("failed", reason));
    let closed = approval(&mut w.client, &held.id).await;
    assert_eq!(
        (closed.status.as_str(), closed.comment.as_str()),
        ("cancelled", reason)
    );
    assert_code(
        w.client
            .decide_approval(decide(&held.id, true, "emad", "ok"))
            .await,
        Code::FailedPrecondition,
        &format!("approval {} is already cancelled", held.id),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(w.worker.refunds().is_empty(), "no held refund ran");
}

#[tokio::test]
async fn an_edited_vote_is_refused_with_the_schema_error_or_the_deny_policy() {
    let mut w = world().await;
    let id = run(&mut w.client, "refund-agent", "Refund 400 for ORD-1").await;
    wait_status(&mut w.client, &id, "awaiting_approval").await;
    let a = pending_approvals(&mut w.client, &id).await.remove(0);
    let edited = |args: Value| pb::DecideApprovalRequest {
        args: serde_json::to_vec(&args).unwrap(),
        ..decide(&a.id, true, "mallory", "edited")
    };
    assert_code(
        w.client
            .decide_approval(edited(
                json!({"order_id": "ORD-1", "amount": 999_999, "currency": "EUR"}),
            ))
            .await,
        Code::FailedPrecondition,
        "the edited arguments are denied by policy payments/refund-hard-limit@1.0.0: Refund \
         amount exceeds the absolute ceiling",
    );
    assert_code(
        w.client
            .decide_approval(edited(json!({"order_id": "ORD-1", "amount": "everything"})))
            .await,
        Code::InvalidArgument,
        "the edited arguments do not match the input schema of issue_refund",
    );
    let still = approval(&mut w.client, &a.id).await;
    assert_eq!(still.status, "pending");
    assert!(still.votes.is_empty(), "a refused edit records nothing");
    assert!(w.worker.refunds().is_empty());
}

#[tokio::test]
async fn a_conversation_is_completed_on_request() {
    let mut w = world().await;
    let mut request = run_request("refund-agent", "hello there");
    request.mode = pb::SessionMode::Conversation as i32;
    let id = w
        .client
        .run_session(request)
        .await
        .unwrap()
        .into_inner()
        .session_id;
    wait_status(&mut w.client, &id, "awaiting_input").await;
    w.client
        .complete_session(pb::CompleteSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap();
    let s = inspect(&mut w.client, &id).await.session.unwrap();
    assert_eq!(s.status, "completed");
    assert_eq!(s.mode, pb::SessionMode::Conversation as i32);
    assert_eq!(output_message(&s), "echo: hello there");
}

#[tokio::test]
async fn list_sessions_filters_and_pages() {
    let mut w = world().await;
    publish_and_deploy(&mut w.client, &refund_agent("other-agent", 1)).await;
    let mut ids = Vec::new();
    for (i, name) in [
        "refund-agent",
        "refund-agent",
        "refund-agent",
        "other-agent",
    ]
    .into_iter()
    .enumerate()
    {
        let mut request = run_request(name, &format!("hello {i}"));
        request.metadata = [
            ("ticket".to_owned(), format!("T-{i}")),
            (
                "team".to_owned(),
                if i % 2 == 0 { "red" } else { "blue" }.to_owned(),
            ),
        ]
        .into();
        let id = w
            .client
            .run_session(request)
            .await
            .unwrap()
            .into_inner()
            .session_id;
        wait_status(&mut w.client, &id, "completed").await;
        ids.push(id);
    }
    let list = |req: pb::ListSessionsRequest| {
        let mut c = w.client.clone();
        async move { c.list_sessions(req).await.map(|r| r.into_inner()) }
    };
    // All versions of the agent, newest first.
    let all = list(pb::ListSessionsRequest {
        agent_ref: Some(agent_ref("refund-agent")),
        ..Default::default()
    })
    .await
    .unwrap();
    let got: Vec<&str> = all.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(got, [&ids[2], &ids[1], &ids[0]].map(String::as_str));
    let s = &all.sessions[0];
    assert_eq!(s.kind, "agent");
    assert_eq!(s.status, "completed");
    assert_eq!(s.agent_ref.as_ref().unwrap().version, "0.1.0");
    assert_eq!(s.metadata["ticket"], "T-2");
    assert_eq!(s.mode, pb::SessionMode::Task as i32);
    // A version filter.
    let versioned = list(pb::ListSessionsRequest {
        agent_ref: Some(pb::AgentRef {
            version: "9.9.9".into(),
            ..agent_ref("refund-agent")
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(versioned.sessions.is_empty());
    // Metadata: every pair must match.
    let red = list(pb::ListSessionsRequest {
        metadata: [("team".to_owned(), "red".to_owned())].into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let got: Vec<&str> = red.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(got, [&ids[2], &ids[0]].map(String::as_str));
    let one = list(pb::ListSessionsRequest {
        metadata: [
            ("team".to_owned(), "blue".to_owned()),
            ("ticket".to_owned(), "T-3".to_owned()),
        ]
        .into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(one.sessions.len(), 1);
    assert_eq!(one.sessions[0].id, ids[3]);
    // Pages of two, no repeats, newest first.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = list(pb::ListSessionsRequest {
            page_size: 2,
            page_token: token.clone(),
            status: "completed".into(),
            ..Default::default()
        })
        .await
        .unwrap();
        assert!(page.sessions.len() <= 2);
        seen.extend(page.sessions.into_iter().map(|s| s.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    // Bundles: none on this runtime.
    let bundles = list(pb::ListSessionsRequest {
        kind: "bundle".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(bundles.sessions.is_empty());
    // Bad filters are named.
    assert_code(
        list(pb::ListSessionsRequest {
            status: "sleeping".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "unknown session status \"sleeping\"",
    );
    assert_code(
        list(pb::ListSessionsRequest {
            kind: "robot".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "kind \"robot\"",
    );
    assert_code(
        list(pb::ListSessionsRequest {
            page_token: "garbage".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "page token",
    );
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let mut w = world().await;
    let mut c = w.client.clone();
    let base = w.client.clone();
    let bad = move |f: fn(&mut pb::RunSessionRequest)| {
        let mut r = run_request("refund-agent", "Refund 100");
        f(&mut r);
        let mut c = base.clone();
        async move { c.run_session(r).await }
    };
    assert_code(
        bad(|r| r.input = b"[1, 2]".to_vec()).await,
        Code::InvalidArgument,
        "input must be a JSON object or a JSON string, got an array",
    );
    assert_code(
        bad(|r| r.input = b"{not json".to_vec()).await,
        Code::InvalidArgument,
        "input must be valid JSON",
    );
    assert_code(
        bad(|r| r.resolved_secrets.clear()).await,
        Code::InvalidArgument,
        "missing resolved secrets: \"openai\"",
    );
    assert_code(
        bad(|r| {
            r.resolved_secrets.insert("github".into(), b"x".to_vec());
        })
        .await,
        Code::InvalidArgument,
        "unknown resolved secrets: \"github\"",
    );
    assert_code(
        bad(|r| {
            r.metadata.insert(String::new(), "x".into());
        })
        .await,
        Code::InvalidArgument,
        "metadata keys must not be empty",
    );
    assert_code(
        bad(|r| r.agent_ref = None).await,
        Code::InvalidArgument,
        "agent_ref or bundle_ref is required",
    );
    assert_code(
        bad(|r| {
            r.agent_ref = None;
            r.bundle_ref = Some(pb::BundleRef {
                namespace: "support".into(),
                name: "desk".into(),
                version: String::new(),
            });
        })
        .await,
        Code::NotFound,
        "bundle support/desk not found",
    );
    assert_code(
        bad(|r| r.agent_ref.as_mut().unwrap().version = "0.0.1".into()).await,
        Code::FailedPrecondition,
        "version \"0.0.1\" is not the active deployment (active: \"0.1.0\")",
    );
    assert_code(
        bad(|r| r.agent_ref.as_mut().unwrap().name = "nobody".into()).await,
        Code::NotFound,
        "agent support/nobody not found",
    );
    // A JSON string input is the first user message (the published SDK's `run(input="text")`).
    let mut r = run_request("refund-agent", "");
    r.input = br#""just text""#.to_vec();
    let id = c.run_session(r).await.unwrap().into_inner().session_id;
    let done = wait_status(&mut w.client, &id, "completed").await;
    assert_eq!(output_message(&done), "echo: just text");

    assert_code(
        c.get_approval(pb::GetApprovalRequest {
            approval_id: "not-a-uuid".into(),
        })
        .await,
        Code::InvalidArgument,
        "approval_id must be a UUID",
    );
    assert_code(
        c.get_approval(pb::GetApprovalRequest {
            approval_id: uuid::Uuid::new_v4().to_string(),
        })
        .await,
        Code::NotFound,
        "not found",
    );
    assert_code(
        c.decide_approval(pb::DecideApprovalRequest {
            approval_id: uuid::Uuid::new_v4().to_string(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "decision must be APPROVE or REJECT",
    );
    assert_code(
        c.list_approvals(pb::ListApprovalsRequest {
            status: "maybe".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "unknown approval status \"maybe\"",
    );
    assert_code(
        c.inspect_session(pb::InspectSessionRequest {
            session_id: String::new(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "session_id is required",
    );
    assert_code(
        c.inspect_session(pb::InspectSessionRequest {
            session_id: "run_00000000-0000-4000-8000-000000000000".into(),
            ..Default::default()
        })
        .await,
        Code::NotFound,
        "not found",
    );
    // An archived agent cannot be run.
    c.archive_agent(pb::ArchiveAgentRequest {
        agent_ref: Some(agent_ref("refund-agent")),
    })
    .await
    .unwrap();
    assert_code(
        bad(|_| {}).await,
        Code::FailedPrecondition,
        "agent support/refund-agent is archived and cannot be run",
    );
}

#[tokio::test]
async fn approvals_list_filters_and_pages() {
    let mut w = world().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let id = run(
            &mut w.client,
            "refund-agent",
            &format!("Refund 400 for ORD-{i}"),
        )
        .await;
        wait_status(&mut w.client, &id, "awaiting_approval").await;
        ids.push(id);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = w
            .client
            .list_approvals(pb::ListApprovalsRequest {
                status: "pending".into(),
                agent_namespace: "support".into(),
                agent_name: "refund-agent".into(),
                route: String::new(),
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        seen.extend(page.approvals.into_iter().map(|a| a.session_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    let other = w
        .client
        .list_approvals(pb::ListApprovalsRequest {
            agent_namespace: "support".into(),
            agent_name: "someone-else".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(other.approvals.is_empty());
}

/// Stops the server with an approval pending, serves again on the same database, approves:
/// the session resumes and the refund runs.
async fn restart_resumes_a_pending_approval(db: Db) {
    let key = SecretsKey::generate().unwrap();
    let model: Arc<RuleModel> = Arc::default();
    let server = Server::start(&db, &key, Arc::clone(&model)).await;
    let worker = Worker::connect(&server).await;
    let mut client = server.client().await;
    publish_and_deploy(&mut client, &refund_agent("refund-agent", 1)).await;
    let id = run(&mut client, "refund-agent", "Refund 400 for ORD-1").await;
    wait_status(&mut client, &id, "awaiting_approval").await;
    let a = pending_approvals(&mut client, &id).await.remove(0);
    drop(client);
    server.stop().await;
    drop(worker);

    let server = Server::start(&db, &key, model).await;
    let worker = Worker::connect(&server).await;
    let mut client = server.client().await;
    assert_eq!(
        inspect(&mut client, &id).await.session.unwrap().status,
        "awaiting_approval"
    );
    let decided = client
        .decide_approval(decide(&a.id, true, "emad", "verified after restart"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.status, "approved");
    let done = wait_status(&mut client, &id, "completed").await;
    assert_eq!(worker.refunds().len(), 1);
    assert!(output_message(&done).starts_with("refund issued: "));
    // The resumed session's model was built with the key sealed before the restart.
    assert!(
        server
            .factory
            .keys
            .lock()
            .unwrap()
            .iter()
            .all(|k| k.as_deref() == Some(API_KEY))
    );
    server.stop().await;
}

#[tokio::test]
async fn restart_resumes_a_pending_approval_on_sqlite() {
    restart_resumes_a_pending_approval(Db::sqlite()).await;
}

#[tokio::test]
async fn restart_resumes_a_pending_approval_on_postgres() {
    if let Some(db) = Db::postgres().await {
        restart_resumes_a_pending_approval(db).await;
    }
}

/// Issue 14 at the boundary: a session whose input is 3.5 MB and whose tool result is 3 MB (each
/// under the runtime's 4 MiB message limit, so accepted) is inspected through a client with
/// gRPC's default 4 MiB receive limit, the published SDK's: every page stays under the 3 MiB
/// budget, the long payloads are shortened and flagged, and `GetSessionPayload` returns them
/// whole.
#[tokio::test]
async fn a_session_with_megabytes_of_input_and_result_is_inspectable() {
    use prost::Message as _;
    const BUDGET: usize = 3 * 1024 * 1024;
    let db = Db::sqlite();
    let server = Server::start(&db, &SecretsKey::generate().unwrap(), Arc::default()).await;
    let _worker = Worker::connect_padded(&server, 3_000_000).await;
    let mut client = server.client().await;
    publish_and_deploy(&mut client, &refund_agent("refund-agent", 1)).await;
    let message = format!("Refund 100 for ORD-1. {}", "y".repeat(3_500_000));
    let id = run(&mut client, "refund-agent", &message).await;
    // Megabytes take a while through a debug build: poll for longer than [`PATIENCE`].
    let mut last = String::new();
    for _ in 0..600 {
        let s = inspect(&mut client, &id).await.session.unwrap();
        if s.status == "completed" {
            break;
        }
        assert!(
            !matches!(s.status.as_str(), "failed" | "cancelled"),
            "session {id} ended {} ({})",
            s.status,
            s.error
        );
        last = s.status;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        inspect(&mut client, &id).await.session.unwrap().status,
        "completed",
        "last seen {last}"
    );

    // Every page, as the SDK asks (no page size), then in pages of two entries.
    let pages = |page_size: i32| {
        let mut client = client.clone();
        let id = id.clone();
        async move {
            let mut pages = Vec::new();
            let mut page_token = String::new();
            loop {
                let page = client
                    .inspect_session(pb::InspectSessionRequest {
                        session_id: id.clone(),
                        page_size,
                        page_token,
                    })
                    .await
                    .unwrap()
                    .into_inner();
                assert!(page.encoded_len() <= BUDGET, "{} bytes", page.encoded_len());
                assert!(!page.timeline.is_empty());
                page_token = page.next_page_token.clone();
                pages.push(page);
                if page_token.is_empty() {
                    return pages;
                }
                assert!(pages.len() < 100, "paging does not end");
            }
        }
    };
    let whole = pages(0).await;
    let timeline: Vec<pb::InspectTimelineEntry> =
        whole.iter().flat_map(|p| p.timeline.clone()).collect();
    // Shortened payloads keep every entry small, so a client that asks for no page size (the
    // published SDK, which knows no page tokens) gets the whole timeline in one response.
    assert_eq!(whole.len(), 1, "the timeline fits in one response");
    let eights = pages(8).await;
    assert!(eights.len() > 1, "pages of 8 entries: {}", eights.len());
    let by_eight: Vec<pb::InspectTimelineEntry> =
        eights.into_iter().flat_map(|p| p.timeline).collect();
    assert_eq!(
        timeline, by_eight,
        "pages of any size make the same timeline"
    );
    let kinds: Vec<&str> = timeline.iter().map(|e| e.kind.as_str()).collect();
    for kind in [
        "session.started",
        "invocation_completed",
        "session.completed",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }

    // The session's input and output are shortened and flagged with their full sizes.
    let session = whole[0].session.clone().unwrap();
    let input_text = json!({ "message": message }).to_string();
    let flagged: Vec<(&str, i64)> = session
        .truncated
        .iter()
        .map(|t| (t.field.as_str(), t.size_bytes))
        .collect();
    assert!(
        flagged.contains(&("input", i64::try_from(input_text.len()).unwrap())),
        "{flagged:?}"
    );
    assert!(
        flagged.iter().any(|(f, _)| *f == "output.message"),
        "{flagged:?}"
    );
    let output = session.output.as_ref().unwrap();
    assert!(
        output.message.starts_with("refund issued: "),
        "{}",
        &output.message[..100]
    );
    assert!(output.message.ends_with(" bytes of JSON]"));

    let read = |reference: pb::PayloadRef| {
        let mut client = client.clone();
        async move {
            let mut stream = client
                .get_session_payload(pb::GetSessionPayloadRequest {
                    r#ref: Some(reference),
                })
                .await
                .unwrap()
                .into_inner();
            let mut text = Vec::new();
            while let Some(chunk) = stream.message().await.unwrap() {
                assert!(chunk.data.len() <= 1024 * 1024);
                assert_eq!(usize::try_from(chunk.offset).unwrap(), text.len());
                text.extend_from_slice(&chunk.data);
            }
            String::from_utf8(text).unwrap()
        }
    };
    let input_ref = session.truncated[0].r#ref.clone().unwrap();
    assert_eq!(input_ref.field, "input");
    assert_eq!(read(input_ref).await, input_text);

    // The tool result: shortened in the invocation entries and in the tool.completed event,
    // keeping its small members; read whole, it is what the worker sent.
    let completed = timeline
        .iter()
        .find(|e| e.kind == "invocation_completed")
        .unwrap();
    let t = completed
        .truncated
        .iter()
        .find(|t| t.field == "invocation.result")
        .unwrap_or_else(|| panic!("{:?}", completed.truncated));
    let result = read(t.r#ref.clone().unwrap()).await;
    let result: Value = serde_json::from_str(&result).unwrap();
    assert_eq!(result["memo"].as_str().unwrap().len(), 3_000_000);
    assert_eq!(result["refund_id"], "rf_2891");
    assert_eq!(
        t.size_bytes,
        i64::try_from(result.to_string().len()).unwrap()
    );
    let shown = completed
        .invocation
        .as_ref()
        .unwrap()
        .result
        .clone()
        .unwrap();
    let Some(prost_types::value::Kind::StructValue(shown)) = shown.kind else {
        panic!("the shortened result is no longer an object")
    };
    assert_eq!(
        shown.fields["refund_id"].kind,
        Some(prost_types::value::Kind::StringValue("rf_2891".into()))
    );
    // Every flagged field reads back whole, as long as its flag says.
    let mut flags: Vec<&pb::TruncatedPayload> =
        timeline.iter().flat_map(|e| e.truncated.iter()).collect();
    flags.dedup_by_key(|t| t.r#ref.clone());
    for t in flags {
        let text = read(t.r#ref.clone().unwrap()).await;
        assert_eq!(i64::try_from(text.len()).unwrap(), t.size_bytes, "{t:?}");
    }

    // Bad references say what is wrong.
    let mut bad = pb::PayloadRef {
        session_id: id.clone(),
        seq: 1,
        field: "nope".into(),
        ..Default::default()
    };
    assert_code(
        client
            .get_session_payload(pb::GetSessionPayloadRequest {
                r#ref: Some(bad.clone()),
            })
            .await,
        Code::InvalidArgument,
        "has no payload field \"nope\"; expected one of payload",
    );
    bad.field = "payload".into();
    bad.seq = 10_000;
    assert_code(
        client
            .get_session_payload(pb::GetSessionPayloadRequest { r#ref: Some(bad) })
            .await,
        Code::NotFound,
        "has no event with seq 10000",
    );
    assert_code(
        client
            .inspect_session(pb::InspectSessionRequest {
                session_id: id.clone(),
                page_size: 0,
                page_token: "later".into(),
            })
            .await,
        Code::InvalidArgument,
        "page_token \"later\" is not a next_page_token",
    );
    server.stop().await;
}

/// Starts "Refund 100 for ORD-<n>" on a worker that never answers, kills the worker mid-call
/// and returns the session id and the outcome review the runtime opened.
async fn lost_refund(w: &mut World, order: u32) -> (String, pb::Approval) {
    let holder = Worker::connect_holding(&w.server).await;
    let id = run(
        &mut w.client,
        "refund-agent",
        &format!("Refund 100 for ORD-{order}"),
    )
    .await;
    for _ in 0..500 {
        if !holder.refunds().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(holder.refunds().len(), 1, "sent once");
    drop(holder);
    wait_status(&mut w.client, &id, "awaiting_approval").await;
    let review = pending_approvals(&mut w.client, &id).await.remove(0);
    (id, review)
}

#[tokio::test]
async fn a_worker_lost_mid_refund_opens_an_outcome_review_and_only_resend_sends_it_again() {
    let mut w = world().await;
    // Only the workers this test connects take the refunds.
    w.worker.task.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The review says what happened and asks its own question; no policy, quorum 1.
    let (id, review) = lost_refund(&mut w, 1).await;
    assert_eq!(review.kind, "outcome_review");
    assert!(review.reason.contains("was lost"), "{}", review.reason);
    assert!(
        review.reason.ends_with(
            "The runtime cannot tell whether payments.issue-refund@1.0.0 took effect: did it \
             happen?"
        ),
        "{}",
        review.reason
    );
    assert_eq!(review.policy_ref, "");
    assert_eq!(review.approvals_required, 1);
    // The published SDK's APPROVE (no resolution) never re-sends: it is refused.
    assert_code(
        w.client
            .decide_approval(decide(&review.id, true, "emad", "looks fine"))
            .await,
        Code::FailedPrecondition,
        "is an outcome review",
    );
    // happened: recorded succeeded with the operator's result, not sent again.
    let decided = w
        .client
        .decide_approval(resolve(
            &review.id,
            "happened",
            "emad",
            Some(json!({"refund_id": "rf_9"})),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.status, "approved");
    let done = wait_status(&mut w.client, &id, "completed").await;
    assert!(
        output_message(&done).starts_with(
            "refund issued: the worker did not report this call's outcome; operator emad \
             confirmed that it took effect. Result: {\"refund_id\":\"rf_9\"}"
        ),
        "{}",
        output_message(&done)
    );
    let got = w
        .client
        .get_approval(pb::GetApprovalRequest {
            approval_id: review.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (got.kind.as_str(), got.resolution.as_str()),
        ("outcome_review", "happened")
    );

    // REJECT (what the published SDK sends): fail, outcome unknown, not re-sent.
    let (id, review) = lost_refund(&mut w, 2).await;
    let decided = w
        .client
        .decide_approval(decide(&review.id, false, "emad", "cannot reach the PSP"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.status, "denied");
    let done = wait_status(&mut w.client, &id, "completed").await;
    assert_eq!(
        output_message(&done),
        "refund not issued: outcome_unknown: outcome unknown, not re-sent by emad (the call may \
         have taken effect): cannot reach the PSP"
    );

    // resend: named explicitly, the only way the call is dispatched a second time.
    let (id, review) = lost_refund(&mut w, 3).await;
    let answering = Worker::connect(&w.server).await;
    w.client
        .decide_approval(resolve(&review.id, "resend", "emad", None))
        .await
        .unwrap();
    let done = wait_status(&mut w.client, &id, "completed").await;
    assert!(
        output_message(&done).starts_with("refund issued: {"),
        "{}",
        output_message(&done)
    );
    let resent = answering.invocations.lock().unwrap().clone();
    assert_eq!(resent.len(), 1);
    assert_eq!(
        resent[0].call_id, review.call_id,
        "the same call, sent a second time"
    );
    // A resolution on a policy approval is refused.
    let policy_session = run(&mut w.client, "refund-agent", "Refund 400 for ORD-4").await;
    wait_status(&mut w.client, &policy_session, "awaiting_approval").await;
    let policy = pending_approvals(&mut w.client, &policy_session)
        .await
        .remove(0);
    assert_eq!(policy.kind, "policy");
    assert_code(
        w.client
            .decide_approval(resolve(&policy.id, "resend", "emad", None))
            .await,
        Code::InvalidArgument,
        "is a policy approval",
    );
    w.server.stop().await;
}

/// With `output.format: json`, InspectSession carries the accepted output as JSON text
/// (`SessionOutputInspect.json`); a text agent's is empty.
#[tokio::test]
async fn inspect_carries_a_json_output() {
    let mut w = world().await;
    publish_and_deploy(
        &mut w.client,
        &refund_agent_with_output(
            "json-agent",
            1,
            "  format: json\n  schema:\n    inline:\n      type: object\n      required: [refund_id]\n",
        ),
    )
    .await;
    let id = run(
        &mut w.client,
        "json-agent",
        r#"answer: {"refund_id": "rf_1"}"#,
    )
    .await;
    let done = wait_status(&mut w.client, &id, "completed").await;
    let output = done.output.as_ref().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&output.json).unwrap(),
        json!({"refund_id": "rf_1"})
    );
    let text = run(
        &mut w.client,
        "refund-agent",
        r#"answer: {"refund_id": "rf_1"}"#,
    )
    .await;
    let done = wait_status(&mut w.client, &text, "completed").await;
    assert_eq!(output_message(&done), r#"{"refund_id": "rf_1"}"#);
    assert_eq!(done.output.unwrap().json, "", "text output has no JSON");
}
