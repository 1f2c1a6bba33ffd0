//! The same flows on the durable ledger: SQLite (a temporary file) always, PostgreSQL (a fresh
//! database per test from `phrony_test_support::postgres::PgDatabase`, on
//! `PHRONY_TEST_POSTGRES_URL`) unless it is unreachable and `PHRONY_TEST_SKIP_POSTGRES=1`.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{Engine, EngineDeps, ErrorKind, LedgerStore, ManualClock};
use phrony_ledger::{ApprovalStatus, Ledger, SessionStatus};
use phrony_test_support::postgres::PgDatabase;
use serde_json::json;

/// A fresh database: SQLite in a temporary directory (deleted at the end), or a throw-away
/// PostgreSQL database ([`PgDatabase`], dropped at the end).
pub(crate) enum Db {
    Sqlite {
        url: String,
        _dir: tempfile::TempDir,
    },
    Postgres(PgDatabase),
}

impl Db {
    pub(crate) fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
        Self::Sqlite { url, _dir: dir }
    }

    /// `None` when PostgreSQL is unreachable and `PHRONY_TEST_SKIP_POSTGRES=1`.
    pub(crate) async fn postgres() -> Option<Self> {
        PgDatabase::create().await.map(Self::Postgres)
    }

    fn url(&self) -> &str {
        match self {
            Self::Sqlite { url, .. } => url,
            Self::Postgres(db) => db.url(),
        }
    }

    /// The ledger on this database, its times following `clock`.
    pub(crate) async fn ledger(&self, clock: &Arc<ManualClock>) -> Ledger {
        let ledger = Ledger::connect_with(self.url(), ledger_options(clock))
            .await
            .unwrap();
        ledger.migrate().await.unwrap();
        ledger
    }
}

/// Publishes the tutorial agent and returns a harness on the ledger.
async fn harness(db: &Db, opts: &AgentOptions, steps: Vec<Step>) -> (Harness, Ledger) {
    let clock = Arc::new(ManualClock::starting_now());
    let ledger = db.ledger(&clock).await;
    let agent = refund_agent(opts);
    let version_id = publish(
        &ledger,
        String::from_utf8(agent.snapshot_json()).unwrap(),
        agent.content_hash(),
    )
    .await;
    let store = Arc::new(LedgerStore::new(ledger.clone(), Some(cipher())));
    let h = Harness::on(store, clock, agent, version_id, Script::new(steps)).await;
    (h, ledger)
}

async fn the_refund_tutorial_runs_on_the_ledger(db: Db) {
    let (h, ledger) = harness(
        &db,
        &AgentOptions::default(),
        vec![
            // €100: dispatched.
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::call("issue_refund", refund("ORD-1", 100.0)),
            Step::say("Refund rf_2891 issued."),
            // €400: approved.
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Approved and issued."),
            // €14,000: denied.
            Step::call("issue_refund", refund("ORD-2", 14000.0)),
            Step::say("I can't issue that refund."),
        ],
    )
    .await;
    let small = h.start("Refund €100 for ORD-1.").await;
    assert_eq!(h.wait_end(&small.id).await.status, SessionStatus::Completed);
    assert_eq!(
        h.worker.tools(),
        ["orders.lookup-order", "payments.issue-refund"]
    );

    let medium = h.start("Refund €400 for ORD-1.").await;
    h.wait(&medium.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&medium.id).await;
    assert_eq!(
        approval.policy_ref.as_deref(),
        Some("payments/refund-approval-boundary@1.0.0")
    );
    assert_eq!(approval.agent.to_string(), "support/refund-agent@0.1.0");
    assert_eq!(h.worker.tools().len(), 2);
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("emad", "Damage claim verified, within policy."),
        )
        .await
        .unwrap();
    let done = h.wait_end(&medium.id).await;
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(done.output.unwrap()["message"], "Approved and issued.");
    assert_eq!(h.worker.invoked("payments.issue-refund").len(), 2);

    let big = h.start("Refund the full €14,000 for ORD-2.").await;
    assert_eq!(h.wait_end(&big.id).await.status, SessionStatus::Completed);
    assert_eq!(
        h.worker.invoked("payments.issue-refund").len(),
        2,
        "the denied refund never runs"
    );
    let (text, is_error) = last_tool_result(&h.script.requests()[6]);
    assert!(is_error);
    assert_eq!(
        text,
        "Refund amount exceeds the absolute ceiling for agent-initiated refunds."
    );

    // The log is intact, the ledger rows say the same, and the secrets are gone.
    for id in [&small.id, &medium.id, &big.id] {
        let report = ledger.verify_stream(id).await.unwrap();
        assert!(report.violation.is_none(), "{report:?}");
        assert!(ledger.load_session_secrets(id).await.unwrap().is_empty());
    }
    let timeline = ledger.session_timeline(&big.id).await.unwrap();
    let denied = timeline
        .invocations
        .iter()
        .find(|c| c.tool == "payments.issue-refund")
        .unwrap();
    assert_eq!(denied.error_code.as_deref(), Some("policy_denied"));
    assert_eq!(denied.attempt, 0);
    let timeline = ledger.session_timeline(&small.id).await.unwrap();
    assert!(
        timeline
            .invocations
            .iter()
            .all(|c| c.attempt == 1 && c.worker_id.as_deref() == Some("refund-worker-1"))
    );
}

