//! Routing, capacity, queueing, deadlines, integrity and shutdown.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::*;
use phrony_dispatch::{
    Allowlist, CancellationToken, DispatchCall, DispatchFailure, HandlerAd, IntegrityKind,
    LateOutcome, LateReason, RouterConfig, RouterEvent, ToWorker, ToolOutcome, WorkerHello,
};
use serde_json::json;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn concurrency_limit_is_respected_under_load() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 3).await;
    let calls: Vec<_> = (0..12)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move { router.dispatch(call(&format!("c{i}"))).await })
        })
        .collect();

    let mut running = worker.invokes().await;
    assert_eq!(running.len(), 3, "only max_concurrency invokes go out");
    let snap = router.snapshot();
    assert_eq!(snap.workers[0].handlers[0].busy, 3);
    assert_eq!(snap.queues[0].depth, 9);

    let mut finished = 0;
    while let Some(invocation) = running.pop() {
        worker
            .succeed(&invocation.call_id, json!({"done": invocation.call_id}))
            .unwrap();
        finished += 1;
        running.extend(worker.invokes().await);
        assert!(running.len() <= 3, "{} running at once", running.len());
        assert_eq!(
            router.snapshot().workers[0].handlers[0].busy as usize,
            running.len()
        );
    }
    assert_eq!(finished, 12);
    for (i, handle) in calls.into_iter().enumerate() {
        let done = handle.await.unwrap().unwrap();
        assert_eq!(
            done.outcome,
            ToolOutcome::Success(json!({"done": format!("c{i}")}))
        );
        assert_eq!(done.attempts, 1);
        assert!(done.ack.ack());
    }
    assert!(router.snapshot().queues.is_empty());
}

#[tokio::test(start_paused = true)]
async fn least_busy_worker_wins_and_ties_go_to_the_least_recently_used() {
    let router = router();
    let mut a = FakeWorker::simple(&router, "a", 4).await;
    let mut b = FakeWorker::simple(&router, "b", 4).await;
    let spawn = |id: &str| {
        let router = router.clone();
        let c = call(id);
        tokio::spawn(async move { router.dispatch(c).await })
    };

    // Both idle and never used: registration order decides.
    let c1 = spawn("c1");
    assert_eq!(a.expect_invoke().await.call_id, "c1");
    // a is busier.
    let c2 = spawn("c2");
    assert_eq!(b.expect_invoke().await.call_id, "c2");
    // Both run one call: a was used least recently.
    let c3 = spawn("c3");
    assert_eq!(a.expect_invoke().await.call_id, "c3");
    let c4 = spawn("c4");
    assert_eq!(b.expect_invoke().await.call_id, "c4");
    // a finishes both of its calls and becomes the least busy.
    a.succeed("c1", json!({})).unwrap();
    a.succeed("c3", json!({})).unwrap();
    let c5 = spawn("c5");
    assert_eq!(a.expect_invoke().await.call_id, "c5");
    b.expect_nothing().await;

    b.succeed("c2", json!({})).unwrap();
    b.succeed("c4", json!({})).unwrap();
    a.succeed("c5", json!({})).unwrap();
    for (handle, worker) in [(c1, "a"), (c2, "b"), (c3, "a"), (c4, "b"), (c5, "a")] {
        assert_eq!(handle.await.unwrap().unwrap().worker.worker_id, worker);
    }
}

#[tokio::test(start_paused = true)]
async fn queued_calls_are_served_first_in_first_out() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let mut handles = Vec::new();
    for i in 0..5 {
        let router2 = router.clone();
        handles.push(tokio::spawn(async move {
            router2.dispatch(call(&format!("c{i}"))).await
        }));
        settle().await;
    }
    for i in 0..5 {
        let invocation = worker.expect_invoke().await;
        assert_eq!(invocation.call_id, format!("c{i}"));
        worker.expect_nothing().await;
        worker
            .succeed(&invocation.call_id, json!({"i": i}))
            .unwrap();
    }
    for handle in handles {
        handle.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_fails_at_once_with_capacity_exhausted() {
    let config = RouterConfig {
        queue_capacity: 2,
        ..RouterConfig::default()
    };
    let router = phrony_dispatch::Router::new(config).unwrap();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let _running: Vec<_> = ["c0", "c1", "c2"]
        .into_iter()
        .map(|id| {
            let router = router.clone();
            tokio::spawn(async move { router.dispatch(call(id)).await })
        })
        .collect();
    assert_eq!(worker.invokes().await.len(), 1);
    assert_eq!(router.snapshot().queues[0].depth, 2);

    let started = Instant::now();
    let err = router.dispatch(call("c3")).await.unwrap_err();
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no waiting when the queue is full"
    );
    assert_eq!(
        err,
        DispatchFailure::CapacityExhausted {
            key: format!("{TOOL}@{VERSION}"),
            queue_full: true
        }
    );
    assert_eq!(err.code(), "capacity_exhausted");
}

