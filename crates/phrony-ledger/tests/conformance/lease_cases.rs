//! Conformance cases for session leases and fencing (issue #20, several replicas on one
//! database): two ledger handles on one database play two replicas, on one manual clock.

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use phrony_ledger::{
    ApprovalStatus, ApprovalTimeout, LeaseClaim, Ledger, LedgerClock, LedgerError, LedgerOptions,
    NewEvent, SessionStatus, StatusChange, TimeoutDefault,
};
use serde_json::json;

use crate::harness::TestDb;
use crate::session_cases::{
    completion_event, deploy_agent, pending_approval, refund_agent, refund_call, start,
};

const TTL: StdDuration = StdDuration::from_secs(10);

/// A clock the test moves.
#[derive(Clone)]
pub(crate) struct Clock(Arc<Mutex<DateTime<Utc>>>);

impl Clock {
    pub(crate) fn new() -> Self {
        Self(Arc::new(Mutex::new(Utc::now())))
    }

    pub(crate) fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }

    fn ledger_clock(&self) -> LedgerClock {
        let now = Arc::clone(&self.0);
        LedgerClock::new(move || *now.lock().unwrap())
    }
}

/// A replica: its own pool on the test database, named `id`, on `clock`.
pub(crate) async fn replica(db: &TestDb, clock: &Clock, id: &str) -> Ledger {
    let ledger = Ledger::connect_with(
        &db.url,
        LedgerOptions {
            clock: clock.ledger_clock(),
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap()
    .with_replica_id(id)
    .unwrap();
    ledger.migrate().await.unwrap();
    ledger
}

fn note(text: &str) -> NewEvent {
    NewEvent::new(
        "message.user",
        "user",
        json!({"role": "user", "content": text}),
    )
}

pub(crate) async fn contents(ledger: &Ledger, session: &str) -> Vec<String> {
    ledger
        .events_after(session, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| {
            e.payload
                .get("content")
                .and_then(|c| c.as_str())
                .map(str::to_owned)
        })
        .collect()
}

#[track_caller]
pub(crate) fn granted(claim: LeaseClaim) -> u64 {
    match claim {
        LeaseClaim::Granted(lease) => lease.epoch,
        LeaseClaim::Held(lease) => panic!("expected the lease granted, it is held: {lease:?}"),
    }
}

#[track_caller]
pub(crate) fn fenced<T: std::fmt::Debug>(
    result: Result<T, LedgerError>,
    session: &str,
    epoch: u64,
) {
    match result {
        Err(LedgerError::Fenced {
            session_id,
            epoch: e,
        }) => {
            assert_eq!((session_id.as_str(), e), (session, epoch));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
}

pub(crate) async fn a_session_lease_is_acquired_renewed_expired_and_taken_over(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let s = start(&a, &v).await;
    assert_eq!(a.session_lease(&s.id).await.unwrap(), None);

    // A takes it; B is refused while it is held, renewed or not expired.
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    match b.acquire_session_lease(&s.id, TTL).await.unwrap() {
        LeaseClaim::Held(lease) => {
            assert_eq!(lease.owner.as_deref(), Some("replica-a"));
            assert_eq!(lease.epoch, 1);
        }
        other => panic!("B must not get A's lease: {other:?}"),
    }
    clock.advance(Duration::seconds(8));
    let renewal = a.renew_session_leases(TTL).await.unwrap();
    assert_eq!(
        (renewal.renewed, renewal.lost),
        (vec![s.id.clone()], vec![])
    );
    clock.advance(Duration::seconds(8));
    assert!(
        matches!(
            b.acquire_session_lease(&s.id, TTL).await.unwrap(),
            LeaseClaim::Held(_)
        ),
        "a renewed lease is not expired 16 s after it was taken"
    );
    assert!(b.expired_session_leases(10).await.unwrap().is_empty());
    a.append_session_event(&s.id, note("a, epoch 1"))
        .await
        .unwrap();

    // A stalls past its TTL: the lease is listed for takeover and B takes it at epoch 2.
    clock.advance(Duration::seconds(11));
    let expired = b.expired_session_leases(10).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(
        (
            expired[0].session_id.as_str(),
            expired[0].owner.as_deref(),
            expired[0].epoch
        ),
        (s.id.as_str(), Some("replica-a"), 1)
    );
    assert_eq!(
        granted(b.acquire_session_lease(&s.id, TTL).await.unwrap()),
        2
    );
    assert!(b.expired_session_leases(10).await.unwrap().is_empty());

    // A's late writes are refused, whole: neither the raw append nor a status change with its
    // event and projection leaves anything.
    fenced(
        a.append_session_event(&s.id, note("a, late")).await,
        &s.id,
        1,
    );
    fenced(
        a.set_session_status(&s.id, StatusChange::to(SessionStatus::AwaitingTool))
            .await,
        &s.id,
        1,
    );
    assert_eq!(
        b.get_session(&s.id).await.unwrap().status,
        SessionStatus::Running
    );
    // Its renewal reports the loss; its writes stay refused afterwards.
    let renewal = a.renew_session_leases(TTL).await.unwrap();
    assert_eq!(
        (renewal.renewed, renewal.lost),
        (vec![], vec![(s.id.clone(), 1)])
    );
    fenced(
        a.append_session_event(&s.id, note("a, later")).await,
        &s.id,
        1,
    );
    b.append_session_event(&s.id, note("b, epoch 2"))
        .await
        .unwrap();
    assert_eq!(contents(&b, &s.id).await, ["a, epoch 1", "b, epoch 2"]);
    assert!(b.verify_stream(&s.id).await.unwrap().violation.is_none());

    // A knows it lost and cannot take it back while B holds it.
    assert!(matches!(
        a.acquire_session_lease(&s.id, TTL).await.unwrap(),
        LeaseClaim::Held(_)
    ));
    // B releases (the session parked): the epoch is kept, the next holder gets 3.
    assert!(
        !b.release_session_lease(&s.id, 1).await.unwrap(),
        "not B's epoch"
    );
    assert!(b.release_session_lease(&s.id, 2).await.unwrap());
    let released = a.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!((released.owner, released.epoch), (None, 2));
    assert!(
        !b.release_session_lease(&s.id, 2).await.unwrap(),
        "released once"
    );
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        3
    );
    a.append_session_event(&s.id, note("a, epoch 3"))
        .await
        .unwrap();
    // B no longer fences the session (a fact it receives is not a driver write).
    b.append_session_event(&s.id, note("b, a fact"))
        .await
        .unwrap();
    assert!(a.verify_stream(&s.id).await.unwrap().violation.is_none());
}

pub(crate) async fn a_replica_reacquiring_its_own_lease_fences_its_older_driver(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let s = start(&a, &v).await;
    let other = start(&a, &v).await;
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    assert_eq!(
        granted(a.acquire_session_lease(&other.id, TTL).await.unwrap()),
        1
    );
    // The same process restarted under the same id (a new handle): it takes its own lease
    // at once, and the handle of the earlier life is fenced.
    let restarted = replica(db, &clock, "replica-a").await;
    assert_eq!(
        granted(restarted.acquire_session_lease(&s.id, TTL).await.unwrap()),
        2
    );
    fenced(
        a.append_session_event(&s.id, note("old life")).await,
        &s.id,
        1,
    );
    restarted
        .append_session_event(&s.id, note("new life"))
        .await
        .unwrap();
    // Its first renewal renews what it drives and frees what only its earlier life held, so
    // another replica takes that session at once instead of after waiting for nobody.
    let renewal = restarted.renew_session_leases(TTL).await.unwrap();
    assert_eq!(
        (renewal.renewed, renewal.lost),
        (vec![s.id.clone()], vec![])
    );
    let freed = restarted.session_lease(&other.id).await.unwrap().unwrap();
    assert_eq!((freed.owner, freed.epoch), (None, 1));
    let b = replica(db, &clock, "replica-b").await;
    assert_eq!(
        granted(b.acquire_session_lease(&other.id, TTL).await.unwrap()),
        2
    );
    // Leases of sessions that do not exist are refused; a zero TTL too.
    assert!(matches!(
        a.acquire_session_lease("run_missing", TTL).await,
        Err(LedgerError::NotFound { .. })
    ));
    assert!(matches!(
        a.acquire_session_lease(&s.id, StdDuration::ZERO).await,
        Err(LedgerError::InvalidArgument { .. })
    ));
    assert!(matches!(
        Ledger::connect(&db.url)
            .await
            .unwrap()
            .with_replica_id("two words"),
        Err(LedgerError::InvalidArgument { .. })
    ));
}

pub(crate) async fn replicas_racing_for_an_expired_lease_get_one_epoch_each(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let mut sessions = Vec::new();
    for _ in 0..8 {
        let s = start(&a, &v).await;
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap());
        sessions.push(s.id);
    }
    clock.advance(Duration::seconds(30));
    let b = replica(db, &clock, "replica-b").await;
    let c = replica(db, &clock, "replica-c").await;
    let take = |ledger: Ledger, ids: Vec<String>| {
        tokio::spawn(async move {
            let mut won = Vec::new();
            for id in ids {
                if let LeaseClaim::Granted(lease) =
                    ledger.acquire_session_lease(&id, TTL).await.unwrap()
                {
                    won.push((id, lease.epoch));
                }
            }
            won
        })
    };
    let (won_b, won_c) = tokio::join!(
        take(b.clone(), sessions.clone()),
        take(c.clone(), sessions.clone())
    );
    let (won_b, won_c) = (won_b.unwrap(), won_c.unwrap());
    assert_eq!(
        won_b.len() + won_c.len(),
        sessions.len(),
        "each expired lease is taken once"
    );
    for (id, epoch) in won_b.iter().chain(&won_c) {
        assert_eq!(*epoch, 2, "session {id}");
        let owner = a.session_lease(id).await.unwrap().unwrap().owner.unwrap();
        let winner = if won_b.iter().any(|(w, _)| w == id) {
            "replica-b"
        } else {
            "replica-c"
        };
        assert_eq!(owner, winner);
        fenced(a.append_session_event(id, note("late")).await, id, 1);
    }
}

pub(crate) async fn replicas_racing_to_expire_an_approval_expire_it_once(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let mut approvals = Vec::new();
    for _ in 0..6 {
        let (s, _, approval) = pending_approval(&a, &v, |n| {
            n.timeout = Some(ApprovalTimeout {
                after_minutes: 5,
                default: TimeoutDefault::Deny,
                escalate_to_route: None,
                escalate_after_minutes: None,
            });
        })
        .await;
        approvals.push((s.id, approval.id));
    }
    clock.advance(Duration::minutes(6));
    let later = Utc::now() + Duration::minutes(60);
    let expire = |ledger: Ledger, ids: Vec<uuid::Uuid>| {
        tokio::spawn(async move {
            let mut expired = 0;
            for id in ids {
                match ledger.expire_approval(id, later).await {
                    Ok(out) => {
                        assert_eq!(out.approval.status, ApprovalStatus::Denied);
                        expired += 1;
                    }
                    Err(LedgerError::FailedPrecondition { message }) => {
                        assert_eq!(message, format!("approval {id} is already denied"));
                    }
                    Err(other) => panic!("{other:?}"),
                }
            }
            expired
        })
    };
    let ids: Vec<_> = approvals.iter().map(|(_, id)| *id).collect();
    let (x, y) = tokio::join!(expire(a.clone(), ids.clone()), expire(b.clone(), ids));
    assert_eq!(
        x.unwrap() + y.unwrap(),
        approvals.len(),
        "each approval expired exactly once"
    );
    for (session, id) in &approvals {
        let decided = a
            .events_after(session, 0, 1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| {
                e.event_type == "approval.decided"
                    && e.payload.get("approval_id").and_then(|x| x.as_str())
                        == Some(id.to_string().as_str())
            })
            .count();
        assert_eq!(decided, 1, "one decision event for approval {id}");
        assert!(a.verify_stream(session).await.unwrap().violation.is_none());
    }
}

/// Renewals running beside acquisitions and releases of the same replica never free a lease
/// acquired a moment ago (its driver's next write would then be refused by the fence and the
/// session stall) nor report one being released as lost (which stops the next driver): the
/// race that stalled sessions under load. Each round drives one session: acquire, write,
/// release, while a task renews in a tight loop.
pub(crate) async fn renewals_beside_acquisitions_never_free_or_lose_a_held_lease(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let mut sessions = Vec::new();
    for _ in 0..16 {
        sessions.push(start(&a, &v).await.id);
    }
    let done = stop_flag();
    let renewer = {
        let a = a.clone();
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut lost = Vec::new();
            let mut renewals = 0_u32;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let renewal = a.renew_session_leases(TTL).await.unwrap();
                lost.extend(renewal.lost);
                renewals += 1;
                tokio::task::yield_now().await;
            }
            (lost, renewals)
        })
    };
    let mut drivers = Vec::new();
    for session in sessions.clone() {
        let a = a.clone();
        drivers.push(tokio::spawn(async move {
            for round in 0..12 {
                let epoch = granted(a.acquire_session_lease(&session, TTL).await.unwrap());
                a.append_session_event(&session, note(&format!("round {round}")))
                    .await
                    .unwrap_or_else(|e| panic!("round {round} at epoch {epoch} refused: {e}"));
                assert!(
                    a.release_session_lease(&session, epoch).await.unwrap(),
                    "round {round}: the lease at epoch {epoch} was freed under its driver"
                );
            }
        }));
    }
    for driver in drivers {
        driver.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let (lost, renewals) = renewer.await.unwrap();
    assert!(renewals > 0);
    assert!(
        lost.is_empty(),
        "no lease was taken over, yet lost: {lost:?}"
    );
    for session in &sessions {
        let lease = a.session_lease(session).await.unwrap().unwrap();
        assert_eq!((lease.owner, lease.epoch), (None, 12));
        assert_eq!(contents(&a, session).await.len(), 12);
    }
}

