//! The Work-stream protocol: leases, disconnects, late and foreign results, re-registration,
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]
//! nacks, durable acknowledgement and malformed messages.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use async_trait::async_trait;
use phrony_dispatch::{
    CompletedCalls, DispatchError, DispatchFailure, DispatchJournal, FromWorker, HandlerAd,
    HookError, Invocation, LateOutcome, LateReason, Router, RouterConfig, RouterEvent, StatusClass,
    ToWorker, ToolError, ToolOutcome, WorkerHello, WorkerLost, WorkerProvenance,
};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;

fn spawn_call(
    router: &Router,
    id: &str,
) -> tokio::task::JoinHandle<Result<phrony_dispatch::Completion, DispatchFailure>> {
    let router = router.clone();
    let c = call(id);
    tokio::spawn(async move { router.dispatch(c).await })
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_the_lease_and_silence_expires_it() {
    let (router, recorder) = recording_router(RouterConfig::default());
    let mut alive = FakeWorker::simple(&router, "alive", 1).await;
    let mut silent = FakeWorker::simple(&router, "silent", 1).await;
    // No execution deadline: the call outlives every lease below.
    let running = tokio::spawn({
        let router = router.clone();
        let mut c = call("c1");
        c.exec_timeout = None;
        async move { router.dispatch(c).await }
    });
    // Registration order: the call runs on "alive"; give "silent" one too.
    assert_eq!(alive.expect_invoke().await.call_id, "c1");
    let stranded = spawn_call(&router, "c2");
    assert_eq!(silent.expect_invoke().await.call_id, "c2");
    let started = Instant::now();

    // "alive" heartbeats every 15s (ttl/2, as the SDK does) for two minutes.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(15)).await;
        alive.heartbeat().unwrap();
        assert_eq!(alive.next().await, Some(ToWorker::HeartbeatAck));
    }

    // "silent" was dropped when its lease ran out at 30s; its call is indeterminate.
    let err = stranded.await.unwrap().unwrap_err();
    match &err {
        DispatchFailure::Indeterminate { worker, reason, .. } => {
            assert_eq!(worker.worker_id, "silent");
            assert_eq!(*reason, WorkerLost::LeaseExpired);
        }
        other => panic!("expected Indeterminate, got {other:?}"),
    }
    assert!(err.outcome_unknown());
    assert_eq!(err.code(), "indeterminate");
    let removed = recorder.take().into_iter().find_map(|e| match e {
        RouterEvent::WorkerRemoved {
            worker_id,
            reason,
            indeterminate,
        } => Some((worker_id, reason, indeterminate)),
        _ => None,
    });
    assert_eq!(
        removed,
        Some(("silent".into(), WorkerLost::LeaseExpired, vec!["c2".into()]))
    );
    // Its stream ends with the reason; a late heartbeat is refused the same way.
    let expected = DispatchError::LeaseExpired {
        worker_id: "silent".into(),
        lease_ttl_ms: 30_000,
    };
    assert_eq!(silent.outbox.recv().await, Some(Err(expected.clone())));
    assert_eq!(silent.outbox.recv().await, None);
    assert_eq!(silent.heartbeat(), Err(expected.clone()));
    assert_eq!(expected.status(), StatusClass::Aborted);

    let snap = router.snapshot();
    assert_eq!(
        snap.workers
            .iter()
            .map(|w| w.worker_id.as_str())
            .collect::<Vec<_>>(),
        ["alive"]
    );
    assert_eq!(started.elapsed(), Duration::from_secs(120));
    alive.succeed("c1", json!({})).unwrap();
    running.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn lease_expiry_is_exact() {
    let router = router();
    let worker = FakeWorker::simple(&router, "w1", 1).await;
    tokio::time::sleep(Duration::from_millis(29_999)).await;
    settle().await;
    assert_eq!(router.snapshot().workers.len(), 1);
    tokio::time::sleep(Duration::from_millis(1)).await;
    settle().await;
    assert!(router.snapshot().workers.is_empty());
    drop(worker);
}

#[tokio::test(start_paused = true)]
async fn a_worker_stream_ending_mid_call_makes_the_call_indeterminate() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let handle = spawn_call(&router, "c1");
    worker.expect_invoke().await;
    let FakeWorker { conn, mut outbox } = worker;
    conn.disconnect();
    let err = handle.await.unwrap().unwrap_err();
    assert!(
        matches!(&err, DispatchFailure::Indeterminate { reason: WorkerLost::StreamEnded, worker, .. } if worker.worker_id == "w1"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "outcome of tool {TOOL}@{VERSION} is unknown: worker \"w1\" was lost because its Work stream ended"
        )
    );
    // A normal end: no error status.
    assert_eq!(outbox.recv().await, None);
    assert!(router.snapshot().workers.is_empty());
}

