//! Conformance cases for user messages queued for the replica driving a session (issue #20,
//! migration 0019): two ledger handles on one database play two replicas.

use std::time::Duration as StdDuration;

use chrono::Duration;
use phrony_auth::{Attribution, Verification};
use phrony_ledger::{LedgerError, SessionStatus, StatusChange};

use crate::harness::TestDb;
use crate::lease_cases::{Clock, contents, fenced, granted, replica};
use crate::session_cases::{deploy_agent, refund_agent, start};

const TTL: StdDuration = StdDuration::from_secs(10);

fn emad() -> Attribution {
    Attribution {
        actor: "emad".to_owned(),
        verification: Verification::Token,
        via: Some("support-ui".to_owned()),
    }
}

/// A message sent to a replica that does not drive the session is queued (bounded, announced
/// on PostgreSQL), and the driving replica moves it into the stream exactly once, with its
/// turn, in the transaction that takes it off the queue; a replica that lost the lease cannot
/// take it (fenced: it stays queued for the new driver); a session that ends drops its queue.
pub(crate) async fn user_messages_queue_for_the_driving_replica_and_are_recorded_once(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let s = start(&a, &v).await;
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    let mut listener = a.listen_replicas().await.unwrap();

    // Bad input and unknown sessions queue nothing.
    assert!(matches!(
        b.queue_user_message(&s.id, &emad(), "  ", 8).await,
        Err(LedgerError::InvalidArgument { .. })
    ));
    assert!(matches!(
        b.queue_user_message(&s.id, &Attribution::unverified(" "), "hi", 8)
            .await,
        Err(LedgerError::InvalidArgument { .. })
    ));
    assert!(matches!(
        b.queue_user_message("run_unknown", &emad(), "hi", 8).await,
        Err(LedgerError::NotFound { .. })
    ));

    // Two fit the bound of two; the third is refused and not queued.
    let first = b
        .queue_user_message(&s.id, &emad(), "hello", 2)
        .await
        .unwrap();
    let second = b
        .queue_user_message(&s.id, &Attribution::unverified("user"), "second", 2)
        .await
        .unwrap();
    assert!(second > first);
    match b.queue_user_message(&s.id, &emad(), "third", 2).await {
        Err(LedgerError::ResourceExhausted { message }) => {
            assert!(message.contains("at most 2 may wait"), "{message}");
        }
        other => panic!("expected ResourceExhausted, got {other:?}"),
    }
    if let Some(listener) = listener.as_mut() {
        let wake = tokio::time::timeout(StdDuration::from_secs(10), listener.recv())
            .await
            .expect("the queued message is announced")
            .unwrap();
        assert_eq!(wake, phrony_ledger::Wake::Session(s.id.clone()));
    } else {
        assert_eq!(db.kind, phrony_ledger::Backend::Sqlite);
    }
    let queued = a.queued_user_messages(&s.id).await.unwrap();
    assert_eq!(
        queued
            .iter()
            .map(|m| (
                m.id,
                m.actor.clone(),
                m.content.as_str(),
                m.queued_by.as_str()
            ))
            .collect::<Vec<_>>(),
        [
            (first, emad(), "hello", "replica-b"),
            (
                second,
                Attribution::unverified("user"),
                "second",
                "replica-b"
            ),
        ]
    );
    assert!(contents(&a, &s.id).await.is_empty());

    // The driver takes the first: recorded once, with its turn and actor; taking it again
    // writes nothing.
    let event = a
        .accept_user_message(&s.id, first, 2)
        .await
        .unwrap()
        .expect("queued");
    assert_eq!(event.event_type, "message.user");
    assert_eq!(event.turn, Some(2));
    assert_eq!(event.actor, "emad");
    assert_eq!(a.accept_user_message(&s.id, first, 2).await.unwrap(), None);
    assert_eq!(contents(&a, &s.id).await, ["hello"]);
    assert_eq!(a.queued_user_messages(&s.id).await.unwrap().len(), 1);

    // A takes over; the old driver's take is fenced and the message stays for the new one.
    clock.advance(Duration::seconds(11));
    assert_eq!(
        granted(b.acquire_session_lease(&s.id, TTL).await.unwrap()),
        2
    );
    fenced(a.accept_user_message(&s.id, second, 3).await, &s.id, 1);
    assert_eq!(a.queued_user_messages(&s.id).await.unwrap().len(), 1);
    assert!(
        b.accept_user_message(&s.id, second, 3)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(contents(&b, &s.id).await, ["hello", "second"]);

    // A session that ends drops what is still queued, and queues nothing more.
    b.queue_user_message(&s.id, &emad(), "late", 8)
        .await
        .unwrap();
    b.set_session_status(&s.id, StatusChange::to(SessionStatus::Cancelled))
        .await
        .unwrap();
    assert!(b.queued_user_messages(&s.id).await.unwrap().is_empty());
    assert!(matches!(
        b.queue_user_message(&s.id, &emad(), "after", 8).await,
        Err(LedgerError::FailedPrecondition { .. })
    ));
    assert!(b.verify_stream(&s.id).await.unwrap().violation.is_none());
}
