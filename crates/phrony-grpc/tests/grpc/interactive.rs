//! `RunSessionInteractive` over real TCP: an in-process server on a SQLite file, the refund
//! example of `policies-examples/refund-agent` (100 allowed, 400 needs approval), a scripted
//! model injected through `ServeConfig::providers`, a tool worker on the `Work` stream, and
//! clients speaking the generated tonic client.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pb::run_session_interactive_client_msg::Body as Up;
use pb::run_session_interactive_server_msg::Body as Down;
use phrony_auth::{Role as AuthRole, TokenSecret};
use phrony_engine::ProviderFactory;
use phrony_ledger::Ledger;
use phrony_ledger::NewApiToken;
use phrony_manifest::CompiledAgent;
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_providers::{
    ApiKey, CompletionRequest, ContentBlock, Event as ModelEvent, ModelProvider, ProviderError,
    Role, StopReason,
};
use phrony_runtime::auth::AuthMode;
use phrony_runtime::{SecretsKey, ServeConfig};
use phrony_test_support::fake_model::{Script, Step, completed};

use crate::access::{Bearer, Client};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};

/// A safety net against hangs; no assertion depends on timing.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The scripted model (`phrony_test_support::fake_model`), handed to the server.

/// Answers with the last user text, prefixed.
fn echo() -> Step {
    Step::from_fn(|r| {
        let last = user_texts(r).pop().unwrap_or_default();
        vec![
            ModelEvent::TextDelta(format!("echo: {last}")),
            completed(StopReason::EndTurn, 10),
        ]
    })
}

#[derive(Debug)]
struct ScriptFactory(Arc<Script>);

impl ProviderFactory for ScriptFactory {
    fn build(
        &self,
        _agent: &CompiledAgent,
        _api_key: Option<ApiKey>,
        _completions_done: usize,
    ) -> Result<Box<dyn ModelProvider>, ProviderError> {
        Ok(self.0.provider())
    }
}

fn user_texts(r: &CompletionRequest) -> Vec<String> {
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

fn tool_results(r: &CompletionRequest) -> Vec<(String, bool)> {
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

// ---------------------------------------------------------------------------------------------
// The server, the worker and the agent.

struct Server {
    addr: String,
    /// The `authorization` value of the harness's own calls (`required` mode: an admin token).
    bearer: Option<String>,
    ledger: Ledger,
    script: Arc<Script>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _worker: Worker,
    _dir: tempfile::TempDir,
}

impl Server {
    /// A server running the refund example (its approval quorum set to `quorum`) on `steps`.
    async fn start(steps: Vec<Step>, quorum: u32) -> Self {
        Self::start_with(steps, refund_agent(quorum, "")).await
    }

    /// A server running `agent` on `steps`.
    async fn start_with(steps: Vec<Step>, agent: CompiledAgent) -> Self {
        Self::start_in(steps, agent, AuthMode::Local).await
    }

    /// [`Server::start_with`] in `auth` mode; in `required` mode the harness publishes,
    /// deploys and serves tools with an admin token.
    async fn start_in(steps: Vec<Step>, agent: CompiledAgent, auth: AuthMode) -> Self {
        Self::start_configured(steps, agent, auth, |_| {}).await
    }

    /// [`Server::start_in`] with `configure` applied to the server's configuration.
    async fn start_configured(
        steps: Vec<Step>,
        agent: CompiledAgent,
        auth: AuthMode,
        configure: impl FnOnce(&mut ServeConfig),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
        let ledger = Ledger::connect(&url).await.unwrap();
        ledger.migrate().await.unwrap();
        let listener = phrony_runtime::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().to_string();
        let script = Script::new(steps);
        let mut config = ServeConfig::new(SecretsKey::generate().unwrap());
        config.providers = Some(Arc::new(ScriptFactory(Arc::clone(&script))));
        config.default_actor = "runtime-default".into();
        config.shutdown_grace = Duration::from_secs(2);
        config.auth = auth;
        configure(&mut config);
        let bearer = match auth {
            AuthMode::Local => None,
            AuthMode::Required => Some(token(&ledger, "harness-admin", AuthRole::Admin).await),
        };
        let serving = ledger.clone();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            phrony_runtime::serve(listener, serving, config, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let mut client = connect_with(&addr, bearer.clone()).await;
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
                    ..agent_ref()
                }),
                actor: "alice".into(),
                allow_new_secret_endpoints: false,
            })
            .await
            .unwrap();
        let worker = Worker::connect(&addr, bearer.clone()).await;
        Self {
            addr,
            bearer,
            ledger,
            script,
            stop: Some(stop),
            task,
            _worker: worker,
            _dir: dir,
        }
    }

    async fn client(&self) -> Client {
        connect_with(&self.addr, self.bearer.clone()).await
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the server did not stop")
            .unwrap();
    }
}

/// A client sending `bearer` (`Bearer phr_…`) as its `authorization`, when given.
async fn connect_with(addr: &str, bearer: Option<String>) -> Client {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    RuntimeClient::with_interceptor(channel, Bearer(bearer))
}