#[tokio::test(start_paused = true)]
async fn queue_wait_expiry_reports_no_handler_or_capacity_exhausted() {
    let router = router();
    let wait = Duration::from_secs(5);
    let with_wait = |id: &str, version: &str| {
        DispatchCall::new(
            invocation_for(id, TOOL, version),
            "demo/refund-agent",
            wait,
            Some(Duration::from_secs(600)),
        )
    };

    // Nobody advertises the key.
    let started = Instant::now();
    let err = router.dispatch(with_wait("c1", VERSION)).await.unwrap_err();
    assert_eq!(started.elapsed(), wait);
    assert_eq!(
        err,
        DispatchFailure::NoHandler {
            key: format!("{TOOL}@{VERSION}")
        }
    );
    assert_eq!(
        err.to_string(),
        format!("no handler registered for tool {TOOL}@{VERSION}")
    );

    // A version pin that no worker serves is a missing handler too.
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let err = router.dispatch(with_wait("c2", "9.9.9")).await.unwrap_err();
    assert_eq!(
        err,
        DispatchFailure::NoHandler {
            key: format!("{TOOL}@9.9.9")
        }
    );

    // The worker is busy for longer than the wait.
    let router2 = router.clone();
    let running = tokio::spawn(async move { router2.dispatch(call("c3")).await });
    worker.expect_invoke().await;
    let started = Instant::now();
    let err = router.dispatch(with_wait("c4", VERSION)).await.unwrap_err();
    assert_eq!(started.elapsed(), wait);
    assert_eq!(
        err,
        DispatchFailure::CapacityExhausted {
            key: format!("{TOOL}@{VERSION}"),
            queue_full: false
        }
    );
    assert!(
        router.snapshot().queues.is_empty(),
        "the expired call left the queue"
    );
    worker.expect_nothing().await;
    worker.succeed("c3", json!({})).unwrap();
    running.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn queue_wait_does_not_bound_execution() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let call = DispatchCall::new(
        invocation("c1"),
        "demo/refund-agent",
        Duration::from_secs(1),
        Some(Duration::from_secs(120)),
    );
    let handle = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(call).await }
    });
    worker.expect_invoke().await;
    // The handler runs 50 times longer than the queue wait (heartbeating meanwhile).
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        worker.heartbeat().unwrap();
    }
    worker.succeed("c1", json!({"refund": "ok"})).unwrap();
    let done = handle.await.unwrap().unwrap();
    assert_eq!(done.outcome, ToolOutcome::Success(json!({"refund": "ok"})));
    assert_eq!(done.executed_for, Duration::from_secs(50));
    assert_eq!(done.queued_for, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn bindings_without_a_version_dispatch_to_default() {
    let router = router();
    let mut worker = FakeWorker::connect(
        &router,
        hello("w1", vec![handler("orders.lookup", "default", 0)]),
    )
    .await;
    let call = DispatchCall::new(
        invocation_for("c1", "orders.lookup", ""),
        "demo/refund-agent",
        Duration::from_secs(1),
        None,
    );
    let handle = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(call).await }
    });
    let invocation = worker.expect_invoke().await;
    assert_eq!(invocation.version, "default");
    assert_eq!(
        invocation.deadline_unix_ms, 0,
        "no session budget and no execution timeout"
    );
    assert_eq!(
        router.snapshot().workers[0].handlers[0].max_concurrency,
        1,
        "0 means 1"
    );
    worker.succeed("c1", json!({"status": "shipped"})).unwrap();
    handle.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_registering_worker_drains_the_queue() {
    let router = router();
    let handles: Vec<_> = ["c1", "c2"]
        .into_iter()
        .map(|id| {
            let router = router.clone();
            tokio::spawn(async move { router.dispatch(call(id)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(router.snapshot().queues[0].depth, 2);

    let mut worker = FakeWorker::simple(&router, "late-worker", 2).await;
    let invokes = worker.invokes().await;
    assert_eq!(
        invokes
            .iter()
            .map(|i| i.call_id.as_str())
            .collect::<Vec<_>>(),
        ["c1", "c2"]
    );
    for invocation in &invokes {
        worker.succeed(&invocation.call_id, json!({})).unwrap();
    }
    for handle in handles {
        let done = handle.await.unwrap().unwrap();
        assert_eq!(done.queued_for, Duration::from_secs(3));
    }
}

#[tokio::test(start_paused = true)]
async fn execution_deadline_sends_cancel_and_fails_with_execution_timeout() {
    let (router, recorder) = recording_router(RouterConfig::default());
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let timeout = Duration::from_secs(10);
    let session_deadline = now_ms() + 3_600_000;
    let mut inv = invocation("c1");
    inv.deadline_unix_ms = session_deadline;
    let call = DispatchCall::new(
        inv,
        "demo/refund-agent",
        Duration::from_secs(1),
        Some(timeout),
    );
    let started = Instant::now();
    let handle = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(call).await }
    });
    let invocation = worker.expect_invoke().await;
    // The worker learns when the runtime stops waiting: the execution deadline, which is
    // earlier than the session's budget.
    let expected = now_ms() + 10_000;
    assert!(
        (expected - 1_000..=expected + 1_000).contains(&invocation.deadline_unix_ms),
        "deadline {} not near {expected}",
        invocation.deadline_unix_ms
    );
    assert!(invocation.deadline_unix_ms < session_deadline);
    tokio::time::sleep(Duration::from_secs(5)).await;
    worker.heartbeat().unwrap();
    assert_eq!(worker.next().await, Some(ToWorker::HeartbeatAck));

    let err = handle.await.unwrap().unwrap_err();
    assert_eq!(started.elapsed(), timeout);
    match &err {
        DispatchFailure::ExecutionTimeout {
            worker, timeout: t, ..
        } => {
            assert_eq!(worker.worker_id, "w1");
            assert_eq!(*t, timeout);
        }
        other => panic!("expected ExecutionTimeout, got {other:?}"),
    }
    assert!(
        err.outcome_unknown(),
        "a timed-out call is routed like an indeterminate one"
    );
    assert_eq!(
        worker.next().await,
        Some(ToWorker::Cancel {
            call_id: "c1".into()
        })
    );

    // The worker is still running it: the slot stays taken until it answers.
    assert_eq!(router.snapshot().workers[0].handlers[0].busy, 1);
    assert_eq!(router.snapshot().workers[0].abandoned, 1);
    // The SDK answers a cancelled call with a `cancelled` error: late, acknowledged once
    // recorded, and the stream stays up.
    worker
        .conn
        .handle(phrony_dispatch::FromWorker::Result {
            call_id: "c1".into(),
            payload: Vec::new(),
            error: Some(phrony_dispatch::ToolError::new(
                "cancelled",
                "invoke cancelled or deadline exceeded",
            )),
        })
        .unwrap();
    let late = recorder
        .take()
        .into_iter()
        .find_map(|e| match e {
            RouterEvent::LateResult(late) => Some(late),
            _ => None,
        })
        .expect("late result reported");
    assert_eq!(
        late.reason,
        LateReason::Abandoned(phrony_dispatch::AbandonReason::ExecutionTimeout)
    );
    assert_eq!(
        late.outcome,
        LateOutcome::Result(ToolOutcome::Error(phrony_dispatch::ToolError::new(
            "cancelled",
            "invoke cancelled or deadline exceeded"
        )))
    );
    worker.expect_nothing().await;
    assert!(late.ack.ack());
    assert_eq!(
        worker.next().await,
        Some(ToWorker::ResultAck {
            call_id: "c1".into()
        })
    );
    assert_eq!(router.snapshot().workers[0].handlers[0].busy, 0);
    worker.heartbeat().unwrap();
    assert_eq!(worker.next().await, Some(ToWorker::HeartbeatAck));
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_slot_is_released_after_the_grace_period() {
    let config = RouterConfig {
        abandon_grace: Duration::from_secs(20),
        ..RouterConfig::default()
    };
    let router = phrony_dispatch::Router::new(config).unwrap();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let first = DispatchCall::new(
        invocation("c1"),
        "demo/refund-agent",
        Duration::from_secs(1),
        Some(Duration::from_secs(5)),
    );
    let err = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(first).await }
    });
    worker.expect_invoke().await;
    let err = err.await.unwrap().unwrap_err();
    assert_eq!(err.code(), "execution_timeout");
    assert_eq!(
        worker.next().await,
        Some(ToWorker::Cancel {
            call_id: "c1".into()
        })
    );

    // The next call waits: the worker never answered the cancelled one.
    let second = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(call("c2")).await }
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    worker.heartbeat().unwrap();
    assert_eq!(worker.next().await, Some(ToWorker::HeartbeatAck));
    worker.expect_nothing().await;
    // 20s after the cancel the slot is released and the queued call goes out.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(worker.expect_invoke().await.call_id, "c2");
    worker.succeed("c2", json!({})).unwrap();
    second.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancellation_sends_cancel_to_a_running_call_and_dequeues_a_waiting_one() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let running_token = CancellationToken::new();
    let queued_token = CancellationToken::new();
    let running = tokio::spawn({
        let router = router.clone();
        let c = call("c1").with_cancel(running_token.clone());
        async move { router.dispatch(c).await }
    });
    worker.expect_invoke().await;
    let queued = tokio::spawn({
        let router = router.clone();
        let c = call("c2").with_cancel(queued_token.clone());
        async move { router.dispatch(c).await }
    });
    settle().await;
    assert_eq!(router.snapshot().queues[0].depth, 1);

    queued_token.cancel();
    let err = queued.await.unwrap().unwrap_err();
    assert!(
        matches!(err, DispatchFailure::Cancelled { worker: None, .. }),
        "{err:?}"
    );
    assert!(!err.outcome_unknown());
    assert!(router.snapshot().queues.is_empty());
    worker.expect_nothing().await;

    running_token.cancel();
    let err = running.await.unwrap().unwrap_err();
    match &err {
        DispatchFailure::Cancelled {
            worker: Some(w), ..
        } => assert_eq!(w.worker_id, "w1"),
        other => panic!("expected Cancelled with a worker, got {other:?}"),
    }
    assert!(err.outcome_unknown());
    assert_eq!(
        worker.next().await,
        Some(ToWorker::Cancel {
            call_id: "c1".into()
        })
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_a_dispatch_cancels_the_call_and_reports_its_result_as_late() {
    let (router, recorder) = recording_router(RouterConfig::default());
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let handle = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(call("c1")).await }
    });
    worker.expect_invoke().await;
    handle.abort();
    let _ = handle.await;
    assert_eq!(
        worker.next().await,
        Some(ToWorker::Cancel {
            call_id: "c1".into()
        })
    );
    worker.succeed("c1", json!({"ok": true})).unwrap();
    let events = recorder.take();
    assert!(
        events.iter().any(|e| matches!(e, RouterEvent::LateResult(l)
            if l.call_id == "c1"
            && l.reason == LateReason::Abandoned(phrony_dispatch::AbandonReason::CallerGone))),
        "{events:?}"
    );
}

