//! MCP-backed tools (§4.10) against the fake Streamable-HTTP server on 127.0.0.1, with the
//! scripted model and the real ledger in memory: the same governance as worker tools
//! (arguments, policy, approvals, ledger rows and events), the result mapping, transport
//! failures routed by side-effect class, the auth header, and recovery after a restart.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{Engine, EngineConfig, EngineDeps, PlainSecret, SessionHandle, SessionMode};
use phrony_ledger::{ApprovalKind, CallStatus, ReviewResolution, SessionStatus};
use phrony_manifest::CompiledAgent;
use phrony_test_support::fake_mcp::{Answer, FakeMcp, FakeTool, Fault};
use serde_json::{Value, json};

const TOKEN: &str = "tok-s3cret-9f2c";
const BEARER: &str = "{scheme: bearer, secret: search_token}";

/// An agent with two tools on the MCP server at `url`: `web_search` (read_only, remote name =
/// wire name) and `create_ticket` (non_idempotent_write, remote `tickets_create`; denied above
/// priority 5, held for approval above 2). `ticket_tool` overrides the remote name; `auth` is
/// the server's `auth` mapping.
fn mcp_agent(url: &str, ticket_tool: &str, auth: &str) -> CompiledAgent {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("policies")).unwrap();
    std::fs::write(
        root.join("agent.yaml"),
        format!(
            r"apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: refund-agent
  namespace: support
  version: 0.1.0
secrets:
  openai: {{fromEnv: OPENAI_API_KEY}}
  search_token: {{fromEnv: SEARCH_TOKEN}}
spec:
  purpose: Research and open tickets through MCP tools.
  instructions: {{text: Use the tools.}}
  model: {{provider: openai, name: gpt-4o}}
  mcp_servers:
    - name: search
      url: {url}
      auth: {auth}
  tools:
    - ref: search.web
      as: web_search
      side_effect_class: read_only
      input_schema:
        inline: {{type: object, properties: {{q: {{type: string}}}}, required: [q]}}
      mcp: {{server: search}}
    - ref: crm.create-ticket
      as: create_ticket
      side_effect_class: non_idempotent_write
      input_schema:
        inline: {{type: object, properties: {{title: {{type: string}}, priority: {{type: integer}}}}, required: [title, priority]}}
      mcp: {{server: search, tool: {ticket_tool}}}
      policies:
        - ref: policies/ticket-deny.yaml
        - ref: policies/ticket-approval.yaml
"
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("policies/ticket-deny.yaml"),
        r"apiVersion: phrony.com/v1
kind: Policy
metadata: {name: ticket-deny, namespace: crm, version: 1.0.0}
spec:
  scope: tool:crm.create-ticket
  conditions: {field: priority, op: gt, value: 5}
  decision: {type: deny, reason: Priorities above 5 are set by people.}
",
    )
    .unwrap();
    std::fs::write(
        root.join("policies/ticket-approval.yaml"),
        r"apiVersion: phrony.com/v1
kind: Policy
metadata: {name: ticket-approval, namespace: crm, version: 1.0.0}
spec:
  scope: tool:crm.create-ticket
  conditions: {field: priority, op: gt, value: 2}
  decision: {type: require_approval, reason: Urgent tickets need a lead., approvals_required: 1}
",
    )
    .unwrap();
    match phrony_manifest::load_agent(root.join("agent.yaml")) {
        Ok(c) => c.agent,
        Err(d) => panic!("the MCP agent does not compile:\n{d}"),
    }
}

fn tools() -> Vec<FakeTool> {
    vec![
        FakeTool::echo("web_search"),
        FakeTool::echo("tickets_create").answering(Answer::Structured(json!({"ticket": "T-77"}))),
    ]
}

struct McpHarness {
    h: Harness,
    server: FakeMcp,
}

impl McpHarness {
    async fn new(steps: Vec<Step>) -> Self {
        Self::with(steps, test_config(), "tickets_create").await
    }

    async fn with(steps: Vec<Step>, config: EngineConfig, ticket_tool: &str) -> Self {
        let server = FakeMcp::start(tools()).await;
        server.require_header("authorization", &format!("Bearer {TOKEN}"));
        Self::on(server, steps, config, ticket_tool, BEARER).await
    }