async fn quorum_and_cancel_on_the_ledger(db: Db) {
    let (h, ledger) = harness(
        &db,
        &AgentOptions::with_decision("    approvals_required: 2\n"),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Issued."),
            Step::call("issue_refund", refund("ORD-1", 400.0)),
        ],
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.engine
        .vote(VoteTarget::Approval(approval.id), approve("alice", "ok"))
        .await
        .unwrap();
    let dup = h
        .engine
        .vote(VoteTarget::Approval(approval.id), approve("alice", "ok"))
        .await
        .unwrap_err();
    assert_eq!(dup.kind, ErrorKind::FailedPrecondition);
    assert_eq!(
        dup.message,
        "actor \"alice\" already decided on this approval"
    );
    h.engine
        .vote(VoteTarget::Approval(approval.id), approve("bob", "ok"))
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(h.worker.tools(), ["payments.issue-refund"]);

    let other = h.start("Refund €400 for ORD-1 again.").await;
    h.wait(&other.id, &[SessionStatus::AwaitingApproval]).await;
    let pending = h.pending_approval(&other.id).await;
    h.engine
        .cancel_session(&other.id, &phrony_ledger::Attribution::unverified("emad"))
        .await
        .unwrap();
    let closed = ledger.get_approval(pending.id).await.unwrap();
    assert_eq!(closed.status, ApprovalStatus::Cancelled);
    assert_eq!(
        ledger.get_session(&other.id).await.unwrap().status,
        SessionStatus::Cancelled
    );
}

async fn a_timeout_default_applies_from_the_stored_expiry(db: Db) {
    let (h, _ledger) = harness(
        &db,
        &AgentOptions::with_decision("    timeout:\n      after_minutes: 5\n      default: deny\n"),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("It timed out."),
        ],
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    assert!(approval.expires_at.is_some());
    h.clock.advance(Duration::from_secs(6 * 60));
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert!(h.worker.tools().is_empty());
    let (text, _) = last_tool_result(&h.script.requests()[1]);
    assert!(
        text.ends_with("was rejected by system:timeout: approval timed out"),
        "{text}"
    );
}