#[tokio::test(start_paused = true)]
async fn unknown_results_are_acknowledged_and_reported_without_ending_the_stream() {
    // Without an observer the router acknowledges at once.
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    worker.succeed("never-dispatched", json!({"x": 1})).unwrap();
    assert_eq!(
        worker.next().await,
        Some(ToWorker::ResultAck {
            call_id: "never-dispatched".into()
        })
    );
    worker.nack("also-unknown").unwrap();
    assert_eq!(
        worker.next().await,
        Some(ToWorker::ResultAck {
            call_id: "also-unknown".into()
        })
    );
    worker.heartbeat().unwrap();
    assert_eq!(worker.next().await, Some(ToWorker::HeartbeatAck));

    // With an observer the ack waits for the observer.
    let (router, recorder) = recording_router(RouterConfig::default());
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    recorder.take();
    worker.succeed("old-call", json!({"x": 1})).unwrap();
    worker.expect_nothing().await;
    let mut events = recorder.take();
    assert_eq!(events.len(), 1);
    let RouterEvent::LateResult(late) = events.remove(0) else {
        panic!("expected a late result")
    };
    assert_eq!(late.worker_id, "w1");
    assert_eq!(late.call_id, "old-call");
    assert_eq!(late.reason, LateReason::Unknown);
    assert_eq!(
        late.outcome,
        LateOutcome::Result(ToolOutcome::Success(json!({"x": 1})))
    );
    assert!(late.ack.ack());
    assert_eq!(
        worker.next().await,
        Some(ToWorker::ResultAck {
            call_id: "old-call".into()
        })
    );
    // The worker keeps serving.
    let handle = spawn_call(&router, "c1");
    worker.expect_invoke().await;
    worker.succeed("c1", json!({})).unwrap();
    handle.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_result_from_a_worker_that_does_not_own_the_call_is_ignored() {
    let (router, recorder) = recording_router(RouterConfig::default());
    let mut owner = FakeWorker::simple(&router, "owner", 1).await;
    let mut other = FakeWorker::simple(&router, "other", 1).await;
    let handle = spawn_call(&router, "c1");
    owner.expect_invoke().await;

    other.succeed("c1", json!({"forged": true})).unwrap();
    other.expect_nothing().await;
    let events = recorder.take();
    assert!(
        events.iter().any(
            |e| matches!(e, RouterEvent::ForeignResult { worker_id, call_id, owner }
            if worker_id == "other" && call_id == "c1" && owner == "owner")
        ),
        "{events:?}"
    );
    assert!(!handle.is_finished(), "the forged result was not applied");
    other.heartbeat().unwrap();
    assert_eq!(other.next().await, Some(ToWorker::HeartbeatAck));

    owner.succeed("c1", json!({"real": true})).unwrap();
    let done = handle.await.unwrap().unwrap();
    assert_eq!(done.outcome, ToolOutcome::Success(json!({"real": true})));
    assert_eq!(done.worker.worker_id, "owner");
}

#[tokio::test(start_paused = true)]
async fn re_registering_keeps_in_flight_calls_and_drops_the_rest() {
    let (router, recorder) = recording_router(RouterConfig::default());
    let mut first = FakeWorker::simple(&router, "w1", 2).await;
    let kept = spawn_call(&router, "c1");
    let dropped = spawn_call(&router, "c2");
    assert_eq!(first.invokes().await.len(), 2);
    recorder.take();

    // The worker reconnects on a new stream while the old one is not yet seen as dead.
    let mut second = FakeWorker::connect(
        &router,
        WorkerHello {
            in_flight: vec!["c1".into(), "ghost".into()],
            ..hello("w1", vec![handler(TOOL, VERSION, 2)])
        },
    )
    .await;
    let err = dropped.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            DispatchFailure::Indeterminate {
                reason: WorkerLost::Replaced,
                ..
            }
        ),
        "{err:?}"
    );
    let events = recorder.take();
    assert!(
        events.iter().any(|e| matches!(e, RouterEvent::WorkerRegistered { worker_id, replaced: true, reattached, .. }
            if worker_id == "w1" && reattached == &["c1".to_string()])),
        "{events:?}"
    );
    let snap = router.snapshot();
    assert_eq!(snap.workers[0].in_flight, ["c1"]);
    assert_eq!(snap.workers[0].handlers[0].busy, 1);

    // The old stream is told it was replaced and refuses further messages.
    let superseded = DispatchError::Superseded {
        worker_id: "w1".into(),
    };
    assert_eq!(first.outbox.recv().await, Some(Err(superseded.clone())));
    assert_eq!(first.heartbeat(), Err(superseded.clone()));
    assert_eq!(first.succeed("c1", json!({"via": "old"})), Err(superseded));

    // The result comes over the new stream and is acked there.
    second.succeed("c1", json!({"via": "new"})).unwrap();
    let done = kept.await.unwrap().unwrap();
    assert_eq!(done.outcome, ToolOutcome::Success(json!({"via": "new"})));
    assert!(done.ack.ack());
    assert_eq!(
        second.next().await,
        Some(ToWorker::ResultAck {
            call_id: "c1".into()
        })
    );

    // The old connection's clean-up leaves the new registration alone.
    drop(first);
    settle().await;
    assert_eq!(router.snapshot().workers.len(), 1);
    second.heartbeat().unwrap();
    assert_eq!(second.next().await, Some(ToWorker::HeartbeatAck));
    let next = spawn_call(&router, "c3");
    assert_eq!(second.expect_invoke().await.call_id, "c3");
    second.succeed("c3", json!({})).unwrap();
    next.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stale_connection_ending_never_unregisters_the_new_one() {
    let router = router();
    let old = FakeWorker::simple(&router, "w1", 1).await;
    let mut new = FakeWorker::simple(&router, "w1", 1).await;
    assert_ne!(old.conn.generation(), new.conn.generation());
    old.conn.disconnect();
    settle().await;
    assert_eq!(router.snapshot().workers.len(), 1);
    // The new registration also keeps its lease.
    tokio::time::sleep(Duration::from_secs(20)).await;
    new.heartbeat().unwrap();
    assert_eq!(new.next().await, Some(ToWorker::HeartbeatAck));
    let handle = spawn_call(&router, "c1");
    new.expect_invoke().await;
    new.succeed("c1", json!({})).unwrap();
    handle.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_nack_is_retried_once_on_another_worker_then_returned() {
    let router = router();
    let mut a = FakeWorker::simple(&router, "a", 1).await;
    let mut b = FakeWorker::simple(&router, "b", 1).await;

    // a refuses, b succeeds.
    let handle = spawn_call(&router, "c1");
    assert_eq!(a.expect_invoke().await.call_id, "c1");
    a.nack("c1").unwrap();
    assert_eq!(b.expect_invoke().await.call_id, "c1");
    a.expect_nothing().await;
    b.succeed("c1", json!({"by": "b"})).unwrap();
    let done = handle.await.unwrap().unwrap();
    assert_eq!(done.outcome, ToolOutcome::Success(json!({"by": "b"})));
    assert_eq!(done.worker.worker_id, "b");
    assert_eq!(done.attempts, 2);
    assert!(done.ack.ack());
    assert_eq!(
        b.next().await,
        Some(ToWorker::ResultAck {
            call_id: "c1".into()
        })
    );

    // Both refuse: the model sees the last refusal as a tool error, and nothing is acked.
    let handle = spawn_call(&router, "c2");
    let first = if a.next().await.is_some() { &a } else { &b };
    first.nack("c2").unwrap();
    settle().await;
    let second_worker = if first.conn.worker_id() == "a" {
        &mut b
    } else {
        &mut a
    };
    assert_eq!(second_worker.expect_invoke().await.call_id, "c2");
    second_worker.nack("c2").unwrap();
    let done = handle.await.unwrap().unwrap();
    assert_eq!(
        done.outcome,
        ToolOutcome::Error(ToolError::new(
            "unknown_handler",
            format!("no handler registered for {TOOL}@{VERSION}")
        ))
    );
    assert_eq!(
        done.outcome.model_text(),
        format!("unknown_handler: no handler registered for {TOOL}@{VERSION}")
    );
    assert_eq!(done.attempts, 2);
    assert!(!done.ack.is_required());
    a.expect_nothing().await;
    b.expect_nothing().await;
}

#[tokio::test(start_paused = true)]
async fn a_nack_without_another_worker_is_returned_at_once() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "only", 1).await;
    let handle = spawn_call(&router, "c1");
    worker.expect_invoke().await;
    let started = Instant::now();
    worker.nack("c1").unwrap();
    let done = handle.await.unwrap().unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(done.outcome.is_error());
    assert_eq!(done.attempts, 1);
    worker.expect_nothing().await;

    // With retries disabled a second worker is not tried either.
    let config = RouterConfig {
        nack_retries: 0,
        ..RouterConfig::default()
    };
    let router = Router::new(config).unwrap();
    let mut a = FakeWorker::simple(&router, "a", 1).await;
    let mut b = FakeWorker::simple(&router, "b", 1).await;
    let handle = spawn_call(&router, "c1");
    a.expect_invoke().await;
    a.nack("c1").unwrap();
    assert!(handle.await.unwrap().unwrap().outcome.is_error());
    b.expect_nothing().await;
}

