//! Bounds on what clients may ask for, in memory: user messages waiting in one conversation
//! (`max_queued_user_messages`) and live sessions of one agent (`max_sessions_per_agent`). Past
//! either the request is `ResourceExhausted`, names the bound and its variable, and records
//! nothing; the refusal lasts only as long as the backlog.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{DEFAULT_MAX_QUEUED_USER_MESSAGES, ErrorKind};
use phrony_ledger::{Attribution, SessionStatus};
use tokio::sync::Notify;

/// The texts of a session's `message.user` events, in order.
async fn user_messages(h: &Harness, id: &str) -> Vec<String> {
    h.events(id)
        .await
        .into_iter()
        .filter(|e| e.event_type == "message.user")
        .map(|e| e.payload["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn user_messages_past_the_waiting_bound_are_refused_and_not_recorded() {
    assert_eq!(DEFAULT_MAX_QUEUED_USER_MESSAGES, 32);
    let config = phrony_engine::EngineConfig {
        max_queued_user_messages: 2,
        ..test_config()
    };
    let gate = Arc::new(Notify::new());
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![
            Step::say("answer 1").gated(gate.clone()),
            Step::say("answer 2"),
            Step::say("answer 3"),
            Step::say("answer 4"),
        ],
        config,
    )
    .await;
    let s = h.start_conversation("hi").await;
    // Turn 1 is running (its model call waits at the gate): its message no longer waits.
    for _ in 0..500 {
        if !h.script.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.script.requests().len(), 1, "turn 1 started");
    let emad = Attribution::unverified("emad");
    for (text, turn) in [("second", 2), ("third", 3)] {
        assert_eq!(
            h.engine
                .send_user_message(&s.id, &emad, text)
                .await
                .unwrap(),
            Some(turn)
        );
    }
    let err = h
        .engine
        .send_user_message(&s.id, &emad, "fourth")
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ResourceExhausted);
    assert_eq!(
        err.message,
        format!(
            "session {} has 2 user messages waiting for their turn; at most 2 may wait \
             (RUNTIME_MAX_QUEUED_USER_MESSAGES), so this one was not recorded: send it after \
             the session answered",
            s.id
        )
    );
    assert_eq!(
        user_messages(&h, &s.id).await,
        ["hi", "second", "third"],
        "the refused message was not recorded"
    );

    // Once the backlog is answered the session takes messages again, numbered on.
    gate.notify_one();
    for _ in 0..500 {
        if h.script.requests().len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert_eq!(
        h.engine
            .send_user_message(&s.id, &emad, "fourth")
            .await
            .unwrap(),
        Some(4)
    );
    for _ in 0..500 {
        if h.script.requests().len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert_eq!(
        user_texts(&h.script.requests()[3]),
        ["hi", "second", "third", "fourth"]
    );
}

#[tokio::test]
async fn a_start_past_the_live_sessions_of_its_agent_is_refused_and_creates_nothing() {
    let config = phrony_engine::EngineConfig {
        max_sessions_per_agent: Some(2),
        ..test_config()
    };
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![Step::say("one"), Step::say("two"), Step::say("three")],
        config,
    )
    .await;
    // Two parked conversations are live sessions of the agent.
    let first = h.start_conversation("first").await;
    h.wait(&first.id, &[SessionStatus::AwaitingInput]).await;
    let second = h.start_conversation("second").await;
    h.wait(&second.id, &[SessionStatus::AwaitingInput]).await;

    let err = h
        .engine
        .start_session(
            h.start_request(serde_json::json!("third"), phrony_engine::SessionMode::Task),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ResourceExhausted);
    assert_eq!(
        err.message,
        "agent support/refund-agent has 2 live sessions (created and not yet ended); at most 2 \
         may be live at once, so no session was started (RUNTIME_MAX_SESSIONS_PER_AGENT); retry \
         when some have ended"
    );
    assert_eq!(
        h.script.requests().len(),
        2,
        "no model call for the refused start"
    );
    assert_eq!(
        h.store
            .ledger()
            .live_sessions_of_agent(&phrony_ledger::AgentRef::new("support", "refund-agent"))
            .await
            .unwrap(),
        2
    );

    // An ended session frees its slot.
    h.engine
        .complete_session(&first.id, &Attribution::unverified("emad"))
        .await
        .unwrap();
    let third = h.start("third").await;
    assert_eq!(h.wait_end(&third.id).await.status, SessionStatus::Completed);
}

#[tokio::test]
async fn after_a_restart_only_messages_whose_turn_has_not_started_count() {
    let config = phrony_engine::EngineConfig {
        max_queued_user_messages: 1,
        ..test_config()
    };
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![Step::say("answer 1")],
        config.clone(),
    )
    .await;
    let s = h.start_conversation("hi").await;
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    h.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;

    // A new engine over the same store: turn 1 ran before the restart, so nothing waits and
    // the parked conversation takes its next message at once.
    let script = Script::new(vec![Step::say("answer 2")]);
    let engine = phrony_engine::Engine::new(phrony_engine::EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: Arc::new(ScriptedFactory(script.clone())),
        clock: h.clock.clone(),
        config,
    });
    let report = engine.recover().await.unwrap();
    assert_eq!(report.resumed, std::slice::from_ref(&s.id));
    let emad = Attribution::unverified("emad");
    assert_eq!(
        engine
            .send_user_message(&s.id, &emad, "second")
            .await
            .unwrap(),
        Some(2)
    );
    for _ in 0..500 {
        if script.requests().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(user_texts(&script.requests()[0]), ["hi", "second"]);
    engine.shutdown();
}