async fn a_pending_approval_survives_a_restart(db: Db) {
    let (h, _ledger) = harness(
        &db,
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::call("issue_refund", refund("ORD-1", 400.0)),
        ],
    )
    .await;
    let s = h.start("Check ORD-1 and refund €400.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    // The daemon stops: engine, router and worker connection go away.
    h.engine.shutdown();
    let Harness {
        agent,
        version_id,
        clock,
        ..
    } = h;
    tokio::time::sleep(Duration::from_millis(50)).await;

    // A new process: a new pool on the same database, a new router, the worker reconnects.
    let ledger = db.ledger(&clock).await;
    let store = Arc::new(LedgerStore::new(ledger.clone(), Some(cipher())));
    assert_eq!(
        store.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
    let script = Script::new(vec![Step::say("Refund rf_2891 issued.")]);
    let router = router_for(&store);
    let worker = FakeWorker::connect(&router).await;
    let engine = Engine::new(EngineDeps {
        store: Arc::clone(&store),
        router: Some(router),
        providers: Arc::new(ScriptedFactory(script.clone())),
        clock,
        config: test_config(),
    });
    let report = engine.recover().await.unwrap();
    // Nothing to do until someone decides: it stays parked (no driver) until the vote.
    assert_eq!(report.parked, std::slice::from_ref(&s.id));
    assert!(report.resumed.is_empty() && report.failed.is_empty());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        store.get_session(&s.id).await.unwrap().status,
        SessionStatus::AwaitingApproval
    );
    assert!(
        worker.tools().is_empty(),
        "still paused until someone decides"
    );

    engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("emad", "Verified."),
        )
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(20), engine.wait_for(&s.id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.output.unwrap()["message"], "Refund rf_2891 issued.");
    assert_eq!(worker.tools(), ["payments.issue-refund"]);
    assert_eq!(
        script.api_keys(),
        [Some("sk-test-123".to_owned())],
        "unsealed from the store when the vote resumed it"
    );
    let request = &script.requests()[0];
    let results = tool_results(request);
    assert_eq!(
        results.len(),
        2,
        "the resumed model sees the lookup and the refund"
    );
    assert!(results[0].0.contains("\"total\":400"));
    assert!(results[1].0.contains("rf_2891"));
    let _ = (agent, version_id);
    assert!(
        ledger
            .verify_stream(&s.id)
            .await
            .unwrap()
            .violation
            .is_none()
    );
    assert!(ledger.load_session_secrets(&s.id).await.unwrap().is_empty());
}