    async fn on(
        server: FakeMcp,
        steps: Vec<Step>,
        config: EngineConfig,
        ticket_tool: &str,
        auth: &str,
    ) -> Self {
        let clock = Arc::new(phrony_engine::ManualClock::starting_now());
        let agent = mcp_agent(&server.url(), ticket_tool, auth);
        let (store, version_id) = memory_store(&clock, &agent).await;
        let h = Harness::on_with(store, clock, agent, version_id, Script::new(steps), config).await;
        Self { h, server }
    }

    async fn start(&self, input: &str) -> SessionHandle {
        let mut req = self.h.start_request(json!(input), SessionMode::Task);
        req.secrets
            .push(PlainSecret::new("search_token", TOKEN.as_bytes().to_vec()));
        self.h.engine.start_session(req).await.unwrap()
    }

    fn calls(&self) -> Vec<Value> {
        self.server
            .requests_of("tools/call")
            .into_iter()
            .map(|r| r.params)
            .collect()
    }

    async fn wait_for_calls(&self, n: usize) {
        for _ in 0..500 {
            if self.calls().len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the server got {} tools/call, not {n}", self.calls().len());
    }

    /// Nothing the session recorded carries the secret.
    async fn assert_secret_not_recorded(&self, id: &str) {
        for e in self.h.events(id).await {
            assert!(
                !e.payload.to_string().contains(TOKEN),
                "{} carries the secret: {}",
                e.event_type,
                e.payload
            );
        }
        for a in self.h.store.session_approvals(id).await.unwrap() {
            assert!(!format!("{a:?}").contains(TOKEN), "{a:?}");
        }
    }
}

#[tokio::test]
async fn an_mcp_tool_round_trip_reaches_the_model_and_is_recorded_like_a_worker_call() {
    let m = McpHarness::new(vec![
        Step::call("web_search", json!({"q": "rust mcp"})),
        Step::say("Found it."),
    ])
    .await;
    let s = m.start("Search for rust mcp.").await;
    let done = m.h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    // The result (structuredContent) reached the model.
    let (text, is_error) = last_tool_result(&m.h.script.requests()[1]);
    assert!(!is_error, "{text}");
    let result: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        result,
        json!({"tool": "web_search", "arguments": {"q": "rust mcp"}})
    );
    // Sent once, under the remote name, with the session's bearer token.
    let calls = m.server.requests_of("tools/call");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].params["name"], "web_search");
    assert_eq!(
        calls[0].header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(
        m.server.requests_of("initialize")[0].params["clientInfo"]["name"],
        "phrony-runtime"
    );
    // The same ledger row and events as a worker call, with the server as provenance.
    let call_id = phrony_ledger::tool_call_id(&s.id, m.h.version_id, 1, 0, 0);
    let call = m.h.store.get_tool_call(&call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!(call.worker_id.as_deref(), Some("mcp:search"));
    assert_eq!(call.attempt, 1);
    let types = m.h.event_types(&s.id).await;
    let tool_events: Vec<_> = types.iter().filter(|t| t.starts_with("tool.")).collect();
    assert_eq!(
        tool_events,
        [
            "tool.requested",
            "tool.queued",
            "tool.dispatched",
            "tool.completed"
        ],
        "{types:?}"
    );
    m.assert_secret_not_recorded(&s.id).await;
}

#[tokio::test]
async fn a_call_a_policy_denies_never_reaches_the_mcp_server() {
    let m = McpHarness::new(vec![
        Step::call("create_ticket", json!({"title": "Outage", "priority": 9})),
        Step::say("I cannot set that priority."),
    ])
    .await;
    let s = m.start("Open a P9 ticket.").await;
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let (text, is_error) = last_tool_result(&m.h.script.requests()[1]);
    assert!(is_error);
    assert!(
        text.contains("Priorities above 5 are set by people."),
        "{text}"
    );
    assert!(
        m.server.requests().is_empty(),
        "not even connected: {:?}",
        m.server.requests()
    );
}

#[tokio::test]
async fn arguments_that_break_the_input_schema_never_reach_the_mcp_server() {
    let m = McpHarness::new(vec![
        Step::call("web_search", json!({"query": "typo"})),
        Step::say("Let me fix that."),
    ])
    .await;
    let s = m.start("Search.").await;
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let (text, is_error) = last_tool_result(&m.h.script.requests()[1]);
    assert!(is_error && text.starts_with("invalid_args: "), "{text}");
    assert!(m.server.requests().is_empty());
}

#[tokio::test]
async fn a_call_held_for_approval_is_sent_once_when_approved() {
    let m = McpHarness::new(vec![
        Step::call("create_ticket", json!({"title": "Outage", "priority": 3})),
        Step::say("Ticket T-77 is open."),
    ])
    .await;
    let s = m.start("Open a P3 ticket.").await;
    m.h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = m.h.pending_approval(&s.id).await;
    assert_eq!(approval.reason, "Urgent tickets need a lead.");
    assert!(m.calls().is_empty(), "nothing sent before the vote");
    m.h.engine
        .vote(VoteTarget::Approval(approval.id), approve("lead-amy", "ok"))
        .await
        .unwrap();
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let calls = m.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["name"], "tickets_create");
    assert_eq!(
        calls[0]["arguments"],
        json!({"title": "Outage", "priority": 3})
    );
    let (text, is_error) = last_tool_result(&m.h.script.requests()[1]);
    assert!(!is_error);
    assert_eq!(text, r#"{"ticket":"T-77"}"#);
}

#[tokio::test]
async fn is_error_is_a_tool_error_with_the_joined_text() {
    let m = McpHarness::new(vec![
        Step::call("web_search", json!({"q": "x"})),
        Step::say("The search failed."),
    ])
    .await;
    m.server
        .set_tools(vec![FakeTool::echo("web_search").answering(
            Answer::IsError(vec!["rate limited".into(), "try later".into()]),
        )]);
    let s = m.start("Search.").await;
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let (text, is_error) = last_tool_result(&m.h.script.requests()[1]);
    assert!(is_error);
    assert_eq!(text, "mcp_tool_error: rate limited\ntry later");
    let call_id = phrony_ledger::tool_call_id(&s.id, m.h.version_id, 1, 0, 0);
    let call = m.h.store.get_tool_call(&call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Failed);
    assert_eq!(call.error_code.as_deref(), Some("mcp_tool_error"));
}

#[tokio::test]
async fn a_tool_the_server_does_not_have_is_a_clear_tool_error_not_indeterminate() {
    let m = McpHarness::with(
        vec![
            Step::call("create_ticket", json!({"title": "x", "priority": 1})),
            Step::say("That tool is missing."),
        ],
        test_config(),
        "tickets_open",
    )
    .await;
    let s = m.start("Open a ticket.").await;
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let (text, is_error) = last_tool_result(&m.h.script.requests()[1]);
    assert!(is_error);
    assert_eq!(
        text,
        "mcp_unknown_tool: MCP server \"search\" has no tool \"tickets_open\" (it lists: \
         tickets_create, web_search)"
    );
    assert!(
        m.h.store.session_approvals(&s.id).await.unwrap().is_empty(),
        "no outcome review: nothing ran"
    );
}

#[tokio::test]
async fn a_transport_error_on_a_read_is_reported_and_the_next_call_initialises_again() {
    let m = McpHarness::new(vec![
        Step::call("web_search", json!({"q": "first"})),
        Step::call("web_search", json!({"q": "second"})),
        Step::say("Done."),
    ])
    .await;
    m.server.set_fault(Some(Fault::Status500));
    let s = m.start("Search twice.").await;
    m.wait_for_calls(1).await;
    // The first call fails with an unknown outcome; the second one, on a new MCP session, works.
    m.server.set_fault(None);
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let requests = m.h.script.requests();
    let (first, first_error) = last_tool_result(&requests[1]);
    assert!(first_error);
    assert!(
        first.starts_with(
            "indeterminate: outcome of tool search.web@default is unknown: MCP server"
        ),
        "{first}"
    );
    assert!(first.contains("HTTP 500"), "{first}");
    let (second, second_error) = last_tool_result(&requests[2]);
    assert!(!second_error, "{second}");
    assert_eq!(
        m.server.sessions(),
        2,
        "the client was reset after the failure"
    );
    assert!(m.h.store.session_approvals(&s.id).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_dropped_connection_on_a_non_idempotent_write_goes_to_an_outcome_review_never_resent() {
    let m = McpHarness::new(vec![
        Step::call("create_ticket", json!({"title": "Outage", "priority": 1})),
        Step::say("Ticket open."),
    ])
    .await;
    m.server.set_fault(Some(Fault::DropConnection));
    let s = m.start("Open a ticket.").await;
    m.h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let review = m.h.pending_approval(&s.id).await;
    assert_eq!(review.kind, ApprovalKind::OutcomeReview);
    assert!(
        review
            .reason
            .starts_with("outcome of tool crm.create-ticket@default is unknown: MCP server"),
        "{}",
        review.reason
    );
    assert_eq!(
        review.policy_runtime[phrony_engine::TRIGGER_KEY],
        "dispatch:indeterminate"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(m.calls().len(), 1, "not re-sent on its own");
    // The operator checked the CRM: no ticket; send it again, explicitly.
    m.server.set_fault(None);
    m.h.engine
        .vote(
            VoteTarget::Approval(review.id),
            resolve("emad", ReviewResolution::Resend, "no ticket in the CRM"),
        )
        .await
        .unwrap();
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(m.calls().len(), 2);
    let call = m.h.store.get_tool_call(&review.call_id).await.unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!(call.attempt, 2);
    m.assert_secret_not_recorded(&s.id).await;
}

#[tokio::test]
async fn the_execution_deadline_applies_to_an_mcp_call() {
    let m = McpHarness::with(
        vec![
            Step::call("web_search", json!({"q": "slow"})),
            Step::say("The search is slow."),
        ],
        EngineConfig {
            exec_timeout: Duration::from_millis(300),
            ..test_config()
        },
        "tickets_create",
    )
    .await;
    m.server.set_fault(Some(Fault::Hang));
    let s = m.start("Search.").await;
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let (text, is_error) = last_tool_result(&m.h.script.requests()[1]);
    assert!(is_error);
    assert_eq!(
        text,
        "indeterminate: tool search.web@default did not finish within 300ms on MCP server \"search\""
    );
}

/// Starts a session whose call hangs at the MCP server, stops the engine, and recovers it on a
/// new engine whose recovery grace is long: an MCP call must not wait for it.
async fn restart_with_mcp_call_in_flight(
    call: Step,
    after: Step,
) -> (McpHarness, Engine, Arc<Script>, String) {
    let m = McpHarness::new(vec![call]).await;
    m.server.set_fault(Some(Fault::Hang));
    let s = m.start("Go.").await;
    m.wait_for_calls(1).await;
    m.h.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let open = m.h.store.open_calls(&s.id).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].status, CallStatus::Dispatched);
    assert_eq!(open[0].worker_id.as_deref(), Some("mcp:search"));
    m.server.set_fault(None);
    let script = Script::new(vec![after]);
    let engine = Engine::new(EngineDeps {
        store: m.h.store.clone(),
        router: Some(m.h.router.clone()),
        providers: Arc::new(ScriptedFactory(script.clone())),
        clock: m.h.clock.clone(),
        config: EngineConfig {
            recovery_grace: Duration::from_secs(600),
            ..test_config()
        },
    });
    engine.recover().await.unwrap();
    (m, engine, script, s.id)
}

#[tokio::test]
async fn after_a_restart_a_read_left_with_an_mcp_server_is_sent_again_at_once() {
    let (m, engine, script, id) = restart_with_mcp_call_in_flight(
        Step::call("web_search", json!({"q": "again"})),
        Step::say("Found."),
    )
    .await;
    let done = tokio::time::timeout(Duration::from_secs(10), engine.wait_for(&id, &[]))
        .await
        .expect("no wait for a worker to reconnect")
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(m.calls().len(), 2, "the read was sent again");
    assert!(!last_tool_result(&script.requests()[0]).1);
}

#[tokio::test]
async fn after_a_restart_a_write_left_with_an_mcp_server_waits_for_a_human() {
    let (m, engine, _script, id) = restart_with_mcp_call_in_flight(
        Step::call("create_ticket", json!({"title": "Outage", "priority": 1})),
        Step::say("Ticket open."),
    )
    .await;
    let paused = tokio::time::timeout(
        Duration::from_secs(10),
        engine.wait_for(&id, &[SessionStatus::AwaitingApproval]),
    )
    .await
    .expect("no wait for a worker to reconnect")
    .unwrap();
    assert_eq!(paused.status, SessionStatus::AwaitingApproval);
    let review = m.h.pending_approval(&id).await;
    assert_eq!(review.kind, ApprovalKind::OutcomeReview);
    assert!(
        review
            .reason
            .starts_with("the runtime restarted while the call was with MCP server \"search\""),
        "{}",
        review.reason
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(m.calls().len(), 1, "never re-sent on its own");
    engine
        .vote(
            VoteTarget::Approval(review.id),
            resolve("emad", ReviewResolution::Fail, "cannot tell"),
        )
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), engine.wait_for(&id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(m.calls().len(), 1);
}

#[tokio::test]
async fn a_server_that_forgot_the_session_gets_a_new_one_and_the_call_once() {
    // Parking off: the session keeps its driver, and so its MCP client, across the approval.
    let m = McpHarness::with(
        vec![
            Step::call("web_search", json!({"q": "one"})),
            Step::call("create_ticket", json!({"title": "Outage", "priority": 3})),
            Step::say("Done."),
        ],
        EngineConfig {
            park_approval_waits: false,
            ..test_config()
        },
        "tickets_create",
    )
    .await;
    let s = m.start("Search, then open an urgent ticket.").await;
    m.h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    assert_eq!(m.server.sessions(), 1);
    // The server restarts while the ticket waits for its approval.
    m.server.expire_sessions();
    let approval = m.h.pending_approval(&s.id).await;
    m.h.engine
        .vote(VoteTarget::Approval(approval.id), approve("lead-amy", "ok"))
        .await
        .unwrap();
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let tickets: Vec<_> = m
        .server
        .requests_of("tools/call")
        .into_iter()
        .filter(|r| r.params["name"] == "tickets_create")
        .collect();
    assert_eq!(
        tickets.len(),
        2,
        "refused on the forgotten session, then sent once on a new one"
    );
    assert_eq!(tickets[0].header("mcp-session-id"), Some("session-1"));
    assert_eq!(tickets[1].header("mcp-session-id"), Some("session-2"));
    let (text, is_error) = last_tool_result(&m.h.script.requests()[2]);
    assert!(!is_error, "{text}");
    assert_eq!(text, r#"{"ticket":"T-77"}"#);
    assert!(
        m.h.store.session_approvals(&s.id).await.unwrap().len() == 1,
        "no outcome review"
    );
}

#[tokio::test]
async fn the_header_scheme_sends_the_secret_in_the_named_header_only() {
    let server = FakeMcp::start(tools()).await;
    server.require_header("x-api-key", TOKEN);
    let m = McpHarness::on(
        server,
        vec![
            Step::call("web_search", json!({"q": "k"})),
            Step::say("Found."),
        ],
        test_config(),
        "tickets_create",
        "{scheme: header, header: X-Api-Key, secret: search_token}",
    )
    .await;
    let s = m.start("Search.").await;
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let calls = m.server.requests_of("tools/call");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].header("x-api-key"), Some(TOKEN));
    assert_eq!(calls[0].header("authorization"), None);
    assert!(!last_tool_result(&m.h.script.requests()[1]).1);
    m.assert_secret_not_recorded(&s.id).await;
}

#[tokio::test]
async fn a_token_the_server_echoes_in_its_error_reaches_neither_the_model_nor_the_ledger() {
    let m = McpHarness::new(vec![
        Step::call("web_search", json!({"q": "x"})),
        Step::say("The search failed."),
    ])
    .await;
    m.server.set_fault(Some(Fault::Status500EchoingAuth));
    let s = m.start("Search.").await;
    assert_eq!(m.h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let (text, is_error) = last_tool_result(&m.h.script.requests()[1]);
    assert!(is_error);
    assert!(text.contains("authorization: Bearer [redacted]"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    m.assert_secret_not_recorded(&s.id).await;
}