/// An API token named `name` with `role` in `ledger`; returns the `authorization` value.
async fn token(ledger: &Ledger, name: &str, role: AuthRole) -> String {
    let secret = TokenSecret::from_random(
        *phrony_auth::hash_secret(name)
            .as_bytes()
            .first_chunk::<32>()
            .unwrap(),
    );
    ledger
        .create_api_token(NewApiToken {
            name: name.into(),
            secret_hash: secret.hash(),
            roles: vec![role],
            routes: vec![],
            tools: vec![],
            expires_at: None,
            created_by: "test".into(),
        })
        .await
        .unwrap();
    format!("Bearer {}", secret.expose())
}

fn agent_ref() -> pb::AgentRef {
    pb::AgentRef {
        namespace: "support".into(),
        name: "refund-agent".into(),
        version: String::new(),
    }
}

/// `policies-examples/refund-agent`, with the approval boundary's quorum set to `quorum` and
/// `limits` (YAML lines under `spec.limits`, indented by 4 spaces) if not empty.
fn refund_agent(quorum: u32, limits: &str) -> CompiledAgent {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/refund-agent");
    let dir = tempfile::tempdir().unwrap();
    for sub in ["tools", "policies"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for entry in std::fs::read_dir(src.join(sub)).unwrap() {
            let entry = entry.unwrap();
            let text = std::fs::read_to_string(entry.path()).unwrap().replace(
                "approvals_required: 1",
                &format!("approvals_required: {quorum}"),
            );
            std::fs::write(dir.path().join(sub).join(entry.file_name()), text).unwrap();
        }
    }
    let mut agent = std::fs::read_to_string(src.join("agent.yaml")).unwrap();
    if !limits.is_empty() {
        agent = agent.replace("\noutput:", &format!("  limits:\n{limits}\noutput:"));
    }
    std::fs::write(dir.path().join("agent.yaml"), agent).unwrap();
    match phrony_manifest::load_agent(dir.path().join("agent.yaml")) {
        Ok(c) => c.agent,
        Err(d) => panic!("the refund example does not compile:\n{d}"),
    }
}

/// A tool worker on the Work stream, answering like the example's `worker.py`.
struct Worker {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Worker {
    async fn connect(addr: &str, bearer: Option<String>) -> Self {
        use pb::work_client_msg::Body as WUp;
        use pb::work_server_msg::Body as WDown;
        let (up, rx) = mpsc::channel(16);
        let msg = |body| pb::WorkClientMsg { body: Some(body) };
        let handler = |tool: &str| pb::WorkHandlerAdvertisement {
            tool: tool.into(),
            version: "1.0.0".into(),
            contract_version: String::new(),
            max_concurrency: 4,
            descriptor_hash: String::new(),
        };
        up.send(msg(WUp::Register(pb::WorkRegister {
            worker_id: "refund-worker".into(),
            workload_identity: "tests/interactive".into(),
            image_digest: String::new(),
            handlers: vec![
                handler("orders.lookup-order"),
                handler("payments.issue-refund"),
            ],
            in_flight: Vec::new(),
        })))
        .await
        .unwrap();
        let mut down = connect_with(addr, bearer)
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
            matches!(first, Some(WDown::Registered(_))),
            "expected registered, got {first:?}"
        );
        let task = tokio::spawn(async move {
            let mut heartbeat = tokio::time::interval(Duration::from_secs(5));
            loop {
                let next = tokio::select! {
                    m = down.message() => m,
                    _ = heartbeat.tick() => {
                        let _ = up.send(msg(WUp::Heartbeat(pb::WorkHeartbeat {}))).await;
                        continue;
                    }
                };
                let Ok(Some(m)) = next else { break };
                if let Some(WDown::Invoke(inv)) = m.body {
                    let args: Value = serde_json::from_slice(&inv.args).unwrap();
                    let payload = if inv.tool == "orders.lookup-order" {
                        json!({"order_id": args["order_id"], "found": true, "total": 400.0,
                               "currency": "EUR", "refund_eligible": true})
                    } else {
                        json!({"refund_id": "rf_2891", "amount": args["amount"],
                               "status": "issued"})
                    };
                    let _ = up
                        .send(msg(WUp::Result(pb::WorkToolResult {
                            call_id: inv.call_id,
                            payload: payload.to_string().into_bytes(),
                            error: None,
                        })))
                        .await;
                }
            }
        });
        Self { task }
    }
}

// ---------------------------------------------------------------------------------------------
// The interactive client.

struct Stream {
    up: Option<mpsc::Sender<pb::RunSessionInteractiveClientMsg>>,
    down: Streaming<pb::RunSessionInteractiveServerMsg>,
    /// Everything received so far.
    seen: Vec<Down>,
}

fn start_msg(input: &str, mode: pb::SessionMode) -> Up {
    Up::Start(pb::RunSessionInteractiveStart {
        agent_ref: Some(agent_ref()),
        input: serde_json::to_vec(&json!(input)).unwrap(),
        session_id: String::new(),
        resolved_secrets: [("openai".to_owned(), b"sk-test".to_vec())].into(),
        bundle_ref: None,
        mode: mode as i32,
        metadata: [("ticket_id".to_owned(), "T-1".to_owned())].into(),
    })
}