#[tokio::test(start_paused = true)]
async fn the_ack_is_sent_only_after_the_caller_records_the_result() {
    let (router, recorder) = recording_router(RouterConfig::default());
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    recorder.take();
    let handle = spawn_call(&router, "c1");
    worker.expect_invoke().await;
    worker.succeed("c1", json!({"refund_id": "r_1"})).unwrap();
    let done = handle.await.unwrap().unwrap();
    assert_eq!(done.ack.call_id(), Some("c1"));
    // Not acknowledged yet: the caller has not recorded it.
    worker.expect_nothing().await;
    assert_eq!(router.snapshot().awaiting_ack, 1);
    // The slot is free already.
    assert_eq!(router.snapshot().workers[0].handlers[0].busy, 0);
    // A resend of the same result meanwhile is neither applied nor reported.
    worker.succeed("c1", json!({"refund_id": "r_1"})).unwrap();
    worker.expect_nothing().await;
    assert!(recorder.take().is_empty());

    // "Commit", then ack.
    assert!(done.ack.ack());
    assert_eq!(
        worker.next().await,
        Some(ToWorker::ResultAck {
            call_id: "c1".into()
        })
    );
    assert_eq!(router.snapshot().awaiting_ack, 0);

    // A handle dropped without acking (the write failed) sends nothing.
    let handle = spawn_call(&router, "c2");
    worker.expect_invoke().await;
    worker.succeed("c2", json!({})).unwrap();
    let done = handle.await.unwrap().unwrap();
    drop(done);
    worker.expect_nothing().await;
    assert_eq!(router.snapshot().awaiting_ack, 0);
}