fn allowlist() -> Allowlist {
    Allowlist::from_yaml_str(&format!(
        r#"
entries:
  - agent: demo/refund-agent
    tool: {TOOL}
    version: {VERSION}
    contract_version: "1"
    workload_identities: [prod/payments]
    image_digests: [sha256:good]
"#
    ))
    .unwrap()
}

fn worker_hello(id: &str, identity: &str, digest: &str, contract: &str) -> WorkerHello {
    WorkerHello {
        worker_id: id.into(),
        workload_identity: identity.into(),
        image_digest: digest.into(),
        handlers: vec![HandlerAd {
            contract_version: contract.into(),
            ..handler(TOOL, VERSION, 4)
        }],
        in_flight: Vec::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn allowlist_violations_fail_the_call_without_invoking_the_worker() {
    let cases = [
        (
            "demo/refund-agent",
            worker_hello("w", "dev/laptop", "sha256:good", "1"),
            IntegrityKind::WorkloadIdentity,
            "workload identity \"dev/laptop\" is not approved",
        ),
        (
            "demo/refund-agent",
            worker_hello("w", "", "sha256:good", "1"),
            IntegrityKind::WorkloadIdentity,
            "workload identity \"\" is not approved",
        ),
        (
            "demo/refund-agent",
            worker_hello("w", "PROD/payments", "sha256:evil", "1"),
            IntegrityKind::ImageDigest,
            "image digest \"sha256:evil\" is not approved",
        ),
        (
            "demo/refund-agent",
            worker_hello("w", "prod/payments", "sha256:good", "2"),
            IntegrityKind::ContractVersion,
            "contract version \"2\" does not match the required \"1\"",
        ),
        (
            "demo/other-agent",
            worker_hello("w", "prod/payments", "sha256:good", "1"),
            IntegrityKind::Agent,
            "agent \"demo/other-agent\" is not on the tool allowlist",
        ),
    ];
    for (agent, hello, kind, detail) in cases {
        let router = phrony_dispatch::Router::builder(RouterConfig::default())
            .allowlist(allowlist())
            .build()
            .unwrap();
        let mut worker = FakeWorker::connect(&router, hello).await;
        let mut c = call("c1");
        c.agent = agent.into();
        let started = Instant::now();
        let err = router.dispatch(c).await.unwrap_err();
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a violation does not wait"
        );
        assert_eq!(
            err,
            DispatchFailure::IntegrityViolation {
                key: format!("{TOOL}@{VERSION}"),
                violation: phrony_dispatch::IntegrityViolation {
                    kind,
                    detail: detail.into()
                },
            }
        );
        assert_eq!(err.code(), kind.as_str());
        assert_eq!(
            err.to_string(),
            format!("tool dispatch integrity violation ({kind}) for {TOOL}@{VERSION}: {detail}")
        );
        worker.expect_nothing().await;
    }
}

#[tokio::test(start_paused = true)]
async fn allowlist_routes_around_unapproved_workers() {
    let router = phrony_dispatch::Router::builder(RouterConfig::default())
        .allowlist(allowlist())
        .build()
        .unwrap();
    let mut rogue = FakeWorker::connect(
        &router,
        worker_hello("rogue", "dev/laptop", "sha256:good", "1"),
    )
    .await;
    let mut good = FakeWorker::connect(
        &router,
        worker_hello("good", "prod/payments", "sha256:good", "1"),
    )
    .await;
    let handles: Vec<_> = ["c1", "c2"]
        .into_iter()
        .map(|id| {
            let router = router.clone();
            tokio::spawn(async move { router.dispatch(call(id)).await })
        })
        .collect();
    // Both go to the approved worker although the rogue one is idle.
    assert_eq!(good.invokes().await.len(), 2);
    rogue.expect_nothing().await;
    good.succeed("c1", json!({})).unwrap();
    good.succeed("c2", json!({})).unwrap();
    for handle in handles {
        assert_eq!(handle.await.unwrap().unwrap().worker.worker_id, "good");
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_refuses_new_work_fails_queued_calls_and_lets_running_ones_finish() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 1).await;
    let running = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(call("c1")).await }
    });
    worker.expect_invoke().await;
    let queued = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(call("c2")).await }
    });
    settle().await;

    router.shutdown();
    assert_eq!(
        queued.await.unwrap().unwrap_err(),
        DispatchFailure::ShuttingDown
    );
    assert_eq!(
        router.dispatch(call("c3")).await.unwrap_err(),
        DispatchFailure::ShuttingDown
    );
    let err = router
        .connect(hello("w2", vec![handler(TOOL, VERSION, 1)]))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "tool worker registry is shutting down");
    assert_eq!(err.status(), phrony_dispatch::StatusClass::InvalidArgument);
    assert!(router.snapshot().shutting_down);

    worker.succeed("c1", json!({"ok": 1})).unwrap();
    let done = running.await.unwrap().unwrap();
    assert_eq!(done.outcome, ToolOutcome::Success(json!({"ok": 1})));
    assert!(done.ack.ack());
    assert_eq!(
        worker.next().await,
        Some(ToWorker::ResultAck {
            call_id: "c1".into()
        })
    );
}