fn stop_flag() -> Arc<std::sync::atomic::AtomicBool> {
    Arc::new(std::sync::atomic::AtomicBool::new(false))
}

/// A replica hands a session to the replica whose workers serve the tool its call needs: the
/// handlers each replica publishes are found by the others (not by itself) until they expire;
/// the lease released to the target is listed for it at once (and announced on PostgreSQL),
/// for any replica once its deadline passed, and acquired at the next epoch; the handing
/// replica no longer fences the session. (On PostgreSQL, session changes are announced too.)
pub(crate) async fn a_session_is_handed_to_the_replica_whose_workers_serve_its_tool(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let c = replica(db, &clock, "replica-c").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let s = start(&a, &v).await;
    let key = "payments.issue-refund@1.0.0".to_owned();

    b.publish_handlers(&[key.clone(), "orders.lookup-order@1.0.0".into()], TTL)
        .await
        .unwrap();
    assert_eq!(
        a.replica_serving(&key).await.unwrap().as_deref(),
        Some("replica-b")
    );
    assert_eq!(b.replica_serving(&key).await.unwrap(), None, "not itself");
    assert_eq!(a.replica_serving("other.tool@1.0.0").await.unwrap(), None);
    // Published again without the key: withdrawn.
    b.publish_handlers(std::slice::from_ref(&key), TTL)
        .await
        .unwrap();
    assert_eq!(
        a.replica_serving("orders.lookup-order@1.0.0")
            .await
            .unwrap(),
        None
    );
    // Bounds.
    assert!(matches!(
        b.publish_handlers(std::slice::from_ref(&key), StdDuration::ZERO)
            .await,
        Err(LedgerError::InvalidArgument { .. })
    ));

    let mut listener = b.listen_replicas().await.unwrap();
    assert_eq!(
        listener.is_some(),
        db.kind == phrony_ledger::Backend::Postgres
    );
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    // Start-up recovery on b skips what a drives; a does not.
    let ids = [s.id.clone(), "run_unknown".to_owned()];
    assert_eq!(
        b.sessions_leased_elsewhere(&ids).await.unwrap(),
        std::collections::HashSet::from([s.id.clone()])
    );
    assert!(a.sessions_leased_elsewhere(&ids).await.unwrap().is_empty());
    assert!(matches!(
        a.sessions_leased_elsewhere(&vec![s.id.clone(); 1001]).await,
        Err(LedgerError::InvalidArgument { .. })
    ));
    assert!(matches!(
        a.hand_off_session_lease(&s.id, 1, "replica-a", TTL).await,
        Err(LedgerError::InvalidArgument { .. })
    ));
    assert!(
        !a.hand_off_session_lease(&s.id, 7, "replica-b", TTL)
            .await
            .unwrap(),
        "not its epoch"
    );
    assert!(
        a.hand_off_session_lease(&s.id, 1, "replica-b", TTL)
            .await
            .unwrap()
    );
    if let Some(listener) = listener.as_mut() {
        let woke = tokio::time::timeout(StdDuration::from_secs(10), listener.recv())
            .await
            .expect("the handoff is announced to its target")
            .unwrap();
        assert_eq!(woke, phrony_ledger::Wake::HandedOff);
        // A change another replica announces reaches every replica's listener.
        c.announce_session_change(&s.id).await.unwrap();
        let woke = tokio::time::timeout(StdDuration::from_secs(10), listener.recv())
            .await
            .expect("a session change is announced")
            .unwrap();
        assert_eq!(woke, phrony_ledger::Wake::Session(s.id.clone()));
    }
    // The handing replica no longer fences the session (a fact it receives is no driver write).
    a.append_session_event(&s.id, note("a, a fact"))
        .await
        .unwrap();
    assert_eq!(b.handed_off_sessions(10).await.unwrap(), vec![s.id.clone()]);
    assert!(
        c.handed_off_sessions(10).await.unwrap().is_empty(),
        "not c's yet"
    );
    assert!(
        c.sessions_leased_elsewhere(&ids).await.unwrap().is_empty(),
        "released"
    );
    assert!(
        a.expired_session_leases(10).await.unwrap().is_empty(),
        "no expired lease"
    );
    // The target never came: once the deadline passed any replica takes it.
    clock.advance(Duration::seconds(11));
    assert_eq!(c.handed_off_sessions(10).await.unwrap(), vec![s.id.clone()]);
    assert_eq!(
        a.replica_serving(&key).await.unwrap(),
        None,
        "b's list expired"
    );
    // Whoever publishes next deletes the expired lists (of replicas gone for good).
    c.publish_handlers(&[], TTL).await.unwrap();
    assert_eq!(
        db.raw_strings("SELECT replica_id FROM replica_handlers")
            .await,
        Vec::<Vec<Option<String>>>::new()
    );
    assert_eq!(
        granted(b.acquire_session_lease(&s.id, TTL).await.unwrap()),
        2
    );
    assert!(b.handed_off_sessions(10).await.unwrap().is_empty());
    assert!(c.handed_off_sessions(10).await.unwrap().is_empty());
    b.append_session_event(&s.id, note("b, epoch 2"))
        .await
        .unwrap();
    // Released normally afterwards, it is nobody's handoff.
    assert!(b.release_session_lease(&s.id, 2).await.unwrap());
    assert!(c.handed_off_sessions(10).await.unwrap().is_empty());
    assert!(b.verify_stream(&s.id).await.unwrap().violation.is_none());
}

