//! Attaching to sessions on the ledger in memory: the catch-up of a session that waits for an
//! approval, is streaming text, is parked or has ended, and the live updates that follow it
//! with no gap and no duplicate.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{
    Activity, ApprovalStatus, AttachFrom, Attachment, BLOCKED_AWAITING_APPROVAL, Engine,
    EngineDeps, ManualClock, ProviderFactory, SessionMode, SessionStatus,
};
use phrony_manifest::CompiledAgent;
use phrony_providers::{
    ApiKey, CompletionRequest, Event as ModelEvent, EventStream, ModelProvider, ProviderError,
    ProviderKind, StopReason,
};
use serde_json::json;
use tokio::sync::Notify;
use uuid::Uuid;

const PATIENCE: Duration = Duration::from_secs(20);

/// Reads updates until (and including) the first item `stop` accepts.
async fn read_until(
    engine_view: &mut Attachment,
    stop: impl Fn(&Activity) -> bool,
) -> Vec<Activity> {
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        let updates = engine_view.updates.as_mut().expect("the session is live");
        while let Some(update) = updates.recv().await {
            for a in engine_view.view.update(&update).unwrap() {
                let done = stop(&a);
                out.push(a);
                if done {
                    return;
                }
            }
        }
        panic!("the updates ended first: {out:#?}");
    })
    .await
    .unwrap_or_else(|_| panic!("timed out; got {out:#?}"));
    out
}

