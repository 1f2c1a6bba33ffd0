//! Shared test harness: the refund tutorial's agent (written from the seed into a temporary
//! directory and compiled by `phrony-manifest`), a scripted model provider that records every
//! request, and an in-process worker on a real dispatch `Router`.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    reason = "test helpers: each test binary uses a different subset, and a panic is a failed assertion"
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use phrony_dispatch::{
    FromWorker, HandlerAd, Invocation, Router, RouterConfig, ToWorker, ToolError, WorkerHello,
};
pub use phrony_engine::VoteTarget;
use phrony_engine::{
    Clock as _, Engine, EngineConfig, EngineDeps, LedgerStore, ManualClock, PlainSecret,
    ProviderFactory, RouterHooks, SessionHandle, SessionMode, StartSession,
};
use phrony_ledger::{
    Event, Ledger, LedgerClock, LedgerOptions, NewAgentVersion, SecretCipher, SessionStatus,
};
use phrony_manifest::CompiledAgent;
use phrony_providers::{
    ApiKey, CompletionRequest, ContentBlock, ModelProvider, ProviderError, Role,
};
use serde_json::{Value, json};
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// The refund tutorial agent.

/// Options that vary the tutorial's manifest.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Extra lines under the approval boundary's `decision:` (indented by 4 spaces).
    pub approval_decision: String,
    /// `spec.limits` lines (indented by 4 spaces), if any.
    pub limits: Option<String>,
    /// Extra policy documents `(file name, YAML)` attached to `issue_refund`.
    pub extra_policies: Vec<(String, String)>,
    /// Run on the dev `stub` provider with this `stub-script.json` (no secrets).
    pub stub_script: Option<String>,
    /// The top-level `output` section's lines (indented by 2 spaces); `format: text` when unset.
    pub output: Option<String>,
    /// `timeout` of the `lookup_order` binding, if any.
    pub lookup_timeout: Option<String>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            approval_decision: "    approvals_required: 1\n    reason: Refund amount above delegated limit.\n    on_reject: return_to_agent\n".into(),
            limits: None,
            extra_policies: Vec::new(),
            stub_script: None,
            output: None,
            lookup_timeout: None,
        }
    }
}

impl AgentOptions {
    pub fn with_decision(extra: &str) -> Self {
        Self {
            approval_decision: format!("    reason: Refund amount above delegated limit.\n{extra}"),
            ..Self::default()
        }
    }

    pub fn with_limits(limits: &str) -> Self {
        Self {
            limits: Some(limits.to_owned()),
            ..Self::default()
        }
    }
}

/// The tutorial's `agent.yaml` with `opts` applied (writes the stub script beside it).
fn agent_yaml(opts: &AgentOptions, root: &std::path::Path, attachments: &str) -> String {
    let limits = opts
        .limits
        .as_ref()
        .map(|l| format!("  limits:\n{l}"))
        .unwrap_or_default();
    let (secrets, model) = match &opts.stub_script {
        Some(script) => {
            std::fs::write(root.join("stub-script.json"), script).unwrap();
            (String::new(), "    provider: stub\n    name: scripted\n")
        }
        None => (
            "secrets:\n  openai:\n    fromEnv: OPENAI_API_KEY\n\n".to_owned(),
            "    provider: openai\n    name: gpt-4o\n",
        ),
    };
    let output = opts
        .output
        .clone()
        .unwrap_or_else(|| "  format: text\n".to_owned());
    let lookup_timeout = opts
        .lookup_timeout
        .as_ref()
        .map(|t| format!("      timeout: {t}\n"))
        .unwrap_or_default();
    format!(
        r"apiVersion: phrony.com/v1
kind: Agent

metadata:
  name: refund-agent
  namespace: support
  version: 0.1.0

{secrets}spec:
  purpose: Handle customer refund requests within policy limits.
  instructions:
    text: |
      You are a customer support agent handling refund requests.
      Always look up the order before issuing a refund.
      Refunds may require human approval or be denied by policy.
      Never claim a refund was issued until the tool result confirms it.
  model:
{model}  tools:
    - ref: orders.lookup-order
      as: lookup_order
{lookup_timeout}    - ref: payments.issue-refund
      as: issue_refund
      policies:
{attachments}{limits}
output:
{output}"
    )
}