/// A vote is a fact from a person, valid whichever replica records it: it is never refused by
/// the recording replica's lease, also while that lease is stale (its takeover acquisition was
/// superseded by its own driver's, or another replica took the session over). Driver writes
/// of the stale lease stay refused.
pub(crate) async fn votes_are_recorded_whatever_the_recording_replicas_lease(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let (s, _, approval) = pending_approval(&a, &v, |_| {}).await;
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    clock.advance(Duration::seconds(11));
    assert_eq!(
        granted(b.acquire_session_lease(&s.id, TTL).await.unwrap()),
        2
    );
    fenced(
        a.append_session_event(&s.id, note("a, late")).await,
        &s.id,
        1,
    );
    let outcome = a
        .cast_vote(approval.id, crate::session_cases::approve("finance-lead"))
        .await
        .unwrap();
    assert!(outcome.decided);
    assert_eq!(outcome.approval.status, ApprovalStatus::Approved);
    assert!(b.verify_stream(&s.id).await.unwrap().violation.is_none());
}

/// The fence refuses a replica's writes once the epoch moved on, not while the lease it
/// released at that epoch is free: an operator's cancel recorded between the release (the
/// driver stopped, the session parked) and the replica forgetting the lease is no stale driver
/// write. (A second handle under the same id releases the lease here, standing for the release
/// that committed before the first one forgot it.)
pub(crate) async fn a_write_between_a_release_and_the_next_acquisition_is_not_fenced(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let same = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let s = start(&a, &v).await;
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    assert!(same.release_session_lease(&s.id, 1).await.unwrap());
    a.append_session_event(&s.id, note("a, released"))
        .await
        .unwrap();
    assert_eq!(
        granted(b.acquire_session_lease(&s.id, TTL).await.unwrap()),
        2
    );
    fenced(
        a.append_session_event(&s.id, note("a, taken")).await,
        &s.id,
        1,
    );
    assert_eq!(contents(&b, &s.id).await, ["a, released"]);
}