async fn a_conversation_with_rejection_revalidation_and_invalid_args(db: Db) {
    let (h, ledger) = harness(
        &db,
        &AgentOptions::with_decision("    on_modify: revalidate\n"),
        vec![
            // Turn 1: rejected.
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Not approved."),
            // Turn 2: an edit above the hard limit is refused at vote time; then it is rejected.
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Denied."),
            // Turn 3: invalid arguments never reach policy or worker.
            Step::call("issue_refund", json!({"order_id": "ORD-1"})),
            Step::say("I need an amount."),
        ],
    )
    .await;
    let s = h.start_conversation("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let first = h.pending_approval(&s.id).await;
    h.engine
        .vote(
            VoteTarget::Approval(first.id),
            reject("emad", "No damage claim on file for this order."),
        )
        .await
        .unwrap();
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;

    h.engine
        .send_user_message(
            &s.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "Try again.",
        )
        .await
        .unwrap();
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let second = h.pending_approval(&s.id).await;
    let vote = phrony_ledger::Vote {
        edited_args: Some(refund("ORD-1", 9000.0)),
        ..approve("mallory", "refund everything")
    };
    let refused = h
        .engine
        .vote(VoteTarget::Approval(second.id), vote)
        .await
        .unwrap_err();
    assert_eq!(refused.kind, phrony_engine::ErrorKind::FailedPrecondition);
    assert!(
        refused.message.starts_with(
            "the edited arguments are denied by policy payments/refund-hard-limit@1.0.0"
        ),
        "{}",
        refused.message
    );
    h.engine
        .vote(
            VoteTarget::Approval(second.id),
            reject("emad", "Not above the ceiling."),
        )
        .await
        .unwrap();
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;

    h.engine
        .send_user_message(
            &s.id,
            &phrony_ledger::Attribution::unverified("emad"),
            "Once more.",
        )
        .await
        .unwrap();
    // The message is recorded while the session is parked; wait for its turn to run.
    for _ in 0..500 {
        if h.script.requests().len() == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(h.script.requests().len(), 6);
    let parked = h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert_eq!(parked.status, SessionStatus::AwaitingInput);
    assert!(h.worker.tools().is_empty(), "nothing reached the worker");
    let requests = h.script.requests();
    assert!(
        last_tool_result(&requests[1])
            .0
            .ends_with("was rejected by emad: No damage claim on file for this order.")
    );
    assert!(
        last_tool_result(&requests[3])
            .0
            .ends_with("was rejected by emad: Not above the ceiling.")
    );
    assert!(
        last_tool_result(&requests[5])
            .0
            .starts_with("invalid_args: ")
    );
    let timeline = ledger.session_timeline(&s.id).await.unwrap();
    let edited = timeline
        .invocations
        .iter()
        .find(|c| c.call_id == second.call_id)
        .unwrap();
    assert_eq!(edited.proposed_args["amount"], json!(400.0));
    assert_eq!(
        edited.args["amount"],
        json!(400.0),
        "the refused edit left no trace"
    );
    let votes = &ledger.get_approval(second.id).await.unwrap().votes;
    assert_eq!(votes.len(), 1);
    assert_eq!(votes[0].decided_by, "emad");
    assert!(
        ledger
            .verify_stream(&s.id)
            .await
            .unwrap()
            .violation
            .is_none()
    );
}

/// A late result beats the engine's "indeterminate" failure (the crash soak's late-result race):
/// the worker's stream is cut mid-call, the call is marked `tool.indeterminate`, the worker
/// reconnects and re-sends its result (`tool.completed`, succeeded) before the engine fails the
/// read as indeterminate. Failing it is refused; the engine's step keeps the recorded result,
/// the model gets it, the call is not sent again and the session completes.
async fn a_late_result_settles_a_call_marked_indeterminate(db: Db) {
    let (h, ledger) = harness(
        &db,
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", json!({"order_id": "ORD-1"})),
            Step::say("ORD-1 totals 400 EUR."),
        ],
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("What does ORD-1 total?").await;
    let mut held = Vec::new();
    for _ in 0..500 {
        held = h.worker.invoked("orders.lookup-order");
        if !held.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let call_id = held
        .first()
        .expect("the lookup reached the worker")
        .call_id
        .clone();

    // The stream is cut: the call is marked indeterminate; the worker reconnects and its
    // re-sent result is recorded (what the router hooks do with a late result).
    h.store
        .mark_tool_call_indeterminate(&call_id, "worker lost")
        .await
        .unwrap();
    h.store
        .record_tool_result(
            &call_id,
            phrony_ledger::ToolResult {
                worker_id: Some("refund-worker-1".into()),
                outcome: phrony_ledger::ToolOutcome::Success(
                    json!({"order_id": "ORD-1", "found": true, "total": 400.0}),
                ),
                usage: None,
            },
        )
        .await
        .unwrap();
    // The engine's step now: the plain transition is refused (what failed the session)…
    let refused = h
        .store
        .fail_tool_call(&call_id, "indeterminate", "worker lost")
        .await
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::FailedPrecondition, "{refused}");
    // …and the engine's call keeps the recorded result, writing nothing.
    let before = h.events(&s.id).await.len();
    let settled = h
        .store
        .fail_tool_call_unless_settled(&call_id, "indeterminate", "worker lost")
        .await
        .unwrap();
    assert_eq!(settled.status, phrony_ledger::CallStatus::Succeeded);
    assert_eq!(settled.result.as_ref().unwrap()["total"], 400.0);
    let again = h
        .store
        .mark_indeterminate_unless_settled(&call_id, "worker lost")
        .await
        .unwrap();
    assert_eq!(again.status, phrony_ledger::CallStatus::Succeeded);
    assert_eq!(h.events(&s.id).await.len(), before, "nothing written");

    // The engine learns the worker was lost and goes on with the recorded result.
    h.worker.disconnect().await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(
        h.worker.invoked("orders.lookup-order").len(),
        1,
        "not sent again"
    );
    let requests = h.script.requests();
    assert_eq!(requests.len(), 2);
    assert!(last_tool_result(&requests[1]).0.contains("\"total\":400"));
    let types = h.event_types(&s.id).await;
    assert_eq!(
        types.iter().filter(|t| *t == "tool.completed").count(),
        1,
        "{types:?}"
    );
    assert!(
        ledger
            .verify_stream(&s.id)
            .await
            .unwrap()
            .violation
            .is_none()
    );
}

/// A crash right after a session's final model turn (the crash soak's final-turn rerun): the
/// engine records the final `model.completion` and its `message.assistant` in one commit
/// (`Ledger::record_completion`), so a daemon that dies after it leaves the answer in the
/// stream. Recovery must finish the session from it: no second (billed) model call, and the
/// output is the recorded answer.
async fn a_crash_after_the_final_completion_does_not_ask_the_model_again(db: Db) {
    let gate = Arc::new(tokio::sync::Notify::new());
    let (h, _ledger) = harness(
        &db,
        &AgentOptions::default(),
        vec![Step::say("ORD-1 totals 400 EUR.").gated(Arc::clone(&gate))],
    )
    .await;
    let s = h.start("What does ORD-1 total?").await;
    for _ in 0..500 {
        if !h.script.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.script.requests().len(), 1, "the model was asked");
    // The model answered; the engine committed the completion with its message and died
    // before the session's status changed (the daemon is killed: nothing else is written).
    let completion = phrony_ledger::EventBody::ModelCompletion(phrony_ledger::ModelCompletion {
        turn: 1,
        iteration: 0,
        stop_reason: "end_turn".into(),
        usage: phrony_ledger::Usage {
            input_tokens: 20,
            output_tokens: 10,
            estimated: false,
        },
        duration_ms: 5,
        tool_calls: Vec::new(),
        reasoning: Vec::new(),
        hidden_tools: Vec::new(),
    });
    let mut completion = completion.into_new_event("agent").unwrap();
    completion.turn = Some(1);
    let message = phrony_ledger::AssistantMessage {
        turn: 1,
        content: "ORD-1 totals 400 EUR.".into(),
        stop_reason: Some("end_turn".into()),
        turn_usage: Some(phrony_ledger::Usage {
            input_tokens: 20,
            output_tokens: 10,
            estimated: false,
        }),
        turn_duration_ms: Some(5),
    };
    h.engine.shutdown();
    let Harness { clock, .. } = h;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let ledger = db.ledger(&clock).await;
    let store = Arc::new(LedgerStore::new(ledger.clone(), Some(cipher())));
    let written = store
        .record_completion(
            &s.id,
            completion,
            Some(phrony_ledger::SessionEvent::AssistantMessage(message)),
        )
        .await
        .unwrap();
    assert_eq!(
        written
            .iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["model.completion", "message.assistant"]
    );
    assert!(
        !store.get_session(&s.id).await.unwrap().status.is_terminal(),
        "the session is still open"
    );

    // A new process recovers it with a model that would answer differently.
    let script = Script::new(vec![Step::say("A different, billed answer.")]);
    let router = router_for(&store);
    let _worker = FakeWorker::connect(&router).await;
    let engine = Engine::new(EngineDeps {
        store: Arc::clone(&store),
        router: Some(router),
        providers: Arc::new(ScriptedFactory(script.clone())),
        clock,
        config: test_config(),
    });
    engine.recover().await.unwrap();
    let done = tokio::time::timeout(Duration::from_secs(20), engine.wait_for(&s.id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.output.unwrap()["message"], "ORD-1 totals 400 EUR.");
    assert!(
        script.requests().is_empty(),
        "the model was not asked again"
    );
    let events = store.events_after(&s.id, 0, 1000).await.unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.event_type == "model.completion")
            .count(),
        1
    );
    assert!(
        ledger
            .verify_stream(&s.id)
            .await
            .unwrap()
            .violation
            .is_none()
    );
    gate.notify_waiters();
}

/// Drains `sub` until it delivered `n` events (or fails the test after 10 s without one).
async fn next_events(sub: &mut phrony_engine::Subscription, n: usize) -> Vec<phrony_ledger::Event> {
    let mut events = Vec::new();
    while events.len() < n {
        match tokio::time::timeout(Duration::from_secs(10), sub.recv())
            .await
            .expect("an event within 10 s")
        {
            Some(phrony_engine::SessionUpdate::Event(e)) => events.push(e),
            Some(phrony_engine::SessionUpdate::TextDelta { .. }) => {}
            None => panic!("the subscription ended"),
        }
    }
    events
}

/// A subscription takes the events its engine committed from memory only when they continue
/// what it delivered: an event another process appended in between (this engine never hears
/// of it) is read from the store, in order, before the engine's own next one.
async fn a_subscription_reads_what_another_process_appended_between_its_own_commits(db: Db) {
    let (h, _) = harness(
        &db,
        &AgentOptions::default(),
        vec![Step::say("Hello."), Step::say("Second answer.")],
    )
    .await;
    let s = h.start_conversation("hi").await;
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    let stored = h.events(&s.id).await.len();
    let mut sub = h.engine.subscribe(&s.id, 0).await.unwrap();
    let first = next_events(&mut sub, stored).await;
    // Another process (its own pool, nothing shared with this engine) appends, and at once
    // this engine records a user message: its commit follows the unheard one.
    let other = db.ledger(&h.clock).await;
    other
        .append_session_event(
            &s.id,
            phrony_ledger::NewEvent::new(
                "session.principal",
                "ops",
                json!({"claims": {"team": "ops"}}),
            ),
        )
        .await
        .unwrap();
    let emad = phrony_ledger::Attribution::unverified("emad");
    assert_eq!(
        h.engine
            .send_user_message(&s.id, &emad, "again")
            .await
            .unwrap(),
        Some(2)
    );
    let next = next_events(&mut sub, 2).await;
    assert_eq!(
        next.iter()
            .map(|e| (e.seq, e.event_type.as_str()))
            .collect::<Vec<_>>(),
        [
            (first.len() as u64 + 1, "session.principal"),
            (first.len() as u64 + 2, "message.user"),
        ]
    );
    // The turn runs to its end; everything delivered is the log, gap-free.
    for _ in 0..1000 {
        if h.script.requests().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    let log = h.events(&s.id).await;
    let rest = next_events(&mut sub, log.len() - first.len() - next.len()).await;
    let delivered: Vec<_> = first.into_iter().chain(next).chain(rest).collect();
    assert_eq!(delivered, log);
}

macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Db::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if let Some(db) = super::Db::postgres().await {
                        super::$case(db).await;
                    }
                }
            )*
        }
    };
}