#[tokio::test(start_paused = true)]
async fn an_ack_follows_a_reconnected_worker_to_its_new_stream() {
    let router = router();
    let mut first = FakeWorker::simple(&router, "w1", 1).await;
    let handle = spawn_call(&router, "c1");
    first.expect_invoke().await;
    first.succeed("c1", json!({})).unwrap();
    let done = handle.await.unwrap().unwrap();
    let mut second = FakeWorker::connect(
        &router,
        WorkerHello {
            in_flight: vec!["c1".into()],
            ..hello("w1", vec![handler(TOOL, VERSION, 1)])
        },
    )
    .await;
    assert!(done.ack.ack());
    assert_eq!(
        second.next().await,
        Some(ToWorker::ResultAck {
            call_id: "c1".into()
        })
    );
}

struct Ledger(HashSet<String>);

#[async_trait]
impl CompletedCalls for Ledger {
    async fn completed(&self, call_ids: &[String]) -> Result<HashSet<String>, HookError> {
        Ok(call_ids
            .iter()
            .filter(|id| self.0.contains(*id))
            .cloned()
            .collect())
    }
}

#[tokio::test(start_paused = true)]
async fn in_flight_calls_already_recorded_are_acknowledged_on_register() {
    let recorder = Arc::new(Recorder::default());
    let router = Router::builder(RouterConfig::default())
        .observer(recorder.clone())
        .completed_calls(Arc::new(Ledger(
            ["done-1".to_string(), "done-2".to_string()].into(),
        )))
        .build()
        .unwrap();
    let (_conn, mut outbox) = router
        .connect(WorkerHello {
            in_flight: vec!["done-1".into(), "running".into(), "done-2".into()],
            ..hello("w1", vec![handler(TOOL, VERSION, 1)])
        })
        .await
        .unwrap();
    assert!(matches!(
        outbox.try_recv(),
        Some(ToWorker::Registered {
            lease_ttl_ms: 30_000,
            ..
        })
    ));
    assert_eq!(
        outbox.try_recv(),
        Some(ToWorker::ResultAck {
            call_id: "done-1".into()
        })
    );
    assert_eq!(
        outbox.try_recv(),
        Some(ToWorker::ResultAck {
            call_id: "done-2".into()
        })
    );
    assert_eq!(outbox.try_recv(), None);
    let events = recorder.take();
    assert!(
        events.iter().any(
            |e| matches!(e, RouterEvent::WorkerRegistered { acknowledged, .. }
            if acknowledged == &["done-1".to_string(), "done-2".to_string()])
        ),
        "{events:?}"
    );
}