/// `sessions_leased_elsewhere` reads a page in one statement (SQLite: chunks of bound
/// parameters) and answers what one read per session answered: for a page mixing sessions
/// leased here, elsewhere, expired, released, never leased and unknown ids — with a session
/// leased elsewhere past SQLite's first chunk — exactly those held by another replica and not
/// expired; and that is what each session's stored lease says.
pub(crate) async fn sessions_leased_elsewhere_answers_a_mixed_page_in_one_read(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let here = start(&a, &v).await.id;
    let elsewhere = start(&a, &v).await.id;
    let expired = start(&a, &v).await.id;
    let released = start(&a, &v).await.id;
    let never = start(&a, &v).await.id;
    let far = start(&a, &v).await.id;
    granted(a.acquire_session_lease(&here, TTL).await.unwrap());
    granted(b.acquire_session_lease(&elsewhere, TTL).await.unwrap());
    granted(b.acquire_session_lease(&far, TTL).await.unwrap());
    granted(
        b.acquire_session_lease(&expired, StdDuration::from_secs(1))
            .await
            .unwrap(),
    );
    let epoch = granted(b.acquire_session_lease(&released, TTL).await.unwrap());
    assert!(b.release_session_lease(&released, epoch).await.unwrap());
    clock.advance(Duration::seconds(2));

    let mut page = vec![
        here.clone(),
        elsewhere.clone(),
        expired.clone(),
        released.clone(),
        never.clone(),
        "run_unknown".to_owned(),
    ];
    page.extend((0..993).map(|n| format!("run_filler_{n}")));
    page.push(far.clone());
    assert_eq!(page.len(), 1000);
    let on_a = a.sessions_leased_elsewhere(&page).await.unwrap();
    assert_eq!(
        on_a,
        std::collections::HashSet::from([elsewhere.clone(), far.clone()])
    );
    let on_b = b.sessions_leased_elsewhere(&page).await.unwrap();
    assert_eq!(on_b, std::collections::HashSet::from([here.clone()]));
    // What each session's stored lease says (the read per session this replaces).
    let now = *clock.0.lock().unwrap();
    for (ledger, answer) in [(&a, &on_a), (&b, &on_b)] {
        for id in &page[..6] {
            let lease = ledger.session_lease(id).await.unwrap();
            let held_elsewhere = lease.is_some_and(|l| {
                l.owner.is_some_and(|o| o != ledger.replica_id()) && l.expires_at > now
            });
            assert_eq!(answer.contains(id), held_elsewhere, "{id}");
        }
    }
    assert!(a.sessions_leased_elsewhere(&[]).await.unwrap().is_empty());
    assert!(
        a.sessions_leased_elsewhere(std::slice::from_ref(&far))
            .await
            .unwrap()
            .contains(&far)
    );
}

