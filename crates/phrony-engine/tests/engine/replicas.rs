//! Session leases in the engine (issue #20, several replicas on one database): a driver holds
//! its session's lease, and one whose lease another replica took over stops at its next write
//! — refused by the fence — without failing the session or recording anything.

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use phrony_engine::{EngineConfig, LedgerStore};
use phrony_ledger::{Attribution, LeaseClaim, SessionStatus};

fn with_leases() -> EngineConfig {
    EngineConfig {
        // Renewed once at start, then not within the test: the manual clock expires it.
        session_lease_ttl: Some(Duration::from_secs(3600)),
        // The call's deadline must not pass when the test moves the clock past the lease.
        exec_timeout: Duration::from_secs(86_400),
        ..test_config()
    }
}

#[tokio::test]
async fn a_driver_whose_lease_was_taken_over_stops_at_its_next_write_and_records_nothing() {
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![
            Step::call("lookup_order", serde_json::json!({"order_id": "ORD-1"})),
            Step::say("Done."),
        ],
        with_leases(),
    )
    .await;
    h.worker.set_behaviour(Behaviour::Hold);
    let s = h.start("Check ORD-1.").await;
    let mut held = None;
    for _ in 0..3000 {
        held = h.worker.invoked("orders.lookup-order").pop();
        if held.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Some(held) = held else {
        panic!(
            "the call never reached the worker within 30 s: {:?}",
            h.event_types(&s.id).await
        );
    };
    let ledger = h.store.ledger();
    let lease = ledger.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!(lease.owner.as_deref(), Some(ledger.replica_id()));
    assert_eq!(lease.epoch, 1);
    let before = h.event_types(&s.id).await;

    // The lease runs out (this replica stalled) and another replica takes the session over.
    h.clock.advance(Duration::from_secs(2 * 3600));
    let other = ledger.clone().with_replica_id("replica-b").unwrap();
    match other
        .acquire_session_lease(&s.id, Duration::from_secs(3600))
        .await
        .unwrap()
    {
        LeaseClaim::Granted(lease) => assert_eq!(lease.epoch, 2),
        LeaseClaim::Held(lease) => panic!("the expired lease must be taken: {lease:?}"),
    }

    // The worker answers here: recording its result is refused by the fence, the driver stops
    // and the session is left to the replica that took it over.
    let fenced = phrony_metrics::LEDGER_FENCED_WRITES.get();
    h.worker.release(held);
    for _ in 0..500 {
        if !h.engine.is_driven(&s.id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!h.engine.is_driven(&s.id), "the fenced driver stopped");
    assert!(phrony_metrics::LEDGER_FENCED_WRITES.get() > fenced);
    let session = h.store.get_session(&s.id).await.unwrap();
    assert!(
        !session.status.is_terminal() && session.status != SessionStatus::Failed,
        "not failed: {:?}",
        session.status
    );
    assert_eq!(h.event_types(&s.id).await, before, "nothing recorded");
    // Its lease stays the other replica's.
    let lease = ledger.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_deref(), lease.epoch),
        (Some("replica-b"), 2)
    );
}