struct FailingLedger;

#[async_trait]
impl CompletedCalls for FailingLedger {
    async fn completed(&self, _: &[String]) -> Result<HashSet<String>, HookError> {
        Err("database is down".into())
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_completed_lookup_does_not_prevent_registration() {
    let router = Router::builder(RouterConfig::default())
        .completed_calls(Arc::new(FailingLedger))
        .build()
        .unwrap();
    let (_conn, mut outbox) = router
        .connect(WorkerHello {
            in_flight: vec!["x".into()],
            ..hello("w1", vec![handler(TOOL, VERSION, 1)])
        })
        .await
        .unwrap();
    assert!(matches!(
        outbox.try_recv(),
        Some(ToWorker::Registered { .. })
    ));
    assert_eq!(outbox.try_recv(), None);
}

/// Records dispatches (and calls announced as queued) and can hold one dispatch until released.
#[derive(Default)]
struct Journal {
    records: Mutex<Vec<(String, String, u32)>>,
    gate: Mutex<Option<oneshot::Receiver<Result<(), String>>>>,
    queued: Mutex<Vec<(String, u32)>>,
    /// The answer of the next `queued` call (an error fails it).
    refuse_queued: Mutex<Option<String>>,
}

#[async_trait]
impl DispatchJournal for Journal {
    async fn queued(&self, invocation: &Invocation, attempt: u32) -> Result<(), HookError> {
        if let Some(message) = self.refuse_queued.lock().unwrap().take() {
            return Err(HookError::from(message));
        }
        self.queued
            .lock()
            .unwrap()
            .push((invocation.call_id.clone(), attempt));
        Ok(())
    }

    async fn dispatching(
        &self,
        invocation: &Invocation,
        worker: &WorkerProvenance,
        attempt: u32,
    ) -> Result<(), HookError> {
        let gate = self.gate.lock().unwrap().take();
        if let Some(gate) = gate {
            gate.await.map_err(|_| HookError::from("gate dropped"))??;
        }
        self.records.lock().unwrap().push((
            invocation.call_id.clone(),
            worker.worker_id.clone(),
            attempt,
        ));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_journal_records_the_dispatch_before_the_invoke_is_sent() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let (release, gate) = oneshot::channel();
    let journal = Arc::new(Journal {
        gate: Mutex::new(Some(gate)),
        ..Journal::default()
    });
    let handle = tokio::spawn({
        let router = router.clone();
        let c = call("c1").with_journal(journal.clone());
        async move { router.dispatch(c).await }
    });
    // The slot is reserved but nothing is sent while the journal write is pending.
    worker.expect_nothing().await;
    assert_eq!(router.snapshot().workers[0].handlers[0].busy, 1);
    release.send(Ok(())).unwrap();
    assert_eq!(worker.expect_invoke().await.call_id, "c1");
    assert_eq!(
        *journal.records.lock().unwrap(),
        [("c1".to_string(), "w1".to_string(), 1)]
    );
    worker.succeed("c1", json!({})).unwrap();
    handle.await.unwrap().unwrap();

    // A failed journal write sends nothing and frees the slot.
    let (release, gate) = oneshot::channel();
    let journal = Arc::new(Journal {
        gate: Mutex::new(Some(gate)),
        ..Journal::default()
    });
    let handle = tokio::spawn({
        let router = router.clone();
        let c = call("c2").with_journal(journal);
        async move { router.dispatch(c).await }
    });
    settle().await;
    release.send(Err("disk full".into())).unwrap();
    let err = handle.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        DispatchFailure::JournalFailed {
            key: format!("{TOOL}@{VERSION}"),
            message: "disk full".into()
        }
    );
    worker.expect_nothing().await;
    assert_eq!(router.snapshot().workers[0].handlers[0].busy, 0);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_stops_reading_its_stream_is_dropped() {
    let config = RouterConfig {
        outbox_capacity: 16,
        ..RouterConfig::default()
    };
    let router = Router::new(config).unwrap();
    let (conn, _outbox) = router
        .connect(hello("w1", vec![handler(TOOL, VERSION, 1)]))
        .await
        .unwrap();
    // Registered + 15 heartbeat acks fill the outbox; the next ack overflows it.
    for _ in 0..15 {
        conn.handle(FromWorker::Heartbeat).unwrap();
    }
    let err = conn.handle(FromWorker::Heartbeat).unwrap_err();
    assert_eq!(
        err,
        DispatchError::OutboxOverflow {
            worker_id: "w1".into(),
            capacity: 16
        }
    );
    assert_eq!(err.status(), StatusClass::ResourceExhausted);
    assert!(router.snapshot().workers.is_empty());
}

#[tokio::test(start_paused = true)]
async fn malformed_registrations_and_messages_are_refused_with_clear_errors() {
    let router = router();
    let refused = |hello: WorkerHello| {
        let router = router.clone();
        async move { router.connect(hello).await.unwrap_err() }
    };
    let err = refused(hello("", vec![handler(TOOL, VERSION, 1)])).await;
    assert_eq!(err.to_string(), "worker_id is required");
    assert_eq!(err.status(), StatusClass::InvalidArgument);
    let err = refused(hello("w", vec![handler("", VERSION, 1)])).await;
    assert_eq!(err.to_string(), "handlers[0].tool is required");
    let err = refused(hello(
        "w",
        vec![handler(TOOL, VERSION, 1), handler(TOOL, "", 1)],
    ))
    .await;
    assert_eq!(
        err.to_string(),
        format!(
            "handlers[1].version is required for tool \"{TOOL}\" (advertise \"default\" to serve bindings without a version)"
        )
    );
    let err = refused(hello(
        "w",
        vec![
            handler(TOOL, VERSION, 1),
            HandlerAd {
                max_concurrency: 9,
                ..handler(TOOL, VERSION, 1)
            },
        ],
    ))
    .await;
    assert_eq!(
        err.to_string(),
        format!("handlers[1] advertises {TOOL}@{VERSION} again (first at handlers[0])")
    );
    let err = refused(WorkerHello {
        in_flight: vec!["ok".into(), String::new()],
        ..hello("w", vec![])
    })
    .await;
    assert_eq!(err.to_string(), "in_flight[1].call_id is required");
    // Names land in audit events and log lines: bounded, no control characters.
    let long = "w".repeat(phrony_dispatch::MAX_REGISTRATION_NAME_BYTES + 1);
    let err = refused(hello(&long, vec![])).await;
    assert_eq!(
        err.to_string(),
        "worker_id is 257 bytes long; the limit is 256"
    );
    assert_eq!(err.status(), StatusClass::InvalidArgument);
    let err = refused(hello("w\nINFO forged", vec![])).await;
    assert_eq!(
        err.to_string(),
        "worker_id contains the control character '\\n'"
    );
    let err = refused(hello("w", vec![handler(TOOL, "1.0\u{1b}[2J", 1)])).await;
    assert_eq!(
        err.to_string(),
        "handlers[0].version contains the control character '\\u{1b}'"
    );
    let many: Vec<HandlerAd> = (0..=phrony_dispatch::MAX_HANDLERS)
        .map(|i| handler(&format!("tool.n{i}"), VERSION, 1))
        .collect();
    let err = refused(hello("w", many)).await;
    assert_eq!(
        err.to_string(),
        "handlers has 1025 entries; the limit is 1024"
    );
    assert!(router.snapshot().workers.is_empty());
    // At the bound, a name is accepted.
    let at_bound = "w".repeat(phrony_dispatch::MAX_REGISTRATION_NAME_BYTES);
    let other = crate::common::router();
    let _registered = other
        .connect(hello(&at_bound, vec![handler(TOOL, VERSION, 1)]))
        .await
        .unwrap();
    assert_eq!(other.snapshot().workers.len(), 1);

    let worker = FakeWorker::simple(&router, "w", 1).await;
    let err = worker
        .conn
        .handle(FromWorker::Result {
            call_id: String::new(),
            payload: vec![],
            error: None,
        })
        .unwrap_err();
    assert_eq!(err.to_string(), "result.call_id is required");
    let err = worker
        .conn
        .handle(FromWorker::Nack {
            call_id: String::new(),
            code: "x".into(),
            message: "y".into(),
        })
        .unwrap_err();
    assert_eq!(err.to_string(), "nack.call_id is required");

    // Errors the gRPC layer raises itself, with their statuses.
    let early = DispatchError::RegisterFirst {
        message: "heartbeat",
    };
    assert_eq!(early.to_string(), "register before heartbeat");
    assert_eq!(early.status(), StatusClass::FailedPrecondition);
}

#[tokio::test(start_paused = true)]
async fn worker_payloads_are_parsed_defensively() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let run = |payload: Vec<u8>, error: Option<ToolError>| {
        let router = router.clone();
        async move {
            let handle = tokio::spawn({
                let router = router.clone();
                async move { router.dispatch(call("c")).await }
            });
            (handle, payload, error)
        }
    };
    for (payload, error, expected) in [
        (Vec::new(), None, ToolOutcome::Success(json!({}))),
        (
            b"{\"a\":1}".to_vec(),
            None,
            ToolOutcome::Success(json!({"a": 1})),
        ),
        (
            b"{\"a\":1}".to_vec(),
            Some(ToolError::new(
                "invalid_args",
                "amount must be greater than zero",
            )),
            ToolOutcome::Error(ToolError::new(
                "invalid_args",
                "amount must be greater than zero",
            )),
        ),
        (
            Vec::new(),
            Some(ToolError::new("", "")),
            ToolOutcome::Error(ToolError::new(
                "internal",
                "the worker reported an error without details",
            )),
        ),
    ] {
        let (handle, payload, error) = run(payload, error).await;
        worker.expect_invoke().await;
        worker
            .conn
            .handle(FromWorker::Result {
                call_id: "c".into(),
                payload,
                error,
            })
            .unwrap();
        let done = handle.await.unwrap().unwrap();
        assert_eq!(done.outcome, expected);
        assert!(done.ack.ack());
        worker.next().await;
    }
    let (handle, _, _) = run(Vec::new(), None).await;
    worker.expect_invoke().await;
    worker
        .conn
        .handle(FromWorker::Result {
            call_id: "c".into(),
            payload: b"not json".to_vec(),
            error: None,
        })
        .unwrap();
    let done = handle.await.unwrap().unwrap();
    match &done.outcome {
        ToolOutcome::Error(e) => {
            assert_eq!(e.code, "invalid_result");
            assert!(
                e.message
                    .starts_with("worker \"w1\" returned a result payload that is not JSON: "),
                "{e}"
            );
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(done.ack.ack());
}

#[tokio::test(start_paused = true)]
async fn config_is_validated() {
    let bad = |config: RouterConfig| Router::new(config).unwrap_err().to_string();
    assert_eq!(
        bad(RouterConfig {
            lease_ttl: Duration::from_secs(1),
            ..RouterConfig::default()
        }),
        "lease_ttl must be at least 2s (workers heartbeat every max(ttl/2, 1s)); got 1s"
    );
    assert_eq!(
        bad(RouterConfig {
            queue_capacity: 0,
            ..RouterConfig::default()
        }),
        "queue_capacity must be at least 1"
    );
    assert_eq!(
        bad(RouterConfig {
            outbox_capacity: 4,
            ..RouterConfig::default()
        }),
        "outbox_capacity must be at least 16; got 4"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_lost_before_the_invoke_went_out_is_not_indeterminate() {
    let router = router();
    let a = FakeWorker::simple(&router, "a", 1).await;
    let mut b = FakeWorker::simple(&router, "b", 1).await;
    let (release, gate) = oneshot::channel();
    let journal = Arc::new(Journal {
        gate: Mutex::new(Some(gate)),
        ..Journal::default()
    });
    let handle = tokio::spawn({
        let router = router.clone();
        let c = call("c1").with_journal(journal.clone());
        async move { router.dispatch(c).await }
    });
    settle().await;
    // The slot on "a" is reserved while the journal writes; then "a" goes away.
    a.conn.disconnect();
    release.send(Ok(())).unwrap();
    // Nothing had been sent, so the call simply goes to "b".
    assert_eq!(b.expect_invoke().await.call_id, "c1");
    b.succeed("c1", json!({})).unwrap();
    let done = handle.await.unwrap().unwrap();
    assert_eq!(done.worker.worker_id, "b");
    assert_eq!(done.attempts, 1);
    assert_eq!(
        *journal.records.lock().unwrap(),
        [
            ("c1".to_string(), "a".to_string(), 1),
            ("c1".to_string(), "b".to_string(), 1)
        ]
    );
}

#[tokio::test]
async fn a_worker_id_is_bound_to_the_credential_that_registered_it_first() {
    let router = router();
    let owner = "\"refund-bot\" (token)";
    let (first, _out) = router
        .connect_as(hello("w", vec![handler("t", "1", 1)]), owner)
        .await
        .unwrap();
    assert_eq!(router.worker_owner("w").as_deref(), Some(owner));

    // Another credential, or an unverified caller, is refused and the worker keeps its slot.
    let err = router
        .connect_as(hello("w", vec![handler("t", "1", 1)]), "\"mallory\" (oidc)")
        .await
        .unwrap_err();
    assert_eq!(err.status(), StatusClass::PermissionDenied);
    assert!(
        matches!(&err, DispatchError::WorkerIdBound { owner: o, credential, .. }
            if o == owner && credential == "\"mallory\" (oidc)"),
        "{err}"
    );
    let err = router
        .connect(hello("w", vec![handler("t", "1", 1)]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("(unverified)"), "{err}");
    first.handle(FromWorker::Heartbeat).unwrap();

    // The owner takes its id over, as any worker re-registering does.
    let (_second, _out2) = router
        .connect_as(hello("w", vec![handler("t", "1", 1)]), owner)
        .await
        .unwrap();
    assert!(first.handle(FromWorker::Heartbeat).is_err());

    // A registration that fails binds nothing.
    let err = router
        .connect_as(hello("fresh", vec![handler("", "1", 1)]), owner)
        .await
        .unwrap_err();
    assert_eq!(err.status(), StatusClass::InvalidArgument);
    assert_eq!(router.worker_owner("fresh"), None);
    // Unbound ids keep today's behaviour.
    router
        .connect(hello("local", vec![handler("t", "1", 1)]))
        .await
        .unwrap();
    assert_eq!(router.worker_owner("local"), None);
}

/// A call that gets a slot at once is never announced as queued (its journal records the
/// queueing with the dispatch); one that must wait is announced before the wait, and a
/// journal that cannot record it fails the dispatch and takes the call out of the queue.
#[tokio::test(start_paused = true)]
async fn the_journal_hears_of_a_queued_call_before_it_waits() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let journal = Arc::new(Journal::default());
    let first = tokio::spawn({
        let router = router.clone();
        let c = call("c1").with_journal(journal.clone());
        async move { router.dispatch(c).await }
    });
    assert_eq!(worker.expect_invoke().await.call_id, "c1");
    assert!(journal.queued.lock().unwrap().is_empty());

    // The only slot is busy: c2 waits, announced first.
    let second = tokio::spawn({
        let router = router.clone();
        let c = call("c2").with_journal(journal.clone());
        async move { router.dispatch(c).await }
    });
    settle().await;
    assert_eq!(*journal.queued.lock().unwrap(), [("c2".to_string(), 1)]);
    assert_eq!(router.snapshot().queues[0].depth, 1);
    worker.expect_nothing().await;

    // A refused announcement fails c3 before it waits, and leaves nothing in the queue.
    *journal.refuse_queued.lock().unwrap() = Some("disk full".into());
    let err = router
        .dispatch(call("c3").with_journal(journal.clone()))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        DispatchFailure::JournalFailed {
            key: format!("{TOOL}@{VERSION}"),
            message: "disk full".into()
        }
    );
    assert_eq!(router.snapshot().queues[0].depth, 1);

    worker.succeed("c1", json!({})).unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(worker.expect_invoke().await.call_id, "c2");
    worker.succeed("c2", json!({})).unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(
        *journal.records.lock().unwrap(),
        [
            ("c1".to_string(), "w1".to_string(), 1),
            ("c2".to_string(), "w1".to_string(), 1)
        ]
    );
}