/// A replica that takes over another's expired lease deletes that replica's published tool
/// handlers in the same transaction (it stopped renewing: killed, paused, cut off), so no call
/// is handed to it for the rest of their TTL — not while it still holds an unexpired lease,
/// not for a lease it released or its own, and never another replica's list.
pub(crate) async fn a_takeover_withdraws_the_dead_replicas_published_handlers(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let c = replica(db, &clock, "replica-c").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let short = start(&a, &v).await.id;
    let long = start(&a, &v).await.id;
    let released = start(&a, &v).await.id;
    let own = start(&a, &v).await.id;
    let b_key = "payments.issue-refund@1.0.0".to_owned();
    let c_key = "orders.lookup-order@1.0.0".to_owned();
    // The handlers outlive the leases here, so only a withdrawal removes them.
    let long_ttl = StdDuration::from_secs(600);
    b.publish_handlers(std::slice::from_ref(&b_key), long_ttl)
        .await
        .unwrap();
    c.publish_handlers(std::slice::from_ref(&c_key), long_ttl)
        .await
        .unwrap();
    granted(
        b.acquire_session_lease(&short, StdDuration::from_secs(5))
            .await
            .unwrap(),
    );
    granted(b.acquire_session_lease(&long, TTL).await.unwrap());
    let epoch = granted(c.acquire_session_lease(&released, TTL).await.unwrap());
    assert!(c.release_session_lease(&released, epoch).await.unwrap());
    granted(
        a.acquire_session_lease(&own, StdDuration::from_secs(5))
            .await
            .unwrap(),
    );
    a.publish_handlers(&["a.tool@1.0.0".to_owned()], long_ttl)
        .await
        .unwrap();
    clock.advance(Duration::seconds(6));

    // b's `short` expired, but b still holds `long` unexpired: b's list stays.
    assert_eq!(
        granted(a.take_over_session_lease(&short, TTL).await.unwrap()),
        2
    );
    assert_eq!(
        a.replica_serving(&b_key).await.unwrap().as_deref(),
        Some("replica-b")
    );
    // A released lease (c is alive) and a's own expired lease withdraw nothing.
    granted(b.take_over_session_lease(&released, TTL).await.unwrap());
    assert_eq!(
        a.replica_serving(&c_key).await.unwrap().as_deref(),
        Some("replica-c")
    );
    granted(a.take_over_session_lease(&own, TTL).await.unwrap());
    assert_eq!(
        b.replica_serving("a.tool@1.0.0").await.unwrap().as_deref(),
        Some("replica-a")
    );
    // b stops renewing for good: once its last lease expired, taking it over withdraws b's
    // list, and nobody else's.
    clock.advance(Duration::seconds(11));
    assert_eq!(
        granted(c.take_over_session_lease(&long, TTL).await.unwrap()),
        2
    );
    assert_eq!(a.replica_serving(&b_key).await.unwrap(), None, "withdrawn");
    assert_eq!(
        a.replica_serving(&c_key).await.unwrap().as_deref(),
        Some("replica-c")
    );
    assert_eq!(
        b.replica_serving("a.tool@1.0.0").await.unwrap().as_deref(),
        Some("replica-a")
    );
    // The replica, back, publishes its list again.
    b.publish_handlers(std::slice::from_ref(&b_key), TTL)
        .await
        .unwrap();
    assert_eq!(
        a.replica_serving(&b_key).await.unwrap().as_deref(),
        Some("replica-b")
    );
}