#[tokio::test(start_paused = true)]
async fn snapshot_shows_workers_handlers_busy_slots_and_queues() {
    let router = router();
    let mut worker = FakeWorker::connect(
        &router,
        hello(
            "w1",
            vec![
                handler(TOOL, VERSION, 1),
                handler("orders.lookup", "1.0.0", 8),
            ],
        ),
    )
    .await;
    let _calls: Vec<_> = ["c1", "c2"]
        .into_iter()
        .map(|id| {
            let router = router.clone();
            tokio::spawn(async move { router.dispatch(call(id)).await })
        })
        .collect();
    assert_eq!(worker.invokes().await.len(), 1);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let snap = router.snapshot();
    assert!(!snap.shutting_down);
    assert_eq!(snap.workers.len(), 1);
    let w = &snap.workers[0];
    assert_eq!(w.worker_id, "w1");
    assert_eq!(w.workload_identity, "playground/local");
    assert_eq!(w.lease_remaining, Duration::from_secs(20));
    assert_eq!(w.in_flight, ["c1"]);
    assert_eq!(
        w.handlers
            .iter()
            .map(|h| (h.tool.as_str(), h.max_concurrency, h.busy))
            .collect::<Vec<_>>(),
        [(TOOL, 1, 1), ("orders.lookup", 8, 0)]
    );
    assert_eq!(snap.queues.len(), 1);
    assert_eq!(snap.queues[0].key, format!("{TOOL}@{VERSION}"));
    assert_eq!(snap.queues[0].depth, 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_id_cannot_be_dispatched_twice_at_once() {
    let router = router();
    let mut worker = FakeWorker::simple(&router, "w1", 2).await;
    let first = tokio::spawn({
        let router = router.clone();
        async move { router.dispatch(call("c1")).await }
    });
    worker.expect_invoke().await;
    assert_eq!(
        router.dispatch(call("c1")).await.unwrap_err(),
        DispatchFailure::AlreadyInFlight {
            call_id: "c1".into()
        }
    );
    worker.expect_nothing().await;
    worker.succeed("c1", json!({})).unwrap();
    first.await.unwrap().unwrap();
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Real threads, many calls, workers answering concurrently: every call completes exactly
/// once and no worker ever runs more than its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_load_on_several_workers_never_exceeds_limits() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    let config = RouterConfig {
        queue_capacity: 1_000,
        ..RouterConfig::default()
    };
    let router = phrony_dispatch::Router::new(config).unwrap();
    let mut peaks = Vec::new();
    let mut worker_tasks = Vec::new();
    for (i, limit) in [1u32, 2, 3, 4].into_iter().enumerate() {
        let (conn, mut outbox) = router
            .connect(hello(&format!("w{i}"), vec![handler(TOOL, VERSION, limit)]))
            .await
            .unwrap();
        let conn = Arc::new(conn);
        let running = Arc::new(AtomicU32::new(0));
        let peak = Arc::new(AtomicU32::new(0));
        peaks.push((limit, Arc::clone(&peak)));
        worker_tasks.push(tokio::spawn(async move {
            while let Some(Ok(msg)) = outbox.recv().await {
                let ToWorker::Invoke(invocation) = msg else {
                    continue;
                };
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                let (conn, running) = (Arc::clone(&conn), Arc::clone(&running));
                tokio::spawn(async move {
                    for _ in 0..(invocation.call_id.len() % 7) {
                        tokio::task::yield_now().await;
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                    conn.handle(phrony_dispatch::FromWorker::Result {
                        call_id: invocation.call_id.clone(),
                        payload: serde_json::to_vec(&json!({"id": invocation.call_id})).unwrap(),
                        error: None,
                    })
                    .unwrap();
                });
            }
        }));
    }

    let calls: Vec<_> = (0..600)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move {
                let id = format!("call-{i}");
                let done = router.dispatch(call(&id)).await.unwrap();
                assert_eq!(done.outcome, ToolOutcome::Success(json!({"id": id})));
                assert!(done.ack.ack());
                done.worker.worker_id
            })
        })
        .collect();
    let mut served = std::collections::HashMap::<String, usize>::new();
    for handle in calls {
        *served.entry(handle.await.unwrap()).or_default() += 1;
    }
    assert_eq!(served.values().sum::<usize>(), 600);
    for (limit, peak) in peaks {
        let peak = peak.load(Ordering::SeqCst);
        assert!(
            peak <= limit,
            "a worker with limit {limit} ran {peak} calls at once"
        );
    }
    let snap = router.snapshot();
    assert!(snap.queues.is_empty());
    assert!(snap.workers.iter().all(|w| w.in_flight.is_empty()));
    assert!(snap.workers.iter().all(|w| w.handlers[0].busy == 0));
    assert_eq!(snap.awaiting_ack, 0);
    for task in worker_tasks {
        task.abort();
    }
}