fn text(items: &[Activity]) -> String {
    items
        .iter()
        .filter_map(|a| match a {
            Activity::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn kinds(items: &[Activity]) -> Vec<&'static str> {
    items
        .iter()
        .map(|a| match a {
            Activity::Text(_) => "text",
            Activity::ToolCall(_) => "tool_call",
            Activity::ToolResult(_) => "tool_result",
            Activity::ApprovalRequired(_) => "approval_required",
            Activity::ApprovalDecided(_) => "approval_decided",
            Activity::Status { .. } => "status",
            Activity::AwaitingInput(_) => "awaiting_input",
            Activity::Completed(_) => "completed",
            Activity::Failed { .. } => "failed",
            Activity::Cancelled { .. } => "cancelled",
        })
        .collect()
}

fn refund_steps() -> Vec<Step> {
    vec![
        Step::call("lookup_order", json!({"order_id": "ORD-1"})),
        Step::call("issue_refund", refund("ORD-1", 400.0)),
        Step::say("Your refund of €400 has been issued."),
    ]
}

#[tokio::test]
async fn attaching_to_a_session_awaiting_approval_replays_the_turn_then_goes_live() {
    let h = Harness::memory(&AgentOptions::default(), refund_steps()).await;
    let s = h.start("Refund €400 for ORD-1, it arrived damaged.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let pending = h.pending_approval(&s.id).await;

    let mut a = h.engine.attach(&s.id, AttachFrom::Now).await.unwrap();
    let c = &a.catch_up;
    assert_eq!(c.session.id, s.id);
    assert_eq!(
        (c.model_provider.as_str(), c.model_name.as_str()),
        ("openai", "gpt-4o")
    );
    assert_eq!(c.history.len(), 1, "{:#?}", c.history);
    assert_eq!(c.history[0].role, "user");
    assert_eq!(
        c.history[0].content,
        "Refund €400 for ORD-1, it arrived damaged."
    );
    assert_eq!(
        kinds(&c.activities),
        [
            "tool_call",
            "tool_result",
            "tool_call",
            "status",
            "approval_required",
            "awaiting_input"
        ]
    );
    let Activity::ToolResult(lookup) = &c.activities[1] else {
        unreachable!()
    };
    assert_eq!(lookup.result.as_ref().unwrap()["total"], json!(400.0));
    let Activity::ApprovalRequired(r) = &c.activities[4] else {
        unreachable!()
    };
    assert_eq!(r.approval_id, pending.id);
    assert_eq!(r.tool, "payments.issue-refund");
    assert_eq!(r.args["amount"], json!(400.0));
    assert_eq!(
        r.policy_ref.as_deref(),
        Some("payments/refund-approval-boundary@1.0.0")
    );
    let Activity::AwaitingInput(w) = &c.activities[5] else {
        unreachable!()
    };
    assert_eq!(w.blocked_reason.as_deref(), Some(BLOCKED_AWAITING_APPROVAL));

    h.engine
        .vote(VoteTarget::Approval(pending.id), approve("emad", "ok"))
        .await
        .unwrap();
    let live = read_until(&mut a, Activity::is_terminal).await;
    let decided: Vec<_> = live
        .iter()
        .filter_map(|a| match a {
            Activity::ApprovalDecided(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(decided.len(), 1, "{live:#?}");
    assert_eq!(decided[0].status, ApprovalStatus::Approved);
    assert_eq!(decided[0].decided_by, "emad");
    // Nothing of the catch-up comes again: only the refund's result is new.
    let results: Vec<_> = live
        .iter()
        .filter_map(|a| match a {
            Activity::ToolResult(r) => Some(r.result.clone().unwrap()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "{live:#?}");
    assert_eq!(results[0]["refund_id"], json!("rf_2891"));
    assert!(!kinds(&live).contains(&"tool_call"), "{live:#?}");
    assert_eq!(text(&live), "Your refund of €400 has been issued.");
    let Some(Activity::Completed(done)) = live.last() else {
        panic!("{live:#?}")
    };
    assert_eq!(
        done.output["message"],
        json!("Your refund of €400 has been issued.")
    );
    assert_eq!(done.stats.unwrap().turn, 1);
}

#[tokio::test]
async fn a_parked_conversation_shows_its_history_and_stats() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::say("Which order is it about?"), Step::say("Thanks.")],
    )
    .await;
    let s = h.start_conversation("I want a refund.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    let mut a = h.engine.attach(&s.id, AttachFrom::Now).await.unwrap();
    let history: Vec<_> = a
        .catch_up
        .history
        .iter()
        .map(|e| {
            (
                e.role.as_str(),
                e.content.as_str(),
                e.stop_reason.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        history,
        [
            ("user", "I want a refund.", None),
            ("assistant", "Which order is it about?", Some("end_turn"))
        ]
    );
    assert_eq!(a.catch_up.history[1].turn_usage.unwrap().output_tokens, 10);
    assert_eq!(kinds(&a.catch_up.activities), ["status", "awaiting_input"]);
    let Activity::AwaitingInput(w) = &a.catch_up.activities[1] else {
        unreachable!()
    };
    assert_eq!(w.blocked_reason, None);
    assert_eq!(w.stop_reason.as_deref(), Some("end_turn"));
    let stats = w.stats.unwrap();
    assert_eq!((stats.turn, stats.session_usage.input_tokens), (1, 20));

    h.engine
        .send_user_message(
            &s.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "ORD-1",
        )
        .await
        .unwrap();
    let live = read_until(&mut a, |a| matches!(a, Activity::AwaitingInput(_))).await;
    assert_eq!(text(&live), "Thanks.");
    let Some(Activity::AwaitingInput(w)) = live.last() else {
        unreachable!()
    };
    let stats = w.stats.unwrap();
    assert_eq!((stats.turn, stats.session_usage.input_tokens), (2, 40));
}

#[tokio::test]
async fn an_ended_session_is_its_terminal_item_and_has_no_updates() {
    let h = Harness::memory(&AgentOptions::default(), vec![Step::say("Done.")]).await;
    let s = h.start("Hello").await;
    h.wait_end(&s.id).await;
    let a = h.engine.attach(&s.id, AttachFrom::Now).await.unwrap();
    assert!(a.updates.is_none());
    assert!(a.catch_up.ended_at.is_some());
    assert_eq!(kinds(&a.catch_up.activities), ["completed"]);
    assert_eq!(a.catch_up.history.len(), 2);
    let err = h
        .engine
        .attach("run_00000000-0000-0000-0000-000000000000", AttachFrom::Now)
        .await
        .unwrap_err();
    assert_eq!(err.kind, phrony_engine::ErrorKind::NotFound);
}

#[tokio::test]
async fn attaching_from_the_start_delivers_every_event_as_an_update() {
    let h = Harness::memory(&AgentOptions::default(), refund_steps()).await;
    let s = h.start("Refund €400 for ORD-1.").await;
    let mut a = h.engine.attach(&s.id, AttachFrom::Start).await.unwrap();
    assert!(a.catch_up.history.is_empty());
    assert!(a.catch_up.activities.is_empty());
    let live = read_until(&mut a, |a| matches!(a, Activity::ApprovalRequired(_))).await;
    let tools: Vec<_> = kinds(&live)
        .into_iter()
        .filter(|k| k.starts_with("tool") || k.starts_with("approval"))
        .collect();
    assert_eq!(
        tools,
        ["tool_call", "tool_result", "tool_call", "approval_required"]
    );
}

#[tokio::test]
async fn an_outcome_review_is_shown_as_one_and_its_fail_as_the_only_tool_result() {
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Refund status unknown."),
        ],
        phrony_engine::EngineConfig {
            exec_timeout: Duration::from_millis(300),
            ..test_config()
        },
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Refund €100 for ORD-1.").await;
    let mut a = h.engine.attach(&s.id, AttachFrom::Start).await.unwrap();
    let live = read_until(&mut a, |a| matches!(a, Activity::ApprovalRequired(_))).await;
    let Some(Activity::ApprovalRequired(review)) = live.last() else {
        unreachable!()
    };
    assert_eq!(review.kind, phrony_ledger::ApprovalKind::OutcomeReview);
    h.engine
        .vote(
            VoteTarget::Approval(review.approval_id),
            reject("emad", "unknown"),
        )
        .await
        .unwrap();
    let after = read_until(&mut a, |a| matches!(a, Activity::ToolResult(_))).await;
    let Some(Activity::ToolResult(result)) = after.last() else {
        unreachable!()
    };
    assert_eq!(result.error_code.as_deref(), Some("outcome_unknown"));
    assert!(
        result
            .error_message
            .as_deref()
            .unwrap()
            .contains("outcome unknown, not re-sent by emad"),
        "the first tool result after the review is the truth, not a denial: {result:?}"
    );
    h.wait_end(&s.id).await;
}

// ---------------------------------------------------------------------------------------------
// A model that stops in the middle of its text until told to go on.

#[derive(Debug)]
struct Halting {
    resume: Arc<Notify>,
    reached: Arc<Notify>,
}

#[async_trait::async_trait]
impl ModelProvider for Halting {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Stub
    }

    async fn stream(&self, _request: CompletionRequest) -> Result<EventStream, ProviderError> {
        let resume = Arc::clone(&self.resume);
        let reached = Arc::clone(&self.reached);
        let stream = async_stream(resume, reached);
        Ok(Box::pin(stream))
    }
}

fn async_stream(
    resume: Arc<Notify>,
    reached: Arc<Notify>,
) -> impl futures::Stream<Item = Result<ModelEvent, ProviderError>> + Send {
    use futures::StreamExt as _;
    let first = futures::stream::iter(vec![
        Ok(ModelEvent::TextDelta("Let me ".into())),
        Ok(ModelEvent::TextDelta("check ".into())),
    ]);
    let rest = futures::stream::once(async move {
        reached.notify_one();
        resume.notified().await;
        futures::stream::iter(vec![
            Ok(ModelEvent::TextDelta("that order.".into())),
            Ok(completed(StopReason::EndTurn, 7)),
        ])
    })
    .flatten();
    first.chain(rest)
}

#[derive(Debug)]
struct HaltingFactory(Arc<Notify>, Arc<Notify>);

impl ProviderFactory for HaltingFactory {
    fn build(
        &self,
        _agent: &CompiledAgent,
        _api_key: Option<ApiKey>,
        _completions_done: usize,
    ) -> Result<Box<dyn ModelProvider>, ProviderError> {
        Ok(Box::new(Halting {
            resume: Arc::clone(&self.0),
            reached: Arc::clone(&self.1),
        }))
    }
}

#[tokio::test]
async fn text_streamed_before_the_attach_is_caught_up_then_continues() {
    let clock = Arc::new(ManualClock::starting_now());
    let agent = refund_agent(&AgentOptions::default());
    let (store, version_id) = memory_store(&clock, &agent).await;
    let (resume, reached) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = Engine::new(EngineDeps {
        store: Arc::clone(&store),
        router: None,
        providers: Arc::new(HaltingFactory(Arc::clone(&resume), Arc::clone(&reached))),
        clock,
        config: test_config(),
    });
    let mut req = StartRequestBuilder::new(&agent, version_id).build();
    req.mode = SessionMode::Conversation;
    let s = engine.start_session(req).await.unwrap();
    tokio::time::timeout(PATIENCE, reached.notified())
        .await
        .unwrap();

    let mut a = engine.attach(&s.id, AttachFrom::Now).await.unwrap();
    assert_eq!(
        a.catch_up.activities.first(),
        Some(&Activity::Text("Let me check ".into())),
        "{:#?}",
        a.catch_up.activities
    );
    resume.notify_one();
    let live = read_until(&mut a, |a| matches!(a, Activity::AwaitingInput(_))).await;
    assert_eq!(text(&live), "that order.");
}

/// A start request for `agent` without the harness.
struct StartRequestBuilder<'a> {
    agent: &'a CompiledAgent,
    version_id: Uuid,
}

impl<'a> StartRequestBuilder<'a> {
    fn new(agent: &'a CompiledAgent, version_id: Uuid) -> Self {
        Self { agent, version_id }
    }

    fn build(self) -> phrony_engine::StartSession {
        phrony_engine::StartSession {
            session_id: None,
            agent_version_id: self.version_id,
            agent: phrony_engine::PreparedAgent::new(self.agent.clone())
                .expect("the agent compiles"),
            input: json!("Refund €400 for ORD-1."),
            metadata: Default::default(),
            mode: SessionMode::Task,
            principal: None,
            secrets: vec![phrony_engine::PlainSecret::new("openai", "sk-test")],
            actor: "emad".into(),
            bundle: None,
        }
    }
}

#[tokio::test]
async fn the_history_keeps_the_completions_of_a_turn_apart() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![
            Step::from_fn(|_| {
                vec![
                    ModelEvent::TextDelta("Let me look it up.".to_owned()),
                    ModelEvent::ToolCall {
                        id: "provider_call_0".to_owned(),
                        name: "lookup_order".to_owned(),
                        args: json!({"order_id": "ORD-1"}),
                    },
                    completed(StopReason::ToolUse, 10),
                ]
            }),
            Step::say("It was delivered."),
        ],
    )
    .await;
    let s = h.start_conversation("Where is ORD-1?").await;
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    let a = h.engine.attach(&s.id, AttachFrom::Now).await.unwrap();
    let assistant: Vec<_> = a
        .catch_up
        .history
        .iter()
        .filter(|e| e.role == "assistant")
        .map(|e| e.content.as_str())
        .collect();
    assert_eq!(assistant, ["Let me look it up.\n\nIt was delivered."]);
}