/// A replica that drives the session it creates takes its lease in the creating transaction
/// (`open_session_leased`): epoch 1, this replica's from the commit on, and its appends fenced
/// by it as by a lease acquired afterwards.
pub(crate) async fn a_session_created_with_its_lease_is_fenced_from_its_first_write(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let (s, claim) = a
        .open_session_leased(
            crate::session_cases::new_session(&v, &[]),
            None,
            Vec::new(),
            TTL,
        )
        .await
        .unwrap();
    assert_eq!(granted(claim), 1);
    assert_eq!(s.status, SessionStatus::Running);
    let lease = b.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_deref(), lease.epoch),
        (Some("replica-a"), 1)
    );
    assert!(a.holds_session_lease(&s.id, 1));
    assert!(matches!(
        b.acquire_session_lease(&s.id, TTL).await.unwrap(),
        LeaseClaim::Held(_)
    ));
    // Renewed like any lease this replica holds, never mistaken for a leftover.
    assert_eq!(
        a.renew_session_leases(TTL).await.unwrap().renewed,
        std::slice::from_ref(&s.id)
    );
    a.append_session_event(&s.id, note("a, epoch 1"))
        .await
        .unwrap();
    // Taken over once it expired: A's next write is refused.
    clock.advance(Duration::seconds(11));
    assert_eq!(
        granted(b.take_over_session_lease(&s.id, TTL).await.unwrap()),
        2
    );
    fenced(
        a.append_session_event(&s.id, note("a, stale")).await,
        &s.id,
        1,
    );
    // Nothing is created (and no lease taken) when the create is refused.
    let mut again = crate::session_cases::new_session(&v, &[]);
    again.id.clone_from(&s.id);
    assert!(matches!(
        a.open_session_leased(again, None, Vec::new(), TTL).await,
        Err(LedgerError::AlreadyExists { .. })
    ));
    let lease = a.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_deref(), lease.epoch),
        (Some("replica-b"), 2)
    );
    assert!(matches!(
        a.open_session_leased(
            crate::session_cases::new_session(&v, &[]),
            None,
            Vec::new(),
            StdDuration::ZERO
        )
        .await,
        Err(LedgerError::InvalidArgument { .. })
    ));
}