/// A user message sent to a replica that does not drive the conversation is queued for the
/// driving one (not refused, as before), which records it once with the next turn and answers
/// it; a local message afterwards gets the turn after it. (SQLite here: no NOTIFY, so the
/// driver's safety-net re-read takes it; the PostgreSQL announcement is the e2e test's.)
#[tokio::test]
async fn a_user_message_sent_to_another_replica_is_queued_and_recorded_by_the_driver() {
    let h = Harness::memory_with(
        &AgentOptions::default(),
        vec![
            Step::say("Hello."),
            Step::say("Second answer."),
            Step::say("Third answer."),
        ],
        with_leases(),
    )
    .await;
    let s = h.start_conversation("hi").await;
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;

    // Replica B: another engine on the same database; it does not drive the session.
    let ledger_b = h
        .store
        .ledger()
        .clone()
        .with_replica_id("replica-b")
        .unwrap();
    let b = phrony_engine::Engine::new(phrony_engine::EngineDeps {
        store: std::sync::Arc::new(phrony_engine::LedgerStore::new(ledger_b, Some(cipher()))),
        router: None,
        providers: std::sync::Arc::new(ScriptedFactory(Script::new(vec![]))),
        clock: h.clock.clone(),
        config: with_leases(),
    });
    assert!(!b.is_driven(&s.id));
    let emad = phrony_ledger::Attribution::unverified("emad");
    assert_eq!(
        b.send_user_message(&s.id, &emad, "second").await.unwrap(),
        None,
        "queued for the driving replica"
    );
    for _ in 0..3000 {
        if h.script.requests().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        h.script.requests().len(),
        2,
        "the queued message was answered"
    );
    h.wait(&s.id, &[SessionStatus::AwaitingInput]).await;
    assert!(
        h.store
            .ledger()
            .queued_user_messages(&s.id)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        h.engine
            .send_user_message(&s.id, &emad, "third")
            .await
            .unwrap(),
        Some(3)
    );
    for _ in 0..3000 {
        if h.script.requests().len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let users: Vec<(Option<u32>, String, String)> = h
        .store
        .ledger()
        .events_after(&s.id, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "message.user")
        .map(|e| {
            (
                e.turn,
                e.actor.clone(),
                e.payload["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        users,
        [
            (Some(1), users[0].1.clone(), "hi".to_owned()),
            (Some(2), "emad".to_owned(), "second".to_owned()),
            (Some(3), "emad".to_owned(), "third".to_owned()),
        ]
    );
    b.shutdown();
}

/// A takeover acquires the expired lease once (epoch + 1) and the driver it starts takes that
/// lease: it does not acquire again, whose new epoch would fence what the taking replica
/// records meanwhile (an operator's cancel refused as fenced, seen as `Internal`).
#[tokio::test]
async fn a_takeover_acquires_the_lease_once_and_the_taking_replicas_writes_are_not_refused() {
    let config = EngineConfig {
        // Scans every ~0.5 s of real time; the manual clock alone expires the lease.
        session_lease_ttl: Some(Duration::from_secs(1)),
        // The driver holds its lease while it waits for the approval.
        park_approval_waits: false,
        ..test_config()
    };
    let steps = || {
        vec![
            Step::call("issue_refund", refund("ORD-1", 400.0)),
            Step::say("Done."),
        ]
    };
    let a = Harness::memory_with(&AgentOptions::default(), steps(), config.clone()).await;
    let s = a.start("Refund €400 for ORD-1.").await;
    a.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let ledger = a.store.ledger().clone();
    let lease = ledger.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_deref(), lease.epoch),
        (Some(ledger.replica_id()), 1)
    );
    // Replica A dies holding the lease; it runs out.
    a.engine.shutdown();
    assert!(a.engine.drained(Duration::from_secs(10)).await);
    a.clock.advance(Duration::from_secs(60));

    let b_store = Arc::new(LedgerStore::new(
        ledger.clone().with_replica_id("replica-b").unwrap(),
        Some(cipher()),
    ));
    let b = Harness::on_with(
        b_store,
        a.clock.clone(),
        a.agent.clone(),
        a.version_id,
        Script::new(steps()),
        config,
    )
    .await;
    let mut driven = false;
    for _ in 0..3000 {
        driven = b.engine.is_driven(&s.id);
        if driven {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(driven, "replica B took the session over within 30 s");

    // Right after the takeover, an operator cancels on the taking replica: never fenced.
    let cancelled = b
        .engine
        .cancel_session(&s.id, &Attribution::unverified("emad".to_owned()))
        .await
        .unwrap();
    assert_eq!(cancelled.status, SessionStatus::Cancelled);
    for _ in 0..1000 {
        if !b.engine.is_driven(&s.id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!b.engine.is_driven(&s.id), "the cancelled driver stopped");
    // One acquisition for the takeover: epoch 2, released by the driver that held it.
    let lease = ledger.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!((lease.owner.as_deref(), lease.epoch), (None, 2));
}