/// The tutorial's `agent.yaml`, `tools/` and `policies/` (from the seed document), compiled.
pub fn refund_agent(opts: &AgentOptions) -> CompiledAgent {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("tools")).unwrap();
    std::fs::create_dir_all(root.join("policies")).unwrap();
    let mut attachments = String::from(
        "        - ref: policies/refund-approval-boundary.yaml\n        - ref: policies/refund-hard-limit.yaml\n",
    );
    for (name, _) in &opts.extra_policies {
        attachments.push_str(&format!("        - ref: policies/{name}\n"));
    }
    let agent = agent_yaml(opts, root, &attachments);
    std::fs::write(root.join("agent.yaml"), agent).unwrap();
    std::fs::write(
        root.join("tools/orders.lookup-order.yaml"),
        r"apiVersion: phrony.com/v1
kind: Tool

metadata:
  name: lookup-order
  namespace: orders
  version: 1.0.0

spec:
  description: Look up an order by id — items, total, and refund eligibility.
  side_effect_class: read_only
  input_schema:
    inline:
      type: object
      properties:
        order_id:
          type: string
      required: [order_id]
",
    )
    .unwrap();
    std::fs::write(
        root.join("tools/payments.issue-refund.yaml"),
        r"apiVersion: phrony.com/v1
kind: Tool

metadata:
  name: issue-refund
  namespace: payments
  version: 1.0.0

spec:
  description: Issue a refund to the customer's original payment method.
  side_effect_class: irreversible_action
  input_schema:
    inline:
      type: object
      properties:
        order_id:
          type: string
        amount:
          type: number
        currency:
          type: string
        reason:
          type: string
      required: [order_id, amount, currency]
",
    )
    .unwrap();
    std::fs::write(
        root.join("policies/refund-approval-boundary.yaml"),
        format!(
            r"apiVersion: phrony.com/v1
kind: Policy

metadata:
  name: refund-approval-boundary
  namespace: payments
  version: 1.0.0

spec:
  description: Refunds above the delegated limit need a human before dispatch.
  conditions:
    field: amount
    op: gt
    value: 250
  decision:
    type: require_approval
{}",
            opts.approval_decision
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("policies/refund-hard-limit.yaml"),
        r"apiVersion: phrony.com/v1
kind: Policy

metadata:
  name: refund-hard-limit
  namespace: payments
  version: 1.0.0

spec:
  description: Refunds above the absolute ceiling are denied outright.
  conditions:
    field: amount
    op: gt
    value: 5000
  decision:
    type: deny
    reason: Refund amount exceeds the absolute ceiling for agent-initiated refunds.
",
    )
    .unwrap();
    for (name, yaml) in &opts.extra_policies {
        std::fs::write(root.join("policies").join(name), yaml).unwrap();
    }
    match phrony_manifest::load_agent(root.join("agent.yaml")) {
        Ok(c) => c.agent,
        Err(d) => panic!("the tutorial agent does not compile:\n{d}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The scripted model.

#[allow(
    unused_imports,
    reason = "the test binary uses `completed`; the bench, which shares this file, does not"
)]
pub use phrony_test_support::fake_model::{Script, Step, completed};

/// A [`ProviderFactory`] handing out providers that play one shared script.
#[derive(Debug, Clone)]
pub struct ScriptedFactory(pub Arc<Script>);

impl ProviderFactory for ScriptedFactory {
    fn build(
        &self,
        _agent: &CompiledAgent,
        api_key: Option<ApiKey>,
        _completions_done: usize,
    ) -> Result<Box<dyn ModelProvider>, ProviderError> {
        self.0
            .record_api_key(api_key.map(|k| k.expose().to_owned()));
        Ok(self.0.provider())
    }
}

/// The tool results (content, is_error) the model received in a request, in order.
pub fn tool_results(request: &CompletionRequest) -> Vec<(String, bool)> {
    request
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            ContentBlock::ToolResult {
                content, is_error, ..
            } => Some((content.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

/// The last tool result the model received.
pub fn last_tool_result(request: &CompletionRequest) -> (String, bool) {
    tool_results(request)
        .pop()
        .unwrap_or_else(|| panic!("no tool result in {request:#?}"))
}

/// The user texts of a request, in order.
pub fn user_texts(request: &CompletionRequest) -> Vec<String> {
    request
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The worker.

/// How the fake worker answers a tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Like the tutorial's `worker.py`.
    Answer,
    /// Never answers (the call stays in flight).
    Hold,
}

/// An in-process worker registered on a real router, answering like the tutorial's
/// `worker.py`.
pub struct FakeWorker {
    pub invocations: Arc<Mutex<Vec<Invocation>>>,
    pub acks: Arc<Mutex<Vec<String>>>,
    pub cancels: Arc<Mutex<Vec<String>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    /// Held invocations to answer now (see [`FakeWorker::release`]).
    release: tokio::sync::mpsc::UnboundedSender<Invocation>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn handler(tool: &str, max_concurrency: u32) -> HandlerAd {
    HandlerAd {
        tool: tool.into(),
        version: "1.0.0".into(),
        contract_version: String::new(),
        max_concurrency,
        descriptor_hash: String::new(),
    }
}

fn answer(inv: &Invocation) -> Result<Value, ToolError> {
    match inv.tool.as_str() {
        "orders.lookup-order" => {
            let id = inv.args["order_id"].as_str().unwrap_or_default();
            Ok(match id {
                "ORD-1" => {
                    json!({"order_id": id, "found": true, "total": 400.0, "currency": "EUR", "status": "delivered", "refund_eligible": true})
                }
                "ORD-2" => {
                    json!({"order_id": id, "found": true, "total": 14000.0, "currency": "EUR", "status": "delivered", "refund_eligible": true})
                }
                _ => json!({"order_id": id, "found": false}),
            })
        }
        "payments.issue-refund" => Ok(json!({
            "refund_id": "rf_2891",
            "order_id": inv.args["order_id"],
            "amount": inv.args["amount"],
            "currency": inv.args["currency"],
            "status": "issued",
        })),
        other => Err(ToolError::new(
            "unknown_handler",
            format!("no handler for {other}"),
        )),
    }
}

impl FakeWorker {
    pub async fn connect(router: &Router) -> Self {
        let hello = WorkerHello {
            worker_id: "refund-worker-1".into(),
            workload_identity: "tests/local".into(),
            image_digest: String::new(),
            handlers: vec![
                handler("orders.lookup-order", 8),
                handler("payments.issue-refund", 2),
            ],
            in_flight: Vec::new(),
        };
        let (conn, mut outbox) = router.connect(hello).await.unwrap();
        let invocations = Arc::new(Mutex::new(Vec::new()));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let cancels = Arc::new(Mutex::new(Vec::new()));
        let behaviour = Arc::new(Mutex::new(Behaviour::Answer));
        let (inv2, acks2, cancels2, behaviour2) = (
            Arc::clone(&invocations),
            Arc::clone(&acks),
            Arc::clone(&cancels),
            Arc::clone(&behaviour),
        );
        let (release, mut released) = tokio::sync::mpsc::unbounded_channel::<Invocation>();
        let task = tokio::spawn(async move {
            // Heartbeat well within the lease, like the SDK's worker (ttl / 2).
            let mut heartbeat = tokio::time::interval(Duration::from_secs(5));
            loop {
                let msg = tokio::select! {
                    msg = outbox.recv() => msg,
                    _ = heartbeat.tick() => {
                        let _ = conn.handle(FromWorker::Heartbeat);
                        continue;
                    }
                    Some(inv) = released.recv() => {
                        let payload = serde_json::to_vec(&answer(&inv).unwrap()).unwrap();
                        let _ = conn.handle(FromWorker::Result {
                            call_id: inv.call_id.clone(),
                            payload,
                            error: None,
                        });
                        continue;
                    }
                };
                let Some(msg) = msg else { break };
                match msg {
                    Ok(ToWorker::Invoke(inv)) => {
                        inv2.lock().unwrap().push((*inv).clone());
                        if *behaviour2.lock().unwrap() == Behaviour::Hold {
                            continue;
                        }
                        let (payload, error) = match answer(&inv) {
                            Ok(v) => (serde_json::to_vec(&v).unwrap(), None),
                            Err(e) => (Vec::new(), Some(e)),
                        };
                        let _ = conn.handle(FromWorker::Result {
                            call_id: inv.call_id.clone(),
                            payload,
                            error,
                        });
                    }
                    Ok(ToWorker::ResultAck { call_id }) => acks2.lock().unwrap().push(call_id),
                    Ok(ToWorker::Cancel { call_id }) => cancels2.lock().unwrap().push(call_id),
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("fake worker dropped by the router: {e}");
                        break;
                    }
                }
            }
        });
        Self {
            invocations,
            acks,
            cancels,
            behaviour,
            release,
            task,
        }
    }

    /// Answers a held invocation now (the worker finished it late).
    pub fn release(&self, inv: Invocation) {
        self.release.send(inv).unwrap();
    }

    /// The acknowledged call ids once there are `n` of them (the worker reads its stream
    /// asynchronously).
    pub async fn wait_acks(&self, n: usize) -> Vec<String> {
        for _ in 0..200 {
            let acks = self.acks.lock().unwrap().clone();
            if acks.len() >= n {
                return acks;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.acks.lock().unwrap().clone()
    }

    /// The cancelled call ids once there are `n` of them.
    pub async fn wait_cancels(&self, n: usize) -> Vec<String> {
        for _ in 0..200 {
            let cancels = self.cancels.lock().unwrap().clone();
            if cancels.len() >= n {
                return cancels;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.cancels.lock().unwrap().clone()
    }

    /// Ends the worker's stream (the router drops it).
    pub async fn disconnect(&self) {
        self.task.abort();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    pub fn set_behaviour(&self, b: Behaviour) {
        *self.behaviour.lock().unwrap() = b;
    }

    /// The tools invoked, in order.
    pub fn tools(&self) -> Vec<String> {
        self.invocations
            .lock()
            .unwrap()
            .iter()
            .map(|i| i.tool.clone())
            .collect()
    }

    pub fn invoked(&self, tool: &str) -> Vec<Invocation> {
        self.invocations
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.tool == tool)
            .cloned()
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The engine under test.

pub fn test_config() -> EngineConfig {
    EngineConfig {
        queue_wait: Duration::from_millis(500),
        exec_timeout: Duration::from_secs(10),
        subscription_buffer: 64,
        poll_interval: Duration::from_millis(50),
        recovery_grace: Duration::from_millis(300),
        ..EngineConfig::default()
    }
}

/// An engine on a store, a router with the store's hooks, a worker, a scripted model and a
/// manual clock.
pub struct Harness {
    pub engine: Engine,
    pub store: Arc<LedgerStore>,
    pub router: Router,
    pub worker: FakeWorker,
    pub script: Arc<Script>,
    pub clock: Arc<ManualClock>,
    pub agent: CompiledAgent,
    pub version_id: Uuid,
}

pub fn router_for(store: &Arc<LedgerStore>) -> Router {
    let hooks = Arc::new(RouterHooks::new(Arc::clone(store)));
    Router::builder(RouterConfig::default())
        .observer(hooks.clone())
        .completed_calls(hooks)
        .build()
        .unwrap()
}

/// The key the test stores seal secrets with.
pub fn cipher() -> SecretCipher {
    SecretCipher::new(&[7u8; 32])
}

/// Ledger options whose clock is `clock` (stored times follow the test's manual clock), with a
/// generous pool timeout: the shared test machine is often saturated.
pub fn ledger_options(clock: &Arc<ManualClock>) -> LedgerOptions {
    let clock = Arc::clone(clock);
    LedgerOptions {
        acquire_timeout: Duration::from_secs(60),
        clock: LedgerClock::new(move || clock.now()),
        ..LedgerOptions::default()
    }
}

/// The ledger in memory (SQLite `:memory:`), migrated, its times following `clock`.
pub async fn memory_ledger(clock: &Arc<ManualClock>) -> Ledger {
    let ledger = Ledger::connect_with("sqlite::memory:", ledger_options(clock))
        .await
        .unwrap();
    ledger.migrate().await.unwrap();
    ledger
}

/// Publishes `snapshot_json` as version 0.1.0 of support/refund-agent; its version id.
pub async fn publish(ledger: &Ledger, snapshot_json: String, content_hash: String) -> Uuid {
    ledger
        .publish_agent_version(NewAgentVersion {
            namespace: "support".into(),
            name: "refund-agent".into(),
            version: "0.1.0".into(),
            owner: String::new(),
            labels: Default::default(),
            snapshot_json,
            content_hash,
            actor: "emad".into(),
        })
        .await
        .unwrap()
        .version_id
}

/// A store on the ledger in memory with `agent` published: the store and the version id.
pub async fn memory_store(
    clock: &Arc<ManualClock>,
    agent: &CompiledAgent,
) -> (Arc<LedgerStore>, Uuid) {
    let ledger = memory_ledger(clock).await;
    let version_id = publish(
        &ledger,
        String::from_utf8(agent.snapshot_json()).unwrap(),
        agent.content_hash(),
    )
    .await;
    (
        Arc::new(LedgerStore::new(ledger, Some(cipher()))),
        version_id,
    )
}

impl Harness {
    /// On the ledger in memory.
    pub async fn memory(opts: &AgentOptions, steps: Vec<Step>) -> Self {
        Self::memory_with(opts, steps, test_config()).await
    }

    /// On the ledger in memory, with `config`.
    pub async fn memory_with(opts: &AgentOptions, steps: Vec<Step>, config: EngineConfig) -> Self {
        let clock = Arc::new(ManualClock::starting_now());
        let agent = refund_agent(opts);
        let (store, version_id) = memory_store(&clock, &agent).await;
        Self::on_with(store, clock, agent, version_id, Script::new(steps), config).await
    }

    /// On any store, for an agent version it already knows.
    pub async fn on(
        store: Arc<LedgerStore>,
        clock: Arc<ManualClock>,
        agent: CompiledAgent,
        version_id: Uuid,
        script: Arc<Script>,
    ) -> Self {
        Self::on_with(store, clock, agent, version_id, script, test_config()).await
    }

    /// On any store, with `config`.
    pub async fn on_with(
        store: Arc<LedgerStore>,
        clock: Arc<ManualClock>,
        agent: CompiledAgent,
        version_id: Uuid,
        script: Arc<Script>,
        config: EngineConfig,
    ) -> Self {
        let providers = Arc::new(ScriptedFactory(Arc::clone(&script)));
        Self::on_factory(store, clock, agent, version_id, script, providers, config).await
    }

    /// On any store, with the model providers built by `providers` (e.g. the production
    /// factory pointed at a fake vendor API); `script` is then only what `Harness::script` reads.
    pub async fn on_factory(
        store: Arc<LedgerStore>,
        clock: Arc<ManualClock>,
        agent: CompiledAgent,
        version_id: Uuid,
        script: Arc<Script>,
        providers: Arc<dyn ProviderFactory>,
        config: EngineConfig,
    ) -> Self {
        let router = router_for(&store);
        let worker = FakeWorker::connect(&router).await;
        let engine = Engine::new(EngineDeps {
            store: Arc::clone(&store),
            router: Some(router.clone()),
            providers,
            clock: clock.clone(),
            config,
        });
        Self {
            engine,
            store,
            router,
            worker,
            script,
            clock,
            agent,
            version_id,
        }
    }

    pub fn start_request(&self, input: Value, mode: SessionMode) -> StartSession {
        StartSession {
            session_id: None,
            agent_version_id: self.version_id,
            // As the service does: prepared by the engine, once per version.
            agent: self
                .engine
                .prepare_version(
                    self.version_id,
                    &self.agent.content_hash(),
                    &String::from_utf8(self.agent.snapshot_json()).expect("UTF-8 JSON"),
                )
                .expect("the agent compiles"),
            input,
            metadata: [("ticket_id".to_owned(), "T-1001".to_owned())].into(),
            mode,
            principal: None,
            secrets: vec![PlainSecret::new("openai", "sk-test-123")],
            actor: phrony_ledger::Attribution::unverified("emad".to_owned()),
            bundle: None,
        }
    }

    pub async fn start(&self, input: &str) -> SessionHandle {
        self.engine
            .start_session(self.start_request(json!(input), SessionMode::Task))
            .await
            .unwrap()
    }

    pub async fn start_conversation(&self, input: &str) -> SessionHandle {
        self.engine
            .start_session(self.start_request(json!(input), SessionMode::Conversation))
            .await
            .unwrap()
    }

    /// Waits (at most 10 s) for one of `statuses` or the end.
    pub async fn wait(&self, id: &str, statuses: &[SessionStatus]) -> phrony_ledger::Session {
        match tokio::time::timeout(Duration::from_secs(30), self.engine.wait_for(id, statuses))
            .await
        {
            Ok(session) => session.unwrap(),
            Err(_) => {
                let session = self.store.get_session(id).await.unwrap();
                let events: Vec<String> = self
                    .events(id)
                    .await
                    .into_iter()
                    .map(|e| format!("{} {} {}", e.seq, e.event_type, e.payload))
                    .collect();
                panic!(
                    "session {id} did not reach {statuses:?}: it is {:?}; events:\n{}",
                    session.status,
                    events.join("\n")
                )
            }
        }
    }

    pub async fn wait_end(&self, id: &str) -> phrony_ledger::Session {
        self.wait(id, &[]).await
    }

    /// The session's events.
    pub async fn events(&self, id: &str) -> Vec<Event> {
        let mut all = Vec::new();
        loop {
            let after = all.last().map_or(0, |e: &Event| e.seq);
            let page = self.store.events_after(id, after, 1000).await.unwrap();
            if page.is_empty() {
                return all;
            }
            all.extend(page);
        }
    }

    pub async fn event_types(&self, id: &str) -> Vec<String> {
        self.events(id)
            .await
            .into_iter()
            .map(|e| e.event_type)
            .collect()
    }

    /// The session's only pending approval.
    pub async fn pending_approval(&self, id: &str) -> phrony_ledger::Approval {
        let pending: Vec<_> = self
            .store
            .session_approvals(id)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.status == phrony_ledger::ApprovalStatus::Pending)
            .collect();
        assert_eq!(pending.len(), 1, "pending approvals: {pending:#?}");
        pending.into_iter().next().unwrap()
    }
}

pub fn approve(actor: &str, comment: &str) -> phrony_ledger::Vote {
    phrony_ledger::Vote {
        routes: Vec::new(),
        actor: actor.into(),
        decision: phrony_ledger::VoteDecision::Approve,
        comment: comment.into(),
        comprehension_acknowledged: false,
        edited_args: None,
        resolution: None,
        result: None,
    }
}

pub fn reject(actor: &str, comment: &str) -> phrony_ledger::Vote {
    phrony_ledger::Vote {
        decision: phrony_ledger::VoteDecision::Reject,
        ..approve(actor, comment)
    }
}

/// The vote resolving an outcome review with `resolution` (every test vote is built from
/// [`approve`], the one place that lists the vote's fields).
pub fn resolve(
    actor: &str,
    resolution: phrony_ledger::ReviewResolution,
    comment: &str,
) -> phrony_ledger::Vote {
    phrony_ledger::Vote {
        decision: resolution.decision(),
        resolution: Some(resolution),
        ..approve(actor, comment)
    }
}

pub fn refund(order: &str, amount: f64) -> Value {
    json!({"order_id": order, "amount": amount, "currency": "EUR", "reason": "item arrived damaged"})
}