/// The transaction that ends a session this replica leases releases the lease with it (the
/// driver stops next): the epoch kept, the owner gone at the commit, no loss reported by a
/// renewal, and the driver's own release is answered without writing. A session ended by a
/// replica that does not lease it leaves the holder's lease to its holder.
pub(crate) async fn a_session_end_releases_the_lease_of_the_replica_that_ends_it(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;

    let s = start(&a, &v).await;
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    a.set_session_status(&s.id, StatusChange::completed(Some(json!({"ok": true}))))
        .await
        .unwrap();
    let lease = b.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner, lease.epoch),
        (None, 1),
        "released with the end"
    );
    assert!(!a.holds_session_lease(&s.id, 1));
    let renewal = a.renew_session_leases(TTL).await.unwrap();
    assert!(
        renewal.lost.is_empty() && renewal.renewed.is_empty(),
        "{renewal:?}"
    );
    assert!(a.release_session_lease(&s.id, 1).await.unwrap());
    assert!(
        !a.release_session_lease(&s.id, 1).await.unwrap(),
        "released once"
    );
    // The next holder gets the next epoch.
    assert_eq!(
        granted(b.acquire_session_lease(&s.id, TTL).await.unwrap()),
        2
    );

    // Cancelled by B, which does not lease it: A's lease stays A's until A's driver releases.
    let s = start(&a, &v).await;
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    b.set_session_status(&s.id, StatusChange::cancelled())
        .await
        .unwrap();
    let lease = a.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_deref(), lease.epoch),
        (Some("replica-a"), 1)
    );
    assert!(a.release_session_lease(&s.id, 1).await.unwrap());
    let lease = a.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!((lease.owner, lease.epoch), (None, 1));

    // A child ended by its parent's end, both leased here: both released in that transaction.
    let parent = start(&a, &v).await;
    let mut child = crate::session_cases::new_session(&v, &[]);
    child.parent_session_id = Some(parent.id.clone());
    let child = a.create_session(child).await.unwrap();
    assert_eq!(
        granted(a.acquire_session_lease(&parent.id, TTL).await.unwrap()),
        1
    );
    assert_eq!(
        granted(a.acquire_session_lease(&child.id, TTL).await.unwrap()),
        1
    );
    a.set_session_status(&parent.id, StatusChange::failed("boom"))
        .await
        .unwrap();
    for id in [&parent.id, &child.id] {
        let lease = b.session_lease(id).await.unwrap().unwrap();
        assert_eq!((lease.owner, lease.epoch), (None, 1), "{id}");
    }
    // A driver that asks after a renewal is still answered; one that never asks (the engine
    // stopping) is forgotten at the second renewal.
    a.renew_session_leases(TTL).await.unwrap();
    assert!(a.release_session_lease(&parent.id, 1).await.unwrap());
    a.renew_session_leases(TTL).await.unwrap();
    assert!(
        !a.release_session_lease(&child.id, 1).await.unwrap(),
        "forgotten: released in the database, nothing held here"
    );
}