fn attach_msg(session_id: &str) -> Up {
    Up::Start(pb::RunSessionInteractiveStart {
        session_id: session_id.into(),
        ..Default::default()
    })
}

fn user(text: &str) -> Up {
    Up::UserMessage(pb::RunSessionInteractiveUserMessage { text: text.into() })
}

fn decide(approval_id: &str, approved: bool, comment: &str) -> Up {
    Up::ToolApproval(pb::RunSessionInteractiveToolApproval {
        approval_id: approval_id.into(),
        approved,
        comment: comment.into(),
        args: Vec::new(),
        comprehension_acknowledged: false,
        resolution: String::new(),
        result: Vec::new(),
    })
}

/// Opens a stream whose first message is `first`, as `actor` (the `phrony-actor` header).
async fn open(server: &Server, actor: Option<&str>, first: Up) -> Result<Stream, Status> {
    open_with(server.client().await, actor, first).await
}

/// [`open`] on `client`.
async fn open_with(mut client: Client, actor: Option<&str>, first: Up) -> Result<Stream, Status> {
    let (up, rx) = mpsc::channel(16);
    up.send(pb::RunSessionInteractiveClientMsg { body: Some(first) })
        .await
        .unwrap();
    let mut request = Request::new(ReceiverStream::new(rx));
    if let Some(actor) = actor {
        request
            .metadata_mut()
            .insert("phrony-actor", actor.parse().unwrap());
    }
    let down = client.run_session_interactive(request).await?.into_inner();
    Ok(Stream {
        up: Some(up),
        down,
        seen: Vec::new(),
    })
}

impl Stream {
    async fn send(&self, body: Up) {
        self.up
            .as_ref()
            .unwrap()
            .send(pb::RunSessionInteractiveClientMsg { body: Some(body) })
            .await
            .unwrap();
    }

    /// The next message; `None` when the server ended the stream with `OK`.
    async fn next(&mut self) -> Result<Option<Down>, Status> {
        let msg = tokio::time::timeout(PATIENCE, self.down.message())
            .await
            .unwrap_or_else(|_| panic!("no message in time; so far: {:#?}", self.seen))?;
        let body = msg.map(|m| m.body.expect("a server message without a body"));
        if let Some(b) = &body {
            self.seen.push(b.clone());
        }
        Ok(body)
    }

    /// Messages up to and including the first that `stop` accepts.
    async fn until(&mut self, stop: impl Fn(&Down) -> bool) -> Vec<Down> {
        let mut out = Vec::new();
        loop {
            match self.next().await {
                Ok(Some(b)) => {
                    let done = stop(&b);
                    out.push(b);
                    if done {
                        return out;
                    }
                }
                other => {
                    panic!("stream ended ({other:?}) before the expected message; got {out:#?}")
                }
            }
        }
    }

    async fn started(&mut self) -> pb::RunSessionInteractiveSessionStarted {
        match self.next().await.unwrap() {
            Some(Down::SessionStarted(s)) => s,
            other => panic!("expected session_started, got {other:?}"),
        }
    }

    /// Reads to the end of the stream, which must end with `OK`.
    async fn rest(&mut self) -> Vec<Down> {
        let mut out = Vec::new();
        while let Some(b) = self.next().await.unwrap() {
            out.push(b);
        }
        out
    }
}

/// A refused client message: a `status` that repeats the current status with the refusal
/// (status changes carry other reasons, or none).
fn refusal(b: &Down, containing: &str) -> bool {
    matches!(b, Down::Status(s) if !s.reason.is_empty() && s.reason.contains(containing)
        && !s.reason.starts_with("approval "))
}

fn kind(b: &Down) -> &'static str {
    match b {
        Down::SessionStarted(_) => "session_started",
        Down::TextDelta(_) => "text_delta",
        Down::AwaitingInput(_) => "awaiting_input",
        Down::Completed(_) => "completed",
        Down::Failed(_) => "failed",
        Down::ToolCall(_) => "tool_call",
        Down::ToolResult(_) => "tool_result",
        Down::ApprovalRequired(_) => "approval_required",
        Down::Cancelled(_) => "cancelled",
        Down::ApprovalDecided(_) => "approval_decided",
        Down::Status(_) => "status",
    }
}

/// The kinds of `msgs`, without status changes and text.
fn flow(msgs: &[Down]) -> Vec<&'static str> {
    msgs.iter()
        .map(kind)
        .filter(|k| !matches!(*k, "status" | "text_delta"))
        .collect()
}