on_both_backends!(
    the_refund_tutorial_runs_on_the_ledger,
    quorum_and_cancel_on_the_ledger,
    a_timeout_default_applies_from_the_stored_expiry,
    a_pending_approval_survives_a_restart,
    a_conversation_with_rejection_revalidation_and_invalid_args,
    a_late_result_settles_a_call_marked_indeterminate,
    a_crash_after_the_final_completion_does_not_ask_the_model_again,
    a_subscription_reads_what_another_process_appended_between_its_own_commits,
);

/// A revalidated edit that still needs approval opens a fresh approval about the *edited*
/// arguments, and approving it dispatches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revalidated_edit_needing_approval_dispatches_the_edit() {
    let db = Db::sqlite();
    let (h, _ledger) = harness(
        &db,
        &AgentOptions::with_decision("    on_modify: revalidate\n"),
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Done."),
        ],
    )
    .await;
    let s = h.start("Refund €400 for ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let first = h.pending_approval(&s.id).await;
    let vote = phrony_ledger::Vote {
        edited_args: Some(refund("ORD-1", 300.0)),
        ..approve("alice", "partial refund")
    };
    h.engine
        .vote(VoteTarget::Approval(first.id), vote)
        .await
        .unwrap();
    let second = loop {
        let pending: Vec<_> = h
            .store
            .session_approvals(&s.id)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.status == ApprovalStatus::Pending)
            .collect();
        if let Some(a) = pending.into_iter().next() {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        second.args["amount"],
        json!(300.0),
        "approvers see the edit"
    );
    h.engine
        .vote(VoteTarget::Approval(second.id), approve("bob", "ok"))
        .await
        .unwrap();
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    assert_eq!(
        h.worker.invoked("payments.issue-refund")[0].args["amount"],
        json!(300.0)
    );
}