/// A transaction that ends a session it leases but does not commit keeps the lease: the
/// release written with the end is rolled back with it, and this replica still holds the
/// lease (renewed, fenced by it, released by its driver), at the same epoch.
pub(crate) async fn an_end_that_does_not_commit_keeps_the_lease(db: &TestDb) {
    let clock = Clock::new();
    let a = replica(db, &clock, "replica-a").await;
    let b = replica(db, &clock, "replica-b").await;
    let v = deploy_agent(&a, &refund_agent(), "0.1.0").await;
    let s = start(&a, &v).await;
    assert_eq!(
        granted(a.acquire_session_lease(&s.id, TTL).await.unwrap()),
        1
    );
    // The step completes the session, then cannot record a call on it: the whole step,
    // the end and its release included, is refused.
    let refused = a
        .record_step(
            &s.id,
            completion_event(0, "tool_use", Vec::new()),
            None,
            Some(StatusChange::completed(None).from(SessionStatus::Running)),
            vec![refund_call(&s.id, 0, 0, 10)],
        )
        .await;
    assert!(
        matches!(refused, Err(LedgerError::FailedPrecondition { .. })),
        "{refused:?}"
    );
    assert_eq!(
        a.get_session(&s.id).await.unwrap().status,
        SessionStatus::Running
    );
    let lease = b.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_deref(), lease.epoch),
        (Some("replica-a"), 1),
        "the release was rolled back with the end"
    );
    assert!(a.holds_session_lease(&s.id, 1));
    let renewal = a.renew_session_leases(TTL).await.unwrap();
    assert!(renewal.lost.is_empty(), "{renewal:?}");
    assert_eq!(renewal.renewed.len(), 1, "{renewal:?}");
    assert!(matches!(
        b.acquire_session_lease(&s.id, TTL).await.unwrap(),
        LeaseClaim::Held(_)
    ));
    // The session goes on under this replica's lease, and ends releasing it.
    a.set_session_status(
        &s.id,
        StatusChange::completed(None).from(SessionStatus::Running),
    )
    .await
    .unwrap();
    let lease = b.session_lease(&s.id).await.unwrap().unwrap();
    assert_eq!((lease.owner, lease.epoch), (None, 1));
    assert!(a.release_session_lease(&s.id, 1).await.unwrap());
}