fn text(msgs: &[Down]) -> String {
    msgs.iter()
        .filter_map(|b| match b {
            Down::TextDelta(t) => Some(t.delta.as_str()),
            _ => None,
        })
        .collect()
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[tokio::test]
async fn a_task_streams_its_turn_and_ends_with_completed() {
    let server = Server::start(
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::call(
                "issue_refund",
                json!({"order_id": "ORD-1", "amount": 100, "currency": "EUR"}),
            ),
            Step::say_in_chunks(&["Your refund ", "of €100 ", "has been issued."]),
        ],
        1,
    )
    .await;
    let mut s = open(
        &server,
        None,
        start_msg("Refund 100 for ORD-1.", pb::SessionMode::Unspecified),
    )
    .await
    .unwrap();
    let started = s.started().await;
    assert!(started.session_id.starts_with("run_"));
    assert_eq!(started.model_provider, "openai");
    assert_eq!(started.model_name, "gpt-4o");
    assert!(started.history.is_empty());
    assert!(started.session_started_at_unix_ms > 0);
    assert_eq!(started.session_ended_at_unix_ms, 0);

    let msgs = s.rest().await;
    assert_eq!(
        flow(&msgs),
        [
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "completed"
        ],
        "{msgs:#?}"
    );
    let Down::ToolCall(lookup) = msgs.iter().find(|m| kind(m) == "tool_call").unwrap() else {
        unreachable!()
    };
    assert_eq!(lookup.tool, "orders.lookup-order");
    assert_eq!(lookup.version, "1.0.0");
    assert_eq!(lookup.wire_name, "lookup_order");
    assert_eq!(json_of(&lookup.args), json!({"order_id": "ORD-1"}));
    let results: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            Down::ToolResult(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(json_of(&results[0].payload)["total"], json!(400.0));
    assert_eq!(results[1].error_code, "");
    assert_eq!(json_of(&results[1].payload)["refund_id"], json!("rf_2891"));
    assert_eq!(text(&msgs), "Your refund of €100 has been issued.");
    let Some(Down::Completed(done)) = msgs.last() else {
        unreachable!()
    };
    assert_eq!(done.stop_reason, "end_turn");
    let output = json_of(&done.output);
    assert_eq!(
        output["message"],
        json!("Your refund of €100 has been issued.")
    );
    let stats = done.stats.unwrap();
    assert_eq!(stats.turn, 1);
    assert_eq!(stats.session_usage.unwrap().input_tokens, 60);
    assert!(done.session_ended_at_unix_ms >= started.session_started_at_unix_ms);
    server.stop().await;
}

#[tokio::test]
async fn a_conversation_parks_and_runs_the_next_message() {
    let server = Server::start(
        vec![Step::say_in_chunks(&["Which order ", "is it?"]), echo()],
        1,
    )
    .await;
    let mut s = open(
        &server,
        Some("emad"),
        start_msg("I want a refund.", pb::SessionMode::Conversation),
    )
    .await
    .unwrap();
    s.started().await;
    let first = s.until(|b| kind(b) == "awaiting_input").await;
    assert_eq!(text(&first), "Which order is it?");
    let Some(Down::AwaitingInput(w)) = first.last() else {
        unreachable!()
    };
    assert_eq!(w.stop_reason, "end_turn");
    assert_eq!(w.input_blocked_reason, "");
    assert_eq!(w.stats.unwrap().turn, 1);

    // A refused message is reported on the stream, which stays open.
    s.send(user("   ")).await;
    let refused = s.until(|b| refusal(b, "")).await;
    let Some(Down::Status(st)) = refused.last() else {
        unreachable!()
    };
    assert_eq!(st.status, "awaiting_input");
    assert_eq!(st.reason, "user_message.text must be non-empty");

    s.send(user("ORD-1")).await;
    let second = s.until(|b| kind(b) == "awaiting_input").await;
    assert_eq!(text(&second), "echo: ORD-1");
    let Some(Down::AwaitingInput(w)) = second.last() else {
        unreachable!()
    };
    assert_eq!(w.stats.unwrap().turn, 2);
    assert_eq!(w.stats.unwrap().session_usage.unwrap().input_tokens, 40);
    server.stop().await;
}

#[tokio::test]
async fn an_approval_decided_on_the_stream_is_the_header_actors_and_its_comment_reaches_the_model()
{
    let server = Server::start(
        vec![
            Step::call(
                "issue_refund",
                json!({"order_id": "ORD-1", "amount": 400, "currency": "EUR"}),
            ),
            Step::from_fn(|r| {
                let (result, _) = tool_results(r).pop().unwrap();
                vec![
                    ModelEvent::TextDelta(format!("Not refunded: {result}")),
                    completed(StopReason::EndTurn, 10),
                ]
            }),
        ],
        1,
    )
    .await;
    let mut s = open(
        &server,
        Some("emad"),
        start_msg("Refund 400 for ORD-1.", pb::SessionMode::Unspecified),
    )
    .await
    .unwrap();
    let session_id = s.started().await.session_id;
    let msgs = s.until(|b| kind(b) == "approval_required").await;
    let Some(Down::ApprovalRequired(a)) = msgs.last() else {
        unreachable!()
    };
    assert_eq!(a.tool, "payments.issue-refund");
    assert_eq!(json_of(&a.args)["amount"], json!(400));
    assert_eq!(a.reason, "Refund amount above delegated limit.");
    assert_eq!(a.policy_ref, "payments/refund-approval-boundary@1.0.0");
    assert_eq!(a.policy_name, "refund-approval-boundary");
    assert_eq!(a.on_reject, "return_to_agent");
    assert_eq!((a.approvals_required, a.approvals_received), (1, 0));

    // Mistakes are reported and change nothing.
    s.send(decide("not-a-uuid", true, "")).await;
    let Some(Down::Status(st)) = s.until(|b| refusal(b, "UUID")).await.pop() else {
        unreachable!()
    };
    assert_eq!(st.status, "awaiting_approval");
    assert!(st.reason.contains("must be a UUID"), "{}", st.reason);

    s.send(decide("", false, "No damage claim on file for this order."))
        .await;
    let rest = s.rest().await;
    assert_eq!(
        flow(&rest),
        ["approval_decided", "tool_result", "completed"],
        "{rest:#?}"
    );
    let Down::ApprovalDecided(d) = &rest.iter().find(|m| kind(m) == "approval_decided").unwrap()
    else {
        unreachable!()
    };
    assert_eq!(d.approval_id, a.approval_id);
    assert_eq!(d.status, "denied");
    assert_eq!(d.decided_by, "emad");
    assert_eq!(d.comment, "No damage claim on file for this order.");
    let Down::ToolResult(r) = &rest.iter().find(|m| kind(m) == "tool_result").unwrap() else {
        unreachable!()
    };
    assert_eq!(r.call_id, a.call_id);
    assert_eq!(r.error_code, "approval_denied");
    let expected = format!(
        "tool call {} was rejected by emad: No damage claim on file for this order.",
        a.call_id
    );
    assert_eq!(r.error_message, expected);
    assert_eq!(text(&rest), format!("Not refunded: {expected}"));
    let to_model = tool_results(server.script.requests().last().unwrap());
    assert_eq!(to_model, [(expected, true)]);

    // Attaching to the ended session: its start, then its end.
    let mut late = open(&server, None, attach_msg(&session_id)).await.unwrap();
    let started = late.started().await;
    assert!(started.session_ended_at_unix_ms > 0);
    assert_eq!(
        started
            .history
            .iter()
            .map(|h| h.role.as_str())
            .collect::<Vec<_>>(),
        ["user", "assistant"]
    );
    assert_eq!(flow(&late.rest().await), ["completed"]);
    server.stop().await;
}

#[tokio::test]
async fn attaching_mid_session_catches_up_in_order_then_follows_live() {
    let server = Server::start(
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::call(
                "issue_refund",
                json!({"order_id": "ORD-1", "amount": 400, "currency": "EUR"}),
            ),
            Step::say_in_chunks(&["Refund ", "issued."]),
        ],
        2,
    )
    .await;
    let mut a = open(
        &server,
        Some("emad"),
        start_msg("Refund 400 for ORD-1.", pb::SessionMode::Unspecified),
    )
    .await
    .unwrap();
    let session_id = a.started().await.session_id;
    let required = a.until(|b| kind(b) == "approval_required").await;
    let Some(Down::ApprovalRequired(approval)) = required.last().cloned() else {
        unreachable!()
    };
    // The first of two votes, on the first stream.
    a.send(decide(&approval.approval_id, true, "amount checked"))
        .await;
    let voted = a.until(|b| kind(b) == "approval_decided").await;
    let Some(Down::ApprovalDecided(d)) = voted.last() else {
        unreachable!()
    };
    assert_eq!(
        (
            d.status.as_str(),
            d.decided_by.as_str(),
            d.approvals_received
        ),
        ("pending", "emad", 1)
    );
    // The same actor cannot vote twice: reported, the stream stays open.
    a.send(decide("", true, "")).await;
    let Some(Down::Status(st)) = a.until(|b| refusal(b, "already")).await.pop() else {
        unreachable!()
    };
    assert!(st.reason.contains("already decided"), "{}", st.reason);

    let mut b = open(&server, Some("sara"), attach_msg(&session_id))
        .await
        .unwrap();
    let started = b.started().await;
    assert_eq!(started.session_id, session_id);
    assert_eq!(started.history.len(), 1);
    assert_eq!(started.history[0].role, "user");
    assert_eq!(started.history[0].content, "Refund 400 for ORD-1.");
    assert_eq!(started.session_ended_at_unix_ms, 0);
    let catch_up = b.until(|b| kind(b) == "awaiting_input").await;
    assert_eq!(
        catch_up.iter().map(kind).collect::<Vec<_>>(),
        [
            "tool_call",
            "tool_result",
            "tool_call",
            "status",
            "approval_required",
            "awaiting_input"
        ],
        "{catch_up:#?}"
    );
    let Down::ApprovalRequired(again) = &catch_up[4] else {
        unreachable!()
    };
    assert_eq!(again.approval_id, approval.approval_id);
    assert_eq!(again.approvals_received, 1);
    let Down::AwaitingInput(w) = &catch_up[5] else {
        unreachable!()
    };
    assert_eq!(w.input_blocked_reason, "awaiting_approval");

    // The deciding vote, on the second stream; both streams follow.
    b.send(decide("", true, "")).await;
    let live_b = b.rest().await;
    let live_a = a.rest().await;
    for live in [&live_a, &live_b] {
        assert_eq!(
            flow(live),
            ["approval_decided", "tool_result", "completed"],
            "{live:#?}"
        );
        assert_eq!(text(live), "Refund issued.");
        let Down::ApprovalDecided(d) =
            &live.iter().find(|m| kind(m) == "approval_decided").unwrap()
        else {
            unreachable!()
        };
        assert_eq!(
            (
                d.status.as_str(),
                d.decided_by.as_str(),
                d.approvals_received
            ),
            ("approved", "sara", 2)
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn dropping_the_stream_detaches_and_the_session_carries_on() {
    let gate = Arc::new(Notify::new());
    let server = Server::start(
        vec![Step::say_in_chunks(&["Hello ", "there."]).gated(Arc::clone(&gate))],
        1,
    )
    .await;
    let mut s = open(
        &server,
        None,
        start_msg("Hi", pb::SessionMode::Conversation),
    )
    .await
    .unwrap();
    let session_id = s.started().await.session_id;
    drop(s);
    gate.notify_one();

    let mut again = open(&server, None, attach_msg(&session_id)).await.unwrap();
    let started = again.started().await;
    assert_eq!(started.session_ended_at_unix_ms, 0);
    let msgs = again.until(|b| kind(b) == "awaiting_input").await;
    // The turn finished while no one was attached, or finishes now: the text is either in the
    // history or streamed, once.
    let history: String = started
        .history
        .iter()
        .filter(|h| h.role == "assistant")
        .map(|h| h.content.as_str())
        .collect();
    assert_eq!(format!("{history}{}", text(&msgs)), "Hello there.");
    server.stop().await;
}

#[tokio::test]
async fn messages_sent_during_a_turn_are_all_run_in_order() {
    let gate = Arc::new(Notify::new());
    let server = Server::start(
        vec![
            Step::say_in_chunks(&["first answer"]).gated(Arc::clone(&gate)),
            echo(),
            echo(),
        ],
        1,
    )
    .await;
    let mut s = open(
        &server,
        Some("emad"),
        start_msg("one", pb::SessionMode::Conversation),
    )
    .await
    .unwrap();
    let session_id = s.started().await.session_id;
    s.send(user("two")).await;
    s.send(user("three")).await;
    // Both are recorded while the first turn is still held by the model.
    tokio::time::timeout(PATIENCE, async {
        loop {
            let mut probe = open(&server, None, attach_msg(&session_id)).await.unwrap();
            let users: Vec<String> = probe
                .started()
                .await
                .history
                .into_iter()
                .filter(|h| h.role == "user")
                .map(|h| h.content)
                .collect();
            if users == ["one", "two", "three"] {
                return;
            }
            assert!(users.len() < 3, "{users:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the queued messages were not recorded");
    gate.notify_one();
    let msgs = s
        .until(|b| matches!(b, Down::AwaitingInput(w) if w.stats.unwrap().turn == 3))
        .await;
    assert_eq!(text(&msgs), "first answerecho: twoecho: three");
    let last_users: Vec<String> = server
        .script
        .requests()
        .iter()
        .map(|r| user_texts(r).pop().unwrap())
        .collect();
    assert_eq!(last_users, ["one", "two", "three"]);
    server.stop().await;
}

#[tokio::test]
async fn a_slow_reader_gets_every_event() {
    // Enough text to fill the transport's windows and the engine's delta buffer many times.
    let chunks: Vec<String> = (0..3000)
        .map(|i| format!("[chunk {i:04} {}]", "x".repeat(60)))
        .collect();
    let full: String = chunks.concat();
    let mut steps: Vec<Step> = (0..10)
        .map(|i| Step::call("lookup_order", json!({"order_id": format!("ORD-{i}")})))
        .collect();
    let owned = chunks.clone();
    steps.push(Step::from_fn(move |_| {
        let mut events: Vec<ModelEvent> = owned.into_iter().map(ModelEvent::TextDelta).collect();
        events.push(completed(StopReason::EndTurn, 10));
        events
    }));
    let server = Server::start(steps, 1).await;
    let mut slow = open(
        &server,
        None,
        start_msg("Look up ten orders.", pb::SessionMode::Unspecified),
    )
    .await
    .unwrap();
    let session_id = slow.started().await.session_id;
    // Read nothing on the slow stream until another stream saw the session end.
    let mut watcher = open(&server, None, attach_msg(&session_id)).await.unwrap();
    watcher.started().await;
    let watched = watcher.rest().await;
    assert!(matches!(watched.last(), Some(Down::Completed(_))));

    let msgs = slow.rest().await;
    assert_eq!(
        flow(&msgs).iter().filter(|k| **k == "tool_call").count(),
        10
    );
    assert_eq!(
        flow(&msgs).iter().filter(|k| **k == "tool_result").count(),
        10
    );
    assert_eq!(text(&msgs), full);
    assert!(matches!(msgs.last(), Some(Down::Completed(_))));
    server.stop().await;
}

#[tokio::test]
async fn protocol_errors_are_refused_with_their_status() {
    let server = Server::start(vec![Step::say_in_chunks(&["Hi."])], 1).await;
    let err = open(&server, None, user("hello")).await.err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "first message must be start");

    let err = open(
        &server,
        None,
        Up::Start(pb::RunSessionInteractiveStart {
            bundle_ref: Some(pb::BundleRef {
                namespace: "support".into(),
                name: "desk".into(),
                version: String::new(),
            }),
            ..Default::default()
        }),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert_eq!(err.message(), "bundle support/desk not found");

    let err = open(
        &server,
        None,
        attach_msg("run_00000000-0000-0000-0000-000000000000"),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // A second start ends the stream.
    let mut s = open(
        &server,
        None,
        start_msg("Hello", pb::SessionMode::Conversation),
    )
    .await
    .unwrap();
    let session_id = s.started().await.session_id;
    s.until(|b| kind(b) == "awaiting_input").await;
    s.send(attach_msg(&session_id)).await;
    let err = loop {
        match s.next().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream ended without an error"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "unexpected start after attach");
    // The session is untouched by the stream's end.
    let mut again = open(&server, None, attach_msg(&session_id)).await.unwrap();
    again.started().await;
    assert_eq!(
        flow(&again.until(|b| kind(b) == "awaiting_input").await),
        ["awaiting_input"]
    );
    // A message without a body (another protocol version) ends the stream too.
    again
        .up
        .as_ref()
        .unwrap()
        .send(pb::RunSessionInteractiveClientMsg { body: None })
        .await
        .unwrap();
    let err = loop {
        match again.next().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream ended without an error"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("no body"), "{}", err.message());
    drop(again.up.take());
    server.stop().await;
}

#[tokio::test]
async fn shutdown_ends_open_streams_with_unavailable() {
    let server = Server::start(vec![Step::say_in_chunks(&["Hello."])], 1).await;
    let mut s = open(
        &server,
        None,
        start_msg("Hi", pb::SessionMode::Conversation),
    )
    .await
    .unwrap();
    s.started().await;
    s.until(|b| kind(b) == "awaiting_input").await;
    let reader = tokio::spawn(async move {
        loop {
            match s.next().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the stream ended with OK"),
                Err(e) => return e,
            }
        }
    });
    server.stop().await;
    let err = tokio::time::timeout(PATIENCE, reader)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("shutting down"), "{}", err.message());
}

#[tokio::test]
async fn a_user_message_while_a_limit_blocks_input_gets_the_reason_again() {
    let server = Server::start_with(
        vec![Step::say_in_chunks(&["One turn only."])],
        refund_agent(1, "    max_loop_iterations: 1\n"),
    )
    .await;
    let mut s = open(
        &server,
        None,
        start_msg("Hello", pb::SessionMode::Conversation),
    )
    .await
    .unwrap();
    let started = s.started().await;
    assert_eq!(started.max_tokens_per_run, 0);
    let msgs = s.until(|b| kind(b) == "awaiting_input").await;
    assert_eq!(text(&msgs), "One turn only.");
    let Some(Down::AwaitingInput(w)) = msgs.last() else {
        unreachable!()
    };
    let reason = "run limit max_loop_iterations exceeded (on_limit=halt)";
    assert_eq!(w.input_blocked_reason, reason);
    assert_eq!(w.stats.unwrap().turn, 1);

    s.send(user("And another thing")).await;
    let Some(Down::AwaitingInput(again)) = s.until(|b| kind(b) == "awaiting_input").await.pop()
    else {
        unreachable!()
    };
    assert_eq!(again.input_blocked_reason, reason);
    assert_eq!(again.stats.unwrap().turn, 1);
    // The message was not run.
    assert_eq!(server.script.requests().len(), 1);
    server.stop().await;
}

/// In `required` mode a runner may open the stream and start the session, but its votes on it
/// are refused naming the missing permission (the stream goes on); an approver's vote on its own
/// stream decides.
#[tokio::test]
async fn a_runner_on_the_stream_cannot_approve_but_an_approver_can() {
    let server = Server::start_in(
        vec![
            Step::call(
                "issue_refund",
                json!({"order_id": "ORD-1", "amount": 400, "currency": "EUR"}),
            ),
            Step::say("Refund handled."),
        ],
        refund_agent(1, ""),
        AuthMode::Required,
    )
    .await;
    let runner = token(&server.ledger, "support-runner", AuthRole::Runner).await;
    let runner_client = connect_with(&server.addr, Some(runner)).await;
    let mut s = open_with(
        runner_client,
        None,
        start_msg("Refund 400 for ORD-1.", pb::SessionMode::Unspecified),
    )
    .await
    .unwrap();
    let session_id = s.started().await.session_id;
    s.until(|b| kind(b) == "approval_required").await;
    s.send(decide("", true, "")).await;
    let Some(Down::Status(st)) = s.until(|b| refusal(b, "permission")).await.pop() else {
        unreachable!()
    };
    assert!(
        st.reason
            .contains("\"support-runner\" lacks the approve permission"),
        "{}",
        st.reason
    );
    assert_eq!(st.status, "awaiting_approval");

    let approver = token(&server.ledger, "finance-approver", AuthRole::Approver).await;
    let approver_client = connect_with(&server.addr, Some(approver.clone())).await;
    // Opening the stream needs `run`, which an approver lacks.
    let refused = open_with(approver_client, None, attach_msg(&session_id))
        .await
        .err()
        .unwrap();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("run permission"), "{refused:?}");
    // The approver decides through DecideApproval; the runner's stream sees it.
    let mut approver_client = connect_with(&server.addr, Some(approver)).await;
    let approvals = approver_client
        .list_approvals(pb::ListApprovalsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .approvals;
    let decided = approver_client
        .decide_approval(pb::DecideApprovalRequest {
            approval_id: approvals[0].id.clone(),
            decision: pb::ApprovalDecision::Approve.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.status, "approved");
    let rest = s.until(|b| kind(b) == "approval_decided").await;
    let Some(Down::ApprovalDecided(d)) = rest.last() else {
        unreachable!()
    };
    assert_eq!(d.decided_by, "finance-approver");
    server.stop().await;
}

#[tokio::test]
async fn a_user_message_past_the_waiting_bound_is_refused_and_the_stream_goes_on() {
    let gate = Arc::new(Notify::new());
    let server = Server::start_configured(
        vec![
            Step::say_in_chunks(&["first answer"]).gated(Arc::clone(&gate)),
            echo(),
            echo(),
        ],
        refund_agent(1, ""),
        AuthMode::Local,
        |config| config.max_queued_user_messages = 1,
    )
    .await;
    let mut s = open(
        &server,
        Some("emad"),
        start_msg("one", pb::SessionMode::Conversation),
    )
    .await
    .unwrap();
    let session_id = s.started().await.session_id;
    // Turn 1 runs (its model call is held): "one" no longer waits.
    tokio::time::timeout(PATIENCE, async {
        while server.script.requests().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("turn 1 did not start");
    s.send(user("two")).await;
    s.send(user("three")).await;
    let msgs = s
        .until(|b| refusal(b, "RUNTIME_MAX_QUEUED_USER_MESSAGES"))
        .await;
    let Some(Down::Status(refused)) = msgs.last() else {
        panic!("{msgs:#?}")
    };
    assert_eq!(
        refused.reason,
        format!(
            "session {session_id} has 1 user messages waiting for their turn; at most 1 may \
             wait (RUNTIME_MAX_QUEUED_USER_MESSAGES), so this one was not recorded: send it \
             after the session answered"
        )
    );
    // The stream goes on: turn 2 answers "two", and "three", sent again, is run as turn 3.
    gate.notify_one();
    let msgs = s
        .until(|b| matches!(b, Down::AwaitingInput(w) if w.stats.unwrap().turn == 2))
        .await;
    assert_eq!(text(&msgs), "first answerecho: two");
    s.send(user("three")).await;
    let msgs = s
        .until(|b| matches!(b, Down::AwaitingInput(w) if w.stats.unwrap().turn == 3))
        .await;
    assert_eq!(text(&msgs), "echo: three");
    let users: Vec<String> = server
        .script
        .requests()
        .iter()
        .map(|r| user_texts(r).pop().unwrap())
        .collect();
    assert_eq!(
        users,
        ["one", "two", "three"],
        "the refused copy was never recorded"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_start_past_the_live_sessions_of_the_agent_is_resource_exhausted() {
    let server = Server::start_configured(
        vec![echo(), echo()],
        refund_agent(1, ""),
        AuthMode::Local,
        |config| config.max_sessions_per_agent = Some(1),
    )
    .await;
    let mut parked = open(
        &server,
        Some("emad"),
        start_msg("one", pb::SessionMode::Conversation),
    )
    .await
    .unwrap();
    let session_id = parked.started().await.session_id;
    parked.until(|b| matches!(b, Down::AwaitingInput(_))).await;
    let expected = "agent support/refund-agent has 1 live sessions (created and not yet ended); \
                    at most 1 may be live at once, so no session was started \
                    (RUNTIME_MAX_SESSIONS_PER_AGENT); retry when some have ended";

    // RunSession and the interactive start are refused alike, before anything is created.
    let mut client = server.client().await;
    let err = client
        .run_session(pb::RunSessionRequest {
            agent_ref: Some(agent_ref()),
            input: serde_json::to_vec(&json!("two")).unwrap(),
            resolved_secrets: [("openai".to_owned(), b"sk-test".to_vec())].into(),
            bundle_ref: None,
            metadata: std::collections::HashMap::new(),
            mode: pb::SessionMode::Unspecified as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(err.message(), expected);
    let Err(err) = open(
        &server,
        Some("emad"),
        start_msg("two", pb::SessionMode::Conversation),
    )
    .await
    else {
        panic!("the interactive start was not refused")
    };
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(err.message(), expected);
    let sessions = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert_eq!(sessions.len(), 1, "nothing was created: {sessions:?}");
    assert_eq!(server.script.requests().len(), 1);

    // Once the conversation ends its slot is free.
    client
        .complete_session(pb::CompleteSessionRequest { session_id })
        .await
        .unwrap();
    let mut next = open(
        &server,
        Some("emad"),
        start_msg("two", pb::SessionMode::Unspecified),
    )
    .await
    .unwrap();
    next.started().await;
    let rest = next.rest().await;
    assert_eq!(flow(&rest), ["completed"]);
    server.stop().await;
}
